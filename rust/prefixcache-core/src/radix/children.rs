//! The child index of one node.
//!
//! A child is found by its *child key*: the namespace plus the first token (page size 1)
//! or the first page of tokens (page size P). The index is keyed by `(namespace, first
//! token)` packed in a u64; with pages, several children may share a first token, so a
//! lookup compares the first page of each candidate (normally one). Up to three children
//! are kept in the node by slot alone (their keys are read off the children); beyond, a
//! vector of (key, slot) in the tree's [`Indexes`], and beyond [`INLINE_MAX`] a hash map.

use std::collections::hash_map::Entry;

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use crate::{Error, Result};

/// Children of a large index kept in a linear vector up to this many; a hash map beyond.
const INLINE_MAX: usize = 8;

#[inline]
pub(crate) fn child_key(ns: u32, first_token: u32) -> u64 {
    (u64::from(ns) << 32) | u64::from(first_token)
}

/// Up to this many children are kept in the node by slot alone (12 bytes, no heap):
/// their child keys are read off the children themselves.
const FEW_MAX: usize = 3;

/// `heap_pos` of a node that is not in the evictable set.
pub(crate) const UNLISTED: u32 = u32::MAX;

/// The children of one node, in three words (12 bytes, no tag: the root, slot 0, is
/// never a child, so a 0 word is free):
///
/// - `[a, b, c]` with `a != 0`: 1..=[`FEW_MAX`] children by slot, packed from the front
///   (0 = none); candidates are every one of them (the caller checks each child's key);
/// - `[0, 0, pos]`: no child; `pos` is the leaf's position in the evictable heap
///   ([`UNLISTED`] when it is not there: only a childless node can be);
/// - `[0, id + 1, 0]`: more children, filed by child key in the large index `id` of the
///   tree's [`Indexes`].
#[derive(Debug)]
pub(crate) struct Children {
    w: [u32; FEW_MAX],
}

impl Default for Children {
    fn default() -> Self {
        Children {
            w: [0, 0, UNLISTED],
        }
    }
}

/// The large child indexes of a tree (nodes with more than [`FEW_MAX`] children), by id.
#[derive(Debug, Default)]
pub(crate) struct Indexes {
    v: Vec<Index>,
    free: Vec<u32>,
}

impl Indexes {
    /// Files a new index; without memory an `OutOfMemory` error (and `ix` dropped).
    fn try_add(&mut self, ix: Index) -> Result<u32> {
        if self.free.is_empty() {
            let oom = |e| Error::out_of_memory("a radix child index", e);
            self.v.try_reserve(1).map_err(oom)?;
            // Taking an index back files its id without allocating.
            let want = self.v.len() + 1;
            self.free
                .try_reserve(want.saturating_sub(self.free.len()))
                .map_err(oom)?;
        }
        Ok(match self.free.pop() {
            Some(id) => {
                self.v[id as usize] = ix;
                id
            }
            None => {
                self.v.push(ix);
                (self.v.len() - 1) as u32
            }
        })
    }

    fn take(&mut self, id: u32) -> Index {
        let ix = std::mem::replace(&mut self.v[id as usize], Index::Inline(Vec::new()));
        self.free.push(id);
        if self.free.len() == self.v.len() {
            // Memory follows the cached content.
            *self = Indexes::default();
        }
        ix
    }

    /// Bytes of the large indexes (capacity x entry; no allocator overhead).
    pub(crate) fn bytes(&self) -> usize {
        let inner: usize = self
            .v
            .iter()
            .map(|ix| match ix {
                Index::Inline(v) => v.capacity() * std::mem::size_of::<(u64, u32)>(),
                Index::Map { map, .. } => {
                    map.capacity() * (std::mem::size_of::<(u64, SmallVec<[u32; 1]>)>() + 1)
                        + map
                            .values()
                            .filter(|b| b.spilled())
                            .map(|b| 4 * b.capacity())
                            .sum::<usize>()
                }
            })
            .sum();
        inner + self.v.capacity() * std::mem::size_of::<Index>() + self.free.capacity() * 4
    }

    /// Number of large indexes held.
    #[cfg(test)]
    pub(crate) fn live(&self) -> usize {
        self.v.len() - self.free.len()
    }
}

