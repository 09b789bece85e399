//! Tests of verify: every finding kind, alone and against live snapshots.

use super::*;
use crate::model::format::{Addr, AllocState, Contents, Digest, Probe, Registration, Tensor};
use crate::model::owner_path::OwnerPath;
use crate::testkit::*;

fn path(p: &str) -> OwnerPath {
    OwnerPath::parse(p).unwrap()
}

const SCALE: &str = "model.scale = model.scale_alias";

#[test]
fn capture_time_checks() {
    let m = manifest();
    let r = verify(&m, None, &Allowlist::default()).unwrap();
    assert_eq!(
        kinds(&r),
        vec![
            (FindingKind::Unregistered, SCALE.into()),
            (FindingKind::Mispooled, "model.meta".into()),
            (FindingKind::Unowned, format!("{:#x}", BASE + 4 * 0x1000)),
        ]
    );
    // The alias is one finding in the one graph that reads it.
    assert_eq!(r.findings[0].graphs, vec!["bs8".to_string()]);
    assert_eq!(r.findings[0].kernels[0].offset, 8);
    assert!(!r.ok);
    assert_eq!(r.subjects, 3);
}

#[test]
fn identical_live_adds_nothing() {
    let m = manifest();
    let l = live(&m, Contents::Preserved);
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    assert_eq!(r.findings.len(), 3, "{:?}", kinds(&r));
    assert_eq!(r.checked.len(), FindingKind::PAIR.len());
}

#[test]
fn drifted_and_freed_name_the_new_address() {
    let m = manifest();
    let mut l = live(&m, Contents::Updated);
    l.allocations.push(alloc(5, W));
    let mut moved = tensor(0, 5, W);
    moved.id = TensorId(10);
    l.tensors.push(moved);
    l.owners[0].tensor = TensorId(10);
    l.probes[0].state = AllocState::Free;
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    let k = kinds(&r);
    assert!(
        k.contains(&(FindingKind::Drifted, "model.w".into())),
        "{k:?}"
    );
    assert!(k.contains(&(FindingKind::Freed, "model.w".into())), "{k:?}");
    let d = r
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::Drifted)
        .unwrap();
    assert_eq!(d.live_addr, Some(Addr(BASE + 0x5000)));
    assert_eq!(d.captured_addr, Some(Addr(BASE)));
    assert_eq!(r.recapture(), vec!["bs1".to_string(), "bs8".to_string()]);
}

#[test]
fn reused_names_the_new_owner_and_unmapped_is_freed() {
    let m = manifest();
    let mut l = live(&m, Contents::Updated);
    // model.w now lives elsewhere; its old storage belongs to model.other.
    l.allocations.push(alloc(5, W));
    let mut moved = tensor(0, 5, W);
    moved.id = TensorId(10);
    l.tensors.push(moved);
    l.owners[0].tensor = TensorId(10);
    l.owners
        .push(owner("model.other", 0, Registration::Parameter));
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    let f = r
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::Reused)
        .expect("reused");
    assert_eq!(f.new_owners, vec!["model.other".to_string()]);

    let mut l = live(&m, Contents::Updated);
    l.probes[2].state = AllocState::Unmapped;
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    assert!(kinds(&r).contains(&(FindingKind::Freed, "model.meta".into())));

    // Regression: without that probe the `freed` finding went missing without a word; the
    // pair is refused instead.
    let freed = l.probes.remove(2).addr;
    match verify(&m, Some(&l), &Allowlist::default()) {
        Err(VerifyError::Pair(PairError::MissingProbe { addr, .. })) => assert_eq!(addr, freed),
        other => panic!("{other:?}"),
    }
}

#[test]
fn vanished_reshaped_and_stale() {
    let m = manifest();
    let mut l = live(&m, Contents::Preserved);
    l.owners.retain(|o| o.path != "model.meta");
    l.tensors[0].shape = vec![64, 2];
    l.tensors[0].stride = vec![2, 1];
    l.tensors[1].digest = Some(Digest("sum64:dead".into()));
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    let k = kinds(&r);
    assert!(
        k.contains(&(FindingKind::Vanished, "model.meta".into())),
        "{k:?}"
    );
    assert!(
        k.contains(&(FindingKind::Reshaped, "model.w".into())),
        "{k:?}"
    );
    assert!(k.contains(&(FindingKind::Stale, SCALE.into())), "{k:?}");

    // New weights may change contents, unless a reference says otherwise.
    let mut l = live(&m, Contents::Updated);
    l.tensors[1].digest = Some(Digest("sum64:dead".into()));
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    assert!(!kinds(&r).iter().any(|(k, _)| *k == FindingKind::Stale));
    l.tensors[1].reference_digest = Some(Digest("sum64:beef".into()));
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    assert!(kinds(&r).contains(&(FindingKind::Stale, SCALE.into())));
    // Digests of different algorithms are never compared.
    l.tensors[1].reference_digest = Some(Digest("sha256:beef".into()));
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    assert!(!kinds(&r).iter().any(|(k, _)| *k == FindingKind::Stale));
}

