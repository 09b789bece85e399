//! `graphcheck._native`: conversions between Python and the core; no logic of its own.
//!
//! Every function takes documents as a path (`str`, `bytes` or `os.PathLike`) or as JSON
//! text (`Text`, or a `str` or `bytes` starting with `{"`: [`is_json_text`]), does its work
//! with the GIL released, and returns plain strings, booleans and tuples, or a handle that
//! keeps Rust-side data until asked (`Walked`, a walked graph; `Verified`, a verify's report,
//! rendered per format on demand); the Python package (`python/graphcheck/`) builds objects
//! from them.
//! Every error the core reports is raised as `graphcheck.GraphcheckError` with the core's
//! message (file and JSON path included), and so is a document argument of the wrong type or
//! one that cannot be encoded (a lone surrogate); nothing here panics on bad input.

use std::path::PathBuf;
use std::sync::Arc;

use graphcheck::app::commands::{self, Format};
use graphcheck::app::folder;
use graphcheck::app::verify as app_verify;
use graphcheck::check::allow::Allowlist;
use graphcheck::check::finding::FindingKind;
use graphcheck::codec::load::{SharedBytes, Source};
use graphcheck::model::format::Document;
use graphcheck::model::owner_path::Glob;
use graphcheck::model::version::{FORMAT_VERSION, FORMAT_VERSIONS};
use graphcheck::present::explain::Query;
use graphcheck::resolve::walked::WalkedGraph;
// The sleep allocator's functions, and its malloc/free symbols for torch.
mod args;
mod build;
mod digest;
mod guard;
mod kept;
mod objects;
mod retarget;
mod sleep;

use args::*;
use guard::*;

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyString};

create_exception!(
    graphcheck,
    GraphcheckError,
    PyException,
    "A bad document, allowlist or argument: the message says what and where."
);

create_exception!(
    graphcheck,
    InternalError,
    GraphcheckError,
    "A bug in graphcheck, not a bad input: a panic caught at the boundary (its message says \
     where); please report it. A GraphcheckError, so that `except GraphcheckError` still \
     keeps the host process alive."
);

/// The version of the core this module was built from.
#[pyfunction]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// Runs the `graphcheck` command line (`argv[0]` is the program name) with the GIL
/// released: the console script of the Python package is this call, so it prints what the
/// Rust binary prints and returns the same exit code. Not [`interruptible`]: the command
/// writes its output (stdout, `--output`), which it must not do after its caller was told
/// it stopped; the console script lets SIGINT end the process instead (`graphcheck.cli`).
#[pyfunction]
fn main(py: Python<'_>, argv: Vec<std::ffi::OsString>) -> PyResult<i32> {
    detached(py, move || Ok::<_, String>(graphcheck_cli::main_impl(argv)))
}

/// Loads and checks a manifest or live snapshot of either format version; returns
/// `(kind, json)`, the document as the core reads it (fields it does not know dropped),
/// written in format `format_version`: 1 (default), every record an object, or 2, the
/// compact columns. `expect` ("manifest" or "live") makes the other kind an error.
#[pyfunction]
#[pyo3(signature = (document, expect=None, name=None, format_version=1))]
fn load(
    py: Python<'_>,
    document: &Bound<'_, PyAny>,
    expect: Option<&str>,
    name: Option<&str>,
    format_version: u32,
) -> PyResult<(&'static str, String)> {
    let src = source(document, name)?;
    let expect = expect.map(str::to_owned);
    let v = version_arg(format_version)?;
    interruptible(
        py,
        move || -> Result<(&'static str, String), NativeError> {
            Ok(match loaded(&src, expect.as_deref())? {
                Document::Manifest(m) => ("manifest", serde_json::to_string(&m.in_version(v))?),
                Document::Live(l) => ("live", serde_json::to_string(&l.in_version(v))?),
            })
        },
    )
}

