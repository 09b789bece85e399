//! Integration tests of `graphcheck verify DIR` over the runs of several ranks in the
//! fixture index (`fixtures/index.json`, `ranks`): expected findings with their ranks,
//! missing ranks and exit codes; insta snapshots of the table, JSON and Markdown; an
//! allowlist over `rank_mismatch`; and every way a folder is refused (exit 2, naming files).
//! `verify M0 L0 M1 L1 …` (explicit pairs) against the folder's report and every way pairs
//! are refused; `--normalized` naming each finding's addresses by its own rank's manifest.

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

    // A JSON file with a document's header that is no document is refused, not skipped.
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

/// Regression: `verify DIR --format json --output DIR/report.json` worked once; the next
/// run refused the output as an input (exit 2), and `verify DIR` refused the report as a
/// document. JSON without the header is skipped with a note, and may be the output.
#[test]
fn a_report_written_into_the_folder_is_skipped_and_may_be_written_again() {
    let dir = fresh_dir("report-in-folder");
    for f in [
        "graphcheck-0-4100.json",
        "live-0-4100.json",
        "graphcheck-1-4101.json",
    ] {
        put(&dir, f, &doc(f));
    }
    let report = dir.join("report.json");
    let (d, r) = (dir.to_str().unwrap(), report.to_str().unwrap());
    let write = ["verify", d, "--format", "json", "--output", r];
    let first = graphcheck(&write);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    let written = std::fs::read(&report).unwrap();
    for args in [&write[..], &["verify", d, "--format", "json"][..]] {
        let out = graphcheck(args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert_eq!(
            err,
            format!(
                "note: {r} is not a graphcheck document (its top level has no `kind`): skipped\n"
            )
        );
    }
    assert_eq!(std::fs::read(&report).unwrap(), written);
    // Any JSON without the header is skipped too, each named.
    std::fs::write(dir.join("other.json"), b"[1, 2]").unwrap();
    std::fs::write(dir.join("tool.json"), b"{\"kind\": \"Config\"}").unwrap();
    let (code, err) = verify_dir(&dir);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("other.json is not a graphcheck document (it is a JSON array, not an object)"),
        "{err}"
    );
    assert!(
        err.contains(
            "tool.json is not a graphcheck document (its top level has no `format_version`)"
        ),
        "{err}"
    );
    // A real document is never the output.
    let m0 = dir.join("graphcheck-0-4100.json");
    let out = graphcheck(&["verify", d, "--output", m0.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("refusing to overwrite an input"));
    assert_eq!(
        std::fs::read(&m0).unwrap(),
        serde_json::to_vec_pretty(&doc("graphcheck-0-4100.json")).unwrap()
    );
}

/// Regression (issue 25, item 1): a `*.json` link whose target is gone, a link loop or a
/// FIFO was left out of the folder in silence, so its rank looked merely missing (a
/// warning) and the run came out clean (exit 0). Each is refused now, naming it.
#[cfg(unix)]
#[test]
fn a_json_entry_that_is_not_a_readable_file_refuses_the_run_naming_it() {
    use std::os::unix::fs::symlink;
    let dir = fresh_dir("unreadable-entry");
    let store = fresh_dir("unreadable-entry-store");
    for f in ["graphcheck-0-4100.json", "live-0-4100.json"] {
        put(&dir, f, &doc(f));
    }
    for f in ["graphcheck-1-4101.json", "live-1-4101.json"] {
        put(&store, f, &doc(f));
        symlink(store.join(f), dir.join(f)).unwrap();
    }
    let (code, err) = verify_dir(&dir);
    assert_eq!(code, Some(1), "links to the documents are read: {err}");
    std::fs::remove_dir_all(&store).unwrap();
    let (code, err) = verify_dir(&dir);
    assert_eq!(code, Some(2), "{err}");
    let m1 = dir.join("graphcheck-1-4101.json");
    assert!(
        err.contains(&format!(
            "{} is named like a document (`*.json`) but cannot be read: it is a link to nothing",
            m1.display()
        )),
        "{err}"
    );
    assert!(!err.contains("caused by"), "said once: {err}");
    // A link loop, alone in a folder with whole documents.
    for f in ["graphcheck-1-4101.json", "live-1-4101.json"] {
        std::fs::remove_file(dir.join(f)).unwrap();
    }
    let looped = dir.join("loop.json");
    symlink(&looped, &looped).unwrap();
    let (code, err) = verify_dir(&dir);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "{} is named like a document (`*.json`) but cannot be read: ",
            looped.display()
        )),
        "{err}"
    );
    std::fs::remove_file(&looped).unwrap();
    // A FIFO is refused before it is opened (opening one blocks until a writer comes).
    let fifo = dir.join("graphcheck-1-4101.json");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let (code, err) = verify_dir(&dir);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "{} is named like a document (`*.json`) but is a FIFO",
            fifo.display()
        )),
        "{err}"
    );
    // The Python API decides in the same place (`app::folder::dir_documents`); a subfolder named
    // `*.json` is still not read.
    std::fs::remove_file(&fifo).unwrap();
    std::fs::create_dir(dir.join("sub.json")).unwrap();
    let (code, err) = verify_dir(&dir);
    assert_eq!(code, Some(0), "{err}");
}

