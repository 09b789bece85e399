//! A builder for one synthetic process: its allocator, tensors, owners and captured graphs.
//! A scenario builds the state at capture, takes the manifest, changes the state the way
//! its reload or sleep does, and takes the live snapshot.

use std::collections::{BTreeMap, HashSet};

use graphcheck::model::format::{
    Addr, AllocationId, Contents, Event, Frame, Graph, GraphId, Live, Manifest, Node, NodeKind,
    Owner, Pool, PoolId, PoolKind, Probe, Producer, Registration, SleepPolicy, Tensor, TensorId,
    Touch,
};
use graphcheck::model::owner_path::OwnerPath;

use crate::heap::Heap;

/// An element type: its name as the format spells it and its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dtype {
    pub name: &'static str,
    pub itemsize: u32,
}

pub const BF16: Dtype = Dtype {
    name: "bfloat16",
    itemsize: 2,
};
pub const F32: Dtype = Dtype {
    name: "float32",
    itemsize: 4,
};
pub const I32: Dtype = Dtype {
    name: "int32",
    itemsize: 4,
};
pub const I64: Dtype = Dtype {
    name: "int64",
    itemsize: 8,
};
pub const FP8: Dtype = Dtype {
    name: "float8_e4m3fn",
    itemsize: 1,
};
pub const U8: Dtype = Dtype {
    name: "uint8",
    itemsize: 1,
};

/// The four pools every synthetic process has, and where their segments start.
pub const DEFAULT: PoolId = PoolId(0);
pub const WEIGHTS: PoolId = PoolId(1);
pub const KV_CACHE: PoolId = PoolId(2);
pub const GRAPH_POOL: PoolId = PoolId(3);

const REGIONS: [u64; 4] = [
    0x7f34_0000_0000,
    0x7f2c_0000_0000,
    0x7f2e_0000_0000,
    0x7f30_0000_0000,
];

/// The digest a tensor's contents get after `version` rewrites; `sum64` of all-zero bytes is
/// zero, which is what a discarded page that comes back zeroed reads as.
pub fn digest(id: TensorId, version: u32) -> graphcheck::model::format::Digest {
    let mut x = (u64::from(id.0) << 32 | u64::from(version)) ^ 0x9e37_79b9_7f4a_7c15;
    // splitmix64: a fixed, well-mixed function of the pair, identical on every run.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    graphcheck::model::format::Digest(format!("sum64:{x:016x}"))
}

/// The digest of a tensor whose pages came back zeroed.
pub fn zero_digest() -> graphcheck::model::format::Digest {
    graphcheck::model::format::Digest("sum64:0000000000000000".into())
}

/// The producer every synthetic document names.
pub fn producer() -> Producer {
    Producer {
        tool: "graphcheck-gen".into(),
        tool_version: env!("CARGO_PKG_VERSION").into(),
        gpu: Some("NVIDIA H200 (synthetic)".into()),
        driver_version: Some(13000),
        framework: Some("torch 2.11.0 (modelled)".into()),
        rank: 0,
        world_size: 1,
        session: None,
    }
}

/// Where a touch points.
#[derive(Clone, Copy, Debug)]
pub enum At {
    /// A tensor's first element.
    T(TensorId),
    /// `n` bytes into a tensor's view.
    Off(TensorId, u64),
    /// An address no tensor record covers (a graph-pool intermediate, a module global).
    Raw(u64),
}

/// The process being modelled.
#[derive(Clone, Debug)]
pub struct Doc {
    pub heap: Heap,
    /// Every tensor ever made, by id; a freed one stays here but no owner names it.
    tensors: Vec<Tensor>,
    freed: Vec<bool>,
    /// Each tensor's storage object, numbered in allocation order (a view shares its
    /// base's): two storages one after the other at one address have two numbers.
    storages: Vec<u32>,
    owners: Vec<Owner>,
    /// Owner records a rebinding or removal ended after a graph had read their tensor: the
    /// manifest keeps what each graph was captured with.
    past_owners: Vec<Owner>,
    graphs: Vec<Graph>,
}