/// [`load`], returning `(kind, document)` with the document as the `dict` `json.loads`
/// makes of `load`'s JSON, built with no JSON text in between ([`objects`]).
#[pyfunction]
#[pyo3(signature = (document, expect=None, name=None, format_version=1))]
fn load_objects<'py>(
    py: Python<'py>,
    document: &Bound<'_, PyAny>,
    expect: Option<&str>,
    name: Option<&str>,
    format_version: u32,
) -> PyResult<(&'static str, Bound<'py, PyAny>)> {
    let src = source(document, name)?;
    let expect = expect.map(str::to_owned);
    let v = version_arg(format_version)?;
    let doc = interruptible(py, move || {
        Ok::<_, NativeError>(match loaded(&src, expect.as_deref())? {
            Document::Manifest(m) => Document::Manifest(m.in_version(v)),
            Document::Live(l) => Document::Live(l.in_version(v)),
        })
    })?;
    let (kind, obj) = match &doc {
        Document::Manifest(m) => (
            "manifest",
            objects::to_python(py, m, objects::DOCUMENT_STRINGS),
        ),
        Document::Live(l) => ("live", objects::to_python(py, l, objects::DOCUMENT_STRINGS)),
    };
    // Freeing millions of records takes time the caller need not wait for, GIL held.
    let _ = std::thread::Builder::new()
        .name("graphcheck-free".into())
        .spawn(move || drop(doc));
    Ok((kind, obj?))
}

/// What a live snapshot needs of its manifest, loaded and checked, with no Python object
/// made of the rest: `(pool id by name, the digest algorithm of its first digested tensor
/// or None)`. Making the manifest's dict for these two facts was a fifth of a retarget at
/// the anchor model's size (`benches/retarget_bench.py`).
///
/// `keep`, with `document` a `Text`: the parse made here is kept with it, for the
/// `build_live`, `verify` and `retarget_plan` calls of the same `Text` that follow
/// (`kept.rs`); one kept already is taken instead of parsing again.
#[pyfunction]
#[pyo3(signature = (document, name=None, keep=false))]
fn manifest_facts<'py>(
    py: Python<'py>,
    document: &Bound<'_, PyAny>,
    name: Option<&str>,
    keep: bool,
) -> PyResult<(Bound<'py, pyo3::types::PyDict>, Option<String>)> {
    let text = document.cast::<args::Text>().ok();
    let kept = kept::kept_parse(document);
    let src = source(document, name)?;
    let (pools, algorithm, parsed) = interruptible(py, move || {
        let (m, t) = match kept {
            Some(parsed) => parsed,
            None => {
                let (m, t) = src.manifest_checked()?;
                (Arc::new(m), Arc::new(t))
            }
        };
        let pools: Vec<(String, u32)> = m.pools.iter().map(|p| (p.name.clone(), p.id.0)).collect();
        let algorithm = m
            .tensors
            .iter()
            .find_map(|t| t.digest.as_ref().map(|d| d.algorithm().to_owned()));
        Ok::<_, NativeError>((pools, algorithm, (m, t)))
    })?;
    if keep && let Some(text) = text {
        text.get().parsed.keep(parsed);
    }
    let out = pyo3::types::PyDict::new(py);
    for (name, id) in pools {
        out.set_item(name, id)?;
    }
    Ok((out, algorithm))
}

/// The document `src` holds, loaded and checked; `expect` ("manifest" or "live") makes the
/// other kind an error.
fn loaded(src: &Source, expect: Option<&str>) -> Result<Document, NativeError> {
    Ok(match expect {
        Some("manifest") => Document::Manifest(src.manifest_checked()?.0),
        Some("live") => Document::Live(src.live_checked()?.0),
        None => src.document()?,
        Some(other) => {
            return Err(format!("expect is \"manifest\" or \"live\", not {other:?}").into());
        }
    })
}

