//! vLLM 0.33's `CPUOffloadingManager` (`vllm/v1/kv_offload/cpu/manager.py`): host chunk
//! slots with reference counts, the store-threshold tracker, request access state, the
//! LRU / ARC policies and the stored / removed events (SEMANTICS.md section 2.4).

use rustc_hash::{FxHashMap, FxHashSet};

use super::arc::{Arc, Finished};
use super::chunks::{ChunkTable, Slot, LIVE, MAX_SLOTS, NIL, PROTECTED};
use super::entry_index::EntryIndex;
use super::index::pipelined;
use super::lru::Lru;
use super::order::{hash_of, Ordered};
use crate::error::{try_vec, Error, Result};
use crate::events::{KvEvent, Medium};
use crate::hash::BlockHash;

pub use crate::events::MEDIUM_CPU;

/// Loads in flight one chunk counts at most (its `ref_cnt` is an i32; vLLM's count is
/// a Python int): a load past it is refused, nothing changed.
pub const MAX_LOADS: i32 = i32::MAX;

/// vLLM's default bound of the store-threshold tracker.
pub const DEFAULT_MAX_TRACKER_SIZE: usize = 64_000;

const NO_POSITION: u64 = u64::MAX;
const SEEN: u8 = 1;
const INSERTED: u8 = 2;
const REUSED: u8 = 4;
const STORE_MISSED: u8 = 8;
/// Named twice in the call being served (a transient mark).
const IN_CALL: u8 = 16;

/// One key of a request: its end token (vLLM's `ReqContext` offload key position), what
/// the request did with it (the manager's `_RequestCacheAccess` sets) and the chunk
/// slot it was last seen in (a hint, checked before use).
#[derive(Debug, Clone, Copy)]
struct KeyInfo {
    key: BlockHash,
    flags: u8,
    hint: u32,
    position: u64,
    /// The key's table hash (`hash_of`), computed once.
    hash: u64,
}

/// What vLLM keeps per request in its `ReqContext` (key positions, the LRU request
/// rank) and in the manager's `_RequestCacheAccess`: one entry per distinct key, found
/// by their key hash (`EntryIndex`).
#[derive(Debug, Clone, Default)]
pub struct RequestState {
    infos: Vec<KeyInfo>,
    index: EntryIndex,
    /// Entries in first-access order (`key_groups`).
    seen: Vec<u32>,
    /// The request's keys in block order (the connector's `offload_keys`), as entries,
    /// for the range calls.
    order: Vec<u32>,
    /// `order` names each entry once (its keys all took new entries when it was set), so
    /// a range of it needs no check for repeated keys.
    distinct: bool,
    pub lru_rank: Option<u64>,
}

impl RequestState {
    fn find(&self, k: &BlockHash) -> Option<u32> {
        self.find_hashed(k, hash_of(k))
    }

    fn find_hashed(&self, k: &BlockHash, h: u64) -> Option<u32> {
        let infos = &self.infos;
        self.index.find(h, |i| {
            let info = &infos[i as usize];
            info.hash == h && info.key == *k
        })
    }

    /// Room for `n` more keys.
    fn try_reserve(&mut self, n: usize) -> Result<()> {
        if self.infos.len().saturating_add(n) >= NIL as usize {
            return Err(Error::out_of_memory(
                "request keys",
                "more than 2^32 - 1 keys",
            ));
        }
        self.infos
            .try_reserve(n)
            .map_err(|e| Error::out_of_memory("request keys", e))?;
        // Each entry is seen at most once: room for all of them, so that `record` never
        // allocates.
        let entries = self.infos.len().saturating_add(n);
        self.seen
            .try_reserve(entries.saturating_sub(self.seen.len()))
            .map_err(|e| Error::out_of_memory("request keys", e))?;
        let infos = &self.infos;
        self.index
            .try_reserve(n, |i| infos[i as usize].hash)
            .map_err(|e| Error::out_of_memory("request keys", e))
    }

    /// The entry of `k`, added (no position, no flags) when new.
    fn entry(&mut self, k: &BlockHash) -> u32 {
        let h = hash_of(k);
        if let Some(i) = self.find_hashed(k, h) {
            return i;
        }
        let i = self.infos.len() as u32;
        self.infos.push(KeyInfo {
            key: *k,
            flags: 0,
            hint: NIL,
            position: NO_POSITION,
            hash: h,
        });
        self.index.insert(h, i);
        i
    }

    fn position_at(&self, e: u32) -> Option<u64> {
        Some(self.infos[e as usize].position).filter(|&p| p != NO_POSITION)
    }

    pub fn position(&self, k: &BlockHash) -> Option<u64> {
        self.find(k).and_then(|e| self.position_at(e))
    }

    /// Sets `flag` on entry `e`; true when it was not set.
    fn flag(&mut self, e: u32, flag: u8) -> bool {
        let f = &mut self.infos[e as usize].flags;
        let was = *f & flag != 0;
        *f |= flag;
        !was
    }

    /// Keys `start..stop` of the block order (clamped), as entries.
    fn range(&self, start: usize, stop: usize) -> std::ops::Range<usize> {
        let stop = stop.min(self.order.len());
        start.min(stop)..stop
    }

    /// Empty, keeping its buffers (a finished request's state, reused by the next).
    fn recycle(&mut self) {
        self.infos.clear();
        self.index.clear();
        self.seen.clear();
        self.order.clear();
        self.distinct = false;
        self.lru_rank = None;
    }

