//! The graph walker: every node of a captured graph (recursing into child-graph and
//! conditional bodies), every 8-byte-aligned word of every kernel's parameters, memset
//! destinations and memcpy ends; a word that lies in a live driver allocation becomes an
//! address word (parameter index, byte offset, address, allocation). Nodes whose types
//! hold addresses graphcheck does not read are counted and listed, never skipped silently.

use std::sync::{Arc, Mutex, OnceLock};

use rustc_hash::{FxHashMap, FxHashSet};

use super::CudaError;
use super::driver::{self, DriverError, GraphRef, NodeRef};
use crate::model::format::{Addr, NodeKind, Unread};
use crate::resolve::demangle::demangle;
use crate::resolve::walked::{RawWord, WalkedGraph, WalkedNode};

/// What a walk cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkStats {
    /// Nodes visited, bodies of child graphs included.
    pub nodes: usize,
    /// Parameter words looked at.
    pub words: usize,
    /// Words that lay in an allocation.
    pub addresses: usize,
    /// `cuMemGetAddressRange` calls (the rest were answered from the cache).
    pub driver_lookups: usize,
    /// Distinct kernels (by name) whose layout was read.
    pub functions: usize,
}

/// The driver's name for a node type.
pub fn node_type_name(t: u32) -> std::borrow::Cow<'static, str> {
    std::borrow::Cow::Borrowed(match t {
        0 => "kernel",
        1 => "memcpy",
        2 => "memset",
        3 => "host",
        4 => "child_graph",
        5 => "empty",
        6 => "wait_event",
        7 => "event_record",
        8 => "ext_semaphore_signal",
        9 => "ext_semaphore_wait",
        10 => "mem_alloc",
        11 => "mem_free",
        12 => "batch_mem_op",
        13 => "conditional",
        _ => return std::borrow::Cow::Owned(format!("type_{t}")),
    })
}

static DRIVER: OnceLock<Result<i32, String>> = OnceLock::new();

/// Initializes the driver once per process; returns its version.
pub fn driver_version() -> Result<i32, CudaError> {
    match DRIVER.get_or_init(|| driver::init().map_err(|e| e.to_string())) {
        Ok(v) => Ok(*v),
        Err(_) => Ok(driver::init()?),
    }
}

/// Ranges of allocations already seen, and words known to be in none.
struct RangeCache {
    /// The range of the last hit: neighbouring words often point into one allocation.
    last: (u64, u64),
    ranges: Vec<(u64, u64)>,
    /// Recent misses, direct-mapped: parameter structs repeat the same non-address words
    /// (packed sizes and strides) in node after node, and a lookup here costs a few ns.
    recent_misses: Box<[u64; 1024]>,
    /// Recent hits by 2 MiB granule, direct-mapped: (granule, base, size). A kernel's
    /// words alternate between a few allocations (a weight's, the graph pool's), which
    /// `last` alone misses and the binary search over every range answers slowly.
    recent_hits: Box<[(u64, u64, u64); 256]>,
    misses: FxHashSet<u64>,
    lookups: usize,
}

impl Default for RangeCache {
    fn default() -> Self {
        RangeCache {
            last: (0, 0),
            ranges: Vec::new(),
            recent_misses: Box::new([0; 1024]),
            recent_hits: Box::new([(u64::MAX, 0, 0); 256]),
            misses: FxHashSet::default(),
            lookups: 0,
        }
    }
}

impl RangeCache {
    /// Records a range the walk learned other than from `cuMemGetAddressRange` (a graph
    /// allocation node's memory, pinned host memory).
    fn add_range(&mut self, base: u64, size: u64) {
        let at = self.ranges.partition_point(|&(x, _)| x < base);
        if self.ranges.get(at).map(|r| r.0) != Some(base) {
            self.ranges.insert(at, (base, size));
        }
        // A word once missed may lie in the new range.
        self.misses.clear();
        self.recent_misses.fill(0);
    }

    /// A host end of a copy: the pointer attributes know pinned and registered host
    /// memory, which `cuMemGetAddressRange` does not.
    fn lookup_host(&mut self, v: u64) -> Option<(u64, u64)> {
        if v == 0 {
            return None;
        }
        self.lookups += 1;
        let (b, s) = driver::pointer_range(v)?;
        self.add_range(b, s);
        self.last = (b, s);
        Some((b, s))
    }

    fn slot(v: u64) -> usize {
        (v.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 54) as usize
    }