/// Runs verify; returns a [`Verified`] handle, which renders the report in the format asked
/// for when asked. `manifest` is a manifest, or a path naming a folder of one run's
/// documents (every rank's, `live` omitted), decided and verified as `graphcheck verify`
/// does ([`folder::folder_documents`], [`app_verify::verify_dir`]). `allow` is an allowlist file,
/// `allow_entries` its entries as data (a JSON array of objects with the keys of a TOML
/// entry); one of them at most. `normalized` prints addresses as symbolic ids, as
/// `graphcheck verify --normalized` does. `deny_unused_allow` makes an allowlist entry that
/// allowed nothing fail the run, as `--deny-unused-allow` does.
#[pyfunction]
#[pyo3(signature = (manifest, live=None, allow=None, allow_entries=None, normalized=false, deny_unused_allow=false))]
fn verify(
    py: Python<'_>,
    manifest: &Bound<'_, PyAny>,
    live: Option<&Bound<'_, PyAny>>,
    allow: Option<&Bound<'_, PyAny>>,
    allow_entries: Option<String>,
    normalized: bool,
    deny_unused_allow: bool,
) -> PyResult<Verified> {
    // The manifest a `build_live(keep=True)` of this very `Text` parsed (kept.rs).
    let parsed = kept::kept_parse(manifest);
    let m_src = source(manifest, Some("<manifest>"))?;
    let l_src = live.map(|l| source(l, Some("<live>"))).transpose()?;
    let allow = allow.map(|a| path_arg(a, "allow")).transpose()?;
    let verified = interruptible(py, move || -> Result<_, NativeError> {
        let allow = allowlist(allow, allow_entries, deny_unused_allow)?;
        let folder = match &m_src {
            Source::Path(dir) => folder::folder_documents(dir, l_src.as_ref().map(Source::name))?
                .map(|docs| (dir, docs)),
            Source::Text { .. } | Source::Shared { .. } => None,
        };
        Ok(match folder {
            Some((dir, docs)) => app_verify::verify_dir(dir, &docs, &allow)?,
            None => app_verify::verify_parsed(&m_src, parsed, l_src.as_ref(), &allow)?,
        })
    })?;
    // What the command line notes on stderr: a folder's JSON files that are no document.
    for skipped in &verified.skipped {
        PyErr::warn(
            py,
            &py.get_type::<pyo3::exceptions::PyUserWarning>(),
            &std::ffi::CString::new(skipped.to_string()).unwrap_or_default(),
            1,
        )?;
    }
    Ok(Verified::new(verified, normalized))
}

/// The allowlist `verify` and `verify_pairs` apply: a file, or entries as data (one of them
/// at most), or none.
fn allowlist(
    allow: Option<PathBuf>,
    allow_entries: Option<String>,
    deny_unused_allow: bool,
) -> Result<Allowlist, NativeError> {
    Ok(match (allow, allow_entries) {
        (Some(_), Some(_)) => return Err("give allow or allow_entries, not both".into()),
        (Some(p), None) => Allowlist::load(&p)?,
        (None, Some(t)) => {
            Allowlist::from_json(&t).map_err(|m| format!("invalid allowlist: {m}"))?
        }
        (None, None) => Allowlist::default(),
    }
    .deny_unused(deny_unused_allow))
}

/// Runs verify over the ranks of one run given as pairs, `paths` flat (each manifest, then
/// its live snapshot), as `graphcheck verify M0 L0 M1 L1 …` does ([`folder::pairs`],
/// [`app_verify::verify_pairs`]): one pair or more, every pair of one rank. The other arguments
/// are [`verify`]'s.
#[pyfunction]
#[pyo3(signature = (paths, allow=None, allow_entries=None, normalized=false, deny_unused_allow=false))]
fn verify_pairs(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    allow: Option<&Bound<'_, PyAny>>,
    allow_entries: Option<String>,
    normalized: bool,
    deny_unused_allow: bool,
) -> PyResult<Verified> {
    let allow = allow.map(|a| path_arg(a, "allow")).transpose()?;
    let verified = interruptible(py, move || -> Result<_, NativeError> {
        let allow = allowlist(allow, allow_entries, deny_unused_allow)?;
        if paths.is_empty() {
            return Err("no (manifest, live) pair to verify".into());
        }
        Ok(app_verify::verify_pairs(&folder::pairs(&paths)?, &allow)?)
    })?;
    Ok(Verified::new(verified, normalized))
}

