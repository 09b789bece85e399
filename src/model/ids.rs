//! Id-to-index maps for the records of a document. Producers number ids densely from 0, so
//! the common case is a vector lookup; sparse ids fall back to a hash map.

use rustc_hash::FxHashMap as HashMap;
use std::marker::PhantomData;

/// An id type: a `u32` newtype.
pub trait RawId: Copy {
    fn raw(self) -> u32;
}

const NONE: u32 = u32::MAX;

/// Maps ids to indices into the document's record list.
#[derive(Clone, Debug)]
pub struct IdIndex<K> {
    dense: Vec<u32>,
    sparse: HashMap<u32, u32>,
    limit: usize,
    _k: PhantomData<K>,
}

impl<K: RawId> Default for IdIndex<K> {
    fn default() -> Self {
        IdIndex::with_capacity(0)
    }
}

impl<K: RawId> IdIndex<K> {
    /// A map for about `n` records: ids below `4n + 1024` are stored densely.
    pub fn with_capacity(n: usize) -> Self {
        IdIndex {
            dense: Vec::new(),
            sparse: HashMap::default(),
            limit: n.saturating_mul(4).saturating_add(1024),
            _k: PhantomData,
        }
    }

    /// Each id of `ids` mapped to its position in the sequence (the first, where an id
    /// repeats: checked documents have none).
    pub fn positions(ids: impl ExactSizeIterator<Item = K>) -> Self {
        let mut ix = IdIndex::with_capacity(ids.len());
        for (i, id) in ids.enumerate() {
            ix.insert(id, i);
        }
        ix
    }

    /// Maps `id` to `index`; returns the index it already had, if any (and keeps it).
    pub fn insert(&mut self, id: K, index: usize) -> Option<usize> {
        let raw = id.raw() as usize;
        if raw < self.limit {
            if raw >= self.dense.len() {
                self.dense.resize(raw + 1, NONE);
            }
            let slot = &mut self.dense[raw];
            if *slot != NONE {
                return Some(*slot as usize);
            }
            *slot = index as u32;
            None
        } else {
            match self.sparse.entry(id.raw()) {
                std::collections::hash_map::Entry::Occupied(e) => Some(*e.get() as usize),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(index as u32);
                    None
                }
            }
        }
    }

    pub fn get(&self, id: &K) -> Option<usize> {
        let raw = id.raw() as usize;
        if raw < self.limit {
            match self.dense.get(raw) {
                Some(&i) if i != NONE => Some(i as usize),
                _ => None,
            }
        } else {
            self.sparse.get(&id.raw()).map(|&i| i as usize)
        }
    }

    pub fn contains_key(&self, id: &K) -> bool {
        self.get(id).is_some()
    }
}

impl<K: RawId + std::fmt::Debug> std::ops::Index<&K> for IdIndex<K> {
    type Output = u32;
    /// The index of a checked id; panics on an unknown one, which checking rules out.
    fn index(&self, id: &K) -> &u32 {
        let raw = id.raw() as usize;
        let slot = if raw < self.limit {
            self.dense.get(raw).filter(|&&i| i != NONE)
        } else {
            self.sparse.get(&id.raw())
        };
        slot.unwrap_or_else(|| panic!("id {id:?} was not checked"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::format::TensorId;

    #[test]
    fn dense_and_sparse_ids_both_map() {
        let mut ix = IdIndex::with_capacity(2);
        assert_eq!(ix.insert(TensorId(0), 0), None);
        assert_eq!(ix.insert(TensorId(4_000_000_000), 1), None);
        assert_eq!(ix.insert(TensorId(0), 2), Some(0));
        assert_eq!(ix.insert(TensorId(4_000_000_000), 3), Some(1));
        assert_eq!(ix.get(&TensorId(0)), Some(0));
        assert_eq!(ix.get(&TensorId(4_000_000_000)), Some(1));
        assert_eq!(ix.get(&TensorId(7)), None);
        assert_eq!(ix.get(&TensorId(100_000)), None);
        assert_eq!(ix[&TensorId(4_000_000_000)], 1);
    }
}
