//! vLLM v1's request-level KV-cache manager over one [`BlockPool`] and one KV-cache group
//! (vLLM's `KVCacheManager` + `UnitaryKVCacheCoordinator` + `FullAttentionManager` or
//! `SlidingWindowManager`), SEMANTICS.md section 2.3.
//!
//! Modelled: block hashes appended as tokens arrive (full blocks only), the longest hit
//! (`num_tokens - 1` cap; full attention scans left to right and stops at the first miss,
//! sliding window scans right to left for `ceil((window - 1) / block_size)` contiguous
//! hits), `allocate_slots` (skipped sliding-window blocks freed and nulled, capacity
//! check, hit blocks touched, new blocks taken, newly full blocks cached), free in reverse
//! order, preemption and vLLM's `PrefixCacheStats`.
//!
//! Not modelled (vLLM features outside a single-group prefix cache): KV connectors /
//! external tokens, EAGLE block dropping, hash lookahead, partial-block hits, watermark,
//! `max_model_len` capping, multi-group (hybrid) models.
//!
//! Differences in bookkeeping, by design: the request's `num_computed_tokens` (which
//! vLLM's scheduler updates) advances inside [`KVCacheManager::allocate_slots`] by the hit
//! plus the scheduled tokens, capped at the request's token count.

use rustc_hash::{FxHashMap, FxHashSet};

use crate::error::{try_copy, try_vec, Error, Result};
use crate::events::KvEvent;
use crate::hash::{BlockHash, BlockHasher, KeyValue};

use super::pool::{BlockPool, StoreInfo, StorePlan, NULL_BLOCK};

/// Request ids are plain integers.
pub type RequestId = u64;

/// vLLM's `PrefixCacheStats` counters (cumulative; see [`KVCacheManager::take_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Requests admitted for the first time.
    pub requests: u64,
    /// Their tokens at admission.
    pub queries: u64,
    /// Their prefix-cache hit tokens.
    pub hits: u64,
    /// Re-admissions of preempted requests.
    pub preempted_requests: u64,
    pub preempted_queries: u64,
    pub preempted_hits: u64,
    /// Whether `reset_prefix_cache` succeeded since the stats were last taken.
    pub reset: bool,
}

impl PrefixCacheStats {
    fn record(&mut self, num_tokens: usize, num_hits: usize, preempted: bool) {
        if preempted {
            self.preempted_requests += 1;
            self.preempted_queries += num_tokens as u64;
            self.preempted_hits += num_hits as u64;
        } else {
            self.requests += 1;
            self.queries += num_tokens as u64;
            self.hits += num_hits as u64;
        }
    }
}

/// Per-request optional inputs of [`KVCacheManager::add_request`].
#[derive(Debug, Clone, Default)]
pub struct RequestOptions {
    /// Extra hash keys of block `i` (`None` = no keys), e.g. the multimodal items, cache
    /// salt or prompt-embeds digests the caller derived as vLLM does.
    pub block_extra_keys: Vec<Option<Vec<KeyValue>>>,
    /// Extra keys of every block past `block_extra_keys` (e.g. the LoRA key, which vLLM
    /// adds to every block, output blocks included). `None` = no keys.
    pub default_extra_keys: Option<Vec<KeyValue>>,
    /// Reported in `BlockStored` events.
    pub lora_id: Option<i64>,
    pub lora_name: Option<String>,
}

#[derive(Debug, Clone)]
struct Request {
    tokens: Vec<u32>,
    num_prompt_tokens: usize,
    block_hashes: Vec<BlockHash>,
    opts: RequestOptions,
    /// vLLM's `req_to_blocks` entry (null blocks stand for skipped window blocks).
    blocks: Vec<u32>,
    /// vLLM's `num_cached_block` entry: `Some` once the request's hits were added or a
    /// block of it was cached, until it is freed or preempted.
    num_cached_blocks: Option<usize>,
    /// Whether slots were allocated since it was added or preempted (it is "running").
    admitted: bool,
    num_computed_tokens: usize,
    num_preemptions: u32,
    /// Tokens queued for [`KVCacheManager::decode_steps`] (`queue_tokens`), and how many
    /// of them were fed already.
    queued: Vec<u32>,
    queued_fed: usize,
}

impl Request {
    fn extra_keys(&self, block: usize) -> Option<&[KeyValue]> {
        match self.opts.block_extra_keys.get(block) {
            Some(k) => k.as_deref(),
            None => self.opts.default_extra_keys.as_deref(),
        }
    }
}

/// The result of a successful [`KVCacheManager::admit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// Prefix-cache hit, in tokens.
    pub num_hit_tokens: usize,
    /// The request's blocks after allocation (null blocks for skipped window blocks).
    pub block_ids: Vec<u32>,
}

/// The request-level manager.
#[derive(Debug, Clone)]
pub struct KVCacheManager {
    pool: BlockPool,
    hasher: BlockHasher,
    block_size: usize,
    sliding_window: Option<usize>,
    requests: FxHashMap<RequestId, Request>,
    stats: PrefixCacheStats,
}

fn unknown(id: RequestId) -> Error {
    Error::UnknownRequest(format!("unknown request id {id}"))
}

