//! vLLM 0.33's `CPUOffloadingManager` (`vllm/v1/kv_offload/cpu/manager.py`): host chunk
//! slots with reference counts, the store-threshold tracker, request access state, the
//! LRU / ARC policies and the stored / removed events (SEMANTICS.md section 2.4).

use rustc_hash::{FxHashMap, FxHashSet};

use super::arc::Arc;
use super::lru::{Lru, Rank};
use super::order::Ordered;
use crate::error::{Error, Result};
use crate::events::{KvEvent, Medium};
use crate::hash::BlockHash;

pub use crate::events::MEDIUM_CPU;

/// vLLM's default bound of the store-threshold tracker.
pub const DEFAULT_MAX_TRACKER_SIZE: usize = 64_000;

/// One stored chunk: `ref_cnt` -1 while its store is in flight, 0 idle (evictable),
/// n > 0 while n loads read it.
#[derive(Debug, Clone, Copy)]
pub struct Chunk {
    pub chunk_id: u64,
    pub ref_cnt: i32,
    /// LRU only: the chunk's rank.
    pub rank: Rank,
    /// ARC only: in T2 (else T1).
    pub in_t2: bool,
}

const NO_POSITION: u64 = u64::MAX;
const SEEN: u8 = 1;
const INSERTED: u8 = 2;
const REUSED: u8 = 4;
const STORE_MISSED: u8 = 8;

/// One key of a request: its end token (vLLM's `ReqContext` offload key position) and
/// what the request did with it (the manager's `_RequestCacheAccess` sets).
#[derive(Debug, Clone, Copy)]
struct KeyInfo {
    position: u64,
    flags: u8,
}

/// What vLLM keeps per request in its `ReqContext` (key positions, the LRU request
/// rank) and in the manager's `_RequestCacheAccess`.
#[derive(Debug, Clone, Default)]
pub struct RequestState {
    keys: FxHashMap<BlockHash, KeyInfo>,
    /// Keys in first-access order (`key_groups`).
    seen: Vec<BlockHash>,
    /// The request's keys in block order (the connector's `offload_keys`), for the
    /// range calls.
    order: Vec<BlockHash>,
    pub lru_rank: Option<u64>,
}

impl RequestState {
    pub fn position(&self, k: &BlockHash) -> Option<u64> {
        self.keys
            .get(k)
            .map(|i| i.position)
            .filter(|&p| p != NO_POSITION)
    }

    fn has(&self, k: &BlockHash, flag: u8) -> bool {
        self.keys.get(k).is_some_and(|i| i.flags & flag != 0)
    }

    fn flag(&mut self, k: &BlockHash, flag: u8) -> bool {
        let e = self.keys.entry(*k).or_insert(KeyInfo {
            position: NO_POSITION,
            flags: 0,
        });
        let was = e.flags & flag != 0;
        e.flags |= flag;
        !was
    }

    /// A new cache generation (`reset_cache`): access state restarts, positions stay.
    fn restart(&mut self) {
        self.keys.retain(|_, i| {
            i.flags = 0;
            i.position != NO_POSITION
        });
        self.seen.clear();
        self.lru_rank = None;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CachePolicy {
    Lru,
    Arc,
}

impl CachePolicy {
    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "lru" => Ok(CachePolicy::Lru),
            "arc" => Ok(CachePolicy::Arc),
            other => Err(Error::InvalidArgument(format!(
                "cache_policy must be lru or arc, got {other:?}"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CachePolicy::Lru => "lru",
            CachePolicy::Arc => "arc",
        }
    }
}

/// vLLM's `LookupResult` (this manager never answers RETRY).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupResult {
    Miss,
    Hit,
    HitPending,
}

impl LookupResult {
    pub fn name(self) -> &'static str {
        match self {
            LookupResult::Miss => "MISS",
            LookupResult::Hit => "HIT",
            LookupResult::HitPending => "HIT_PENDING",
        }
    }
}

/// vLLM's `PrepareStoreOutput` (the store spec is the chunk ids).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrepareStoreOutput {
    pub keys_to_store: Vec<BlockHash>,
    pub chunk_ids: Vec<u64>,
    pub evicted_keys: Vec<BlockHash>,
}

/// vLLM's `OffloadingEvent` (medium always [`MEDIUM_CPU`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffloadEvent {
    pub keys: Vec<BlockHash>,
    pub removed: bool,
    /// A failed store released its chunks: not an eviction (vLLM's `metadata_only`).
    pub metadata_only: bool,
}

