//! `graphcheck._native`: conversions between Python and the core; no logic of its own.
//!
//! Every function takes documents as a path (`str` or `os.PathLike`) or as JSON text (a
//! `str` whose first non-blank character is `{`, or `bytes`), does its work with the GIL
//! released, and returns plain strings, booleans and tuples; the Python package
//! (`python/graphcheck/`) builds objects from them. Every error the core reports is raised
//! as `graphcheck.GraphcheckError` with the core's message (file and JSON path included);
//! nothing here panics on bad input.

use std::path::{Path, PathBuf};

use graphcheck::allow::Allowlist;
use graphcheck::build::{ManifestBuilder, TensorSpec, WalkedGraph};
use graphcheck::explain::Query;
use graphcheck::format::{
    Addr, Document, Live, Manifest, PoolId, PoolKind, Producer, Registration, SleepPolicy, TensorId,
};
use graphcheck::load::{self as loader, Tables};
use graphcheck::normalize::Symbolizer;
use graphcheck::path::Glob;
use graphcheck::report::{AddrFmt, RawAddrs, render_json, render_markdown, render_table};
// The sleep allocator's functions, and its malloc/free symbols for torch.
mod sleep;

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use serde::Deserialize;

create_exception!(
    graphcheck,
    GraphcheckError,
    PyException,
    "A bad document, allowlist or argument: the message says what and where."
);

/// A check failure of JSON text, named as the loaders name a file's.
fn invalid(name: &Path, e: &loader::Invalid) -> String {
    format!(
        "{}: invalid document at `{}`: {}",
        name.display(),
        e.json_path,
        e.message
    )
}

/// A document as the caller handed it: a file, or JSON text named for error messages.
enum Source {
    Path(PathBuf),
    Text { bytes: Vec<u8>, name: PathBuf },
}

impl Source {
    /// `str` starting with `{` (after blanks) or `bytes`: JSON text; any other `str` or an
    /// `os.PathLike`: a path. `name` names text in error messages (default `<string>`).
    fn extract(obj: &Bound<'_, PyAny>, name: Option<&str>) -> PyResult<Source> {
        let name = || PathBuf::from(name.unwrap_or("<string>"));
        if let Ok(s) = obj.cast::<PyString>() {
            let s = s.to_cow()?;
            return Ok(if s.trim_start().starts_with('{') {
                Source::Text {
                    bytes: s.as_bytes().to_vec(),
                    name: name(),
                }
            } else {
                Source::Path(PathBuf::from(s.as_ref()))
            });
        }
        if let Ok(b) = obj.cast::<PyBytes>() {
            return Ok(Source::Text {
                bytes: b.as_bytes().to_vec(),
                name: name(),
            });
        }
        obj.extract::<PathBuf>().map(Source::Path).map_err(|_| {
            GraphcheckError::new_err(format!(
                "expected a path or JSON text (str, bytes or os.PathLike), got {}",
                obj.get_type()
                    .name()
                    .map_or_else(|_| "?".to_string(), |n| n.to_string())
            ))
        })
    }

    /// What error messages and `diff` call the document.
    fn display_name(&self) -> &Path {
        match self {
            Source::Path(p) => p,
            Source::Text { name, .. } => name,
        }
    }

    fn manifest(&self) -> Result<(Manifest, Tables), String> {
        match self {
            Source::Path(p) => loader::load_manifest_checked(p).map_err(|e| chain(&e)),
            Source::Text { bytes, name } => {
                let m = loader::parse_manifest(bytes, name).map_err(|e| chain(&e))?;
                let t = loader::check_manifest(&m).map_err(|e| invalid(name, &e))?;
                Ok((m, t))
            }
        }
    }

