//! A model of PyTorch's CUDA caching allocator, faithful enough that synthetic tensors sit
//! where a real process would put them: 512-byte blocks carved out of 2 MiB (small) and
//! 20 MiB (large) driver allocations per pool, best-fit reuse of freed blocks, and
//! `empty_cache()` returning wholly free segments to the driver.

use graphcheck::model::format::{AllocState, Allocation, AllocationId, Pool, PoolId};

/// Blocks are multiples of this many bytes (`kMinBlockSize`).
pub const BLOCK_ROUND: u64 = 512;
/// Requests up to this size come from small segments (`kSmallSize`).
pub const SMALL_REQUEST: u64 = 1 << 20;
/// The size of a small segment (`kSmallBuffer`).
pub const SMALL_SEGMENT: u64 = 2 << 20;
/// Requests below this size share large segments (`kMinLargeAlloc`).
pub const SHARED_LARGE_REQUEST: u64 = 10 << 20;
/// The size of a shared large segment (`kLargeBuffer`).
pub const LARGE_SEGMENT: u64 = 20 << 20;
/// Segments are rounded to, and aligned on, this many bytes (`kRoundLarge`).
pub const SEGMENT_ROUND: u64 = 2 << 20;

/// Which free list a segment serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Small,
    Large,
}

#[derive(Clone, Copy, Debug)]
struct Block {
    off: u64,
    size: u64,
    active: bool,
}

#[derive(Clone, Debug)]
struct Segment {
    id: AllocationId,
    pool: PoolId,
    base: u64,
    size: u64,
    class: Class,
    /// Sorted by offset, covering the segment without gaps.
    blocks: Vec<Block>,
    mapped: bool,
}

/// The allocator's state: pools, their address regions and their segments.
#[derive(Clone, Debug)]
pub struct Heap {
    pools: Vec<Pool>,
    /// Next segment base of each pool, by the pool's index.
    next_base: Vec<u64>,
    segments: Vec<Segment>,
}

/// Rounds `n` up to a multiple of `to`.
pub fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to) * to
}

impl Heap {
    /// A heap with these pools; pool `i` hands out segments from `regions[i]` upward.
    pub fn new(pools: Vec<Pool>, regions: Vec<u64>) -> Heap {
        assert_eq!(pools.len(), regions.len(), "one region per pool");
        Heap {
            pools,
            next_base: regions,
            segments: Vec::new(),
        }
    }

    pub fn pools(&self) -> &[Pool] {
        &self.pools
    }

    fn pool_index(&self, pool: PoolId) -> usize {
        self.pools
            .iter()
            .position(|p| p.id == pool)
            .expect("pool exists")
    }

    /// Allocates `nbytes` in `pool` the way the caching allocator does; returns the
    /// segment and the block's address.
    pub fn alloc(&mut self, pool: PoolId, nbytes: u64) -> (AllocationId, u64) {
        let size = round_up(nbytes.max(1), BLOCK_ROUND);
        let class = if size <= SMALL_REQUEST {
            Class::Small
        } else {
            Class::Large
        };
        // Best fit: the smallest free block that holds the request, lowest address first.
        let mut best: Option<(u64, u64, usize, usize)> = None;
        for (si, s) in self.segments.iter().enumerate() {
            if !s.mapped || s.pool != pool || s.class != class {
                continue;
            }
            for (bi, b) in s.blocks.iter().enumerate() {
                if !b.active && b.size >= size {
                    let key = (b.size, s.base + b.off, si, bi);
                    if best.is_none_or(|k| (key.0, key.1) < (k.0, k.1)) {
                        best = Some(key);
                    }
                }
            }
        }
        let (si, bi) = match best {
            Some((_, _, si, bi)) => (si, bi),
            None => (self.new_segment(pool, class, size), 0),
        };
        let seg = &mut self.segments[si];
        let block = seg.blocks[bi];
        let remaining = block.size - size;
        let split = match class {
            Class::Small => remaining >= BLOCK_ROUND,
            Class::Large => remaining > SMALL_REQUEST,
        };
        if split {
            seg.blocks[bi] = Block {
                off: block.off,
                size,
                active: true,
            };
            seg.blocks.insert(
                bi + 1,
                Block {
                    off: block.off + size,
                    size: remaining,
                    active: false,
                },
            );
        } else {
            seg.blocks[bi].active = true;
        }
        (seg.id, seg.base + block.off)
    }

    fn new_segment(&mut self, pool: PoolId, class: Class, size: u64) -> usize {
        let seg_size = match class {
            Class::Small => SMALL_SEGMENT,
            Class::Large if size < SHARED_LARGE_REQUEST => LARGE_SEGMENT,
            Class::Large => round_up(size, SEGMENT_ROUND),
        };
        let pi = self.pool_index(pool);
        let base = round_up(self.next_base[pi], SEGMENT_ROUND);
        self.next_base[pi] = base + seg_size;
        let id = AllocationId(self.segments.len() as u32);
        self.segments.push(Segment {
            id,
            pool,
            base,
            size: seg_size,
            class,
            blocks: vec![Block {
                off: 0,
                size: seg_size,
                active: false,
            }],
            mapped: true,
        });
        self.segments.len() - 1
    }

