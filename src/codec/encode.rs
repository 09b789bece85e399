//! Writing documents: a [`Manifest`] or [`Live`] serializes in the layout of its
//! `format_version`, format 1 (one object per record, as the model's types derive) or
//! format 2 (columns, [`crate::codec::v2`]). New documents carry
//! [`crate::model::version::FORMAT_VERSION`], so every writer writes format 2 unless a
//! caller sets `format_version` to 1 ([`Manifest::in_version`]).
//!
//! Format 2 is written straight from the model, column by column, without building the
//! columns in memory; a touch's address is written as an offset from what it names.

use crate::codec::columns::{column, entry, optional};
use crate::codec::v2::{Allocations, Owners, Probes, Tensors};

use rustc_hash::FxHashMap;
use serde::ser::{SerializeMap, SerializeStruct};
use serde::{Serialize, Serializer};

use crate::model::format::{
    Addr, Allocation, AllocationId, DocKind, Event, Graph, Live, Manifest, Owner, Pool, Probe,
    Producer, RangeDigest, Tensor, TensorId,
};
use crate::model::ids::IdIndex;
use crate::model::version::FORMAT_VERSIONS;

impl Manifest {
    /// This manifest, to be written in format `version` (1 or 2).
    pub fn in_version(mut self, version: u32) -> Manifest {
        self.format_version = version;
        self
    }
}

impl Live {
    /// This live snapshot, to be written in format `version` (1 or 2).
    pub fn in_version(mut self, version: u32) -> Live {
        self.format_version = version;
        self
    }
}

fn unknown_version<E: serde::ser::Error>(v: u32) -> E {
    E::custom(format!(
        "cannot write format_version {v}: this graphcheck writes versions {FORMAT_VERSIONS:?}"
    ))
}

impl Serialize for Manifest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.format_version {
            1 => V1Manifest {
                format_version: 1,
                kind: self.kind,
                producer: &self.producer,
                pools: &self.pools,
                allocations: &self.allocations,
                tensors: &self.tensors,
                owners: &self.owners,
                graphs: &self.graphs,
                ranges: &self.ranges,
            }
            .serialize(s),
            2 => v2_manifest(self, s),
            v => Err(unknown_version(v)),
        }
    }
}

impl Serialize for Live {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.format_version {
            1 => V1Live {
                format_version: 1,
                kind: self.kind,
                producer: &self.producer,
                event: &self.event,
                pools: &self.pools,
                allocations: &self.allocations,
                tensors: &self.tensors,
                owners: &self.owners,
                probes: &self.probes,
                ranges: &self.ranges,
            }
            .serialize(s),
            2 => v2_live(self, s),
            v => Err(unknown_version(v)),
        }
    }
}

/// Format 1's manifest: the model's fields in order, each record an object.
#[derive(Serialize)]
struct V1Manifest<'a> {
    format_version: u32,
    kind: DocKind,
    producer: &'a Producer,
    pools: &'a [Pool],
    allocations: &'a [Allocation],
    tensors: &'a [Tensor],
    owners: &'a [Owner],
    graphs: &'a [Graph],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    ranges: &'a [RangeDigest],
}

/// Format 1's live snapshot.
#[derive(Serialize)]
struct V1Live<'a> {
    format_version: u32,
    kind: DocKind,
    producer: &'a Producer,
    event: &'a Event,
    pools: &'a [Pool],
    allocations: &'a [Allocation],
    tensors: &'a [Tensor],
    owners: &'a [Owner],
    probes: &'a [Probe],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    ranges: &'a [RangeDigest],
}

/// Node names, each once, in the order nodes first use them.
struct Names<'a> {
    list: Vec<&'a str>,
    position: FxHashMap<&'a str, u32>,
}

impl<'a> Names<'a> {
    fn of(graphs: &'a [Graph]) -> Names<'a> {
        let mut names = Names {
            list: Vec::new(),
            position: FxHashMap::default(),
        };
        for n in graphs.iter().flat_map(|g| &g.nodes) {
            let next = names.list.len() as u32;
            names.position.entry(&n.name).or_insert_with(|| {
                names.list.push(&n.name);
                next
            });
        }
        names
    }
}

/// What touch offsets count from: each tensor's first element and each allocation's base,
/// by id (the first record of an id, as the reader takes it).
struct Bases<'a> {
    tensors: &'a [Tensor],
    tensor_ix: IdIndex<TensorId>,
    allocations: &'a [Allocation],
    alloc_ix: IdIndex<AllocationId>,
}

/// A touch's `addr` as written: an offset where what it names lies at or below it, else
/// the address itself.
enum TouchAddr {
    Offset(u64),
    At(Addr),
}

impl Serialize for TouchAddr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            TouchAddr::Offset(o) => s.serialize_u64(*o),
            TouchAddr::At(a) => a.serialize(s),
        }
    }
}

impl Bases<'_> {
    /// The base a touch's offset counts from, where the touch names a tensor, else an
    /// allocation, that the document has.
    fn of(&self, tensor: Option<TensorId>, allocation: Option<AllocationId>) -> Option<Addr> {
        match (tensor, allocation) {
            (Some(t), _) => self.tensor_ix.get(&t).map(|i| self.tensors[i].data_ptr()),
            (None, Some(a)) => self.alloc_ix.get(&a).map(|i| self.allocations[i].base),
            (None, None) => None,
        }
    }

    fn addr(&self, addr: Addr, tensor: Option<TensorId>, alloc: Option<AllocationId>) -> TouchAddr {
        match self.of(tensor, alloc) {
            Some(base) if base <= addr => TouchAddr::Offset(addr.0 - base.0),
            _ => TouchAddr::At(addr),
        }
    }
}