#[test]
fn allowlist_silences_and_reports_unused_entries() {
    let m = manifest();
    let allow = Allowlist::parse(
        "[[allow]]\npath = \"model.scale*\"\nkinds = [\"unregistered\"]\nreason = \"scratch\"\n\
         [[allow]]\npath = \"model.gone\"\nreason = \"old\"\n\
         [[allow]]\npath = \"model.w\"\nkinds = [\"stale\"]\nreason = \"live-only\"\n",
    )
    .unwrap();
    let r = verify(&m, None, &allow).unwrap();
    let k = kinds(&r);
    assert!(
        !k.contains(&(FindingKind::Unregistered, SCALE.into())),
        "{k:?}"
    );
    assert_eq!(r.allowed.len(), 1);
    assert_eq!(r.allowed[0].reason, "scratch");
    // The stale-only entry is not judged without a live snapshot.
    assert!(
        k.contains(&(FindingKind::UnusedAllow, "model.gone".into())),
        "{k:?}"
    );
    assert!(
        !k.contains(&(FindingKind::UnusedAllow, "model.w".into())),
        "{k:?}"
    );
    let l = live(&m, Contents::Preserved);
    let r = verify(&m, Some(&l), &allow).unwrap();
    assert!(kinds(&r).contains(&(FindingKind::UnusedAllow, "model.w".into())));
}

#[test]
fn kernel_entries_allow_unowned_scratch_and_are_reported_when_unused() {
    let m = manifest();
    // The unowned allocation is held by bs8's node k0 only.
    let allow = Allowlist::parse(
        "[[allow]]\nkernel = \"k*\"\nkinds = [\"unowned\"]\nreason = \"cuBLAS workspace\"\n\
         [[allow]]\nkernel = \"nvjet_*\"\nkinds = [\"unowned\"]\nreason = \"gone\"\n",
    )
    .unwrap();
    let r = verify(&m, None, &allow).unwrap();
    let k = kinds(&r);
    assert!(
        !k.iter().any(|(kind, _)| *kind == FindingKind::Unowned),
        "{k:?}"
    );
    assert_eq!(r.allowed.len(), 1);
    assert_eq!(r.allowed[0].allowed_by, "kernel:k*");
    assert!(
        k.contains(&(FindingKind::UnusedAllow, "kernel:nvjet_*".into())),
        "{k:?}"
    );
    // Several patterns: each holding kernel matches one of them.
    let allow = Allowlist::parse(
        "[[allow]]\nkernels = [\"nvjet*\", \"k0\"]\nkinds = [\"unowned\"]\nreason = \"x\"\n",
    )
    .unwrap();
    let r = verify(&m, None, &allow).unwrap();
    assert_eq!(r.allowed.len(), 1);
    assert_eq!(r.allowed[0].allowed_by, "kernel:nvjet*|k0");
    // A kernel entry never allows a finding held by no kernel, nor by another kernel.
    let allow = Allowlist::parse("[[allow]]\nkernel = \"k1\"\nreason = \"x\"\n").unwrap();
    let r = verify(&m, None, &allow).unwrap();
    assert!(
        kinds(&r)
            .iter()
            .any(|(kind, _)| *kind == FindingKind::Unowned)
    );
}

#[test]
fn inconsistent_documents_are_errors_not_panics() {
    let mut m = manifest();
    m.graphs[0].nodes[0].touches[0].tensor = Some(TensorId(99));
    let e = verify(&m, None, &Allowlist::default()).unwrap_err();
    assert!(
        e.to_string()
            .contains("graphs[0].nodes[0].touches[0].tensor"),
        "{e}"
    );
    let m = manifest();
    let mut l = live(&m, Contents::Preserved);
    l.owners[0].tensor = TensorId(42);
    let e = verify(&m, Some(&l), &Allowlist::default()).unwrap_err();
    assert!(e.to_string().contains("owners[0].tensor"), "{e}");
}

// Identity follows the storage; a view into a registered storage is registered;
// an unused allowlist entry warns. Helpers build on the testkit manifest.

/// `n` bytes of slot `slot`'s 256-byte storage from byte `offset`: a view of it.
fn view(id: u32, slot: u64, offset: u64, n: u64) -> Tensor {
    let mut t = tensor(id, slot, W);
    t.offset = offset;
    t.nbytes = n;
    t.shape = vec![n / 2];
    t
}

