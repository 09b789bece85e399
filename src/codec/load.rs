//! Reading manifests and live snapshots of either format version: read the version, parse
//! the body of that version into the model, and check every reference ([`crate::index::refs`]),
//! so that later stages can index without failing. Errors name the file and the JSON path
//! of the bad value in the file's own layout.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::codec::objects::Objects;
use crate::codec::schema;
use crate::codec::v2::{self, LiveV2, ManifestV2};
use crate::codec::wording::{describe, shorten, shorten_quoted};
use crate::index::refs::{Invalid, Tables, check_live, check_manifest};
use crate::model::format::{DocKind, Document, Live, Manifest};
use crate::model::version::version_message;

// The reference checks live in `refs`; they are part of loading, and named from here too.

mod header;
use header::{Header, check_version, header, version};

/// Why a document could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    #[error("failed to read {}", shown(path))]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}:{line}:{column}: invalid document {}: {}", path.display(), at(json_path), shorten_quoted(message))]
    Json {
        path: PathBuf,
        json_path: String,
        line: usize,
        column: usize,
        message: String,
    },
    /// `found` is the value as JSON text: `2`, `"1"`, `null`.
    #[error("{}: {}", path.display(), version_message(&shorten(found)))]
    Version { path: PathBuf, found: String },
    /// JSON that is no graphcheck document at all: not an object, or without the header
    /// (`format_version` and `kind`), as a report or another tool's file is.
    #[error(
        "{}: not a graphcheck document: {why} (a manifest or live snapshot is a JSON object \
         with `format_version` and `kind`)",
        path.display()
    )]
    NotADocument { path: PathBuf, why: String },
    #[error("{}: `kind` is `{found}`, expected a `{expected}` document", path.display())]
    Kind {
        path: PathBuf,
        found: DocKind,
        expected: DocKind,
    },
    #[error("{}: invalid document {}: {}", path.display(), at(json_path), shorten_quoted(message))]
    Invalid {
        path: PathBuf,
        json_path: String,
        message: String,
    },
    /// Two documents, each valid, that do not belong together: `why` is the check's
    /// error ([`crate::check::pair::PairError`]), which this layer does not know.
    #[error("{} cannot be verified against {}: {why}", live.display(), manifest.display())]
    Pair {
        manifest: PathBuf,
        live: PathBuf,
        why: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// A path as an error names it: whole, unless it is longer than any file system takes
/// (`PATH_MAX`, 4096 bytes), as a document's text handed over as a path would be: then its
/// start and a count of the rest, never megabytes of it.
fn shown(path: &Path) -> String {
    const LONGEST: usize = 4096;
    let text = path.display().to_string();
    match text.char_indices().nth(LONGEST) {
        Some(_) => {
            let start: String = text.chars().take(80).collect();
            let rest = text.chars().count() - 80;
            format!("{start}… ({rest} more characters: longer than any path)")
        }
        None => text,
    }
}

/// Where in the document, in words.
fn at(json_path: &str) -> String {
    if json_path == "." || json_path.is_empty() {
        "at the top level".to_string()
    } else {
        format!("at `{json_path}`")
    }
}

impl Invalid {
    fn in_file(self, path: &Path) -> LoadError {
        LoadError::Invalid {
            path: path.to_path_buf(),
            json_path: self.json_path,
            message: self.message,
        }
    }
}

/// Where a document comes from: a file, JSON text in memory (from Python), or bytes held
/// elsewhere (a file the CLI mapped into memory), named for error messages. Every way in
/// goes through the same parse, version and kind checks.
#[derive(Clone, Debug)]
pub enum Source {
    Path(PathBuf),
    Text { bytes: Vec<u8>, name: PathBuf },
    Shared { bytes: SharedBytes, name: PathBuf },
}

/// Bytes another owner holds, shared between the threads that read them: the CLI's memory
/// map of an input file, which saves copying it into fresh memory (on a machine whose free
/// memory another process left fragmented, that copy cost about a seventh of a large
/// verify: benches/verify.md).
#[derive(Clone)]
pub struct SharedBytes(pub std::sync::Arc<dyn AsRef<[u8]> + Send + Sync>);

impl std::ops::Deref for SharedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        (*self.0).as_ref()
    }
}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedBytes({} bytes)", self.len())
    }
}

