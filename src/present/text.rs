//! Text for people that both command lines print: the `show` summary of a document and
//! the `diff` report as a table or Markdown.

use std::path::Path;

use crate::check::diff::DiffReport;
use crate::document::format::Document;

/// `graphcheck show DOCUMENT`: producer, tensors by registration, pools, graphs or probes.
pub fn summary(d: &Document) -> String {
    use std::collections::BTreeMap;
    use std::fmt::Write as _;
    let mut out = String::new();
    let p = d.producer();
    let _ = writeln!(
        out,
        "{} v1 by {} {}{}{}{}, rank {} of {}",
        d.kind(),
        p.tool,
        p.tool_version,
        p.gpu
            .as_ref()
            .map(|g| format!(" on {g}"))
            .unwrap_or_default(),
        p.driver_version
            .map(|v| format!(", driver {v}"))
            .unwrap_or_default(),
        p.framework
            .as_ref()
            .map(|f| format!(", {f}"))
            .unwrap_or_default(),
        p.rank,
        p.world_size
    );
    if let Document::Live(l) = d {
        let _ = writeln!(out, "event: {}", l.event.name);
    }
    let mut regs: BTreeMap<String, usize> = BTreeMap::new();
    for o in d.owners() {
        *regs.entry(o.registration.to_string()).or_default() += 1;
    }
    let _ = writeln!(
        out,
        "tensors: {} views, {} owner paths ({})",
        d.tensors().len(),
        d.owners().len(),
        regs.iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(
        out,
        "pools: {}",
        d.pools()
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    match d {
        Document::Manifest(m) => {
            let touches: usize = m
                .graphs
                .iter()
                .flat_map(|g| &g.nodes)
                .map(|n| n.touches.len())
                .sum();
            let _ = writeln!(
                out,
                "graphs: {}, {} address words held",
                m.graphs.len(),
                touches
            );
            for g in &m.graphs {
                let counts: Vec<String> = g
                    .node_counts
                    .iter()
                    .map(|(k, v)| format!("{v} {k}"))
                    .collect();
                let opaque = g.nodes.iter().filter(|n| n.opaque.is_some()).count();
                let _ = writeln!(
                    out,
                    "  {}: {}{}{}",
                    g.name,
                    counts.join(", "),
                    if g.unread.is_empty() {
                        String::new()
                    } else {
                        format!("; {} unread", g.unread.len())
                    },
                    if opaque == 0 {
                        String::new()
                    } else {
                        format!("; {opaque} opaque")
                    }
                );
            }
        }
        Document::Live(l) => {
            let mut states: BTreeMap<String, usize> = BTreeMap::new();
            for p in &l.probes {
                *states
                    .entry(
                        serde_json::to_value(p.state)
                            .ok()
                            .and_then(|v| v.as_str().map(String::from))
                            .unwrap_or_default(),
                    )
                    .or_default() += 1;
            }
            let _ = writeln!(
                out,
                "probes: {} ({})",
                l.probes.len(),
                states
                    .iter()
                    .map(|(k, v)| format!("{v} {k}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    out
}

/// `graphcheck diff A B` as a table (or Markdown); `a` and `b` name the two documents.
pub fn diff_text(r: &DiffReport, a: &Path, b: &Path, markdown: bool) -> String {
    use comfy_table::{ContentArrangement, Table, presets};
    let mut out = if r.same {
        format!("same: {} owner paths compared, no difference\n", r.compared)
    } else {
        format!(
            "{} difference(s) between {} (A) and {} (B); {} owner paths in both\n",
            r.differences.len() + r.graphs.len() + r.pools.len(),
            a.display(),
            b.display(),
            r.compared
        )
    };
    let rows: Vec<[String; 4]> = r
        .graphs
        .iter()
        .map(|d| (format!("graph {}", d.path), d))
        .chain(r.pools.iter().map(|d| (format!("pool {}", d.path), d)))
        .chain(r.differences.iter().map(|d| (d.path.clone(), d)))
        .map(|(p, d)| {
            [
                p,
                serde_json::to_value(&d.change)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default(),
                d.a.clone().unwrap_or_else(|| "—".into()),
                d.b.clone().unwrap_or_else(|| "—".into()),
            ]
        })
        .collect();
    if rows.is_empty() {
        return out;
    }
    if markdown {
        out.push_str("\n| path | change | A | B |\n|---|---|---|---|\n");
        for r in rows {
            out.push_str(&format!(
                "| `{}` | {} | {} | {} |\n",
                r[0], r[1], r[2], r[3]
            ));
        }
    } else {
        let mut t = Table::new();
        t.load_style(presets::UTF8_FULL_CONDENSED)
            .set_content_arrangement(ContentArrangement::Disabled)
            .set_header(["path", "change", "A", "B"]);
        for r in rows {
            t.add_row(r);
        }
        out.push_str(&t.to_string());
        out.push('\n');
    }
    out
}
