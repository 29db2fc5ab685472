//! A small table of recent SHA-256 block hashes, keyed by everything such a hash covers.
//!
//! A SHA-256 block hash is a pure function of the encoding (pickle or CBOR), the parent
//! hash and the block's tokens (when the block has no extra keys). Prompts that share a
//! prefix (a system prompt, a conversation's earlier turns) hash the same `(parent,
//! tokens)` blocks again and again; a table hit costs a short hash of the key and a
//! 100-byte compare instead of 2-3 SHA-256 compressions. Entries hold the whole key and are
//! compared in full, so a hit returns exactly what SHA-256 would; the table only decides
//! how often that happens.
//!
//! Set associative, eight ways. A key's 64-bit hash picks a set and is kept as the
//! entry's tag; the sets' headers (tags and per-way state, 128 bytes a set) lie apart
//! from the entries, small enough to stay in the CPU's cache, so a miss reads no entry.
//! A new entry replaces one that was not hit since it was recorded: blocks hashed once
//! (a request's own suffix) replace each other, while the blocks that requests share
//! stay.
//!
//! A miss costs ~20 ns over plain SHA-256. When few blocks recur (a trace whose sharing
//! spans more than the table holds), hits earn less than misses cost: the table then
//! serves only a fixed sample of the blocks (one in 16, chosen by the parent digest)
//! until the sample's hits show that blocks recur again.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The longest block the table holds (vLLM's default block size). Longer blocks are
/// always hashed.
pub(crate) const MAX_TOKENS: usize = 16;

/// Sets of the table each thread keeps: 4096 entries (64K tokens of blocks of 16),
/// 576 KB.
pub(crate) const DEFAULT_SETS: usize = 512;

const WAYS: usize = 8;

/// Credit a hit earns and a miss costs: a hit saves ~100 ns of SHA-256, a miss costs
/// ~20 ns, so the table pays while more than one lookup in five hits.
const HIT_CREDIT: i32 = 4;
const MISS_COST: i32 = 1;
/// Bounds of the credit: how much history the decision weighs.
const CREDIT_MAX: i32 = 256;
const CREDIT_MIN: i32 = -64;
/// The credit of a new table: its first 64 misses are looked up and recorded.
const CREDIT_START: i32 = 64;
/// While the credit is negative, only blocks whose parent digest's last byte is 0 mod
/// this are looked up (and recorded): one in 16, the same blocks each time, so blocks
/// that recur are still found and bring the table back.
const SAMPLE: u8 = 16;

/// One recorded hash: 128 bytes, two cache lines.
#[derive(Clone, Copy)]
#[repr(C)]
struct Entry {
    tokens: [u32; MAX_TOKENS],
    parent: [u8; 32],
    digest: [u8; 32],
}

impl Entry {
    const EMPTY: Entry = Entry {
        tokens: [0; MAX_TOKENS],
        parent: [0; 32],
        digest: [0; 32],
    };
}

/// What a set knows of its ways (entries `WAYS * set ..` of the table): two cache lines.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Head {
    tags: [u64; WAYS],
    /// Token count of each way's entry.
    lens: [u8; WAYS],
    /// Bit w: way w holds an entry.
    valid: u8,
    /// Bit w: way w's entry hashes CBOR (else pickle).
    cbor: u8,
    /// Bit w: way w was hit since it was recorded (or since the last reset).
    referenced: u8,
}

impl Head {
    const EMPTY: Head = Head {
        tags: [0; WAYS],
        lens: [0; WAYS],
        valid: 0,
        cbor: 0,
        referenced: 0,
    };

    /// The way whose entry holds the key, its tag being `tag`.
    #[inline]
    fn find(
        &self,
        ways: &[Entry],
        tag: u64,
        cbor: bool,
        parent: &[u8; 32],
        tokens: &[u32],
    ) -> Option<usize> {
        (0..WAYS).find(|&w| {
            let bit = 1u8 << w;
            self.tags[w] == tag
                && self.valid & bit != 0
                && usize::from(self.lens[w]) == tokens.len()
                && (self.cbor & bit != 0) == cbor
                && ways[w].parent == *parent
                && ways[w].tokens[..tokens.len()] == *tokens
        })
    }

