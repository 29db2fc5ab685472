//! An insertion-ordered map from block hashes (Python's `OrderedDict` as the offloading
//! policies use it): push at the newest end, move a key to the newest end, pop the
//! oldest, walk oldest first. O(log n) a step.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use crate::error::{Error, Result};
use crate::hash::BlockHash;

#[derive(Debug, Clone, Default)]
pub struct Ordered<V> {
    map: FxHashMap<BlockHash, (V, u64)>,
    seq: BTreeMap<u64, BlockHash>,
    next: u64,
}

impl<V> Ordered<V> {
    pub fn new() -> Self {
        Ordered {
            map: FxHashMap::default(),
            seq: BTreeMap::new(),
            next: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn contains(&self, k: &BlockHash) -> bool {
        self.map.contains_key(k)
    }

    pub fn get(&self, k: &BlockHash) -> Option<&V> {
        self.map.get(k).map(|(v, _)| v)
    }

    pub fn get_mut(&mut self, k: &BlockHash) -> Option<&mut V> {
        self.map.get_mut(k).map(|(v, _)| v)
    }

    /// Room for `n` more keys, reserved fallibly (nothing changes on failure).
    pub fn try_reserve(&mut self, n: usize) -> Result<()> {
        self.map
            .try_reserve(n)
            .map_err(|e| Error::out_of_memory("the offload tier's key table", e))
    }

    /// Puts `k` at the newest end with value `v` (replacing and moving it if present).
    pub fn push_back(&mut self, k: BlockHash, v: V) {
        let s = self.next;
        self.next += 1;
        if let Some((_, old)) = self.map.insert(k, (v, s)) {
            self.seq.remove(&old);
        }
        self.seq.insert(s, k);
    }

    /// Moves `k` to the newest end; false when absent.
    pub fn move_to_back(&mut self, k: &BlockHash) -> bool {
        let s = self.next;
        match self.map.get_mut(k) {
            None => false,
            Some((_, at)) => {
                self.seq.remove(at);
                *at = s;
                self.seq.insert(s, *k);
                self.next += 1;
                true
            }
        }
    }

    pub fn remove(&mut self, k: &BlockHash) -> Option<V> {
        let (v, s) = self.map.remove(k)?;
        self.seq.remove(&s);
        Some(v)
    }

    pub fn pop_front(&mut self) -> Option<(BlockHash, V)> {
        let (_, k) = self.seq.pop_first()?;
        let (v, _) = self.map.remove(&k)?;
        Some((k, v))
    }

    /// Keys oldest first.
    pub fn keys(&self) -> impl Iterator<Item = &BlockHash> + '_ {
        self.seq.values()
    }

    pub fn clear(&mut self) {
        self.map.clear();
        self.seq.clear();
        self.next = 0;
    }

    /// The map and the order agree (for `check_invariants`).
    pub fn consistent(&self) -> bool {
        self.map.len() == self.seq.len()
            && self
                .seq
                .iter()
                .all(|(s, k)| self.map.get(k).is_some_and(|(_, at)| at == s))
    }
}
