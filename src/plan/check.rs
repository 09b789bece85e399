//! A plan read back (a plan file, or the text the Python API hands the patcher) is checked
//! against itself before any word is written: the patcher trusts its actions and edits.

use std::collections::BTreeSet;

use super::{Action, PLAN_FORMAT_VERSION, Plan};

/// Where a plan contradicts itself: the JSON path of the value, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {why}")]
pub struct PlanInvalid {
    pub path: String,
    pub why: String,
}

fn bad(path: impl Into<String>, why: impl Into<String>) -> Result<(), PlanInvalid> {
    Err(PlanInvalid {
        path: path.into(),
        why: why.into(),
    })
}

impl Plan {
    /// Checks the plan against itself: its version and kind; each graph named once; each
    /// action with what it needs (`retarget`: edits and no refusal; `recapture`: a
    /// refusal; `keep`: neither); each word edited once per graph, of a node kind the
    /// patcher changes; and the summary (`retarget`, `recapture`, `edits`, `ok`) as the
    /// graphs say.
    pub fn check(&self) -> Result<(), PlanInvalid> {
        if self.format_version != PLAN_FORMAT_VERSION {
            return bad(
                "format_version",
                format!(
                    "plan format {} (this graphcheck reads {PLAN_FORMAT_VERSION})",
                    self.format_version
                ),
            );
        }
        if self.kind != "retarget_plan" {
            return bad("kind", format!("`{}`, not `retarget_plan`", self.kind));
        }
        let mut names = BTreeSet::new();
        for (i, g) in self.graphs.iter().enumerate() {
            let at = |f: &str| format!("graphs[{i}].{f}");
            if !names.insert(g.graph.as_str()) {
                return bad(at("graph"), format!("graph {:?} is planned twice", g.graph));
            }
            match g.action {
                Action::Retarget if g.edits.is_empty() => {
                    return bad(at("action"), "`retarget` with no edit");
                }
                Action::Retarget if !g.refusals.is_empty() => {
                    return bad(
                        at("action"),
                        "`retarget` with refusals: the graph must be captured again",
                    );
                }
                Action::Recapture if g.refusals.is_empty() => {
                    return bad(at("action"), "`recapture` with no refusal saying why");
                }
                Action::Keep if !g.edits.is_empty() || !g.refusals.is_empty() => {
                    return bad(at("action"), "`keep` with edits or refusals");
                }
                _ => {}
            }
            let mut words = BTreeSet::new();
            for (j, e) in g.edits.iter().enumerate() {
                if !matches!(e.node_kind.as_str(), "kernel" | "memset" | "memcpy") {
                    return bad(
                        format!("graphs[{i}].edits[{j}].node_kind"),
                        format!(
                            "`{}`: only kernel, memset and memcpy words are changed",
                            e.node_kind
                        ),
                    );
                }
                if !words.insert((e.node, e.param, e.offset)) {
                    return bad(
                        format!("graphs[{i}].edits[{j}]"),
                        format!(
                            "node {} param {} +{} is edited twice",
                            e.node, e.param, e.offset
                        ),
                    );
                }
            }
        }
        let listed = |a: Action| -> Vec<&str> {
            let mut v: Vec<&str> = self
                .graphs
                .iter()
                .filter(|g| g.action == a)
                .map(|g| g.graph.as_str())
                .collect();
            v.sort_unstable();
            v
        };
        for (field, action, have) in [
            ("retarget", Action::Retarget, &self.retarget),
            ("recapture", Action::Recapture, &self.recapture),
        ] {
            let mut have: Vec<&str> = have.iter().map(String::as_str).collect();
            have.sort_unstable();
            if have != listed(action) {
                return bad(
                    field,
                    format!(
                        "{have:?}, where the graphs' actions say {:?}",
                        listed(action)
                    ),
                );
            }
        }
        let edits: usize = self
            .graphs
            .iter()
            .filter(|g| g.action == Action::Retarget)
            .map(|g| g.edits.len())
            .sum();
        if self.edits != edits {
            return bad(
                "edits",
                format!("{}, where the retargeted graphs hold {edits}", self.edits),
            );
        }
        if self.ok != self.recapture.is_empty() {
            return bad(
                "ok",
                format!(
                    "{}, with {} graphs to recapture",
                    self.ok,
                    self.recapture.len()
                ),
            );
        }
        Ok(())
    }
}
