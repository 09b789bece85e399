//! What a walker read from a captured graph: per node, the raw words of its parameters
//! that held device addresses. The CUDA walker (`cuda` feature) produces it; the Python
//! front hands it over as JSON; [`super::manifest::ManifestBuilder`] resolves it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::signature::{NodeSignature, ParamLayout, WordRole, param_layouts};
use crate::model::format::{Addr, NodeKind, Unread};

/// One parameter word that held a device address, as a walker found it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWord {
    pub param: u32,
    pub offset: u32,
    pub addr: Addr,
    /// The driver allocation holding `addr` (`cuMemGetAddressRange`): base and size.
    pub allocation: Option<(Addr, u64)>,
}

/// One node as a walker read it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WalkedNode {
    pub index: u32,
    pub kind: NodeKind,
    /// Shared by every node that launches the same kernel (read once per function).
    pub name: Arc<str>,
    pub grid: Option<[u32; 3]>,
    pub block: Option<[u32; 3]>,
    pub parent: Option<u32>,
    pub opaque: Option<String>,
    pub words: Vec<RawWord>,
}

/// One graph as a walker read it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
                .entry(&*n.name)
                .or_insert_with(|| param_layouts(&n.name));
            let sig = NodeSignature::new(layouts, &slots(&n.words));
            out.extend(
                n.words
                    .iter()
                    .filter(|w| {
                        !known(w.addr.0)
                            && !matches!(sig.role(w.param, w.offset), WordRole::SetAside(_))
                    })
                    .map(|w| w.addr),
            );
        }
        out.sort_unstable();
        out.dedup();
        out
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

/// A node's words as `(parameter index, byte offset)`, what the signature rules read.
pub(crate) fn slots(words: &[RawWord]) -> Vec<(u32, u32)> {
    words.iter().map(|w| (w.param, w.offset)).collect()
}
