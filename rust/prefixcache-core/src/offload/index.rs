//! The chunk table's index: key hash -> chunk slot, open addressing with linear probing
//! in one array of 8-byte words (`hash tag << 32 | slot`), at most half full. A lookup
//! reads one cache line of the array in the common case (a `hashbrown` table reads its
//! control bytes, then its slot array), and a caller that knows its keys ahead can
//! prefetch their lines ([`SlotIndex::prefetch`]). Deletion shifts the following run
//! back (no tombstones).

use crate::error::{Error, Result};

const EMPTY: u64 = u64::MAX;

/// The largest array: 2^31 words.
const MAX_BITS: u32 = 31;

#[derive(Debug, Clone, Default)]
pub struct SlotIndex {
    words: Vec<u64>,
    /// log2 of the array length (0 when empty).
    bits: u32,
    len: usize,
}

/// The word's tag: the top 32 bits of the key hash (the home bucket is its top `bits`).
#[inline]
fn tag(h: u64) -> u32 {
    (h >> 32) as u32
}

impl SlotIndex {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    fn mask(&self) -> usize {
        self.words.len().wrapping_sub(1)
    }

    #[inline]
    fn home(&self, t: u32) -> usize {
        // bits in 4..=31: the shift is in 1..=28.
        (t >> (32 - self.bits)) as usize
    }

    /// Hints the CPU to fetch the line where a lookup of hash `h` starts.
    #[inline]
    pub fn prefetch(&self, h: u64) {
        if let Some(w) = self.words.get(self.home_of(h)) {
            prefetch(w);
        }
    }

    #[inline]
    fn home_of(&self, h: u64) -> usize {
        if self.words.is_empty() {
            0
        } else {
            self.home(tag(h))
        }
    }

    /// The slot stored under hash `h` for which `eq` holds.
    #[inline]
    pub fn find(&self, h: u64, eq: impl Fn(u32) -> bool) -> Option<u32> {
        if self.words.is_empty() {
            return None;
        }
        let (t, mask) = (tag(h), self.mask());
        let mut i = self.home(t);
        loop {
            let w = self.words[i];
            if w == EMPTY {
                return None;
            }
            if (w >> 32) as u32 == t && eq(w as u32) {
                return Some(w as u32);
            }
            i = (i + 1) & mask;
        }
    }

    /// Room for `n` more entries (fallible; nothing changes on failure).
    #[inline]
    pub fn try_reserve(&mut self, n: usize) -> Result<()> {
        let need = self.len.saturating_add(n);
        if need.saturating_mul(2) <= self.words.len() {
            return Ok(());
        }
        self.grow(need)
    }

    /// Grows the array for `need` entries.
    #[cold]
    fn grow(&mut self, need: usize) -> Result<()> {
        let mut bits = self.bits.max(4);
        while (1usize << bits) < need.saturating_mul(2) {
            bits += 1;
            if bits > MAX_BITS {
                return Err(Error::out_of_memory(
                    "the offload tier's chunk index",
                    "more than 2^31 entries",
                ));
            }
        }
        let mut words: Vec<u64> = Vec::new();
        words
            .try_reserve_exact(1usize << bits)
            .map_err(|e| Error::out_of_memory("the offload tier's chunk index", e))?;
        words.resize(1usize << bits, EMPTY);
        let old = std::mem::replace(&mut self.words, words);
        self.bits = bits;
        let mask = self.mask();
        for w in old.into_iter().filter(|&w| w != EMPTY) {
            let mut i = self.home((w >> 32) as u32);
            while self.words[i] != EMPTY {
                i = (i + 1) & mask;
            }
            self.words[i] = w;
        }
        Ok(())
    }

    /// Adds `slot` under hash `h` (room reserved by `try_reserve`; grows otherwise).
    pub fn insert(&mut self, h: u64, slot: u32) -> Result<()> {
        self.try_reserve(1)?;
        let (t, mask) = (tag(h), self.mask());
        let mut i = self.home(t);
        while self.words[i] != EMPTY {
            i = (i + 1) & mask;
        }
        self.words[i] = (u64::from(t) << 32) | u64::from(slot);
        self.len += 1;
        Ok(())
    }

    /// Removes `slot` stored under hash `h`; false when absent.
    pub fn remove(&mut self, h: u64, slot: u32) -> bool {
        if self.words.is_empty() {
            return false;
        }
        let (t, mask) = (tag(h), self.mask());
        let want = (u64::from(t) << 32) | u64::from(slot);
        let mut i = self.home(t);
        loop {
            let w = self.words[i];
            if w == EMPTY {
                return false;
            }
            if w == want {
                break;
            }
            i = (i + 1) & mask;
        }
        // Shift the rest of the run back over the hole: an entry moves when the hole
        // lies between its home and its place.
        let mut hole = i;
        let mut j = (i + 1) & mask;
        loop {
            let w = self.words[j];
            if w == EMPTY {
                break;
            }
            let home = self.home((w >> 32) as u32);
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.words[hole] = w;
                hole = j;
            }
            j = (j + 1) & mask;
        }
        self.words[hole] = EMPTY;
        self.len -= 1;
        true
    }

    pub fn clear(&mut self) {
        self.words.clear();
        self.words.shrink_to_fit();
        self.bits = 0;
        self.len = 0;
    }

    /// Every entry is reachable from its home (no empty word between), and the count
    /// is right.
    pub fn consistent(&self) -> bool {
        let mask = self.mask();
        let mut n = 0;
        for (i, &w) in self.words.iter().enumerate() {
            if w == EMPTY {
                continue;
            }
            n += 1;
            let mut at = self.home((w >> 32) as u32);
            while at != i {
                if self.words[at] == EMPTY {
                    return false;
                }
                at = (at + 1) & mask;
            }
        }
        n == self.len
    }
}

/// Hints the CPU to bring `x`'s cache line in.
#[inline]
pub fn prefetch<T>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it reads nothing into the program, cannot
    // fault, and `x` is a valid reference anyway.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (x as *const T).cast::<i8>(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn matches_a_map_under_random_inserts_and_removes() {
        let mut ix = SlotIndex::default();
        let mut model: HashMap<u32, u64> = HashMap::new();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for step in 0..200_000u32 {
            let r = next();
            if r % 3 != 0 || model.is_empty() {
                // Some hashes repeat (equal tags, different slots).
                let h = match model.values().next() {
                    Some(&h) if r % 5 == 0 => h,
                    _ => next(),
                };
                let slot = step;
                ix.insert(h, slot).unwrap_or_else(|e| panic!("{e}"));
                model.insert(slot, h);
            } else {
                let (&slot, &h) = model.iter().next().unwrap_or_else(|| unreachable!());
                assert!(ix.remove(h, slot));
                model.remove(&slot);
            }
            if step % 10_000 == 0 {
                assert!(ix.consistent());
            }
        }
        assert_eq!(ix.len(), model.len());
        for (&slot, &h) in &model {
            assert_eq!(ix.find(h, |s| s == slot), Some(slot));
        }
        assert!(ix.consistent());
    }
}
