//! Format version 2: the compact layout of both documents, and reading it into the model of
//! [`crate::document::format`].
//!
//! What is big in a manifest is stored as columns: `allocations`, `tensors` and `owners`
//! are objects of arrays (one value per record, the key the v1 field), node names are
//! stored once in `names` and referred to by position, and each graph holds its `nodes`,
//! their `touches` and `ignored` words as column tables, a node's touches being the next
//! `nodes.touches[i]` rows. A touch's `addr` is an integer offset from the first element of
//! the tensor it names, or else from the base of the allocation it names; a `"0x…"` string
//! is the address itself. A live snapshot stores `allocations`, `tensors`, `owners` and
//! `probes` as columns. Small records (producer, pools, event, unread nodes, allocation
//! sites) keep format 1's layout. A column of a field that format 1 may omit may be
//! omitted: every value is then absent. At the default benchmark size (1,000,000 touches)
//! this layout is less than half the size of format 1's and parses several times faster.
//!
//! Errors name the column and element, as the file spells it: `graphs[3].touches.tensor[17]`,
//! with the node and touch it belongs to where that helps.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer};

use crate::document::format::{
    Addr, AllocState, Allocation, AllocationId, Digest, DocKind, Event, Frame, Graph, GraphId,
    IgnoredReason, IgnoredWord, Live, Manifest, Node, NodeKind, Owner, Pool, PoolId, Probe,
    Producer, Registration, Tensor, TensorId, Touch, Unread,
};
use crate::document::ids::IdIndex;
use crate::document::owner_path::OwnerPath;
use crate::document::refs::Invalid;

/// A manifest in format 2.
#[derive(Deserialize, JsonSchema)]
#[schemars(rename = "Manifest")]
pub struct ManifestV2 {
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
    pub names: Vec<String>,
    pub graphs: Vec<GraphV2>,
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
}

/// `allocations` as columns: one value per allocation in each.
#[derive(Default, Deserialize, JsonSchema)]
#[schemars(rename = "Allocations")]
pub struct AllocationColumns {
    pub id: Vec<AllocationId>,
    pub base: Vec<Addr>,
    pub size: Vec<u64>,
    #[serde(default)]
    pub pool: Option<Vec<Option<PoolId>>>,
}

/// `tensors` as columns (the fields of format 1's tensor record).
#[derive(Deserialize, JsonSchema)]
#[schemars(rename = "Tensors")]
pub struct TensorColumns {
    pub id: Vec<TensorId>,
    pub storage_base: Vec<Addr>,
    pub storage_nbytes: Vec<u64>,
    pub offset: Vec<u64>,
    pub nbytes: Vec<u64>,
    pub shape: Vec<Vec<u64>>,
    pub stride: Vec<Vec<i64>>,
    pub dtype: Vec<String>,
    pub itemsize: Vec<u32>,
    pub device: Vec<String>,
    #[serde(default)]
    pub allocation: Option<Vec<Option<AllocationId>>>,
    #[serde(default)]
    pub pool: Option<Vec<Option<PoolId>>>,
    #[serde(default)]
    pub digest: Option<Vec<Option<Digest>>>,
    /// Live snapshots only.
    #[serde(default)]
    pub reference_digest: Option<Vec<Option<Digest>>>,
    #[serde(default)]
    pub alloc_site: Option<Vec<Vec<Frame>>>,
}

/// `owners` as columns.
#[derive(Deserialize, JsonSchema)]
#[schemars(rename = "Owners")]
pub struct OwnerColumns {
    #[schemars(with = "Vec<String>")]
    pub path: Vec<OwnerPath>,
    pub tensor: Vec<TensorId>,
    pub registration: Vec<Registration>,
    #[serde(default)]
    pub holder: Option<Vec<Option<String>>>,
}

/// `probes` as columns.
#[derive(Deserialize, JsonSchema)]
#[schemars(rename = "Probes")]
pub struct ProbeColumns {
    pub addr: Vec<Addr>,
    pub state: Vec<AllocState>,
    #[serde(default)]
    pub pool: Option<Vec<Option<PoolId>>>,
    #[serde(default)]
    pub allocation: Option<Vec<Option<AllocationId>>>,
}

