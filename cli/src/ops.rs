//! The work behind each command, shared by the command line and the Python API
//! (`graphcheck._native`): load, check, render. Nothing here prints.

use std::path::{Path, PathBuf};

use graphcheck::app::ranks::{RankDoc, Ranks, RanksError, group};
use graphcheck::check::allow::Allowlist;
use graphcheck::check::finding::Report;
use graphcheck::check::ranks::{RankDocs, verify_ranks};
use graphcheck::check::verify::LiveIndex;
#[cfg(unix)]
use graphcheck::codec::load::SharedBytes;
use graphcheck::codec::load::{Checked, LoadError, Source};
use graphcheck::index::refs::Tables;
use graphcheck::model::format::{DocKind, Document, Live, Manifest};
use graphcheck::present::explain::{Query, explain};
use graphcheck::present::fmt::{AddrFmt, RawAddrs};
use graphcheck::present::normalize::Symbolizer;
use graphcheck::present::rank_symbols::RankSymbolizer;
use graphcheck::present::report::{render_json, render_markdown, render_table_fit};
use graphcheck::present::text::diff_text_fit;

#[cfg(unix)]
pub mod live_maps;

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
    /// The manifest verified; with several ranks (`verify DIR`, pairs), the lowest rank's.
    pub manifest: Manifest,
    pub tables: Tables,
    pub live: Option<(Live, Tables)>,
    pub report: Report,
    /// With several ranks, every rank's manifest but `manifest`'s, by rank: `--normalized`
    /// names each finding's addresses with its own rank's manifest. Empty for one manifest.
    /// (The live snapshots of several ranks are dropped once verified.)
    pub other_ranks: Vec<(u32, Manifest)>,
    /// The JSON files of a folder that are no graphcheck document, skipped (`verify DIR`).
    pub skipped: Vec<Skipped>,
}

/// A JSON file of a folder that is no graphcheck document (a report written into the
/// folder, another tool's file: no `format_version` and `kind` at its top level), which
/// `verify DIR` skips rather than refusing the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub path: PathBuf,
    /// What the file lacks, in words (`its top level has no `kind``).
    pub why: String,
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is not a graphcheck document ({}): skipped",
            self.path.display(),
            self.why
        )
    }
}

/// Loads the manifest and the live snapshot (on two threads: parsing is most of the work)
/// and verifies them.
pub fn verify(
    manifest: &Source,
    live: Option<&Source>,
    allow: &Allowlist,
) -> Result<Verified, LoadError> {
    let (m, l) = std::thread::scope(|s| {
        // The live snapshot's lookups are built on its thread too: it is done loading well
        // before the manifest (a third of the size, no graphs).
        let live_job = live.map(|l| {
            s.spawn(move || {
                l.live_checked().map(|(l, t)| {
                    let index = LiveIndex::new(&l);
                    (l, t, index)
                })
            })
        });
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
    let report = graphcheck::check::verify::verify_indexed(
        &manifest,
        &tables,
        live.as_ref().map(|(l, t, i)| (l, t, i)),
        allow,
    )
    .map_err(|e| e.in_files(names.0, names.1.unwrap_or(Path::new("live"))))?;
    Ok(Verified {
        manifest,
        tables,
        live: live.map(|(l, t, _)| (l, t)),
        report,
        other_ranks: Vec::new(),
        skipped: Vec::new(),
    })
}

/// Why `verify DIR`, or `verify` of several manifest and live snapshot pairs, could not run.
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
    #[error(
        "{} is named like a document (`*.json`) but cannot be read{}",
        path.display(), entry_why(error)
    )]
    Entry {
        path: PathBuf,
        // In the message, in words: not a `source` (thiserror takes a field of that name
        // as one), which would say it twice.
        error: std::io::Error,
    },
    #[error(
        "{} is named like a document (`*.json`) but is {what}: graphcheck reads documents \
         from regular files only (move it out of the folder, or rename it)",
        path.display()
    )]
    NotAFile { path: PathBuf, what: &'static str },
    #[error("{}: the documents are not one run's: {why}", dir.display())]
    Ranks { dir: PathBuf, why: RanksError },
    #[error(
        "{} is a folder, verified with the live snapshots among its documents, so it takes no \
         live snapshot, but one was given too ({}): give the folder alone, or a manifest file \
         and its live snapshot",
        dir.display(), live.display()
    )]
    LiveWithFolder { dir: PathBuf, live: PathBuf },
    #[error(
        "{count} documents were given, an odd number: more than two are pairs, each manifest \
         followed by its own rank's live snapshot (MANIFEST LIVE MANIFEST LIVE …)"
    )]
    OddPairs { count: usize },
    #[error(
        "{} is a folder, which is verified alone (`verify DIR`), not among pairs of manifests \
         and live snapshots: give the folder alone, or the pairs' files",
        dir.display()
    )]
    FolderAmongPairs { dir: PathBuf },
    #[error(
        "{} is a live snapshot, but it comes first in pair {pair}, where the manifest goes: \
         give each manifest, then its live snapshot",
        path.display()
    )]
    LiveAsManifest { pair: usize, path: PathBuf },
    #[error(
        "{} is a manifest, but it comes second in pair {pair}, where the live snapshot goes: \
         give each manifest, then its live snapshot",
        path.display()
    )]
    ManifestAsLive { pair: usize, path: PathBuf },
    #[error(
        "{} is a live snapshot of rank {live_rank}, but it is paired with {}, the manifest of \
         rank {manifest_rank}: a live snapshot is verified only against its own rank's manifest",
        live.display(), manifest.display()
    )]
    PairRanks {
        manifest: PathBuf,
        manifest_rank: u32,
        live: PathBuf,
        live_rank: u32,
    },
    #[error("the pairs are not one run's: {why}")]
    PairsRanks { why: RanksError },
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

