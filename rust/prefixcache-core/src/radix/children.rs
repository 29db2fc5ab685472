//! The child index of one node.
//!
//! A child is found by its *child key*: the namespace plus the first token (page size 1)
//! or the first page of tokens (page size P). The index is keyed by `(namespace, first
//! token)` packed in a u64; with pages, several children may share a first token, so a
//! lookup compares the first page of each candidate (normally one). Up to three children
//! are kept in the node by slot alone (their keys are read off the children); beyond, a
//! boxed vector of (key, slot), and beyond [`INLINE_MAX`] a hash map.

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

/// Children of a large index kept in a linear vector up to this many; a hash map beyond.
const INLINE_MAX: usize = 8;

#[inline]
pub(crate) fn child_key(ns: u32, first_token: u32) -> u64 {
    (u64::from(ns) << 32) | u64::from(first_token)
}

/// Up to this many children are kept in the node by slot alone (16 bytes, no heap):
/// their child keys are read off the children themselves.
const FEW_MAX: usize = 3;

#[derive(Debug, Default)]
pub(crate) enum Children {
    #[default]
    Empty,
    /// 1..=FEW_MAX children, by slot; candidates are every one of them (the caller checks
    /// each child's own key).
    Few { len: u8, ids: [u32; FEW_MAX] },
    /// More: filed by child key.
    Many(Box<Index>),
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

    fn insert(&mut self, key: u64, child: u32) {
        match self {
            Index::Inline(v) if v.len() < INLINE_MAX => v.push((key, child)),
            Index::Inline(v) => {
                let mut map: FxHashMap<u64, SmallVec<[u32; 1]>> = FxHashMap::default();
                for &(k, c) in v.iter() {
                    map.entry(k).or_default().push(c);
                }
                map.entry(key).or_default().push(child);
                let len = v.len() + 1;
                *self = Index::Map { map, len };
            }
            Index::Map { map, len } => {
                map.entry(key).or_default().push(child);
                *len += 1;
            }
        }
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
    pub(crate) fn len(&self) -> usize {
        match self {
            Children::Empty => 0,
            Children::Few { len, .. } => usize::from(*len),
            Children::Many(ix) => ix.len(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        matches!(self, Children::Empty)
    }

    /// The children that may be filed under `key`: exactly those for a large index, every
    /// child for a small one. The caller checks each candidate's own key.
    pub(crate) fn candidates(&self, key: u64) -> impl Iterator<Item = u32> + '_ {
        let (few, many) = match self {
            Children::Empty => (&[][..], None),
            Children::Few { len, ids } => (&ids[..usize::from(*len)], None),
            Children::Many(ix) => (&[][..], Some(ix.candidates(key))),
        };
        few.iter().copied().chain(many.into_iter().flatten())
    }

    /// Files `child` under `key`; `key_of` gives the child key of an existing child (read
    /// when a small index grows into a large one).
    pub(crate) fn insert(&mut self, key: u64, child: u32, key_of: impl Fn(u32) -> u64) {
        match self {
            Children::Empty => {
                *self = Children::Few {
                    len: 1,
                    ids: [child, 0, 0],
                }
            }
            Children::Few { len, ids } if usize::from(*len) < FEW_MAX => {
                ids[usize::from(*len)] = child;
                *len += 1;
            }
            Children::Few { ids, .. } => {
                let mut v: Vec<(u64, u32)> = ids.iter().map(|&c| (key_of(c), c)).collect();
                v.push((key, child));
                *self = Children::Many(Box::new(Index::Inline(v)));
            }
            Children::Many(ix) => ix.insert(key, child),
        }
    }

    /// Removes `child` (filed under `key`); returns whether it was there.
    pub(crate) fn remove(&mut self, key: u64, child: u32) -> bool {
        let found = match self {
            Children::Empty => false,
            Children::Few { len, ids } => {
                let n = usize::from(*len);
                match ids[..n].iter().position(|&c| c == child) {
                    Some(i) => {
                        ids[i] = ids[n - 1];
                        *len -= 1;
                        true
                    }
                    None => false,
                }
            }
            Children::Many(ix) => ix.remove(key, child),
        };
        if found {
            let n = self.len();
            if n == 0 {
                *self = Children::Empty;
            } else if n <= FEW_MAX && matches!(self, Children::Many(_)) {
                // Back to the small form: memory follows the children held.
                let mut ids = [0u32; FEW_MAX];
                for (d, c) in ids.iter_mut().zip(self.iter()) {
                    *d = c;
                }
                *self = Children::Few { len: n as u8, ids };
            }
        }
        found
    }

    /// Files `new` where `old` was (same child key: used by split).
    pub(crate) fn replace(&mut self, key: u64, old: u32, new: u32) -> bool {
        match self {
            Children::Empty => false,
            Children::Few { len, ids } => {
                match ids[..usize::from(*len)].iter_mut().find(|c| **c == old) {
                    Some(c) => {
                        *c = new;
                        true
                    }
                    None => false,
                }
            }
            Children::Many(ix) => ix.replace(key, old, new),
        }
    }

    /// Every child, in no particular order, without allocating.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let (few, many) = match self {
            Children::Empty => (&[][..], None),
            Children::Few { len, ids } => (&ids[..usize::from(*len)], None),
            Children::Many(ix) => (&[][..], Some(ix.iter())),
        };
        few.iter().copied().chain(many.into_iter().flatten())
    }

    /// Every child, in no particular order.
    pub(crate) fn ids(&self) -> Vec<u32> {
        self.iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_into_a_map_and_back() {
        let mut c = Children::default();
        let key_of = |i: u32| child_key(0, i % 15);
        for i in 0..20u32 {
            c.insert(key_of(i), i, key_of);
        }
        assert_eq!(c.len(), 20);
        assert!(matches!(&c, Children::Many(ix) if matches!(**ix, Index::Map { .. })));
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
        let key_of = |i: u32| child_key(i - 9, 7);
        for i in 10..14 {
            c.insert(key_of(i), i, key_of);
        }
        assert_eq!(c.candidates(child_key(1, 7)).collect::<Vec<_>>(), vec![10]);
        assert_eq!(c.candidates(child_key(2, 7)).collect::<Vec<_>>(), vec![11]);
        assert_eq!(c.candidates(child_key(7, 7)).count(), 0);
    }
}
