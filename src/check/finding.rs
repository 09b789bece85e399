//! What a check reports: the kinds of finding, their severity, one finding with the owners
//! and kernels it names, an allowed finding, and the report of a run. Below both verify
//! and the allowlist, which each use it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Serialize;

use crate::model::format::{Addr, Frame, Registration};

/// The kinds of finding, in report order.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FindingKind {
    Vanished,
    Drifted,
    Freed,
    Reused,
    Reshaped,
    Stale,
    Unregistered,
    Mispooled,
    Unowned,
    RankMismatch,
    UnusedAllow,
}

/// What a kind of finding is found from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Basis {
    /// A manifest compared with its live snapshot (after sleep/wake or a reload).
    Live,
    /// The manifest alone, as captured.
    Capture,
    /// The manifests of several ranks compared with each other.
    Ranks,
    /// The allowlist (an entry that allowed nothing).
    Allowlist,
}

impl FindingKind {
    /// Every kind, in report order.
    pub const ALL: [FindingKind; 11] = [
        FindingKind::Vanished,
        FindingKind::Drifted,
        FindingKind::Freed,
        FindingKind::Reused,
        FindingKind::Reshaped,
        FindingKind::Stale,
        FindingKind::Unregistered,
        FindingKind::Mispooled,
        FindingKind::Unowned,
        FindingKind::RankMismatch,
        FindingKind::UnusedAllow,
    ];

    /// The kinds only a live snapshot can give (`graphcheck._native.LIVE_KINDS`).
    pub const LIVE: [FindingKind; 6] = FindingKind::found_from(&[Basis::Live]);

    /// The kinds a run without a live snapshot checks (besides `unused_allow`).
    pub const CAPTURE_TIME: [FindingKind; 3] = FindingKind::found_from(&[Basis::Capture]);

    /// The kinds one manifest and its live snapshot can give: all but `rank_mismatch`,
    /// which compares the manifests of several ranks.
    pub const PAIR: [FindingKind; 10] =
        FindingKind::found_from(&[Basis::Live, Basis::Capture, Basis::Allowlist]);

    /// What the kind is found from.
    pub const fn basis(self) -> Basis {
        match self {
            FindingKind::Vanished
            | FindingKind::Drifted
            | FindingKind::Freed
            | FindingKind::Reused
            | FindingKind::Reshaped
            | FindingKind::Stale => Basis::Live,
            FindingKind::Unregistered | FindingKind::Mispooled | FindingKind::Unowned => {
                Basis::Capture
            }
            FindingKind::RankMismatch => Basis::Ranks,
            FindingKind::UnusedAllow => Basis::Allowlist,
        }
    }