impl KVCacheManager {
    /// A manager over a fresh pool of `num_blocks` blocks. `sliding_window` (in tokens,
    /// >= 2) selects vLLM's sliding-window manager; `None` full attention.
    pub fn new(
        num_blocks: usize,
        hasher: BlockHasher,
        enable_caching: bool,
        sliding_window: Option<usize>,
        enable_kv_cache_events: bool,
    ) -> Result<Self> {
        if let Some(w) = sliding_window {
            if w < 2 {
                return Err(Error::InvalidArgument(format!(
                    "sliding_window must be >= 2 tokens, got {w}"
                )));
            }
        }
        let block_size = hasher.block_size();
        Ok(KVCacheManager {
            pool: BlockPool::new(num_blocks, enable_caching, enable_kv_cache_events)?,
            hasher,
            block_size,
            sliding_window,
            requests: FxHashMap::default(),
            stats: PrefixCacheStats::default(),
        })
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn sliding_window(&self) -> Option<usize> {
        self.sliding_window
    }

    pub fn hasher(&self) -> &BlockHasher {
        &self.hasher
    }

    pub fn enable_caching(&self) -> bool {
        self.pool.enable_caching()
    }

    pub fn num_requests(&self) -> usize {
        self.requests.len()
    }

    pub fn contains(&self, id: RequestId) -> bool {
        self.requests.contains_key(&id)
    }

    pub fn usage(&self) -> f64 {
        self.pool.usage()
    }

    pub fn take_events(&mut self) -> Result<Vec<KvEvent>> {
        self.pool.take_events()
    }

    /// [`KVCacheManager::take_events`] with runs of removals in one event each.
    pub fn take_events_merged(&mut self) -> Vec<KvEvent> {
        self.pool.take_events_merged()
    }

    /// The cumulative stats.
    pub fn stats(&self) -> PrefixCacheStats {
        self.stats
    }

    /// The stats since the last call, resetting them (vLLM's `make_prefix_cache_stats`).
    pub fn take_stats(&mut self) -> PrefixCacheStats {
        std::mem::take(&mut self.stats)
    }

    fn req(&self, id: RequestId) -> Result<&Request> {
        self.requests.get(&id).ok_or_else(|| unknown(id))
    }

    pub fn block_ids(&self, id: RequestId) -> Result<&[u32]> {
        Ok(&self.req(id)?.blocks)
    }

    pub fn num_tokens(&self, id: RequestId) -> Result<usize> {
        Ok(self.req(id)?.tokens.len())
    }

    pub fn num_prompt_tokens(&self, id: RequestId) -> Result<usize> {
        Ok(self.req(id)?.num_prompt_tokens)
    }

    pub fn num_computed_tokens(&self, id: RequestId) -> Result<usize> {
        Ok(self.req(id)?.num_computed_tokens)
    }

    pub fn block_hashes(&self, id: RequestId) -> Result<&[BlockHash]> {
        Ok(&self.req(id)?.block_hashes)
    }

    /// Tokens before the window of the next token (vLLM's `get_num_skipped_tokens`).
    fn num_skipped_tokens(&self, num_computed_tokens: usize) -> usize {
        match self.sliding_window {
            Some(w) => (num_computed_tokens + 1).saturating_sub(w),
            None => 0,
        }
    }

    /// Register a request with its prompt; hashes its full blocks (when caching is on).
    pub fn add_request(
        &mut self,
        id: RequestId,
        prompt: &[u32],
        opts: RequestOptions,
    ) -> Result<()> {
        self.check_new(id, prompt)?;
        self.insert_request(id, try_copy(prompt, "a prompt")?, opts)
    }

    /// [`add_request`](Self::add_request) taking the prompt's buffer (no copy).
    pub fn add_request_owned(
        &mut self,
        id: RequestId,
        prompt: Vec<u32>,
        opts: RequestOptions,
    ) -> Result<()> {
        self.check_new(id, &prompt)?;
        self.insert_request(id, prompt, opts)
    }

    fn check_new(&self, id: RequestId, prompt: &[u32]) -> Result<()> {
        if self.requests.contains_key(&id) {
            return Err(Error::InvalidArgument(format!(
                "request id {id} is already known"
            )));
        }
        if prompt.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "request {id} has an empty prompt"
            )));
        }
        Ok(())
    }

    fn new_request(tokens: Vec<u32>, opts: RequestOptions) -> Request {
        Request {
            num_prompt_tokens: tokens.len(),
            tokens,
            block_hashes: Vec::new(),
            opts,
            blocks: Vec::new(),
            num_cached_blocks: None,
            admitted: false,
            num_computed_tokens: 0,
            num_preemptions: 0,
            queued: Vec::new(),
            queued_fed: 0,
        }
    }

    fn insert_request(
        &mut self,
        id: RequestId,
        tokens: Vec<u32>,
        opts: RequestOptions,
    ) -> Result<()> {
        self.reserve_request()?;
        let mut req = Self::new_request(tokens, opts);
        if self.pool.enable_caching() {
            req.block_hashes = self.hash_from(&req, 0, None)?;
        }
        self.requests.insert(id, req);
        Ok(())
    }

    /// Room in the request table for one more request.
    fn reserve_request(&mut self) -> Result<()> {
        self.requests
            .try_reserve(1)
            .map_err(|e| Error::out_of_memory("the request table", e))
    }

    /// [`add_request`](Self::add_request) + [`get_computed_blocks`](Self::get_computed_blocks)
    /// for full attention with caching on: each block's hash is looked up as soon as it is
    /// computed (while the prefix still hits), so that the table's cache misses overlap
    /// the hashing of the next block instead of following all of it. The same hashes and
    /// hit as the two calls.
    fn add_and_look_up(
        &mut self,
        id: RequestId,
        tokens: Vec<u32>,
        opts: RequestOptions,
    ) -> Result<(Vec<u32>, usize)> {
        let bs = self.block_size;
        let mut req = Self::new_request(tokens, opts);
        // get_computed_blocks: hits capped at `num_tokens - 1` tokens (the prompt is not
        // empty: checked by the caller).
        let max_blocks = req.tokens.len().saturating_sub(1) / bs;
        self.reserve_request()?;
        let mut lookup = self.pool.streaming_lookup(0, max_blocks)?;
        req.block_hashes = self.hasher.hash_blocks_with(
            &req.tokens,
            None,
            |i| req.extra_keys(i),
            |_, h| lookup.push(h),
        )?;
        let hits = lookup.finish();
        self.requests.insert(id, req);
        let hit = hits.len() * bs;
        Ok((hits, hit))
    }

    fn hash_from(
        &self,
        req: &Request,
        first: usize,
        parent: Option<&BlockHash>,
    ) -> Result<Vec<BlockHash>> {
        let bs = self.block_size;
        let from = first.saturating_mul(bs).min(req.tokens.len());
        self.hasher.hash_blocks_with(
            &req.tokens[from..],
            parent,
            |i| req.extra_keys(first + i),
            |_, _| (),
        )
    }

    /// Append generated tokens (decode output); hashes the blocks they complete. Caching
    /// them happens at the next `allocate_slots`, as in vLLM.
    pub fn append_tokens(&mut self, id: RequestId, tokens: &[u32]) -> Result<()> {
        let caching = self.pool.enable_caching();
        let req = self.requests.get_mut(&id).ok_or_else(|| unknown(id))?;
        let oom = |e| Error::out_of_memory("the request's tokens", e);
        req.tokens.try_reserve(tokens.len()).map_err(oom)?;
        if caching {
            let full = (req.tokens.len() + tokens.len()) / self.block_size;
            req.block_hashes
                .try_reserve(full.saturating_sub(req.block_hashes.len()))
                .map_err(oom)?;
        }
        // Taken out and put back: room first (see `preempt`).
        self.reserve_request()?;
        let mut req = self.requests.remove(&id).ok_or_else(|| unknown(id))?;
        let old_len = req.tokens.len();
        req.tokens.extend_from_slice(tokens);
        let res = if caching {
            let first = req.block_hashes.len();
            let parent = req.block_hashes.last().copied();
            self.hash_from(&req, first, parent.as_ref())
        } else {
            Ok(Vec::new())
        };
        let out = match res {
            Ok(new) => {
                req.block_hashes.extend(new);
                Ok(())
            }
            Err(e) => {
                req.tokens.truncate(old_len);
                Err(e)
            }
        };
        self.requests.insert(id, req);
        out
    }

    /// The longest prefix-cache hit of the request, capped at `num_tokens - 1`: the hit
    /// blocks (null blocks where a sliding window skips) and the hit length in tokens.
    /// Changes nothing. With caching disabled: no hit.
    pub fn get_computed_blocks(&self, id: RequestId) -> Result<(Vec<u32>, usize)> {
        let req = self.req(id)?;
        if !self.pool.enable_caching() {
            return Ok((Vec::new(), 0));
        }
        let max_len = req.tokens.len().saturating_sub(1);
        let bs = self.block_size;
        let max_blocks = (max_len / bs).min(req.block_hashes.len());
        let hashes = &req.block_hashes[..max_blocks];
        let blocks = match self.sliding_window {
            None => self.pool.lookup_prefix(hashes, 0)?,
            Some(w) => {
                let need = (w - 1).div_ceil(bs);
                let mut out = try_vec(max_blocks, "the hit blocks")?;
                out.resize(max_blocks, NULL_BLOCK);
                let mut run = 0usize;
                let mut found = false;
                for i in (0..max_blocks).rev() {
                    match self.pool.lookup(&hashes[i], 0) {
                        Some(b) => {
                            out[i] = b;
                            run += 1;
                            if run >= need {
                                out.truncate(i + run);
                                found = true;
                                break;
                            }
                        }
                        None => run = 0,
                    }
                }
                if !found {
                    out.truncate(run);
                }
                out
            }
        };
        let hit = blocks.len() * bs;
        Ok((blocks, hit))
    }

    /// Free the blocks before the attention window (vLLM's `remove_skipped_blocks`):
    /// from the last skipped block backwards until a null block, each replaced by null.
    fn remove_skipped_blocks(&mut self, id: RequestId, num_computed_tokens: usize) {
        let Some(range) = self.skipped_range(id, num_computed_tokens) else {
            return;
        };
        let Some(req) = self.requests.get_mut(&id) else {
            return;
        };
        // Freed last first (the pool's room to free them was reserved with the request's
        // blocks), then replaced by null.
        self.pool
            .free_owned(req.blocks[range.clone()].iter().rev().copied());
        req.blocks[range].fill(NULL_BLOCK);
    }

    /// The request's blocks that [`remove_skipped_blocks`](Self::remove_skipped_blocks)
    /// would release: from the last block before the window back to the first null one.
    fn skipped_blocks(&self, id: RequestId, num_computed_tokens: usize) -> Option<&[u32]> {
        let range = self.skipped_range(id, num_computed_tokens)?;
        self.requests.get(&id).map(|r| &r.blocks[range])
    }

    fn skipped_range(
        &self,
        id: RequestId,
        num_computed_tokens: usize,
    ) -> Option<std::ops::Range<usize>> {
        let skipped_tokens = self.num_skipped_tokens(num_computed_tokens);
        if skipped_tokens == 0 {
            return None;
        }
        let req = self.requests.get(&id)?;
        let last = (skipped_tokens / self.block_size).min(req.blocks.len());
        let first = req.blocks[..last]
            .iter()
            .rposition(|&b| b == NULL_BLOCK)
            .map_or(0, |i| i + 1);
        Some(first..last)
    }

    /// vLLM's `get_num_blocks_to_allocate` for one group.
    fn num_blocks_to_allocate(
        &self,
        req: &Request,
        num_tokens: usize,
        new_computed: &[u32],
        total_computed_tokens: usize,
    ) -> usize {
        let bs = self.block_size;
        let required = num_tokens.div_ceil(bs);
        let num_req_blocks = req.blocks.len();
        if req.num_cached_blocks.is_some() {
            return required.saturating_sub(num_req_blocks);
        }
        let skipped_blocks = self.num_skipped_tokens(total_computed_tokens) / bs;
        let local_blocks = new_computed.len() + num_req_blocks;
        let new_blocks = required.saturating_sub(skipped_blocks.max(local_blocks));
        let skip_new = skipped_blocks
            .saturating_sub(num_req_blocks)
            .min(new_computed.len());
        let evictable = new_computed[skip_new..]
            .iter()
            .filter(|&&b| self.pool.is_unreferenced(b))
            .count();
        new_blocks + evictable
    }

    /// vLLM's `allocate_slots` (no connector, no EAGLE): make room for `num_new_tokens`
    /// to compute (+ `num_lookahead_tokens` speculative slots) after the request's
    /// computed tokens and the `num_new_computed_tokens` hit in `new_computed_blocks`
    /// (from [`get_computed_blocks`](Self::get_computed_blocks); only before the first
    /// allocation). Returns the newly allocated block ids, or `None` when the pool is
    /// short: then nothing changes, except that (as in vLLM) a sliding-window request may
    /// already have released the blocks that left its window. On success the newly full
    /// blocks are cached and the request's computed tokens advance.
    pub fn allocate_slots(
        &mut self,
        id: RequestId,
        num_new_tokens: usize,
        num_new_computed_tokens: usize,
        new_computed_blocks: &[u32],
        num_lookahead_tokens: usize,
    ) -> Result<Option<Vec<u32>>> {
        let bs = self.block_size;
        let req = self.req(id)?;
        if num_new_tokens == 0 && num_new_computed_tokens == 0 {
            return Err(Error::InvalidArgument(
                "num_new_tokens must be > 0 when there are no computed tokens to adopt".into(),
            ));
        }
        if !new_computed_blocks.is_empty() && req.admitted {
            return Err(Error::InvalidArgument(format!(
                "request {id} already holds slots: prefix-cache hits can only be adopted at admission"
            )));
        }
        if Some(num_new_computed_tokens) != new_computed_blocks.len().checked_mul(bs) {
            return Err(Error::InvalidArgument(format!(
                "num_new_computed_tokens = {num_new_computed_tokens} but {} hit blocks of {bs} tokens were given",
                new_computed_blocks.len()
            )));
        }
        if req.num_computed_tokens + num_new_computed_tokens > req.tokens.len() {
            return Err(Error::InvalidArgument(format!(
                "the hit ({num_new_computed_tokens} tokens) exceeds the request's {} uncomputed tokens",
                req.tokens.len() - req.num_computed_tokens
            )));
        }
        for &b in new_computed_blocks {
            if (b as usize) >= self.pool.num_blocks() {
                return Err(Error::InvalidArgument(format!(
                    "hit block id {b} is out of range: the pool has {} blocks",
                    self.pool.num_blocks()
                )));
            }
        }
        if !self.pool.enable_caching() && new_computed_blocks.iter().any(|&b| b != NULL_BLOCK) {
            return Err(Error::InvalidArgument(
                "prefix caching is disabled: there can be no hit blocks".into(),
            ));
        }

        let total_computed = req.num_computed_tokens + num_new_computed_tokens;
        let num_tokens_main = total_computed.saturating_add(num_new_tokens);
        let need_slots = num_tokens_main.saturating_add(num_lookahead_tokens);
        let first_admission = !req.admitted;
        let num_tokens = req.tokens.len();
        let preempted = req.num_preemptions > 0;

        let n_skipped_blocks = self.num_skipped_tokens(total_computed) / bs;
        let caching = self.pool.enable_caching();
        // vLLM adopts the hit only when it is not its shared empty sentinel and the request
        // is not already tracked in `num_cached_block`.
        let adopt = !new_computed_blocks.is_empty() && req.num_cached_blocks.is_none();
        let computed = num_tokens_main.min(num_tokens);
        // The blocks a sliding window left behind are released first (even when the pool
        // then turns out short, as in vLLM); that changes none of what the count of blocks
        // to allocate depends on, only the free count, by the released blocks that reach
        // no reference.
        let n_alloc =
            self.num_blocks_to_allocate(req, need_slots, new_computed_blocks, total_computed);
        let freed = self.skipped_blocks(id, total_computed).map_or(0, |run| {
            run.iter()
                .filter(|&&b| self.pool.ref_cnt(b).is_ok_and(|r| r == 1))
                .count()
        });
        if n_alloc > self.pool.num_free_blocks() + freed {
            self.remove_skipped_blocks(id, total_computed);
            return Ok(None);
        }
        // Everything this call allocates, before it changes anything: without memory an
        // `OutOfMemory` error and no change.
        let plan = self.reserve_allocation(
            id,
            adopt,
            n_skipped_blocks,
            new_computed_blocks,
            need_slots,
            computed,
        )?;
        self.remove_skipped_blocks(id, total_computed);
        debug_assert!(n_alloc <= self.pool.num_free_blocks());
        let pool = &mut self.pool;
        let req = self.requests.get_mut(&id).ok_or_else(|| unknown(id))?;
        if adopt {
            let rest = &new_computed_blocks[n_skipped_blocks.min(new_computed_blocks.len())..];
            for &b in rest {
                if b != NULL_BLOCK {
                    pool.touch_reserved(b);
                }
            }
            req.blocks
                .extend(std::iter::repeat_n(NULL_BLOCK, n_skipped_blocks));
            req.blocks.extend_from_slice(rest);
            req.num_cached_blocks = Some(req.blocks.len());
        }
        let required = need_slots.div_ceil(bs);
        let mut new_blocks = Vec::new();
        if required > req.blocks.len() {
            if caching {
                // The first keys `cache_blocks` will insert: their table slots load while
                // the new blocks are taken (its own prefetching covers those after).
                let from = req.num_cached_blocks.unwrap_or(0);
                let full = num_tokens_main.min(num_tokens) / bs;
                let to = full.min(req.block_hashes.len()).min(from + 4);
                if let Some(first) = req.block_hashes.get(from..to) {
                    pool.prefetch_keys(first, 0);
                }
            }
            // Cannot fail: the free blocks were counted and the memory reserved above.
            new_blocks = plan.new_blocks;
            pool.get_new_blocks_into(required - req.blocks.len(), &mut new_blocks)?;
            req.blocks.extend_from_slice(&new_blocks);
        }
        req.num_computed_tokens = computed;
        req.admitted = true;
        if caching {
            if let Some(store) = plan.store {
                cache_blocks(pool, req, store, computed, bs);
            }
            if first_admission {
                self.stats
                    .record(num_tokens, num_new_computed_tokens, preempted);
            }
        }
        Ok(Some(new_blocks))
    }

    /// What [`allocate_slots`](Self::allocate_slots) allocates for request `id` (its
    /// block list's room, the new blocks' list and storage, the caching of its full
    /// blocks), before it changes anything.
    fn reserve_allocation(
        &mut self,
        id: RequestId,
        adopt: bool,
        n_skipped_blocks: usize,
        hits: &[u32],
        need_slots: usize,
        computed: usize,
    ) -> Result<SlotPlan> {
        let bs = self.block_size;
        let req = self.requests.get_mut(&id).ok_or_else(|| unknown(id))?;
        let oom = |e| Error::out_of_memory("the request's blocks", e);
        let (held, num_cached) = if adopt {
            let rest = hits.len() - n_skipped_blocks.min(hits.len());
            let held = req.blocks.len() + n_skipped_blocks + rest;
            (held, held)
        } else {
            (req.blocks.len(), req.num_cached_blocks.unwrap_or(0))
        };
        let required = need_slots.div_ceil(bs);
        let n_new = required.saturating_sub(held);
        req.blocks
            .try_reserve(held.max(required) - req.blocks.len())
            .map_err(oom)?;
        let mut new_blocks = Vec::new();
        new_blocks.try_reserve_exact(n_new).map_err(oom)?;
        let num_full = computed.min(req.block_hashes.len() * bs) / bs;
        let store = if self.pool.enable_caching() && num_cached < num_full {
            let hashes = &req.block_hashes[num_cached.saturating_sub(1)..num_full];
            let hash_len = self.pool.hash_len_after(hashes)?;
            let max_id = (self.pool.materialized() as usize + n_new).saturating_sub(1);
            let plan = self.pool.plan_store(
                hash_len,
                num_full - num_cached,
                u32::try_from(max_id).unwrap_or(u32::MAX),
                num_full - num_cached,
                Some(&req.tokens[num_cached * bs..num_full * bs]),
                req.opts.lora_name.as_deref(),
            )?;
            Some(plan)
        } else {
            None
        };
        if adopt {
            // A hit on a block never used before gives it storage (the pool's `touch`).
            let rest = &hits[n_skipped_blocks.min(hits.len())..];
            if let Some(&top) = rest.iter().max() {
                self.pool.reserve_through(top)?;
            }
        }
        self.pool.reserve_new_blocks(n_new)?;
        // The new blocks' removals and the stored blocks: two events at most.
        self.pool.reserve_events(2)?;
        // Freeing the request later allocates nothing.
        self.pool.reserve_frees(held.max(required))?;
        Ok(SlotPlan { new_blocks, store })
    }

    fn release(&mut self, req: &mut Request) {
        // Tail first (vLLM frees `reversed(blocks)`); null blocks are skipped by the pool.
        let blocks = std::mem::take(&mut req.blocks);
        self.pool.free_owned(blocks.iter().rev().copied());
        req.num_cached_blocks = None;
        req.admitted = false;
    }

    /// Free the request's blocks (tail first) and forget the request.
    pub fn free(&mut self, id: RequestId) -> Result<()> {
        let mut req = self.requests.remove(&id).ok_or_else(|| unknown(id))?;
        self.release(&mut req);
        Ok(())
    }

    /// Preempt a request as vLLM's scheduler does: free its blocks, reset its computed
    /// tokens and count the preemption; its tokens and hashes stay, and its next admission
    /// is counted in the `preempted_*` stats.
    pub fn preempt(&mut self, id: RequestId) -> Result<()> {
        self.req(id)?;
        // Taking the entry out and putting it back can need a new table (a removal may
        // leave a tombstone): room first.
        self.reserve_request()?;
        let mut req = self.requests.remove(&id).ok_or_else(|| unknown(id))?;
        self.release(&mut req);
        req.num_computed_tokens = 0;
        req.num_preemptions += 1;
        self.requests.insert(id, req);
        Ok(())
    }

    /// Reset the prefix cache (only when no request holds blocks); marks the stats.
    pub fn reset_prefix_cache(&mut self) -> Result<bool> {
        if !self.pool.reset_prefix_cache()? {
            return Ok(false);
        }
        self.stats.reset = true;
        Ok(true)
    }

    /// Evict these blocks' hashes from the prefix cache.
    pub fn evict_blocks(&mut self, ids: &[u32]) -> Result<()> {
        self.pool.evict_blocks(ids)
    }

    /// Convenience for simulators: add the request, look up its prompt, allocate the
    /// prompt remainder plus `num_lookahead_tokens` slots. `None` (and the request is
    /// forgotten again) when the pool is short.
    pub fn admit(
        &mut self,
        id: RequestId,
        prompt: &[u32],
        opts: RequestOptions,
        num_lookahead_tokens: usize,
    ) -> Result<Option<Admission>> {
        self.admit_owned(
            id,
            try_copy(prompt, "a prompt")?,
            opts,
            num_lookahead_tokens,
        )
    }

    /// [`admit`](Self::admit) taking the prompt's buffer (no copy).
    pub fn admit_owned(
        &mut self,
        id: RequestId,
        prompt: Vec<u32>,
        opts: RequestOptions,
        num_lookahead_tokens: usize,
    ) -> Result<Option<Admission>> {
        let n = prompt.len();
        let (hit_blocks, hit) = if self.pool.enable_caching() && self.sliding_window.is_none() {
            self.check_new(id, &prompt)?;
            self.add_and_look_up(id, prompt, opts)?
        } else {
            self.add_request_owned(id, prompt, opts)?;
            match self.get_computed_blocks(id) {
                Ok(x) => x,
                Err(e) => {
                    self.requests.remove(&id);
                    return Err(e);
                }
            }
        };
        // Room for the admission's list of blocks (at most the slots asked for, or the hit;
        // never more than the pool has: a larger request is refused, not reserved for).
        let most = n
            .saturating_add(num_lookahead_tokens)
            .div_ceil(self.block_size)
            .min(self.pool.num_blocks())
            .max(hit_blocks.len());
        let mut block_ids = Vec::new();
        if let Err(e) = block_ids.try_reserve_exact(most) {
            self.requests.remove(&id);
            return Err(Error::out_of_memory("the admission's blocks", e));
        }
        match self.allocate_slots(id, n - hit, hit, &hit_blocks, num_lookahead_tokens) {
            Ok(Some(_)) => {
                block_ids.extend_from_slice(&self.req(id)?.blocks);
                Ok(Some(Admission {
                    num_hit_tokens: hit,
                    block_ids,
                }))
            }
            Ok(None) => {
                self.requests.remove(&id);
                Ok(None)
            }
            Err(e) => {
                self.requests.remove(&id);
                Err(e)
            }
        }
    }

    /// Convenience for simulators: append the output tokens, compute them (caching the
    /// blocks they fill, allocating more slots if the lookahead did not cover them) and
    /// free the request. Returns false when the pool was too short to take the output
    /// (then nothing was cached for it), true otherwise. The request is freed either way.
    pub fn finish(&mut self, id: RequestId, output: &[u32]) -> Result<bool> {
        // On an error (no memory) the request stays as it was, running.
        let ok = if output.is_empty() {
            self.req(id)?;
            true
        } else {
            self.extend_one(id, output)?
        };
        self.free(id)?;
        Ok(ok)
    }

    /// Convenience for simulators (decode steps): for each `(id, n)` of `items` in order,
    /// append the next `n` of `tokens` to request `id` and compute them
    /// (`append_tokens` + `allocate_slots(id, n)`: the blocks they fill are cached, new
    /// blocks taken as needed). Stops at the first item the pool cannot take, which
    /// changes nothing (its tokens are not appended). Returns the blocks each applied item
    /// evicted (as many entries as items applied) and the most blocks the prefix cache
    /// held before the first item or after any applied item.
    ///
    /// Checked before anything changes: every id is a running request (slots allocated),
    /// every `n >= 1`, and the `n` add up to `tokens.len()`.
    pub fn extend(
        &mut self,
        items: &[(RequestId, usize)],
        tokens: &[u32],
    ) -> Result<(Vec<u64>, usize)> {
        let mut total = 0usize;
        for &(id, n) in items {
            if !self.req(id)?.admitted {
                return Err(Error::InvalidArgument(format!(
                    "request {id} holds no slots: admit or allocate it first"
                )));
            }
            if n == 0 {
                return Err(Error::InvalidArgument(format!(
                    "request {id}: each item extends by at least 1 token, got 0"
                )));
            }
            total = total.saturating_add(n);
        }
        if total != tokens.len() {
            return Err(Error::InvalidArgument(format!(
                "the items extend by {total} tokens but {} were given",
                tokens.len()
            )));
        }
        let mut evicted = Vec::new();
        evicted
            .try_reserve(items.len())
            .map_err(|e| Error::out_of_memory("the eviction counts", e))?;
        let mut peak = self.pool.num_cached_blocks();
        let mut at = 0;
        for &(id, n) in items {
            let before = self.pool.num_evicted_blocks();
            let taken = self.extend_one(id, &tokens[at..at + n])?;
            at += n;
            if !taken {
                break;
            }
            evicted.push(self.pool.num_evicted_blocks() - before);
            peak = peak.max(self.pool.num_cached_blocks());
        }
        Ok((evicted, peak))
    }

    /// `append_tokens(id, tokens)` + `allocate_slots(id, tokens.len())`; false (and the
    /// tokens not appended) when the pool cannot take them.
    fn extend_one(&mut self, id: RequestId, tokens: &[u32]) -> Result<bool> {
        let (n_tokens, n_hashes) = {
            let r = self.req(id)?;
            (r.tokens.len(), r.block_hashes.len())
        };
        self.append_tokens(id, tokens)?;
        let got = self.allocate_slots(id, tokens.len(), 0, &[], 0);
        if !matches!(got, Ok(Some(_))) {
            if let Some(r) = self.requests.get_mut(&id) {
                r.tokens.truncate(n_tokens);
                r.block_hashes.truncate(n_hashes);
            }
            got?;
            return Ok(false);
        }
        Ok(true)
    }

    /// Queues tokens that request `id` will append over its next decode steps
    /// ([`decode_steps`](Self::decode_steps)): a simulator that knows a request's output
    /// hands it over once instead of a few tokens per step. They join the end of the
    /// request's queue, which lives as long as the request.
    pub fn queue_tokens(&mut self, id: RequestId, tokens: &[u32]) -> Result<()> {
        let req = self.requests.get_mut(&id).ok_or_else(|| unknown(id))?;
        req.queued
            .try_reserve(tokens.len())
            .map_err(|e| Error::out_of_memory("the queued tokens", e))?;
        req.queued.extend_from_slice(tokens);
        Ok(())
    }

    /// Tokens queued for request `id` and not fed yet.
    pub fn num_queued_tokens(&self, id: RequestId) -> Result<usize> {
        let r = self.req(id)?;
        Ok(r.queued.len() - r.queued_fed)
    }

    /// `k` decode steps of each request of `ids`, in order: each appends its next `k`
    /// queued tokens and computes them, as [`extend`](Self::extend) does with those
    /// tokens (`append_tokens` + `allocate_slots(id, k)`). Stops at the first request the
    /// pool cannot take, which changes nothing (its tokens stay queued). Returns the
    /// blocks each applied request evicted (one entry per request applied) and the most
    /// blocks the prefix cache held before the first or after any applied request.
    ///
    /// Checked before anything changes: `k >= 1`, no id twice, and every id is a running
    /// request with at least `k` queued tokens.
    pub fn decode_steps(&mut self, ids: &[RequestId], k: usize) -> Result<(Vec<u64>, usize)> {
        if k == 0 {
            return Err(Error::InvalidArgument(
                "decode_steps takes k >= 1 steps, got 0".into(),
            ));
        }
        let mut seen: FxHashSet<RequestId> = FxHashSet::default();
        seen.try_reserve(ids.len())
            .map_err(|e| Error::out_of_memory("the request ids", e))?;
        for &id in ids {
            let r = self.req(id)?;
            if !r.admitted {
                return Err(Error::InvalidArgument(format!(
                    "request {id} holds no slots: admit or allocate it first"
                )));
            }
            let left = r.queued.len() - r.queued_fed;
            if left < k {
                return Err(Error::InvalidArgument(format!(
                    "request {id} has {left} queued tokens, fewer than the {k} steps"
                )));
            }
            if !seen.insert(id) {
                return Err(Error::InvalidArgument(format!(
                    "request {id} is given twice"
                )));
            }
        }
        let mut evicted = Vec::new();
        evicted
            .try_reserve(ids.len())
            .map_err(|e| Error::out_of_memory("the eviction counts", e))?;
        let mut peak = self.pool.num_cached_blocks();
        for &id in ids {
            let before = self.pool.num_evicted_blocks();
            // The queue leaves the request while its tokens are appended to it.
            let (queue, at) = {
                let r = self.requests.get_mut(&id).ok_or_else(|| unknown(id))?;
                (std::mem::take(&mut r.queued), r.queued_fed)
            };
            let taken = self.extend_one(id, &queue[at..at + k]);
            if let Some(r) = self.requests.get_mut(&id) {
                r.queued = queue;
                if matches!(taken, Ok(true)) {
                    r.queued_fed += k;
                }
            }
            if !taken? {
                break;
            }
            evicted.push(self.pool.num_evicted_blocks() - before);
            peak = peak.max(self.pool.num_cached_blocks());
        }
        Ok((evicted, peak))
    }

    /// The most decode steps (at most `limit`) that every request of `ids` can take
    /// together with the blocks the pool can still hand out: the largest `k <= limit`
    /// for which the new blocks the requests need to hold `k` more tokens each fit in
    /// [`BlockPool::num_free_blocks`]. Full attention counts exactly; a sliding window
    /// releases blocks as it moves, so there the answer is a lower bound.
    pub fn max_decode_steps(&self, ids: &[RequestId], limit: usize) -> Result<usize> {
        let bs = self.block_size;
        let mut held = Vec::new();
        held.try_reserve(ids.len())
            .map_err(|e| Error::out_of_memory("the request ids", e))?;
        for &id in ids {
            let r = self.req(id)?;
            held.push((r.tokens.len(), r.blocks.len()));
        }
        let free = self.pool.num_free_blocks();
        let needed = |k: usize| -> usize {
            held.iter()
                .map(|&(n, b)| n.saturating_add(k).div_ceil(bs).saturating_sub(b))
                .fold(0usize, usize::saturating_add)
        };
        if needed(limit) <= free {
            return Ok(limit);
        }
        // needed(lo) <= free < needed(hi); needed is non-decreasing in k.
        let (mut lo, mut hi) = (0usize, limit);
        if needed(0) > free {
            return Ok(0);
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if needed(mid) <= free {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }

    /// The pool's invariants plus: every request's blocks are referenced.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        self.pool.check_invariants()?;
        let mut refs: FxHashMap<u32, u32> = FxHashMap::default();
        for req in self.requests.values() {
            for &b in &req.blocks {
                if b != NULL_BLOCK {
                    *refs.entry(b).or_default() += 1;
                }
            }
        }
        for (b, n) in refs {
            let r = self.pool.ref_cnt(b).map_err(|e| e.to_string())?;
            if r < n {
                return Err(format!("block {b} is held {n} times but has ref_cnt {r}"));
            }
        }
        Ok(())
    }
}

