//! The block trie: lookup, two-phase claim, store, extend, release (SEMANTICS.md
//! section 3).
//!
//! - Blocks `0..num_blocks` are all usable (TensorRT-LLM has no null block); the root is
//!   an extra slot that never holds tokens.
//! - A prompt of `n` tokens occupies `ceil(n / tokens_per_block)` context blocks; its
//!   first `n - 1` tokens are split into keys (the last one possibly partial).
//! - `claim` walks the trie: a full block found by its exact key is reused and the walk
//!   goes on; a non-full block found by its exact key, or (with partial reuse) the child
//!   with the longest common token prefix, is a *partial* match and ends the walk: an
//!   unreferenced leaf is taken over (it leaves the trie), otherwise a fresh block is
//!   allocated and a copy recorded; the copy source stays referenced (pinned) until
//!   `complete` (phase two). Every other block is fresh.
//! - `store` files the request's blocks under their keys, stopping at the first key
//!   another block already holds.
//! - `release` drops the references in reverse block order; blocks reaching zero become
//!   free at the back of their priority's LRU queue.

//!
//! This file holds the blocks, the requests and the trie's state with its constructor and
//! getters; the operations are in `lookup.rs` (keys and planning a claim), `refs.rs`
//! (references, allocation, the partial index), `requests.rs` (claim, complete, extend,
//! store, release); the public result types in `types.rs`, interning in `interner.rs`.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

use super::arena::BlockArena;
use super::children::Children;
use super::interner::Interner;
use super::key::{
    BlockKey, MmItem, Scope, DEFAULT_PRIORITY, DEFAULT_SECONDARY_OFFLOAD_MIN_PRIORITY, MAX_PRIORITY,
};
use super::types::{BlockDump, TrieEvent, TrieHostStats, TrieStats};
use crate::error::try_vec;
use crate::{Error, Result};

pub(crate) struct Block {
    /// Some iff the block is cached in the trie.
    pub key: Option<BlockKey>,
    /// The parent when cached (the root slot for first blocks).
    pub parent: u32,
    pub children: Children,
    /// References by requests' block lists plus copy pins.
    pub ref_cnt: u32,
    pub priority: u8,
    /// Retention duration in clock ticks.
    pub duration: Option<u64>,
    /// When a free block's retention ends (then it is in the expiry set).
    pub expiry: Option<u64>,
    /// Release sequence number: LRU order within a priority.
    pub seq: u64,
    /// In the evictable set.
    pub listed: bool,
    /// In the parent's partial-match index.
    pub in_partial: bool,
    /// Chained content hash reported in events (0 when not cached).
    pub hash: u64,
    /// In host memory (the secondary level); GPU otherwise.
    pub host: bool,
    /// Children on the GPU (a GPU block is evictable only without them).
    pub gpu_children: u32,
}

impl Block {
    pub(super) fn new(seq: u64) -> Self {
        Block {
            key: None,
            parent: 0,
            children: Children::default(),
            ref_cnt: 0,
            priority: DEFAULT_PRIORITY,
            duration: None,
            expiry: None,
            seq,
            listed: false,
            in_partial: false,
            hash: 0,
            host: false,
            gpu_children: 0,
        }
    }
}

pub(super) struct Request {
    pub(super) blocks: Vec<u32>,
    pub(super) pins: Vec<u32>,
    pub(super) tokens: Vec<u32>,
    pub(super) scope: Scope,
    pub(super) mm: Vec<MmItem>,
}

/// TensorRT-LLM's block manager with block reuse (one attention window, beam width 1).
pub struct BlockTrie {
    pub(crate) blocks: BlockArena,
    pub(crate) root: u32,
    /// GPU blocks (ids `0..num_gpu_blocks` at first).
    pub(crate) num_gpu_blocks: usize,
    pub(super) tokens_per_block: usize,
    pub(super) enable_partial_reuse: bool,
    pub(super) copy_on_partial_reuse: bool,
    /// Evictable GPU blocks: unreferenced, no children on the GPU.
    pub(crate) evictable: BTreeSet<(u8, u64, u32)>,
    /// Evictable host blocks: unreferenced, childless.
    pub(crate) host_evictable: BTreeSet<(u8, u64, u32)>,
    /// Blocks of host memory (0: no host tier).
    pub(crate) host_blocks: usize,
    pub(crate) offload_min_priority: u8,
    pub(crate) expiring: BTreeSet<(u64, u32)>,
    pub(crate) clock: u64,
    pub(super) seq: u64,
    pub(crate) num_free: usize,
    pub(crate) num_cached: usize,
    pub(crate) num_cached_tokens: usize,
    pub(crate) num_host_cached: usize,
    pub(crate) num_host_cached_tokens: usize,
    pub(super) requests: FxHashMap<u64, Request>,
    pub(crate) salts: Interner,
    pub(crate) mm_hashes: Interner,
    pub(crate) events: Vec<TrieEvent>,
    /// Whether events are recorded (a caller that never takes them turns them off).
    pub(crate) events_enabled: bool,
    pub(crate) stats: TrieStats,
    pub(crate) host_stats: TrieHostStats,
}