/// Launch configurations (grid, block), each once, in the order nodes first use them.
struct Launches {
    list: Vec<Launch>,
    position: FxHashMap<Launch, u32>,
}

type Launch = (Option<[u32; 3]>, Option<[u32; 3]>);

impl Launches {
    fn of(graphs: &[Graph]) -> Launches {
        let mut l = Launches {
            list: Vec::new(),
            position: FxHashMap::default(),
        };
        for n in graphs.iter().flat_map(|g| &g.nodes) {
            if n.grid.is_some() || n.block.is_some() {
                let next = l.list.len() as u32;
                l.position.entry((n.grid, n.block)).or_insert_with(|| {
                    l.list.push((n.grid, n.block));
                    next
                });
            }
        }
        l
    }

    /// A node's launch position, where it has a grid or block.
    fn position(&self, grid: Option<[u32; 3]>, block: Option<[u32; 3]>) -> Option<u32> {
        self.position.get(&(grid, block)).copied()
    }
}

struct Graphs<'a> {
    graphs: &'a [Graph],
    names: &'a Names<'a>,
    launches: &'a Launches,
    bases: &'a Bases<'a>,
}

impl Serialize for Graphs<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.graphs.iter().map(|g| GraphOut {
            g,
            names: self.names,
            launches: self.launches,
            bases: self.bases,
        }))
    }
}

struct GraphOut<'a> {
    g: &'a Graph,
    names: &'a Names<'a>,
    launches: &'a Launches,
    bases: &'a Bases<'a>,
}

impl Serialize for GraphOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let g = self.g;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("id", &g.id)?;
        m.serialize_entry("name", &g.name)?;
        if let Some(p) = g.pool {
            m.serialize_entry("pool", &p)?;
        }
        m.serialize_entry("node_counts", &g.node_counts)?;
        if !g.unread.is_empty() {
            m.serialize_entry("unread", &g.unread)?;
        }
        if !g.guards.is_empty() {
            m.serialize_entry("guards", &g.guards)?;
        }
        if !g.retargets.is_empty() {
            m.serialize_entry("retargets", &g.retargets)?;
        }
        m.serialize_entry("nodes", &NodesOut(self))?;
        m.end()
    }
}

struct NodesOut<'a>(&'a GraphOut<'a>);

impl Serialize for NodesOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (r, names) = (&self.0.g.nodes[..], self.0.names);
        let mut m = s.serialize_map(None)?;
        entry(&mut m, "index", r, |n| n.index)?;
        entry(&mut m, "kind", r, |n| n.kind)?;
        entry(&mut m, "name", r, |n| names.position[&*n.name])?;
        let launches = self.0.launches;
        optional(&mut m, "launch", r, |n| launches.position(n.grid, n.block))?;
        optional(&mut m, "parent", r, |n| n.parent)?;
        optional(&mut m, "opaque", r, |n| n.opaque.as_ref())?;
        if r.iter().any(|n| !n.touches.is_empty()) {
            let bases = self.0.bases;
            entry(&mut m, "touches", r, |n| {
                column(n.touches.iter().map(move |t| {
                    (
                        t.param,
                        t.offset,
                        bases.addr(t.addr, t.tensor, t.allocation),
                        t.tensor,
                        t.allocation,
                    )
                }))
            })?;
        }
        if r.iter().any(|n| !n.ignored.is_empty()) {
            entry(&mut m, "ignored", r, |n| {
                column(
                    n.ignored
                        .iter()
                        .map(|w| (w.param, w.offset, w.addr, w.reason)),
                )
            })?;
        }
        m.end()
    }
}

fn v2_manifest<S: Serializer>(m: &Manifest, s: S) -> Result<S::Ok, S::Error> {
    let names = Names::of(&m.graphs);
    let launches = Launches::of(&m.graphs);
    let bases = Bases {
        tensors: &m.tensors,
        tensor_ix: IdIndex::positions(m.tensors.iter().map(|t| t.id)),
        allocations: &m.allocations,
        alloc_ix: IdIndex::positions(m.allocations.iter().map(|a| a.id)),
    };
    let mut st = s.serialize_struct("Manifest", 10)?;
    st.serialize_field("format_version", &2u32)?;
    st.serialize_field("kind", &m.kind)?;
    st.serialize_field("producer", &m.producer)?;
    st.serialize_field("pools", &m.pools)?;
    st.serialize_field("allocations", &Allocations(&m.allocations))?;
    st.serialize_field("tensors", &Tensors(&m.tensors))?;
    st.serialize_field("owners", &Owners(&m.owners))?;
    st.serialize_field("names", &names.list)?;
    st.serialize_field("launches", &launches.list)?;
    st.serialize_field(
        "graphs",
        &Graphs {
            graphs: &m.graphs,
            names: &names,
            launches: &launches,
            bases: &bases,
        },
    )?;
    if !m.ranges.is_empty() {
        st.serialize_field("ranges", &m.ranges)?;
    }
    st.end()
}

fn v2_live<S: Serializer>(l: &Live, s: S) -> Result<S::Ok, S::Error> {
    let mut st = s.serialize_struct("Live", 9)?;
    st.serialize_field("format_version", &2u32)?;
    st.serialize_field("kind", &l.kind)?;
    st.serialize_field("producer", &l.producer)?;
    st.serialize_field("event", &l.event)?;
    st.serialize_field("pools", &l.pools)?;
    st.serialize_field("allocations", &Allocations(&l.allocations))?;
    st.serialize_field("tensors", &Tensors(&l.tensors))?;
    st.serialize_field("owners", &Owners(&l.owners))?;
    st.serialize_field("probes", &Probes(&l.probes))?;
    if !l.ranges.is_empty() {
        st.serialize_field("ranges", &l.ranges)?;
    }
    st.end()
}