    fn hit_slot(granule: u64) -> usize {
        (granule.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as usize
    }

    /// `v` is in the range `(b, s)`: the last hit, and its granule's.
    fn hit(&mut self, v: u64, b: u64, s: u64) -> Option<(u64, u64)> {
        self.last = (b, s);
        let g = v >> 21;
        self.recent_hits[Self::hit_slot(g)] = (g, b, s);
        Some((b, s))
    }

    /// The allocation holding `v`: the common answers (not an address, the range of the
    /// last hit, a recent miss) inline, the rest out of line.
    #[inline(always)]
    fn lookup(&mut self, v: u64) -> Option<(u64, u64)> {
        // Small integers and non-canonical values are never device addresses.
        if !(0x10000..(1u64 << 57)).contains(&v) {
            return None;
        }
        if v.wrapping_sub(self.last.0) < self.last.1 {
            return Some(self.last);
        }
        let g = v >> 21;
        let (hg, b, s) = self.recent_hits[Self::hit_slot(g)];
        if hg == g && v.wrapping_sub(b) < s {
            self.last = (b, s);
            return Some((b, s));
        }
        let slot = Self::slot(v);
        if self.recent_misses[slot] == v {
            return None;
        }
        self.lookup_slow(v, slot)
    }

    #[inline(never)]
    fn lookup_slow(&mut self, v: u64, slot: usize) -> Option<(u64, u64)> {
        let i = self.ranges.partition_point(|&(b, _)| b <= v);
        if i > 0 {
            let (b, s) = self.ranges[i - 1];
            if v - b < s {
                return self.hit(v, b, s);
            }
        }
        if self.misses.contains(&v) {
            self.recent_misses[slot] = v;
            return None;
        }
        self.lookups += 1;
        // An address the driver does not know at all is answered without the range call,
        // whose failure takes the driver's slow error path (0.8 to 1.5 µs against 0.1 to 0.17).
        let range = if driver::is_known_pointer(v) {
            driver::address_range(v)
        } else {
            None
        };
        match range {
            Some((b, s)) => {
                let at = self.ranges.partition_point(|&(x, _)| x < b);
                if self.ranges.get(at).map(|r| r.0) != Some(b) {
                    self.ranges.insert(at, (b, s));
                }
                self.hit(v, b, s)
            }
            None => {
                self.misses.insert(v);
                self.recent_misses[slot] = v;
                None
            }
        }
    }
}

/// A function's demangled name and parameter layout (or why the layout is unknown).
type FunctionInfo = Arc<(Arc<str>, Result<Vec<(usize, usize)>, String>)>;

/// Reads a kernel's demangled name and parameter layout.
fn function_info(k: &driver::KernelNode<'_>) -> FunctionInfo {
    let name = k
        .raw_name()
        .map(|n| demangle(&n))
        .unwrap_or_else(|e| format!("(name unavailable: {e})"));
    Arc::new((name.into(), k.param_layout().map_err(|e| e.to_string())))
}

/// Function facts across walks, by the address of the kernel's name string in its loaded
/// module (what `cuFuncGetName` hands out, equal for every handle of one kernel), with the
/// raw name read there: a module loaded later where an unloaded one was does not match
/// unless the very same name is at the very same address. A graph captured after the
/// first reads no layout and demangles no name it has seen before.
static FUNCTIONS: Mutex<Option<FunctionCache>> = Mutex::new(None);

/// Name address → (raw name, facts).
type FunctionCache = FxHashMap<usize, (Box<[u8]>, FunctionInfo)>;

/// The facts of the kernel `k` launches, from [`FUNCTIONS`] or read (and kept there).
fn shared_function_info(k: &driver::KernelNode<'_>) -> FunctionInfo {
    let Ok(key) = k.name_key() else {
        return function_info(k);
    };
    let raw = k.raw_name_bytes();
    let mut cache = FUNCTIONS.lock().unwrap_or_else(|p| p.into_inner());
    let cache = cache.get_or_insert_with(FxHashMap::default);
    if let Some((name, info)) = cache.get(&key)
        && Some(&**name) == raw
    {
        return info.clone();
    }
    let info = function_info(k);
    if let Some(raw) = raw {
        cache.insert(key, (raw.into(), info.clone()));
    }
    info
}

struct Walker {
    /// Nodes per driver type 0..=13; other types are counted in `out.node_counts`.
    counts: [u64; 14],
    cache: RangeCache,
    /// By function handle (then [`FUNCTIONS`], by name string, for launches of one kernel
    /// through different handles: the runtime API can hand out one per launch).
    functions: FxHashMap<(usize, usize), FunctionInfo>,
    /// The distinct kernels of this walk (by their facts' address), for the stats.
    distinct: FxHashSet<usize>,
    out: WalkedGraph,
    /// A kernel's words are gathered here and copied out at their size: one allocation per
    /// node instead of a vector grown word by word.
    scratch: Vec<RawWord>,
    next: u32,
    stats: WalkStats,
}

/// What the walk asks of a graph: its nodes. The driver answers for a captured graph
/// ([`GraphRef`]); the CPU tests answer from a tree they build, to test the traversal.
trait Graph<'a>: Copy {
    type Node: Node<'a, Graph = Self>;
    fn nodes(self) -> Result<Vec<Self::Node>, DriverError>;
}

/// What the walk asks of a node: the driver's calls of [`NodeRef`], by the same names.
trait Node<'a>: Copy {
    type Graph: Graph<'a, Node = Self>;
    fn type_number(self) -> Result<u32, DriverError>;
    fn kernel(self) -> Result<driver::KernelNode<'a>, DriverError>;
    fn memset(self) -> Result<driver::MemsetNode, DriverError>;
    fn memcpy(self) -> Result<driver::MemcpyNode, DriverError>;
    fn mem_alloc(self) -> Result<(u64, u64), DriverError>;
    fn mem_free(self) -> Result<u64, DriverError>;
    fn child_graph(self) -> Result<Self::Graph, DriverError>;
    fn conditional_bodies(self) -> Result<Vec<Self::Graph>, DriverError>;
}

impl<'a> Graph<'a> for GraphRef<'a> {
    type Node = NodeRef<'a>;
    fn nodes(self) -> Result<Vec<NodeRef<'a>>, DriverError> {
        GraphRef::nodes(self)
    }
}

