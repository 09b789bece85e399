//! A short seeded pass of every fuzz target, as CI runs it: a fixed seed, so a failure
//! here reproduces with `graphcheck-fuzz TARGET --iterations N --seed 2026`.

use std::path::PathBuf;

use graphcheck_fuzz::{Budget, repo, run};

const SEED: u64 = 2026;

/// The `graphcheck` binary the `cli` target runs: the one CI built (debug), else release.
fn binary() -> PathBuf {
    for profile in ["debug", "release"] {
        let p = repo().join("target").join(profile).join("graphcheck");
        if p.is_file() {
            return p;
        }
    }
    panic!("no graphcheck binary: build it first (`cargo build -p graphcheck-cli`)");
}

fn pass(target: &str, iterations: u64) {
    let counts = run(target, Budget::Iterations(iterations), SEED, &binary()).unwrap();
    assert_eq!(counts.iterations, iterations);
    let failures: Vec<String> = counts
        .failures
        .iter()
        .map(|f| {
            let input: String = String::from_utf8_lossy(&f.input)
                .chars()
                .take(400)
                .collect();
            format!("{} (input: {input})", f.what)
        })
        .collect();
    assert!(failures.is_empty(), "{target}: {failures:#?}");
    // Each target must both accept and reject inputs, or it is not exploring.
    assert!(counts.accepted > 0, "{target}: nothing accepted");
}

#[test]
fn load() {
    pass("load", 300);
}

#[test]
fn contradictions() {
    pass("contradictions", 600);
}

#[test]
fn allow() {
    pass("allow", 2000);
}

#[test]
fn owner_path() {
    pass("owner_path", 5000);
}

#[test]
fn explain() {
    pass("explain", 1000);
}

#[test]
fn signature() {
    pass("signature", 3000);
}

// The command line as a whole, as its own process per input. (Its first finding, a
// `diff` that printed 65 KiB of error, one 70,000-character value quoted in full, looked
// like a hang until the harness read stderr while the child ran.)
#[test]
fn cli() {
    pass("cli", 300);
}
