//! Building a manifest from what a walker read (raw address words per node) and what the
//! framework knows (tensor views, owners, pools): every word is resolved to a tensor view
//! through the address index, or left a bare allocation. GPU-free, so CI tests it; the
//! CUDA walker (`cuda` feature) and the Python front both feed it.

use std::collections::HashMap;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use serde::{Deserialize, Serialize};

use super::signature::{NodeSignature, ParamLayout, WordRole, param_layouts};
use super::walked::{RangeSet, WalkedGraph, WalkedNode, slots};
use crate::index::address::{AddressIndex, IntervalIndex};
use crate::index::refs::{Invalid, check_manifest};
use crate::model::format::{
    Addr, Allocation, AllocationId, Digest, Frame, Graph, GraphId, Guard, IgnoredReason,
    IgnoredWord, Manifest, Node, Owner, Pool, PoolId, PoolKind, Producer, Registration,
    SleepPolicy, Tensor, TensorId, Touch,
};
use crate::model::owner_path::OwnerPath;

/// A tensor view as the framework describes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorSpec {
    pub storage_base: Addr,
    pub storage_nbytes: u64,
    pub offset: u64,
    pub nbytes: u64,
    pub shape: Vec<u64>,
    pub stride: Vec<i64>,
    pub dtype: String,
    pub itemsize: u32,
    pub device: String,
    #[serde(default)]
    pub pool: Option<PoolId>,
    #[serde(default)]
    pub digest: Option<Digest>,
    #[serde(default)]
    pub alloc_site: Vec<Frame>,
    /// The storage object's number, where two storages of the walks had one address
    /// (the model's `Tensor::storage`): views are one record only within one storage.
    #[serde(default)]
    pub storage: Option<u32>,
    /// The graphs at whose capture the storage was alive, by the order they were added:
    /// `[first, end)`, `end` null while it lives. A graph's words resolve only to the views
    /// alive at its capture. Absent: alive at every capture.
    #[serde(default)]
    pub alive: Option<(u32, Option<u32>)>,
}

impl TensorSpec {
    /// The document's tensor record of this view, not yet placed in an allocation.
    pub fn into_tensor(self, id: TensorId) -> Tensor {
        Tensor {
            id,
            storage_base: self.storage_base,
            storage_nbytes: self.storage_nbytes,
            offset: self.offset,
            nbytes: self.nbytes,
            shape: self.shape,
            stride: self.stride,
            dtype: self.dtype,
            itemsize: self.itemsize,
            device: self.device,
            allocation: None,
            pool: self.pool,
            digest: self.digest,
            reference_digest: None,
            alloc_site: self.alloc_site,
            storage: self.storage,
        }
    }
}

/// Why a manifest could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    #[error("owner path {path:?} is given twice, for tensors {first} and {second}")]
    DuplicateOwner {
        path: String,
        first: TensorId,
        second: TensorId,
    },
    #[error(transparent)]
    Path(#[from] crate::model::owner_path::PathError),
    #[error("no {0} was added")]
    UnknownTensor(TensorId),
    #[error("no {0} was declared")]
    UnknownPool(PoolId),
    #[error("the built document is inconsistent at `{}`: {}", .0.json_path, .0.message)]
    Inconsistent(Invalid),
    /// A spec handed to a builder refers to something it does not have.
    #[error("{0}")]
    Spec(String),
}

/// Collects pools, tensors, owners and walked graphs; [`ManifestBuilder::finish`] resolves.
#[derive(Debug)]
pub struct ManifestBuilder {
    producer: Producer,
    pools: Vec<Pool>,
    pool_ranges: Vec<(u64, u64, PoolId)>,
    known_allocations: Vec<(Addr, u64)>,
    tensors: Vec<Tensor>,
    /// Each tensor's captures alive (`TensorSpec::alive`), by position.
    alive: Vec<Option<(u32, Option<u32>)>>,
    views: HashMap<ViewOf, TensorId>,
    owners: Vec<Owner>,
    /// Each path's tensors: more than one where the path held another storage at another
    /// capture (each numbered, `TensorSpec::storage`).
    owner_paths: HashMap<String, Vec<TensorId>>,
    graphs: Vec<(String, Option<PoolId>, Arc<WalkedGraph>)>,
    /// Memory the allocator holds free (`[start, end)`), for [`IgnoredReason::FreeMemory`].
    free_ranges: Vec<(u64, u64)>,
    /// Each graph's guarded static inputs (`Graph::guards`), by graph.
    guards: HashMap<GraphId, Vec<Guard>>,
    /// Each graph's retargets (`Graph::retargets`), by graph.
    retargets: HashMap<GraphId, Vec<crate::model::format::RetargetRecord>>,
}

