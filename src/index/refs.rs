//! Checking every reference of a loaded document, whatever its format version: ids unique
//! per record type, every reference resolving, every address inside what it names, owner
//! paths given once; and the lookups built on the way, which verify reuses. Errors name
//! the record by its path in the in-memory model (format 1's layout), which the loader
//! turns into the path of the file's own layout.

use rustc_hash::FxHashMap;
use std::fmt::Write as _;

use crate::model::dtype;
use crate::model::format::{
    Addr, Allocation, AllocationId, DocKind, Graph, Live, Manifest, Owner, Pool, PoolId,
    RangeDigest, Tensor, TensorId, ViewKey,
};
use crate::model::ids::IdIndex;
use crate::model::version::{FORMAT_VERSIONS, version_message};

/// A semantic error found after parsing: where, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub json_path: String,
    pub message: String,
}

impl Invalid {
    pub(crate) fn at(json_path: impl Into<String>, message: impl Into<String>) -> Invalid {
        Invalid {
            json_path: json_path.into(),
            message: message.into(),
        }
    }
}

/// Each tensor's owners (indices into `owners`, in document order), in one array: `[i]`
/// is tensor `i`'s. One vector per tensor was a hundred thousand allocations at scale.
#[derive(Debug, Default, Clone)]
pub struct OwnersOf {
    /// Tensor `i`'s owners are `items[starts[i]..starts[i + 1]]`.
    starts: Vec<usize>,
    items: Vec<usize>,
}

impl OwnersOf {
    /// From the tensor index of each owner, in owner order.
    fn new(tensors: usize, of_owner: &[usize]) -> OwnersOf {
        let mut starts = vec![0usize; tensors + 1];
        for &t in of_owner {
            starts[t + 1] += 1;
        }
        for i in 0..tensors {
            starts[i + 1] += starts[i];
        }
        let mut next = starts.clone();
        let mut items = vec![0usize; of_owner.len()];
        for (o, &t) in of_owner.iter().enumerate() {
            items[next[t]] = o;
            next[t] += 1;
        }
        OwnersOf { starts, items }
    }
}

impl std::ops::Index<usize> for OwnersOf {
    type Output = [usize];
    fn index(&self, tensor: usize) -> &[usize] {
        &self.items[self.starts[tensor]..self.starts[tensor + 1]]
    }
}

/// Owner index by path, without a copy of each path: by the path's hash, the path itself
/// compared in the owners (paths whose hash another path already has, which 64 bits make
/// rare, are kept by their text). A manifest's path given once per storage it held at one
/// capture or another has its further records in `more`, by the first one's position.
#[derive(Debug, Default, Clone)]
pub struct PathIndex {
    by_hash: FxHashMap<u64, usize>,
    clashes: FxHashMap<String, usize>,
    more: FxHashMap<usize, Vec<usize>>,
}

impl PathIndex {
    fn with_capacity(n: usize) -> PathIndex {
        PathIndex {
            by_hash: FxHashMap::with_capacity_and_hasher(n, Default::default()),
            clashes: FxHashMap::default(),
            more: FxHashMap::default(),
        }
    }

