//! Test fixtures shared by the unit tests: a small manifest with every kind of tensor.
#![cfg(test)]

use std::collections::BTreeMap;

use crate::check::finding::Report;
use crate::model::format::*;

/// (kind, subject) of every finding, in report order.
pub fn kinds(r: &Report) -> Vec<(crate::check::finding::FindingKind, String)> {
    r.findings
        .iter()
        .map(|f| (f.kind, f.subject.clone()))
        .collect()
}

pub const W: PoolId = PoolId(0);
pub const KV: PoolId = PoolId(1);
pub const GP: PoolId = PoolId(2);
pub const BASE: u64 = 0x7f2c_0000_0000;

pub fn producer() -> Producer {
    Producer {
        tool: "unit".into(),
        tool_version: "0".into(),
        gpu: None,
        driver_version: None,
        framework: None,
        rank: 0,
        world_size: 1,
        session: None,
    }
}

pub fn pools() -> Vec<Pool> {
    vec![
        Pool {
            id: W,
            name: "weights".into(),
            kind: PoolKind::Weights,
            sleep: SleepPolicy::Restored,
        },
        Pool {
            id: KV,
            name: "kv_cache".into(),
            kind: PoolKind::KvCache,
            sleep: SleepPolicy::Discarded,
        },
        Pool {
            id: GP,
            name: "graph".into(),
            kind: PoolKind::Graph,
            sleep: SleepPolicy::Untouched,
        },
    ]
}

/// A tensor of 256 bytes at `BASE + slot * 0x1000` in allocation `slot`.
pub fn tensor(id: u32, slot: u64, pool: PoolId) -> Tensor {
    Tensor {
        id: TensorId(id),
        storage_base: Addr(BASE + slot * 0x1000),
        storage_nbytes: 256,
        offset: 0,
        nbytes: 256,
        shape: vec![128],
        stride: vec![1],
        dtype: "bfloat16".into(),
        itemsize: 2,
        device: "cuda:0".into(),
        allocation: Some(AllocationId(slot as u32)),
        pool: Some(pool),
        digest: Some(Digest(format!("sum64:{id:016x}"))),
        reference_digest: None,
        alloc_site: vec![],
        storage: None,
    }
}

pub fn alloc(slot: u64, pool: PoolId) -> Allocation {
    Allocation {
        id: AllocationId(slot as u32),
        base: Addr(BASE + slot * 0x1000),
        size: 0x1000,
        pool: Some(pool),
    }
}

pub fn owner(path: &str, t: u32, r: Registration) -> Owner {
    Owner {
        path: crate::model::owner_path::OwnerPath::parse(path).unwrap(),
        tensor: TensorId(t),
        registration: r,
        holder: None,
    }
}

pub fn touch(t: Option<u32>, slot: u64, off: u64) -> Touch {
    Touch {
        param: 0,
        offset: 8,
        addr: Addr(BASE + slot * 0x1000 + off),
        tensor: t.map(TensorId),
        allocation: Some(AllocationId(slot as u32)),
    }
}

/// Slots: 0 weight (parameter), 1 scale (plain attribute), 2 meta (buffer in kv pool),
/// 3 graph-pool intermediate, 4 a global cache nobody owns; 5..8 spare for live.
pub fn manifest() -> Manifest {
    let mut m = Manifest::new(producer());
    m.pools = pools();
    m.allocations = vec![alloc(0, W), alloc(1, W), alloc(2, KV), alloc(3, GP), {
        let mut a = alloc(4, W);
        a.pool = None;
        a
    }];
    m.tensors = vec![tensor(0, 0, W), tensor(1, 1, W), tensor(2, 2, KV)];
    m.owners = vec![
        owner("model.w", 0, Registration::Parameter),
        owner("model.scale", 1, Registration::ModuleAttribute),
        owner("model.scale_alias", 1, Registration::ObjectAttribute),
        owner("model.meta", 2, Registration::BufferNonPersistent),
    ];
    let node = |i: u32, touches: Vec<Touch>| Node {
        index: i,
        kind: NodeKind::Kernel,
        name: format!("k{i}").into(),
        grid: None,
        block: None,
        parent: None,
        opaque: None,
        touches,
        ignored: Vec::new(),
    };
    m.graphs = vec![
        Graph {
            id: GraphId(0),
            name: "bs1".into(),
            pool: Some(GP),
            node_counts: BTreeMap::from([("kernel".into(), 2)]),
            unread: vec![],
            guards: Vec::new(),
            retargets: Vec::new(),
            nodes: vec![
                node(0, vec![touch(Some(0), 0, 0), touch(None, 3, 0x40)]),
                node(1, vec![touch(Some(2), 2, 0)]),
            ],
        },
        Graph {
            id: GraphId(1),
            name: "bs8".into(),
            pool: Some(GP),
            node_counts: BTreeMap::from([("kernel".into(), 1)]),
            unread: vec![],
            guards: Vec::new(),
            retargets: Vec::new(),
            nodes: vec![node(0, vec![touch(Some(1), 1, 0x10), touch(None, 4, 0)])],
        },
    ];
    m
}

/// A live snapshot equal to the manifest: same owners, tensors and addresses, all active.
pub fn live(m: &Manifest, contents: Contents) -> Live {
    let mut l = Live::new(
        producer(),
        Event {
            name: "reload".into(),
            contents,
        },
    );
    l.pools = m.pools.clone();
    l.allocations = m.allocations.clone();
    l.tensors = m.tensors.clone();
    l.owners = m.owners.clone();
    // One probe per distinct captured address, in document order, as `build_live` writes
    // them (a live snapshot missing one is refused).
    let mut seen = std::collections::BTreeSet::new();
    l.probes = m
        .graphs
        .iter()
        .flat_map(|g| &g.nodes)
        .flat_map(|n| &n.touches)
        .filter(|t| seen.insert(t.addr))
        .map(|t| Probe {
            addr: t.addr,
            state: AllocState::Active,
            pool: None,
            allocation: None,
        })
        .collect();
    l
}