/// One captured graph: format 1's graph record with its nodes, their touches and their
/// ignored words as column tables.
#[derive(Deserialize, JsonSchema)]
#[schemars(rename = "Graph")]
pub struct GraphV2 {
    pub id: GraphId,
    pub name: String,
    #[serde(default)]
    pub pool: Option<PoolId>,
    pub node_counts: BTreeMap<String, u64>,
    #[serde(default)]
    pub unread: Vec<Unread>,
    pub nodes: NodeColumns,
    /// Every node's touches, node after node.
    #[serde(default)]
    pub touches: Option<TouchColumns>,
    /// Every node's ignored words, node after node.
    #[serde(default)]
    pub ignored: Option<IgnoredColumns>,
}

/// A graph's nodes as columns.
#[derive(Deserialize, JsonSchema)]
#[schemars(rename = "Nodes")]
pub struct NodeColumns {
    pub index: Vec<u32>,
    pub kind: Vec<NodeKind>,
    /// Positions in the manifest's `names`.
    pub name: Vec<u32>,
    #[serde(default)]
    pub grid: Option<Vec<Option<[u32; 3]>>>,
    #[serde(default)]
    pub block: Option<Vec<Option<[u32; 3]>>>,
    #[serde(default)]
    pub parent: Option<Vec<Option<u32>>>,
    #[serde(default)]
    pub opaque: Option<Vec<Option<String>>>,
    /// How many rows of the graph's `touches` each node has (absent: none).
    #[serde(default)]
    pub touches: Option<Vec<u32>>,
    /// How many rows of the graph's `ignored` each node has (absent: none).
    #[serde(default)]
    pub ignored: Option<Vec<u32>>,
}

/// A graph's touches as columns.
#[derive(Deserialize, JsonSchema)]
#[schemars(rename = "Touches")]
pub struct TouchColumns {
    pub param: Vec<u32>,
    pub offset: Vec<u32>,
    /// Offsets from the named tensor's first element (or the named allocation's base), or
    /// addresses.
    pub addr: Vec<TouchAddr>,
    #[serde(default)]
    pub tensor: Option<Vec<Option<TensorId>>>,
    #[serde(default)]
    pub allocation: Option<Vec<Option<AllocationId>>>,
}