    fn hash(path: &str) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = rustc_hash::FxHasher::default();
        path.hash(&mut h);
        h.finish()
    }

    /// Indexes `owners[i]`; the position of an earlier owner with the same path, if any
    /// (then nothing changes).
    fn insert(&mut self, owners: &[Owner], i: usize) -> Option<usize> {
        let path = owners[i].path.as_str();
        match self.by_hash.entry(Self::hash(path)) {
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(i);
                None
            }
            std::collections::hash_map::Entry::Occupied(e) => {
                let j = *e.get();
                if owners[j].path.as_str() == path {
                    return Some(j);
                }
                match self.clashes.entry(path.to_string()) {
                    std::collections::hash_map::Entry::Occupied(c) => Some(*c.get()),
                    std::collections::hash_map::Entry::Vacant(c) => {
                        c.insert(i);
                        None
                    }
                }
            }
        }
    }

    /// Notes `owners[i]` as a further record of the path first given at `first`.
    fn add_more(&mut self, first: usize, i: usize) {
        self.more.entry(first).or_default().push(i);
    }

    /// The positions of every record of this path: the first, then the others in order
    /// (more than one only in a manifest whose path held several storages, one per capture).
    pub fn all(&self, owners: &[Owner], path: &str) -> Vec<usize> {
        let Some(&first) = self.get(owners, path) else {
            return Vec::new();
        };
        let mut v = vec![first];
        v.extend(self.more.get(&first).into_iter().flatten().copied());
        v
    }

    /// The position in `owners` (the records this index was built over) of the first owner
    /// with this path.
    pub fn get(&self, owners: &[Owner], path: &str) -> Option<&usize> {
        match self.by_hash.get(&Self::hash(path)) {
            Some(i) if owners[*i].path.as_str() == path => Some(i),
            Some(_) => self.clashes.get(path),
            None => None,
        }
    }
}

/// Lookups over the records both documents share, built while checking them.
#[derive(Debug, Default, Clone)]
pub struct Tables {
    pub pool_ix: IdIndex<PoolId>,
    pub alloc_ix: IdIndex<AllocationId>,
    pub tensor_ix: IdIndex<TensorId>,
    /// Owners of each tensor, by the tensor's index: indices into `owners`.
    pub owners_of: OwnersOf,
    /// Owner index by path.
    pub owner_by_path: PathIndex,
    /// A manifest's touches of each tensor, by the tensor's index (counted while checking
    /// them; empty for a live snapshot).
    pub touch_counts: Vec<u32>,
}

