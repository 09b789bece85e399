//! Retarget in `graphcheck._native` (`graphcheck::plan`): the plan of a manifest and its
//! live snapshot, applying one graph's part all or nothing on the host stand-in (the CPU
//! tests') or through the driver on a captured graph, and the manifest after applying.
//! Documents come as paths or JSON text, as everywhere in the module; plans as JSON text.

use graphcheck::app::retarget as app_retarget;
use graphcheck::codec::load::Source;
use graphcheck::model::format::{Live, Manifest};
use graphcheck::plan::apply::{HostGraph, Outcome, apply_graph, probed_for, retargeted_manifest};
use graphcheck::plan::{GraphPlan, Plan};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::collections::HashMap;

use crate::kept::kept_parse;
use crate::{NativeError, allowlist, detached, interruptible, path_arg, source};

/// The plan that makes each graph of `manifest` read what its owners hold in `live`, as
/// JSON (`graphcheck retarget --format json`): per graph `keep`, `retarget` (the word
/// edits) or `recapture` (why). `allow` is an allowlist file, `allow_entries` its entries
/// as data, as for `verify`.
#[pyfunction]
#[pyo3(signature = (manifest, live, allow=None, allow_entries=None))]
fn retarget_plan(
    py: Python<'_>,
    manifest: &Bound<'_, PyAny>,
    live: &Bound<'_, PyAny>,
    allow: Option<&Bound<'_, PyAny>>,
    allow_entries: Option<String>,
) -> PyResult<String> {
    // The manifest a `build_live(keep=True)` or `manifest_facts(keep=True)` of this very
    // `Text` parsed (kept.rs).
    let parsed = kept_parse(manifest);
    let m = source(manifest, Some("<manifest>"))?;
    let l = source(live, Some("<live>"))?;
    let allow = allow.map(|a| path_arg(a, "allow")).transpose()?;
    interruptible(py, move || -> Result<String, NativeError> {
        let allow = allowlist(allow, allow_entries, false)?;
        let plan = app_retarget::retarget_parsed(&m, parsed, &l, &allow)?;
        Ok(serde_json::to_string(&plan)?)
    })
}

/// The plan in `text`.
fn plan_of(text: &str) -> Result<Plan, NativeError> {
    let p: Plan = serde_json::from_str(text).map_err(|e| format!("not a retarget plan: {e}"))?;
    // The patcher trusts the plan's actions and edits: checked against itself first.
    p.check()
        .map_err(|e| format!("the retarget plan contradicts itself at {e}"))?;
    Ok(p)
}

/// Graph `name`'s part of the plan.
fn graph_plan(plan: &Plan, name: &str) -> Result<GraphPlan, NativeError> {
    plan.graph(name)
        .cloned()
        .ok_or_else(|| format!("the plan has no graph named {name:?}").into())
}

/// An outcome as Python sees it: `applied`, `edits` (made), `why` (of a refusal) and
/// `restored` (the graph is as it was: false only where undoing failed too).
fn outcome_dict<'py>(py: Python<'py>, o: &Outcome) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    match o {
        Outcome::Applied { edits } => {
            d.set_item("applied", true)?;
            d.set_item("edits", *edits)?;
            d.set_item("why", py.None())?;
            d.set_item("restored", false)?;
        }
        Outcome::Refused { why, restored } => {
            d.set_item("applied", false)?;
            d.set_item("edits", 0)?;
            d.set_item("why", why)?;
            d.set_item("restored", *restored)?;
        }
    }
    Ok(d)
}

/// Words keyed by (node, parameter, offset).
type Words = std::collections::BTreeMap<(u32, u32, u32), u64>;

/// Applies graph `graph`'s part of the plan to `words` held in host memory ((node,
/// parameter, offset) → word), as the driver's patcher would to a captured graph: every
/// edit or none. `fail_write` makes that write fail (counted from 0, undo writes
/// included), `fail_undo` every write after a failure. Returns (outcome, the words after).
#[pyfunction]
#[pyo3(signature = (plan, graph, words, fail_write=None, fail_undo=false))]
fn apply_plan_host<'py>(
    py: Python<'py>,
    plan: &str,
    graph: &str,
    words: Words,
    fail_write: Option<usize>,
    fail_undo: bool,
) -> PyResult<(Bound<'py, PyDict>, Words)> {
    let (plan, graph) = (plan.to_owned(), graph.to_owned());
    let (outcome, words) = detached(py, move || -> Result<_, NativeError> {
        let gp = graph_plan(&plan_of(&plan)?, &graph)?;
        let mut h = HostGraph::default();
        h.words = words;
        h.fail_write = fail_write;
        h.fail_undo = fail_undo;
        let outcome = apply_graph(&mut h, &gp);
        Ok((outcome, h.words))
    })?;
    Ok((outcome_dict(py, &outcome)?, words))
}