    fn live(&self) -> Result<(Live, Tables), String> {
        match self {
            Source::Path(p) => loader::load_live_checked(p).map_err(|e| chain(&e)),
            Source::Text { bytes, name } => {
                let l = loader::parse_live(bytes, name).map_err(|e| chain(&e))?;
                let t = loader::check_live(&l).map_err(|e| invalid(name, &e))?;
                Ok((l, t))
            }
        }
    }

    fn document(&self) -> Result<Document, String> {
        match self {
            Source::Path(p) => loader::load_document(p).map_err(|e| chain(&e)),
            Source::Text { bytes, name } => {
                // `kind` picks the parser; a document without one fails in the manifest
                // parser, whose error says what is missing.
                #[derive(Deserialize)]
                struct Kind {
                    kind: Option<serde_json::Value>,
                }
                let live = serde_json::from_slice::<Kind>(bytes)
                    .ok()
                    .and_then(|k| k.kind)
                    .is_some_and(|k| k == "live");
                if live {
                    loader::parse_live(bytes, name).map(Document::Live)
                } else {
                    loader::parse_manifest(bytes, name).map(Document::Manifest)
                }
                .map_err(|e| chain(&e))
            }
        }
    }
}

/// Runs `f` with the GIL released. A panic inside it (a bug in graphcheck) becomes a
/// `GraphcheckError` instead of `pyo3_runtime.PanicException`, which is a `BaseException`
/// that an engine's `except Exception` would not catch: graphcheck never takes down the
/// process it runs in.
pub(crate) fn detached<T, F>(py: Python<'_>, f: F) -> PyResult<T>
where
    T: Send,
    F: FnOnce() -> Result<T, String> + Send,
{
    py.detach(move || guarded(f))
}

/// Runs `f`, turning its error and any panic into a `GraphcheckError`.
pub(crate) fn guarded<T, F>(f: F) -> PyResult<T>
where
    F: FnOnce() -> Result<T, String>,
{
    catch_panic(
        || f().map_err(GraphcheckError::new_err),
        GraphcheckError::new_err,
    )
}

/// Runs `f`; a panic inside it becomes the error `on_panic` makes of its message.
pub(crate) fn catch_panic<T>(
    f: impl FnOnce() -> PyResult<T>,
    on_panic: impl FnOnce(String) -> PyErr,
) -> PyResult<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|payload| Err(on_panic(panic_message(payload.as_ref()))))
}

/// What a caught panic says, as the message of the error that replaces it.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".into());
    format!("internal error in graphcheck (a bug; please report it): {what}")
}

/// An error and its causes as one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        message.push_str(": ");
        message.push_str(&c.to_string());
        cause = c.source();
    }
    message
}

/// The version of the core this module was built from.
#[pyfunction]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// Loads and checks a manifest or live snapshot; returns `(kind, json)`, the document as
/// the core reads it (fields it does not know dropped). `expect` ("manifest" or "live")
/// makes the other kind an error.
#[pyfunction]
#[pyo3(signature = (document, expect=None, name=None))]
fn load(
    py: Python<'_>,
    document: &Bound<'_, PyAny>,
    expect: Option<&str>,
    name: Option<&str>,
) -> PyResult<(&'static str, String)> {
    let src = Source::extract(document, name)?;
    let expect = expect.map(str::to_owned);
    detached(py, move || -> Result<(&'static str, String), String> {
        let (kind, json) = match expect.as_deref() {
            Some("manifest") => ("manifest", serde_json::to_string(&src.manifest()?.0)),
            Some("live") => ("live", serde_json::to_string(&src.live()?.0)),
            None => match src.document()? {
                Document::Manifest(m) => ("manifest", serde_json::to_string(&m)),
                Document::Live(l) => ("live", serde_json::to_string(&l)),
            },
            Some(other) => {
                return Err(format!("expect is \"manifest\" or \"live\", not {other:?}"));
            }
        };
        Ok((kind, json.map_err(|e| e.to_string())?))
    })
}

