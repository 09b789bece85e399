//! `graphcheck-gen`: writes the synthetic fixture corpus, the benchmark documents, and the
//! command line's reference and man pages.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use graphcheck_gen::{bench, docs, fixtures, phases};

/// Exit code: done, or `--check` found the folder equal to the generator.
const EXIT_OK: u8 = 0;
/// Exit code: `--check` found files that differ.
const EXIT_DIFFERS: u8 = 1;
/// Exit code: an error (usage, I/O).
const EXIT_ERROR: u8 = 2;

#[derive(Parser)]
#[command(name = "graphcheck-gen", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write the synthetic scenario corpus (manifests, live snapshots, allowlists, broken
    /// inputs, index.json).
    Fixtures {
        /// The fixtures folder.
        #[arg(long, default_value = "fixtures")]
        out: PathBuf,
        /// Compare instead of writing; exit 1 listing the files that differ.
        #[arg(long)]
        check: bool,
    },
    /// Write the command line's Markdown reference (reference/cli.md) and its man pages
    /// (man/*.1), generated from graphcheck-cli's clap definitions.
    Docs {
        /// The docs folder.
        #[arg(long, default_value = "docs")]
        out: PathBuf,
        /// Compare instead of writing; exit 1 listing the files that differ.
        #[arg(long)]
        check: bool,
    },
    /// Write a large manifest and live snapshot for benchmarks.
    Bench {
        /// The folder to write manifest.json and live.json into.
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 1_000_000)]
        touches: u64,
        #[arg(long, default_value_t = 100_000)]
        tensors: u64,
        #[arg(long, default_value_t = 64)]
        graphs: u32,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Scale the share of tensors that become findings (plain attributes, and tensors
        /// the reload moves, reshapes, stales or removes) by this factor: 1 gives about 2%
        /// of the tensors, 20 about 40%.
        #[arg(long, default_value_t = 1.0, value_parser = positive)]
        changes: f64,
        /// The format version to write (1: one object per record; 2: columns).
        #[arg(long, default_value_t = graphcheck::model::version::FORMAT_VERSION, value_parser = version)]
        format_version: u32,
    },
    /// Time verify's phases (read, parse, convert, check, verify, render) over a manifest
    /// and live snapshot, on one thread: wall and CPU milliseconds of each.
    Phases {
        /// The manifest (either format version).
        manifest: PathBuf,
        /// The live snapshot.
        live: PathBuf,
        /// How many times to load and verify.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
}

/// A format version this build writes.
fn version(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(v) if graphcheck::model::version::FORMAT_VERSIONS.contains(&v) => Ok(v),
        _ => Err(format!(
            "expected one of {:?}, not {s:?}",
            graphcheck::model::version::FORMAT_VERSIONS
        )),
    }
}

/// A finite factor above zero.
fn positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err(format!("expected a number above 0, not {s:?}")),
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { EXIT_ERROR } else { EXIT_OK });
        }
    };
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// `--check`'s answer: that `out` matches, or the files that differ and the command that
/// writes them again (`cargo run -p graphcheck-gen -- COMMAND`), and the exit code.
fn checked(out: &Path, files: &fixtures::Files, differ: Vec<String>, command: &str) -> u8 {
    if differ.is_empty() {
        eprintln!(
            "{}: {} files match the generator",
            out.display(),
            files.len()
        );
        return EXIT_OK;
    }
    eprintln!(
        "{}: {} files differ from the generator (run `cargo run -p graphcheck-gen -- {command}`):",
        out.display(),
        differ.len()
    );
    for d in differ {
        eprintln!("  {d}");
    }
    EXIT_DIFFERS
}

fn run(cli: Cli) -> anyhow::Result<u8> {
    match cli.command {
        Command::Fixtures { out, check } => {
            let files = fixtures::corpus();
            if check {
                return Ok(checked(
                    &out,
                    &files,
                    fixtures::check(&out, &files),
                    "fixtures",
                ));
            }
            fixtures::write(&out, &files)?;
            eprintln!("wrote {} files under {}", files.len(), out.display());
            Ok(EXIT_OK)
        }
        Command::Docs { out, check } => {
            let files = docs::files()?;
            if check {
                return Ok(checked(&out, &files, docs::check(&out, &files), "docs"));
            }
            docs::write(&out, &files)?;
            eprintln!("wrote {} files under {}", files.len(), out.display());
            Ok(EXIT_OK)
        }
        Command::Bench {
            out,
            touches,
            tensors,
            graphs,
            seed,
            changes,
            format_version,
        } => {
            bench::run(
                &out,
                bench::BenchOpts {
                    touches,
                    tensors,
                    graphs,
                    seed,
                    changes,
                    format_version,
                },
            )?;
            Ok(EXIT_OK)
        }
        Command::Phases {
            manifest,
            live,
            rounds,
        } => {
            phases::run(&manifest, &live, rounds)?;
            Ok(EXIT_OK)
        }
    }
}
