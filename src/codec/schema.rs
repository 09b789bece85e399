//! The JSON Schemas of the format, generated from the types: format 1's from the model of
//! [`crate::model::format`], format 2's from the column types of [`super::v2`]; committed as
//! `schema/graphcheck-v1.schema.json` and `schema/graphcheck-v2.schema.json`, which a test
//! keeps equal to these. The loader asks them what a value of the wrong type should have
//! been.

use super::v2::{LiveV2, ManifestV2};
use crate::model::format::{DocKind, Live, Manifest};

/// The JSON Schema of both documents in format `version` (1 or 2; any other: 2's), as
/// `graphcheck schema` prints it.
pub fn json_schema_of(version: u32) -> serde_json::Value {
    match version {
        1 => json_schema(),
        _ => json_schema_v2(),
    }
}

/// The JSON Schema of both documents in format 1.
pub fn json_schema() -> serde_json::Value {
    let manifest = schemars::schema_for!(Manifest);
    let live = schemars::schema_for!(Live);
    serde_json::json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "graphcheck format v1",
        "description": "A graphcheck manifest (written at capture) or live snapshot (written after sleep/wake or reload).",
        "oneOf": [
            {"$ref": "#/$defs/Manifest"},
            {"$ref": "#/$defs/Live"}
        ],
        "$defs": bounded(merge_defs(manifest, live)),
    })
}

/// The JSON Schema of both documents in format 2. What no schema can say is the loader's
/// to check: every column of a table has one value per row, the nodes' counts add up to
/// the rows of `touches` and `ignored`, a name position lies in `names`.
pub fn json_schema_v2() -> serde_json::Value {
    let manifest = schemars::schema_for!(ManifestV2);
    let live = schemars::schema_for!(LiveV2);
    serde_json::json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "graphcheck format v2",
        "description": "A graphcheck manifest (written at capture) or live snapshot (written after sleep/wake or reload), its big tables stored as columns: each table an object of arrays holding one value per record. Every column of a table has the same length; a node's touches are the next `nodes.touches[i]` rows of its graph's `touches`; `nodes.name` holds positions in `names`.",
        "oneOf": [
            {"$ref": "#/$defs/Manifest"},
            {"$ref": "#/$defs/Live"}
        ],
        "$defs": bounded(merge_defs(manifest, live)),
    })
}

/// The schema with the range of every fixed-width integer stated (`maximum` beside
/// schemars' `format`, which validators treat as a note): the loader refuses 2^64 for a
/// u64, and so must the schema.
fn bounded(mut v: serde_json::Value) -> serde_json::Value {
    fn walk(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(o) => {
                let bounds: Option<(serde_json::Value, serde_json::Value)> =
                    match o.get("format").and_then(|f| f.as_str()) {
                        Some("uint32") => Some((0.into(), u32::MAX.into())),
                        Some("uint64") => Some((0.into(), u64::MAX.into())),
                        Some("int64") => Some((i64::MIN.into(), i64::MAX.into())),
                        _ => None,
                    };
                if let Some((min, max)) = bounds
                    && o.get("type").and_then(|t| t.as_str()) == Some("integer")
                {
                    o.insert("minimum".into(), min);
                    o.insert("maximum".into(), max);
                }
                o.values_mut().for_each(walk);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut v);
    v
}

fn merge_defs(manifest: schemars::Schema, live: schemars::Schema) -> serde_json::Value {
    let mut defs = serde_json::Map::new();
    for (name, schema) in [("Manifest", manifest), ("Live", live)] {
        let mut value = schema.to_value();
        if let Some(obj) = value.as_object_mut() {
            if let Some(serde_json::Value::Object(inner)) = obj.remove("$defs") {
                defs.extend(inner);
            }
            obj.remove("$schema");
            obj.remove("title");
        }
        defs.insert(name.to_string(), value);
    }
    serde_json::Value::Object(defs)
}

/// One step of a JSON path: a key of an object, or an index into an array.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Key(String),
    Index(usize),
}

/// A JSON path as error messages print it: `graphs[0].nodes[1].touches[0].tensor`; empty
/// for the top level.
pub fn render_path(path: &[Step]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Step::Index(i) => {
                out.push('[');
                out.push_str(&i.to_string());
                out.push(']');
            }
        }
    }
    out
}

/// The value at `path` in `doc`, where there is one.
pub fn value_at<'a>(doc: &'a serde_json::Value, path: &[Step]) -> Option<&'a serde_json::Value> {
    path.iter().try_fold(doc, |v, step| match step {
        Step::Key(k) => v.get(k.as_str()),
        Step::Index(i) => v.get(*i),
    })
}

/// A JSON value in words: `the number 3`, `the string "x"`, `an object`.
pub fn describe_value(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("`{b}`"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) if s.chars().count() > 40 => {
            let cut: String = s.chars().take(40).collect();
            format!("the string {}…", serde_json::Value::String(cut))
        }
        Value::String(_) => format!("the string {v}"),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// What the schema of a `kind` document of format `version` wants at `path`, in words
/// (`one of "default", "graph"`, `an unsigned 64-bit integer`), where the schema says.
pub fn expected_at(kind: DocKind, version: u32, path: &[Step]) -> Option<String> {
    let root = json_schema_of(version);
    let defs = root.get("$defs")?;
    expected(defs, node_at(defs, kind, path)?)
}

/// What the schema allows at `path`, as facts rather than words: the JSON types
/// (`integer`, `number`, `string`, …, `null` for an optional value) and an integer's
/// `format` (`uint32`, `uint64`, `int64`) where it says one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allowed {
    pub types: Vec<String>,
    pub integer_format: Option<String>,
}