/// Adds `t` (and its allocation, if new) to `m`, held at `path`, read by bs1's first
/// node.
fn add(m: &mut Manifest, t: Tensor, path: &str, r: Registration) {
    let slot = (t.storage_base.0 - BASE) / 0x1000;
    if !m.allocations.iter().any(|a| a.base == t.storage_base) {
        m.allocations.push(alloc(slot, W));
    }
    m.graphs[0].nodes[0]
        .touches
        .push(touch(Some(t.id.0), slot, t.offset));
    m.owners.push(owner(path, t.id.0, r));
    if !m.tensors.iter().any(|x| x.id == t.id) {
        m.tensors.push(t);
    }
}

/// The live snapshot equal to `m`, with an active probe at every captured address.
fn live_of(m: &Manifest, contents: Contents) -> Live {
    let mut l = live(m, contents);
    for t in m
        .graphs
        .iter()
        .flat_map(|g| &g.nodes)
        .flat_map(|n| &n.touches)
    {
        if !l.probes.iter().any(|p| p.addr == t.addr) {
            l.probes.push(Probe {
                addr: t.addr,
                state: AllocState::Active,
                pool: None,
                allocation: None,
            });
        }
    }
    l
}

fn set_probe(l: &mut Live, addr: u64, state: AllocState) {
    l.probes
        .iter_mut()
        .find(|p| p.addr == Addr(addr))
        .expect("a probe at the address")
        .state = state;
}

fn drop_owner(l: &mut Live, path: &str) {
    let before = l.owners.len();
    l.owners.retain(|o| o.path != path);
    assert_eq!(before, l.owners.len() + 1, "{path}");
}

fn rebind(l: &mut Live, path: &str, t: u32) {
    l.owners.iter_mut().find(|o| o.path == path).unwrap().tensor = TensorId(t);
}

/// Findings naming `path` among their owners, by kind; with a live snapshot, only the
/// live kinds (the capture-time ones are tested apart).
fn about(r: &Report, path: &str) -> Vec<FindingKind> {
    let live = r.checked.contains(&FindingKind::Drifted);
    r.findings
        .iter()
        .filter(|f| f.owners.iter().any(|o| o.path == path))
        .filter(|f| !live || !FindingKind::CAPTURE_TIME.contains(&f.kind))
        .map(|f| f.kind)
        .collect()
}

/// The testkit manifest plus `model.w_half`, a plain attribute holding the second
/// quarter of `model.w`'s storage, which bs1 reads.
fn with_view() -> Manifest {
    let mut m = manifest();
    add(
        &mut m,
        view(5, 0, 64, 64),
        "model.w_half",
        Registration::ModuleAttribute,
    );
    m
}

#[test]
fn a_view_into_a_parameter_is_registered_through_it() {
    let r = verify(&with_view(), None, &Allowlist::default()).unwrap();
    assert_eq!(about(&r, "model.w_half"), vec![], "{:?}", kinds(&r));
    // A view into a storage only plain attributes hold is still unregistered.
    let mut m = manifest();
    add(
        &mut m,
        view(5, 1, 64, 64),
        "model.scale_half",
        Registration::ObjectAttribute,
    );
    let r = verify(&m, None, &Allowlist::default()).unwrap();
    assert_eq!(
        about(&r, "model.scale_half"),
        vec![FindingKind::Unregistered]
    );
}

#[test]
fn bytes_of_a_storage_outside_every_registered_view_are_unregistered() {
    // Regression (review): a parameter that is the first half of its storage, and a
    // plain attribute over the second half: an in-place reload (`param.copy_`) never
    // restores those bytes, so the storage alone does not register them.
    let mut m = manifest();
    add(
        &mut m,
        view(8, 6, 0, 128),
        "model.p",
        Registration::Parameter,
    );
    add(
        &mut m,
        view(9, 6, 128, 128),
        "model.tail",
        Registration::ModuleAttribute,
    );
    let r = verify(&m, None, &Allowlist::default()).unwrap();
    assert_eq!(about(&r, "model.tail"), vec![FindingKind::Unregistered]);
    assert_eq!(about(&r, "model.p"), vec![]);
}

#[test]
fn rebinding_the_parameter_a_view_is_registered_through_is_drifted() {
    let m = with_view();
    let mut l = live_of(&m, Contents::Updated);
    // model.w is a new tensor in slot 5; the view keeps the old storage alive.
    l.allocations.push(alloc(5, W));
    let mut new = tensor(10, 5, W);
    new.id = TensorId(10);
    l.tensors.push(new);
    rebind(&mut l, "model.w", 10);
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    assert_eq!(about(&r, "model.w_half"), vec![FindingKind::Drifted]);
    let f = r
        .findings
        .iter()
        .find(|f| f.subject == "model.w_half")
        .unwrap();
    assert_eq!(f.live_addr, Some(Addr(BASE + 0x5000)));
    assert!(f.detail.contains("`model.w` (parameter)"), "{}", f.detail);
    assert!(about(&r, "model.w").contains(&FindingKind::Drifted));
}

