//! The address index: from a device address to every tensor view and allocation that
//! contains it, overlapping views of one storage included, in O(log n + hits).
//!
//! The structure is an implicit interval tree (Heng Li's cgranges): intervals sorted by
//! start, the sorted array read as a complete binary tree in which node `i` sits at the
//! level of its trailing one bits, each node augmented with the largest end below it. It
//! costs one sorted array and one `u64` per interval, no pointers.

use crate::model::format::{Addr, Allocation, Tensor};

/// Half-open intervals `[start, end)` with a payload each, queried by point.
#[derive(Clone, Debug, Default)]
pub struct IntervalIndex<T> {
    start: Vec<u64>,
    end: Vec<u64>,
    max_end: Vec<u64>,
    items: Vec<T>,
    root_level: u32,
}

impl<T: Copy> IntervalIndex<T> {
    /// Builds the index; empty intervals are dropped.
    pub fn new(mut intervals: Vec<(u64, u64, T)>) -> Self {
        intervals.retain(|&(s, e, _)| s < e);
        intervals.sort_unstable_by_key(|&(s, e, _)| (s, e));
        let n = intervals.len();
        let mut idx = IntervalIndex {
            start: Vec::with_capacity(n),
            end: Vec::with_capacity(n),
            max_end: Vec::with_capacity(n),
            items: Vec::with_capacity(n),
            root_level: 0,
        };
        for (s, e, t) in intervals {
            idx.start.push(s);
            idx.end.push(e);
            idx.max_end.push(e);
            idx.items.push(t);
        }
        idx.root_level = idx.augment();
        idx
    }

    /// Fills `max_end` bottom-up; returns the level of the root.
    fn augment(&mut self) -> u32 {
        let n = self.start.len();
        if n == 0 {
            return 0;
        }
        // `last_i` tracks the rightmost node of the (virtual, complete) tree at each level,
        // `last` its subtree's largest end, standing in for right children past `n`.
        let mut last_i = (n - 1) & !1;
        let mut last = self.end[last_i];
        let mut k = 1u32;
        while (1usize << k) <= n {
            let x = 1usize << (k - 1);
            let i0 = (x << 1) - 1;
            let step = x << 2;
            let mut i = i0;
            while i < n {
                let el = self.max_end[i - x];
                let er = if i + x < n { self.max_end[i + x] } else { last };
                self.max_end[i] = self.end[i].max(el).max(er);
                i += step;
            }
            last_i = if (last_i >> k) & 1 == 1 {
                last_i - x
            } else {
                last_i + x
            };
            if last_i < n && self.max_end[last_i] > last {
                last = self.max_end[last_i];
            }
            k += 1;
        }
        k - 1
    }

    pub fn len(&self) -> usize {
        self.start.len()
    }

    pub fn is_empty(&self) -> bool {
        self.start.is_empty()
    }

    /// Calls `f` with every interval containing `point`, in order of start.
    pub fn stab(&self, point: u64, mut f: impl FnMut(u64, u64, T)) {
        let n = self.start.len();
        if n == 0 {
            return;
        }
        let (st, en) = (point, point.saturating_add(1));
        // (level, node, left child done)
        let mut stack: Vec<(u32, usize, bool)> = Vec::with_capacity(64);
        stack.push((self.root_level, (1usize << self.root_level) - 1, false));
        while let Some((k, x, left_done)) = stack.pop() {
            if k <= 3 {
                // A small subtree: scan it.
                let i0 = (x >> k) << k;
                let i1 = (i0 + (1usize << (k + 1)) - 1).min(n);
                let mut i = i0;
                while i < i1 && self.start[i] < en {
                    if st < self.end[i] {
                        f(self.start[i], self.end[i], self.items[i]);
                    }
                    i += 1;
                }
            } else if !left_done {
                let y = x - (1usize << (k - 1));
                stack.push((k, x, true));
                if y >= n || self.max_end[y] > st {
                    stack.push((k - 1, y, false));
                }
            } else if x < n && self.start[x] < en {
                if st < self.end[x] {
                    f(self.start[x], self.end[x], self.items[x]);
                }
                stack.push((k - 1, x + (1usize << (k - 1)), false));
            }
        }
    }

