//! Format version 2: the compact layout of both documents, and reading it into the model of
//! [`crate::model::format`].
//!
//! What is big is stored compactly. `allocations`, `tensors` and `owners` (and a live
//! snapshot's `probes`) are column tables: objects of arrays, one value per record in each,
//! the key the field of format 1's record. Node names are stored once, in `names`, and
//! nodes refer to them by position. Each graph's `nodes` is a column table too, whose
//! `touches` column holds each node's touches as arrays `[param, offset, addr, tensor,
//! allocation]`; a touch's `addr` is an integer offset from the first element of the tensor
//! it names, or else from the base of the allocation it names, or a `"0x…"` string, the
//! address itself. Small records (producer, pools, event, unread nodes, allocation sites)
//! keep format 1's layout. A column of a field that format 1 may omit may be omitted:
//! every value is then absent. Launch configurations (grid, block) are stored once, in
//! `launches`. At the benchmark's default size (1,000,000 touches) this layout is about a
//! quarter of format 1's size.
//!
//! Errors name the column and element as the file spells them
//! (`graphs[3].nodes.touches[7][2][3]`), and say which node, touch and field that is.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer};

use crate::codec::columns::{column_table, rows};
use crate::index::refs::Invalid;
use crate::model::format::{
    Addr, AllocState, Allocation, AllocationId, Digest, DocKind, Event, Frame, Graph, GraphId,
    Guard, Live, Manifest, Node, NodeKind, Owner, Pool, PoolId, Probe, Producer, RangeDigest,
    Registration, Tensor, TensorId, Touch, Unread,
};
use crate::model::ids::IdIndex;
use crate::model::owner_path::OwnerPath;

/// A manifest in format 2.
// (Doc comments here are the schema's descriptions.) `T` holds each graph's `touches`
// column: parsed by serde (the default), or its text (`RawTouches`) for `fast_manifest`.
#[derive(Deserialize, JsonSchema)]
#[schemars(rename = "Manifest")]
#[serde(bound(deserialize = "T: Deserialize<'de>"))]
pub struct ManifestV2<T = Vec<TouchList>> {
    /// Always 2.
    #[schemars(extend("const" = 2))]
    pub format_version: u32,
    /// Always `manifest`.
    #[schemars(extend("const" = "manifest"))]
    pub kind: DocKind,
    pub producer: Producer,
    #[serde(default)]
    pub pools: Vec<Pool>,
    #[serde(default)]
    pub allocations: AllocationColumns,
    pub tensors: TensorColumns,
    pub owners: OwnerColumns,
    /// Node names (demangled kernel names, `memset`, `memcpy`), each once; `nodes.name`
    /// holds positions in this list.
    #[serde(default)]
    pub names: Vec<std::sync::Arc<str>>,
    /// Launch configurations, `[grid, block]` (each `[x, y, z]` or null), each once;
    /// `nodes.launch` holds positions in this list.
    #[serde(default)]
    pub launches: Vec<Launch>,
    pub graphs: Vec<GraphV2<T>>,
    /// As in format 1.
    #[serde(default)]
    pub ranges: Vec<RangeDigest>,
}

/// A live snapshot in format 2.
#[derive(Deserialize, JsonSchema)]
#[schemars(rename = "Live")]
pub struct LiveV2 {
    /// Always 2.
    #[schemars(extend("const" = 2))]
    pub format_version: u32,
    /// Always `live`.
    #[schemars(extend("const" = "live"))]
    pub kind: DocKind,
    pub producer: Producer,
    pub event: Event,
    #[serde(default)]
    pub pools: Vec<Pool>,
    #[serde(default)]
    pub allocations: AllocationColumns,
    pub tensors: TensorColumns,
    pub owners: OwnerColumns,
    /// One row per distinct address the manifest's graphs hold.
    pub probes: ProbeColumns,
    /// As in format 1.
    #[serde(default)]
    pub ranges: Vec<RangeDigest>,
}

column_table! {
    /// `allocations` as columns: one value per allocation in each.
    #[derive(Default, Deserialize, JsonSchema)]
    #[schemars(rename = "Allocations")]
    "allocations": AllocationColumns of Allocation, written by Allocations {
        req id: AllocationId,
        req base: Addr,
        req size: u64,
        #[serde(default)]
        opt pool: PoolId,
    }
}