/// A graph's ignored words as columns.
#[derive(Deserialize, JsonSchema)]
#[schemars(rename = "IgnoredWords")]
pub struct IgnoredColumns {
    pub param: Vec<u32>,
    pub offset: Vec<u32>,
    pub addr: Vec<Addr>,
    pub reason: Vec<IgnoredReason>,
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

/// The rows of a column table: the length of its first column, which every other column
/// present must have.
fn rows(table: &str, columns: &[(&str, Option<usize>)]) -> Result<usize, Invalid> {
    let Some(&(first, Some(n))) = columns.first() else {
        return Ok(0);
    };
    for &(name, len) in &columns[1..] {
        if let Some(len) = len
            && len != n
        {
            return Err(Invalid::at(
                format!("{table}.{name}"),
                format!(
                    "{len} values, but `{table}.{first}` has {n}: every column of a table \
                     holds one value per row"
                ),
            ));
        }
    }
    Ok(n)
}

/// The value of an optional column at `i` (absent column: `None`).
fn opt<T: Clone>(column: &Option<Vec<Option<T>>>, i: usize) -> Option<T> {
    column.as_ref().and_then(|c| c[i].clone())
}

/// The value of an optional column at `i`, moved out (absent column: `None`).
fn take<T>(column: &mut Option<Vec<Option<T>>>, i: usize) -> Option<T> {
    column.as_mut().and_then(|c| c[i].take())
}

fn allocations(c: AllocationColumns) -> Result<Vec<Allocation>, Invalid> {
    let n = rows(
        "allocations",
        &[
            ("id", Some(c.id.len())),
            ("base", Some(c.base.len())),
            ("size", Some(c.size.len())),
            ("pool", c.pool.as_ref().map(Vec::len)),
        ],
    )?;
    Ok((0..n)
        .map(|i| Allocation {
            id: c.id[i],
            base: c.base[i],
            size: c.size[i],
            pool: opt(&c.pool, i),
        })
        .collect())
}

fn tensors(mut c: TensorColumns) -> Result<Vec<Tensor>, Invalid> {
    let n = rows(
        "tensors",
        &[
            ("id", Some(c.id.len())),
            ("storage_base", Some(c.storage_base.len())),
            ("storage_nbytes", Some(c.storage_nbytes.len())),
            ("offset", Some(c.offset.len())),
            ("nbytes", Some(c.nbytes.len())),
            ("shape", Some(c.shape.len())),
            ("stride", Some(c.stride.len())),
            ("dtype", Some(c.dtype.len())),
            ("itemsize", Some(c.itemsize.len())),
            ("device", Some(c.device.len())),
            ("allocation", c.allocation.as_ref().map(Vec::len)),
            ("pool", c.pool.as_ref().map(Vec::len)),
            ("digest", c.digest.as_ref().map(Vec::len)),
            ("reference_digest", c.reference_digest.as_ref().map(Vec::len)),
            ("alloc_site", c.alloc_site.as_ref().map(Vec::len)),
        ],
    )?;
    Ok((0..n)
        .map(|i| Tensor {
            id: c.id[i],
            storage_base: c.storage_base[i],
            storage_nbytes: c.storage_nbytes[i],
            offset: c.offset[i],
            nbytes: c.nbytes[i],
            shape: std::mem::take(&mut c.shape[i]),
            stride: std::mem::take(&mut c.stride[i]),
            dtype: std::mem::take(&mut c.dtype[i]),
            itemsize: c.itemsize[i],
            device: std::mem::take(&mut c.device[i]),
            allocation: opt(&c.allocation, i),
            pool: opt(&c.pool, i),
            digest: take(&mut c.digest, i),
            reference_digest: take(&mut c.reference_digest, i),
            alloc_site: c
                .alloc_site
                .as_mut()
                .map(|s| std::mem::take(&mut s[i]))
                .unwrap_or_default(),
        })
        .collect())
}

fn owners(c: OwnerColumns) -> Result<Vec<Owner>, Invalid> {
    rows(
        "owners",
        &[
            ("path", Some(c.path.len())),
            ("tensor", Some(c.tensor.len())),
            ("registration", Some(c.registration.len())),
            ("holder", c.holder.as_ref().map(Vec::len)),
        ],
    )?;
    let OwnerColumns {
        path,
        tensor,
        registration,
        mut holder,
    } = c;
    Ok(path
        .into_iter()
        .enumerate()
        .map(|(i, path)| Owner {
            path,
            tensor: tensor[i],
            registration: registration[i],
            holder: take(&mut holder, i),
        })
        .collect())
}

fn probes(c: ProbeColumns) -> Result<Vec<Probe>, Invalid> {
    let n = rows(
        "probes",
        &[
            ("addr", Some(c.addr.len())),
            ("state", Some(c.state.len())),
            ("pool", c.pool.as_ref().map(Vec::len)),
            ("allocation", c.allocation.as_ref().map(Vec::len)),
        ],
    )?;
    Ok((0..n)
        .map(|i| Probe {
            addr: c.addr[i],
            state: c.state[i],
            pool: opt(&c.pool, i),
            allocation: opt(&c.allocation, i),
        })
        .collect())
}

/// What a touch's offset counts from: tensors' first elements and allocations' bases, by
/// id (the first record of an id: a repeated id is reported by the reference check).
struct Bases<'a> {
    tensors: &'a [Tensor],
    tensor_ix: IdIndex<TensorId>,
    allocations: &'a [Allocation],
    alloc_ix: IdIndex<AllocationId>,
}

impl<'a> Bases<'a> {
    fn new(tensors: &'a [Tensor], allocations: &'a [Allocation]) -> Bases<'a> {
        Bases {
            tensor_ix: IdIndex::positions(tensors.iter().map(|t| t.id)),
            alloc_ix: IdIndex::positions(allocations.iter().map(|a| a.id)),
            tensors,
            allocations,
        }
    }
}

/// Node `n`'s row `j` of a graph's touches or ignored words, in words for an error.
fn row_of(counts: &[u32], row: usize, what: &str) -> String {
    let mut start = 0usize;
    for (n, &c) in counts.iter().enumerate() {
        let end = start + c as usize;
        if row < end {
            return format!("node {n}'s {what} {}", row - start);
        }
        start = end;
    }
    format!("{what} row {row}")
}

