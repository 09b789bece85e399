//! Addresses no owner explains: the touches that name no tensor, or a tensor with no
//! owner, outside every graph pool, grouped by subject. Each group is an `unowned` finding
//! at capture; against a live snapshot, its captured addresses are also looked up in the
//! probes, giving `freed` and `reused` where the memory the graphs read was released.

use std::collections::BTreeMap;

use rustc_hash::FxHashSet;

use super::context::{Ctx, Subject, TouchRef, kernel_refs};
use super::finding::{Finding, FindingKind, Severity};
use super::live::ProbeIndex;
use crate::index::address::AddressIndex;
use crate::index::refs::Tables;
use crate::index::refs::in_range;
use crate::model::format::{
    Addr, AllocState, Allocation, Contents, Digest, Live, PoolKind, Probe, RangeDigest, Tensor,
};

/// The touches no owner explains that share one subject.
pub(super) struct Group<'m> {
    /// The subject: the data pointer of the ownerless tensor the touches name; else the
    /// base of the allocation the address lies in; else the address itself.
    key: Addr,
    refs: Vec<TouchRef>,
    /// The manifest allocation (index) the first touch's address lay in at capture.
    alloc: Option<usize>,
    tensor: Option<&'m Tensor>,
}

impl Group<'_> {
    /// Whether the allocation the group's address lay in at capture belongs to a pool the
    /// manifest declares (not a graph's: those groups are left out): memory a sleep or an
    /// engine allocator may release and map again, losing what it held.
    pub(super) fn in_declared_pool(&self, m: &crate::model::format::Manifest) -> bool {
        self.alloc.is_some_and(|a| m.allocations[a].pool.is_some())
    }

    /// The group's touches whose captured address `keep` accepts.
    fn refs_at(
        &self,
        m: &crate::model::format::Manifest,
        keep: impl Fn(Addr) -> bool,
    ) -> Vec<TouchRef> {
        self.refs
            .iter()
            .copied()
            .filter(|&(gi, ni, ki)| {
                keep(m.graphs[gi as usize].nodes[ni as usize].touches[ki as usize].addr)
            })
            .collect()
    }

    /// The group's captured addresses, sorted, each once.
    pub(super) fn addresses(&self, m: &crate::model::format::Manifest) -> Vec<Addr> {
        let mut addrs: Vec<Addr> = self
            .refs
            .iter()
            .map(|&(gi, ni, ki)| m.graphs[gi as usize].nodes[ni as usize].touches[ki as usize].addr)
            .collect();
        addrs.sort_unstable();
        addrs.dedup();
        addrs
    }
}

/// The groups of touches that name no tensor (`bare`), or a tensor with no owner, outside
/// any graph pool, by subject.
pub(super) fn groups<'m>(
    ctx: &Ctx<'m>,
    bare: &[TouchRef],
    subjects: &[Subject<'m>],
) -> Vec<Group<'m>> {
    let m = ctx.m;
    let mut index: Option<AddressIndex> = None;
    let mut groups: BTreeMap<Addr, Group<'m>> = BTreeMap::new();
    let in_graph_pool = |a: Option<usize>| {
        a.and_then(|a| m.allocations[a].pool)
            .is_some_and(|p| m.pools[ctx.mt.pool_ix[&p] as usize].kind == PoolKind::Graph)
    };
    let mut add = |r: TouchRef, tensor: Option<&'m Tensor>, index: &mut Option<AddressIndex>| {
        let touch = &m.graphs[r.0 as usize].nodes[r.1 as usize].touches[r.2 as usize];
        let alloc = match touch.allocation {
            Some(a) => Some(ctx.mt.alloc_ix[&a] as usize),
            None => index
                .get_or_insert_with(|| AddressIndex::new(&m.tensors, &m.allocations))
                .allocations_at(touch.addr)
                .first()
                .copied(),
        };
        if in_graph_pool(alloc) {
            return;
        }
        let key = match (tensor, alloc) {
            (Some(t), _) => t.data_ptr(),
            (None, Some(a)) => m.allocations[a].base,
            (None, None) => touch.addr,
        };
        groups
            .entry(key)
            .or_insert(Group {
                key,
                refs: Vec::new(),
                alloc,
                tensor,
            })
            .refs
            .push(r);
    };
    for &r in bare {
        add(r, None, &mut index);
    }
    for s in subjects {
        if s.owners.is_empty() {
            for &t in &s.tensors {
                for &r in &ctx.touches_of[t] {
                    add(r, Some(s.tensor), &mut index);
                }
            }
        }
    }
    groups.into_values().collect()
}

