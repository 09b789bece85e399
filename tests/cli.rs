//! Integration tests of the `graphcheck` binary over the fixture corpus
//! (`fixtures/index.json`): expected findings, allowed entries and exit codes per scenario,
//! insta snapshots of `show --normalized`, `verify` (table, json) and `explain`, every
//! bad-input class, and the committed JSON Schema.

use std::path::{Path, PathBuf};

use serde_json::Value;

#[path = "support/mod.rs"]
mod support;
use support::{graphcheck, root, settings, text, transcript};

fn fixtures() -> PathBuf {
    root().join("fixtures")
}

fn read_index(p: &Path) -> Value {
    let s = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&s).expect("an index is JSON")
}

/// The synthetic corpus's index (scenarios and bad inputs).
fn index() -> Value {
    read_index(&fixtures().join("index.json"))
}

fn rel(p: &str) -> String {
    format!("fixtures/{p}")
}

/// Every scenario: the synthetic corpus, then the GPU-recorded one (`fixtures/gpu/`).
fn scenarios() -> Vec<Value> {
    let mut all = index()["scenarios"].as_array().expect("scenarios").clone();
    let gpu = read_index(&fixtures().join("gpu/index.json"));
    all.extend(
        gpu["scenarios"]
            .as_array()
            .expect("gpu scenarios")
            .iter()
            .cloned(),
    );
    all
}

fn verify_args(s: &Value, format: &str) -> Vec<String> {
    let mut a = vec!["verify".to_string(), rel(s["manifest"].as_str().unwrap())];
    if let Some(l) = s["live"].as_str() {
        a.push(rel(l));
    }
    if let Some(al) = s["allow"].as_str() {
        a.push("--allow".into());
        a.push(rel(al));
    }
    a.push("--format".into());
    a.push(format.into());
    a
}