    /// A new cache generation (`reset_cache`): access state restarts, positions stay.
    fn restart(&mut self) {
        for i in &mut self.infos {
            i.flags = 0;
            i.hint = NIL;
        }
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

/// A key of the call being served: the key, its request entry, its chunk slot.
#[derive(Debug, Clone, Copy)]
struct CallKey {
    key: BlockHash,
    /// The chunk table's hash of the key.
    hash: u64,
    ent: u32,
    slot: u32,
}

/// Finished requests' states kept for reuse (their buffers), at most this many.
const SPARE_REQUESTS: usize = 4;

/// Buffers the calls reuse instead of allocating: a replay makes a few calls per request
/// over hundreds of keys each, and a store built about ten vectors per call (allocation,
/// growth by copying, release) before these.
#[derive(Debug, Clone, Default)]
struct Scratch {
    /// The call's keys (`range_keys`, `call_keys`).
    keys: Vec<CallKey>,
    /// `store`: the keys to store, which keys of the call are offered, the first store
    /// misses (key, hash), the tracker's counts.
    to_store: Vec<CallKey>,
    offered: Vec<bool>,
    missed: Vec<(BlockHash, u64)>,
    offers: Vec<u32>,
    /// `store`'s result: the stored keys' chunk ids and the evicted keys.
    ids: Vec<u64>,
    evicted: Vec<BlockHash>,
    /// The chunks picked for eviction, their keys' hashes.
    picked: Vec<u32>,
    hashes: Vec<u64>,
    arc_picked: Vec<(u32, bool)>,
    /// `record`: (slot, position) of the keys whose LRU rank may rise.
    ranked: Vec<(u32, u64)>,
    /// `store` (LRU): the stored chunks and their keys' positions, in store order.
    linked: Vec<(u32, Option<u64>)>,
    /// `on_request_finished`: the request's stored keys as (entry, slot), and with
    /// ARC what the request did with each.
    found: Vec<(u32, u32)>,
    finished: Vec<Finished>,
    /// `on_request_finished`: (position, first access, entry), to sort the accesses by
    /// position as a stable sort would, without a merge buffer.
    sorted: Vec<(u64, u32, u32)>,
    /// With events: the key lists of the next removal and completion events, allocated
    /// before a call changes anything.
    ev_removed: Vec<BlockHash>,
    ev_done: Vec<BlockHash>,
}

/// Capacity for at least `n` items in the reused buffer `v` (cleared before use).
fn room<T>(v: &mut Vec<T>, n: usize) -> Result<()> {
    v.try_reserve(n.saturating_sub(v.len()))
        .map_err(|e| Error::out_of_memory("the offload tier's buffers", e))
}

/// `buf`'s items in a list of their size when one can be allocated (`buf`, emptied,
/// keeps its room for the next call), else `buf` itself (taken: the next call reserves
/// another). For lists handed out (events, results) from room reserved for a whole call;
/// cannot fail.
fn fitted<T: Copy>(buf: &mut Vec<T>) -> Vec<T> {
    let mut exact = Vec::new();
    if exact.try_reserve_exact(buf.len()).is_ok() {
        exact.extend_from_slice(buf);
        buf.clear();
        exact
    } else {
        std::mem::take(buf)
    }
}

#[derive(Debug, Clone)]
pub struct CpuOffloadManager {
    num_chunks: u64,
    kind: CachePolicy,
    /// The stored chunks: slot index = chunk id.
    table: ChunkTable,
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
    /// Finished requests' states, emptied, for the next requests.
    spare: Vec<RequestState>,
    scratch: Box<Scratch>,
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
            table: ChunkTable::default(),
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
            spare: Vec::new(),
            scratch: Box::default(),
            num_stored_total: 0,
            num_evicted_total: 0,
        })
    }

    /// Tests: LRU rank changes chunk by chunk (the reference for the runs).
    #[cfg(test)]
    pub(crate) fn lru_per_chunk(&mut self) {
        if let Policy::Lru(l) = &mut self.policy {
            l.per_chunk = true;
        }
    }

    /// Tests: sets the load count of stored key `k` (a chunk near [`MAX_LOADS`]).
    #[cfg(test)]
    pub(crate) fn set_loads(&mut self, k: &BlockHash, loads: i32) {
        let id = self
            .table
            .find(k)
            .unwrap_or_else(|| panic!("{k:?} is not stored"));
        let s = &mut self.table.slots[id as usize];
        if s.ref_cnt == 0 && loads > 0 {
            self.num_idle -= 1;
        }
        s.ref_cnt = loads;
    }

    /// Tests: the LRU's runs so far (finishes, accesses, stores, evictions); zeros under ARC.
    #[cfg(test)]
    pub(crate) fn lru_runs(&self) -> [usize; 4] {
        match &self.policy {
            Policy::Lru(l) => l.runs,
            Policy::Arc(_) => [0; 4],
        }
    }

    /// The whole state as text, for tests that compare two managers: the stored chunks
    /// (slots, links), the policy's order, the free ids, the counters, the tracker, the
    /// request contexts and the events. Reserved room is not part of it.
    pub fn state_dump(&self) -> String {
        let slots: Vec<_> = self.table.live().collect();
        let policy = match &self.policy {
            Policy::Lru(l) => l.dump(),
            Policy::Arc(a) => a.dump(),
        };
        let tracker: Option<Vec<_>> = self
            .counts
            .as_ref()
            .map(|c| c.keys_of(0).map(|k| (k, c.get(k))).collect());
        let mut requests: Vec<_> = self.requests.iter().collect();
        requests.sort_by_key(|&(rid, _)| *rid);
        let requests: Vec<_> = requests
            .into_iter()
            .map(|(rid, st)| {
                let infos: Vec<_> = st
                    .infos
                    .iter()
                    .map(|i| (i.key, i.flags, i.hint, i.position))
                    .collect();
                format!(
                    "{rid}: {infos:?} {:?} {:?} {:?}",
                    st.seen, st.order, st.lru_rank
                )
            })
            .collect();
        format!(
            "{slots:?} {policy} {:?} {} {} {} {} {} {tracker:?} {requests:?} {:?}",
            self.free_ids,
            self.allocated,
            self.num_idle,
            self.num_pending,
            self.num_stored_total,
            self.num_evicted_total,
            self.events
        )
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
        self.table.len()
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
    pub fn on_new_request(&mut self, rid: u64) -> Result<()> {
        if !self.requests.contains_key(&rid) {
            self.reserve_requests()?;
            let st = self.spare.pop().unwrap_or_default();
            self.requests.insert(rid, st);
        }
        Ok(())
    }

    /// Room for one more request context, and for keeping a dropped one's buffers.
    fn reserve_requests(&mut self) -> Result<()> {
        self.requests
            .try_reserve(1)
            .map_err(|e| Error::out_of_memory("the offload tier's requests", e))?;
        self.reserve_spare()
    }

    /// Room for keeping dropped requests' buffers (`recycle`).
    fn reserve_spare(&mut self) -> Result<()> {
        self.spare
            .try_reserve(SPARE_REQUESTS.saturating_sub(self.spare.len()))
            .map_err(|e| Error::out_of_memory("the offload tier's requests", e))
    }

    /// Room for a call that accesses `n` keys of request `rid`, reserved before the call
    /// changes anything: the request table (a context taken out and put back, or a new
    /// one), the request's first-access order, the call's keys, the ranks they may raise
    /// and the request's LRU group.
    fn reserve_access(&mut self, rid: u64, n: usize) -> Result<()> {
        self.reserve_requests()?;
        if let Some(st) = self.requests.get_mut(&rid) {
            st.try_reserve(0)?;
        }
        room(&mut self.scratch.keys, n)?;
        room(&mut self.scratch.ranked, n)?;
        if let Policy::Lru(l) = &mut self.policy {
            l.try_reserve_group()?;
        }
        Ok(())
    }

    /// Room for completing `n` stores: the chunk ids a failed one frees, a completion
    /// event and its key list. (A chunk that leaves the LRU order never drops its
    /// request's group: a group is dropped when its request finishes, empty, since the
    /// finish gives every chunk the request ranked a fresh rank.)
    fn reserve_completion(&mut self, n: usize) -> Result<()> {
        self.free_ids
            .try_reserve(n)
            .map_err(|e| Error::out_of_memory("chunk ids", e))?;
        if let Some(ev) = &mut self.events {
            ev.try_reserve(1)
                .map_err(|e| Error::out_of_memory("the offload tier's events", e))?;
            room(&mut self.scratch.ev_done, n)?;
        }
        Ok(())
    }

    /// Room for a store offering `n` keys (with `complete`, completed at once), besides
    /// `reserve_access` and `reserve_store`: its working lists, the chunk ids it frees
    /// and its events (a removal and a completion) with their key lists.
    fn reserve_store_call(&mut self, rid: u64, n: usize) -> Result<()> {
        self.reserve_access(rid, n)?;
        self.reserve_completion(n)?;
        let evicts = self.max_evictions(n);
        let sc = &mut *self.scratch;
        room(&mut sc.to_store, n)?;
        room(&mut sc.offered, n)?;
        room(&mut sc.missed, n)?;
        room(&mut sc.ids, n)?;
        if matches!(self.policy, Policy::Lru(_)) {
            room(&mut sc.linked, n)?;
        }
        room(&mut sc.evicted, evicts)?;
        room(&mut sc.picked, evicts)?;
        room(&mut sc.hashes, evicts)?;
        if self.counts.is_some() {
            room(&mut sc.offers, n)?;
        }
        if matches!(self.policy, Policy::Arc(_)) {
            room(&mut sc.arc_picked, evicts)?;
        }
        if let Some(ev) = &mut self.events {
            ev.try_reserve(2)
                .map_err(|e| Error::out_of_memory("the offload tier's events", e))?;
            room(&mut sc.ev_removed, evicts)?;
        }
        Ok(())
    }

    /// Room for finishing a request that saw `n` keys: its stored keys' slots, their new
    /// order and (LRU) its group dropped.
    fn reserve_finish(&mut self, n: usize) -> Result<()> {
        self.reserve_spare()?;
        let sc = &mut *self.scratch;
        room(&mut sc.found, n)?;
        room(&mut sc.sorted, n)?;
        match &mut self.policy {
            Policy::Lru(l) => {
                room(&mut sc.picked, n)?;
                l.try_reserve_group()
            }
            Policy::Arc(_) => room(&mut sc.finished, n),
        }
    }

    /// Keeps a dropped request's buffers for the next request.
    fn recycle(&mut self, mut st: RequestState) {
        if self.spare.len() < SPARE_REQUESTS {
            st.recycle();
            self.spare.push(st);
        }
    }

    /// Runs `f` on the request's state (created when new), taken out of the table
    /// meanwhile so that `f` can use the rest of the manager. A new state is kept only
    /// when `f` succeeds (`f` changes nothing when it fails). The table was reserved
    /// (`reserve_requests`).
    fn with_request<T>(
        &mut self,
        rid: u64,
        f: impl FnOnce(&mut Self, &mut RequestState) -> Result<T>,
    ) -> Result<T> {
        let (mut st, known) = match self.requests.remove(&rid) {
            Some(st) => (st, true),
            None => (self.spare.pop().unwrap_or_default(), false),
        };
        let out = f(self, &mut st);
        if known || out.is_ok() {
            self.requests.insert(rid, st);
        } else {
            self.recycle(st);
        }
        out
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
        self.reserve_requests()?;
        self.with_request(rid, |_, st| {
            st.try_reserve(keys.len())?;
            for (k, &p) in keys.iter().zip(end_tokens) {
                let e = st.entry(k);
                st.infos[e as usize].position = p;
            }
            Ok(())
        })
    }

    /// The request's keys in block order, key `i` ending at token
    /// `(i + 1) * tokens_per_key` (what the connector's `update_offload_keys` records);
    /// the `*_range` calls name slices of them. The last end token must be below 2**63
    /// (an int64, as `set_offload_key_positions` takes them).
    pub fn set_request_keys(
        &mut self,
        rid: u64,
        keys: &[BlockHash],
        tokens_per_key: u64,
    ) -> Result<()> {
        let last = (keys.len() as u64).checked_mul(tokens_per_key);
        if last.is_none_or(|t| t > i64::MAX as u64) {
            return Err(Error::InvalidArgument(format!(
                "{} keys of {tokens_per_key} tokens end past token 2**63 - 1: an end token \
                 must fit in int64",
                keys.len()
            )));
        }
        self.reserve_requests()?;
        self.with_request(rid, |_, st| {
            st.try_reserve(keys.len())?;
            if st.order.capacity() < keys.len() {
                // Allocated aside: the old order stays if this fails.
                st.order = try_vec(keys.len(), "request keys")?;
            }
            let mut order = std::mem::take(&mut st.order);
            order.clear();
            let known = st.infos.len();
            for (i, k) in (1..=keys.len() as u64).zip(keys) {
                let e = st.entry(k);
                st.infos[e as usize].position = i.saturating_mul(tokens_per_key);
                order.push(e);
            }
            st.distinct = st.infos.len() - known == keys.len();
            st.order = order;
            Ok(())
        })
    }

    /// Keys `start..stop` of the request's `set_request_keys` (clamped).
    pub fn request_keys(&self, rid: u64, start: usize, stop: usize) -> Vec<BlockHash> {
        match self.requests.get(&rid) {
            None => Vec::new(),
            Some(st) => st.order[st.range(start, stop)]
                .iter()
                .map(|&e| st.infos[e as usize].key)
                .collect(),
        }
    }

    /// The call's keys `start..stop` of the request's block order, with their slots, in
    /// the reused buffer (empty for an unknown request).
    fn range_keys(&mut self, rid: u64, start: usize, stop: usize) -> Vec<CallKey> {
        let mut out = std::mem::take(&mut self.scratch.keys);
        out.clear();
        if let Some(st) = self.requests.get(&rid) {
            out.extend(st.order[st.range(start, stop)].iter().map(|&e| {
                let i = &st.infos[e as usize];
                CallKey {
                    key: i.key,
                    hash: i.hash,
                    ent: e,
                    slot: i.hint,
                }
            }));
            self.resolve(&mut out);
        }
        out
    }

    /// The call's keys (entries added to the request as needed), with their slots, in
    /// the reused buffer (`reserve_access`; to be handed back).
    fn call_keys(&mut self, st: &mut RequestState, keys: &[BlockHash]) -> Result<Vec<CallKey>> {
        st.try_reserve(keys.len())?;
        let mut out = std::mem::take(&mut self.scratch.keys);
        out.clear();
        out.extend(keys.iter().map(|k| {
            let ent = st.entry(k);
            CallKey {
                key: *k,
                hash: st.infos[ent as usize].hash,
                ent,
                slot: st.infos[ent as usize].hint,
            }
        }));
        self.resolve(&mut out);
        Ok(out)
    }

    /// How many keys the request's range `start..stop` names.
    fn range_len(&self, rid: u64, start: usize, stop: usize) -> usize {
        self.requests
            .get(&rid)
            .map_or(0, |st| st.range(start, stop).len())
    }

    /// Finds the keys' slots: each key comes with its request's hint in `slot` (NIL:
    /// none), kept when it still holds, else replaced by a lookup. Pipelined so that the
    /// cache misses of later keys overlap: a key's index line (or hinted slot) is fetched
    /// some keys ahead, then the slot its lookup will land on.
    fn resolve(&self, keys: &mut [CallKey]) {
        let table = &self.table;
        pipelined(
            &mut (),
            keys,
            |_, c| match c.slot {
                NIL => table.prefetch_hash(c.hash),
                hint => table.prefetch_slot(hint),
            },
            |_, c| {
                if c.slot == NIL {
                    table.prefetch_candidate(c.hash);
                }
            },
            |_, c| {
                let hint = c.slot;
                c.slot = match table.slots.get(hint as usize) {
                    Some(s) if s.live() && s.key == c.key => hint,
                    _ => table.find_hashed(&c.key, c.hash).unwrap_or(NIL),
                };
            },
        );
    }

    /// `_record_request_cache_access`: `keys` accessed (with their slots, NIL when not
    /// stored) and reused; with `offered`, only the keys it marks, the stored ones of
    /// them reused.
    fn record(&mut self, st: &mut RequestState, keys: &[CallKey], offered: Option<&[bool]>) {
        let mut any = false;
        let mut ranked = std::mem::take(&mut self.scratch.ranked);
        ranked.clear();
        for (i, c) in keys.iter().enumerate() {
            let info = &mut st.infos[c.ent as usize];
            // Of the offered keys, the stored ones are those ready to reuse.
            let (accessed, reused) = match offered {
                Some(o) => (o[i], o[i] && c.slot != NIL),
                None => (true, true),
            };
            if reused && info.flags & INSERTED == 0 {
                info.flags |= REUSED;
            }
            if !accessed {
                continue;
            }
            if c.slot != NIL {
                info.hint = c.slot;
            }
            if info.flags & SEEN == 0 {
                info.flags |= SEEN;
                st.seen.push(c.ent);
                any = true;
                if c.slot != NIL && info.position != NO_POSITION {
                    ranked.push((c.slot, info.position));
                }
            }
        }
        if any {
            if let Policy::Lru(l) = &mut self.policy {
                l.on_access(&mut self.table.slots, &ranked, &mut st.lru_rank);
            }
        }
        self.scratch.ranked = ranked;
    }

    /// `on_request_finished`: the policy sees the request's accesses in prefix order
    /// (by position when every key has one, else first-access order); the request's
    /// context is dropped.
    pub fn on_request_finished(&mut self, rid: u64) -> Result<()> {
        let Some(n) = self.requests.get(&rid).map(|st| st.seen.len()) else {
            return Ok(());
        };
        self.reserve_finish(n)?;
        if let Some(mut st) = self.requests.remove(&rid) {
            self.finish_request(&mut st);
            self.recycle(st);
        }
        Ok(())
    }

    /// The body of `on_request_finished`.
    fn finish_request(&mut self, st: &mut RequestState) {
        let mut ordered = std::mem::take(&mut st.seen);
        let position = |e: u32| st.infos[e as usize].position;
        // Sorted when every key has a position and they are not in order already.
        let mut in_order = true;
        let mut last = 0;
        let all_placed = ordered.iter().all(|&e| {
            let p = position(e);
            in_order &= last <= p;
            last = p;
            p != NO_POSITION
        });
        if all_placed && !in_order {
            // A stable sort by position, as Python's sort: by (position, first access),
            // in place.
            let mut sorted = std::mem::take(&mut self.scratch.sorted);
            sorted.clear();
            sorted.extend((0..).zip(&ordered).map(|(i, &e)| (position(e), i, e)));
            sorted.sort_unstable();
            ordered.clear();
            ordered.extend(sorted.iter().map(|&(_, _, e)| e));
            self.scratch.sorted = sorted;
        }
        // The stored keys' (entry, slot), their slots fetched a few keys ahead.
        let table = &self.table;
        let mut found = std::mem::take(&mut self.scratch.found);
        found.clear();
        pipelined(
            &mut (),
            &mut ordered,
            |_, &e| table.prefetch_slot(st.infos[e as usize].hint),
            |_, _| {},
            |_, &mut e| {
                let i = &st.infos[e as usize];
                if let Some(slot) = table.find_hinted(&i.key, i.hint) {
                    found.push((e, slot));
                }
            },
        );
        match &mut self.policy {
            Policy::Lru(l) => {
                // The keys take fresh ranks last position first.
                let mut ids = std::mem::take(&mut self.scratch.picked);
                ids.clear();
                ids.extend(found.iter().rev().map(|&(_, slot)| slot));
                l.fresh_in_order(&mut self.table.slots, &ids, st.lru_rank);
                l.close(&mut self.table.slots, st.lru_rank);
                self.scratch.picked = ids;
            }
            Policy::Arc(a) => {
                let mut fin = std::mem::take(&mut self.scratch.finished);
                fin.clear();
                fin.extend(found.iter().map(|&(e, slot)| {
                    let f = st.infos[e as usize].flags;
                    Finished {
                        slot,
                        inserted_only: f & INSERTED != 0 && f & REUSED == 0,
                        reused: f & REUSED != 0,
                    }
                }));
                a.on_finished(&mut self.table.slots, &fin);
                self.scratch.finished = fin;
            }
        }
        self.scratch.found = found;
        st.seen = ordered;
    }

    // -- lookups and loads --------------------------------------------------------------
    pub fn lookup(&self, key: &BlockHash) -> LookupResult {
        match self.table.find(key) {
            None => LookupResult::Miss,
            Some(id) if self.table.slots[id as usize].ref_cnt >= 0 => LookupResult::Hit,
            Some(_) => LookupResult::HitPending,
        }
    }

    fn prefix_of<'a>(&self, keys: impl Iterator<Item = &'a BlockHash> + Clone) -> Option<usize> {
        // The walk stops at the first miss, so the keys are fetched a window ahead as it
        // goes: the hashes of the next AHEAD keys in a ring, their index lines fetched
        // on entering it, their likely slots NEAR keys ahead.
        const AHEAD: usize = 16;
        const NEAR: usize = 6;
        let mut ring = [0u64; AHEAD];
        let mut ahead = keys.clone();
        for (h, k) in ring.iter_mut().zip(ahead.by_ref()) {
            *h = hash_of(k);
            self.table.prefetch_hash(*h);
        }
        let mut pending = false;
        let mut n = 0;
        for (i, k) in keys.enumerate() {
            let h = ring[i % AHEAD];
            self.table.prefetch_candidate(ring[(i + NEAR) % AHEAD]);
            if let Some(next) = ahead.next() {
                ring[i % AHEAD] = hash_of(next);
                self.table.prefetch_hash(ring[i % AHEAD]);
            }
            match self.table.find_hashed(k, h) {
                None => break,
                Some(id) => pending |= self.table.slots[id as usize].ref_cnt < 0,
            }
            n += 1;
        }
        (!pending).then_some(n)
    }

    /// The connector's `_maximal_prefix_lookup`: how many leading keys are stored
    /// (ready or not); None when one of them is still being stored (the lookup defers).
    pub fn lookup_prefix(&self, keys: &[BlockHash]) -> Option<usize> {
        self.prefix_of(keys.iter())
    }

    /// `lookup_prefix` over the request's keys `start..stop` (clamped).
    pub fn lookup_prefix_range(&self, rid: u64, start: usize, stop: usize) -> Option<usize> {
        match self.requests.get(&rid) {
            None => Some(0),
            Some(st) => self.prefix_of(
                st.order[st.range(start, stop)]
                    .iter()
                    .map(|&e| &st.infos[e as usize].key),
            ),
        }
    }

    /// Pins the (checked) stored, ready chunks of `keys` for loading.
    fn load(&mut self, st: &mut RequestState, keys: &[CallKey]) {
        for c in keys {
            let s = &mut self.table.slots[c.slot as usize];
            if s.ref_cnt == 0 {
                self.num_idle -= 1;
            }
            s.ref_cnt += 1;
        }
        self.record(st, keys, None);
    }

    /// Every key of a load (with its slot, NIL: not stored) is stored and ready, and its
    /// chunk can count the call's loads of it (at most [`MAX_LOADS`] in flight).
    fn check_loadable(
        &self,
        keys: impl ExactSizeIterator<Item = (BlockHash, u32)> + Clone,
    ) -> Result<()> {
        // A chunk whose count plus the call's size passes the bound may overflow: its
        // loads in the call are counted exactly below (never in practice).
        let n = keys.len() as u64;
        let mut near = false;
        for (k, slot) in keys.clone() {
            match self.table.slots.get(slot as usize) {
                Some(s) if s.live() && s.ref_cnt >= 0 => {
                    near |= s.ref_cnt as u64 + n > MAX_LOADS as u64;
                }
                _ => {
                    return Err(Error::BlockState(format!(
                        "key {k:?} is not stored and ready to load"
                    )))
                }
            }
        }
        if near {
            self.check_load_counts(keys, n)?;
        }
        Ok(())
    }

    /// `check_loadable`'s exact check (`n` keys): each chunk near the bound gets no more
    /// loads than it can count (the first such key in call order is named).
    fn check_load_counts(
        &self,
        keys: impl Iterator<Item = (BlockHash, u32)> + Clone,
        n: u64,
    ) -> Result<()> {
        let loads = |slot: u32| self.table.slots[slot as usize].ref_cnt as u64;
        let near = |slot: u32| loads(slot) + n > MAX_LOADS as u64;
        let mut calls: FxHashMap<u32, u64> = FxHashMap::default();
        calls
            .try_reserve(keys.clone().filter(|&(_, slot)| near(slot)).count())
            .map_err(|e| Error::out_of_memory("the loads' counts", e))?;
        for (_, slot) in keys.clone().filter(|&(_, slot)| near(slot)) {
            *calls.entry(slot).or_default() += 1;
        }
        for (k, slot) in keys {
            if calls
                .get(&slot)
                .is_some_and(|&c| loads(slot) + c > MAX_LOADS as u64)
            {
                return Err(Error::BlockState(format!(
                    "key {k:?} has {} loads in flight: a chunk counts at most 2**31 - 1",
                    loads(slot)
                )));
            }
        }
        Ok(())
    }

    pub fn prepare_load(&mut self, rid: u64, keys: &[BlockHash]) -> Result<Vec<u64>> {
        self.check_loadable(keys.iter().map(|k| (*k, self.table.find(k).unwrap_or(NIL))))?;
        let mut ids: Vec<u64> = try_vec(keys.len(), "chunk ids")?;
        self.reserve_access(rid, keys.len())?;
        self.with_request(rid, |m, st| {
            let ks = m.call_keys(st, keys)?;
            ids.extend(ks.iter().map(|c| u64::from(c.slot)));
            m.load(st, &ks);
            m.scratch.keys = ks;
            Ok(ids)
        })
    }

    /// `prepare_load` of the request's keys `start..stop`; returns how many were pinned.
    pub fn prepare_load_range(&mut self, rid: u64, start: usize, stop: usize) -> Result<usize> {
        self.reserve_access(rid, self.range_len(rid, start, stop))?;
        let ks = self.range_keys(rid, start, stop);
        let mut out = self.check_loadable(ks.iter().map(|c| (c.key, c.slot)));
        if out.is_ok() {
            out = self.with_request(rid, |m, st| {
                m.load(st, &ks);
                Ok(())
            });
        }
        let n = ks.len();
        self.scratch.keys = ks;
        out.map(|()| n)
    }

    /// Allocates nothing: chunks move to fresh ranks (no request group is dropped, see
    /// `reserve_completion`), or between ARC's lists.
    pub fn touch(&mut self, _rid: u64, keys: &[BlockHash]) {
        match &mut self.policy {
            Policy::Lru(l) => {
                for k in keys.iter().rev() {
                    if let Some(id) = self.table.find(k) {
                        l.fresh(&mut self.table.slots, id);
                    }
                }
            }
            Policy::Arc(a) => a.touch(&mut self.table, keys),
        }
    }

    /// Releases one load of each key (a key listed n times, n loads); nothing changes
    /// when one of them has no load in flight. The loads are released in turn, each
    /// checked as it goes (so a repeated key needs as many loads), and put back on an
    /// error.
    fn unload(&mut self, keys: impl Iterator<Item = (BlockHash, u32)> + Clone) -> Result<()> {
        let mut idle = 0;
        let mut done = 0;
        let mut bad = None;
        for (k, slot) in keys.clone() {
            match self.table.slots.get_mut(slot as usize) {
                Some(s) if s.live() && s.ref_cnt > 0 => {
                    s.ref_cnt -= 1;
                    idle += u64::from(s.ref_cnt == 0);
                    done += 1;
                }
                _ => {
                    bad = Some(k);
                    break;
                }
            }
        }
        if let Some(k) = bad {
            for (_, slot) in keys.take(done) {
                self.table.slots[slot as usize].ref_cnt += 1;
            }
            return Err(Error::BlockState(format!(
                "key {k:?} has no load in flight"
            )));
        }
        self.num_idle += idle;
        Ok(())
    }

    pub fn complete_load(&mut self, _rid: u64, keys: &[BlockHash]) -> Result<()> {
        let mut ks: Vec<(BlockHash, u32)> = try_vec(keys.len(), "the loaded keys")?;
        ks.extend(keys.iter().map(|k| (*k, self.table.find(k).unwrap_or(NIL))));
        self.unload(ks.iter().copied())
    }

    /// `complete_load` of the request's keys `start..stop`.
    pub fn complete_load_range(&mut self, rid: u64, start: usize, stop: usize) -> Result<()> {
        let n = self.range_len(rid, start, stop);
        room(&mut self.scratch.keys, n)?;
        let ks = self.range_keys(rid, start, stop);
        let out = self.unload(ks.iter().map(|c| (c.key, c.slot)));
        self.scratch.keys = ks;
        out
    }

    // -- stores -------------------------------------------------------------------------
    /// `_record_accesses`: count an offer of each key (keys distinct); a full tracker
    /// drops its oldest key not offered in this call, and skips new keys once none is
    /// left. Returns each key's count after the call (0: not tracked), or nothing
    /// without a tracker (in the reused buffer).
    fn count_offers(&mut self, keys: &[CallKey]) -> Vec<u32> {
        let mut out = std::mem::take(&mut self.scratch.offers);
        out.clear();
        let Some(counts) = self.counts.as_mut() else {
            return out;
        };
        out.resize(keys.len(), 0);
        let mut known = 0usize;
        for c in keys {
            counts.prefetch(c.hash);
        }
        for (c, n) in keys.iter().zip(out.iter_mut()) {
            if let Some(v) = counts.bump_hashed(&c.key, c.hash) {
                *n = v;
                known += 1;
            }
        }
        // The known keys are now the newest: the oldest `unprotected` keys were not
        // offered, and no key new to this call is tracked yet (the keys are distinct).
        let mut unprotected = counts.len() - known;
        for (c, n) in keys.iter().zip(out.iter_mut()) {
            if *n != 0 {
                continue;
            }
            if counts.len() >= self.max_tracker_size {
                if unprotected == 0 {
                    continue;
                }
                counts.pop_front();
                unprotected -= 1;
            }
            counts.push_new_hashed(0, c.key, c.hash, 1);
            *n = 1;
        }
        out
    }

    /// How many chunks a store of `n` keys may evict: as many as it stores beyond the
    /// free ones.
    fn max_evictions(&self, n: usize) -> usize {
        n.saturating_sub(usize::try_from(self.num_free_chunks()).unwrap_or(usize::MAX))
    }

    /// Room for a store of `n` keys: chunk table, ghost lists, tracker, chunk ids.
    fn reserve_store(&mut self, n: usize) -> Result<()> {
        let evicts = self.max_evictions(n);
        let fresh = (n as u64).min(self.num_chunks - self.allocated);
        if self.allocated.saturating_add(fresh) > MAX_SLOTS {
            return Err(Error::out_of_memory(
                "the offload tier's chunk table",
                "more than 2^31 chunks",
            ));
        }
        let max_slots = usize::try_from(self.num_chunks.min(MAX_SLOTS)).unwrap_or(usize::MAX);
        self.table
            .try_reserve(n, usize::try_from(fresh).unwrap_or(usize::MAX), max_slots)?;
        if let Policy::Arc(a) = &mut self.policy {
            a.try_reserve(evicts)?;
        }
        if let Some(c) = &mut self.counts {
            c.try_reserve(n, self.max_tracker_size)?;
        }
        Ok(())
    }

    /// vLLM's `prepare_store`: which of `keys` to write now, their chunk ids and the keys
    /// evicted for them; `Ok(None)` when not enough idle unoffered chunks can be evicted
    /// (nothing is stored then, but the offer was counted and recorded as in vLLM).
    pub fn prepare_store(
        &mut self,
        rid: u64,
        keys: &[BlockHash],
    ) -> Result<Option<PrepareStoreOutput>> {
        let mut distinct: FxHashSet<BlockHash> = FxHashSet::default();
        distinct
            .try_reserve(keys.len())
            .map_err(|e| Error::out_of_memory("the offered keys", e))?;
        if let Some(k) = keys.iter().find(|k| !distinct.insert(**k)) {
            return Err(Error::InvalidArgument(format!(
                "prepare_store keys must be distinct: key {k:?} is offered twice"
            )));
        }
        drop(distinct);
        let n = keys.len();
        self.reserve_store_call(rid, n)?;
        self.reserve_store(n)?;
        // The output's lists: at most one entry per key each, handed out at their size.
        let mut keys_to_store = try_vec(n, "the stored keys")?;
        let mut chunk_ids = try_vec(n, "chunk ids")?;
        let mut evicted_keys = try_vec(self.max_evictions(n), "the evicted keys")?;
        self.with_request(rid, |m, st| {
            let ks = m.call_keys(st, keys)?;
            let to_store = m.store(st, &ks);
            m.scratch.keys = ks;
            let sc = &mut m.scratch;
            let out = to_store.map(|to_store| {
                keys_to_store.extend(to_store.iter().map(|c| c.key));
                chunk_ids.extend_from_slice(&sc.ids);
                evicted_keys.extend_from_slice(&sc.evicted);
                sc.to_store = to_store;
                PrepareStoreOutput {
                    keys_to_store: fitted(&mut keys_to_store),
                    chunk_ids: fitted(&mut chunk_ids),
                    evicted_keys: fitted(&mut evicted_keys),
                }
            });
            Ok(out)
        })
    }

    /// `prepare_store` of the request's keys `start..stop` (clamped); with `complete`,
    /// the stored keys' `complete_store(success)` follows at once. Returns how many keys
    /// were stored and how many evicted, or None when eviction cannot free enough.
    pub fn prepare_store_range(
        &mut self,
        rid: u64,
        start: usize,
        stop: usize,
        complete: bool,
    ) -> Result<Option<(usize, usize)>> {
        self.reserve_store_call(rid, self.range_len(rid, start, stop))?;
        let ks = self.range_keys(rid, start, stop);
        let out = self.store_range(rid, &ks, complete);
        self.scratch.keys = ks;
        out
    }

    /// The body of `prepare_store_range` (`ks`: the range's keys).
    fn store_range(
        &mut self,
        rid: u64,
        ks: &[CallKey],
        complete: bool,
    ) -> Result<Option<(usize, usize)>> {
        if let Some(st) = self.requests.get_mut(&rid).filter(|st| !st.distinct) {
            // Distinct entries are distinct keys.
            let mut dup = None;
            for c in ks {
                if !st.flag(c.ent, IN_CALL) && dup.is_none() {
                    dup = Some(c.key);
                }
            }
            for c in ks {
                st.infos[c.ent as usize].flags &= !IN_CALL;
            }
            if let Some(k) = dup {
                return Err(Error::InvalidArgument(format!(
                    "prepare_store keys must be distinct: key {k:?} is named twice by the \
                     request's keys in the range"
                )));
            }
        }
        self.reserve_store(ks.len())?;
        self.with_request(rid, |m, st| {
            let Some(to_store) = m.store(st, ks) else {
                return Ok(None);
            };
            let out = (to_store.len(), m.scratch.evicted.len());
            if complete && !to_store.is_empty() {
                m.complete_stored(&to_store);
            }
            m.scratch.to_store = to_store;
            Ok(Some(out))
        })
    }

    /// Sets or clears PROTECTED on the stored keys of the call.
    fn protect(&mut self, keys: &[CallKey], on: bool) {
        for c in keys {
            if let Some(s) = self.table.slots.get_mut(c.slot as usize) {
                if on {
                    s.flags |= PROTECTED;
                } else {
                    s.flags &= !PROTECTED;
                }
            }
        }
    }

    /// Frees the slots of evicted chunks (unlinked by the policy; `hashes`: their keys'
    /// hashes), their keys appended to `keys`.
    fn free_slots(&mut self, ids: &[u32], hashes: &mut [u64], keys: &mut Vec<BlockHash>) {
        let mut next_id = ids.iter();
        pipelined(
            &mut self.table,
            hashes,
            |table, &h| table.prefetch_hash(h),
            |_, _| {},
            |table, &mut h| {
                let Some(&id) = next_id.next() else { return };
                keys.push(table.slots[id as usize].key);
                table.remove_hashed(id, h);
                self.free_ids.push(u64::from(id));
            },
        );
    }

    /// The body of `prepare_store` (keys distinct, room reserved): the keys stored (the
    /// reused buffer, to be handed back), their chunk ids in `scratch.ids` and the keys
    /// evicted for them in `scratch.evicted`; None when eviction cannot free enough.
    fn store(&mut self, st: &mut RequestState, keys: &[CallKey]) -> Option<Vec<CallKey>> {
        let offers = self.count_offers(keys);
        // One pass: keys absent (store candidates passing the threshold) and keys ready;
        // a key still being stored is neither.
        let threshold = self.store_threshold;
        let sc = &mut *self.scratch;
        let mut to_store = std::mem::take(&mut sc.to_store);
        let mut offered = std::mem::take(&mut sc.offered);
        let mut missed = std::mem::take(&mut sc.missed);
        to_store.clear();
        offered.clear();
        missed.clear();
        sc.ids.clear();
        sc.evicted.clear();
        for (i, c) in keys.iter().enumerate() {
            let offer = if c.slot == NIL {
                let admitted = offers.get(i).is_none_or(|&n| n >= threshold);
                if admitted {
                    to_store.push(*c);
                }
                admitted
            } else {
                self.table.slots[c.slot as usize].ref_cnt >= 0 // ready
            };
            offered.push(offer);
        }
        self.scratch.offers = offers;
        // LRU's hook is a touch of absent keys: nothing moves, no first miss is needed.
        if let Policy::Arc(a) = &mut self.policy {
            // Last first, the order the policy visits them in.
            missed.extend(
                to_store
                    .iter()
                    .rev()
                    .filter(|c| st.flag(c.ent, STORE_MISSED))
                    .map(|c| (c.key, c.hash)),
            );
            if !missed.is_empty() {
                a.on_store_miss(&mut missed);
            }
        }
        self.scratch.missed = missed;
        self.record(st, keys, Some(&offered));
        self.scratch.offered = offered;
        if to_store.is_empty() {
            return Some(to_store);
        }
        let n = to_store.len() as u64;
        let free = self.num_free_chunks();
        if n > free {
            let short = n - free;
            if short > self.num_idle {
                self.scratch.to_store = to_store;
                return None;
            }
            let short = usize::try_from(short).unwrap_or(usize::MAX);
            // The new keys' index lines, fetched while the eviction runs.
            for c in &to_store {
                self.table.prefetch_hash(c.hash);
            }
            self.protect(keys, true);
            let mut picked = std::mem::take(&mut self.scratch.picked);
            let mut hashes = std::mem::take(&mut self.scratch.hashes);
            hashes.clear();
            let ok = match &mut self.policy {
                Policy::Lru(l) => {
                    let ok = l.evict(&self.table.slots, short, &mut picked);
                    if ok {
                        for &id in &picked {
                            hashes.push(hash_of(&self.table.slots[id as usize].key));
                        }
                        l.remove_evicted(&mut self.table.slots, &picked);
                    }
                    ok
                }
                Policy::Arc(a) => {
                    let p = &mut self.scratch.arc_picked;
                    let ok = a.select(&self.table.slots, short, p);
                    if ok {
                        for &(id, _) in p.iter() {
                            hashes.push(hash_of(&self.table.slots[id as usize].key));
                        }
                        a.apply(&mut self.table.slots, p);
                        picked.clear();
                        picked.extend(p.iter().map(|&(id, _)| id));
                    }
                    ok
                }
            };
            self.protect(keys, false);
            if !ok {
                self.scratch.picked = picked;
                self.scratch.hashes = hashes;
                self.scratch.to_store = to_store;
                return None;
            }
            let mut evicted = std::mem::take(&mut self.scratch.evicted);
            self.free_slots(&picked, &mut hashes, &mut evicted);
            self.scratch.picked = picked;
            self.scratch.hashes = hashes;
            self.num_idle -= evicted.len() as u64;
            self.num_evicted_total += evicted.len() as u64;
            if !evicted.is_empty() {
                if let Some(ev) = &mut self.events {
                    // Room reserved by `reserve_store_call`.
                    let buf = &mut self.scratch.ev_removed;
                    buf.clear();
                    buf.extend_from_slice(&evicted);
                    ev.push(OffloadEvent {
                        keys: fitted(buf),
                        removed: true,
                        metadata_only: false,
                    });
                }
            }
            self.scratch.evicted = evicted;
        }
        let mut ids = std::mem::take(&mut self.scratch.ids);
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
        let mut next_id = ids.iter();
        // LRU: the stored chunks with their positions, linked after the loop, as a run.
        let mut linked = std::mem::take(&mut self.scratch.linked);
        linked.clear();
        pipelined(
            &mut (&mut self.table, &mut self.policy),
            &mut to_store,
            |(table, policy), c| {
                table.prefetch_hash(c.hash);
                if let Policy::Arc(a) = policy {
                    a.prefetch(c.hash); // its ghost entry, removed on insert
                }
            },
            |_, _| {},
            |(table, policy), c| {
                // As many ids as keys (the free count was checked); below MAX_SLOTS.
                let Some(&id) = next_id.next() else { return };
                let id = id as u32;
                table.insert(id, c.key, c.hash);
                match policy {
                    Policy::Lru(_) => linked.push((id, st.position_at(c.ent))),
                    Policy::Arc(a) => a.insert(&mut table.slots, id, c.hash),
                }
                let info = &mut st.infos[c.ent as usize];
                info.hint = id;
                info.flags |= INSERTED;
            },
        );
        if let Policy::Lru(l) = &mut self.policy {
            l.insert_all(&mut self.table.slots, &linked, &mut st.lru_rank);
        }
        self.scratch.linked = linked;
        self.scratch.ids = ids;
        self.num_pending += n;
        self.num_stored_total += n;
        Some(to_store)
    }

    /// vLLM's `complete_store`: the keys still being stored become loadable (success) or
    /// are dropped and their chunks released (failure).
    pub fn complete_store(&mut self, _rid: u64, keys: &[BlockHash], success: bool) -> Result<()> {
        let mut found: Vec<(BlockHash, u32)> = try_vec(keys.len(), "the stored keys")?;
        self.reserve_completion(keys.len())?;
        found.extend(keys.iter().map(|k| (*k, self.table.find(k).unwrap_or(NIL))));
        self.complete_slots(&found, success);
        Ok(())
    }

    /// `complete_store(success)` of the keys `store` just stored (their chunk ids in
    /// `scratch.ids`, the slots): every one is still being stored, so each becomes
    /// loadable as `complete_slots` would make it, without looking it up.
    fn complete_stored(&mut self, stored: &[CallKey]) {
        let events = self.events.is_some();
        let mut done = std::mem::take(&mut self.scratch.ev_done);
        done.clear();
        for (c, &id) in stored.iter().zip(&self.scratch.ids) {
            self.table.slots[id as usize].ref_cnt = 0;
            if events {
                done.push(c.key);
            }
        }
        let n = stored.len() as u64;
        self.num_pending -= n;
        self.num_idle += n;
        if let Some(ev) = self.events.as_mut() {
            ev.push(OffloadEvent {
                keys: fitted(&mut done),
                removed: false,
                metadata_only: false,
            });
        }
        self.scratch.ev_done = done;
    }

    /// `complete_store` of keys whose slots are known (NIL: not stored).
    fn complete_slots(&mut self, keys: &[(BlockHash, u32)], success: bool) {
        // The keys completed, for the event (only with events on; its list was allocated
        // by `reserve_completion`).
        let mut done = std::mem::take(&mut self.scratch.ev_done);
        done.clear();
        let events = self.events.is_some();
        for &(k, id) in keys {
            let Some(s) = self.table.slots.get_mut(id as usize) else {
                continue;
            };
            if !s.live() || s.key != k || s.ref_cnt >= 0 {
                continue;
            }
            self.num_pending -= 1;
            if success {
                s.ref_cnt = 0;
                self.num_idle += 1;
            } else {
                match &mut self.policy {
                    Policy::Lru(l) => l.remove(&mut self.table.slots, id),
                    Policy::Arc(a) => a.remove(&mut self.table.slots, id),
                }
                self.table.remove(id);
                self.free_ids.push(u64::from(id));
            }
            if events {
                done.push(k);
            }
        }
        if let Some(ev) = self.events.as_mut().filter(|_| !done.is_empty()) {
            ev.push(OffloadEvent {
                keys: fitted(&mut done),
                removed: !success,
                metadata_only: !success,
            });
        }
        self.scratch.ev_done = done;
    }

    /// vLLM's `reset_cache`: every chunk dropped, ids restart at 0, request access state
    /// restarts (key positions stay, as they live in vLLM's ReqContext).
    pub fn reset_cache(&mut self) {
        self.table.clear();
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
    pub fn take_events(&mut self) -> Result<Vec<OffloadEvent>> {
        let Some(evs) = self.events.as_mut() else {
            return Ok(Vec::new());
        };
        let mut out = try_vec(evs.len(), "the offload tier's events")?;
        let evs = std::mem::take(evs);
        for mut e in evs {
            if e.metadata_only {
                e.keys.retain(|k| !self.table.contains(k));
                if e.keys.is_empty() {
                    continue;
                }
            }
            out.push(e);
        }
        Ok(out)
    }

    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let n = self.table.len() as u64;
        if n + self.num_free_chunks() != self.num_chunks {
            return Err(format!(
                "{} stored + {} free != {} chunks",
                n,
                self.num_free_chunks(),
                self.num_chunks
            ));
        }
        if !self.table.consistent() {
            return Err("the chunk table's index and slots disagree".into());
        }
        let live: Vec<(u32, &Slot)> = self.table.live().collect();
        let mut ids: Vec<u64> = live.iter().map(|(i, _)| u64::from(*i)).collect();
        ids.extend(&self.free_ids);
        ids.sort_unstable();
        if ids.iter().enumerate().any(|(i, &id)| id != i as u64)
            || ids.len() as u64 != self.allocated
        {
            return Err("chunk ids are not a permutation of the allocated ids".into());
        }
        let idle = live.iter().filter(|(_, s)| s.ref_cnt == 0).count() as u64;
        let pending = live.iter().filter(|(_, s)| s.ref_cnt < 0).count() as u64;
        if idle != self.num_idle || pending != self.num_pending {
            return Err(format!(
                "counted {idle} idle / {pending} pending, kept {} / {}",
                self.num_idle, self.num_pending
            ));
        }
        if live
            .iter()
            .any(|(_, s)| s.ref_cnt < -1 || s.flags & PROTECTED != 0 || s.flags & LIVE == 0)
        {
            return Err("a ref count below -1 or a stale protection mark".into());
        }
        if let Some(c) = &self.counts {
            if c.len() > self.max_tracker_size || !c.consistent() {
                return Err("the store-threshold tracker is over its bound or inconsistent".into());
            }
        }
        match &self.policy {
            Policy::Lru(l) => l.check(&self.table.slots, self.table.len()),
            Policy::Arc(a) => a.check(&self.table),
        }
    }
}
