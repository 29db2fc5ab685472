//! The tier's chunk table: one [`Slot`] per chunk id in a vector (the chunk id is the
//! slot index), and a hash table of slot indices that finds a stored key (4 bytes a
//! table slot; the key lives in the slot). The policies link slots into intrusive
//! doubly-linked lists ([`List`]) through the slots' `prev` / `next` fields.

use super::index::{prefetch, SlotIndex};
use super::order::hash_of;
use crate::error::{Error, Result};
use crate::hash::BlockHash;

/// No node (end of a list, or no slot).
pub const NIL: u32 = u32::MAX;
/// Node ids at and above this name the LRU's group sentinels, below it chunk slots.
pub const SENTINEL_BASE: u32 = 1 << 31;
/// Chunk ids a slot can have: `0..MAX_SLOTS`.
pub const MAX_SLOTS: u64 = SENTINEL_BASE as u64;
/// The largest slot table reserved whole at the first store (1 GiB of address space,
/// 16M chunks).
pub const PRESIZE_BYTES: usize = 1 << 30;

/// The slot holds a stored chunk (else it is free and its fields are stale).
pub const LIVE: u8 = 1;
/// ARC: the chunk is in T2 (else T1).
pub const IN_T2: u8 = 2;
/// LRU: the chunk's rank is its request's (it sits in that request's group).
pub const GROUPED: u8 = 4;
/// Offered in the `prepare_store` being served: not evictable by it.
pub const PROTECTED: u8 = 8;

/// An LRU rank: `(r, -position)` or `(r, 0)` (module `lru`).
pub type Rank = (u64, i64);

/// One chunk: 64 bytes, aligned to a cache line (one miss per slot visited).
#[derive(Debug, Clone, Copy)]
#[repr(align(64))]
pub struct Slot {
    pub key: BlockHash,
    pub flags: u8,
    /// -1 while its store is in flight, 0 idle (evictable), n > 0 while n loads read it.
    pub ref_cnt: i32,
    pub prev: u32,
    pub next: u32,
    /// LRU only.
    pub rank: Rank,
}

impl Default for Slot {
    fn default() -> Self {
        Slot {
            key: BlockHash::default(),
            flags: 0,
            ref_cnt: 0,
            prev: NIL,
            next: NIL,
            rank: (0, 0),
        }
    }
}

impl Slot {
    pub fn live(&self) -> bool {
        self.flags & LIVE != 0
    }
    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

#[derive(Debug, Clone, Default)]
pub struct ChunkTable {
    index: SlotIndex,
    pub slots: Vec<Slot>,
}

impl ChunkTable {
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The slot of `k`, whose table hash is `h`.
    #[inline]
    pub fn find_hashed(&self, k: &BlockHash, h: u64) -> Option<u32> {
        let slots = &self.slots;
        self.index.find(h, |i| slots[i as usize].key == *k)
    }

    pub fn find(&self, k: &BlockHash) -> Option<u32> {
        self.find_hashed(k, hash_of(k))
    }

    pub fn contains(&self, k: &BlockHash) -> bool {
        self.find(k).is_some()
    }

    /// Hints the CPU to fetch where a lookup of hash `h` starts.
    #[inline]
    pub fn prefetch_hash(&self, h: u64) {
        self.index.prefetch(h);
    }

    /// Hints the CPU to fetch slot `id`.
    #[inline]
    pub fn prefetch_slot(&self, id: u32) {
        if let Some(s) = self.slots.get(id as usize) {
            prefetch(s);
        }
    }

    /// For a lookup of hash `h` coming soon (its index line prefetched earlier by
    /// [`ChunkTable::prefetch_hash`]): prefetches the slot the lookup will likely land on.
    #[inline]
    pub fn prefetch_candidate(&self, h: u64) {
        if let Some(id) = self.index.first_candidate(h) {
            self.prefetch_slot(id);
        }
    }