/// The child index of a node with more than [`FEW_MAX`] children.
#[derive(Debug)]
pub(crate) enum Index {
    Inline(Vec<(u64, u32)>),
    Map {
        map: FxHashMap<u64, SmallVec<[u32; 1]>>,
        len: usize,
    },
}

impl Index {
    fn len(&self) -> usize {
        match self {
            Index::Inline(v) => v.len(),
            Index::Map { len, .. } => *len,
        }
    }

    fn candidates(&self, key: u64) -> impl Iterator<Item = u32> + '_ {
        let (inline, mapped): (&[(u64, u32)], &[u32]) = match self {
            Index::Inline(v) => (v.as_slice(), &[]),
            Index::Map { map, .. } => (&[], map.get(&key).map_or(&[][..], |b| b.as_slice())),
        };
        inline
            .iter()
            .filter(move |(k, _)| *k == key)
            .map(|&(_, c)| c)
            .chain(mapped.iter().copied())
    }

    /// Files `child` under `key`; without memory an `OutOfMemory` error and no change.
    fn try_insert(&mut self, key: u64, child: u32) -> Result<()> {
        let oom = |e: &dyn std::fmt::Display| Error::out_of_memory("a radix child index", e);
        match self {
            Index::Inline(v) if v.len() < INLINE_MAX => {
                v.try_reserve(1).map_err(|e| oom(&e))?;
                v.push((key, child));
            }
            Index::Inline(v) => {
                let mut map: FxHashMap<u64, SmallVec<[u32; 1]>> = FxHashMap::default();
                map.try_reserve(v.len() + 1).map_err(|e| oom(&e))?;
                for &(k, c) in v.iter().chain([(key, child)].iter()) {
                    let bucket = map.entry(k).or_default();
                    bucket.try_reserve(1).map_err(|e| oom(&e))?;
                    bucket.push(c);
                }
                let len = v.len() + 1;
                *self = Index::Map { map, len };
            }
            Index::Map { map, len } => {
                // Room first: the entry below then allocates nothing for a new key.
                map.try_reserve(1).map_err(|e| oom(&e))?;
                match map.entry(key) {
                    Entry::Occupied(mut bucket) => {
                        let bucket = bucket.get_mut();
                        bucket.try_reserve(1).map_err(|e| oom(&e))?;
                        bucket.push(child);
                    }
                    Entry::Vacant(slot) => {
                        slot.insert(SmallVec::from_buf([child]));
                    }
                }
                *len += 1;
            }
        }
        Ok(())
    }

    fn remove(&mut self, key: u64, child: u32) -> bool {
        match self {
            Index::Inline(v) => match v.iter().position(|&e| e == (key, child)) {
                Some(i) => {
                    v.swap_remove(i);
                    true
                }
                None => false,
            },
            Index::Map { map, len } => {
                let mut found = false;
                if let Some(bucket) = map.get_mut(&key) {
                    if let Some(i) = bucket.iter().position(|&c| c == child) {
                        bucket.swap_remove(i);
                        found = true;
                        *len -= 1;
                    }
                    if bucket.is_empty() {
                        map.remove(&key);
                    }
                }
                found
            }
        }
    }

    fn replace(&mut self, key: u64, old: u32, new: u32) -> bool {
        match self {
            Index::Inline(v) => match v.iter_mut().find(|e| **e == (key, old)) {
                Some(e) => {
                    e.1 = new;
                    true
                }
                None => false,
            },
            Index::Map { map, .. } => match map
                .get_mut(&key)
                .and_then(|b| b.iter_mut().find(|c| **c == old))
            {
                Some(c) => {
                    *c = new;
                    true
                }
                None => false,
            },
        }
    }

    fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let (inline, mapped) = match self {
            Index::Inline(v) => (v.as_slice(), None),
            Index::Map { map, .. } => (&[][..], Some(map.values())),
        };
        inline
            .iter()
            .map(|&(_, c)| c)
            .chain(mapped.into_iter().flatten().flat_map(|b| b.iter().copied()))
    }
}

impl Children {
    #[inline]
    fn many(&self) -> Option<u32> {
        (self.w[0] == 0 && self.w[1] != 0).then(|| self.w[1] - 1)
    }

