//! Which workers hold one block hash, per medium: a bitset over worker slots per medium.
//! With up to 64 workers a bitset is one inline word, so a query step is an AND.

use smallvec::SmallVec;

/// Worker-slot bitset: inline for up to 64 slots.
pub type Bits = SmallVec<[u64; 1]>;

/// Holders of one hash: `(medium id, workers holding it on that medium)`; no empty sets.
#[derive(Debug, Default, Clone)]
pub struct Holders {
    media: SmallVec<[(u8, Bits); 1]>,
}

impl Holders {
    /// The holders on `medium` (empty slice when none).
    pub fn on(&self, medium: u8) -> &[u64] {
        self.media
            .iter()
            .find(|(m, _)| *m == medium)
            .map_or(&[], |(_, b)| b.as_slice())
    }

    pub fn set(&mut self, medium: u8, slot: u32) {
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
    }

    /// Clears one bit; returns true when no worker holds the hash on any medium any more.
    pub fn clear(&mut self, medium: u8, slot: u32) -> bool {
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
        self.media.is_empty()
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
