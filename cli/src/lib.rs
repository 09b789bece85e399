//! The `graphcheck` command: its arguments and how each command runs. [`main_impl`] is the
//! whole command line — the Rust binary's `main` calls it, and so does the Python console
//! script (through `graphcheck._native.main`) — so the two faces print the same bytes and
//! exit with the same codes by construction.

pub mod mapped;
pub mod reference;

use std::ffi::OsString;
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use graphcheck::app::output::{refuse_inputs, write_atomic};
use graphcheck::check::allow::Allowlist;
use graphcheck::codec::load::Source;
use graphcheck::exit;
use graphcheck::model::version::{FORMAT_VERSION, FORMAT_VERSIONS};
use graphcheck::present::explain::{Query, QueryError};
use graphcheck::present::normalize::normalized;
use graphcheck::present::reads::{ReadsOptions, reads};
use graphcheck::present::text::summary;

use graphcheck::app::commands::{self, Format};
use graphcheck::app::{folder, verify};

/// How a report or diff is printed: the command line's names for [`Format`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FormatArg {
    /// A table for terminals and CI logs.
    Table,
    /// The report as JSON (versioned: `format_version`).
    Json,
    /// Markdown for a CI step summary (`>> $GITHUB_STEP_SUMMARY`).
    Markdown,
}

impl From<FormatArg> for Format {
    fn from(f: FormatArg) -> Format {
        match f {
            FormatArg::Table => Format::Table,
            FormatArg::Json => Format::Json,
            FormatArg::Markdown => Format::Markdown,
        }
    }
}

/// A shell `completions` writes a script for: every shell clap_complete generates for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ShellArg {
    /// `graphcheck completions bash > ~/.local/share/bash-completion/completions/graphcheck`
    /// (bash-completion loads it the first time `graphcheck` is completed).
    Bash,
    /// `graphcheck completions zsh > ~/.zfunc/_graphcheck`, with `fpath+=~/.zfunc` before
    /// `compinit` in `~/.zshrc`.
    Zsh,
    /// `graphcheck completions fish > ~/.config/fish/completions/graphcheck.fish`.
    Fish,
    /// `eval (graphcheck completions elvish | slurp)` in `~/.config/elvish/rc.elv`.
    Elvish,
    /// `graphcheck completions powershell | Out-String | Invoke-Expression` in `$PROFILE`.
    Powershell,
}

impl From<ShellArg> for clap_complete::Shell {
    fn from(s: ShellArg) -> clap_complete::Shell {
        match s {
            ShellArg::Bash => clap_complete::Shell::Bash,
            ShellArg::Zsh => clap_complete::Shell::Zsh,
            ShellArg::Fish => clap_complete::Shell::Fish,
            ShellArg::Elvish => clap_complete::Shell::Elvish,
            ShellArg::Powershell => clap_complete::Shell::PowerShell,
        }
    }
}

/// The exit codes, as `--help` lists them (the constants are [`graphcheck::exit`]).
pub const EXIT_CODES: &str = "\
Exit codes:
  0  verify: no findings (allowed ones and warnings aside); diff: equal; explain: found;
     retarget: no graph must be recaptured; show, schema, convert, completions: printed
  1  verify: findings; diff: the documents differ; explain: nothing matched; retarget:
     some graphs must be recaptured
  2  bad input or usage: an unreadable or invalid document or allowlist, a bad flag or
     explain target, two `-`, an --output that is a directory or one of the inputs";

/// How a document path reads standard input.
const STDIN: &str = "-";

/// Standard input as a file, to compare with `--output`.
const STDIN_FILE: &str = "/dev/stdin";

/// What error messages and `diff` call a document read from standard input.
const STDIN_NAME: &str = "<stdin>";