/// Regression (issue 25, item 6): a table or Markdown report `--output` wrote into the
/// folder made every later `verify DIR` exit 2 ("not valid JSON"). A file without a
/// document's header is skipped whatever its bytes; bytes that open a JSON object but break
/// off (a document cut short), and anything in a file named as `instrument()` names a
/// rank's manifest, still refuse the run.
#[test]
fn a_report_in_any_format_written_into_the_folder_is_skipped() {
    let dir = fresh_dir("table-in-folder");
    for f in [
        "graphcheck-0-4100.json",
        "live-0-4100.json",
        "graphcheck-1-4101.json",
    ] {
        put(&dir, f, &doc(f));
    }
    let d = dir.to_str().unwrap();
    for format in ["table", "markdown", "json"] {
        let report = dir.join(format!("report-{format}.json"));
        let r = report.to_str().unwrap();
        let out = graphcheck(&["verify", d, "--format", format, "--output", r]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{format}: {}",
            text(&out.stderr)
        );
        // Written again over itself: it is no input.
        let again = graphcheck(&["verify", d, "--format", format, "--output", r]);
        assert_eq!(
            again.status.code(),
            Some(0),
            "{format}: {}",
            text(&again.stderr)
        );
    }
    std::fs::write(dir.join("empty.json"), b"").unwrap();
    let (code, err) = verify_dir(&dir);
    assert_eq!(code, Some(0), "{err}");
    for (file, why) in [
        ("report-table.json", "it does not open a JSON object"),
        ("report-markdown.json", "it does not open a JSON object"),
        ("report-json.json", "its top level has no `kind`"),
        ("empty.json", "it is empty or only white space"),
    ] {
        let note = format!(
            "note: {} is not a graphcheck document ({why}): skipped",
            dir.join(file).display()
        );
        assert!(err.contains(&note), "{note}\n{err}");
    }
    // A document cut short opens an object: refused, naming it.
    let cut = dir.join("cut.json");
    let whole = serde_json::to_vec_pretty(&doc("live-1-4101.json")).unwrap();
    std::fs::write(&cut, &whole[..whole.len() / 2]).unwrap();
    let (code, err) = verify_dir(&dir);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(&format!("{}:", cut.display())), "{err}");
    std::fs::remove_file(&cut).unwrap();
    // A rank's manifest by its name is never skipped, whatever it holds.
    let m1 = dir.join("graphcheck-1-4101.json");
    for bytes in [&b""[..], b"[]", b"not json"] {
        std::fs::write(&m1, bytes).unwrap();
        let (code, err) = verify_dir(&dir);
        assert_eq!(code, Some(2), "{bytes:?}: {err}");
        assert!(err.contains(&m1.display().to_string()), "{err}");
    }
}

#[test]
fn an_output_file_among_the_pairs_is_refused() {
    // Guards: every file of every pair is an input `--output` must not replace.
    let dir = fresh_dir("pairs-output");
    for f in [
        "graphcheck-0-4100.json",
        "live-0-4100.json",
        "graphcheck-1-4101.json",
        "live-1-4101.json",
    ] {
        put(&dir, f, &doc(f));
    }
    let files: Vec<String> = pair_args(dir.to_str().unwrap());
    let target = dir.join("live-1-4101.json");
    let mut argv: Vec<&str> = vec!["verify"];
    argv.extend(files.iter().map(String::as_str));
    argv.extend(["--output", target.to_str().unwrap()]);
    let out = graphcheck(&argv);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("live snapshot"), "{err}");
    assert_eq!(
        std::fs::read(&target).unwrap(),
        serde_json::to_vec_pretty(&doc("live-1-4101.json")).unwrap()
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

/// The documents of a run with a live snapshot per rank, as `verify` takes pairs: each rank's
/// manifest, then its live snapshot, in rank order.
fn pair_args(dir: &str) -> Vec<String> {
    let mut files: Vec<(u64, bool, String)> = std::fs::read_dir(root().join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            let name = p.file_name().unwrap().to_str().unwrap();
            (
                v["producer"]["rank"].as_u64().unwrap(),
                v["kind"] == "live",
                format!("{dir}/{name}"),
            )
        })
        .collect();
    files.sort();
    files.into_iter().map(|(_, _, f)| f).collect()
}