#[test]
fn a_view_dropped_while_its_base_lives_is_clean() {
    let m = with_view();
    let mut l = live_of(&m, Contents::Preserved);
    drop_owner(&mut l, "model.w_half");
    l.tensors.retain(|t| t.id != TensorId(5));
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    assert_eq!(about(&r, "model.w_half"), vec![], "{:?}", kinds(&r));

    // The base gone too, its storage freed: nothing holds those bytes any more.
    let mut l = live_of(&m, Contents::Preserved);
    drop_owner(&mut l, "model.w_half");
    drop_owner(&mut l, "model.w");
    l.tensors
        .retain(|t| t.id != TensorId(5) && t.id != TensorId(0));
    set_probe(&mut l, BASE + 64, AllocState::Free);
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    assert_eq!(
        about(&r, "model.w_half"),
        vec![FindingKind::Vanished, FindingKind::Freed]
    );
}

#[test]
fn the_base_carries_only_the_bytes_its_storage_holds() {
    // A live tensor at the same base whose storage is smaller than the captured view's
    // end is not the captured storage: the view vanished and its bytes were reused.
    let m = with_view();
    let mut l = live_of(&m, Contents::Preserved);
    drop_owner(&mut l, "model.w_half");
    l.tensors.retain(|t| t.id != TensorId(5));
    let w = l.tensors.iter_mut().find(|t| t.id == TensorId(0)).unwrap();
    w.storage_nbytes = 64;
    w.nbytes = 64;
    w.shape = vec![32];
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    assert!(
        about(&r, "model.w_half").contains(&FindingKind::Vanished),
        "{:?}",
        kinds(&r)
    );
}

#[test]
fn two_tensors_sharing_a_storage_one_dropped_is_clean() {
    // model.x is slot 6's whole storage, model.y the same bytes as a [2, 64] tensor.
    let mut m = manifest();
    m.allocations.push(alloc(6, W));
    m.tensors.push(tensor(6, 6, W));
    m.owners.push(owner("model.x", 6, Registration::Buffer));
    let mut y = tensor(7, 6, W);
    y.shape = vec![2, 64];
    y.stride = vec![64, 1];
    add(&mut m, y, "model.y", Registration::Buffer);
    let r = verify(&m, None, &Allowlist::default()).unwrap();
    assert_eq!(about(&r, "model.y"), vec![]);

    let mut l = live_of(&m, Contents::Preserved);
    drop_owner(&mut l, "model.y");
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    assert_eq!(about(&r, "model.y"), vec![], "{:?}", kinds(&r));

    // Both dropped and the block freed: vanished and freed.
    drop_owner(&mut l, "model.x");
    set_probe(&mut l, BASE + 0x6000, AllocState::Free);
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    assert_eq!(
        about(&r, "model.y"),
        vec![FindingKind::Vanished, FindingKind::Freed]
    );
}

/// `ys[i]` a plain list of slot `5 + i`'s tensors, every one read by bs1.
fn with_list(n: u32) -> Manifest {
    let mut m = manifest();
    for i in 0..n {
        add(
            &mut m,
            tensor(5 + i, 5 + u64::from(i), W),
            &format!("model.ys[{i}]"),
            Registration::Container,
        );
    }
    m
}

/// `del ys[k]`: later elements shift down one index; the deleted tensor's block is free.
fn del(m: &Manifest, n: u32, k: u32, contents: Contents) -> Live {
    let mut l = live_of(m, contents);
    for i in k..n - 1 {
        rebind(&mut l, &format!("model.ys[{i}]"), 5 + i + 1);
    }
    drop_owner(&mut l, &format!("model.ys[{}]", n - 1));
    l.tensors.retain(|t| t.id != TensorId(5 + k));
    set_probe(&mut l, BASE + (5 + u64::from(k)) * 0x1000, AllocState::Free);
    l
}

#[test]
fn a_list_shifted_by_a_delete_reports_only_the_deleted_tensor() {
    for n in [3, 4] {
        let m = with_list(n);
        let l = del(&m, n, 1, Contents::Preserved);
        let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
        let k: Vec<_> = kinds(&r)
            .into_iter()
            .filter(|(k, s)| s.starts_with("model.ys") && !FindingKind::CAPTURE_TIME.contains(k))
            .collect();
        // ys[1] now holds what ys[2] held; the tensor it held is gone.
        assert_eq!(
            k,
            vec![
                (FindingKind::Drifted, "model.ys[1]".into()),
                (FindingKind::Freed, "model.ys[1]".into()),
            ],
            "n={n}"
        );
    }
}