impl Default for Doc {
    fn default() -> Self {
        Doc::new()
    }
}

impl Doc {
    /// A process with the default, weights, KV-cache and graph pools.
    pub fn new() -> Doc {
        let pools = vec![
            Pool {
                id: DEFAULT,
                name: "default".into(),
                kind: PoolKind::Default,
                sleep: SleepPolicy::Untouched,
            },
            Pool {
                id: WEIGHTS,
                name: "weights".into(),
                kind: PoolKind::Weights,
                sleep: SleepPolicy::Restored,
            },
            Pool {
                id: KV_CACHE,
                name: "kv_cache".into(),
                kind: PoolKind::KvCache,
                sleep: SleepPolicy::Discarded,
            },
            Pool {
                id: GRAPH_POOL,
                name: "graph(1, 0)".into(),
                kind: PoolKind::Graph,
                sleep: SleepPolicy::Untouched,
            },
        ];
        Doc {
            heap: Heap::new(pools, REGIONS.to_vec()),
            tensors: Vec::new(),
            freed: Vec::new(),
            storages: Vec::new(),
            owners: Vec::new(),
            past_owners: Vec::new(),
            graphs: Vec::new(),
        }
    }

    /// Allocates a contiguous tensor in `pool`.
    pub fn tensor(&mut self, pool: PoolId, dtype: Dtype, shape: &[u64]) -> TensorId {
        let numel: u64 = shape.iter().product();
        let nbytes = numel * u64::from(dtype.itemsize);
        let (alloc, base) = self.heap.alloc(pool, nbytes);
        let id = TensorId(self.tensors.len() as u32);
        self.tensors.push(Tensor {
            id,
            storage_base: Addr(base),
            storage_nbytes: nbytes,
            offset: 0,
            nbytes,
            shape: shape.to_vec(),
            stride: contiguous(shape),
            dtype: dtype.name.into(),
            itemsize: dtype.itemsize,
            device: "cuda:0".into(),
            allocation: Some(alloc),
            pool: Some(pool),
            digest: None,
            reference_digest: None,
            alloc_site: Vec::new(),
            storage: None,
        });
        self.freed.push(false);
        let next = self.storages.iter().max().map_or(0, |n| n + 1);
        self.storages.push(next);
        id
    }

    /// A view of `base`'s storage (what `.T`, `.permute` or `.split` give): `offset` bytes
    /// in, its own shape and stride (in elements), the same storage, allocation and pool. A
    /// view of a digested tensor gets a digest of its own.
    pub fn view(&mut self, base: TensorId, offset: u64, shape: &[u64], stride: &[i64]) -> TensorId {
        let b = self.get(base).clone();
        // Bytes from the first element to one past the last one.
        let last: u64 = shape
            .iter()
            .zip(stride)
            .map(|(&d, &s)| d.saturating_sub(1) * s.unsigned_abs())
            .sum();
        let nbytes = if shape.contains(&0) {
            0
        } else {
            (last + 1) * u64::from(b.itemsize)
        };
        assert!(
            offset + nbytes <= b.storage_nbytes,
            "a view past its storage"
        );
        let id = TensorId(self.tensors.len() as u32);
        self.tensors.push(Tensor {
            id,
            offset,
            nbytes,
            shape: shape.to_vec(),
            stride: stride.to_vec(),
            digest: b.digest.as_ref().map(|_| digest(id, 0)),
            reference_digest: None,
            alloc_site: Vec::new(),
            storage: None,
            ..b
        });
        self.freed.push(false);
        self.storages.push(self.storages[base.0 as usize]);
        id
    }

    /// Allocates a block no tensor record describes (a graph intermediate, a global).
    pub fn raw(&mut self, pool: PoolId, nbytes: u64) -> u64 {
        self.heap.alloc(pool, nbytes).1
    }

    /// Adds an owner path for `t`.
    pub fn own(&mut self, path: &str, t: TensorId, registration: Registration, holder: &str) {
        self.owners.push(Owner {
            path: OwnerPath::parse(path).expect("scenarios name valid owner paths"),
            tensor: t,
            registration,
            holder: Some(holder.into()),
        });
    }

