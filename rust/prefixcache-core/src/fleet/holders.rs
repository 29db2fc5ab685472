//! Which workers hold one block hash, per medium: a bitset over worker slots per medium,
//! and the copy counts of the holders with more than one copy. Applying an event is one
//! hash-table probe per block hash, so the table's size decides its speed: the common
//! entries fit in two inline words, 16 bytes in all (medium 0 on slots 0..63, medium 1
//! on slots 0..64, one copy each: a device tier and a host tier behind it, as the
//! fleet's engines with a CPU tier publish them); anything else moves to a boxed record.

use std::mem::ManuallyDrop;

use smallvec::{smallvec, CollectionAllocErr, SmallVec};

use crate::error::{try_box, Error, Result};

/// Worker-slot bitset: inline for up to 64 slots.
pub type Bits = SmallVec<[u64; 1]>;

/// In [`Holders::first`]: the second word holds medium 1's bits (not the boxed record).
const M1_INLINE: u64 = 1 << 63;
/// Slots of medium 0 held in the inline word (bit 63 is [`M1_INLINE`]).
const M0_INLINE_SLOTS: u32 = 63;

/// Holders of one hash; never an empty set while listed in the index.
pub struct Holders {
    /// Medium 0's slots 0..63 (one copy each), and [`M1_INLINE`]; 0 when boxed.
    first: u64,
    /// Medium 1's slots 0..64 when `first` has [`M1_INLINE`], else the boxed record.
    second: Second,
}

/// The second word of [`Holders`]; which field is live is recorded in `first`
/// ([`M1_INLINE`]), and only [`Holders`]' methods below read or write it.
union Second {
    /// Medium 1's slots 0..64 holding the hash, one copy each; never 0 while live.
    m1: u64,
    /// Every holding, when one is beyond the inline words (another medium, a slot past
    /// them, several copies); `None`: no more holders.
    more: ManuallyDrop<Option<Box<More>>>,
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

/// The words of one medium's holder bitset ([`Holders::on`]): no trailing zero word.
pub enum Words<'a> {
    Inline([u64; 1]),
    Boxed(&'a [u64]),
}

impl Words<'_> {
    pub const NONE: Words<'static> = Words::Inline([0]);

    pub fn as_slice(&self) -> &[u64] {
        match self {
            Words::Inline([0]) => &[],
            Words::Inline(w) => w,
            Words::Boxed(s) => s,
        }
    }
}

fn oom_small(e: CollectionAllocErr) -> Error {
    Error::out_of_memory("the fleet index's holders", format!("{e:?}"))
}

fn word_bit(slot: u32) -> (usize, u32) {
    ((slot / 64) as usize, slot % 64)
}

impl More {
    /// Room for one more holding on `medium` in word `w` of its bitset (`held`: the slot
    /// holds the hash there already, so the holding is one more copy).
    fn reserve_holding(&mut self, medium: u8, w: usize, held: bool) -> Result<()> {
        if held {
            self.copies
                .try_reserve(1)
                .map_err(|e| Error::out_of_memory("the fleet index's holders", e))?;
            return Ok(());
        }
        match self.media.iter_mut().find(|(m, _)| *m == medium) {
            Some((_, bits)) => bits
                .try_reserve((w + 1).saturating_sub(bits.len()))
                .map_err(oom_small),
            None => {
                self.media.try_reserve(1).map_err(oom_small)?;
                let mut bits = Bits::new();
                bits.try_reserve(w + 1).map_err(oom_small)?;
                // Kept empty, so that `bits_mut` finds room; no holder has no bits, as
                // `add` sets the slot's bit at once.
                self.media.push((medium, bits));
                Ok(())
            }
        }
    }

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

impl Default for Holders {
    fn default() -> Self {
        Holders {
            first: 0,
            second: Second {
                more: ManuallyDrop::new(None),
            },
        }
    }
}

impl Drop for Holders {
    fn drop(&mut self) {
        if self.first & M1_INLINE == 0 {
            // SAFETY: without M1_INLINE the live field is `more` (the invariant every
            // method keeps), dropped once here and never read again.
            unsafe { ManuallyDrop::drop(&mut self.second.more) }
        }
    }
}

impl Clone for Holders {
    fn clone(&self) -> Self {
        let second = match self.m1_inline() {
            Some(m1) => Second { m1 },
            None => Second {
                more: ManuallyDrop::new(self.more().map(|m| Box::new(m.clone()))),
            },
        };
        Holders {
            first: self.first,
            second,
        }
    }
}

impl std::fmt::Debug for Holders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Holders")
            .field("m0", &(self.first & !M1_INLINE))
            .field("m1", &self.m1_inline())
            .field("more", &self.more())
            .finish()
    }
}

