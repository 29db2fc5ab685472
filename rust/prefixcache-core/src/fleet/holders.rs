//! Which workers hold one block hash, per medium: a bitset over worker slots per medium,
//! and the copy counts of the holders with more than one copy. Applying an event is one
//! hash-table probe per block hash, so the table's size decides its speed: the common
//! entry (one medium, the first 64 slots, one copy each) is one inline word, 16 bytes in
//! all; anything else moves to a boxed record.

use smallvec::{smallvec, SmallVec};

/// Worker-slot bitset: inline for up to 64 slots.
pub type Bits = SmallVec<[u64; 1]>;

/// Holders of one hash; never an empty set while listed in the index.
#[derive(Debug, Default, Clone)]
pub struct Holders {
    /// Slots 0..64 holding the hash on medium 0, one copy each; 0 when `more` is used.
    first: u64,
    /// Every holding, when one is on another medium, on a slot from 64, or several copies.
    more: Option<Box<More>>,
}

#[derive(Debug, Default, Clone)]
struct More {
    /// `(medium id, workers holding it on that medium)`; no empty sets.
    media: SmallVec<[(u8, Bits); 1]>,
    /// `(medium, slot, copies)` of every holder with more than one copy (vLLM may cache
    /// one hash on several blocks); a set bit without an entry here is one copy.
    copies: Vec<(u8, u32, u32)>,
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

fn word_bit(slot: u32) -> (usize, u32) {
    ((slot / 64) as usize, slot % 64)
}

impl More {
    fn bits_mut(&mut self, medium: u8) -> &mut Bits {
        let i = match self.media.iter().position(|(m, _)| *m == medium) {
            Some(i) => i,
            None => {
                self.media.push((medium, Bits::new()));
                self.media.len() - 1
            }
        };
        &mut self.media[i].1
    }

    fn clear_bit(&mut self, medium: u8, slot: u32) {
        let (w, bit) = word_bit(slot);
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
}

impl Holders {
    /// The holders on `medium` (empty slice when none).
    pub fn on(&self, medium: u8) -> &[u64] {
        match &self.more {
            Some(more) => more
                .media
                .iter()
                .find(|(m, _)| *m == medium)
                .map_or(&[], |(_, b)| b.as_slice()),
            None if medium == 0 && self.first != 0 => std::slice::from_ref(&self.first),
            None => &[],
        }
    }

    /// Whether `slot` holds the hash on `medium`.
    pub fn holds(&self, medium: u8, slot: u32) -> bool {
        let (w, bit) = word_bit(slot);
        self.on(medium)
            .get(w)
            .is_some_and(|word| word & (1 << bit) != 0)
    }

    /// Moves the inline word into the boxed record (before a holding it cannot express).
    fn promote(&mut self) -> &mut More {
        let first = std::mem::take(&mut self.first);
        self.more.get_or_insert_with(|| {
            let media = if first != 0 {
                smallvec![(0, smallvec![first])]
            } else {
                SmallVec::new()
            };
            Box::new(More {
                media,
                copies: Vec::new(),
            })
        })
    }

    /// Back to the inline word when the record holds nothing it alone can express.
    fn demote(&mut self) {
        let Some(more) = &self.more else { return };
        if !more.copies.is_empty() {
            return;
        }
        let first = match more.media.as_slice() {
            [] => 0,
            [(0, bits)] if bits.len() == 1 => bits[0],
            _ => return,
        };
        self.first = first;
        self.more = None;
    }

    /// Adds one copy; returns true when `slot` did not hold the hash on `medium` before.
    pub fn add(&mut self, medium: u8, slot: u32) -> bool {
        if self.more.is_none() && medium == 0 && slot < 64 && self.first & (1 << slot) == 0 {
            self.first |= 1 << slot;
            return true;
        }
        let held = self.holds(medium, slot);
        let more = self.promote();
        if held {
            match more
                .copies
                .iter_mut()
                .find(|c| c.0 == medium && c.1 == slot)
            {
                Some(c) => c.2 += 1,
                None => more.copies.push((medium, slot, 2)),
            }
            return false;
        }
        let (w, bit) = word_bit(slot);
        let bits = more.bits_mut(medium);
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
        let Some(more) = &mut self.more else {
            self.first &= !(1 << slot); // held inline: medium 0, slot < 64
            return Removal::Last;
        };
        let out = match more
            .copies
            .iter()
            .position(|c| c.0 == medium && c.1 == slot)
        {
            Some(i) => {
                more.copies[i].2 -= 1;
                if more.copies[i].2 == 1 {
                    more.copies.swap_remove(i);
                }
                Removal::Copy
            }
            None => {
                more.clear_bit(medium, slot);
                Removal::Last
            }
        };
        self.demote();
        out
    }

