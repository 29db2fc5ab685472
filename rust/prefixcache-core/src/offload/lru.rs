//! vLLM 0.33's `LRUCachePolicy` (`vllm/v1/kv_offload/cpu/policies/lru.py`).
//!
//! Every stored chunk has a rank; the idle chunk (ref count 0) of smallest rank is
//! evicted first. A rank is `(r, -position)` for a key a request accessed at that end
//! token (all keys of one request share r, so a request's tails go before its heads),
//! or `(r, 0)` with r fresh from the global counter (insert without a position, touch,
//! request finish). vLLM keeps the idle chunks in a lazily invalidated heap of
//! `(rank, key)`; the ordered set here pops the same keys in the same order.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

use super::manager::{Chunk, RequestState};
use crate::hash::BlockHash;

pub type Rank = (u64, i64);

#[derive(Debug, Clone, Default)]
pub struct Lru {
    /// The idle chunks by (rank, key).
    idle: BTreeSet<(Rank, BlockHash)>,
    counter: u64,
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

    fn set_rank(&mut self, k: &BlockHash, c: &mut Chunk, rank: Rank) {
        if c.ref_cnt == 0 {
            self.idle.remove(&(c.rank, *k));
            self.idle.insert((rank, *k));
        }
        c.rank = rank;
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
    }

    /// The rank of a newly inserted (pending, not idle) chunk.
    pub fn insert_rank(&mut self, k: &BlockHash, st: &mut RequestState) -> Rank {
        match st.positions.get(k).copied() {
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
            let Some(pos) = st.positions.get(k).copied() else {
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
    }

    pub fn on_finished(&mut self, chunks: &mut FxHashMap<BlockHash, Chunk>, ordered: &[BlockHash]) {
        self.fresh(chunks, ordered.iter().rev());
    }

    /// The `n` idle unprotected keys of smallest rank, smallest first; None (nothing
    /// changed) when there are fewer.
    pub fn select(
        &self,
        n: usize,
        protected: &rustc_hash::FxHashSet<BlockHash>,
    ) -> Option<Vec<BlockHash>> {
        let out: Vec<BlockHash> = self
            .idle
            .iter()
            .filter(|(_, k)| !protected.contains(k))
            .take(n)
            .map(|(_, k)| *k)
            .collect();
        (out.len() == n).then_some(out)
    }

    pub fn mark_idle(&mut self, k: &BlockHash, c: &Chunk) {
        self.idle.insert((c.rank, *k));
    }

    pub fn mark_busy(&mut self, k: &BlockHash, c: &Chunk) {
        self.idle.remove(&(c.rank, *k));
    }

    pub fn clear(&mut self) {
        self.idle.clear();
        self.counter = 0;
    }

    pub fn check(&self, chunks: &FxHashMap<BlockHash, Chunk>) -> Result<(), String> {
        let idle = chunks.values().filter(|c| c.ref_cnt == 0).count();
        if idle != self.idle.len() {
            return Err(format!(
                "lru: {} idle chunks, {} listed",
                idle,
                self.idle.len()
            ));
        }
        for (rank, k) in &self.idle {
            match chunks.get(k) {
                Some(c) if c.ref_cnt == 0 && c.rank == *rank => {}
                _ => return Err(format!("lru: listed key {k:?} is not idle at its rank")),
            }
        }
        Ok(())
    }
}