/// Runs verify; returns `(ok, report_json, table, markdown)`. `allow` is an allowlist
/// file, `allow_text` its TOML text (one of them at most). `normalized` prints addresses as
/// symbolic ids, as `graphcheck verify --normalized` does. `deny_unused_allow` makes an
/// allowlist entry that allowed nothing fail the run, as `--deny-unused-allow` does.
#[pyfunction]
#[pyo3(signature = (manifest, live=None, allow=None, allow_text=None, normalized=false, deny_unused_allow=false))]
fn verify(
    py: Python<'_>,
    manifest: &Bound<'_, PyAny>,
    live: Option<&Bound<'_, PyAny>>,
    allow: Option<PathBuf>,
    allow_text: Option<String>,
    normalized: bool,
    deny_unused_allow: bool,
) -> PyResult<(bool, String, String, String)> {
    let m_src = Source::extract(manifest, Some("<manifest>"))?;
    let l_src = live
        .map(|l| Source::extract(l, Some("<live>")))
        .transpose()?;
    detached(py, move || -> Result<_, String> {
        let allow = match (allow, allow_text) {
            (Some(_), Some(_)) => return Err("give allow or allow_text, not both".into()),
            (Some(p), None) => Allowlist::load(&p).map_err(|e| chain(&e))?,
            (None, Some(t)) => {
                Allowlist::parse(&t).map_err(|m| format!("<allowlist>: invalid allowlist: {m}"))?
            }
            (None, None) => Allowlist::default(),
        }
        .deny_unused(deny_unused_allow);
        // The two documents parse on two threads, as in the CLI: parsing is most of it.
        let (m, l) = std::thread::scope(|s| {
            let live_job = l_src.as_ref().map(|l| s.spawn(move || l.live()));
            let m = m_src.manifest();
            let l = live_job.map(|j| j.join().unwrap_or_else(|_| Err("loader failed".into())));
            (m, l)
        });
        let (m, mt) = m?;
        let l = l.transpose()?;
        let report =
            graphcheck::verify::verify_checked(&m, &mt, l.as_ref().map(|(l, t)| (l, t)), &allow);
        let sym;
        let fmt: &dyn AddrFmt = if normalized {
            sym = Symbolizer::for_manifest(&m);
            &sym
        } else {
            &RawAddrs
        };
        // Addresses also appear inside sentences (`detail`): redact whole texts.
        let finish = |text: String| {
            if normalized {
                Symbolizer::for_manifest(&m).redact(&text)
            } else {
                text
            }
        };
        Ok((
            report.ok,
            finish(render_json(&report)),
            finish(render_table(&report, fmt)),
            finish(render_markdown(&report, fmt)),
        ))
    })
}

/// The stable text of a document (`graphcheck show --normalized`).
#[pyfunction]
#[pyo3(signature = (document, name=None))]
fn normalized(py: Python<'_>, document: &Bound<'_, PyAny>, name: Option<&str>) -> PyResult<String> {
    let src = Source::extract(document, name)?;
    detached(py, move || {
        src.document()
            .map(|d| graphcheck::normalize::normalized(&d))
    })
}

/// The summary of a document (`graphcheck show`).
#[pyfunction]
#[pyo3(signature = (document, name=None))]
fn summary(py: Python<'_>, document: &Bound<'_, PyAny>, name: Option<&str>) -> PyResult<String> {
    let src = Source::extract(document, name)?;
    detached(py, move || {
        src.document().map(|d| graphcheck::text::summary(&d))
    })
}

