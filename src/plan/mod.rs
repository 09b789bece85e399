//! Retarget instead of recapture (`docs/retarget.md`): from a manifest, its live snapshot
//! and verify's report, the plan that makes each graph read what its owners hold now — per
//! graph, the words to change in its nodes, or why it must be captured again — and
//! [`apply`], which patches a graph all or nothing through a [`apply::Patcher`] (the
//! driver's, in `graphcheck::cuda`, or the host stand-in the tests use) and gives the
//! manifest that describes the patched graphs.

pub mod apply;
mod build;
mod check;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::model::format::Addr;

pub use build::{PlanError, plan};
pub use check::PlanInvalid;

/// The version of the plan's JSON layout.
pub const PLAN_FORMAT_VERSION: u32 = 1;

/// What to do with one graph.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// No finding concerns it: replay as it is.
    Keep,
    /// Every finding that concerns it is fixed by its edits.
    Retarget,
    /// At least one finding cannot be fixed by changing words: capture it again.
    Recapture,
}

/// One word of one node parameter to change.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
pub struct Edit {
    /// The node's index in the manifest's graph (`Node::index`).
    pub node: u32,
    /// `kernel`, `memset` or `memcpy`.
    pub node_kind: String,
    pub param: u32,
    /// Byte offset of the word in the parameter.
    pub offset: u32,
    /// The word the graph holds (the captured address).
    pub old: Addr,
    /// The word it gets: the new data pointer plus the word's offset from the old one.
    pub new: Addr,
    /// The subject whose tensor moved (its owner paths, joined with ` = `).
    pub subject: String,
}

/// Why a graph must be captured again.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
pub struct Refusal {
    /// The finding that cannot be fixed (its kind), or `node` / `ambiguous`.
    pub kind: String,
    /// Its subject (owner paths, or an address).
    pub subject: String,
    /// One sentence: why no change of words fixes it.
    pub why: String,
}

/// One graph's part of the plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GraphPlan {
    pub graph: String,
    pub action: Action,
    /// The edits that fix it (`retarget`), in node, parameter and offset order. Also
    /// listed for a graph refused for another reason: what would be changed if it were not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub edits: Vec<Edit>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refusals: Vec<Refusal>,
}

/// The plan: every graph of the manifest with its action.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Plan {
    pub format_version: u32,
    /// Always `retarget_plan`.
    pub kind: String,
    /// Every graph with a finding can be retargeted (nothing to recapture).
    pub ok: bool,
    /// Graphs to patch, by name.
    pub retarget: Vec<String>,
    /// Graphs to capture again, by name.
    pub recapture: Vec<String>,
    /// Word edits over all graphs.
    pub edits: usize,
    pub graphs: Vec<GraphPlan>,
}

impl Plan {
    /// The plan of the graphs, with the summary lists filled in.
    fn of(graphs: Vec<GraphPlan>) -> Plan {
        let names = |a: Action| -> Vec<String> {
            let mut v: Vec<String> = graphs
                .iter()
                .filter(|g| g.action == a)
                .map(|g| g.graph.clone())
                .collect();
            v.sort();
            v
        };
        let (retarget, recapture) = (names(Action::Retarget), names(Action::Recapture));
        Plan {
            format_version: PLAN_FORMAT_VERSION,
            kind: "retarget_plan".into(),
            ok: recapture.is_empty(),
            edits: graphs
                .iter()
                .filter(|g| g.action == Action::Retarget)
                .map(|g| g.edits.len())
                .sum(),
            retarget,
            recapture,
            graphs,
        }
    }

    /// The graph's part of the plan.
    pub fn graph(&self, name: &str) -> Option<&GraphPlan> {
        self.graphs.iter().find(|g| g.graph == name)
    }
}

/// Says in `r`, a report of `m` against its live snapshot `l`, what a retarget would do:
/// each live-check finding's `retarget` (every graph that holds it would be patched), and
/// the graphs it would patch (`Report::retarget`). A report without live checks is left
/// as it is.
pub fn annotate(
    r: &mut crate::check::finding::Report,
    m: &crate::model::format::Manifest,
    l: &crate::model::format::Live,
) {
    use crate::check::finding::FindingKind as K;
    let Ok(p) = plan(m, l, r) else {
        return;
    };
    for f in &mut r.findings {
        if matches!(
            f.kind,
            K::Drifted | K::Freed | K::Reused | K::Vanished | K::Reshaped | K::Stale
        ) {
            f.retarget =
                Some(!f.graphs.is_empty() && f.graphs.iter().all(|g| p.retarget.contains(g)));
        }
    }
    r.retarget = p.retarget;
}

/// The JSON Schema of the plan (`schema/graphcheck-plan-v1.schema.json`).
pub fn schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(Plan)).expect("a schema serializes")
}

#[cfg(test)]
mod tests;