/// The KV events (`vllm/distributed/kv_events.py`) vLLM's OffloadingConnector publishes
/// for these offloading events without self-describing payloads
/// (`offloading/events.py`, `OffloadingEventsTracker`): one `BlockStored` per stored key
/// (hash only: no parent, tokens or LoRA, block size 0, group 0), one `BlockRemoved` per
/// removal event; a failed store's release (`metadata_only`) publishes nothing. Medium
/// "CPU".
pub fn to_kv_events(events: &[OffloadEvent]) -> Vec<KvEvent> {
    let mut out = Vec::new();
    for e in events {
        if e.metadata_only {
            continue;
        }
        if e.removed {
            out.push(KvEvent::BlockRemoved {
                block_hashes: e.keys.clone(),
                group_idx: 0,
                medium: Medium::Cpu,
            });
        } else {
            out.extend(e.keys.iter().map(|k| KvEvent::BlockStored {
                block_hashes: vec![*k],
                parent_block_hash: None,
                token_ids: Vec::new(),
                block_size: 0,
                lora_id: None,
                lora_name: None,
                group_idx: 0,
                extra_keys: None,
                medium: Medium::Cpu,
            }));
        }
    }
    out
}

#[derive(Debug, Clone)]
enum Policy {
    Lru(Lru),
    Arc(Box<Arc>),
}

#[derive(Debug, Clone)]
pub struct CpuOffloadManager {
    num_chunks: u64,
    kind: CachePolicy,
    chunks: FxHashMap<BlockHash, Chunk>,
    policy: Policy,
    /// Chunk ids handed out at least once (fresh ids go first, in order).
    allocated: u64,
    /// Released ids, reused last in first out.
    free_ids: Vec<u64>,
    num_idle: u64,
    num_pending: u64,
    store_threshold: u32,
    max_tracker_size: usize,
    /// Offers counted per key, oldest first (store_threshold >= 2 only).
    counts: Option<Ordered<u32>>,
    events: Option<Vec<OffloadEvent>>,
    requests: FxHashMap<u64, RequestState>,
    /// Totals since construction (not vLLM state): chunks stored, evicted.
    num_stored_total: u64,
    num_evicted_total: u64,
}

impl CpuOffloadManager {
    pub fn new(
        num_chunks: u64,
        policy: CachePolicy,
        store_threshold: u32,
        max_tracker_size: usize,
        enable_events: bool,
    ) -> Result<Self> {
        if store_threshold < 1 {
            return Err(Error::InvalidArgument(format!(
                "store_threshold must be >= 1, got {store_threshold}"
            )));
        }
        if max_tracker_size < 1 {
            return Err(Error::InvalidArgument(format!(
                "max_tracker_size must be >= 1, got {max_tracker_size}"
            )));
        }
        Ok(CpuOffloadManager {
            num_chunks,
            kind: policy,
            chunks: FxHashMap::default(),
            policy: match policy {
                CachePolicy::Lru => Policy::Lru(Lru::new()),
                CachePolicy::Arc => Policy::Arc(Box::new(Arc::new(num_chunks))),
            },
            allocated: 0,
            free_ids: Vec::new(),
            num_idle: 0,
            num_pending: 0,
            store_threshold,
            max_tracker_size,
            counts: (store_threshold >= 2).then(Ordered::new),
            events: enable_events.then(Vec::new),
            requests: FxHashMap::default(),
            num_stored_total: 0,
            num_evicted_total: 0,
        })
    }

    // -- counters ----------------------------------------------------------------------
    pub fn num_chunks(&self) -> u64 {
        self.num_chunks
    }
    pub fn cache_policy(&self) -> CachePolicy {
        self.kind
    }
    pub fn store_threshold(&self) -> u32 {
        self.store_threshold
    }
    pub fn max_tracker_size(&self) -> usize {
        self.max_tracker_size
    }
    /// Chunks held (stored or being stored).
    pub fn num_stored(&self) -> usize {
        self.chunks.len()
    }
    pub fn num_free_chunks(&self) -> u64 {
        self.free_ids.len() as u64 + self.num_chunks - self.allocated
    }
    pub fn num_idle(&self) -> u64 {
        self.num_idle
    }
    pub fn num_write_pending(&self) -> u64 {
        self.num_pending
    }
    pub fn num_tracked(&self) -> usize {
        self.counts.as_ref().map_or(0, Ordered::len)
    }
    pub fn num_requests(&self) -> usize {
        self.requests.len()
    }
    /// Chunks inserted by `prepare_store` since construction.
    pub fn num_stored_total(&self) -> u64 {
        self.num_stored_total
    }
    /// Chunks evicted by `prepare_store` since construction.
    pub fn num_evicted_total(&self) -> u64 {
        self.num_evicted_total
    }