impl<'a> Node<'a> for NodeRef<'a> {
    type Graph = GraphRef<'a>;
    fn type_number(self) -> Result<u32, DriverError> {
        NodeRef::type_number(self)
    }
    fn kernel(self) -> Result<driver::KernelNode<'a>, DriverError> {
        NodeRef::kernel(self)
    }
    fn memset(self) -> Result<driver::MemsetNode, DriverError> {
        NodeRef::memset(self)
    }
    fn memcpy(self) -> Result<driver::MemcpyNode, DriverError> {
        NodeRef::memcpy(self)
    }
    fn mem_alloc(self) -> Result<(u64, u64), DriverError> {
        NodeRef::mem_alloc(self)
    }
    fn mem_free(self) -> Result<u64, DriverError> {
        NodeRef::mem_free(self)
    }
    fn child_graph(self) -> Result<GraphRef<'a>, DriverError> {
        NodeRef::child_graph(self)
    }
    fn conditional_bodies(self) -> Result<Vec<GraphRef<'a>>, DriverError> {
        NodeRef::conditional_bodies(self)
    }
}

/// What every read of a graph needs first: a driver new enough, and a current CUDA
/// context on this thread (the one the graph's allocations belong to).
pub fn ready() -> Result<(), CudaError> {
    driver_version()?;
    if !driver::has_current_context()? {
        return Err(CudaError::NoContext);
    }
    Ok(())
}

/// Walks a captured graph. Needs a current CUDA context on this thread (the one the
/// graph's allocations belong to).
pub fn walk_graph(g: GraphRef<'_>) -> Result<(WalkedGraph, WalkStats), CudaError> {
    ready()?;
    walk_tree(g)
}

/// The walk proper, over any [`Graph`].
fn walk_tree<'a, G: Graph<'a>>(g: G) -> Result<(WalkedGraph, WalkStats), CudaError> {
    let mut w = Walker {
        counts: [0; 14],
        cache: RangeCache::default(),
        functions: Default::default(),
        distinct: Default::default(),
        out: WalkedGraph::default(),
        scratch: Vec::new(),
        next: 0,
        stats: WalkStats::default(),
    };
    w.walk(g, None)?;
    for (t, &n) in w.counts.iter().enumerate() {
        if n > 0 {
            *w.out
                .node_counts
                .entry(node_type_name(t as u32).into_owned())
                .or_default() += n;
        }
    }
    w.stats.driver_lookups = w.cache.lookups;
    w.stats.functions = w.distinct.len();
    Ok((w.out, w.stats))
}

impl Walker {
    fn walk<'a, G: Graph<'a>>(&mut self, g: G, parent: Option<u32>) -> Result<(), CudaError> {
        let nodes = g.nodes()?;
        self.out.nodes.reserve(nodes.len());
        let types: Vec<Result<u32, DriverError>> = nodes.iter().map(|n| n.type_number()).collect();
        // Memory that the graph's own allocation nodes hand out is mapped only while the
        // graph runs, so the driver may not know it yet: its ranges come from the nodes,
        // before any kernel's words are resolved against them.
        // (Only allocation nodes are asked: a driver call per node cost as much as the rest
        // of the walk, measured on the H200.)
        for (node, t) in nodes.iter().zip(&types) {
            if !matches!(t, Ok(10)) {
                continue;
            }
            if let Ok((base, size)) = node.mem_alloc()
                && base != 0
                && size > 0
            {
                self.cache.add_range(base, size);
                self.out.graph_allocations.push((Addr(base), size));
            }
        }
        for (node, t) in nodes.into_iter().zip(types) {
            let index = self.next;
            self.next += 1;
            self.stats.nodes += 1;
            let t = match t {
                Ok(t) => t,
                Err(e) => {
                    *self.out.node_counts.entry("unknown".into()).or_default() += 1;
                    self.out.unread.push(Unread {
                        index,
                        node_type: "unknown".into(),
                        reason: e.to_string(),
                    });
                    continue;
                }
            };
            let type_name = node_type_name(t);
            match self.counts.get_mut(t as usize) {
                Some(c) => *c += 1,
                None => {
                    *self
                        .out
                        .node_counts
                        .entry(type_name.to_string())
                        .or_default() += 1
                }
            }
            match t {
                0 => self.kernel(node, index, parent),
                1 => self.memcpy(node, index, parent),
                2 => self.memset(node, index, parent),
                4 => match node.child_graph() {
                    Ok(body) => self.walk(body, Some(index))?,
                    Err(e) => self.unread(index, type_name.into_owned(), format!("its body could not be read: {e}")),
                },
                13 => match node.conditional_bodies() {
                    Ok(bodies) => {
                        for body in bodies {
                            self.walk(body, Some(index))?;
                        }
                    }
                    Err(e) => self.unread(index, type_name.into_owned(), format!("its bodies could not be read: {e}")),
                },
                10 => self.mem_alloc(node, index, parent),
                11 => self.mem_free(node, index, parent),
                // No device address to read: host callbacks, empty nodes, events.
                3 | 5 | 6 | 7 => {}
                8 | 9 | 12 => self.unread(
                    index,
                    type_name.into_owned(),
                    "graphcheck does not read this node type's parameters; any address it holds is not checked".into(),
                ),
                _ => self.unread(
                    index,
                    type_name.into_owned(),
                    format!("node type {t} is unknown to graphcheck (a newer driver?)"),
                ),
            }
        }
        Ok(())
    }