pub(super) fn invalid(msg: String) -> Error {
    Error::InvalidArgument(msg)
}

impl BlockTrie {
    /// A trie over `num_blocks` GPU blocks, without a host tier.
    pub fn new(
        num_blocks: usize,
        tokens_per_block: usize,
        enable_partial_reuse: bool,
        copy_on_partial_reuse: bool,
    ) -> Result<Self> {
        Self::with_host_tier(
            num_blocks,
            tokens_per_block,
            enable_partial_reuse,
            copy_on_partial_reuse,
            0,
            DEFAULT_SECONDARY_OFFLOAD_MIN_PRIORITY,
        )
    }

    /// A trie over `num_blocks` GPU blocks (ids `0..num_blocks` at first) and `host_blocks`
    /// blocks of host memory (ids `num_blocks..num_blocks + host_blocks` at first; 0: no
    /// host tier). A GPU victim of priority >= `secondary_offload_min_priority` that holds
    /// a cached block is offloaded to host memory instead of leaving the trie (host.rs).
    pub fn with_host_tier(
        num_blocks: usize,
        tokens_per_block: usize,
        enable_partial_reuse: bool,
        copy_on_partial_reuse: bool,
        host_blocks: usize,
        secondary_offload_min_priority: u8,
    ) -> Result<Self> {
        if num_blocks == 0 || num_blocks >= u32::MAX as usize {
            return Err(invalid(format!(
                "num_blocks must be in [1, 2**32 - 1), got {num_blocks}"
            )));
        }
        if tokens_per_block == 0 {
            return Err(invalid("tokens_per_block must be >= 1, got 0".into()));
        }
        let total = num_blocks.saturating_add(host_blocks);
        if total >= u32::MAX as usize {
            return Err(invalid(format!(
                "num_blocks + host_blocks must be < 2**32 - 1, got {num_blocks} + {host_blocks}"
            )));
        }
        if secondary_offload_min_priority > MAX_PRIORITY {
            return Err(invalid(format!(
                "secondary_offload_min_priority must be in [0, {MAX_PRIORITY}], got {secondary_offload_min_priority}"
            )));
        }
        // Every block starts free at the default priority, in id order, on its level: the
        // arena makes each on its first use (arena.rs), the evictable sets hold the used
        // ones.
        let blocks = BlockArena::new(num_blocks, host_blocks);
        Ok(BlockTrie {
            root: blocks.root_id(),
            blocks,
            num_gpu_blocks: num_blocks,
            tokens_per_block,
            enable_partial_reuse,
            copy_on_partial_reuse,
            evictable: BTreeSet::new(),
            host_evictable: BTreeSet::new(),
            host_blocks,
            offload_min_priority: secondary_offload_min_priority,
            expiring: BTreeSet::new(),
            clock: 0,
            seq: total as u64,
            num_free: num_blocks,
            num_cached: 0,
            num_cached_tokens: 0,
            num_host_cached: 0,
            num_host_cached_tokens: 0,
            requests: FxHashMap::default(),
            salts: Interner::default(),
            mm_hashes: Interner::default(),
            events: Vec::new(),
            events_enabled: true,
            stats: TrieStats::default(),
            host_stats: TrieHostStats::default(),
        })
    }