/// The files `verify DIR` reads: every entry of `dir` (not its subfolders) whose name ends
/// in `.json`, sorted by name. Each must be a regular file, or a link to one: any other
/// entry so named (a dangling link, a link loop, a FIFO, a socket) is refused, naming it,
/// since skipping it would let its rank pass as merely missing. A file that is no
/// graphcheck document is skipped when read ([`verify_dir`], [`not_a_document`]); one that
/// is, and any fault of it (bad JSON, a bad header value), refuses the run, naming it.
pub fn dir_documents(dir: &Path) -> Result<Vec<PathBuf>, DirError> {
    let read = |source| DirError::Read {
        dir: dir.to_path_buf(),
        source,
    };
    let mut named = Vec::new();
    for e in std::fs::read_dir(dir).map_err(read)? {
        let p = e.map_err(read)?.path();
        if p.extension().is_some_and(|x| x == "json") {
            named.push(p);
        }
    }
    named.sort();
    let mut out = Vec::with_capacity(named.len());
    for p in named {
        // Followed through links: the file a link names is the one read.
        match std::fs::metadata(&p) {
            Ok(m) if m.is_file() => out.push(p),
            Ok(m) if m.is_dir() => {}
            Ok(m) => {
                return Err(DirError::NotAFile {
                    what: file_kind(&m.file_type()),
                    path: p,
                });
            }
            Err(error) => return Err(DirError::Entry { path: p, error }),
        }
    }
    Ok(out)
}

/// Why a folder entry cannot be opened, in words after its name: a dangling link names
/// what it points to.
fn entry_why(e: &std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::NotFound {
        ": it is a link to nothing (its target does not exist)".into()
    } else {
        format!(": {e}")
    }
}

/// What a folder entry that is neither a regular file nor a folder is, in words.
fn file_kind(t: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_socket() {
            return "a socket";
        }
        if t.is_block_device() || t.is_char_device() {
            return "a device";
        }
    }
    let _ = t;
    "not a regular file"
}

