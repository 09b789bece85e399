//! The `graphcheck` command line: parse, run, print, exit with a documented code.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use graphcheck::check::allow::Allowlist;
use graphcheck::document::load::{
    load_document, load_live_checked, load_manifest, load_manifest_checked, write_atomic,
};
use graphcheck::exit;
use graphcheck::present::explain::{Query, explain};
use graphcheck::present::fmt::{AddrFmt, RawAddrs};
use graphcheck::present::normalize::{Symbolizer, normalized};
use graphcheck::present::report::{render_json, render_markdown, render_table};
use graphcheck::present::text::{diff_text, summary};

const EXIT_CODES: &str = "\
Exit codes:
  0  verify: no findings (allowed ones and warnings aside); diff: equal; explain: found
  1  verify: findings; diff: the documents differ; explain: nothing matched
  2  bad input or usage: unreadable or invalid document or allowlist, bad flag";

/// Verify that captured CUDA graphs still read the tensors they were captured with.
#[derive(Parser)]
#[command(name = "graphcheck", version, about, after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    /// A table for terminals and CI logs.
    Table,
    /// The report as JSON (versioned: `format_version`).
    Json,
    /// Markdown for a CI step summary (`>> $GITHUB_STEP_SUMMARY`).
    Markdown,
}

#[derive(Subcommand)]
enum Command {
    /// Check a manifest alone (unregistered, unowned, mispooled) or against a live
    /// snapshot (every finding kind).
    #[command(after_help = EXIT_CODES)]
    Verify {
        /// The manifest recorded at capture.
        manifest: PathBuf,
        /// The live snapshot taken after sleep/wake or reload.
        live: Option<PathBuf>,
        /// An allowlist (TOML: [[allow]] path, kinds, reason).
        #[arg(long, value_name = "FILE")]
        allow: Option<PathBuf>,
        /// Fail (exit 1) on an allowlist entry that allowed nothing, instead of warning.
        #[arg(long)]
        deny_unused_allow: bool,
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
        /// Write the report to FILE (atomically) instead of stdout.
        #[arg(long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Print addresses as symbolic ids (A3+0x40), as `show --normalized` does.
        #[arg(long)]
        normalized: bool,
    },
    /// Trace an address, an owner path or a kernel through the ownership graph.
    #[command(after_help = EXIT_CODES)]
    Explain {
        manifest: PathBuf,
        /// A device address (0x…) or an owner path (model.layers[0].mlp.w).
        #[arg(required_unless_present = "kernel", conflicts_with = "kernel")]
        target: Option<String>,
        /// Explain every node whose name contains PATTERN.
        #[arg(long, value_name = "PATTERN")]
        kernel: Option<String>,
        /// Print Graphviz DOT instead of text.
        #[arg(long)]
        dot: bool,
        /// Print addresses as symbolic ids.
        #[arg(long)]
        normalized: bool,
    },
    /// Summarize a manifest or live snapshot.
    Show {
        document: PathBuf,
        /// The stable text snapshot tests store: symbolic addresses, sorted, complete.
        #[arg(long)]
        normalized: bool,
    },
    /// Compare two documents by owner path (tensor set, registration, layout, digests).
    #[command(after_help = EXIT_CODES)]
    Diff {
        a: PathBuf,
        b: PathBuf,
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Print the JSON Schema of format v1 (manifest and live snapshot).
    Schema,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::from(exit::BAD_INPUT as u8)
        }
    }
}

/// Writes to stdout; a closed pipe (`| head`) is not an error.
fn emit(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("failed to write to stdout"),
    }
}

/// Progress for big inputs, on a terminal only, so CI logs and pipes stay clean.
fn progress(path: &Path, what: &str) -> Option<Instant> {
    let big = std::fs::metadata(path).is_ok_and(|m| m.len() > 16 << 20);
    (big && std::io::stderr().is_terminal()).then(|| {
        eprintln!("graphcheck: loading {what} {} …", path.display());
        Instant::now()
    })
}