impl ManifestBuilder {
    pub fn new(producer: Producer) -> ManifestBuilder {
        ManifestBuilder {
            producer,
            pools: Vec::new(),
            pool_ranges: Vec::new(),
            known_allocations: Vec::new(),
            tensors: Vec::new(),
            alive: Vec::new(),
            views: HashMap::new(),
            owners: Vec::new(),
            owner_paths: HashMap::new(),
            graphs: Vec::new(),
            free_ranges: Vec::new(),
            guards: HashMap::new(),
            retargets: HashMap::new(),
        }
    }

    /// Records the retargets applied to graph `id` ([`Graph::retargets`]).
    pub fn note_retargets(
        &mut self,
        id: GraphId,
        records: Vec<crate::model::format::RetargetRecord>,
    ) {
        self.retargets.entry(id).or_default().extend(records);
    }

    /// Records the static inputs torch's CUDA-graph trees guard for graph `id`
    /// ([`Graph::guards`]).
    pub fn guard_graph(&mut self, id: GraphId, guards: Vec<Guard>) {
        self.guards.entry(id).or_default().extend(guards);
    }

    /// Declares `[base, base + size)` free in the allocator now (a free block of a segment):
    /// a word inside a by-value struct that points there and names no tensor is stale bytes,
    /// not an address a kernel reads ([`IgnoredReason::FreeMemory`]).
    pub fn add_free_range(&mut self, base: Addr, size: u64) {
        if size > 0 {
            self.free_ranges.push((base.0, base.0.saturating_add(size)));
        }
    }

    /// Declares a pool; returns its id.
    pub fn add_pool(&mut self, name: &str, kind: PoolKind, sleep: SleepPolicy) -> PoolId {
        let id = PoolId(self.pools.len() as u32);
        self.pools.push(Pool {
            id,
            name: name.to_string(),
            kind,
            sleep,
        });
        id
    }

    /// Declares that `[base, base + size)` belongs to a pool (a segment of it).
    pub fn add_pool_range(
        &mut self,
        base: Addr,
        size: u64,
        pool: PoolId,
    ) -> Result<(), BuildError> {
        if pool.0 as usize >= self.pools.len() {
            return Err(BuildError::UnknownPool(pool));
        }
        self.pool_ranges
            .push((base.0, base.0.saturating_add(size), pool));
        Ok(())
    }

    /// Declares an allocation the walk may not have seen (one holding a registered tensor
    /// no kernel touches).
    pub fn add_allocation(&mut self, base: Addr, size: u64) {
        self.known_allocations.push((base, size));
    }

    /// Adds a tensor view, or returns the id of the equal view already added.
    pub fn add_tensor(&mut self, spec: TensorSpec) -> Result<TensorId, BuildError> {
        if let Some(p) = spec.pool
            && p.0 as usize >= self.pools.len()
        {
            return Err(BuildError::UnknownPool(p));
        }
        let data_ptr = Addr(spec.storage_base.0.wrapping_add(spec.offset));
        let key = (
            data_ptr,
            spec.shape.clone(),
            spec.stride.clone(),
            spec.dtype.clone(),
            spec.storage,
        );
        if let Some(&id) = self.views.get(&key) {
            return Ok(id);
        }
        let id = TensorId(self.tensors.len() as u32);
        self.alive.push(spec.alive);
        self.tensors.push(spec.into_tensor(id));
        self.views.insert(key, id);
        Ok(id)
    }

    /// Adds an owner path of a tensor. The same path for the same tensor is accepted once
    /// more (walks meet aliases twice). For another tensor it is accepted where the path
    /// held another storage at another capture: both tensors carry storage numbers, and
    /// they differ (the manifest then gives the path once per storage, `docs/format.md`);
    /// else it is an error.
    pub fn add_owner(
        &mut self,
        path: &str,
        tensor: TensorId,
        registration: Registration,
        holder: Option<String>,
    ) -> Result<(), BuildError> {
        let path = OwnerPath::parse(path)?;
        if tensor.0 as usize >= self.tensors.len() {
            return Err(BuildError::UnknownTensor(tensor));
        }
        let storage = |t: TensorId| self.tensors[t.0 as usize].storage;
        if let Some(held) = self.owner_paths.get(path.as_str()) {
            if held.contains(&tensor) {
                return Ok(());
            }
            let mine = storage(tensor);
            if let Some(&t) = held
                .iter()
                .find(|&&t| mine.is_none() || storage(t).is_none_or(|n| Some(n) == mine))
            {
                return Err(BuildError::DuplicateOwner {
                    path: path.to_string(),
                    first: t,
                    second: tensor,
                });
            }
        }
        self.owner_paths
            .entry(path.to_string())
            .or_default()
            .push(tensor);
        self.owners.push(Owner {
            path,
            tensor,
            registration,
            holder,
        });
        Ok(())
    }