// The tagline is the crate's description (`about` without a value), so `--help`, the
// package metadata and the README say the same thing.
#[derive(Parser)]
#[command(name = "graphcheck", version, about, after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check a manifest alone (unregistered, unowned, mispooled) or against a live
    /// snapshot (every finding kind); or every rank of a run, from a folder or from pairs.
    #[command(after_help = EXIT_CODES)]
    Verify {
        /// MANIFEST [LIVE], DIR, or MANIFEST LIVE MANIFEST LIVE … (one pair per rank).
        ///
        /// MANIFEST [LIVE]: the manifest recorded at capture, then the live snapshot taken
        /// after sleep/wake or reload (either `-`: standard input). DIR: a folder holding one
        /// run's documents (`*.json`: one manifest per rank, at most one live snapshot per
        /// rank). MANIFEST LIVE MANIFEST LIVE …: several ranks' pairs, each manifest followed
        /// by its own rank's live snapshot. A folder and pairs are verified rank by rank and
        /// across ranks into one report.
        #[arg(required = true, value_name = "DOCUMENT")]
        documents: Vec<PathBuf>,
        /// An allowlist (TOML: [[allow]] path, kinds, reason).
        #[arg(long, value_name = "FILE")]
        allow: Option<PathBuf>,
        /// Fail (exit 1) on an allowlist entry that allowed nothing, instead of warning.
        #[arg(long)]
        deny_unused_allow: bool,
        /// How the report is printed: a table for people, JSON for tools, Markdown for a
        /// pull request or CI summary.
        #[arg(long, value_enum, default_value = "table")]
        format: FormatArg,
        /// Write the report to FILE instead of stdout: a regular file is replaced
        /// atomically (through a symlink, its target), a device or FIFO written in place;
        /// an input, or a file this user may not write, is refused; `-` is stdout.
        #[arg(long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Print addresses as symbolic ids (A3+0x40), as `show --normalized` does; with
        /// several ranks, each finding's named by its own rank's manifest.
        #[arg(long)]
        normalized: bool,
    },
    /// Trace an address, an owner path or a kernel through the ownership graph.
    #[command(after_help = EXIT_CODES)]
    Explain {
        /// The manifest to search (`-`: standard input).
        manifest: PathBuf,
        /// A device address (0x and 1 to 16 hexadecimal digits) or an owner path
        /// (model.layers[0].mlp.w).
        #[arg(
            required_unless_present = "kernel",
            conflicts_with = "kernel",
            value_parser = target_query
        )]
        target: Option<Query>,
        /// Explain every node whose name contains PATTERN (not empty).
        #[arg(long, value_name = "PATTERN", value_parser = kernel_query)]
        kernel: Option<Query>,
        /// Print Graphviz DOT instead of text.
        #[arg(long)]
        dot: bool,
        /// Print addresses as symbolic ids.
        #[arg(long)]
        normalized: bool,
    },
    /// Summarize a manifest or live snapshot.
    #[command(after_help = EXIT_CODES)]
    Show {
        /// The manifest or live snapshot (`-`: standard input).
        document: PathBuf,
        /// The stable text snapshot tests store: symbolic addresses, sorted, complete.
        #[arg(long, conflicts_with = "reads")]
        normalized: bool,
        /// What the graphs read, with no address, id or pool number: owners, pools, and per
        /// graph the owners read and its kernels; stable across runs and machines, for an
        /// engine's snapshot tests (a manifest only).
        #[arg(long)]
        reads: bool,
        /// With --reads: leave out kernel names, which differ between GPU architectures and
        /// library versions.
        #[arg(long, requires = "reads")]
        no_kernels: bool,
    },
    /// Compare two documents by owner path (tensor set, registration, layout, digests).
    #[command(after_help = EXIT_CODES)]
    Diff {
        /// The first document, manifest or live snapshot (`-`: standard input).
        a: PathBuf,
        /// The second document, compared against the first (`-`: standard input).
        b: PathBuf,
        /// How the report is printed: a table for people, JSON for tools, Markdown for a
        /// pull request or CI summary.
        #[arg(long, value_enum, default_value = "table")]
        format: FormatArg,
    },
    /// Plan the retarget of every graph (a dry run: nothing is changed): which graphs can
    /// be patched to read what their owners hold now, word by word, and which must be
    /// captured again, and why. Exit 0 when no graph must be recaptured.
    #[command(after_help = EXIT_CODES)]
    Retarget {
        /// The manifest recorded at capture (`-`: standard input).
        manifest: PathBuf,
        /// The live snapshot taken after sleep/wake or reload (`-`: standard input).
        live: PathBuf,
        /// An allowlist (TOML): allowed findings are neither fixed nor refused.
        #[arg(long, value_name = "FILE")]
        allow: Option<PathBuf>,
        /// How the plan is printed: a table for people, JSON for tools (the plan document,
        /// `schema/graphcheck-plan-v1.schema.json`), Markdown for a CI summary.
        #[arg(long, value_enum, default_value = "table")]
        format: FormatArg,
    },
    /// Print the JSON Schema of the format (manifest and live snapshot).
    #[command(after_help = EXIT_CODES)]
    Schema {
        /// The format version: 2, the compact layout graphcheck writes, or 1.
        #[arg(long, value_name = "N", default_value_t = FORMAT_VERSION, value_parser = format_version)]
        format_version: u32,
        /// Print the schema of the retarget plan (`graphcheck retarget --format json`)
        /// instead.
        #[arg(long, conflicts_with = "format_version")]
        plan: bool,
    },
    /// Rewrite a manifest or live snapshot in another format version: 2 is the compact
    /// layout graphcheck writes; 1 is what graphcheck before format 2 reads.
    #[command(after_help = EXIT_CODES)]
    Convert {
        /// The manifest or live snapshot, of either version (`-`: standard input).
        document: PathBuf,
        /// The format version to write.
        #[arg(long, value_name = "N", default_value_t = FORMAT_VERSION, value_parser = format_version)]
        format_version: u32,
        /// Write to FILE instead of stdout: a regular file is replaced atomically; the input,
        /// or a file this user may not write, is refused; `-` is stdout.
        #[arg(long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Print a shell's completion script (`graphcheck completions --help` says where to
    /// install it).
    ///
    /// The script is generated from graphcheck's own command-line definitions, so it
    /// completes every command, option and value of this version: write it again after an
    /// upgrade. Each shell below is followed by the line that installs its script.
    #[command(after_help = EXIT_CODES)]
    Completions {
        /// The shell to write the script for.
        #[arg(value_enum)]
        shell: ShellArg,
    },
}