    /// The slot of `k` when `hint` names it (no table probe), else by lookup.
    pub fn find_hinted(&self, k: &BlockHash, hint: u32) -> Option<u32> {
        match self.slots.get(hint as usize) {
            Some(s) if s.live() && s.key == *k => Some(hint),
            _ => self.find(k),
        }
    }

    /// Room for `n` more chunks, `fresh` of them in new slots, of at most `max_slots`
    /// slots in all (the tier's chunks), reserved fallibly. The first reservation takes
    /// address space for all `max_slots` slots when that is at most [`PRESIZE_BYTES`]
    /// (pages are only faulted in as slots are used); else, or when that fails, the slot
    /// vector grows by doubling, capped at `max_slots`. Growing by doubling copies the
    /// slots at each step and faults in about twice the final table. The index grows
    /// toward its size for `max_slots` ([`SlotIndex::try_reserve_upto`]).
    pub fn try_reserve(&mut self, n: usize, fresh: usize, max_slots: usize) -> Result<()> {
        let need = self.slots.len().saturating_add(fresh);
        if need > self.slots.capacity() {
            let whole = max_slots.max(need);
            let presized = self.slots.capacity() == 0
                && whole.saturating_mul(std::mem::size_of::<Slot>()) <= PRESIZE_BYTES
                && self.slots.try_reserve_exact(whole).is_ok();
            if !presized {
                let want = self
                    .slots
                    .capacity()
                    .saturating_mul(2)
                    .min(max_slots)
                    .max(need);
                self.slots
                    .try_reserve_exact(want - self.slots.len())
                    .map_err(|e| Error::out_of_memory("the offload tier's chunk table", e))?;
            }
        }
        self.index.try_reserve_upto(n, max_slots)
    }

    /// Stores `k` (table hash `h`) in slot `id` (free, or the next new slot), unlinked,
    /// ref count -1. Room was reserved by `try_reserve`.
    pub fn insert(&mut self, id: u32, k: BlockHash, h: u64) {
        let slot = Slot {
            key: k,
            flags: LIVE,
            ref_cnt: -1,
            ..Slot::default()
        };
        match self.slots.get_mut(id as usize) {
            Some(s) => *s = slot,
            None => self.slots.push(slot),
        }
        // Reserved: cannot fail.
        let _ = self.index.insert(h, id);
    }

    /// Frees slot `id` (the caller unlinked it from its policy's list).
    pub fn remove(&mut self, id: u32) {
        if let Some(s) = self.slots.get(id as usize) {
            let h = hash_of(&s.key);
            self.remove_hashed(id, h);
        }
    }

    /// `remove` of slot `id` whose key's hash is `h`.
    pub fn remove_hashed(&mut self, id: u32, h: u64) {
        let Some(s) = self.slots.get_mut(id as usize) else {
            return;
        };
        s.flags = 0;
        self.index.remove(h, id);
    }

    pub fn clear(&mut self) {
        self.index.clear();
        self.slots.clear();
    }

    /// Live slots: (chunk id, slot).
    pub fn live(&self) -> impl Iterator<Item = (u32, &Slot)> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.live())
            .map(|(i, s)| (i as u32, s))
    }

    /// The index and the live slots agree.
    pub fn consistent(&self) -> bool {
        self.index.consistent()
            && self.live().count() == self.index.len()
            && self.live().all(|(i, s)| self.find(&s.key) == Some(i))
    }
}

/// The links of the nodes a [`List`] runs through, read.
pub trait LinksRead {
    fn prev(&self, n: u32) -> u32;
    fn next(&self, n: u32) -> u32;
}

/// The links of the nodes a [`List`] runs through, written.
pub trait Links: LinksRead {
    fn set_prev(&mut self, n: u32, v: u32);
    fn set_next(&mut self, n: u32, v: u32);
}

impl LinksRead for [Slot] {
    fn prev(&self, n: u32) -> u32 {
        self[n as usize].prev
    }
    fn next(&self, n: u32) -> u32 {
        self[n as usize].next
    }
}