impl Tables {
    /// Checks ids, references and paths, and indexes them. `per_capture`: a path may be
    /// given once per storage it held (a manifest, whose graphs were captured at different
    /// times), not only once (a live snapshot: one moment).
    pub fn build(
        pools: &[Pool],
        allocations: &[Allocation],
        tensors: &[Tensor],
        owners: &[Owner],
        per_capture: bool,
    ) -> Result<Tables, Invalid> {
        let mut t = Tables {
            pool_ix: IdIndex::with_capacity(pools.len()),
            alloc_ix: IdIndex::with_capacity(allocations.len()),
            tensor_ix: IdIndex::with_capacity(tensors.len()),
            owner_by_path: PathIndex::with_capacity(owners.len()),
            ..Tables::default()
        };
        for (i, p) in pools.iter().enumerate() {
            if t.pool_ix.insert(p.id, i).is_some() {
                return Err(Invalid::at(
                    format!("pools[{i}].id"),
                    format!("two pools claim id {}", p.id.0),
                ));
            }
        }
        let pool_ref = |t: &Tables, p: Option<PoolId>, at: &dyn Fn() -> String| match p {
            Some(p) if !t.pool_ix.contains_key(&p) => {
                Err(Invalid::at(at(), format!("no pool has id {}", p.0)))
            }
            _ => Ok(()),
        };
        for (i, a) in allocations.iter().enumerate() {
            if t.alloc_ix.insert(a.id, i).is_some() {
                return Err(Invalid::at(
                    format!("allocations[{i}].id"),
                    format!("two allocations claim id {}", a.id.0),
                ));
            }
            if a.size == 0 || a.base.checked_add(a.size).is_none() {
                return Err(Invalid::at(
                    format!("allocations[{i}].size"),
                    format!(
                        "allocation at {} of {} bytes is empty or wraps",
                        a.base, a.size
                    ),
                ));
            }
            pool_ref(&t, a.pool, &|| format!("allocations[{i}].pool"))?;
        }
        // A storage number names one storage object: one base, one size, one device, and
        // each of its views once.
        let mut storages: FxHashMap<u32, usize> = FxHashMap::default();
        let mut numbered_views: FxHashMap<(ViewKey<'_>, u32), usize> = FxHashMap::default();
        for (i, x) in tensors.iter().enumerate() {
            if let Some(n) = x.storage {
                let first = *storages.entry(n).or_insert(i);
                let f = &tensors[first];
                if (f.storage_base, f.storage_nbytes, &f.device)
                    != (x.storage_base, x.storage_nbytes, &x.device)
                {
                    return Err(Invalid::at(
                        format!("tensors[{i}].storage"),
                        format!(
                            "storage {n} is {}+{} on {} at tensors[{first}], here {}+{} on {}: \
                             one storage object has one base, size and device",
                            f.storage_base,
                            f.storage_nbytes,
                            f.device,
                            x.storage_base,
                            x.storage_nbytes,
                            x.device
                        ),
                    ));
                }
                if let Some(j) = numbered_views.insert((x.view_key(), n), i) {
                    return Err(Invalid::at(
                        format!("tensors[{i}].storage"),
                        format!(
                            "the same view of storage {n} as tensors[{j}]: a view is one record"
                        ),
                    ));
                }
            }
            if t.tensor_ix.insert(x.id, i).is_some() {
                return Err(Invalid::at(
                    format!("tensors[{i}].id"),
                    format!("two tensors claim id {}", x.id.0),
                ));
            }
            check_layout(i, x)?;
            if let Some(a) = x.allocation {
                let Some(ai) = t.alloc_ix.get(&a) else {
                    return Err(Invalid::at(
                        format!("tensors[{i}].allocation"),
                        format!("no allocation has id {}", a.0),
                    ));
                };
                let al = &allocations[ai];
                // Neither sum wraps: checked above.
                if x.storage_base < al.base
                    || x.storage_base.0 + x.storage_nbytes > al.base.0 + al.size
                {
                    return Err(Invalid::at(
                        format!("tensors[{i}].storage_base"),
                        format!(
                            "storage {}+{} lies outside allocation {} ({}+{})",
                            x.storage_base, x.storage_nbytes, a.0, al.base, al.size
                        ),
                    ));
                }
            }
            pool_ref(&t, x.pool, &|| format!("tensors[{i}].pool"))?;
        }
        let mut of_owner = Vec::with_capacity(owners.len());
        for (i, o) in owners.iter().enumerate() {
            let Some(ti) = t.tensor_ix.get(&o.tensor) else {
                return Err(Invalid::at(
                    format!("owners[{i}].tensor"),
                    format!("no tensor has id {}", o.tensor.0),
                ));
            };
            if let Some(first) = t.owner_by_path.insert(owners, i) {
                repeated_path(&t, tensors, owners, first, i, per_capture)?;
                t.owner_by_path.add_more(first, i);
            }
            of_owner.push(ti);
        }
        t.owners_of = OwnersOf::new(tensors.len(), &of_owner);
        Ok(t)
    }

    /// The tensor with this id; the id must have been checked.
    pub fn tensor<'a>(&self, tensors: &'a [Tensor], id: TensorId) -> &'a Tensor {
        &tensors[self.tensor_ix[&id] as usize]
    }
}

/// Owner `i` gives the path of owner `first` again. A manifest may: where the path held
/// another storage at another capture (a parameter rebound between two captures), each
/// record names a tensor of its own storage number. Anything else is the path given twice.
fn repeated_path(
    t: &Tables,
    tensors: &[Tensor],
    owners: &[Owner],
    first: usize,
    i: usize,
    per_capture: bool,
) -> Result<(), Invalid> {
    let path = owners[i].path.as_str();
    let twice = |why: String| {
        Err(Invalid::at(
            format!("owners[{i}].path"),
            format!("path {path:?} is given twice (also by the owner at position {first}){why}"),
        ))
    };
    if !per_capture {
        return twice(String::new());
    }
    let storage = |o: usize| tensors[t.tensor_ix[&owners[o].tensor] as usize].storage;
    let Some(mine) = storage(i) else {
        return twice(
            "; a manifest gives a path again only for a tensor of another storage number".into(),
        );
    };
    for o in t.owner_by_path.all(owners, path) {
        match storage(o) {
            Some(n) if n != mine => {}
            Some(_) => {
                return twice(format!(
                    ", for storage {mine} both times: a path holds one view of a storage"
                ));
            }
            None => {
                return twice(format!(
                    "; the owner at position {o} names a tensor with no storage number"
                ));
            }
        }
    }
    Ok(())
}