    #[inline(always)]
    fn few(&self) -> &[u32] {
        if self.w[0] == 0 {
            return &[];
        }
        let n = if self.w[1] == 0 {
            1
        } else if self.w[2] == 0 {
            2
        } else {
            3
        };
        &self.w[..n]
    }

    /// The children of a small index (none for a childless node); `None` for a large one.
    #[inline(always)]
    pub(crate) fn few_slots(&self) -> Option<&[u32]> {
        if self.w[0] == 0 && self.w[1] != 0 {
            None
        } else {
            Some(self.few())
        }
    }

    pub(crate) fn len(&self, ixs: &Indexes) -> usize {
        match self.many() {
            Some(id) => ixs.v[id as usize].len(),
            None => self.few().len(),
        }
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.w[0] == 0 && self.w[1] == 0
    }

    /// The position of this childless node in the evictable heap ([`UNLISTED`] if none,
    /// or if the node has children).
    #[inline(always)]
    pub(crate) fn heap_pos(&self) -> u32 {
        if self.is_empty() {
            self.w[2]
        } else {
            UNLISTED
        }
    }

    /// Records the heap position of this childless node.
    #[inline]
    pub(crate) fn set_heap_pos(&mut self, pos: u32) {
        debug_assert!(self.is_empty(), "only a leaf is in the evictable heap");
        self.w[2] = pos;
    }

