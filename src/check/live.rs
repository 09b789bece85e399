//! The checks against a live snapshot: for every touched storage view, where its owner
//! paths lead now (probes, carriers, the live address index), giving `vanished`, `drifted`,
//! `freed`, `reused`, `reshaped` and `stale`.

use std::cell::OnceCell;
use std::collections::BTreeSet;

use rustc_hash::FxHashSet;

use super::context::{Ctx, Subject, persistent, shift_siblings, shifted};
use super::finding::{Finding, FindingKind};
use crate::check::pair::probed;
use crate::index::address::AddressIndex;
use crate::index::refs::Tables;
use crate::model::format::{Addr, AllocState, Contents, Live, Tensor};
use crate::model::owner_path::OwnerPath;

/// The lookups verify makes over a live snapshot alone: built where the snapshot is loaded
/// (on a thread of its own, while the manifest is still parsing), or by verify itself.
pub struct LiveIndex {
    pub(super) addresses: AddressIndex,
    pub(super) probes: ProbeIndex,
    pub(super) probed: FxHashSet<Addr>,
    /// The snapshot's tensors, allocations and probes when the index was built.
    counts: (usize, usize, usize),
}

impl LiveIndex {
    pub fn new(l: &Live) -> LiveIndex {
        LiveIndex {
            addresses: AddressIndex::new(&l.tensors, &l.allocations),
            probes: ProbeIndex::new(l),
            probed: probed(l),
            counts: (l.tensors.len(), l.allocations.len(), l.probes.len()),
        }
    }

    /// Whether the index could be `l`'s: it was built over as many tensors, allocations and
    /// probes (so none of its positions lies outside `l`'s records).
    pub fn fits(&self, l: &Live) -> bool {
        self.counts == (l.tensors.len(), l.allocations.len(), l.probes.len())
    }
}

/// Probes sorted by address, remembering document order.
pub(super) struct ProbeIndex {
    /// (addr, document index)
    sorted: Vec<(Addr, usize)>,
}

impl ProbeIndex {
    pub(super) fn new(l: &Live) -> ProbeIndex {
        let mut sorted: Vec<(Addr, usize)> = l
            .probes
            .iter()
            .enumerate()
            .map(|(i, p)| (p.addr, i))
            .collect();
        sorted.sort_unstable();
        ProbeIndex { sorted }
    }

    /// The first probe in document order at `addr`.
    pub(super) fn at(&self, addr: Addr) -> Option<usize> {
        let start = self.sorted.partition_point(|&(a, _)| a < addr);
        self.sorted
            .get(start)
            .filter(|&&(a, _)| a == addr)
            .map(|&(_, i)| i)
    }

    /// The first probe in document order inside `[lo, hi)`.
    fn first_in(&self, lo: Addr, hi: Addr) -> Option<usize> {
        let start = self.sorted.partition_point(|&(a, _)| a < lo);
        self.sorted[start..]
            .iter()
            .take_while(|&&(a, _)| a < hi)
            .map(|&(_, i)| i)
            .min()
    }
}

/// What became of one persistent owner path of a subject in the live snapshot.
#[derive(Clone, Copy)]
enum PathNow<'l> {
    /// It resolves to a tensor at the captured data pointer.
    Kept(&'l Tensor),
    /// It no longer resolves.
    Gone,
    /// It resolves to a tensor at another address, and the manifest tensor with that view
    /// and storage, if any: then the path may have shifted onto another captured tensor.
    Rebound(&'l Tensor, Option<usize>),
}

/// Live owner paths, none of them the subject's own, that still reach the captured bytes.
#[derive(Default)]
struct Carriers<'l> {
    paths: BTreeSet<&'l OwnerPath>,
    /// A carrying tensor with the captured view and storage, whose contents can be
    /// compared with the captured digest.
    same_view: Option<&'l Tensor>,
}