/// A verify's documents and report, held on the Rust side, as `verify` returns them: each
/// format is rendered when first asked for, so a caller who reads only the findings (the
/// JSON) never pays for the table, which at tens of thousands of findings costs seconds.
/// The table and the Markdown are kept once rendered.
#[pyclass(frozen, module = "graphcheck._native")]
struct Verified {
    /// Shared with the thread that renders it ([`interruptible`]); taken only by `drop`.
    verified: Option<std::sync::Arc<app_verify::Verified>>,
    normalized: bool,
    table: PyOnceLock<Py<PyString>>,
    markdown: PyOnceLock<Py<PyString>>,
}

impl Verified {
    /// A report not rendered yet (`normalized`: addresses as symbols).
    fn new(verified: app_verify::Verified, normalized: bool) -> Verified {
        Verified {
            verified: Some(std::sync::Arc::new(verified)),
            normalized,
            table: PyOnceLock::new(),
            markdown: PyOnceLock::new(),
        }
    }

    /// The verify's documents and report, there until the handle is dropped.
    fn inner(&self) -> PyResult<&std::sync::Arc<app_verify::Verified>> {
        self.verified.as_ref().ok_or_else(|| {
            GraphcheckError::new_err(
                "internal error in graphcheck (a bug; please report it): a report read after \
                 it was freed",
            )
        })
    }

    /// The report rendered in `format` (with the GIL released; Ctrl-C stops the wait).
    fn rendered_in(&self, py: Python<'_>, format: Format) -> PyResult<String> {
        let (verified, normalized) = (self.inner()?.clone(), self.normalized);
        interruptible(py, move || {
            Ok::<_, NativeError>(verified.render(format, normalized))
        })
    }

    /// The report in `format`, rendered (with the GIL released) at the first call and kept.
    fn kept(
        &self,
        py: Python<'_>,
        cell: &PyOnceLock<Py<PyString>>,
        format: Format,
    ) -> PyResult<Py<PyString>> {
        cell.get_or_try_init(py, || {
            let text = self.rendered_in(py, format)?;
            Ok::<_, PyErr>(PyString::new(py, &text).unbind())
        })
        .map(|s| s.clone_ref(py))
    }
}

impl Drop for Verified {
    fn drop(&mut self) {
        // Freeing a verify's documents (millions of records) takes time the caller need
        // not wait for, GIL held: they are freed on a thread of their own, as the command
        // line frees them. Where no thread can be had, `spawn` drops them here.
        let verified = self.verified.take();
        let _ = std::thread::Builder::new()
            .name("graphcheck-free".into())
            .spawn(move || drop(verified));
    }
}

#[pymethods]
impl Verified {
    /// No finding of severity `error`.
    #[getter]
    fn ok(&self) -> PyResult<bool> {
        Ok(self.inner()?.report.ok)
    }

    /// The report's fields but its findings and allowed findings, as JSON: what a Python
    /// `Report` reads at once; it reads the findings from [`Verified::json`] when first
    /// asked for them. None of these fields holds an address, so `normalized` changes none.
    fn head(&self) -> PyResult<String> {
        let r = &self.inner()?.report;
        let head = serde_json::json!({
            "ok": r.ok,
            "checked": r.checked,
            "summary": r.summary,
            "subjects": r.subjects,
            "graphs": r.graphs,
            "unread_nodes": r.unread_nodes,
            "world_size": r.world_size,
            "ranks": r.ranks,
            "missing_ranks": r.missing_ranks,
            "superseded": r.superseded,
            "retarget": r.retarget,
        });
        guarded(|| serde_json::to_string(&head))
    }

