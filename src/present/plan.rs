//! A retarget plan for people: per graph, what is patched (every word, old → new) or why
//! it must be captured again; in Markdown for a CI step summary.

use std::fmt::Write as _;

use crate::plan::{Action, Plan};
use crate::present::fmt::{escape, shorten};

fn count(n: usize, one: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {one}s")
    }
}

/// The plan's first line: what it comes to.
pub fn headline(p: &Plan) -> String {
    let keep = p.graphs.iter().filter(|g| g.action == Action::Keep).count();
    format!(
        "graphcheck retarget: {} to retarget ({}), {} to recapture, {} unchanged{}",
        count(p.retarget.len(), "graph"),
        count(p.edits, "edit"),
        p.recapture.len(),
        keep,
        if p.ok {
            ""
        } else {
            " — some graphs must be captured again"
        }
    )
}

/// The plan as text (`markdown`: headings and tables for a CI summary).
pub fn plan_text(p: &Plan, markdown: bool) -> String {
    let mut out = String::new();
    if markdown {
        let _ = writeln!(out, "### {}\n", headline(p));
    } else {
        let _ = writeln!(out, "{}", headline(p));
    }
    for g in p.graphs.iter().filter(|g| g.action != Action::Keep) {
        let what = match g.action {
            Action::Retarget => format!("retarget ({})", count(g.edits.len(), "edit")),
            _ => "recapture".to_string(),
        };
        if markdown {
            let _ = writeln!(out, "\n#### `{}`: {what}\n", escape(&g.graph));
        } else {
            let _ = writeln!(out, "\n{}  {what}", escape(&g.graph));
        }
        for r in &g.refusals {
            if markdown {
                let _ = writeln!(
                    out,
                    "- **{}** `{}`: {}",
                    r.kind,
                    escape(&r.subject),
                    escape(&r.why)
                );
            } else {
                let _ = writeln!(out, "  {:<10} {}", r.kind, escape(&r.subject));
                let _ = writeln!(out, "  {:<10} {}", "", escape(&r.why));
            }
        }
        if g.action == Action::Recapture && !g.edits.is_empty() {
            let _ = writeln!(
                out,
                "{}",
                if markdown {
                    "\nEdits that would be made were the graph not refused:\n"
                } else {
                    "  edits that would be made were the graph not refused:"
                }
            );
        }
        if markdown && !g.edits.is_empty() {
            out.push_str(
                "| node | param | offset | old | new | subject |\n|---|---|---|---|---|---|\n",
            );
        }
        for e in &g.edits {
            let subject = shorten(&escape(&e.subject), 100);
            if markdown {
                let _ = writeln!(
                    out,
                    "| {} {} | {} | +{} | `{}` | `{}` | `{}` |",
                    e.node,
                    e.node_kind,
                    e.param,
                    e.offset,
                    e.old,
                    e.new,
                    subject.replace('|', "\\|")
                );
            } else {
                let _ = writeln!(
                    out,
                    "  node {} {} param {} +{}: {} → {}  {subject}",
                    e.node, e.node_kind, e.param, e.offset, e.old, e.new
                );
            }
        }
    }
    out
}
