//! Eviction: the evictable leaves in an indexed binary min-heap kept up to date on every
//! change, so that evicting k leaves costs O(k log L) instead of rebuilding a heap over all
//! L leaves. The heap holds only slots (4 bytes a leaf) and each node its position in it;
//! keys are read off the nodes. Keys are unique (they end with the serial), so the order
//! of eviction is a total order, the same as a sorted set's.
//!
//! A childless node keeps its heap position in its child index's words
//! ([`Children::heap_pos`](super::children::Children::heap_pos)). With a host tier a
//! listed device leaf can still have (host-only) children: its position is then in the
//! tree's `heap_side` table. [`RadixTree::heap_pos`] reads either, and the child index
//! changes of a listed node go through [`RadixTree::remove_child`], which moves the
//! position to the words when the last child goes.

use super::children::{child_key, UNLISTED};
use super::node::{shrink, shrink_vec};
use super::span::Span;
use super::tree::{RadixTree, ROOT};
use crate::{Error, Result};

impl RadixTree {
    fn is_evictable(&self, slot: u32) -> bool {
        let n = &self.nodes[slot as usize];
        slot != ROOT && n.lock_ref == 0 && !self.is_evicted(slot) && !self.has_device_children(slot)
    }

    /// The node's position in the evictable heap ([`UNLISTED`] if it is not there).
    #[inline(always)]
    pub(crate) fn heap_pos(&self, slot: u32) -> u32 {
        let c = &self.nodes[slot as usize].children;
        if c.is_empty() {
            return c.heap_pos();
        }
        if self.heap_side.is_empty() {
            return UNLISTED;
        }
        self.side_heap_pos(slot)
    }

    #[cold]
    #[inline(never)]
    fn side_heap_pos(&self, slot: u32) -> u32 {
        self.heap_side.get(&slot).copied().unwrap_or(UNLISTED)
    }

    /// Whether the node is in the evictable set.
    #[inline(always)]
    pub(crate) fn listed(&self, slot: u32) -> bool {
        self.heap_pos(slot) != UNLISTED
    }

    /// Records the node's heap position ([`UNLISTED`]: not in the heap).
    #[inline(always)]
    fn set_heap_pos(&mut self, slot: u32, pos: u32) {
        let c = &mut self.nodes[slot as usize].children;
        if c.is_empty() {
            c.set_heap_pos(pos);
            return;
        }
        self.set_side_heap_pos(slot, pos);
    }

    #[cold]
    #[inline(never)]
    fn set_side_heap_pos(&mut self, slot: u32, pos: u32) {
        if pos == UNLISTED {
            self.heap_side.remove(&slot);
            self.shrink_heap_side();
        } else {
            // Only a tree with a host tier lists nodes with children (device leaves with
            // host-only children). `host_reserve` keeps room here for twice the slots,
            // so a new entry never allocates (a table short of free buckets after many
            // removals is rehashed in place), and a moved one is updated in place.
            match self.heap_side.get_mut(&slot) {
                Some(p) => *p = pos,
                None => {
                    debug_assert!(self.heap_side.len() < self.heap_side.capacity());
                    self.heap_side.insert(slot, pos);
                }
            }
        }
    }

    /// Gives back what the side table of heap positions no longer needs, unless a host
    /// tier keeps its room.
    fn shrink_heap_side(&mut self) {
        if self.host.is_none() {
            shrink(&mut self.heap_side);
        }
    }

    /// Removes `child` (filed under `key`) from `parent`'s child index, keeping the
    /// parent's heap position (it moves into the words when the last child goes).
    /// Returns whether the child was there.
    pub(crate) fn remove_child(&mut self, parent: u32, key: u64, child: u32) -> bool {
        let pos = self.heap_pos(parent);
        let c = &mut self.nodes[parent as usize].children;
        let removed = c.remove(key, child, &mut self.indexes);
        if pos != UNLISTED && c.is_empty() {
            c.set_heap_pos(pos);
            self.heap_side.remove(&parent);
            self.shrink_heap_side();
        }
        removed
    }

