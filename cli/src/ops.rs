//! The work behind each command, shared by the command line and the Python API
//! (`graphcheck._native`): load, check, render. Nothing here prints.

use std::path::{Path, PathBuf};

use graphcheck::check::allow::Allowlist;
use graphcheck::check::finding::Report;
use graphcheck::check::ranks::{RankDocs, verify_ranks};
use graphcheck::document::format::{DocKind, Document, Live, Manifest};
use graphcheck::document::load::{Checked, LoadError, Source, Tables};
use graphcheck::document::ranks::{RankDoc, RanksError, group};
use graphcheck::present::explain::{Query, explain};
use graphcheck::present::fmt::{AddrFmt, RawAddrs};
use graphcheck::present::normalize::Symbolizer;
use graphcheck::present::report::{render_json, render_markdown, render_table_fit};
use graphcheck::present::text::diff_text_fit;

/// How a report or diff is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A table for terminals and CI logs.
    Table,
    /// The report as JSON (versioned: `format_version`).
    Json,
    /// Markdown for a CI step summary (`>> $GITHUB_STEP_SUMMARY`).
    Markdown,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Format, String> {
        match s {
            "table" => Ok(Format::Table),
            "json" => Ok(Format::Json),
            "markdown" => Ok(Format::Markdown),
            other => Err(format!("format is table, json or markdown, not {other:?}")),
        }
    }
}

/// A verified manifest: the documents and the report, ready to render in any format.
pub struct Verified {
    /// The manifest verified; with several ranks (`verify DIR`), the lowest rank's, whose
    /// addresses `--normalized` names (the other ranks' documents are dropped once
    /// verified).
    pub manifest: Manifest,
    pub tables: Tables,
    pub live: Option<(Live, Tables)>,
    pub report: Report,
}

/// Loads the manifest and the live snapshot (on two threads: parsing is most of the work)
/// and verifies them.
pub fn verify(
    manifest: &Source,
    live: Option<&Source>,
    allow: &Allowlist,
) -> Result<Verified, LoadError> {
    let (m, l) = std::thread::scope(|s| {
        let live_job = live.map(|l| s.spawn(move || l.live_checked()));
        let m = manifest.manifest_checked();
        let l = live_job.map(|j| match j.join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        });
        (m, l)
    });
    let names = (manifest.name(), live.map(Source::name));
    let (manifest, tables) = m?;
    let live = l.transpose()?;
    let report = graphcheck::check::verify::verify_checked(
        &manifest,
        &tables,
        live.as_ref().map(|(l, t)| (l, t)),
        allow,
    )
    .map_err(|e| e.in_files(names.0, names.1.unwrap_or(Path::new("live"))))?;
    Ok(Verified {
        manifest,
        tables,
        live,
        report,
    })
}

/// Why `verify DIR` could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DirError {
    #[error("failed to read the folder {}", dir.display())]
    Read {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("{}: the documents are not one run's: {why}", dir.display())]
    Ranks { dir: PathBuf, why: RanksError },
    #[error(
        "{} is a folder, verified with the live snapshots among its documents, so it takes no \
         live snapshot, but one was given too ({}): give the folder alone, or a manifest file \
         and its live snapshot",
        dir.display(), live.display()
    )]
    LiveWithFolder { dir: PathBuf, live: PathBuf },
}

/// The documents `verify` reads when its manifest argument names a folder (every rank of a
/// run, as [`dir_documents`] lists them); `None` when it names anything else (a file, or
/// standard input), verified as one manifest. `live` names the live snapshot given, if any:
/// a folder's live snapshots are among its documents, so one given beside it is refused.
/// The command line and the Python API (`graphcheck.verify(dir)`) both decide here.
pub fn folder_documents(
    manifest: &Path,
    live: Option<&Path>,
) -> Result<Option<Vec<PathBuf>>, DirError> {
    if !manifest.is_dir() {
        return Ok(None);
    }
    if let Some(live) = live {
        return Err(DirError::LiveWithFolder {
            dir: manifest.to_path_buf(),
            live: live.to_path_buf(),
        });
    }
    dir_documents(manifest).map(Some)
}

