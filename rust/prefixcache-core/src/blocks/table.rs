//! The prefix-cache table: `(hash, group)` -> the blocks cached under it, oldest first.
//!
//! vLLM does not de-duplicate cached blocks (block tables stay append-only), so one key
//! may name several blocks; lookups return the oldest. The keys live in the blocks
//! themselves ([`Block`]: the group and the hash's first 8 bytes; bytes 8.. of longer
//! hashes in a side array indexed by block id); the table is a hash set of block ids, one
//! per key: the oldest
//! block of the key's chain. Further blocks with the same key are chained through the
//! blocks' `chain_next` / `chain_prev` links (the oldest block's `chain_prev` names the
//! newest, so appending is O(1)). A table slot costs 4 bytes; insert, remove and lookup
//! are O(1).

use hashbrown::hash_table::Entry;
use hashbrown::HashTable;

use crate::hash::BlockHash;
use crate::sys_vec::SysVec;

/// `chain_prev` of a block with no key.
pub(crate) const NO_KEY: u32 = u32::MAX;
/// End of a chain.
const END: u32 = u32::MAX - 1;

/// Bytes of a hash past the 8 held in the block (SHA-256: 32 - 8).
const TAIL: usize = 24;

/// One block of the pool: its reference count and, when cached, its key and chain links.
/// 24 bytes: the key's hash is held here up to its first 8 bytes; the rest of a longer
/// hash lives in the table's side array ([`HashTable32`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Block {
    pub ref_cnt: u32,
    /// The key's group (meaningless without a key).
    pub group: u32,
    /// [`NO_KEY`] when the block is not cached; else the previous block with the same key
    /// (for the oldest: the newest).
    pub chain_prev: u32,
    pub chain_next: u32,
    /// The key's hash, its first 8 bytes zero-padded, little-endian.
    pub head: u64,
}

impl Default for Block {
    fn default() -> Self {
        Block {
            ref_cnt: 0,
            group: 0,
            chain_prev: NO_KEY,
            chain_next: END,
            head: 0,
        }
    }
}

impl Block {
    pub fn has_key(&self) -> bool {
        self.chain_prev != NO_KEY
    }
}

/// Every byte of the hash is folded in (one multiply per 8 bytes): digests are uniform,
/// but hashes given by a caller need not be (a counter in the last bytes made every key
/// collide when only the first 8 bytes were read: quadratic inserts).
pub(crate) fn key_hash(hash: &[u8], group: u32) -> u64 {
    let mut h = (u64::from(group) << 40) ^ hash.len() as u64;
    for chunk in hash.chunks(8) {
        let mut w = [0u8; 8];
        for (dst, src) in w.iter_mut().zip(chunk) {
            *dst = *src;
        }
        h = (h ^ u64::from_le_bytes(w)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^= h >> 32;
    }
    // MurmurHash3's finaliser: every input bit reaches the low (bucket) bits.
    h = (h ^ (h >> 33)).wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    h = (h ^ (h >> 33)).wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    h ^ (h >> 33)
}

/// A hash split as the pool stores it: the first 8 bytes as a word, the rest (zero-padded).
#[derive(Clone, Copy)]
struct Split {
    head: u64,
    tail: [u8; TAIL],
}

#[inline]
fn split(hash: &BlockHash) -> Split {
    let p = hash.padded_bytes();
    let mut head = [0u8; 8];
    head.copy_from_slice(&p[..8]);
    let mut tail = [0u8; TAIL];
    tail.copy_from_slice(&p[8..]);
    Split {
        head: u64::from_le_bytes(head),
        tail,
    }
}

/// Key -> blocks table over the pool's blocks.
#[derive(Debug, Clone, Default)]
pub(crate) struct HashTable32 {
    heads: HashTable<u32>,
    /// The pool's hash length (0 until the first key).
    hash_len: usize,
    /// Bytes `8..` of each cached block's hash, indexed by block id; empty while the
    /// pool's hashes fit in the block (`hash_len <= 8`). Grown to the highest cached id.
    tails: SysVec<[u8; TAIL]>,
}

/// Whether block `id` carries the key `(hash, group)`: the block's word first, the tail
/// (when the hashes are longer than 8 bytes) only when it matches.
#[inline]
fn same_key(blocks: &[Block], tails: &[[u8; TAIL]], id: u32, key: &Split, group: u32) -> bool {
    let b = &blocks[id as usize];
    b.head == key.head
        && b.group == group
        && (tails.is_empty() || tails.get(id as usize) == Some(&key.tail))
}

/// The full hash block `id` is stored under, zero-padded (meaningless without a key).
#[inline]
fn stored_hash(blocks: &[Block], tails: &[[u8; TAIL]], id: u32) -> [u8; 32] {
    let mut out = [0u8; 32];
    out[..8].copy_from_slice(&blocks[id as usize].head.to_le_bytes());
    if let Some(t) = tails.get(id as usize) {
        out[8..].copy_from_slice(t);
    }
    out
}

/// [`key_hash`] of block `id`'s stored key (`len`: the pool's hash length).
#[inline]
fn stored_key_hash(blocks: &[Block], tails: &[[u8; TAIL]], len: usize, id: u32) -> u64 {
    let h = stored_hash(blocks, tails, id);
    key_hash(&h[..len.min(32)], blocks[id as usize].group)
}

/// Where a key's first probe lands in the table, for prefetching (see
/// [`HashTable32::prefetcher`]). Valid until the table next grows or is cleared.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Prefetcher {
    /// Address of the control bytes; bucket `i`'s `u32` sits at `ctrl - 4 * (i + 1)`.
    ctrl: usize,
    mask: usize,
}

