//! Rendering the corpus to bytes, writing it, and checking a folder against it.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context as _;
use serde::Serialize;

use crate::index::{INDEX_VERSION, Index, RanksEntry, ScenarioEntry};
use crate::scenarios::{self, Scenario};

/// Every file of the corpus, by path relative to the fixtures folder.
pub type Files = BTreeMap<String, Vec<u8>>;

/// Pretty JSON with a trailing newline: the corpus' spelling of the index and of format 1
/// documents.
pub fn pretty<T: Serialize>(value: &T) -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(value).expect("format types serialize");
    bytes.push(b'\n');
    bytes
}

/// A document as the corpus spells it: format 2's columns with short arrays on one line
/// (`[132, 1, 1]`, a node's touches), so that a column reads as a list of values, not one
/// number a line; format 1 as [`pretty`] writes it. Keys keep the order the writer gives
/// them (`format_version` first).
pub fn pretty_doc<T: Serialize>(value: &T) -> Vec<u8> {
    let compact = serde_json::to_string(value).expect("format types serialize");
    let (tree, _) = Json::parse(compact.as_bytes(), 0);
    if let Json::Object(fields) = &tree
        && fields
            .iter()
            .any(|(k, v)| k == "\"format_version\"" && matches!(v, Json::Scalar(s) if s == "1"))
    {
        return pretty(value);
    }
    let mut out = String::new();
    tree.write(&mut out, 0);
    out.push('\n');
    out.into_bytes()
}

/// Compact JSON text as a tree, every scalar and key kept as written.
enum Json {
    Scalar(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    /// Parses the value at `at` of compact JSON text `serde_json` wrote; returns it and
    /// where it ends.
    fn parse(b: &[u8], at: usize) -> (Json, usize) {
        match b[at] {
            b'[' => {
                let (mut items, mut i) = (Vec::new(), at + 1);
                while b[i] != b']' {
                    let (v, next) = Json::parse(b, i);
                    items.push(v);
                    i = if b[next] == b',' { next + 1 } else { next };
                }
                (Json::Array(items), i + 1)
            }
            b'{' => {
                let (mut fields, mut i) = (Vec::new(), at + 1);
                while b[i] != b'}' {
                    let key_end = Json::string_end(b, i);
                    let key = String::from_utf8_lossy(&b[i..key_end]).into_owned();
                    let (v, next) = Json::parse(b, key_end + 1);
                    fields.push((key, v));
                    i = if b[next] == b',' { next + 1 } else { next };
                }
                (Json::Object(fields), i + 1)
            }
            b'"' => {
                let end = Json::string_end(b, at);
                (
                    Json::Scalar(String::from_utf8_lossy(&b[at..end]).into_owned()),
                    end,
                )
            }
            _ => {
                let end = at
                    + b[at..]
                        .iter()
                        .position(|c| matches!(c, b',' | b']' | b'}'))
                        .unwrap_or(b.len() - at);
                (
                    Json::Scalar(String::from_utf8_lossy(&b[at..end]).into_owned()),
                    end,
                )
            }
        }
    }

    /// The end (past the closing quote) of the string opening at `at`.
    fn string_end(b: &[u8], at: usize) -> usize {
        let mut i = at + 1;
        while b[i] != b'"' {
            i += if b[i] == b'\\' { 2 } else { 1 };
        }
        i + 1
    }

    /// How deep arrays nest (a scalar: 0); an object is too deep to inline.
    fn depth(&self) -> usize {
        match self {
            Json::Scalar(_) => 0,
            Json::Array(a) => 1 + a.iter().map(Json::depth).max().unwrap_or(0),
            Json::Object(_) => usize::MAX / 2,
        }
    }

    fn write(&self, out: &mut String, indent: usize) {
        let pad = |out: &mut String, n: usize| out.extend(std::iter::repeat_n(' ', n));
        match self {
            Json::Scalar(s) => out.push_str(s),
            // Arrays of scalars, and arrays of those: one line.
            Json::Array(a) if self.depth() <= 2 || a.is_empty() => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    x.write(out, indent);
                }
                out.push(']');
            }
            Json::Array(a) => {
                out.push_str("[\n");
                for (i, x) in a.iter().enumerate() {
                    pad(out, indent + 2);
                    x.write(out, indent + 2);
                    out.push_str(if i + 1 < a.len() { ",\n" } else { "\n" });
                }
                pad(out, indent);
                out.push(']');
            }
            Json::Object(o) if o.is_empty() => out.push_str("{}"),
            Json::Object(o) => {
                out.push_str("{\n");
                for (i, (k, x)) in o.iter().enumerate() {
                    pad(out, indent + 2);
                    out.push_str(k);
                    out.push_str(": ");
                    x.write(out, indent + 2);
                    out.push_str(if i + 1 < o.len() { ",\n" } else { "\n" });
                }
                pad(out, indent);
                out.push('}');
            }
        }
    }
}