impl Source {
    /// What error messages and `diff` call the document.
    pub fn name(&self) -> &Path {
        match self {
            Source::Path(p) => p,
            Source::Text { name, .. } | Source::Shared { name, .. } => name,
        }
    }

    /// Parses and checks a manifest, keeping the lookups checking built (for
    /// [`crate::check::verify::verify_checked`]).
    pub fn manifest_checked(&self) -> Result<(Manifest, Tables), LoadError> {
        let path = self.name();
        let m = self.with_bytes(|b| read_manifest(b, path))?;
        let t = checked_manifest(&m, path)?;
        Ok((m, t))
    }

    /// Parses and checks a live snapshot, keeping the lookups checking built.
    pub fn live_checked(&self) -> Result<(Live, Tables), LoadError> {
        let path = self.name();
        let l = self.with_bytes(|b| read_live(b, path))?;
        let t = checked_live(&l, path)?;
        Ok((l, t))
    }

    /// Parses and checks either document, by its `kind` (after its `format_version`).
    pub fn document(&self) -> Result<Document, LoadError> {
        self.checked().map(|c| match c {
            Checked::Manifest(m, _) => Document::Manifest(m),
            Checked::Live(l, _) => Document::Live(l),
        })
    }

    /// Parses and checks either document, by its `kind`, keeping the lookups checking built
    /// (for `verify DIR`, which reads every document of a folder).
    pub fn checked(&self) -> Result<Checked, LoadError> {
        let path = self.name();
        let doc = self.with_bytes(|bytes| match header(bytes, path)? {
            (_, DocKind::Live) => read_live(bytes, path).map(Document::Live),
            _ => read_manifest(bytes, path).map(Document::Manifest),
        })?;
        match doc {
            Document::Manifest(m) => {
                let t = checked_manifest(&m, path)?;
                Ok(Checked::Manifest(m, t))
            }
            Document::Live(l) => {
                let t = checked_live(&l, path)?;
                Ok(Checked::Live(l, t))
            }
        }
    }

    /// Reads only the header: the format version and kind, or
    /// [`LoadError::NotADocument`] for JSON without one.
    pub fn header(&self) -> Result<(u32, DocKind), LoadError> {
        let path = self.name();
        self.with_bytes(|bytes| header(bytes, path))
    }

    /// Runs `f` over the document's bytes; a file's are read, and freed before the caller
    /// goes on to check what was parsed (shared bytes live as long as the source).
    fn with_bytes<T>(&self, f: impl FnOnce(&[u8]) -> Result<T, LoadError>) -> Result<T, LoadError> {
        match self {
            Source::Path(p) => f(&read(p)?),
            Source::Text { bytes, .. } => f(bytes),
            Source::Shared { bytes, .. } => f(bytes),
        }
    }
}

/// A checked document of either kind, with its lookups ([`Source::checked`]).
#[derive(Debug)]
pub enum Checked {
    Manifest(Manifest, Tables),
    Live(Live, Tables),
}

/// Reads and checks a manifest.
pub fn load_manifest(path: &Path) -> Result<Manifest, LoadError> {
    load_manifest_checked(path).map(|(m, _)| m)
}

/// Reads and checks a live snapshot.
pub fn load_live(path: &Path) -> Result<Live, LoadError> {
    load_live_checked(path).map(|(l, _)| l)
}

/// Reads and checks a manifest, keeping the lookups checking built.
pub fn load_manifest_checked(path: &Path) -> Result<(Manifest, Tables), LoadError> {
    Source::Path(path.to_path_buf()).manifest_checked()
}

/// Reads and checks a live snapshot, keeping the lookups checking built.
pub fn load_live_checked(path: &Path) -> Result<(Live, Tables), LoadError> {
    Source::Path(path.to_path_buf()).live_checked()
}

/// Reads and checks either document, by its `kind`.
pub fn load_document(path: &Path) -> Result<Document, LoadError> {
    Source::Path(path.to_path_buf()).document()
}