    /// Every interval containing `point`, in order of start.
    pub fn stab_vec(&self, point: u64) -> Vec<T> {
        let mut out = Vec::new();
        self.stab(point, |_, _, t| out.push(t));
        out
    }
}

/// Addresses to tensor views (by index into the document's `tensors`) and allocations (by
/// index into its `allocations`).
#[derive(Clone, Debug, Default)]
pub struct AddressIndex {
    views: IntervalIndex<usize>,
    allocations: IntervalIndex<usize>,
}

impl AddressIndex {
    pub fn new(tensors: &[Tensor], allocations: &[Allocation]) -> Self {
        AddressIndex {
            views: IntervalIndex::new(
                tensors
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (t.data_ptr().0, t.end().0, i))
                    .collect(),
            ),
            allocations: IntervalIndex::new(
                allocations
                    .iter()
                    .enumerate()
                    .map(|(i, a)| (a.base.0, a.base.0.saturating_add(a.size), i))
                    .collect(),
            ),
        }
    }

    /// Indices of the views containing `addr`, smallest start first.
    pub fn views_at(&self, addr: Addr) -> Vec<usize> {
        self.views.stab_vec(addr.0)
    }

    /// Indices of the allocations containing `addr` (one, unless the document overlaps
    /// them).
    pub fn allocations_at(&self, addr: Addr) -> Vec<usize> {
        self.allocations.stab_vec(addr.0)
    }

    /// Calls `f` with the index of every view containing `addr`.
    pub fn for_each_view_at(&self, addr: Addr, mut f: impl FnMut(usize)) {
        self.views.stab(addr.0, |_, _, i| f(i));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64*: deterministic, and enough to scatter intervals.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
    }

    #[test]
    fn stab_matches_brute_force_with_overlaps() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for n in [0usize, 1, 2, 3, 7, 8, 9, 16, 17, 100, 1000, 1025] {
            let ivs: Vec<(u64, u64, usize)> = (0..n)
                .map(|i| {
                    let s = rng.next() % 10_000;
                    // Mostly small views, some large storages holding many of them.
                    let len = if rng.next() % 10 == 0 {
                        rng.next() % 3000
                    } else {
                        rng.next() % 40
                    };
                    (s, s + len, i)
                })
                .collect();
            let idx = IntervalIndex::new(ivs.clone());
            for _ in 0..500 {
                let p = rng.next() % 11_000;
                let mut got = idx.stab_vec(p);
                got.sort_unstable();
                let mut want: Vec<usize> = ivs
                    .iter()
                    .filter(|&&(s, e, _)| s <= p && p < e)
                    .map(|&(_, _, i)| i)
                    .collect();
                want.sort_unstable();
                assert_eq!(got, want, "n={n} p={p}");
            }
        }
    }

    #[test]
    fn half_open_bounds_and_address_extremes() {
        let idx = IntervalIndex::new(vec![
            (10, 20, 'a'),
            (20, 30, 'b'),
            (u64::MAX - 5, u64::MAX, 'c'),
        ]);
        assert_eq!(idx.stab_vec(9), Vec::<char>::new());
        assert_eq!(idx.stab_vec(10), vec!['a']);
        assert_eq!(idx.stab_vec(19), vec!['a']);
        assert_eq!(idx.stab_vec(20), vec!['b']);
        assert_eq!(idx.stab_vec(u64::MAX - 1), vec!['c']);
        assert_eq!(idx.stab_vec(u64::MAX), Vec::<char>::new());
    }

    #[test]
    fn nested_views_of_one_storage_all_found() {
        // A storage, a view of its second half, and an alias of the whole.
        let idx = IntervalIndex::new(vec![
            (0x1000, 0x2000, 0),
            (0x1800, 0x2000, 1),
            (0x1000, 0x2000, 2),
        ]);
        let mut hits = idx.stab_vec(0x1900);
        hits.sort_unstable();
        assert_eq!(hits, vec![0, 1, 2]);
        assert_eq!(idx.stab_vec(0x1100).len(), 2);
    }
}
