//! Interning of salts and multimodal hashes, reference-counted by their holders.

use rustc_hash::FxHashMap;

/// Byte strings (salts, multimodal hashes) interned to small ids, each with the number of
/// holders (cached block keys and live requests); a string is dropped with its last holder
/// and its id reused, so memory follows what is cached and claimed.
#[derive(Default)]
pub(crate) struct Interner {
    ids: FxHashMap<Box<[u8]>, u32>,
    /// `(bytes, holders)` by id; a dropped id holds empty bytes and 0.
    items: Vec<(Box<[u8]>, u32)>,
    /// Dropped ids, reused last-dropped first.
    free: Vec<u32>,
}

impl Interner {
    pub(super) fn get(&self, s: &[u8]) -> Option<u32> {
        self.ids.get(s).copied()
    }

    /// The id the `k`-th (from 0) new string interned from now on will get.
    pub(super) fn new_id(&self, k: usize) -> u32 {
        match self.free.len().checked_sub(k + 1) {
            Some(i) => self.free[i],
            None => (self.items.len() + k - self.free.len()) as u32,
        }
    }

    /// Interns `s` (if new) and adds a holder.
    pub(super) fn acquire(&mut self, s: &[u8]) -> u32 {
        if let Some(id) = self.get(s) {
            self.retain(id);
            return id;
        }
        let id = self.new_id(0);
        let entry = (Box::<[u8]>::from(s), 1);
        if self.free.pop().is_some() {
            self.items[id as usize] = entry;
        } else {
            self.items.push(entry);
        }
        self.ids.insert(Box::from(s), id);
        id
    }

    /// Adds a holder to a live id.
    pub(super) fn retain(&mut self, id: u32) {
        if let Some(e) = self.items.get_mut(id as usize) {
            e.1 += 1;
        }
    }

    /// Drops a holder; the last one drops the string.
    pub(crate) fn release(&mut self, id: u32) {
        let Some(e) = self.items.get_mut(id as usize) else {
            return;
        };
        e.1 = e.1.saturating_sub(1);
        if e.1 == 0 {
            let bytes = std::mem::take(&mut e.0);
            self.ids.remove(&bytes);
            self.free.push(id);
            if self.ids.len() * 4 < self.ids.capacity() {
                self.ids.shrink_to_fit();
            }
        }
    }

    pub(super) fn bytes(&self, id: u32) -> &[u8] {
        self.items.get(id as usize).map_or(&[], |v| &v.0)
    }

    /// Number of live strings.
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    /// Holders by live id (for the invariant check).
    pub(crate) fn holders(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.ids.values().map(|&id| (id, self.items[id as usize].1))
    }
}