    /// The kinds of [`FindingKind::ALL`] found from one of `bases`, in report order. `N`
    /// must be their number: another is an error when the constant is evaluated (at
    /// compile time), so the lists cannot drift from [`FindingKind::basis`].
    const fn found_from<const N: usize>(bases: &[Basis]) -> [FindingKind; N] {
        let mut out = [FindingKind::Vanished; N];
        let (mut i, mut n) = (0, 0);
        while i < FindingKind::ALL.len() {
            let kind = FindingKind::ALL[i];
            let mut j = 0;
            while j < bases.len() {
                if bases[j] as u8 == kind.basis() as u8 {
                    assert!(n < N, "more kinds of these bases than the list holds");
                    out[n] = kind;
                    n += 1;
                    break;
                }
                j += 1;
            }
            i += 1;
        }
        assert!(n == N, "fewer kinds of these bases than the list holds");
        out
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FindingKind::Vanished => "vanished",
            FindingKind::Drifted => "drifted",
            FindingKind::Freed => "freed",
            FindingKind::Reused => "reused",
            FindingKind::Reshaped => "reshaped",
            FindingKind::Stale => "stale",
            FindingKind::Unregistered => "unregistered",
            FindingKind::Mispooled => "mispooled",
            FindingKind::Unowned => "unowned",
            FindingKind::RankMismatch => "rank_mismatch",
            FindingKind::UnusedAllow => "unused_allow",
        }
    }

    /// One line on what the kind means, for reports.
    pub fn meaning(self) -> &'static str {
        match self {
            FindingKind::Vanished => "the owner path no longer resolves",
            FindingKind::Drifted => {
                "the owner now holds a tensor at another address; the graph reads the old one"
            }
            FindingKind::Freed => "the captured address is no longer an active allocation",
            FindingKind::Reused => {
                "the captured address now lies in another owner's tensor, or another allocation"
            }
            FindingKind::Reshaped => {
                "same address and owner, but shape, stride, dtype or offset changed"
            }
            FindingKind::Stale => "same address, owner and layout, but the contents are wrong",
            FindingKind::Unregistered => {
                "held only through plain attributes: sleep level 2 and reload do not restore it"
            }
            FindingKind::Mispooled => "a persistent tensor in a pool that sleep discards",
            FindingKind::Unowned => {
                "a captured address no owner, graph input or graph pool explains"
            }
            FindingKind::RankMismatch => {
                "an owner path absent on some ranks, or with another shape or dtype there"
            }
            FindingKind::UnusedAllow => "an allowlist entry that allowed nothing",
        }
    }
}

impl fmt::Display for FindingKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a finding fails the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Severity {
    /// Fails the run: `ok` is false, exit code 1.
    Error,
    /// Shown, but the run stays `ok`: an allowlist entry that allowed nothing (unless the
    /// allowlist denies unused entries, `--deny-unused-allow`).
    Warning,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        }
    }
}

/// An owner path named by a finding.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct OwnerRef {
    pub path: String,
    pub registration: Registration,
}

/// One node parameter word that holds the subject's address.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct KernelRef {
    pub graph: String,
    pub node: u32,
    pub name: String,
    pub param: u32,
    pub offset: u32,
    pub addr: Addr,
}

/// One finding.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Finding {
    pub kind: FindingKind,
    /// Whether it fails the run; every kind but `unused_allow` is always an error.
    pub severity: Severity,
    /// The rank whose documents gave it, in a report of several ranks (`verify DIR`); absent
    /// for one manifest, and for findings about several ranks (`rank_mismatch`,
    /// `unused_allow`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// Owner paths sorted and joined with ` = `, or the hex address (`unowned`), or the
    /// glob (`unused_allow`).
    pub subject: String,
    /// The owners that triggered the finding.
    pub owners: Vec<OwnerRef>,
    /// For `reused`: the owners now at the address. For `drifted`: the same paths, now.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub new_owners: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<u64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stride: Option<Vec<i64>>,
    /// The address the graphs hold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub captured_addr: Option<Addr>,
    /// Where the owner's tensor is now (`drifted`), or the live layout's address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live_addr: Option<Addr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// The graphs that hold the address: the set to recapture.
    pub graphs: Vec<String>,
    pub kernels: Vec<KernelRef>,
    /// One sentence on what was seen.
    pub detail: String,
    /// Where the captured storage was allocated, where the producer recorded it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub alloc_site: Vec<Frame>,
    /// For a finding of a live check (`drifted`, `freed`, `reused`, `vanished`, `reshaped`,
    /// `stale`) of one manifest against its live snapshot: whether `graphcheck retarget`
    /// fixes it, every graph that holds it patched instead of recaptured
    /// (`docs/retarget.md`). Absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retarget: Option<bool>,
}

impl Finding {
    /// A finding about no tensor, graph or address (an allowlist entry, an owner path
    /// across ranks): every other field empty, to be filled by struct update.
    pub fn about(
        kind: FindingKind,
        severity: Severity,
        subject: String,
        detail: String,
    ) -> Finding {
        Finding {
            kind,
            severity,
            rank: None,
            subject,
            owners: Vec::new(),
            new_owners: Vec::new(),
            dtype: None,
            shape: None,
            stride: None,
            captured_addr: None,
            live_addr: None,
            pool: None,
            graphs: Vec::new(),
            kernels: Vec::new(),
            detail,
            alloc_site: Vec::new(),
            retarget: None,
        }
    }
}

