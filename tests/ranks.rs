//! Integration tests of `graphcheck verify DIR` over the runs of several ranks in the
//! fixture index (`fixtures/index.json`, `ranks`): expected findings with their ranks,
//! missing ranks and exit codes; insta snapshots of the table, JSON and Markdown; an
//! allowlist over `rank_mismatch`; and every way a folder is refused (exit 2, naming files).

use std::path::{Path, PathBuf};

use serde_json::Value;

#[path = "support/mod.rs"]
mod support;
use support::{graphcheck, root, settings, text, transcript};

/// The runs of several ranks the index lists.
fn runs() -> Vec<Value> {
    let p = root().join("fixtures/index.json");
    let index: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    index["ranks"]
        .as_array()
        .expect("ranks in the index")
        .clone()
}

#[test]
fn every_run_gives_exactly_its_expected_findings_ranks_and_exit_code() {
    let runs = runs();
    assert!(runs.len() >= 2, "{} runs", runs.len());
    for run in runs {
        let name = run["name"].as_str().unwrap();
        let dir = format!("fixtures/{}", run["dir"].as_str().unwrap());
        let out = graphcheck(&["verify", &dir, "--format", "json"]);
        let want = &run["expect"];
        assert_eq!(
            out.status.code(),
            want["exit_code"].as_i64().map(|c| c as i32),
            "{name}: {}",
            text(&out.stderr)
        );
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        let got: Vec<Value> = r["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| serde_json::json!({"rank": f["rank"], "kind": f["kind"], "subject": f["subject"]}))
            .collect();
        assert_eq!(&Value::Array(got), &want["findings"], "{name}");
        let missing = r
            .get("missing_ranks")
            .cloned()
            .unwrap_or(Value::Array(vec![]));
        assert_eq!(missing, want["missing_ranks"], "{name}");
        assert_eq!(r["ok"], want["exit_code"] == 0, "{name}");
        // Each rank's counts are its own findings'.
        for s in r["ranks"].as_array().unwrap() {
            let rank = &s["rank"];
            let n = r["findings"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|f| &f["rank"] == rank)
                .count() as u64;
            let counted: u64 = s["summary"]
                .as_object()
                .unwrap()
                .values()
                .map(|v| v.as_u64().unwrap())
                .sum();
            assert_eq!(n, counted, "{name} rank {rank}");
        }
    }
}

#[test]
fn snapshots_per_run() {
    for run in runs() {
        let name = run["name"].as_str().unwrap().to_string();
        let dir = format!("fixtures/{}", run["dir"].as_str().unwrap());
        let _guard = settings(&name, &root().join(&dir)).bind_to_scope();
        for format in ["table", "json", "markdown"] {
            let argv = ["verify", dir.as_str(), "--format", format];
            insta::assert_snapshot!(
                format!("verify_ranks_{format}"),
                transcript(&argv, &graphcheck(&argv))
            );
        }
    }
}

/// A fresh folder under the system's temporary folder, for this process and `what`.
fn fresh_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("graphcheck-ranks-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const RUN: &str = "fixtures/ranks/tp2_rebind_rank1";

/// A document of the TP=2 run, as JSON to edit.
fn doc(file: &str) -> Value {
    let p = root().join(RUN).join(file);
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn put(dir: &Path, file: &str, v: &Value) {
    std::fs::write(dir.join(file), serde_json::to_vec_pretty(v).unwrap()).unwrap();
}

/// Runs `verify DIR` and returns (exit code, stderr).
fn verify_dir(dir: &Path) -> (Option<i32>, String) {
    let out = graphcheck(&["verify", dir.to_str().unwrap()]);
    (out.status.code(), text(&out.stderr))
}

#[test]
fn a_folder_that_is_not_one_run_is_refused_naming_its_files() {
    let m0 = doc("graphcheck-0-4100.json");
    let m1 = doc("graphcheck-1-4101.json");
    let l1 = doc("live-1-4101.json");

    // Two manifests of one rank.
    let dir = fresh_dir("two-manifests");
    put(&dir, "a.json", &m0);
    put(&dir, "b.json", &m0);
    let (code, err) = verify_dir(&dir);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("rank 0 has two manifests"), "{err}");
    assert!(err.contains("a.json") && err.contains("b.json"), "{err}");

    // A live snapshot whose rank has no manifest: never verified against another rank's.
    let dir = fresh_dir("orphan-live");
    put(&dir, "m0.json", &m0);
    put(&dir, "l1.json", &l1);
    let (code, err) = verify_dir(&dir);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("l1.json is a live snapshot of rank 1, which has no manifest"),
        "{err}"
    );

    // Mixed world sizes.
    let dir = fresh_dir("world-sizes");
    let mut m1_of_4 = m1.clone();
    m1_of_4["producer"]["world_size"] = 4.into();
    put(&dir, "m0.json", &m0);
    put(&dir, "m1.json", &m1_of_4);
    let (code, err) = verify_dir(&dir);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("different world sizes: 2 in"), "{err}");
    assert!(err.contains("m1.json"), "{err}");

    // A JSON file that is no graphcheck document is refused, not skipped.
    let dir = fresh_dir("stray");
    put(&dir, "m0.json", &m0);
    put(
        &dir,
        "notes.json",
        &serde_json::json!({"format_version": 1, "kind": "notes"}),
    );
    let (code, err) = verify_dir(&dir);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("notes.json") && err.contains("`kind`"),
        "{err}"
    );

    // A folder with no document.
    let dir = fresh_dir("empty");
    let (code, err) = verify_dir(&dir);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no manifest or live snapshot"), "{err}");

    // A live snapshot given after a folder: the folder's own live snapshots are verified.
    let out = graphcheck(&["verify", RUN, &format!("{RUN}/live-0-4100.json")]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("{RUN} is a folder")) && err.contains("takes no live snapshot"),
        "{err}"
    );

    // Files that are not `*.json` are not read; one rank alone verifies (the other missing).
    let dir = fresh_dir("one-rank");
    put(&dir, "m0.json", &m0);
    std::fs::write(dir.join("README.txt"), "not a document").unwrap();
    let out = graphcheck(&["verify", dir.to_str().unwrap(), "--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["missing_ranks"], serde_json::json!([1]));
    assert_eq!(r["world_size"], 2);
}

#[test]
fn an_allowlist_entry_allows_an_uneven_shard_by_path() {
    // Guards: rank_mismatch goes through the allowlist like every other kind, by path.
    let dir = fresh_dir("allow");
    let allow = dir.join("allow.toml");
    std::fs::write(
        &allow,
        "[[allow]]\npath = \"model.layers[*].mlp.down_proj.weight\"\nkinds = [\"rank_mismatch\"]\n\
         reason = \"rank 2 holds the uneven shard\"\n",
    )
    .unwrap();
    let out = graphcheck(&[
        "verify",
        "fixtures/ranks/tp4_shard_shape_mismatch",
        "--allow",
        allow.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["findings"], serde_json::json!([]));
    assert_eq!(r["allowed"][0]["finding"]["kind"], "rank_mismatch");
}

#[test]
fn single_pair_reports_carry_no_rank_fields() {
    // Guards: the JSON of `verify MANIFEST LIVE` is unchanged by the rank fields.
    let out = graphcheck(&[
        "verify",
        "fixtures/ranks/tp2_rebind_rank1/graphcheck-1-4101.json",
        "fixtures/ranks/tp2_rebind_rank1/live-1-4101.json",
        "--format",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in ["world_size", "ranks", "missing_ranks"] {
        assert!(r.get(key).is_none(), "{key}");
    }
    assert!(r["findings"][0].get("rank").is_none());
    assert!(
        !r["checked"]
            .as_array()
            .unwrap()
            .contains(&"rank_mismatch".into())
    );
}

#[test]
fn an_output_file_among_the_folders_documents_is_refused() {
    let dir = fresh_dir("output");
    put(&dir, "m0.json", &doc("graphcheck-0-4100.json"));
    let target = dir.join("m0.json");
    let out = graphcheck(&[
        "verify",
        dir.to_str().unwrap(),
        "--output",
        target.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read(&target).unwrap(),
        serde_json::to_vec_pretty(&doc("graphcheck-0-4100.json")).unwrap()
    );
}

/// The TP=2 run recorded on two H200s (fixtures/gpu/README.md): instrument's own files
/// (`graphcheck-<rank>-<pid>.json`) and a live snapshot per rank, read as one run. Rank 1
/// alone rebound its shard; rank 0 has nothing live; NCCL's communicator is no finding.
#[test]
fn the_gpu_recorded_tp2_run_is_one_report_with_the_reload_on_rank_1_only() {
    let dir = root().join("fixtures/gpu/tp2_rebind_rank1");
    let out = graphcheck(&["verify", dir.to_str().unwrap(), "--format", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["world_size"], 2);
    let mut got: Vec<(u64, String, String)> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["rank"].as_u64().unwrap(),
                f["kind"].as_str().unwrap().to_string(),
                f["subject"].as_str().unwrap().to_string(),
            )
        })
        .filter(|(_, kind, _)| kind != "unowned")
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            (1, "drifted".to_string(), "model.down.weight".to_string()),
            (1, "freed".to_string(), "model.down.weight".to_string()),
        ]
    );
    // The one unowned per rank is the scenario's unregistered input, read by a GEMM.
    for f in report["findings"].as_array().unwrap() {
        if f["kind"] == "unowned" {
            let kernels = f["kernels"].to_string();
            assert!(!kernels.contains("nccl"), "{kernels}");
        }
    }
}
