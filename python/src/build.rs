//! Building documents in `graphcheck._native`: the manifest of a build spec and the live
//! snapshot of a live spec, with the digests of the memory the graphs read that no owner
//! explains, which a Python callable takes (it reads device memory).

use std::sync::Arc;

use graphcheck::codec::load::Source;
use graphcheck::model::format::{Addr, Digest, RangeDigest};
use graphcheck::resolve::live::LiveSpec;
use graphcheck::resolve::spec::{self, BuildSpec};
use graphcheck::resolve::walked::WalkedGraph;
use pyo3::prelude::*;

use crate::{GraphcheckError, NativeError, Walked, chain, interruptible, source, version_arg};

/// Builds a manifest from a build spec (JSON, see `graphcheck::resolve::spec`): resolves
/// every walked word to a tensor view, allocation and pool, checks the result, returns its
/// JSON in format `format_version` (default 2).
///
/// `ranges`, where given, digests the memory the graphs read that no owner explains: it is
/// called with the allocator blocks (from the spec's segments) holding the addresses of the
/// `unowned` touches, as a list of `(address, bytes)`, and returns a digest
/// (`"<algorithm>:<hex>"`) or `None` for each; the manifest's `ranges` records them. It is
/// not called where there are none.
#[pyfunction]
#[pyo3(signature = (spec, walked=None, format_version=2, ranges=None))]
fn build_manifest(
    py: Python<'_>,
    spec: &Bound<'_, PyAny>,
    walked: Option<Vec<PyRef<'_, Walked>>>,
    format_version: u32,
    ranges: Option<Bound<'_, PyAny>>,
) -> PyResult<String> {
    let v = version_arg(format_version)?;
    let spec = spec_bytes(spec, "<build spec>")?;
    let walked: Vec<std::sync::Arc<WalkedGraph>> = walked
        .unwrap_or_default()
        .iter()
        .map(|w| w.inner.clone())
        .collect();
    let digest = ranges.is_some();
    let (mut m, wanted) = interruptible(py, move || -> Result<_, NativeError> {
        let name = "<build spec>";
        let spec = BuildSpec::parse(&spec, name)?;
        let blocks = if digest {
            spec.active_blocks()
        } else {
            Vec::new()
        };
        let m = spec::build(spec, &walked, name)?;
        let wanted = if blocks.is_empty() {
            Vec::new()
        } else {
            let mt = graphcheck::index::refs::check_manifest(&m).map_err(|e| {
                format!(
                    "{name}: the built manifest is invalid at `{}`: {}",
                    e.json_path, e.message
                )
            })?;
            let addrs = graphcheck::check::verify::unexplained_addresses(&m, &mt);
            spec::blocks_holding(&blocks, &addrs)
        };
        Ok((m, wanted))
    })?;
    if let Some(f) = ranges
        && !wanted.is_empty()
    {
        m.ranges = range_digests(&f, &wanted, "ranges")?;
    }
    interruptible(py, move || -> Result<String, NativeError> {
        Ok(serde_json::to_string(&m.in_version(v))?)
    })
}

/// The digests `f` gives for `wanted` (`(address, bytes)` each), those it gave: `f` returns a
/// list as long, each a digest `"<algorithm>:<hex>"` or `None`. `what` names `f` in errors.
fn range_digests(
    f: &Bound<'_, PyAny>,
    wanted: &[(Addr, u64)],
    what: &str,
) -> PyResult<Vec<RangeDigest>> {
    let arg: Vec<(u64, u64)> = wanted.iter().map(|&(a, n)| (a.0, n)).collect();
    let got: Vec<Option<String>> = f.call1((arg,))?.extract().map_err(|e| {
        GraphcheckError::new_err(format!(
            "{what}: returns a list of digests (str or None): {e}"
        ))
    })?;
    if got.len() != wanted.len() {
        return Err(GraphcheckError::new_err(format!(
            "{what}: returned {} digests for {} ranges",
            got.len(),
            wanted.len()
        )));
    }
    let mut out = Vec::new();
    for (&(addr, size), d) in wanted.iter().zip(got) {
        let Some(d) = d else { continue };
        if !d.contains(':') {
            return Err(GraphcheckError::new_err(format!(
                "{what}: `{d}` (for {addr}+{size}) is not `<algorithm>:<hex>`"
            )));
        }
        out.push(RangeDigest {
            addr,
            size,
            digest: Digest(d),
        });
    }
    Ok(out)
}

/// Builds the live snapshot of a live spec (JSON, see `graphcheck::resolve::live::LiveSpec`:
/// the live model's tensor views and owners, the allocator's segments, pool bindings,
/// reference digests) against `manifest`; returns its JSON in format `format_version`
/// (default 2), checked like a loaded document.
///
/// `ranges`, where given and the manifest has `ranges`, digests them again (called as
/// `build_manifest`'s is, with the manifest's ranges); the snapshot's `ranges` records what
/// it gives.
///
/// `keep`, with `manifest` a `Text`: the manifest as parsed here is kept with the `Text`,
/// and later `build_live` and `verify` calls of it take it instead of parsing the same
/// text again (`kept.rs`); a `Text` that holds one is never parsed again.
#[pyfunction]
#[pyo3(signature = (spec, manifest, format_version=2, ranges=None, keep=false))]
fn build_live(
    py: Python<'_>,
    spec: &Bound<'_, PyAny>,
    manifest: &Bound<'_, PyAny>,
    format_version: u32,
    ranges: Option<Bound<'_, PyAny>>,
    keep: bool,
) -> PyResult<String> {
    let v = version_arg(format_version)?;
    let spec = spec_bytes(spec, "<live spec>")?;
    let text = manifest.cast::<crate::args::Text>().ok();
    let kept = text.and_then(|t| t.get().parsed.get());
    let manifest = source(manifest, Some("<manifest>"))?;
    let (mut live, wanted, parsed) = interruptible(py, move || -> Result<_, NativeError> {
        let mut de = serde_json::Deserializer::from_slice(&spec);
        let spec: LiveSpec = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            NativeError::Message(format!(
                "<live spec>: invalid spec at `{}`: {}",
                e.path(),
                e.inner()
            ))
        })?;
        let (m, t) = match kept {
            Some(parsed) => parsed,
            None => {
                let (m, t) = manifest.manifest_checked()?;
                (Arc::new(m), Arc::new(t))
            }
        };
        let live = graphcheck::resolve::live::build_live(spec, &m)
            .map_err(|e| NativeError::Message(format!("<live spec>: {}", chain(&e))))?;
        let wanted: Vec<(Addr, u64)> = m.ranges.iter().map(|r| (r.addr, r.size)).collect();
        Ok((live, wanted, (m, t)))
    })?;
    if keep && let Some(text) = text {
        text.get().parsed.keep(parsed);
    }
    if let Some(f) = ranges
        && !wanted.is_empty()
    {
        live.ranges = range_digests(&f, &wanted, "ranges")?;
    }
    interruptible(py, move || -> Result<String, NativeError> {
        Ok(serde_json::to_string(&live.in_version(v))?)
    })
}

/// A spec as the caller handed it: JSON text, or a file holding it.
fn spec_bytes(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<u8>> {
    match source(obj, Some(name))? {
        Source::Text { bytes, .. } => Ok(bytes),
        Source::Shared { bytes, .. } => Ok(bytes.to_vec()),
        Source::Path(p) => std::fs::read(&p)
            .map_err(|e| GraphcheckError::new_err(format!("failed to read {}: {e}", p.display()))),
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(build_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(build_live, m)?)?;
    Ok(())
}
