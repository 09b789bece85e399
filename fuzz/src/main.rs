//! `graphcheck-fuzz TARGET|all [--seconds N | --iterations N] [--seed S] [--binary PATH]`:
//! runs fuzz targets and prints what each did; exits 1 when an invariant failed (the
//! failing inputs are written to `fuzz/failures/`).

use std::path::PathBuf;
use std::time::Duration;

use graphcheck_fuzz::{Budget, TARGETS, repo, run};

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut target = None;
    let mut budget = Budget::Time(Duration::from_secs(60));
    let mut seed = 1u64;
    let mut binary = repo().join("target/release/graphcheck");
    let mut it = args.iter();
    let usage = || {
        eprintln!(
            "usage: graphcheck-fuzz TARGET|all [--seconds N | --iterations N] [--seed S] [--binary PATH]\n  targets: {}",
            TARGETS.join(", ")
        );
        std::process::ExitCode::from(2)
    };
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().unwrap_or_default();
        match a.as_str() {
            "--seconds" => match value().parse() {
                Ok(s) => budget = Budget::Time(Duration::from_secs(s)),
                Err(_) => return usage(),
            },
            "--iterations" => match value().parse() {
                Ok(n) => budget = Budget::Iterations(n),
                Err(_) => return usage(),
            },
            "--seed" => match value().parse() {
                Ok(s) => seed = s,
                Err(_) => return usage(),
            },
            "--binary" => binary = PathBuf::from(value()),
            "-h" | "--help" => return usage(),
            t if target.is_none() && !t.starts_with('-') => target = Some(t.to_string()),
            _ => return usage(),
        }
    }
    let Some(target) = target else { return usage() };
    let targets: Vec<&str> = if target == "all" {
        TARGETS.to_vec()
    } else {
        vec![target.as_str()]
    };
    let mut failed = false;
    for t in targets {
        let counts = match run(t, budget, seed, &binary) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("error: {e}");
                return std::process::ExitCode::from(2);
            }
        };
        println!(
            "{t}: {} inputs ({} accepted, {} rejected), {} failures, seed {seed}",
            counts.iterations,
            counts.accepted,
            counts.rejected,
            counts.failures.len()
        );
        if !counts.failures.is_empty() {
            failed = true;
            let dir = repo().join("fuzz/failures");
            let _ = std::fs::create_dir_all(&dir);
            for (i, f) in counts.failures.iter().enumerate() {
                let path = dir.join(format!("{t}-{seed}-{i}.bin"));
                let _ = std::fs::write(&path, &f.input);
                println!("  FAIL {}: {}", path.display(), f.what);
            }
        }
    }
    std::process::ExitCode::from(u8::from(failed))
}