    /// The report's findings and allowed findings, as the lists of dicts `json.loads` makes
    /// of them in [`Verified::json`], built with no JSON text in between ([`objects`]);
    /// `None` with `normalized`, whose symbols are given to the JSON's text.
    #[allow(clippy::type_complexity)]
    fn findings<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)>> {
        if self.normalized {
            return Ok(None);
        }
        let r = &self.inner()?.report;
        Ok(Some((
            objects::to_python(py, &r.findings, objects::REPORT_STRINGS)?,
            objects::to_python(py, &r.allowed, objects::REPORT_STRINGS)?,
        )))
    }

    /// The report as JSON (`graphcheck verify --format json`), rendered at each call: the
    /// Python `Report` reads it once.
    fn json(&self, py: Python<'_>) -> PyResult<String> {
        self.rendered_in(py, Format::Json)
    }

    /// The table `graphcheck verify` prints, rendered at the first call.
    fn table(&self, py: Python<'_>) -> PyResult<Py<PyString>> {
        self.kept(py, &self.table, Format::Table)
    }

    /// The Markdown of `--format markdown`, rendered at the first call.
    fn markdown(&self, py: Python<'_>) -> PyResult<Py<PyString>> {
        self.kept(py, &self.markdown, Format::Markdown)
    }

    /// The formats rendered and kept so far (`table`, `markdown`), in that order.
    #[getter]
    fn rendered(&self, py: Python<'_>) -> Vec<&'static str> {
        [("table", &self.table), ("markdown", &self.markdown)]
            .into_iter()
            .filter(|(_, cell)| cell.get(py).is_some())
            .map(|(name, _)| name)
            .collect()
    }

    /// Every graph some finding names, sorted (`Report::recapture`).
    fn recapture(&self) -> PyResult<Vec<String>> {
        Ok(self.inner()?.report.recapture())
    }

    fn __repr__(&self) -> String {
        match &self.verified {
            Some(v) => format!(
                "<Verified: ok={}, {} findings, {} allowed>",
                if v.report.ok { "True" } else { "False" },
                v.report.findings.len(),
                v.report.allowed.len()
            ),
            None => "<Verified: freed>".to_string(),
        }
    }
}

/// The stable text of a document (`graphcheck show --normalized`).
#[pyfunction]
#[pyo3(signature = (document, name=None))]
fn normalized(py: Python<'_>, document: &Bound<'_, PyAny>, name: Option<&str>) -> PyResult<String> {
    let src = source(document, name)?;
    interruptible(py, move || {
        src.document()
            .map(|d| graphcheck::present::normalize::normalized(&d))
    })
}

/// The reads view of a manifest (`graphcheck.reads`): its owners, pools and, per graph,
/// the owner paths it reads, what no owner explains and its kernels, with no address, id,
/// pool number or timing; `kernels=False` leaves the kernel names (and word counts) out. A
/// live snapshot is an error naming the document.
#[pyfunction]
#[pyo3(signature = (manifest, kernels=true, name=None))]
fn reads(
    py: Python<'_>,
    manifest: &Bound<'_, PyAny>,
    kernels: bool,
    name: Option<&str>,
) -> PyResult<String> {
    let src = source(manifest, name)?;
    interruptible(py, move || -> Result<String, NativeError> {
        let options = graphcheck::present::reads::ReadsOptions { kernels };
        graphcheck::present::reads::reads(&src.document()?, options)
            .map_err(|e| format!("{}: {e}", src.name().display()).into())
    })
}