/// What [`KVCacheManager::allocate_slots`] allocated before changing anything.
struct SlotPlan {
    new_blocks: Vec<u32>,
    store: Option<StorePlan>,
}

/// vLLM's `cache_blocks` for one group: caches the request's blocks that are full within
/// its first `num_tokens` tokens and have a hash, past those it has cached, in what
/// `plan` allocated (those blocks are in range, referenced, uncached and distinct by
/// construction).
fn cache_blocks(
    pool: &mut BlockPool,
    req: &mut Request,
    plan: StorePlan,
    num_tokens: usize,
    bs: usize,
) {
    let num_cached = req.num_cached_blocks.unwrap_or(0);
    let num_full = num_tokens.min(req.block_hashes.len() * bs) / bs;
    if num_cached >= num_full {
        return;
    }
    let info = StoreInfo {
        token_ids: Some(&req.tokens),
        lora_id: req.opts.lora_id,
        lora_name: req.opts.lora_name.as_deref(),
        block_extra_keys: &req.opts.block_extra_keys,
        default_extra_keys: req.opts.default_extra_keys.as_deref(),
    };
    pool.commit_store(
        plan,
        &req.blocks[num_cached..num_full],
        &req.block_hashes,
        num_cached,
        bs,
        0,
        &info,
    );
    req.num_cached_blocks = Some(num_full);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::HashAlgo;

    fn mgr(n: usize, bs: usize, window: Option<usize>) -> KVCacheManager {
        let h = BlockHasher::new(HashAlgo::Sha256, bs, "vllm-none-hash").unwrap();
        KVCacheManager::new(n, h, true, window, true).unwrap()
    }

    fn toks(r: std::ops::Range<u32>) -> Vec<u32> {
        r.collect()
    }

    #[test]
    fn a_hit_on_a_never_used_block_leaves_the_free_queue() {
        let mut m = mgr(4, 1, None);
        m.add_request(0, &[2], RequestOptions::default()).unwrap();
        // Block 3 never had storage: adopting it must take it out of the fresh run, so
        // that the new block is another one.
        let new = m.allocate_slots(0, 0, 1, &[3], 1).unwrap().unwrap();
        assert_eq!(new, vec![1]);
        assert_eq!(m.block_ids(0).unwrap(), &[3, 1]);
        assert_eq!(m.pool().free_block_ids().unwrap(), vec![2]);
        m.check_invariants().unwrap();
        m.free(0).unwrap();
        assert_eq!(m.pool().free_block_ids().unwrap(), vec![1, 3, 2]);
        m.check_invariants().unwrap();
    }

    #[test]
    fn checked_free_order_and_reuse() {
        let mut m = mgr(8, 16, None);
        let a = m
            .admit(1, &toks(0..40), RequestOptions::default(), 0)
            .unwrap()
            .unwrap();
        assert_eq!(a.block_ids, vec![1, 2, 3]);
        m.free(1).unwrap();
        assert_eq!(
            m.pool().free_block_ids().unwrap(),
            vec![3, 4, 5, 6, 7, 2, 1]
        );
        // A fully cached 32-token prompt hits 16 (the last token is recomputed).
        let b = m
            .admit(2, &toks(0..32), RequestOptions::default(), 0)
            .unwrap()
            .unwrap();
        assert_eq!(b.num_hit_tokens, 16);
        assert_eq!(b.block_ids, vec![1, 3]);
        let s = m.stats();
        assert_eq!((s.requests, s.queries, s.hits), (2, 72, 16));
        m.check_invariants().unwrap();
    }

    #[test]
    fn decode_caches_at_next_allocation() {
        let mut m = mgr(16, 4, None);
        m.admit(1, &toks(0..6), RequestOptions::default(), 4)
            .unwrap()
            .unwrap();
        assert_eq!(m.pool().num_cached_keys(), 1);
        m.append_tokens(1, &[9, 9, 9]).unwrap();
        assert_eq!(m.block_hashes(1).unwrap().len(), 2);
        assert_eq!(m.pool().num_cached_keys(), 1);
        assert_eq!(m.allocate_slots(1, 3, 0, &[], 0).unwrap(), Some(vec![]));
        assert_eq!(m.pool().num_cached_keys(), 2);
        assert_eq!(m.num_computed_tokens(1).unwrap(), 9);
    }

    #[test]
    fn sliding_window_hit_and_skipped_blocks() {
        let mut m = mgr(32, 4, Some(5));
        m.admit(1, &toks(0..24), RequestOptions::default(), 0)
            .unwrap()
            .unwrap();
        // Blocks before the window of the next token were released as nulls.
        let ids = m.block_ids(1).unwrap().to_vec();
        assert_eq!(ids.iter().filter(|&&b| b == NULL_BLOCK).count(), 0);
        m.append_tokens(1, &[7]).unwrap();
        m.allocate_slots(1, 1, 0, &[], 0).unwrap().unwrap();
        let ids = m.block_ids(1).unwrap();
        assert_eq!(&ids[..5], &[0, 0, 0, 0, 0]);
        m.free(1).unwrap();
        m.add_request(2, &toks(0..24), RequestOptions::default())
            .unwrap();
        let (blocks, hit) = m.get_computed_blocks(2).unwrap();
        // Needs ceil(4/4) = 1 contiguous block: the last full block below the cap.
        assert_eq!(hit, 20);
        assert_eq!(blocks.iter().filter(|&&b| b != NULL_BLOCK).count(), 1);
        m.check_invariants().unwrap();
    }

    #[test]
    fn refusal_and_errors_change_nothing() {
        let mut m = mgr(4, 4, None);
        m.add_request(1, &toks(0..20), RequestOptions::default())
            .unwrap();
        let free = m.pool().free_block_ids().unwrap();
        assert_eq!(m.allocate_slots(1, 20, 0, &[], 0).unwrap(), None);
        assert_eq!(m.pool().free_block_ids().unwrap(), free);
        assert!(matches!(m.free(7), Err(Error::UnknownRequest(_))));
        assert!(m.allocate_slots(1, 0, 0, &[], 0).is_err());
        assert!(m.allocate_slots(1, 1, 4, &[9], 0).is_err());
        assert!(m.add_request(1, &[1], RequestOptions::default()).is_err());
        assert!(m.add_request(2, &[], RequestOptions::default()).is_err());
        assert_eq!(m.pool().free_block_ids().unwrap(), free);
        m.preempt(1).unwrap();
        assert!(KVCacheManager::new(4, m.hasher().clone(), true, Some(1), false).is_err());
    }

    #[test]
    fn admit_looks_up_as_it_hashes_with_the_same_result() {
        // Prompts sharing prefixes of 0..=3 blocks (block 4), including exact multiples
        // of the block size (the hit is capped at num_tokens - 1).
        let base = toks(100..116);
        let prompts: Vec<Vec<u32>> = [0usize, 4, 7, 8, 12, 16]
            .iter()
            .flat_map(|&n| {
                [0u32, 1, 5].map(|k| {
                    let mut p = base[..n].to_vec();
                    p.extend((0..k).map(|j| 1000 + 10 * n as u32 + j));
                    p
                })
            })
            .filter(|p| !p.is_empty())
            .collect();
        let (mut a, mut b) = (mgr(64, 4, None), mgr(64, 4, None));
        for (i, p) in prompts.iter().enumerate() {
            let id = i as u64;
            let got = a
                .admit(id, p, RequestOptions::default(), 0)
                .unwrap()
                .unwrap();
            b.add_request(id, p, RequestOptions::default()).unwrap();
            let (blocks, hit) = b.get_computed_blocks(id).unwrap();
            b.allocate_slots(id, p.len() - hit, hit, &blocks, 0)
                .unwrap()
                .unwrap();
            assert_eq!(got.num_hit_tokens, hit, "prompt {i}");
            assert_eq!(got.block_ids, b.block_ids(id).unwrap(), "prompt {i}");
            assert_eq!(a.block_hashes(id).unwrap(), b.block_hashes(id).unwrap());
            a.finish(id, &[]).unwrap();
            b.free(id).unwrap();
        }
        assert_eq!(a.stats(), b.stats());
        assert_eq!(
            a.pool().free_block_ids().unwrap(),
            b.pool().free_block_ids().unwrap()
        );
        // A known id is refused before anything is hashed or looked up.
        a.add_request(7, &[1, 2, 3], RequestOptions::default())
            .unwrap();
        assert!(a
            .admit(7, &[1, 2, 3], RequestOptions::default(), 0)
            .is_err());
        assert_eq!(a.num_tokens(7).unwrap(), 3);
    }

    /// A 12-block pool (4-token blocks) running requests 1 and 3, with the blocks of a
    /// freed request 2 cached (to be evicted later).
    fn two_running() -> KVCacheManager {
        let mut m = mgr(12, 4, None);
        for (id, r) in [(1, 0..6), (2, 100..103), (3, 200..205)] {
            m.admit(id, &toks(r), RequestOptions::default(), 0)
                .unwrap()
                .unwrap();
            if id == 2 {
                m.free(2).unwrap(); // before request 3 takes its blocks, as a cache
            }
        }
        m
    }

    #[test]
    fn extend_equals_append_and_allocate_and_stops_where_the_pool_is_short() {
        let step = |m: &mut KVCacheManager, items: &[(u64, usize)], toks: &[u32]| {
            let mut at = 0;
            let mut out = Vec::new();
            for &(id, n) in items {
                let before = m.pool().num_evicted_blocks();
                m.append_tokens(id, &toks[at..at + n]).unwrap();
                at += n;
                m.allocate_slots(id, n, 0, &[], 0).unwrap().unwrap();
                out.push(m.pool().num_evicted_blocks() - before);
            }
            out
        };
        let (mut a, mut b) = (two_running(), two_running());
        let items = [(1u64, 3usize), (3, 4), (1, 5)];
        let t = toks(1000..1012);
        let want = step(&mut a, &items, &t);
        let (got, peak) = b.extend(&items, &t).unwrap();
        assert_eq!(got, want);
        assert!(peak >= b.pool().num_cached_blocks());
        assert_eq!(b.block_ids(1).unwrap(), a.block_ids(1).unwrap());
        assert_eq!(b.block_hashes(3).unwrap(), a.block_hashes(3).unwrap());
        assert_eq!(
            b.pool().free_block_ids().unwrap(),
            a.pool().free_block_ids().unwrap()
        );
        // Too long for the pool: the first item applies, the second changes nothing.
        let free = b.pool().num_free_blocks();
        let (got, _) = b
            .extend(&[(1, 1), (3, 4 * free + 8)], &toks(0..4 * free as u32 + 9))
            .unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(b.num_tokens(3).unwrap(), a.num_tokens(3).unwrap());
        assert_eq!(b.block_hashes(3).unwrap(), a.block_hashes(3).unwrap());
        b.check_invariants().unwrap();
        // Bad items change nothing.
        let ids = b.pool().free_block_ids().unwrap();
        assert!(b.extend(&[(1, 1), (9, 1)], &[5, 6]).is_err());
        assert!(b.extend(&[(1, 0)], &[]).is_err());
        assert!(b.extend(&[(1, 2)], &[5]).is_err());
        assert_eq!(b.num_tokens(1).unwrap(), a.num_tokens(1).unwrap() + 1);
        assert_eq!(b.pool().free_block_ids().unwrap(), ids);
    }

    #[test]
    fn decode_steps_equal_extend_with_the_queued_tokens() {
        let (mut a, mut b) = (two_running(), two_running());
        b.queue_tokens(1, &toks(1000..1004)).unwrap();
        b.queue_tokens(1, &toks(1004..1010)).unwrap(); // joins the end of the queue
        b.queue_tokens(3, &toks(2000..2010)).unwrap();
        assert_eq!(b.num_queued_tokens(1).unwrap(), 10);
        for (k, from) in [(3usize, 0u32), (2, 3), (4, 5)] {
            let t: Vec<u32> = toks(1000 + from..1000 + from + k as u32)
                .into_iter()
                .chain(toks(2000 + from..2000 + from + k as u32))
                .collect();
            let want = a.extend(&[(1, k), (3, k)], &t).unwrap();
            assert_eq!(b.decode_steps(&[1, 3], k).unwrap(), want);
            assert_eq!(b.block_ids(1).unwrap(), a.block_ids(1).unwrap());
            assert_eq!(b.block_hashes(3).unwrap(), a.block_hashes(3).unwrap());
            assert_eq!(
                b.pool().free_block_ids().unwrap(),
                a.pool().free_block_ids().unwrap()
            );
            assert_eq!(b.pool().num_evicted_blocks(), a.pool().num_evicted_blocks());
        }
        assert_eq!(b.num_queued_tokens(1).unwrap(), 1);
        b.check_invariants().unwrap();
        // Bad calls change nothing: too few queued tokens, an unknown or repeated id,
        // zero steps.
        let ids = b.pool().free_block_ids().unwrap();
        assert!(b.decode_steps(&[1, 3], 2).is_err());
        assert!(b.decode_steps(&[3, 9], 1).is_err());
        assert!(b.decode_steps(&[3, 3], 1).is_err());
        assert!(b.decode_steps(&[3], 0).is_err());
        assert_eq!(b.num_tokens(3).unwrap(), a.num_tokens(3).unwrap());
        assert_eq!(b.num_queued_tokens(3).unwrap(), 1);
        assert_eq!(b.pool().free_block_ids().unwrap(), ids);
    }

    #[test]
    fn decode_steps_stop_where_the_pool_is_short_and_max_decode_steps_says_where() {
        let mut m = mgr(6, 4, None);
        m.admit(1, &toks(0..4), RequestOptions::default(), 0)
            .unwrap()
            .unwrap();
        m.admit(2, &toks(50..53), RequestOptions::default(), 0)
            .unwrap()
            .unwrap();
        m.queue_tokens(1, &toks(100..140)).unwrap();
        m.queue_tokens(2, &toks(200..240)).unwrap();
        // 5 usable blocks, 2 taken: 3 free. Request 1 holds 4 tokens in 1 block,
        // request 2 holds 3 in 1.
        let needed = |k: usize| (4 + k).div_ceil(4) - 1 + (3 + k).div_ceil(4) - 1;
        let free = m.pool().num_free_blocks();
        let best = (0..=40).filter(|&k| needed(k) <= free).max().unwrap();
        assert_eq!(m.max_decode_steps(&[1, 2], 40).unwrap(), best);
        assert_eq!(m.max_decode_steps(&[1, 2], 2).unwrap(), 2);
        assert_eq!(m.max_decode_steps(&[], 7).unwrap(), 7);
        assert!(m.max_decode_steps(&[1, 9], 7).is_err());
        let (ev, _) = m.decode_steps(&[1, 2], best).unwrap();
        assert_eq!(ev.len(), 2);
        assert_eq!(m.max_decode_steps(&[1, 2], 40).unwrap(), 0);
        // Past that the pool is short: the call stops at the first request it cannot
        // take, and request 2 keeps its tokens queued.
        let before = m.num_tokens(2).unwrap();
        let (ev, _) = m.decode_steps(&[1, 2], 4).unwrap();
        assert!(ev.len() < 2);
        assert_eq!(m.num_tokens(2).unwrap(), before);
        assert_eq!(m.num_queued_tokens(2).unwrap(), 40 - best);
        m.check_invariants().unwrap();
    }

    #[test]
    fn preempted_admission_counts_separately() {
        let mut m = mgr(16, 4, None);
        m.admit(1, &toks(0..9), RequestOptions::default(), 0)
            .unwrap()
            .unwrap();
        m.preempt(1).unwrap();
        let (b, hit) = m.get_computed_blocks(1).unwrap();
        assert_eq!(hit, 8);
        m.allocate_slots(1, 1, hit, &b, 0).unwrap().unwrap();
        let s = m.take_stats();
        assert_eq!(
            (s.requests, s.preempted_requests, s.preempted_hits),
            (1, 1, 8)
        );
        assert_eq!(m.stats(), PrefixCacheStats::default());
    }
}
