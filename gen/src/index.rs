//! `fixtures/index.json`: every scenario of the corpus, where its files are, what to ask
//! `explain`, and what `verify` must report; and every deliberately broken input with the
//! words its error must contain.

use serde::{Deserialize, Serialize};

/// The version of the index format.
pub const INDEX_VERSION: u32 = 1;

/// The whole index.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Index {
    pub format_version: u32,
    pub scenarios: Vec<ScenarioEntry>,
    /// (The GPU corpus's index has none.)
    #[serde(default)]
    pub bad: Vec<BadEntry>,
    /// Runs of several ranks, each a folder `verify DIR` reads. (The GPU corpus's index has
    /// none.)
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<RanksEntry>,
}

/// A run of several ranks: a folder of per-rank manifests and live snapshots.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RanksEntry {
    pub name: String,
    pub description: String,
    pub made_by: String,
    /// The folder `graphcheck verify DIR` is given, relative to `fixtures/`.
    pub dir: String,
    pub expect: RanksExpect,
}

/// What `graphcheck verify DIR` must report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RanksExpect {
    pub exit_code: i32,
    /// Every finding, in report order (kind, subject, then rank); nothing else.
    pub findings: Vec<RankFinding>,
    /// The ranks below the world size that have no manifest (a warning).
    pub missing_ranks: Vec<u32>,
}

/// One finding of a report of several ranks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankFinding {
    /// `null` for a finding about several ranks (`rank_mismatch`).
    pub rank: Option<u32>,
    pub kind: Kind,
    pub subject: String,
}

/// One scenario. Paths are relative to the `fixtures/` folder.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScenarioEntry {
    pub name: String,
    /// What the model does, what the reload or sleep does, which upstream issue it models.
    pub description: String,
    /// How the files were made.
    pub made_by: String,
    pub manifest: String,
    /// The live snapshot, for scenarios with a reload or sleep; `null` for capture-only.
    pub live: Option<String>,
    /// The allowlist `verify` is given, if any.
    pub allow: Option<String>,
    /// Queries to snapshot `explain` with: owner paths, hex addresses, or
    /// `--kernel PATTERN`. Each must find something (exit 0), unless listed in
    /// `explain_misses`.
    pub explain: Vec<String>,
    /// Queries of `explain` that must find nothing (exit 1): a miss kept on purpose.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub explain_misses: Vec<String>,
    pub expect: Expect,
}

/// What `graphcheck verify MANIFEST [LIVE] [--allow ALLOW]` must report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Expect {
    pub exit_code: i32,
    /// Every finding, in report order (kind, then subject); nothing else.
    pub findings: Vec<ExpectedFinding>,
    /// Findings the allowlist silences, in the same order.
    pub allowed: Vec<ExpectedFinding>,
    /// What `graphcheck retarget` plans, where the scenario states it (derived by hand from
    /// `docs/retarget.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<ExpectPlan>,
}

/// The graphs a retarget plan patches and those it leaves to recapture, sorted by name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpectPlan {
    pub retarget: Vec<String>,
    pub recapture: Vec<String>,
}

/// One finding, by kind and subject (see `docs/findings.md`, "Order, subject, exit code").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpectedFinding {
    pub kind: Kind,
    /// Owner paths sorted and joined with ` = `; the hex address for `unowned`; the glob
    /// for `unused_allow`.
    pub subject: String,
    /// The sorted names of the graphs whose touches name the subject's tensors (the set
    /// to recapture), where the scenario pins it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graphs: Option<Vec<String>>,
    /// `warning` for a finding that does not fail the run (`unused_allow`, without
    /// `--deny-unused-allow`); absent for an error.
    #[serde(default = "error", skip_serializing_if = "is_error")]
    pub severity: Severity,
}

/// Whether a finding fails the run: the core's [`graphcheck::check::finding::Severity`].
pub use graphcheck::check::finding::Severity;

fn error() -> Severity {
    Severity::Error
}

fn is_error(s: &Severity) -> bool {
    *s == Severity::Error
}

/// The finding kinds: the core's vocabulary (`docs/findings.md`), in report order.
pub use graphcheck::check::finding::FindingKind as Kind;

/// A deliberately broken input.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BadEntry {
    /// Relative to `fixtures/`.
    pub file: String,
    /// What the file is given to the CLI as: `manifest`, `live` (verified against the
    /// first scenario's manifest, which the bad inputs are cut from) or `allow`.
    #[serde(rename = "as")]
    pub as_: String,
    /// Substrings the CLI's stderr must contain: the file's name, and the JSON path or
    /// line of the fault where there is one.
    pub error_contains: Vec<String>,
    /// The document validates against the JSON Schema: it is bad only in ways a schema
    /// cannot see (an id no record has, two records with one id, a document of the other
    /// kind, a live snapshot that does not belong with the manifest). Every other bad
    /// document the schema rejects, as the loader does.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub schema_valid: bool,
}
