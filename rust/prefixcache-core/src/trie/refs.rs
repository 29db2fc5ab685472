//! References, allocation and the partial-match index of the block trie.

use super::key::{BlockKey, DEFAULT_PRIORITY};
use super::trie::BlockTrie;
use crate::{Error, Result};

impl BlockTrie {
    // ----- references -----------------------------------------------------------------

    pub(super) fn ref_inc(&mut self, b: u32) {
        if self.blocks[b as usize].ref_cnt == 0 {
            self.unlist(b);
            self.unexpire(b);
            if !self.blocks[b as usize].host {
                self.num_free -= 1;
            }
        }
        self.blocks[b as usize].ref_cnt += 1;
        self.sync(b);
    }

    pub(super) fn ref_dec(&mut self, b: u32) {
        let blk = &mut self.blocks[b as usize];
        debug_assert!(blk.ref_cnt > 0, "ref_dec of a free block");
        blk.ref_cnt = blk.ref_cnt.saturating_sub(1);
        if blk.ref_cnt == 0 {
            if !blk.host {
                self.num_free += 1;
            }
            let seq = self.next_seq();
            let clock = self.clock;
            let blk = &mut self.blocks[b as usize];
            blk.seq = seq;
            if let (Some(d), true) = (blk.duration, blk.priority != DEFAULT_PRIORITY) {
                let t = clock.saturating_add(d);
                blk.expiry = Some(t);
                self.expiring.insert((t, b));
            }
        }
        self.sync(b);
    }

    pub(super) fn alloc_fresh(&mut self, priority: u8, duration: Option<u64>) -> Result<u32> {
        let b = self.pop_victim().ok_or(Error::OutOfBlocks {
            requested: 1,
            available: 0,
        })?;
        self.num_free -= 1;
        let blk = &mut self.blocks[b as usize];
        blk.ref_cnt = 1;
        blk.priority = priority;
        blk.duration = duration;
        self.stats.allocated_blocks += 1;
        self.sync(b);
        Ok(b)
    }

    /// Partial-index membership: cached, no multimodal keys, and (without copy on partial
    /// reuse) an unreferenced leaf.
    pub(crate) fn wants_partial(&self, b: u32) -> bool {
        let blk = &self.blocks[b as usize];
        match &blk.key {
            Some(k) if k.mm.is_empty() => {
                self.copy_on_partial_reuse || (blk.ref_cnt == 0 && blk.children.is_empty())
            }
            _ => false,
        }
    }

    /// The scope and tokens of block `b`'s key (None when it is not cached).
    pub(crate) fn key_of(&self, b: u32) -> Option<(super::key::Scope, &[u32])> {
        let k = self.blocks[b as usize].key.as_ref()?;
        Some((k.scope, &k.tokens))
    }

    pub(crate) fn sync_partial(&mut self, b: u32) {
        let want = self.wants_partial(b);
        if want == self.blocks[b as usize].in_partial {
            return;
        }
        if want {
            let parent = self.blocks[b as usize].parent;
            // The parent's index is taken out while it reads the blocks' keys.
            let mut children = std::mem::take(&mut self.blocks[parent as usize].children);
            if let Some((scope, tokens)) = self.key_of(b) {
                children.insert_partial(scope, tokens, b, |x| self.key_of(x));
                self.blocks[b as usize].in_partial = true;
            }
            self.blocks[parent as usize].children = children;
        } else {
            self.drop_partial(b);
        }
    }

    pub(crate) fn drop_partial(&mut self, b: u32) {
        if !self.blocks[b as usize].in_partial {
            return;
        }
        let parent = self.blocks[b as usize].parent;
        let mut children = std::mem::take(&mut self.blocks[parent as usize].children);
        if let Some((scope, tokens)) = self.key_of(b) {
            children.remove_partial(scope, tokens, b);
        }
        self.blocks[parent as usize].children = children;
        self.blocks[b as usize].in_partial = false;
    }

    pub(super) fn attach(&mut self, b: u32, parent: u32, key: BlockKey) {
        let parent_hash = (parent != self.root).then(|| self.blocks[parent as usize].hash);
        let hash = self.chain_hash(parent_hash, &key);
        let key_len = key.tokens.len();
        self.blocks[parent as usize]
            .children
            .insert_exact(key.exact_hash(), b);
        debug_assert!(!self.blocks[b as usize].host, "attach: a host block");
        self.blocks[parent as usize].gpu_children += 1;
        if let Some(s) = key.scope.salt {
            self.salts.retain(s);
        }
        for &(id, _) in &key.mm {
            self.mm_hashes.retain(id);
        }
        let blk = &mut self.blocks[b as usize];
        blk.key = Some(key);
        blk.parent = parent;
        blk.hash = hash;
        self.num_cached += 1;
        self.num_cached_tokens += key_len;
        self.sync(b);
        self.sync(parent);
    }
}