#[test]
fn a_delete_at_the_front_shifts_every_later_element_without_a_finding() {
    // del ys[0] of four: each later element moves down one index (same displacement
    // for the tensor each path now holds and for where each captured tensor went).
    let m = with_list(4);
    let l = del(&m, 4, 0, Contents::Preserved);
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    assert_eq!(
        about(&r, "model.ys[0]"),
        vec![FindingKind::Drifted, FindingKind::Freed]
    );
    for i in 1..4 {
        assert_eq!(about(&r, &format!("model.ys[{i}]")), vec![], "ys[{i}]");
    }
}

#[test]
fn swapped_list_elements_are_drifted() {
    // Regression (review): ys[0] and ys[2] swapped, every tensor still held. The model
    // now reads ys[2]'s tensor through ys[0] while the graphs read the old one: not a
    // shift (the two moved by +2 and -2), so both paths are drifted.
    let m = with_list(3);
    let mut l = live_of(&m, Contents::Preserved);
    rebind(&mut l, "model.ys[0]", 7);
    rebind(&mut l, "model.ys[2]", 5);
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    assert_eq!(about(&r, "model.ys[0]"), vec![FindingKind::Drifted]);
    assert_eq!(about(&r, "model.ys[2]"), vec![FindingKind::Drifted]);
    assert_eq!(about(&r, "model.ys[1]"), vec![]);
}

#[test]
fn a_path_rebound_onto_another_captured_tensor_is_drifted() {
    // Regression (review): ys[1] = ys[0] while ys[1]'s own tensor is still held through
    // an alias captured with it (CUTLASS's c_strides2 = c_strides1 with ab_strides1
    // keeping the old one): no shift; the graphs read the old ys[1].
    let mut m = with_list(2);
    m.owners
        .push(owner("model.alias", 6, Registration::Container));
    let mut l = live_of(&m, Contents::Preserved);
    rebind(&mut l, "model.ys[1]", 5);
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    assert_eq!(about(&r, "model.ys[1]"), vec![FindingKind::Drifted]);
}

/// A rebind chain after a reload (`contents: updated`, no digests to compare): every
/// `ys[i]` replaced by a new tensor of its layout, `ys[0]`'s in a new block (slot 9) and
/// each later one in the block its predecessor's old tensor freed; the last old block is
/// free. By address and layout alone this is `del ys[0]` followed by an append. With
/// `session`, both documents name one producer session and number every storage.
fn rebind_chain(n: u32, session: bool) -> (Manifest, Live) {
    let mut m = with_list(n);
    if session {
        m.producer.session = Some("recorder-1".into());
        for t in &mut m.tensors {
            t.storage = Some(t.id.0);
        }
    }
    let mut l = live_of(&m, Contents::Updated);
    l.producer.session = m.producer.session.clone();
    l.allocations.push(alloc(9, W));
    l.tensors.retain(|t| !(5..5 + n).contains(&t.id.0));
    for i in 0..n {
        let slot = if i == 0 { 9 } else { 5 + u64::from(i) - 1 };
        let mut t = tensor(100 + i, slot, W);
        t.digest = None;
        if session {
            t.storage = Some(100 + i);
        }
        l.tensors.push(t);
        rebind(&mut l, &format!("model.ys[{i}]"), 100 + i);
    }
    set_probe(
        &mut l,
        BASE + (5 + u64::from(n - 1)) * 0x1000,
        AllocState::Free,
    );
    (m, l)
}

#[test]
fn a_rebind_chain_through_freed_blocks_is_drifted_everywhere_when_storages_are_numbered() {
    // Seen on the H200 (benches/retarget_bench.py): 64 RMSNorm weights replaced in
    // order, each new one in the block the previous layer's old one freed. Every graph
    // still reads the old addresses, which now hold the next layer's new weight: every
    // path drifted, every address but the first reused by a sibling.
    let n = 4;
    let (m, l) = rebind_chain(n, true);
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    for i in 0..n {
        let p = format!("model.ys[{i}]");
        let k = about(&r, &p);
        assert!(k.contains(&FindingKind::Drifted), "{p}: {k:?}");
        let want = if i == n - 1 {
            FindingKind::Freed
        } else {
            FindingKind::Reused
        };
        assert!(k.contains(&want), "{p}: {k:?}");
    }
    // Without the numbers the documents cannot tell the chain from a list shift: only
    // its ends are flagged (what the H200 run showed; the documents say too little).
    let (m, l) = rebind_chain(n, false);
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    let drifted = (0..n)
        .filter(|i| about(&r, &format!("model.ys[{i}]")).contains(&FindingKind::Drifted))
        .count();
    assert!(drifted < n as usize, "{:?}", kinds(&r));
    // Numbers of two sessions say nothing about each other: addresses decide, as without.
    let (m, mut l) = rebind_chain(n, true);
    l.producer.session = Some("recorder-2".into());
    let other = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    assert_eq!(kinds(&other), kinds(&r));
}

