//! Rendering a verify report: a terminal table, Markdown for a CI step summary, or JSON.
//! Addresses go through a caller's formatter so normalized output can hide them; text from
//! documents goes through [`escape`] so it cannot drive the terminal.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use comfy_table::{ContentArrangement, Table, presets};
use rustc_hash::FxHashMap;

use crate::check::finding::{Finding, FindingKind, KernelRef, RankSummary, Report, Severity};
use crate::check::ranks::rank_list;
use crate::present::fmt::{AddrFmt, MIN_WIDTH, escape, shorten, wrap};

const MAX_KERNELS_SHOWN: usize = 3;
const MAX_NAME: usize = 96;
/// The shortest a kernel name is cut to when fitting a line to the terminal: enough to
/// tell `nvjet_sm90_tst_128x256…` from `void cutlass::device…`.
const MIN_NAME: usize = 24;
/// The width of a detail line's label column (`  drifted      `).
const LABEL: usize = 15;

/// `graph#node name (param P +O)`, the name cut to `max_name` characters.
fn kernel_line(k: &KernelRef, max_name: usize) -> String {
    format!(
        "{}#{} {} (param {} +{})",
        escape(&k.graph),
        k.node,
        shorten(&escape(&k.name), max_name),
        k.param,
        k.offset
    )
}

/// The longest a kernel name may be for `k`'s line to fit `room` characters, between
/// [`MIN_NAME`] and [`MAX_NAME`]; [`MAX_NAME`] when nothing is fitted.
fn name_room(k: &KernelRef, room: Option<usize>) -> usize {
    let Some(room) = room else {
        return MAX_NAME;
    };
    let rest = format!(
        "{}#{}  (param {} +{})",
        escape(&k.graph),
        k.node,
        k.param,
        k.offset
    );
    room.saturating_sub(rest.chars().count())
        .clamp(MIN_NAME, MAX_NAME)
}

fn kernels_cell(f: &Finding) -> String {
    let mut lines: Vec<String> = f
        .kernels
        .iter()
        .take(MAX_KERNELS_SHOWN)
        .map(|k| kernel_line(k, MAX_NAME))
        .collect();
    if f.kernels.len() > MAX_KERNELS_SHOWN {
        lines.push(format!("… {} more", f.kernels.len() - MAX_KERNELS_SHOWN));
    }
    lines.join("\n")
}

/// Whether a finding is about an address no owner explains (`unowned`, and `freed` or
/// `reused` of such an address): its subject is the address, and it names no owner.
fn ownerless(f: &Finding) -> bool {
    f.kind != FindingKind::UnusedAllow && f.owners.is_empty()
}