impl Holders {
    // -- the representation: every read and write of `second` is here -----------------
    /// Medium 1's inline bits, when the second word holds them.
    #[inline]
    fn m1_inline(&self) -> Option<u64> {
        if self.first & M1_INLINE != 0 {
            // SAFETY: M1_INLINE is set exactly while `m1` is the live field (written by
            // `set_m1`, cleared with it by `clear_second`); u64 has no
            // invalid bit patterns.
            Some(unsafe { self.second.m1 })
        } else {
            None
        }
    }

    /// The boxed record, if any.
    #[inline]
    fn more(&self) -> Option<&More> {
        if self.first & M1_INLINE != 0 {
            return None;
        }
        // SAFETY: without M1_INLINE the live field is `more` (see `m1_inline`).
        unsafe { self.second.more.as_deref() }
    }

    #[inline]
    fn more_mut(&mut self) -> Option<&mut More> {
        if self.first & M1_INLINE != 0 {
            return None;
        }
        // SAFETY: as in `more`; `&mut self` makes the borrow unique.
        unsafe { (*self.second.more).as_deref_mut() }
    }

    /// Empties the second word (dropping a boxed record) and clears M1_INLINE.
    fn clear_second(&mut self) {
        if self.first & M1_INLINE == 0 {
            // SAFETY: `more` is live (see `m1_inline`); it is dropped once, then
            // overwritten below.
            unsafe { ManuallyDrop::drop(&mut self.second.more) }
        }
        self.second = Second {
            more: ManuallyDrop::new(None),
        };
        self.first &= !M1_INLINE;
    }

    /// Medium 1's inline bits (`m1 != 0`), replacing what the second word held.
    #[inline]
    fn set_m1(&mut self, m1: u64) {
        if self.first & M1_INLINE == 0 {
            self.clear_second();
        }
        self.second = Second { m1 };
        self.first |= M1_INLINE;
    }