/// The capture-time check: every group is `unowned`.
pub(super) fn capture_checks(ctx: &Ctx<'_>, groups: &[Group<'_>], out: &mut Vec<Finding>) {
    let m = ctx.m;
    for g in groups {
        let detail = match (g.tensor, g.alloc) {
            (Some(_), _) => "a tensor the graphs read, but no owner path reaches it".to_string(),
            (None, Some(a)) => format!(
                "inside allocation {}+{} ({}), which no owner, graph input or graph pool explains",
                m.allocations[a].base,
                m.allocations[a].size,
                pool_name(ctx, g).as_deref().unwrap_or("no pool")
            ),
            (None, None) => "an address in no known allocation".to_string(),
        };
        out.push(finding(ctx, g, &g.refs, FindingKind::Unowned, detail));
    }
}

/// The live checks of the groups whose addresses lay in an allocation the manifest knows
/// (`docs/findings.md`, "Addresses no owner explains"): `freed` where a probe at one of
/// the captured addresses is `free` (or `unmapped`, where the captured allocation lay in a
/// declared pool); else `reused` where one is `active` in a
/// live allocation that no longer holds the captured one. Without a captured allocation
/// the probe says nothing the manifest did not: a CPU manifest has no allocations, and its
/// probes call every address no walk found `unmapped`.
pub(super) fn live_checks(
    ctx: &Ctx<'_>,
    l: &Live,
    lt: &Tables,
    probes: &ProbeIndex,
    groups: &[Group<'_>],
    out: &mut Vec<Finding>,
) {
    let m = ctx.m;
    // Allocations by extent: a live allocation with the base and size of one the manifest
    // has is the one the address lay in at capture, even where a document overlaps them.
    let mut captured_extents: Option<FxHashSet<(Addr, u64)>> = None;
    // The manifest's allocations are the driver's ranges, the live snapshot's the caching
    // allocator's segments, and an expandable segment grows past the range it began as
    // (docs/findings.md, "Addresses no owner explains"): a live allocation that holds the
    // whole captured one is the same memory.
    let holds = |live: &Allocation, captured: &Allocation| {
        live.base <= captured.base
            && captured.base.0.saturating_add(captured.size)
                <= live.base.0.saturating_add(live.size)
    };
    for g in groups {
        let Some(a) = g.alloc else {
            continue;
        };
        let captured = &m.allocations[a];
        let addrs = g.addresses(m);
        let now: Vec<&Probe> = addrs
            .iter()
            .filter_map(|&addr| probes.at(addr))
            .map(|pi| &l.probes[pi])
            .collect();
        // `unmapped` says only that torch's allocator has no segment there: memory another
        // library mapped itself (NCCL's communicator state, seen on two H200s) is
        // `unmapped` while it is alive. It counts as released only where the captured
        // allocation lay in a pool the manifest declares (torch's, the sleep allocator's),
        // which the allocator would list if it were still mapped.
        let released = |p: &Probe| {
            p.state == AllocState::Free
                || (p.state == AllocState::Unmapped && captured.pool.is_some())
        };
        if let Some(p) = now.iter().find(|p| released(p)) {
            let state = if p.state == AllocState::Free {
                "a free block of the allocator"
            } else {
                "unmapped"
            };
            // Named by the kernels that read a freed address, not every kernel of the
            // group: one allocation can hold a live input and a freed intermediate.
            let gone = |addr: Addr| probes.at(addr).is_some_and(|pi| released(&l.probes[pi]));
            let refs = g.refs_at(m, gone);
            out.push(finding(
                ctx,
                g,
                &refs,
                FindingKind::Freed,
                format!(
                    "no owner explained it at capture, and {} is now {state}; replay reads freed memory",
                    p.addr
                ),
            ));
            continue;
        }
        let extents = captured_extents.get_or_insert_with(|| {
            m.allocations
                .iter()
                .map(|a| (a.base, a.size))
                .collect::<FxHashSet<_>>()
        });
        let moved = now.iter().find_map(|p| {
            let live = &l.allocations[lt.alloc_ix[&p.allocation?] as usize];
            (!holds(live, captured) && !extents.contains(&(live.base, live.size)))
                .then_some((p, live))
        });
        if let Some((p, live)) = moved {
            out.push(finding(
                ctx,
                g,
                &g.refs,
                FindingKind::Reused,
                format!(
                    "no owner explained it at capture, and {} now lies in another allocation {}+{} (captured in {}+{}); replay reads and writes whatever the allocator put there",
                    p.addr, live.base, live.size, captured.base, captured.size
                ),
            ));
            continue;
        }
        if l.event.contents == Contents::Preserved
            && let Some((r, now)) = changed_range(&m.ranges, &l.ranges, &addrs)
        {
            let inside = |addr: Addr| in_range(addr, r.addr, r.size);
            let refs = g.refs_at(m, inside);
            out.push(finding(
                ctx,
                g,
                &refs,
                FindingKind::Stale,
                format!(
                    "no owner explained it at capture, and the contents of {}+{} that the graphs read changed across `{}` (contents preserved): {} at capture, {} now",
                    r.addr, r.size, l.event.name, r.digest.0, now.0
                ),
            ));
        }
    }
}

/// The first captured range holding one of `addrs` whose live digest (same range, same
/// algorithm) differs, with that digest. A range the snapshot did not digest (unmapped, or
/// no digests asked for) says nothing.
fn changed_range<'a>(
    captured: &'a [RangeDigest],
    live: &'a [RangeDigest],
    addrs: &[Addr],
) -> Option<(&'a RangeDigest, &'a Digest)> {
    captured
        .iter()
        .filter(|r| addrs.iter().any(|&a| in_range(a, r.addr, r.size)))
        .find_map(|r| {
            let now = live.iter().find(|n| n.addr == r.addr && n.size == r.size)?;
            (now.digest.algorithm() == r.digest.algorithm() && now.digest != r.digest)
                .then_some((r, &now.digest))
        })
}