/// The documents `verify DIR` reads: every regular file of `dir` (not its subfolders) whose
/// name ends in `.json`, sorted by name. Each must be a manifest or a live snapshot: any
/// other JSON file is refused by the loader, naming it, rather than skipped.
pub fn dir_documents(dir: &Path) -> Result<Vec<PathBuf>, DirError> {
    let read = |source| DirError::Read {
        dir: dir.to_path_buf(),
        source,
    };
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(read)? {
        let p = e.map_err(read)?.path();
        if p.extension().is_some_and(|x| x == "json") && p.is_file() {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

/// Verifies the ranks of one run from their documents (as [`dir_documents`] lists them):
/// loads each (on a thread of its own), groups them by `producer.rank`
/// ([`graphcheck::document::ranks::group`]), verifies each rank's manifest against its own
/// live snapshot, and the manifests against each other, into one report.
pub fn verify_dir(dir: &Path, paths: &[PathBuf], allow: &Allowlist) -> Result<Verified, DirError> {
    let loaded: Vec<Result<Checked, LoadError>> = std::thread::scope(|s| {
        let jobs: Vec<_> = paths
            .iter()
            .map(|p| s.spawn(move || source(p).checked()))
            .collect();
        jobs.into_iter()
            .map(|j| match j.join() {
                Ok(r) => r,
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    });
    let docs: Vec<Checked> = loaded.into_iter().collect::<Result<_, _>>()?;
    let meta: Vec<RankDoc<'_>> = docs
        .iter()
        .zip(paths)
        .map(|(d, path)| {
            let (kind, p) = match d {
                Checked::Manifest(m, _) => (DocKind::Manifest, &m.producer),
                Checked::Live(l, _) => (DocKind::Live, &l.producer),
            };
            RankDoc {
                path,
                kind,
                rank: p.rank,
                world_size: p.world_size,
            }
        })
        .collect();
    let ranks = group(&meta).map_err(|why| DirError::Ranks {
        dir: dir.to_path_buf(),
        why,
    })?;
    let manifest = |i: usize| match &docs[i] {
        Checked::Manifest(m, t) => (m, t),
        Checked::Live(..) => unreachable!("grouping put a live snapshot as a manifest"),
    };
    let live = |i: usize| match &docs[i] {
        Checked::Live(l, t) => (l, t),
        Checked::Manifest(..) => unreachable!("grouping put a manifest as a live snapshot"),
    };
    let rank_docs: Vec<RankDocs<'_>> = ranks
        .ranks
        .iter()
        .map(|r| {
            let (m, t) = manifest(r.manifest);
            RankDocs {
                rank: r.rank,
                manifest: m,
                tables: t,
                live: r.live.map(live),
            }
        })
        .collect();
    let report =
        verify_ranks(ranks.world_size, &rank_docs, ranks.missing.clone(), allow).map_err(|e| {
            let files = ranks
                .ranks
                .iter()
                .find(|r| r.rank == e.rank)
                .expect("the rank that failed was given");
            let live = files.live.map_or(Path::new("live"), |l| &paths[l]);
            e.source.in_files(&paths[files.manifest], live)
        })?;
    let first = ranks.ranks[0].manifest;
    drop(rank_docs);
    let (manifest, tables) = match docs.into_iter().nth(first) {
        Some(Checked::Manifest(m, t)) => (m, t),
        _ => unreachable!("the lowest rank's manifest"),
    };
    Ok(Verified {
        manifest,
        tables,
        live: None,
        report,
    })
}

impl Verified {
    /// The report in `format`; with `normalized`, every address (in sentences too) as its
    /// symbolic id.
    pub fn render(&self, format: Format, normalized: bool) -> String {
        self.render_fit(format, normalized, None)
    }

    /// [`Verified::render`] with the table fitted to `width` columns (`None`: the fixed
    /// layout, for files, pipes and logs).
    pub fn render_fit(&self, format: Format, normalized: bool, width: Option<u16>) -> String {
        let sym = normalized.then(|| Symbolizer::for_manifest(&self.manifest));
        let fmt: &dyn AddrFmt = match &sym {
            Some(s) => s,
            None => &RawAddrs,
        };
        let text = match format {
            Format::Table => render_table_fit(&self.report, fmt, width),
            Format::Markdown => render_markdown(&self.report, fmt),
            Format::Json => render_json(&self.report),
        };
        match &sym {
            Some(s) => s.redact(&text),
            None => text,
        }
    }
}

/// Explains `query` in a manifest; returns whether anything matched and the text (DOT with
/// `dot`).
pub fn explain_text(m: &Manifest, query: &Query, dot: bool, normalized: bool) -> (bool, String) {
    let sym = normalized.then(|| Symbolizer::for_manifest(m));
    let fmt: &dyn AddrFmt = match &sym {
        Some(s) => s,
        None => &RawAddrs,
    };
    let e = explain(m, query, fmt);
    let text = if dot { e.dot } else { e.text };
    let text = match &sym {
        Some(s) => s.redact(&text),
        None => text,
    };
    (e.found, text)
}

/// Compares two documents by owner path; returns whether they are the same and the text.
pub fn diff(a: &Source, b: &Source, format: Format) -> Result<(bool, String), LoadError> {
    diff_fit(a, b, format, None)
}

/// [`diff`] with the table fitted to `width` columns.
pub fn diff_fit(
    a: &Source,
    b: &Source,
    format: Format,
    width: Option<u16>,
) -> Result<(bool, String), LoadError> {
    let (da, db) = (a.document()?, b.document()?);
    let r = graphcheck::check::diff::diff(&da, &db);
    let text = match format {
        Format::Json => json_text(&r),
        Format::Table | Format::Markdown => diff_text_fit(
            &r,
            a.name(),
            b.name(),
            matches!(format, Format::Markdown),
            width,
        ),
    };
    Ok((r.same, text))
}

/// The JSON Schema of format `version` (1 or 2), as `graphcheck schema` prints it.
pub fn schema_text(version: u32) -> String {
    json_text(&graphcheck::document::schema::json_schema_of(version))
}

/// A document of either version, rewritten in format `version` (1 or 2): compact JSON with
/// a final newline, as graphcheck writes documents.
pub fn convert(doc: &Source, version: u32) -> Result<Vec<u8>, LoadError> {
    let mut bytes = match doc.document()? {
        Document::Manifest(m) => serde_json::to_vec(&m.in_version(version)),
        Document::Live(l) => serde_json::to_vec(&l.in_version(version)),
    }
    .expect("a checked document of a version this build writes serializes");
    bytes.push(b'\n');
    Ok(bytes)
}

/// Pretty JSON with a final newline.
fn json_text(v: &impl serde::Serialize) -> String {
    let mut s = serde_json::to_string_pretty(v).expect("a report serializes");
    s.push('\n');
    s
}

/// A path as the loaders take it.
pub fn source(path: &Path) -> Source {
    Source::Path(path.to_path_buf())
}