    // -- request contexts -------------------------------------------------------------
    fn state(&mut self, rid: u64) -> &mut RequestState {
        self.requests.entry(rid).or_default()
    }

    pub fn on_new_request(&mut self, rid: u64) {
        self.state(rid);
    }

    /// vLLM's `ReqContext.set_offload_key_position` for each key: its end token.
    pub fn set_offload_key_positions(
        &mut self,
        rid: u64,
        keys: &[BlockHash],
        end_tokens: &[u64],
    ) -> Result<()> {
        if keys.len() != end_tokens.len() {
            return Err(Error::InvalidArgument(format!(
                "{} keys but {} end_tokens",
                keys.len(),
                end_tokens.len()
            )));
        }
        let st = self.state(rid);
        st.keys
            .try_reserve(keys.len())
            .map_err(|e| Error::out_of_memory("key positions", e))?;
        for (k, &p) in keys.iter().zip(end_tokens) {
            st.keys
                .entry(*k)
                .and_modify(|i| i.position = p)
                .or_insert(KeyInfo {
                    position: p,
                    flags: 0,
                });
        }
        Ok(())
    }

    /// The request's keys in block order, key `i` ending at token
    /// `(i + 1) * tokens_per_key` (what the connector's `update_offload_keys` records);
    /// the `*_range` calls name slices of them.
    pub fn set_request_keys(
        &mut self,
        rid: u64,
        keys: &[BlockHash],
        tokens_per_key: u64,
    ) -> Result<()> {
        let ends: Vec<u64> = (1..=keys.len() as u64)
            .map(|i| i.saturating_mul(tokens_per_key))
            .collect();
        self.set_offload_key_positions(rid, keys, &ends)?;
        let st = self.state(rid);
        st.order.clear();
        st.order
            .try_reserve_exact(keys.len())
            .map_err(|e| Error::out_of_memory("request keys", e))?;
        st.order.extend_from_slice(keys);
        Ok(())
    }

    /// Keys `start..stop` of the request's `set_request_keys` (clamped).
    pub fn request_keys(&self, rid: u64, start: usize, stop: usize) -> Vec<BlockHash> {
        match self.requests.get(&rid) {
            None => Vec::new(),
            Some(st) => {
                let stop = stop.min(st.order.len());
                st.order.get(start.min(stop)..stop).unwrap_or(&[]).to_vec()
            }
        }
    }

    /// `_record_request_cache_access`.
    fn record(&mut self, rid: u64, keys: &[BlockHash], reused: &[BlockHash]) {
        let st = self.requests.entry(rid).or_default();
        let mut new = Vec::new();
        for k in keys {
            if st.flag(k, SEEN) {
                st.seen.push(*k);
                new.push(*k);
            }
        }
        if !new.is_empty() {
            if let Policy::Lru(l) = &mut self.policy {
                l.on_access(&mut self.chunks, &new, st);
            }
        }
        for k in reused {
            if !st.has(k, INSERTED) {
                st.flag(k, REUSED);
            }
        }
    }

    /// `on_request_finished`: the policy sees the request's accesses in prefix order
    /// (by position when every key has one, else first-access order); the request's
    /// context is dropped.
    pub fn on_request_finished(&mut self, rid: u64) {
        let Some(mut st) = self.requests.remove(&rid) else {
            return;
        };
        let mut ordered = std::mem::take(&mut st.seen);
        let positions: Option<Vec<(u64, BlockHash)>> = ordered
            .iter()
            .map(|k| st.position(k).map(|p| (p, *k)))
            .collect();
        if let Some(mut by_position) = positions {
            // A stable sort by position, as Python's sort.
            by_position.sort_by_key(|(p, _)| *p);
            ordered = by_position.into_iter().map(|(_, k)| k).collect();
        }
        match &mut self.policy {
            Policy::Lru(l) => l.on_finished(&mut self.chunks, &ordered),
            Policy::Arc(a) => {
                let class = |k: &BlockHash| {
                    let f = st.keys.get(k).map_or(0, |i| i.flags);
                    (f & INSERTED != 0 && f & REUSED == 0, f & REUSED != 0)
                };
                a.on_finished(&mut self.chunks, &ordered, class);
            }
        }
    }