fn owner_cell(f: &Finding) -> String {
    match f.kind {
        FindingKind::UnusedAllow => format!("allow: {}", escape(&f.subject)),
        _ if ownerless(f) => "(no owner)".to_string(),
        _ => f
            .owners
            .iter()
            .map(|o| format!("{} ({})", escape(&o.path), o.registration))
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

fn tensor_cell(f: &Finding) -> String {
    let pool = f.pool.as_deref().map(escape);
    match (&f.dtype, &f.shape) {
        (Some(d), Some(s)) => {
            let dims: Vec<String> = s.iter().map(u64::to_string).collect();
            let mut c = format!("{}[{}]", escape(d), dims.join(", "));
            if let Some(p) = pool {
                c.push_str("\npool ");
                c.push_str(&p);
            }
            c
        }
        _ => pool.map(|p| format!("pool {p}")).unwrap_or_default(),
    }
}

fn address_cell(f: &Finding, fmt: &dyn AddrFmt) -> String {
    match (f.captured_addr, f.live_addr) {
        (Some(c), Some(l)) if c != l => format!("{} → {}", fmt.addr(c), fmt.addr(l)),
        (Some(c), _) => fmt.addr(c),
        _ => String::new(),
    }
}

fn graphs_cell(f: &Finding, sep: &str) -> String {
    f.graphs
        .iter()
        .map(|g| escape(g))
        .collect::<Vec<_>>()
        .join(sep)
}

/// `3 drifted, 1 freed`: counts by kind, in report order.
fn by_kind<'a>(findings: impl Iterator<Item = &'a Finding>) -> String {
    let mut counts: BTreeMap<FindingKind, usize> = BTreeMap::new();
    for f in findings {
        *counts.entry(f.kind).or_default() += 1;
    }
    counts
        .iter()
        .map(|(k, c)| format!("{c} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `1 graph`, `2 graphs`.
pub(crate) fn plural(n: usize, word: &str) -> String {
    format!("{n} {word}{}", if n == 1 { "" } else { "s" })
}

fn headline(r: &Report) -> String {
    let n = r.errors().count();
    let w = r.warnings().count();
    let mode = mode(r);
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
    let ranks = match r.world_size {
        Some(w) if multi(r) => format!("{} of world size {w}, ", plural(r.ranks.len(), "rank")),
        _ => String::new(),
    };
    let scope = format!(
        "{ranks}{}, {}",
        plural(r.graphs, "graph"),
        plural(r.subjects, "touched tensor")
    );
    if n == 0 {
        format!("graphcheck verify: ok — no findings in {scope} ({mode}){warnings}{unread}")
    } else {
        format!(
            "graphcheck verify: {} ({}) in {scope} ({mode}){warnings}{unread}",
            plural(n, "finding"),
            by_kind(r.errors()),
        )
    }
}

/// What the run could check: with several ranks, the ranks that had a live snapshot and
/// those that had only their manifest.
fn mode(r: &Report) -> String {
    const CAPTURE: &str = "capture-time checks only: no live snapshot";
    // Contents are compared where both sides have digests and contents were preserved, or
    // where the live snapshot carries reference digests (`stale` is then checked). It said
    // "no digests on both sides" also of an update whose sides both had digests.
    let both = if r.checked.contains(&FindingKind::Stale) {
        "capture and live checks"
    } else {
        "capture and live checks; contents not compared: an update without reference digests, or digests missing on a side"
    };
    if !multi(r) {
        return if r.checked.contains(&FindingKind::Drifted) {
            both
        } else {
            CAPTURE
        }
        .into();
    }
    let (live, alone): (Vec<_>, Vec<_>) = r.ranks.iter().partition(|s| s.live);
    let list = |v: &[&RankSummary]| rank_list(&v.iter().map(|s| s.rank).collect::<Vec<_>>());
    match (live.is_empty(), alone.is_empty()) {
        (_, true) => both.into(),
        (true, _) => CAPTURE.into(),
        _ => format!(
            "{both} on {}; capture-time only on {}, which had no live snapshot",
            list(&live),
            list(&alone)
        ),
    }
}

/// With several ranks, one line per rank and one for the ranks that had no manifest (empty
/// for one manifest); then the superseded graphs, where there are any. Findings about
/// several ranks are counted in the headline only.
fn rank_lines(r: &Report) -> Vec<String> {
    let mut out: Vec<String> = r
        .ranks
        .iter()
        .map(|s| {
            let n: usize = s.summary.values().sum();
            let counts = s
                .summary
                .iter()
                .map(|(k, c)| format!("{c} {k}"))
                .collect::<Vec<_>>()
                .join(", ");
            let verdict = match (n, s.ok) {
                (0, _) => "ok".to_string(),
                (_, true) => format!("ok — {} ({counts})", plural(n, "warning")),
                _ => format!("{} ({counts})", plural(n, "finding")),
            };
            format!(
                "rank {}: {verdict} in {}, {}{}",
                s.rank,
                plural(s.graphs, "graph"),
                plural(s.subjects, "touched tensor"),
                if s.live { "" } else { " (no live snapshot)" }
            )
        })
        .collect();
    if let (false, Some(w)) = (r.missing_ranks.is_empty(), r.world_size) {
        out.push(format!(
            "warning: no manifest for {} of world size {w}: not verified",
            rank_list(&r.missing_ranks)
        ));
    }
    if !r.superseded.is_empty() {
        out.push(format!(
            "superseded, left out: {} (torch's CUDA-graph trees record a new graph instead: a static input they guard is held at another address now)",
            r.superseded.join(", ")
        ));
    }
    out
}

/// The kind as a report shows it: `unused_allow (warning)` where it does not fail the run.
fn kind_label(f: &Finding) -> String {
    match f.severity {
        Severity::Warning => format!("{} (warning)", f.kind),
        _ => f.kind.to_string(),
    }
}

/// Lines of text, each cut to the width when there is one: continuation lines take
/// `indent`, and nothing is dropped (see [`wrap`]).
struct Lines<'a> {
    out: &'a mut String,
    width: Option<usize>,
}

impl Lines<'_> {
    /// `first` then `text` on one line, or wrapped onto lines that start with `indent`
    /// (as wide as `first`, for a column of text beside a label).
    fn push(&mut self, first: &str, indent: &str, text: &str) {
        let (lead, rest) = (first.chars().count(), indent.chars().count());
        match self.width {
            Some(w) if lead + text.chars().count() > w => {
                let pieces = wrap(text, w.saturating_sub(lead), w.saturating_sub(rest));
                for (i, piece) in pieces.iter().enumerate() {
                    self.out.push_str(if i == 0 { first } else { indent });
                    self.out.push_str(piece);
                    self.out.push('\n');
                }
            }
            _ => {
                self.out.push_str(first);
                self.out.push_str(text);
                self.out.push('\n');
            }
        }
    }

    /// A detail line: `  label        text`.
    fn detail(&mut self, label: &str, text: &str) {
        // A label as wide as the column (`rank_mismatch`) still gets a space after it.
        let first = match label.chars().count() {
            n if n >= LABEL - 2 => format!("  {label} "),
            _ => format!("  {label:<13}"),
        };
        self.push(&first, &" ".repeat(LABEL.max(first.chars().count())), text);
    }
}

const HEADER: [&str; 5] = ["kind", "owner", "tensor", "address", "graphs"];
/// The columns a table spends on borders and padding: `│ ` and ` ┆ ` between columns, ` │`.
fn frame(columns: usize) -> usize {
    3 * columns + 1
}
/// The least room the owner column needs beside the four others before the fitted table
/// folds tensor, address and graphs into one column.
const MIN_OWNER: usize = 40;

/// Whether the report covers several ranks (`verify DIR`): its findings then show a rank.
fn multi(r: &Report) -> bool {
    !r.ranks.is_empty()
}

/// A finding's rank as a report of several ranks shows it: `all` for a finding about
/// several ranks (`rank_mismatch`, `unused_allow`).
fn rank_cell(f: &Finding) -> String {
    f.rank.map_or("all".into(), |r| r.to_string())
}

/// The findings table. Without a width, or where its natural layout fits, every column is
/// as wide as its content. Where it does not fit, comfy-table's dynamic arrangement wraps
/// the cells to the width; where even that would leave the owner column less than
/// [`MIN_OWNER`] columns (80 columns do: five columns of borders and the fixed-width ones
/// leave about 15), tensor, address and graphs share one column, so owner paths wrap into
/// a few long lines instead of many short ones. A report of several ranks has a `rank`
/// column first.
fn findings_table(r: &Report, fmt: &dyn AddrFmt, width: Option<usize>) -> String {
    // The columns before the owner's: `rank` where there are several ranks, then `kind`.
    let lead = if multi(r) { 2 } else { 1 };
    let mut header: Vec<&str> = HEADER.to_vec();
    if multi(r) {
        header.insert(0, "rank");
    }
    let rows: Vec<Vec<String>> = r
        .findings
        .iter()
        .map(|f| {
            let mut row = vec![
                kind_label(f),
                owner_cell(f),
                tensor_cell(f),
                address_cell(f, fmt),
                graphs_cell(f, "\n"),
            ];
            if multi(r) {
                row.insert(0, rank_cell(f));
            }
            row
        })
        .collect();
    let mut t = Table::new();
    // The layout depends only on `width`, never on where stdout goes.
    t.force_no_tty().load_style(presets::UTF8_FULL_CONDENSED);
    let natural = column_widths(&header, &rows);
    let w = match width {
        Some(w) if natural.iter().sum::<usize>() + frame(header.len()) > w => w,
        _ => {
            t.set_content_arrangement(ContentArrangement::Disabled)
                .set_header(header)
                .add_rows(rows);
            return t.to_string();
        }
    };
    t.set_content_arrangement(ContentArrangement::Dynamic)
        .set_width(w as u16);
    let beside_owner = natural.iter().sum::<usize>() - natural[lead] + frame(header.len());
    if w.saturating_sub(beside_owner) >= MIN_OWNER {
        t.set_header(header).add_rows(rows);
    } else {
        // The header names the shared column's lines in the order they come.
        let mut folded = header[..=lead].to_vec();
        folded.push("tensor\naddress\ngraphs");
        t.set_header(folded);
        for mut row in rows {
            let mut rest = row.split_off(lead + 1);
            // `0x… → 0x…` as two lines keeps the shared column about as narrow as an address.
            rest[1] = rest[1].replace(" → ", " →\n");
            let place: Vec<String> = rest.into_iter().filter(|c| !c.is_empty()).collect();
            row.push(place.join("\n"));
            t.add_row(row);
        }
    }
    t.to_string()
}

/// The widest line of each column, header included.
fn column_widths(header: &[&str], rows: &[Vec<String>]) -> Vec<usize> {
    let widest = |s: &str| s.lines().map(|l| l.chars().count()).max().unwrap_or(0);
    let mut w: Vec<usize> = header.iter().map(|h| widest(h)).collect();
    for row in rows {
        for (w, cell) in w.iter_mut().zip(row) {
            *w = (*w).max(widest(cell));
        }
    }
    w
}

/// `items` grouped by `key`: the groups in the order of their first items, each in the
/// items' order. One pass, one `key` call an item: a report can hold tens of thousands of
/// findings (a scan of them all for each subject took 18 s at 40,000).
fn group_in_order<'a, T, K: std::hash::Hash + Eq>(
    items: &'a [T],
    mut key: impl FnMut(&'a T) -> K,
) -> Vec<Vec<&'a T>> {
    let mut order: FxHashMap<K, usize> = FxHashMap::default();
    let mut groups: Vec<Vec<&T>> = Vec::new();
    for item in items {
        let g = *order.entry(key(item)).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(item);
    }
    groups
}

/// The terminal report in its fixed layout: a headline, one table row per finding, then
/// per subject what was seen and which node parameters hold it, the recapture set and the
/// allowed findings. Use [`render_table_fit`] to fit a terminal.
pub fn render_table(r: &Report, fmt: &dyn AddrFmt) -> String {
    render_table_fit(r, fmt, None)
}

/// The terminal report fitted to `width` columns (at least [`MIN_WIDTH`]): the table's
/// columns wrap their cells, and every other line wraps with an indent, so every owner
/// path, detail and reason is shown in full; only kernel names, already cut in the fixed
/// layout, are cut shorter to fit their line. `None` gives the fixed layout, where lines
/// are as long as their content (for logs, files and snapshots).
pub fn render_table_fit(r: &Report, fmt: &dyn AddrFmt, width: Option<u16>) -> String {
    let width = width.map(|w| usize::from(w.max(MIN_WIDTH)));
    let mut out = String::new();
    let mut lines = Lines {
        out: &mut out,
        width,
    };
    lines.push("", "  ", &headline(r));
    for l in rank_lines(r) {
        lines.push("  ", "    ", &l);
    }
    if !r.findings.is_empty() {
        lines.out.push_str(&findings_table(r, fmt, width));
        lines.out.push('\n');

        // Details, one block per subject, in table order.
        let groups = group_in_order(&r.findings, |f| (f.rank, f.subject.as_str()));
        let kernel_room = width.map(|w| w.saturating_sub(LABEL));
        for fs in &groups {
            let first = fs[0];
            let subject = escape(&first.subject);
            lines.out.push('\n');
            let head = match first.kind {
                FindingKind::UnusedAllow => format!(
                    "allow entry `{subject}`{}",
                    match first.severity {
                        Severity::Warning =>
                            " (warning: does not fail the run; --deny-unused-allow makes it fail)",
                        _ => "",
                    }
                ),
                _ if ownerless(first) => format!(
                    "unowned {}",
                    first
                        .captured_addr
                        .map_or(subject.to_string(), |a| fmt.addr(a))
                ),
                _ => subject.into_owned(),
            };
            let head = match first.rank {
                Some(rank) if multi(r) => format!("rank {rank}: {head}"),
                _ => head,
            };
            lines.push("", "    ", &head);
            for f in fs {
                lines.detail(f.kind.as_str(), &escape(&f.detail));
                if !f.new_owners.is_empty() && f.kind == FindingKind::Reused {
                    let now = f
                        .new_owners
                        .iter()
                        .map(|o| escape(o))
                        .collect::<Vec<_>>()
                        .join(", ");
                    lines.detail("now owned by", &now);
                }
            }
            if let Some(site) = first.alloc_site.first() {
                let at = format!(
                    "{}:{} in {}",
                    escape(&site.filename),
                    site.line,
                    escape(&site.name)
                );
                lines.detail("allocated at", &at);
            }
            for (i, k) in first.kernels.iter().enumerate() {
                if i == MAX_KERNELS_SHOWN {
                    let more = format!("… {} more", first.kernels.len() - i);
                    lines.detail("", &more);
                    break;
                }
                let line = kernel_line(k, name_room(k, kernel_room));
                lines.detail(if i == 0 { "held by" } else { "" }, &line);
            }
        }
        let rc = r.recapture();
        if !rc.is_empty() {
            let rc: Vec<_> = rc.iter().map(|g| escape(g)).collect();
            lines.out.push('\n');
            lines.push("recapture: ", "  ", &rc.join(", "));
        }
        if !r.retarget.is_empty() {
            let rt: Vec<_> = r.retarget.iter().map(|g| escape(g)).collect();
            lines.push(
                "retarget instead: ",
                "  ",
                &format!("{} (`graphcheck retarget` plans the edits)", rt.join(", ")),
            );
        }
    }
    if !r.allowed.is_empty() {
        let _ = write!(lines.out, "\nallowed ({}):\n", r.allowed.len());
        for a in &r.allowed {
            let line = format!(
                "{}{} {} — by `{}`: {}",
                a.finding
                    .rank
                    .map_or(String::new(), |r| format!("rank {r}: ")),
                a.finding.kind,
                escape(&a.finding.subject),
                escape(&a.allowed_by),
                escape(&a.reason)
            );
            lines.push("  ", "    ", &line);
        }
    }
    out
}

/// A Markdown table cell: no raw control character, pipe or line break.
fn md_escape(s: &str) -> String {
    escape(s).replace('|', "\\|")
}

/// Markdown for a CI step summary (`$GITHUB_STEP_SUMMARY`).
pub fn render_markdown(r: &Report, fmt: &dyn AddrFmt) -> String {
    let mut out = String::new();
    let warn = r.warnings().next().is_some() || r.unread_nodes > 0 || !r.missing_ranks.is_empty();
    let icon = match (r.ok, warn) {
        (false, _) => "❌",
        (true, true) => "⚠️",
        (true, false) => "✅",
    };
    let _ = write!(out, "### {icon} {}\n\n", headline(r));
    let per_rank = rank_lines(r);
    for l in &per_rank {
        let _ = writeln!(out, "- {}", md_escape(l));
    }
    if !per_rank.is_empty() {
        out.push('\n');
    }
    if !r.findings.is_empty() {
        let (rank_head, rank_rule) = if multi(r) {
            ("| rank ", "|---")
        } else {
            ("", "")
        };
        let _ = writeln!(
            out,
            "{rank_head}| kind | owner | tensor | address | graphs | kernels | why |"
        );
        let _ = writeln!(out, "{rank_rule}|---|---|---|---|---|---|---|");
        for f in &r.findings {
            if multi(r) {
                let _ = write!(out, "| {} ", rank_cell(f));
            }
            let owner = match f.kind {
                FindingKind::UnusedAllow => format!("allow `{}`", md_escape(&f.subject)),
                _ if ownerless(f) => "(no owner)".into(),
                _ => f
                    .owners
                    .iter()
                    .map(|o| format!("`{}` ({})", md_escape(&o.path), o.registration))
                    .collect::<Vec<_>>()
                    .join("<br>"),
            };
            // The cells built here are escaped already: split on their own line breaks.
            let _ = writeln!(
                out,
                "| **{}**{} | {} | {} | {} | {} | {} | {} |",
                f.kind,
                if f.severity == Severity::Warning {
                    " (warning)"
                } else {
                    ""
                },
                owner,
                tensor_cell(f).replace('|', "\\|").replace('\n', "<br>"),
                md_escape(&address_cell(f, fmt)),
                graphs_cell(f, ", ").replace('|', "\\|"),
                kernels_cell(f).replace('|', "\\|").replace('\n', "<br>"),
                md_escape(&f.detail)
            );
        }
        let rc = r.recapture();
        if !rc.is_empty() {
            let _ = writeln!(
                out,
                "\n**Recapture:** {}",
                rc.iter()
                    .map(|g| format!("`{}`", escape(g)))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        if !r.retarget.is_empty() {
            let _ = writeln!(
                out,
                "\n**Retarget instead:** {} (`graphcheck retarget` plans the edits)",
                r.retarget
                    .iter()
                    .map(|g| format!("`{}`", escape(g)))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    if !r.allowed.is_empty() {
        let _ = write!(
            out,
            "\n<details><summary>Allowed ({})</summary>\n\n",
            r.allowed.len()
        );
        for a in &r.allowed {
            let _ = writeln!(
                out,
                "- {}{} `{}` — by `{}`: {}",
                a.finding
                    .rank
                    .map_or(String::new(), |r| format!("rank {r}: ")),
                a.finding.kind,
                escape(&a.finding.subject),
                escape(&a.allowed_by),
                md_escape(&a.reason)
            );
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

#[cfg(test)]
mod tests;