/// A tensor record agrees with itself: one stride per dimension, none negative (PyTorch
/// has none), the `itemsize` of its dtype, the byte span `nbytes` its shape, strides and
/// itemsize give (computed without overflow), and that span inside its storage, which lies
/// inside the address space. Verify, explain and retarget trust each of these.
fn check_layout(i: usize, x: &Tensor) -> Result<(), Invalid> {
    let at = |field: &str| format!("tensors[{i}].{field}");
    if x.shape.len() != x.stride.len() {
        return Err(Invalid::at(
            at("stride"),
            format!(
                "{} strides for {} dimensions",
                x.stride.len(),
                x.shape.len()
            ),
        ));
    }
    if let Some(k) = x.stride.iter().position(|&s| s < 0) {
        return Err(Invalid::at(
            at(&format!("stride[{k}]")),
            format!(
                "stride {} is negative, which no PyTorch view has",
                x.stride[k]
            ),
        ));
    }
    match dtype::itemsize(&x.dtype) {
        Some(n) if n != x.itemsize => {
            return Err(Invalid::at(
                at("itemsize"),
                format!(
                    "a `{}` element is {}, not {}",
                    x.dtype,
                    bytes(n.into()),
                    x.itemsize
                ),
            ));
        }
        None if !dtype::plausible_itemsize(x.itemsize) => {
            return Err(Invalid::at(
                at("itemsize"),
                format!(
                    "{} bytes per element of `{}`, a dtype graphcheck does not know: an element \
                     is 1, 2, 4, 8 or 16 bytes",
                    x.itemsize, x.dtype
                ),
            ));
        }
        _ => {}
    }
    let Some(span) = view_span(&x.shape, &x.stride, x.itemsize) else {
        return Err(Invalid::at(
            at("shape"),
            format!(
                "the view {} of {} per element spans more bytes than a 64-bit address space \
                 holds",
                x.layout(),
                bytes(x.itemsize.into())
            ),
        ));
    };
    if span != x.nbytes {
        return Err(Invalid::at(
            at("nbytes"),
            format!(
                "`nbytes` is {}, but the view {} of {} per element spans {span}",
                x.nbytes,
                x.layout(),
                bytes(x.itemsize.into())
            ),
        ));
    }
    if x.storage_base.checked_add(x.storage_nbytes).is_none() {
        return Err(Invalid::at(
            at("storage_base"),
            format!(
                "a storage of {} at {} passes the end of the address space",
                bytes(x.storage_nbytes),
                x.storage_base
            ),
        ));
    }
    if x.offset
        .checked_add(x.nbytes)
        .is_none_or(|end| end > x.storage_nbytes)
    {
        return Err(Invalid::at(
            at("nbytes"),
            format!(
                "the view (offset {}, {}) lies outside its storage of {}",
                x.offset,
                bytes(x.nbytes),
                bytes(x.storage_nbytes)
            ),
        ));
    }
    Ok(())
}

/// `1 byte`, `4096 bytes`.
fn bytes(n: u64) -> String {
    if n == 1 {
        "1 byte".into()
    } else {
        format!("{n} bytes")
    }
}

