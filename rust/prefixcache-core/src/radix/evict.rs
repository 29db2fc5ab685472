//! Eviction: an ordered set of evictable leaves kept up to date on every change, so that
//! evicting k leaves costs O(k log L) instead of rebuilding a heap over all L leaves.

use super::children::child_key;
use super::policy::PolicyKey;
use super::tree::{RadixTree, ROOT};
use crate::{Error, Result};

impl RadixTree {
    fn is_evictable(&self, slot: u32) -> bool {
        let n = &self.nodes[slot as usize];
        slot != ROOT && n.lock_ref == 0 && n.children.is_empty()
    }

    pub(crate) fn set_entry(&self, slot: u32) -> (PolicyKey, u32) {
        let n = &self.nodes[slot as usize];
        let key = self
            .policy
            .key(n.last_access, n.creation, n.hit_count, n.priority, n.serial);
        (key, slot)
    }

    /// Takes `slot` out of the evictable set (before a change of its policy fields).
    pub(crate) fn unlist(&mut self, slot: u32) {
        if self.nodes[slot as usize].listed {
            let entry = self.set_entry(slot);
            self.evictable.remove(&entry);
            self.nodes[slot as usize].listed = false;
        }
    }

    /// Puts `slot` in the evictable set if it is an evictable leaf.
    pub(crate) fn relist(&mut self, slot: u32) {
        if !self.nodes[slot as usize].listed && self.is_evictable(slot) {
            let entry = self.set_entry(slot);
            self.evictable.insert(entry);
            self.nodes[slot as usize].listed = true;
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
            let Some(entry) = self.evictable.pop_first() else {
                break;
            };
            let slot = entry.1;
            let n = &mut self.nodes[slot as usize];
            n.listed = false;
            let parent = n.parent;
            let ck = child_key(n.ns, n.key[0]);
            let value = std::mem::take(&mut n.value);
            self.evictable_size -= value.len();
            freed.extend_from_slice(&value);
            let removed = self.nodes[parent as usize].children.remove(ck, slot);
            debug_assert!(removed, "evict: leaf not filed under its parent");
            self.release(slot);
            self.relist(parent);
        }
        Ok(freed)
    }
}