/// The command line's definitions, as `graphcheck` parses them: what the completion
/// scripts, the man pages and the Markdown reference are generated from.
pub fn command() -> clap::Command {
    // The program is `graphcheck` however it was started (a path, `python -m graphcheck`).
    Cli::command().bin_name("graphcheck")
}

/// An output refused for being standard input, named so (`the document read from standard
/// input`), not by the device path it was compared as.
fn stdin_named(
    mut e: graphcheck::app::output::OutputIsInput,
) -> graphcheck::app::output::OutputIsInput {
    if e.input == Path::new(STDIN_FILE) {
        e.role.push_str(" read from");
        e.input = PathBuf::from("standard input");
    }
    e
}

/// A format version this build writes.
fn format_version(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(v) if FORMAT_VERSIONS.contains(&v) => Ok(v),
        _ => Err(format!("expected 1 or 2, not {s:?}")),
    }
}

/// `explain`'s target, checked while parsing the command line: a malformed address or an
/// empty target is a usage error, never an owner path that matches nothing.
fn target_query(s: &str) -> Result<Query, QueryError> {
    Query::parse(s)
}

/// `explain --kernel`'s pattern: an empty one is a usage error (it would match every node).
fn kernel_query(s: &str) -> Result<Query, QueryError> {
    Query::kernel(s)
}

/// Runs the `graphcheck` command line over `args` (the first is the program name, as in
/// `std::env::args_os`): parses, runs, prints the report to stdout and errors to stderr,
/// and returns the exit code ([`graphcheck::exit`]). `--help` and `--version` print and
/// return 0; a usage error prints clap's message and returns 2.
pub fn main_impl<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    main_with(args, Inputs::Read)
}

/// How the command line takes its document files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inputs {
    /// Read into memory: what any process that is not the command itself gets (the Python
    /// console entry runs [`main_impl`] inside a Python process, maybe an engine's).
    Read,
    /// Files of [`mapped::MAP_FROM`] bytes or more mapped into memory ([`mapped::mapped_source`]):
    /// the binary only, which answers a fault on a mapped page (another process truncated
    /// the file) with a message and exit code 2.
    Map,
}

/// [`main_impl`] taking its document files as `inputs` says.
pub fn main_with<I, T>(args: I, inputs: Inputs) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let mut command = command();
    let cli = match command
        .try_get_matches_from_mut(args)
        .and_then(|m| Cli::from_arg_matches(&m))
    {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout, usage errors to stderr, as clap's `exit` does.
            let _ = e.print();
            let _ = std::io::stdout().flush();
            return if e.use_stderr() {
                exit::BAD_INPUT
            } else {
                exit::OK
            };
        }
    };
    let code = match run(cli, inputs) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            exit::BAD_INPUT
        }
    };
    // In a Python process nothing flushes at exit on our behalf.
    let _ = std::io::stdout().flush();
    code
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
fn progress(manifest: &Path, live: Option<&Path>) -> Option<Instant> {
    let big = std::fs::metadata(manifest).is_ok_and(|m| m.len() > 16 << 20);
    (big && std::io::stderr().is_terminal()).then(|| {
        eprintln!("{}", loading_line(manifest, live));
        Instant::now()
    })
}

