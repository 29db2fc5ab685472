//! Priority-LRU eviction: the set of evictable free blocks ordered by
//! `(priority, release sequence, block id)`, lowest priority first and least recently
//! released first within a priority; and the retention expiry set.
//!
//! A block is evictable when nobody references it and it has no children in the trie
//! (blocks outside the trie count as leaves). Since a referenced block's ancestors are
//! referenced too, every free block becomes evictable once its free descendants are gone,
//! so the number of free blocks is exactly what can be allocated.

use super::key::DEFAULT_PRIORITY;
use super::trie::BlockTrie;
use super::types::TrieEvent;

impl BlockTrie {
    fn evict_entry(&self, b: u32) -> (u8, u64, u32) {
        let blk = &self.blocks[b as usize];
        (blk.priority, blk.seq, b)
    }

    fn should_list(&self, b: u32) -> bool {
        let blk = &self.blocks[b as usize];
        b != self.root && blk.ref_cnt == 0 && blk.children.is_empty()
    }

    /// Takes `b` out of the evictable set (before its priority or sequence changes).
    pub(crate) fn unlist(&mut self, b: u32) {
        if self.blocks[b as usize].listed {
            let e = self.evict_entry(b);
            self.evictable.remove(&e);
            self.blocks[b as usize].listed = false;
        }
    }

    /// Brings `b`'s evictable-set and partial-index membership up to date.
    pub(crate) fn sync(&mut self, b: u32) {
        let want = self.should_list(b);
        let listed = self.blocks[b as usize].listed;
        if want && !listed {
            let e = self.evict_entry(b);
            self.evictable.insert(e);
            self.blocks[b as usize].listed = true;
        } else if !want && listed {
            self.unlist(b);
        }
        self.sync_partial(b);
    }

    /// Drops `b` from the expiry set (it was claimed or its retention ended).
    pub(crate) fn unexpire(&mut self, b: u32) {
        if let Some(t) = self.blocks[b as usize].expiry.take() {
            self.expiring.remove(&(t, b));
        }
    }

    /// Retention: free blocks whose retention ran out drop to the default priority and go
    /// to the back of its queue.
    pub(crate) fn refresh(&mut self) {
        while let Some(&(t, b)) = self.expiring.first() {
            if t > self.clock {
                break;
            }
            self.expiring.remove(&(t, b));
            self.blocks[b as usize].expiry = None;
            if self.blocks[b as usize].ref_cnt == 0 {
                self.unlist(b);
                self.blocks[b as usize].priority = DEFAULT_PRIORITY;
                self.blocks[b as usize].seq = self.next_seq();
                self.sync(b);
            }
        }
    }

    /// Takes the first evictable block, removes it from the trie if it was cached (one
    /// `Removed` event) and returns it unreferenced and unlisted.
    pub(crate) fn pop_victim(&mut self) -> Option<u32> {
        let (_, _, b) = self.evictable.pop_first()?;
        self.blocks[b as usize].listed = false;
        self.unexpire(b);
        if let Some(k) = &self.blocks[b as usize].key {
            self.stats.evicted_blocks += 1;
            self.stats.evicted_tokens += k.tokens.len() as u64;
            self.detach(b);
        }
        Some(b)
    }

    /// Removes a cached block from the trie (it must be childless) and emits `Removed`;
    /// does nothing for a block outside the trie.
    pub(crate) fn detach(&mut self, b: u32) {
        let parent = self.blocks[b as usize].parent;
        self.drop_partial(b);
        let Some(key) = self.blocks[b as usize].key.take() else {
            return;
        };
        self.num_cached -= 1;
        self.num_cached_tokens -= key.tokens.len();
        if let Some(s) = key.scope.salt {
            self.salts.release(s);
        }
        for &(id, _) in &key.mm {
            self.mm_hashes.release(id);
        }
        let removed = self.blocks[parent as usize]
            .children
            .remove_exact(key.exact_hash(), b);
        debug_assert!(removed, "detach: block not filed under its parent");
        self.blocks[b as usize].parent = self.root;
        let hash = self.blocks[b as usize].hash;
        self.blocks[b as usize].hash = 0;
        self.events.push(TrieEvent::Removed {
            block_ids: vec![b],
            block_hashes: vec![hash],
        });
        self.sync(parent);
    }
}