column_table! {
    /// `tensors` as columns (the fields of format 1's tensor record).
    #[derive(Deserialize, JsonSchema)]
    #[schemars(rename = "Tensors")]
    "tensors": TensorColumns of Tensor, written by Tensors {
        req id: TensorId,
        req storage_base: Addr,
        req storage_nbytes: u64,
        req offset: u64,
        req nbytes: u64,
        req shape: Vec<u64>,
        req stride: Vec<i64>,
        req dtype: String,
        req itemsize: u32,
        req device: String,
        #[serde(default)]
        opt allocation: AllocationId,
        #[serde(default)]
        opt pool: PoolId,
        #[serde(default)]
        opt digest: Digest,
        /// Live snapshots only.
        #[serde(default)]
        opt reference_digest: Digest,
        #[serde(default)]
        list alloc_site: Frame,
        #[serde(default)]
        opt storage: u32,
    }
}

column_table! {
    /// `owners` as columns.
    #[derive(Deserialize, JsonSchema)]
    #[schemars(rename = "Owners")]
    "owners": OwnerColumns of Owner, written by Owners {
        #[schemars(with = "Vec<String>")]
        req path: OwnerPath,
        req tensor: TensorId,
        req registration: Registration,
        #[serde(default)]
        opt holder: String,
    }
}

column_table! {
    /// `probes` as columns.
    #[derive(Deserialize, JsonSchema)]
    #[schemars(rename = "Probes")]
    "probes": ProbeColumns of Probe, written by Probes {
        req addr: Addr,
        req state: AllocState,
        #[serde(default)]
        opt pool: PoolId,
        #[serde(default)]
        opt allocation: AllocationId,
    }
}

/// One captured graph: format 1's graph record with its nodes as a column table.
#[derive(Deserialize, JsonSchema)]
#[schemars(rename = "Graph")]
#[serde(bound(deserialize = "T: Deserialize<'de>"))]
pub struct GraphV2<T = Vec<TouchList>> {
    pub id: GraphId,
    pub name: String,
    #[serde(default)]
    pub pool: Option<PoolId>,
    pub node_counts: BTreeMap<String, u64>,
    #[serde(default)]
    pub unread: Vec<Unread>,
    /// As in format 1.
    #[serde(default)]
    pub guards: Vec<Guard>,
    /// As in format 1.
    #[serde(default)]
    pub retargets: Vec<crate::model::format::RetargetRecord>,
    pub nodes: NodeColumns<T>,
}

/// A launch configuration: grid and block, each `[x, y, z]` or null.
pub type Launch = (Option<[u32; 3]>, Option<[u32; 3]>);

/// A graph's nodes as columns.
#[derive(Deserialize, JsonSchema)]
#[schemars(rename = "Nodes")]
#[serde(bound(deserialize = "T: Deserialize<'de>"))]
pub struct NodeColumns<T = Vec<TouchList>> {
    pub index: Vec<u32>,
    pub kind: Vec<NodeKind>,
    /// Positions in the manifest's `names`.
    pub name: Vec<u32>,
    /// Positions in the manifest's `launches` (null: neither grid nor block).
    #[serde(default)]
    pub launch: Option<Vec<Option<u32>>>,
    #[serde(default)]
    pub parent: Option<Vec<Option<u32>>>,
    #[serde(default)]
    pub opaque: Option<Vec<Option<String>>>,
    /// Each node's touches (absent: none).
    // A `TouchList` per node, held as `T` says (`TouchColumn`).
    #[serde(default)]
    pub touches: Option<T>,
    /// Each node's ignored words (absent: none).
    #[serde(default)]
    pub ignored: Option<Vec<IgnoredList>>,
}

/// A touch's address: an offset from what the touch names, or the address itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TouchAddr {
    /// Bytes from the first element of the touch's tensor, or, where it names none, from
    /// the base of its allocation.
    Offset(u64),
    /// The address.
    At(Addr),
}