/// The summary of a document (`graphcheck show`).
#[pyfunction]
#[pyo3(signature = (document, name=None))]
fn summary(py: Python<'_>, document: &Bound<'_, PyAny>, name: Option<&str>) -> PyResult<String> {
    let src = source(document, name)?;
    interruptible(py, move || {
        src.document()
            .map(|d| graphcheck::present::text::summary(&d))
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
    let src = source(manifest, Some("<manifest>"))?;
    let query = match (kernel, target) {
        (Some(k), None) => {
            Query::kernel(&k).map_err(|e| GraphcheckError::new_err(e.to_string()))?
        }
        (None, Some(t)) => Query::parse(&t).map_err(|e| GraphcheckError::new_err(e.to_string()))?,
        _ => {
            return Err(GraphcheckError::new_err(
                "explain takes a target (address or owner path) or kernel, exactly one",
            ));
        }
    };
    interruptible(py, move || -> Result<_, NativeError> {
        let (m, _) = src.manifest_checked()?;
        Ok(commands::explain_text(&m, &query, dot, normalized))
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
    let (a, b) = (source(a, Some("<A>"))?, source(b, Some("<B>"))?);
    let format: Format = format.parse().map_err(GraphcheckError::new_err)?;
    interruptible(py, move || commands::diff(&a, &b, format))
}

/// The JSON Schema of format `format_version` (default: 2, what graphcheck writes), as
/// `graphcheck schema` prints it.
#[pyfunction]
#[pyo3(signature = (format_version=2))]
fn schema(format_version: u32) -> PyResult<String> {
    let v = version_arg(format_version)?;
    guarded(|| Ok::<_, String>(commands::schema_text(v)))
}

/// A format version this build writes, or a `GraphcheckError` naming the argument.
fn version_arg(v: u32) -> PyResult<u32> {
    if FORMAT_VERSIONS.contains(&v) {
        Ok(v)
    } else {
        Err(GraphcheckError::new_err(format!(
            "format_version is 1 or 2, not {v}"
        )))
    }
}

/// For each path, whether it matches the owner-path glob (`*` any run but `.`, `**`
/// across hops, brackets literal).
#[pyfunction]
fn glob_match(pattern: &str, paths: Vec<String>) -> PyResult<Vec<bool>> {
    guarded(|| {
        let glob = Glob::owner_path(pattern)?;
        Ok::<_, NativeError>(paths.iter().map(|p| glob.is_match(p)).collect())
    })
}

/// Checks an owner path against the core's grammar; returns its canonical spelling.
#[pyfunction]
fn check_path(path: &str) -> PyResult<String> {
    guarded(|| {
        graphcheck::model::owner_path::parse(path)
            .map(|segs| graphcheck::model::owner_path::join(&segs))
    })
}

/// Writes `data` to `path` atomically (the file is replaced whole or not at all).
#[pyfunction]
fn write_atomic(py: Python<'_>, path: PathBuf, data: Vec<u8>) -> PyResult<()> {
    detached(py, || {
        graphcheck::app::output::write_atomic(&path, &data)
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
            let known = graphcheck::resolve::walked::RangeSet::from_sizes(
                known
                    .chunks_exact(16)
                    .map(|pair| (word(&pair[..8]), word(&pair[8..]))),
            );
            Ok::<_, NativeError>(inner.unexplained(&known).into_iter().map(|a| a.0).collect())
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

fn walk_raw(handle: u64) -> Result<WalkedGraph, NativeError> {
    // The caller promises a live cudaGraph_t that nothing modifies during the walk
    // (documented on `walk_graph` and `walk`); the borrow ends with the walk, and a null
    // handle is refused.
    let walked = graphcheck::cuda::GraphRef::with_raw_handle(handle, graphcheck::cuda::walk_graph)
        .map_err(|e| format!("walk_graph: {e}"))??;
    Ok(walked.0)
}

/// Walks a captured CUDA graph (as `walk_graph`) and keeps the result on the Rust side.
#[pyfunction]
fn walk(py: Python<'_>, handle: u64) -> PyResult<Walked> {
    detached(py, move || walk_raw(handle)).map(|w| Walked {
        inner: std::sync::Arc::new(w),
    })
}

/// The graph a capture still open on `stream` (a `CUstream` as an integer:
/// `torch.cuda.Stream.cuda_stream`) is building, as a handle `walk` takes: read before
/// `capture_end`, the graph is walked without keeping the template torch would otherwise
/// destroy at instantiate. A stream with no capture open, or one the driver invalidated,
/// raises `GraphcheckError`; so do a missing driver and no current context.
#[pyfunction]
fn capturing_graph(py: Python<'_>, stream: u64) -> PyResult<u64> {
    detached(py, move || {
        use graphcheck::cuda::driver::{CaptureState, capture_state};
        graphcheck::cuda::walk::ready()?;
        match capture_state(stream).map_err(graphcheck::cuda::CudaError::from)? {
            CaptureState::Active { graph } => Ok::<_, NativeError>(graph),
            CaptureState::None => Err(format!("stream {stream:#x} has no capture open").into()),
            CaptureState::Other(status) => Err(format!(
                "the capture on stream {stream:#x} is not active: capture status {status} \
                 ({})",
                match status {
                    1 => "active, but the driver gave no graph",
                    2 => "invalidated",
                    _ => "a status this build does not know",
                }
            )
            .into()),
        }
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
        let w = walk_raw(handle)?;
        Ok::<_, NativeError>(serde_json::to_string(&w)?)
    })
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("GraphcheckError", m.py().get_type::<GraphcheckError>())?;
    m.add("InternalError", m.py().get_type::<InternalError>())?;
    m.add("FORMAT_VERSION", FORMAT_VERSION)?;
    m.add("FORMAT_VERSIONS", FORMAT_VERSIONS.to_vec())?;
    m.add("EXIT_OK", graphcheck::exit::OK)?;
    m.add("EXIT_FINDINGS", graphcheck::exit::FINDINGS)?;
    m.add("EXIT_BAD_INPUT", graphcheck::exit::BAD_INPUT)?;
    // The kinds only a live snapshot gives: what a replay check stops for (`_instrument.replay_check`).
    let live_kinds: Vec<&str> = FindingKind::LIVE.iter().map(|k| k.as_str()).collect();
    m.add("LIVE_KINDS", live_kinds)?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(main, m)?)?;
    m.add_class::<Text>()?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_function(wrap_pyfunction!(load_objects, m)?)?;
    m.add_function(wrap_pyfunction!(manifest_facts, m)?)?;
    m.add_function(wrap_pyfunction!(verify, m)?)?;
    m.add_function(wrap_pyfunction!(verify_pairs, m)?)?;
    m.add_class::<Verified>()?;
    m.add_function(wrap_pyfunction!(normalized, m)?)?;
    m.add_function(wrap_pyfunction!(reads, m)?)?;
    m.add_function(wrap_pyfunction!(summary, m)?)?;
    m.add_function(wrap_pyfunction!(explain, m)?)?;
    m.add_function(wrap_pyfunction!(diff, m)?)?;
    m.add_function(wrap_pyfunction!(schema, m)?)?;
    m.add_function(wrap_pyfunction!(walk_graph, m)?)?;
    m.add_function(wrap_pyfunction!(walk, m)?)?;
    m.add_function(wrap_pyfunction!(capturing_graph, m)?)?;
    m.add_class::<Walked>()?;
    m.add_function(wrap_pyfunction!(glob_match, m)?)?;
    m.add_function(wrap_pyfunction!(check_path, m)?)?;
    m.add_function(wrap_pyfunction!(write_atomic, m)?)?;
    sleep::register(m)?;
    digest::register(m)?;
    build::register(m)?;
    retarget::register(m)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_a_native_call_becomes_an_error() {
        // Regression: a panic crossing into Python is PanicException (a BaseException an
        // engine's `except Exception` misses); `guarded` returns an error instead.
        // A bug is told apart from a bad input: `InternalError` (a `GraphcheckError`), not
        // `PanicException`, and a bad input is a plain `GraphcheckError`.
        Python::initialize();
        Python::attach(|py| {
            let r: PyResult<()> =
                guarded(|| -> Result<(), NativeError> { panic!("index out of bounds") });
            let e = r.unwrap_err();
            assert!(e.is_instance_of::<InternalError>(py), "{e}");
            assert!(e.is_instance_of::<GraphcheckError>(py), "{e}");
            assert!(e.to_string().contains("index out of bounds"), "{e}");
            let r: PyResult<u32> = guarded(|| Err("bad input".to_string()));
            let e = r.unwrap_err();
            assert!(e.is_instance_of::<GraphcheckError>(py), "{e}");
            assert!(!e.is_instance_of::<InternalError>(py), "{e}");
        });
        assert!(matches!(guarded(|| Ok::<_, NativeError>(7u32)), Ok(7)));
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
