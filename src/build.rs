//! Building a manifest from what a walker read (raw address words per node) and what the
//! framework knows (tensor views, owners, pools): every word is resolved to a tensor view
//! through the address index, or left a bare allocation. GPU-free, so CI tests it; the
//! CUDA walker (`cuda` feature) and the Python front both feed it.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::format::{
    Addr, Allocation, AllocationId, Digest, Frame, Graph, GraphId, IgnoredReason, IgnoredWord,
    Manifest, Node, NodeKind, Owner, Pool, PoolId, PoolKind, Producer, Registration, SleepPolicy,
    Tensor, TensorId, Touch, Unread,
};
use crate::index::{AddressIndex, IntervalIndex};
use crate::load::{Invalid, check_manifest};

/// One parameter word that held a device address, as a walker found it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RawWord {
    pub param: u32,
    pub offset: u32,
    pub addr: Addr,
    /// The driver allocation holding `addr` (`cuMemGetAddressRange`): base and size.
    pub allocation: Option<(Addr, u64)>,
}

/// One node as a walker read it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WalkedNode {
    pub index: u32,
    pub kind: NodeKind,
    pub name: String,
    pub grid: Option<[u32; 3]>,
    pub block: Option<[u32; 3]>,
    pub parent: Option<u32>,
    pub opaque: Option<String>,
    pub words: Vec<RawWord>,
}

/// One graph as a walker read it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WalkedGraph {
    pub node_counts: BTreeMap<String, u64>,
    pub unread: Vec<Unread>,
    pub nodes: Vec<WalkedNode>,
    /// Memory the graph's own allocation nodes (`mem_alloc`) hand out: (base, size). It
    /// belongs to the graph, as a graph pool's memory does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub graph_allocations: Vec<(Addr, u64)>,
}

impl WalkedGraph {
    /// Address words over all nodes.
    pub fn word_count(&self) -> usize {
        self.nodes.iter().map(|n| n.words.len()).sum()
    }

