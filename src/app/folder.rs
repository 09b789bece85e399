//! The documents of a folder (`verify DIR`) and of a list of pairs: which files are
//! documents, which are refused, and why.

use std::path::{Path, PathBuf};

use crate::app::commands::source;

use crate::app::ranks::RanksError;
use crate::codec::load::LoadError;

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
pub(crate) fn no_folder<'a>(mut paths: impl Iterator<Item = &'a PathBuf>) -> Result<(), DirError> {
    match paths.find(|p| p.is_dir()) {
        Some(dir) => Err(DirError::FolderAmongPairs { dir: dir.clone() }),
        None => Ok(()),
    }
}