    fn unread(&mut self, index: u32, node_type: String, reason: String) {
        self.out.unread.push(Unread {
            index,
            node_type,
            reason,
        });
    }

    fn push(&mut self, node: WalkedNode) {
        self.stats.addresses += node.words.len();
        self.out.nodes.push(node);
    }

    fn kernel<'a>(&mut self, node: impl Node<'a>, index: u32, parent: Option<u32>) {
        let k = match node.kernel() {
            Ok(k) => k,
            Err(e) => {
                return self.push(WalkedNode {
                    index,
                    kind: NodeKind::Kernel,
                    name: Arc::from("(unreadable kernel node)"),
                    grid: None,
                    block: None,
                    parent,
                    opaque: Some(format!("its launch parameters could not be read: {e}")),
                    words: Vec::new(),
                });
            }
        };
        // Graphs launch few distinct functions many times: name and layout once each.
        let info = match self.functions.get(&k.function_key()) {
            Some(info) => info.clone(),
            None => {
                let info = shared_function_info(&k);
                self.distinct.insert(Arc::as_ptr(&info) as usize);
                self.functions.insert(k.function_key(), info.clone());
                info
            }
        };
        let name = info.0.clone();
        let layout: &[(usize, usize)] = match &info.1 {
            Ok(l) => l,
            Err(e) => {
                return self.push(WalkedNode {
                    index,
                    kind: NodeKind::Kernel,
                    name,
                    grid: Some(k.grid),
                    block: Some(k.block),
                    parent,
                    opaque: Some(format!("its parameter layout could not be read: {e}")),
                    words: Vec::new(),
                });
            }
        };
        let mut words = std::mem::take(&mut self.scratch);
        words.clear();
        let mut opaque = None;
        if k.has_kernel_params() {
            for (i, &(_, size)) in layout.iter().enumerate() {
                self.scan(k.param(i, size), i as u32, |_| None, &mut words);
            }
        } else if let Some(buf) = k.packed_params() {
            self.scan(buf, 0, |o| packed_position(layout, o), &mut words);
        } else if !layout.is_empty() {
            opaque = Some(format!(
                "the kernel takes {} parameters but the node holds neither kernelParams nor a packed buffer",
                layout.len()
            ));
        }
        let exact = words.as_slice().to_vec();
        self.scratch = words;
        self.push(WalkedNode {
            index,
            kind: NodeKind::Kernel,
            name,
            grid: Some(k.grid),
            block: Some(k.block),
            parent,
            opaque,
            words: exact,
        });
    }

    /// [`scan_words`] against the walk's allocations.
    fn scan(
        &mut self,
        bytes: &[u8],
        param: u32,
        map: impl Fn(usize) -> Option<(u32, u32)>,
        out: &mut Vec<RawWord>,
    ) {
        let cache = &mut self.cache;
        self.stats.words += scan_words(bytes, param, map, |v| cache.lookup(v), out);
    }

    /// Pushes a memset, memcpy or graph-memory node: the words and name its parameters
    /// give or, where they could not be read, why (the node is then opaque, never dropped).
    fn push_read(
        &mut self,
        index: u32,
        parent: Option<u32>,
        kind: NodeKind,
        read: Result<(Vec<RawWord>, String), DriverError>,
    ) {
        let (words, name, opaque) = match read {
            Ok((words, name)) => (words, name, None),
            Err(e) => (
                Vec::new(),
                kind.to_string(),
                Some(format!("its parameters could not be read: {e}")),
            ),
        };
        self.push(WalkedNode {
            index,
            kind,
            name: name.into(),
            grid: None,
            block: None,
            parent,
            opaque,
            words,
        });
    }

    fn memset<'a>(&mut self, node: impl Node<'a>, index: u32, parent: Option<u32>) {
        let read = node
            .memset()
            .map(|m| (self.ends(&[(0, m.dst)], false), "memset".into()));
        self.push_read(index, parent, NodeKind::Memset, read);
    }

    fn memcpy<'a>(&mut self, node: impl Node<'a>, index: u32, parent: Option<u32>) {
        let read = node.memcpy().map(|m| {
            let mut words = Vec::new();
            for (param, a, host) in copy_ends(&m) {
                words.extend(self.ends(&[(param, a)], host));
            }
            (words, copy_name(&m))
        });
        self.push_read(index, parent, NodeKind::Memcpy, read);
    }

    fn mem_alloc<'a>(&mut self, node: impl Node<'a>, index: u32, parent: Option<u32>) {
        let read = node.mem_alloc().map(|(base, size)| {
            self.stats.words += 1;
            let word = RawWord {
                param: 0,
                offset: 0,
                addr: Addr(base),
                allocation: Some((Addr(base), size)),
            };
            (vec![word], format!("mem_alloc ({size} bytes)"))
        });
        self.push_read(index, parent, NodeKind::MemAlloc, read);
    }

    fn mem_free<'a>(&mut self, node: impl Node<'a>, index: u32, parent: Option<u32>) {
        let read = node
            .mem_free()
            .map(|dptr| (self.ends(&[(0, dptr)], false), "mem_free".into()));
        self.push_read(index, parent, NodeKind::MemFree, read);
    }

    /// Address words for (parameter, address) ends that lie in an allocation; `host`
    /// also asks the driver's pointer attributes, which know pinned host memory.
    fn ends(&mut self, ends: &[(u32, u64)], host: bool) -> Vec<RawWord> {
        let mut w = Vec::new();
        for &(param, a) in ends {
            self.stats.words += 1;
            let range = match self.cache.lookup(a) {
                Some(r) => Some(r),
                None if host => self.cache.lookup_host(a),
                None => None,
            };
            if let Some((b, s)) = range {
                w.push(RawWord {
                    param,
                    offset: 0,
                    addr: Addr(a),
                    allocation: Some((Addr(b), s)),
                });
            }
        }
        w
    }
}

