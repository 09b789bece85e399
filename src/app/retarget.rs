//! `graphcheck retarget`: the plan that makes each graph read what its owners hold now
//! (`crate::plan`), from a manifest and its live snapshot, printed; nothing is changed.

use crate::check::allow::Allowlist;
use std::sync::Arc;

use crate::codec::load::{LoadError, Source};
use crate::index::refs::Tables;
use crate::model::format::Manifest;
use crate::plan::{Plan, plan};

use super::commands::Format;

/// Loads and verifies both documents, and plans the retarget.
pub fn retarget(manifest: &Source, live: &Source, allow: &Allowlist) -> Result<Plan, LoadError> {
    retarget_parsed(manifest, None, live, allow)
}

/// [`retarget`], with `manifest`'s text parsed and checked already where `parsed` is given
/// (`verify::verify_parsed`): it is not parsed again.
pub fn retarget_parsed(
    manifest: &Source,
    parsed: Option<(Arc<Manifest>, Arc<Tables>)>,
    live: &Source,
    allow: &Allowlist,
) -> Result<Plan, LoadError> {
    let v = super::verify::verify_parsed(manifest, parsed, Some(live), allow)?;
    let (l, _) = v.live.as_ref().expect("verified with a live snapshot");
    Ok(plan(&v.manifest, l, &v.report).expect("a report with a live snapshot has its live checks"))
}

/// The plan as `format` prints it.
pub fn render(p: &Plan, format: Format) -> String {
    match format {
        Format::Json => {
            let mut s = serde_json::to_string_pretty(p).expect("a plan serializes");
            s.push('\n');
            s
        }
        Format::Table => crate::present::plan::plan_text(p, false),
        Format::Markdown => crate::present::plan::plan_text(p, true),
    }
}