impl Prefetcher {
    /// Hints the CPU to load the control byte and the slot of the first bucket a key of
    /// table hash `h` probes (no effect on results).
    #[inline(always)]
    pub fn key(&self, h: u64) {
        let pos = (h as usize) & self.mask;
        prefetch_addr(self.ctrl.wrapping_add(pos));
        prefetch_addr(self.ctrl.wrapping_sub(4 * (pos + 1)));
    }
}

/// Hint the CPU to load the cache line at `addr` (no effect on results).
#[inline(always)]
pub(crate) fn prefetch_addr(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch never faults, whatever the address, and reads nothing the
        // program sees; SSE (which the intrinsic needs) is part of the x86_64 baseline.
        // The pointer is only handed to the prefetch instruction, never dereferenced.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(addr as *const i8) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

impl HashTable32 {
    pub fn new() -> Self {
        Self::default()
    }

    /// A [`Prefetcher`] for the table as it is now (`None` while it is empty). It relies
    /// on hashbrown's layout (buckets stored below the control bytes, the first probe at
    /// `hash & (buckets - 1)`); were that layout to change, prefetches would only miss.
    pub fn prefetcher(&self) -> Option<Prefetcher> {
        let i = self.heads.iter_buckets().next()?;
        let r = self.heads.get_bucket(i)?;
        let ctrl = (std::ptr::from_ref(r) as usize).wrapping_add(4 * (i + 1));
        Some(Prefetcher {
            ctrl,
            mask: self.heads.num_buckets() - 1,
        })
    }

    /// Prefetches the table slot of block `id`'s key (if it has one).
    #[inline]
    pub fn prefetch_block_key(&self, p: &Prefetcher, blocks: &[Block], id: u32) {
        if let Some(b) = blocks.get(id as usize) {
            if b.has_key() {
                p.key(stored_key_hash(blocks, &self.tails, self.hash_len, id));
            }
        }
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.heads.len()
    }

    pub fn hash_len(&self) -> usize {
        self.hash_len
    }

    /// Bytes the table holds per block id beyond the table itself (for tests).
    #[cfg(test)]
    pub fn tail_bytes(&self) -> usize {
        self.tails.capacity() * TAIL
    }

    /// The hash block `id` is cached under (`None` when it has no key).
    pub fn hash_of(&self, blocks: &[Block], id: u32) -> Option<BlockHash> {
        let b = blocks.get(id as usize)?;
        if !b.has_key() {
            return None;
        }
        let h = stored_hash(blocks, &self.tails, id);
        BlockHash::from_bytes(h.get(..self.hash_len)?)
    }

    /// The oldest block cached under `(hash, group)`.
    #[inline]
    pub fn first(&self, blocks: &[Block], hash: &BlockHash, group: u32) -> Option<u32> {
        self.first_hashed(blocks, hash, group, key_hash(hash.as_bytes(), group))
    }

    /// [`first`](Self::first) given the key's table hash `kh` (`key_hash(hash, group)`).
    #[inline]
    pub fn first_hashed(
        &self,
        blocks: &[Block],
        hash: &BlockHash,
        group: u32,
        kh: u64,
    ) -> Option<u32> {
        if hash.len() != self.hash_len {
            return None;
        }
        let key = split(hash);
        let tails = &self.tails;
        self.heads
            .find(kh, |&id| same_key(blocks, tails, id, &key, group))
            .copied()
    }

    /// Prefetches what a lookup of table hash `kh` compares after its table slot: the
    /// block the first slot with a matching tag names, and its hash tail (no effect on
    /// results; the slot itself should be prefetched first, see [`Prefetcher::key`]).
    #[inline]
    pub fn prefetch_candidate(&self, blocks: &[Block], kh: u64) {
        if let Some(&id) = self.heads.find(kh, |_| true) {
            if let Some(b) = blocks.get(id as usize) {
                prefetch_addr(std::ptr::from_ref(b) as usize);
            }
            if let Some(t) = self.tails.get(id as usize) {
                prefetch_addr(t.as_ptr() as usize);
            }
        }
    }

    /// Every block cached under `(hash, group)`, oldest first.
    pub fn blocks(&self, blocks: &[Block], hash: &BlockHash, group: u32) -> Vec<u32> {
        let mut out = Vec::new();
        let mut at = self.first(blocks, hash, group).unwrap_or(END);
        while at != END {
            out.push(at);
            at = blocks[at as usize].chain_next;
        }
        out
    }

    /// The oldest block of every key (for invariant checks).
    pub fn heads(&self) -> impl Iterator<Item = u32> + '_ {
        self.heads.iter().copied()
    }

    /// Room for `additional` more keys of `hash_len` bytes on blocks up to `max_id` (of
    /// `num_blocks`), so that the next inserts cannot fail.
    pub fn reserve_for(
        &mut self,
        blocks: &[Block],
        additional: usize,
        max_id: u32,
        hash_len: usize,
        num_blocks: usize,
    ) -> Result<(), &'static str> {
        let len = self.hash_len;
        let tails = &self.tails;
        self.heads
            .try_reserve(additional, |&id| stored_key_hash(blocks, tails, len, id))
            .map_err(|_| "memory allocation failed")?;
        let want = max_id as usize + 1;
        if hash_len > 8 && additional > 0 && want > self.tails.capacity() {
            // A quarter more at a time (amortised O(1): capped by the pool's size, not by
            // the blocks in use, which grow one at a time), as the pool's blocks grow.
            let n = self.tails.len();
            let grown = (n + n / 4).max(want).min(num_blocks.max(want));
            self.tails
                .try_reserve_exact(grown - n)
                .map_err(|_| "memory allocation failed")?;
        }
        Ok(())
    }

    /// Adds block `id` (not cached) as the newest block of `(hash, group)`. Callers
    /// reserve first ([`reserve_for`](Self::reserve_for)) and keep one hash length.
    pub fn insert(&mut self, blocks: &mut [Block], id: u32, hash: &BlockHash, group: u32) {
        let h = hash.as_bytes();
        self.hash_len = h.len();
        let key = split(hash);
        if self.hash_len > 8 {
            let i = id as usize;
            if self.tails.len() <= i {
                // Within the reserved capacity: no allocation.
                self.tails.resize(i + 1, [0; TAIL]);
            }
            if let Some(t) = self.tails.get_mut(i) {
                *t = key.tail;
            }
        }
        let b = &mut blocks[id as usize];
        b.head = key.head;
        b.group = group;
        b.chain_next = END;
        // One probe: the key's chain, or the slot for a new key.
        let len = self.hash_len;
        let ro: &[Block] = blocks;
        let tails = &self.tails;
        let entry = self.heads.entry(
            key_hash(h, group),
            |&x| same_key(ro, tails, x, &key, group),
            |&x| stored_key_hash(ro, tails, len, x),
        );
        match entry {
            Entry::Vacant(slot) => {
                slot.insert(id);
                blocks[id as usize].chain_prev = id;
            }
            Entry::Occupied(head) => {
                let head = *head.get();
                let tail = blocks[head as usize].chain_prev;
                blocks[tail as usize].chain_next = id;
                blocks[id as usize].chain_prev = tail;
                blocks[head as usize].chain_prev = id;
            }
        }
    }

    /// Removes block `id`'s key (no-op when it has none). Returns whether it had one.
    pub fn remove(&mut self, blocks: &mut [Block], id: u32) -> bool {
        let b = blocks[id as usize];
        if !b.has_key() {
            return false;
        }
        let key = Split {
            head: b.head,
            tail: self.tails.get(id as usize).copied().unwrap_or([0; TAIL]),
        };
        let tails = &self.tails;
        let hk = stored_key_hash(blocks, tails, self.hash_len, id);
        let Ok(entry) = self
            .heads
            .find_entry(hk, |&x| same_key(blocks, tails, x, &key, b.group))
        else {
            blocks[id as usize].chain_prev = NO_KEY;
            return true; // unreachable: a keyed block's key is in the table
        };
        let head = *entry.get();
        if head == id {
            if b.chain_next == END {
                entry.remove();
            } else {
                // The next block becomes the oldest and inherits the newest link.
                let next = b.chain_next;
                blocks[next as usize].chain_prev = b.chain_prev;
                let mut entry = entry;
                *entry.get_mut() = next;
            }
        } else {
            let (p, n) = (b.chain_prev, b.chain_next);
            blocks[p as usize].chain_next = n;
            if n == END {
                blocks[head as usize].chain_prev = p;
            } else {
                blocks[n as usize].chain_prev = p;
            }
        }
        let b = &mut blocks[id as usize];
        b.chain_prev = NO_KEY;
        b.chain_next = END;
        true
    }

    /// Forgets every key (the blocks' own links are the caller's to clear).
    pub fn clear(&mut self) {
        self.heads = HashTable::new();
        self.tails = SysVec::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The prefetcher's address arithmetic matches hashbrown's layout: every occupied
    /// bucket sits where it computes, and keys sit in (or near) the bucket their first
    /// probe names. A layout change would not break results, only make the prefetches
    /// miss; this test says so instead.
    #[test]
    fn prefetcher_addresses_match_the_table_layout() {
        let n = 5000u32;
        let mut blocks = vec![Block::default(); n as usize];
        let mut t = HashTable32::new();
        assert!(t.prefetcher().is_none());
        let hash = |id: u32| {
            BlockHash::from_bytes(&u64::from(id).wrapping_mul(0x9E37_79B9).to_be_bytes()).unwrap()
        };
        for id in 1..n {
            t.reserve_for(&blocks, 1, id, 8, n as usize).unwrap();
            t.insert(&mut blocks, id, &hash(id), 0);
        }
        let p = t.prefetcher().unwrap();
        assert_eq!(p.mask + 1, t.heads.num_buckets());
        let mut seen = 0;
        for i in t.heads.iter_buckets() {
            let r = t.heads.get_bucket(i).unwrap();
            assert_eq!(std::ptr::from_ref(r) as usize, p.ctrl - 4 * (i + 1));
            seen += 1;
        }
        assert_eq!(seen, n as usize - 1);
        let mut near = 0;
        for id in 1..n {
            let h = key_hash(hash(id).as_bytes(), 0);
            let at = t.heads.find_bucket_index(h, |&x| x == id).unwrap();
            let home = (h as usize) & p.mask;
            if at.wrapping_sub(home) & p.mask < 16 {
                near += 1;
            }
        }
        // Most keys sit in the group their first probe reads (the table is at most 7/8
        // full).
        assert!(near * 2 > n, "{near} of {n} keys near their first probe");
    }
}
