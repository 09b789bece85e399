//! What a framework knows, as it hands it to the builders: the caching allocator's
//! segments (with their blocks and pool), the tensor views and owner paths of a registry
//! walk. Both the manifest and the live snapshot are built in Rust from these facts, so the
//! lookups (tensor → segment → allocation → pool) are written once.

use serde::{Deserialize, Serialize};

use crate::index::address::IntervalIndex;
use crate::model::format::{Addr, PoolId, Registration};

/// A pool as the allocator names it (torch's `(a, b)` pool id).
pub type PoolKey = [i64; 2];

/// One segment of the caching allocator (`torch.cuda.memory_snapshot()`), trimmed to what
/// the builders read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Segment {
    pub base: Addr,
    pub size: u64,
    /// The pool the segment belongs to (`segment_pool_id`); `[0, 0]` is the default pool.
    #[serde(default)]
    pub pool: PoolKey,
    /// The segment's blocks, in any order.
    #[serde(default)]
    pub blocks: Vec<Block>,
}

/// One block of a segment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Block {
    pub addr: Addr,
    pub size: u64,
    pub state: BlockState,
}

/// A block's state, as torch's allocator names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// Handed out.
    ActiveAllocated,
    /// Freed by its owner, waiting for the streams that used it.
    ActivePendingFree,
    /// Cached and free.
    Inactive,
    /// A state this graphcheck does not know: neither handed out nor free.
    #[serde(other)]
    Other,
}

/// Which document pool an allocator pool is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolBinding {
    pub key: PoolKey,
    pub pool: PoolId,
}

/// A range of memory that belongs to a document pool, whatever allocator pool its segment
/// is in: a region of an allocator that keeps its own table of allocations (vLLM's
/// `CuMemAllocator`: one range per allocation, under its tag).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolRange {
    pub base: Addr,
    pub size: u64,
    pub pool: PoolId,
}

/// An owner path of a registry walk; `tensor` is a position in the list of tensor specs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OwnerSpec {
    pub path: String,
    pub tensor: usize,
    pub registration: Registration,
    #[serde(default)]
    pub holder: Option<String>,
}

/// The segments, sorted, for "which segment holds this address" and its blocks; and the
/// pool of an address: its [`PoolRange`] where one holds it, else its segment's bound pool.
pub struct SegmentMap<'a> {
    segments: Vec<&'a Segment>,
    index: IntervalIndex<usize>,
    bindings: &'a [PoolBinding],
    ranges: IntervalIndex<PoolId>,
}

impl<'a> SegmentMap<'a> {
    pub fn new(
        segments: &'a [Segment],
        bindings: &'a [PoolBinding],
        ranges: &[PoolRange],
    ) -> SegmentMap<'a> {
        let segments: Vec<&Segment> = segments.iter().collect();
        let index = IntervalIndex::new(
            segments
                .iter()
                .enumerate()
                .map(|(i, s)| (s.base.0, s.base.0.saturating_add(s.size), i))
                .collect(),
        );
        let ranges = IntervalIndex::new(
            ranges
                .iter()
                .map(|r| (r.base.0, r.base.0.saturating_add(r.size), r.pool))
                .collect(),
        );
        SegmentMap {
            segments,
            index,
            bindings,
            ranges,
        }
    }

    /// The document pool of `addr` in segment `s` (or in none): the pool range holding it,
    /// else the segment's bound pool.
    pub fn pool_at(&self, addr: u64, s: Option<&Segment>) -> Option<PoolId> {
        let mut found = None;
        self.ranges.stab(addr, |_, _, p| {
            found.get_or_insert(p);
        });
        found.or_else(|| s.and_then(|s| self.pool_of(s)))
    }

    /// The segment holding `addr`, by position in the caller's list.
    pub fn at(&self, addr: u64) -> Option<(usize, &'a Segment)> {
        let mut found = None;
        self.index.stab(addr, |_, _, i| {
            found.get_or_insert(i);
        });
        found.map(|i| (i, self.segments[i]))
    }

    /// The document pool of a segment, where its allocator pool is bound to one.
    pub fn pool_of(&self, s: &Segment) -> Option<PoolId> {
        self.bindings
            .iter()
            .find(|b| b.key == s.pool)
            .map(|b| b.pool)
    }

    /// Whether `addr` lies in a block the allocator has handed out.
    pub fn active(s: &Segment, addr: u64) -> bool {
        s.blocks.iter().any(|b| {
            b.state == BlockState::ActiveAllocated && b.addr.0 <= addr && addr - b.addr.0 < b.size
        })
    }
}