    /// The way a new entry with hash `tag` takes: an empty way, else one not hit since it
    /// was recorded, picked by the tag's high bits (when every way was hit, the hits are
    /// forgotten and any way may go). A pseudo-random pick rather than the oldest: a key
    /// that recurs every few misses of a set survives to its next use often enough to be
    /// hit and kept, where under LRU a stream of keys seen once would evict it each time.
    #[inline]
    fn victim(&mut self, tag: u64) -> usize {
        const ALL: u8 = u8::MAX; // WAYS == 8
        let empty = !self.valid & ALL;
        if empty != 0 {
            return empty.trailing_zeros() as usize;
        }
        let mut candidates = !self.referenced & ALL;
        if candidates == 0 {
            self.referenced = 0;
            candidates = ALL;
        }
        // The tag's high 32 bits scaled to 0..count (a multiply instead of a division).
        let mut nth = (((tag >> 32) * u64::from(candidates.count_ones())) >> 32) as u32;
        while nth > 0 {
            candidates &= candidates - 1;
            nth -= 1;
        }
        candidates.trailing_zeros() as usize
    }

    /// Records the key of `tag` in way `w`.
    #[inline]
    fn record(&mut self, w: usize, tag: u64, cbor: bool, len: usize) {
        let bit = 1u8 << w;
        self.tags[w] = tag;
        self.lens[w] = len as u8;
        self.valid |= bit;
        self.referenced &= !bit;
        if cbor {
            self.cbor |= bit;
        } else {
            self.cbor &= !bit;
        }
    }
}

/// The table. Empty (and allocation-free) until the first lookup.
pub(crate) struct HashMemo {
    heads: Vec<Head>,
    /// `WAYS` entries per set, set after set.
    entries: Vec<Entry>,
    n_sets: usize,
    /// Set once an allocation of the table failed: hash without it from then on.
    unavailable: bool,
    /// Hits earn credit, misses spend it; below zero most blocks skip the table.
    credit: i32,
    /// Tests: every key gets the tag 0 (that of an empty way), so only the full compare
    /// and the valid bits tell keys apart.
    #[cfg(test)]
    same_tags: bool,
}

impl Default for HashMemo {
    fn default() -> Self {
        HashMemo::with_sets(DEFAULT_SETS)
    }
}

impl HashMemo {
    /// A table of `n_sets` sets (rounded up to a power of two).
    pub(crate) fn with_sets(n_sets: usize) -> Self {
        HashMemo {
            heads: Vec::new(),
            entries: Vec::new(),
            n_sets: n_sets.max(1).next_power_of_two(),
            unavailable: false,
            credit: CREDIT_START,
            #[cfg(test)]
            same_tags: false,
        }
    }

    /// The digest of `(parent, tokens)` in the encoding `cbor`: from the table when it
    /// holds the key, else `compute()`, which is then recorded. Blocks longer than
    /// [`MAX_TOKENS`] are not recorded; while recent lookups hit too rarely to pay for
    /// themselves, only a sample of the blocks goes through the table.
    #[inline]
    pub(crate) fn digest(
        &mut self,
        cbor: bool,
        parent: &[u8; 32],
        tokens: &[u32],
        compute: impl FnOnce() -> [u8; 32],
    ) -> [u8; 32] {
        let sampled = parent[31] % SAMPLE == 0;
        if tokens.len() > MAX_TOKENS || (self.credit < 0 && !sampled) || !self.ready() {
            return compute();
        }
        let tag = key_hash(cbor, parent, tokens);
        #[cfg(test)]
        let tag = if self.same_tags { 0 } else { tag };
        // n_sets is a power of two: the low bits of the hash pick the set.
        let set = (tag as usize) & (self.n_sets - 1);
        let head = &mut self.heads[set];
        let ways = &mut self.entries[set * WAYS..(set + 1) * WAYS];
        if let Some(w) = head.find(ways, tag, cbor, parent, tokens) {
            head.referenced |= 1 << w;
            self.credit = (self.credit + HIT_CREDIT).min(CREDIT_MAX);
            return ways[w].digest;
        }
        self.credit = (self.credit - MISS_COST).max(CREDIT_MIN);
        let digest = compute();
        let w = head.victim(tag);
        head.record(w, tag, cbor, tokens.len());
        let e = &mut ways[w];
        e.tokens = [0; MAX_TOKENS];
        e.tokens[..tokens.len()].copy_from_slice(tokens);
        e.parent = *parent;
        e.digest = digest;
        digest
    }