fn graph(
    gi: usize,
    g: GraphV2,
    names: &[String],
    bases: &Bases<'_>,
) -> Result<Graph, Invalid> {
    let at = |rest: &str| format!("graphs[{gi}].{rest}");
    let mut c = g.nodes;
    let n = rows(
        &at("nodes"),
        &[
            ("index", Some(c.index.len())),
            ("kind", Some(c.kind.len())),
            ("name", Some(c.name.len())),
            ("grid", c.grid.as_ref().map(Vec::len)),
            ("block", c.block.as_ref().map(Vec::len)),
            ("parent", c.parent.as_ref().map(Vec::len)),
            ("opaque", c.opaque.as_ref().map(Vec::len)),
            ("touches", c.touches.as_ref().map(Vec::len)),
            ("ignored", c.ignored.as_ref().map(Vec::len)),
        ],
    )?;
    let touches = touch_rows(gi, g.touches, c.touches.as_deref(), bases)?;
    let ignored = ignored_rows(gi, g.ignored, c.ignored.as_deref())?;
    let mut touches = touches.into_iter();
    let mut ignored = ignored.into_iter();
    let mut nodes = Vec::with_capacity(n);
    for i in 0..n {
        let Some(name) = names.get(c.name[i] as usize) else {
            return Err(Invalid::at(
                at(&format!("nodes.name[{i}]")),
                format!(
                    "no name at position {}: `names` has {}",
                    c.name[i],
                    names.len()
                ),
            ));
        };
        let count = |counts: &Option<Vec<u32>>| counts.as_ref().map_or(0, |c| c[i] as usize);
        nodes.push(Node {
            index: c.index[i],
            kind: c.kind[i],
            name: name.clone(),
            grid: opt(&c.grid, i),
            block: opt(&c.block, i),
            parent: opt(&c.parent, i),
            opaque: take(&mut c.opaque, i),
            touches: touches.by_ref().take(count(&c.touches)).collect(),
            ignored: ignored.by_ref().take(count(&c.ignored)).collect(),
        });
    }
    Ok(Graph {
        id: g.id,
        name: g.name,
        pool: g.pool,
        node_counts: g.node_counts,
        unread: g.unread,
        nodes,
    })
}

/// The rows of `counts` must add up to the rows of the table they count.
fn counted(gi: usize, what: &str, counts: Option<&[u32]>, n: usize) -> Result<(), Invalid> {
    let total: u64 = counts.unwrap_or_default().iter().map(|&c| u64::from(c)).sum();
    if total == n as u64 {
        return Ok(());
    }
    let path = format!("graphs[{gi}].nodes.{what}");
    Err(Invalid::at(
        path,
        format!("the nodes' counts add up to {total} rows, but `graphs[{gi}].{what}` has {n}"),
    ))
}

fn touch_rows(
    gi: usize,
    c: Option<TouchColumns>,
    counts: Option<&[u32]>,
    bases: &Bases<'_>,
) -> Result<Vec<Touch>, Invalid> {
    let Some(c) = c else {
        counted(gi, "touches", counts, 0)?;
        return Ok(Vec::new());
    };
    let table = format!("graphs[{gi}].touches");
    let n = rows(
        &table,
        &[
            ("param", Some(c.param.len())),
            ("offset", Some(c.offset.len())),
            ("addr", Some(c.addr.len())),
            ("tensor", c.tensor.as_ref().map(Vec::len)),
            ("allocation", c.allocation.as_ref().map(Vec::len)),
        ],
    )?;
    counted(gi, "touches", counts, n)?;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let tensor = opt(&c.tensor, i);
        let allocation = opt(&c.allocation, i);
        let addr = match c.addr[i] {
            TouchAddr::At(a) => a,
            TouchAddr::Offset(off) => {
                let whose = || row_of(counts.unwrap_or_default(), i, "touch");
                let (base, from) = if let Some(id) = tensor {
                    let Some(x) = bases.tensor_ix.get(&id) else {
                        return Err(Invalid::at(
                            format!("{table}.tensor[{i}]"),
                            format!("no tensor has id {} ({})", id.0, whose()),
                        ));
                    };
                    (bases.tensors[x].data_ptr(), format!("tensor {}'s first element", id.0))
                } else if let Some(id) = allocation {
                    let Some(x) = bases.alloc_ix.get(&id) else {
                        return Err(Invalid::at(
                            format!("{table}.allocation[{i}]"),
                            format!("no allocation has id {} ({})", id.0, whose()),
                        ));
                    };
                    (bases.allocations[x].base, format!("allocation {}'s base", id.0))
                } else {
                    return Err(Invalid::at(
                        format!("{table}.addr[{i}]"),
                        format!(
                            "the offset {off} counts from the touch's tensor or allocation, \
                             but it names neither ({}): write the address as a \"0x…\" string",
                            whose()
                        ),
                    ));
                };
                base.checked_add(off).ok_or_else(|| {
                    Invalid::at(
                        format!("{table}.addr[{i}]"),
                        format!(
                            "the offset {off} from {from} ({base}) passes the end of the \
                             address space ({})",
                            whose()
                        ),
                    )
                })?
            }
        };
        out.push(Touch {
            param: c.param[i],
            offset: c.offset[i],
            addr,
            tensor,
            allocation,
        });
    }
    Ok(out)
}

