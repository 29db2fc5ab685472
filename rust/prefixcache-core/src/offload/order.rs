//! Insertion-ordered key maps (Python's `OrderedDict` as the offloading policies use
//! it): push at the newest end, move a key to the newest end, pop the oldest, walk
//! oldest first. One [`Ordered`] holds up to two such orders over disjoint keys (ARC's
//! ghost lists B1 and B2 share one table; the store-threshold tracker uses one order),
//! so one lookup answers which order holds a key. O(1) a step: the entries sit in a
//! vector (freed entries reused), linked oldest to newest by index, and a
//! [`SlotIndex`] of entry indices finds a key; callers that know keys ahead prefetch
//! their index lines.

use super::chunks::PRESIZE_BYTES;
use super::index::{prefetch, SlotIndex};
use crate::error::{Error, Result};
use crate::hash::BlockHash;

/// No entry (end of an order).
const NIL: u32 = u32::MAX;

/// The most entries an [`Ordered`] holds (the index holds 31-bit values).
const MAX_ENTRIES: usize = 1 << 30;

#[derive(Debug, Clone)]
struct Entry<V> {
    key: BlockHash,
    prev: u32,
    next: u32,
    /// The order holding the entry (0 or 1); free entries: 2.
    order: u8,
    value: V,
}

const FREE: u8 = 2;

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

#[derive(Debug, Clone, Copy)]
struct Ends {
    head: u32,
    tail: u32,
    len: usize,
}

const EMPTY: Ends = Ends {
    head: NIL,
    tail: NIL,
    len: 0,
};

#[derive(Debug, Clone)]
pub struct Ordered<V> {
    index: SlotIndex,
    entries: Vec<Entry<V>>,
    /// Freed entries, newest first, linked through their `next` (reused first; a
    /// release never allocates).
    free_head: u32,
    num_free: usize,
    ends: [Ends; 2],
}

impl<V> Default for Ordered<V> {
    fn default() -> Self {
        Ordered::new()
    }
}

impl<V> Ordered<V> {
    pub fn new() -> Self {
        Ordered {
            index: SlotIndex::default(),
            entries: Vec::new(),
            free_head: NIL,
            num_free: 0,
            ends: [EMPTY; 2],
        }
    }

    /// Keys in both orders.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Keys in order `o`.
    pub fn len_of(&self, o: usize) -> usize {
        self.ends[o].len
    }

    fn find(&self, k: &BlockHash) -> Option<u32> {
        self.find_hashed(k, hash_of(k))
    }

    #[inline]
    fn find_hashed(&self, k: &BlockHash, h: u64) -> Option<u32> {
        let entries = &self.entries;
        self.index.find(h, |i| entries[i as usize].key == *k)
    }

    /// Hints the CPU to fetch where a lookup of the key of hash `h` starts.
    #[inline]
    pub fn prefetch(&self, h: u64) {
        self.index.prefetch(h);
    }

    /// Hints the CPU to fetch the oldest entry of order `o`.
    #[inline]
    pub fn prefetch_front(&self, o: usize) {
        if let Some(e) = self.entries.get(self.ends[o].head as usize) {
            prefetch(e);
        }
    }

