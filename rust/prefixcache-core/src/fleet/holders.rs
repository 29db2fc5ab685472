//! Which workers hold one block hash, per medium: a bitset over worker slots per medium,
//! and the copy counts of the rare holders with more than one copy. With up to 64
//! workers a bitset is one inline word, so a query step is an AND; applying an event is
//! one hash-table probe per block hash.

use smallvec::SmallVec;

/// Worker-slot bitset: inline for up to 64 slots.
pub type Bits = SmallVec<[u64; 1]>;

/// Holders of one hash: `(medium id, workers holding it on that medium)`; no empty sets.
#[derive(Debug, Default, Clone)]
pub struct Holders {
    media: SmallVec<[(u8, Bits); 1]>,
    /// `(medium, slot, copies)` of every holder with more than one copy (vLLM may cache
    /// one hash on several blocks); a set bit without an entry here is one copy.
    copies: Option<Box<[(u8, u32, u32)]>>,
}

/// What removing one copy of a hash did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// The worker did not hold the hash on that medium.
    Unknown,
    /// One of several copies went; the worker still holds the hash.
    Copy,
    /// The last copy went: the worker no longer holds the hash on that medium.
    Last,
}

impl Holders {
    /// The holders on `medium` (empty slice when none).
    pub fn on(&self, medium: u8) -> &[u64] {
        self.media
            .iter()
            .find(|(m, _)| *m == medium)
            .map_or(&[], |(_, b)| b.as_slice())
    }

    /// Whether `slot` holds the hash on `medium`.
    pub fn holds(&self, medium: u8, slot: u32) -> bool {
        let (w, bit) = ((slot / 64) as usize, slot % 64);
        self.on(medium)
            .get(w)
            .is_some_and(|word| word & (1 << bit) != 0)
    }

    /// Adds one copy; returns true when `slot` did not hold the hash on `medium` before.
    pub fn add(&mut self, medium: u8, slot: u32) -> bool {
        if self.holds(medium, slot) {
            let found = self
                .copies
                .as_deref_mut()
                .and_then(|cs| cs.iter_mut().find(|c| c.0 == medium && c.1 == slot));
            match found {
                Some(c) => c.2 += 1,
                None => {
                    let mut cs = self.copies.take().map(Vec::from).unwrap_or_default();
                    cs.push((medium, slot, 2));
                    self.copies = Some(cs.into_boxed_slice());
                }
            }
            return false;
        }
        let (w, bit) = ((slot / 64) as usize, slot % 64);
        let bits = match self.media.iter().position(|(m, _)| *m == medium) {
            Some(i) => &mut self.media[i].1,
            None => {
                self.media.push((medium, Bits::new()));
                let last = self.media.len() - 1;
                &mut self.media[last].1
            }
        };
        if bits.len() <= w {
            bits.resize(w + 1, 0);
        }
        bits[w] |= 1 << bit;
        true
    }

    /// Removes one copy.
    pub fn remove(&mut self, medium: u8, slot: u32) -> Removal {
        if !self.holds(medium, slot) {
            return Removal::Unknown;
        }
        if let Some(cs) = self.copies.as_deref_mut() {
            if let Some(i) = cs.iter().position(|c| c.0 == medium && c.1 == slot) {
                cs[i].2 -= 1;
                if cs[i].2 == 1 {
                    self.drop_copies(|c| c.0 == medium && c.1 == slot);
                }
                return Removal::Copy;
            }
        }
        self.clear_bit(medium, slot);
        Removal::Last
    }

    /// Drops every copy `slot` holds; `on_pair(medium)` once per medium it held the hash on.
    pub fn clear_slot(&mut self, slot: u32, mut on_pair: impl FnMut(u8)) {
        let held: SmallVec<[u8; 4]> = self
            .media
            .iter()
            .map(|(m, _)| *m)
            .filter(|&m| self.holds(m, slot))
            .collect();
        for m in held {
            self.clear_bit(m, slot);
            on_pair(m);
        }
        self.drop_copies(|c| c.1 == slot);
    }

    /// Removes the copy entries matching `gone` (rare: the table is reallocated).
    fn drop_copies(&mut self, gone: impl Fn(&(u8, u32, u32)) -> bool) {
        if let Some(cs) = self.copies.take() {
            let kept: Vec<_> = cs.iter().copied().filter(|c| !gone(c)).collect();
            if !kept.is_empty() {
                self.copies = Some(kept.into_boxed_slice());
            }
        }
    }

    fn clear_bit(&mut self, medium: u8, slot: u32) {
        let (w, bit) = ((slot / 64) as usize, slot % 64);
        if let Some(i) = self.media.iter().position(|(m, _)| *m == medium) {
            let bits = &mut self.media[i].1;
            if let Some(word) = bits.get_mut(w) {
                *word &= !(1 << bit);
            }
            while bits.last() == Some(&0) {
                bits.pop();
            }
            if bits.is_empty() {
                self.media.swap_remove(i);
            }
        }
    }

    /// The copies `slot` holds on `medium` (0 when it does not hold the hash there).
    pub fn copies(&self, medium: u8, slot: u32) -> u32 {
        if !self.holds(medium, slot) {
            return 0;
        }
        self.copies
            .as_ref()
            .and_then(|cs| cs.iter().find(|c| c.0 == medium && c.1 == slot))
            .map_or(1, |c| c.2)
    }

    /// The `(medium, slot, copies)` entries of holders with several copies.
    pub fn multi_copies(&self) -> &[(u8, u32, u32)] {
        self.copies.as_deref().unwrap_or(&[])
    }

    pub fn media(&self) -> impl Iterator<Item = (u8, &[u64])> {
        self.media.iter().map(|(m, b)| (*m, b.as_slice()))
    }

    pub fn is_empty(&self) -> bool {
        self.media.is_empty()
    }
}

/// Calls `f(slot)` for every set bit of `word` number `w`.
#[inline]
pub fn for_each_bit(w: usize, mut word: u64, mut f: impl FnMut(usize)) {
    while word != 0 {
        let b = word.trailing_zeros() as usize;
        f(w * 64 + b);
        word &= word - 1;
    }
}