/// The whole corpus: scenarios, bad inputs and the index.
pub fn corpus() -> Files {
    corpus_of(&scenarios::all())
}

/// The corpus of these scenarios; the first is the base the bad inputs are cut from.
pub fn corpus_of(all: &[Scenario]) -> Files {
    let mut files = Files::new();
    let mut entries = Vec::new();
    for s in all {
        let dir = format!("synthetic/{}", s.name);
        let manifest = format!("{dir}/manifest.json");
        files.insert(manifest.clone(), pretty_doc(&s.manifest));
        let live = s.live.as_ref().map(|l| {
            let p = format!("{dir}/live.json");
            files.insert(p.clone(), pretty_doc(l));
            p
        });
        let allow = s.allow.as_ref().map(|a| {
            let p = format!("{dir}/allow.toml");
            files.insert(p.clone(), a.as_bytes().to_vec());
            p
        });
        entries.push(ScenarioEntry {
            name: s.name.into(),
            description: s.description.clone(),
            made_by: s.made_by(),
            manifest,
            live,
            allow,
            explain: s.explain.clone(),
            explain_misses: Vec::new(),
            expect: s.expect.clone(),
        });
    }
    let base = all.first().expect("at least one scenario");
    let (bad_files, bad) = crate::bad::inputs(base);
    files.extend(bad_files);
    let mut ranks = Vec::new();
    for r in scenarios::ranks::all() {
        let dir = format!("ranks/{}", r.name);
        for (name, doc) in &r.files {
            let bytes = match doc {
                Ok(m) => pretty_doc(m),
                Err(l) => pretty_doc(l),
            };
            files.insert(format!("{dir}/{name}"), bytes);
        }
        ranks.push(RanksEntry {
            name: r.name.into(),
            description: r.description.clone(),
            made_by: r.made_by(),
            dir,
            expect: r.expect.clone(),
        });
    }
    let index = Index {
        format_version: INDEX_VERSION,
        scenarios: entries,
        bad,
        ranks,
    };
    files.insert("index.json".into(), pretty(&index));
    files
}

/// Writes every file under `out`, atomically, creating folders as needed.
pub fn write(out: &Path, files: &Files) -> anyhow::Result<()> {
    for (rel, bytes) in files {
        let path = out.join(rel);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("failed to create {}", dir.display()))?;
        }
        graphcheck::app::output::write_atomic(&path, bytes)
            .with_context(|| format!("failed to write {}", path.display()))?;
    }
    Ok(())
}