    /// The order holding `k`, if any.
    pub fn order_of(&self, k: &BlockHash) -> Option<usize> {
        self.find(k)
            .map(|i| usize::from(self.entries[i as usize].order))
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

    /// Room for `n` more keys in a map that never holds more than `most` (a bound the
    /// caller knows: ARC's ghost lists, the tracker's size), reserved fallibly (nothing
    /// changes on failure). The first reservation takes address space for `most`
    /// entries when that is at most [`PRESIZE_BYTES`]: entries are used in order, so
    /// pages are faulted in only as the map fills, and never copied by a growth.
    pub fn try_reserve(&mut self, n: usize, most: usize) -> Result<()> {
        if self.index.len().saturating_add(n) > MAX_ENTRIES {
            return Err(Error::out_of_memory(
                "the offload tier's key table",
                "more than 2^32 - 1 keys",
            ));
        }
        let new = n.saturating_sub(self.num_free);
        let need = self.entries.len().saturating_add(new);
        if need > self.entries.capacity() {
            let whole = most.min(MAX_ENTRIES).max(need);
            let presized = self.entries.capacity() == 0
                && whole.saturating_mul(std::mem::size_of::<Entry<V>>()) <= PRESIZE_BYTES
                && self.entries.try_reserve_exact(whole).is_ok();
            if !presized {
                self.entries
                    .try_reserve(new)
                    .map_err(|e| Error::out_of_memory("the offload tier's key table", e))?;
            }
        }
        self.index.try_reserve_upto(n, most)
    }

    fn unlink(&mut self, i: u32) {
        let (p, n, o) = {
            let e = &self.entries[i as usize];
            (e.prev, e.next, usize::from(e.order))
        };
        match p {
            NIL => self.ends[o].head = n,
            p => self.entries[p as usize].next = n,
        }
        match n {
            NIL => self.ends[o].tail = p,
            n => self.entries[n as usize].prev = p,
        }
        self.ends[o].len -= 1;
    }

    fn link_back(&mut self, i: u32, o: usize) {
        let t = self.ends[o].tail;
        {
            let e = &mut self.entries[i as usize];
            e.prev = t;
            e.next = NIL;
            e.order = o as u8;
        }
        match t {
            NIL => self.ends[o].head = i,
            t => self.entries[t as usize].next = i,
        }
        self.ends[o].tail = i;
        self.ends[o].len += 1;
    }

    /// Puts `k` at the newest end of order `o` with value `v` (replacing and moving it
    /// if present).
    pub fn push_back_in(&mut self, o: usize, k: BlockHash, v: V) {
        if let Some(i) = self.find(&k) {
            self.entries[i as usize].value = v;
            self.unlink(i);
            self.link_back(i, o);
            return;
        }
        self.push_new(o, k, v);
    }

    /// Puts `k`, known absent, at the newest end of order `o`.
    pub fn push_new(&mut self, o: usize, k: BlockHash, v: V) {
        self.push_new_hashed(o, k, hash_of(&k), v);
    }

    /// `push_new` of a key whose hash `h` is known. Room was reserved by `try_reserve`
    /// (else the index grows here).
    pub fn push_new_hashed(&mut self, o: usize, k: BlockHash, h: u64, v: V) {
        let e = Entry {
            key: k,
            prev: NIL,
            next: NIL,
            order: FREE,
            value: v,
        };
        let i = match self.free_head {
            NIL => {
                self.entries.push(e);
                (self.entries.len() - 1) as u32
            }
            i => {
                self.free_head = self.entries[i as usize].next;
                self.num_free -= 1;
                self.entries[i as usize] = e;
                i
            }
        };
        self.link_back(i, o);
        // Reserved (or grown here): an allocation failure leaves the key unfound, which
        // check_invariants reports.
        let _ = self.index.insert(h, i);
    }

    /// `push_back_in` of order 0.
    pub fn push_back(&mut self, k: BlockHash, v: V) {
        self.push_back_in(0, k, v);
    }

    /// Moves `k` to the newest end of its order; false when absent.
    pub fn move_to_back(&mut self, k: &BlockHash) -> bool {
        match self.find(k) {
            None => false,
            Some(i) => {
                self.move_entry(i);
                true
            }
        }
    }

    fn move_entry(&mut self, i: u32) {
        let o = usize::from(self.entries[i as usize].order);
        if self.ends[o].tail != i {
            self.unlink(i);
            self.link_back(i, o);
        }
    }

    /// Moves `k` to the newest end of its order; returns that order (None: absent).
    pub fn move_to_back_in(&mut self, k: &BlockHash) -> Option<usize> {
        self.move_to_back_hashed(k, hash_of(k))
    }

    /// `move_to_back_in` of a key whose hash `h` is known.
    pub fn move_to_back_hashed(&mut self, k: &BlockHash, h: u64) -> Option<usize> {
        let i = self.find_hashed(k, h)?;
        self.move_entry(i);
        Some(usize::from(self.entries[i as usize].order))
    }

    /// Drops entry `i` (unlinked already, key hash `h`) from the index and frees it.
    fn drop_entry(&mut self, i: u32, h: u64) {
        self.index.remove(h, i);
        self.entries[i as usize].order = FREE;
        self.entries[i as usize].next = self.free_head;
        self.free_head = i;
        self.num_free += 1;
    }

    /// Removes `k`; returns the order that held it.
    pub fn remove(&mut self, k: &BlockHash) -> Option<usize> {
        self.remove_hashed(k, hash_of(k))
    }

    /// `remove` of a key whose hash `h` is known.
    pub fn remove_hashed(&mut self, k: &BlockHash, h: u64) -> Option<usize> {
        let i = self.find_hashed(k, h)?;
        let o = usize::from(self.entries[i as usize].order);
        self.unlink(i);
        self.drop_entry(i, h);
        Some(o)
    }

    /// Removes the oldest key of order `o`.
    pub fn pop_front_of(&mut self, o: usize) -> Option<BlockHash> {
        let i = self.ends[o].head;
        if i == NIL {
            return None;
        }
        let k = self.entries[i as usize].key;
        // Look ahead for the next pop: the next entry's index line (its entry was
        // fetched by this pop's predecessor) and the entry after it.
        let next = self.entries[i as usize].next;
        if let Some(e) = self.entries.get(next as usize) {
            self.index.prefetch(hash_of(&e.key));
            if let Some(e2) = self.entries.get(e.next as usize) {
                prefetch(e2);
            }
        }
        self.unlink(i);
        self.drop_entry(i, hash_of(&k));
        Some(k)
    }

    /// `pop_front_of` order 0.
    pub fn pop_front(&mut self) -> Option<BlockHash> {
        self.pop_front_of(0)
    }

    /// Keys of order `o`, oldest first.
    pub fn keys_of(&self, o: usize) -> impl Iterator<Item = &BlockHash> + '_ {
        let mut at = self.ends[o].head;
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
        self.free_head = NIL;
        self.num_free = 0;
        self.ends = [EMPTY; 2];
    }