    /// Allocates the table on first use; false when that failed (now or before).
    #[inline]
    fn ready(&mut self) -> bool {
        if self.heads.is_empty() && !self.unavailable {
            let n_entries = self.n_sets * WAYS;
            if self.heads.try_reserve_exact(self.n_sets).is_ok()
                && self.entries.try_reserve_exact(n_entries).is_ok()
            {
                self.heads.resize(self.n_sets, Head::EMPTY);
                self.entries.resize(n_entries, Entry::EMPTY);
            } else {
                self.heads = Vec::new();
                self.entries = Vec::new();
                self.unavailable = true;
            }
        }
        !self.unavailable
    }
}

/// A 64-bit hash of a key. The parent is a SHA-256 digest (uniform), so its first 8 bytes
/// seed a hash of the tokens.
#[inline]
fn key_hash(cbor: bool, parent: &[u8; 32], tokens: &[u32]) -> u64 {
    let mut bytes = [0u8; 4 * MAX_TOKENS];
    for (b, t) in bytes.chunks_exact_mut(4).zip(tokens) {
        b.copy_from_slice(&t.to_le_bytes());
    }
    let mut seed = [0u8; 8];
    seed.copy_from_slice(&parent[..8]);
    let seed = u64::from_le_bytes(seed) ^ u64::from(cbor);
    xxh3_64_with_seed(&bytes[..4 * tokens.len()], seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_digest(cbor: bool, parent: &[u8; 32], tokens: &[u32]) -> [u8; 32] {
        let mut d = *parent;
        d[0] ^= u8::from(cbor);
        for (i, t) in tokens.iter().enumerate() {
            d[i % 32] = d[i % 32].wrapping_add(*t as u8).rotate_left(3);
        }
        d[31] ^= tokens.len() as u8 ^ 0xa5;
        d
    }

    #[test]
    fn a_key_is_recorded_at_its_miss_and_then_hit() {
        let mut m = HashMemo::with_sets(4);
        let p = [7u8; 32];
        let mut calls = 0;
        for _ in 0..3 {
            let d = m.digest(false, &p, &[1, 2, 3], || {
                calls += 1;
                fake_digest(false, &p, &[1, 2, 3])
            });
            assert_eq!(d, fake_digest(false, &p, &[1, 2, 3]));
        }
        assert_eq!(calls, 1);
    }

    #[test]
    fn every_part_of_the_key_is_compared() {
        for same_tags in [false, true] {
            let mut m = HashMemo::with_sets(1);
            m.same_tags = same_tags;
            let p = [7u8; 32];
            let mut q = p;
            q[31] = 8;
            let keys: Vec<(bool, [u8; 32], Vec<u32>)> = [
                (false, [0; 32], vec![]), // what an empty way looks like (first: ways empty)
                (false, p, vec![1, 2, 3]),
                (true, p, vec![1, 2, 3]),
                (false, q, vec![1, 2, 3]),
                (false, p, vec![1, 2]),
                (false, p, vec![1, 2, 3, 0]),
                (false, p, vec![]),
                (false, p, vec![1, 2, 4]),
            ]
            .into_iter()
            .chain((0..2 * WAYS as u32).map(|t| (false, p, vec![9, t])))
            .collect();
            // One set, more keys than ways: each key is used twice in a row (recorded, then
            // hit) and keys evict each other; each gets its own digest.
            let (mut calls, mut computed) = (0, 0);
            for _ in 0..3 {
                for (cbor, parent, tokens) in &keys {
                    for _ in 0..2 {
                        let d = m.digest(*cbor, parent, tokens, || {
                            computed += 1;
                            fake_digest(*cbor, parent, tokens)
                        });
                        calls += 1;
                        assert_eq!(d, fake_digest(*cbor, parent, tokens));
                    }
                }
            }
            assert!(computed < calls, "no hit: the compare was not exercised");
        }
    }

    #[test]
    fn entries_that_were_hit_outlive_entries_that_were_not() {
        // One set. Each round: two keys used every round, then WAYS - 1 keys used once and
        // never again. Under LRU the new entries of a round would evict the two keys
        // every round.
        let mut m = HashMemo::with_sets(1);
        let p = [2u8; 32];
        let mut computed = Vec::new();
        let mut get = |m: &mut HashMemo, round: u32, t: u32| {
            m.digest(false, &p, &[t], || {
                computed.push((round, t));
                fake_digest(false, &p, &[t])
            })
        };
        for round in 0..20 {
            for hot in 0..2 {
                get(&mut m, round, hot);
            }
            for k in 1..WAYS as u32 {
                get(&mut m, round, 100 * k + round);
            }
        }
        // The two keys settle (hit since recorded, they are not replaced).
        let hot: Vec<_> = computed.iter().filter(|&&(_, t)| t < 2).collect();
        assert!(hot.iter().all(|&&(round, _)| round < 10), "{computed:?}");
        assert_eq!(computed.len(), hot.len() + (WAYS - 1) * 20);
    }

    #[test]
    fn when_keys_do_not_recur_only_a_sample_goes_through_the_table() {
        let mut m = HashMemo::with_sets(64);
        let parent = |i: u32, sampled: bool| {
            let mut p = [0u8; 32];
            p[..4].copy_from_slice(&i.to_le_bytes());
            p[31] = if sampled { 0 } else { 1 };
            p
        };
        let computed = std::cell::Cell::new(0);
        let get = |m: &mut HashMemo, p: [u8; 32], t: u32| {
            m.digest(false, &p, &[t], || {
                computed.set(computed.get() + 1);
                fake_digest(false, &p, &[t])
            })
        };
        // Keys seen once: the credit runs out and unsampled keys stop being recorded.
        for i in 0..1000 {
            get(&mut m, parent(i, false), i);
        }
        let valid = |m: &HashMemo| m.heads.iter().map(|h| h.valid.count_ones()).sum::<u32>();
        let recorded = valid(&m);
        assert!(recorded < 100, "{recorded}");
        get(&mut m, parent(5000, false), 0);
        assert_eq!(valid(&m), recorded);
        // A sampled key that recurs earns the credit back; then every key is served.
        for _ in 0..40 {
            get(&mut m, parent(7, true), 7);
        }
        let before = computed.get();
        for _ in 0..3 {
            get(&mut m, parent(6000, false), 1);
        }
        assert_eq!(computed.get() - before, 1);
    }

    #[test]
    fn long_blocks_are_not_recorded() {
        let mut m = HashMemo::with_sets(2);
        let p = [3u8; 32];
        let tokens: Vec<u32> = (0..MAX_TOKENS as u32 + 1).collect();
        let mut calls = 0;
        for _ in 0..2 {
            m.digest(false, &p, &tokens, || {
                calls += 1;
                fake_digest(false, &p, &tokens)
            });
        }
        assert_eq!(calls, 2);
        assert!(m.heads.is_empty() && m.entries.is_empty());
    }

    #[test]
    fn a_head_is_two_cache_lines_and_an_entry_two_more() {
        assert_eq!(std::mem::size_of::<Entry>(), 128);
        assert_eq!(std::mem::size_of::<Head>(), 128);
        assert_eq!(std::mem::align_of::<Head>(), 64);
    }
}
