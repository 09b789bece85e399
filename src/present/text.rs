//! Text for people that both command lines print: the `show` summary of a document and
//! the `diff` report as a table or Markdown. Text from documents goes through [`escape`].

use std::path::Path;

use crate::check::diff::DiffReport;
use crate::model::format::Document;
use crate::present::fmt::{MIN_WIDTH, escape, wrap};
use crate::present::report::plural;

/// `13 kernels`, `1 memset`, `2 empty nodes`: a count of graph nodes of one driver type.
/// The types that name a thing take a plural; the others (`host`, `empty`, `conditional`,
/// a newer driver's `type_N`) describe a node.
fn node_count(n: u64, kind: &str) -> String {
    let kind = escape(kind);
    let noun = matches!(
        &*kind,
        "kernel"
            | "memcpy"
            | "memset"
            | "child_graph"
            | "wait_event"
            | "event_record"
            | "ext_semaphore_signal"
            | "ext_semaphore_wait"
            | "mem_alloc"
            | "batch_mem_op"
    );
    let s = if n == 1 { "" } else { "s" };
    if noun {
        format!("{n} {kind}{s}")
    } else {
        format!("{n} {kind} node{s}")
    }
}

/// `graphcheck show DOCUMENT`: producer, tensors by registration, pools, graphs or probes.
pub fn summary(d: &Document) -> String {
    use std::collections::BTreeMap;
    use std::fmt::Write as _;
    let mut out = String::new();
    let p = d.producer();
    let _ = writeln!(
        out,
        "{} v{} by {} {}{}{}{}, rank {} of {}",
        d.kind(),
        d.format_version(),
        escape(&p.tool),
        escape(&p.tool_version),
        p.gpu
            .as_ref()
            .map(|g| format!(" on {}", escape(g)))
            .unwrap_or_default(),
        p.driver_version
            .map(|v| format!(", driver {v}"))
            .unwrap_or_default(),
        p.framework
            .as_ref()
            .map(|f| format!(", {}", escape(f)))
            .unwrap_or_default(),
        p.rank,
        p.world_size
    );
    if let Document::Live(l) = d {
        let _ = writeln!(out, "event: {}", escape(&l.event.name));
    }
    let mut regs: BTreeMap<String, usize> = BTreeMap::new();
    for o in d.owners() {
        *regs.entry(o.registration.to_string()).or_default() += 1;
    }
    // Registrations as a tally (`parameter 3`): their names are not all nouns.
    let _ = writeln!(
        out,
        "tensors: {}, {} ({})",
        plural(d.tensors().len(), "view"),
        plural(d.owners().len(), "owner path"),
        regs.iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(
        out,
        "pools: {}",
        d.pools()
            .iter()
            .map(|p| escape(&p.name))
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
                "graphs: {}, {} held",
                m.graphs.len(),
                plural(touches, "address word")
            );
            for g in &m.graphs {
                let counts: Vec<String> = g
                    .node_counts
                    .iter()
                    .map(|(k, v)| node_count(*v, k))
                    .collect();
                let opaque = g.nodes.iter().filter(|n| n.opaque.is_some()).count();
                let _ = writeln!(
                    out,
                    "  {}: {}{}{}",
                    escape(&g.name),
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
                // Each unread node with the walk's reason: verify's headline sends the
                // reader here to see which nodes went unchecked and why.
                for u in &g.unread {
                    let _ = writeln!(
                        out,
                        "    unread node {} ({}): {}",
                        u.index,
                        escape(&u.node_type),
                        escape(&u.reason)
                    );
                }
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
    diff_text_fit(r, a, b, markdown, None)
}

/// [`diff_text`] with the table fitted to `width` columns (at least [`MIN_WIDTH`]; cells
/// wrap, nothing is cut), or in its fixed layout with `None`.
pub fn diff_text_fit(
    r: &DiffReport,
    a: &Path,
    b: &Path,
    markdown: bool,
    width: Option<u16>,
) -> String {
    use comfy_table::{ContentArrangement, Table, presets};
    let mut out = if r.same {
        format!(
            "same: {} compared, no difference\n",
            plural(r.compared, "owner path")
        )
    } else {
        format!(
            "{} between {} (A) and {} (B); {} in both\n",
            plural(
                r.differences.len() + r.graphs.len() + r.pools.len(),
                "difference"
            ),
            escape(&a.display().to_string()),
            escape(&b.display().to_string()),
            plural(r.compared, "owner path")
        )
    };
    // The heading names both documents, whose paths can be long: fitted, it wraps.
    if let Some(w) = width.filter(|_| !markdown) {
        let w = usize::from(w.max(MIN_WIDTH));
        out = wrap(out.trim_end(), w, w - 2).join("\n  ") + "\n";
    }
    let rows: Vec<[String; 4]> = r
        .graphs
        .iter()
        .map(|d| (format!("graph {}", d.path), d))
        .chain(r.pools.iter().map(|d| (format!("pool {}", d.path), d)))
        .chain(r.differences.iter().map(|d| (d.path.clone(), d)))
        .map(|(p, d)| {
            let side =
                |s: &Option<String>| s.as_deref().map_or("—".into(), |s| escape(s).into_owned());
            [
                escape(&p).into_owned(),
                serde_json::to_value(&d.change)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default(),
                side(&d.a),
                side(&d.b),
            ]
        })
        .collect();
    if rows.is_empty() {
        return out;
    }
    if markdown {
        out.push_str("\n| path | change | A | B |\n|---|---|---|---|\n");
        for r in rows {
            let cell = |s: &str| s.replace('|', "\\|");
            out.push_str(&format!(
                "| `{}` | {} | {} | {} |\n",
                cell(&r[0]),
                cell(&r[1]),
                cell(&r[2]),
                cell(&r[3])
            ));
        }
    } else {
        let mut t = Table::new();
        // The layout depends only on `width`, never on where stdout goes.
        t.force_no_tty()
            .load_style(presets::UTF8_FULL_CONDENSED)
            .set_header(["path", "change", "A", "B"]);
        match width {
            Some(w) => t
                .set_content_arrangement(ContentArrangement::Dynamic)
                .set_width(w.max(MIN_WIDTH)),
            None => t.set_content_arrangement(ContentArrangement::Disabled),
        };
        for r in rows {
            t.add_row(r);
        }
        out.push_str(&t.to_string());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::model::owner_path::OwnerPath;
    use crate::testkit::manifest;

    fn assert_printable(what: &str, text: &str) {
        for line in text.lines() {
            assert!(!line.chars().any(char::is_control), "{what}: {line:?}");
        }
    }

    /// The test manifest with control characters where documents carry free text.
    fn hostile() -> crate::model::format::Manifest {
        let mut m = manifest();
        m.owners[1].path = OwnerPath::parse("model.sc\rale\0x").unwrap();
        m.graphs[0].name = "bs1\u{1b}[31m".into();
        m.pools[0].name = "wei\rghts".into();
        m.producer.tool = "unit\u{9b}2J".into();
        m.graphs[0].node_counts.insert("kernel".into(), 13);
        m.graphs[0].node_counts.insert("memset".into(), 1);
        m.graphs[0].node_counts.insert("empty".into(), 2);
        m
    }

    #[test]
    fn summary_escapes_document_text_and_counts_with_the_right_noun() {
        // Guards: `show` printed graph, pool and tool names raw, and "13 kernel".
        let text = summary(&Document::Manifest(hostile()));
        assert_printable("summary", &text);
        assert!(text.contains("by unit\\u{9b}2J 0"), "{text}");
        assert!(
            text.contains("pools: wei\\rghts, kv_cache, graph"),
            "{text}"
        );
        assert!(
            text.contains("  bs1\\u{1b}[31m: 2 empty nodes, 13 kernels, 1 memset\n"),
            "{text}"
        );
        assert!(text.contains("  bs8: 1 kernel\n"), "{text}");
        assert!(text.contains("tensors: 3 views, 4 owner paths ("), "{text}");
    }

    #[test]
    fn diff_escapes_paths_and_names_and_counts_with_the_right_noun() {
        // Guards: `diff` printed owner paths and document names raw, and "1 difference(s)".
        let a = Document::Manifest(manifest());
        let b = Document::Manifest(hostile());
        let r = crate::check::diff::diff(&a, &b);
        for markdown in [false, true] {
            let text = diff_text(&r, Path::new("a\r.json"), Path::new("b.json"), markdown);
            assert_printable("diff", &text);
            assert!(text.contains("model.sc\\rale\\u{0}x"), "{text}");
            assert!(
                text.contains("between a\\r.json (A) and b.json (B)"),
                "{text}"
            );
            assert!(!text.contains("(s)"), "{text}");
        }
        let same = crate::check::diff::diff(&a, &a);
        let text = diff_text(&same, Path::new("a"), Path::new("a"), false);
        assert_eq!(text, "same: 4 owner paths compared, no difference\n");
    }

    #[test]
    fn fitted_diff_stays_within_the_width() {
        // Guards: the diff table, like the report's, fits the terminal when asked to.
        let mut b = manifest();
        for o in &mut b.owners {
            o.path = OwnerPath::parse(&format!(
                "{}.quant_method.kernel.a_rather_long_attribute_name_for_a_workspace",
                o.path
            ))
            .unwrap();
        }
        let r = crate::check::diff::diff(&Document::Manifest(manifest()), &Document::Manifest(b));
        let text = diff_text_fit(&r, Path::new("a"), Path::new("b"), false, Some(60));
        assert!(text.lines().all(|l| l.chars().count() <= 60), "{text}");
        let wide = diff_text(&r, Path::new("a"), Path::new("b"), false);
        assert!(wide.lines().any(|l| l.chars().count() > 60), "{wide}");
    }
}