const GPU_RUN: &str = "fixtures/gpu/tp2_rebind_rank1";

#[test]
fn pairs_give_the_folders_report_byte_for_byte_in_any_pair_order() {
    for dir in [RUN, GPU_RUN] {
        let pairs = pair_args(dir);
        assert_eq!(pairs.len(), 4, "{pairs:?}");
        // The ranks' pairs in reverse order: grouping by rank puts them back.
        let reversed: Vec<String> = pairs.chunks(2).rev().flatten().cloned().collect();
        for format in ["table", "json", "markdown"] {
            for normalized in [false, true] {
                let mut flags = vec!["--format", format];
                if normalized {
                    flags.push("--normalized");
                }
                let folder = graphcheck(&[&["verify", dir][..], &flags].concat());
                assert_eq!(folder.status.code(), Some(1), "{}", text(&folder.stderr));
                for order in [&pairs, &reversed] {
                    let files: Vec<&str> = order.iter().map(String::as_str).collect();
                    let argv = [&["verify"][..], &files, &flags].concat();
                    let out = graphcheck(&argv);
                    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
                    assert_eq!(text(&out.stdout), text(&folder.stdout), "{argv:?}");
                    assert_eq!(text(&out.stderr), "", "{argv:?}");
                }
            }
        }
    }
}

/// Runs `verify` over `files` (paths under the repository root) and returns (exit code,
/// stderr, stdout).
fn verify_files(files: &[&str]) -> (Option<i32>, String, String) {
    let out = graphcheck(&[&["verify"][..], files].concat());
    (out.status.code(), text(&out.stderr), text(&out.stdout))
}

#[test]
fn pairs_that_are_not_one_runs_pairs_are_refused_naming_the_files() {
    let m0 = "fixtures/ranks/tp2_rebind_rank1/graphcheck-0-4100.json";
    let l0 = "fixtures/ranks/tp2_rebind_rank1/live-0-4100.json";
    let m1 = "fixtures/ranks/tp2_rebind_rank1/graphcheck-1-4101.json";
    let l1 = "fixtures/ranks/tp2_rebind_rank1/live-1-4101.json";
    let refused = |files: &[&str], want: &[&str]| {
        let (code, err, out) = verify_files(files);
        assert_eq!(code, Some(2), "{files:?}: {err}");
        assert_eq!(out, "", "{files:?}: nothing is printed");
        for w in want {
            assert!(err.contains(w), "{files:?}: {w:?} not in {err}");
        }
    };
    // An odd number of files beyond one pair.
    refused(&[m0, l0, m1], &["3 documents were given, an odd number"]);
    refused(&[m0, l0, m1, l1, m0], &["5 documents"]);
    // A live snapshot where a manifest goes, and a manifest where a live snapshot goes.
    refused(
        &[m0, l0, l1, m1],
        &[&format!(
            "{l1} is a live snapshot, but it comes first in pair 2"
        )],
    );
    refused(
        &[m0, m1, m1, l1],
        &[&format!(
            "{m1} is a manifest, but it comes second in pair 1"
        )],
    );
    // A live snapshot paired with another rank's manifest: never compared across ranks.
    refused(
        &[m0, l1, m1, l0],
        &[&format!(
            "{l1} is a live snapshot of rank 1, but it is paired with {m0}, the manifest of rank 0"
        )],
    );
    // Two pairs of one rank: the folder's refusal, naming both manifests.
    refused(
        &[m1, l1, m1, l1],
        &["the pairs are not one run's: rank 1 has two manifests", m1],
    );
    // A folder among pairs, and standard input among pairs.
    refused(
        &[RUN, l0, m1, l1],
        &[&format!("{RUN} is a folder, which is verified alone")],
    );
    refused(
        &[m0, l0, m1, "-"],
        &["standard input (`-`) holds one document"],
    );
    // Mixed world sizes, as a folder refuses them.
    let dir = fresh_dir("pairs-world-sizes");
    let mut m1_of_4 = doc("graphcheck-1-4101.json");
    m1_of_4["producer"]["world_size"] = 4.into();
    let mut l1_of_4 = doc("live-1-4101.json");
    l1_of_4["producer"]["world_size"] = 4.into();
    put(&dir, "m1.json", &m1_of_4);
    put(&dir, "l1.json", &l1_of_4);
    let (m1_4, l1_4) = (dir.join("m1.json"), dir.join("l1.json"));
    refused(
        &[m0, l0, m1_4.to_str().unwrap(), l1_4.to_str().unwrap()],
        &["different world sizes: 2 in", m0, "4 in"],
    );
    // A JSON file that is no graphcheck document is named by the loader.
    let stray = dir.join("notes.json");
    put(
        &dir,
        "notes.json",
        &serde_json::json!({"format_version": 1, "kind": "notes"}),
    );
    refused(
        &[m0, l0, m1, stray.to_str().unwrap()],
        &["notes.json", "`kind`"],
    );
}