impl<'de> Deserialize<'de> for TouchAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = TouchAddr;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "an unsigned byte offset or a device address as a \"0x\"-prefixed \
                     hexadecimal string",
                )
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<TouchAddr, E> {
                Ok(TouchAddr::Offset(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<TouchAddr, E> {
                Addr::parse_strict(v)
                    .map(TouchAddr::At)
                    .ok_or_else(|| E::invalid_value(serde::de::Unexpected::Str(v), &self))
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for TouchAddr {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "TouchAddr".into()
    }
    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let addr = g.subschema_for::<Addr>();
        schemars::json_schema!({
            "description": "A byte offset from the first element of the touch's tensor (or, where it names none, from the base of its allocation), or the address itself.",
            "oneOf": [
                {"type": "integer", "format": "uint64", "minimum": 0},
                addr
            ]
        })
    }
}

/// The value of an optional column at `i` (absent column: `None`).
fn opt<T: Clone>(column: &Option<Vec<Option<T>>>, i: usize) -> Option<T> {
    column.as_ref().and_then(|c| c[i].clone())
}

/// The value of an optional column at `i`, moved out (absent column: `None`).
fn take<T>(column: &mut Option<Vec<Option<T>>>, i: usize) -> Option<T> {
    column.as_mut().and_then(|c| c[i].take())
}

/// What a touch's offset counts from: tensors' first elements and allocations' bases, by
/// id (the first record of an id: a repeated id is reported by the reference check).
struct Bases {
    /// First element of each tensor, by its position: a compact array, since a million
    /// touches look it up in no order (the tensors themselves are 20 times the size).
    tensor_ptr: Vec<Addr>,
    tensor_ix: IdIndex<TensorId>,
    alloc_base: Vec<Addr>,
    alloc_ix: IdIndex<AllocationId>,
}

impl Bases {
    fn new(tensors: &[Tensor], allocations: &[Allocation]) -> Bases {
        Bases {
            tensor_ix: IdIndex::positions(tensors.iter().map(|t| t.id)),
            tensor_ptr: tensors.iter().map(Tensor::data_ptr).collect(),
            alloc_ix: IdIndex::positions(allocations.iter().map(|a| a.id)),
            alloc_base: allocations.iter().map(|a| a.base).collect(),
        }
    }
}

fn graph<T: TouchColumn>(
    gi: usize,
    g: GraphV2<T>,
    (names, launches): (&[std::sync::Arc<str>], &[Launch]),
    bases: &Bases,
) -> Result<Graph, Invalid> {
    let table = format!("graphs[{gi}].nodes");
    let mut c = g.nodes;
    let mut touch_lists = c.touches.take().map(TouchColumn::lists).transpose()?;
    let n = rows(
        &table,
        &[
            ("index", Some(c.index.len())),
            ("kind", Some(c.kind.len())),
            ("name", Some(c.name.len())),
            ("launch", c.launch.as_ref().map(Vec::len)),
            ("parent", c.parent.as_ref().map(Vec::len)),
            ("opaque", c.opaque.as_ref().map(Vec::len)),
            ("touches", touch_lists.as_ref().map(Vec::len)),
            ("ignored", c.ignored.as_ref().map(Vec::len)),
        ],
    )?;
    let mut nodes = Vec::with_capacity(n);
    for i in 0..n {
        let Some(name) = names.get(c.name[i] as usize) else {
            return Err(Invalid::at(
                format!("{table}.name[{i}]"),
                format!(
                    "no name at position {}: `names` has {}",
                    c.name[i],
                    names.len()
                ),
            ));
        };
        let (grid, block) = match opt(&c.launch, i) {
            None => (None, None),
            Some(l) => *launches.get(l as usize).ok_or_else(|| {
                Invalid::at(
                    format!("{table}.launch[{i}]"),
                    format!(
                        "no launch at position {l}: `launches` has {}",
                        launches.len()
                    ),
                )
            })?,
        };
        let touches = match touch_lists.as_mut() {
            Some(t) => resolve(std::mem::take(&mut t[i]), bases, &table, i)?,
            None => Vec::new(),
        };
        nodes.push(Node {
            index: c.index[i],
            kind: c.kind[i],
            name: name.clone(),
            grid,
            block,
            parent: opt(&c.parent, i),
            opaque: take(&mut c.opaque, i),
            touches,
            ignored: c
                .ignored
                .as_mut()
                .map(|w| std::mem::take(&mut w[i].0))
                .unwrap_or_default(),
        });
    }
    Ok(Graph {
        id: g.id,
        name: g.name,
        pool: g.pool,
        node_counts: g.node_counts,
        unread: g.unread,
        guards: g.guards,
        retargets: g.retargets,
        nodes,
    })
}

/// Every graph in the model's terms, in order; on a machine of several cores, the graphs
/// of the second half of the nodes on a thread of their own (graphs are independent, and a
/// million touches take tens of milliseconds to resolve). The error is the first graph's.
fn graphs<T: TouchColumn + Send>(
    all: Vec<GraphV2<T>>,
    names: (&[std::sync::Arc<str>], &[Launch]),
    bases: &Bases,
) -> Result<Vec<Graph>, Invalid> {
    let nodes: usize = all.iter().map(|g| g.nodes.index.len()).sum();
    let run = |part: Vec<(usize, GraphV2<T>)>| -> Result<Vec<Graph>, Invalid> {
        part.into_iter()
            .map(|(gi, g)| graph(gi, g, names, bases))
            .collect()
    };
    let mut all: Vec<(usize, GraphV2<T>)> = all.into_iter().enumerate().collect();
    let parallel = std::thread::available_parallelism().is_ok_and(|n| n.get() > 1);
    if !parallel || nodes < 8192 {
        return run(all);
    }
    // Split where half the nodes lie before.
    let mut seen = 0;
    let split = all
        .iter()
        .position(|(_, g)| {
            seen += g.nodes.index.len();
            seen * 2 >= nodes
        })
        .map_or(all.len(), |i| i + 1);
    let second = all.split_off(split);
    std::thread::scope(|scope| {
        let job = scope.spawn(|| run(second));
        let mut first = run(all)?;
        match job.join() {
            Ok(rest) => first.extend(rest?),
            Err(panic) => std::panic::resume_unwind(panic),
        }
        Ok(first)
    })
}

/// Node `n`'s touches with every offset turned into the address it counts to.
fn resolve(list: TouchList, bases: &Bases, table: &str, n: usize) -> Result<Vec<Touch>, Invalid> {
    let TouchList {
        mut touches,
        absolute,
    } = list;
    let mut absolute = absolute.into_iter().peekable();
    for (k, t) in touches.iter_mut().enumerate() {
        if absolute.next_if_eq(&(k as u32)).is_some() {
            continue;
        }
        let at = |field: usize| format!("{table}.touches[{n}][{k}][{field}]");
        let whose = |field: usize| format!("node {n}'s touch {k}, its `{}`", TOUCH_FIELDS[field]);
        let off = t.addr.0;
        let (base, from) = if let Some(id) = t.tensor {
            let Some(x) = bases.tensor_ix.get(&id) else {
                return Err(Invalid::at(
                    at(3),
                    format!("no tensor has id {} ({})", id.0, whose(3)),
                ));
            };
            (bases.tensor_ptr[x], "the first element of tensor")
        } else if let Some(id) = t.allocation {
            let Some(x) = bases.alloc_ix.get(&id) else {
                return Err(Invalid::at(
                    at(4),
                    format!("no allocation has id {} ({})", id.0, whose(4)),
                ));
            };
            (bases.alloc_base[x], "the base of allocation")
        } else {
            return Err(Invalid::at(
                at(2),
                format!(
                    "the offset {off} counts from the touch's tensor or allocation, but it \
                     names neither ({}): write the address as a \"0x…\" string",
                    whose(2)
                ),
            ));
        };
        t.addr = base.checked_add(off).ok_or_else(|| {
            let id = t
                .tensor
                .map_or_else(|| t.allocation.map_or(0, |a| a.0), |x| x.0);
            Invalid::at(
                at(2),
                format!(
                    "the offset {off} from {from} {id} ({base}) passes the end of the address \
                     space ({})",
                    whose(2)
                ),
            )
        })?;
    }
    Ok(touches)
}

impl<T: TouchColumn + Send> ManifestV2<T> {
    /// The manifest in the model's terms. Errors name the column and element; references
    /// are checked afterwards, as for format 1 ([`crate::index::refs::check_manifest`]).
    pub fn into_model(self) -> Result<Manifest, Invalid> {
        let allocations = self.allocations.into_records()?;
        let tensors = self.tensors.into_records()?;
        let owners = self.owners.into_records()?;
        let graphs = {
            let bases = Bases::new(&tensors, &allocations);
            graphs(self.graphs, (&self.names, &self.launches), &bases)?
        };
        let mut m = Manifest::new(self.producer);
        m.format_version = self.format_version;
        m.kind = self.kind;
        m.pools = self.pools;
        m.allocations = allocations;
        m.tensors = tensors;
        m.owners = owners;
        m.graphs = graphs;
        m.ranges = self.ranges;
        Ok(m)
    }
}

impl LiveV2 {
    /// The live snapshot in the model's terms (see [`ManifestV2::into_model`]).
    pub fn into_model(self) -> Result<Live, Invalid> {
        let mut l = Live::new(self.producer, self.event);
        l.format_version = self.format_version;
        l.kind = self.kind;
        l.pools = self.pools;
        l.allocations = self.allocations.into_records()?;
        l.tensors = self.tensors.into_records()?;
        l.owners = self.owners.into_records()?;
        l.probes = self.probes.into_records()?;
        l.ranges = self.ranges;
        Ok(l)
    }
}

/// Where a reference check's error lies in a format 2 document: the model's path
/// (format 1's layout: `tensors[4].nbytes`, `graphs[0].nodes[7].touches[2].tensor`) as the
/// column and element that hold the value (`tensors.nbytes[4]`,
/// `graphs[0].nodes.touches[7][2][3]`, with the node, touch and field in the message).
pub fn locate(e: Invalid) -> Invalid {
    let Invalid { json_path, message } = e;
    let (table, rest) = json_path.split_at(json_path.find('[').unwrap_or(json_path.len()));
    let unchanged = |json_path: String, message: String| Invalid { json_path, message };
    let Some((i, rest)) = index_then(rest) else {
        return unchanged(json_path, message);
    };
    match table {
        "allocations" | "tensors" | "owners" | "probes" => {
            let (field, tail) = field_then(rest);
            Invalid {
                json_path: format!("{table}.{field}[{i}]{tail}"),
                message,
            }
        }
        "graphs" => {
            let Some((n, rest)) = rest.strip_prefix(".nodes").and_then(index_then) else {
                return unchanged(json_path, message);
            };
            let (field, tail) = field_then(rest);
            let row = index_then(tail).map(|(k, tail)| (k, field_then(tail)));
            let (what, fields): (_, &[&str]) = match field {
                "touches" => ("touch", &TOUCH_FIELDS),
                "ignored" => ("ignored word", &IGNORED_FIELDS),
                _ => ("", &[]),
            };
            match row {
                Some((k, (column, ""))) if !what.is_empty() => {
                    match fields.iter().position(|f| *f == column) {
                        Some(f) => Invalid {
                            json_path: format!("graphs[{i}].nodes.{field}[{n}][{k}][{f}]"),
                            message: format!("{message} (node {n}'s {what} {k}, its `{column}`)"),
                        },
                        None => unchanged(json_path, message),
                    }
                }
                _ => Invalid {
                    json_path: format!("graphs[{i}].nodes.{field}[{n}]{tail}"),
                    message,
                },
            }
        }
        _ => unchanged(json_path, message),
    }
}

/// `[12]rest` as (12, rest).
fn index_then(s: &str) -> Option<(usize, &str)> {
    let s = s.strip_prefix('[')?;
    let close = s.find(']')?;
    Some((s[..close].parse().ok()?, &s[close + 1..]))
}

/// `.field rest` as (field, rest); `("", s)` where `s` starts with no field.
fn field_then(s: &str) -> (&str, &str) {
    let Some(s) = s.strip_prefix('.') else {
        return ("", s);
    };
    let end = s.find(['.', '[']).unwrap_or(s.len());
    (&s[..end], &s[end..])
}

mod rows;
pub use rows::{IGNORED_FIELDS, IgnoredList, TOUCH_FIELDS, TouchList};
mod scan;
pub use scan::{RawTouches, TouchColumn, fast_manifest};

#[cfg(test)]
mod tests;