    // -- lookups and loads --------------------------------------------------------------
    pub fn lookup(&self, key: &BlockHash) -> LookupResult {
        match self.chunks.get(key) {
            None => LookupResult::Miss,
            Some(c) if c.ref_cnt >= 0 => LookupResult::Hit,
            Some(_) => LookupResult::HitPending,
        }
    }

    /// The connector's `_maximal_prefix_lookup`: how many leading keys are stored
    /// (ready or not); None when one of them is still being stored (the lookup defers).
    pub fn lookup_prefix(&self, keys: &[BlockHash]) -> Option<usize> {
        let mut pending = false;
        let mut n = 0;
        for k in keys {
            match self.chunks.get(k) {
                None => break,
                Some(c) => pending |= c.ref_cnt < 0,
            }
            n += 1;
        }
        (!pending).then_some(n)
    }

    pub fn prepare_load(&mut self, rid: u64, keys: &[BlockHash]) -> Result<Vec<u64>> {
        for k in keys {
            if self.chunks.get(k).is_none_or(|c| c.ref_cnt < 0) {
                return Err(Error::BlockState(format!(
                    "key {k:?} is not stored and ready to load"
                )));
            }
        }
        let mut ids = Vec::new();
        ids.try_reserve_exact(keys.len())
            .map_err(|e| Error::out_of_memory("chunk ids", e))?;
        for k in keys {
            let Some(c) = self.chunks.get_mut(k) else {
                continue;
            };
            if c.ref_cnt == 0 {
                if let Policy::Lru(l) = &mut self.policy {
                    l.mark_busy();
                }
                self.num_idle -= 1;
            }
            c.ref_cnt += 1;
            ids.push(c.chunk_id);
        }
        self.record(rid, keys, keys);
        Ok(ids)
    }

    pub fn touch(&mut self, _rid: u64, keys: &[BlockHash]) {
        match &mut self.policy {
            Policy::Lru(l) => l.touch(&mut self.chunks, keys),
            Policy::Arc(a) => a.touch(&mut self.chunks, keys),
        }
    }

    pub fn complete_load(&mut self, _rid: u64, keys: &[BlockHash]) -> Result<()> {
        let mut need: FxHashMap<BlockHash, i32> = FxHashMap::default();
        for k in keys {
            let n = need.entry(*k).or_insert(0);
            *n += 1;
            if self.chunks.get(k).is_none_or(|c| c.ref_cnt < *n) {
                return Err(Error::BlockState(format!(
                    "key {k:?} has no load in flight"
                )));
            }
        }
        for k in keys {
            let Some(c) = self.chunks.get_mut(k) else {
                continue;
            };
            c.ref_cnt -= 1;
            if c.ref_cnt == 0 {
                self.num_idle += 1;
                let c = *c;
                if let Policy::Lru(l) = &mut self.policy {
                    l.mark_idle(&self.chunks, k, c);
                }
            }
        }
        Ok(())
    }

    // -- stores -------------------------------------------------------------------------
    /// `_record_accesses`: count an offer of each key; a full tracker drops its oldest
    /// key not offered in this call, and skips new keys once none is left.
    fn count_offers(&mut self, keys: &[BlockHash]) {
        let Some(counts) = self.counts.as_mut() else {
            return;
        };
        let mut known = 0usize;
        for k in keys {
            if let Some(n) = counts.get_mut(k) {
                *n = n.saturating_add(1);
                counts.move_to_back(k);
                known += 1;
            }
        }
        let mut unprotected = counts.len() - known;
        for k in keys {
            if counts.contains(k) {
                continue;
            }
            if counts.len() >= self.max_tracker_size {
                if unprotected == 0 {
                    continue;
                }
                counts.pop_front();
                unprotected -= 1;
            }
            counts.push_back(*k, 1);
        }
    }

