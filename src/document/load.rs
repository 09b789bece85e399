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
    #[error("{}:{line}:{column}: invalid document {}: {message}", path.display(), at(json_path))]
    Json {
        path: PathBuf,
        json_path: String,
        line: usize,
        column: usize,
        message: String,
    },
    #[error(
        "{}: `format_version` is {found}, but this graphcheck reads version {FORMAT_VERSION} \
         (re-record it, or use a graphcheck of that version)",
        path.display()
    )]
    Version { path: PathBuf, found: String },
    #[error("{}: `kind` is `{found}`, expected a `{expected}` document", path.display())]
    Kind {
        path: PathBuf,
        found: DocKind,
        expected: DocKind,
    },
    #[error("{}: invalid document {}: {message}", path.display(), at(json_path))]
    Invalid {
        path: PathBuf,
        json_path: String,
        message: String,
    },
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
        let m: Manifest = self.with_bytes(|b| parse_typed(b, path, DocKind::Manifest))?;
        expect_kind(m.kind, DocKind::Manifest, path)?;
        let t = check_manifest(&m).map_err(|e| e.in_file(path))?;
        Ok((m, t))
    }

    /// Parses and checks a live snapshot, keeping the lookups checking built.
    pub fn live_checked(&self) -> Result<(Live, Tables), LoadError> {
        let path = self.name();
        let l: Live = self.with_bytes(|b| parse_typed(b, path, DocKind::Live))?;
        expect_kind(l.kind, DocKind::Live, path)?;
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

    /// Runs `f` over the document's bytes; a file's are read, and freed before the caller
    /// goes on to check what was parsed.
    fn with_bytes<T>(&self, f: impl FnOnce(&[u8]) -> Result<T, LoadError>) -> Result<T, LoadError> {
        match self {
            Source::Path(p) => f(&read(p)?),
            Source::Text { bytes, .. } => f(bytes),
        }
    }
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
    let m: Manifest = parse_typed(bytes, path, DocKind::Manifest)?;
    expect_kind(m.kind, DocKind::Manifest, path)?;
    check_manifest(&m).map_err(|e| e.in_file(path))?;
    Ok(m)
}

/// Parses and checks a live snapshot held in memory; `path` only names it in errors.
pub fn parse_live(bytes: &[u8], path: &Path) -> Result<Live, LoadError> {
    let l: Live = parse_typed(bytes, path, DocKind::Live)?;
    expect_kind(l.kind, DocKind::Live, path)?;
    check_live(&l).map_err(|e| e.in_file(path))?;
    Ok(l)
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
    format_version: Option<serde_json::Value>,
    kind: Option<serde_json::Value>,
}

/// Reads only `format_version` and `kind`, skipping the rest.
fn header(bytes: &[u8], path: &Path) -> Result<DocKind, LoadError> {
    let h: Header = json_error(
        path,
        serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(bytes)),
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
    // that its error can say where.
    if let Ok(v) = serde_json::from_slice::<T>(bytes) {
        return Ok(v);
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize::<_, T>(&mut de) {
        Ok(v) => {
            de.end().map_err(|e| LoadError::Json {
                path: path.to_path_buf(),
                json_path: ".".into(),
                line: e.line(),
                column: e.column(),
                message: describe(&e),
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
            json_error(path, Err(e))
        }
    }
}

/// serde_json's message, saying first whether the text is not JSON at all or cut short.
fn describe(e: &serde_json::Error) -> String {
    let m = strip_position(e.to_string());
    match e.classify() {
        serde_json::error::Category::Syntax => format!("not valid JSON: {m}"),
        serde_json::error::Category::Eof => format!("truncated JSON: {m}"),
        _ => m,
    }
}

/// serde_json appends " at line L column C"; our errors lead with the position.
fn strip_position(mut message: String) -> String {
    if let Some(cut) = message.rfind(" at line ") {
        message.truncate(cut);
    }
    message
}

fn json_error<T>(
    path: &Path,
    r: Result<T, serde_path_to_error::Error<serde_json::Error>>,
) -> Result<T, LoadError> {
    r.map_err(|e| {
        let json_path = e.path().to_string();
        let inner = e.into_inner();
        let (line, column) = (inner.line(), inner.column());
        let message = describe(&inner);
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

/// Checks every reference of a manifest.
pub fn check_manifest(m: &Manifest) -> Result<Tables, Invalid> {
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
        assert!(e.contains("truncated JSON: EOF while parsing"), "{e}");
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
}