    /// The distinct addresses, ascending, of the words that lie in none of `known` and
    /// that the kernel's signature does not set aside (index slots, torch's RNG state):
    /// what an owner registry walked before the capture may fail to explain. Memory the
    /// graph allocates itself (`graph_allocations`) is the graph's and is left out too.
    /// The Python recorder walks its roots again only when this is not empty, so that a
    /// tensor made after the first capture is owned without a walk at every capture.
    pub fn unexplained(&self, known: &RangeSet) -> Vec<Addr> {
        let own = RangeSet::from_sizes(self.graph_allocations.iter().map(|&(b, s)| (b.0, s)));
        // Words come in runs into one range (a graph pool, a weight): the range that
        // answered last is tried first, before a search.
        let last = std::cell::Cell::new((0u64, 0u64));
        let known = |a: u64| {
            let (start, end) = last.get();
            if start <= a && a < end {
                return true;
            }
            match known.range_of(a).or_else(|| own.range_of(a)) {
                Some(r) => {
                    last.set(r);
                    true
                }
                None => false,
            }
        };
        let mut layouts_of: HashMap<&str, Vec<ParamLayout>> = HashMap::new();
        let mut out = Vec::new();
        for n in &self.nodes {
            // Most nodes hold only known addresses: no signature is parsed for them.
            if n.words.iter().all(|w| known(w.addr.0)) {
                continue;
            }
            let layouts = layouts_of
                .entry(n.name.as_str())
                .or_insert_with(|| param_layouts(&n.name));
            let sig = NodeSignature::new(layouts, &n.words);
            out.extend(
                n.words
                    .iter()
                    .filter(|w| !known(w.addr.0) && !matches!(sig.role(w), WordRole::SetAside(_)))
                    .map(|w| w.addr),
            );
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

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
    Path(#[from] crate::path::PathError),
    #[error("no {0} was added")]
    UnknownTensor(TensorId),
    #[error("no {0} was declared")]
    UnknownPool(PoolId),
    #[error("the built manifest is inconsistent at `{}`: {}", .0.json_path, .0.message)]
    Inconsistent(Invalid),
}

/// Collects pools, tensors, owners and walked graphs; [`ManifestBuilder::finish`] resolves.
#[derive(Debug)]
pub struct ManifestBuilder {
    producer: Producer,
    pools: Vec<Pool>,
    pool_ranges: Vec<(u64, u64, PoolId)>,
    known_allocations: Vec<(Addr, u64)>,
    tensors: Vec<Tensor>,
    views: HashMap<(Addr, Vec<u64>, Vec<i64>, String), TensorId>,
    owners: Vec<Owner>,
    owner_paths: HashMap<String, TensorId>,
    graphs: Vec<(String, Option<PoolId>, WalkedGraph)>,
    /// Memory the allocator holds free (`[start, end)`), for [`IgnoredReason::FreeMemory`].
    free_ranges: Vec<(u64, u64)>,
}

/// What the kernel signature says about a parameter's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ParamLayout {
    /// Nothing known: every word is a candidate address.
    Opaque,
    /// torch's `at::cuda::detail::TensorInfo`: `data` at offset 0, then `sizes` and
    /// `strides` (indices).
    TensorInfo,
    /// torch's `OffsetCalculator`: dims, divisors and strides, never an address.
    OffsetCalculator,
    /// The closure `gpu_kernel_impl(_nocast)` hands `elementwise_kernel`: an
    /// `OffsetCalculator<N>` first, then the `std::array<char*, N>` of operand pointers.
    ElementwiseClosure,
    /// An array of pointers (`std::array<char*, N>`): every word is an operand.
    PointerArray,
    /// torch's `at::PhiloxCudaState`: `seed_` and `offset_` (offsets 0 and 8) are, under
    /// capture, pointers to the CUDA generator's graph-safe state.
    PhiloxState,
}

/// Whether a parameter type is torch's `at::PhiloxCudaState` by value. jiterator and other
/// NVRTC-compiled kernels declare the struct without the `at` namespace, and a `const`
/// parameter may keep its qualifier in a demangled name.
fn is_philox_state(t: &str) -> bool {
    let t = t.trim();
    let t = t.strip_suffix(" const").unwrap_or(t);
    let t = t.strip_prefix("const ").unwrap_or(t);
    let t = t.strip_prefix("::").unwrap_or(t);
    t == "at::PhiloxCudaState" || t == "PhiloxCudaState"
}

/// The layout of each parameter of the kernel `name` (demangled), from its signature.
fn param_layouts(name: &str) -> Vec<ParamLayout> {
    crate::demangle::param_types(name)
        .map(|types| {
            types
                .iter()
                .map(|t| {
                    if t.starts_with("at::cuda::detail::TensorInfo<") {
                        ParamLayout::TensorInfo
                    } else if t.starts_with("OffsetCalculator<")
                        || t.starts_with("at::native::OffsetCalculator<")
                    {
                        ParamLayout::OffsetCalculator
                    } else if t.contains("gpu_kernel_impl") && t.ends_with("::{lambda(int)#1}") {
                        ParamLayout::ElementwiseClosure
                    } else if t.starts_with("std::array<char*,")
                        || t.starts_with("at::detail::Array<char*,")
                    {
                        ParamLayout::PointerArray
                    } else if is_philox_state(t) {
                        ParamLayout::PhiloxState
                    } else {
                        ParamLayout::Opaque
                    }
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `OffsetCalculator<N, uint32_t>` on CUDA: `int dims`, 25 `IntDivider<uint32_t>` (12
/// bytes each), `uint32_t strides[25][N]`, padded to 8 bytes.
fn offset_calculator_size(n: u32) -> u32 {
    (4 + 25 * 12 + 25 * 4 * n).div_ceil(8) * 8
}

/// Where the operand pointers of an elementwise closure start, found from the words
/// themselves: the `N` words at `offset_calculator_size(N)`, `+ 8`, … are all present.
/// Everything before is the calculator. `None` where no `N` fits (a layout we do not know).
fn closure_data_offset(offsets: &[u32]) -> Option<u32> {
    (1..=16)
        .map(offset_calculator_size)
        .zip(1u32..)
        .find_map(|(start, n)| {
            (0..n)
                .all(|i| offsets.contains(&(start + 8 * i)))
                .then_some(start)
        })
}

/// What a node's kernel signature says about each of its words.
struct NodeSignature<'a> {
    layouts: &'a [ParamLayout],
    /// Per elementwise-closure parameter: where its operand pointers start.
    data_start: HashMap<u32, Option<u32>>,
}

/// What the signature makes of one word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WordRole {
    /// Not an address the kernel reads through, for the reason given.
    SetAside(IgnoredReason),
    /// An operand pointer: a touch, whatever the memory it points to holds now.
    Operand,
    /// Nothing known: a touch unless it points into free memory.
    Unknown,
}

impl<'a> NodeSignature<'a> {
    /// `layouts` are the kernel's, from [`param_layouts`]; `words` the node's.
    fn new(layouts: &'a [ParamLayout], words: &[RawWord]) -> NodeSignature<'a> {
        // A word past the parameters the signature names: the name was not parsed right,
        // so nothing is known of any parameter.
        let layouts = if words.iter().any(|w| w.param as usize >= layouts.len()) {
            &[]
        } else {
            layouts
        };
        let mut data_start = HashMap::new();
        for (p, l) in layouts.iter().enumerate() {
            if *l == ParamLayout::ElementwiseClosure {
                let offsets: Vec<u32> = words
                    .iter()
                    .filter(|w| w.param == p as u32)
                    .map(|w| w.offset)
                    .collect();
                data_start.insert(p as u32, closure_data_offset(&offsets));
            }
        }
        NodeSignature {
            layouts,
            data_start,
        }
    }

    fn role(&self, w: &RawWord) -> WordRole {
        let layout = self
            .layouts
            .get(w.param as usize)
            .copied()
            .unwrap_or(ParamLayout::Opaque);
        match layout {
            ParamLayout::Opaque => WordRole::Unknown,
            ParamLayout::PointerArray => WordRole::Operand,
            ParamLayout::TensorInfo if w.offset > 0 => WordRole::SetAside(IgnoredReason::IndexSlot),
            ParamLayout::TensorInfo => WordRole::Unknown,
            ParamLayout::OffsetCalculator => WordRole::SetAside(IgnoredReason::IndexSlot),
            ParamLayout::ElementwiseClosure => {
                match self.data_start.get(&w.param).copied().flatten() {
                    Some(start) if w.offset < start => WordRole::SetAside(IgnoredReason::IndexSlot),
                    Some(_) => WordRole::Operand,
                    None => WordRole::Unknown,
                }
            }
            ParamLayout::PhiloxState if w.offset == 0 || w.offset == 8 => {
                WordRole::SetAside(IgnoredReason::RngState)
            }
            ParamLayout::PhiloxState => WordRole::Unknown,
        }
    }
}

/// Address ranges, sorted and merged, for membership tests in `O(log n)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeSet {
    /// `[start, end)`, ascending, disjoint and not adjacent.
    ranges: Vec<(u64, u64)>,
}

impl RangeSet {
    /// The union of `[start, end)` ranges given in any order; empty ones are dropped.
    pub fn new(ranges: impl IntoIterator<Item = (u64, u64)>) -> RangeSet {
        let mut v: Vec<(u64, u64)> = ranges.into_iter().filter(|r| r.0 < r.1).collect();
        v.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(v.len());
        for (start, end) in v {
            match merged.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        RangeSet { ranges: merged }
    }

    /// The union of `(base, size)` ranges given in any order.
    pub fn from_sizes(ranges: impl IntoIterator<Item = (u64, u64)>) -> RangeSet {
        RangeSet::new(
            ranges
                .into_iter()
                .map(|(base, size)| (base, base.saturating_add(size))),
        )
    }

    pub fn contains(&self, addr: u64) -> bool {
        self.range_of(addr).is_some()
    }

    /// The merged range `[start, end)` holding `addr`.
    pub fn range_of(&self, addr: u64) -> Option<(u64, u64)> {
        let i = self.ranges.partition_point(|r| r.0 <= addr);
        let r = *self.ranges.get(i.checked_sub(1)?)?;
        (addr < r.1).then_some(r)
    }

    /// Disjoint ranges after merging.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

impl ManifestBuilder {
    pub fn new(producer: Producer) -> ManifestBuilder {
        ManifestBuilder {
            producer,
            pools: Vec::new(),
            pool_ranges: Vec::new(),
            known_allocations: Vec::new(),
            tensors: Vec::new(),
            views: HashMap::new(),
            owners: Vec::new(),
            owner_paths: HashMap::new(),
            graphs: Vec::new(),
            free_ranges: Vec::new(),
        }
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
        );
        if let Some(&id) = self.views.get(&key) {
            return Ok(id);
        }
        let id = TensorId(self.tensors.len() as u32);
        self.tensors.push(Tensor {
            id,
            storage_base: spec.storage_base,
            storage_nbytes: spec.storage_nbytes,
            offset: spec.offset,
            nbytes: spec.nbytes,
            shape: spec.shape,
            stride: spec.stride,
            dtype: spec.dtype,
            itemsize: spec.itemsize,
            device: spec.device,
            allocation: None,
            pool: spec.pool,
            digest: spec.digest,
            reference_digest: None,
            alloc_site: spec.alloc_site,
        });
        self.views.insert(key, id);
        Ok(id)
    }

    /// Adds an owner path of a tensor. The same path for the same tensor is accepted once
    /// more (walks meet aliases twice); for another tensor it is an error.
    pub fn add_owner(
        &mut self,
        path: &str,
        tensor: TensorId,
        registration: Registration,
        holder: Option<String>,
    ) -> Result<(), BuildError> {
        crate::path::parse(path)?;
        if tensor.0 as usize >= self.tensors.len() {
            return Err(BuildError::UnknownTensor(tensor));
        }
        match self.owner_paths.get(path) {
            Some(&t) if t == tensor => return Ok(()),
            Some(&t) => {
                return Err(BuildError::DuplicateOwner {
                    path: path.to_string(),
                    first: t,
                    second: tensor,
                });
            }
            None => {}
        }
        self.owner_paths.insert(path.to_string(), tensor);
        self.owners.push(Owner {
            path: path.to_string(),
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
    pub fn add_graph(&mut self, name: &str, pool: Option<PoolId>, walked: WalkedGraph) -> GraphId {
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
        let pool_index = IntervalIndex::new(self.pool_ranges.clone());
        let pool_at = |a: u64| pool_index.stab_vec(a).first().copied();

        // Allocations: every range the walk saw, plus the declared ones, by base.
        let mut ranges: BTreeMap<Addr, u64> = BTreeMap::new();
        for (_, _, g) in &self.graphs {
            for n in &g.nodes {
                for w in &n.words {
                    if let Some((base, size)) = w.allocation {
                        let e = ranges.entry(base).or_insert(size);
                        *e = (*e).max(size);
                    }
                }
            }
        }
        for &(base, size) in &self.known_allocations {
            let e = ranges.entry(base).or_insert(size);
            *e = (*e).max(size);
        }
        let allocations: Vec<Allocation> = ranges
            .into_iter()
            .filter(|&(_, size)| size > 0)
            .enumerate()
            .map(|(i, (base, size))| Allocation {
                id: AllocationId(i as u32),
                base,
                size,
                pool: pool_at(base.0),
            })
            .collect();
        let by_base: HashMap<Addr, AllocationId> =
            allocations.iter().map(|a| (a.base, a.id)).collect();

        let mut tensors = self.tensors;
        let alloc_index = AddressIndex::new(&[], &allocations);
        for t in &mut tensors {
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
                    .or_else(|| pool_at(t.storage_base.0));
            }
        }

        let owned: Vec<bool> = {
            let mut v = vec![false; tensors.len()];
            for o in &self.owners {
                v[o.tensor.0 as usize] = true;
            }
            v
        };
        let view_index = AddressIndex::new(&tensors, &[]);
        let resolve = |addr: Addr| -> Option<TensorId> {
            let hits = view_index.views_at(addr);
            // A view that starts at the address, owned, widest first: the kernel was most
            // likely handed the whole tensor. Else the narrowest view around it.
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
        };

        let free = RangeSet::new(self.free_ranges);
        let pool_kinds: Vec<PoolKind> = self.pools.iter().map(|p| p.kind).collect();
        let in_graph_pool = |a: u64| {
            pool_index
                .stab_vec(a)
                .iter()
                .any(|p| pool_kinds.get(p.0 as usize) == Some(&PoolKind::Graph))
        };
        let mut layouts_of: HashMap<String, Vec<ParamLayout>> = HashMap::new();

        let graphs = self
            .graphs
            .into_iter()
            .enumerate()
            .map(|(gi, (name, pool, walked))| Graph {
                id: GraphId(gi as u32),
                name,
                pool,
                node_counts: walked.node_counts,
                unread: walked.unread,
                nodes: walked
                    .nodes
                    .into_iter()
                    .map(|n| {
                        let layouts = layouts_of
                            .entry(n.name.clone())
                            .or_insert_with(|| param_layouts(&n.name));
                        let sig = NodeSignature::new(layouts, &n.words);
                        let mut touches = Vec::with_capacity(n.words.len());
                        let mut ignored = Vec::new();
                        for w in n.words {
                            let tensor = resolve(w.addr);
                            let reason = match sig.role(&w) {
                                WordRole::SetAside(reason) => Some(reason),
                                WordRole::Unknown
                                    if w.offset > 0
                                        && tensor.is_none()
                                        && free.contains(w.addr.0)
                                        && !in_graph_pool(w.addr.0) =>
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
                                        .and_then(|(b, _)| by_base.get(&b).copied()),
                                }),
                            }
                        }
                        Node {
                            index: n.index,
                            kind: n.kind,
                            name: n.name,
                            grid: n.grid,
                            block: n.block,
                            parent: n.parent,
                            opaque: n.opaque,
                            touches,
                            ignored,
                        }
                    })
                    .collect(),
            })
            .collect();

        let mut m = Manifest::new(self.producer);
        m.pools = self.pools;
        m.allocations = allocations;
        m.tensors = tensors;
        m.owners = self.owners;
        m.graphs = graphs;
        check_manifest(&m).map_err(BuildError::Inconsistent)?;
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::producer;

    fn spec(base: u64, offset: u64, nbytes: u64, storage: u64) -> TensorSpec {
        TensorSpec {
            storage_base: Addr(base),
            storage_nbytes: storage,
            offset,
            nbytes,
            shape: vec![nbytes / 2],
            stride: vec![1],
            dtype: "bfloat16".into(),
            itemsize: 2,
            device: "cuda:0".into(),
            pool: None,
            digest: None,
            alloc_site: vec![],
        }
    }

    fn word(param: u32, offset: u32, addr: u64, alloc: Option<(u64, u64)>) -> RawWord {
        RawWord {
            param,
            offset,
            addr: Addr(addr),
            allocation: alloc.map(|(b, s)| (Addr(b), s)),
        }
    }

    #[test]
    fn words_resolve_to_views_allocations_and_pools() {
        let mut b = ManifestBuilder::new(producer());
        let weights = b.add_pool("weights", PoolKind::Weights, SleepPolicy::Restored);
        let graph_pool = b.add_pool("graph", PoolKind::Graph, SleepPolicy::Untouched);
        b.add_pool_range(Addr(0x10_0000), 0x20_0000, weights)
            .unwrap();
        b.add_pool_range(Addr(0x40_0000), 0x20_0000, graph_pool)
            .unwrap();
        let w = b.add_tensor(spec(0x10_0000, 0, 0x1000, 0x1000)).unwrap();
        // The second half of w, as a row view, and an alias of w under another path.
        let half = b.add_tensor(spec(0x10_0000, 0x800, 0x800, 0x1000)).unwrap();
        assert_eq!(b.add_tensor(spec(0x10_0000, 0, 0x1000, 0x1000)).unwrap(), w);
        b.add_owner("model.w", w, Registration::Parameter, None)
            .unwrap();
        b.add_owner("model.w_half", half, Registration::ObjectAttribute, None)
            .unwrap();
        b.add_owner("model.w_alias", w, Registration::ModuleAttribute, None)
            .unwrap();
        b.add_owner("model.w", w, Registration::Parameter, None)
            .unwrap();
        assert!(matches!(
            b.add_owner("model.w", half, Registration::Parameter, None),
            Err(BuildError::DuplicateOwner { .. })
        ));
        assert!(
            b.add_owner("model..x", w, Registration::Parameter, None)
                .is_err()
        );
        let seg_w = Some((0x10_0000, 0x20_0000));
        let seg_g = Some((0x40_0000, 0x20_0000));
        let walked = WalkedGraph {
            node_counts: BTreeMap::from([("kernel".into(), 1)]),
            unread: vec![],
            nodes: vec![WalkedNode {
                index: 0,
                kind: NodeKind::Kernel,
                name: "k".into(),
                grid: Some([1, 1, 1]),
                block: Some([32, 1, 1]),
                parent: None,
                opaque: None,
                words: vec![
                    word(0, 0, 0x10_0000, seg_w), // start of w: w, not its half
                    word(0, 8, 0x10_0900, seg_w), // inside the half: the narrower owned view
                    word(1, 0, 0x40_0100, seg_g), // a graph-pool intermediate
                ],
            }],
            graph_allocations: vec![],
        };
        b.add_graph("bs1", Some(graph_pool), walked);
        let m = b.finish().unwrap();
        let t = &m.graphs[0].nodes[0].touches;
        assert_eq!(t[0].tensor, Some(w));
        assert_eq!(t[1].tensor, Some(half));
        assert_eq!(t[2].tensor, None);
        assert_eq!(m.allocations.len(), 2);
        assert_eq!(m.allocations[1].pool, Some(graph_pool));
        assert_eq!(m.tensors[0].pool, Some(weights));
        assert_eq!(m.tensors[0].allocation, Some(m.allocations[0].id));
        // The result verifies: the plain-attribute alias keeps w registered, nothing unowned.
        let r = crate::verify::verify(&m, None, &crate::allow::Allowlist::default()).unwrap();
        assert!(
            r.findings
                .iter()
                .all(|f| f.kind != crate::verify::FindingKind::Unowned),
            "{:?}",
            r.findings
        );
    }

    fn one_node(name: &str, words: Vec<RawWord>) -> WalkedGraph {
        WalkedGraph {
            node_counts: BTreeMap::from([("kernel".into(), 1)]),
            unread: vec![],
            nodes: vec![WalkedNode {
                index: 0,
                kind: NodeKind::Kernel,
                name: name.into(),
                grid: None,
                block: None,
                parent: None,
                opaque: None,
                words,
            }],
            graph_allocations: vec![],
        }
    }

    #[test]
    fn memory_of_graph_allocation_nodes_belongs_to_the_graph() {
        // A captured cudaMallocAsync: the mem_alloc node's memory, read by a kernel of the
        // same graph, is the graph's own (a graph pool), not an unowned address.
        let mut b = ManifestBuilder::new(producer());
        let range = Some((0x7000_0000, 0x1000));
        let mut walked = one_node("k", vec![word(0, 0, 0x7000_0040, range)]);
        walked.nodes.insert(
            0,
            WalkedNode {
                index: 1,
                kind: NodeKind::MemAlloc,
                name: "mem_alloc (4096 bytes)".into(),
                grid: None,
                block: None,
                parent: None,
                opaque: None,
                words: vec![word(0, 0, 0x7000_0000, range)],
            },
        );
        walked.graph_allocations = vec![(Addr(0x7000_0000), 0x1000)];
        b.add_graph("g", None, walked);
        let m = b.finish().unwrap();
        assert_eq!(m.pools.len(), 1);
        assert_eq!(m.pools[0].kind, PoolKind::Graph);
        assert_eq!(m.pools[0].name, "g graph allocations");
        assert_eq!(m.allocations[0].pool, Some(m.pools[0].id));
        let r = crate::verify::verify(&m, None, &crate::allow::Allowlist::default()).unwrap();
        assert!(r.findings.is_empty(), "{:?}", r.findings);

        // Without the declaration the same word is unowned: the test can fail.
        let mut b = ManifestBuilder::new(producer());
        b.add_graph(
            "g",
            None,
            one_node("k", vec![word(0, 0, 0x7000_0040, range)]),
        );
        let m = b.finish().unwrap();
        let r = crate::verify::verify(&m, None, &crate::allow::Allowlist::default()).unwrap();
        assert!(
            r.findings
                .iter()
                .any(|f| f.kind == crate::verify::FindingKind::Unowned),
            "{:?}",
            r.findings
        );
    }

    /// Guards the Qwen3 false `unowned` (fixtures/gpu/corpus_qwen3_*): stale bytes in the
    /// unused `strides` slots of a by-value TensorInfo are not touches.
    #[test]
    fn tensor_info_index_slots_are_ignored_by_the_kernel_signature() {
        let mut b = ManifestBuilder::new(producer());
        let idx = b.add_tensor(spec(0x10_0000, 0, 0x100, 0x100)).unwrap();
        b.add_owner("model.idx", idx, Registration::Buffer, None)
            .unwrap();
        let name = "void at::native::(anonymous namespace)::indexSelectSmallIndex<float, long, unsigned int, 2, 2, -2>(at::cuda::detail::TensorInfo<float, unsigned int>, at::cuda::detail::TensorInfo<float const, unsigned int>, at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, unsigned int, long)";
        let seg = Some((0x10_0000, 0x20_0000));
        let stale = Some((0x80_0000, 0x20_0000));
        b.add_graph(
            "g",
            None,
            one_node(
                name,
                vec![
                    word(2, 0, 0x10_0000, seg),     // data: the index tensor
                    word(2, 176, 0x80_0000, stale), // strides[17]: stale bytes
                    word(2, 192, 0x80_0000, stale),
                ],
            ),
        );
        let m = b.finish().unwrap();
        let n = &m.graphs[0].nodes[0];
        assert_eq!(n.touches.len(), 1);
        assert_eq!(n.touches[0].tensor, Some(idx));
        assert_eq!(
            n.ignored
                .iter()
                .map(|w| (w.offset, w.reason))
                .collect::<Vec<_>>(),
            [
                (176, IgnoredReason::IndexSlot),
                (192, IgnoredReason::IndexSlot)
            ]
        );
        let r = crate::verify::verify(&m, None, &crate::allow::Allowlist::default()).unwrap();
        assert!(r.findings.is_empty(), "{:?}", r.findings);
    }

    /// Guards the false `unowned` of torch's elementwise kernels (OffsetCalculator sets only
    /// `dims` of its slots): a struct word into free memory that names no tensor is ignored;
    /// one into live memory, into a graph pool, or at offset 0 is still a touch.
    #[test]
    fn struct_words_into_free_memory_are_ignored() {
        let mut b = ManifestBuilder::new(producer());
        let graph_pool = b.add_pool("graph", PoolKind::Graph, SleepPolicy::Untouched);
        b.add_pool_range(Addr(0x40_0000), 0x20_0000, graph_pool)
            .unwrap();
        let x = b.add_tensor(spec(0x10_0000, 0, 0x100, 0x100)).unwrap();
        b.add_owner("model.x", x, Registration::Buffer, None)
            .unwrap();
        b.add_free_range(Addr(0x80_0000), 0x10_0000); // a free block of a default segment
        b.add_free_range(Addr(0x10_0000), 0x20_0000); // stale range over x: x still wins
        b.add_free_range(Addr(0x40_0000), 0x1000); // free in the graph pool
        let lambda = "void at::native::elementwise_kernel<128, 2, F>(int, F)";
        let (seg, free_seg, gp) = (
            Some((0x10_0000, 0x20_0000)),
            Some((0x80_0000, 0x20_0000)),
            Some((0x40_0000, 0x20_0000)),
        );
        b.add_graph(
            "g",
            Some(graph_pool),
            one_node(
                lambda,
                vec![
                    word(1, 40, 0x81_0000, free_seg), // stale: ignored
                    word(1, 48, 0x90_0000, free_seg), // past the free block: a live block
                    word(1, 0, 0x80_0100, free_seg),  // offset 0: kept
                    word(1, 608, 0x10_0000, seg),     // x
                    word(1, 616, 0x40_0000, gp),      // graph-pool intermediate
                ],
            ),
        );
        let m = b.finish().unwrap();
        let n = &m.graphs[0].nodes[0];
        let kept: Vec<u32> = n.touches.iter().map(|t| t.offset).collect();
        assert_eq!(kept, [48, 0, 608, 616]);
        assert_eq!(n.ignored.len(), 1);
        assert_eq!(
            (n.ignored[0].offset, n.ignored[0].reason),
            (40, IgnoredReason::FreeMemory)
        );
        assert_eq!(n.touches[2].tensor, Some(x));
    }

    /// Guards the false `unowned` of torch's elementwise kernels on Qwen3's decode step
    /// (fixtures/gpu/corpus_qwen3_decode_*): stale bytes in the unset slots of the
    /// closure's `OffsetCalculator<3>` (param 1, offset 560) pointed at a live segment.
    #[test]
    fn elementwise_closure_index_slots_are_found_from_the_operand_array() {
        let closure = "void at::native::gpu_kernel_impl_nocast<at::native::(anonymous namespace)::CompareFunctor<long> >(at::TensorIteratorBase&, at::native::(anonymous namespace)::CompareFunctor<long> const&)::{lambda(int)#1}";
        let name =
            format!("void at::native::elementwise_kernel<128, 4, {closure}>(int, {closure})");
        assert_eq!(offset_calculator_size(3), 608);
        assert_eq!(closure_data_offset(&[560, 608, 616, 624]), Some(608));
        assert_eq!(closure_data_offset(&[504, 512]), Some(504)); // N = 2
        assert_eq!(closure_data_offset(&[560, 600]), None); // no layout fits: keep all
        let mut b = ManifestBuilder::new(producer());
        let x = b.add_tensor(spec(0x10_0000, 0, 0x100, 0x100)).unwrap();
        b.add_owner("model.x", x, Registration::Buffer, None)
            .unwrap();
        let live = Some((0x80_0000, 0x20_0000)); // a live segment: the free rule cannot help
        let seg = Some((0x10_0000, 0x20_0000));
        let words = vec![
            word(1, 560, 0x80_0000, live),
            word(1, 608, 0x10_0000, seg),
            word(1, 616, 0x10_0000, seg),
            word(1, 624, 0x10_0000, seg),
        ];
        b.add_graph("g", None, one_node(&name, words));
        let unrolled = "void at::native::unrolled_elementwise_kernel<F, std::array<char*, 2ul>, OffsetCalculator<1, unsigned int, false>, OffsetCalculator<1, unsigned int, false>, L, S>(int, F, std::array<char*, 2ul>, OffsetCalculator<1, unsigned int, false>, OffsetCalculator<1, unsigned int, false>, L, S)";
        b.add_graph(
            "h",
            None,
            one_node(
                unrolled,
                vec![word(2, 0, 0x10_0000, seg), word(3, 16, 0x80_0000, live)],
            ),
        );
        let m = b.finish().unwrap();
        let n = &m.graphs[0].nodes[0];
        assert_eq!(
            n.touches.iter().map(|t| t.offset).collect::<Vec<_>>(),
            [608, 616, 624]
        );
        assert_eq!(
            (n.ignored[0].offset, n.ignored[0].reason),
            (560, IgnoredReason::IndexSlot)
        );
        let h = &m.graphs[1].nodes[0];
        assert_eq!((h.touches.len(), h.ignored.len()), (1, 1));
        assert_eq!(h.ignored[0].param, 3);
        assert_eq!(param_layouts(unrolled)[2], ParamLayout::PointerArray);
        let r = crate::verify::verify(&m, None, &crate::allow::Allowlist::default()).unwrap();
        assert!(r.findings.is_empty(), "{:?}", r.findings);
    }

    /// A pointer freed between capture and build, in a parameter the signature types as
    /// an array of pointers, is a touch (the dangling read is reported), and a name
    /// parsed into too few parameters makes every word a candidate again.
    #[test]
    fn operand_pointers_into_free_memory_stay_touches() {
        let mut b = ManifestBuilder::new(producer());
        b.add_free_range(Addr(0x80_0000), 0x10_0000);
        let free_seg = Some((0x80_0000, 0x20_0000));
        let vectorized = "void at::native::vectorized_elementwise_kernel<4, F, std::array<char*, 2ul> >(int, F, std::array<char*, 2ul>)";
        b.add_graph(
            "g",
            None,
            one_node(vectorized, vec![word(2, 8, 0x80_0100, free_seg)]),
        );
        // `(int)` alone, but words at param 1: the parse cannot be right.
        b.add_graph(
            "h",
            None,
            one_node(
                "k<at::cuda::detail::TensorInfo<float, unsigned int> >(int)",
                vec![word(1, 16, 0x80_0200, free_seg)],
            ),
        );
        let m = b.finish().unwrap();
        assert_eq!(m.graphs[0].nodes[0].touches.len(), 1);
        assert!(m.graphs[0].nodes[0].ignored.is_empty());
        let h = &m.graphs[1].nodes[0];
        let reasons: Vec<_> = h.ignored.iter().map(|w| w.reason).collect();
        assert_eq!(reasons, [IgnoredReason::FreeMemory]);
        let r = crate::verify::verify(&m, None, &crate::allow::Allowlist::default()).unwrap();
        assert_eq!(r.findings.len(), 1, "{:?}", r.findings);
        assert_eq!(r.findings[0].kind, crate::verify::FindingKind::Unowned);
    }
    /// torch's RNG kernels as `cuFuncGetName` names them (mangled by g++ from declarations
    /// shaped like torch's: `fused_dropout_kernel_vec`, and the grid-stride kernel that
    /// `torch.randn` launches through `normal_and_transform`).
    const DROPOUT_MANGLED: &str = "_ZN2at6native12_GLOBAL__N_124fused_dropout_kernel_vecIffjLi1ELi4EbEEvNS_4cuda6detail10TensorInfoIKT_T1_EENS5_IS6_S8_EENS5_IT4_S8_EES8_T0_NS_15PhiloxCudaStateE";
    const RANDN_MANGLED: &str = "_ZN2at6native12_GLOBAL__N_143distribution_elementwise_grid_stride_kernelIfLi4EZNS0_9templates4cuda20normal_and_transformIffLm4EPNS_17CUDAGeneratorImplEZNS0_13normal_kernelERNS_18TensorIteratorBaseES7_EUlfE_EEvS9_T2_T3_EUlP24curandStatePhilox4_32_10E_ZNS4_27distribution_nullary_kernelIffLi4ES7_SF_SA_EEvS9_SB_RKSC_T4_EUlifE_EEvlNS_15PhiloxCudaStateET1_SB_";

    #[test]
    fn philox_state_parameters_are_found_in_demangled_signatures() {
        let dropout = crate::demangle::demangle(DROPOUT_MANGLED);
        assert!(
            dropout.ends_with(", unsigned int, float, at::PhiloxCudaState)"),
            "{dropout}"
        );
        let layouts = param_layouts(&dropout);
        assert_eq!(layouts.len(), 6);
        assert_eq!(layouts[0], ParamLayout::TensorInfo);
        assert_eq!(layouts[5], ParamLayout::PhiloxState);
        let randn = crate::demangle::demangle(RANDN_MANGLED);
        let layouts = param_layouts(&randn);
        assert_eq!(layouts.len(), 4, "{randn}");
        assert_eq!(layouts[1], ParamLayout::PhiloxState);
        // The shape a demangler that keeps template parameters unexpanded gives.
        let short = "void at::native::(anonymous namespace)::distribution_elementwise_grid_stride_kernel<float, 4, at::native::templates::cuda::normal_and_transform<float, float, at::CUDAGeneratorImpl*, F>(at::TensorIteratorBase&, at::CUDAGeneratorImpl*, F)::{lambda(curandStatePhilox4_32_10*)#1}, G>(long, at::PhiloxCudaState, T3, T4)";
        assert_eq!(param_layouts(short)[1], ParamLayout::PhiloxState);
        for t in [
            "at::PhiloxCudaState",
            "PhiloxCudaState",
            "::at::PhiloxCudaState",
            "at::PhiloxCudaState const",
        ] {
            assert!(is_philox_state(t), "{t}");
        }
        for t in [
            "at::PhiloxCudaState*",
            "at::PhiloxCudaState const&",
            "at::PhiloxXpuState",
            "my::PhiloxCudaStateLike",
        ] {
            assert!(!is_philox_state(t), "{t}");
        }
    }

    /// Guards the false `unowned` of every RNG kernel in a graph (`torch.randn`, dropout,
    /// `bernoulli_`): the philox `seed_`/`offset_` words point at the CUDA generator's
    /// graph-safe state, which torch owns and no Python object reaches.
    #[test]
    fn philox_seed_and_offset_words_are_rng_state() {
        let rng_seg = Some((0x90_0000, 0x20_0000)); // torch's generator state tensors
        let seg = Some((0x10_0000, 0x20_0000));
        let build = |name: &str| {
            let mut b = ManifestBuilder::new(producer());
            let x = b.add_tensor(spec(0x10_0000, 0, 0x100, 0x100)).unwrap();
            let y = b.add_tensor(spec(0x10_1000, 0, 0x100, 0x100)).unwrap();
            b.add_owner("model.x", x, Registration::Buffer, None)
                .unwrap();
            b.add_owner("model.y", y, Registration::Buffer, None)
                .unwrap();
            let words = vec![
                word(0, 0, 0x10_0000, seg),     // TensorInfo data: x
                word(1, 0, 0x10_1000, seg),     // TensorInfo data: y
                word(5, 0, 0x90_0000, rng_seg), // seed_.ptr
                word(5, 8, 0x90_0200, rng_seg), // offset_.ptr
            ];
            b.add_graph("g", None, one_node(name, words));
            b.finish().unwrap()
        };
        let m = build(&crate::demangle::demangle(DROPOUT_MANGLED));
        let n = &m.graphs[0].nodes[0];
        assert_eq!(
            n.touches.iter().map(|t| t.tensor).collect::<Vec<_>>(),
            [Some(TensorId(0)), Some(TensorId(1))]
        );
        assert_eq!(
            n.ignored
                .iter()
                .map(|w| (w.param, w.offset, w.addr, w.reason))
                .collect::<Vec<_>>(),
            [
                (5, 0, Addr(0x90_0000), IgnoredReason::RngState),
                (5, 8, Addr(0x90_0200), IgnoredReason::RngState)
            ]
        );
        let r = crate::verify::verify(&m, None, &crate::allow::Allowlist::default()).unwrap();
        assert!(r.findings.is_empty(), "{:?}", r.findings);
        let text = crate::normalize::normalized_manifest(&m);
        assert!(
            text.contains("param 5 +8: ignored (torch's RNG state)"),
            "{text}"
        );

        // A kernel whose name gives no signature: the same words are unowned (one finding:
        // grouped by the allocation they lie in).
        let m = build("fused_dropout_kernel_vec");
        let r = crate::verify::verify(&m, None, &crate::allow::Allowlist::default()).unwrap();
        assert_eq!(
            r.findings.iter().map(|f| f.kind).collect::<Vec<_>>(),
            [crate::verify::FindingKind::Unowned]
        );
    }

    #[test]
    fn an_empty_graph_builds_and_verifies_clean() {
        // torch only warns on an empty capture: the graph is recorded with no node.
        let mut b = ManifestBuilder::new(producer());
        b.add_graph("empty", None, WalkedGraph::default());
        let m = b.finish().unwrap();
        assert_eq!(m.graphs.len(), 1);
        assert!(m.graphs[0].nodes.is_empty());
        let r = crate::verify::verify(&m, None, &crate::allow::Allowlist::default()).unwrap();
        assert!(r.ok && r.findings.is_empty(), "{:?}", r.findings);
        assert!(
            WalkedGraph::default()
                .unexplained(&RangeSet::default())
                .is_empty()
        );
    }

    #[test]
    fn range_sets_merge_and_answer_membership() {
        let r = RangeSet::from_sizes([(0x300, 0x10), (0x100, 0x100), (0x180, 0x100), (0x500, 0)]);
        assert_eq!(r.len(), 2); // [0x100, 0x280) and [0x300, 0x310); the empty one dropped
        for (addr, inside) in [
            (0xff, false),
            (0x100, true),
            (0x27f, true),
            (0x280, false),
            (0x30f, true),
            (0x310, false),
            (0x500, false),
        ] {
            assert_eq!(r.contains(addr), inside, "{addr:#x}");
        }
        // Adjacent ranges merge; an end past u64::MAX saturates.
        assert_eq!(RangeSet::new([(0, 4), (4, 8)]).len(), 1);
        assert!(RangeSet::from_sizes([(u64::MAX - 1, 16)]).contains(u64::MAX - 1));
        assert!(RangeSet::default().is_empty());
    }

    /// What the recorder asks before walking its roots again: the words no known range
    /// explains, without those the signature sets aside.
    #[test]
    fn unexplained_words_leave_out_known_ranges_and_set_aside_words() {
        let seg = Some((0x10_0000, 0x20_0000));
        let dropout = crate::demangle::demangle(DROPOUT_MANGLED);
        let mut g = one_node(
            &dropout,
            vec![
                word(0, 0, 0x10_0000, seg),   // known
                word(1, 0, 0x50_0000, None),  // new: data of a TensorInfo
                word(1, 16, 0x60_0000, None), // index slot
                word(5, 0, 0x90_0000, None),  // RNG state
                word(5, 8, 0x90_0200, None),
            ],
        );
        g.nodes.push(WalkedNode {
            index: 1,
            ..one_node(
                "k",
                vec![word(0, 0, 0x50_0000, None), word(0, 8, 0x10_0040, seg)],
            )
            .nodes[0]
                .clone()
        });
        let known = RangeSet::from_sizes([(0x10_0000, 0x100)]);
        assert_eq!(g.unexplained(&known), [Addr(0x50_0000)]);
        let known = RangeSet::from_sizes([(0x10_0000, 0x100), (0x50_0000, 8)]);
        assert!(g.unexplained(&known).is_empty());
        // Memory the graph allocates itself explains its words.
        let mut own = g.clone();
        own.graph_allocations = vec![(Addr(0x50_0000), 0x100)];
        assert!(
            own.unexplained(&RangeSet::from_sizes([(0x10_0000, 0x100)]))
                .is_empty()
        );
        // Nothing known: every word that is not set aside, once each, ascending.
        assert_eq!(
            g.unexplained(&RangeSet::default()),
            [Addr(0x10_0000), Addr(0x10_0040), Addr(0x50_0000)]
        );
    }
}
