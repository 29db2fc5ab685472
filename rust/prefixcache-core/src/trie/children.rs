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

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use super::key::{lcp, Scope};

#[derive(Debug, Default)]
pub(crate) struct Children {
    exact: FxHashMap<u64, SmallVec<[u32; 1]>>,
    partial: BTreeMap<(Scope, Box<[u32]>), u32>,
    len: usize,
}

impl Children {
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Children filed under the exact key hash `h` (compare their keys).
    pub(crate) fn exact(&self, h: u64) -> &[u32] {
        self.exact.get(&h).map_or(&[], |v| v.as_slice())
    }

    pub(crate) fn insert_exact(&mut self, h: u64, id: u32) {
        self.exact.entry(h).or_default().push(id);
        self.len += 1;
    }

    /// Removes `id` filed under `h`; false when it was not there.
    pub(crate) fn remove_exact(&mut self, h: u64, id: u32) -> bool {
        let Some(v) = self.exact.get_mut(&h) else {
            return false;
        };
        let Some(pos) = v.iter().position(|&x| x == id) else {
            return false;
        };
        v.swap_remove(pos);
        if v.is_empty() {
            self.exact.remove(&h);
        }
        self.len -= 1;
        true
    }

    /// Every child, in no particular order.
    pub(crate) fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.exact.values().flat_map(|v| v.iter().copied())
    }

    pub(crate) fn insert_partial(&mut self, scope: Scope, tokens: &[u32], id: u32) {
        self.partial.insert((scope, Box::from(tokens)), id);
    }

    pub(crate) fn remove_partial(&mut self, scope: Scope, tokens: &[u32]) -> Option<u32> {
        self.partial.remove(&(scope, Box::from(tokens)))
    }

    pub(crate) fn partial_contains(&self, scope: Scope, tokens: &[u32], id: u32) -> bool {
        self.partial.get(&(scope, Box::from(tokens))) == Some(&id)
    }

    pub(crate) fn num_partial(&self) -> usize {
        self.partial.len()
    }

    /// The candidate with the longest common token prefix with `q` (>= 1) in `scope`,
    /// and that length.
    pub(crate) fn best_partial(&self, scope: Scope, q: &[u32]) -> Option<(u32, usize)> {
        if self.partial.is_empty() || q.is_empty() {
            return None;
        }
        let probe = (scope, Box::<[u32]>::from(q));
        let mut best = 0usize;
        if let Some(((s, t), _)) = self.partial.range(..&probe).next_back() {
            if *s == scope {
                best = lcp(t, q);
            }
        }
        if let Some(((s, t), _)) = self.partial.range(&probe..).next() {
            if *s == scope {
                best = best.max(lcp(t, q));
            }
        }
        if best == 0 {
            return None;
        }
        let prefix = (scope, Box::<[u32]>::from(&q[..best]));
        let (_, &id) = self.partial.range(&prefix..).next()?;
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
                c.insert_partial(Scope::default(), &t, id);
                all.push((t, id));
            }
            for _ in 0..10 {
                let len = 1 + next() as usize + next() as usize;
                let q: Vec<u32> = (0..len).map(|_| next()).collect();
                assert_eq!(c.best_partial(Scope::default(), &q), brute(&all, &q));
            }
        }
    }

    #[test]
    fn scopes_never_partially_match() {
        let mut c = Children::default();
        let other = Scope {
            lora: Some(1),
            salt: None,
        };
        c.insert_partial(other, &[1, 2, 3], 5);
        assert_eq!(c.best_partial(Scope::default(), &[1, 2, 3]), None);
        assert_eq!(c.best_partial(other, &[1, 2, 9]), Some((5, 2)));
    }
}
