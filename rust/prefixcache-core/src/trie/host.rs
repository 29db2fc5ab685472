//! The secondary (host) tier, as TensorRT-LLM's `WindowBlockManager` has it
//! (`getFreeBlock`, `onboardBlock`; docs/TRTLLM.md):
//!
//! - Blocks are objects that keep their id; `host` says which memory (level) holds their
//!   KV. Exactly `num_blocks` of them are on the GPU at any time and `host_blocks` on
//!   host; moving a block between the levels swaps the memory of two blocks.
//! - Offload: when a GPU victim holds a cached block, its priority is at least
//!   `secondary_offload_min_priority` and a host block is evictable, the first evictable
//!   host block (lowest priority first, LRU within) gives its memory: the victim stays in
//!   the trie, now in host memory, at the back of its priority's host queue (its
//!   retention duration dropped, as `claimBlock` without one drops it), and the host
//!   block (leaving the trie if it was cached) becomes the GPU block handed out.
//! - Otherwise a cached victim leaves the trie together with its host descendants
//!   (children first, as `freeChildren`).
//! - Onboard: a claim whose match holds host blocks moves each to the GPU in block order:
//!   a GPU block is taken as for an allocation (which may itself offload) and swapped in;
//!   the emptied host block goes to the back of the host queue at the default priority.
//! - Invariant: a cached GPU block's parent is on the GPU (or the root), so host blocks
//!   form subtrees hanging below GPU blocks.

use super::key::DEFAULT_PRIORITY;
use super::trie::BlockTrie;
use super::types::{Medium, TrieEvent};

impl BlockTrie {
    fn note_host_peak(&mut self) {
        let t = self.num_host_cached_tokens as u64;
        if t > self.host_stats.peak_host_tokens {
            self.host_stats.peak_host_tokens = t;
        }
    }

    fn moved_event(&mut self, b: u32, medium: Medium) {
        if self.events_enabled && self.blocks[b as usize].key.is_some() {
            self.events.push(TrieEvent::Moved {
                block_ids: vec![b],
                block_hashes: vec![self.blocks[b as usize].hash],
                medium,
            });
        }
    }

    /// Moves unlisted, unreferenced-or-not block `b` to `host`, keeping the cached
    /// counts and the parent's GPU-children count right.
    fn set_level(&mut self, b: u32, host: bool) {
        debug_assert!(
            !self.blocks[b as usize].listed,
            "set_level of a listed block"
        );
        if self.blocks[b as usize].host == host {
            return;
        }
        self.blocks[b as usize].host = host;
        let Some(len) = self.blocks[b as usize].key.as_ref().map(|k| k.tokens.len()) else {
            return;
        };
        let parent = self.blocks[b as usize].parent;
        if host {
            self.num_cached -= 1;
            self.num_cached_tokens -= len;
            self.num_host_cached += 1;
            self.num_host_cached_tokens += len;
            self.blocks[parent as usize].gpu_children -= 1;
        } else {
            self.num_host_cached -= 1;
            self.num_host_cached_tokens -= len;
            self.num_cached += 1;
            self.num_cached_tokens += len;
            self.blocks[parent as usize].gpu_children += 1;
        }
        self.sync(parent);
    }

    /// Offloads the popped GPU victim `v` (cached, unreferenced, unlisted) when the rules
    /// allow; returns the block that takes its place on the GPU (unlisted, outside the
    /// trie), or None when `v` was not offloaded.
    pub(crate) fn try_offload(&mut self, v: u32) -> Option<u32> {
        if self.host_blocks == 0 || self.blocks[v as usize].priority < self.offload_min_priority {
            return None;
        }
        let h = self.pop_evictable(true)?;
        self.unexpire(h);
        let len = self.blocks[v as usize]
            .key
            .as_ref()
            .map_or(0, |k| k.tokens.len() as u64);
        // The victim keeps its priority, loses its retention, goes to the back of the
        // host queue.
        self.set_level(v, true);
        self.blocks[v as usize].duration = None;
        self.blocks[v as usize].seq = self.next_seq();
        self.host_stats.offloaded_blocks += 1;
        self.host_stats.stored_tokens += len;
        self.moved_event(v, Medium::Cpu);
        self.sync(v);
        // The host block's own content (if any) leaves the trie; it becomes a GPU block.
        if let Some(k) = &self.blocks[h as usize].key {
            self.host_stats.host_evicted_blocks += 1;
            self.host_stats.host_evicted_tokens += k.tokens.len() as u64;
            self.detach(h);
        }
        self.set_level(h, false);
        self.note_host_peak();
        Some(h)
    }

    /// Evicts GPU victim `v` (cached, unreferenced, unlisted, without GPU children) and
    /// its host descendants: children before parents, siblings in id order.
    pub(crate) fn evict_with_host_descendants(&mut self, v: u32, len: u64) {
        // Post-order: a stack of (block, children expanded).
        let mut order = Vec::new();
        let mut stack = vec![(v, false)];
        while let Some((b, expanded)) = stack.pop() {
            if expanded {
                order.push(b);
                continue;
            }
            stack.push((b, true));
            let mut kids: Vec<u32> = self.blocks[b as usize].children.ids().collect();
            kids.sort_unstable_by(|a, b| b.cmp(a));
            stack.extend(kids.into_iter().map(|c| (c, false)));
        }
        for &b in &order {
            if b == v {
                self.stats.evicted_blocks += 1;
                self.stats.evicted_tokens += len;
            } else {
                debug_assert!(self.blocks[b as usize].host, "a GPU descendant of a victim");
                // Out of the trie it stays in the host queue where it was.
                self.unlist(b);
                let n = self.blocks[b as usize]
                    .key
                    .as_ref()
                    .map_or(0, |k| k.tokens.len() as u64);
                self.host_stats.host_evicted_blocks += 1;
                self.host_stats.host_evicted_tokens += n;
            }
            self.detach(b);
            if b != v {
                self.sync(b);
            }
        }
        // Detaching its children listed `v` again: it is the caller's now.
        self.unlist(v);
    }

    /// Moves referenced host block `b` to the GPU (TensorRT-LLM's `onboardBlock`): takes
    /// a GPU block as an allocation does and swaps the two.
    pub(crate) fn onboard(&mut self, b: u32) -> crate::Result<()> {
        let g = self.pop_victim().ok_or(crate::Error::OutOfBlocks {
            requested: 1,
            available: 0,
        })?;
        // `g` was a free GPU block: it becomes an empty host block at the back of the
        // default queue.
        self.num_free -= 1;
        self.set_level(g, true);
        let seq = self.next_seq();
        let blk = &mut self.blocks[g as usize];
        blk.priority = DEFAULT_PRIORITY;
        blk.duration = None;
        blk.seq = seq;
        self.sync(g);
        self.set_level(b, false);
        self.host_stats.onboarded_blocks += 1;
        self.moved_event(b, Medium::Gpu);
        self.sync(b);
        Ok(())
    }
}