/// Traces an address (`0x…`), an owner path, or with `kernel` every node whose name
/// contains it; returns `(found, text)` (DOT with `dot=True`).
#[pyfunction]
#[pyo3(signature = (manifest, target=None, kernel=None, dot=false, normalized=false))]
fn explain(
    py: Python<'_>,
    manifest: &Bound<'_, PyAny>,
    target: Option<String>,
    kernel: Option<String>,
    dot: bool,
    normalized: bool,
) -> PyResult<(bool, String)> {
    let src = Source::extract(manifest, Some("<manifest>"))?;
    let query = match (kernel, target) {
        (Some(k), None) => Query::Kernel(k),
        (None, Some(t)) => Query::parse(&t),
        _ => {
            return Err(GraphcheckError::new_err(
                "explain takes a target (address or owner path) or kernel, exactly one",
            ));
        }
    };
    detached(py, move || -> Result<_, String> {
        let (m, _) = src.manifest()?;
        let sym = Symbolizer::for_manifest(&m);
        let fmt: &dyn AddrFmt = if normalized { &sym } else { &RawAddrs };
        let e = graphcheck::explain::explain(&m, &query, fmt);
        let text = if dot { e.dot } else { e.text };
        let text = if normalized { sym.redact(&text) } else { text };
        Ok((e.found, text))
    })
}

/// Compares two documents by owner path; returns `(same, text)`. `format` is `table`,
/// `markdown` or `json`.
#[pyfunction]
#[pyo3(signature = (a, b, format="table"))]
fn diff(
    py: Python<'_>,
    a: &Bound<'_, PyAny>,
    b: &Bound<'_, PyAny>,
    format: &str,
) -> PyResult<(bool, String)> {
    let (a, b) = (
        Source::extract(a, Some("<A>"))?,
        Source::extract(b, Some("<B>"))?,
    );
    let format = format.to_owned();
    detached(py, move || -> Result<_, String> {
        let (da, db) = (a.document()?, b.document()?);
        let r = graphcheck::diff::diff(&da, &db);
        let text = match format.as_str() {
            "json" => {
                let mut s = serde_json::to_string_pretty(&r).map_err(|e| e.to_string())?;
                s.push('\n');
                s
            }
            "table" | "markdown" => graphcheck::text::diff_text(
                &r,
                a.display_name(),
                b.display_name(),
                format == "markdown",
            ),
            other => return Err(format!("format is table, markdown or json, not {other:?}")),
        };
        Ok((r.same, text))
    })
}

/// The JSON Schema of format v1, as `graphcheck schema` prints it.
#[pyfunction]
fn schema() -> PyResult<String> {
    guarded(|| {
        let mut s = serde_json::to_string_pretty(&graphcheck::format::json_schema())
            .map_err(|e| e.to_string())?;
        s.push('\n');
        Ok(s)
    })
}

