//! The child index of one block (or of the root).
//!
//! - Exact lookup: a hash map from the hash of the full [`BlockKey`] to the children
//!   filed under it (normally one; the caller compares keys), O(1).
//! - Partial lookup: the partial-match candidates ordered by `(scope, tokens)`. For a
//!   query `q`, the longest common prefix with any candidate of the same scope is reached
//!   at one of the two lexicographic neighbours of `q`, so it costs O(log n) token-slice
//!   comparisons however many children there are. TensorRT-LLM scans every child (its
//!   Python v2 manager gives up at >= 32 children).
//!
//! Ties between candidates with the same longest common prefix `L` go to the smallest
//! token sequence, i.e. the first candidate at or after `q[..L]`.
//!
//! Most blocks of a trie have at most one child (a prompt's blocks form a chain below the
//! point where it leaves the prompts before it), so both indexes hold a single child
//! inline and allocate their maps only for a second one. The inline partial candidate
//! keeps no copy of its tokens: lookups read them from the child's own key, which the
//! caller passes in (`key_of`).

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use super::key::{lcp, Scope};

/// The children filed under their exact key hashes.
#[derive(Debug, Default)]
enum Exact {
    #[default]
    Empty,
    One(u64, u32),
    Many(Box<FxHashMap<u64, SmallVec<[u32; 1]>>>),
}

/// Partial-match candidates ordered by `(scope, tokens)`.
type Ordered = BTreeMap<(Scope, Box<[u32]>), u32>;

/// The partial-match candidates.
#[derive(Debug, Default)]
enum Partial {
    #[default]
    Empty,
    /// One candidate; its scope and tokens are its own key's (`key_of`).
    One(u32),
    Many(Box<Ordered>),
}

#[derive(Debug, Default)]
pub(crate) struct Children {
    exact: Exact,
    partial: Partial,
    len: u32,
}

impl Children {
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Children filed under the exact key hash `h` (compare their keys).
    pub(crate) fn exact(&self, h: u64) -> &[u32] {
        match &self.exact {
            Exact::One(k, id) if *k == h => std::slice::from_ref(id),
            Exact::Many(m) => m.get(&h).map_or(&[], |v| v.as_slice()),
            _ => &[],
        }
    }

    pub(crate) fn insert_exact(&mut self, h: u64, id: u32) {
        match &mut self.exact {
            Exact::Empty => self.exact = Exact::One(h, id),
            Exact::One(k, first) => {
                let mut m: FxHashMap<u64, SmallVec<[u32; 1]>> = FxHashMap::default();
                m.entry(*k).or_default().push(*first);
                m.entry(h).or_default().push(id);
                self.exact = Exact::Many(Box::new(m));
            }
            Exact::Many(m) => m.entry(h).or_default().push(id),
        }
        self.len += 1;
    }

    /// Removes `id` filed under `h`; false when it was not there.
    pub(crate) fn remove_exact(&mut self, h: u64, id: u32) -> bool {
        match &mut self.exact {
            Exact::One(k, x) if *k == h && *x == id => self.exact = Exact::Empty,
            Exact::Many(m) => {
                let Some(v) = m.get_mut(&h) else {
                    return false;
                };
                let Some(pos) = v.iter().position(|&x| x == id) else {
                    return false;
                };
                v.swap_remove(pos);
                if v.is_empty() {
                    m.remove(&h);
                }
                if m.is_empty() {
                    self.exact = Exact::Empty;
                }
            }
            _ => return false,
        }
        self.len -= 1;
        true
    }

