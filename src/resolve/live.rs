//! Building a live snapshot from what a framework sees after sleep/wake or a reload: the
//! tensor views and owner paths of the live model, the allocator's segments, and the
//! manifest whose captured addresses are probed. The counterpart of
//! [`super::manifest::ManifestBuilder`]; the result is checked like a loaded document.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;

use super::facts::{OwnerSpec, PoolBinding, Segment, SegmentMap};
use super::manifest::{BuildError, TensorSpec};
use crate::document::format::{
    Addr, AllocState, Allocation, AllocationId, Digest, Event, Live, Manifest, Owner, Probe,
    Producer, Tensor, TensorId,
};
use crate::document::load::check_live;
use crate::document::owner_path::OwnerPath;

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
    let segments = SegmentMap::new(&spec.segments, &spec.pool_bindings);
    for (i, b) in spec.pool_bindings.iter().enumerate() {
        if !manifest.pools.iter().any(|p| p.id == b.pool) {
            return Err(BuildError::Spec(format!(
                "pool_bindings[{i}].pool: the manifest has no {}",
                b.pool
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
        let mut tensor = Tensor {
            id: TensorId(i as u32),
            storage_base: t.storage_base,
            storage_nbytes: t.storage_nbytes,
            offset: t.offset,
            nbytes: t.nbytes,
            shape: t.shape.clone(),
            stride: t.stride.clone(),
            dtype: t.dtype.clone(),
            itemsize: t.itemsize,
            device: t.device.clone(),
            allocation: None,
            pool: t.pool,
            digest: t.digest.clone(),
            reference_digest: None,
            alloc_site: t.alloc_site.clone(),
        };
        let base = t.storage_base.0;
        if t.device.starts_with("cuda")
            && let Some((si, s)) = segments.at(base)
            && base.saturating_add(t.storage_nbytes) <= s.base.0.saturating_add(s.size)
        {
            tensor.allocation = Some(allocations.of(si, s, &segments));
            if let Some(p) = segments.pool_of(s) {
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
                pool: segments.pool_of(s),
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
                pool: segments.pool_of(s),
            });
            id
        })
    }
}