/// The progress line: it names the live snapshot only when one was given.
fn loading_line(manifest: &Path, live: Option<&Path>) -> String {
    match live {
        Some(l) => format!(
            "graphcheck: loading manifest {} and live snapshot {} …",
            manifest.display(),
            l.display()
        ),
        None => format!("graphcheck: loading manifest {} …", manifest.display()),
    }
}

/// The documents named on the command line, as the loaders take them: with
/// [`Inputs::Map`] a file of 1 MiB or more mapped into memory ([`mapped::mapped_source`]);
/// `-` standard input, read here. Standard input can be read once, so two `-` are a usage error, found
/// before anything is read.
fn sources<const N: usize>(paths: [&Path; N], inputs: Inputs) -> Result<[Source; N]> {
    let from_stdin = paths.iter().filter(|p| is_stdin(p)).count();
    if from_stdin > 1 {
        bail!("standard input (`-`) can be read only once, but `-` names {from_stdin} documents");
    }
    let mut stdin = match from_stdin {
        0 => None,
        _ => {
            let mut bytes = Vec::new();
            std::io::stdin()
                .lock()
                .read_to_end(&mut bytes)
                .context("failed to read standard input")?;
            Some(bytes)
        }
    };
    Ok(paths.map(|p| match stdin.take_if(|_| is_stdin(p)) {
        Some(bytes) => Source::Text {
            bytes,
            name: PathBuf::from(STDIN_NAME),
        },
        None if inputs == Inputs::Map => mapped::mapped_source(p),
        None => commands::source(p),
    }))
}

fn is_stdin(p: &Path) -> bool {
    p.as_os_str() == STDIN
}

/// The file an input path reads, for comparing it with `--output`: standard input's file
/// where the input is `-` (a shell's `< manifest.json`).
fn input_file(p: &Path) -> &Path {
    if is_stdin(p) {
        Path::new(STDIN_FILE)
    } else {
        p
    }
}

fn done(t: Option<Instant>) {
    if let Some(t) = t {
        eprintln!("graphcheck:   done in {:.2} s", t.elapsed().as_secs_f64());
    }
}

/// What `verify`'s documents name.
enum VerifyRun<'a> {
    /// `MANIFEST [LIVE]`.
    One {
        manifest: &'a Path,
        live: Option<&'a Path>,
    },
    /// `DIR`, with the documents it holds.
    Folder {
        dir: &'a Path,
        documents: Vec<PathBuf>,
    },
    /// `MANIFEST LIVE MANIFEST LIVE …`.
    Pairs(Vec<(PathBuf, PathBuf)>),
}

/// Decides what `verify`'s documents are, before any is read: one to two name a manifest
/// (or a folder) and its live snapshot, more are pairs ([`folder::pairs`]). Standard input
/// holds one document, so `-` among pairs is refused.
fn verify_run(documents: &[PathBuf]) -> Result<VerifyRun<'_>> {
    let (manifest, live) = match documents {
        [m] => (m.as_path(), None),
        [m, l] => (m.as_path(), Some(l.as_path())),
        _ => {
            if documents.iter().any(|p| is_stdin(p)) {
                bail!(
                    "standard input (`-`) holds one document, of `verify - [LIVE]` or `verify \
                     MANIFEST -`, not one among several pairs: give the pairs as files"
                );
            }
            return Ok(VerifyRun::Pairs(folder::pairs(documents)?));
        }
    };
    Ok(match folder::folder_documents(manifest, live)? {
        Some(documents) => VerifyRun::Folder {
            dir: manifest,
            documents,
        },
        None => VerifyRun::One { manifest, live },
    })
}

impl VerifyRun<'_> {
    /// The files read, each with its role, for refusing an `--output` that is one of them.
    fn inputs(&self) -> Vec<(&'static str, &Path)> {
        match self {
            VerifyRun::One { manifest, live } => {
                let mut inputs = vec![("manifest", input_file(manifest))];
                inputs.extend(live.map(|l| ("live snapshot", input_file(l))));
                inputs
            }
            VerifyRun::Folder { dir, documents } => std::iter::once(("manifest", *dir))
                .chain(documents.iter().map(|d| ("document", d.as_path())))
                .collect(),
            VerifyRun::Pairs(pairs) => pairs
                .iter()
                .flat_map(|(m, l)| [("manifest", m.as_path()), ("live snapshot", l.as_path())])
                .collect(),
        }
    }
}