/// The manifest and live snapshot in two sources.
fn documents(m: &Source, l: &Source) -> Result<(Manifest, Live), NativeError> {
    Ok((m.manifest_checked()?.0, l.live_checked()?.0))
}

/// The manifest after the graphs named in `applied` were patched by `plan` (JSON): their
/// edited words name the new addresses and the tensors their owners hold now, so that a
/// later verify checks what the patched graphs read.
#[pyfunction]
#[pyo3(name = "retargeted_manifest")]
fn retargeted_manifest_json(
    py: Python<'_>,
    manifest: &Bound<'_, PyAny>,
    live: &Bound<'_, PyAny>,
    plan: String,
    applied: Vec<String>,
) -> PyResult<String> {
    let m = source(manifest, Some("<manifest>"))?;
    let l = source(live, Some("<live>"))?;
    interruptible(py, move || -> Result<String, NativeError> {
        let (m, l) = documents(&m, &l)?;
        let out = retargeted_manifest(&m, &l, &plan_of(&plan)?, &applied);
        Ok(serde_json::to_string(&out)?)
    })
}

/// The live snapshot `live` with a probe at every address of `manifest` it does not probe
/// (active in the live allocation that holds it, else unmapped), as a snapshot taken after
/// the retarget would have it (JSON).
#[pyfunction]
#[pyo3(name = "probed_for")]
fn probed_for_json(
    py: Python<'_>,
    live: &Bound<'_, PyAny>,
    manifest: &Bound<'_, PyAny>,
) -> PyResult<String> {
    let m = source(manifest, Some("<manifest>"))?;
    let l = source(live, Some("<live>"))?;
    interruptible(py, move || -> Result<String, NativeError> {
        let (m, l) = documents(&m, &l)?;
        Ok(serde_json::to_string(&probed_for(&l, &m))?)
    })
}

/// Applies the plan to captured CUDA graphs, each all or nothing: `graphs` lists (name,
/// template, exec), `template` the graph's `cudaGraph_t` (`torch.cuda.CUDAGraph(
/// keep_graph=True).raw_cuda_graph()`), `exec` the `cudaGraphExec_t` instantiated from it
/// (`raw_cuda_graph_exec()`), patched in place; without `exec` only the template changes
/// and the caller instantiates it again before replaying. Returns each graph's outcome (as
/// `apply_plan_host`'s), in the order given. The plan is parsed and checked once (parsed
/// per graph, as `apply_plan_host` does, it took 8.4 s of a 9.3 s retarget of 1,667 graphs
/// on the CPU box), and a name it does not plan is an error before any graph is touched.
///
/// Nothing may replay, read or change a graph during the call (synchronize first), and
/// the graphs' CUDA context must be current on the calling thread (torch's is).
#[pyfunction]
fn apply_plan_cuda<'py>(
    py: Python<'py>,
    plan: &str,
    graphs: Vec<(String, u64, Option<u64>)>,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let plan = plan.to_owned();
    let outcomes = detached(py, move || -> Result<Vec<Outcome>, NativeError> {
        let plan = plan_of(&plan)?;
        let by_name: HashMap<&str, &GraphPlan> =
            plan.graphs.iter().map(|g| (g.graph.as_str(), g)).collect();
        let mut parts = Vec::with_capacity(graphs.len());
        for (name, template, exec) in &graphs {
            let gp = by_name
                .get(name.as_str())
                .ok_or_else(|| format!("the plan has no graph named {name:?}"))?;
            parts.push((*template, *exec, *gp));
        }
        graphcheck::cuda::retarget::apply_plans(&parts)
            .map_err(|e| format!("apply_plan_cuda: {e}").into())
    })?;
    outcomes.iter().map(|o| outcome_dict(py, o)).collect()
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(retarget_plan, m)?)?;
    m.add_function(wrap_pyfunction!(apply_plan_host, m)?)?;
    m.add_function(wrap_pyfunction!(retargeted_manifest_json, m)?)?;
    m.add_function(wrap_pyfunction!(probed_for_json, m)?)?;
    m.add_function(wrap_pyfunction!(apply_plan_cuda, m)?)?;
    Ok(())
}