    // -- holdings ------------------------------------------------------------------
    /// The holders on `medium` (no words when none).
    pub fn on(&self, medium: u8) -> Words<'_> {
        if let Some(more) = self.more() {
            return more
                .media
                .iter()
                .find(|(m, _)| *m == medium)
                .map_or(Words::NONE, |(_, b)| Words::Boxed(b.as_slice()));
        }
        match medium {
            0 => Words::Inline([self.first & !M1_INLINE]),
            1 => Words::Inline([self.m1_inline().unwrap_or(0)]),
            _ => Words::NONE,
        }
    }

    /// Whether `slot` holds the hash on `medium`.
    pub fn holds(&self, medium: u8, slot: u32) -> bool {
        let (w, bit) = word_bit(slot);
        self.on(medium)
            .as_slice()
            .get(w)
            .is_some_and(|word| word & (1 << bit) != 0)
    }

    /// The inline words `(m0, m1)` that express `more`, if they can.
    fn inline_form(more: &More) -> Option<(u64, u64)> {
        if !more.copies.is_empty() {
            return None;
        }
        let (mut m0, mut m1) = (0, 0);
        for (m, bits) in &more.media {
            match (m, bits.as_slice()) {
                (0, [w]) if w & M1_INLINE == 0 => m0 = *w,
                (1, [w]) => m1 = *w,
                _ => return None,
            }
        }
        Some((m0, m1))
    }

    /// Back to the inline words when the record holds nothing they cannot express.
    fn demote(&mut self) {
        let Some((m0, m1)) = self.more().and_then(Self::inline_form) else {
            return;
        };
        self.clear_second();
        self.first = m0;
        if m1 != 0 {
            self.set_m1(m1);
        }
    }

    /// Adds one copy; returns true when `slot` did not hold the hash on `medium` before.
    /// What the holding needs (a boxed record, room in its lists) is allocated before
    /// anything changes: on `Err` the holders are as they were.
    pub fn try_add(&mut self, medium: u8, slot: u32) -> Result<bool> {
        if self.more().is_none() {
            let bit = 1u64 << (slot % 64);
            match medium {
                0 if slot < M0_INLINE_SLOTS && self.first & bit == 0 => {
                    self.first |= bit;
                    return Ok(true);
                }
                1 if slot < 64 => {
                    let m1 = self.m1_inline().unwrap_or(0);
                    if m1 & bit == 0 {
                        self.set_m1(m1 | bit);
                        return Ok(true);
                    }
                }
                _ => {}
            }
        }
        // Beyond the inline words: the boxed record, with room for the holding.
        self.reserve_for(medium, slot)?;
        Ok(self.add_boxed(medium, slot))
    }

    /// Room for one more holding of `slot` on `medium` in the boxed record (made, with
    /// the inline words moved into it, when there is none), so that [`Holders::add`]
    /// allocates nothing.
    fn reserve_for(&mut self, medium: u8, slot: u32) -> Result<()> {
        let held = self.holds(medium, slot);
        let (w, _) = word_bit(slot);
        if let Some(more) = self.more_mut() {
            return more.reserve_holding(medium, w, held);
        }
        // The inline words moved into a boxed record, with room for the new holding.
        let m0 = self.first & !M1_INLINE;
        let m1 = self.m1_inline().unwrap_or(0);
        let mut media: SmallVec<[(u8, Bits); 1]> = SmallVec::new();
        media
            .try_reserve(usize::from(m0 != 0) + usize::from(m1 != 0))
            .map_err(oom_small)?;
        if m0 != 0 {
            media.push((0, smallvec![m0]));
        }
        if m1 != 0 {
            media.push((1, smallvec![m1]));
        }
        let mut more = More {
            media,
            copies: Vec::new(),
        };
        more.reserve_holding(medium, w, held)?;
        let boxed = try_box(more, "the fleet index's holders")?;
        if self.first & M1_INLINE != 0 {
            self.clear_second();
        }
        self.first = 0;
        self.second = Second {
            more: ManuallyDrop::new(Some(boxed)),
        };
        Ok(())
    }

    /// [`Holders::try_add`] beyond the inline words, once [`Holders::reserve_for`] made
    /// the room: allocates nothing.
    fn add_boxed(&mut self, medium: u8, slot: u32) -> bool {
        let held = self.holds(medium, slot);
        let Some(more) = self.more_mut() else {
            return false; // unreachable: `reserve_for` made the record
        };
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
        let Some(more) = self.more_mut() else {
            // Inline: medium 0 or 1, one copy each.
            let bit = 1u64 << (slot % 64);
            match medium {
                0 if slot < M0_INLINE_SLOTS && self.first & bit != 0 => self.first &= !bit,
                1 if slot < 64 => match self.m1_inline() {
                    Some(m1) if m1 & bit != 0 => {
                        if m1 == bit {
                            self.clear_second();
                        } else {
                            self.set_m1(m1 & !bit);
                        }
                    }
                    _ => return Removal::Unknown,
                },
                _ => return Removal::Unknown,
            }
            return Removal::Last;
        };
        let (w, bit) = word_bit(slot);
        if !more
            .media
            .iter()
            .any(|(m, b)| *m == medium && b.get(w).is_some_and(|x| x & (1 << bit) != 0))
        {
            return Removal::Unknown;
        }
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
        let Some(more) = self.more_mut() else {
            for medium in [0, 1] {
                if self.holds(medium, slot) {
                    self.remove(medium, slot);
                    on_pair(medium);
                }
            }
            return;
        };
        let (w, bit) = word_bit(slot);
        // The media it holds the hash on, as bits (media ids are below 64): clearing
        // allocates nothing, so that a worker can always be cleared.
        let mut held = 0u64;
        for (m, b) in &more.media {
            if b.get(w).is_some_and(|word| word & (1 << bit) != 0) {
                held |= 1 << (m % 64);
            }
        }
        for_each_bit(0, held, |m| {
            more.clear_bit(m as u8, slot);
            on_pair(m as u8);
        });
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
        self.more().map_or(&[], |m| m.copies.as_slice())
    }

    /// Whether the boxed record is in use although the inline words could hold
    /// everything (an invariant check: `demote` runs after every removal).
    pub fn needlessly_boxed(&self) -> bool {
        self.more().and_then(Self::inline_form).is_some()
    }

    /// `(medium, words)` of every medium with holders.
    pub fn media(&self) -> impl Iterator<Item = (u8, Words<'_>)> + '_ {
        const INLINE_MEDIA: [u8; 2] = [0, 1];
        let (inline, boxed): (&[u8], &[(u8, Bits)]) = match self.more() {
            Some(m) => (&[], m.media.as_slice()),
            None => (&INLINE_MEDIA, &[]),
        };
        inline
            .iter()
            .map(|&id| (id, self.on(id)))
            .filter(|(_, w)| !w.as_slice().is_empty())
            .chain(
                boxed
                    .iter()
                    .map(|(id, b)| (*id, Words::Boxed(b.as_slice()))),
            )
    }

    pub fn is_empty(&self) -> bool {
        match self.more() {
            Some(m) => m.media.is_empty(),
            None => self.first & !M1_INLINE == 0 && self.m1_inline().is_none(),
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

    impl Holders {
        fn add_ok(&mut self, medium: u8, slot: u32) -> bool {
            self.try_add(medium, slot).unwrap_or_else(|e| panic!("{e}"))
        }
    }

    fn boxed(h: &Holders) -> bool {
        h.more().is_some()
    }

    #[test]
    fn entries_stay_small() {
        assert_eq!(std::mem::size_of::<Holders>(), 16);
    }

    #[test]
    fn copies_media_and_far_slots_box_and_unbox() {
        let mut h = Holders::default();
        assert!(h.add_ok(0, 3));
        assert!(!boxed(&h));
        assert!(!h.add_ok(0, 3)); // a second copy boxes
        assert_eq!(h.copies(0, 3), 2);
        assert_eq!(h.remove(0, 3), Removal::Copy);
        assert!(!boxed(&h) && h.holds(0, 3)); // back inline
        assert!(h.add_ok(2, 3) && h.add_ok(0, 70)); // a third medium, a slot past 64
        assert!(boxed(&h));
        assert_eq!(h.on(0).as_slice(), &[1 << 3, 1 << 6]);
        assert_eq!(h.remove(0, 70), Removal::Last);
        assert_eq!(h.remove(2, 3), Removal::Last);
        assert!(!boxed(&h) && h.holds(0, 3));
        assert_eq!(h.remove(3, 3), Removal::Unknown);
        let mut pairs = Vec::new();
        h.add_ok(1, 3);
        h.add_ok(2, 3);
        h.clear_slot(3, |m| pairs.push(m));
        pairs.sort_unstable();
        assert_eq!(pairs, vec![0, 1, 2]);
        assert!(h.is_empty() && !boxed(&h));
    }

    #[test]
    fn two_media_stay_inline() {
        let mut h = Holders::default();
        // Medium 0 on slots 0..63 and medium 1 on slots 0..64, one copy each: inline.
        for s in 0..63 {
            assert!(h.add_ok(0, s));
        }
        for s in 0..64 {
            assert!(h.add_ok(1, s));
        }
        assert!(!boxed(&h));
        assert_eq!(h.on(0).as_slice(), &[(1u64 << 63) - 1]);
        assert_eq!(h.on(1).as_slice(), &[u64::MAX]);
        assert_eq!(h.media().count(), 2);
        // Slot 63 of medium 0 does not fit (its bit marks the inline medium 1): boxed,
        // with every holding kept.
        assert!(h.add_ok(0, 63));
        assert!(boxed(&h));
        assert_eq!(h.on(0).as_slice(), &[u64::MAX]);
        assert_eq!(h.on(1).as_slice(), &[u64::MAX]);
        let c = h.clone();
        assert_eq!(h.remove(0, 63), Removal::Last);
        assert!(!boxed(&h)); // back inline
        assert!(c.holds(0, 63) && c.holds(1, 63)); // the clone is independent
        assert!(!h.holds(0, 63) && h.holds(1, 63));
        // Emptying medium 1 leaves medium 0 inline; emptying both leaves nothing.
        for s in 0..64 {
            assert_eq!(h.remove(1, s), Removal::Last);
        }
        assert!(h.on(1).as_slice().is_empty() && !h.is_empty());
        assert_eq!(h.media().count(), 1);
        for s in 0..63 {
            assert_eq!(h.remove(0, s), Removal::Last);
        }
        assert!(h.is_empty() && h.media().next().is_none());
    }

    #[test]
    fn medium_one_alone_and_its_copies() {
        let mut h = Holders::default();
        assert!(h.add_ok(1, 5));
        assert!(!boxed(&h) && !h.is_empty() && !h.holds(0, 5));
        assert!(!h.add_ok(1, 5)); // a second copy boxes
        assert!(boxed(&h) && !h.needlessly_boxed());
        assert_eq!(h.copies(1, 5), 2);
        assert_eq!(h.remove(1, 5), Removal::Copy);
        assert!(!boxed(&h) && h.holds(1, 5));
        let mut pairs = Vec::new();
        h.clear_slot(5, |m| pairs.push(m));
        assert_eq!(pairs, vec![1]);
        assert!(h.is_empty());
        // Dropping a boxed and an inline entry frees what they own (Miri / leak checks).
        let mut b = Holders::default();
        b.add_ok(7, 1);
        let mut i = Holders::default();
        i.add_ok(1, 1);
        drop((b, i));
    }
}