/// The bytes a view spans from its first element: 0 when a dimension is 0, else one element
/// plus each dimension's reach (`(size - 1) * stride` elements); `None` past 64 bits.
/// Strides must not be negative.
pub fn view_span(shape: &[u64], stride: &[i64], itemsize: u32) -> Option<u64> {
    if shape.contains(&0) {
        return Some(0);
    }
    let mut elements: u128 = 1;
    for (&n, &s) in shape.iter().zip(stride) {
        let reach = u128::from(n - 1).checked_mul(u128::from(s.unsigned_abs()))?;
        elements = elements.checked_add(reach)?;
        if elements > u128::from(u64::MAX) {
            return None;
        }
    }
    u64::try_from(elements.checked_mul(u128::from(itemsize))?).ok()
}

/// Checks the version and kind of a document built in memory (the loaders check them
/// before anything else, with their own errors).
fn check_header(version: u32, kind: DocKind, expected: DocKind) -> Result<(), Invalid> {
    if !FORMAT_VERSIONS.contains(&version) {
        return Err(Invalid::at(
            "format_version",
            version_message(&version.to_string()),
        ));
    }
    if kind != expected {
        return Err(Invalid::at(
            "kind",
            format!("`kind` is `{kind}`, expected a `{expected}` document"),
        ));
    }
    Ok(())
}

/// Checks every reference of a manifest.
pub fn check_manifest(m: &Manifest) -> Result<Tables, Invalid> {
    check_header(m.format_version, m.kind, DocKind::Manifest)?;
    let mut t = Tables::build(&m.pools, &m.allocations, &m.tensors, &m.owners, true)?;
    let mut graph_ids = FxHashMap::default();
    for (gi, g) in m.graphs.iter().enumerate() {
        if graph_ids.insert(g.id, gi).is_some() {
            return Err(Invalid::at(
                format!("graphs[{gi}].id"),
                format!("two graphs claim id {}", g.id.0),
            ));
        }
        if let Some(p) = g.pool
            && !t.pool_ix.contains_key(&p)
        {
            return Err(Invalid::at(
                format!("graphs[{gi}].pool"),
                format!("no pool has id {}", p.0),
            ));
        }
        check_nodes(gi, g)?;
    }
    t.touch_counts = touches_in_parallel(m, &t)?;
    check_ranges(&m.ranges)?;
    Ok(t)
}

/// A graph's node records agree with its walk: each `index` (of a node read, or one
/// `unread`) is given once, and a node's `parent` is a node walked before it that holds a
/// body: not one whose parameters were read or that went unread.
fn check_nodes(gi: usize, g: &Graph) -> Result<(), Invalid> {
    // Where a record lies, in words, only for an error: `nodes[3]` or `unread[0]`.
    let place = |slot: usize| match slot.checked_sub(g.nodes.len()) {
        None => format!("graphs[{gi}].nodes[{slot}]"),
        Some(u) => format!("graphs[{gi}].unread[{u}]"),
    };
    // (index, slot) of every record, nodes read first, sorted: duplicates side by side, and
    // a parent found by bisection (no map: a manifest holds a hundred thousand nodes).
    let mut given: Vec<(u32, usize)> = g
        .nodes
        .iter()
        .map(|n| n.index)
        .chain(g.unread.iter().map(|u| u.index))
        .enumerate()
        .map(|(slot, index)| (index, slot))
        .collect();
    given.sort_unstable();
    if let Some(w) = given.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(Invalid::at(
            format!("{}.index", place(w[1].1)),
            format!("node {} is given twice (also at {})", w[1].0, place(w[0].1)),
        ));
    }
    for (ni, n) in g.nodes.iter().enumerate() {
        let Some(p) = n.parent else { continue };
        let at = || format!("graphs[{gi}].nodes[{ni}].parent");
        if p >= n.index {
            return Err(Invalid::at(
                at(),
                format!(
                    "node {} lies in the body of node {p}, which the walk must reach first",
                    n.index
                ),
            ));
        }
        if let Ok(k) = given.binary_search_by_key(&p, |&(index, _)| index) {
            return Err(Invalid::at(
                at(),
                format!(
                    "node {}'s parent {p} is the node at {}, which holds no body",
                    n.index,
                    place(given[k].1)
                ),
            ));
        }
    }
    Ok(())
}