/// [`Allowed`] at `path` of a `kind` document of format `version`, where the schema says.
pub fn allowed_at(kind: DocKind, version: u32, path: &[Step]) -> Option<Allowed> {
    let root = json_schema_of(version);
    let defs = root.get("$defs")?;
    let mut out = Allowed::default();
    allowed(defs, node_at(defs, kind, path)?, &mut out)?;
    Some(out)
}

fn allowed(defs: &serde_json::Value, node: &serde_json::Value, out: &mut Allowed) -> Option<()> {
    if let Some(c) = node.get("const") {
        out.types.push(json_type(c).into());
        return Some(());
    }
    let (node, nullable) = resolve(defs, node)?;
    if nullable {
        out.types.push("null".into());
    }
    if let Some(c) = node.get("const") {
        out.types.push(json_type(c).into());
    } else if let Some(options) = node.get("oneOf").and_then(|o| o.as_array()) {
        for o in options {
            allowed(defs, o, out)?;
        }
    } else {
        match node.get("type")? {
            serde_json::Value::Array(ts) => out
                .types
                .extend(ts.iter().filter_map(|t| t.as_str()).map(String::from)),
            t => out.types.push(t.as_str()?.into()),
        }
        if let Some(f) = node.get("format").and_then(|f| f.as_str())
            && out.types.iter().any(|t| t == "integer")
        {
            out.integer_format = Some(f.into());
        }
    }
    Some(())
}

/// The JSON type of `v` as a schema names it (`integer` for a whole number).
pub fn json_type(v: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_u64() || n.is_i64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The schema node at `path` under the document's root definition.
fn node_at<'a>(
    defs: &'a serde_json::Value,
    kind: DocKind,
    path: &[Step],
) -> Option<&'a serde_json::Value> {
    let mut node = defs.get(match kind {
        DocKind::Manifest => "Manifest",
        DocKind::Live => "Live",
    })?;
    for step in path {
        let (n, _) = resolve(defs, node)?;
        node = match step {
            Step::Key(k) => n
                .get("properties")
                .and_then(|p| p.get(k.as_str()))
                .or_else(|| n.get("additionalProperties").filter(|a| a.is_object()))?,
            // A fixed-length array (a touch) names each element's schema.
            Step::Index(i) => match n.get("prefixItems").and_then(|p| p.get(*i)) {
                Some(item) => item,
                None => n.get("items")?,
            },
        };
    }
    Some(node)
}

/// Follows `$ref`s, and an `anyOf` of one schema and `null` (an optional field) to the
/// schema; says whether `null` was allowed on the way.
fn resolve<'a>(
    defs: &'a serde_json::Value,
    mut node: &'a serde_json::Value,
) -> Option<(&'a serde_json::Value, bool)> {
    let mut nullable = false;
    for _ in 0..16 {
        if let Some(r) = node.get("$ref").and_then(|r| r.as_str()) {
            node = defs.get(r.strip_prefix("#/$defs/")?)?;
        } else if let Some([a, b]) = node
            .get("anyOf")
            .and_then(|a| a.as_array())
            .map(Vec::as_slice)
            && (a.get("type") == Some(&"null".into()) || b.get("type") == Some(&"null".into()))
        {
            nullable = true;
            node = if a.get("type") == Some(&"null".into()) {
                b
            } else {
                a
            };
        } else {
            return Some((node, nullable));
        }
    }
    None
}

fn expected(defs: &serde_json::Value, node: &serde_json::Value) -> Option<String> {
    // A `const` beside a `$ref` (the documents' `kind`) is the one value allowed.
    if let Some(c) = node.get("const") {
        return Some(format!("{c}"));
    }
    let (node, nullable) = resolve(defs, node)?;
    let what = if let Some(c) = node.get("const") {
        format!("{c}")
    } else if let Some(options) = node.get("oneOf").and_then(|o| o.as_array()) {
        let consts: Option<Vec<String>> = options
            .iter()
            .map(|o| o.get("const").map(|c| c.to_string()))
            .collect();
        match consts {
            Some(consts) => format!("one of {}", consts.join(", ")),
            // Alternatives of other kinds (a touch's offset or address): each in words.
            None => options
                .iter()
                .map(|o| expected(defs, o))
                .collect::<Option<Vec<_>>>()?
                .join(" or "),
        }
    } else {
        let types: Vec<String> = match node.get("type")? {
            serde_json::Value::Array(ts) => ts
                .iter()
                .filter_map(|t| t.as_str())
                .map(|t| type_words(t, node))
                .collect(),
            t => vec![type_words(t.as_str()?, node)],
        };
        types.join(" or ")
    };
    Some(if nullable {
        format!("{what} or null")
    } else {
        what
    })
}

fn type_words(t: &str, node: &serde_json::Value) -> String {
    match (t, node.get("format").and_then(|f| f.as_str())) {
        ("integer", Some("uint64")) => "an unsigned 64-bit integer".into(),
        ("integer", Some("uint32")) => "an unsigned 32-bit integer".into(),
        ("integer", Some("int64")) => "a signed 64-bit integer".into(),
        ("integer", _) => "an integer".into(),
        ("string", _) => match node.get("pattern").and_then(|p| p.as_str()) {
            Some(p) => format!("a string matching `{p}`"),
            None => "a string".into(),
        },
        ("array", _) => "an array".into(),
        ("object", _) => "an object".into(),
        ("boolean", _) => "`true` or `false`".into(),
        ("null", _) => "null".into(),
        (other, _) => format!("a {other}"),
    }
}
