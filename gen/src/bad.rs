//! Hand-broken inputs for the bad-input tests, each cut from a good document of the
//! corpus, with the words the error must contain. The words are what
//! `graphcheck::document::load::parse_manifest` says today (the tests below hold it to that).

use crate::fixtures::{Files, pretty};
use crate::index::BadEntry;
use crate::scenarios::Scenario;

/// A syntax error on line 5: the string is never closed.
pub const BAD_ALLOW: &str = r#"# An allowlist with a syntax error on line 5.

[[allow]]
kinds = ["unregistered"]
path = "model.layers[*].mlp.gate_up_proj.quant_method.kernel.workspace
reason = "the quote above is never closed"
"#;

/// The broken files of `base` (a scenario with a live snapshot) and their index entries.
pub fn inputs(base: &Scenario) -> (Files, Vec<BadEntry>) {
    let mut files = Files::new();
    let mut entries = Vec::new();
    let mut add = |name: &str, as_: &str, bytes: Vec<u8>, contains: &[&str]| {
        let file = format!("bad/{name}");
        let mut error_contains = vec![file.clone()];
        error_contains.extend(contains.iter().map(|s| s.to_string()));
        files.insert(file.clone(), bytes);
        entries.push(BadEntry {
            file,
            as_: as_.into(),
            error_contains,
        });
    };
    let manifest = serde_json::to_value(&base.manifest).expect("serializes");
    let live = base
        .live
        .as_ref()
        .expect("the base scenario has a live snapshot");

    add(
        "not_json.json",
        "manifest",
        b"graphcheck manifest for decode_bs8, see attached\n".to_vec(),
        &[":1:1:", "expected value"],
    );

    // Cut inside the second touch's address of the first graph's first node.
    let whole = pretty(&base.manifest);
    let text = std::str::from_utf8(&whole).expect("JSON is UTF-8");
    let graphs = text.find("\"graphs\": [").expect("graphs");
    let touches = graphs + text[graphs..].find("\"touches\": [").expect("touches");
    let first = touches + text[touches..].find("\"addr\": \"").expect("addr");
    let second = first + 1 + text[first + 1..].find("\"addr\": \"").expect("addr");
    let cut = second + "\"addr\": \"0x7f".len();
    add(
        "truncated.json",
        "manifest",
        whole[..cut].to_vec(),
        &["graphs[0].nodes[0].touches[1].addr", "EOF while parsing"],
    );

    let v2 = serde_json::json!({
        "format_version": 2,
        "kind": "manifest",
        "producer": {"tool": "graphcheck.torch", "tool_version": "2.0.0"},
        "captures": [{"graph": "decode_bs8", "kernels": [{"name": "marlin::Marlin", "words": ["0x7f2c00000000"]}]}]
    });
    add(
        "wrong_version.json",
        "manifest",
        pretty(&v2),
        &["`format_version` is 2", "reads version 1"],
    );

    let mut missing = manifest.clone();
    missing
        .as_object_mut()
        .expect("object")
        .remove("graphs")
        .expect("had graphs");
    add(
        "missing_field.json",
        "manifest",
        pretty(&missing),
        &["missing field `graphs`"],
    );

    let mut dangling = manifest.clone();
    dangling["graphs"][0]["nodes"][1]["touches"][0]["tensor"] = serde_json::json!(999);
    add(
        "dangling_tensor.json",
        "manifest",
        pretty(&dangling),
        &[
            "graphs[0].nodes[1].touches[0].tensor",
            "no tensor has id 999",
        ],
    );

    let mut dup = manifest.clone();
    let first_id = dup["tensors"][0]["id"].clone();
    dup["tensors"][1]["id"] = first_id;
    add(
        "duplicate_tensor_id.json",
        "manifest",
        pretty(&dup),
        &["tensors[1].id", "two tensors claim id 0"],
    );

    // A live snapshot where a manifest is expected.
    add(
        "wrong_kind.json",
        "manifest",
        pretty(live),
        &["`kind` is `live`", "expected a `manifest` document"],
    );

    add(
        "bad_allow.toml",
        "allow",
        BAD_ALLOW.as_bytes().to_vec(),
        &["line 5"],
    );
    (files, entries)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::fixtures::corpus;
    use crate::index::Index;

    /// Every broken manifest fails to load with an error that names the file and the fault.
    #[test]
    fn bad_inputs_fail_with_the_promised_words() {
        let files = corpus();
        let index: Index = serde_json::from_slice(&files["index.json"]).unwrap();
        assert_eq!(index.bad.len(), 8);
        for bad in &index.bad {
            let bytes = &files[&bad.file];
            // The CLI names the file as the user spelled it; this is the path under fixtures/.
            let message = match bad.as_.as_str() {
                "manifest" => {
                    let err =
                        graphcheck::document::load::parse_manifest(bytes, Path::new(&bad.file))
                            .expect_err(&bad.file);
                    err.to_string()
                }
                "allow" => {
                    let text = std::str::from_utf8(bytes).unwrap();
                    let err = toml::from_str::<toml::Value>(text).expect_err(&bad.file);
                    format!("{}: {err}", bad.file)
                }
                other => panic!("unexpected `as` {other}"),
            };
            for want in &bad.error_contains {
                assert!(
                    message.contains(want.as_str()),
                    "{}: {message:?} lacks {want:?}",
                    bad.file
                );
            }
        }
    }
}
