//! The prefix-cache table: `(hash, group)` -> the blocks cached under it, oldest first.
//!
//! vLLM does not de-duplicate cached blocks (block tables stay append-only), so one key
//! may name several blocks; lookups return the oldest. The map stores only the first and
//! last block of each key; further blocks are chained through per-block `next`/`prev`
//! links, so an entry is small and insert, remove and lookup are O(1).

use rustc_hash::FxHashMap;

use super::pool::CacheKey;

const NONE: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Chain {
    head: u32,
    tail: u32,
}

/// Key -> blocks table over block ids `0..n`.
#[derive(Debug, Clone)]
pub struct HashTable {
    map: FxHashMap<CacheKey, Chain>,
    next: Vec<u32>,
    prev: Vec<u32>,
}

impl HashTable {
    /// The map is sized for `num_blocks` keys up front (it never holds more): it never
    /// rehashes, and no grown-out tables are left behind in the allocator (they cost ~90
    /// bytes per block of resident memory at 1M blocks). Untouched buckets are not
    /// resident, so an idle pool pays only the control bytes (1 per bucket).
    pub fn new(num_blocks: usize) -> Self {
        HashTable {
            map: FxHashMap::with_capacity_and_hasher(num_blocks, Default::default()),
            next: vec![NONE; num_blocks],
            prev: vec![NONE; num_blocks],
        }
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The oldest block cached under `key`.
    #[inline]
    pub fn first(&self, key: &CacheKey) -> Option<u32> {
        self.map.get(key).map(|c| c.head)
    }

    /// Every block cached under `key`, oldest first.
    pub fn blocks(&self, key: &CacheKey) -> Vec<u32> {
        let mut out = Vec::new();
        let mut at = self.map.get(key).map_or(NONE, |c| c.head);
        while at != NONE {
            out.push(at);
            at = self.next[at as usize];
        }
        out
    }

    /// Every key with its blocks (for invariant checks).
    pub fn entries(&self) -> impl Iterator<Item = (&CacheKey, Vec<u32>)> + '_ {
        self.map.keys().map(move |k| (k, self.blocks(k)))
    }

    /// Add block `id` (in range, not in the table) as the newest block of `key`.
    pub fn insert(&mut self, key: CacheKey, id: u32) {
        let i = id as usize;
        self.next[i] = NONE;
        match self.map.get_mut(&key) {
            None => {
                self.prev[i] = NONE;
                self.map.insert(key, Chain { head: id, tail: id });
            }
            Some(c) => {
                self.next[c.tail as usize] = id;
                self.prev[i] = c.tail;
                c.tail = id;
            }
        }
    }

    /// Remove block `id` from `key`'s blocks (no-op if the key is absent).
    pub fn remove(&mut self, key: &CacheKey, id: u32) {
        let Some(c) = self.map.get_mut(key) else {
            return;
        };
        let i = id as usize;
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NONE {
            if c.head != id {
                return; // not in this chain
            }
            c.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NONE {
            c.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[i] = NONE;
        self.next[i] = NONE;
        if c.head == NONE {
            self.map.remove(key);
        }
    }

    pub fn clear(&mut self) {
        self.map.clear();
        self.next.fill(NONE);
        self.prev.fill(NONE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::BlockHash;

    fn key(x: u8) -> CacheKey {
        CacheKey {
            hash: BlockHash::from_bytes(&[x; 32]).unwrap_or_else(|| unreachable!()),
            group: 0,
        }
    }

    #[test]
    fn chains_keep_insertion_order() {
        let mut t = HashTable::new(8);
        t.insert(key(1), 3);
        t.insert(key(1), 5);
        t.insert(key(1), 1);
        t.insert(key(2), 2);
        assert_eq!(t.blocks(&key(1)), vec![3, 5, 1]);
        assert_eq!(t.first(&key(1)), Some(3));
        t.remove(&key(1), 5);
        assert_eq!(t.blocks(&key(1)), vec![3, 1]);
        t.remove(&key(1), 3);
        assert_eq!(t.first(&key(1)), Some(1));
        t.insert(key(1), 4);
        assert_eq!(t.blocks(&key(1)), vec![1, 4]);
        t.remove(&key(1), 4);
        t.remove(&key(1), 1);
        assert_eq!(t.first(&key(1)), None);
        assert_eq!(t.len(), 1);
        t.remove(&key(2), 7); // not there
        assert_eq!(t.blocks(&key(2)), vec![2]);
        t.clear();
        assert!(t.is_empty());
    }
}