    /// GPU blocks (the primary pool).
    pub fn num_blocks(&self) -> usize {
        self.num_gpu_blocks
    }
    /// Blocks of host memory (0: no host tier).
    pub fn host_blocks(&self) -> usize {
        self.host_blocks
    }
    /// The lowest priority a GPU victim is offloaded at (meaningful with a host tier).
    pub fn secondary_offload_min_priority(&self) -> u8 {
        self.offload_min_priority
    }
    /// Cached blocks in host memory.
    pub fn num_host_cached_blocks(&self) -> usize {
        self.num_host_cached
    }
    /// Tokens in the keys of the cached blocks in host memory.
    pub fn num_host_cached_tokens(&self) -> usize {
        self.num_host_cached_tokens
    }
    pub fn host_stats(&self) -> TrieHostStats {
        self.host_stats.clone()
    }
    /// Per block id (GPU and host blocks): whether it is in host memory. `OutOfMemory`
    /// (nothing built) when a list of every block id does not fit.
    pub fn host_dump(&self) -> Result<Vec<bool>> {
        let mut out = try_vec(self.root as usize, "the trie's host dump")?;
        out.extend((0..self.root).map(|b| {
            self.blocks
                .get(b)
                .map_or(b as usize >= self.num_gpu_blocks, |blk| blk.host)
        }));
        Ok(out)
    }
    pub fn tokens_per_block(&self) -> usize {
        self.tokens_per_block
    }
    pub fn enable_partial_reuse(&self) -> bool {
        self.enable_partial_reuse
    }
    pub fn copy_on_partial_reuse(&self) -> bool {
        self.copy_on_partial_reuse
    }
    /// Unreferenced GPU blocks (cached or not): what can be allocated.
    pub fn num_free_blocks(&self) -> usize {
        self.num_free
    }
    /// Blocks cached in the trie on the GPU.
    pub fn num_cached_blocks(&self) -> usize {
        self.num_cached
    }
    /// Tokens in the keys of the cached GPU blocks.
    pub fn num_cached_tokens(&self) -> usize {
        self.num_cached_tokens
    }
    pub fn num_requests(&self) -> usize {
        self.requests.len()
    }
    /// The logical clock: +1 per `claim`, +ticks per `advance_clock`.
    pub fn clock(&self) -> u64 {
        self.clock
    }
    /// Tokens of cached blocks that left the GPU since construction: evicted, or
    /// offloaded to host memory (`stats().evicted_tokens + host_stats().stored_tokens`),
    /// without building either.
    pub fn num_tokens_left_gpu(&self) -> u64 {
        self.stats.evicted_tokens + self.host_stats.stored_tokens
    }
    pub fn stats(&self) -> TrieStats {
        self.stats.clone()
    }
    /// Records events (the default) or not: a caller that never takes them would let
    /// them pile up for the trie's whole life. Turning them off drops the pending ones.
    pub fn set_events_enabled(&mut self, on: bool) {
        self.events_enabled = on;
        if !on {
            self.events = Vec::new();
        }
    }

    /// Whether events are recorded.
    pub fn events_enabled(&self) -> bool {
        self.events_enabled
    }

    pub fn take_events(&mut self) -> Vec<TrieEvent> {
        std::mem::take(&mut self.events)
    }

    pub(crate) fn next_seq(&mut self) -> u64 {
        let s = self.seq;
        self.seq += 1;
        s
    }

    pub(crate) fn full(&self, k: &BlockKey) -> bool {
        k.tokens.len() == self.tokens_per_block
    }

    /// Every block (GPU and host), by id. `OutOfMemory` (nothing built) when a list of
    /// every block id does not fit.
    pub fn dump(&self) -> Result<Vec<BlockDump>> {
        let unused = Block::new(0);
        let mut out = try_vec(self.root as usize, "the trie's dump")?;
        out.extend((0..self.root).map(|b| {
            let blk = self.blocks.get(b).unwrap_or(&unused);
            let key = blk.key.as_ref();
            BlockDump {
                block_id: b,
                cached: key.is_some(),
                parent: (key.is_some() && blk.parent != self.root).then_some(blk.parent),
                tokens: key.map(|k| k.tokens.clone()).unwrap_or_default(),
                lora_id: key.and_then(|k| k.scope.lora),
                cache_salt: key
                    .and_then(|k| k.scope.salt)
                    .map(|s| String::from_utf8_lossy(self.salts.bytes(s)).into_owned()),
                mm_keys: key
                    .map(|k| {
                        k.mm.iter()
                            .map(|&(id, off)| (self.mm_hashes.bytes(id).to_vec(), off))
                            .collect()
                    })
                    .unwrap_or_default(),
                ref_cnt: blk.ref_cnt,
                priority: blk.priority,
            }
        }));
        Ok(out)
    }

    /// Per request: its interned salt and multimodal ids, for the invariant check.
    pub(crate) fn requests_interned(&self) -> impl Iterator<Item = (Option<u32>, Vec<u32>)> + '_ {
        self.requests
            .values()
            .map(|r| (r.scope.salt, r.mm.iter().map(|m| m.id).collect()))
    }

    /// Number of interned salts and multimodal hashes (what cached keys and live requests
    /// hold).
    pub fn num_interned(&self) -> (usize, usize) {
        (self.salts.len(), self.mm_hashes.len())
    }

    /// Per request: (blocks, pins), for the invariant check.
    pub(crate) fn held(&self) -> impl Iterator<Item = (&[u32], &[u32])> {
        self.requests
            .values()
            .map(|r| (r.blocks.as_slice(), r.pins.as_slice()))
    }
}
