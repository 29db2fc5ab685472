//! A request's key entries found by their key hash: the index behind
//! [`RequestState`](super::manager::RequestState).
//!
//! Open addressing with linear probing over 4-byte slots (entry + 1; 0 is empty), at
//! most half full. A request names hundreds to thousands of keys, each looked up or
//! added once or twice per call, so the table stays in the first cache levels and a
//! lookup is a few instructions: the slot's entry is compared by its stored hash first
//! (the caller's `eq`), then by key. Entries are never removed one by one; the table is
//! emptied as a whole when the request's state is reused.

use std::collections::TryReserveError;

/// Tables up to this many slots are kept (zeroed) when emptied; larger ones, left by
/// an unusually long request, are dropped so that the next request does not zero them.
const KEEP_SLOTS: usize = 1 << 16;

#[derive(Debug, Clone, Default)]
pub(crate) struct EntryIndex {
    /// `entry + 1` per used slot, 0 for an empty one; the length is 0 or a power of two.
    slots: Vec<u32>,
    len: usize,
}

impl EntryIndex {
    /// The entry at hash `h` for which `eq(entry)` holds.
    #[inline]
    pub(crate) fn find(&self, h: u64, mut eq: impl FnMut(u32) -> bool) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut i = h as usize & mask;
        loop {
            match self.slots[i] {
                0 => return None,
                s if eq(s - 1) => return Some(s - 1),
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// Adds entry `e` (below `u32::MAX`, not in the table) at hash `h`. Room must have
    /// been reserved ([`try_reserve`](Self::try_reserve)).
    #[inline]
    pub(crate) fn insert(&mut self, h: u64, e: u32) {
        debug_assert!(2 * (self.len + 1) <= self.slots.len());
        let mask = self.slots.len() - 1;
        let mut i = h as usize & mask;
        while self.slots[i] != 0 {
            i = (i + 1) & mask;
        }
        self.slots[i] = e + 1;
        self.len += 1;
    }

    /// Room for `additional` more entries (`hash_of(e)`: entry `e`'s hash, to move the
    /// present ones into a larger table). Nothing changes on error.
    pub(crate) fn try_reserve(
        &mut self,
        additional: usize,
        hash_of: impl Fn(u32) -> u64,
    ) -> Result<(), TryReserveError> {
        let need = self.len.saturating_add(additional).saturating_mul(2);
        if need <= self.slots.len() {
            return Ok(());
        }
        let size = need
            .checked_next_power_of_two()
            .unwrap_or(usize::MAX)
            .max(16);
        let mut grown: Vec<u32> = Vec::new();
        grown.try_reserve_exact(size)?;
        grown.resize(size, 0);
        let mask = size - 1;
        for &s in self.slots.iter().filter(|&&s| s != 0) {
            let mut i = hash_of(s - 1) as usize & mask;
            while grown[i] != 0 {
                i = (i + 1) & mask;
            }
            grown[i] = s;
        }
        self.slots = grown;
        Ok(())
    }

    /// No entries (the table is kept for the next request unless it is large).
    pub(crate) fn clear(&mut self) {
        if self.slots.len() > KEEP_SLOTS {
            self.slots = Vec::new();
        } else {
            self.slots.fill(0);
        }
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Random adds and lookups against a `HashMap`, with hashes that collide on purpose
    /// (few distinct low bits, some equal hashes for different keys).
    #[test]
    fn matches_a_map() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..50 {
            let mut idx = EntryIndex::default();
            let mut keys: Vec<u64> = Vec::new(); // entry -> key
            let mut map: HashMap<u64, u32> = HashMap::new();
            // The hash of a key: a few bits only, so that probes run long.
            let hash = |k: u64| (k % 37).wrapping_mul(0x1000_0001) ^ (k % 3);
            for _ in 0..(200 + round * 40) {
                let k = next() % 500;
                let h = hash(k);
                let found = idx.find(h, |e| keys[e as usize] == k);
                assert_eq!(found, map.get(&k).copied());
                if found.is_none() {
                    let e = keys.len() as u32;
                    idx.try_reserve(1, |e| hash(keys[e as usize])).unwrap();
                    idx.insert(h, e);
                    keys.push(k);
                    map.insert(k, e);
                }
            }
            for (&k, &e) in &map {
                assert_eq!(idx.find(hash(k), |x| keys[x as usize] == k), Some(e));
            }
            idx.clear();
            assert_eq!(
                idx.find(hash(keys[0]), |x| keys[x as usize] == keys[0]),
                None
            );
        }
    }

    #[test]
    fn a_large_table_is_dropped_when_emptied() {
        let mut idx = EntryIndex::default();
        idx.try_reserve(KEEP_SLOTS, |_| 0).unwrap();
        assert!(idx.slots.len() > KEEP_SLOTS);
        idx.clear();
        assert!(idx.slots.is_empty());
        assert_eq!(idx.find(7, |_| true), None);
        idx.try_reserve(10, |_| 0).unwrap();
        idx.insert(7, 0);
        idx.clear();
        assert_eq!(idx.slots.len(), 32);
        assert_eq!(idx.find(7, |_| true), None);
    }

    #[test]
    fn an_impossible_reservation_fails_and_changes_nothing() {
        let mut idx = EntryIndex::default();
        idx.try_reserve(4, |_| 0).unwrap();
        idx.insert(3, 0);
        assert!(idx.try_reserve(usize::MAX / 4, |_| 3).is_err());
        assert_eq!(idx.find(3, |e| e == 0), Some(0));
        assert_eq!(idx.slots.len(), 16);
    }
}
