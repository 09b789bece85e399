//! Verify: classify every touched storage view of a manifest, alone (capture-time checks)
//! or against a live snapshot (all checks). The rules are `docs/findings.md`.

use std::cell::OnceCell;
use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

use super::live::{ProbeIndex, live_checks};
use crate::check::allow::Allowlist;
use crate::check::finding::{
    Finding, FindingKind, KernelRef, OwnerRef, REPORT_VERSION, Report, Severity,
};
use crate::document::format::{
    Addr, Live, Manifest, PoolKind, SleepPolicy, Tensor, TensorId, ViewKey,
};
use crate::document::index::{AddressIndex, IntervalIndex};
use crate::document::load::{Tables, check_live, check_manifest};
use crate::document::owner_path::OwnerPath;

/// A touched storage view and where it is touched.
pub(super) struct Subject<'m> {
    /// Tensor indices (into `manifest.tensors`) with this view key.
    pub(super) tensors: Vec<usize>,
    /// The first of them, for layout and address.
    pub(super) tensor: &'m Tensor,
    /// Owner indices (into `manifest.owners`).
    pub(super) owners: Vec<usize>,
}

/// Where a tensor is touched: (graph index, node index, touch index).
type TouchRef = (u32, u32, u32);

/// The touches of each manifest tensor, in one flat array (compressed rows): a million
/// touches cost two allocations, not one per tensor.
pub(super) struct TouchIndex {
    start: Vec<u32>,
    refs: Vec<TouchRef>,
}

impl TouchIndex {
    /// Also returns the touches that name no tensor.
    fn new(m: &Manifest, mt: &Tables) -> (TouchIndex, Vec<TouchRef>) {
        let touches = || {
            m.graphs.iter().enumerate().flat_map(|(gi, g)| {
                g.nodes.iter().enumerate().flat_map(move |(ni, n)| {
                    n.touches
                        .iter()
                        .enumerate()
                        .map(move |(ki, t)| ((gi as u32, ni as u32, ki as u32), t.tensor))
                })
            })
        };
        let mut start = vec![0u32; m.tensors.len() + 1];
        let mut bare = Vec::new();
        for (r, t) in touches() {
            match t {
                Some(id) => start[mt.tensor_ix[&id] as usize + 1] += 1,
                None => bare.push(r),
            }
        }
        for i in 1..start.len() {
            start[i] += start[i - 1];
        }
        let mut fill = start.clone();
        let mut refs = vec![(0, 0, 0); start[m.tensors.len()] as usize];
        for (r, t) in touches() {
            if let Some(id) = t {
                let slot = &mut fill[mt.tensor_ix[&id] as usize];
                refs[*slot as usize] = r;
                *slot += 1;
            }
        }
        (TouchIndex { start, refs }, bare)
    }
}

impl std::ops::Index<usize> for TouchIndex {
    type Output = [TouchRef];
    fn index(&self, tensor: usize) -> &[TouchRef] {
        &self.refs[self.start[tensor] as usize..self.start[tensor + 1] as usize]
    }
}

pub(super) struct Ctx<'m> {
    pub(super) m: &'m Manifest,
    pub(super) mt: &'m Tables,
    /// Touch references per manifest tensor index.
    pub(super) touches_of: TouchIndex,
    /// Manifest tensors by the span of their storage, built on first use: only subjects
    /// held through plain attributes, or whose owner paths moved, need it.
    pub(super) storages: OnceCell<IntervalIndex<usize>>,
    /// Manifest tensors by the span of their view, built on first use.
    pub(super) views: OnceCell<IntervalIndex<usize>>,
}

/// Whether the storage of `storage` holds every byte of `view`'s span.
pub(super) fn storage_holds(storage: &Tensor, view: &Tensor) -> bool {
    let start = view.data_ptr().0;
    let end = start.saturating_add(view.nbytes);
    storage.storage_base.0 <= start
        && end
            <= storage
                .storage_base
                .0
                .saturating_add(storage.storage_nbytes)
}

/// Whether two tensors are views of one storage: same base, same size.
pub(super) fn same_storage(a: &Tensor, b: &Tensor) -> bool {
    a.storage_base == b.storage_base && a.storage_nbytes == b.storage_nbytes
}

/// Whether two owner paths name slots of one container that differ only in one index
/// (`ys[2]` and `ys[1]`, `experts[3].w` and `experts[2].w`): where a list insert or delete
/// moves a tensor.
pub(super) fn shift_siblings(a: &OwnerPath, b: &OwnerPath) -> bool {
    a.index_shift(b).is_some()
}

