//! Fuzz targets for everything graphcheck reads from outside — the document loader
//! (manifest and live), allowlists, owner paths, explain targets, the kernel-signature
//! rules, and the command line as a whole — on the stable toolchain: seeded, structure-aware
//! mutation of the committed fixture corpus, with invariants checked on every input, not
//! only "no panic". `graphcheck-fuzz` runs them for a time; a test runs a short seeded pass.

pub mod mutate;
pub mod plans;
pub mod records;
pub mod targets;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::rngs::SmallRng;

/// How long a target runs.
#[derive(Clone, Copy, Debug)]
pub enum Budget {
    Iterations(u64),
    Time(Duration),
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct Counts {
    pub iterations: u64,
    /// Inputs the code under test accepted (a document loaded, a path parsed, exit 0 or 1).
    pub accepted: u64,
    /// Inputs it rejected with an error (exit 2).
    pub rejected: u64,
    /// Invariant violations and panics, each with the input that caused it.
    pub failures: Vec<Failure>,
}

/// One violated invariant.
#[derive(Clone, Debug)]
pub struct Failure {
    pub what: String,
    pub input: Vec<u8>,
}

/// What each case returns: accepted or rejected, or a violated invariant.
pub enum Outcome {
    Accepted,
    Rejected,
    Failed(String),
}

/// The repository root (the fuzz crate lives in `fuzz/`).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("fuzz/ has a parent")
        .to_path_buf()
}

/// One case of a target: makes an input, runs it, returns it with the outcome.
type Case<'a> = dyn FnMut(&mut SmallRng) -> (Vec<u8>, Outcome) + 'a;

/// The targets, by name.
pub const TARGETS: &[&str] = &[
    "load",
    "contradictions",
    "allow",
    "owner_path",
    "explain",
    "signature",
    "plans",
    "cli",
];

/// Runs `target` under `budget` from `seed`. `binary` is the `graphcheck` executable the
/// `cli` target runs.
pub fn run(target: &str, budget: Budget, seed: u64, binary: &Path) -> Result<Counts, String> {
    let corpus = targets::Corpus::load(&repo())?;
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut counts = Counts::default();
    let start = Instant::now();
    let mut case: Box<Case<'_>> = match target {
        "load" => Box::new(|r| targets::load(r, &corpus)),
        "contradictions" => Box::new(|r| records::contradictions(r, &corpus)),
        "allow" => Box::new(|r| targets::allow(r, &corpus)),
        "owner_path" => Box::new(|r| targets::owner_path(r, &corpus)),
        "explain" => Box::new(|r| targets::explain(r, &corpus)),
        "signature" => Box::new(|r| targets::signature(r, &corpus)),
        "plans" => Box::new(|r| plans::plans(r, &corpus)),
        "cli" => {
            let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
            let binary = binary.to_path_buf();
            Box::new(move |r| targets::cli(r, &corpus, &binary, dir.path()))
        }
        other => {
            return Err(format!(
                "no target {other:?}; targets: {}",
                TARGETS.join(", ")
            ));
        }
    };
    loop {
        match budget {
            Budget::Iterations(n) if counts.iterations >= n => break,
            Budget::Time(t) if start.elapsed() >= t => break,
            _ => {}
        }
        counts.iterations += 1;
        // A panic is a failure like any other: caught, recorded with its input.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(&mut rng)));
        match result {
            Ok((_, Outcome::Accepted)) => counts.accepted += 1,
            Ok((_, Outcome::Rejected)) => counts.rejected += 1,
            Ok((input, Outcome::Failed(what))) => counts.failures.push(Failure { what, input }),
            Err(p) => {
                let what = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                counts.failures.push(Failure {
                    what: format!("panic: {what}"),
                    input: Vec::new(),
                });
            }
        }
        if counts.failures.len() >= 20 {
            break;
        }
    }
    Ok(counts)
}