/// The carriers of a subject (`docs/findings.md`, "Identity follows the storage"):
/// - a persistent path that held, at capture, a storage holding the captured bytes, and
///   holds that same storage now (a view's base, another view of the storage);
/// - a persistent path that differs from one of the subject's paths only in one index and
///   holds the captured view and storage, with contents that are not stale (a list shifted
///   by an insert or a delete), where either no path of the subject was rebound to a tensor
///   the manifest does not know (`all_shift`), or the tensor that path held at capture is
///   still held (it shifted on). A sibling that took the block of a tensor rebound to a new
///   one, and whose own old tensor is gone, took freed memory: not a carrier.
#[allow(clippy::too_many_arguments)]
fn carriers<'l>(
    ctx: &Ctx<'_>,
    l: &'l Live,
    lt: &Tables,
    live_index: &AddressIndex,
    s: &Subject<'_>,
    mine: &BTreeSet<&OwnerPath>,
    all_shift: bool,
) -> Carriers<'l> {
    let t = s.tensor;
    let mut c = Carriers::default();
    for mi in ctx.holders(t) {
        let held = &ctx.m.tensors[mi];
        for &o in &ctx.mt.owners_of[mi] {
            let owner = &ctx.m.owners[o];
            if !owner.registration.is_persistent() || mine.contains(&owner.path) {
                continue;
            }
            let Some(&lo) = lt.owner_by_path.get(&l.owners, owner.path.as_str()) else {
                continue;
            };
            let now = &l.owners[lo];
            let lq = lt.tensor(&l.tensors, now.tensor);
            if now.registration.is_persistent() && ctx.same_storage_now(lq, held) {
                c.paths.insert(&now.path);
                if lq.view_key() == t.view_key() && c.same_view.is_none() {
                    c.same_view = Some(lq);
                }
            }
        }
    }
    live_index.for_each_view_at(t.data_ptr(), |vi| {
        let lq = &l.tensors[vi];
        if lq.view_key() != t.view_key()
            || !ctx.same_storage_now(lq, t)
            || stale_reason(l.event.contents, t, lq).is_some()
        {
            return;
        }
        for &lo in &lt.owners_of[vi] {
            let q = &l.owners[lo];
            if q.registration.is_persistent()
                && !mine.contains(&q.path)
                && mine.iter().any(|p| shift_siblings(p, &q.path))
                && (all_shift || still_held(ctx, l, lt, live_index, &q.path))
            {
                c.paths.insert(&q.path);
                c.same_view.get_or_insert(lq);
            }
        }
    });
    c
}

/// Whether a tensor `path` held at capture (one per storage, where the path held several
/// at different captures) is still held, by any persistent owner, with its view and
/// storage.
fn still_held(ctx: &Ctx<'_>, l: &Live, lt: &Tables, live_index: &AddressIndex, path: &str) -> bool {
    ctx.mt
        .owner_by_path
        .all(&ctx.m.owners, path)
        .into_iter()
        .any(|o| {
            let was = ctx.mt.tensor(&ctx.m.tensors, ctx.m.owners[o].tensor);
            let mut held = false;
            live_index.for_each_view_at(was.data_ptr(), |vi| {
                let t = &l.tensors[vi];
                held |= t.view_key() == was.view_key()
                    && ctx.same_storage_now(t, was)
                    && lt.owners_of[vi]
                        .iter()
                        .any(|&lo| l.owners[lo].registration.is_persistent());
            });
            held
        })
}

/// `names` as `` `a`, `b` ``.
fn quoted<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    names
        .into_iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[allow(clippy::too_many_arguments)]