    /// Returns the block that starts at `addr` to its segment's free list, merging it
    /// with free neighbours.
    pub fn free(&mut self, addr: u64) {
        let seg = self
            .segments
            .iter_mut()
            .find(|s| s.mapped && s.base <= addr && addr < s.base + s.size)
            .expect("freeing an address of a mapped segment");
        let off = addr - seg.base;
        let bi = seg
            .blocks
            .iter()
            .position(|b| b.off == off && b.active)
            .expect("freeing the start of an active block");
        seg.blocks[bi].active = false;
        if bi + 1 < seg.blocks.len() && !seg.blocks[bi + 1].active {
            seg.blocks[bi].size += seg.blocks[bi + 1].size;
            seg.blocks.remove(bi + 1);
        }
        if bi > 0 && !seg.blocks[bi - 1].active {
            seg.blocks[bi - 1].size += seg.blocks[bi].size;
            seg.blocks.remove(bi);
        }
    }

    /// `torch.cuda.empty_cache()`: unmaps every segment that holds no active block.
    pub fn empty_cache(&mut self) {
        for s in &mut self.segments {
            if s.blocks.iter().all(|b| !b.active) {
                s.mapped = false;
            }
        }
    }

    /// The mapped segment that holds `addr`.
    pub fn allocation_at(&self, addr: u64) -> Option<AllocationId> {
        self.segment_at(addr).map(|s| s.id)
    }

    fn segment_at(&self, addr: u64) -> Option<&Segment> {
        self.segments
            .iter()
            .find(|s| s.mapped && s.base <= addr && addr < s.base + s.size)
    }

    /// The pool of a segment.
    pub fn pool_of(&self, id: AllocationId) -> PoolId {
        self.segments[id.0 as usize].pool
    }

    /// The base address of a segment.
    pub fn base_of(&self, id: AllocationId) -> u64 {
        self.segments[id.0 as usize].base
    }

    /// What the allocator says about `addr` now: a live snapshot's probe.
    pub fn probe(&self, addr: u64) -> (AllocState, Option<PoolId>, Option<AllocationId>) {
        match self.segment_at(addr) {
            None => (AllocState::Unmapped, None, None),
            Some(s) => {
                let off = addr - s.base;
                let active = s
                    .blocks
                    .iter()
                    .any(|b| b.active && b.off <= off && off < b.off + b.size);
                let state = if active {
                    AllocState::Active
                } else {
                    AllocState::Free
                };
                (state, Some(s.pool), Some(s.id))
            }
        }
    }

    /// The mapped segments as allocation records, by id.
    pub fn allocations(&self) -> Vec<Allocation> {
        self.segments
            .iter()
            .filter(|s| s.mapped)
            .map(|s| Allocation {
                id: s.id,
                base: graphcheck::model::format::Addr(s.base),
                size: s.size,
                pool: Some(s.pool),
            })
            .collect()
    }

    /// Number of segments ever created (the next allocation id).
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use graphcheck::model::format::{PoolKind, SleepPolicy};

    fn heap() -> Heap {
        Heap::new(
            vec![Pool {
                id: PoolId(0),
                name: "default".into(),
                kind: PoolKind::Default,
                sleep: SleepPolicy::Untouched,
            }],
            vec![0x7f00_0000_0000],
        )
    }

    #[test]
    fn small_blocks_share_a_segment_and_freed_blocks_are_reused_best_fit() {
        let mut h = heap();
        let (s0, a) = h.alloc(PoolId(0), 4);
        let (s1, b) = h.alloc(PoolId(0), 600);
        let (_, c) = h.alloc(PoolId(0), 4);
        assert_eq!(s0, s1);
        assert_eq!((a, b, c), (0x7f00_0000_0000, a + 512, a + 1536));
        h.free(a);
        assert_eq!(h.probe(a).0, AllocState::Free);
        // The 512-byte hole is the best fit, not the tail of the segment.
        assert_eq!(h.alloc(PoolId(0), 8).1, a);
        assert_eq!(h.probe(a).0, AllocState::Active);
    }

    #[test]
    fn large_requests_get_own_segments_and_empty_cache_unmaps_them() {
        let mut h = heap();
        let (_, small) = h.alloc(PoolId(0), 100);
        let (big_seg, big) = h.alloc(PoolId(0), 32 << 20);
        let (mid_seg, mid) = h.alloc(PoolId(0), 2 << 20);
        assert_eq!(big, small + SMALL_SEGMENT);
        assert_eq!(mid, big + (32 << 20));
        assert_ne!(big_seg, mid_seg);
        h.free(big);
        h.empty_cache();
        assert_eq!(h.probe(big), (AllocState::Unmapped, None, None));
        assert_eq!(h.probe(small).0, AllocState::Active);
        assert_eq!(h.allocations().len(), 2);
    }
}
