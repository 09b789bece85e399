//! Tests of the retarget plan and of applying it on the host stand-in.

use super::apply::{HostGraph, Outcome, apply_graph, probed_for, retargeted_manifest};
use super::*;
use crate::check::allow::Allowlist;
use crate::check::finding::FindingKind;
use crate::check::verify::verify;
use crate::model::format::{
    AllocState, Contents, Live, Manifest, NodeKind, Registration, TensorId, Touch,
};
use crate::testkit::*;

/// `model.w` (slot 0), read by bs1 at its start and 0x20 bytes in, is rebound by the
/// reload to a new tensor of its layout in slot 5; its old block is free.
fn moved_w() -> (Manifest, Live) {
    let mut m = manifest();
    // Each word of a node at its own parameter and offset, as a walk reads them.
    m.graphs[0].nodes[0].touches[1].param = 2;
    let mut inner = touch(Some(0), 0, 0x20);
    inner.param = 1;
    m.graphs[0].nodes[0].touches.push(inner);
    let mut l = live(&m, Contents::Updated);
    l.allocations.push(alloc(5, W));
    let mut new = tensor(0, 5, W);
    new.id = TensorId(10);
    l.tensors.push(new);
    l.owners[0].tensor = TensorId(10);
    for p in l.probes.iter_mut().filter(|p| p.addr == Addr(BASE)) {
        p.state = AllocState::Free;
    }
    (m, l)
}

/// The manifest after applying, verified against `l` probed for its new addresses: no
/// live finding is left. Returns the probed snapshot and the report.
fn verified_after(l: &Live, after: &Manifest) -> (Live, crate::check::finding::Report) {
    let probed = probed_for(l, after);
    let r = verify(after, Some(&probed), &Allowlist::default()).unwrap();
    let live_kinds: Vec<_> = r
        .findings
        .iter()
        .filter(|f| !FindingKind::CAPTURE_TIME.contains(&f.kind))
        .map(|f| (f.kind, f.subject.clone()))
        .collect();
    assert_eq!(live_kinds, vec![], "{:?}", r.findings);
    (probed, r)
}

fn plan_of(m: &Manifest, l: &Live) -> Plan {
    let r = verify(m, Some(l), &Allowlist::default()).unwrap();
    plan(m, l, &r).unwrap()
}

