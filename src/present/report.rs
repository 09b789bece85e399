//! Rendering a verify report: a terminal table, Markdown for a CI step summary, or JSON.
//! Addresses go through a caller's formatter so normalized output can hide them.

use comfy_table::{ContentArrangement, Table, presets};

use crate::check::finding::{Finding, FindingKind, KernelRef, Report, Severity};
use crate::present::fmt::{AddrFmt, shorten};

const MAX_KERNELS_SHOWN: usize = 3;
const MAX_NAME: usize = 96;

fn kernel_line(k: &KernelRef) -> String {
    format!(
        "{}#{} {} (param {} +{})",
        k.graph,
        k.node,
        shorten(&k.name, MAX_NAME),
        k.param,
        k.offset
    )
}

fn kernels_cell(f: &Finding) -> String {
    let mut lines: Vec<String> = f
        .kernels
        .iter()
        .take(MAX_KERNELS_SHOWN)
        .map(kernel_line)
        .collect();
    if f.kernels.len() > MAX_KERNELS_SHOWN {
        lines.push(format!("… {} more", f.kernels.len() - MAX_KERNELS_SHOWN));
    }
    lines.join("\n")
}

fn owner_cell(f: &Finding) -> String {
    match f.kind {
        FindingKind::UnusedAllow => format!("allow: {}", f.subject),
        FindingKind::Unowned => "(no owner)".to_string(),
        _ => f
            .owners
            .iter()
            .map(|o| format!("{} ({})", o.path, o.registration))
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

fn tensor_cell(f: &Finding) -> String {
    match (&f.dtype, &f.shape) {
        (Some(d), Some(s)) => {
            let dims: Vec<String> = s.iter().map(u64::to_string).collect();
            let mut c = format!("{d}[{}]", dims.join(", "));
            if let Some(p) = &f.pool {
                c.push_str(&format!("\npool {p}"));
            }
            c
        }
        _ => f
            .pool
            .as_ref()
            .map(|p| format!("pool {p}"))
            .unwrap_or_default(),
    }
}

fn address_cell(f: &Finding, fmt: &dyn AddrFmt) -> String {
    match (f.captured_addr, f.live_addr) {
        (Some(c), Some(l)) if c != l => format!("{} → {}", fmt.addr(c), fmt.addr(l)),
        (Some(c), _) => fmt.addr(c),
        _ => String::new(),
    }
}

/// `3 drifted, 1 freed`: counts by kind, in report order.
fn by_kind<'a>(findings: impl Iterator<Item = &'a Finding>) -> String {
    let mut counts: std::collections::BTreeMap<FindingKind, usize> = Default::default();
    for f in findings {
        *counts.entry(f.kind).or_default() += 1;
    }
    counts
        .iter()
        .map(|(k, c)| format!("{c} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn plural(n: usize, word: &str) -> String {
    format!("{n} {word}{}", if n == 1 { "" } else { "s" })
}

fn headline(r: &Report) -> String {
    let n = r.errors().count();
    let w = r.warnings().count();
    let mode = if r.checked.contains(&FindingKind::Drifted) {
        "capture and live checks"
    } else {
        "capture-time checks only (no live snapshot)"
    };
    // Warnings are counted apart: they do not fail the run.
    let warnings = if w == 0 {
        String::new()
    } else {
        format!("; {} ({})", plural(w, "warning"), by_kind(r.warnings()))
    };
    // Nodes the walk could not read are not findings (nothing is known to be wrong), but
    // what they hold was not checked: a clean run says so.
    let unread = if r.unread_nodes == 0 {
        String::new()
    } else {
        format!(
            "; {} unread, whose addresses are not checked (`graphcheck show` lists them)",
            plural(r.unread_nodes, "node")
        )
    };
    if n == 0 {
        format!(
            "graphcheck verify: ok — no findings in {} graphs, {} touched tensors ({mode}){warnings}{unread}",
            r.graphs, r.subjects
        )
    } else {
        format!(
            "graphcheck verify: {} ({}) in {} graphs, {} touched tensors ({mode}){warnings}{unread}",
            plural(n, "finding"),
            by_kind(r.errors()),
            r.graphs,
            r.subjects
        )
    }
}

/// The kind as a report shows it: `unused_allow (warning)` where it does not fail the run.
fn kind_label(f: &Finding) -> String {
    match f.severity {
        Severity::Warning => format!("{} (warning)", f.kind),
        _ => f.kind.to_string(),
    }
}

/// The terminal report: a headline, one table row per finding, then per subject what was
/// seen and which node parameters hold it, the recapture set and the allowed findings.
pub fn render_table(r: &Report, fmt: &dyn AddrFmt) -> String {
    let mut out = headline(r);
    out.push('\n');
    if !r.findings.is_empty() {
        let mut t = Table::new();
        t.load_style(presets::UTF8_FULL_CONDENSED)
            .set_content_arrangement(ContentArrangement::Disabled)
            .set_header(["kind", "owner", "tensor", "address", "graphs"]);
        for f in &r.findings {
            t.add_row([
                kind_label(f),
                owner_cell(f),
                tensor_cell(f),
                address_cell(f, fmt),
                f.graphs.join("\n"),
            ]);
        }
        out.push_str(&t.to_string());
        out.push('\n');

        // Details, one block per subject, in table order.
        let mut subjects: Vec<&str> = Vec::new();
        for f in &r.findings {
            if !subjects.contains(&f.subject.as_str()) {
                subjects.push(&f.subject);
            }
        }
        for subject in subjects {
            let fs: Vec<&Finding> = r.findings.iter().filter(|f| f.subject == subject).collect();
            out.push('\n');
            out.push_str(&match fs[0].kind {
                FindingKind::UnusedAllow => format!(
                    "allow entry `{subject}`{}",
                    match fs[0].severity {
                        Severity::Warning =>
                            " (warning: does not fail the run; --deny-unused-allow makes it fail)",
                        _ => "",
                    }
                ),
                FindingKind::Unowned => format!(
                    "unowned {}",
                    fs[0]
                        .captured_addr
                        .map_or(subject.to_string(), |a| fmt.addr(a))
                ),
                _ => subject.to_string(),
            });
            out.push('\n');
            for f in &fs {
                out.push_str(&format!("  {:<13}{}\n", f.kind.as_str(), f.detail));
                if !f.new_owners.is_empty() && f.kind == FindingKind::Reused {
                    out.push_str(&format!(
                        "  {:<13}{}\n",
                        "now owned by",
                        f.new_owners.join(", ")
                    ));
                }
            }
            if let Some(site) = fs[0].alloc_site.first() {
                out.push_str(&format!(
                    "  {:<13}{}:{} in {}\n",
                    "allocated at", site.filename, site.line, site.name
                ));
            }
            for (i, k) in fs[0].kernels.iter().enumerate() {
                if i == MAX_KERNELS_SHOWN {
                    out.push_str(&format!("  {:<13}… {} more\n", "", fs[0].kernels.len() - i));
                    break;
                }
                out.push_str(&format!(
                    "  {:<13}{}\n",
                    if i == 0 { "held by" } else { "" },
                    kernel_line(k)
                ));
            }
        }
        let rc = r.recapture();
        if !rc.is_empty() {
            out.push_str(&format!("\nrecapture: {}\n", rc.join(", ")));
        }
    }
    if !r.allowed.is_empty() {
        out.push_str(&format!("\nallowed ({}):\n", r.allowed.len()));
        for a in &r.allowed {
            out.push_str(&format!(
                "  {} {} — by `{}`: {}\n",
                a.finding.kind, a.finding.subject, a.allowed_by, a.reason
            ));
        }
    }
    out
}

fn md_escape(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', "<br>")
}

/// Markdown for a CI step summary (`$GITHUB_STEP_SUMMARY`).
pub fn render_markdown(r: &Report, fmt: &dyn AddrFmt) -> String {
    let mut out = String::new();
    let icon = match (r.ok, r.warnings().next().is_some() || r.unread_nodes > 0) {
        (false, _) => "❌",
        (true, true) => "⚠️",
        (true, false) => "✅",
    };
    out.push_str(&format!("### {icon} {}\n\n", headline(r)));
    if !r.findings.is_empty() {
        out.push_str("| kind | owner | tensor | address | graphs | kernels | why |\n");
        out.push_str("|---|---|---|---|---|---|---|\n");
        for f in &r.findings {
            let owner = match f.kind {
                FindingKind::UnusedAllow => format!("allow `{}`", f.subject),
                FindingKind::Unowned => "(no owner)".into(),
                _ => f
                    .owners
                    .iter()
                    .map(|o| format!("`{}` ({})", o.path, o.registration))
                    .collect::<Vec<_>>()
                    .join("<br>"),
            };
            out.push_str(&format!(
                "| **{}**{} | {} | {} | {} | {} | {} | {} |\n",
                f.kind,
                if f.severity == Severity::Warning {
                    " (warning)"
                } else {
                    ""
                },
                md_escape(&owner),
                md_escape(&tensor_cell(f)),
                md_escape(&address_cell(f, fmt)),
                md_escape(&f.graphs.join(", ")),
                md_escape(&kernels_cell(f)),
                md_escape(&f.detail)
            ));
        }
        let rc = r.recapture();
        if !rc.is_empty() {
            out.push_str(&format!(
                "\n**Recapture:** {}\n",
                rc.iter()
                    .map(|g| format!("`{g}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    if !r.allowed.is_empty() {
        out.push_str(&format!(
            "\n<details><summary>Allowed ({})</summary>\n\n",
            r.allowed.len()
        ));
        for a in &r.allowed {
            out.push_str(&format!(
                "- {} `{}` — by `{}`: {}\n",
                a.finding.kind,
                a.finding.subject,
                a.allowed_by,
                md_escape(&a.reason)
            ));
        }
        out.push_str("\n</details>\n");
    }
    out
}

/// The report as pretty JSON, with a trailing newline.
pub fn render_json(r: &Report) -> String {
    let mut s = serde_json::to_string_pretty(r).expect("a report serializes");
    s.push('\n');
    s
}