/// Whether `path`, now holding the manifest tensor `now` (captured under other paths),
/// took part in a shift of its list by an insert or a delete: the tensor now at `path`
/// came from a sibling index by the same displacement by which the subject moved to one of
/// its `carriers`. A swap or any other permutation moves them by different displacements,
/// and an alias (`c_strides2 = c_strides1`) by none: those stay `drifted`, since the
/// model now reads another tensor through `path` than the graphs do.
pub(super) fn shifted(
    ctx: &Ctx<'_>,
    path: &OwnerPath,
    now: usize,
    carriers: &BTreeSet<&OwnerPath>,
) -> bool {
    let came: Vec<i64> = ctx.mt.owners_of[now]
        .iter()
        .filter_map(|&o| ctx.m.owners[o].path.index_shift(path))
        .collect();
    carriers
        .iter()
        .filter_map(|c| path.index_shift(c))
        .any(|went| went != 0 && came.contains(&went))
}

/// The graphs (sorted names) and node parameters of some touches, deduplicated.
pub(super) fn kernel_refs(
    m: &Manifest,
    refs: impl Iterator<Item = TouchRef>,
) -> (Vec<String>, Vec<KernelRef>) {
    let mut graphs = BTreeSet::new();
    let mut kernels = Vec::new();
    for (g, n, k) in refs {
        let graph = &m.graphs[g as usize];
        let node = &graph.nodes[n as usize];
        let touch = &node.touches[k as usize];
        graphs.insert(graph.name.as_str());
        kernels.push(KernelRef {
            graph: graph.name.clone(),
            node: node.index,
            name: node.name.clone(),
            param: touch.param,
            offset: touch.offset,
            addr: touch.addr,
        });
    }
    kernels.sort();
    kernels.dedup();
    (graphs.into_iter().map(String::from).collect(), kernels)
}

impl<'m> Ctx<'m> {
    /// Indices of the manifest tensors whose storage holds every byte of `t`'s view
    /// (`t`'s own tensors among them).
    pub(super) fn holders(&self, t: &Tensor) -> Vec<usize> {
        let index = self.storages.get_or_init(|| {
            IntervalIndex::new(
                self.m
                    .tensors
                    .iter()
                    .enumerate()
                    .map(|(i, t)| {
                        let base = t.storage_base.0;
                        (base, base.saturating_add(t.storage_nbytes), i)
                    })
                    .collect(),
            )
        });
        let mut out = Vec::new();
        index.stab(t.data_ptr().0, |_, _, i| {
            if storage_holds(&self.m.tensors[i], t) {
                out.push(i);
            }
        });
        out
    }

    /// The manifest tensor with `l`'s view and storage, if any: a live tensor graphcheck
    /// already knew at capture.
    pub(super) fn known(&self, l: &Tensor) -> Option<usize> {
        let index = self.views.get_or_init(|| {
            IntervalIndex::new(
                self.m
                    .tensors
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (t.data_ptr().0, t.end().0, i))
                    .collect(),
            )
        });
        let mut found = None;
        index.stab(l.data_ptr().0, |_, _, i| {
            let m = &self.m.tensors[i];
            if m.view_key() == l.view_key() && same_storage(m, l) {
                found.get_or_insert(i);
            }
        });
        found
    }

    /// The registered owners (parameter, buffer, held) of the manifest tensors that share
    /// `t`'s storage and whose own view covers `t`'s bytes: a view into a registered
    /// tensor is registered through it, because sleep and an in-place reload
    /// (`param.copy_`) restore those bytes. Bytes of the storage outside every registered
    /// view are restored by sleep but not by an in-place reload, so they do not count.
    pub(super) fn registered_through(&self, t: &Tensor) -> Vec<usize> {
        let mut owners: Vec<usize> = self
            .holders(t)
            .into_iter()
            .filter(|&i| {
                let r = &self.m.tensors[i];
                r.data_ptr() <= t.data_ptr() && t.end() <= r.end()
            })
            .flat_map(|i| self.mt.owners_of[i].iter().copied())
            .filter(|&o| self.m.owners[o].registration.is_registered())
            .collect();
        owners.sort_unstable();
        owners.dedup();
        owners
    }

    pub(super) fn kernels(&self, tensors: &[usize]) -> (Vec<String>, Vec<KernelRef>) {
        kernel_refs(
            self.m,
            tensors
                .iter()
                .flat_map(|&t| self.touches_of[t].iter().copied()),
        )
    }

    pub(super) fn pool_name(&self, t: &Tensor) -> Option<String> {
        t.pool
            .map(|p| self.m.pools[self.mt.pool_ix[&p] as usize].name.clone())
    }

    pub(super) fn finding(
        &self,
        kind: FindingKind,
        s: &Subject<'m>,
        owners: &[usize],
        detail: String,
    ) -> Finding {
        let mut refs: Vec<OwnerRef> = owners
            .iter()
            .map(|&o| OwnerRef {
                path: self.m.owners[o].path.to_string(),
                registration: self.m.owners[o].registration,
            })
            .collect();
        refs.sort();
        refs.dedup();
        let subject = refs
            .iter()
            .map(|o| o.path.as_str())
            .collect::<Vec<_>>()
            .join(" = ");
        let (graphs, kernels) = self.kernels(&s.tensors);
        let t = s.tensor;
        Finding {
            kind,
            severity: Severity::Error,
            subject,
            owners: refs,
            new_owners: Vec::new(),
            dtype: Some(t.dtype.clone()),
            shape: Some(t.shape.clone()),
            stride: Some(t.stride.clone()),
            captured_addr: Some(t.data_ptr()),
            live_addr: None,
            pool: self.pool_name(t),
            graphs,
            kernels,
            detail,
            alloc_site: t.alloc_site.clone(),
        }
    }
}

