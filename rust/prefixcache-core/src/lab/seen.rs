//! How often requests brought the keys no longer cached (2Q's and the admission filter's
//! counts; a cached block's count lives in its slot, [`super::LabCache`]). Every key ever
//! seen is counted, so this grows with the distinct keys of the sequence: a key costs
//! 12 bytes in two dense arrays plus a 4-byte position in the index table.

use hashbrown::HashTable;

use super::cache::key_hash;
use crate::error::{Error, Result};
use crate::sys_vec::SysVec;

#[derive(Debug, Default)]
pub(crate) struct SeenTable {
    keys: SysVec<u64>,
    counts: SysVec<u32>,
    /// Positions in `keys` / `counts`, found by key.
    index: HashTable<u32>,
}

impl SeenTable {
    /// Room for `n` more keys ([`put`](Self::put)); nothing changes on error.
    pub fn reserve(&mut self, n: usize) -> Result<()> {
        let oom = |e: String| Error::out_of_memory("the lab cache's seen keys", e);
        let total = self.keys.len().saturating_add(n);
        if u32::try_from(total).is_err() {
            return Err(oom(format!("{total} keys")));
        }
        if self.keys.capacity() < total || self.counts.capacity() < total {
            // Growing by half at least (the arrays are on the system allocator: moved
            // by mremap, not copied); exactly what is asked when that is refused.
            let more = n.max(self.keys.len() / 2).max(64);
            if self.keys.try_reserve_exact(more).is_err()
                || self.counts.try_reserve_exact(more).is_err()
            {
                self.keys
                    .try_reserve_exact(n)
                    .and_then(|()| self.counts.try_reserve_exact(n))
                    .map_err(|e| oom(e.to_string()))?;
            }
        }
        let keys = &self.keys;
        self.index
            .try_reserve(n, |&p| key_hash(keys[p as usize]))
            .map_err(|e| oom(format!("{e:?}")))
    }

    /// Takes `key` out: its count, 0 if it is not here.
    pub fn take(&mut self, key: u64) -> u32 {
        let keys = &self.keys;
        let Ok(e) = self
            .index
            .find_entry(key_hash(key), |&p| keys[p as usize] == key)
        else {
            return 0;
        };
        let (p, _) = e.remove();
        let p = p as usize;
        let count = self.counts[p];
        let last = self.keys.len() - 1;
        if p != last {
            let moved = self.keys[last];
            self.keys[p] = moved;
            self.counts[p] = self.counts[last];
            let at = last as u32;
            if let Some(q) = self.index.find_mut(key_hash(moved), |&q| q == at) {
                *q = p as u32;
            }
        }
        self.keys.resize(last, 0);
        self.counts.resize(last, 0);
        count
    }

    /// Adds `key` (not here) with `count`, within a [`reserve`](Self::reserve).
    pub fn put(&mut self, key: u64, count: u32) {
        let p = self.keys.len() as u32;
        self.keys.push(key);
        self.counts.push(count);
        let keys = &self.keys;
        self.index
            .insert_unique(key_hash(key), p, |&q| key_hash(keys[q as usize]));
    }

    /// Every key once, each found at its position.
    pub fn consistent(&self) -> bool {
        self.index.len() == self.keys.len()
            && self.counts.len() == self.keys.len()
            && self.keys.iter().enumerate().all(|(p, &k)| {
                self.index
                    .find(key_hash(k), |&q| self.keys[q as usize] == k)
                    .is_some_and(|&q| q as usize == p)
            })
    }

    pub fn contains(&self, key: u64) -> bool {
        self.index
            .find(key_hash(key), |&p| self.keys[p as usize] == key)
            .is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_and_put() {
        let mut t = SeenTable::default();
        t.reserve(10).unwrap();
        for k in 0..10u64 {
            t.put(k * 7, k as u32 + 1);
        }
        assert!(t.consistent());
        assert_eq!(t.take(21), 4);
        assert_eq!(t.take(21), 0);
        assert_eq!(t.take(0), 1);
        assert_eq!(t.take(63), 10);
        assert!(t.consistent());
        assert_eq!(t.keys.len(), 7);
        for k in [7u64, 14, 28, 35, 42, 49, 56] {
            assert_eq!(t.take(k), k as u32 / 7 + 1);
            assert!(t.consistent());
        }
        assert_eq!(t.keys.len(), 0);
    }
}
