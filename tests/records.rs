//! Records that contradict themselves, or each other, are refused at load in either
//! format version, naming the file, the JSON path and what is wrong (issue 25, items 2–4):
//! a tensor's layout against its byte span, dtype and storage; two probes of one address;
//! node indexes and parents. And what a record's every field means to `verify` (a layout
//! or device changed at one address is `reshaped`) and to `diff` (every field compared).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

#[path = "support/mod.rs"]
#[allow(dead_code)] // the snapshot helpers are `cli`'s and `ranks`'
mod support;
use support::{graphcheck, root, text};

const CLEAN: &str = "fixtures/synthetic/clean_reload_inplace";
const MARLIN: &str = "fixtures/synthetic/marlin_workspace_rebuilt";

fn read(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// The fixture's document in format `version` (converted by the binary), as JSON to edit.
fn document(fixture: &str, file: &str, version: u32) -> Value {
    let out = graphcheck(&[
        "convert",
        &format!("{fixture}/{file}"),
        "--format-version",
        &version.to_string(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A fresh folder for this test process and `what`.
fn fresh(what: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("graphcheck-records-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn put(dir: &Path, file: &str, v: &Value) -> String {
    let p = dir.join(file);
    std::fs::write(&p, serde_json::to_vec(v).unwrap()).unwrap();
    p.to_str().unwrap().to_string()
}

/// `tensors[6].<field>` of a format 1 document, `tensors.<field>[6]` of a format 2 one.
fn field<'a>(
    doc: &'a mut Value,
    version: u32,
    table: &str,
    row: usize,
    name: &str,
) -> &'a mut Value {
    if version == 1 {
        &mut doc[table][row][name]
    } else {
        &mut doc[table][name][row]
    }
}

fn at(version: u32, table: &str, row: usize, name: &str) -> String {
    if version == 1 {
        format!("`{table}[{row}].{name}`")
    } else {
        format!("`{table}.{name}[{row}]`")
    }
}

/// Verifies `manifest` against the fixture's own live snapshot: (exit code, stderr).
fn verify_with(manifest: &str, live: &str) -> (Option<i32>, String) {
    let out = graphcheck(&["verify", manifest, live]);
    (out.status.code(), text(&out.stderr))
}

/// Regression: each of these verified clean (exit 0) on `clean_reload_inplace`, tensor 6
/// (`bfloat16[2048]`, 4096 bytes in a storage of 4096).
#[test]
fn a_tensor_record_that_contradicts_itself_is_refused_in_either_format() {
    let live = format!("{CLEAN}/live.json");
    type Damage = (
        &'static str,
        fn(&mut Value, u32),
        &'static str,
        &'static str,
    );
    let damages: [Damage; 9] = [
        (
            "shape [2^62, 4] stride [4, 1]",
            |d, v| {
                *field(d, v, "tensors", 6, "shape") = json!([4611686018427387904u64, 4]);
                *field(d, v, "tensors", 6, "stride") = json!([4, 1]);
            },
            "shape",
            "spans more bytes than a 64-bit address space holds",
        ),
        (
            "shape [2^32, 2^32, 16]",
            |d, v| {
                *field(d, v, "tensors", 6, "shape") = json!([4294967296u64, 4294967296u64, 16]);
                *field(d, v, "tensors", 6, "stride") = json!([68719476736u64, 16, 1]);
            },
            "shape",
            "spans more bytes than a 64-bit address space holds",
        ),
        (
            "shape [2^64 - 1] with nbytes 4096",
            |d, v| *field(d, v, "tensors", 6, "shape") = json!([u64::MAX]),
            "shape",
            "spans more bytes than a 64-bit address space holds",
        ),
        (
            "bfloat16 of itemsize 3",
            |d, v| *field(d, v, "tensors", 6, "itemsize") = json!(3),
            "itemsize",
            "a `bfloat16` element is 2 bytes, not 3",
        ),
        (
            "bfloat16 of itemsize 2^32 - 1",
            |d, v| *field(d, v, "tensors", 6, "itemsize") = json!(4294967295u64),
            "itemsize",
            "a `bfloat16` element is 2 bytes, not 4294967295",
        ),
        (
            "nbytes that its shape does not give",
            |d, v| *field(d, v, "tensors", 6, "nbytes") = json!(2),
            "nbytes",
            "`nbytes` is 2, but the view bfloat16[2048] stride [1] of 2 bytes per element spans 4096",
        ),
        (
            "a negative stride",
            |d, v| *field(d, v, "tensors", 6, "stride") = json!([-1]),
            "stride",
            "stride -1 is negative, which no PyTorch view has",
        ),
        (
            "a storage that wraps the address space",
            |d, v| {
                *field(d, v, "tensors", 6, "storage_base") = json!("0xfffffffffffff000");
                // No allocation to hold it, so that the tensor's own check speaks.
                if v == 1 {
                    d["tensors"][6]
                        .as_object_mut()
                        .unwrap()
                        .remove("allocation");
                } else {
                    d["tensors"]["allocation"][6] = Value::Null;
                }
            },
            "storage_base",
            "a storage of 4096 bytes at 0xfffffffffffff000 passes the end of the address space",
        ),
        (
            "an unknown dtype of 3 bytes an element",
            |d, v| {
                *field(d, v, "tensors", 6, "dtype") = json!("float24");
                *field(d, v, "tensors", 6, "itemsize") = json!(3);
            },
            "itemsize",
            "3 bytes per element of `float24`, a dtype graphcheck does not know",
        ),
    ];
    let dir = fresh("tensor");
    for version in [1, 2] {
        let clean = document(CLEAN, "manifest.json", version);
        let m = put(&dir, "clean.json", &clean);
        assert_eq!(verify_with(&m, &live).0, Some(0), "the fixture is clean");
        for (what, damage, name, message) in damages {
            let mut doc = clean.clone();
            damage(&mut doc, version);
            let m = put(&dir, "manifest.json", &doc);
            let (code, err) = verify_with(&m, &live);
            assert_eq!(code, Some(2), "format {version}, {what}: {err}");
            let path = if what.contains("negative") {
                at(version, "tensors", 6, "stride")
                    .replace("[6].stride`", "[6].stride[0]`")
                    .replace("stride[6]`", "stride[6][0]`")
            } else {
                at(version, "tensors", 6, name)
            };
            let want = format!("{m}: invalid document at {path}: ");
            assert!(
                err.contains(&want) && err.contains(message),
                "format {version}, {what}:\n{want}…{message}\n{err}"
            );
            // The live snapshot's records are held to the same.
            let mut l = document(CLEAN, "live.json", version);
            damage(&mut l, version);
            let lp = put(&dir, "live.json", &l);
            let (code, err) = verify_with(&format!("{CLEAN}/manifest.json"), &lp);
            assert_eq!(code, Some(2), "live, format {version}, {what}: {err}");
            assert!(
                err.contains(&format!("{lp}: invalid document at ")),
                "{err}"
            );
        }
    }
}

/// Regression: a copy of each `free` probe, marked `active`, put before the original hid
/// one of marlin_workspace_rebuilt's two `freed` findings (6 findings became 5).
#[test]
fn two_probes_of_one_address_are_refused() {
    let dir = fresh("probes");
    let m = format!("{MARLIN}/manifest.json");
    let (code, _) = verify_with(&m, &format!("{MARLIN}/live.json"));
    assert_eq!(code, Some(1));
    for version in [1, 2] {
        let mut l = document(MARLIN, "live.json", version);
        let probes = if version == 1 {
            let ps = l["probes"].as_array().unwrap().clone();
            let mut out: Vec<Value> = Vec::new();
            for p in ps {
                if p["state"] == "free" {
                    let mut copy = p.clone();
                    copy["state"] = json!("active");
                    out.push(copy);
                }
                out.push(p);
            }
            json!(out)
        } else {
            let ps = &l["probes"];
            let mut cols: serde_json::Map<String, Value> = serde_json::Map::new();
            let names: Vec<String> = ps.as_object().unwrap().keys().cloned().collect();
            let rows = ps["addr"].as_array().unwrap().len();
            for n in &names {
                cols.insert(n.clone(), json!([]));
            }
            for r in 0..rows {
                let free = ps["state"][r] == "free";
                for copy in [true, false] {
                    if copy && !free {
                        continue;
                    }
                    for n in &names {
                        let v = if copy && n == "state" {
                            json!("active")
                        } else {
                            ps[n][r].clone()
                        };
                        cols[n].as_array_mut().unwrap().push(v);
                    }
                }
            }
            Value::Object(cols)
        };
        l["probes"] = probes;
        let lp = put(&dir, "live.json", &l);
        let (code, err) = verify_with(&m, &lp);
        assert_eq!(code, Some(2), "format {version}: {err}");
        assert!(err.contains("is probed twice (also by probes["), "{err}");
        assert!(err.contains(&lp), "{err}");
    }
}

/// Regression: a node `parent` of 99 was accepted (`show` printed "in #99"), and so were two
/// nodes of index 0.
#[test]
fn node_indexes_and_parents_are_checked() {
    let dir = fresh("nodes");
    for version in [1, 2] {
        let clean = document(CLEAN, "manifest.json", version);
        // Parent 99.
        let mut d = clean.clone();
        if version == 1 {
            d["graphs"][0]["nodes"][1]["parent"] = json!(99);
        } else {
            let n = d["graphs"][0]["nodes"]["index"].as_array().unwrap().len();
            let mut parents = vec![Value::Null; n];
            parents[1] = json!(99);
            d["graphs"][0]["nodes"]["parent"] = json!(parents);
        }
        let m = put(&dir, "manifest.json", &d);
        let out = graphcheck(&["show", &m]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "format {version}: {err}");
        let path = if version == 1 {
            "`graphs[0].nodes[1].parent`"
        } else {
            "`graphs[0].nodes.parent[1]`"
        };
        assert!(
            err.contains(&format!("{m}: invalid document at {path}: node 1 lies in the body of node 99, which the walk must reach first")),
            "format {version}: {err}"
        );
        // Two nodes of index 0.
        let mut d = clean.clone();
        if version == 1 {
            d["graphs"][0]["nodes"][1]["index"] = json!(0);
        } else {
            d["graphs"][0]["nodes"]["index"][1] = json!(0);
        }
        let m = put(&dir, "manifest.json", &d);
        let out = graphcheck(&["show", &m]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "format {version}: {err}");
        let path = if version == 1 {
            "`graphs[0].nodes[1].index`"
        } else {
            "`graphs[0].nodes.index[1]`"
        };
        assert!(
            err.contains(&format!("{m}: invalid document at {path}: node 0 is given twice (also at graphs[0].nodes[0])")),
            "format {version}: {err}"
        );
    }
}

/// Regression: in a live snapshot, a device changed at the captured address (the layout
/// otherwise kept) went unreported. It is `reshaped`, saying both devices.
#[test]
fn a_device_changed_at_the_same_address_is_reshaped() {
    let dir = fresh("device");
    let mut l = read(&root().join(CLEAN).join("live.json"));
    l["tensors"]["device"][6] = json!("cuda:1");
    let lp = put(&dir, "live.json", &l);
    let out = graphcheck(&[
        "verify",
        &format!("{CLEAN}/manifest.json"),
        &lp,
        "--format",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    let f = &r["findings"].as_array().unwrap();
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0]["kind"], "reshaped");
    let detail = f[0]["detail"].as_str().unwrap();
    assert!(
        detail.contains("on cuda:0, now") && detail.ends_with("on cuda:1"),
        "{detail}"
    );
}

/// Regression: `diff` called two manifests the same whose tensor differed in itemsize
/// (2 against 4294967295) or in nbytes (4096 against 0). Those records are refused now; and
/// every field of the view but its addresses is compared: itemsize, nbytes, storage size,
/// device.
#[test]
fn diff_compares_every_field_of_a_view() {
    let dir = fresh("diff");
    let a = format!("{CLEAN}/manifest.json");
    let same = graphcheck(&["diff", &a, &a]);
    assert_eq!(same.status.code(), Some(0));
    let mut b = read(&root().join(&a));
    b["tensors"]["itemsize"][6] = json!(4294967295u64);
    let bp = put(&dir, "b.json", &b);
    assert_eq!(graphcheck(&["diff", &a, &bp]).status.code(), Some(2));
    for (name, value, shows) in [
        ("device", json!("cuda:1"), "on cuda:1"),
        ("storage_nbytes", json!(8192), "in a storage of 8192 bytes"),
    ] {
        let mut b = read(&root().join(&a));
        b["tensors"][name][6] = value;
        let bp = put(&dir, "b.json", &b);
        let out = graphcheck(&["diff", &a, &bp, "--format", "json"]);
        assert_eq!(out.status.code(), Some(1), "{name}: {}", text(&out.stderr));
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        let d = r["differences"].as_array().unwrap();
        assert!(
            !d.is_empty() && d.iter().all(|d| d["change"] == "layout"),
            "{name}: {d:?}"
        );
        assert!(
            d[0]["b"].as_str().unwrap().ends_with(shows),
            "{name}: {d:?}"
        );
    }
}

/// Regression (issue 25, item 11): ``invalid value: integer `4294967296`, expected u32``
/// (Rust's words), `1e3` quoted back as "the number 1000.0", and "1 values".
#[test]
fn messages_say_numbers_as_written_and_limits_in_words() {
    let dir = fresh("messages");
    for version in [1, 2] {
        let clean = document(CLEAN, "manifest.json", version);
        let mut d = clean.clone();
        *field(&mut d, version, "tensors", 6, "itemsize") = json!(4294967296u64);
        let m = put(&dir, "m.json", &d);
        let err = text(&graphcheck(&["show", &m]).stderr);
        assert!(
            err.contains(&format!(
                "at {}: the number 4294967296 is out of range for an unsigned 32-bit value (at \
                 most 4294967295)",
                at(version, "tensors", 6, "itemsize")
            )),
            "format {version}: {err}"
        );
        // Written by hand: serde_json writes 1000.0, not 1e3.
        let mut d = clean.clone();
        *field(&mut d, version, "tensors", 6, "itemsize") = json!("ITEMSIZE");
        let m = dir.join("m.json");
        let t = serde_json::to_string(&d)
            .unwrap()
            .replace("\"ITEMSIZE\"", "1e3");
        std::fs::write(&m, t).unwrap();
        let err = text(&graphcheck(&["show", m.to_str().unwrap()]).stderr);
        assert!(
            err.contains(&format!(
                "at {}: expected an unsigned 32-bit integer, found the number 1e3",
                at(version, "tensors", 6, "itemsize")
            )),
            "format {version}: {err}"
        );
    }
    let mut d = read(&root().join(CLEAN).join("manifest.json"));
    d["tensors"]["dtype"] = json!(["bfloat16"]);
    let m = put(&dir, "m.json", &d);
    let err = text(&graphcheck(&["show", &m]).stderr);
    assert!(
        err.contains("at `tensors.dtype`: 1 value, but `tensors.id` has 15"),
        "{err}"
    );
}

/// Regression (issue 25, item 11): a megabyte of text given as a path was echoed whole in
/// "failed to read …".
#[test]
fn a_path_longer_than_any_is_named_by_its_start() {
    // Below the kernel's 128 KiB limit on one argument.
    let long = "x".repeat(100_000);
    let out = graphcheck(&["show", &long]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(err.len() < 1000, "{} bytes of error", err.len());
    assert!(
        err.contains(&format!(
            "failed to read {}… (99920 more characters: longer than any path)",
            "x".repeat(80)
        )),
        "{err}"
    );
}

/// A storage number names one storage object (issue 28): two records of one number at two
/// bases, or one view of it recorded twice, are refused in either format.
#[test]
fn a_storage_number_is_one_storage_object() {
    let dir = fresh("storage");
    let live = format!("{CLEAN}/live.json");
    for version in [1, 2] {
        let number = |doc: &mut Value, rows: &[usize]| {
            if version == 2 {
                let n = doc["tensors"]["id"].as_array().unwrap().len();
                doc["tensors"]["storage"] = json!(vec![Value::Null; n]);
            }
            for &r in rows {
                *field(doc, version, "tensors", r, "storage") = json!(5);
            }
        };
        let mut m = document(CLEAN, "manifest.json", version);
        number(&mut m, &[0, 1]);
        let (code, err) = verify_with(&put(&dir, "manifest.json", &m), &live);
        assert_eq!(code, Some(2), "format {version}: {err}");
        assert!(err.contains(&at(version, "tensors", 1, "storage")), "{err}");
        assert!(
            err.contains("one storage object has one base, size and device"),
            "{err}"
        );

        let mut m = document(CLEAN, "manifest.json", version);
        for name in [
            "storage_base",
            "storage_nbytes",
            "offset",
            "nbytes",
            "shape",
            "stride",
            "dtype",
            "itemsize",
            "device",
            "allocation",
            "pool",
        ] {
            let v = field(&mut m, version, "tensors", 0, name).clone();
            *field(&mut m, version, "tensors", 1, name) = v;
        }
        number(&mut m, &[0, 1]);
        let (code, err) = verify_with(&put(&dir, "manifest.json", &m), &live);
        assert_eq!(code, Some(2), "format {version}: {err}");
        assert!(
            err.contains("the same view of storage 5 as tensors[0]"),
            "{err}"
        );
    }
}

/// A manifest may give an owner path once per storage it held at different captures (a
/// parameter rebound between two captures), each record naming a tensor of its own
/// storage number; the same path for two unnumbered tensors is given twice, and a live
/// snapshot (one moment) gives each path once. In either format.
#[test]
fn a_manifest_gives_a_path_once_per_storage_it_held() {
    let dir = fresh("paths");
    let live = format!("{CLEAN}/live.json");
    for version in [1, 2] {
        let mut m = document(CLEAN, "manifest.json", version);
        let first = field(&mut m, version, "owners", 0, "path").clone();
        let tensor = |m: &mut Value, row| field(m, version, "owners", row, "tensor").clone();
        let (t0, t1) = (tensor(&mut m, 0), tensor(&mut m, 1));
        assert_ne!(t0, t1, "the fixture's first two owners hold two tensors");
        *field(&mut m, version, "owners", 1, "path") = first.clone();
        let (code, err) = verify_with(&put(&dir, "manifest.json", &m), &live);
        assert_eq!(code, Some(2), "format {version}: {err}");
        assert!(err.contains(&at(version, "owners", 1, "path")), "{err}");
        assert!(
            err.contains(
                "a manifest gives a path again only for a tensor of another storage number"
            ),
            "{err}"
        );

        if version == 2 {
            let n = m["tensors"]["id"].as_array().unwrap().len();
            m["tensors"]["storage"] = json!(vec![Value::Null; n]);
        }
        let row = |v: &Value| -> usize {
            let ids = if version == 1 {
                m["tensors"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t["id"].clone())
                    .collect::<Vec<_>>()
            } else {
                m["tensors"]["id"].as_array().unwrap().clone()
            };
            ids.iter().position(|id| id == v).unwrap()
        };
        let (r0, r1) = (row(&t0), row(&t1));
        *field(&mut m, version, "tensors", r0, "storage") = json!(0);
        *field(&mut m, version, "tensors", r1, "storage") = json!(1);
        let (code, err) = verify_with(&put(&dir, "manifest.json", &m), &live);
        assert_ne!(
            code,
            Some(2),
            "format {version}: a path once per storage loads: {err}"
        );

        let mut l = document(CLEAN, "live.json", version);
        let first = field(&mut l, version, "owners", 0, "path").clone();
        *field(&mut l, version, "owners", 1, "path") = first;
        let manifest = format!("{CLEAN}/manifest.json");
        let (code, err) = verify_with(&manifest, &put(&dir, "live.json", &l));
        assert_eq!(code, Some(2), "format {version}: {err}");
        assert!(err.contains(&at(version, "owners", 1, "path")), "{err}");
        assert!(err.contains("is given twice"), "{err}");
    }
}