fn run(cli: Cli, inputs: Inputs) -> Result<i32> {
    match cli.command {
        Command::Verify {
            documents,
            allow,
            deny_unused_allow,
            format,
            output,
            normalized,
        } => {
            let run = verify_run(&documents)?;
            let output = output.filter(|p| !is_stdin(p));
            // Before anything is read or written: an output that is an input would be lost.
            if let Some(out) = &output {
                let mut inputs = run.inputs();
                if let Some(a) = &allow {
                    inputs.push(("allowlist", a.as_path()));
                }
                refuse_inputs(out, &inputs)
                    .or_else(|e| {
                        // A folder's JSON file that is no document (a report written there
                        // by an earlier run) is skipped when read, so it may be the output.
                        if e.role == "document" && !folder::is_document(&e.input) {
                            Ok(())
                        } else {
                            Err(e)
                        }
                    })
                    .map_err(stdin_named)?;
            }
            let allow = match &allow {
                Some(p) if p == Path::new(STDIN) => bail!(
                    "--allow - : an allowlist is read from a file; standard input (`-`) is for documents only"
                ),
                Some(p) => Allowlist::load(p)?,
                None => Allowlist::default(),
            }
            .deny_unused(deny_unused_allow);
            let v = match &run {
                VerifyRun::Folder { dir, documents } => verify::verify_dir(dir, documents, &allow)?,
                VerifyRun::Pairs(pairs) => verify::verify_pairs(pairs, &allow)?,
                VerifyRun::One { manifest, live } => {
                    let t = progress(manifest, *live);
                    let v = match live {
                        Some(l) => {
                            let [m, l] = sources([manifest, l], inputs)?;
                            verify::verify(&m, Some(&l), &allow)?
                        }
                        None => {
                            let [m] = sources([manifest], inputs)?;
                            verify::verify(&m, None, &allow)?
                        }
                    };
                    done(t);
                    v
                }
            };
            for skipped in &v.skipped {
                eprintln!("note: {skipped}");
            }
            // Fitted to the terminal only when printed to one: a file keeps the fixed layout.
            let width = output
                .is_none()
                .then(graphcheck::present::fmt::terminal_width)
                .flatten();
            let text = v.render_fit(format.into(), normalized, width);
            match output {
                Some(p) => write_atomic(&p, text.as_bytes())
                    .with_context(|| format!("failed to write {}", p.display()))?,
                None => emit(&text)?,
            }
            let ok = v.report.ok;
            // Freeing millions of records takes time the answer does not need: they are
            // freed on a thread of their own. The binary exits without waiting for it; a
            // Python process that calls this in-process still gets the memory back.
            // Where no thread can be had, `spawn` drops the closure, and `v` with it, here.
            let _ = std::thread::Builder::new()
                .name("graphcheck-free".into())
                .spawn(move || drop(v));
            Ok(if ok { exit::OK } else { exit::FINDINGS })
        }
        Command::Explain {
            manifest,
            target,
            kernel,
            dot,
            normalized,
        } => {
            let [m] = sources([&manifest], inputs)?;
            let (m, _) = m.manifest_checked()?;
            let query = kernel
                .or(target)
                .expect("clap requires a target or --kernel");
            let (found, text) = commands::explain_text(&m, &query, dot, normalized);
            emit(&text)?;
            Ok(if found { exit::OK } else { exit::FINDINGS })
        }
        Command::Show {
            document,
            normalized: norm,
            reads: view,
            no_kernels,
        } => {
            let [source] = sources([&document], inputs)?;
            let d = source.document()?;
            let text = if view {
                let options = ReadsOptions {
                    kernels: !no_kernels,
                };
                reads(&d, options)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", source.name().display()))?
            } else if norm {
                normalized(&d)
            } else {
                summary(&d)
            };
            emit(&text)?;
            Ok(exit::OK)
        }
        Command::Diff { a, b, format } => {
            let [a, b] = sources([&a, &b], inputs)?;
            let width = graphcheck::present::fmt::terminal_width();
            let (same, text) = commands::diff_fit(&a, &b, format.into(), width)?;
            emit(&text)?;
            Ok(if same { exit::OK } else { exit::FINDINGS })
        }
        Command::Retarget {
            manifest,
            live,
            allow,
            format,
        } => {
            let allow = match &allow {
                Some(p) if p == Path::new(STDIN) => bail!(
                    "--allow - : an allowlist is read from a file; standard input (`-`) is for documents only"
                ),
                Some(p) => Allowlist::load(p)?,
                None => Allowlist::default(),
            };
            let [m, l] = sources([&manifest, &live], inputs)?;
            let plan = graphcheck::app::retarget::retarget(&m, &l, &allow)?;
            emit(&graphcheck::app::retarget::render(&plan, format.into()))?;
            Ok(if plan.ok { exit::OK } else { exit::FINDINGS })
        }
        Command::Schema {
            format_version,
            plan,
        } => {
            if plan {
                emit(&commands::plan_schema_text())?;
                return Ok(exit::OK);
            }
            emit(&commands::schema_text(format_version))?;
            Ok(exit::OK)
        }
        Command::Convert {
            document,
            format_version,
            output,
        } => {
            let output = output.filter(|p| !is_stdin(p));
            if let Some(out) = &output {
                refuse_inputs(out, &[("document", input_file(&document))]).map_err(stdin_named)?;
            }
            let [d] = sources([&document], inputs)?;
            let bytes = commands::convert(&d, format_version)?;
            match output {
                Some(p) => write_atomic(&p, &bytes)
                    .with_context(|| format!("failed to write {}", p.display()))?,
                None => emit(&String::from_utf8_lossy(&bytes))?,
            }
            Ok(exit::OK)
        }
        Command::Completions { shell } => {
            emit(&completion_script(shell.into())?)?;
            Ok(exit::OK)
        }
    }
}