/// A finding an allowlist entry silenced.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Allowed {
    pub finding: Finding,
    pub allowed_by: String,
    pub reason: String,
}

/// Everything a run found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// The version of this report's JSON layout.
    pub format_version: u32,
    /// No finding of severity `error` (allowed ones and warnings aside).
    pub ok: bool,
    /// The kinds this run could check.
    pub checked: Vec<FindingKind>,
    pub summary: BTreeMap<FindingKind, usize>,
    pub findings: Vec<Finding>,
    pub allowed: Vec<Allowed>,
    /// Subjects (touched storage views) classified.
    pub subjects: usize,
    pub graphs: usize,
    /// Nodes whose addresses the walk could not read (the graphs' `unread` nodes and
    /// nodes marked `opaque`): whatever they hold is not checked. Left out when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unread_nodes: usize,
    /// The world size the documents record, in a report of several ranks (`verify DIR`);
    /// absent for one manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u32>,
    /// Each rank's own counts, in rank order, in a report of several ranks; left out
    /// otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<RankSummary>,
    /// Ranks below `world_size` that had no manifest: a warning, not a finding (the report
    /// covers the ranks it was given). Left out when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing_ranks: Vec<u32>,
    /// Graphs left out of every finding: torch's CUDA-graph trees guard a static input of
    /// theirs that an owner now holds at another address, so torch records a new graph
    /// instead of replaying them (`Graph::guards`). Left out when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub superseded: Vec<String>,
    /// Graphs `graphcheck retarget` would patch instead of recapturing (one manifest
    /// against its live snapshot). Left out when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retarget: Vec<String>,
}

/// One rank's part of a report of several ranks.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RankSummary {
    pub rank: u32,
    /// No finding of severity `error` on this rank.
    pub ok: bool,
    /// Whether the rank had a live snapshot (all checks) or only its manifest.
    pub live: bool,
    /// Findings of this rank by kind (findings about several ranks are not counted here).
    pub summary: BTreeMap<FindingKind, usize>,
    pub subjects: usize,
    pub graphs: usize,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unread_nodes: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Report {
    /// The findings that fail the run.
    pub fn errors(&self) -> impl Iterator<Item = &Finding> {
        self.findings
            .iter()
            .filter(|f| f.severity == Severity::Error)
    }

    /// The findings shown that do not fail the run.
    pub fn warnings(&self) -> impl Iterator<Item = &Finding> {
        self.findings
            .iter()
            .filter(|f| f.severity == Severity::Warning)
    }

    /// Every graph some finding names, sorted: what to recapture.
    pub fn recapture(&self) -> Vec<String> {
        let set: BTreeSet<&String> = self.findings.iter().flat_map(|f| &f.graphs).collect();
        set.into_iter().cloned().collect()
    }
}

/// The report JSON layout version.
pub const REPORT_VERSION: u32 = 1;

#[cfg(test)]
mod tests {
    use super::FindingKind as K;

    #[test]
    fn the_kind_lists_are_all_kinds_by_basis_in_report_order() {
        // Guards: the lists derived from `basis` are the ones the report and Python use.
        let live: Vec<&str> = K::LIVE.iter().map(|k| k.as_str()).collect();
        assert_eq!(
            live,
            [
                "vanished", "drifted", "freed", "reused", "reshaped", "stale"
            ]
        );
        assert_eq!(K::CAPTURE_TIME, [K::Unregistered, K::Mispooled, K::Unowned]);
        let pair: Vec<K> = K::ALL
            .into_iter()
            .filter(|k| *k != K::RankMismatch)
            .collect();
        assert_eq!(K::PAIR.to_vec(), pair);
    }
}