/// Whether a `*.json` of a folder that failed to load as a document is none at all, to be
/// skipped (with `why`, in words), rather than a damaged document that refuses the run. A
/// file is none when it has no header: valid JSON without `format_version` and `kind` at
/// its top level (a JSON report, another tool's file, an array), or bytes that do not open
/// a JSON object (a table or Markdown report `--output` wrote there, an empty file).
/// Bytes that open an object but are no valid JSON may be a document cut short: refused.
/// So is anything in a file named as `instrument()` names its manifests
/// (`graphcheck-<rank>-<pid>.json`): that name is a rank's document, never skipped.
pub fn not_a_document(path: &Path, e: &LoadError) -> Option<String> {
    if named_as_manifest(path) {
        return None;
    }
    match e {
        LoadError::NotADocument { why, .. } => Some(why.clone()),
        LoadError::Json { .. } | LoadError::Invalid { .. } => {
            match opening_byte(path) {
                // An object (or one behind a byte-order mark, which documents refuse).
                Some(b'{' | 0xEF) => None,
                Some(_) => Some("it does not open a JSON object".into()),
                None => Some("it is empty or only white space".into()),
            }
        }
        _ => None,
    }
}

/// Whether the file name is the one `graphcheck.torch.instrument()` gives a rank's
/// manifest: `graphcheck-<rank>-<pid>.json`.
fn named_as_manifest(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    let Some(middle) = name
        .strip_prefix("graphcheck-")
        .and_then(|n| n.strip_suffix(".json"))
    else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    middle
        .split_once('-')
        .is_some_and(|(rank, pid)| digits(rank) && digits(pid))
}

/// The file's first byte that is not JSON white space; `None` if it has none (or cannot be
/// read, which the load already reported).
fn opening_byte(path: &Path) -> Option<u8> {
    use std::io::Read as _;
    let file = std::fs::File::open(path).ok()?;
    let mut bytes = std::io::BufReader::new(file).bytes();
    bytes
        .find(|b| !matches!(b, Ok(b' ' | b'\t' | b'\n' | b'\r')))?
        .ok()
}

/// Verifies the ranks of one run from their documents (as [`dir_documents`] lists them):
/// loads each (on a thread of its own), groups them by `producer.rank`
/// ([`graphcheck::app::ranks::group`]), verifies each rank's manifest against its own
/// live snapshot, and the manifests against each other, into one report.
pub fn verify_dir(dir: &Path, paths: &[PathBuf], allow: &Allowlist) -> Result<Verified, DirError> {
    let mut docs = Vec::with_capacity(paths.len());
    let mut read = Vec::with_capacity(paths.len());
    let mut skipped = Vec::new();
    for (path, doc) in paths.iter().zip(load_each(paths)) {
        match doc {
            Ok(doc) => {
                docs.push(doc);
                read.push(path.clone());
            }
            Err(e) => match not_a_document(path, &e) {
                Some(why) => skipped.push(Skipped {
                    path: path.clone(),
                    why,
                }),
                None => return Err(e.into()),
            },
        }
    }
    let meta = rank_docs(&docs, &read);
    let ranks = group(&meta).map_err(|why| DirError::Ranks {
        dir: dir.to_path_buf(),
        why,
    })?;
    let mut v = verify_grouped(docs, &read, &ranks, allow)?;
    v.skipped = skipped;
    Ok(v)
}

/// Whether `path` is a graphcheck document (it has the header), for `--output`: a folder's
/// JSON file that is none is skipped by `verify DIR`, so it may be written over.
pub fn is_document(path: &Path) -> bool {
    match source(path).header() {
        Ok(_) => true,
        Err(e) => not_a_document(path, &e).is_none(),
    }
}

/// The files `verify` takes after its first two, as pairs (`M0 L0 M1 L1 …`: each manifest,
/// then its live snapshot): an even number of them, none a folder. What each file is and
/// its rank are checked once read ([`verify_pairs`]).
pub fn pairs(files: &[PathBuf]) -> Result<Vec<(PathBuf, PathBuf)>, DirError> {
    if files.len() % 2 != 0 {
        return Err(DirError::OddPairs { count: files.len() });
    }
    no_folder(files.iter())?;
    Ok(files
        .chunks_exact(2)
        .map(|p| (p[0].clone(), p[1].clone()))
        .collect())
}

/// A folder among pairs is refused: it is a run of its own (`verify DIR`).
fn no_folder<'a>(mut paths: impl Iterator<Item = &'a PathBuf>) -> Result<(), DirError> {
    match paths.find(|p| p.is_dir()) {
        Some(dir) => Err(DirError::FolderAmongPairs { dir: dir.clone() }),
        None => Ok(()),
    }
}

