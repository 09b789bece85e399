//! Building a live snapshot from what a framework sees after sleep/wake or a reload: the
//! tensor views and owner paths of the live model, the allocator's segments, and the
//! manifest whose captured addresses are probed. The counterpart of
//! [`super::manifest::ManifestBuilder`]; the result is checked like a loaded document.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;

use super::facts::{OwnerSpec, PoolBinding, PoolRange, Segment, SegmentMap};
use super::manifest::{BuildError, TensorSpec};
use crate::index::refs::check_live;
use crate::model::format::{
    Addr, AllocState, Allocation, AllocationId, Digest, Event, Live, Manifest, Owner, Probe,
    Producer, TensorId,
};
use crate::model::owner_path::OwnerPath;

/// Everything [`build_live`] takes besides the manifest.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveSpec {
    pub producer: Producer,
    pub event: Event,
    /// The live model's tensor views, in registry order (ids are positions).
    #[serde(default)]
    pub tensors: Vec<TensorSpec>,
    #[serde(default)]
    pub owners: Vec<OwnerSpec>,
    /// The caching allocator's segments now.
    #[serde(default)]
    pub segments: Vec<Segment>,
    /// Which of the manifest's pools each allocator pool is.
    #[serde(default)]
    pub pool_bindings: Vec<PoolBinding>,
    /// Ranges of the manifest's pools, whatever allocator pool their segments are in (an
    /// allocator's own table of allocations: vLLM's `CuMemAllocator`); a range wins over
    /// its segment's binding.
    #[serde(default)]
    pub pool_ranges: Vec<PoolRange>,
    /// Owner path → the digest a fresh load holds there (`contents: updated`).
    #[serde(default)]
    pub reference_digests: BTreeMap<String, Digest>,
}

/// Builds and checks the live snapshot of `spec` against `manifest`: the manifest's pools,
/// an allocation per segment that holds a tensor or a probed address, and one probe per
/// distinct captured address — `active` in a handed-out block (or, outside every segment,
/// inside a storage the live walk found: CPU memory), `free` in a cached block, else
/// `unmapped`.
pub fn build_live(spec: LiveSpec, manifest: &Manifest) -> Result<Live, BuildError> {
    let segments = SegmentMap::new(&spec.segments, &spec.pool_bindings, &spec.pool_ranges);
    for (i, b) in spec.pool_bindings.iter().enumerate() {
        if !manifest.pools.iter().any(|p| p.id == b.pool) {
            return Err(BuildError::Spec(format!(
                "pool_bindings[{i}].pool: the manifest has no {}",
                b.pool
            )));
        }
    }
    for (i, r) in spec.pool_ranges.iter().enumerate() {
        if !manifest.pools.iter().any(|p| p.id == r.pool) {
            return Err(BuildError::Spec(format!(
                "pool_ranges[{i}].pool: the manifest has no {}",
                r.pool
            )));
        }
    }
    let mut live = Live::new(spec.producer, spec.event);
    live.pools = manifest.pools.clone();
    let mut allocations = Allocations::default();

    let mut first_path: HashMap<usize, Vec<&str>> = HashMap::new();
    for o in &spec.owners {
        first_path.entry(o.tensor).or_default().push(&o.path);
    }
    for (i, t) in spec.tensors.iter().enumerate() {
        let mut tensor = t.clone().into_tensor(TensorId(i as u32));
        let base = t.storage_base.0;
        if t.device.starts_with("cuda")
            && let Some((si, s)) = segments.at(base)
            && base.saturating_add(t.storage_nbytes) <= s.base.0.saturating_add(s.size)
        {
            tensor.allocation = Some(allocations.of(si, s, &segments));
            if let Some(p) = segments.pool_at(base, Some(s)) {
                tensor.pool = Some(p);
            }
        }
        tensor.reference_digest = first_path
            .get(&i)
            .into_iter()
            .flatten()
            .find_map(|p| spec.reference_digests.get(*p).cloned());
        live.tensors.push(tensor);
    }
    for (i, o) in spec.owners.iter().enumerate() {
        if o.tensor >= spec.tensors.len() {
            return Err(BuildError::Spec(format!(
                "owners[{i}].tensor: no tensor at position {} ({} given)",
                o.tensor,
                spec.tensors.len()
            )));
        }
        live.owners.push(Owner {
            path: OwnerPath::parse(&o.path)?,
            tensor: TensorId(o.tensor as u32),
            registration: o.registration,
            holder: o.holder.clone(),
        });
    }

    // Storages the live walk found, for probes outside every segment (CPU memory).
    let storages = super::walked::RangeSet::from_sizes(
        spec.tensors
            .iter()
            .map(|t| (t.storage_base.0, t.storage_nbytes.max(1))),
    );
    let mut seen = std::collections::HashSet::new();
    for addr in touch_addresses(manifest) {
        if !seen.insert(addr) {
            continue;
        }
        let probe = match segments.at(addr.0) {
            Some((si, s)) => Probe {
                addr,
                state: if SegmentMap::active(s, addr.0) {
                    AllocState::Active
                } else {
                    AllocState::Free
                },
                pool: segments.pool_at(addr.0, Some(s)),
                allocation: Some(allocations.of(si, s, &segments)),
            },
            None => Probe {
                addr,
                state: if storages.contains(addr.0) {
                    AllocState::Active
                } else {
                    AllocState::Unmapped
                },
                pool: None,
                allocation: None,
            },
        };
        live.probes.push(probe);
    }
    live.allocations = allocations.list;
    check_live(&live).map_err(BuildError::Inconsistent)?;
    Ok(live)
}