fn refusal_words(p: &Plan, graph: &str) -> String {
    p.graph(graph)
        .unwrap()
        .refusals
        .iter()
        .map(|r| format!("{}: {}", r.kind, r.why))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_moved_owner_is_followed_word_by_word_interior_pointers_included() {
    let (m, l) = moved_w();
    let p = plan_of(&m, &l);
    assert!(p.ok);
    assert_eq!(p.retarget, ["bs1"]);
    let g = p.graph("bs1").unwrap();
    assert_eq!(g.action, Action::Retarget);
    let words: Vec<(u32, u32, u32, Addr, Addr)> = g
        .edits
        .iter()
        .map(|e| (e.node, e.param, e.offset, e.old, e.new))
        .collect();
    let new = BASE + 5 * 0x1000;
    assert_eq!(
        words,
        [
            (0, 0, 8, Addr(BASE), Addr(new)),
            (0, 1, 8, Addr(BASE + 0x20), Addr(new + 0x20)),
        ]
    );
    // bs8 does not read model.w: nothing to change there.
    assert_eq!(p.graph("bs8").unwrap().action, Action::Keep);
    // Without the move nothing is planned.
    let same = live(&m, Contents::Preserved);
    assert_eq!(plan_of(&m, &same).edits, 0);
}

#[test]
fn every_edit_or_none_a_failed_kth_write_leaves_the_graph_as_it_was() {
    let (m, l) = moved_w();
    let p = plan_of(&m, &l);
    let g = p.graph("bs1").unwrap();
    let before = HostGraph::of(&m, "bs1");
    assert!(g.edits.len() >= 2);
    for k in 0..g.edits.len() {
        let mut h = before.clone();
        h.fail_write = Some(k);
        match apply_graph(&mut h, g) {
            Outcome::Refused { why, restored } => {
                assert!(restored, "edit {k}: {why}");
                assert!(why.contains(&format!("edit {} of", k + 1)), "{why}");
            }
            other => panic!("edit {k} failed yet: {other:?}"),
        }
        assert_eq!(
            h.words, before.words,
            "a failure at edit {k} left words changed"
        );
    }
    // An undo that fails too says the graph must not be replayed.
    let mut h = before.clone();
    (h.fail_write, h.fail_undo) = (Some(1), true);
    match apply_graph(&mut h, g) {
        Outcome::Refused { why, restored } => {
            assert!(!restored);
            assert!(why.contains("must not be replayed"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    // No failure: every word is the new one.
    let mut h = before.clone();
    assert_eq!(
        apply_graph(&mut h, g),
        Outcome::Applied {
            edits: g.edits.len()
        }
    );
    for e in &g.edits {
        assert_eq!(h.words[&(e.node, e.param, e.offset)], e.new.0);
    }
}

#[test]
fn a_graph_that_changed_since_its_manifest_is_refused_untouched() {
    let (m, l) = moved_w();
    let p = plan_of(&m, &l);
    let g = p.graph("bs1").unwrap();
    let mut h = HostGraph::of(&m, "bs1");
    let e = &g.edits[1];
    h.words.insert((e.node, e.param, e.offset), 0x1234);
    let before = h.words.clone();
    match apply_graph(&mut h, g) {
        Outcome::Refused {
            why,
            restored: true,
        } => assert!(why.contains("changed since"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!((h.words, h.writes), (before, 0));
}

#[test]
fn the_manifest_after_applying_verifies_clean_against_the_live_state() {
    let (m, l) = moved_w();
    let p = plan_of(&m, &l);
    let after = retargeted_manifest(&m, &l, &p, &["bs1".to_string()]);
    crate::index::refs::check_manifest(&after).expect("the new manifest is consistent");
    // The patched graph notes the retarget; the other does not; both formats keep it.
    assert_eq!(after.graphs[0].retargets.len(), 1);
    assert_eq!(after.graphs[0].retargets[0].edits, 2);
    assert!(after.graphs[1].retargets.is_empty());
    for v in [1, 2] {
        let text = serde_json::to_vec(&after.clone().in_version(v)).unwrap();
        let back =
            crate::codec::load::parse_manifest(&text, std::path::Path::new("m.json")).unwrap();
        assert_eq!(
            back.graphs[0].retargets, after.graphs[0].retargets,
            "format {v}"
        );
    }
    let (probed, r) = verified_after(&l, &after);
    // And nothing is left to retarget.
    assert_eq!(plan(&after, &probed, &r).unwrap().edits, 0);
    // Before applying, the same check finds the drift.
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    assert!(r.findings.iter().any(|f| f.kind == FindingKind::Drifted));
}

/// `model.ys[0..3]` (slots 5..7), read by bs1, all replaced by a reload: `ys[0]`'s new
/// tensor in slot 9, each later one in its predecessor's freed block; slot 7 is free.
/// Both documents name one producer session and number every storage.
fn rebind_chain() -> (Manifest, Live) {
    let mut m = manifest();
    m.producer.session = Some("recorder-1".into());
    for i in 0..3u32 {
        let slot = 5 + u64::from(i);
        m.allocations.push(alloc(slot, W));
        m.tensors.push(tensor(5 + i, slot, W));
        m.owners.push(owner(
            &format!("model.ys[{i}]"),
            5 + i,
            Registration::Container,
        ));
        // Each at a word of its own, as a walk reads them.
        let mut k = touch(Some(5 + i), slot, 0);
        k.param = 10 + i;
        m.graphs[0].nodes[0].touches.push(k);
    }
    for t in &mut m.tensors {
        t.storage = Some(t.id.0);
    }
    let mut l = live(&m, Contents::Updated);
    l.producer.session = m.producer.session.clone();
    l.allocations.push(alloc(9, W));
    l.tensors.retain(|t| !(5..8).contains(&t.id.0));
    for i in 0..3u32 {
        let mut t = tensor(100 + i, if i == 0 { 9 } else { 4 + u64::from(i) }, W);
        t.storage = Some(100 + i);
        l.tensors.push(t);
        l.owners
            .iter_mut()
            .find(|o| o.path.as_str() == format!("model.ys[{i}]"))
            .unwrap()
            .tensor = TensorId(100 + i);
    }
    for p in l
        .probes
        .iter_mut()
        .filter(|p| p.addr == Addr(BASE + 7 * 0x1000))
    {
        p.state = AllocState::Free;
    }
    (m, l)
}

#[test]
fn a_rebind_chain_is_followed_link_by_link_and_verifies_clean_after() {
    let (m, l) = rebind_chain();
    let p = plan_of(&m, &l);
    let g = p.graph("bs1").unwrap();
    assert_eq!(g.action, Action::Retarget, "{}", refusal_words(&p, "bs1"));
    let moves: Vec<(Addr, Addr)> = g
        .edits
        .iter()
        .filter(|e| e.subject.starts_with("model.ys"))
        .map(|e| (e.old, e.new))
        .collect();
    let slot = |s: u64| Addr(BASE + s * 0x1000);
    assert_eq!(
        moves,
        vec![(slot(5), slot(9)), (slot(6), slot(5)), (slot(7), slot(6))]
    );
    let after = retargeted_manifest(&m, &l, &p, &["bs1".to_string()]);
    crate::index::refs::check_manifest(&after).expect("the new manifest is consistent");
    verified_after(&l, &after);
}

/// `model.w` and `model.w2` are one tensor; `move_both` rebinds both to one new tensor,
/// else only `model.w` moves.
fn alias(move_both: bool, apart: bool) -> Plan {
    let mut m = manifest();
    m.owners.push(owner("model.w2", 0, Registration::Parameter));
    let mut l = live(&m, Contents::Updated);
    l.allocations.extend([alloc(5, W), alloc(6, W)]);
    for (id, slot) in [(10, 5), (11, 6)] {
        let mut t = tensor(0, slot, W);
        t.id = TensorId(id);
        l.tensors.push(t);
    }
    for o in l.owners.iter_mut() {
        if o.path == "model.w" || (move_both && o.path == "model.w2") {
            o.tensor = TensorId(if apart && o.path == "model.w2" {
                11
            } else {
                10
            });
        }
    }
    plan_of(&m, &l)
}

#[test]
fn an_alias_pair_moves_together_or_is_refused() {
    let together = alias(true, false);
    assert_eq!(together.retarget, ["bs1"], "{together:?}");
    let split = alias(false, false);
    assert_eq!(split.recapture, ["bs1"]);
    assert!(
        refusal_words(&split, "bs1").contains("alias split"),
        "{}",
        refusal_words(&split, "bs1")
    );
    let apart = alias(true, true);
    assert_eq!(apart.recapture, ["bs1"]);
    assert!(refusal_words(&apart, "bs1").contains("different places"));
}

#[test]
fn another_layout_at_the_new_address_is_refused() {
    let (m, mut l) = moved_w();
    let t = l.tensors.iter_mut().find(|t| t.id == TensorId(10)).unwrap();
    (t.shape, t.stride) = (vec![64, 2], vec![2, 1]);
    let p = plan_of(&m, &l);
    assert_eq!(p.recapture, ["bs1"]);
    assert!(refusal_words(&p, "bs1").contains("does not read another"));
}

/// A node 2 added to bs1, a copy of its node 1 that holds no word: to be made into the
/// node a case needs.
fn extra_node(m: &mut Manifest) -> &mut crate::model::format::Node {
    let mut n = m.graphs[0].nodes[1].clone();
    n.index = 2;
    n.touches = Vec::<Touch>::new();
    m.graphs[0].nodes.push(n);
    m.graphs[0].nodes.last_mut().expect("just pushed")
}

#[test]
fn nodes_the_driver_cannot_change_refuse_the_graph() {
    type Change = fn(&mut Manifest);
    let cases: [(&str, Change); 6] = [
        ("in the body of node", |m| {
            // model.w's words move into the body of node 2, a child-graph node (which
            // holds no record of its own).
            let mut body = m.graphs[0].nodes[0].clone();
            body.index = 3;
            body.parent = Some(2);
            m.graphs[0].nodes[0].touches.retain(|t| t.tensor.is_none());
            m.graphs[0].nodes.push(body);
        }),
        ("NCCL collective", |m| {
            m.graphs[0].nodes[0].name = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL".into()
        }),
        ("device-side work storage", |m| {
            // An NCCL collective elsewhere in the graph, holding no word of model.w (with
            // several ranks, its buffers' addresses are in NCCL's own device memory).
            extra_node(m).name = "ncclDevKernel_AllReduce_Sum_f32_RING_LL".into();
        }),
        ("does not retarget a graph with a collective", |m| {
            // A one-rank group's all-reduce, as torch 2.11's NCCL launches it on the H200
            // (fixtures/gpu/nodes_nccl_manifest.json): a plain kernel with plain pointers.
            extra_node(m).name = "__nv_static_32__b4148644_10_onerank_cu_fdf47990__ZN43_GLOBAL__N__b4148644_10_onerank_cu_fdf4799013oneRankReduceI13FuncPreMulSumIfEEEvPvS3_mmb".into();
        }),
        ("the graph's own", |m| {
            m.graphs[0].nodes[0].kind = NodeKind::MemAlloc
        }),
        ("is opaque", |m| {
            extra_node(m).opaque = Some("params not readable".into());
        }),
    ];
    for (words, change) in cases {
        let (mut m, mut l) = moved_w();
        change(&mut m);
        l.probes.clear();
        let l = probed_for(&live(&m, Contents::Updated), &m);
        let mut l2 = l;
        l2.allocations.push(alloc(5, W));
        let mut new = tensor(0, 5, W);
        new.id = TensorId(10);
        l2.tensors.push(new);
        l2.owners[0].tensor = TensorId(10);
        let p = plan_of(&m, &l2);
        assert_eq!(p.recapture, ["bs1"], "{words}: {p:?}");
        assert!(
            refusal_words(&p, "bs1").contains(words),
            "{words}: {}",
            refusal_words(&p, "bs1")
        );
    }
}

#[test]
fn refused_findings_name_why_no_change_of_words_fixes_them() {
    // model.w set to None: vanished and freed, nothing to point the graph at.
    let (m, mut l) = moved_w();
    l.owners.retain(|o| o.path != "model.w");
    l.tensors.retain(|t| t.id != TensorId(10));
    let p = plan_of(&m, &l);
    assert_eq!(p.recapture, ["bs1"]);
    let words = refusal_words(&p, "bs1");
    assert!(
        words.contains("freed: the captured memory is free"),
        "{words}"
    );
    assert!(words.contains("vanished: no owner holds"), "{words}");
    // The schema of the plan names every field.
    let s = schema().to_string();
    for field in ["refusals", "edits", "recapture", "node_kind"] {
        assert!(s.contains(field), "{field}");
    }
}

#[test]
fn a_plan_needs_the_live_checks() {
    let m = manifest();
    let r = verify(&m, None, &Allowlist::default()).unwrap();
    assert!(matches!(
        plan(&m, &live(&m, Contents::Preserved), &r),
        Err(PlanError::NoLiveChecks)
    ));
}

/// Every fixture scenario whose plan patches all its graphs with findings: applied on the
/// host stand-in, each graph takes all its edits, and the manifest after verifies with no
/// live finding against the live snapshot probed for the new addresses.
#[test]
fn every_fully_retargetable_fixture_verifies_clean_after_applying() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let mut checked = Vec::new();
    for index in ["index.json", "gpu/index.json"] {
        let text = std::fs::read_to_string(root.join(index)).unwrap();
        let index: serde_json::Value = serde_json::from_str(&text).unwrap();
        for s in index["scenarios"].as_array().unwrap() {
            let Some(live) = s["live"].as_str() else {
                continue;
            };
            let read = |p: &str| std::fs::read(root.join(p)).unwrap();
            let manifest = s["manifest"].as_str().unwrap();
            let m = crate::codec::load::parse_manifest(&read(manifest), manifest.as_ref()).unwrap();
            let l = crate::codec::load::parse_live(&read(live), live.as_ref()).unwrap();
            let allow = match s["allow"].as_str() {
                Some(a) => Allowlist::load(&root.join(a)).unwrap(),
                None => Allowlist::default(),
            };
            let r = verify(&m, Some(&l), &allow).unwrap();
            let p = plan(&m, &l, &r).unwrap();
            if !p.ok || p.retarget.is_empty() {
                continue;
            }
            for g in p.graphs.iter().filter(|g| g.action == Action::Retarget) {
                let mut h = HostGraph::of(&m, &g.graph);
                assert!(
                    apply_graph(&mut h, g).applied(),
                    "{}: {}",
                    s["name"],
                    g.graph
                );
            }
            let after = retargeted_manifest(&m, &l, &p, &p.retarget);
            crate::index::refs::check_manifest(&after)
                .unwrap_or_else(|e| panic!("{}: {e:?}", s["name"]));
            let probed = probed_for(&l, &after);
            let r = verify(&after, Some(&probed), &allow).unwrap();
            let live: Vec<_> = r
                .findings
                .iter()
                .filter(|f| {
                    matches!(
                        f.kind,
                        FindingKind::Drifted
                            | FindingKind::Freed
                            | FindingKind::Reused
                            | FindingKind::Vanished
                            | FindingKind::Reshaped
                            | FindingKind::Stale
                    )
                })
                .map(|f| (f.kind, f.subject.clone()))
                .collect();
            assert!(
                live.is_empty(),
                "{} after the retarget: {live:?}",
                s["name"]
            );
            checked.push(s["name"].as_str().unwrap().to_string());
        }
    }
    eprintln!("retargeted and verified clean: {checked:?}");
    assert!(checked.len() >= 5, "{checked:?}");
}

#[test]
fn a_plan_read_back_is_checked_against_itself() {
    // Every plan the builder makes passes.
    let (m, l) = moved_w();
    let good = plan_of(&m, &l);
    good.check().expect("a made plan is consistent");
    let (m, l) = rebind_chain();
    plan_of(&m, &l).check().expect("a made plan is consistent");
    // Each contradiction planted is refused at its JSON path.
    type Plant = fn(&mut Plan);
    let plants: [(&str, Plant); 10] = [
        ("format_version", |p| p.format_version = 9),
        ("kind", |p| p.kind = "plan".into()),
        ("graphs[2].graph", |p| {
            let g = p.graphs[0].clone();
            p.graphs.push(g);
        }),
        ("graphs[0].action", |p| p.graphs[0].edits.clear()),
        ("graphs[0].action", |p| {
            p.graphs[0].refusals.push(Refusal {
                kind: "node".into(),
                subject: "node 0".into(),
                why: "planted".into(),
            })
        }),
        ("graphs[1].action", |p| {
            p.graphs[1].action = Action::Recapture
        }),
        ("graphs[0].edits[1]", |p| {
            let e = p.graphs[0].edits[0].clone();
            p.graphs[0].edits.insert(1, e);
        }),
        ("graphs[0].edits[0].node_kind", |p| {
            p.graphs[0].edits[0].node_kind = "mem_alloc".into()
        }),
        ("edits", |p| p.edits += 1),
        ("retarget", |p| p.retarget.clear()),
    ];
    assert_eq!(good.graphs[0].action, Action::Retarget, "{good:?}");
    assert_eq!(good.graphs[1].action, Action::Keep, "{good:?}");
    for (path, plant) in plants {
        let mut p = good.clone();
        plant(&mut p);
        let e = p.check().expect_err(path);
        assert_eq!(e.path, path, "{e}");
    }
    let mut p = good.clone();
    p.ok = false;
    assert_eq!(p.check().unwrap_err().path, "ok");
}
