//! Tests of the live checks of addresses no owner explains: `freed` and `reused` beside
//! the capture-time `unowned`.

use crate::check::allow::Allowlist;
use crate::check::finding::{Finding, FindingKind, Report, Severity};
use crate::check::verify::verify;
use crate::model::format::{
    Addr, AllocState, Allocation, AllocationId, Contents, Digest, Live, Manifest, RangeDigest,
};
use crate::testkit::*;

/// The testkit's global cache: a bare address at the base of allocation 4 (no pool), read
/// by bs8's node 0.
const CACHE: u64 = BASE + 4 * 0x1000;

/// The live snapshot equal to `m`, every probe active in the allocation that holds it (as
/// `build_live` writes them on a GPU).
fn live_in_allocations(m: &Manifest) -> Live {
    let mut l = live(m, Contents::Preserved);
    for p in &mut l.probes {
        p.allocation = m
            .allocations
            .iter()
            .find(|a| a.base <= p.addr && p.addr.0 - a.base.0 < a.size)
            .map(|a| a.id);
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

/// The findings of one kind.
fn of(r: &Report, kind: FindingKind) -> Vec<&Finding> {
    r.findings.iter().filter(|f| f.kind == kind).collect()
}

fn run(m: &Manifest, l: &Live) -> Report {
    verify(m, Some(l), &Allowlist::default()).unwrap()
}

#[test]
fn a_free_or_unmapped_unowned_address_is_freed() {
    for (state, words) in [
        (AllocState::Free, "a free block of the allocator"),
        (AllocState::Unmapped, "unmapped"),
    ] {
        // Unmapped counts only in a declared pool (the next test): put the cache in one.
        let mut m = manifest();
        m.allocations[4].pool = Some(m.pools[0].id);
        let mut l = live_in_allocations(&m);
        set_probe(&mut l, CACHE, state);
        let r = run(&m, &l);
        let freed = of(&r, FindingKind::Freed);
        assert_eq!(freed.len(), 1, "{state:?}: {:?}", kinds(&r));
        let f = freed[0];
        assert_eq!(f.subject, format!("{CACHE:#x}"));
        assert_eq!(f.severity, Severity::Error);
        assert!(f.owners.is_empty());
        assert_eq!(f.graphs, vec!["bs8".to_string()]);
        assert_eq!(
            f.kernels
                .iter()
                .map(|k| k.name.as_str())
                .collect::<Vec<_>>(),
            vec!["k0"]
        );
        assert!(
            f.detail.contains("no owner explained it at capture"),
            "{}",
            f.detail
        );
        assert!(f.detail.contains(words), "{}", f.detail);
        // The capture-time finding stays beside it.
        assert!(kinds(&r).contains(&(FindingKind::Unowned, format!("{CACHE:#x}"))));
        assert!(!r.ok);
    }
}

#[test]
fn an_ownerless_tensor_freed_is_named_by_its_data_pointer() {
    // A tensor no owner reaches (a module global), in its own allocation, read by bs1.
    let mut m = manifest();
    m.allocations.push(alloc(5, W));
    let mut t = tensor(5, 5, W);
    t.offset = 0x20;
    t.nbytes = 0x40;
    t.shape = vec![32];
    m.tensors.push(t);
    m.graphs[0].nodes[1].touches.push(touch(Some(5), 5, 0x20));
    let mut l = live_in_allocations(&m);
    set_probe(&mut l, BASE + 0x5020, AllocState::Free);
    let r = run(&m, &l);
    let subject = format!("{:#x}", BASE + 0x5020);
    assert!(kinds(&r).contains(&(FindingKind::Unowned, subject.clone())));
    let freed = of(&r, FindingKind::Freed);
    assert_eq!(freed.len(), 1, "{:?}", kinds(&r));
    assert_eq!(freed[0].subject, subject);
    assert_eq!(freed[0].shape, Some(vec![32]));
    assert_eq!(freed[0].pool.as_deref(), Some("weights"));
    assert_eq!(freed[0].graphs, vec!["bs1".to_string()]);
}

#[test]
fn an_unowned_address_active_in_its_allocation_is_no_live_finding() {
    let m = manifest();
    let r = run(&m, &live_in_allocations(&m));
    assert_eq!(
        kinds(&r),
        vec![
            (
                FindingKind::Unregistered,
                "model.scale = model.scale_alias".into()
            ),
            (FindingKind::Mispooled, "model.meta".into()),
            (FindingKind::Unowned, format!("{CACHE:#x}")),
        ]
    );
}

/// `m`'s live snapshot with the probe at the global cache in a new live allocation `id`
/// of `base` and `size`.
fn cache_in(m: &Manifest, id: u32, base: u64, size: u64) -> Live {
    let mut l = live_in_allocations(m);
    l.allocations.push(Allocation {
        id: AllocationId(id),
        base: Addr(base),
        size,
        pool: None,
    });
    l.probes
        .iter_mut()
        .find(|p| p.addr == Addr(CACHE))
        .unwrap()
        .allocation = Some(AllocationId(id));
    l
}

#[test]
fn an_unowned_address_in_another_live_allocation_is_reused() {
    // Allocation 4 was released and another one, from another base, covers the address.
    let m = manifest();
    let r = run(&m, &cache_in(&m, 9, CACHE - 0x800, 0x1000));
    let reused = of(&r, FindingKind::Reused);
    assert_eq!(reused.len(), 1, "{:?}", kinds(&r));
    assert_eq!(reused[0].subject, format!("{CACHE:#x}"));
    assert_eq!(reused[0].severity, Severity::Error);
    assert_eq!(reused[0].graphs, vec!["bs8".to_string()]);
    assert!(
        reused[0].detail.contains(&format!(
            "another allocation {:#x}+4096 (captured in {CACHE:#x}+4096)",
            CACHE - 0x800
        )),
        "{}",
        reused[0].detail
    );
    assert!(of(&r, FindingKind::Freed).is_empty());
    // The same base, a smaller size: it no longer holds the captured allocation.
    assert_eq!(
        of(
            &run(&m, &cache_in(&m, 9, CACHE, 0x800)),
            FindingKind::Reused
        )
        .len(),
        1
    );
}

#[test]
fn a_live_allocation_holding_the_captured_one_is_the_same_memory() {
    // Regression guard (H200, torch 2.11, expandable segments): the manifest's allocation
    // is the driver's 20 MiB chunk, the live one the allocator's segment, grown from the
    // same base (or begun before it). Both hold the captured allocation: no finding.
    let m = manifest();
    for (base, size) in [(CACHE, 0x20_0000), (CACHE - 0x10_0000, 0x20_0000)] {
        let r = run(&m, &cache_in(&m, 9, base, size));
        assert!(
            of(&r, FindingKind::Reused).is_empty(),
            "{base:#x}+{size:#x}: {:?}",
            kinds(&r)
        );
    }
}

#[test]
fn an_active_probe_without_a_live_allocation_is_no_finding() {
    // A probe that names no allocation says nothing about one (CPU storages).
    let m = manifest();
    let l = live(&m, Contents::Preserved);
    assert!(l.probes.iter().all(|p| p.allocation.is_none()));
    let r = run(&m, &l);
    assert!(of(&r, FindingKind::Reused).is_empty(), "{:?}", kinds(&r));
}

#[test]
fn without_a_captured_allocation_the_probe_is_not_judged() {
    // On a CPU manifest there are no allocations, and the probes call every address no
    // walk found `unmapped`.
    let mut m = manifest();
    m.allocations.retain(|a| a.id != AllocationId(4));
    m.graphs[1].nodes[0].touches[1].allocation = None;
    let mut l = live(&m, Contents::Preserved);
    set_probe(&mut l, CACHE, AllocState::Unmapped);
    let r = run(&m, &l);
    assert!(kinds(&r).contains(&(FindingKind::Unowned, format!("{CACHE:#x}"))));
    assert!(of(&r, FindingKind::Freed).is_empty(), "{:?}", kinds(&r));
}

#[test]
fn graph_pool_addresses_are_not_judged() {
    // Slot 3 is a graph-pool intermediate: no group, so no live finding either.
    let m = manifest();
    let mut l = live_in_allocations(&m);
    set_probe(&mut l, BASE + 0x3040, AllocState::Free);
    let r = run(&m, &l);
    assert!(of(&r, FindingKind::Freed).is_empty(), "{:?}", kinds(&r));
}

#[test]
fn without_a_live_snapshot_only_unowned() {
    let m = manifest();
    let r = verify(&m, None, &Allowlist::default()).unwrap();
    assert!(!r.checked.contains(&FindingKind::Freed));
    assert_eq!(
        r.findings
            .iter()
            .filter(|f| f.owners.is_empty())
            .map(|f| f.kind)
            .collect::<Vec<_>>(),
        vec![FindingKind::Unowned]
    );
}

#[test]
fn a_kernel_entry_allows_freed_only_where_it_covers_the_kind() {
    let m = manifest();
    let mut l = live_in_allocations(&m);
    set_probe(&mut l, CACHE, AllocState::Free);
    let unowned_only =
        Allowlist::parse("[[allow]]\nkernel = \"k0\"\nkinds = [\"unowned\"]\nreason = \"x\"\n")
            .unwrap();
    let r = verify(&m, Some(&l), &unowned_only).unwrap();
    assert_eq!(of(&r, FindingKind::Freed).len(), 1, "{:?}", kinds(&r));
    let every_kind = Allowlist::parse("[[allow]]\nkernel = \"k0\"\nreason = \"x\"\n").unwrap();
    let r = verify(&m, Some(&l), &every_kind).unwrap();
    assert!(
        !r.findings.iter().any(|f| f.owners.is_empty()),
        "{:?}",
        kinds(&r)
    );
    let allowed: Vec<FindingKind> = r
        .allowed
        .iter()
        .filter(|a| a.finding.subject == format!("{CACHE:#x}"))
        .map(|a| a.finding.kind)
        .collect();
    assert_eq!(allowed, vec![FindingKind::Freed, FindingKind::Unowned]);
}

#[test]
fn an_owned_tensor_in_the_same_allocation_keeps_its_own_rules() {
    // Regression guard: the rule is for ownerless addresses only; an owned subject freed
    // is `freed` under its owner path, not under an address.
    let m = manifest();
    let mut l = live_in_allocations(&m);
    set_probe(&mut l, BASE, AllocState::Free);
    let r = run(&m, &l);
    let freed = of(&r, FindingKind::Freed);
    assert_eq!(freed.len(), 1, "{:?}", kinds(&r));
    assert_eq!(freed[0].subject, "model.w");
}

#[test]
fn freed_names_only_the_kernels_that_read_a_freed_address() {
    // One allocation holds an input that stays and an intermediate that is freed (a
    // piecewise graph's eager intermediate beside the batch input): the finding names the
    // graph that reads the freed one, not every graph of the allocation.
    let mut m = manifest();
    m.graphs[0].nodes[1]
        .touches
        .push(crate::testkit::touch(None, 4, 0x100));
    let mut l = live_in_allocations(&m);
    set_probe(&mut l, CACHE + 0x100, AllocState::Free);
    let r = run(&m, &l);
    let freed = of(&r, FindingKind::Freed);
    assert_eq!(freed.len(), 1, "{:?}", kinds(&r));
    assert_eq!(freed[0].graphs, vec!["bs1".to_string()]);
    assert_eq!(
        freed[0]
            .kernels
            .iter()
            .map(|k| k.name.as_str())
            .collect::<Vec<_>>(),
        vec!["k1"]
    );
    // The capture-time finding names both.
    let unowned = of(&r, FindingKind::Unowned);
    assert_eq!(
        unowned[0].graphs,
        vec!["bs1".to_string(), "bs8".to_string()]
    );
}

#[test]
fn memory_another_library_mapped_is_not_freed_for_being_outside_torch() {
    // NCCL's communicator state (seen on two H200s): a ring kernel's first parameter points
    // into memory NCCL mapped itself, in no pool; torch's allocator has no segment there,
    // so the live snapshot calls it `unmapped` while it is alive. Not freed; a free block
    // of torch's allocator still is.
    let m = manifest();
    assert!(m.allocations[4].pool.is_none());
    let mut l = live_in_allocations(&m);
    set_probe(&mut l, CACHE, AllocState::Unmapped);
    let r = run(&m, &l);
    assert!(of(&r, FindingKind::Freed).is_empty(), "{:?}", kinds(&r));
    assert!(of(&r, FindingKind::Reused).is_empty(), "{:?}", kinds(&r));
    set_probe(&mut l, CACHE, AllocState::Free);
    assert_eq!(of(&run(&m, &l), FindingKind::Freed).len(), 1);
}

/// The cache's block digested: `digest` at capture, `now` in the live snapshot of `contents`.
fn digested(digest: &str, now: Option<&str>, contents: Contents) -> (Manifest, Live) {
    let mut m = manifest();
    let range = |d: &str| RangeDigest {
        addr: Addr(CACHE),
        size: 0x200,
        digest: Digest(d.into()),
    };
    m.ranges.push(range(digest));
    let mut l = live_in_allocations(&m);
    l.event.contents = contents;
    l.ranges.extend(now.map(range));
    (m, l)
}

#[test]
fn an_unowned_range_whose_contents_changed_across_a_preserving_event_is_stale() {
    // The case: a module-global cos/sin cache in memory sleep discarded reads NaN
    // after wake, at the same address, in the same allocation.
    let (m, l) = digested("gc128:aa", Some("gc128:bb"), Contents::Preserved);
    let r = run(&m, &l);
    let stale = of(&r, FindingKind::Stale);
    assert_eq!(stale.len(), 1, "{:?}", kinds(&r));
    let f = stale[0];
    assert_eq!(f.subject, format!("{CACHE:#x}"));
    assert!(f.owners.is_empty());
    assert_eq!(f.graphs, vec!["bs8".to_string()]);
    assert!(
        f.detail.contains("gc128:aa at capture, gc128:bb now")
            && f.detail.contains(&format!("{CACHE:#x}+512")),
        "{}",
        f.detail
    );
    // Beside the capture-time finding, as `freed` and `reused` are.
    assert!(kinds(&r).contains(&(FindingKind::Unowned, format!("{CACHE:#x}"))));
}

#[test]
fn an_unowned_range_is_not_stale_where_nothing_says_its_contents_changed() {
    for (digest, now, contents) in [
        // Equal contents.
        ("gc128:aa", Some("gc128:aa"), Contents::Preserved),
        // Not digested again (unmapped now, or the snapshot took no digests).
        ("gc128:aa", None, Contents::Preserved),
        // Another algorithm: not comparable.
        ("gc128:aa", Some("sha256:bb"), Contents::Preserved),
        // New weights: contents may change.
        ("gc128:aa", Some("gc128:bb"), Contents::Updated),
    ] {
        let (m, l) = digested(digest, now, contents);
        let r = run(&m, &l);
        assert!(
            of(&r, FindingKind::Stale).is_empty(),
            "{digest} {now:?} {contents:?}: {:?}",
            kinds(&r)
        );
    }
}

#[test]
fn a_freed_unowned_range_is_freed_not_stale() {
    let (mut m, mut l) = digested("gc128:aa", Some("gc128:bb"), Contents::Preserved);
    m.allocations[4].pool = Some(m.pools[0].id);
    l.probes
        .iter_mut()
        .find(|p| p.addr == Addr(CACHE))
        .unwrap()
        .state = AllocState::Free;
    let r = run(&m, &l);
    assert_eq!(of(&r, FindingKind::Freed).len(), 1, "{:?}", kinds(&r));
    assert!(of(&r, FindingKind::Stale).is_empty(), "{:?}", kinds(&r));
}