/// Why verify could not run: an inconsistent document handed in memory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    #[error("invalid manifest at `{}`: {}", .0.json_path, .0.message)]
    Manifest(crate::document::load::Invalid),
    #[error("invalid live snapshot at `{}`: {}", .0.json_path, .0.message)]
    Live(crate::document::load::Invalid),
}

/// Verifies a manifest, alone or against a live snapshot, under an allowlist. Checks both
/// documents first, so an inconsistent one is an error, never a panic.
pub fn verify(m: &Manifest, live: Option<&Live>, allow: &Allowlist) -> Result<Report, VerifyError> {
    let mt = check_manifest(m).map_err(VerifyError::Manifest)?;
    let lt = live
        .map(|l| check_live(l).map_err(VerifyError::Live))
        .transpose()?;
    Ok(verify_checked(m, &mt, live.zip(lt.as_ref()), allow))
}

/// [`verify`] for documents already checked (the loaders in [`crate::document::load`] return their
/// [`Tables`]); the tables must be those of these documents.
pub fn verify_checked(
    m: &Manifest,
    mt: &Tables,
    live: Option<(&Live, &Tables)>,
    allow: &Allowlist,
) -> Report {
    let (touches_of, bare) = TouchIndex::new(m, mt);
    let ctx = Ctx {
        m,
        mt,
        touches_of,
        storages: OnceCell::new(),
        views: OnceCell::new(),
    };

    // Subjects: touched tensors grouped by view key, in document order of first tensor.
    let mut by_key: FxHashMap<ViewKey<'_>, usize> = FxHashMap::default();
    let mut subjects: Vec<Subject<'_>> = Vec::new();
    for (ti, t) in m.tensors.iter().enumerate() {
        if ctx.touches_of[ti].is_empty() {
            continue;
        }
        let si = *by_key.entry(t.view_key()).or_insert_with(|| {
            subjects.push(Subject {
                tensors: Vec::new(),
                tensor: t,
                owners: Vec::new(),
            });
            subjects.len() - 1
        });
        subjects[si].tensors.push(ti);
        subjects[si].owners.extend_from_slice(&ctx.mt.owners_of[ti]);
    }

    let mut findings = Vec::new();
    for s in &subjects {
        capture_checks(&ctx, s, &mut findings);
    }
    unowned(&ctx, &bare, &subjects, &mut findings);
    if let Some((l, lt)) = live {
        let live_index = AddressIndex::new(&l.tensors, &l.allocations);
        let probes = ProbeIndex::new(l);
        for s in &subjects {
            live_checks(&ctx, l, lt, &live_index, &probes, s, &mut findings);
        }
    }

    let checked: Vec<FindingKind> = if live.is_some() {
        FindingKind::ALL.to_vec()
    } else {
        let mut k = FindingKind::CAPTURE_TIME.to_vec();
        k.push(FindingKind::UnusedAllow);
        k
    };
    let (mut findings, mut allowed) = allow.apply(findings, &checked);
    findings.sort_by(|a, b| (a.kind, &a.subject).cmp(&(b.kind, &b.subject)));
    allowed.sort_by(|a, b| {
        (a.finding.kind, &a.finding.subject).cmp(&(b.finding.kind, &b.finding.subject))
    });
    let mut summary = BTreeMap::new();
    for f in &findings {
        *summary.entry(f.kind).or_insert(0) += 1;
    }
    Report {
        format_version: REPORT_VERSION,
        ok: findings.iter().all(|f| f.severity == Severity::Warning),
        checked,
        summary,
        findings,
        allowed,
        subjects: subjects.len(),
        graphs: m.graphs.len(),
        unread_nodes: m
            .graphs
            .iter()
            .map(|g| g.unread.len() + g.nodes.iter().filter(|n| n.opaque.is_some()).count())
            .sum(),
    }
}