    /// The table and the orders agree (for `check_invariants`).
    pub fn consistent(&self) -> bool {
        let mut free = 0usize;
        let mut at = self.free_head;
        while at != NIL {
            match self.entries.get(at as usize) {
                Some(e) if e.order == FREE && free < self.entries.len() => {
                    free += 1;
                    at = e.next;
                }
                _ => return false,
            }
        }
        if free != self.num_free {
            return false;
        }
        let live = self.entries.len() - free;
        if !self.index.consistent()
            || self.index.len() != live
            || self.ends[0].len + self.ends[1].len != live
        {
            return false;
        }
        for (o, ends) in self.ends.iter().enumerate() {
            let mut count = 0usize;
            let mut prev = NIL;
            let mut at = ends.head;
            while at != NIL {
                let Some(e) = self.entries.get(at as usize) else {
                    return false;
                };
                if e.prev != prev || usize::from(e.order) != o || count >= live {
                    return false;
                }
                count += 1;
                prev = at;
                at = e.next;
            }
            if count != ends.len || prev != ends.tail {
                return false;
            }
        }
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.order != FREE)
            .all(|(i, e)| self.find(&e.key) == Some(i as u32))
    }
}

impl Ordered<u32> {
    /// Counts one more offer of `k` (saturating) and makes it newest; returns the new
    /// count, None when `k` is absent.
    pub fn bump(&mut self, k: &BlockHash) -> Option<u32> {
        self.bump_hashed(k, hash_of(k))
    }

    /// `bump` of a key whose hash `h` is known.
    pub fn bump_hashed(&mut self, k: &BlockHash, h: u64) -> Option<u32> {
        let i = self.find_hashed(k, h)?;
        let e = &mut self.entries[i as usize];
        e.value = e.value.saturating_add(1);
        let v = e.value;
        self.move_entry(i);
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u32) -> BlockHash {
        BlockHash::from_bytes(&i.to_le_bytes()).unwrap_or_else(|| unreachable!())
    }

    /// Pushes `n` keys, each after reserving room for it under bound `most`; returns how
    /// many times the entries moved (a growth by copying).
    fn moves(n: u32, most: usize) -> usize {
        let mut o: Ordered<()> = Ordered::new();
        let mut moved = 0;
        let mut at = std::ptr::null();
        for i in 0..n {
            o.try_reserve(1, most).unwrap_or_else(|e| panic!("{e}"));
            if o.entries.as_ptr() != at {
                moved += 1;
                at = o.entries.as_ptr();
            }
            o.push_new(0, key(i), ());
        }
        assert_eq!(o.len(), n as usize);
        assert_eq!(o.keys_of(0).count(), n as usize);
        moved - 1 // the first reservation is no move
    }

    #[test]
    fn a_bounded_map_reserves_its_entries_once() {
        assert_eq!(moves(5000, 5000), 0);
        // Without a bound the entries grow by doubling, copied each time.
        assert!(moves(5000, usize::MAX) >= 5);
        // A bound larger than the whole reservation allows: doubling again.
        let too_many = PRESIZE_BYTES / std::mem::size_of::<Entry<()>>() + 1;
        assert!(moves(5000, too_many) >= 5);
    }
}