    /// The children that may be filed under `key`: exactly those for a large index, every
    /// child for a small one. The caller checks each candidate's own key.
    #[inline]
    pub(crate) fn candidates<'a>(
        &'a self,
        key: u64,
        ixs: &'a Indexes,
    ) -> impl Iterator<Item = u32> + 'a {
        let many = self.many().map(|id| ixs.v[id as usize].candidates(key));
        self.few().iter().copied().chain(many.into_iter().flatten())
    }

    /// Files `child` under `key`; `key_of` gives the child key of an existing child (read
    /// when a small index grows into a large one). The node must not be in the evictable
    /// heap (a node with children never is).
    /// Files `child` under `key`; `key_of` gives the keys of the children already held.
    /// Without memory an `OutOfMemory` error and no change.
    pub(crate) fn try_insert(
        &mut self,
        key: u64,
        child: u32,
        ixs: &mut Indexes,
        key_of: impl Fn(u32) -> u64,
    ) -> Result<()> {
        debug_assert!(child != 0);
        if let Some(id) = self.many() {
            return ixs.v[id as usize].try_insert(key, child);
        }
        let n = self.few().len();
        if n == 0 {
            self.insert_first(child);
        } else if n < FEW_MAX {
            self.w[n] = child;
        } else {
            let mut v: Vec<(u64, u32)> = Vec::new();
            v.try_reserve_exact(FEW_MAX + 1)
                .map_err(|e| Error::out_of_memory("a radix child index", e))?;
            v.extend(self.w.iter().map(|&c| (key_of(c), c)));
            v.push((key, child));
            let id = ixs.try_add(Index::Inline(v))?;
            self.w = [0, id + 1, 0];
        }
        Ok(())
    }

    /// Files the first child of a childless node (never allocates).
    pub(crate) fn insert_first(&mut self, child: u32) {
        debug_assert!(child != 0 && self.is_empty());
        debug_assert_eq!(self.w[2], UNLISTED, "a listed leaf gains a child");
        self.w = [child, 0, 0];
    }

    /// Removes `child` (filed under `key`); returns whether it was there.
    pub(crate) fn remove(&mut self, key: u64, child: u32, ixs: &mut Indexes) -> bool {
        if let Some(id) = self.many() {
            let ix = &mut ixs.v[id as usize];
            if !ix.remove(key, child) {
                return false;
            }
            if ix.len() <= FEW_MAX {
                // Back to the small form: memory follows the children held.
                let ix = ixs.take(id);
                let mut w = [0u32; FEW_MAX];
                for (d, c) in w.iter_mut().zip(ix.iter()) {
                    *d = c;
                }
                self.w = w;
            }
            return true;
        }
        let n = self.few().len();
        match self.w[..n].iter().position(|&c| c == child) {
            Some(i) => {
                self.w[i] = self.w[n - 1];
                self.w[n - 1] = 0;
                if n == 1 {
                    self.w = [0, 0, UNLISTED];
                }
                true
            }
            None => false,
        }
    }

    /// Files `new` where `old` was (same child key: used by split).
    pub(crate) fn replace(&mut self, key: u64, old: u32, new: u32, ixs: &mut Indexes) -> bool {
        if let Some(id) = self.many() {
            return ixs.v[id as usize].replace(key, old, new);
        }
        let n = self.few().len();
        match self.w[..n].iter_mut().find(|c| **c == old) {
            Some(c) => {
                *c = new;
                true
            }
            None => false,
        }
    }

    /// Every child, in no particular order, without allocating.
    pub(crate) fn iter<'a>(&'a self, ixs: &'a Indexes) -> impl Iterator<Item = u32> + 'a {
        let many = self.many().map(|id| ixs.v[id as usize].iter());
        self.few().iter().copied().chain(many.into_iter().flatten())
    }

    /// Every child, in no particular order.
    pub(crate) fn ids(&self, ixs: &Indexes) -> Vec<u32> {
        self.iter(ixs).collect()
    }

    /// Gives back a large index (the node is being freed with its children gone).
    pub(crate) fn clear(&mut self, ixs: &mut Indexes) {
        if let Some(id) = self.many() {
            ixs.take(id);
        }
        *self = Children::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_into_a_map_and_back() {
        let mut ixs = Indexes::default();
        let mut c = Children::default();
        assert_eq!(c.heap_pos(), UNLISTED);
        let key_of = |i: u32| child_key(0, i % 15);
        for i in 1..=20u32 {
            c.try_insert(key_of(i), i, &mut ixs, key_of).unwrap();
        }
        assert_eq!(c.len(&ixs), 20);
        assert_eq!(c.heap_pos(), UNLISTED);
        assert!(matches!(
            c.many().map(|id| &ixs.v[id as usize]),
            Some(Index::Map { .. })
        ));
        let mut got: Vec<u32> = c.candidates(child_key(0, 3), &ixs).collect();
        got.sort_unstable();
        assert_eq!(got, vec![3, 18]);
        assert!(c.replace(child_key(0, 3), 18, 99, &mut ixs));
        assert!(c.remove(child_key(0, 3), 99, &mut ixs));
        assert!(!c.remove(child_key(0, 3), 99, &mut ixs));
        for i in 1..=20u32 {
            let id = if i == 18 { continue } else { i };
            assert!(c.remove(child_key(0, i % 15), id, &mut ixs));
            if c.len(&ixs) <= FEW_MAX {
                assert!(c.many().is_none());
                assert_eq!(ixs.live(), 0);
            }
        }
        assert!(c.is_empty());
        assert_eq!(c.heap_pos(), UNLISTED);
        c.set_heap_pos(7);
        assert_eq!(c.heap_pos(), 7);
        assert!(c.is_empty());
    }

    #[test]
    fn namespaces_do_not_collide() {
        let mut ixs = Indexes::default();
        let mut c = Children::default();
        let key_of = |i: u32| child_key(i - 9, 7);
        for i in 10..14 {
            c.try_insert(key_of(i), i, &mut ixs, key_of).unwrap();
        }
        let got = |ns| c.candidates(child_key(ns, 7), &ixs).collect::<Vec<_>>();
        assert_eq!(got(1), vec![10]);
        assert_eq!(got(2), vec![11]);
        assert_eq!(got(7), Vec::<u32>::new());
    }

    #[test]
    fn small_form_keeps_order_free() {
        let mut ixs = Indexes::default();
        let mut c = Children::default();
        for i in [5u32, 6, 7] {
            c.try_insert(child_key(0, i), i, &mut ixs, |_| 0).unwrap();
        }
        assert!(c.remove(child_key(0, 5), 5, &mut ixs));
        let mut ids = c.ids(&ixs);
        ids.sort_unstable();
        assert_eq!(ids, vec![6, 7]);
        assert!(c.remove(child_key(0, 7), 7, &mut ixs));
        assert!(c.remove(child_key(0, 6), 6, &mut ixs));
        assert!(c.is_empty());
        assert_eq!(c.heap_pos(), UNLISTED);
        assert_eq!(std::mem::size_of::<Children>(), 12);
    }
}