fn pool_name(ctx: &Ctx<'_>, g: &Group<'_>) -> Option<String> {
    g.alloc
        .and_then(|a| ctx.m.allocations[a].pool)
        .map(|p| ctx.m.pools[ctx.mt.pool_ix[&p] as usize].name.clone())
}

/// A finding on a group: named by its subject in hex, with no owner.
/// `refs`: the touches it names (all of the group's, or those the finding is about).
fn finding(
    ctx: &Ctx<'_>,
    g: &Group<'_>,
    refs: &[TouchRef],
    kind: FindingKind,
    detail: String,
) -> Finding {
    let (graphs, kernels) = kernel_refs(ctx.m, refs.iter().copied());
    let t = g.tensor;
    Finding {
        kind,
        severity: Severity::Error,
        rank: None,
        subject: g.key.to_string(),
        owners: Vec::new(),
        new_owners: Vec::new(),
        dtype: t.map(|t| t.dtype.clone()),
        shape: t.map(|t| t.shape.clone()),
        stride: t.map(|t| t.stride.clone()),
        captured_addr: Some(g.key),
        live_addr: None,
        pool: pool_name(ctx, g),
        graphs,
        kernels,
        detail,
        alloc_site: t.map(|t| t.alloc_site.clone()).unwrap_or_default(),
        retarget: None,
    }
}

#[cfg(test)]
mod tests;
