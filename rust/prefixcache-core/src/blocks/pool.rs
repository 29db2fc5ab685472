//! vLLM v1's `BlockPool`: blocks with reference counts, the LRU free queue and the
//! prefix-cache hash table (SEMANTICS.md section 2.2).
//!
//! - Block 0 is the null block: taken out of the free queue at construction and never
//!   handed out, touched or freed (`N - 1` usable blocks).
//! - The free queue holds exactly the blocks with `ref_cnt == 0`; its head is reused
//!   first. Freed blocks without a hash go to the head (LIFO reuse), freed blocks with a
//!   hash to the tail (LRU eviction).
//! - The hash table maps `(hash, group)` to the blocks carrying it in insertion order
//!   (vLLM does not de-duplicate; lookups return the first, i.e. the oldest entry).
//!
//! Every fallible operation validates all of its input before changing anything.
//!
//! Memory follows the blocks in use, not `num_blocks`: a block gets its 32 bytes (24 in
//! [`Block`], 8 of free-queue links) when it is first handed out or hit, and the table
//! holds 4 bytes per cached key, plus, when the pool's hashes are longer than 8 bytes,
//! 24 bytes per block id up to the highest cached one for the hash bytes past the 8 in
//! the block. Growth is reserved fallibly before anything changes.

use crate::error::{try_copy, try_copy_str, try_vec};
use crate::error::{Error, Result};
use crate::events::{split_removals, untag_extra_keys, KvEvent, Medium};
use crate::hash::{BlockHash, KeyValue};

use super::free_queue::FreeQueue;
use super::table::{key_hash, Block, HashTable32, Prefetcher};
use crate::sys_vec::SysVec;

/// The id of the null block (vLLM's placeholder for skipped sliding-window blocks).
pub const NULL_BLOCK: u32 = 0;

/// Prefix-cache key: a block hash within one KV-cache group (vLLM's
/// `BlockHashWithGroupId`: `hash + group.to_bytes(4, "big")`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheKey {
    pub hash: BlockHash,
    pub group: u32,
}

impl std::hash::Hash for CacheKey {
    /// Every byte of the hash is folded in ([`key_hash`]).
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(key_hash(self.hash.as_bytes(), self.group));
    }
}

/// A block that never left the fresh run: free, unreferenced, uncached.
const UNUSED: Block = Block {
    ref_cnt: 0,
    group: 0,
    chain_prev: super::table::NO_KEY,
    chain_next: u32::MAX - 1,
    head: 0,
};

/// What `cache_full_blocks` needs to know about the request that owns the blocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct StoreInfo<'a> {
    /// The request's tokens (at least `num_full_blocks * block_size` of them), used only
    /// for the `BlockStored` event; `None` gives the event no tokens.
    pub token_ids: Option<&'a [u32]>,
    pub lora_id: Option<i64>,
    pub lora_name: Option<&'a str>,
    /// Extra hash keys of block `i` (tagged, as hashed), for the event's `extra_keys`.
    pub block_extra_keys: &'a [Option<Vec<KeyValue>>],
    /// Extra keys of blocks past `block_extra_keys`.
    pub default_extra_keys: Option<&'a [KeyValue]>,
}

impl StoreInfo<'_> {
    fn extra_keys(&self, block: usize) -> Option<&[KeyValue]> {
        match self.block_extra_keys.get(block) {
            Some(k) => k.as_deref(),
            None => self.default_extra_keys,
        }
    }
}

/// The block pool.
#[derive(Debug, Clone)]
pub struct BlockPool {
    num_blocks: usize,
    /// Blocks `0..blocks.len()` (as many as the free queue has links for); the others have
    /// never been handed out or hit and are [`UNUSED`].
    blocks: SysVec<Block>,
    free: FreeQueue,
    cached: HashTable32,
    /// Cached blocks whose hash was dropped because the block was reused.
    evictions: u64,
    /// Blocks that carry a hash now (what the prefix cache holds).
    num_cached: usize,
    /// Length of the hashes this pool holds, fixed by the first hash it sees.
    hash_len: Option<usize>,
    enable_caching: bool,
    events_enabled: bool,
    events: Vec<KvEvent>,
    /// Room for the hashes of the next new `BlockRemoved` event, reserved before a call
    /// that may evict (see [`BlockPool::reserve_new_blocks`]).
    removal_spare: Vec<BlockHash>,
    /// Reused buffer of `free_owned`.
    scratch: Vec<u32>,
}

/// What caching a run of blocks allocates, allocated before anything changes
/// ([`BlockPool::plan_store`]): the `BlockStored` event's lists, with room for every
/// block of the run.
#[derive(Debug, Default)]
pub(crate) struct StorePlan {
    stored: Vec<BlockHash>,
    event_keys: Vec<Option<Vec<KeyValue>>>,
    token_ids: Vec<u32>,
    lora_name: Option<String>,
    hash_len: Option<usize>,
}

/// Hint the CPU to load `block` into the cache (no effect on results).
#[inline(always)]
fn prefetch(block: Option<&Block>) {
    #[cfg(target_arch = "x86_64")]
    if let Some(b) = block {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch never faults and reads nothing the program sees; SSE (which
        // the intrinsic needs) is part of the x86_64 baseline.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(b).cast::<i8>()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = block;
}

/// [`BlockPool::lookup_prefix`] for hashes that arrive one at a time, each after some
/// work (hashing its block). A lookup has two dependent misses, the table slot and the
/// block it names, so each hash goes through three stages, one per later arrival: its
/// slot is prefetched when it arrives, the block that slot names when the next hash
/// arrives, and it is looked up when the one after arrives (or at
/// [`finish`](Self::finish)). The result is `lookup_prefix`'s: the hits up to the first
/// miss.
pub(crate) struct StreamingLookup<'p> {
    pool: &'p BlockPool,
    pf: Option<Prefetcher>,
    group: u32,
    /// Hashes still to take.
    left: usize,
    /// The hashes taken and not looked up yet, with their table hashes, oldest first.
    older: Option<(BlockHash, u64)>,
    newer: Option<(BlockHash, u64)>,
    hits: Vec<u32>,
    hitting: bool,
}

impl StreamingLookup<'_> {
    /// Takes the next hash of the prefix.
    #[inline]
    pub fn push(&mut self, hash: &BlockHash) {
        if !self.hitting || self.left == 0 {
            return;
        }
        self.left -= 1;
        let kh = key_hash(hash.as_bytes(), self.group);
        if let Some(pf) = &self.pf {
            pf.key(kh);
        }
        if let Some(old) = self.older.take() {
            self.resolve(&old);
        }
        self.older = self.newer.replace((*hash, kh));
        if let Some((_, kh)) = &self.older {
            let pool = self.pool;
            pool.cached.prefetch_candidate(&pool.blocks, *kh);
        }
    }

    fn resolve(&mut self, (hash, kh): &(BlockHash, u64)) {
        if !self.hitting {
            return;
        }
        let pool = self.pool;
        match pool
            .cached
            .first_hashed(&pool.blocks, hash, self.group, *kh)
        {
            Some(b) => self.hits.push(b),
            None => self.hitting = false,
        }
    }

    /// The hit blocks: the longest cached run of the hashes taken, from the first.
    pub fn finish(mut self) -> Vec<u32> {
        if let Some(old) = self.older.take() {
            self.resolve(&old);
        }
        if let Some(new) = self.newer.take() {
            self.resolve(&new);
        }
        self.hits
    }
}