    /// vLLM's `prepare_store`: which of `keys` to write now, their chunk ids and the keys
    /// evicted for them; `Ok(None)` when not enough idle unoffered chunks can be evicted
    /// (nothing is stored then, but the offer was counted and recorded as in vLLM).
    pub fn prepare_store(
        &mut self,
        rid: u64,
        keys: &[BlockHash],
    ) -> Result<Option<PrepareStoreOutput>> {
        // The offered keys: checked distinct, and protected from eviction by this call.
        let mut protected: FxHashSet<BlockHash> = FxHashSet::default();
        protected
            .try_reserve(keys.len())
            .map_err(|e| Error::out_of_memory("the offered keys", e))?;
        if !keys.iter().all(|k| protected.insert(*k)) {
            return Err(Error::InvalidArgument(
                "prepare_store keys must be distinct".into(),
            ));
        }
        self.chunks
            .try_reserve(keys.len())
            .map_err(|e| Error::out_of_memory("the offload tier's chunk table", e))?;
        if let Policy::Arc(a) = &mut self.policy {
            a.try_reserve(keys.len())?;
        }
        self.count_offers(keys);
        // One pass: keys absent (store candidates passing the threshold) and keys ready;
        // a key still being stored is neither.
        let threshold = self.store_threshold;
        let mut to_store: Vec<BlockHash> = Vec::new();
        let mut ready: Vec<BlockHash> = Vec::new();
        let mut offered: Vec<BlockHash> = Vec::with_capacity(keys.len());
        for k in keys {
            match self.chunks.get(k) {
                None => {
                    let admitted = self
                        .counts
                        .as_ref()
                        .is_none_or(|c| c.get(k).copied().unwrap_or(0) >= threshold);
                    if admitted {
                        to_store.push(*k);
                        offered.push(*k);
                    }
                }
                Some(c) if c.ref_cnt >= 0 => {
                    ready.push(*k);
                    offered.push(*k);
                }
                Some(_) => {}
            }
        }
        let st = self.requests.entry(rid).or_default();
        let missed: Vec<BlockHash> = to_store
            .iter()
            .filter(|k| st.flag(k, STORE_MISSED))
            .copied()
            .collect();
        // LRU's hook is a touch of absent keys: nothing moves.
        if !missed.is_empty() {
            if let Policy::Arc(a) = &mut self.policy {
                a.on_store_miss(&missed);
            }
        }
        self.record(rid, &offered, &ready);
        if to_store.is_empty() {
            return Ok(Some(PrepareStoreOutput::default()));
        }
        let n = to_store.len() as u64;
        let free = self.num_free_chunks();
        let mut evicted = Vec::new();
        if n > free {
            let short = n - free;
            if short > self.num_idle {
                return Ok(None);
            }
            let short = usize::try_from(short).unwrap_or(usize::MAX);
            match &mut self.policy {
                Policy::Lru(l) => {
                    let Some(picked) = l.evict(&self.chunks, short, &protected) else {
                        return Ok(None);
                    };
                    for k in &picked {
                        if let Some(c) = self.chunks.remove(k) {
                            self.free_ids.push(c.chunk_id);
                        }
                    }
                    l.after_evict(&self.chunks);
                    evicted = picked;
                }
                Policy::Arc(a) => {
                    let Some(picked) = a.select(&self.chunks, short, &protected) else {
                        return Ok(None);
                    };
                    a.apply(&picked);
                    for (k, _) in &picked {
                        if let Some(c) = self.chunks.remove(k) {
                            self.free_ids.push(c.chunk_id);
                        }
                    }
                    evicted = picked.into_iter().map(|(k, _)| k).collect();
                }
            }
            self.num_idle -= evicted.len() as u64;
            self.num_evicted_total += evicted.len() as u64;
        }
        if !evicted.is_empty() {
            if let Some(ev) = &mut self.events {
                ev.push(OffloadEvent {
                    keys: evicted.clone(),
                    removed: true,
                    metadata_only: false,
                });
            }
        }
        let mut ids = Vec::with_capacity(to_store.len());
        while ids.len() < to_store.len() && self.allocated < self.num_chunks {
            ids.push(self.allocated);
            self.allocated += 1;
        }
        while ids.len() < to_store.len() {
            match self.free_ids.pop() {
                Some(id) => ids.push(id),
                None => break, // unreachable: the free count was checked
            }
        }
        let st = self.requests.entry(rid).or_default();
        for (k, id) in to_store.iter().zip(&ids) {
            let mut c = Chunk {
                chunk_id: *id,
                ref_cnt: -1,
                rank: (0, 0),
                in_t2: false,
            };
            match &mut self.policy {
                Policy::Lru(l) => c.rank = l.insert_rank(k, st),
                Policy::Arc(a) => a.insert(k, &mut c),
            }
            self.chunks.insert(*k, c);
        }
        self.num_pending += n;
        self.num_stored_total += n;
        for k in &to_store {
            st.flag(k, INSERTED);
        }
        Ok(Some(PrepareStoreOutput {
            keys_to_store: to_store,
            chunk_ids: ids,
            evicted_keys: evicted,
        }))
    }