    /// Adds a walked graph.
    ///
    /// Memory the graph allocates itself (its `mem_alloc` nodes) is declared as a graph
    /// pool of its own, named after the graph: what lies there is the graph's, not an
    /// owner's, and sleep or reload does not concern it.
    /// Adds a walked graph (taken as it is or shared: a recorder builds manifests of the
    /// same walked graphs again and again, and nothing is copied for that).
    pub fn add_graph(
        &mut self,
        name: &str,
        pool: Option<PoolId>,
        walked: impl Into<Arc<WalkedGraph>>,
    ) -> GraphId {
        let walked = walked.into();
        if !walked.graph_allocations.is_empty() {
            let own = self.add_pool(
                &format!("{name} graph allocations"),
                PoolKind::Graph,
                SleepPolicy::Untouched,
            );
            for &(base, size) in &walked.graph_allocations {
                self.pool_ranges
                    .push((base.0, base.0.saturating_add(size), own));
            }
        }
        let id = GraphId(self.graphs.len() as u32);
        self.graphs.push((name.to_string(), pool, walked));
        id
    }

    /// Resolves every word and returns the checked manifest.
    pub fn finish(self) -> Result<Manifest, BuildError> {
        let pools = PoolMap::new(self.pool_ranges, &self.pools);
        let allocations = allocations(&self.graphs, &self.known_allocations, &pools);
        let mut tensors = self.tensors;
        place_tensors(&mut tensors, &allocations, &pools);
        let mut nodes = NodeResolver {
            views: ViewResolver::new(&tensors, &self.owners, &self.alive),
            graph: 0,
            view_of: FxHashMap::default(),
            by_base: allocations.iter().map(|a| (a.base, a.id)).collect(),
            free: RangeSet::new(self.free_ranges),
            pools: &pools,
            layouts: Vec::new(),
            layout_by_ptr: FxHashMap::default(),
            layout_by_name: FxHashMap::default(),
        };
        let mut guards = self.guards;
        let mut retargets = self.retargets;
        let graphs: Vec<Graph> = self
            .graphs
            .into_iter()
            .enumerate()
            .map(|(gi, (name, pool, walked))| {
                nodes.graph = gi as u32;
                Graph {
                    id: GraphId(gi as u32),
                    name,
                    pool,
                    node_counts: walked.node_counts.clone(),
                    unread: walked.unread.clone(),
                    guards: guards.remove(&GraphId(gi as u32)).unwrap_or_default(),
                    retargets: retargets.remove(&GraphId(gi as u32)).unwrap_or_default(),
                    nodes: walked.nodes.iter().map(|n| nodes.node(n)).collect(),
                }
            })
            .collect();
        drop(nodes);

        let mut m = Manifest::new(self.producer);
        m.pools = self.pools;
        m.allocations = allocations;
        m.owners = captured_owners(self.owners, &self.owner_paths, &tensors, &graphs);
        m.tensors = tensors;
        m.graphs = graphs;
        check_manifest(&m).map_err(BuildError::Inconsistent)?;
        Ok(m)
    }
}

/// The owners, where a path held several storages, only with those a graph captured: the
/// first one added (what the path held at the last walk) stays whether a graph read it or
/// not, a storage the path held earlier only where a graph read it.
fn captured_owners(
    owners: Vec<Owner>,
    paths: &HashMap<String, Vec<TensorId>>,
    tensors: &[Tensor],
    graphs: &[Graph],
) -> Vec<Owner> {
    if paths.values().all(|held| held.len() < 2) {
        return owners;
    }
    let mut touched = vec![false; tensors.len()];
    for t in graphs
        .iter()
        .flat_map(|g| &g.nodes)
        .flat_map(|n| &n.touches)
    {
        if let Some(id) = t.tensor {
            touched[id.0 as usize] = true;
        }
    }
    owners
        .into_iter()
        .filter(|o| {
            let held = &paths[o.path.as_str()];
            held.len() < 2 || held[0] == o.tensor || touched[o.tensor.0 as usize]
        })
        .collect()
}