fn done(t: Option<Instant>) {
    if let Some(t) = t {
        eprintln!("graphcheck:   done in {:.2} s", t.elapsed().as_secs_f64());
    }
}

fn run(cli: Cli) -> Result<i32> {
    match cli.command {
        Command::Verify {
            manifest,
            live,
            allow,
            deny_unused_allow,
            format,
            output,
            normalized,
        } => {
            let allow = match &allow {
                Some(p) => Allowlist::load(p)?,
                None => Allowlist::default(),
            }
            .deny_unused(deny_unused_allow);
            // The two documents load on two threads: parsing is most of the work.
            let t = progress(&manifest, "manifest and live snapshot");
            let (m, l) = std::thread::scope(|s| {
                let live_job = live
                    .as_deref()
                    .map(|p| s.spawn(move || load_live_checked(p)));
                let m = load_manifest_checked(&manifest);
                let l = live_job.map(|j| j.join().expect("the loader does not panic"));
                (m, l)
            });
            let (m, mt) = m?;
            let l = l.transpose()?;
            done(t);
            let report = graphcheck::check::verify::verify_checked(
                &m,
                &mt,
                l.as_ref().map(|(l, t)| (l, t)),
                &allow,
            );
            let sym;
            let fmt: &dyn AddrFmt = if normalized {
                sym = Symbolizer::for_manifest(&m);
                &sym
            } else {
                &RawAddrs
            };
            let mut text = match format {
                Format::Table => render_table(&report, fmt),
                Format::Markdown => render_markdown(&report, fmt),
                Format::Json => render_json(&report),
            };
            if normalized {
                // Addresses also appear inside sentences (`detail`): redact the whole text.
                text = Symbolizer::for_manifest(&m).redact(&text);
            }
            match output {
                Some(p) => write_atomic(&p, text.as_bytes())
                    .with_context(|| format!("failed to write {}", p.display()))?,
                None => emit(&text)?,
            }
            // Freeing millions of records costs time and changes nothing before exit.
            std::mem::forget((m, mt, l));
            Ok(if report.ok { exit::OK } else { exit::FINDINGS })
        }
        Command::Explain {
            manifest,
            target,
            kernel,
            dot,
            normalized,
        } => {
            let m = load_manifest(&manifest)?;
            let query = match (kernel, target) {
                (Some(k), _) => Query::Kernel(k),
                (None, Some(t)) => Query::parse(&t),
                (None, None) => unreachable!("clap requires one of them"),
            };
            let sym;
            let fmt: &dyn AddrFmt = if normalized {
                sym = Symbolizer::for_manifest(&m);
                &sym
            } else {
                &RawAddrs
            };
            let e = explain(&m, &query, fmt);
            let out = if dot { e.dot } else { e.text };
            emit(&if normalized {
                Symbolizer::for_manifest(&m).redact(&out)
            } else {
                out
            })?;
            Ok(if e.found { exit::OK } else { exit::FINDINGS })
        }
        Command::Show {
            document,
            normalized: norm,
        } => {
            let d = load_document(&document)?;
            emit(&if norm { normalized(&d) } else { summary(&d) })?;
            Ok(exit::OK)
        }
        Command::Diff { a, b, format } => {
            let da = load_document(&a)?;
            let db = load_document(&b)?;
            let r = graphcheck::check::diff::diff(&da, &db);
            let text = match format {
                Format::Json => {
                    let mut s = serde_json::to_string_pretty(&r)?;
                    s.push('\n');
                    s
                }
                Format::Table | Format::Markdown => {
                    diff_text(&r, &a, &b, matches!(format, Format::Markdown))
                }
            };
            emit(&text)?;
            Ok(if r.same { exit::OK } else { exit::FINDINGS })
        }
        Command::Schema => {
            let mut s = serde_json::to_string_pretty(&graphcheck::document::schema::json_schema())?;
            s.push('\n');
            emit(&s)?;
            Ok(exit::OK)
        }
    }
}