/// Every touch's tensor and allocation exist and hold its address; the graphs of the
/// second half of the touches on a thread of their own where the machine has cores to
/// spare. The error is the first in document order. Returns the touches of each tensor.
fn touches_in_parallel(m: &Manifest, t: &Tables) -> Result<Vec<u32>, Invalid> {
    // Each tensor's span and each allocation's extent in compact arrays: a million touches
    // look them up in no order, and the records are many times their size.
    let spans: Vec<(u64, u64)> = m
        .tensors
        .iter()
        .map(|x| (x.data_ptr().0, x.end().0))
        .collect();
    let extents: Vec<(u64, u64)> = m.allocations.iter().map(|a| (a.base.0, a.size)).collect();
    let run = |graphs: std::ops::Range<usize>| -> Result<Vec<u32>, Invalid> {
        let mut counts = vec![0u32; m.tensors.len()];
        for gi in graphs {
            graph_touches(gi, m, t, &spans, &extents, &mut counts)?;
        }
        Ok(counts)
    };
    let touches: Vec<usize> = m
        .graphs
        .iter()
        .map(|g| g.nodes.iter().map(|n| n.touches.len()).sum())
        .collect();
    let total: usize = touches.iter().sum();
    let parallel = std::thread::available_parallelism().is_ok_and(|n| n.get() > 1);
    if !parallel || total < 65_536 {
        return run(0..m.graphs.len());
    }
    let mut seen = 0;
    let split = touches
        .iter()
        .position(|&n| {
            seen += n;
            seen * 2 >= total
        })
        .map_or(m.graphs.len(), |i| i + 1);
    std::thread::scope(|scope| {
        let second = scope.spawn(|| run(split..m.graphs.len()));
        let first = run(0..split);
        let second = match second.join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        let (mut counts, second) = (first?, second?);
        for (c, d) in counts.iter_mut().zip(second) {
            *c += d;
        }
        Ok(counts)
    })
}

