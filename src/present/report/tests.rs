//! Tests of the report's renderings: table, Markdown and JSON.

use std::path::{Path, PathBuf};

use super::*;
use crate::check::allow::Allowlist;
use crate::check::finding::OwnerRef;
use crate::model::format::{Addr, Registration};
use crate::present::fmt::RawAddrs;

/// Every scenario of the synthetic and the GPU-recorded corpus, verified as the CLI
/// verifies it: real owner paths, aliases, CUTLASS and cuBLAS kernel names.
fn corpus_reports() -> Vec<(String, Report)> {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let mut out = Vec::new();
    for index in ["index.json", "gpu/index.json"] {
        let text = std::fs::read_to_string(fixtures.join(index)).unwrap();
        let index: serde_json::Value = serde_json::from_str(&text).unwrap();
        for s in index["scenarios"].as_array().unwrap() {
            let path = |key: &str| s[key].as_str().map(|p| fixtures.join(p));
            let m = crate::codec::load::load_manifest(&path("manifest").unwrap()).unwrap();
            let l = path("live").map(|p| crate::codec::load::load_live(&p).unwrap());
            let allow = path("allow").map_or_else(Allowlist::default, |p| {
                Allowlist::load(Path::new(&p)).unwrap()
            });
            let r = crate::check::verify::verify(&m, l.as_ref(), &allow).unwrap();
            out.push((s["name"].as_str().unwrap().to_string(), r));
        }
    }
    out
}

/// `text` without any whitespace: wrapped text compares equal to the line it came from.
fn squeeze(text: &str) -> String {
    text.chars().filter(|c| !c.is_whitespace()).collect()
}

#[test]
fn fitted_table_stays_within_80_columns_and_keeps_every_subject_and_detail() {
    // Guards: at 80 columns no line is wider than the terminal, and the details below
    // the table still carry every subject, detail sentence and allowlist reason in full.
    let reports = corpus_reports();
    assert!(reports.len() >= 12, "{} scenarios", reports.len());
    let mut seen = 0;
    for (name, r) in &reports {
        for width in [80u16, 60] {
            let text = render_table_fit(r, &RawAddrs, Some(width));
            for line in text.lines() {
                assert!(
                    line.chars().count() <= usize::from(width),
                    "{name} at {width}: {} columns: {line}\n{text}",
                    line.chars().count()
                );
            }
            // The details start after the table's last border line.
            let details = squeeze(text.rsplit_once('┘').map_or(text.as_str(), |(_, d)| d));
            for f in &r.findings {
                assert!(
                    details.contains(&squeeze(&f.subject)),
                    "{name}: {}",
                    f.subject
                );
                assert!(
                    details.contains(&squeeze(&f.detail)),
                    "{name}: {}",
                    f.detail
                );
                for o in &f.owners {
                    assert!(details.contains(&squeeze(&o.path)), "{name}: {}", o.path);
                }
                seen += 1;
            }
            for a in &r.allowed {
                assert!(
                    details.contains(&squeeze(&a.reason)),
                    "{name}: {}",
                    a.reason
                );
            }
        }
    }
    assert!(seen > 50, "only {seen} findings in the corpus");
}

#[test]
fn without_a_width_the_layout_is_the_fixed_one() {
    // Guards: logs, files and snapshots (no terminal) keep today's layout, line for line.
    for (name, r) in corpus_reports() {
        assert_eq!(
            render_table(&r, &RawAddrs),
            render_table_fit(&r, &RawAddrs, None),
            "{name}"
        );
    }
}

#[test]
fn a_narrow_terminal_is_treated_as_the_narrowest_supported_width() {
    // Guards: a 10-column COLUMNS cannot ask comfy-table for a table it cannot draw.
    let (_, r) = corpus_reports()
        .into_iter()
        .find(|(n, _)| n == "cutlass_moe_strides_alias")
        .expect("the alias scenario");
    let text = render_table_fit(&r, &RawAddrs, Some(10));
    assert!(
        text.lines()
            .all(|l| l.chars().count() <= usize::from(MIN_WIDTH)),
        "{text}"
    );
}

/// No character that could move the cursor or start an escape sequence, line breaks
/// aside.
fn assert_printable(what: &str, text: &str) {
    for line in text.lines() {
        assert!(!line.chars().any(char::is_control), "{what}: {line:?}");
    }
}

#[test]
fn control_characters_from_documents_are_escaped_in_every_text_format() {
    // Guards: an owner path, graph name or kernel name holding `\r`, NUL or an ANSI
    // escape is printed escaped (`\r`, `\u{0}`, `\u{1b}`), never raw, in the table (fixed
    // and fitted) and in Markdown.
    let mut m = crate::testkit::manifest();
    m.owners[1].path = crate::model::owner_path::OwnerPath::parse("model.sc\rale\0x").unwrap();
    m.owners[2].path =
        crate::model::owner_path::OwnerPath::parse("model.cache[\"\u{1b}[2Jk\"]").unwrap();
    m.graphs[1].name = "bs8\r".into();
    m.graphs[1].nodes[0].name = "k\u{9b}0".into();
    let r = crate::check::verify::verify(&m, None, &Allowlist::default()).unwrap();
    assert!(
        r.findings.iter().any(|f| f.subject.contains('\r')),
        "the test needs a finding on the path with control characters: {:?}",
        crate::testkit::kinds(&r)
    );
    for (what, text) in [
        ("table", render_table(&r, &RawAddrs)),
        ("fitted table", render_table_fit(&r, &RawAddrs, Some(80))),
        ("markdown", render_markdown(&r, &RawAddrs)),
    ] {
        assert_printable(what, &text);
        assert!(text.contains("model.sc\\rale\\u{0}x"), "{what}:\n{text}");
        assert!(
            text.contains("model.cache[\"\\u{1b}[2Jk\"]"),
            "{what}:\n{text}"
        );
        assert!(text.contains("bs8\\r"), "{what}:\n{text}");
    }
    // JSON keeps the text as it is: serde escapes it and a reader gets it back.
    let json: serde_json::Value = serde_json::from_str(&render_json(&r)).unwrap();
    assert!(json.to_string().contains("model.sc\\rale\\u0000x"));
}

