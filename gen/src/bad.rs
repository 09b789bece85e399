//! Hand-broken inputs for the bad-input tests, each cut from a good document of the
//! corpus, with the words the error must contain. The words are what
//! `graphcheck::codec::load::parse_manifest` says today (the tests below hold it to that).
//! Most are format 1 documents (format 1 stays readable, and its errors stay what they
//! were); those named `v2_*` are format 2's own faults.

use crate::fixtures::{Files, pretty, pretty_doc};
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
    let mut add = |name: &str, as_: &str, schema_valid: bool, bytes: Vec<u8>, contains: &[&str]| {
        let file = format!("bad/{name}");
        let mut error_contains = vec![file.clone()];
        error_contains.extend(contains.iter().map(|s| s.to_string()));
        files.insert(file.clone(), bytes);
        entries.push(BadEntry {
            file,
            as_: as_.into(),
            error_contains,
            schema_valid,
        });
    };
    let v1 = base.manifest.clone().in_version(1);
    let manifest = serde_json::to_value(&v1).expect("serializes");
    let live = &base
        .live
        .clone()
        .expect("the base scenario has a live snapshot")
        .in_version(1);
    let live_value = serde_json::to_value(live).expect("serializes");

    add(
        "not_json.json",
        "manifest",
        false,
        b"graphcheck manifest for decode_bs8, see attached\n".to_vec(),
        &[":1:1:", "expected value"],
    );

    // Bytes that are no JSON object, each said in words rather than serde's.
    add(
        "empty.json",
        "manifest",
        false,
        Vec::new(),
        &["the file is empty"],
    );
    let mut bom = b"\xEF\xBB\xBF".to_vec();
    bom.extend(pretty(&v1));
    add(
        "byte_order_mark.json",
        "manifest",
        false,
        bom,
        &["starts with a UTF-8 byte-order mark"],
    );
    add(
        "top_level_array.json",
        "manifest",
        false,
        b"[]\n".to_vec(),
        &["not a graphcheck document: it is a JSON array, not an object"],
    );
    let mut huge = manifest.clone();
    huge["format_version"] = serde_json::json!(0);
    let huge = String::from_utf8(pretty(&huge))
        .expect("JSON is UTF-8")
        .replacen(
            "\"format_version\": 0",
            "\"format_version\": 18446744073709551617",
            1,
        );
    add(
        "version_past_u64.json",
        "manifest",
        false,
        huge.into_bytes(),
        &["`format_version` is 18446744073709551617, but this graphcheck reads versions 1 and 2"],
    );

    // Cut inside the second touch's address of the first graph's first node.
    let whole = pretty(&v1);
    let text = std::str::from_utf8(&whole).expect("JSON is UTF-8");
    let graphs = text.find("\"graphs\": [").expect("graphs");
    let touches = graphs + text[graphs..].find("\"touches\": [").expect("touches");
    let first = touches + text[touches..].find("\"addr\": \"").expect("addr");
    let second = first + 1 + text[first + 1..].find("\"addr\": \"").expect("addr");
    let cut = second + "\"addr\": \"0x7f".len();
    add(
        "truncated.json",
        "manifest",
        false,
        whole[..cut].to_vec(),
        &[
            "graphs[0].nodes[0].touches[1].addr",
            "the document ends early, in the middle of a string",
        ],
    );

    // Cut just inside the fourth pool's object: the parser stops between a key and its
    // value, where the JSON path once ended in `?`.
    let pools = text.find("\"pools\": [").expect("pools");
    let fourth = pools
        + text[pools..]
            .match_indices('{')
            .nth(3)
            .expect("four pools")
            .0;
    add(
        "truncated_in_pools.json",
        "manifest",
        false,
        whole[..fourth + 1].to_vec(),
        &["invalid document at `pools[3]`: the document ends early, in the middle of an object"],
    );

    let v3 = serde_json::json!({
        "format_version": 3,
        "kind": "manifest",
        "producer": {"tool": "graphcheck.torch", "tool_version": "3.0.0"},
        "captures": [{"graph": "decode_bs8", "kernels": [{"name": "marlin::Marlin", "words": ["0x7f2c00000000"]}]}]
    });
    add(
        "wrong_version.json",
        "manifest",
        false,
        pretty(&v3),
        &["`format_version` is 3", "reads versions 1 and 2"],
    );

    // Valid v1 bodies under another version: refused before the body is read, or, under
    // 2, read as format 2 and refused where the layouts differ, saying so.
    for (name, as_, doc, version, words) in [
        (
            "version_2.json",
            "manifest",
            &manifest,
            serde_json::json!(2),
            "at `allocations`: expected an object, found an array (the body is in format 1's \
             layout: a format 1 document says `\"format_version\": 1`)",
        ),
        (
            "version_0.json",
            "manifest",
            &manifest,
            serde_json::json!(0),
            "`format_version` is 0, but this graphcheck reads versions 1 and 2",
        ),
        (
            "version_string.json",
            "manifest",
            &manifest,
            serde_json::json!("1"),
            "`format_version` must be the number 1 or 2, not the string \"1\"",
        ),
        (
            "live_version_99.json",
            "live",
            &live_value,
            serde_json::json!(99),
            "`format_version` is 99, but this graphcheck reads versions 1 and 2",
        ),
    ] {
        let mut doc = doc.clone();
        doc["format_version"] = version;
        add(name, as_, false, pretty(&doc), &[words]);
    }

    // A sign after the prefix: `u64::from_str_radix` takes it, the schema's pattern not.
    let mut plus = manifest.clone();
    let base_addr = plus["allocations"][0]["base"]
        .as_str()
        .expect("an address")
        .to_string();
    plus["allocations"][0]["base"] = format!("0x+{}", &base_addr[2..]).into();
    add(
        "addr_plus_sign.json",
        "manifest",
        false,
        pretty(&plus),
        &["`allocations[0].base`", "invalid value: string \"0x+"],
    );

    // Valid JSON with a number where a name is due.
    let mut wrong_type = manifest.clone();
    wrong_type["pools"][1]["kind"] = 3.into();
    add(
        "wrong_type.json",
        "manifest",
        false,
        pretty(&wrong_type),
        &[
            "`pools[1].kind`",
            "expected one of \"default\", \"graph\", \"weights\", \"kv_cache\", \"other\", found the number 3",
        ],
    );

    // A record written as an array of its fields: serde's derive reads that, the schema
    // does not.
    let mut as_array = manifest.clone();
    let pool = as_array["pools"][1].clone();
    as_array["pools"][1] =
        serde_json::json!([pool["id"], pool["name"], pool["kind"], pool["sleep"]]);
    add(
        "record_as_array.json",
        "manifest",
        false,
        pretty(&as_array),
        &["`pools[1]`", "expected an object, found an array"],
    );

    // An integer past 64 bits, which serde_json reads as a float.
    let size = format!("\"size\": {}", v1.allocations[0].size);
    assert!(
        text.contains(&size),
        "the first allocation's size is in the text"
    );
    add(
        "u64_overflow.json",
        "manifest",
        false,
        text.replacen(&size, "\"size\": 18446744073709551616", 1)
            .into_bytes(),
        &[
            "`allocations[0].size`",
            "the number 18446744073709551616 is out of range for an unsigned 64-bit value",
        ],
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
        false,
        pretty(&missing),
        &["missing field `graphs`"],
    );

    let mut dangling = manifest.clone();
    dangling["graphs"][0]["nodes"][1]["touches"][0]["tensor"] = serde_json::json!(999);
    add(
        "dangling_tensor.json",
        "manifest",
        true,
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
        true,
        pretty(&dup),
        &["tensors[1].id", "two tensors claim id 0"],
    );

    // A live snapshot where a manifest is expected.
    add(
        "wrong_kind.json",
        "manifest",
        true,
        pretty(live),
        &["`kind` is `live`", "expected a `manifest` document"],
    );

    // Live snapshots that do not belong with the base manifest: each valid alone.
    let mut other_rank = live.clone();
    other_rank.producer.rank = 3;
    other_rank.producer.world_size = 8;
    add(
        "live_other_rank.json",
        "live",
        true,
        pretty(&other_rank),
        &[
            "cannot be verified against",
            "the manifest was recorded on rank 0 of 1, the live snapshot on rank 3 of 8",
        ],
    );
    let mut no_probe = live.clone();
    let dropped = no_probe.probes.remove(0).addr.to_string();
    let graphs: std::collections::BTreeSet<&str> = v1
        .graphs
        .iter()
        .filter(|g| {
            g.nodes
                .iter()
                .flat_map(|n| &n.touches)
                .any(|t| t.addr.to_string() == dropped)
        })
        .map(|g| g.name.as_str())
        .collect();
    let named = graphs
        .iter()
        .map(|g| format!("`{g}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let probe_words = if graphs.len() == 1 {
        format!("the live snapshot has no probe for {dropped}, which graph {named} holds")
    } else {
        format!("the live snapshot has no probe for {dropped}, which graphs {named} hold")
    };
    add(
        "live_missing_probe.json",
        "live",
        true,
        pretty(&no_probe),
        &["cannot be verified against", &probe_words],
    );

    v2_inputs(base, &mut add);

    add(
        "bad_allow.toml",
        "allow",
        false,
        BAD_ALLOW.as_bytes().to_vec(),
        &["line 5"],
    );
    (files, entries)
}