    /// A tensor in `pool` held at `path`; persistent ones get a content digest.
    pub fn held(
        &mut self,
        path: &str,
        holder: &str,
        registration: Registration,
        pool: PoolId,
        dtype: Dtype,
        shape: &[u64],
    ) -> TensorId {
        let t = self.tensor(pool, dtype, shape);
        if registration.is_persistent() {
            self.tensors[t.0 as usize].digest = Some(digest(t, 0));
        }
        self.own(path, t, registration, holder);
        t
    }

    /// A parameter in the weights pool.
    pub fn param(&mut self, path: &str, holder: &str, dtype: Dtype, shape: &[u64]) -> TensorId {
        self.held(path, holder, Registration::Parameter, WEIGHTS, dtype, shape)
    }

    /// A graph input the runner fills before each replay, in the default pool.
    pub fn input(&mut self, path: &str, dtype: Dtype, shape: &[u64]) -> TensorId {
        self.held(
            path,
            "GPUModelRunner",
            Registration::GraphInput,
            DEFAULT,
            dtype,
            shape,
        )
    }

    pub fn get(&self, t: TensorId) -> &Tensor {
        &self.tensors[t.0 as usize]
    }

    pub fn get_mut(&mut self, t: TensorId) -> &mut Tensor {
        &mut self.tensors[t.0 as usize]
    }

    /// The address of `t`'s first element.
    pub fn addr(&self, t: TensorId) -> u64 {
        self.get(t).data_ptr().0
    }

    /// Records where `t`'s storage was allocated, innermost frame first.
    pub fn site(&mut self, t: TensorId, frames: &[(&str, u32, &str)]) {
        self.get_mut(t).alloc_site = frames
            .iter()
            .map(|&(filename, line, name)| Frame {
                filename: filename.into(),
                line,
                name: name.into(),
            })
            .collect();
    }

    /// The tensor an owner path holds now.
    pub fn tensor_at(&self, path: &str) -> TensorId {
        self.owners
            .iter()
            .find(|o| o.path == path)
            .unwrap_or_else(|| panic!("no owner {path}"))
            .tensor
    }

    /// Points an owner path at another tensor (a rebinding).
    pub fn rebind(&mut self, path: &str, t: TensorId) {
        let i = self.owner_index(path);
        self.keep_if_captured(i);
        self.owners[i].tensor = t;
    }

    /// Removes an owner path (the attribute is gone, or set to `None`).
    pub fn remove_owner(&mut self, path: &str) {
        let i = self.owner_index(path);
        self.keep_if_captured(i);
        self.owners.remove(i);
    }

    fn owner_index(&self, path: &str) -> usize {
        self.owners
            .iter()
            .position(|o| o.path == path)
            .unwrap_or_else(|| panic!("no owner {path}"))
    }

    /// Keeps owner `i` for the manifest where a graph captured so far read its tensor.
    fn keep_if_captured(&mut self, i: usize) {
        let t = self.owners[i].tensor;
        let read = self
            .graphs
            .iter()
            .flat_map(|g| &g.nodes)
            .flat_map(|n| &n.touches)
            .any(|k| k.tensor == Some(t));
        if read {
            self.past_owners.push(self.owners[i].clone());
        }
    }

    /// Releases `t`'s storage to the allocator; no owner may hold it, nor a view of it,
    /// any more.
    pub fn free(&mut self, t: TensorId) {
        let base = self.get(t).storage_base;
        let views: Vec<TensorId> = self
            .tensors
            .iter()
            .filter(|v| v.storage_base == base && !self.freed[v.id.0 as usize])
            .map(|v| v.id)
            .collect();
        assert!(
            self.owners.iter().all(|o| !views.contains(&o.tensor)),
            "freeing a storage that is still owned"
        );
        self.heap.free(base.0);
        for v in views {
            self.freed[v.0 as usize] = true;
        }
    }

    /// The next content version of `t` (new weights copied in place).
    pub fn rewrite(&mut self, t: TensorId, version: u32) {
        self.get_mut(t).digest = Some(digest(t, version));
    }