/// Verifies the ranks of one run given as pairs, each a manifest and its live snapshot
/// (`verify M0 L0 M1 L1 …`, `graphcheck.verify([(m0, l0), (m1, l1)])`), as [`verify_dir`]
/// verifies a folder's documents (the same grouping, refusals and report), once each pair
/// is checked to be a manifest, then a live snapshot, of one rank: a snapshot is never
/// compared with another rank's manifest.
pub fn verify_pairs(pairs: &[(PathBuf, PathBuf)], allow: &Allowlist) -> Result<Verified, DirError> {
    no_folder(pairs.iter().flat_map(|(m, l)| [m, l]))?;
    let paths: Vec<PathBuf> = pairs
        .iter()
        .flat_map(|(m, l)| [m.clone(), l.clone()])
        .collect();
    let docs = load_all(&paths)?;
    let meta = rank_docs(&docs, &paths);
    for (i, pair) in meta.chunks_exact(2).enumerate() {
        let (m, l) = (&pair[0], &pair[1]);
        if m.kind != DocKind::Manifest {
            return Err(DirError::LiveAsManifest {
                pair: i + 1,
                path: m.path.to_path_buf(),
            });
        }
        if l.kind != DocKind::Live {
            return Err(DirError::ManifestAsLive {
                pair: i + 1,
                path: l.path.to_path_buf(),
            });
        }
        if m.rank != l.rank {
            return Err(DirError::PairRanks {
                manifest: m.path.to_path_buf(),
                manifest_rank: m.rank,
                live: l.path.to_path_buf(),
                live_rank: l.rank,
            });
        }
    }
    let ranks = group(&meta).map_err(|why| DirError::PairsRanks { why })?;
    Ok(verify_grouped(docs, &paths, &ranks, allow)?)
}

/// Loads and checks every document, each on a thread of its own.
fn load_all(paths: &[PathBuf]) -> Result<Vec<Checked>, LoadError> {
    load_each(paths).into_iter().collect()
}

/// Loads and checks each document on a thread of its own; one result per path.
fn load_each(paths: &[PathBuf]) -> Vec<Result<Checked, LoadError>> {
    std::thread::scope(|s| {
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
    })
}

/// What grouping by rank needs of each document.
fn rank_docs<'a>(docs: &[Checked], paths: &'a [PathBuf]) -> Vec<RankDoc<'a>> {
    docs.iter()
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
        .collect()
}

/// Verifies documents grouped by rank (`docs[i]` read from `paths[i]`) into one report:
/// each rank's manifest against its own live snapshot, the manifests against each other.
fn verify_grouped(
    docs: Vec<Checked>,
    paths: &[PathBuf],
    ranks: &Ranks,
    allow: &Allowlist,
) -> Result<Verified, LoadError> {
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
    drop(rank_docs);
    // Each rank's manifest is kept for `--normalized`; the live snapshots go.
    let mut docs: Vec<Option<Checked>> = docs.into_iter().map(Some).collect();
    let mut manifests = ranks.ranks.iter().map(|r| match docs[r.manifest].take() {
        Some(Checked::Manifest(m, t)) => (r.rank, m, t),
        _ => unreachable!("grouping put a live snapshot as a manifest"),
    });
    let (_, manifest, tables) = manifests.next().expect("grouping gives at least one rank");
    Ok(Verified {
        manifest,
        tables,
        live: None,
        report,
        other_ranks: manifests.map(|(rank, m, _)| (rank, m)).collect(),
        skipped: Vec::new(),
    })
}

impl Verified {
    /// The report in `format`; with `normalized`, every address (in sentences too) as its
    /// symbolic id, named by the manifest of the finding's own rank where there are several.
    pub fn render(&self, format: Format, normalized: bool) -> String {
        self.render_fit(format, normalized, None)
    }