#[test]
fn every_scenario_gives_exactly_its_expected_findings() {
    let scenarios = scenarios();
    assert!(
        scenarios.len() >= 12,
        "the corpus lists {} scenarios",
        scenarios.len()
    );
    let mut failures = Vec::new();
    for s in &scenarios {
        let name = s["name"].as_str().unwrap();
        let args = verify_args(s, "json");
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = graphcheck(&argv);
        let expect = &s["expect"];
        let code = out.status.code();
        if code != expect["exit_code"].as_i64().map(|c| c as i32) {
            failures.push(format!(
                "{name}: exit {code:?}, expected {}\n{}",
                expect["exit_code"],
                text(&out.stderr)
            ));
            continue;
        }
        let report: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{name}: report is not JSON: {e}\n{}", text(&out.stdout)));
        let got: Vec<(String, String)> = report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["kind"].as_str().unwrap().into(),
                    f["subject"].as_str().unwrap().into(),
                )
            })
            .collect();
        let mut want: Vec<(String, String)> = expect["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["kind"].as_str().unwrap().into(),
                    f["subject"].as_str().unwrap().into(),
                )
            })
            .collect();
        let mut got_sorted = got.clone();
        got_sorted.sort();
        want.sort();
        if got_sorted != want {
            failures.push(format!("{name}: findings\n  got  {got:?}\n  want {want:?}"));
        }
        // Where the index names the graphs to recapture, they must match exactly.
        for w in expect["findings"].as_array().unwrap() {
            let Some(graphs) = w.get("graphs").and_then(Value::as_array) else {
                continue;
            };
            let f = report["findings"]
                .as_array()
                .unwrap()
                .iter()
                .find(|f| f["kind"] == w["kind"] && f["subject"] == w["subject"]);
            if let Some(f) = f
                && f["graphs"].as_array() != Some(graphs)
            {
                failures.push(format!(
                    "{name}: {} {}: graphs {} , expected {:?}",
                    w["kind"], w["subject"], f["graphs"], graphs
                ));
            }
        }
        // Severity as the index states it (absent: error); `ok` means no error.
        let severity = |f: &Value| f["severity"].as_str().unwrap_or("error").to_string();
        let mut got_sev: Vec<(String, String, String)> = report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["kind"].as_str().unwrap().into(),
                    f["subject"].as_str().unwrap().into(),
                    f["severity"].as_str().unwrap_or("(none)").into(),
                )
            })
            .collect();
        let mut want_sev: Vec<(String, String, String)> = expect["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["kind"].as_str().unwrap().into(),
                    f["subject"].as_str().unwrap().into(),
                    severity(f),
                )
            })
            .collect();
        got_sev.sort();
        want_sev.sort();
        if got_sev != want_sev {
            failures.push(format!(
                "{name}: severities\n  got  {got_sev:?}\n  want {want_sev:?}"
            ));
        }
        let errors = want_sev.iter().filter(|f| f.2 == "error").count();
        if report["ok"].as_bool() != Some(errors == 0) {
            failures.push(format!("{name}: ok is {}, errors {errors}", report["ok"]));
        }
        if let Some(why) = allowed_differ(&report, &expect["allowed"]) {
            failures.push(format!("{name}: allowed: {why}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// How the report's `allowed` entries differ from the index's `expect.allowed`, if they do:
/// the same (kind, subject) pairs exactly, and the same graphs where the index names them.
fn allowed_differ(report: &Value, want: &Value) -> Option<String> {
    let Some(want) = want.as_array() else {
        return Some(format!("the index states none (expect.allowed is {want})"));
    };
    let got: Vec<&Value> = report["allowed"]
        .as_array()
        .expect("a report's allowed is an array")
        .iter()
        .map(|a| &a["finding"])
        .collect();
    let pair = |f: &Value| -> (String, String) {
        let s = |k: &str| f[k].as_str().unwrap_or_else(|| panic!("{k} in {f}")).into();
        (s("kind"), s("subject"))
    };
    let mut got_pairs: Vec<_> = got.iter().map(|f| pair(f)).collect();
    let mut want_pairs: Vec<_> = want.iter().map(pair).collect();
    got_pairs.sort();
    want_pairs.sort();
    if got_pairs != want_pairs {
        return Some(format!("\n  got  {got_pairs:?}\n  want {want_pairs:?}"));
    }
    for w in want {
        let Some(graphs) = w.get("graphs") else {
            continue;
        };
        let f = got
            .iter()
            .find(|f| pair(f) == pair(w))
            .expect("paired above");
        if &f["graphs"] != graphs {
            return Some(format!(
                "{} {}: graphs {}, expected {graphs}",
                w["kind"], w["subject"], f["graphs"]
            ));
        }
    }
    None
}

#[test]
fn snapshots_per_scenario() {
    for s in scenarios() {
        let name = s["name"].as_str().unwrap().to_string();
        let manifest = rel(s["manifest"].as_str().unwrap());
        let input = root().join(&manifest);
        let _guard = settings(&name, &input).bind_to_scope();

        let show = ["show", manifest.as_str(), "--normalized"];
        insta::assert_snapshot!("show_normalized", transcript(&show, &graphcheck(&show)));
        if let Some(l) = s["live"].as_str() {
            let live = rel(l);
            let show = ["show", live.as_str(), "--normalized"];
            insta::assert_snapshot!(
                "show_live_normalized",
                transcript(&show, &graphcheck(&show))
            );
        }
        for format in ["table", "json"] {
            let args = verify_args(&s, format);
            let argv: Vec<&str> = args.iter().map(String::as_str).collect();
            insta::assert_snapshot!(
                format!("verify_{format}"),
                transcript(&argv, &graphcheck(&argv))
            );
        }
        if let Some(l) = s["live"].as_str() {
            let args = retarget_argv(&s, &manifest, &rel(l), "table");
            let argv: Vec<&str> = args.iter().map(String::as_str).collect();
            insta::assert_snapshot!("retarget_table", transcript(&argv, &graphcheck(&argv)));
        }
        for (i, q) in s["explain"].as_array().into_iter().flatten().enumerate() {
            let args = explain_argv(&manifest, q.as_str().unwrap());
            let argv: Vec<&str> = args.iter().map(String::as_str).collect();
            insta::assert_snapshot!(
                format!("explain_{i}"),
                transcript(&argv, &graphcheck(&argv))
            );
        }
    }
}

/// The argv of `graphcheck retarget MANIFEST LIVE [--allow FILE] --format FORMAT`.
fn retarget_argv(s: &Value, manifest: &str, live: &str, format: &str) -> Vec<String> {
    let mut argv = vec![
        "retarget".to_string(),
        manifest.to_string(),
        live.to_string(),
    ];
    if let Some(a) = s["allow"].as_str() {
        argv.extend(["--allow".to_string(), rel(a)]);
    }
    argv.extend(["--format".to_string(), format.to_string()]);
    argv
}

/// Every scenario whose index states its plan (`expect.plan`: the graphs to retarget and
/// to recapture, derived by hand from `docs/retarget.md`) gets it from `graphcheck
/// retarget`, with exit 0 when nothing is to recapture and 1 otherwise.
#[test]
fn retarget_plans_match_the_index() {
    let mut stated = 0;
    for s in scenarios() {
        let Some(want) = s["expect"].get("plan") else {
            continue;
        };
        stated += 1;
        let manifest = rel(s["manifest"].as_str().unwrap());
        let live = rel(s["live"].as_str().expect("a plan needs a live snapshot"));
        let args = retarget_argv(&s, &manifest, &live, "json");
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = graphcheck(&argv);
        let plan: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{}: {e}: {}", s["name"], text(&out.stderr)));
        for key in ["retarget", "recapture"] {
            assert_eq!(plan[key], want[key], "{}: {key}", s["name"]);
        }
        let recapture = !want["recapture"].as_array().unwrap().is_empty();
        assert_eq!(
            out.status.code(),
            Some(i32::from(recapture)),
            "{}",
            s["name"]
        );
    }
    assert!(stated >= 7, "the index states {stated} plans");
}

/// The argv of `graphcheck explain MANIFEST QUERY` for an index's query.
fn explain_argv(manifest: &str, query: &str) -> Vec<String> {
    let mut argv = vec!["explain".to_string(), manifest.to_string()];
    match query.strip_prefix("--kernel ") {
        Some(pattern) => argv.extend(["--kernel".to_string(), pattern.trim().to_string()]),
        None => argv.extend(query.split_whitespace().map(String::from)),
    }
    argv
}

/// Regression: `gpu_corpus_clean_inplace` asked `--kernel Mul` of a manifest without such a
/// kernel, and its snapshot stored the miss. Every query of both indexes finds something
/// (exit 0), unless the scenario lists it in `explain_misses` (then exit 1).
#[test]
fn every_explain_query_finds_something_unless_marked_a_miss() {
    let mut failures = Vec::new();
    let mut asked = 0;
    for s in scenarios() {
        let name = s["name"].as_str().unwrap();
        let manifest = rel(s["manifest"].as_str().unwrap());
        let misses: Vec<&str> = s["explain_misses"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|q| q.as_str().unwrap())
            .collect();
        let queries = s["explain"].as_array().into_iter().flatten();
        for (q, want) in queries
            .map(|q| (q.as_str().unwrap(), 0))
            .chain(misses.iter().map(|&q| (q, 1)))
        {
            asked += 1;
            let args = explain_argv(&manifest, q);
            let argv: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = graphcheck(&argv);
            if out.status.code() != Some(want) {
                failures.push(format!(
                    "{name}: explain {q:?} exited {:?}, expected {want}\n{}",
                    out.status.code(),
                    text(&out.stdout)
                ));
            }
        }
    }
    assert!(asked > 40, "{asked} queries");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Regression: an allowlist entry that allowed nothing warns (exit 0) unless
/// `--deny-unused-allow` (exit 1, the finding an error).
#[test]
fn unused_allow_warns_and_deny_unused_allow_fails() {
    let s = index()["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "allowlisted_workspace")
        .expect("the allowlisted_workspace scenario")
        .clone();
    let manifest = rel(s["manifest"].as_str().unwrap());
    let allow = rel(s["allow"].as_str().unwrap());
    let base = ["verify", manifest.as_str(), "--allow", allow.as_str()];
    let out = graphcheck(&[&base[..], &["--format", "json"]].concat());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], true);
    assert_eq!(report["findings"][0]["kind"], "unused_allow");
    assert_eq!(report["findings"][0]["severity"], "warning");

    let deny: Vec<&str> = [&base[..], &["--deny-unused-allow", "--format", "json"]].concat();
    let out = graphcheck(&deny);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], false);
    assert_eq!(report["findings"][0]["severity"], "error");

    // Without an allowlist the flag changes nothing.
    let out = graphcheck(&[
        "verify",
        "fixtures/synthetic/clean_reload_inplace/manifest.json",
        "fixtures/synthetic/clean_reload_inplace/live.json",
        "--deny-unused-allow",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));

    let _guard = settings("allowlisted_workspace", &root().join(&manifest)).bind_to_scope();
    for format in ["table", "markdown"] {
        let argv: Vec<&str> = [&base[..], &["--format", format]].concat();
        insta::assert_snapshot!(
            format!("verify_warning_{format}"),
            transcript(&argv, &graphcheck(&argv))
        );
        let argv: Vec<&str> = [&base[..], &["--deny-unused-allow", "--format", format]].concat();
        insta::assert_snapshot!(
            format!("verify_deny_unused_allow_{format}"),
            transcript(&argv, &graphcheck(&argv))
        );
    }
}

#[test]
fn bad_inputs_exit_2_naming_file_and_json_path() {
    let bad = index()["bad"]
        .as_array()
        .expect("index lists bad inputs")
        .clone();
    assert!(bad.len() >= 7, "{} bad inputs", bad.len());
    let any_manifest = rel(scenarios()[0]["manifest"].as_str().unwrap());
    for b in bad {
        let file = rel(b["file"].as_str().unwrap());
        let args: Vec<&str> = match b["as"].as_str().unwrap() {
            "allow" => vec!["verify", any_manifest.as_str(), "--allow", file.as_str()],
            "live" => vec!["verify", any_manifest.as_str(), file.as_str()],
            _ => vec!["verify", file.as_str()],
        };
        let out = graphcheck(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{file}: {err}");
        assert!(!err.contains("panicked"), "{file} panicked: {err}");
        assert!(err.starts_with("error: "), "{file}: {err}");
        for want in b["error_contains"].as_array().unwrap() {
            let want = want.as_str().unwrap();
            assert!(err.contains(want), "{file}: stderr lacks {want:?}:\n{err}");
        }
        let stem = Path::new(&file)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .replace('.', "_");
        let _guard = settings(&stem, &root().join(&file)).bind_to_scope();
        insta::assert_snapshot!("bad_input", transcript(&args, &out));
    }
}

// The README's and the docs site's transcripts and allowlists are run by the docs test
// (tests/python/test_docs.py), over every page: `console` blocks compared with what the
// installed command prints, `toml` allowlists read by graphcheck.

/// Regression: `diff` did not report a pool's sleep policy changing.
#[test]
fn diff_names_a_pool_whose_sleep_policy_changed() {
    let manifest = "fixtures/synthetic/kv_pool_metadata/manifest.json";
    let mut doc: Value =
        serde_json::from_str(&std::fs::read_to_string(root().join(manifest)).unwrap()).unwrap();
    let kv = doc["pools"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|p| p["name"] == "kv_cache")
        .expect("a kv_cache pool");
    assert_eq!(kv["sleep"], "discarded");
    kv["sleep"] = "restored".into();
    let dir = tempfile_dir("diff-pool");
    let changed = dir.join("restored.json");
    std::fs::write(&changed, serde_json::to_vec(&doc).unwrap()).unwrap();
    let changed = changed.to_string_lossy().to_string();
    let out = graphcheck(&["diff", manifest, &changed, "--format", "markdown"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("| `pool kv_cache` | sleep | discarded | restored |"),
        "{}",
        text(&out.stdout)
    );
    let out = graphcheck(&["diff", manifest, &changed, "--format", "json"]);
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["same"], false);
    assert_eq!(r["pools"][0]["change"], "sleep");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A fresh folder under the system's temporary folder, for this process and `what`.
fn tempfile_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("graphcheck-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Regression: verify's headline says `graphcheck show` lists the unread nodes, and plain
/// `show` only counted them; it lists each with the walk's reason.
#[test]
fn show_lists_each_unread_node_with_its_reason() {
    let out = graphcheck(&["show", "fixtures/gpu/native_conditional.json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(
        shown.contains("    unread node 0 (conditional): its bodies could not be read"),
        "{shown}"
    );
}

/// `show --reads` prints the core's reads view of every scenario's manifest, and refuses a
/// live snapshot (exit 2, naming the file) and `--no-kernels` without `--reads`.
#[test]
fn show_reads_is_the_reads_view_of_a_manifest() {
    use graphcheck::codec::load::Source;
    use graphcheck::present::reads::{ReadsOptions, reads};
    for s in scenarios() {
        let manifest = rel(s["manifest"].as_str().unwrap());
        let doc = Source::Path(root().join(&manifest)).document().unwrap();
        for kernels in [true, false] {
            let mut argv = vec!["show", "--reads", manifest.as_str()];
            if !kernels {
                argv.push("--no-kernels");
            }
            let out = graphcheck(&argv);
            assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
            let want = reads(&doc, ReadsOptions { kernels }).unwrap();
            assert_eq!(text(&out.stdout).trim_end(), want.trim_end(), "{manifest}");
        }
    }
    let live = "fixtures/synthetic/marlin_workspace_rebuilt/live.json";
    let out = graphcheck(&["show", "--reads", live]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains(live) && err.contains("not of a live snapshot"),
        "{err}"
    );
    let out = graphcheck(&["show", "--no-kernels", live]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

#[test]
fn missing_file_and_usage_errors_exit_2() {
    let out = graphcheck(&["verify", "fixtures/does-not-exist.json"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("fixtures/does-not-exist.json") && err.contains("No such file"),
        "{err}"
    );
    let out = graphcheck(&["verify", "--format", "yaml", "x.json"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let out = graphcheck(&["explain", "x.json"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

#[test]
fn committed_schemas_are_what_the_binary_prints() {
    for (version, args) in [
        (2, &["schema"][..]),
        (2, &["schema", "--format-version", "2"][..]),
        (1, &["schema", "--format-version", "1"][..]),
    ] {
        let out = graphcheck(args);
        assert_eq!(out.status.code(), Some(0));
        let file = format!("schema/graphcheck-v{version}.schema.json");
        let committed = std::fs::read_to_string(root().join(&file))
            .unwrap_or_else(|_| panic!("{file} is committed"));
        assert!(
            text(&out.stdout) == committed,
            "{file} is out of date: run `cargo run -p graphcheck-cli -- schema --format-version {version} > {file}`"
        );
    }
    let out = graphcheck(&["schema", "--plan"]);
    assert_eq!(out.status.code(), Some(0));
    let file = "schema/graphcheck-plan-v1.schema.json";
    let committed =
        std::fs::read_to_string(root().join(file)).expect("the plan schema is committed");
    assert!(
        text(&out.stdout) == committed,
        "{file} is out of date: run `cargo run -p graphcheck-cli -- schema --plan > {file}`"
    );
    let out = graphcheck(&["schema", "--format-version", "3"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("expected 1 or 2"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn every_fixture_document_validates_against_the_schema_shape() {
    // The schema's required keys of the top-level documents are present in every fixture
    // (each against its own version's schema): a cheap guard that the schemas and the
    // corpus describe the same format.
    let schema = |version: u64| -> Value {
        let file = format!("schema/graphcheck-v{version}.schema.json");
        serde_json::from_str(&std::fs::read_to_string(root().join(file)).unwrap()).unwrap()
    };
    let schemas = [schema(1), schema(2)];
    let mut versions = std::collections::BTreeSet::new();
    for s in scenarios() {
        for (key, def) in [("manifest", "Manifest"), ("live", "Live")] {
            let Some(p) = s[key].as_str() else { continue };
            let doc: Value =
                serde_json::from_str(&std::fs::read_to_string(fixtures().join(p)).unwrap())
                    .unwrap();
            let version = doc["format_version"].as_u64().unwrap();
            versions.insert(version);
            let schema = &schemas[usize::from(version == 2)];
            for req in schema["$defs"][def]["required"].as_array().unwrap() {
                assert!(doc.get(req.as_str().unwrap()).is_some(), "{p} lacks {req}");
            }
        }
    }
    // The synthetic corpus is format 2, the GPU recordings format 1: both are read.
    assert_eq!(versions.into_iter().collect::<Vec<_>>(), vec![1, 2]);
}

/// `convert` rewrites a document in either version; both load to the same model, and
/// converting back gives the bytes graphcheck writes.
#[test]
fn convert_writes_either_version_and_both_read_the_same() {
    let s = &scenarios()[1];
    let manifest = rel(s["manifest"].as_str().unwrap());
    let dir = std::env::temp_dir().join(format!("graphcheck-convert-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let v1 = dir.join("v1.json");
    let v2 = dir.join("v2.json");
    let path = |p: &std::path::Path| p.to_string_lossy().to_string();
    let out = graphcheck(&[
        "convert",
        &manifest,
        "--format-version",
        "1",
        "--output",
        &path(&v1),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&v1).unwrap()).unwrap();
    assert_eq!(doc["format_version"], 1);
    assert!(doc["graphs"][0]["nodes"].is_array());
    let out = graphcheck(&["convert", &path(&v1), "--output", &path(&v2)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&v2).unwrap()).unwrap();
    assert_eq!(doc["format_version"], 2);
    let shown = |p: &str| text(&graphcheck(&["show", "--normalized", p]).stdout);
    let (a, b, c) = (shown(&manifest), shown(&path(&v1)), shown(&path(&v2)));
    assert_eq!(a, c);
    assert_eq!(a.replace("manifest v2", "manifest v1"), b);
    // The plain summary names the version too, as read (it said v1 of every document).
    let summary = |p: &str| text(&graphcheck(&["show", p]).stdout);
    assert!(summary(&manifest).starts_with("manifest v2 by "));
    assert!(summary(&path(&v1)).starts_with("manifest v1 by "));
    let out = graphcheck(&["verify", &path(&v1), "--format", "json"]);
    let out2 = graphcheck(&["verify", &manifest, "--format", "json"]);
    assert_eq!(text(&out.stdout), text(&out2.stdout));
    // An output that is the input is refused before anything is written.
    let out = graphcheck(&["convert", &path(&v2), "--output", &path(&v2)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("refusing to overwrite an input"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn verify_output_file_is_written_atomically_and_diff_of_a_document_with_itself_is_empty() {
    let s = &scenarios()[0];
    let manifest = rel(s["manifest"].as_str().unwrap());
    let dir = std::env::temp_dir().join(format!("graphcheck-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out_file = dir.join("report.json");
    let out_str = out_file.to_string_lossy().to_string();
    let out = graphcheck(&[
        "verify", &manifest, "--format", "json", "--output", &out_str,
    ]);
    assert!(out.stdout.is_empty());
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&out_file).unwrap()).unwrap();
    assert_eq!(report["format_version"], 1);
    // No temporary file is left beside it.
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    std::fs::remove_dir_all(&dir).unwrap();

    let out = graphcheck(&["diff", &manifest, &manifest]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert!(text(&out.stdout).starts_with("same: "));
}