    #[inline]
    fn place(&mut self, i: usize, slot: u32) {
        self.evictable[i] = slot;
        self.set_heap_pos(slot, i as u32);
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
    pub(crate) fn remove_at(&mut self, i: usize) -> u32 {
        let slot = self.evictable[i];
        self.set_heap_pos(slot, UNLISTED);
        let Some(last) = self.evictable.pop() else {
            return slot;
        };
        if i < self.evictable.len() {
            self.place(i, last);
            self.sift_down(i);
            let j = self.heap_pos(last) as usize;
            if j == i {
                self.sift_up(i);
            }
        }
        // Memory follows the cached content: give back what a large set held.
        if self.evictable.capacity() > 64 && self.evictable.len() * 4 < self.evictable.capacity() {
            // Room for one more stays: an eviction relists the parent of each leaf it
            // takes, an insert the node it unlisted, without allocating.
            let cap = (self.evictable.len() * 2).max(4);
            shrink_vec(&mut self.evictable, cap);
        }
        slot
    }

    /// Takes `slot` out of the evictable set (before a change of its policy fields).
    pub(crate) fn unlist(&mut self, slot: u32) {
        let pos = self.heap_pos(slot);
        if pos != UNLISTED {
            self.remove_at(pos as usize);
        }
    }

    /// Puts `slot` in the evictable set if it is an evictable leaf.
    pub(crate) fn relist(&mut self, slot: u32) {
        if !self.listed(slot) && self.is_evictable(slot) {
            self.evictable.push(slot);
            let i = self.evictable.len() - 1;
            self.set_heap_pos(slot, i as u32);
            self.sift_up(i);
        }
    }

    /// Number of evictable leaves.
    pub fn num_evictable_leaves(&self) -> usize {
        self.evictable.len()
    }

    /// Evicts whole leaves in policy order until at least `num_tokens` tokens are freed or
    /// nothing evictable is left; returns the freed KV indices in eviction order. With a
    /// host tier, leaves are device leaves and a backed-up one stays host-only (host.rs).
    pub fn evict(&mut self, num_tokens: i64) -> Result<Vec<i64>> {
        let target = evict_target(num_tokens)?;
        // Reserve once: whole-leaf eviction overshoots by at most one leaf.
        let expected = usize::try_from(target)
            .unwrap_or(usize::MAX)
            .min(self.evictable_size);
        let mut freed: Vec<i64> = Vec::new();
        freed
            .try_reserve_exact(expected)
            .map_err(|e| Error::out_of_memory("the evicted KV indices", e))?;
        self.evict_into(target, &mut freed);
        Ok(freed)
    }

    /// Evicts exactly as [`evict`](Self::evict) does (the same leaves, in the same
    /// order), but returns only the number of tokens freed: no indices are gathered.
    pub fn evict_count(&mut self, num_tokens: i64) -> Result<usize> {
        let target = evict_target(num_tokens)?;
        let mut freed = FreedCount(0);
        self.evict_into(target, &mut freed);
        Ok(freed.0)
    }

    /// The eviction loop of [`evict`](Self::evict) and [`evict_count`](Self::evict_count).
    fn evict_into<S: FreedSink>(&mut self, target: u64, freed: &mut S) {
        if self.host.is_some() {
            self.evict_with_host(target, freed);
            return;
        }
        while (freed.count() as u64) < target {
            let Some(&next) = self.evictable.first() else {
                break;
            };
            if !freed.make_room(self.nodes[next as usize].span.len()) {
                // The list of freed indices cannot grow: what was evicted is returned.
                break;
            }
            let slot = self.remove_at(0);
            let n = &self.nodes[slot as usize];
            let parent = n.parent;
            let ck = child_key(self.ns(slot), n.span.key()[0]);
            self.evictable_size -= n.span.len();
            freed.take(&n.span);
            let removed = self.remove_child(parent, ck, slot);
            debug_assert!(removed, "evict: leaf not filed under its parent");
            self.release(slot);
            self.relist(parent);
        }
    }
}

/// `num_tokens` of an eviction, checked.
fn evict_target(num_tokens: i64) -> Result<u64> {
    u64::try_from(num_tokens)
        .map_err(|_| Error::InvalidArgument(format!("num_tokens must be >= 0, got {num_tokens}")))
}

/// Where an eviction puts what it frees: the KV indices ([`Vec<i64>`]) or only their
/// number ([`FreedCount`]).
pub(crate) trait FreedSink {
    /// Room for `n` more tokens; false when it cannot be allocated.
    fn make_room(&mut self, n: usize) -> bool;
    /// Takes the device KV of an evicted node.
    fn take(&mut self, span: &Span);
    /// Tokens taken so far.
    fn count(&self) -> usize;
}

impl FreedSink for Vec<i64> {
    #[inline]
    fn make_room(&mut self, n: usize) -> bool {
        self.try_reserve(n).is_ok()
    }

    #[inline]
    fn take(&mut self, span: &Span) {
        span.extend_values(self);
    }

    #[inline]
    fn count(&self) -> usize {
        self.len()
    }
}

/// Counts the freed tokens without gathering their indices.
pub(crate) struct FreedCount(pub(crate) usize);

impl FreedSink for FreedCount {
    #[inline]
    fn make_room(&mut self, _: usize) -> bool {
        true
    }

    #[inline]
    fn take(&mut self, span: &Span) {
        self.0 += span.len();
    }

    #[inline]
    fn count(&self) -> usize {
        self.0
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
                        t.match_prefix(&key[..2], &ns).unwrap();
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
