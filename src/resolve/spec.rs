//! The build spec: what a framework hands over to have a manifest built (pools, allocator
//! segments, tensor views, owner paths, and graphs as walkers read them), as JSON, and the
//! build from it. The Python recorder's `build_manifest` is this.

use std::sync::Arc;

use serde::Deserialize;

use super::facts::{BlockState, OwnerSpec, PoolBinding, PoolRange, Segment};
use super::manifest::{BuildError, ManifestBuilder, TensorSpec};
use super::walked::WalkedGraph;
use crate::model::format::{
    Addr, Guard, Manifest, PoolId, PoolKind, Producer, SleepPolicy, TensorId,
};

/// See the module documentation. Ids of pools are their positions in `pools`; owners name
/// tensors by their position in `tensors`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildSpec {
    producer: Producer,
    #[serde(default)]
    pools: Vec<PoolSpec>,
    /// Ranges that belong to a pool, beyond the bound allocator pools' segments.
    #[serde(default)]
    pool_ranges: Vec<PoolRange>,
    #[serde(default)]
    allocations: Vec<AllocationSpec>,
    /// Free ranges beyond the segments' free blocks.
    #[serde(default)]
    free_ranges: Vec<AllocationSpec>,
    /// The caching allocator's segments when the spec was made: a bound pool's segments
    /// belong to it, and free blocks are free memory (`IgnoredReason::FreeMemory`).
    #[serde(default)]
    segments: Vec<Segment>,
    /// Which declared pool each allocator pool is.
    #[serde(default)]
    pool_bindings: Vec<PoolBinding>,
    #[serde(default)]
    tensors: Vec<TensorSpec>,
    #[serde(default)]
    owners: Vec<OwnerSpec>,
    #[serde(default)]
    graphs: Vec<GraphSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolSpec {
    name: String,
    kind: PoolKind,
    sleep: SleepPolicy,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AllocationSpec {
    base: Addr,
    size: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GraphSpec {
    name: String,
    #[serde(default)]
    pool: Option<PoolId>,
    /// The walked graph as JSON, or (`walked_index`) the position of a walked graph in the
    /// list handed to [`build`]: exactly one of them.
    #[serde(default)]
    walked: Option<WalkedGraph>,
    #[serde(default)]
    walked_index: Option<usize>,
    /// The static inputs torch's CUDA-graph trees guard for the graph (`Graph::guards`).
    #[serde(default)]
    guards: Vec<Guard>,
    /// The retargets applied to the graph (`Graph::retargets`).
    #[serde(default)]
    retargets: Vec<crate::model::format::RetargetRecord>,
}

/// Why a build spec gave no manifest. `at` is where in the spec (`owners[3]`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    #[error("{name}: invalid spec at `{json_path}`: {message}")]
    Json {
        name: String,
        json_path: String,
        message: String,
    },
    #[error("{name}: {at}")]
    Build {
        name: String,
        at: String,
        #[source]
        source: BuildError,
    },
    #[error("{name}: {at}: {message}")]
    Reference {
        name: String,
        at: String,
        message: String,
    },
}

impl BuildSpec {
    /// Parses a spec; `name` names it in errors.
    pub fn parse(bytes: &[u8], name: &str) -> Result<BuildSpec, SpecError> {
        let json = |json_path: String, message: String| SpecError::Json {
            name: name.to_string(),
            json_path,
            message,
        };
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let spec: BuildSpec = serde_path_to_error::deserialize(&mut de)
            .map_err(|e| json(e.path().to_string(), e.inner().to_string()))?;
        de.end().map_err(|e| json(".".into(), e.to_string()))?;
        Ok(spec)
    }
}

impl BuildSpec {
    /// The allocator blocks handed out when the spec was made (active or pending free),
    /// `(address, size)`, sorted: where the memory a kernel reads without an owner is
    /// digested, since a block is one allocation the caller made, a segment many.
    pub fn active_blocks(&self) -> Vec<(Addr, u64)> {
        let mut blocks: Vec<(Addr, u64)> = self
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| {
                matches!(
                    b.state,
                    BlockState::ActiveAllocated | BlockState::ActivePendingFree
                ) && b.size > 0
            })
            .map(|b| (b.addr, b.size))
            .collect();
        blocks.sort_unstable();
        blocks
    }
}