/// Where byte `offset` of a packed parameter buffer lies: (parameter, offset in it), by the
/// kernel's layout ((offset, size) per parameter, in order); `None` before the first.
fn packed_position(layout: &[(usize, usize)], offset: usize) -> Option<(u32, u32)> {
    let i = layout.partition_point(|&(off, _)| off <= offset);
    (i > 0).then(|| ((i - 1) as u32, (offset - layout[i - 1].0) as u32))
}

/// The address words among the 8-byte-aligned words of `bytes` (parameter `param`'s, or
/// several parameters' where `map` turns a byte offset into (parameter, offset)): those
/// `lookup` places in an allocation (base, size). Returns the number of words looked at.
fn scan_words(
    bytes: &[u8],
    param: u32,
    map: impl Fn(usize) -> Option<(u32, u32)>,
    mut lookup: impl FnMut(u64) -> Option<(u64, u64)>,
    out: &mut Vec<RawWord>,
) -> usize {
    for (k, chunk) in bytes.chunks_exact(8).enumerate() {
        let v = u64::from_le_bytes(chunk.try_into().expect("chunks of 8"));
        if let Some((base, size)) = lookup(v) {
            let off = k * 8;
            let (param, offset) = map(off).unwrap_or((param, off as u32));
            out.push(RawWord {
                param,
                offset,
                addr: Addr(v),
                allocation: Some((Addr(base), size)),
            });
        }
    }
    bytes.len() / 8
}

/// A copy's ends as (parameter, address, host): parameter 0 is the destination, 1 the
/// source. A host end (pinned or registered memory; unified too) is an address like any
/// other, the tensor behind it an owner and freeing it a hazard, but only the driver's
/// pointer attributes know its range (`host`). Array ends hold no address.
fn copy_ends(m: &driver::MemcpyNode) -> Vec<(u32, u64, bool)> {
    [(0u32, m.dst), (1, m.src)]
        .into_iter()
        .filter_map(|(param, end)| {
            end.addr
                .map(|(a, t)| (param, a, t != driver::MemoryType::Device))
        })
        .collect()
}

/// A copy node's name: `memcpy host->device (8192 bytes)`, source first.
fn copy_name(m: &driver::MemcpyNode) -> String {
    format!(
        "memcpy {}->{} ({} bytes)",
        memory_type_name(m.src.memory_type),
        memory_type_name(m.dst.memory_type),
        m.bytes
    )
}