fn block_state(msg: String) -> Error {
    Error::BlockState(msg)
}

impl BlockPool {
    /// A pool of `num_blocks` blocks (at least 1: the null block), all free but the null
    /// block.
    pub fn new(
        num_blocks: usize,
        enable_caching: bool,
        enable_kv_cache_events: bool,
    ) -> Result<Self> {
        if num_blocks == 0 || num_blocks > (u32::MAX - 3) as usize {
            return Err(Error::InvalidArgument(format!(
                "num_blocks must be in [1, {}], got {num_blocks}",
                u32::MAX - 3
            )));
        }
        let mut pool = BlockPool {
            num_blocks,
            blocks: SysVec::new(),
            free: FreeQueue::new(num_blocks as u32)
                .map_err(|e| Error::out_of_memory("the block pool", e))?,
            cached: HashTable32::new(),
            evictions: 0,
            num_cached: 0,
            hash_len: None,
            enable_caching,
            events_enabled: enable_kv_cache_events,
            events: Vec::new(),
            removal_spare: Vec::new(),
            scratch: Vec::new(),
        };
        pool.reserve_through(NULL_BLOCK)?;
        pool.free.pop_front(); // the null block
        pool.sync_blocks();
        Ok(pool)
    }

    /// Reserves block storage for every id up to `id` (inclusive), so that the free
    /// queue can hand out or drop any block up to it without allocating.
    pub(crate) fn reserve_through(&mut self, id: u32) -> Result<()> {
        let id = id.min(self.num_blocks as u32 - 1);
        self.free
            .reserve_through(id)
            .map_err(|e| Error::out_of_memory("the block pool", e))?;
        let want = id as usize + 1;
        if want > self.blocks.capacity() {
            let grown = (self.blocks.len() + self.blocks.len() / 4)
                .max(want)
                .min(self.num_blocks);
            self.blocks
                .try_reserve_exact(grown - self.blocks.len())
                .map_err(|e| Error::out_of_memory("the block pool", e))?;
        }
        Ok(())
    }