/// The completion script of `shell` for the `graphcheck` command.
fn completion_script(shell: clap_complete::Shell) -> Result<String> {
    let mut cmd = command();
    cmd.build();
    let mut script = Vec::new();
    // `try_generate`, not `generate`: a generator's error is a message, never a panic.
    clap_complete::Generator::try_generate(&shell, &cmd, &mut script)
        .context("failed to generate the completion script")?;
    Ok(String::from_utf8_lossy(&script).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: the progress line named a live snapshot when none was given.
    #[test]
    fn the_progress_line_names_only_what_was_given() {
        let m = Path::new("m.json");
        assert_eq!(
            loading_line(m, None),
            "graphcheck: loading manifest m.json …"
        );
        assert_eq!(
            loading_line(m, Some(Path::new("l.json"))),
            "graphcheck: loading manifest m.json and live snapshot l.json …"
        );
    }

    /// Regression: the tagline was "The graphcheck command line"; positional arguments of
    /// explain, show and diff had no help; show and schema did not list the exit codes.
    #[test]
    fn help_has_a_tagline_argument_help_and_exit_codes_everywhere() {
        let mut cli = Cli::command();
        let about = cli.get_about().map(ToString::to_string);
        assert_eq!(about.as_deref(), Some(env!("CARGO_PKG_DESCRIPTION")));
        assert!(
            env!("CARGO_PKG_DESCRIPTION").contains("CUDA graph"),
            "the tagline says what graphcheck does"
        );
        assert!(cli.render_help().to_string().contains("Exit codes:"));
        // clap's own `help` subcommand is not ours to document.
        for sub in cli.get_subcommands_mut().filter(|s| s.get_name() != "help") {
            let name = sub.get_name().to_string();
            for arg in sub.get_positionals() {
                assert!(
                    arg.get_help().is_some(),
                    "{name} {} has no help",
                    arg.get_id()
                );
            }
            let help = sub.render_long_help().to_string();
            assert!(
                help.contains(EXIT_CODES),
                "{name} --help lists no exit codes"
            );
        }
    }
}

#[cfg(test)]
mod input_tests {
    use super::*;

    /// The binary maps a large document file; the console entry point, which may run
    /// inside someone's Python process, reads it.
    #[cfg(unix)]
    #[test]
    fn only_the_binary_maps_its_inputs() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.json");
        std::fs::write(&big, vec![b' '; mapped::MAP_FROM as usize]).unwrap();
        let small = dir.path().join("small.json");
        std::fs::write(&small, b"{}").unwrap();
        let [b, s] = sources([&big, &small], Inputs::Map).unwrap();
        assert!(matches!(b, Source::Shared { .. }), "{b:?}");
        assert!(matches!(s, Source::Path(_)), "{s:?}");
        let [b] = sources([&big], Inputs::Read).unwrap();
        assert!(matches!(b, Source::Path(_)), "{b:?}");
    }
}