    /// vLLM's `complete_store`: the keys still being stored become loadable (success) or
    /// are dropped and their chunks released (failure).
    pub fn complete_store(&mut self, _rid: u64, keys: &[BlockHash], success: bool) {
        let mut done = Vec::new();
        for k in keys {
            let Some(c) = self.chunks.get_mut(k) else {
                continue;
            };
            if c.ref_cnt >= 0 {
                continue;
            }
            self.num_pending -= 1;
            if success {
                c.ref_cnt = 0;
                self.num_idle += 1;
                let c = *c;
                if let Policy::Lru(l) = &mut self.policy {
                    l.mark_idle(&self.chunks, k, c);
                }
            } else {
                let c = *c;
                if let Policy::Arc(a) = &mut self.policy {
                    a.remove(k, &c);
                }
                self.chunks.remove(k);
                self.free_ids.push(c.chunk_id);
            }
            done.push(*k);
        }
        if !done.is_empty() {
            if let Some(ev) = &mut self.events {
                ev.push(OffloadEvent {
                    keys: done,
                    removed: !success,
                    metadata_only: !success,
                });
            }
        }
    }

    /// vLLM's `reset_cache`: every chunk dropped, ids restart at 0, request access state
    /// restarts (key positions stay, as they live in vLLM's ReqContext).
    pub fn reset_cache(&mut self) {
        self.chunks.clear();
        match &mut self.policy {
            Policy::Lru(l) => l.clear(),
            Policy::Arc(a) => a.clear(),
        }
        self.num_idle = 0;
        self.num_pending = 0;
        self.free_ids.clear();
        self.allocated = 0;
        for st in self.requests.values_mut() {
            st.restart();
        }
    }

    /// The events since the last call, in order. A failed store's release lists only
    /// the keys not stored again since (vLLM's take_events).
    pub fn take_events(&mut self) -> Vec<OffloadEvent> {
        let Some(evs) = self.events.as_mut() else {
            return Vec::new();
        };
        let evs = std::mem::take(evs);
        let mut out = Vec::with_capacity(evs.len());
        for mut e in evs {
            if e.metadata_only {
                e.keys.retain(|k| !self.chunks.contains_key(k));
                if e.keys.is_empty() {
                    continue;
                }
            }
            out.push(e);
        }
        out
    }

    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let n = self.chunks.len() as u64;
        if n + self.num_free_chunks() != self.num_chunks {
            return Err(format!(
                "{} stored + {} free != {} chunks",
                n,
                self.num_free_chunks(),
                self.num_chunks
            ));
        }
        let mut ids: Vec<u64> = self.chunks.values().map(|c| c.chunk_id).collect();
        ids.extend(&self.free_ids);
        ids.sort_unstable();
        if ids.iter().enumerate().any(|(i, &id)| id != i as u64)
            || ids.len() as u64 != self.allocated
        {
            return Err("chunk ids are not a permutation of the allocated ids".into());
        }
        let idle = self.chunks.values().filter(|c| c.ref_cnt == 0).count() as u64;
        let pending = self.chunks.values().filter(|c| c.ref_cnt < 0).count() as u64;
        if idle != self.num_idle || pending != self.num_pending {
            return Err(format!(
                "counted {idle} idle / {pending} pending, kept {} / {}",
                self.num_idle, self.num_pending
            ));
        }
        if self.chunks.values().any(|c| c.ref_cnt < -1) {
            return Err("a ref count below -1".into());
        }
        if let Some(c) = &self.counts {
            if c.len() > self.max_tracker_size || !c.consistent() {
                return Err("the store-threshold tracker is over its bound or inconsistent".into());
            }
        }
        match &self.policy {
            Policy::Lru(l) => l.check(&self.chunks),
            Policy::Arc(a) => a.check(&self.chunks),
        }
    }
}