/// The driver's name for a `CUmemorytype`.
fn memory_type_name(t: u32) -> std::borrow::Cow<'static, str> {
    std::borrow::Cow::Borrowed(match t {
        1 => "host",
        2 => "device",
        3 => "array",
        4 => "unified",
        _ => return std::borrow::Cow::Owned(format!("memory_type_{t}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node of a GPU-recorded fixture (`fixtures/gpu/`): its name, the words the walk read
    /// from it there (its touches, with their allocations' base and size), and the
    /// manifest's allocations, which answer for the driver's address ranges here.
    struct Recorded {
        name: String,
        words: Vec<RawWord>,
        allocations: Vec<(u64, u64)>,
    }

    fn recorded(manifest: &str, graph: &str, node: u64) -> Recorded {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/gpu")
            .join(manifest);
        let text = std::fs::read_to_string(&path).unwrap();
        let m: serde_json::Value = serde_json::from_str(&text).unwrap();
        let hex = |v: &serde_json::Value| {
            u64::from_str_radix(v.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
        };
        let allocations: Vec<(u64, u64)> = m["allocations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| (hex(&a["base"]), a["size"].as_u64().unwrap()))
            .collect();
        let g = m["graphs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["name"] == graph)
            .unwrap();
        let n = g["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["index"] == node)
            .unwrap();
        let words = n["touches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let (base, size) = allocations[t["allocation"].as_u64().unwrap() as usize];
                RawWord {
                    param: t["param"].as_u64().unwrap() as u32,
                    offset: t["offset"].as_u64().unwrap() as u32,
                    addr: Addr(hex(&t["addr"])),
                    allocation: Some((Addr(base), size)),
                }
            })
            .collect();
        Recorded {
            name: n["name"].as_str().unwrap().into(),
            words,
            allocations,
        }
    }

    impl Recorded {
        /// The allocation holding `v`, as `cuMemGetAddressRange` answered on the GPU.
        fn lookup(&self, v: u64) -> Option<(u64, u64)> {
            self.allocations
                .iter()
                .copied()
                .find(|&(b, s)| v.wrapping_sub(b) < s)
        }

        /// Parameter bytes laid out by `layout`, holding each recorded word at its
        /// parameter and offset and, everywhere else, words no allocation holds: small
        /// integers (sizes, strides) and pairs of floats (1.0f, scales).
        fn bytes(&self, layout: &[(usize, usize)]) -> Vec<u8> {
            let (last, size) = *layout.last().unwrap();
            let mut b: Vec<u8> = (0..(last + size).div_ceil(8) as u64)
                .flat_map(|k| {
                    let filler = if k % 2 == 0 {
                        k * 64
                    } else {
                        0x3f80_0000_3f80_0000
                    };
                    filler.to_le_bytes()
                })
                .collect();
            for w in &self.words {
                let at = layout[w.param as usize].0 + w.offset as usize;
                b[at..at + 8].copy_from_slice(&w.addr.0.to_le_bytes());
            }
            b.truncate(last + size);
            b
        }
    }

    #[test]
    fn a_packed_buffer_maps_each_offset_to_its_parameter() {
        // Parameters of 16, 4 (padded to 8) and 8 bytes: padding belongs to the parameter
        // before it; an offset before the first parameter belongs to none.
        let layout = [(0, 16), (16, 4), (24, 8)];
        let at = |o| packed_position(&layout, o);
        assert_eq!(
            [at(0), at(8), at(16), at(20), at(24), at(31)],
            [
                Some((0, 0)),
                Some((0, 8)),
                Some((1, 0)),
                Some((1, 4)),
                Some((2, 0)),
                Some((2, 7))
            ]
        );
        assert_eq!(packed_position(&[(8, 8)], 0), None);
    }

    #[test]
    fn packed_and_per_parameter_bytes_decode_to_the_words_the_gpu_walk_read() {
        // cuBLAS's split-K reduction on the H200, read through kernelParams: parameters 1
        // to 4 (pointers) of 21 at offset 0. Its signature gives the sizes: a
        // cublasSplitKParams struct (its size is not in the record; 64 bytes here), then
        // 20 of 8 bytes. The same values packed in one buffer (`extra`) must decode to the
        // same words as read one parameter at a time.
        let r = recorded("corpus_cutlass_moe_manifest.json", "decode_bs8", 1);
        assert!(
            r.name.starts_with("void cublasLt::splitKreduce_kernel<"),
            "{}",
            r.name
        );
        let mut layout = vec![(0usize, 64usize)];
        layout.extend((0..20).map(|i| (64 + 8 * i, 8)));
        let bytes = r.bytes(&layout);
        let mut per_param = Vec::new();
        let mut looked = 0;
        for (i, &(off, size)) in layout.iter().enumerate() {
            let p = &bytes[off..off + size];
            looked += scan_words(p, i as u32, |_| None, |v| r.lookup(v), &mut per_param);
        }
        assert_eq!(per_param, r.words);
        assert_eq!(looked, 28);
        let mut packed = Vec::new();
        let map = |o| packed_position(&layout, o);
        assert_eq!(scan_words(&bytes, 0, map, |v| r.lookup(v), &mut packed), 28);
        assert_eq!(packed, r.words);

        // An nvjet GEMM of torch._scaled_mm (fp8), whose parameters came packed: one
        // struct, 19 address words at their offsets in it.
        let r = recorded("corpus_kernels_manifest.json", "fp8_scaled_mm", 0);
        assert!(r.name.starts_with("nvjet_sm90_"), "{}", r.name);
        let end = r.words.iter().map(|w| w.offset as usize + 8).max().unwrap();
        let layout = [(0, end + 64)];
        let mut packed = Vec::new();
        let map = |o| packed_position(&layout, o);
        scan_words(&r.bytes(&layout), 0, map, |v| r.lookup(v), &mut packed);
        assert_eq!(packed.len(), 19);
        assert_eq!(packed, r.words);
    }

    fn end(addr: u64, t: driver::MemoryType) -> driver::MemcpyEnd {
        let memory_type = match t {
            driver::MemoryType::Host => 1,
            driver::MemoryType::Device => 2,
            driver::MemoryType::Unified => 4,
        };
        driver::MemcpyEnd {
            addr: Some((addr, t)),
            memory_type,
        }
    }

    #[test]
    fn copy_ends_are_the_recorded_parameters_and_names() {
        use driver::MemoryType::{Device, Host, Unified};
        // Staging through pinned memory and a copy between unified ends (NCCL's), as the
        // H200 walk recorded them: parameter 0 the destination, 1 the source; every end
        // not addressed as device memory is asked as host memory.
        for (manifest, graph, node, dst, src, bytes) in [
            (
                "nodes_memcpy_pinned_manifest.json",
                "staging",
                0,
                Device,
                Host,
                8192,
            ),
            (
                "nodes_memcpy_pinned_manifest.json",
                "staging",
                2,
                Host,
                Device,
                8192,
            ),
            (
                "nodes_nccl_manifest.json",
                "collectives",
                1,
                Unified,
                Unified,
                16384,
            ),
            (
                "nodes_memcpy_d2d_manifest.json",
                "copy",
                0,
                Device,
                Device,
                16384,
            ),
        ] {
            let r = recorded(manifest, graph, node);
            let (d, s) = (r.words[0].addr.0, r.words[1].addr.0);
            assert_eq!((r.words[0].param, r.words[1].param), (0, 1));
            let m = driver::MemcpyNode {
                dst: end(d, dst),
                src: end(s, src),
                bytes,
            };
            assert_eq!(
                copy_ends(&m),
                [(0, d, dst != Device), (1, s, src != Device)],
                "{}",
                r.name
            );
            assert_eq!(copy_name(&m), r.name);
        }
        // A CUDA array's end holds no address: only the other end is read.
        let array = driver::MemcpyEnd {
            addr: None,
            memory_type: 3,
        };
        let m = driver::MemcpyNode {
            dst: array,
            src: end(0x7f00_0000_0000, Device),
            bytes: 64,
        };
        assert_eq!(copy_ends(&m), [(1, 0x7f00_0000_0000, false)]);
        assert_eq!(copy_name(&m), "memcpy device->array (64 bytes)");
    }

    /// A graph the CPU tests build: the nodes the driver would hand out, each answering
    /// the walk's questions from what it holds.
    #[derive(Clone, Copy)]
    struct Tree(&'static [Fake]);

    #[derive(Clone, Copy)]
    enum Fake {
        Alloc(u64, u64),
        Memset(u64),
        Free(u64),
        Event,
        /// A kernel node whose launch cannot be read (no kernel can be faked).
        Kernel,
        Child(Tree),
        /// A child-graph node whose body the driver does not hand out.
        LostChild,
        Conditional(&'static [Tree]),
        /// Driver 580 does not export the call that hands out the bodies.
        LostConditional,
        Type(u32),
    }

    fn tree(nodes: Vec<Fake>) -> Tree {
        Tree(Box::leak(nodes.into_boxed_slice()))
    }

    fn lost(call: &'static str) -> DriverError {
        DriverError::new(call, 0, "not in this tree")
    }

    impl Graph<'static> for Tree {
        type Node = Fake;
        fn nodes(self) -> Result<Vec<Fake>, DriverError> {
            Ok(self.0.to_vec())
        }
    }

    impl Node<'static> for Fake {
        type Graph = Tree;
        fn type_number(self) -> Result<u32, DriverError> {
            Ok(match self {
                Fake::Kernel => 0,
                Fake::Memset(_) => 2,
                Fake::Child(_) | Fake::LostChild => 4,
                Fake::Event => 6,
                Fake::Alloc(..) => 10,
                Fake::Free(_) => 11,
                Fake::Conditional(_) | Fake::LostConditional => 13,
                Fake::Type(t) => t,
            })
        }
        fn kernel(self) -> Result<driver::KernelNode<'static>, DriverError> {
            Err(lost("cuGraphKernelNodeGetParams"))
        }
        fn memset(self) -> Result<driver::MemsetNode, DriverError> {
            match self {
                Fake::Memset(dst) => Ok(driver::MemsetNode { dst, bytes: 64 }),
                _ => Err(lost("cuGraphMemsetNodeGetParams")),
            }
        }
        fn memcpy(self) -> Result<driver::MemcpyNode, DriverError> {
            Err(lost("cuGraphMemcpyNodeGetParams"))
        }
        fn mem_alloc(self) -> Result<(u64, u64), DriverError> {
            match self {
                Fake::Alloc(base, size) => Ok((base, size)),
                _ => Err(lost("cuGraphMemAllocNodeGetParams")),
            }
        }
        fn mem_free(self) -> Result<u64, DriverError> {
            match self {
                Fake::Free(dptr) => Ok(dptr),
                _ => Err(lost("cuGraphMemFreeNodeGetParams")),
            }
        }
        fn child_graph(self) -> Result<Tree, DriverError> {
            match self {
                Fake::Child(t) => Ok(t),
                _ => Err(lost("cuGraphChildGraphNodeGetGraph")),
            }
        }
        fn conditional_bodies(self) -> Result<Vec<Tree>, DriverError> {
            match self {
                Fake::Conditional(bodies) => Ok(bodies.to_vec()),
                _ => Err(lost("cuGraphNodeGetParams")),
            }
        }
    }

    /// (index, kind, parent, words' addresses) of every node read.
    fn read(w: &WalkedGraph) -> Vec<(u32, String, Option<u32>, Vec<u64>)> {
        w.nodes
            .iter()
            .map(|n| {
                let words = n.words.iter().map(|w| w.addr.0).collect();
                (n.index, n.kind.to_string(), n.parent, words)
            })
            .collect()
    }

    const A: u64 = 0x7f00_0000_0000;
    const B: u64 = 0x7f00_1000_0000;

    #[test]
    fn child_graph_bodies_are_walked_depth_first_with_their_parent() {
        // 0 memset, 1 child { 2 alloc B, 3 child { 4 memset B+64 }, 5 free B }, 6 memset A
        let inner = tree(vec![Fake::Memset(B + 64)]);
        let body = tree(vec![
            Fake::Alloc(B, 4096),
            Fake::Child(inner),
            Fake::Free(B),
        ]);
        let top = tree(vec![
            Fake::Alloc(A, 1 << 21),
            Fake::Child(body),
            Fake::Memset(A + 8),
            Fake::Event,
        ]);
        let (w, stats) = walk_tree(top).unwrap();
        assert_eq!(
            read(&w),
            vec![
                (0, "mem_alloc".into(), None, vec![A]),
                (2, "mem_alloc".into(), Some(1), vec![B]),
                (4, "memset".into(), Some(3), vec![B + 64]),
                (5, "mem_free".into(), Some(1), vec![B]),
                (6, "memset".into(), None, vec![A + 8]),
            ]
        );
        assert!(w.unread.is_empty());
        // Bodies' nodes are counted with the graph's own; the event holds no address.
        let counts: Vec<(&str, u64)> = w
            .node_counts
            .iter()
            .map(|(k, &v)| (k.as_str(), v))
            .collect();
        assert_eq!(
            counts,
            [
                ("child_graph", 2),
                ("mem_alloc", 2),
                ("mem_free", 1),
                ("memset", 2),
                ("wait_event", 1)
            ]
        );
        assert_eq!(stats.nodes, 8);
        assert_eq!(
            w.graph_allocations,
            vec![(Addr(A), 1 << 21), (Addr(B), 4096)]
        );
    }

    #[test]
    fn every_body_of_a_conditional_node_is_walked_under_it() {
        let then = tree(vec![Fake::Memset(A)]);
        let other = tree(vec![Fake::Memset(A + 16), Fake::Memset(A + 32)]);
        let top = tree(vec![
            Fake::Alloc(A, 4096),
            Fake::Conditional(Box::leak(vec![then, other].into_boxed_slice())),
            Fake::Memset(A + 48),
        ]);
        let (w, _) = walk_tree(top).unwrap();
        assert_eq!(
            read(&w),
            vec![
                (0, "mem_alloc".into(), None, vec![A]),
                (2, "memset".into(), Some(1), vec![A]),
                (3, "memset".into(), Some(1), vec![A + 16]),
                (4, "memset".into(), Some(1), vec![A + 32]),
                (5, "memset".into(), None, vec![A + 48]),
            ]
        );
        assert_eq!(w.node_counts["conditional"], 1);
    }

    #[test]
    fn a_body_or_node_that_cannot_be_read_is_listed_never_dropped() {
        let top = tree(vec![
            Fake::LostConditional,
            Fake::LostChild,
            Fake::Kernel,
            Fake::Type(8),
            Fake::Type(42),
        ]);
        let (w, _) = walk_tree(top).unwrap();
        let unread: Vec<(u32, &str, &str)> = w
            .unread
            .iter()
            .map(|u| (u.index, u.node_type.as_str(), u.reason.as_str()))
            .collect();
        assert_eq!(unread.len(), 4, "{unread:?}");
        assert_eq!((unread[0].0, unread[0].1), (0, "conditional"));
        assert!(
            unread[0].2.starts_with("its bodies could not be read: "),
            "{}",
            unread[0].2
        );
        assert_eq!((unread[1].0, unread[1].1), (1, "child_graph"));
        assert!(
            unread[1].2.starts_with("its body could not be read: "),
            "{}",
            unread[1].2
        );
        assert_eq!((unread[2].0, unread[2].1), (3, "ext_semaphore_signal"));
        assert!(
            unread[2].2.contains("does not read this node type"),
            "{}",
            unread[2].2
        );
        assert_eq!((unread[3].0, unread[3].1), (4, "type_42"));
        assert!(
            unread[3].2.contains("unknown to graphcheck"),
            "{}",
            unread[3].2
        );
        // The kernel whose launch could not be read is a node, opaque, with the reason.
        let [k] = &w.nodes[..] else {
            panic!("{:?}", w.nodes)
        };
        assert_eq!((k.index, &*k.name), (2, "(unreadable kernel node)"));
        assert!(
            k.opaque
                .as_deref()
                .unwrap()
                .starts_with("its launch parameters could not be read")
        );
    }

    #[test]
    fn node_type_names_cover_the_driver_and_beyond() {
        assert_eq!(node_type_name(0), "kernel");
        assert_eq!(node_type_name(4), "child_graph");
        assert_eq!(node_type_name(13), "conditional");
        assert_eq!(node_type_name(99), "type_99");
    }

    #[test]
    fn range_cache_filters_non_addresses_without_the_driver() {
        // Answered from the cache: no driver call for small numbers, non-canonical values,
        // or words inside a range already seen.
        let mut c = RangeCache {
            ranges: vec![(0x7f00_0000_0000, 0x20_0000)],
            ..RangeCache::default()
        };
        // A miss remembered in the recent-miss table is answered there.
        c.misses.insert(0x1234_5678);
        assert_eq!(c.lookup(0x1234_5678), None);
        assert_eq!(c.recent_misses[RangeCache::slot(0x1234_5678)], 0x1234_5678);
        assert_eq!(c.lookup(0x1234_5678), None);
        assert_eq!(c.lookup(8), None);
        assert_eq!(c.lookup(u64::MAX), None);
        assert_eq!(
            c.lookup(0x7f00_0000_0100),
            Some((0x7f00_0000_0000, 0x20_0000))
        );
        assert_eq!(c.lookups, 0);
    }

    #[test]
    fn words_alternating_between_allocations_hit_their_granules() {
        // A weight's allocation and the graph pool's, as a GEMM's words alternate: once
        // each is found, either answers from its granule though `last` is the other's.
        let (w, pool) = ((0x7f00_0000_0000, 0x80_0000), (0x7f10_0000_0000, 0x20_0000));
        let mut c = RangeCache {
            ranges: vec![w, pool],
            ..RangeCache::default()
        };
        for _ in 0..3 {
            assert_eq!(c.lookup(w.0 + 0x40), Some(w));
            assert_eq!(c.lookup(pool.0 + 0x100), Some(pool));
        }
        c.ranges.clear(); // answered without the sorted ranges from here on
        assert_eq!(c.lookup(w.0 + 0x80), Some(w));
        assert_eq!(c.lookup(pool.0 + 0x180), Some(pool));
        assert_eq!(c.lookups, 0);
    }
}