#[test]
fn a_shift_whose_contents_changed_is_not_the_same_tensor() {
    // What ys[1] holds now reads other bytes than the captured ys[2]: without the
    // contents as evidence, the address is another owner's.
    let m = with_list(3);
    let mut l = del(&m, 3, 1, Contents::Preserved);
    let t = l.tensors.iter_mut().find(|t| t.id == TensorId(7)).unwrap();
    t.digest = Some(Digest("sum64:dead".into()));
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    assert_eq!(
        about(&r, "model.ys[2]"),
        vec![FindingKind::Vanished, FindingKind::Reused]
    );
}

#[test]
fn a_list_shifted_by_an_insert_reports_the_new_slot_as_drifted() {
    // ys.insert(0, new): every captured tensor is still held, one index later.
    let m = with_list(2);
    let mut l = live_of(&m, Contents::Preserved);
    l.allocations.push(alloc(8, W));
    l.tensors.push(tensor(8, 8, W));
    rebind(&mut l, "model.ys[0]", 8);
    rebind(&mut l, "model.ys[1]", 5);
    l.owners
        .push(owner("model.ys[2]", 6, Registration::Container));
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    assert_eq!(about(&r, "model.ys[0]"), vec![FindingKind::Drifted]);
    assert_eq!(about(&r, "model.ys[1]"), vec![]);
}

#[test]
fn a_rebound_parameter_is_drifted_while_its_old_storage_lives() {
    // model.w rebound; the old storage still held through a plain attribute graphcheck
    // did not see at capture: drifted (and the address another owner's).
    let m = manifest();
    let mut l = live_of(&m, Contents::Preserved);
    l.allocations.push(alloc(5, W));
    l.tensors.push(tensor(10, 5, W));
    rebind(&mut l, "model.w", 10);
    l.owners
        .push(owner("model.w_old", 0, Registration::ModuleAttribute));
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    assert_eq!(
        about(&r, "model.w"),
        vec![FindingKind::Drifted, FindingKind::Reused]
    );

    // Held through a view graphcheck knew at capture: the same storage, not another
    // owner's; only drifted.
    let mut m = manifest();
    m.tensors.push(view(5, 0, 0, 128));
    m.owners
        .push(owner("model.w_head", 5, Registration::ModuleAttribute));
    let mut l = live_of(&m, Contents::Preserved);
    l.allocations.push(alloc(5, W));
    l.tensors.push(tensor(10, 5, W));
    rebind(&mut l, "model.w", 10);
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    assert_eq!(about(&r, "model.w"), vec![FindingKind::Drifted]);
}

#[test]
fn an_expert_reusing_a_siblings_block_is_still_reused() {
    // experts[0].s rebound to a new tensor, experts[1].s rebound into experts[0].s's
    // old block (same layout): sibling paths, but a rebinding to an unknown tensor is
    // no shift.
    let mut m = manifest();
    for i in 0..2u32 {
        add(
            &mut m,
            tensor(5 + i, 5 + u64::from(i), W),
            &format!("model.experts[{i}].s"),
            Registration::Parameter,
        );
    }
    let mut l = live_of(&m, Contents::Updated);
    l.allocations.push(alloc(8, W));
    l.tensors.push(tensor(8, 8, W));
    rebind(&mut l, "model.experts[0].s", 8);
    let mut thief = tensor(9, 5, W);
    thief.digest = Some(Digest("sum64:beef".into()));
    l.tensors.push(thief);
    rebind(&mut l, "model.experts[1].s", 9);
    l.tensors
        .retain(|t| t.id != TensorId(5) && t.id != TensorId(6));
    set_probe(&mut l, BASE + 0x6000, AllocState::Free);
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    assert_eq!(
        about(&r, "model.experts[0].s"),
        vec![FindingKind::Drifted, FindingKind::Reused]
    );
    assert_eq!(
        about(&r, "model.experts[1].s"),
        vec![FindingKind::Drifted, FindingKind::Freed]
    );
}

#[test]
fn shift_siblings_differ_in_exactly_one_index() {
    let shift_siblings =
        |a: &str, b: &str| crate::check::context::shift_siblings(&path(a), &path(b));
    assert!(shift_siblings("m.ys[2]", "m.ys[1]"));
    assert!(shift_siblings("m.experts[3].w", "m.experts[2].w"));
    assert!(!shift_siblings("m.ys[2]", "m.ys[2]"));
    assert!(!shift_siblings("m.ys[2]", "m.zs[1]"));
    assert!(!shift_siblings("m.a[0][1]", "m.a[1][0]"));
    assert!(!shift_siblings("m.d[\"a\"]", "m.d[\"b\"]"));
    assert!(!shift_siblings("m.ys[2]", "m.ys[2].w"));
    assert!(!shift_siblings("m.q.s", "m.o.s"));
}