/// What differs between `out` and the corpus: files missing, files with other bytes, and
/// files under the generated folders that the generator does not make. Sorted.
pub fn check(out: &Path, files: &Files) -> Vec<String> {
    let mut differ = Vec::new();
    for (rel, bytes) in files {
        match std::fs::read(out.join(rel)) {
            Ok(have) if &have == bytes => {}
            Ok(_) => differ.push(format!("{rel} (differs)")),
            Err(_) => differ.push(format!("{rel} (missing)")),
        }
    }
    for top in ["synthetic", "bad", "ranks"] {
        let mut stack = vec![out.join(top)];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let path = e.path();
                if path.is_dir() {
                    stack.push(path);
                } else if let Ok(rel) = path.strip_prefix(out) {
                    let rel = rel.to_string_lossy().replace('\\', "/");
                    if !files.contains_key(&rel) {
                        differ.push(format!("{rel} (not generated)"));
                    }
                }
            }
        }
    }
    differ.sort();
    differ
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashSet};
    use std::path::Path;

    use super::*;
    use crate::index::{Index, Kind};

    fn index(files: &Files) -> Index {
        serde_json::from_slice(&files["index.json"]).expect("index.json parses")
    }

    /// Every document of the corpus passes the loader's validation, under its own name.
    #[test]
    fn every_document_loads() {
        let files = corpus();
        let index = index(&files);
        assert_eq!(index.scenarios.len(), 22);
        for s in &index.scenarios {
            graphcheck::codec::load::parse_manifest(&files[&s.manifest], Path::new(&s.manifest))
                .unwrap_or_else(|e| panic!("{e}"));
            if let Some(l) = &s.live {
                graphcheck::codec::load::parse_live(&files[l], Path::new(l))
                    .unwrap_or_else(|e| panic!("{e}"));
            }
            if let Some(a) = &s.allow {
                let text = std::str::from_utf8(&files[a]).unwrap();
                toml::from_str::<toml::Value>(text).unwrap_or_else(|e| panic!("{a}: {e}"));
            }
        }
    }

    /// Two runs give the same bytes.
    #[test]
    fn corpus_is_deterministic() {
        assert!(corpus() == corpus());
    }

    /// `--check` right after writing finds nothing, and finds an edit and a stray file.
    #[test]
    fn check_after_write_finds_no_difference() {
        let dir = tempfile::tempdir().unwrap();
        let files = corpus();
        write(dir.path(), &files).unwrap();
        assert_eq!(check(dir.path(), &files), Vec::<String>::new());
        std::fs::write(dir.path().join("index.json"), "{}").unwrap();
        std::fs::write(dir.path().join("synthetic/stray.json"), "{}").unwrap();
        assert_eq!(
            check(dir.path(), &files),
            vec![
                "index.json (differs)".to_string(),
                "synthetic/stray.json (not generated)".to_string()
            ]
        );
    }

    /// The committed `fixtures/` folder is what the generator writes.
    #[test]
    fn committed_fixtures_match_the_generator() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
        let differ = check(&dir, &corpus());
        assert!(
            differ.is_empty(),
            "fixtures/ differs from the generator; run `cargo run -p graphcheck-gen -- fixtures`:\n{}",
            differ.join("\n")
        );
    }

    /// The hand-written expectations are well-formed: kinds in report order, subjects
    /// sorted within a kind, every path of a subject an owner of the manifest, and where
    /// `graphs` is given, it names exactly the graphs whose touches name those tensors.
    #[test]
    fn expectations_are_consistent_with_their_data() {
        for s in scenarios::all() {
            let m = &s.manifest;
            for list in [&s.expect.findings, &s.expect.allowed] {
                let keys: Vec<(Kind, &str)> =
                    list.iter().map(|f| (f.kind, f.subject.as_str())).collect();
                let mut sorted = keys.clone();
                sorted.sort();
                assert_eq!(keys, sorted, "{}: findings out of report order", s.name);
            }
            // Exit 1 exactly when a finding is an error; `unused_allow` alone warns.
            assert_eq!(
                s.expect.exit_code,
                i32::from(
                    s.expect
                        .findings
                        .iter()
                        .any(|f| f.severity == crate::index::Severity::Error)
                ),
                "{}",
                s.name
            );
            for f in &s.expect.findings {
                assert_eq!(
                    f.severity == crate::index::Severity::Warning,
                    f.kind == Kind::UnusedAllow,
                    "{}: {:?} {}",
                    s.name,
                    f.kind,
                    f.subject
                );
            }
            for f in s.expect.findings.iter().chain(&s.expect.allowed) {
                if f.kind == Kind::UnusedAllow {
                    continue;
                }
                if let Some(hex) = f.subject.strip_prefix("0x") {
                    // An address no owner explains (`unowned`, and `freed` or `reused` of
                    // it): here always an allocation's base, read by the graphs named
                    // through touches that name no tensor.
                    assert!(
                        matches!(f.kind, Kind::Unowned | Kind::Freed | Kind::Reused),
                        "{}: {:?} of an address",
                        s.name,
                        f.kind
                    );
                    let base = u64::from_str_radix(hex, 16).expect("a hex subject");
                    let alloc = m
                        .allocations
                        .iter()
                        .find(|a| a.base.0 == base)
                        .unwrap_or_else(|| panic!("{}: no allocation at {}", s.name, f.subject));
                    if let Some(graphs) = &f.graphs {
                        let touching: BTreeSet<&str> = m
                            .graphs
                            .iter()
                            .filter(|g| {
                                g.nodes.iter().flat_map(|n| &n.touches).any(|t| {
                                    t.tensor.is_none()
                                        && graphcheck::index::refs::in_range(
                                            t.addr, alloc.base, alloc.size,
                                        )
                                })
                            })
                            .map(|g| g.name.as_str())
                            .collect();
                        let want: Vec<&str> = graphs.iter().map(String::as_str).collect();
                        assert_eq!(
                            want,
                            touching.into_iter().collect::<Vec<_>>(),
                            "{}: {:?} {}",
                            s.name,
                            f.kind,
                            f.subject
                        );
                    }
                    continue;
                }
                let paths: Vec<&str> = f.subject.split(" = ").collect();
                let mut sorted = paths.clone();
                sorted.sort();
                assert_eq!(paths, sorted, "{}: {} paths unsorted", s.name, f.subject);
                // A path rebound between two captures is given once per storage: the
                // subject is one of them (each is its own), so one choice must match.
                let held = |p: &str| -> Vec<graphcheck::model::format::TensorId> {
                    let v: Vec<graphcheck::model::format::TensorId> = m
                        .owners
                        .iter()
                        .filter(|o| o.path == p)
                        .map(|o| o.tensor)
                        .collect();
                    assert!(!v.is_empty(), "{}: no owner {p}", s.name);
                    v
                };
                let rest: HashSet<graphcheck::model::format::TensorId> =
                    paths[1..].iter().flat_map(|p| held(p)).collect();
                if let Some(graphs) = &f.graphs {
                    let want: Vec<&str> = graphs.iter().map(String::as_str).collect();
                    let choices: Vec<Vec<&str>> = held(paths[0])
                        .into_iter()
                        .map(|first| {
                            let mut tensors = rest.clone();
                            tensors.insert(first);
                            let touching: BTreeSet<&str> =
                                m.graphs
                                    .iter()
                                    .filter(|g| {
                                        g.nodes.iter().flat_map(|n| &n.touches).any(|t| {
                                            t.tensor.is_some_and(|id| tensors.contains(&id))
                                        })
                                    })
                                    .map(|g| g.name.as_str())
                                    .collect();
                            touching.into_iter().collect()
                        })
                        .collect();
                    assert!(
                        choices.contains(&want),
                        "{}: {:?} {}: {want:?} is none of {choices:?}",
                        s.name,
                        f.kind,
                        f.subject
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod consistency {
    use graphcheck::model::format::PoolKind;

    use crate::scenarios;

    /// Each touch names the tensor its address lies in (when one does) and the allocation
    /// that holds it, as a walker would resolve them; an address no tensor covers lies in
    /// the graph pool, except where a scenario means it to be unowned.
    #[test]
    fn touches_resolve_as_a_walker_would() {
        for s in scenarios::all() {
            let m = &s.manifest;
            for touch in m
                .graphs
                .iter()
                .flat_map(|g| &g.nodes)
                .flat_map(|n| &n.touches)
            {
                let containing: Vec<_> = m
                    .tensors
                    .iter()
                    .filter(|t| t.contains(touch.addr))
                    .map(|t| t.id)
                    .collect();
                match touch.tensor {
                    Some(id) => assert!(containing.contains(&id), "{}: {touch:?}", s.name),
                    None => assert!(containing.is_empty(), "{}: {touch:?}", s.name),
                }
                let alloc = m
                    .allocations
                    .iter()
                    .find(|a| graphcheck::index::refs::in_range(touch.addr, a.base, a.size))
                    .unwrap_or_else(|| panic!("{}: {touch:?} in no allocation", s.name));
                assert_eq!(touch.allocation, Some(alloc.id), "{}", s.name);
                if touch.tensor.is_none() && !s.name.starts_with("module_global_cache") {
                    let pool = m.pools.iter().find(|p| Some(p.id) == alloc.pool).unwrap();
                    assert_eq!(pool.kind, PoolKind::Graph, "{}: {touch:?}", s.name);
                }
            }
            // Allocations never overlap.
            let mut spans: Vec<(u64, u64)> = m
                .allocations
                .iter()
                .map(|a| (a.base.0, a.base.0 + a.size))
                .collect();
            spans.sort();
            assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "{}", s.name);
        }
    }
}
