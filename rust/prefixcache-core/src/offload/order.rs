//! An insertion-ordered map from block hashes (Python's `OrderedDict` as the offloading
//! policies use it): push at the newest end, move a key to the newest end, pop the
//! oldest, walk oldest first. O(1) a step: the entries sit in one dense vector, linked
//! oldest to newest by index, and a hash table of entry indices finds a key (4 bytes a
//! table slot). Removing an entry moves the last one into its place.

use hashbrown::HashTable;

use crate::error::{Error, Result};
use crate::hash::BlockHash;

/// No entry (end of the order).
const NIL: u32 = u32::MAX;

/// The most entries an [`Ordered`] holds (indices are `u32`, `NIL` excluded).
const MAX_ENTRIES: usize = (u32::MAX - 1) as usize;

#[derive(Debug, Clone)]
struct Entry<V> {
    key: BlockHash,
    prev: u32,
    next: u32,
    value: V,
}

/// The table hash of a key: every byte folded in, one multiply per 8 bytes, then
/// MurmurHash3's finaliser (the same mix as the block pool's table, read in whole
/// words from the zero-padded hash).
#[inline]
pub(crate) fn hash_of(k: &BlockHash) -> u64 {
    let b = k.padded_bytes();
    let mut h = k.len() as u64;
    for chunk in b.chunks_exact(8).take(k.len().div_ceil(8)) {
        let mut w = [0u8; 8];
        w.copy_from_slice(chunk);
        h = (h ^ u64::from_le_bytes(w)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^= h >> 32;
    }
    h = (h ^ (h >> 33)).wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    h = (h ^ (h >> 33)).wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    h ^ (h >> 33)
}

#[derive(Debug, Clone)]
pub struct Ordered<V> {
    index: HashTable<u32>,
    entries: Vec<Entry<V>>,
    head: u32,
    tail: u32,
}

impl<V> Default for Ordered<V> {
    fn default() -> Self {
        Ordered::new()
    }
}

impl<V> Ordered<V> {
    pub fn new() -> Self {
        Ordered {
            index: HashTable::new(),
            entries: Vec::new(),
            head: NIL,
            tail: NIL,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn find(&self, k: &BlockHash) -> Option<u32> {
        let entries = &self.entries;
        self.index
            .find(hash_of(k), |&i| entries[i as usize].key == *k)
            .copied()
    }

    pub fn contains(&self, k: &BlockHash) -> bool {
        self.find(k).is_some()
    }

    pub fn get(&self, k: &BlockHash) -> Option<&V> {
        self.find(k).map(|i| &self.entries[i as usize].value)
    }

    pub fn get_mut(&mut self, k: &BlockHash) -> Option<&mut V> {
        self.find(k).map(|i| &mut self.entries[i as usize].value)
    }

    /// Room for `n` more keys, reserved fallibly (nothing changes on failure).
    pub fn try_reserve(&mut self, n: usize) -> Result<()> {
        if self.entries.len().saturating_add(n) > MAX_ENTRIES {
            return Err(Error::out_of_memory(
                "the offload tier's key table",
                "more than 2^32 - 1 keys",
            ));
        }
        self.entries
            .try_reserve(n)
            .map_err(|e| Error::out_of_memory("the offload tier's key table", e))?;
        let entries = &self.entries;
        self.index
            .try_reserve(n, |&i| hash_of(&entries[i as usize].key))
            .map_err(|e| Error::out_of_memory("the offload tier's key table", format!("{e:?}")))
    }

    fn unlink(&mut self, i: u32) {
        let (p, n) = {
            let e = &self.entries[i as usize];
            (e.prev, e.next)
        };
        match p {
            NIL => self.head = n,
            p => self.entries[p as usize].next = n,
        }
        match n {
            NIL => self.tail = p,
            n => self.entries[n as usize].prev = p,
        }
    }

    fn link_back(&mut self, i: u32) {
        let t = self.tail;
        {
            let e = &mut self.entries[i as usize];
            e.prev = t;
            e.next = NIL;
        }
        match t {
            NIL => self.head = i,
            t => self.entries[t as usize].next = i,
        }
        self.tail = i;
    }

    /// Puts `k` at the newest end with value `v` (replacing and moving it if present).
    pub fn push_back(&mut self, k: BlockHash, v: V) {
        if let Some(i) = self.find(&k) {
            self.entries[i as usize].value = v;
            self.unlink(i);
            self.link_back(i);
            return;
        }
        let i = self.entries.len() as u32;
        self.entries.push(Entry {
            key: k,
            prev: NIL,
            next: NIL,
            value: v,
        });
        self.link_back(i);
        let entries = &self.entries;
        self.index
            .insert_unique(hash_of(&k), i, |&j| hash_of(&entries[j as usize].key));
    }

    /// Moves `k` to the newest end; false when absent.
    pub fn move_to_back(&mut self, k: &BlockHash) -> bool {
        match self.find(k) {
            None => false,
            Some(i) => {
                if self.tail != i {
                    self.unlink(i);
                    self.link_back(i);
                }
                true
            }
        }
    }

    /// Drops entry `i` (unlinked already or not): the last entry takes its index.
    fn drop_entry(&mut self, i: u32) -> V {
        let k = self.entries[i as usize].key;
        if let Ok(slot) = self.index.find_entry(hash_of(&k), |&j| j == i) {
            slot.remove();
        }
        let last = (self.entries.len() - 1) as u32;
        let e = self.entries.swap_remove(i as usize);
        if i != last {
            // The former last entry now lives at `i`: repoint its neighbours and index.
            let (p, n, lk) = {
                let m = &self.entries[i as usize];
                (m.prev, m.next, m.key)
            };
            match p {
                NIL => self.head = i,
                p => self.entries[p as usize].next = i,
            }
            match n {
                NIL => self.tail = i,
                n => self.entries[n as usize].prev = i,
            }
            if let Some(slot) = self.index.find_mut(hash_of(&lk), |&j| j == last) {
                *slot = i;
            }
        }
        e.value
    }

    pub fn remove(&mut self, k: &BlockHash) -> Option<V> {
        let i = self.find(k)?;
        self.unlink(i);
        Some(self.drop_entry(i))
    }

    pub fn pop_front(&mut self) -> Option<(BlockHash, V)> {
        let i = self.head;
        if i == NIL {
            return None;
        }
        let k = self.entries[i as usize].key;
        self.unlink(i);
        Some((k, self.drop_entry(i)))
    }

    /// Keys oldest first.
    pub fn keys(&self) -> impl Iterator<Item = &BlockHash> + '_ {
        let mut at = self.head;
        std::iter::from_fn(move || {
            if at == NIL {
                return None;
            }
            let e = &self.entries[at as usize];
            at = e.next;
            Some(&e.key)
        })
    }

    pub fn clear(&mut self) {
        self.index.clear();
        self.entries.clear();
        self.head = NIL;
        self.tail = NIL;
    }

    /// The map and the order agree (for `check_invariants`).
    pub fn consistent(&self) -> bool {
        if self.index.len() != self.entries.len() {
            return false;
        }
        // Walk the order: every entry once, links mutual.
        let mut count = 0usize;
        let mut prev = NIL;
        let mut at = self.head;
        while at != NIL {
            let Some(e) = self.entries.get(at as usize) else {
                return false;
            };
            if e.prev != prev || count >= self.entries.len() {
                return false;
            }
            count += 1;
            prev = at;
            at = e.next;
        }
        count == self.entries.len()
            && prev == self.tail
            && self
                .entries
                .iter()
                .enumerate()
                .all(|(i, e)| self.find(&e.key) == Some(i as u32))
    }
}
