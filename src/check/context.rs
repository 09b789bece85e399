//! What verify's rules share: the touched storage views (subjects), where each is touched,
//! the manifest's lookups, and the small predicates both the capture-time and the live
//! checks use. Below both [`super::verify`] and [`super::live`].

use std::collections::BTreeSet;
use std::sync::OnceLock;

use smallvec::SmallVec;

use crate::check::finding::{Finding, FindingKind, KernelRef, OwnerRef, Severity};
use crate::index::address::IntervalIndex;
use crate::index::refs::Tables;
use crate::model::format::{Manifest, Tensor};
use crate::model::owner_path::OwnerPath;

/// A touched storage view and where it is touched.
pub(super) struct Subject<'m> {
    /// Tensor indices (into `manifest.tensors`) with this view key.
    pub(super) tensors: SmallVec<[usize; 2]>,
    /// The first of them, for layout and address.
    pub(super) tensor: &'m Tensor,
    /// Owner indices (into `manifest.owners`).
    pub(super) owners: SmallVec<[usize; 2]>,
}

/// Where a tensor is touched: (graph index, node index, touch index).
pub(super) type TouchRef = (u32, u32, u32);

/// The touches of each manifest tensor, in one flat array (compressed rows): a million
/// touches cost two allocations, not one per tensor.
pub(super) struct TouchIndex {
    start: Vec<u32>,
    refs: Vec<TouchRef>,
}

impl TouchIndex {
    /// Also returns the touches that name no tensor. `counts` holds the touches of each
    /// tensor ([`Tables::touch_counts`]); counts that do not match the manifest's touches
    /// (tables of another manifest, or of this one before it changed) are made again here.
    /// The flag says whether they were made again.
    pub(super) fn new(
        m: &Manifest,
        mt: &Tables,
        counts: &[u32],
    ) -> (TouchIndex, Vec<TouchRef>, bool) {
        match Self::filled(m, mt, counts) {
            Some((index, bare)) => (index, bare, false),
            None => {
                let counts = count_touches(m, mt);
                let (index, bare) =
                    Self::filled(m, mt, &counts).expect("counts made from the touches match them");
                (index, bare, true)
            }
        }
    }

    /// How many touches name tensor `t`.
    pub(super) fn count(&self, t: usize) -> u32 {
        self.start[t + 1] - self.start[t]
    }

    /// The index over `counts`, or `None` where they do not match the touches.
    fn filled(m: &Manifest, mt: &Tables, counts: &[u32]) -> Option<(TouchIndex, Vec<TouchRef>)> {
        if counts.len() != m.tensors.len() {
            return None;
        }
        let mut start = Vec::with_capacity(counts.len() + 1);
        let mut total = 0u32;
        start.push(0);
        for &c in counts {
            total = total.checked_add(c)?;
            start.push(total);
        }
        let mut fill = start.clone();
        let mut refs = vec![(0, 0, 0); total as usize];
        let mut bare = Vec::new();
        for (gi, g) in m.graphs.iter().enumerate() {
            for (ni, n) in g.nodes.iter().enumerate() {
                for (ki, t) in n.touches.iter().enumerate() {
                    let r = (gi as u32, ni as u32, ki as u32);
                    match t.tensor {
                        Some(id) => {
                            let x = mt.tensor_ix[&id] as usize;
                            let slot = &mut fill[x];
                            if *slot >= start[x + 1] {
                                return None;
                            }
                            refs[*slot as usize] = r;
                            *slot += 1;
                        }
                        None => bare.push(r),
                    }
                }
            }
        }
        // Every tensor's row filled to its count: no placeholder left.
        if fill[..counts.len()] != start[1..] {
            return None;
        }
        Some((TouchIndex { start, refs }, bare))
    }
}

/// The touches of each tensor of `m`: the tables' count where checking made one, else
/// counted here. [`TouchIndex::new`] checks the tables' counts against the touches.
pub(super) fn touch_counts<'a>(m: &Manifest, mt: &'a Tables) -> std::borrow::Cow<'a, [u32]> {
    if mt.touch_counts.len() == m.tensors.len() {
        return std::borrow::Cow::Borrowed(&mt.touch_counts);
    }
    std::borrow::Cow::Owned(count_touches(m, mt))
}

fn count_touches(m: &Manifest, mt: &Tables) -> Vec<u32> {
    let mut counts = vec![0u32; m.tensors.len()];
    for t in m
        .graphs
        .iter()
        .flat_map(|g| &g.nodes)
        .flat_map(|n| &n.touches)
    {
        if let Some(id) = t.tensor {
            counts[mt.tensor_ix[&id] as usize] += 1;
        }
    }
    counts
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
    pub(super) storages: OnceLock<IntervalIndex<usize>>,
    /// Manifest tensors by the span of their view, built on first use.
    pub(super) views: OnceLock<IntervalIndex<usize>>,
    /// Whether the manifest and the live snapshot number storages alike (one producer
    /// session, [`crate::model::format::Producer::session`]): then a captured storage and
    /// a live one are one object only where their numbers agree.
    pub(super) numbered: bool,
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
            name: node.name.to_string(),
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
    /// (`t`'s own tensors among them), of `t`'s storage object where the document numbers
    /// storages (`Tensor::storage`).
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
            let holder = &self.m.tensors[i];
            if storage_holds(holder, t) && holder.same_storage_object(t) {
                out.push(i);
            }
        });
        out
    }

    /// Whether the live tensor `live` and the manifest tensor `captured` are views of one
    /// storage object: the same base and size and, where the two documents number
    /// storages alike, the same number (a storage the allocator put in a dead one's block
    /// has the dead one's base and size, and is another storage).
    pub(super) fn same_storage_now(&self, live: &Tensor, captured: &Tensor) -> bool {
        same_storage(live, captured) && (!self.numbered || live.storage == captured.storage)
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
            if m.view_key() == l.view_key() && self.same_storage_now(l, m) {
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
            rank: None,
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
            retarget: None,
        }
    }
}

/// The subject's owners (indices into `manifest.owners`) whose registration survives a
/// reload (parameters, buffers), sorted and distinct.
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