fn ignored_rows(
    gi: usize,
    c: Option<IgnoredColumns>,
    counts: Option<&[u32]>,
) -> Result<Vec<IgnoredWord>, Invalid> {
    let Some(c) = c else {
        counted(gi, "ignored", counts, 0)?;
        return Ok(Vec::new());
    };
    let n = rows(
        &format!("graphs[{gi}].ignored"),
        &[
            ("param", Some(c.param.len())),
            ("offset", Some(c.offset.len())),
            ("addr", Some(c.addr.len())),
            ("reason", Some(c.reason.len())),
        ],
    )?;
    counted(gi, "ignored", counts, n)?;
    Ok((0..n)
        .map(|i| IgnoredWord {
            param: c.param[i],
            offset: c.offset[i],
            addr: c.addr[i],
            reason: c.reason[i],
        })
        .collect())
}

impl ManifestV2 {
    /// The manifest in the model's terms. Errors name the column and element; references
    /// are checked afterwards, as for format 1 ([`crate::document::refs::check_manifest`]).
    pub fn into_model(self) -> Result<Manifest, Invalid> {
        let allocations = allocations(self.allocations)?;
        let tensors = tensors(self.tensors)?;
        let owners = owners(self.owners)?;
        let graphs = {
            let bases = Bases::new(&tensors, &allocations);
            self.graphs
                .into_iter()
                .enumerate()
                .map(|(gi, g)| graph(gi, g, &self.names, &bases))
                .collect::<Result<Vec<_>, _>>()?
        };
        let mut m = Manifest::new(self.producer);
        m.format_version = self.format_version;
        m.kind = self.kind;
        m.pools = self.pools;
        m.allocations = allocations;
        m.tensors = tensors;
        m.owners = owners;
        m.graphs = graphs;
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
        l.allocations = allocations(self.allocations)?;
        l.tensors = tensors(self.tensors)?;
        l.owners = owners(self.owners)?;
        l.probes = probes(self.probes)?;
        Ok(l)
    }
}

/// Where a reference check's error lies in a format 2 document: the model's path
/// (format 1's layout, `tensors[4].nbytes`, `graphs[0].nodes[7].touches[2].tensor`) as the
/// column and element that hold the value (`tensors.nbytes[4]`,
/// `graphs[0].touches.tensor[k]`, the node and touch added to the message).
pub fn locate(e: Invalid, graphs: &[Graph]) -> Invalid {
    let Invalid { json_path, message } = e;
    let (table, rest) = json_path.split_at(json_path.find('[').unwrap_or(json_path.len()));
    let Some((i, rest)) = index_then(rest) else {
        return Invalid { json_path, message };
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
            let Some(rest) = rest.strip_prefix(".nodes") else {
                return Invalid { json_path, message };
            };
            let Some((n, rest)) = index_then(rest) else {
                return Invalid { json_path, message };
            };
            let (field, tail) = field_then(rest);
            let nodes = graphs.get(i).map_or(&[][..], |g| &g.nodes[..]);
            let rows_before = |what: &str| -> usize {
                nodes
                    .iter()
                    .take(n)
                    .map(|node| match what {
                        "touches" => node.touches.len(),
                        _ => node.ignored.len(),
                    })
                    .sum()
            };
            match (field, index_then(tail)) {
                ("touches" | "ignored", Some((t, tail))) => {
                    let (column, tail) = field_then(tail);
                    let what = if field == "touches" { "touch" } else { "ignored word" };
                    Invalid {
                        json_path: format!(
                            "graphs[{i}].{field}.{column}[{}]{tail}",
                            rows_before(field) + t
                        ),
                        message: format!("{message} (node {n}'s {what} {t})"),
                    }
                }
                _ => Invalid {
                    json_path: format!("graphs[{i}].nodes.{field}[{n}]{tail}"),
                    message,
                },
            }
        }
        _ => Invalid { json_path, message },
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

#[cfg(test)]
mod tests;
