//! Priority-LRU eviction: the sets of evictable free blocks, one per level (GPU, host),
//! ordered by `(priority, release sequence, block id)`, lowest priority first and least
//! recently released first within a priority; and the retention expiry set.
//!
//! A GPU block is evictable when nobody references it and it has no children on the GPU
//! (blocks outside the trie count as leaves; host children are allowed). A host block is
//! evictable when nobody references it and it has no children (which are all on host).
//! Since a referenced block's ancestors are referenced too, every free GPU block becomes
//! evictable once its free GPU descendants are gone, so the number of free GPU blocks is
//! exactly what can be allocated.

use super::key::DEFAULT_PRIORITY;
use super::trie::BlockTrie;
use super::types::TrieEvent;

impl BlockTrie {
    fn evict_entry(&self, b: u32) -> (u8, u64, u32) {
        let blk = &self.blocks[b as usize];
        (blk.priority, blk.seq, b)
    }

    pub(crate) fn should_list(&self, b: u32) -> bool {
        let blk = &self.blocks[b as usize];
        b != self.root
            && blk.ref_cnt == 0
            && if blk.host {
                blk.children.is_empty()
            } else {
                blk.gpu_children == 0
            }
    }

    /// Takes `b` out of its level's evictable set (before its priority, sequence or level
    /// changes).
    pub(crate) fn unlist(&mut self, b: u32) {
        if self.blocks[b as usize].listed {
            let e = self.evict_entry(b);
            if self.blocks[b as usize].host {
                self.host_evictable.remove(&e);
            } else {
                self.evictable.remove(&e);
            }
            self.blocks[b as usize].listed = false;
        }
    }

    /// Brings `b`'s evictable-set and partial-index membership up to date.
    pub(crate) fn sync(&mut self, b: u32) {
        let want = self.should_list(b);
        let listed = self.blocks[b as usize].listed;
        if want && !listed {
            let e = self.evict_entry(b);
            if self.blocks[b as usize].host {
                self.host_evictable.insert(e);
            } else {
                self.evictable.insert(e);
            }
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

    /// Takes the first block of a level's eviction order and unlists it: the first of its
    /// evictable set or its next never-used block, whichever comes first (a never-used
    /// block ranks `(DEFAULT_PRIORITY, id, id)`, as if it were in the set: arena.rs).
    pub(crate) fn pop_evictable(&mut self, host: bool) -> Option<u32> {
        let set = if host {
            &mut self.host_evictable
        } else {
            &mut self.evictable
        };
        let unused = self.blocks.next_unused(host);
        let listed_first = match (set.first(), unused) {
            (Some(&e), Some(u)) => e < (DEFAULT_PRIORITY, u64::from(u), u),
            (first, _) => first.is_some(),
        };
        if listed_first {
            let (_, _, b) = set.pop_first()?;
            self.blocks[b as usize].listed = false;
            Some(b)
        } else {
            self.blocks.take_unused(host)
        }
    }

    /// Takes the first evictable GPU block and returns a GPU block, unreferenced, unlisted
    /// and outside the trie: with a host tier a cached victim may be offloaded (it stays
    /// cached, in host memory, and a host block takes its place: host.rs); otherwise a
    /// cached victim leaves the trie with its host descendants (`Removed` events).
    pub(crate) fn pop_victim(&mut self) -> Option<u32> {
        let b = self.pop_evictable(false)?;
        self.unexpire(b);
        let Some(k) = &self.blocks[b as usize].key else {
            return Some(b);
        };
        let len = k.tokens.len() as u64;
        if let Some(h) = self.try_offload(b) {
            return Some(h);
        }
        if self.blocks[b as usize].children.is_empty() {
            self.stats.evicted_blocks += 1;
            self.stats.evicted_tokens += len;
            self.detach(b);
        } else {
            self.evict_with_host_descendants(b, len);
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
        if self.blocks[b as usize].host {
            self.num_host_cached -= 1;
            self.num_host_cached_tokens -= key.tokens.len();
        } else {
            self.num_cached -= 1;
            self.num_cached_tokens -= key.tokens.len();
            self.blocks[parent as usize].gpu_children -= 1;
        }
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
        if self.events_enabled {
            self.events.push(TrieEvent::Removed {
                block_ids: vec![b],
                block_hashes: vec![hash],
            });
        }
        self.sync(parent);
    }
}