#[test]
fn an_unused_entry_warns_unless_denied() {
    let m = manifest();
    // Every capture-time finding allowed, plus an entry that allows nothing.
    let text = "[[allow]]\npath = \"model.**\"\nreason = \"x\"\n\
                [[allow]]\nkernel = \"k*\"\nreason = \"x\"\n\
                [[allow]]\npath = \"model.gone\"\nreason = \"old\"\n";
    let r = verify(&m, None, &Allowlist::parse(text).unwrap()).unwrap();
    assert_eq!(
        kinds(&r),
        vec![(FindingKind::UnusedAllow, "model.gone".into())]
    );
    assert_eq!(r.findings[0].severity, Severity::Warning);
    assert!(r.ok);
    assert_eq!(r.warnings().count(), 1);
    assert_eq!(r.errors().count(), 0);
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["findings"][0]["severity"], "warning");
    assert_eq!(json["ok"], true);

    let deny = Allowlist::parse(text).unwrap().deny_unused(true);
    let r = verify(&m, None, &deny).unwrap();
    assert_eq!(r.findings[0].severity, Severity::Error);
    assert!(!r.ok);
    // Other findings still fail the run beside a warning.
    let r = verify(
        &m,
        None,
        &Allowlist::parse("[[allow]]\npath = \"model.gone\"\nreason = \"old\"\n").unwrap(),
    )
    .unwrap();
    assert!(!r.ok);
    assert_eq!(r.warnings().count(), 1);
}

/// What the touch index, the bare touches and the subjects of a context are.
type ContextSummary = (
    Vec<Vec<TouchRef>>,
    Vec<TouchRef>,
    Vec<(Vec<usize>, Vec<usize>)>,
    u32,
);

fn summary(m: &Manifest, c: (Ctx<'_>, Vec<TouchRef>, Vec<Subject<'_>>, u32)) -> ContextSummary {
    let (ctx, bare, subjects, r) = c;
    let rows = (0..m.tensors.len())
        .map(|t| ctx.touches_of[t].to_vec())
        .collect();
    let subjects = subjects
        .iter()
        .map(|s| (s.tensors.to_vec(), s.owners.to_vec()))
        .collect();
    (rows, bare, subjects, r)
}

/// The context is the same on one thread and on three, and `beside`'s answer comes back
/// either way.
#[test]
fn context_is_the_same_on_one_thread_and_on_three() {
    let m = manifest();
    let mt = check_manifest(&m).unwrap();
    let serial = summary(&m, context_on(&m, &mt, || 7, true, false));
    assert!(serial.0.iter().any(|r| !r.is_empty()) && !serial.1.is_empty());
    assert!(!serial.2.is_empty());
    for beside_thread in [true, false] {
        let threaded = summary(&m, context_on(&m, &mt, || 7, beside_thread, true));
        assert_eq!(threaded, serial);
    }
}

/// The test manifest and an identical live snapshot, their tables, and their report.
fn checked_pair() -> (Manifest, Live, Tables, Tables, Report) {
    let m = manifest();
    let l = live(&m, Contents::Preserved);
    let (mt, lt) = (check_manifest(&m).unwrap(), check_live(&l).unwrap());
    let r = verify_checked(&m, &mt, Some((&l, &lt)), &Allowlist::default()).unwrap();
    (m, l, mt, lt, r)
}

/// Touch counts that are not the manifest's (tables checked before a touch was added, or
/// made by hand) are made again: the same context and report as with the right ones, and
/// no panic.
#[test]
fn wrong_touch_counts_are_made_again() {
    let (m, l, mt, lt, right) = checked_pair();
    let allow = Allowlist::default();
    let right_context = summary(&m, context_on(&m, &mt, || 0, false, false));
    let n = m.tensors.len();
    let mut moved = mt.touch_counts.clone();
    let touched = moved.iter().position(|&c| c > 0).unwrap();
    moved[touched] -= 1;
    moved[(touched + 1) % n] += 1;
    for counts in [vec![0; n], vec![1000; n], moved, Vec::new()] {
        let wrong = Tables {
            touch_counts: counts.clone(),
            ..mt.clone()
        };
        for parallel in [false, true] {
            let c = summary(&m, context_on(&m, &wrong, || 0, false, parallel));
            assert_eq!(c, right_context, "counts {counts:?}, parallel {parallel}");
        }
        let r = verify_checked(&m, &wrong, Some((&l, &lt)), &allow).unwrap();
        assert_eq!(r, right, "counts {counts:?}");
    }
}

/// A live index built over another snapshot's records is built again, not trusted.
#[test]
fn a_live_index_of_another_snapshot_is_built_again() {
    let (m, l, mt, lt, right) = checked_pair();
    let allow = Allowlist::default();
    let mut other = l.clone();
    other.probes.truncate(1);
    let index = LiveIndex::new(&other);
    assert!(!index.fits(&l) && index.fits(&other));
    let r = verify_indexed(&m, &mt, Some((&l, &lt, &index)), &allow).unwrap();
    assert_eq!(r, right);
}