/// The blocks (sorted, as [`BuildSpec::active_blocks`] gives them) that hold one of
/// `addrs`, each once, in order.
pub fn blocks_holding(blocks: &[(Addr, u64)], addrs: &[Addr]) -> Vec<(Addr, u64)> {
    let mut out: Vec<(Addr, u64)> = addrs
        .iter()
        .filter_map(|&a| {
            let i = blocks.partition_point(|b| b.0 <= a).checked_sub(1)?;
            let (base, size) = blocks[i];
            (a.0 - base.0 < size).then_some((base, size))
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Builds and checks the manifest of `spec`; `walked` holds the graphs that `walked_index`
/// entries refer to. `name` names the spec in errors.
pub fn build(
    spec: BuildSpec,
    walked: &[Arc<WalkedGraph>],
    name: &str,
) -> Result<Manifest, SpecError> {
    let at = |at: String| {
        let name = name.to_string();
        move |source| SpecError::Build { name, at, source }
    };
    let reference = |at: String, message: String| SpecError::Reference {
        name: name.to_string(),
        at,
        message,
    };
    let mut b = ManifestBuilder::new(spec.producer);
    for p in &spec.pools {
        b.add_pool(&p.name, p.kind, p.sleep);
    }
    for (i, r) in spec.pool_ranges.iter().enumerate() {
        b.add_pool_range(r.base, r.size, r.pool)
            .map_err(at(format!("pool_ranges[{i}]")))?;
    }
    for (i, s) in spec.segments.iter().enumerate() {
        if let Some(binding) = spec.pool_bindings.iter().find(|p| p.key == s.pool) {
            b.add_pool_range(s.base, s.size, binding.pool)
                .map_err(at(format!("pool_bindings (segment {i})")))?;
        }
        // Free blocks: a word in a by-value struct pointing here is stale bytes; graph
        // pools are left out by the builder.
        for blk in s
            .blocks
            .iter()
            .filter(|blk| blk.state == BlockState::Inactive)
        {
            b.add_free_range(blk.addr, blk.size);
        }
    }
    for a in &spec.allocations {
        b.add_allocation(a.base, a.size);
    }
    for r in &spec.free_ranges {
        b.add_free_range(r.base, r.size);
    }
    // Equal views collapse into one tensor; owners refer to spec positions.
    let mut ids: Vec<TensorId> = Vec::with_capacity(spec.tensors.len());
    for (i, t) in spec.tensors.into_iter().enumerate() {
        ids.push(b.add_tensor(t).map_err(at(format!("tensors[{i}]")))?);
    }
    for (i, o) in spec.owners.into_iter().enumerate() {
        let tensor = *ids.get(o.tensor).ok_or_else(|| {
            reference(
                format!("owners[{i}].tensor"),
                format!("no tensor at position {} ({} given)", o.tensor, ids.len()),
            )
        })?;
        b.add_owner(&o.path, tensor, o.registration, o.holder)
            .map_err(at(format!("owners[{i}]")))?;
    }
    for (i, g) in spec.graphs.into_iter().enumerate() {
        let graph = match (g.walked, g.walked_index) {
            (Some(w), None) => Arc::new(w),
            (None, Some(k)) => walked
                .get(k)
                .ok_or_else(|| {
                    reference(
                        format!("graphs[{i}].walked_index"),
                        format!("no walked graph at position {k} ({} given)", walked.len()),
                    )
                })?
                .clone(),
            _ => {
                return Err(reference(
                    format!("graphs[{i}]"),
                    "give exactly one of `walked` and `walked_index`".into(),
                ));
            }
        };
        let id = b.add_graph(&g.name, g.pool, graph);
        if !g.guards.is_empty() {
            b.guard_graph(id, g.guards);
        }
        if !g.retargets.is_empty() {
            b.note_retargets(id, g.retargets);
        }
    }
    b.finish().map_err(at("failed to build".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bound allocator pool's segments are the pool's ranges; its free blocks are free
    /// memory, others' active blocks are not.
    #[test]
    fn segments_of_a_bound_pool_belong_to_it() {
        let spec = r#"{
            "producer": {"tool": "t", "tool_version": "0", "rank": 0, "world_size": 1},
            "pools": [{"name": "graph(0, 1)", "kind": "graph", "sleep": "untouched"}],
            "segments": [
                {"base": "0x200000", "size": 33554432, "pool": [0, 1],
                 "blocks": [{"addr": "0x200000", "size": 4096, "state": "active_allocated"},
                            {"addr": "0x201000", "size": 4096, "state": "inactive"}]},
                {"base": "0x4000000", "size": 2097152, "pool": [0, 0], "blocks": []}
            ],
            "pool_bindings": [{"key": [0, 1], "pool": 0}],
            "graphs": [{"name": "g", "walked": {"node_counts": {"kernel": 1}, "unread": [],
                "nodes": [{"index": 0, "kind": "kernel", "name": "k", "grid": null,
                    "block": null, "parent": null, "opaque": null, "words": [
                    {"param": 0, "offset": 0, "addr": "0x210020", "allocation": ["0x200000", 33554432]},
                    {"param": 1, "offset": 0, "addr": "0x4000000", "allocation": ["0x4000000", 2097152]}
                ]}]}}]
        }"#;
        let spec = BuildSpec::parse(spec.as_bytes(), "<test>").unwrap();
        let m = build(spec, &[], "<test>").unwrap();
        let pools: Vec<Option<PoolId>> = m.allocations.iter().map(|a| a.pool).collect();
        assert_eq!(pools, vec![Some(PoolId(0)), None]);
    }

    /// A pool range (an allocator's own table: vLLM's) wins over the bound segment it
    /// overlaps, larger or not, as the live snapshot decides.
    #[test]
    fn a_pool_range_wins_over_the_bound_segment_it_overlaps() {
        for size in ["2097152", "2101248"] {
            let spec = r#"{
                "producer": {"tool": "t", "tool_version": "0", "rank": 0, "world_size": 1},
                "pools": [{"name": "model", "kind": "other", "sleep": "untouched"},
                          {"name": "kv_cache", "kind": "kv_cache", "sleep": "discarded"}],
                "pool_ranges": [{"base": "0x200000", "size": SIZE, "pool": 1}],
                "segments": [{"base": "0x200000", "size": 2097152, "pool": [0, 1], "blocks": []}],
                "pool_bindings": [{"key": [0, 1], "pool": 0}],
                "graphs": [{"name": "g", "walked": {"node_counts": {"kernel": 1}, "unread": [],
                    "nodes": [{"index": 0, "kind": "kernel", "name": "k", "grid": null,
                        "block": null, "parent": null, "opaque": null, "words": [
                        {"param": 0, "offset": 0, "addr": "0x210020", "allocation": ["0x200000", 2097152]}
                    ]}]}}]
            }"#
            .replace("SIZE", size);
            let spec = BuildSpec::parse(spec.as_bytes(), "<test>").unwrap();
            let m = build(spec, &[], "<test>").unwrap();
            let pools: Vec<Option<PoolId>> = m.allocations.iter().map(|a| a.pool).collect();
            assert_eq!(pools, vec![Some(PoolId(1))], "range of {size} bytes");
        }
    }

    /// The blocks digested for addresses no owner explains: handed-out blocks only, each
    /// once, and none for an address in a free block or outside every block.
    #[test]
    fn the_blocks_holding_addresses_are_the_handed_out_ones() {
        let spec = r#"{
            "producer": {"tool": "t", "tool_version": "0", "rank": 0, "world_size": 1},
            "segments": [
                {"base": "0x200000", "size": 2097152,
                 "blocks": [{"addr": "0x201000", "size": 4096, "state": "active_allocated"},
                            {"addr": "0x200000", "size": 4096, "state": "inactive"},
                            {"addr": "0x202000", "size": 512, "state": "active_pending_free"}]}
            ]
        }"#;
        let spec = BuildSpec::parse(spec.as_bytes(), "<test>").unwrap();
        let blocks = spec.active_blocks();
        assert_eq!(blocks, vec![(Addr(0x201000), 4096), (Addr(0x202000), 512)]);
        let addrs = [0x200010, 0x201000, 0x201ff8, 0x202100, 0x202200, 0x300000].map(Addr);
        assert_eq!(
            blocks_holding(&blocks, &addrs),
            vec![(Addr(0x201000), 4096), (Addr(0x202000), 512)]
        );
        assert_eq!(blocks_holding(&blocks, &[Addr(0x100)]), vec![]);
    }
}