#[test]
fn headline_counts_agree_with_their_nouns() {
    // Guards: "in 1 graphs", "1 touched tensors" and the nested "(… (no live snapshot))".
    let mut r = many(1);
    r.subjects = 1;
    let head = headline(&r);
    assert_eq!(
        head,
        "graphcheck verify: 1 finding (1 unregistered) in 1 graph, 1 touched tensor \
         (capture-time checks only: no live snapshot)"
    );
    r.findings.clear();
    r.graphs = 2;
    r.subjects = 0;
    assert!(headline(&r).contains("no findings in 2 graphs, 0 touched tensors"));
}

/// A report of `n` findings with distinct subjects, shaped like the benchmark's.
fn many(n: usize) -> Report {
    let findings = (0..n)
        .map(|i| Finding {
            kind: FindingKind::Unregistered,
            severity: Severity::Error,
            rank: None,
            subject: format!(
                "model.layers[{}].mlp.experts[{i}].quant_method.workspace",
                i / 64
            ),
            owners: vec![OwnerRef {
                path: format!(
                    "model.layers[{}].mlp.experts[{i}].quant_method.workspace",
                    i / 64
                ),
                registration: Registration::ObjectAttribute,
            }],
            new_owners: vec![],
            dtype: Some("bfloat16".into()),
            shape: Some(vec![128]),
            stride: Some(vec![1]),
            captured_addr: Some(Addr(0x7f00_0000_0000 + 0x1000 * i as u64)),
            live_addr: None,
            pool: Some("weights".into()),
            graphs: vec!["decode_bs1".into()],
            kernels: vec![KernelRef {
                graph: "decode_bs1".into(),
                node: i as u32,
                name: "fused_moe_kernel".into(),
                param: 0,
                offset: 0,
                addr: Addr(0x7f00_0000_0000 + 0x1000 * i as u64),
            }],
            detail: "held only as object_attribute; register it as a buffer".into(),
            alloc_site: vec![],
            retarget: None,
        })
        .collect();
    Report {
        format_version: 1,
        ok: false,
        checked: vec![FindingKind::Unregistered],
        summary: BTreeMap::from([(FindingKind::Unregistered, n)]),
        findings,
        allowed: vec![],
        subjects: n,
        graphs: 1,
        unread_nodes: 0,
        world_size: None,
        ranks: vec![],
        missing_ranks: vec![],
        superseded: vec![],
        retarget: vec![],
    }
}

#[test]
fn details_are_grouped_in_one_pass_in_table_order() {
    // Guards: the table grouped its details per subject by scanning every finding for
    // every subject (40,000 findings took 18 s). Counted, not timed: one key an item. How
    // long rendering takes per finding, at 1,000 to 40,000 findings, is
    // benches/render_bench.py's to measure (a wall-clock ratio in a debug test on a
    // loaded machine is either loose or flaky).
    let items: Vec<(usize, &str)> = ["a", "b", "a", "c", "b", "a"]
        .into_iter()
        .enumerate()
        .collect();
    let mut keys = 0;
    let groups = group_in_order(&items, |&(_, s)| {
        keys += 1;
        s
    });
    assert_eq!(keys, items.len(), "key calls for {} items", items.len());
    let positions: Vec<Vec<usize>> = groups
        .iter()
        .map(|g| g.iter().map(|(i, _)| *i).collect())
        .collect();
    assert_eq!(positions, [vec![0, 2, 5], vec![1, 4], vec![3]]);

    // The table's details: one block a subject, in table order, each finding's detail in
    // its subject's block (two findings share each subject here).
    let mut r = many(400);
    for (i, f) in r.findings.iter_mut().enumerate() {
        f.subject = format!("model.layers[{}].w", i % 200);
        f.detail = format!("detail {i}");
    }
    let table = render_table(&r, &RawAddrs);
    let details = &table[table
        .find("\nmodel.layers[0].w\n")
        .expect("the first block")..];
    let heads: Vec<&str> = details
        .lines()
        .filter(|l| l.starts_with("model.layers["))
        .collect();
    let want: Vec<String> = (0..200).map(|i| format!("model.layers[{i}].w")).collect();
    assert_eq!(heads, want);
    for (i, head) in want.iter().enumerate() {
        let block = &details[details.find(&format!("\n{head}\n")).unwrap()..];
        let block = &block[..block[1..]
            .find("\nmodel.layers[")
            .map_or(block.len(), |e| e + 1)];
        assert!(
            block.contains(&format!("detail {i}\n"))
                && block.contains(&format!("detail {}\n", i + 200)),
            "{block}"
        );
    }
}