fn graph_touches(
    gi: usize,
    m: &Manifest,
    t: &Tables,
    spans: &[(u64, u64)],
    extents: &[(u64, u64)],
    counts: &mut [u32],
) -> Result<(), Invalid> {
    let g = &m.graphs[gi];
    let mut at = String::new();
    for (ni, n) in g.nodes.iter().enumerate() {
        for (ti, touch) in n.touches.iter().enumerate() {
            let mut here = |field: &str| {
                at.clear();
                let _ = write!(at, "graphs[{gi}].nodes[{ni}].touches[{ti}].{field}");
                at.clone()
            };
            if let Some(id) = touch.tensor {
                let Some(x) = t.tensor_ix.get(&id) else {
                    return Err(Invalid::at(
                        here("tensor"),
                        format!("no tensor has id {}", id.0),
                    ));
                };
                counts[x] += 1;
                let (start, end) = spans[x];
                if !(start <= touch.addr.0 && touch.addr.0 < end) {
                    let tensor = &m.tensors[x];
                    return Err(Invalid::at(
                        here("addr"),
                        format!(
                            "{} lies outside tensor {} ({}+{})",
                            touch.addr,
                            id.0,
                            tensor.data_ptr(),
                            tensor.nbytes
                        ),
                    ));
                }
            }
            if let Some(id) = touch.allocation {
                let Some(a) = t.alloc_ix.get(&id) else {
                    return Err(Invalid::at(
                        here("allocation"),
                        format!("no allocation has id {}", id.0),
                    ));
                };
                let (base, size) = extents[a];
                if !(base <= touch.addr.0 && touch.addr.0 - base < size) {
                    let al = &m.allocations[a];
                    return Err(Invalid::at(
                        here("addr"),
                        format!(
                            "{} lies outside allocation {} ({}+{})",
                            touch.addr, id.0, al.base, al.size
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Checks every reference of a live snapshot.
pub fn check_live(l: &Live) -> Result<Tables, Invalid> {
    check_header(l.format_version, l.kind, DocKind::Live)?;
    let t = Tables::build(&l.pools, &l.allocations, &l.tensors, &l.owners, false)?;
    let mut probed: FxHashMap<Addr, usize> = FxHashMap::default();
    for (i, p) in l.probes.iter().enumerate() {
        if let Some(first) = probed.insert(p.addr, i) {
            return Err(Invalid::at(
                format!("probes[{i}].addr"),
                format!(
                    "{} is probed twice (also by probes[{first}]): one probe per address",
                    p.addr
                ),
            ));
        }
        if let Some(pool) = p.pool
            && !t.pool_ix.contains_key(&pool)
        {
            return Err(Invalid::at(
                format!("probes[{i}].pool"),
                format!("no pool has id {}", pool.0),
            ));
        }
        if let Some(a) = p.allocation
            && !t.alloc_ix.contains_key(&a)
        {
            return Err(Invalid::at(
                format!("probes[{i}].allocation"),
                format!("no allocation has id {}", a.0),
            ));
        }
    }
    check_ranges(&l.ranges)?;
    Ok(t)
}

/// Each range of `ranges` is non-empty, within the address space, and its digest names an
/// algorithm.
fn check_ranges(ranges: &[RangeDigest]) -> Result<(), Invalid> {
    for (i, r) in ranges.iter().enumerate() {
        if r.size == 0 || r.addr.0.checked_add(r.size).is_none() {
            return Err(Invalid::at(
                format!("ranges[{i}].size"),
                format!(
                    "a range of {} bytes at {} is empty or passes the end of the address space",
                    r.size, r.addr
                ),
            ));
        }
        if r.digest.algorithm().is_empty() {
            return Err(Invalid::at(
                format!("ranges[{i}].digest"),
                format!("`{}` is not `<algorithm>:<hex>`", r.digest.0),
            ));
        }
    }
    Ok(())
}

/// Whether `addr` lies in `[base, base + size)`.
pub fn in_range(addr: Addr, base: Addr, size: u64) -> bool {
    base <= addr && addr.0 - base.0 < size
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::format::{Registration, TensorId};
    use crate::model::owner_path::OwnerPath;

    fn owner(path: &str) -> Owner {
        Owner {
            path: OwnerPath::parse(path).unwrap(),
            tensor: TensorId(0),
            registration: Registration::Parameter,
            holder: None,
        }
    }

    #[test]
    fn owners_of_lists_each_tensors_owners_in_document_order() {
        let o = OwnersOf::new(4, &[2, 0, 2, 3, 2]);
        assert_eq!(&o[0], &[1]);
        assert!(o[1].is_empty());
        assert_eq!(&o[2], &[0, 2, 4]);
        assert_eq!(&o[3], &[3]);
    }

    #[test]
    fn path_index_finds_each_path_and_its_duplicate_even_where_hashes_clash() {
        let owners = [
            owner("model.a"),
            owner("model.b"),
            owner("model.b"),
            owner("model.c"),
        ];
        let mut ix = PathIndex::with_capacity(4);
        assert_eq!(ix.insert(&owners, 0), None);
        // As if model.b's hash were model.a's: model.b goes to the clashes, by its text.
        ix.by_hash.insert(PathIndex::hash("model.b"), 0);
        assert_eq!(ix.insert(&owners, 1), None);
        assert_eq!(ix.clashes.get("model.b"), Some(&1));
        assert_eq!(
            ix.insert(&owners, 2),
            Some(1),
            "a path given twice is found"
        );
        assert_eq!(ix.insert(&owners, 3), None);
        assert_eq!(ix.get(&owners, "model.a"), Some(&0));
        assert_eq!(ix.get(&owners, "model.b"), Some(&1));
        assert_eq!(ix.get(&owners, "model.c"), Some(&3));
        assert_eq!(ix.get(&owners, "model.d"), None);
    }
}