impl Links for [Slot] {
    fn set_prev(&mut self, n: u32, v: u32) {
        self[n as usize].prev = v;
    }
    fn set_next(&mut self, n: u32, v: u32) {
        self[n as usize].next = v;
    }
}

/// An intrusive doubly-linked list, oldest (head) to newest (tail).
#[derive(Debug, Clone, Copy)]
pub struct List {
    pub head: u32,
    pub tail: u32,
    pub len: usize,
}

impl Default for List {
    fn default() -> Self {
        List {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
}

impl List {
    pub fn push_back<L: Links + ?Sized>(&mut self, l: &mut L, n: u32) {
        let t = self.tail;
        l.set_prev(n, t);
        l.set_next(n, NIL);
        match t {
            NIL => self.head = n,
            t => l.set_next(t, n),
        }
        self.tail = n;
        self.len += 1;
    }

    /// Links `n` right after `at` (a node of this list).
    pub fn insert_after<L: Links + ?Sized>(&mut self, l: &mut L, at: u32, n: u32) {
        let nx = l.next(at);
        l.set_prev(n, at);
        l.set_next(n, nx);
        l.set_next(at, n);
        match nx {
            NIL => self.tail = n,
            nx => l.set_prev(nx, n),
        }
        self.len += 1;
    }

    /// Links `n` right before `at` (a node of this list).
    pub fn insert_before<L: Links + ?Sized>(&mut self, l: &mut L, at: u32, n: u32) {
        let pv = l.prev(at);
        l.set_prev(n, pv);
        l.set_next(n, at);
        l.set_prev(at, n);
        match pv {
            NIL => self.head = n,
            pv => l.set_next(pv, n),
        }
        self.len += 1;
    }

    pub fn unlink<L: Links + ?Sized>(&mut self, l: &mut L, n: u32) {
        let (p, nx) = (l.prev(n), l.next(n));
        match p {
            NIL => self.head = nx,
            p => l.set_next(p, nx),
        }
        match nx {
            NIL => self.tail = p,
            nx => l.set_prev(nx, p),
        }
        l.set_prev(n, NIL);
        l.set_next(n, NIL);
        self.len -= 1;
    }

    /// Moves the run `a..=b` (linked from `a` to `b`, `a` first) to right after node
    /// `at` (not in the run; NIL: the tail). The length is unchanged.
    pub fn move_run_after<L: Links + ?Sized>(&mut self, l: &mut L, a: u32, b: u32, at: u32) {
        let (p, nx) = (l.prev(a), l.next(b));
        match p {
            NIL => self.head = nx,
            p => l.set_next(p, nx),
        }
        match nx {
            NIL => self.tail = p,
            nx => l.set_prev(nx, p),
        }
        let at = if at == NIL { self.tail } else { at };
        let after = match at {
            NIL => std::mem::replace(&mut self.head, a),
            at => {
                let after = l.next(at);
                l.set_next(at, a);
                after
            }
        };
        l.set_prev(a, at);
        l.set_next(b, after);
        match after {
            NIL => self.tail = b,
            after => l.set_prev(after, b),
        }
    }

    pub fn move_to_back<L: Links + ?Sized>(&mut self, l: &mut L, n: u32) {
        if self.tail != n {
            self.unlink(l, n);
            self.push_back(l, n);
        }
    }

    pub fn clear(&mut self) {
        *self = List::default();
    }

    /// The nodes head to tail, or None when the links are inconsistent (for checks).
    pub fn walk<L: LinksRead + ?Sized>(&self, l: &L, limit: usize) -> Option<Vec<u32>> {
        let mut out = Vec::new();
        let mut prev = NIL;
        let mut at = self.head;
        while at != NIL {
            if out.len() >= limit || l.prev(at) != prev {
                return None;
            }
            out.push(at);
            prev = at;
            at = l.next(at);
        }
        (prev == self.tail && out.len() == self.len).then_some(out)
    }
}

const _: () = assert!(std::mem::size_of::<Slot>() == 64);
