//! Eviction: the evictable leaves in an indexed binary min-heap kept up to date on every
//! change, so that evicting k leaves costs O(k log L) instead of rebuilding a heap over all
//! L leaves. The heap holds only slots (4 bytes a leaf) and each node its position in it;
//! keys are read off the nodes. Keys are unique (they end with the serial), so the order
//! of eviction is a total order, the same as a sorted set's.

use super::children::{child_key, UNLISTED};
use super::tree::{RadixTree, ROOT};
use crate::{Error, Result};

impl RadixTree {
    fn is_evictable(&self, slot: u32) -> bool {
        let n = &self.nodes[slot as usize];
        slot != ROOT && n.lock_ref == 0 && n.children.is_empty()
    }

    #[inline]
    fn place(&mut self, i: usize, slot: u32) {
        self.evictable[i] = slot;
        self.nodes[slot as usize].children.set_heap_pos(i as u32);
    }

    fn sift_up(&mut self, mut i: usize) {
        let slot = self.evictable[i];
        let key = self.policy_key(slot);
        while i > 0 {
            let parent = (i - 1) / 2;
            let p = self.evictable[parent];
            if self.policy_key(p) <= key {
                break;
            }
            self.place(i, p);
            i = parent;
        }
        self.place(i, slot);
    }

    fn sift_down(&mut self, mut i: usize) {
        let len = self.evictable.len();
        let slot = self.evictable[i];
        let key = self.policy_key(slot);
        loop {
            let left = 2 * i + 1;
            if left >= len {
                break;
            }
            let mut child = left;
            let mut child_key = self.policy_key(self.evictable[left]);
            if left + 1 < len {
                let right_key = self.policy_key(self.evictable[left + 1]);
                if right_key < child_key {
                    child = left + 1;
                    child_key = right_key;
                }
            }
            if key <= child_key {
                break;
            }
            self.place(i, self.evictable[child]);
            i = child;
        }
        self.place(i, slot);
    }

    /// Takes the entry at heap position `i` out; returns its slot.
    fn remove_at(&mut self, i: usize) -> u32 {
        let slot = self.evictable[i];
        self.nodes[slot as usize].children.set_heap_pos(UNLISTED);
        let Some(last) = self.evictable.pop() else {
            return slot;
        };
        if i < self.evictable.len() {
            self.place(i, last);
            self.sift_down(i);
            let j = self.nodes[last as usize].children.heap_pos() as usize;
            if j == i {
                self.sift_up(i);
            }
        }
        // Memory follows the cached content: give back what a large set held.
        if self.evictable.capacity() > 64 && self.evictable.len() * 4 < self.evictable.capacity() {
            self.evictable.shrink_to(self.evictable.len() * 2);
        }
        slot
    }

    /// Takes `slot` out of the evictable set (before a change of its policy fields).
    pub(crate) fn unlist(&mut self, slot: u32) {
        let pos = self.nodes[slot as usize].children.heap_pos();
        if pos != UNLISTED {
            self.remove_at(pos as usize);
        }
    }

    /// Puts `slot` in the evictable set if it is an evictable leaf.
    pub(crate) fn relist(&mut self, slot: u32) {
        if !self.nodes[slot as usize].listed() && self.is_evictable(slot) {
            self.evictable.push(slot);
            let i = self.evictable.len() - 1;
            self.nodes[slot as usize].children.set_heap_pos(i as u32);
            self.sift_up(i);
        }
    }

    /// Number of evictable leaves.
    pub fn num_evictable_leaves(&self) -> usize {
        self.evictable.len()
    }

    /// Evicts whole leaves in policy order until at least `num_tokens` tokens are freed or
    /// nothing evictable is left; returns the freed KV indices in eviction order.
    pub fn evict(&mut self, num_tokens: i64) -> Result<Vec<i64>> {
        if num_tokens < 0 {
            return Err(Error::InvalidArgument(format!(
                "num_tokens must be >= 0, got {num_tokens}"
            )));
        }
        let target = num_tokens as u64;
        // Reserve once: whole-leaf eviction overshoots by at most one leaf.
        let expected = usize::try_from(target)
            .unwrap_or(usize::MAX)
            .min(self.evictable_size);
        let mut freed: Vec<i64> = Vec::with_capacity(expected);
        while (freed.len() as u64) < target {
            if self.evictable.is_empty() {
                break;
            }
            let slot = self.remove_at(0);
            let n = &self.nodes[slot as usize];
            let parent = n.parent;
            let ck = child_key(self.ns(slot), n.span.key()[0]);
            self.evictable_size -= n.span.len();
            n.span.extend_values(&mut freed);
            let removed = self.nodes[parent as usize]
                .children
                .remove(ck, slot, &mut self.indexes);
            debug_assert!(removed, "evict: leaf not filed under its parent");
            self.release(slot);
            self.relist(parent);
        }
        Ok(freed)
    }
}

#[cfg(test)]
mod tests {
    use super::super::policy::EvictionPolicy;
    use super::super::tree::{Namespace, RadixTree};

    /// A replay with churn (fill, evict everything, again) must not grow: slots are
    /// reused, the heap gives back what a large set held, and the invariants hold.
    #[test]
    fn churn_does_not_grow_the_tree() {
        let ns = Namespace::default();
        for policy in EvictionPolicy::ALL {
            let mut t = RadixTree::new(1, policy).expect("tree");
            let mut sizes = Vec::new();
            for round in 0..6u32 {
                for i in 0..3000u32 {
                    let key = [i % 3, (i / 3) % 3, i + round * 100_000, 7];
                    let values = [i64::from(i), -1, 1 << 40, 5];
                    t.insert(&key, Some(&values), &ns, 0, 0).expect("insert");
                    if i % 5 == 0 {
                        t.match_prefix(&key[..2], &ns);
                    }
                }
                t.check_invariants().expect("invariants");
                let cap = t.evictable.capacity();
                let cached = t.total_size();
                let freed = t.evict(1 << 40).expect("evict");
                assert_eq!(freed.len(), cached);
                assert_eq!(t.total_size(), 0);
                t.check_invariants().expect("invariants");
                sizes.push((t.nodes.len(), cap));
                assert!(t.evictable.capacity() <= 64, "{}", t.evictable.capacity());
            }
            assert!(
                sizes
                    .windows(2)
                    .all(|w| w[1].0 == w[0].0 && w[1].1 <= w[0].1),
                "{sizes:?}"
            );
        }
    }
}
