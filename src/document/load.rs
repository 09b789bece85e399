//! Reading manifests and live snapshots: parse, check the version, and check every
//! reference, so that later stages can index without failing. Errors name the file and
//! the JSON path of the bad value.

use rustc_hash::FxHashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::document::format::{
    Addr, Allocation, AllocationId, DocKind, Document, FORMAT_VERSION, Live, Manifest, Owner, Pool,
    PoolId, Tensor, TensorId,
};
use crate::document::ids::IdIndex;
use crate::document::objects::Objects;
use crate::document::pair::PairError;
use crate::document::schema;
use crate::document::wording::{describe, shorten, shorten_quoted};

/// Why a document could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    #[error("failed to read {}", path.display())]
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
    #[error("{}: {}", path.display(), version_message(found))]
    Version { path: PathBuf, found: String },
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
    /// Two documents, each valid, that do not belong together.
    #[error("{} cannot be verified against {}: {why}", live.display(), manifest.display())]
    Pair {
        manifest: PathBuf,
        live: PathBuf,
        why: PairError,
    },
}

/// What a `format_version` other than 1 is told: a number names the version this build
/// reads; anything else is not a version at all.
fn version_message(found: &str) -> String {
    let found = &*shorten(found);
    let integer = found.strip_prefix('-').unwrap_or(found);
    if !integer.is_empty() && integer.bytes().all(|b| b.is_ascii_digit()) {
        format!(
            "`format_version` is {found}, but this graphcheck reads version {FORMAT_VERSION} \
             (re-record it, or use a graphcheck of that version)"
        )
    } else if found.starts_with('"') {
        format!("`format_version` must be the number {FORMAT_VERSION}, not the string {found}")
    } else {
        format!("`format_version` must be the number {FORMAT_VERSION}, not {found}")
    }
}

impl PairError {
    /// The error naming both files.
    pub fn in_files(self, manifest: &Path, live: &Path) -> LoadError {
        LoadError::Pair {
            manifest: manifest.to_path_buf(),
            live: live.to_path_buf(),
            why: self,
        }
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

/// A semantic error found after parsing: where, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub json_path: String,
    pub message: String,
}

impl Invalid {
    fn at(json_path: impl Into<String>, message: impl Into<String>) -> Invalid {
        Invalid {
            json_path: json_path.into(),
            message: message.into(),
        }
    }
    fn in_file(self, path: &Path) -> LoadError {
        LoadError::Invalid {
            path: path.to_path_buf(),
            json_path: self.json_path,
            message: self.message,
        }
    }
}

/// Where a document comes from: a file, or JSON text in memory (from Python), named for
/// error messages. Every way in goes through the same parse, version and kind checks.
#[derive(Clone, Debug)]
pub enum Source {
    Path(PathBuf),
    Text { bytes: Vec<u8>, name: PathBuf },
}

impl Source {
    /// What error messages and `diff` call the document.
    pub fn name(&self) -> &Path {
        match self {
            Source::Path(p) => p,
            Source::Text { name, .. } => name,
        }
    }

    /// Parses and checks a manifest, keeping the lookups checking built (for
    /// [`crate::check::verify::verify_checked`]).
    pub fn manifest_checked(&self) -> Result<(Manifest, Tables), LoadError> {
        let path = self.name();
        let m: Manifest = self.with_bytes(|b| parse_body(b, path))?;
        let t = check_manifest(&m).map_err(|e| e.in_file(path))?;
        Ok((m, t))
    }

    /// Parses and checks a live snapshot, keeping the lookups checking built.
    pub fn live_checked(&self) -> Result<(Live, Tables), LoadError> {
        let path = self.name();
        let l: Live = self.with_bytes(|b| parse_body(b, path))?;
        let t = check_live(&l).map_err(|e| e.in_file(path))?;
        Ok((l, t))
    }

    /// Parses and checks either document, by its `kind` (after its `format_version`).
    pub fn document(&self) -> Result<Document, LoadError> {
        let path = self.name();
        self.with_bytes(|bytes| match header(bytes, path)? {
            DocKind::Live => parse_live(bytes, path).map(Document::Live),
            _ => parse_manifest(bytes, path).map(Document::Manifest),
        })
    }