    /// Room for taking `n` blocks off the free queue: their storage, and the hashes
    /// their evictions add to the events (the last event's list, or a new event's, when
    /// the removals do not change group more than once).
    pub(crate) fn reserve_new_blocks(&mut self, n: usize) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let fresh = self.free.materialized();
        self.reserve_through(fresh.saturating_add((n - 1) as u32))?;
        if self.enable_caching {
            self.reserve_removals(n)?;
        }
        Ok(())
    }

    /// Room for the `BlockRemoved` hashes of up to `n` evictions: the last event's list,
    /// or a new event and its list (when the removals do not change group more than
    /// once).
    fn reserve_removals(&mut self, n: usize) -> Result<()> {
        if !self.events_enabled || n == 0 {
            return Ok(());
        }
        let oom = |e| Error::out_of_memory("the event list", e);
        self.events.try_reserve(1).map_err(oom)?;
        if let Some(KvEvent::BlockRemoved { block_hashes, .. }) = self.events.last_mut() {
            block_hashes.try_reserve(n).map_err(oom)?;
        }
        self.removal_spare.try_reserve(n).map_err(oom)
    }

    /// Room for `n` more events (none when events are off).
    pub(crate) fn reserve_events(&mut self, n: usize) -> Result<()> {
        if !self.events_enabled {
            return Ok(());
        }
        self.events
            .try_reserve(n)
            .map_err(|e| Error::out_of_memory("the event list", e))
    }

    /// Room for freeing `n` blocks in one call without allocating.
    pub(crate) fn reserve_frees(&mut self, n: usize) -> Result<()> {
        self.scratch
            .try_reserve(n)
            .map_err(|e| Error::out_of_memory("the blocks to free", e))
    }

    /// Blocks that have storage (the free queue's fresh run starts here).
    pub(crate) fn materialized(&self) -> u32 {
        self.free.materialized()
    }

    /// Gives storage to the blocks the free queue just took out of its fresh run
    /// (reserved before by [`reserve_through`](Self::reserve_through)).
    #[inline]
    fn sync_blocks(&mut self) {
        let n = self.free.materialized() as usize;
        if self.blocks.len() < n {
            self.blocks.resize(n, UNUSED);
        }
    }

    #[inline]
    fn block(&self, id: u32) -> &Block {
        self.blocks.get(id as usize).unwrap_or(&UNUSED)
    }

    /// The key of a block, if cached.
    #[inline]
    fn key_of(&self, id: u32) -> Option<CacheKey> {
        let hash = self.cached.hash_of(&self.blocks, id)?;
        Some(CacheKey {
            hash,
            group: self.block(id).group,
        })
    }

    /// Blocks that ever held content or a reference (what the pool's memory follows).
    pub fn num_touched_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Cached blocks whose hash was dropped because the block was reused (vLLM's
    /// evictions; one `BlockRemoved` event each when events are enabled).
    pub fn num_evicted_blocks(&self) -> u64 {
        self.evictions
    }

    /// Blocks that carry a hash now: what the prefix cache holds.
    pub fn num_cached_blocks(&self) -> usize {
        self.num_cached
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn enable_caching(&self) -> bool {
        self.enable_caching
    }

    pub fn events_enabled(&self) -> bool {
        self.events_enabled
    }

    pub fn num_free_blocks(&self) -> usize {
        self.free.len()
    }

    /// `1 - free / (N - 1)`; 0 for a pool holding only the null block.
    pub fn usage(&self) -> f64 {
        let usable = self.num_blocks - 1;
        if usable == 0 {
            return 0.0;
        }
        1.0 - self.free.len() as f64 / usable as f64
    }

    /// Number of `(hash, group)` keys in the prefix cache.
    pub fn num_cached_keys(&self) -> usize {
        self.cached.len()
    }

    fn check_id(&self, id: u32) -> Result<()> {
        if (id as usize) < self.num_blocks {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "block id {id} is out of range: the pool has {} blocks",
                self.num_blocks
            )))
        }
    }

    /// Checks that `hash` has the length of the hashes already in the pool.
    pub fn check_hash(&self, hash: &BlockHash) -> Result<()> {
        match self.hash_len {
            Some(n) if n != hash.len() => Err(Error::InvalidArgument(format!(
                "block hash has {} bytes but this pool holds {n}-byte hashes",
                hash.len()
            ))),
            _ if hash.is_empty() => Err(Error::InvalidArgument("block hash is empty".into())),
            _ => Ok(()),
        }
    }

    pub fn ref_cnt(&self, id: u32) -> Result<u32> {
        self.check_id(id)?;
        Ok(self.block(id).ref_cnt)
    }

    /// The hash a block is cached under (`None` if not cached).
    pub fn block_key(&self, id: u32) -> Result<Option<CacheKey>> {
        self.check_id(id)?;
        Ok(self.key_of(id))
    }

    /// Free block ids from the head (next reused) to the tail. `OutOfMemory` (nothing
    /// built) when a list of every free id does not fit.
    pub fn free_block_ids(&self) -> Result<Vec<u32>> {
        let mut out = try_vec(self.free.len(), "the free block ids")?;
        out.extend(self.free.iter());
        Ok(out)
    }

    /// Whether block `id` is in the free queue.
    pub fn is_free(&self, id: u32) -> bool {
        self.free.contains(id)
    }

    /// The blocks cached under `key`, oldest first (empty when none).
    pub fn cached_blocks(&self, key: &CacheKey) -> Vec<u32> {
        if key.hash.len() != self.cached.hash_len() {
            return Vec::new();
        }
        self.cached.blocks(&self.blocks, &key.hash, key.group)
    }

    /// The first block cached under `hash` for each group, or `None` if any group misses.
    pub fn get_cached_block(&self, hash: &BlockHash, groups: &[u32]) -> Result<Option<Vec<u32>>> {
        self.check_hash(hash)?;
        let mut out = Vec::with_capacity(groups.len());
        for &group in groups {
            match self.lookup(hash, group) {
                Some(id) => out.push(id),
                None => return Ok(None),
            }
        }
        Ok(Some(out))
    }

    /// The first block cached under `(hash, group)` (no length check: a hash of another
    /// length simply misses).
    #[inline]
    pub fn lookup(&self, hash: &BlockHash, group: u32) -> Option<u32> {
        self.cached.first(&self.blocks, hash, group)
    }

    /// A prefix lookup fed one hash at a time, for a caller that computes the hashes as
    /// it goes (see [`StreamingLookup`]): at most `limit` hashes are looked up.
    /// An `OutOfMemory` error when room for `limit` hits cannot be allocated.
    pub(crate) fn streaming_lookup(&self, group: u32, limit: usize) -> Result<StreamingLookup<'_>> {
        let hits = try_vec(limit, "the hit blocks")?;
        Ok(StreamingLookup {
            pool: self,
            pf: self.cached.prefetcher(),
            group,
            left: limit,
            older: None,
            newer: None,
            hits,
            hitting: true,
        })
    }

    /// The blocks of the longest run of `hashes` cached under `group`, from the first
    /// (each the first block of its key): [`lookup`](Self::lookup) until the first miss,
    /// with the table slots of the hashes a few places ahead prefetched.
    pub(crate) fn lookup_prefix(&self, hashes: &[BlockHash], group: u32) -> Result<Vec<u32>> {
        const AHEAD: usize = 4;
        let mut out = try_vec(hashes.len(), "the hit blocks")?;
        let pf = self.cached.prefetcher();
        for (i, h) in hashes.iter().enumerate() {
            if let (Some(pf), Some(next)) = (&pf, hashes.get(i + AHEAD)) {
                pf.key(key_hash(next.as_bytes(), group));
            }
            match self.lookup(h, group) {
                Some(b) => out.push(b),
                None => break,
            }
        }
        Ok(out)
    }

    /// Take `n` blocks from the head of the free queue (evicting their cached hashes),
    /// each with `ref_cnt = 1`.
    pub fn get_new_blocks(&mut self, n: usize) -> Result<Vec<u32>> {
        // Reserved fallibly by `get_new_blocks_into`, once `n` is known to be available.
        let mut out = Vec::new();
        self.get_new_blocks_into(n, &mut out)?;
        Ok(out)
    }

    /// [`get_new_blocks`](Self::get_new_blocks), appending to `out`.
    pub fn get_new_blocks_into(&mut self, n: usize, out: &mut Vec<u32>) -> Result<()> {
        if n > self.free.len() {
            return Err(Error::OutOfBlocks {
                requested: n,
                available: self.free.len(),
            });
        }
        out.try_reserve(n)
            .map_err(|e| Error::out_of_memory("the block ids", e))?;
        self.reserve_new_blocks(n)?;
        let fresh = self.free.materialized();
        // Three passes over the popped ids (same result as one block at a time: popping
        // touches only the queue, evicting only the table and the blocks' keys). Keyed
        // blocks are scattered over the pool, so the eviction pass prefetches the block a
        // few places ahead: its cache miss overlaps the table work of the current one.
        let start = out.len();
        for _ in 0..n {
            let Some(id) = self.free.pop_front() else {
                break; // unreachable: n <= len was checked
            };
            if id >= fresh {
                self.sync_blocks();
            }
            out.push(id);
        }
        let new = &out[start..];
        if self.enable_caching {
            const AHEAD: usize = 4;
            let pf = self.cached.prefetcher();
            for (k, &id) in new.iter().enumerate() {
                if let Some(&far) = new.get(k + 2 * AHEAD) {
                    prefetch(self.blocks.get(far as usize));
                }
                if let (Some(pf), Some(&next)) = (&pf, new.get(k + AHEAD)) {
                    self.cached.prefetch_block_key(pf, &self.blocks, next);
                }
                if id < fresh && self.evict_hash(id) {
                    self.evictions += 1;
                }
            }
        }
        for &id in new {
            self.blocks[id as usize].ref_cnt = 1;
        }
        Ok(())
    }

    /// Drop block `id`'s cache entry (if any) and emit `BlockRemoved`.
    fn evict_hash(&mut self, id: u32) -> bool {
        if (id as usize) >= self.blocks.len() {
            return false;
        }
        if self.events_enabled {
            let Some(key) = self.key_of(id) else {
                return false;
            };
            // Runs of removals share one event (no allocation per evicted block);
            // `take_events` splits them back into vLLM's one event per hash.
            match self.events.last_mut() {
                Some(KvEvent::BlockRemoved {
                    block_hashes,
                    group_idx,
                    medium: Medium::Gpu,
                }) if *group_idx == key.group => block_hashes.push(key.hash),
                _ => {
                    // The list reserved for it (`reserve_new_blocks`).
                    let mut block_hashes = std::mem::take(&mut self.removal_spare);
                    block_hashes.push(key.hash);
                    self.events.push(KvEvent::BlockRemoved {
                        block_hashes,
                        group_idx: key.group,
                        medium: Medium::Gpu,
                    });
                }
            }
        }
        if !self.cached.remove(&mut self.blocks, id) {
            return false;
        }
        self.num_cached -= 1;
        true
    }

    /// Add a reference to each block (a prefix-cache hit); blocks with no reference leave
    /// the free queue. The null block cannot be touched (vLLM skips it silently; the
    /// manager filters it out before calling).
    pub fn touch(&mut self, ids: &[u32]) -> Result<()> {
        let mut top = 0;
        for &id in ids {
            self.check_id(id)?;
            if id == NULL_BLOCK {
                return Err(block_state("cannot touch the null block (block 0)".into()));
            }
            if self.block(id).ref_cnt == u32::MAX {
                return Err(block_state(format!("block {id} has 2**32 - 1 references")));
            }
            top = top.max(id);
        }
        // A hit on a never-used block gives it (and the fresh blocks before it) storage.
        self.reserve_through(top)?;
        for &id in ids {
            self.touch_reserved(id);
        }
        Ok(())
    }

    /// Touch one non-null block in range whose storage was reserved
    /// ([`reserve_through`](Self::reserve_through)): a never-used block leaves the fresh
    /// run of the free queue with one reference.
    #[inline]
    pub(crate) fn touch_reserved(&mut self, id: u32) {
        if id >= self.free.materialized() {
            self.free.remove(id);
            self.sync_blocks();
            if let Some(b) = self.blocks.get_mut(id as usize) {
                b.ref_cnt = 1;
            }
        } else {
            self.touch_one(id);
        }
    }

    /// Touch one non-null block that has storage (others are ignored: the manager only
    /// touches cached blocks, which have).
    #[inline]
    pub(crate) fn touch_one(&mut self, id: u32) {
        if let Some(b) = self.blocks.get_mut(id as usize) {
            if b.ref_cnt == 0 {
                self.free.remove(id);
            }
            b.ref_cnt = b.ref_cnt.saturating_add(1);
        }
    }

    /// Whether a block is an eviction candidate a hit would take out of the free queue.
    #[inline]
    pub(crate) fn is_unreferenced(&self, id: u32) -> bool {
        id != NULL_BLOCK && (id as usize) < self.num_blocks && self.block(id).ref_cnt == 0
    }

    /// Drop one reference from each block, in eviction order (the first block freed is
    /// evicted first). Blocks reaching zero references join the free queue: without a
    /// hash (or with caching disabled) at the head, in the given order; with a hash at the
    /// tail. Freeing a block that has no reference left (a double free) or the null block
    /// is an error.
    pub fn free_blocks(&mut self, ids: &[u32]) -> Result<()> {
        self.reserve_frees(ids.len())?;
        // Validate: decrement, undoing everything on the first failure.
        for (i, &id) in ids.iter().enumerate() {
            let err = if (id as usize) >= self.num_blocks {
                Some(Error::InvalidArgument(format!(
                    "block id {id} is out of range: the pool has {} blocks",
                    self.num_blocks
                )))
            } else if id == NULL_BLOCK {
                Some(block_state("cannot free the null block (block 0)".into()))
            } else if self.block(id).ref_cnt == 0 {
                Some(block_state(format!(
                    "cannot free block {id}: it has no reference left (double free?)"
                )))
            } else {
                None
            };
            if let Some(e) = err {
                for &done in &ids[..i] {
                    self.blocks[done as usize].ref_cnt += 1;
                }
                return Err(e);
            }
            self.blocks[id as usize].ref_cnt -= 1;
        }
        self.release_decremented(ids);
        Ok(())
    }

    /// After every block in `ids` lost one reference: queue those that reached zero, in
    /// the order vLLM would (a block reaches zero at its last occurrence in `ids`).
    fn release_decremented(&mut self, ids: &[u32]) {
        let mut first: Vec<u32> = Vec::with_capacity(ids.len());
        let mut last: Vec<u32> = Vec::with_capacity(ids.len());
        for &id in ids.iter().rev() {
            if id == NULL_BLOCK {
                continue;
            }
            let Some(b) = self.blocks.get(id as usize) else {
                continue;
            };
            if b.ref_cnt != 0 || self.free.is_marked(id) || self.free.contains(id) {
                continue;
            }
            let keyed = b.has_key();
            self.free.mark(id);
            if !keyed || !self.enable_caching {
                first.push(id);
            } else {
                last.push(id);
            }
        }
        // `first` and `last` are in reverse order: prepend `first` back to front so the
        // earliest-freed block ends at the head, append `last` front to back.
        for &id in &first {
            self.free.unmark(id);
            self.free.push_front(id);
        }
        for &id in last.iter().rev() {
            self.free.unmark(id);
            self.free.push_back(id);
        }
    }

    /// Internal free used by the manager, in eviction order: its own blocks (valid and
    /// referenced; null blocks are skipped, as vLLM does), so no validation pass. One
    /// pass: a block reaching zero with a hash joins the tail at once; those without are
    /// collected and put at the head in the given order (vLLM's `prepend_n`).
    /// Allocates nothing when [`BlockPool::reserve_frees`] made room for the ids.
    pub(crate) fn free_owned(&mut self, ids: impl Iterator<Item = u32>) {
        let mut first = std::mem::take(&mut self.scratch);
        first.clear();
        for id in ids {
            let Some(b) = self.blocks.get_mut(id as usize) else {
                continue;
            };
            if id == NULL_BLOCK || b.ref_cnt == 0 {
                continue;
            }
            b.ref_cnt -= 1;
            if b.ref_cnt == 0 {
                if b.has_key() && self.enable_caching {
                    self.free.push_back(id);
                } else {
                    first.push(id);
                }
            }
        }
        for &id in first.iter().rev() {
            self.free.push_front(id);
        }
        self.scratch = first;
    }

    /// Register `block_ids[num_cached..num_full]` in the prefix cache under
    /// `block_hashes[num_cached..num_full]` (null blocks are skipped) and emit one
    /// `BlockStored` for the batch.
    #[allow(clippy::too_many_arguments)]
    pub fn cache_full_blocks(
        &mut self,
        block_ids: &[u32],
        block_hashes: &[BlockHash],
        num_cached: usize,
        num_full: usize,
        block_size: usize,
        group: u32,
        info: StoreInfo<'_>,
    ) -> Result<()> {
        if num_cached >= num_full {
            return Ok(());
        }
        if !self.enable_caching {
            return Err(Error::InvalidArgument(
                "cache_full_blocks on a pool with caching disabled".into(),
            ));
        }
        if num_full > block_ids.len() || num_full > block_hashes.len() {
            return Err(Error::InvalidArgument(format!(
                "num_full_blocks = {num_full} exceeds the {} block ids or the {} block hashes given",
                block_ids.len(),
                block_hashes.len()
            )));
        }
        if block_size == 0 || block_size > u32::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "bad block_size {block_size}"
            )));
        }
        if let Some(t) = info.token_ids {
            if t.len() < num_full * block_size {
                return Err(Error::InvalidArgument(format!(
                    "token_ids has {} tokens, fewer than num_full_blocks * block_size = {}",
                    t.len(),
                    num_full * block_size
                )));
            }
        }
        let hash_len = self.hash_len_after(
            block_hashes
                .get(num_cached.saturating_sub(1)..num_full)
                .unwrap_or(&[]),
        )?;
        let new = &block_ids[num_cached..num_full];
        self.check_blocks_to_cache(new)?;
        let new_keys = new.iter().filter(|&&id| id != NULL_BLOCK).count();
        let max_id = new.iter().copied().max().unwrap_or(NULL_BLOCK);
        let plan = self.plan_store(
            hash_len,
            new_keys,
            max_id,
            num_full - num_cached,
            info.token_ids
                .map(|t| &t[num_cached * block_size..num_full * block_size]),
            info.lora_name,
        )?;
        self.commit_store(
            plan,
            new,
            block_hashes,
            num_cached,
            block_size,
            group,
            &info,
        );
        Ok(())
    }

    /// Prefetches the table slots of these keys (no effect on results): a caller that
    /// will cache them after other work gives the loads time to land.
    pub(crate) fn prefetch_keys(&self, hashes: &[BlockHash], group: u32) {
        if let Some(pf) = self.cached.prefetcher() {
            for h in hashes {
                pf.key(key_hash(h.as_bytes(), group));
            }
        }
    }

    /// The hash length a run of hashes leaves the pool with (its first hash fixes it),
    /// or why they cannot be cached.
    pub(crate) fn hash_len_after(&self, hashes: &[BlockHash]) -> Result<Option<usize>> {
        hashes.iter().try_fold(self.hash_len, |len, h| {
            if h.is_empty() {
                return Err(Error::InvalidArgument("block hash is empty".into()));
            }
            match len {
                Some(n) if n != h.len() => Err(Error::InvalidArgument(format!(
                    "block hash has {} bytes but this pool holds {n}-byte hashes",
                    h.len()
                ))),
                _ => Ok(Some(h.len())),
            }
        })
    }

    /// Everything caching up to `blocks` blocks (`new_keys` of them with a key, on ids up
    /// to `max_id`) allocates: the table's room, the event list's, the event's lists
    /// (`tokens`, `lora_name`). An `OutOfMemory` error, and no change, when any of it
    /// cannot be had; [`BlockPool::commit_store`] then allocates nothing.
    pub(crate) fn plan_store(
        &mut self,
        hash_len: Option<usize>,
        new_keys: usize,
        max_id: u32,
        blocks: usize,
        tokens: Option<&[u32]>,
        lora_name: Option<&str>,
    ) -> Result<StorePlan> {
        let max_id = max_id.min(self.num_blocks as u32 - 1);
        self.cached
            .reserve_for(
                &self.blocks,
                new_keys,
                max_id,
                hash_len.unwrap_or(0),
                self.num_blocks,
            )
            .map_err(|e| Error::out_of_memory("the prefix-cache table", e))?;
        let mut plan = StorePlan {
            hash_len,
            ..StorePlan::default()
        };
        if self.events_enabled {
            let oom = |e| Error::out_of_memory("the event list", e);
            self.events.try_reserve(1).map_err(oom)?;
            plan.stored.try_reserve_exact(blocks).map_err(oom)?;
            plan.event_keys.try_reserve_exact(blocks).map_err(oom)?;
            if let Some(t) = tokens {
                plan.token_ids = try_copy(t, "the event's tokens")?;
            }
            if let Some(name) = lora_name {
                plan.lora_name = Some(try_copy_str(name, "the event's LoRA name")?);
            }
        }
        Ok(plan)
    }

    /// Caches `new` (blocks `num_cached..` of their request) under their hashes and emits
    /// one `BlockStored`, in what `plan` allocated (extra keys, when the blocks have any,
    /// are copied into the event here).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn commit_store(
        &mut self,
        plan: StorePlan,
        new: &[u32],
        block_hashes: &[BlockHash],
        num_cached: usize,
        block_size: usize,
        group: u32,
        info: &StoreInfo<'_>,
    ) {
        let StorePlan {
            mut stored,
            mut event_keys,
            token_ids,
            lora_name,
            hash_len,
        } = plan;
        self.hash_len = hash_len;
        const AHEAD: usize = 4;
        let pf = self.cached.prefetcher();
        for (i, &id) in new.iter().enumerate() {
            if let (Some(pf), Some(h)) = (&pf, block_hashes.get(num_cached + i + AHEAD)) {
                pf.key(key_hash(h.as_bytes(), group));
            }
            if id == NULL_BLOCK {
                continue;
            }
            if self.events_enabled {
                event_keys.push(info.extra_keys(num_cached + i).map(untag_extra_keys));
            }
            let hash = &block_hashes[num_cached + i];
            // Checked by the caller: the block has no key yet.
            self.num_cached += 1;
            self.cached.insert(&mut self.blocks, id, hash, group);
            if self.events_enabled {
                stored.push(*hash);
            }
        }
        if self.events_enabled {
            let parent_block_hash = num_cached.checked_sub(1).map(|p| block_hashes[p]);
            self.events.push(KvEvent::BlockStored {
                block_hashes: stored,
                parent_block_hash,
                token_ids,
                block_size: block_size as u32,
                lora_id: info.lora_id,
                lora_name,
                group_idx: group,
                extra_keys: (!event_keys.is_empty()).then_some(event_keys),
                medium: Medium::Gpu,
            });
        }
    }

    /// The checks of [`cache_full_blocks`](Self::cache_full_blocks) on each block to cache:
    /// in range, not twice, not cached yet, referenced (null blocks pass).
    fn check_blocks_to_cache(&mut self, new: &[u32]) -> Result<()> {
        for &id in new {
            self.check_id(id)?;
        }
        let mut bad = None;
        for &id in new {
            if id == NULL_BLOCK {
                continue;
            }
            let b = self.block(id);
            let msg = if self.free.is_marked(id) {
                Some(format!(
                    "block {id} appears twice among the blocks to cache"
                ))
            } else if b.has_key() {
                Some(format!("block {id} is already cached"))
            } else if b.ref_cnt == 0 {
                Some(format!(
                    "block {id} is free: only referenced blocks can be cached"
                ))
            } else {
                None
            };
            if let Some(m) = msg {
                bad = Some(block_state(m));
                break;
            }
            self.free.mark(id);
        }
        for &id in new {
            self.free.unmark(id);
        }
        match bad {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Drop the cache entries of these blocks (they stay allocated or free as they are).
    pub fn evict_blocks(&mut self, ids: &[u32]) -> Result<()> {
        for &id in ids {
            self.check_id(id)?;
        }
        self.reserve_removals(ids.len())?;
        for &id in ids {
            self.evict_hash(id);
        }
        Ok(())
    }

    /// Forget every cached hash; only possible when no block but the null block is in use.
    /// Returns whether it happened (emits `AllBlocksCleared` when it did); without memory
    /// for the event, an `OutOfMemory` error and nothing forgotten.
    pub fn reset_prefix_cache(&mut self) -> Result<bool> {
        if self.free.len() != self.num_blocks - 1 {
            return Ok(false);
        }
        self.reserve_events(1)?;
        self.cached.clear();
        self.num_cached = 0;
        for b in self.blocks.iter_mut() {
            b.chain_prev = UNUSED.chain_prev;
            b.chain_next = UNUSED.chain_next;
        }
        if self.events_enabled {
            self.events.push(KvEvent::AllBlocksCleared);
        }
        Ok(true)
    }

    /// The events emitted since the last call, as vLLM emits them: one `BlockRemoved`
    /// per removed hash (always empty when events are disabled).
    /// Without memory for them, an `OutOfMemory` error and the events stay.
    pub fn take_events(&mut self) -> Result<Vec<KvEvent>> {
        match split_removals(std::mem::take(&mut self.events)) {
            Ok(events) => Ok(events),
            Err((events, e)) => {
                self.events = events;
                Err(e)
            }
        }
    }

    /// The same events with every run of consecutive removals of one group in one
    /// `BlockRemoved` ([`crate::events::coalesce_removals`]'s shape, without building the single-hash
    /// events first).
    pub fn take_events_merged(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }

    /// Check the pool's invariants (for tests): every block but the null block is either
    /// free with no reference or referenced and not free; the table and the blocks' keys
    /// agree; the null block is never free.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        if self.free.contains(NULL_BLOCK) {
            return Err("the null block is in the free queue".into());
        }
        if self.blocks.len() != self.free.materialized() as usize {
            return Err("block storage and free-queue links disagree".into());
        }
        let mut n_free = self.num_blocks - self.blocks.len();
        let mut n_keyed = 0;
        for (id, b) in self.blocks.iter().enumerate().skip(1) {
            let id = id as u32;
            let free = self.free.contains(id);
            n_free += usize::from(free);
            if free != (b.ref_cnt == 0) || self.free.is_marked(id) {
                return Err(format!(
                    "block {id}: ref_cnt {} but free = {free}",
                    b.ref_cnt
                ));
            }
            if let Some(key) = self.key_of(id) {
                n_keyed += 1;
                if !self.cached_blocks(&key).contains(&id) {
                    return Err(format!(
                        "block {id} has a hash the table does not map to it"
                    ));
                }
            }
        }
        if n_free != self.free.len() {
            return Err("free queue length mismatch".into());
        }
        let mut n_listed = 0;
        for head in self.cached.heads() {
            let Some(key) = self.key_of(head) else {
                return Err(format!("table holds block {head}, which has no hash"));
            };
            let ids = self.cached_blocks(&key);
            if ids.first() != Some(&head) {
                return Err(format!("block {head} is not the oldest of its key"));
            }
            for id in ids {
                n_listed += 1;
                if self.key_of(id) != Some(key) {
                    return Err(format!(
                        "table maps a hash to block {id}, which has another"
                    ));
                }
            }
        }
        if n_keyed != self.num_cached {
            return Err(format!(
                "{n_keyed} blocks carry a hash but the pool counts {}",
                self.num_cached
            ));
        }
        if n_listed != n_keyed {
            return Err(format!(
                "{n_keyed} blocks have a hash, the table lists {n_listed}"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: u8) -> BlockHash {
        BlockHash::from_bytes(&[x; 32]).unwrap_or_else(|| unreachable!())
    }

    #[test]
    fn huge_block_count_is_an_error_not_a_panic() {
        let mut p = BlockPool::new(6, true, false).unwrap();
        for n in [6, 1 << 40, usize::MAX / 2, usize::MAX] {
            assert!(matches!(
                p.get_new_blocks(n),
                Err(Error::OutOfBlocks { .. })
            ));
        }
        assert_eq!(p.num_free_blocks(), 5);
    }

    #[test]
    fn cache_key_hash_reads_every_byte() {
        use std::hash::BuildHasher;
        let build = rustc_hash::FxBuildHasher;
        // a counter in the LAST bytes (first 24 bytes zero) must still spread
        let mut seen = std::collections::HashSet::new();
        for i in 0u32..1000 {
            let mut b = [0u8; 32];
            b[28..].copy_from_slice(&i.to_be_bytes());
            let key = CacheKey {
                hash: BlockHash::from_bytes(&b).unwrap_or_else(|| unreachable!()),
                group: 0,
            };
            seen.insert(build.hash_one(key) & 0xFFFF); // the bucket bits spread too
        }
        assert!(seen.len() > 900, "{} distinct buckets of 1000", seen.len());
    }

    #[test]
    fn new_pool_reserves_the_null_block() {
        let p = BlockPool::new(6, true, false).unwrap();
        assert_eq!(p.num_free_blocks(), 5);
        assert_eq!(p.free_block_ids().unwrap(), vec![1, 2, 3, 4, 5]);
        assert_eq!(p.usage(), 0.0);
        assert!(BlockPool::new(0, true, false).is_err());
        assert_eq!(BlockPool::new(1, true, false).unwrap().usage(), 0.0);
    }

    #[test]
    fn checked_free_order_example() {
        // Blocks [1 full, 2 full, 3 partial] freed in reverse: [3, 4, 5, ..., 2, 1].
        let mut p = BlockPool::new(8, true, true).unwrap();
        let ids = p.get_new_blocks(3).unwrap();
        assert_eq!(ids, vec![1, 2, 3]);
        p.cache_full_blocks(&ids, &[h(1), h(2)], 0, 2, 16, 0, StoreInfo::default())
            .unwrap();
        p.free_blocks(&[3, 2, 1]).unwrap();
        assert_eq!(p.free_block_ids().unwrap(), vec![3, 4, 5, 6, 7, 2, 1]);
        p.check_invariants().unwrap();
        let ev = p.take_events().unwrap();
        assert_eq!(ev.len(), 1);
        // Reusing 3..7 first, then 2 evicts hash 2.
        let got = p.get_new_blocks(6).unwrap();
        assert_eq!(got, vec![3, 4, 5, 6, 7, 2]);
        assert_eq!(
            p.take_events().unwrap(),
            vec![KvEvent::BlockRemoved {
                block_hashes: vec![h(2)],
                group_idx: 0,
                medium: Medium::Gpu,
            }]
        );
        assert_eq!(p.get_cached_block(&h(1), &[0]).unwrap(), Some(vec![1]));
        assert_eq!(p.get_cached_block(&h(2), &[0]).unwrap(), None);
    }

    #[test]
    fn errors_leave_state_unchanged() {
        let mut p = BlockPool::new(5, true, false).unwrap();
        let ids = p.get_new_blocks(2).unwrap();
        assert!(matches!(
            p.get_new_blocks(3),
            Err(Error::OutOfBlocks { .. })
        ));
        assert!(matches!(p.touch(&[1, 0]), Err(Error::BlockState(_))));
        assert_eq!(p.ref_cnt(1).unwrap(), 1);
        assert!(matches!(p.free_blocks(&[1, 1]), Err(Error::BlockState(_))));
        assert!(matches!(
            p.free_blocks(&[1, 9]),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(p.free_blocks(&[0]), Err(Error::BlockState(_))));
        assert_eq!(p.ref_cnt(1).unwrap(), 1);
        assert_eq!(p.free_block_ids().unwrap(), vec![3, 4]);
        p.cache_full_blocks(&ids, &[h(1)], 0, 1, 4, 0, StoreInfo::default())
            .unwrap();
        let short = BlockHash::from_bytes(&[1; 16]).unwrap();
        assert!(p.get_cached_block(&short, &[0]).is_err());
        assert!(p
            .cache_full_blocks(&ids, &[h(1), short], 1, 2, 4, 0, StoreInfo::default())
            .is_err());
        assert!(p
            .cache_full_blocks(&ids, &[h(1), h(2)], 0, 2, 4, 0, StoreInfo::default())
            .is_err());
        assert_eq!(p.block_key(2).unwrap(), None);
        assert!(!p.reset_prefix_cache().unwrap());
        p.free_blocks(&ids).unwrap();
        assert!(p.reset_prefix_cache().unwrap());
        assert_eq!(p.num_cached_keys(), 0);
        p.check_invariants().unwrap();
    }

    #[test]
    fn duplicates_and_groups() {
        let mut p = BlockPool::new(6, true, false).unwrap();
        let a = p.get_new_blocks(1).unwrap();
        let b = p.get_new_blocks(1).unwrap();
        p.cache_full_blocks(&a, &[h(7)], 0, 1, 4, 0, StoreInfo::default())
            .unwrap();
        p.cache_full_blocks(&b, &[h(7)], 0, 1, 4, 0, StoreInfo::default())
            .unwrap();
        assert_eq!(
            p.cached_blocks(&CacheKey {
                hash: h(7),
                group: 0
            }),
            &[1, 2]
        );
        assert_eq!(p.get_cached_block(&h(7), &[0]).unwrap(), Some(vec![1]));
        assert_eq!(p.get_cached_block(&h(7), &[0, 1]).unwrap(), None);
        p.evict_blocks(&[1]).unwrap();
        assert_eq!(p.get_cached_block(&h(7), &[0]).unwrap(), Some(vec![2]));
        // Touch twice, free in one call with a duplicate: reaches zero once.
        p.touch(&[2]).unwrap();
        p.free_blocks(&[1, 2, 2]).unwrap();
        assert_eq!(p.free_block_ids().unwrap(), vec![1, 3, 4, 5, 2]);
        p.check_invariants().unwrap();
    }

    fn hb(bytes: &[u8]) -> BlockHash {
        BlockHash::from_bytes(bytes).unwrap_or_else(|| unreachable!())
    }

    /// A hash of `len` bytes: `first` in bytes 0..8, `last` in the bytes past 8.
    fn split_hash(len: usize, first: u8, last: u8) -> BlockHash {
        let b: Vec<u8> = (0..len).map(|i| if i < 8 { first } else { last }).collect();
        hb(&b)
    }

    fn cache_one(p: &mut BlockPool, hash: BlockHash, group: u32) -> u32 {
        let ids = p.get_new_blocks(1).unwrap();
        p.cache_full_blocks(&ids, &[hash], 0, 1, 4, group, StoreInfo::default())
            .unwrap();
        ids[0]
    }

    #[test]
    fn a_block_is_24_bytes_and_8_byte_hashes_need_no_tail() {
        assert_eq!(std::mem::size_of::<Block>(), 24);
        let mut p = BlockPool::new(64, true, false).unwrap();
        for i in 0..40u8 {
            cache_one(&mut p, hb(&[i, 1, 2, 3, 4, 5, 6, 7]), 0);
        }
        assert_eq!(p.cached.tail_bytes(), 0);
        let mut q = BlockPool::new(64, true, false).unwrap();
        for i in 0..40u8 {
            cache_one(&mut q, split_hash(32, i, 9), 0);
        }
        assert!(q.cached.tail_bytes() >= 40 * 24);
        // Blocks cached one at a time: the side array grows by a quarter at a time, not
        // by a block (which would copy it once per call).
        let mut r = BlockPool::new(20_001, true, false).unwrap();
        let mut sizes = vec![0];
        for i in 0..20_000u32 {
            let mut b = [1u8; 32];
            b[28..].copy_from_slice(&i.to_le_bytes());
            cache_one(&mut r, hb(&b), 0);
            if sizes.last() != Some(&r.cached.tail_bytes()) {
                sizes.push(r.cached.tail_bytes());
            }
        }
        assert!(sizes.len() < 60, "{} reallocations", sizes.len());
        r.check_invariants().unwrap();
    }

    #[test]
    fn every_hash_length_round_trips_through_the_pool() {
        for len in [1usize, 4, 7, 8, 9, 16, 24, 31, 32] {
            let mut p = BlockPool::new(16, true, true).unwrap();
            let hashes: Vec<BlockHash> = (0..5u8)
                .map(|k| {
                    hb(&(0..len)
                        .map(|i| k.wrapping_mul(31) ^ i as u8)
                        .collect::<Vec<_>>())
                })
                .collect();
            let ids = p.get_new_blocks(5).unwrap();
            p.cache_full_blocks(&ids, &hashes, 0, 5, 4, 3, StoreInfo::default())
                .unwrap();
            p.check_invariants().unwrap();
            for (id, h) in ids.iter().zip(&hashes) {
                let key = p.block_key(*id).unwrap().unwrap();
                assert_eq!(key.hash.as_bytes(), h.as_bytes(), "len {len}");
                assert_eq!(key.group, 3);
                assert_eq!(p.get_cached_block(h, &[3]).unwrap(), Some(vec![*id]));
                assert_eq!(p.get_cached_block(h, &[0]).unwrap(), None);
            }
            let ev = p.take_events().unwrap();
            assert!(
                matches!(&ev[..], [KvEvent::BlockStored { block_hashes, .. }]
                if block_hashes == &hashes)
            );
            // Free and reuse all: every hash is evicted with its full bytes.
            p.free_blocks(&ids).unwrap();
            p.get_new_blocks(15).unwrap();
            let removed: Vec<BlockHash> = p
                .take_events()
                .unwrap()
                .into_iter()
                .filter_map(|e| match e {
                    KvEvent::BlockRemoved { block_hashes, .. } => Some(block_hashes),
                    _ => None,
                })
                .flatten()
                .collect();
            assert_eq!(removed, hashes, "len {len}");
            assert_eq!(p.num_cached_keys(), 0);
            p.check_invariants().unwrap();
        }
    }

    #[test]
    fn hashes_equal_in_the_first_8_bytes_are_different_keys() {
        for len in [9usize, 16, 32] {
            let mut p = BlockPool::new(16, true, true).unwrap();
            let (a, b) = (split_hash(len, 5, 1), split_hash(len, 5, 2));
            let ia = cache_one(&mut p, a, 0);
            let ib = cache_one(&mut p, b, 0);
            let ia2 = cache_one(&mut p, a, 0);
            assert_eq!(p.num_cached_keys(), 2, "len {len}");
            assert_eq!(
                p.cached_blocks(&CacheKey { hash: a, group: 0 }),
                vec![ia, ia2]
            );
            assert_eq!(p.cached_blocks(&CacheKey { hash: b, group: 0 }), vec![ib]);
            assert_eq!(p.block_key(ib).unwrap().map(|k| k.hash), Some(b));
            // A hash differing only in its last byte misses.
            let mut c = *a.padded_bytes();
            c[len - 1] ^= 0x80;
            assert_eq!(p.get_cached_block(&hb(&c[..len]), &[0]).unwrap(), None);
            p.check_invariants().unwrap();
            // Evicting the head of `a` leaves `b` alone, and the other way round.
            p.evict_blocks(&[ia]).unwrap();
            assert_eq!(p.get_cached_block(&a, &[0]).unwrap(), Some(vec![ia2]));
            assert_eq!(p.get_cached_block(&b, &[0]).unwrap(), Some(vec![ib]));
            p.evict_blocks(&[ib]).unwrap();
            assert_eq!(p.get_cached_block(&a, &[0]).unwrap(), Some(vec![ia2]));
            assert_eq!(p.get_cached_block(&b, &[0]).unwrap(), None);
            p.check_invariants().unwrap();
            let removed: Vec<KvEvent> = p.take_events().unwrap().into_iter().skip(3).collect();
            assert_eq!(
                removed,
                [a, b]
                    .map(|h| KvEvent::BlockRemoved {
                        block_hashes: vec![h],
                        group_idx: 0,
                        medium: Medium::Gpu,
                    })
                    .to_vec()
            );
        }
    }

    #[test]
    fn many_hashes_sharing_the_first_8_bytes_stay_apart() {
        // The table's key hash folds every byte, so two such keys meet in the table's
        // equality check only when their 7-bit tags collide: hundreds make that certain.
        for len in [9usize, 16, 32] {
            let n = 600u16;
            let mut p = BlockPool::new(usize::from(n) + 1, true, false).unwrap();
            let hashes: Vec<BlockHash> = (0..n)
                .map(|k| {
                    // The counter in the last bytes (len 9: 256 keys, chains of up to 3).
                    let mut b = [7u8; 32];
                    b[len - 1] = k as u8;
                    if len >= 10 {
                        b[len - 2] = (k >> 8) as u8;
                    }
                    hb(&b[..len])
                })
                .collect();
            let distinct: std::collections::HashSet<_> = hashes.iter().collect();
            let ids = p.get_new_blocks(usize::from(n)).unwrap();
            p.cache_full_blocks(&ids, &hashes, 0, ids.len(), 4, 0, StoreInfo::default())
                .unwrap();
            assert_eq!(p.num_cached_keys(), distinct.len(), "len {len}");
            let mut oldest = std::collections::HashMap::new();
            for (id, h) in ids.iter().zip(&hashes) {
                oldest.entry(*h).or_insert(*id);
                assert_eq!(p.block_key(*id).unwrap().map(|k| k.hash), Some(*h));
            }
            for (h, id) in &oldest {
                assert_eq!(p.get_cached_block(h, &[0]).unwrap(), Some(vec![*id]));
            }
            p.check_invariants().unwrap();
        }
    }

    #[test]
    fn keys_differing_only_in_group_stay_apart() {
        for len in [8usize, 16, 32] {
            let mut p = BlockPool::new(16, true, false).unwrap();
            let h = split_hash(len, 3, 4);
            let i0 = cache_one(&mut p, h, 0);
            let i1 = cache_one(&mut p, h, 1);
            assert_eq!(p.num_cached_keys(), 2);
            assert_eq!(p.get_cached_block(&h, &[0, 1]).unwrap(), Some(vec![i0, i1]));
            p.evict_blocks(&[i0]).unwrap();
            assert_eq!(p.get_cached_block(&h, &[1]).unwrap(), Some(vec![i1]));
            assert_eq!(p.get_cached_block(&h, &[0]).unwrap(), None);
            p.check_invariants().unwrap();
            // Enough groups that some meet in the table's equality check (tag collisions).
            let groups: Vec<u32> = (2..400).collect();
            let mut q = BlockPool::new(groups.len() + 1, true, false).unwrap();
            let ids: Vec<u32> = groups.iter().map(|&g| cache_one(&mut q, h, g)).collect();
            assert_eq!(q.num_cached_keys(), groups.len(), "len {len}");
            assert_eq!(q.get_cached_block(&h, &groups).unwrap(), Some(ids));
            q.check_invariants().unwrap();
        }
    }

    #[test]
    fn reset_forgets_long_hashes_and_caches_again() {
        let mut p = BlockPool::new(8, true, false).unwrap();
        let (a, b) = (split_hash(32, 1, 1), split_hash(32, 1, 2));
        let ia = cache_one(&mut p, a, 0);
        p.free_blocks(&[ia]).unwrap();
        assert!(p.reset_prefix_cache().unwrap());
        assert_eq!(p.block_key(ia).unwrap(), None);
        assert_eq!(p.get_cached_block(&a, &[0]).unwrap(), None);
        // Reuse the highest ids first so the side array regrows past them.
        let ids = p.get_new_blocks(7).unwrap();
        p.cache_full_blocks(&ids[6..], &[b], 0, 1, 4, 0, StoreInfo::default())
            .unwrap();
        assert_eq!(p.get_cached_block(&b, &[0]).unwrap(), Some(vec![ids[6]]));
        assert_eq!(p.get_cached_block(&a, &[0]).unwrap(), None);
        p.check_invariants().unwrap();
    }
}
