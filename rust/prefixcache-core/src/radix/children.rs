//! The child index of one node.
//!
//! A child is found by its *child key*: the namespace plus the first token (page size 1)
//! or the first page of tokens (page size P). The index is keyed by `(namespace, first
//! token)` packed in a u64; with pages, several children may share a first token, so a
//! lookup compares the first page of each candidate (normally one). Few children are kept
//! inline in a small vector; beyond [`INLINE_MAX`] a hash map takes over.

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

/// Children kept in a linear vector up to this many; a hash map beyond.
const INLINE_MAX: usize = 8;

#[inline]
pub(crate) fn child_key(ns: u32, first_token: u32) -> u64 {
    (u64::from(ns) << 32) | u64::from(first_token)
}

#[derive(Debug, Default)]
pub(crate) enum Children {
    #[default]
    Empty,
    Inline(SmallVec<[(u64, u32); 2]>),
    Map {
        map: FxHashMap<u64, SmallVec<[u32; 1]>>,
        len: usize,
    },
}

impl Children {
    pub(crate) fn len(&self) -> usize {
        match self {
            Children::Empty => 0,
            Children::Inline(v) => v.len(),
            Children::Map { len, .. } => *len,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The children whose child key starts with `key` (one unless pages share a first token).
    pub(crate) fn candidates(&self, key: u64) -> impl Iterator<Item = u32> + '_ {
        let (inline, mapped): (&[(u64, u32)], &[u32]) = match self {
            Children::Empty => (&[], &[]),
            Children::Inline(v) => (v.as_slice(), &[]),
            Children::Map { map, .. } => (&[], map.get(&key).map_or(&[][..], |b| b.as_slice())),
        };
        inline
            .iter()
            .filter(move |(k, _)| *k == key)
            .map(|&(_, c)| c)
            .chain(mapped.iter().copied())
    }

    pub(crate) fn insert(&mut self, key: u64, child: u32) {
        match self {
            Children::Empty => {
                let mut v = SmallVec::new();
                v.push((key, child));
                *self = Children::Inline(v);
            }
            Children::Inline(v) if v.len() < INLINE_MAX => v.push((key, child)),
            Children::Inline(v) => {
                let mut map: FxHashMap<u64, SmallVec<[u32; 1]>> = FxHashMap::default();
                for &(k, c) in v.iter() {
                    map.entry(k).or_default().push(c);
                }
                map.entry(key).or_default().push(child);
                let len = v.len() + 1;
                *self = Children::Map { map, len };
            }
            Children::Map { map, len } => {
                map.entry(key).or_default().push(child);
                *len += 1;
            }
        }
    }

    /// Removes `child` (filed under `key`); returns whether it was there.
    pub(crate) fn remove(&mut self, key: u64, child: u32) -> bool {
        let found = match self {
            Children::Empty => false,
            Children::Inline(v) => match v.iter().position(|&e| e == (key, child)) {
                Some(i) => {
                    v.swap_remove(i);
                    true
                }
                None => false,
            },
            Children::Map { map, len } => {
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
        };
        if found && self.is_empty() {
            *self = Children::Empty;
        }
        found
    }

    /// Files `new` where `old` was (same child key: used by split).
    pub(crate) fn replace(&mut self, key: u64, old: u32, new: u32) -> bool {
        match self {
            Children::Empty => false,
            Children::Inline(v) => match v.iter_mut().find(|e| **e == (key, old)) {
                Some(e) => {
                    e.1 = new;
                    true
                }
                None => false,
            },
            Children::Map { map, .. } => match map
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

    /// Every child, in no particular order, without allocating.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let (inline, mapped) = match self {
            Children::Empty => (&[][..], None),
            Children::Inline(v) => (v.as_slice(), None),
            Children::Map { map, .. } => (&[][..], Some(map.values())),
        };
        inline
            .iter()
            .map(|&(_, c)| c)
            .chain(mapped.into_iter().flatten().flat_map(|b| b.iter().copied()))
    }

    /// Every child, in no particular order.
    pub(crate) fn ids(&self) -> Vec<u32> {
        match self {
            Children::Empty => Vec::new(),
            Children::Inline(v) => v.iter().map(|&(_, c)| c).collect(),
            Children::Map { map, .. } => map.values().flat_map(|b| b.iter().copied()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_into_a_map_and_back() {
        let mut c = Children::default();
        for i in 0..20u32 {
            c.insert(child_key(0, i % 15), i);
        }
        assert_eq!(c.len(), 20);
        assert!(matches!(c, Children::Map { .. }));
        let mut got: Vec<u32> = c.candidates(child_key(0, 3)).collect();
        got.sort_unstable();
        assert_eq!(got, vec![3, 18]);
        assert!(c.replace(child_key(0, 3), 18, 99));
        assert!(c.remove(child_key(0, 3), 99));
        assert!(!c.remove(child_key(0, 3), 99));
        for i in 0..20u32 {
            let id = if i == 18 { continue } else { i };
            assert!(c.remove(child_key(0, i % 15), id));
        }
        assert!(c.is_empty());
        assert!(matches!(c, Children::Empty));
    }

    #[test]
    fn namespaces_do_not_collide() {
        let mut c = Children::default();
        c.insert(child_key(1, 7), 10);
        c.insert(child_key(2, 7), 11);
        assert_eq!(c.candidates(child_key(1, 7)).collect::<Vec<_>>(), vec![10]);
        assert_eq!(c.candidates(child_key(2, 7)).collect::<Vec<_>>(), vec![11]);
        assert_eq!(c.candidates(child_key(3, 7)).count(), 0);
    }
}