/// Which pool holds an address, from the declared pool ranges. Where ranges overlap, the
/// one declared first wins: the spec's `pool_ranges` (an allocator's own table of
/// allocations, vLLM's) before the bound segments, as the live snapshot decides
/// ([`super::facts::SegmentMap::pool_at`]).
struct PoolMap {
    index: IntervalIndex<(usize, PoolId)>,
    kinds: Vec<PoolKind>,
}

impl PoolMap {
    fn new(ranges: Vec<(u64, u64, PoolId)>, pools: &[Pool]) -> PoolMap {
        PoolMap {
            index: IntervalIndex::new(
                ranges
                    .into_iter()
                    .enumerate()
                    .map(|(i, (start, end, p))| (start, end, (i, p)))
                    .collect(),
            ),
            kinds: pools.iter().map(|p| p.kind).collect(),
        }
    }

    fn pool_at(&self, a: u64) -> Option<PoolId> {
        self.index
            .stab_vec(a)
            .into_iter()
            .min_by_key(|&(declared, _)| declared)
            .map(|(_, p)| p)
    }

    fn in_graph_pool(&self, a: u64) -> bool {
        self.index
            .stab_vec(a)
            .iter()
            .any(|(_, p)| self.kinds.get(p.0 as usize) == Some(&PoolKind::Graph))
    }
}

/// Every allocation the walk saw, plus the declared ones, numbered by base address.
fn allocations(
    graphs: &[(String, Option<PoolId>, Arc<WalkedGraph>)],
    known: &[(Addr, u64)],
    pools: &PoolMap,
) -> Vec<Allocation> {
    // Words come in runs into one allocation: hashed first, sorted once.
    let mut by_base: FxHashMap<Addr, u64> = FxHashMap::default();
    let seen = graphs
        .iter()
        .flat_map(|(_, _, g)| &g.nodes)
        .flat_map(|n| &n.words)
        .filter_map(|w| w.allocation);
    for (base, size) in seen.chain(known.iter().copied()) {
        let e = by_base.entry(base).or_insert(size);
        *e = (*e).max(size);
    }
    let mut ranges: Vec<(Addr, u64)> = by_base.into_iter().collect();
    ranges.sort_unstable();
    ranges
        .into_iter()
        .filter(|&(_, size)| size > 0)
        .enumerate()
        .map(|(i, (base, size))| Allocation {
            id: AllocationId(i as u32),
            base,
            size,
            pool: pools.pool_at(base.0),
        })
        .collect()
}

/// Sets each tensor's allocation (the one holding its whole storage) and, where the
/// framework named none, its pool.
fn place_tensors(tensors: &mut [Tensor], allocations: &[Allocation], pools: &PoolMap) {
    let alloc_index = AddressIndex::new(&[], allocations);
    for t in tensors {
        let holder = alloc_index
            .allocations_at(t.storage_base)
            .into_iter()
            .find(|&i| {
                let a = &allocations[i];
                t.storage_base.0 + t.storage_nbytes <= a.base.0 + a.size
            });
        t.allocation = holder.map(|i| allocations[i].id);
        if t.pool.is_none() {
            t.pool = holder
                .and_then(|i| allocations[i].pool)
                .or_else(|| pools.pool_at(t.storage_base.0));
        }
    }
}

/// A view's key in the builder: address, layout, and the storage object's number.
type ViewOf = (Addr, Vec<u64>, Vec<i64>, String, Option<u32>);

/// From an address to the tensor view a kernel most likely was handed.
struct ViewResolver<'a> {
    tensors: &'a [Tensor],
    owned: Vec<bool>,
    index: AddressIndex,
    alive: &'a [Option<(u32, Option<u32>)>],
    /// Whether any view lives for some captures only: then an address resolves per graph.
    per_graph: bool,
}