pub(super) fn persistent(ctx: &Ctx<'_>, s: &Subject<'_>) -> Vec<usize> {
    let mut p: Vec<usize> = s
        .owners
        .iter()
        .copied()
        .filter(|&o| ctx.m.owners[o].registration.is_persistent())
        .collect();
    p.sort_unstable();
    p.dedup();
    p
}

fn capture_checks(ctx: &Ctx<'_>, s: &Subject<'_>, out: &mut Vec<Finding>) {
    let p = persistent(ctx, s);
    if p.is_empty() {
        return;
    }
    if !p
        .iter()
        .any(|&o| ctx.m.owners[o].registration.is_registered())
        && ctx.registered_through(s.tensor).is_empty()
    {
        let regs: BTreeSet<&str> = p
            .iter()
            .map(|&o| ctx.m.owners[o].registration.as_str())
            .collect();
        out.push(ctx.finding(
            FindingKind::Unregistered,
            s,
            &p,
            format!(
                "held only as {}; register it as a buffer (or list it in persistent_tensors())",
                regs.into_iter().collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    if let Some(pool) = s.tensor.pool {
        let pool = &ctx.m.pools[ctx.mt.pool_ix[&pool] as usize];
        if pool.sleep == SleepPolicy::Discarded {
            out.push(ctx.finding(
                FindingKind::Mispooled,
                s,
                &p,
                format!(
                    "allocated in pool `{}`, whose memory sleep discards without restoring it",
                    pool.name
                ),
            ));
        }
    }
}

/// The touches of one unowned subject, its allocation index and its tensor, if any.
type UnownedGroup<'m> = (Vec<TouchRef>, Option<usize>, Option<&'m Tensor>);

/// Touches that name no tensor, or a tensor with no owner, outside any graph pool.
fn unowned<'m>(ctx: &Ctx<'m>, bare: &[TouchRef], subjects: &[Subject<'m>], out: &mut Vec<Finding>) {
    let m = ctx.m;
    let mut index: Option<AddressIndex> = None;
    // subject string -> (touch refs, allocation index, first tensor)
    let mut groups: BTreeMap<Addr, UnownedGroup<'m>> = BTreeMap::new();
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
        let e = groups.entry(key).or_insert((Vec::new(), alloc, tensor));
        e.0.push(r);
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
    for (key, (refs, alloc, tensor)) in groups {
        let (graphs, kernels) = kernel_refs(m, refs.into_iter());
        let pool = alloc
            .and_then(|a| m.allocations[a].pool)
            .map(|p| m.pools[ctx.mt.pool_ix[&p] as usize].name.clone());
        let detail = match (tensor, alloc) {
            (Some(_), _) => "a tensor the graphs read, but no owner path reaches it".to_string(),
            (None, Some(a)) => format!(
                "inside allocation {}+{} ({}), which no owner, graph input or graph pool explains",
                m.allocations[a].base,
                m.allocations[a].size,
                pool.as_deref().unwrap_or("no pool")
            ),
            (None, None) => "an address in no known allocation".to_string(),
        };
        out.push(Finding {
            kind: FindingKind::Unowned,
            severity: Severity::Error,
            subject: key.to_string(),
            owners: Vec::new(),
            new_owners: Vec::new(),
            dtype: tensor.map(|t| t.dtype.clone()),
            shape: tensor.map(|t| t.shape.clone()),
            stride: tensor.map(|t| t.stride.clone()),
            captured_addr: Some(key),
            live_addr: None,
            pool,
            graphs,
            kernels,
            detail,
            alloc_site: tensor.map(|t| t.alloc_site.clone()).unwrap_or_default(),
        });
    }
}

/// The tensor ids of a manifest that some touch names.
pub fn touched(m: &Manifest) -> BTreeSet<TensorId> {
    m.graphs
        .iter()
        .flat_map(|g| &g.nodes)
        .flat_map(|n| &n.touches)
        .filter_map(|t| t.tensor)
        .collect()
}

#[cfg(test)]
mod tests;