pub(super) fn live_checks(
    ctx: &Ctx<'_>,
    l: &Live,
    lt: &Tables,
    live_index: &AddressIndex,
    probes: &ProbeIndex,
    s: &Subject<'_>,
    out: &mut Vec<Finding>,
) {
    let p = persistent(ctx, s);
    if p.is_empty() {
        return;
    }
    let t = s.tensor;
    let now: Vec<(usize, PathNow<'_>)> = p
        .iter()
        .map(|&o| {
            let st = match lt
                .owner_by_path
                .get(&l.owners, ctx.m.owners[o].path.as_str())
            {
                None => PathNow::Gone,
                Some(&lo) => {
                    let lten = lt.tensor(&l.tensors, l.owners[lo].tensor);
                    if lten.data_ptr() == t.data_ptr() {
                        PathNow::Kept(lten)
                    } else {
                        PathNow::Rebound(lten, ctx.known(lten))
                    }
                }
            };
            (o, st)
        })
        .collect();
    let mine: BTreeSet<&OwnerPath> = p.iter().map(|&o| &ctx.m.owners[o].path).collect();
    let any_kept = now.iter().any(|(_, n)| matches!(n, PathNow::Kept(_)));
    let all_shift = !now
        .iter()
        .any(|(_, n)| matches!(n, PathNow::Rebound(_, None)));
    // Only subjects whose paths moved, or whose address another owner holds, need them.
    let carried = OnceCell::new();
    let carriers = || carried.get_or_init(|| carriers(ctx, l, lt, live_index, s, &mine, all_shift));
    // The captured bytes are still reached: through one of the subject's own paths, or
    // through a carrier. Then a path that went away, or that shifted onto another captured
    // tensor, is no hazard: identity follows the storage.
    let reached = any_kept || !carriers().paths.is_empty();

    let mut vanished = Vec::new();
    let mut drifted: Vec<(usize, &Tensor, Option<usize>)> = Vec::new();
    let mut reshaped: Vec<(usize, &Tensor)> = Vec::new();
    let mut stale: Vec<(usize, &Tensor, &'static str)> = Vec::new();
    for &(o, n) in &now {
        match n {
            PathNow::Gone if !reached => vanished.push(o),
            PathNow::Gone => {}
            PathNow::Rebound(_, Some(k))
                if reached && shifted(ctx, &ctx.m.owners[o].path, k, &carriers().paths) => {}
            PathNow::Rebound(lten, known) => drifted.push((o, lten, known)),
            PathNow::Kept(lten) => {
                if !lten.same_layout(t) {
                    reshaped.push((o, lten));
                } else if let Some(why) = stale_reason(l.event.contents, t, lten) {
                    stale.push((o, lten, why));
                }
            }
        }
    }
    if !vanished.is_empty() {
        out.push(ctx.finding(
            FindingKind::Vanished,
            s,
            &vanished,
            "the owner path does not resolve in the live model, and no other owner holds the captured storage; the graphs still read the captured address".into(),
        ));
    }
    if !drifted.is_empty() {
        let owners: Vec<usize> = drifted.iter().map(|d| d.0).collect();
        let (_, new, known) = drifted[0];
        // Where the path now holds a tensor captured under other paths (a list shifted by
        // a delete), say which: the captured one is the one that went.
        let was = known
            .map(|i| {
                let paths: BTreeSet<&str> = ctx.mt.owners_of[i]
                    .iter()
                    .map(|&o| &ctx.m.owners[o].path)
                    .filter(|p| !mine.contains(p))
                    .map(|p| p.as_str())
                    .collect();
                if paths.is_empty() {
                    String::new()
                } else {
                    format!(", captured as {}", quoted(paths))
                }
            })
            .unwrap_or_default();
        let mut f = ctx.finding(
            FindingKind::Drifted,
            s,
            &owners,
            format!(
                "the owner now holds {} at {}{was}; the graphs still read {}",
                new.layout(),
                new.data_ptr(),
                t.data_ptr()
            ),
        );
        f.live_addr = Some(new.data_ptr());
        out.push(f);
    } else if !p
        .iter()
        .any(|&o| ctx.m.owners[o].registration.is_registered())
        && let Some(f) = drifted_through(ctx, l, lt, s, &p)
    {
        out.push(f);
    }
    if !reshaped.is_empty() {
        let owners: Vec<usize> = reshaped.iter().map(|d| d.0).collect();
        let new = reshaped[0].1;
        let mut f = ctx.finding(
            FindingKind::Reshaped,
            s,
            &owners,
            if t.device == new.device {
                format!(
                    "captured as {} (offset {}), now {} (offset {})",
                    t.layout(),
                    t.offset,
                    new.layout(),
                    new.offset
                )
            } else {
                format!(
                    "captured as {} (offset {}) on {}, now {} (offset {}) on {}",
                    t.layout(),
                    t.offset,
                    t.device,
                    new.layout(),
                    new.offset,
                    new.device
                )
            },
        );
        f.live_addr = Some(new.data_ptr());
        out.push(f);
    }
    if !stale.is_empty() {
        let owners: Vec<usize> = stale.iter().map(|d| d.0).collect();
        out.push(ctx.finding(FindingKind::Stale, s, &owners, stale[0].2.to_string()));
    } else if !any_kept
        && reached
        && let Some(lq) = carriers().same_view
        && let Some(why) = stale_reason(l.event.contents, t, lq)
    {
        // No path of its own holds it any more: judge the contents where it is now held.
        out.push(ctx.finding(
            FindingKind::Stale,
            s,
            &p,
            format!(
                "{why}; now held as {}",
                quoted(carriers().paths.iter().map(|p| p.as_str()))
            ),
        ));
    }

    // The captured address itself.
    let Some(pi) = probes.first_in(t.data_ptr(), t.end()) else {
        return;
    };
    let probe = &l.probes[pi];
    match probe.state {
        AllocState::Free | AllocState::Unmapped => {
            let state = if probe.state == AllocState::Free {
                "a free block of the allocator"
            } else {
                "unmapped"
            };
            out.push(ctx.finding(
                FindingKind::Freed,
                s,
                &p,
                format!("{} is now {state}; replay reads freed memory", probe.addr),
            ));
        }
        AllocState::Active => {
            let mut others: BTreeSet<&OwnerPath> = BTreeSet::new();
            let mut any_mine = false;
            live_index.for_each_view_at(t.data_ptr(), |vi| {
                for &lo in &lt.owners_of[vi] {
                    let path = &l.owners[lo].path;
                    if mine.contains(path) {
                        any_mine = true;
                    } else {
                        others.insert(path);
                    }
                }
            });
            // A carrier at the address holds the captured storage itself: no other owner's
            // data.
            if !any_mine
                && !others.is_empty()
                && !others.iter().any(|o| carriers().paths.contains(o))
            {
                let mut f = ctx.finding(
                    FindingKind::Reused,
                    s,
                    &p,
                    format!(
                        "{} now lies in the tensor of {}; replay reads and writes another owner's data",
                        t.data_ptr(),
                        others.iter().map(|p| p.as_str()).collect::<Vec<_>>().join(", ")
                    ),
                );
                f.new_owners = others.into_iter().map(ToString::to_string).collect();
                out.push(f);
            }
        }
    }
}

/// `drifted` for a subject held only through plain attributes and registered through the
/// owner of a storage that holds its bytes (`Ctx::registered_through`): when no such
/// owner holds that storage any more and one of them holds another, reloads restore the
/// new storage while the graphs read the old one.
fn drifted_through(
    ctx: &Ctx<'_>,
    l: &Live,
    lt: &Tables,
    s: &Subject<'_>,
    p: &[usize],
) -> Option<Finding> {
    let t = s.tensor;
    let through = ctx.registered_through(t);
    if through.is_empty() {
        return None;
    }
    let mut moved = None;
    for &r in &through {
        let owner = &ctx.m.owners[r];
        let Some(&lo) = lt.owner_by_path.get(&l.owners, owner.path.as_str()) else {
            continue;
        };
        let held = ctx.mt.tensor(&ctx.m.tensors, owner.tensor);
        let lr = lt.tensor(&l.tensors, l.owners[lo].tensor);
        if ctx.same_storage_now(lr, held) {
            return None;
        }
        moved.get_or_insert((owner, lr));
    }
    let (owner, lr) = moved?;
    let mut f = ctx.finding(
        FindingKind::Drifted,
        s,
        p,
        format!(
            "a view into the storage of `{}` ({}), which now holds {} at {}; reloads restore the new storage, the graphs still read {}",
            owner.path,
            owner.registration,
            lr.layout(),
            lr.data_ptr(),
            t.data_ptr()
        ),
    );
    f.live_addr = Some(lr.data_ptr());
    Some(f)
}

fn stale_reason(contents: Contents, captured: &Tensor, live: &Tensor) -> Option<&'static str> {
    let same_alg = |a: &crate::model::format::Digest, b: &crate::model::format::Digest| {
        a.algorithm() == b.algorithm()
    };
    if let (Some(r), Some(d)) = (&live.reference_digest, &live.digest)
        && same_alg(r, d)
        && r != d
    {
        return Some("the contents differ from what a fresh load puts there (reference digest)");
    }
    if contents == Contents::Preserved
        && let (Some(c), Some(d)) = (&captured.digest, &live.digest)
        && same_alg(c, d)
        && c != d
    {
        return Some(
            "the contents changed across an event that must preserve them (digest differs from capture)",
        );
    }
    None
}
