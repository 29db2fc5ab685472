//! vLLM 0.33's `LRUCachePolicy` (`vllm/v1/kv_offload/cpu/policies/lru.py`).
//!
//! Every stored chunk has a rank; the idle chunk (ref count 0) of smallest rank is
//! evicted first. A rank is `(r, -position)` for a key a request accessed at that end
//! token (all keys of one request share r, so a request's tails go before its heads),
//! or `(r, 0)` with r fresh from the global counter (insert without a position, touch,
//! request finish). As in vLLM, the idle chunks live in a lazily invalidated min-heap of
//! `(rank, key)`: an entry counts only while its key is idle at that rank; stale entries
//! are dropped when popped, and the heap is rebuilt when it holds more than twice the
//! idle chunks (at least 64 entries).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::{FxHashMap, FxHashSet};

use super::manager::{Chunk, RequestState};
use crate::hash::BlockHash;

pub type Rank = (u64, i64);

type Entry = Reverse<(Rank, BlockHash)>;

#[derive(Debug, Clone, Default)]
pub struct Lru {
    heap: BinaryHeap<Entry>,
    num_idle: usize,
    counter: u64,
}

fn current(chunks: &FxHashMap<BlockHash, Chunk>, rank: Rank, k: &BlockHash) -> bool {
    chunks
        .get(k)
        .is_some_and(|c| c.ref_cnt == 0 && c.rank == rank)
}

impl Lru {
    pub fn new() -> Self {
        Lru::default()
    }

    fn request_rank(&mut self, st: &mut RequestState) -> u64 {
        match st.lru_rank {
            Some(r) => r,
            None => {
                self.counter += 1;
                st.lru_rank = Some(self.counter);
                self.counter
            }
        }
    }

    fn push(&mut self, rank: Rank, k: BlockHash) {
        self.heap.push(Reverse((rank, k)));
    }

    fn maybe_compact(&mut self, chunks: &FxHashMap<BlockHash, Chunk>) {
        if self.heap.len() < (2 * self.num_idle).max(64) {
            return;
        }
        let mut seen = FxHashSet::default();
        let live: Vec<Entry> = std::mem::take(&mut self.heap)
            .into_vec()
            .into_iter()
            .filter(|Reverse((r, k))| current(chunks, *r, k) && seen.insert(*k))
            .collect();
        self.heap = BinaryHeap::from(live);
    }

    fn set_rank(&mut self, k: &BlockHash, c: &mut Chunk, rank: Rank) {
        c.rank = rank;
        if c.ref_cnt == 0 {
            self.push(rank, *k);
        }
    }

    /// A fresh counter rank for each present key, in the order given (`_update_recency`).
    fn fresh<'a>(
        &mut self,
        chunks: &mut FxHashMap<BlockHash, Chunk>,
        keys: impl Iterator<Item = &'a BlockHash>,
    ) {
        for k in keys {
            if let Some(c) = chunks.get_mut(k) {
                self.counter += 1;
                let r = (self.counter, 0);
                self.set_rank(k, c, r);
            }
        }
        self.maybe_compact(chunks);
    }

    /// The rank of a newly inserted (pending, not idle) chunk.
    pub fn insert_rank(&mut self, k: &BlockHash, st: &mut RequestState) -> Rank {
        match st.position(k) {
            Some(pos) => (self.request_rank(st), -(pos as i64)),
            None => {
                self.counter += 1;
                (self.counter, 0)
            }
        }
    }

    pub fn touch(&mut self, chunks: &mut FxHashMap<BlockHash, Chunk>, keys: &[BlockHash]) {
        self.fresh(chunks, keys.iter().rev());
    }

    /// `on_request_access`: keys first seen by a request take its rank at their position
    /// when that raises their rank.
    pub fn on_access(
        &mut self,
        chunks: &mut FxHashMap<BlockHash, Chunk>,
        keys: &[BlockHash],
        st: &mut RequestState,
    ) {
        let r = self.request_rank(st);
        for k in keys {
            let Some(pos) = st.position(k) else {
                continue;
            };
            let Some(c) = chunks.get_mut(k) else {
                continue;
            };
            let rank = (r, -(pos as i64));
            if c.rank < rank {
                self.set_rank(k, c, rank);
            }
        }
        self.maybe_compact(chunks);
    }

    pub fn on_finished(&mut self, chunks: &mut FxHashMap<BlockHash, Chunk>, ordered: &[BlockHash]) {
        self.fresh(chunks, ordered.iter().rev());
    }

    /// Evicts the `n` idle unprotected keys of smallest rank, smallest first (the caller
    /// removes their chunks); None (nothing changed) when there are fewer.
    pub fn evict(
        &mut self,
        chunks: &FxHashMap<BlockHash, Chunk>,
        n: usize,
        protected: &FxHashSet<BlockHash>,
    ) -> Option<Vec<BlockHash>> {
        let mut picked: Vec<Entry> = Vec::with_capacity(n);
        let mut picked_keys = FxHashSet::default();
        let mut deferred: Vec<Entry> = Vec::new();
        while picked.len() < n {
            let Some(e) = self.heap.pop() else {
                break;
            };
            let Reverse((rank, k)) = &e;
            if !current(chunks, *rank, k) || picked_keys.contains(k) {
                continue;
            }
            if protected.contains(k) {
                deferred.push(e);
                continue;
            }
            picked_keys.insert(*k);
            picked.push(e);
        }
        let ok = picked.len() == n;
        self.heap.extend(deferred);
        if !ok {
            self.heap.extend(picked);
            return None;
        }
        self.num_idle -= n;
        Some(picked.into_iter().map(|Reverse((_, k))| k).collect())
    }

    pub fn after_evict(&mut self, chunks: &FxHashMap<BlockHash, Chunk>) {
        self.maybe_compact(chunks);
    }

    pub fn mark_idle(&mut self, chunks: &FxHashMap<BlockHash, Chunk>, k: &BlockHash, c: Chunk) {
        self.num_idle += 1;
        self.push(c.rank, *k);
        self.maybe_compact(chunks);
    }

    pub fn mark_busy(&mut self) {
        self.num_idle -= 1;
    }

    pub fn clear(&mut self) {
        self.heap.clear();
        self.num_idle = 0;
        self.counter = 0;
    }

    pub fn check(&self, chunks: &FxHashMap<BlockHash, Chunk>) -> Result<(), String> {
        let idle: Vec<(&BlockHash, &Chunk)> =
            chunks.iter().filter(|(_, c)| c.ref_cnt == 0).collect();
        if idle.len() != self.num_idle {
            return Err(format!(
                "lru: {} idle chunks, {} counted",
                idle.len(),
                self.num_idle
            ));
        }
        let listed: FxHashSet<BlockHash> = self
            .heap
            .iter()
            .filter(|Reverse((r, k))| current(chunks, *r, k))
            .map(|Reverse((_, k))| *k)
            .collect();
        if listed.len() != idle.len() || idle.iter().any(|(k, _)| !listed.contains(*k)) {
            return Err("lru: an idle chunk has no current heap entry".into());
        }
        Ok(())
    }
}