/// `model.a`, read by bs1, died after its capture; `model.b`, a new storage with its layout
/// in its memory, is read by bs8. The manifest numbers the two storages (`storage`).
fn same_memory_twice(numbered: bool) -> (Manifest, Live) {
    let mut m = manifest();
    let mut a = tensor(3, 6, W);
    let mut b = tensor(4, 6, W);
    if numbered {
        (a.storage, b.storage) = (Some(0), Some(1));
    }
    m.allocations.push(alloc(6, W));
    m.graphs[0].nodes[0].touches.push(touch(Some(3), 6, 0));
    m.graphs[1].nodes[0].touches.push(touch(Some(4), 6, 0));
    m.tensors.extend([a, b]);
    m.owners.push(owner("model.a", 3, Registration::Buffer));
    m.owners.push(owner("model.b", 4, Registration::Buffer));
    let mut l = live_of(&m, Contents::Preserved);
    // Now: model.b holds the memory; model.a is no path any more.
    drop_owner(&mut l, "model.a");
    l.tensors.retain(|t| t.id != TensorId(3));
    for t in &mut l.tensors {
        t.storage = None;
    }
    (m, l)
}

#[test]
fn a_storage_that_died_between_two_captures_is_its_own_subject() {
    let (m, l) = same_memory_twice(true);
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    let reused = r
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::Reused)
        .expect("reused");
    assert_eq!(reused.subject, "model.a");
    assert_eq!(reused.new_owners, vec!["model.b".to_string()]);
    assert_eq!(about(&r, "model.b"), Vec::<FindingKind>::new());
    // Only the graph that captured model.a reads what model.b holds now.
    assert_eq!(reused.graphs, vec!["bs1".to_string()]);
    // Without the numbers the two records are one view, its two owners one subject, and
    // bs1's read of model.b's bytes goes unseen (documents written before `storage`).
    let (m, l) = same_memory_twice(false);
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    assert!(
        !r.findings.iter().any(|f| f.kind == FindingKind::Reused),
        "{:?}",
        kinds(&r)
    );
}

/// `model.r` captured by bs1 in slot 6 (storage 0), then rebound between the captures to a
/// new tensor in slot 7 (storage 1), which bs8 captured: the manifest gives the path once
/// per storage. Live: `model.r` holds slot 7; slot 6 was freed.
fn rebound_between_captures() -> (Manifest, Live) {
    let mut m = manifest();
    let (mut old, mut new) = (tensor(3, 6, W), tensor(4, 7, W));
    (old.storage, new.storage) = (Some(0), Some(1));
    m.allocations.extend([alloc(6, W), alloc(7, W)]);
    m.graphs[0].nodes[0].touches.push(touch(Some(3), 6, 0));
    m.graphs[1].nodes[0].touches.push(touch(Some(4), 7, 0));
    m.tensors.extend([old, new]);
    m.owners.push(owner("model.r", 4, Registration::Parameter));
    m.owners.push(owner("model.r", 3, Registration::Parameter));
    let mut l = live_of(&m, Contents::Preserved);
    l.owners
        .retain(|o| !(o.path == "model.r" && o.tensor == TensorId(3)));
    l.tensors.retain(|t| t.id != TensorId(3));
    for t in &mut l.tensors {
        t.storage = None;
    }
    for p in l
        .probes
        .iter_mut()
        .filter(|p| p.addr == Addr(BASE + 6 * 0x1000))
    {
        p.state = AllocState::Free;
    }
    (m, l)
}

#[test]
fn a_parameter_rebound_between_two_captures_drifts_for_the_first_graph_alone() {
    let (m, l) = rebound_between_captures();
    crate::index::refs::check_manifest(&m).expect("a path once per storage loads");
    crate::index::refs::check_live(&l).expect("the live snapshot has the path once");
    let r = verify(&m, Some(&l), &Allowlist::default()).unwrap();
    let on = |kind| {
        r.findings
            .iter()
            .filter(|f| f.kind == kind && f.subject == "model.r")
            .map(|f| f.graphs.clone())
            .collect::<Vec<_>>()
    };
    // bs1 holds the old address: the owner moved, and what it read is free.
    assert_eq!(on(FindingKind::Drifted), vec![vec!["bs1".to_string()]]);
    assert_eq!(on(FindingKind::Freed), vec![vec!["bs1".to_string()]]);
    // bs8 captured what model.r holds now: nothing.
    assert!(
        r.findings
            .iter()
            .all(|f| f.subject != "model.r" || f.graphs == ["bs1"]),
        "{:?}",
        kinds(&r)
    );
    let d = r
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::Drifted)
        .unwrap();
    assert_eq!(d.live_addr, Some(Addr(BASE + 7 * 0x1000)));
}