/// What `build_manifest` takes: pools, tensors and owners from the Python registry walk,
/// and graphs as walkers read them. Ids of pools are their positions in `pools`; owners
/// name tensors by their position in `tensors`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BuildSpec {
    producer: Producer,
    #[serde(default)]
    pools: Vec<PoolSpec>,
    #[serde(default)]
    pool_ranges: Vec<PoolRange>,
    #[serde(default)]
    allocations: Vec<AllocationSpec>,
    /// Free blocks of the allocator's segments (`base`, `size`) when the spec was made.
    #[serde(default)]
    free_ranges: Vec<AllocationSpec>,
    #[serde(default)]
    tensors: Vec<TensorSpec>,
    #[serde(default)]
    owners: Vec<OwnerSpec>,
    #[serde(default)]
    graphs: Vec<GraphSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolSpec {
    name: String,
    kind: PoolKind,
    sleep: SleepPolicy,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolRange {
    base: Addr,
    size: u64,
    pool: PoolId,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AllocationSpec {
    base: Addr,
    size: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OwnerSpec {
    path: String,
    /// Position in `tensors`.
    tensor: usize,
    registration: Registration,
    #[serde(default)]
    holder: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GraphSpec {
    name: String,
    #[serde(default)]
    pool: Option<PoolId>,
    /// The walked graph as JSON, or (`walked_index`) the position of a `Walked` object in
    /// `build_manifest`'s `walked` list: exactly one of them.
    #[serde(default)]
    walked: Option<WalkedGraph>,
    #[serde(default)]
    walked_index: Option<usize>,
}

fn build(spec: &[u8], walked: &[std::sync::Arc<WalkedGraph>]) -> Result<String, String> {
    let name = "<build spec>";
    let mut de = serde_json::Deserializer::from_slice(spec);
    let spec: BuildSpec = serde_path_to_error::deserialize(&mut de)
        .map_err(|e| format!("{name}: invalid spec at `{}`: {}", e.path(), e.inner()))?;
    de.end().map_err(|e| format!("{name}: invalid spec: {e}"))?;
    let at = |what: String, e: &dyn std::error::Error| format!("{name}: {what}: {}", chain(e));
    let mut b = ManifestBuilder::new(spec.producer);
    for p in &spec.pools {
        b.add_pool(&p.name, p.kind, p.sleep);
    }
    for (i, r) in spec.pool_ranges.iter().enumerate() {
        b.add_pool_range(r.base, r.size, r.pool)
            .map_err(|e| at(format!("pool_ranges[{i}]"), &e))?;
    }
    for a in &spec.allocations {
        b.add_allocation(a.base, a.size);
    }
    for r in &spec.free_ranges {
        b.add_free_range(r.base, r.size);
    }
    // Equal views collapse into one tensor; owners refer to spec positions.
    let mut ids: Vec<TensorId> = Vec::with_capacity(spec.tensors.len());
    for (i, t) in spec.tensors.into_iter().enumerate() {
        ids.push(
            b.add_tensor(t)
                .map_err(|e| at(format!("tensors[{i}]"), &e))?,
        );
    }
    for (i, o) in spec.owners.into_iter().enumerate() {
        let tensor = *ids.get(o.tensor).ok_or_else(|| {
            format!(
                "{name}: owners[{i}].tensor: no tensor at position {} ({} given)",
                o.tensor,
                ids.len()
            )
        })?;
        b.add_owner(&o.path, tensor, o.registration, o.holder)
            .map_err(|e| at(format!("owners[{i}]"), &e))?;
    }
    for (i, g) in spec.graphs.into_iter().enumerate() {
        let walked = match (g.walked, g.walked_index) {
            (Some(w), None) => w,
            (None, Some(k)) => (**walked.get(k).ok_or_else(|| {
                format!(
                    "{name}: graphs[{i}].walked_index: no walked graph at position {k} ({} given)",
                    walked.len()
                )
            })?)
            .clone(),
            _ => {
                return Err(format!(
                    "{name}: graphs[{i}]: give exactly one of `walked` and `walked_index`"
                ));
            }
        };
        b.add_graph(&g.name, g.pool, walked);
    }
    let m = b.finish().map_err(|e| at("failed to build".into(), &e))?;
    serde_json::to_string(&m).map_err(|e| e.to_string())
}

/// Builds a manifest from a build spec (JSON, see `BuildSpec`): resolves every walked
/// word to a tensor view, allocation and pool, checks the result, returns its JSON.
#[pyfunction]
#[pyo3(signature = (spec, walked=None))]
fn build_manifest(
    py: Python<'_>,
    spec: &Bound<'_, PyAny>,
    walked: Option<Vec<PyRef<'_, Walked>>>,
) -> PyResult<String> {
    let bytes = match Source::extract(spec, Some("<build spec>"))? {
        Source::Text { bytes, .. } => bytes,
        Source::Path(p) => std::fs::read(&p).map_err(|e| {
            GraphcheckError::new_err(format!("failed to read {}: {e}", p.display()))
        })?,
    };
    let walked: Vec<std::sync::Arc<WalkedGraph>> = walked
        .unwrap_or_default()
        .iter()
        .map(|w| w.inner.clone())
        .collect();
    detached(py, move || build(&bytes, &walked))
}

/// For each path, whether it matches the owner-path glob (`*` within one hop, `**`
/// across hops, brackets literal).
#[pyfunction]
fn glob_match(pattern: &str, paths: Vec<String>) -> PyResult<Vec<bool>> {
    guarded(|| {
        let glob = Glob::new(pattern).map_err(|e| chain(&e))?;
        Ok(paths.iter().map(|p| glob.is_match(p)).collect())
    })
}

/// Checks an owner path against the core's grammar; returns its canonical spelling.
#[pyfunction]
fn check_path(path: &str) -> PyResult<String> {
    guarded(|| {
        graphcheck::path::parse(path)
            .map(|segs| graphcheck::path::join(&segs))
            .map_err(|e| chain(&e))
    })
}

/// Writes `data` to `path` atomically (the file is replaced whole or not at all).
#[pyfunction]
fn write_atomic(py: Python<'_>, path: PathBuf, data: Vec<u8>) -> PyResult<()> {
    detached(py, || {
        loader::write_atomic(&path, &data)
            .map_err(|e| format!("failed to write {}: {e}", path.display()))
    })
}

/// A walked graph held on the Rust side, as `walk` returns it: handing it to
/// `build_manifest` (graphs' `walked_index`) costs no JSON round trip, which matters on the
/// capture path.
#[pyclass(frozen, module = "graphcheck._native")]
struct Walked {
    inner: std::sync::Arc<WalkedGraph>,
}

#[pymethods]
impl Walked {
    /// A walked graph from WalkedGraph JSON (a saved walk, or a hand-written one in tests).
    #[staticmethod]
    fn from_json(py: Python<'_>, text: &str) -> PyResult<Walked> {
        let text = text.to_string();
        detached(py, move || {
            let mut de = serde_json::Deserializer::from_str(&text);
            serde_path_to_error::deserialize::<_, WalkedGraph>(&mut de)
                .map_err(|e| format!("<walked graph>: invalid at `{}`: {}", e.path(), e.inner()))
        })
        .map(|w| Walked {
            inner: std::sync::Arc::new(w),
        })
    }

    /// The walked graph as WalkedGraph JSON (what `walk_graph` returns).
    fn to_json(&self, py: Python<'_>) -> PyResult<String> {
        let inner = self.inner.clone();
        detached(py, move || {
            serde_json::to_string(&*inner).map_err(|e| e.to_string())
        })
    }

    /// Nodes that hold addresses (kernels, memsets, memcpys).
    fn __len__(&self) -> usize {
        self.inner.nodes.len()
    }

    /// Address words over all nodes.
    #[getter]
    fn words(&self) -> usize {
        self.inner.word_count()
    }

    /// Nodes per driver type.
    #[getter]
    fn node_counts(&self) -> std::collections::BTreeMap<String, u64> {
        self.inner.node_counts.clone()
    }

    /// The distinct addresses, ascending, of this graph's words that lie in none of the
    /// `known` ranges and that the kernel signatures do not set aside
    /// (`WalkedGraph::unexplained`): a recorder walks its roots again only when there are
    /// any. `known` is packed native-endian `u64` pairs `(base, size)`, in any order (an
    /// `array.array("Q")`'s bytes).
    fn unexplained(&self, py: Python<'_>, known: &[u8]) -> PyResult<Vec<u64>> {
        if known.len() % 16 != 0 {
            return Err(GraphcheckError::new_err(format!(
                "unexplained: known ranges are (base, size) pairs of 8-byte words, not {} bytes",
                known.len()
            )));
        }
        let inner = self.inner.clone();
        detached(py, move || {
            let word = |b: &[u8]| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8]));
            let known = graphcheck::build::RangeSet::from_sizes(
                known
                    .chunks_exact(16)
                    .map(|pair| (word(&pair[..8]), word(&pair[8..]))),
            );
            Ok(inner.unexplained(&known).into_iter().map(|a| a.0).collect())
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "<Walked: {} nodes read, {} address words, {} unread>",
            self.inner.nodes.len(),
            self.inner.word_count(),
            self.inner.unread.len()
        )
    }
}

fn walk_raw(handle: u64) -> Result<WalkedGraph, String> {
    // The caller promises a live cudaGraph_t that nothing modifies during the walk
    // (documented on `walk_graph` and `walk`); the borrow ends with the walk, and a null
    // handle is refused.
    graphcheck::cuda::GraphRef::with_raw_handle(handle, graphcheck::cuda::walk_graph)
        .map_err(|e| format!("walk_graph: {e}"))?
        .map(|(w, _)| w)
        .map_err(|e| e.to_string())
}

/// Walks a captured CUDA graph (as `walk_graph`) and keeps the result on the Rust side.
#[pyfunction]
fn walk(py: Python<'_>, handle: u64) -> PyResult<Walked> {
    detached(py, move || walk_raw(handle)).map(|w| Walked {
        inner: std::sync::Arc::new(w),
    })
}

/// Walks a captured CUDA graph and returns what its nodes hold, as WalkedGraph JSON (the
/// input of `build_manifest`'s `graphs`). `handle` is a `cudaGraph_t`, as
/// `torch.cuda.CUDAGraph(keep_graph=True).raw_cuda_graph()` returns it.
///
/// The graph must stay alive and unmodified during the call, and the calling thread must
/// have the graph's CUDA context current (torch's is, once CUDA is in use); a missing or
/// too old driver, or no current context, raises `GraphcheckError`.
#[pyfunction]
fn walk_graph(py: Python<'_>, handle: u64) -> PyResult<String> {
    detached(py, move || {
        walk_raw(handle).and_then(|w| serde_json::to_string(&w).map_err(|e| e.to_string()))
    })
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("GraphcheckError", m.py().get_type::<GraphcheckError>())?;
    m.add("FORMAT_VERSION", graphcheck::format::FORMAT_VERSION)?;
    m.add("EXIT_OK", graphcheck::exit::OK)?;
    m.add("EXIT_FINDINGS", graphcheck::exit::FINDINGS)?;
    m.add("EXIT_BAD_INPUT", graphcheck::exit::BAD_INPUT)?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_function(wrap_pyfunction!(verify, m)?)?;
    m.add_function(wrap_pyfunction!(normalized, m)?)?;
    m.add_function(wrap_pyfunction!(summary, m)?)?;
    m.add_function(wrap_pyfunction!(explain, m)?)?;
    m.add_function(wrap_pyfunction!(diff, m)?)?;
    m.add_function(wrap_pyfunction!(schema, m)?)?;
    m.add_function(wrap_pyfunction!(build_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(walk_graph, m)?)?;
    m.add_function(wrap_pyfunction!(walk, m)?)?;
    m.add_class::<Walked>()?;
    m.add_function(wrap_pyfunction!(glob_match, m)?)?;
    m.add_function(wrap_pyfunction!(check_path, m)?)?;
    m.add_function(wrap_pyfunction!(write_atomic, m)?)?;
    sleep::register(m)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_a_native_call_becomes_an_error() {
        // Regression: a panic crossing into Python is PanicException (a BaseException an
        // engine's `except Exception` misses); `guarded` returns an error instead.
        let r: PyResult<()> = guarded(|| panic!("index out of bounds"));
        assert!(r.is_err());
        let r: PyResult<u32> = guarded(|| Err("bad input".to_string()));
        assert!(r.is_err());
        assert!(matches!(guarded(|| Ok(7u32)), Ok(7)));
    }

    #[test]
    fn a_panic_message_names_the_bug() {
        let m = panic_message(&"index out of bounds");
        assert!(
            m.contains("index out of bounds") && m.contains("a bug"),
            "{m}"
        );
        let m = panic_message(&String::from("formatted"));
        assert!(m.contains("formatted"), "{m}");
        assert!(panic_message(&42u8).contains("no message"));
    }
}