    /// [`Verified::render`] with the table fitted to `width` columns (`None`: the fixed
    /// layout, for files, pipes and logs).
    pub fn render_fit(&self, format: Format, normalized: bool, width: Option<u16>) -> String {
        if normalized && self.report.world_size.is_some() {
            return self.render_ranks_normalized(format, width);
        }
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

    /// A report of several ranks with every finding's addresses named by its own rank's
    /// manifest (the report's ranks are in rank order; `manifest` is the lowest's).
    fn render_ranks_normalized(&self, format: Format, width: Option<u16>) -> String {
        let lowest = self.report.ranks.first().map_or(0, |r| r.rank);
        let manifests = std::iter::once((lowest, &self.manifest))
            .chain(self.other_ranks.iter().map(|(rank, m)| (*rank, m)));
        let ranks =
            RankSymbolizer::new(manifests.map(|(rank, m)| (rank, Symbolizer::for_manifest(m))));
        let (report, symbols) = ranks.normalize(&self.report);
        match format {
            Format::Table => render_table_fit(&report, &symbols, width),
            Format::Markdown => render_markdown(&report, &symbols),
            Format::Json => symbols.redact(&render_json(&report)),
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
    json_text(&graphcheck::codec::schema::json_schema_of(version))
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

/// A path as the binary's own loads take it ([`crate::Inputs::Map`]): on Unix, a regular
/// file of at least [`MAP_FROM`] bytes mapped into memory (its pages are the page cache's,
/// never copied into fresh memory); any other path read by the loader, which also reports
/// why one cannot be. Never for a process that is not the command: the Python API and the
/// console entry point ([`crate::main_impl`]) read.
pub fn mapped_source(path: &Path) -> Source {
    #[cfg(unix)]
    if let Some(map) = mapped(path) {
        let map = live_maps::Mapped::new(map, path);
        pause_after_map(path, map.as_ref().len());
        return Source::Shared {
            bytes: SharedBytes(std::sync::Arc::new(map)),
            name: path.to_path_buf(),
        };
    }
    source(path)
}

/// Test-only: with `GRAPHCHECK_TEST_PAUSE_AFTER_MAP_MS=N` set, the binary waits after
/// mapping a file, up to N ms or until the file is shorter than its `len` mapped bytes, so
/// a test can truncate a mapped input before it is read (tests/mapped_inputs.rs). No user
/// has a reason to set it; unset, nothing is asked of the file.
#[cfg(unix)]
fn pause_after_map(path: &Path, len: usize) {
    let Some(ms) = std::env::var_os("GRAPHCHECK_TEST_PAUSE_AFTER_MAP_MS")
        .and_then(|v| v.to_str()?.parse::<u64>().ok())
    else {
        return;
    };
    let until = std::time::Instant::now() + std::time::Duration::from_millis(ms);
    while std::time::Instant::now() < until
        && std::fs::metadata(path).is_ok_and(|m| m.len() >= len as u64)
    {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Files from this size on are mapped rather than read.
pub const MAP_FROM: u64 = 1 << 20;

/// `path` mapped into memory, read-only, its pages faulted in at once; `None` for what is
/// not a regular file of at least [`MAP_FROM`] bytes or what the system does not map.
#[cfg(unix)]
#[allow(unsafe_code)]
fn mapped(path: &Path) -> Option<memmap2::Mmap> {
    // Asked before opening: opening a FIFO blocks until something writes to it.
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() < MAP_FROM {
        return None;
    }
    let file = std::fs::File::open(path).ok()?;
    // The file may have been replaced between the two: the opened one is what is mapped.
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() < MAP_FROM {
        return None;
    }
    // SAFETY: a read-only shared mapping of a regular file this process opened and never
    // writes. What it cannot rule out is another process changing the file while the map
    // lives, which Rust counts as undefined behaviour for the `&[u8]` the loader reads:
    // - a rewrite in place can show the loader (which may read the bytes more than once)
    //   a mix of old and new bytes: at worst a wrong report or a parse error, as a `read`
    //   racing the same writer can give;
    // - a truncation makes reads past the new end fault (SIGBUS), which the binary answers
    //   with a message naming the file (registered in `live_maps`) and exit code 2
    //   (main.rs).
    // graphcheck's own writers replace a regular file by renaming a new one over it, which
    // leaves a mapped file whole (`write_atomic`); only a path reached through
    // `/proc/<pid>/fd` or a device is written in place, and no document is such a file.
    unsafe { memmap2::MmapOptions::new().populate().map(&file) }.ok()
}