    /// Drops every copy `slot` holds; `on_pair(medium)` once per medium it held the hash on.
    pub fn clear_slot(&mut self, slot: u32, mut on_pair: impl FnMut(u8)) {
        let Some(more) = &mut self.more else {
            if slot < 64 && self.first & (1 << slot) != 0 {
                self.first &= !(1 << slot);
                on_pair(0);
            }
            return;
        };
        let (w, bit) = word_bit(slot);
        let held: SmallVec<[u8; 4]> = more
            .media
            .iter()
            .filter(|(_, b)| b.get(w).is_some_and(|word| word & (1 << bit) != 0))
            .map(|(m, _)| *m)
            .collect();
        for m in held {
            more.clear_bit(m, slot);
            on_pair(m);
        }
        more.copies.retain(|c| c.1 != slot);
        self.demote();
    }

    /// The copies `slot` holds on `medium` (0 when it does not hold the hash there).
    pub fn copies(&self, medium: u8, slot: u32) -> u32 {
        if !self.holds(medium, slot) {
            return 0;
        }
        self.multi_copies()
            .iter()
            .find(|c| c.0 == medium && c.1 == slot)
            .map_or(1, |c| c.2)
    }

    /// The `(medium, slot, copies)` entries of holders with several copies.
    pub fn multi_copies(&self) -> &[(u8, u32, u32)] {
        self.more.as_ref().map_or(&[], |m| m.copies.as_slice())
    }

    /// Whether the boxed record is in use although the inline word could hold everything
    /// (an invariant check: `demote` runs after every removal).
    pub fn needlessly_boxed(&self) -> bool {
        self.more.as_ref().is_some_and(|m| {
            m.copies.is_empty()
                && match m.media.as_slice() {
                    [] => true,
                    [(0, bits)] => bits.len() == 1,
                    _ => false,
                }
        })
    }

    pub fn media(&self) -> impl Iterator<Item = (u8, &[u64])> {
        type Row<'a> = (u8, &'a [u64]);
        let (inline, rest): (Option<Row<'_>>, &[(u8, Bits)]) = match &self.more {
            Some(m) => (None, m.media.as_slice()),
            None if self.first != 0 => (Some((0, std::slice::from_ref(&self.first))), &[]),
            None => (None, &[]),
        };
        inline
            .into_iter()
            .chain(rest.iter().map(|(m, b)| (*m, b.as_slice())))
    }

    pub fn is_empty(&self) -> bool {
        match &self.more {
            Some(m) => m.media.is_empty(),
            None => self.first == 0,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_stay_small() {
        assert_eq!(std::mem::size_of::<Holders>(), 16);
    }

    #[test]
    fn copies_media_and_far_slots_box_and_unbox() {
        let mut h = Holders::default();
        assert!(h.add(0, 3));
        assert!(h.more.is_none());
        assert!(!h.add(0, 3)); // a second copy boxes
        assert_eq!(h.copies(0, 3), 2);
        assert_eq!(h.remove(0, 3), Removal::Copy);
        assert!(h.more.is_none() && h.holds(0, 3)); // back inline
        assert!(h.add(1, 3) && h.add(0, 70)); // another medium, a slot past 64
        assert_eq!(h.on(0), &[1 << 3, 1 << 6]);
        assert_eq!(h.remove(0, 70), Removal::Last);
        assert_eq!(h.remove(1, 3), Removal::Last);
        assert!(h.more.is_none() && h.holds(0, 3));
        assert_eq!(h.remove(2, 3), Removal::Unknown);
        let mut pairs = Vec::new();
        h.add(1, 3);
        h.clear_slot(3, |m| pairs.push(m));
        pairs.sort_unstable();
        assert_eq!(pairs, vec![0, 1]);
        assert!(h.is_empty() && h.more.is_none());
    }
}
