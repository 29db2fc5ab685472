//! The prefix-cache table: `(hash, group)` -> the blocks cached under it, oldest first.
//!
//! vLLM does not de-duplicate cached blocks (block tables stay append-only), so one key
//! may name several blocks; lookups return the oldest. The keys live in the blocks
//! themselves ([`Block`]); the table is a hash set of block ids, one per key: the oldest
//! block of the key's chain. Further blocks with the same key are chained through the
//! blocks' `chain_next` / `chain_prev` links (the oldest block's `chain_prev` names the
//! newest, so appending is O(1)). A table slot costs 4 bytes; insert, remove and lookup
//! are O(1).

use hashbrown::hash_table::Entry;
use hashbrown::HashTable;

use crate::hash::BlockHash;

/// `chain_prev` of a block with no key.
pub(crate) const NO_KEY: u32 = u32::MAX;
/// End of a chain.
const END: u32 = u32::MAX - 1;

/// One block of the pool: its reference count and, when cached, its key and chain links.
/// 48 bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Block {
    pub ref_cnt: u32,
    /// The key's group (meaningless without a key).
    pub group: u32,
    /// [`NO_KEY`] when the block is not cached; else the previous block with the same key
    /// (for the oldest: the newest).
    pub chain_prev: u32,
    pub chain_next: u32,
    /// The key's hash, its first `hash_len` bytes (the pool's hash length).
    pub hash: [u8; 32],
}

impl Default for Block {
    fn default() -> Self {
        Block {
            ref_cnt: 0,
            group: 0,
            chain_prev: NO_KEY,
            chain_next: END,
            hash: [0; 32],
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

/// Key -> blocks table over the pool's blocks.
#[derive(Debug, Clone, Default)]
pub(crate) struct HashTable32 {
    heads: HashTable<u32>,
    /// The pool's hash length (0 until the first key).
    hash_len: usize,
}

/// Whether block `b` carries the key `(hash, group)`.
#[inline]
fn same_key(b: &Block, hash: &[u8], group: u32) -> bool {
    b.group == group && &b.hash[..hash.len()] == hash
}

impl HashTable32 {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.heads.len()
    }

    pub fn hash_len(&self) -> usize {
        self.hash_len
    }

    /// The oldest block cached under `(hash, group)`.
    #[inline]
    pub fn first(&self, blocks: &[Block], hash: &[u8], group: u32) -> Option<u32> {
        if hash.len() != self.hash_len {
            return None;
        }
        self.heads
            .find(key_hash(hash, group), |&id| {
                same_key(&blocks[id as usize], hash, group)
            })
            .copied()
    }

    /// Every block cached under `(hash, group)`, oldest first.
    pub fn blocks(&self, blocks: &[Block], hash: &[u8], group: u32) -> Vec<u32> {
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

    /// Room for `additional` more keys, so that the next inserts cannot fail.
    pub fn reserve_for(&mut self, blocks: &[Block], additional: usize) -> Result<(), &'static str> {
        let len = self.hash_len;
        self.heads
            .try_reserve(additional, |&id| {
                let b = &blocks[id as usize];
                key_hash(&b.hash[..len], b.group)
            })
            .map_err(|_| "memory allocation failed")
    }

    /// Adds block `id` (not cached) as the newest block of `(hash, group)`. Callers
    /// reserve first ([`reserve_for`](Self::reserve_for)) and keep one hash length.
    pub fn insert(&mut self, blocks: &mut [Block], id: u32, hash: &BlockHash, group: u32) {
        let h = hash.as_bytes();
        self.hash_len = h.len();
        let b = &mut blocks[id as usize];
        // The whole zero-padded array: a fixed-size copy (no memcpy call per block).
        b.hash = *hash.padded_bytes();
        b.group = group;
        b.chain_next = END;
        // One probe: the key's chain, or the slot for a new key.
        let len = self.hash_len;
        let ro: &[Block] = blocks;
        let entry = self.heads.entry(
            key_hash(h, group),
            |&x| same_key(&ro[x as usize], h, group),
            |&x| {
                let b = &ro[x as usize];
                key_hash(&b.hash[..len], b.group)
            },
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
        let hash = &b.hash[..self.hash_len];
        let hk = key_hash(hash, b.group);
        let Ok(entry) = self
            .heads
            .find_entry(hk, |&x| same_key(&blocks[x as usize], hash, b.group))
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
    }
}