    /// Ids of the persistent parameters and buffers now owned (for bulk content updates).
    pub fn registered_tensors(&self) -> Vec<TensorId> {
        let mut v: Vec<TensorId> = self
            .owners
            .iter()
            .filter(|o| o.registration.is_registered())
            .map(|o| o.tensor)
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// Starts a graph captured into the shared graph pool; returns its index.
    pub fn graph(&mut self, name: &str) -> usize {
        self.graphs.push(Graph {
            id: GraphId(self.graphs.len() as u32),
            name: name.into(),
            pool: Some(GRAPH_POOL),
            node_counts: BTreeMap::new(),
            unread: Vec::new(),
            guards: Vec::new(),
            retargets: Vec::new(),
            nodes: Vec::new(),
        });
        self.graphs.len() - 1
    }

    fn touch(&self, param: u32, offset: u32, at: At) -> Touch {
        let (addr, tensor) = match at {
            At::T(t) => (self.addr(t), Some(t)),
            At::Off(t, n) => {
                assert!(n < self.get(t).nbytes.max(1), "touch past the view's end");
                (self.addr(t) + n, Some(t))
            }
            At::Raw(a) => (a, None),
        };
        let allocation: Option<AllocationId> = match tensor {
            Some(t) => self.get(t).allocation,
            None => self.heap.allocation_at(addr),
        };
        Touch {
            param,
            offset,
            addr: Addr(addr),
            tensor,
            allocation,
        }
    }

    /// Appends a kernel node; `touches` are `(param, byte offset, target)`.
    pub fn kernel(
        &mut self,
        g: usize,
        name: &str,
        grid: [u32; 3],
        block: [u32; 3],
        touches: &[(u32, u32, At)],
    ) {
        let touches = touches
            .iter()
            .map(|&(p, o, at)| self.touch(p, o, at))
            .collect();
        self.push_node(g, NodeKind::Kernel, name, Some(grid), Some(block), touches);
    }

    /// Appends a memset node writing `dst`.
    pub fn memset(&mut self, g: usize, dst: At) {
        let touches = vec![self.touch(0, 0, dst)];
        self.push_node(g, NodeKind::Memset, "memset", None, None, touches);
    }

    /// Appends a memcpy node from `src` to `dst`.
    pub fn memcpy(&mut self, g: usize, dst: At, src: At) {
        let touches = vec![self.touch(0, 0, dst), self.touch(1, 0, src)];
        self.push_node(g, NodeKind::Memcpy, "memcpy", None, None, touches);
    }

    fn push_node(
        &mut self,
        g: usize,
        kind: NodeKind,
        name: &str,
        grid: Option<[u32; 3]>,
        block: Option<[u32; 3]>,
        touches: Vec<Touch>,
    ) {
        let graph = &mut self.graphs[g];
        let index = graph.nodes.len() as u32;
        *graph.node_counts.entry(kind.to_string()).or_insert(0) += 1;
        graph.nodes.push(Node {
            index,
            kind,
            name: name.into(),
            grid,
            block,
            parent: None,
            opaque: None,
            touches,
            ignored: Vec::new(),
        });
    }

    /// The manifest of the process as it is now: tensors that are owned or that a graph
    /// read (also one since freed), and each graph's capture-time owners. Where two of its
    /// tensors are one view of two storages (one died, another took its memory), or a
    /// path held two storages at two captures, their tensors carry storage numbers, as
    /// graphcheck's recorder writes them.
    pub fn manifest(&self) -> Manifest {
        let touched: HashSet<TensorId> = self
            .graphs
            .iter()
            .flat_map(|g| &g.nodes)
            .flat_map(|n| &n.touches)
            .filter_map(|t| t.tensor)
            .collect();
        let owned: HashSet<TensorId> = self.owners.iter().map(|o| o.tensor).collect();
        let mut m = Manifest::new(producer());
        m.pools = self.heap.pools().to_vec();
        m.allocations = self.heap.allocations();
        m.owners = self.owners.clone();
        for o in &self.past_owners {
            if !m
                .owners
                .iter()
                .any(|x| x.path == o.path && x.tensor == o.tensor)
            {
                m.owners.push(o.clone());
            }
        }
        m.tensors = self
            .tensors
            .iter()
            .filter(|t| {
                touched.contains(&t.id) || (!self.freed[t.id.0 as usize] && owned.contains(&t.id))
            })
            .cloned()
            .collect();
        self.number_storages(&mut m);
        m.graphs = self.graphs.clone();
        m
    }

    fn number_storages(&self, m: &mut Manifest) {
        let mut numbered: HashSet<TensorId> = HashSet::new();
        let mut by_view: BTreeMap<ViewOf<'_>, Vec<TensorId>> = BTreeMap::new();
        for t in &m.tensors {
            by_view
                .entry((t.data_ptr().0, &t.shape, &t.stride, &t.dtype))
                .or_default()
                .push(t.id);
        }
        for same in by_view.values() {
            let storages: HashSet<u32> = same.iter().map(|t| self.storages[t.0 as usize]).collect();
            if storages.len() > 1 {
                numbered.extend(same);
            }
        }
        let mut paths: BTreeMap<&str, Vec<TensorId>> = BTreeMap::new();
        for o in &m.owners {
            paths.entry(o.path.as_str()).or_default().push(o.tensor);
        }
        for held in paths.values().filter(|h| h.len() > 1) {
            numbered.extend(held);
        }
        for t in &mut m.tensors {
            if numbered.contains(&t.id) {
                t.storage = Some(self.storages[t.id.0 as usize]);
            }
        }
    }

    /// Gives the manifest storage numbers to every view of `t`'s storage (a producer that
    /// numbers storages it need not tell apart).
    pub fn number_all_views(&self, m: &mut Manifest, t: TensorId) {
        let n = self.storages[t.0 as usize];
        for x in &mut m.tensors {
            if self.storages[x.id.0 as usize] == n {
                x.storage = Some(n);
            }
        }
    }

    /// The live snapshot of the process as it is now, probing every address `m` captured.
    pub fn live(&self, m: &Manifest, event: &str, contents: Contents) -> Live {
        let owned: HashSet<TensorId> = self.owners.iter().map(|o| o.tensor).collect();
        let mut l = Live::new(
            producer(),
            Event {
                name: event.into(),
                contents,
            },
        );
        l.pools = self.heap.pools().to_vec();
        l.allocations = self.heap.allocations();
        l.tensors = self
            .tensors
            .iter()
            .filter(|t| owned.contains(&t.id))
            .cloned()
            .collect();
        l.owners = self.owners.clone();
        let mut seen = HashSet::new();
        for touch in m
            .graphs
            .iter()
            .flat_map(|g| &g.nodes)
            .flat_map(|n| &n.touches)
        {
            if seen.insert(touch.addr) {
                let (state, pool, allocation) = self.heap.probe(touch.addr.0);
                l.probes.push(Probe {
                    addr: touch.addr,
                    state,
                    pool,
                    allocation,
                });
            }
        }
        l
    }
}

/// A view's data pointer, shape, stride and dtype.
type ViewOf<'a> = (u64, &'a [u64], &'a [i64], &'a str);

/// Row-major strides of `shape`, in elements.
pub fn contiguous(shape: &[u64]) -> Vec<i64> {
    let mut stride = vec![0i64; shape.len()];
    let mut acc = 1i64;
    for (s, &d) in stride.iter_mut().zip(shape).rev() {
        *s = acc;
        acc *= d.max(1) as i64;
    }
    stride
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_strides() {
        assert_eq!(contiguous(&[4, 3, 2]), vec![6, 2, 1]);
        assert_eq!(contiguous(&[]), Vec::<i64>::new());
    }

    #[test]
    fn digests_are_stable_and_distinct() {
        assert_eq!(digest(TensorId(1), 0), digest(TensorId(1), 0));
        assert_ne!(digest(TensorId(1), 0), digest(TensorId(1), 1));
        assert_ne!(digest(TensorId(1), 0), digest(TensorId(2), 0));
    }
}