/// Format 2's own faults, cut from `base` in format 2: what no schema can see (columns of
/// different lengths, a name position past `names`, an offset with nothing to count from,
/// a dangling id inside a touch) and what one can (a touch of four values).
fn v2_inputs(base: &Scenario, add: &mut impl FnMut(&str, &str, bool, Vec<u8>, &[&str])) {
    let v2 = base.manifest.clone().in_version(2);
    let manifest = serde_json::to_value(&v2).expect("serializes");
    let live = base.live.clone().expect("a live snapshot").in_version(2);
    let live = serde_json::to_value(&live).expect("serializes");
    let changed = |doc: &serde_json::Value, pointer: &str, value: serde_json::Value| {
        let mut doc = doc.clone();
        *doc.pointer_mut(pointer).expect("the pointer names a value") = value;
        pretty_doc(&doc)
    };
    // The first graph's node 1, its first touch, where format 1's `dangling_tensor.json`
    // names a tensor that does not exist.
    let touch = "/graphs/0/nodes/touches/1/0";
    add(
        "v2_dangling_tensor.json",
        "manifest",
        true,
        changed(&manifest, &format!("{touch}/3"), 999.into()),
        &[
            "`graphs[0].nodes.touches[1][0][3]`",
            "no tensor has id 999 (node 1's touch 0, its `tensor`)",
        ],
    );
    add(
        "v2_offset_from_nothing.json",
        "manifest",
        true,
        {
            let mut doc = manifest.clone();
            let t = doc.pointer_mut(touch).expect("a touch");
            t[2] = 64.into();
            t[3] = serde_json::Value::Null;
            t[4] = serde_json::Value::Null;
            pretty_doc(&doc)
        },
        &[
            "`graphs[0].nodes.touches[1][0][2]`",
            "the offset 64 counts from the touch's tensor or allocation, but it names neither",
        ],
    );
    add(
        "v2_short_touch.json",
        "manifest",
        false,
        changed(&manifest, touch, serde_json::json!([0, 0, 0, 1])),
        &[
            "`graphs[0].nodes.touches[1][0]`",
            "invalid length 4, expected a touch: [param, offset, addr, tensor, allocation]",
        ],
    );
    let mut dtypes = manifest["tensors"]["dtype"].clone();
    dtypes.as_array_mut().expect("a column").pop();
    add(
        "v2_short_column.json",
        "manifest",
        true,
        changed(&manifest, "/tensors/dtype", dtypes),
        &[
            "`tensors.dtype`",
            "but `tensors.id` has",
            "every column of a table holds one value per row",
        ],
    );
    add(
        "v2_name_position.json",
        "manifest",
        true,
        changed(&manifest, "/graphs/0/nodes/name/0", 4096.into()),
        &["`graphs[0].nodes.name[0]`", "no name at position 4096"],
    );
    let mut states = live["probes"]["state"].clone();
    states
        .as_array_mut()
        .expect("a column")
        .push("active".into());
    add(
        "v2_live_long_column.json",
        "live",
        true,
        changed(&live, "/probes/state", states),
        &["`probes.state`", "but `probes.addr` has"],
    );
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use graphcheck::check::allow::Allowlist;
    use graphcheck::check::pair::PairError;
    use graphcheck::check::verify::{VerifyError, verify};
    use graphcheck::model::format::{AllocState, Manifest};

    use crate::fixtures::corpus;
    use crate::index::Index;

    fn index(files: &crate::fixtures::Files) -> Index {
        serde_json::from_slice(&files["index.json"]).unwrap()
    }

    /// The manifest the bad inputs are cut from (the first scenario's), as the CLI test
    /// pairs a bad live snapshot with it.
    fn base_manifest(files: &crate::fixtures::Files, index: &Index) -> (String, Manifest) {
        let file = index.scenarios[0].manifest.clone();
        let m = graphcheck::codec::load::parse_manifest(&files[&file], Path::new(&file)).unwrap();
        (file, m)
    }

    /// Every broken input fails to load (a live snapshot: to load, or to pair with the
    /// base manifest) with an error that names the file and the fault.
    #[test]
    fn bad_inputs_fail_with_the_promised_words() {
        let files = corpus();
        let index = index(&files);
        assert_eq!(index.bad.len(), 29);
        let (manifest_file, manifest) = base_manifest(&files, &index);
        for bad in &index.bad {
            let bytes = &files[&bad.file];
            let name = Path::new(&bad.file);
            // The CLI names the file as the user spelled it; this is the path under fixtures/.
            let message = match bad.as_.as_str() {
                "manifest" => graphcheck::codec::load::parse_manifest(bytes, name)
                    .expect_err(&bad.file)
                    .to_string(),
                "live" => match graphcheck::codec::load::parse_live(bytes, name) {
                    Err(e) => e.to_string(),
                    Ok(live) => graphcheck::check::pair::check_pair(&manifest, &live)
                        .expect_err(&bad.file)
                        .in_files(Path::new(&manifest_file), name)
                        .to_string(),
                },
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
            // A JSON path ends where the document broke, never in serde's `?`.
            assert!(!message.contains("?`"), "{}: {message}", bad.file);
        }
    }

    /// The committed schemas of both format versions.
    struct Schemas([jsonschema::Validator; 2]);

    fn schema() -> Schemas {
        let load = |version: u32| {
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(format!("../schema/graphcheck-v{version}.schema.json"));
            let schema: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            jsonschema::validator_for(&schema).expect("the committed schema compiles")
        };
        Schemas([load(1), load(2)])
    }

    /// The schema's first complaint, or `None` where the document validates: against the
    /// schema of its `format_version`; a document of no version this build reads must fail
    /// both.
    fn schema_error(schemas: &Schemas, bytes: &[u8]) -> Option<String> {
        let doc = match serde_json::from_slice::<serde_json::Value>(bytes) {
            Err(e) => return Some(format!("not JSON: {e}")),
            Ok(doc) => doc,
        };
        let first = |s: &jsonschema::Validator| {
            s.iter_errors(&doc)
                .next()
                .map(|e| format!("{} at {}", e, e.instance_path()))
        };
        match doc["format_version"].as_u64() {
            Some(1) => first(&schemas.0[0]),
            Some(2) => first(&schemas.0[1]),
            _ => first(&schemas.0[0]).and(first(&schemas.0[1])),
        }
    }

    /// Every document the loader accepts validates against the committed schema: the
    /// synthetic corpus and every document the GPU corpus (`fixtures/gpu/index.json`)
    /// names.
    #[test]
    fn every_document_the_loader_accepts_validates_against_the_schema() {
        let schema = schema();
        let files = corpus();
        let mut docs: Vec<(String, String, Vec<u8>)> = Vec::new();
        for s in &index(&files).scenarios {
            docs.push((
                "manifest".into(),
                s.manifest.clone(),
                files[&s.manifest].clone(),
            ));
            if let Some(l) = &s.live {
                docs.push(("live".into(), l.clone(), files[l].clone()));
            }
        }
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
        let gpu: Index =
            serde_json::from_slice(&std::fs::read(fixtures.join("gpu/index.json")).unwrap())
                .expect("fixtures/gpu/index.json is an index");
        for s in &gpu.scenarios {
            for (as_, p) in [("manifest", Some(&s.manifest)), ("live", s.live.as_ref())] {
                if let Some(p) = p {
                    docs.push((
                        as_.into(),
                        p.clone(),
                        std::fs::read(fixtures.join(p)).unwrap(),
                    ));
                }
            }
        }
        assert!(docs.len() > 60, "{} documents", docs.len());
        for (as_, name, bytes) in &docs {
            let loaded = match as_.as_str() {
                "manifest" => {
                    graphcheck::codec::load::parse_manifest(bytes, Path::new(name)).map(drop)
                }
                _ => graphcheck::codec::load::parse_live(bytes, Path::new(name)).map(drop),
            };
            loaded.unwrap_or_else(|e| panic!("{e}"));
            if let Some(e) = schema_error(&schema, bytes) {
                panic!("{name}: the loader accepts it, the schema does not: {e}");
            }
        }
    }

    /// Every bad document the schema rejects, the loader rejects; and the schema rejects
    /// every one the loader rejects, except those the index marks `schema_valid` (bad in
    /// ways no schema can see), which it must accept.
    #[test]
    fn bad_documents_and_the_schema_agree() {
        let schema = schema();
        let files = corpus();
        let index = index(&files);
        for bad in index.bad.iter().filter(|b| b.as_ != "allow") {
            let bytes = &files[&bad.file];
            match (schema_error(&schema, bytes), bad.schema_valid) {
                (Some(_), false) | (None, true) => {}
                (Some(e), true) => panic!("{}: marked schema_valid, but: {e}", bad.file),
                (None, false) => panic!(
                    "{}: the schema accepts it; mark it schema_valid if no schema can see its fault",
                    bad.file
                ),
            }
        }
        // The sign after `0x` is what once set the two apart.
        assert!(
            schema_error(&schema, &files["bad/addr_plus_sign.json"])
                .is_some_and(|e| e.contains("0x+")),
        );
    }

    /// Regression: Marlin's live snapshot without the probe of its freed workspace lost the
    /// `freed` findings (6 findings became 4) instead of being refused.
    #[test]
    fn marlin_without_a_probe_is_refused_not_verified_short() {
        let s = crate::scenarios::all()
            .into_iter()
            .find(|s| s.name == "marlin_workspace_rebuilt")
            .unwrap();
        let mut live = s.live.clone().unwrap();
        let allow = Allowlist::default();
        let r = verify(&s.manifest, Some(&live), &allow).unwrap();
        assert_eq!(r.findings.len(), 6);
        let freed: Vec<_> = live
            .probes
            .iter()
            .filter(|p| p.state != AllocState::Active)
            .map(|p| p.addr)
            .collect();
        assert!(!freed.is_empty());
        live.probes.retain(|p| !freed.contains(&p.addr));
        match verify(&s.manifest, Some(&live), &allow) {
            Err(VerifyError::Pair(PairError::MissingProbe { addr, graphs, .. })) => {
                assert!(freed.contains(&addr), "{addr}");
                assert!(!graphs.is_empty());
            }
            other => panic!("{other:?}"),
        }
    }
}