fn read(path: &Path) -> Result<Vec<u8>, LoadError> {
    std::fs::read(path).map_err(|source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Parses and checks a manifest held in memory, of either format version; `path` only
/// names it in errors.
pub fn parse_manifest(bytes: &[u8], path: &Path) -> Result<Manifest, LoadError> {
    let m = read_manifest(bytes, path)?;
    checked_manifest(&m, path)?;
    Ok(m)
}

/// Parses and checks a live snapshot held in memory, of either format version; `path`
/// only names it in errors.
pub fn parse_live(bytes: &[u8], path: &Path) -> Result<Live, LoadError> {
    let l = read_live(bytes, path)?;
    checked_live(&l, path)?;
    Ok(l)
}

/// Parses a manifest of either format version into the model, references not yet checked.
fn read_manifest(bytes: &[u8], path: &Path) -> Result<Manifest, LoadError> {
    match version(bytes, path)? {
        1 => parse_body::<Manifest>(bytes, path, 1),
        // The fast reader takes the common case; anything it declines, valid or not, is
        // parsed again here, which words every error.
        v => match v2::fast_manifest(bytes, v) {
            Some(m) => Ok(m),
            None => parse_body::<ManifestV2>(bytes, path, v)?
                .into_model()
                .map_err(|e| e.in_file(path)),
        },
    }
}

/// Parses a live snapshot of either format version into the model, references not yet
/// checked.
fn read_live(bytes: &[u8], path: &Path) -> Result<Live, LoadError> {
    match version(bytes, path)? {
        1 => parse_body::<Live>(bytes, path, 1),
        v => parse_body::<LiveV2>(bytes, path, v)?
            .into_model()
            .map_err(|e| e.in_file(path)),
    }
}

/// Checks every reference of a parsed manifest; an error names the path of the file's own
/// layout.
fn checked_manifest(m: &Manifest, path: &Path) -> Result<Tables, LoadError> {
    check_manifest(m).map_err(|e| match m.format_version {
        1 => e.in_file(path),
        _ => v2::locate(e).in_file(path),
    })
}

fn checked_live(l: &Live, path: &Path) -> Result<Tables, LoadError> {
    check_live(l).map_err(|e| match l.format_version {
        1 => e.in_file(path),
        _ => v2::locate(e).in_file(path),
    })
}

/// The documents of both versions, to the loader: what kind each is, and where its header
/// is.
trait Body: for<'de> Deserialize<'de> {
    const KIND: DocKind;
    fn header(&self) -> (u32, DocKind);
}

macro_rules! body {
    ($($t:ty => $kind:expr),*) => {$(
        impl Body for $t {
            const KIND: DocKind = $kind;
            fn header(&self) -> (u32, DocKind) {
                (self.format_version, self.kind)
            }
        }
    )*};
}

body!(
    Manifest => DocKind::Manifest,
    Live => DocKind::Live,
    ManifestV2 => DocKind::Manifest,
    LiveV2 => DocKind::Live
);

/// Parses a document of kind `T`, format `version`, and checks its kind: the version was
/// read first (a document of another version may parse and mean something else).
fn parse_body<T: Body>(bytes: &[u8], path: &Path, version: u32) -> Result<T, LoadError> {
    let doc: T = parse_typed(bytes, path, T::KIND, version)?;
    let (found, kind) = doc.header();
    if found != version {
        return Err(LoadError::Version {
            path: path.to_path_buf(),
            found: found.to_string(),
        });
    }
    expect_kind(kind, T::KIND, path)?;
    Ok(doc)
}

fn expect_kind(found: DocKind, expected: DocKind, path: &Path) -> Result<(), LoadError> {
    if found == expected {
        Ok(())
    } else {
        Err(LoadError::Kind {
            path: path.to_path_buf(),
            found,
            expected,
        })
    }
}

fn parse_typed<T: for<'de> Deserialize<'de>>(
    bytes: &[u8],
    path: &Path,
    expected: DocKind,
    version: u32,
) -> Result<T, LoadError> {
    // The fast path tracks no JSON path; only a failed parse is repeated with tracking, so
    // that its error can say where. Both read records from JSON objects only (`Objects`).
    let fast = || -> Result<T, serde_json::Error> {
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let v = T::deserialize(Objects(&mut de))?;
        de.end()?;
        Ok(v)
    };
    if let Ok(v) = fast() {
        return Ok(v);
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize::<_, T>(Objects(&mut de)) {
        Ok(v) => {
            de.end().map_err(|e| LoadError::Json {
                path: path.to_path_buf(),
                json_path: ".".into(),
                line: e.line(),
                column: e.column(),
                message: describe(&e, bytes, None, &[]),
            })?;
            Ok(v)
        }
        Err(e) => {
            // A document of another version or kind fails somewhere in its body; say why.
            if let Ok(h) = serde_json::from_slice::<Header>(bytes) {
                check_version(h.format_version.as_ref(), path, bytes)?;
                let found = match h.kind.as_ref().and_then(|k| k.as_str()) {
                    Some("manifest") => Some(DocKind::Manifest),
                    Some("live") => Some(DocKind::Live),
                    _ => None,
                };
                if let Some(found) = found {
                    expect_kind(found, expected, path)?;
                }
            }
            let mut err = json_error(path, bytes, Some((expected, version)), Err(e));
            if version == 2 {
                err = err.map_err(|e| v1_body_hint(e, bytes, expected));
            }
            err
        }
    }
}

/// A format 2 document that failed to parse, whose body is format 1's: say so, since the
/// fix is its `format_version`, not its body.
fn v1_body_hint(e: LoadError, bytes: &[u8], kind: DocKind) -> LoadError {
    let v1 = |bytes: &[u8]| {
        let mut de = serde_json::Deserializer::from_slice(bytes);
        match kind {
            DocKind::Live => Live::deserialize(Objects(&mut de)).is_ok(),
            _ => Manifest::deserialize(Objects(&mut de)).is_ok(),
        }
    };
    match e {
        LoadError::Json {
            path,
            json_path,
            line,
            column,
            message,
        } if v1(bytes) => LoadError::Json {
            path,
            json_path,
            line,
            column,
            message: format!(
                "{message} (the body is in format 1's layout: a format 1 document says \
                 `\"format_version\": 1`)"
            ),
        },
        e => e,
    }
}

fn json_error<T>(
    path: &Path,
    bytes: &[u8],
    expected: Option<(DocKind, u32)>,
    r: Result<T, serde_path_to_error::Error<serde_json::Error>>,
) -> Result<T, LoadError> {
    r.map_err(|e| {
        // The path up to where it broke: serde_path_to_error ends it with `?` where the
        // parser was between a key and its value (a document cut short there).
        let at: Vec<schema::Step> = e
            .path()
            .iter()
            .map_while(|s| match s {
                serde_path_to_error::Segment::Seq { index } => Some(schema::Step::Index(*index)),
                serde_path_to_error::Segment::Map { key } => Some(schema::Step::Key(key.clone())),
                serde_path_to_error::Segment::Enum { variant } => {
                    Some(schema::Step::Key(variant.clone()))
                }
                serde_path_to_error::Segment::Unknown => None,
            })
            .collect();
        let json_path = schema::render_path(&at);
        let inner = e.into_inner();
        let (line, column) = (inner.line(), inner.column());
        let message = describe(&inner, bytes, expected, &at);
        LoadError::Json {
            path: path.to_path_buf(),
            json_path,
            line,
            column,
            message,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error of loading `bytes` as a manifest (`m.json`), as the user reads it.
    pub(super) fn err(bytes: &[u8]) -> String {
        parse_manifest(bytes, Path::new("m.json"))
            .unwrap_err()
            .to_string()
    }

    /// The test manifest, written in format 1's layout (format 2's errors: `v2/tests.rs`).
    fn manifest() -> crate::model::format::Manifest {
        crate::testkit::manifest().in_version(1)
    }

    #[test]
    fn ranges_round_trip_and_a_bad_one_is_named() {
        use crate::model::format::{Addr, Digest, RangeDigest};
        for version in [1, 2] {
            let mut m = manifest().in_version(version);
            m.ranges.push(RangeDigest {
                addr: Addr(0x7f00_0000_2600),
                size: 4096,
                digest: Digest("gc128:00ff".into()),
            });
            let bytes = serde_json::to_vec(&m).unwrap();
            assert_eq!(parse_manifest(&bytes, Path::new("m.json")).unwrap(), m);
            let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            v["ranges"][0]["size"] = 0.into();
            let e = err(&serde_json::to_vec(&v).unwrap());
            assert!(e.contains("`ranges[0].size`") && e.contains("empty"), "{e}");
            let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            v["ranges"][0]["digest"] = "00ff".into();
            let e = err(&serde_json::to_vec(&v).unwrap());
            assert!(e.contains("`ranges[0].digest`"), "{e}");
        }
        // None: no field, as documents before ranges were written.
        let text = serde_json::to_string(&manifest()).unwrap();
        assert!(!text.contains("\"ranges\""));
    }

    #[test]
    fn round_trips_and_names_file_and_json_path_on_errors() {
        let m = manifest();
        let bytes = serde_json::to_vec(&m).unwrap();
        assert_eq!(parse_manifest(&bytes, Path::new("m.json")).unwrap(), m);

        let e = err(b"not json");
        assert!(
            e.starts_with("m.json:1:2: invalid document at the top level: not valid JSON"),
            "{e}"
        );
        let e = err(&bytes[..bytes.len() / 2]);
        assert!(e.contains("the document ends early"), "{e}");
        let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        v["format_version"] = 3.into();
        v["graphs"] = serde_json::json!({"renamed": true});
        let e = err(&serde_json::to_vec(&v).unwrap());
        assert!(e.contains("`format_version` is 3"), "{e}");
        let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        v.as_object_mut().unwrap().remove("graphs");
        let e = err(&serde_json::to_vec(&v).unwrap());
        assert!(e.contains("missing field `graphs`"), "{e}");
        let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        v["tensors"][1]["shape"][0] = "wide".into();
        let e = err(&serde_json::to_vec(&v).unwrap());
        assert!(e.contains("`tensors[1].shape[0]`"), "{e}");
        let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        v["tensors"][2]["id"] = 0.into();
        let e = err(&serde_json::to_vec(&v).unwrap());
        assert!(e.contains("`tensors[2].id`: two tensors claim id 0"), "{e}");
        let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        v["owners"][0]["path"] = "model..w".into();
        let e = err(&serde_json::to_vec(&v).unwrap());
        assert!(e.contains("`owners[0].path`"), "{e}");
        let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        v["graphs"][1]["nodes"][0]["touches"][0]["addr"] = "0x10".into();
        let e = err(&serde_json::to_vec(&v).unwrap());
        assert!(
            e.contains("`graphs[1].nodes[0].touches[0].addr`: 0x10 lies outside tensor 1"),
            "{e}"
        );
        let l = serde_json::to_vec(&crate::testkit::live(
            &m,
            crate::model::format::Contents::Preserved,
        ))
        .unwrap();
        let e = err(&l);
        assert!(e.contains("`kind` is `live`, expected a `manifest`"), "{e}");
        let e = err(b"{\"format_version\": 1, \"kind\": \"manifest\"} trailing");
        assert!(e.contains("missing field"), "{e}");
    }

    /// A v1 body under another `format_version`, as JSON text.
    fn with_version(doc: &impl serde::Serialize, version: serde_json::Value) -> Vec<u8> {
        let mut v = serde_json::to_value(doc).unwrap();
        v["format_version"] = version;
        serde_json::to_vec(&v).unwrap()
    }

    /// Regression: `format_version` was checked only when the body failed to parse, so a v1
    /// body under version 2 (or 0, or 99) was read as v1 by every loader but `document()`.
    /// Now that 2 is a version, a body of either under 3, 0 or 99 is refused.
    #[test]
    fn every_loader_refuses_another_version_whose_body_parses() {
        for m in [manifest(), manifest().in_version(2)] {
            refused_under_other_versions(m);
        }
    }

    fn refused_under_other_versions(m: crate::model::format::Manifest) {
        let l = crate::testkit::live(&m, crate::model::format::Contents::Preserved)
            .in_version(m.format_version);
        let name = Path::new("doc.json");
        for version in [3, 0, 99] {
            let bytes = with_version(&m, version.into());
            let text = || Source::Text {
                bytes: bytes.clone(),
                name: name.into(),
            };
            let errors = [
                parse_manifest(&bytes, name).unwrap_err(),
                text().manifest_checked().unwrap_err(),
                text().document().unwrap_err(),
            ];
            for e in errors {
                assert!(
                    matches!(&e, LoadError::Version { found, .. } if *found == version.to_string()),
                    "{e}"
                );
            }
            let bytes = with_version(&l, version.into());
            let text = Source::Text {
                bytes: bytes.clone(),
                name: name.into(),
            };
            for e in [
                parse_live(&bytes, name).unwrap_err(),
                text.live_checked().unwrap_err(),
                text.document().unwrap_err(),
            ] {
                assert!(
                    e.to_string().contains(&format!(
                        "`format_version` is {version}, but this graphcheck reads versions 1 and 2"
                    )),
                    "{e}"
                );
            }
        }
        // In memory too (`check::verify::verify` takes documents as values).
        let mut v3 = m.clone();
        v3.format_version = 3;
        let e = check_manifest(&v3).unwrap_err();
        assert_eq!(e.json_path, "format_version");
    }

    /// Regression: the errors a person reads. A version that is not a number said "is "1",
    /// but this graphcheck reads version 1"; a cut document's path ended in `?`; an enum
    /// given a number was "not valid JSON"; an integer past u64 was a "floating point".
    #[test]
    fn errors_say_what_is_wrong_in_words() {
        let m = manifest();
        // A huge value in the wrong place is named, not printed (the fuzzer found a 65 KiB
        // error message).
        let mut v = serde_json::to_value(&m).unwrap();
        v["allocations"][0]["base"] = format!("0x7f{}", "a".repeat(70_000)).into();
        let e = err(&serde_json::to_vec(&v).unwrap());
        assert!(e.len() < 400, "{} bytes: {e}", e.len());
        assert!(e.contains("aaa… (69924 more characters)\""), "{e}");
        for (key, value) in [
            ("kind", format!("manifest{}", "a".repeat(70_000))),
            ("format_version", "9".repeat(70_000)),
            // The quote character inside the value: what follows is not seen as quoted.
            (
                "kind",
                format!("live{}`{}", "a".repeat(9_000), "b".repeat(60_000)),
            ),
        ] {
            let mut v = serde_json::to_value(&m).unwrap();
            v[key] = value.clone().into();
            let e = err(&serde_json::to_vec(&v).unwrap());
            assert!(e.len() < 600, "{key}: {} bytes: {e}", e.len());
        }
        let e = err(&with_version(&m, "1".into()));
        assert!(
            e.ends_with("m.json: `format_version` must be the number 1 or 2, not the string \"1\""),
            "{e}"
        );
        let e = err(&with_version(&m, serde_json::Value::Null));
        assert!(e.contains("must be the number 1 or 2, not null"), "{e}");

        let text = serde_json::to_string_pretty(&m).unwrap();
        // Cut just inside the second pool's object, and in the middle of its first key.
        let second = text.match_indices("\"id\": 1,").next().unwrap().0;
        for cut in [second, second + 3] {
            let e = err(&text.as_bytes()[..cut]);
            assert!(
                e.contains("invalid document at `pools[1]`: the document ends early"),
                "{e}"
            );
            assert!(!e.contains("?`"), "{e}");
        }
        let e = err(b"{");
        assert!(
            e.contains("at the top level: the document ends early, in the middle of an object"),
            "{e}"
        );

        let mut v = serde_json::to_value(&m).unwrap();
        v["pools"][1]["kind"] = 3.into();
        let e = err(&serde_json::to_vec(&v).unwrap());
        assert!(
            e.contains(
                "at `pools[1].kind`: expected one of \"default\", \"graph\", \"weights\", \"kv_cache\", \"other\", found the number 3"
            ),
            "{e}"
        );
        assert!(!e.contains("not valid JSON"), "{e}");
        let mut v = serde_json::to_value(&m).unwrap();
        v["kind"] = serde_json::json!([]);
        let e = err(&serde_json::to_vec(&v).unwrap());
        assert!(
            e.contains("at `kind`: expected \"manifest\", found an array"),
            "{e}"
        );

        let text = serde_json::to_string_pretty(&m).unwrap();
        let size = format!("\"size\": {}", m.allocations[0].size);
        let e = err(text
            .replacen(&size, "\"size\": 18446744073709551616", 1)
            .as_bytes());
        assert!(
            e.contains("at `allocations[0].size`: the number 18446744073709551616 is out of range for an unsigned 64-bit value"),
            "{e}"
        );
        let e = err(text.replacen(&size, "\"size\": 1.5", 1).as_bytes());
        assert!(
            e.contains("expected an unsigned 64-bit integer, found the number 1.5"),
            "{e}"
        );
        assert!(err(b"{\"a\": tru}").contains("not valid JSON"));
    }
}
