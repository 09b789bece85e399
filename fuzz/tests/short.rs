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

/// Whether the code a target runs can turn an input down.
#[derive(PartialEq)]
enum Rejects {
    /// It can: a pass must see both outcomes, or it is not exploring.
    Some,
    /// It never does, by the target's invariant: every input must be accepted.
    Never,
}

fn pass(target: &str, iterations: u64, rejects: Rejects) {
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
    let (accepted, rejected) = (counts.accepted, counts.rejected);
    assert_eq!(
        accepted + rejected,
        iterations,
        "{target}: outcomes counted"
    );
    if rejects == Rejects::Some {
        // A target that only accepts or only rejects is not exploring both sides.
        assert!(
            accepted > 0,
            "{target}: nothing accepted ({rejected} rejected)"
        );
        assert!(
            rejected > 0,
            "{target}: nothing rejected ({accepted} accepted)"
        );
    } else {
        assert_eq!(
            rejected, 0,
            "{target}: rejected inputs it has no way to reject"
        );
    }
}

#[test]
fn load() {
    pass("load", 300, Rejects::Some);
}

#[test]
fn contradictions() {
    pass("contradictions", 600, Rejects::Some);
}

#[test]
fn allow() {
    pass("allow", 2000, Rejects::Some);
}

#[test]
fn owner_path() {
    pass("owner_path", 5000, Rejects::Some);
}

#[test]
fn explain() {
    pass("explain", 1000, Rejects::Some);
}

// The builder takes any kernel name and any words (`fuzz/src/targets.rs`'s `signature`: its
// invariant is that they always build a consistent manifest), so the target has no rejected
// outcome: an input is accepted, or it is a failure.
#[test]
fn signature() {
    pass("signature", 3000, Rejects::Never);
}

// The command line as a whole, as its own process per input. (Its first finding, a
// `diff` that printed 65 KiB of error, one 70,000-character value quoted in full, looked
// like a hang until the harness read stderr while the child ran.)
#[test]
fn plans() {
    pass("plans", 300, Rejects::Some);
}

#[test]
fn cli() {
    pass("cli", 300, Rejects::Some);
}
