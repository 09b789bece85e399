//! The JSON Schema of the format, generated from the types of [`super::format`]; committed
//! as `schema/graphcheck-v1.schema.json`, which a test keeps equal to this.

use super::format::{Live, Manifest};

/// The JSON Schema of both documents, as `graphcheck schema` prints it.
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
        "$defs": merge_defs(manifest, live),
    })
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
