//! The chunk table's index: key hash -> chunk slot, open addressing with linear probing
//! in one array of 8-byte words (`hash tag << 32 | slot + 1`; 0 is the empty word, so a
//! new array comes zeroed from the allocator, untouched), at most half full. A lookup
//! reads one cache line of the array in the common case (a `hashbrown` table reads its
//! control bytes, then its slot array), and a caller that knows its keys ahead can
//! prefetch their lines ([`SlotIndex::prefetch`]). Deletion shifts the following run
//! back (no tombstones).

use crate::error::{Error, Result};

const EMPTY: u64 = 0;

/// The word of `slot` (below `u32::MAX`) under tag `t`: never [`EMPTY`].
#[inline]
fn word(t: u32, slot: u32) -> u64 {
    (u64::from(t) << 32) | u64::from(slot + 1)
}

/// The slot a (non-empty) word names.
#[inline]
fn slot_of(w: u64) -> u32 {
    (w as u32).wrapping_sub(1)
}

/// `n` empty words (n > 0), allocated fallibly and zeroed by the allocator: memory fresh
/// from the system is zero already, so nothing is written and the pages are faulted in
/// only when first used.
fn try_zeroed_words(n: usize) -> Result<Vec<u64>> {
    let oom = |e: &dyn std::fmt::Display| {
        Error::out_of_memory("the offload tier's chunk index", e.to_string())
    };
    let layout = std::alloc::Layout::array::<u64>(n.max(1)).map_err(|e| oom(&e))?;
    // SAFETY: the layout's size is nonzero (at least one 8-byte word).
    let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<u64>();
    if p.is_null() {
        return Err(oom(&"allocation refused"));
    }
    // SAFETY: `p` comes from the global allocator with the layout of `n.max(1)` u64s
    // (their size and alignment), which is the layout a `Vec<u64>` of that capacity
    // frees with; its first `n` words are initialised (zero bytes are a valid u64) and
    // the vector owns the allocation from here on.
    Ok(unsafe { Vec::from_raw_parts(p, n, n.max(1)) })
}

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

    /// The slot named by the word where a lookup of hash `h` starts, when its tag is
    /// `h`'s (the likely answer of the lookup, unconfirmed: a caller prefetches that
    /// slot's line). Reads the word, so its line should have been prefetched earlier.
    #[inline]
    pub fn first_candidate(&self, h: u64) -> Option<u32> {
        let w = *self.words.get(self.home_of(h))?;
        (w != EMPTY && (w >> 32) as u32 == tag(h)).then_some(slot_of(w))
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
            if (w >> 32) as u32 == t && eq(slot_of(w)) {
                return Some(slot_of(w));
            }
            i = (i + 1) & mask;
        }
    }

    /// Room for `n` more entries (fallible; nothing changes on failure).
    #[inline]
    pub fn try_reserve(&mut self, n: usize) -> Result<()> {
        self.try_reserve_upto(n, usize::MAX)
    }

    /// Room for `n` more entries in an index that never holds more than `most` (a bound
    /// the caller knows: a table's capacity). A growth whose array would be at least half
    /// the largest `most` can need takes that largest array at once: every array a
    /// growth leaves behind is memory touched once and returned, and this skips the
    /// largest of them (half the final array) at the price of holding the final array
    /// from an eighth to a quarter of `most` entries on.
    #[inline]
    pub fn try_reserve_upto(&mut self, n: usize, most: usize) -> Result<()> {
        let need = self.len.saturating_add(n);
        if need.saturating_mul(2) <= self.words.len() {
            return Ok(());
        }
        self.grow(need, most)
    }

    /// The bits of the smallest array that holds `n` entries at most half full.
    fn bits_for(n: usize) -> Result<u32> {
        let mut bits = 4;
        while (1usize << bits) < n.saturating_mul(2) {
            bits += 1;
            if bits > MAX_BITS {
                return Err(Error::out_of_memory(
                    "the offload tier's chunk index",
                    "more than 2^31 entries",
                ));
            }
        }
        Ok(bits)
    }

    /// Grows the array for `need` entries (at most `most` ever).
    #[cold]
    fn grow(&mut self, need: usize, most: usize) -> Result<()> {
        let mut bits = Self::bits_for(need)?.max(self.bits);
        if let Ok(last) = Self::bits_for(most.max(need)) {
            if last <= bits + 1 {
                bits = last;
            }
        }
        let words = try_zeroed_words(1usize << bits)?;
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

    /// Adds `slot` (below `u32::MAX`) under hash `h` (room reserved by `try_reserve`;
    /// grows otherwise).
    #[inline]
    pub fn insert(&mut self, h: u64, slot: u32) -> Result<()> {
        if slot == u32::MAX {
            return Err(Error::InvalidArgument(
                "the chunk index holds slots below 2^32 - 1".to_owned(),
            ));
        }
        self.try_reserve(1)?;
        let (t, mask) = (tag(h), self.mask());
        let mut i = self.home(t);
        while self.words[i] != EMPTY {
            i = (i + 1) & mask;
        }
        self.words[i] = word(t, slot);
        self.len += 1;
        Ok(())
    }

    /// Removes `slot` stored under hash `h`; false when absent.
    pub fn remove(&mut self, h: u64, slot: u32) -> bool {
        if self.words.is_empty() {
            return false;
        }
        let (t, mask) = (tag(h), self.mask());
        if slot == u32::MAX {
            return false;
        }
        let want = word(t, slot);
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

/// How many steps ahead of its use [`pipelined`] runs an item's first and second stage.
const FAR: usize = 16;
const NEAR: usize = 6;

/// Runs `body` on each item in order, with two prefetch stages ahead of it: `far(x)`
/// `FAR` items before `body(x)` (typically: fetch the line that leads to the item's
/// data), `near(x)` `NEAR` items before (typically: read that line, fetch the data it
/// names). Each stage sees every item once, in order, before `body` does. Keeping the
/// fetches a few items ahead, rather than issuing all of them first, keeps the misses
/// overlapping without letting the early lines fall out of the cache. `ctx` is what
/// the stages read and the body may change (a table the body inserts into).
#[inline]
pub fn pipelined<C, T>(
    ctx: &mut C,
    items: &mut [T],
    far: impl Fn(&C, &T),
    near: impl Fn(&C, &T),
    mut body: impl FnMut(&mut C, &mut T),
) {
    let n = items.len();
    items[..n.min(FAR)].iter().for_each(|x| far(ctx, x));
    items[..n.min(NEAR)].iter().for_each(|x| near(ctx, x));
    for i in 0..n {
        if let Some(x) = items.get(i + FAR) {
            far(ctx, x);
        }
        if let Some(x) = items.get(i + NEAR) {
            near(ctx, x);
        }
        body(ctx, &mut items[i]);
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
    fn pipelined_runs_each_stage_once_per_item_and_ahead_of_the_body() {
        for n in [0usize, 1, 5, 6, 7, 16, 17, 40] {
            let log = std::cell::RefCell::new(Vec::new());
            let mut items: Vec<usize> = (0..n).collect();
            let mut bodies = 0;
            pipelined(
                &mut bodies,
                &mut items,
                |_, &i| log.borrow_mut().push(('f', i)),
                |_, &i| log.borrow_mut().push(('n', i)),
                |bodies, i| {
                    log.borrow_mut().push(('b', *i));
                    *i += 100;
                    *bodies += 1;
                },
            );
            assert_eq!(bodies, n);
            assert_eq!(items, (100..100 + n).collect::<Vec<_>>());
            let log = log.into_inner();
            for stage in ['f', 'n', 'b'] {
                let got: Vec<usize> = log.iter().filter(|e| e.0 == stage).map(|e| e.1).collect();
                assert_eq!(got, (0..n).collect::<Vec<_>>(), "stage {stage}, n {n}");
            }
            let at = |e: (char, usize)| log.iter().position(|&x| x == e);
            for i in 0..n {
                assert!(at(('f', i)) < at(('n', i)) && at(('n', i)) < at(('b', i)));
                // Ahead, but not all at once: item i's first stage comes before the body
                // of the item FAR before it, and after the body of the one before that.
                if i >= FAR {
                    assert!(at(('f', i)) < at(('b', i - FAR)));
                }
                if i > FAR {
                    assert!(at(('f', i)) > at(('b', i - FAR - 1)));
                }
            }
        }
    }

    #[test]
    fn first_candidate_names_the_home_word_when_its_tag_matches() {
        let mut ix = SlotIndex::default();
        assert_eq!(ix.first_candidate(7 << 32), None);
        ix.insert(0xABCD_0000_0000_0001, 5)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ix.first_candidate(0xABCD_0000_0000_0001), Some(5));
        // Same tag, other low bits: the tag is all the word holds.
        assert_eq!(ix.first_candidate(0xABCD_0000_0000_0002), Some(5));
        assert_eq!(ix.first_candidate(0x1234_0000_0000_0001), None);
    }

    /// The array lengths an index takes as `n` entries arrive one at a time.
    fn sizes(n: u32, most: usize) -> Vec<usize> {
        let mut ix = SlotIndex::default();
        let mut seen = Vec::new();
        for i in 0..n {
            ix.try_reserve_upto(1, most)
                .unwrap_or_else(|e| panic!("{e}"));
            ix.insert(u64::from(i).wrapping_mul(0x9E37_79B9_7F4A_7C15), i)
                .unwrap_or_else(|e| panic!("{e}"));
            if seen.last() != Some(&ix.words.len()) {
                seen.push(ix.words.len());
            }
        }
        assert!(ix.consistent());
        seen
    }

    #[test]
    fn a_bounded_index_skips_the_array_before_its_last() {
        // Unbounded: doubling, 16 words for up to 8 entries and so on.
        assert_eq!(
            sizes(1000, usize::MAX),
            [16, 32, 64, 128, 256, 512, 1024, 2048]
        );
        // At most 1000 entries need 2048 words: the growth that would take 1024 takes
        // 2048 at once (from 257 entries on), and nothing beyond.
        assert_eq!(sizes(1000, 1000), [16, 32, 64, 128, 256, 512, 2048]);
        // A bound is no cap: past 100 entries (256 words, taken at 33) the index grows
        // by doubling for the entries that keep coming.
        assert_eq!(sizes(1000, 100), [16, 32, 64, 256, 512, 1024, 2048]);
    }

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