impl<'a> ViewResolver<'a> {
    fn new(
        tensors: &'a [Tensor],
        owners: &[Owner],
        alive: &'a [Option<(u32, Option<u32>)>],
    ) -> ViewResolver<'a> {
        let mut owned = vec![false; tensors.len()];
        for o in owners {
            owned[o.tensor.0 as usize] = true;
        }
        ViewResolver {
            tensors,
            owned,
            index: AddressIndex::new(tensors, &[]),
            alive,
            per_graph: alive.iter().any(Option::is_some),
        }
    }

    /// Whether view `i` was alive at the capture of graph `g` (by the order added).
    fn alive_at(&self, i: usize, g: u32) -> bool {
        match self.alive.get(i).copied().flatten() {
            None => true,
            Some((first, end)) => first <= g && end.is_none_or(|e| g < e),
        }
    }

    /// Of the views alive at graph `g`'s capture: one that starts at the address, owned,
    /// widest first (the kernel was most likely handed the whole tensor); else the
    /// narrowest view around it.
    fn tensor_at(&self, addr: Addr, g: u32) -> Option<TensorId> {
        let (tensors, owned) = (self.tensors, &self.owned);
        let mut hits = self.index.views_at(addr);
        if self.per_graph {
            hits.retain(|&i| self.alive_at(i, g));
        }
        let starting = hits
            .iter()
            .copied()
            .filter(|&i| tensors[i].data_ptr() == addr)
            .max_by_key(|&i| (owned[i], tensors[i].nbytes, std::cmp::Reverse(i)));
        starting
            .or_else(|| {
                hits.iter()
                    .copied()
                    .min_by_key(|&i| (!owned[i], tensors[i].nbytes, i))
            })
            .map(|i| tensors[i].id)
    }
}

/// Resolves the words of one walked node into touches and set-aside words.
struct NodeResolver<'a> {
    views: ViewResolver<'a>,
    /// The graph being resolved, by the order added.
    graph: u32,
    /// The view each address resolved to: graphs of one model read the same weights and
    /// buffers again and again (one per batch size), so each address is resolved once
    /// (once per graph where views live for some captures only).
    view_of: FxHashMap<(u64, u32), Option<TensorId>>,
    by_base: FxHashMap<Addr, AllocationId>,
    /// Memory the allocator holds free, for [`IgnoredReason::FreeMemory`].
    free: RangeSet,
    pools: &'a PoolMap,
    /// Parameter layouts per kernel name: a name's signature is parsed once. Found by the
    /// address of the node's shared name (nodes of one kernel share it), then by the name.
    layouts: Vec<Vec<ParamLayout>>,
    layout_by_ptr: FxHashMap<usize, usize>,
    layout_by_name: FxHashMap<Arc<str>, usize>,
}

impl NodeResolver<'_> {
    fn node(&mut self, n: &WalkedNode) -> Node {
        let ptr = Arc::as_ptr(&n.name) as *const u8 as usize;
        let at = match self.layout_by_ptr.get(&ptr) {
            Some(&at) => at,
            None => {
                let at = match self.layout_by_name.get(&n.name) {
                    Some(&at) => at,
                    None => {
                        self.layouts.push(param_layouts(&n.name));
                        self.layout_by_name
                            .insert(n.name.clone(), self.layouts.len() - 1);
                        self.layouts.len() - 1
                    }
                };
                self.layout_by_ptr.insert(ptr, at);
                at
            }
        };
        let layouts = &self.layouts[at];
        let sig = NodeSignature::new(layouts, &slots(&n.words));
        let mut touches = Vec::with_capacity(n.words.len());
        let mut ignored = Vec::new();
        for w in &n.words {
            let views = &self.views;
            let g = if views.per_graph { self.graph } else { 0 };
            let tensor = *self
                .view_of
                .entry((w.addr.0, g))
                .or_insert_with(|| views.tensor_at(w.addr, self.graph));
            let reason = match sig.role(w.param, w.offset) {
                WordRole::SetAside(reason) => Some(reason),
                // A word inside a by-value struct (offset > 0) into free memory that names
                // no tensor is stale bytes, unless a graph pool holds it: the graph's own
                // memory is free to the allocator between replays.
                WordRole::Unknown
                    if w.offset > 0
                        && tensor.is_none()
                        && self.free.contains(w.addr.0)
                        && !self.pools.in_graph_pool(w.addr.0) =>
                {
                    Some(IgnoredReason::FreeMemory)
                }
                WordRole::Unknown | WordRole::Operand => None,
            };
            match reason {
                Some(reason) => ignored.push(IgnoredWord {
                    param: w.param,
                    offset: w.offset,
                    addr: w.addr,
                    reason,
                }),
                None => touches.push(Touch {
                    param: w.param,
                    offset: w.offset,
                    addr: w.addr,
                    tensor,
                    allocation: w
                        .allocation
                        .and_then(|(b, _)| self.by_base.get(&b).copied()),
                }),
            }
        }
        Node {
            index: n.index,
            kind: n.kind,
            name: n.name.clone(),
            grid: n.grid,
            block: n.block,
            parent: n.parent,
            opaque: n.opaque.clone(),
            touches,
            ignored,
        }
    }
}