    /// Parses and checks either document, by its `kind`, keeping the lookups checking built
    /// (for `verify DIR`, which reads every document of a folder).
    pub fn checked(&self) -> Result<Checked, LoadError> {
        let path = self.name();
        let doc = self.with_bytes(|bytes| match header(bytes, path)? {
            DocKind::Live => parse_body(bytes, path).map(Document::Live),
            _ => parse_body(bytes, path).map(Document::Manifest),
        })?;
        match doc {
            Document::Manifest(m) => {
                let t = check_manifest(&m).map_err(|e| e.in_file(path))?;
                Ok(Checked::Manifest(m, t))
            }
            Document::Live(l) => {
                let t = check_live(&l).map_err(|e| e.in_file(path))?;
                Ok(Checked::Live(l, t))
            }
        }
    }

    /// Runs `f` over the document's bytes; a file's are read, and freed before the caller
    /// goes on to check what was parsed.
    fn with_bytes<T>(&self, f: impl FnOnce(&[u8]) -> Result<T, LoadError>) -> Result<T, LoadError> {
        match self {
            Source::Path(p) => f(&read(p)?),
            Source::Text { bytes, .. } => f(bytes),
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

/// Parses and checks a manifest held in memory; `path` only names it in errors.
pub fn parse_manifest(bytes: &[u8], path: &Path) -> Result<Manifest, LoadError> {
    let m: Manifest = parse_body(bytes, path)?;
    check_manifest(&m).map_err(|e| e.in_file(path))?;
    Ok(m)
}

/// Parses and checks a live snapshot held in memory; `path` only names it in errors.
pub fn parse_live(bytes: &[u8], path: &Path) -> Result<Live, LoadError> {
    let l: Live = parse_body(bytes, path)?;
    check_live(&l).map_err(|e| e.in_file(path))?;
    Ok(l)
}

/// The two documents, to the loader: what kind each is, and where its header is.
trait Body: for<'de> Deserialize<'de> {
    const KIND: DocKind;
    fn version(&self) -> u32;
    fn kind(&self) -> DocKind;
}

impl Body for Manifest {
    const KIND: DocKind = DocKind::Manifest;
    fn version(&self) -> u32 {
        self.format_version
    }
    fn kind(&self) -> DocKind {
        self.kind
    }
}

impl Body for Live {
    const KIND: DocKind = DocKind::Live;
    fn version(&self) -> u32 {
        self.format_version
    }
    fn kind(&self) -> DocKind {
        self.kind
    }
}

/// Parses a document of kind `T` and checks its version and kind before anything reads its
/// body: a document of another version may parse as v1 and mean something else.
fn parse_body<T: Body>(bytes: &[u8], path: &Path) -> Result<T, LoadError> {
    let doc: T = parse_typed(bytes, path, T::KIND)?;
    if doc.version() != FORMAT_VERSION {
        return Err(LoadError::Version {
            path: path.to_path_buf(),
            found: doc.version().to_string(),
        });
    }
    expect_kind(doc.kind(), T::KIND, path)?;
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

#[derive(Deserialize)]
struct Header {
    // Absent is `None`; `null` is a value of the wrong type, and said so.
    #[serde(default, deserialize_with = "present")]
    format_version: Option<serde_json::Value>,
    kind: Option<serde_json::Value>,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<serde_json::Value>, D::Error> {
    serde_json::Value::deserialize(d).map(Some)
}

/// Reads only `format_version` and `kind`, skipping the rest.
fn header(bytes: &[u8], path: &Path) -> Result<DocKind, LoadError> {
    let h: Header = json_error(
        path,
        bytes,
        None,
        serde_path_to_error::deserialize(Objects(&mut serde_json::Deserializer::from_slice(bytes))),
    )?;
    check_version(h.format_version.as_ref(), path)?;
    match h.kind.as_ref().and_then(|k| k.as_str()) {
        Some("manifest") => Ok(DocKind::Manifest),
        Some("live") => Ok(DocKind::Live),
        _ => Err(LoadError::Invalid {
            path: path.to_path_buf(),
            json_path: "kind".into(),
            message: format!(
                "expected `\"manifest\"` or `\"live\"`, found {}",
                h.kind.map_or("nothing".into(), |k| k.to_string())
            ),
        }),
    }
}

fn check_version(v: Option<&serde_json::Value>, path: &Path) -> Result<(), LoadError> {
    match v {
        Some(v) if v.as_u64() == Some(u64::from(FORMAT_VERSION)) => Ok(()),
        Some(v) => Err(LoadError::Version {
            path: path.to_path_buf(),
            found: v.to_string(),
        }),
        None => Err(LoadError::Invalid {
            path: path.to_path_buf(),
            json_path: ".".into(),
            message: "missing field `format_version`: not a graphcheck document".into(),
        }),
    }
}

fn parse_typed<T: for<'de> Deserialize<'de>>(
    bytes: &[u8],
    path: &Path,
    expected: DocKind,
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
                check_version(h.format_version.as_ref(), path)?;
                let found = match h.kind.as_ref().and_then(|k| k.as_str()) {
                    Some("manifest") => Some(DocKind::Manifest),
                    Some("live") => Some(DocKind::Live),
                    _ => None,
                };
                if let Some(found) = found {
                    expect_kind(found, expected, path)?;
                }
            }
            json_error(path, bytes, Some(expected), Err(e))
        }
    }
}

fn json_error<T>(
    path: &Path,
    bytes: &[u8],
    expected: Option<DocKind>,
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

/// Lookups over the records both documents share, built while checking them.
#[derive(Debug, Default, Clone)]
pub struct Tables {
    pub pool_ix: IdIndex<PoolId>,
    pub alloc_ix: IdIndex<AllocationId>,
    pub tensor_ix: IdIndex<TensorId>,
    /// Owners of each tensor, by the tensor's index: indices into `owners`.
    pub owners_of: Vec<Vec<usize>>,
    /// Owner index by path.
    pub owner_by_path: FxHashMap<String, usize>,
}

impl Tables {
    /// Checks ids, references and paths, and indexes them.
    pub fn build(
        pools: &[Pool],
        allocations: &[Allocation],
        tensors: &[Tensor],
        owners: &[Owner],
    ) -> Result<Tables, Invalid> {
        let mut t = Tables {
            pool_ix: IdIndex::with_capacity(pools.len()),
            alloc_ix: IdIndex::with_capacity(allocations.len()),
            tensor_ix: IdIndex::with_capacity(tensors.len()),
            ..Tables::default()
        };
        for (i, p) in pools.iter().enumerate() {
            if t.pool_ix.insert(p.id, i).is_some() {
                return Err(Invalid::at(
                    format!("pools[{i}].id"),
                    format!("two pools claim id {}", p.id.0),
                ));
            }
        }
        let pool_ref = |t: &Tables, p: Option<PoolId>, at: &dyn Fn() -> String| match p {
            Some(p) if !t.pool_ix.contains_key(&p) => {
                Err(Invalid::at(at(), format!("no pool has id {}", p.0)))
            }
            _ => Ok(()),
        };
        for (i, a) in allocations.iter().enumerate() {
            if t.alloc_ix.insert(a.id, i).is_some() {
                return Err(Invalid::at(
                    format!("allocations[{i}].id"),
                    format!("two allocations claim id {}", a.id.0),
                ));
            }
            if a.size == 0 || a.base.checked_add(a.size).is_none() {
                return Err(Invalid::at(
                    format!("allocations[{i}].size"),
                    format!(
                        "allocation at {} of {} bytes is empty or wraps",
                        a.base, a.size
                    ),
                ));
            }
            pool_ref(&t, a.pool, &|| format!("allocations[{i}].pool"))?;
        }
        for (i, x) in tensors.iter().enumerate() {
            if t.tensor_ix.insert(x.id, i).is_some() {
                return Err(Invalid::at(
                    format!("tensors[{i}].id"),
                    format!("two tensors claim id {}", x.id.0),
                ));
            }
            if x.shape.len() != x.stride.len() {
                return Err(Invalid::at(
                    format!("tensors[{i}].stride"),
                    format!(
                        "{} strides for {} dimensions",
                        x.stride.len(),
                        x.shape.len()
                    ),
                ));
            }
            if x.itemsize == 0 {
                return Err(Invalid::at(
                    format!("tensors[{i}].itemsize"),
                    "itemsize is 0",
                ));
            }
            if x.offset
                .checked_add(x.nbytes)
                .is_none_or(|end| end > x.storage_nbytes)
                || x.storage_base.checked_add(x.storage_nbytes).is_none()
            {
                return Err(Invalid::at(
                    format!("tensors[{i}].nbytes"),
                    format!(
                        "the view (offset {}, {} bytes) lies outside its storage of {} bytes",
                        x.offset, x.nbytes, x.storage_nbytes
                    ),
                ));
            }
            if let Some(a) = x.allocation {
                let Some(ai) = t.alloc_ix.get(&a) else {
                    return Err(Invalid::at(
                        format!("tensors[{i}].allocation"),
                        format!("no allocation has id {}", a.0),
                    ));
                };
                let al = &allocations[ai];
                if x.storage_base < al.base
                    || x.storage_base.0 + x.storage_nbytes > al.base.0 + al.size
                {
                    return Err(Invalid::at(
                        format!("tensors[{i}].storage_base"),
                        format!(
                            "storage {}+{} lies outside allocation {} ({}+{})",
                            x.storage_base, x.storage_nbytes, a.0, al.base, al.size
                        ),
                    ));
                }
            }
            pool_ref(&t, x.pool, &|| format!("tensors[{i}].pool"))?;
        }
        t.owners_of = vec![Vec::new(); tensors.len()];
        for (i, o) in owners.iter().enumerate() {
            let Some(ti) = t.tensor_ix.get(&o.tensor) else {
                return Err(Invalid::at(
                    format!("owners[{i}].tensor"),
                    format!("no tensor has id {}", o.tensor.0),
                ));
            };
            if let Some(prev) = t.owner_by_path.insert(o.path.to_string(), i) {
                return Err(Invalid::at(
                    format!("owners[{i}].path"),
                    format!("path {:?} is also owners[{prev}]", o.path),
                ));
            }
            t.owners_of[ti].push(i);
        }
        Ok(t)
    }

    /// The tensor with this id; the id must have been checked.
    pub fn tensor<'a>(&self, tensors: &'a [Tensor], id: TensorId) -> &'a Tensor {
        &tensors[self.tensor_ix[&id] as usize]
    }
}

/// Checks the version and kind of a document built in memory (the loaders check them
/// before anything else, with their own errors).
fn check_header(version: u32, kind: DocKind, expected: DocKind) -> Result<(), Invalid> {
    if version != FORMAT_VERSION {
        return Err(Invalid::at(
            "format_version",
            version_message(&version.to_string()),
        ));
    }
    if kind != expected {
        return Err(Invalid::at(
            "kind",
            format!("`kind` is `{kind}`, expected a `{expected}` document"),
        ));
    }
    Ok(())
}

/// Checks every reference of a manifest.
pub fn check_manifest(m: &Manifest) -> Result<Tables, Invalid> {
    check_header(m.format_version, m.kind, DocKind::Manifest)?;
    let t = Tables::build(&m.pools, &m.allocations, &m.tensors, &m.owners)?;
    let mut graph_ids = FxHashMap::default();
    let mut at = String::new();
    for (gi, g) in m.graphs.iter().enumerate() {
        if graph_ids.insert(g.id, gi).is_some() {
            return Err(Invalid::at(
                format!("graphs[{gi}].id"),
                format!("two graphs claim id {}", g.id.0),
            ));
        }
        if let Some(p) = g.pool
            && !t.pool_ix.contains_key(&p)
        {
            return Err(Invalid::at(
                format!("graphs[{gi}].pool"),
                format!("no pool has id {}", p.0),
            ));
        }
        for (ni, n) in g.nodes.iter().enumerate() {
            for (ti, touch) in n.touches.iter().enumerate() {
                let mut here = |field: &str| {
                    at.clear();
                    let _ = write!(at, "graphs[{gi}].nodes[{ni}].touches[{ti}].{field}");
                    at.clone()
                };
                if let Some(id) = touch.tensor {
                    let Some(x) = t.tensor_ix.get(&id) else {
                        return Err(Invalid::at(
                            here("tensor"),
                            format!("no tensor has id {}", id.0),
                        ));
                    };
                    let tensor = &m.tensors[x];
                    if !tensor.contains(touch.addr) {
                        return Err(Invalid::at(
                            here("addr"),
                            format!(
                                "{} lies outside tensor {} ({}+{})",
                                touch.addr,
                                id.0,
                                tensor.data_ptr(),
                                tensor.nbytes
                            ),
                        ));
                    }
                }
                if let Some(id) = touch.allocation {
                    let Some(a) = t.alloc_ix.get(&id) else {
                        return Err(Invalid::at(
                            here("allocation"),
                            format!("no allocation has id {}", id.0),
                        ));
                    };
                    let al = &m.allocations[a];
                    if !(al.base <= touch.addr && touch.addr.0 - al.base.0 < al.size) {
                        return Err(Invalid::at(
                            here("addr"),
                            format!(
                                "{} lies outside allocation {} ({}+{})",
                                touch.addr, id.0, al.base, al.size
                            ),
                        ));
                    }
                }
            }
        }
    }
    Ok(t)
}

/// Checks every reference of a live snapshot.
pub fn check_live(l: &Live) -> Result<Tables, Invalid> {
    check_header(l.format_version, l.kind, DocKind::Live)?;
    let t = Tables::build(&l.pools, &l.allocations, &l.tensors, &l.owners)?;
    for (i, p) in l.probes.iter().enumerate() {
        if let Some(pool) = p.pool
            && !t.pool_ix.contains_key(&pool)
        {
            return Err(Invalid::at(
                format!("probes[{i}].pool"),
                format!("no pool has id {}", pool.0),
            ));
        }
        if let Some(a) = p.allocation
            && !t.alloc_ix.contains_key(&a)
        {
            return Err(Invalid::at(
                format!("probes[{i}].allocation"),
                format!("no allocation has id {}", a.0),
            ));
        }
    }
    Ok(t)
}

/// Whether `addr` lies in `[base, base + size)`.
pub fn in_range(addr: Addr, base: Addr, size: u64) -> bool {
    base <= addr && addr.0 - base.0 < size
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::manifest;

    fn err(bytes: &[u8]) -> String {
        parse_manifest(bytes, Path::new("m.json"))
            .unwrap_err()
            .to_string()
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
        v["format_version"] = 2.into();
        v["graphs"] = serde_json::json!({"renamed": true});
        let e = err(&serde_json::to_vec(&v).unwrap());
        assert!(e.contains("`format_version` is 2"), "{e}");
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
            crate::document::format::Contents::Preserved,
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
    #[test]
    fn every_loader_refuses_another_version_whose_body_parses() {
        let m = manifest();
        let l = crate::testkit::live(&m, crate::document::format::Contents::Preserved);
        let name = Path::new("doc.json");
        for version in [2, 0, 99] {
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
                        "`format_version` is {version}, but this graphcheck reads version 1"
                    )),
                    "{e}"
                );
            }
        }
        // In memory too (`check::verify::verify` takes documents as values).
        let mut v2 = m.clone();
        v2.format_version = 2;
        let e = check_manifest(&v2).unwrap_err();
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
            e.ends_with("m.json: `format_version` must be the number 1, not the string \"1\""),
            "{e}"
        );
        let e = err(&with_version(&m, serde_json::Value::Null));
        assert!(e.contains("must be the number 1, not null"), "{e}");

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