    /// Every child, in no particular order.
    pub(crate) fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        let (one, many) = match &self.exact {
            Exact::Empty => (None, None),
            Exact::One(_, id) => (Some(*id), None),
            Exact::Many(m) => (None, Some(m)),
        };
        one.into_iter().chain(
            many.into_iter()
                .flat_map(|m| m.values().flat_map(|v| v.iter().copied())),
        )
    }

    /// Files `id` (scope `scope`, tokens `tokens`) as a partial-match candidate; `key_of`
    /// gives the scope and tokens of the candidate already filed, if one is.
    pub(crate) fn insert_partial<'a>(
        &mut self,
        scope: Scope,
        tokens: &[u32],
        id: u32,
        key_of: impl Fn(u32) -> Option<(Scope, &'a [u32])>,
    ) {
        match &mut self.partial {
            Partial::Empty => self.partial = Partial::One(id),
            Partial::One(first) => {
                let mut m = BTreeMap::new();
                if let Some((s, t)) = key_of(*first) {
                    m.insert((s, Box::from(t)), *first);
                }
                m.insert((scope, Box::from(tokens)), id);
                self.partial = Partial::Many(Box::new(m));
            }
            Partial::Many(m) => {
                m.insert((scope, Box::from(tokens)), id);
            }
        }
    }

    /// Removes the candidate filed under `(scope, tokens)` (inline: candidate `id`); false
    /// when it was not there.
    pub(crate) fn remove_partial(&mut self, scope: Scope, tokens: &[u32], id: u32) -> bool {
        match &mut self.partial {
            Partial::One(x) if *x == id => self.partial = Partial::Empty,
            Partial::Many(m) => {
                if m.remove(&(scope, Box::from(tokens))).is_none() {
                    return false;
                }
                if m.is_empty() {
                    self.partial = Partial::Empty;
                }
            }
            _ => return false,
        }
        true
    }

    /// Whether `id` is filed as a candidate under `(scope, tokens)` (inline: whether it is
    /// the candidate; its key is its own).
    pub(crate) fn partial_contains(&self, scope: Scope, tokens: &[u32], id: u32) -> bool {
        match &self.partial {
            Partial::Empty => false,
            Partial::One(x) => *x == id,
            Partial::Many(m) => m.get(&(scope, Box::from(tokens))) == Some(&id),
        }
    }

    pub(crate) fn num_partial(&self) -> usize {
        match &self.partial {
            Partial::Empty => 0,
            Partial::One(_) => 1,
            Partial::Many(m) => m.len(),
        }
    }

    /// The candidate with the longest common token prefix with `q` (>= 1) in `scope`,
    /// and that length; `key_of` gives an inline candidate's scope and tokens.
    pub(crate) fn best_partial<'a>(
        &self,
        scope: Scope,
        q: &[u32],
        key_of: impl Fn(u32) -> Option<(Scope, &'a [u32])>,
    ) -> Option<(u32, usize)> {
        if q.is_empty() {
            return None;
        }
        let m = match &self.partial {
            Partial::Empty => return None,
            Partial::One(id) => {
                let (s, t) = key_of(*id)?;
                let best = if s == scope { lcp(t, q) } else { 0 };
                return (best > 0).then_some((*id, best));
            }
            Partial::Many(m) => m,
        };
        let probe = (scope, Box::<[u32]>::from(q));
        let mut best = 0usize;
        if let Some(((s, t), _)) = m.range(..&probe).next_back() {
            if *s == scope {
                best = lcp(t, q);
            }
        }
        if let Some(((s, t), _)) = m.range(&probe..).next() {
            if *s == scope {
                best = best.max(lcp(t, q));
            }
        }
        if best == 0 {
            return None;
        }
        let prefix = (scope, Box::<[u32]>::from(&q[..best]));
        let (_, &id) = m.range(&prefix..).next()?;
        Some((id, best))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brute(c: &[(Vec<u32>, u32)], q: &[u32]) -> Option<(u32, usize)> {
        let mut best: Option<(&Vec<u32>, u32, usize)> = None;
        for (t, id) in c {
            let l = lcp(t, q);
            if l == 0 {
                continue;
            }
            match best {
                Some((bt, _, bl)) if bl > l || (bl == l && bt <= t) => {}
                _ => best = Some((t, *id, l)),
            }
        }
        best.map(|(_, id, l)| (id, l))
    }

    #[test]
    fn ordered_index_equals_a_full_scan() {
        let mut x: u64 = 12345;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 3) as u32
        };
        for _ in 0..200 {
            let mut c = Children::default();
            let mut all: Vec<(Vec<u32>, u32)> = Vec::new();
            let n = (next() * 7 + next()) as usize;
            for id in 0..n as u32 {
                let len = 1 + next() as usize + next() as usize;
                let t: Vec<u32> = (0..len).map(|_| next()).collect();
                if all.iter().any(|(u, _)| *u == t) {
                    continue;
                }
                let key_of = |x: u32| {
                    let (t, _) = all.iter().find(|(_, i)| *i == x)?;
                    Some((Scope::default(), t.as_slice()))
                };
                c.insert_partial(Scope::default(), &t, id, key_of);
                all.push((t, id));
            }
            let key_of = |x: u32| {
                let (t, _) = all.iter().find(|(_, i)| *i == x)?;
                Some((Scope::default(), t.as_slice()))
            };
            for _ in 0..10 {
                let len = 1 + next() as usize + next() as usize;
                let q: Vec<u32> = (0..len).map(|_| next()).collect();
                assert_eq!(
                    c.best_partial(Scope::default(), &q, key_of),
                    brute(&all, &q)
                );
            }
            assert_eq!(c.num_partial(), all.len());
            // Removing every candidate but the last, then the last, in both index forms.
            for (t, id) in &all {
                assert!(c.partial_contains(Scope::default(), t, *id));
                assert!(c.remove_partial(Scope::default(), t, *id));
                assert!(!c.remove_partial(Scope::default(), t, *id));
            }
            assert_eq!(c.num_partial(), 0);
        }
    }

    #[test]
    fn exact_children_inline_and_in_the_map() {
        let mut c = Children::default();
        assert!(c.is_empty() && c.exact(9).is_empty());
        c.insert_exact(9, 1);
        assert_eq!((c.exact(9), c.exact(8)), (&[1][..], &[][..]));
        c.insert_exact(9, 2);
        c.insert_exact(8, 3);
        let mut ids: Vec<u32> = c.ids().collect();
        ids.sort_unstable();
        assert_eq!(ids, [1, 2, 3]);
        assert!(!c.remove_exact(8, 1));
        assert!(c.remove_exact(9, 1) && c.remove_exact(8, 3));
        assert_eq!(c.exact(9), &[2][..]);
        assert!(c.remove_exact(9, 2) && c.is_empty() && c.ids().next().is_none());
        assert!(!c.remove_exact(9, 2));
    }

    #[test]
    fn scopes_never_partially_match() {
        let other = Scope {
            lora: Some(1),
            salt: None,
        };
        let keys = [(other, vec![1, 2, 3]), (Scope::default(), vec![7])];
        let key_of = |x: u32| keys.get(x as usize).map(|(s, t)| (*s, t.as_slice()));
        // One candidate (inline), then two (the ordered map).
        let mut c = Children::default();
        c.insert_partial(other, &[1, 2, 3], 0, key_of);
        for n in [1, 2] {
            assert_eq!(c.num_partial(), n);
            assert_eq!(c.best_partial(Scope::default(), &[1, 2, 3], key_of), None);
            assert_eq!(c.best_partial(other, &[1, 2, 9], key_of), Some((0, 2)));
            c.insert_partial(Scope::default(), &[7], 1, key_of);
        }
        assert_eq!(
            c.best_partial(Scope::default(), &[7, 7], key_of),
            Some((1, 1))
        );
    }
}