/// Every address the manifest's graphs hold, in document order (repeats included).
fn touch_addresses(m: &Manifest) -> impl Iterator<Item = Addr> + '_ {
    m.graphs
        .iter()
        .flat_map(|g| &g.nodes)
        .flat_map(|n| &n.touches)
        .map(|t| t.addr)
}

/// One allocation per segment, numbered in the order they are first needed.
#[derive(Default)]
struct Allocations {
    list: Vec<Allocation>,
    by_segment: HashMap<usize, AllocationId>,
}

impl Allocations {
    fn of(&mut self, si: usize, s: &Segment, segments: &SegmentMap<'_>) -> AllocationId {
        *self.by_segment.entry(si).or_insert_with(|| {
            let id = AllocationId(self.list.len() as u32);
            self.list.push(Allocation {
                id,
                base: s.base,
                size: s.size,
                pool: segments.pool_at(s.base.0, Some(s)),
            });
            id
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::format::{Contents, PoolId, Registration};
    use crate::resolve::facts::{Block, BlockState};
    use crate::testkit::{BASE, manifest, producer};

    fn spec_of(m: &Manifest) -> LiveSpec {
        LiveSpec {
            producer: producer(),
            event: Event {
                name: "wake".into(),
                contents: Contents::Preserved,
            },
            tensors: m
                .tensors
                .iter()
                .map(|t| TensorSpec {
                    storage_base: t.storage_base,
                    storage_nbytes: t.storage_nbytes,
                    offset: t.offset,
                    nbytes: t.nbytes,
                    shape: t.shape.clone(),
                    stride: t.stride.clone(),
                    dtype: t.dtype.clone(),
                    itemsize: t.itemsize,
                    device: "cuda:0".into(),
                    pool: None,
                    digest: None,
                    alloc_site: vec![],
                    storage: None,
                    alive: None,
                })
                .collect(),
            owners: m
                .owners
                .iter()
                .map(|o| OwnerSpec {
                    path: o.path.to_string(),
                    tensor: o.tensor.0 as usize,
                    registration: o.registration,
                    holder: None,
                })
                .collect(),
            segments: vec![],
            pool_bindings: vec![],
            pool_ranges: vec![],
            reference_digests: BTreeMap::new(),
        }
    }

    /// Probes follow the allocator's blocks: handed out is `active`, cached is `free`, no
    /// segment is `unmapped` unless a live storage (CPU memory) holds the address; tensors
    /// and probes in a segment share its allocation and the bound pool.
    #[test]
    fn probes_and_allocations_follow_the_segments() {
        let m = manifest();
        let mut spec = spec_of(&m);
        // Slots 0..2 in one segment of allocator pool [0, 1], bound to the weights pool;
        // slot 1's block is cached; slots 3 and 4 in no segment.
        spec.segments = vec![Segment {
            base: Addr(BASE),
            size: 0x3000,
            pool: [0, 1],
            blocks: [
                (0u64, BlockState::ActiveAllocated),
                (1, BlockState::Inactive),
            ]
            .into_iter()
            .chain([(2, BlockState::ActiveAllocated)])
            .map(|(slot, state)| Block {
                addr: Addr(BASE + slot * 0x1000),
                size: 0x1000,
                state,
            })
            .collect(),
        }];
        let weights = m.pools[0].id;
        spec.pool_bindings = vec![PoolBinding {
            key: [0, 1],
            pool: weights,
        }];
        spec.reference_digests =
            BTreeMap::from([("model.scale_alias".to_string(), Digest("sum64:01".into()))]);
        let live = build_live(spec, &m).unwrap();
        assert_eq!(live.allocations.len(), 1);
        assert_eq!(live.allocations[0].pool, Some(weights));
        assert!(
            live.tensors
                .iter()
                .all(|t| t.allocation == Some(AllocationId(0)))
        );
        assert_eq!(
            live.tensors[1].reference_digest,
            Some(Digest("sum64:01".into())),
            "the digest of any of a tensor's paths"
        );
        let state = |slot: u64| {
            live.probes
                .iter()
                .find(|p| p.addr.0 >= BASE + slot * 0x1000 && p.addr.0 < BASE + (slot + 1) * 0x1000)
                .map(|p| p.state)
        };
        assert_eq!(state(0), Some(AllocState::Active));
        assert_eq!(state(1), Some(AllocState::Free));
        assert_eq!(state(3), Some(AllocState::Unmapped));
        assert_eq!(
            live.probes.len(),
            5,
            "one probe per distinct captured address"
        );
        assert_eq!(live.owners[2].registration, Registration::ObjectAttribute);
    }

    #[test]
    fn a_pool_range_names_the_pool_of_what_lies_in_it_over_the_segments_binding() {
        let m = manifest();
        let mut spec = spec_of(&m);
        // One segment of allocator pool [0, 1], bound to pool 0; a range over its second
        // slot (one allocation of an allocator with its own table) names pool 1.
        spec.segments = vec![Segment {
            base: Addr(BASE),
            size: 0x3000,
            pool: [0, 1],
            blocks: vec![Block {
                addr: Addr(BASE),
                size: 0x3000,
                state: BlockState::ActiveAllocated,
            }],
        }];
        let (bound, ranged) = (m.pools[0].id, m.pools[1].id);
        spec.pool_bindings = vec![PoolBinding {
            key: [0, 1],
            pool: bound,
        }];
        spec.pool_ranges = vec![PoolRange {
            base: Addr(BASE + 0x1000),
            size: 0x1000,
            pool: ranged,
        }];
        let live = build_live(spec, &m).unwrap();
        let pool = |slot: u64| {
            let at = |a: u64| a >= BASE + slot * 0x1000 && a < BASE + (slot + 1) * 0x1000;
            let probe = live.probes.iter().find(|p| at(p.addr.0)).map(|p| p.pool);
            let tensor = live
                .tensors
                .iter()
                .find(|t| at(t.storage_base.0))
                .map(|t| t.pool);
            (probe, tensor)
        };
        assert_eq!(pool(0), (Some(Some(bound)), Some(Some(bound))));
        assert_eq!(pool(1), (Some(Some(ranged)), Some(Some(ranged))));
        assert_eq!(pool(2), (Some(Some(bound)), Some(Some(bound))));
    }

    #[test]
    fn a_range_of_a_pool_the_manifest_lacks_is_an_error() {
        let m = manifest();
        let mut spec = spec_of(&m);
        spec.pool_ranges = vec![PoolRange {
            base: Addr(BASE),
            size: 0x1000,
            pool: PoolId(99),
        }];
        let e = build_live(spec, &m).unwrap_err().to_string();
        assert!(e.contains("pool_ranges[0].pool"), "{e}");
    }

    #[test]
    fn a_binding_to_a_pool_the_manifest_lacks_is_an_error() {
        let m = manifest();
        let mut spec = spec_of(&m);
        spec.pool_bindings = vec![PoolBinding {
            key: [0, 1],
            pool: PoolId(99),
        }];
        let e = build_live(spec, &m).unwrap_err().to_string();
        assert!(e.contains("pool_bindings[0].pool"), "{e}");
        let mut spec = spec_of(&m);
        spec.owners[0].tensor = 42;
        let e = build_live(spec, &m).unwrap_err().to_string();
        assert!(e.contains("owners[0].tensor"), "{e}");
    }
}