#[test]
fn one_or_two_documents_are_still_a_single_pair_or_a_folder() {
    // Guards: two files stay `MANIFEST LIVE` (no rank fields), not pairs of the ranks path.
    let m1 = "fixtures/ranks/tp2_rebind_rank1/graphcheck-1-4101.json";
    let l1 = "fixtures/ranks/tp2_rebind_rank1/live-1-4101.json";
    let (code, err, out) = verify_files(&[m1, l1, "--format", "json"]);
    assert_eq!(code, Some(1), "{err}");
    let r: Value = serde_json::from_str(&out).unwrap();
    assert!(r.get("world_size").is_none(), "{out}");
    // No document at all is a usage error.
    let (code, err, _) = verify_files(&[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("<DOCUMENT>"), "{err}");
}

/// The findings of a JSON report as (rank, kind, captured, live, detail), for comparing
/// the addresses two reports name.
fn addressed(json: &str) -> Vec<(Value, Value, Value, Value, Value)> {
    let r: Value = serde_json::from_str(json).unwrap();
    r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["rank"].clone(),
                f["kind"].clone(),
                f["captured_addr"].clone(),
                f["live_addr"].clone(),
                f["detail"].clone(),
            )
        })
        .collect()
}

/// Regression: `verify DIR --normalized` named every rank's addresses with the lowest rank's
/// manifest, so rank 1's rebound shard read `? → ?` (its addresses are no allocation of
/// rank 0's) and a rank-1 address that rank 0 also holds got rank 0's symbol.
#[test]
fn normalized_names_each_findings_addresses_by_its_own_ranks_manifest() {
    let normalized = |args: &[&str]| {
        let argv = [&["verify"], args, &["--format", "json", "--normalized"]].concat();
        let out = graphcheck(&argv);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
        addressed(&text(&out.stdout))
    };
    let folder = normalized(&[GPU_RUN]);
    let pairs = pair_args(GPU_RUN);
    for rank in [0u64, 1] {
        let (m, l) = (&pairs[2 * rank as usize], &pairs[2 * rank as usize + 1]);
        // The rank's pair verified alone, named by its own manifest: the same symbols.
        let mut alone: Vec<_> = normalized(&[m, l])
            .into_iter()
            .map(|(_, kind, c, l, d)| (Value::from(rank), kind, c, l, d))
            .collect();
        let mut mine: Vec<_> = folder.iter().filter(|f| f.0 == rank).cloned().collect();
        assert!(!mine.is_empty(), "rank {rank}");
        alone.sort_by_key(|f| f.1.to_string());
        mine.sort_by_key(|f| f.1.to_string());
        assert_eq!(mine, alone, "rank {rank}");
    }
    // Every address has a symbol: none is `?`, none is left raw.
    for f in &folder {
        for a in [&f.2, &f.3] {
            if let Some(a) = a.as_str() {
                assert!(a.starts_with('A') || a.starts_with('S'), "{f:?}");
            }
        }
        assert!(!f.4.as_str().unwrap().contains("0x7f"), "{f:?}");
    }
}

#[test]
fn normalized_snapshot_of_the_gpu_recorded_tp2_run() {
    let _guard = settings("gpu_tp2_rebind_rank1", &root().join(GPU_RUN)).bind_to_scope();
    for format in ["table", "json", "markdown"] {
        let argv = ["verify", GPU_RUN, "--normalized", "--format", format];
        insta::assert_snapshot!(
            format!("verify_ranks_normalized_{format}"),
            transcript(&argv, &graphcheck(&argv))
        );
    }
}
