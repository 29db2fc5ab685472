//! vLLM 0.33's `ARCCachePolicy` (`vllm/v1/kv_offload/cpu/policies/arc.py`): T1 (stored,
//! not reused yet) and T2 (reused), each oldest first, the ghost lists B1 / B2 of keys
//! evicted from them (at most `capacity` each) and the adaptive target size of T1.

use rustc_hash::{FxHashMap, FxHashSet};

use super::manager::Chunk;
use super::order::Ordered;
use crate::hash::BlockHash;

#[derive(Debug, Clone)]
pub struct Arc {
    capacity: u64,
    /// vLLM's `target_t1_size` (a float: ghost hits move it by ratios of list sizes).
    pub target: f64,
    pub t1: Ordered<()>,
    pub t2: Ordered<()>,
    pub b1: Ordered<()>,
    pub b2: Ordered<()>,
}

impl Arc {
    pub fn new(capacity: u64) -> Self {
        Arc {
            capacity,
            target: 0.0,
            t1: Ordered::new(),
            t2: Ordered::new(),
            b1: Ordered::new(),
            b2: Ordered::new(),
        }
    }

    pub fn try_reserve(&mut self, n: usize) -> crate::Result<()> {
        self.t1.try_reserve(n)
    }

    /// A new chunk enters T1 and leaves the ghost lists.
    pub fn insert(&mut self, k: &BlockHash, c: &mut Chunk) {
        self.t1.push_back(*k, ());
        c.in_t2 = false;
        self.b1.remove(k);
        self.b2.remove(k);
    }

    pub fn remove(&mut self, k: &BlockHash, c: &Chunk) {
        if c.in_t2 {
            self.t2.remove(k);
        } else {
            self.t1.remove(k);
        }
    }

    fn ghost_hit(&mut self, k: &BlockHash) {
        let (b1, b2) = (self.b1.len() as f64, self.b2.len() as f64);
        if self.b1.contains(k) {
            let step = (b2 / b1).max(1.0);
            self.target = (self.target + step).min(self.capacity as f64);
            self.b1.move_to_back(k);
        } else if self.b2.contains(k) {
            let step = (b1 / b2).max(1.0);
            self.target = (self.target - step).max(0.0);
            self.b2.move_to_back(k);
        }
    }

    pub fn on_store_miss(&mut self, keys: &[BlockHash]) {
        for k in keys.iter().rev() {
            self.ghost_hit(k);
        }
    }

    pub fn touch(&mut self, chunks: &mut FxHashMap<BlockHash, Chunk>, keys: &[BlockHash]) {
        for k in keys.iter().rev() {
            match chunks.get_mut(k) {
                Some(c) if !c.in_t2 => {
                    if c.ref_cnt >= 0 {
                        self.t1.remove(k);
                        self.t2.push_back(*k, ());
                        c.in_t2 = true;
                    } else {
                        // A chunk still being stored is not a second use: newest of T1.
                        self.t1.move_to_back(k);
                    }
                }
                Some(_) => {
                    self.t2.move_to_back(k);
                }
                None => self.ghost_hit(k),
            }
        }
    }

    pub fn on_finished(
        &mut self,
        chunks: &mut FxHashMap<BlockHash, Chunk>,
        ordered: &[BlockHash],
        class: impl Fn(&BlockHash) -> (bool, bool),
    ) {
        for k in ordered.iter().rev() {
            let Some(c) = chunks.get_mut(k) else {
                continue;
            };
            let (inserted_only, reused) = class(k);
            if inserted_only {
                // Storing is not a reuse: the key keeps its list, as its newest entry.
                if c.in_t2 {
                    self.t2.move_to_back(k);
                } else {
                    self.t1.move_to_back(k);
                }
            } else if reused {
                if c.in_t2 {
                    self.t2.move_to_back(k);
                } else {
                    self.t1.remove(k);
                    self.t2.push_back(*k, ());
                    c.in_t2 = true;
                }
            }
        }
    }

    /// The `n` keys to evict in vLLM's order (each from T1 while T1 is at least its
    /// target, else from T2, else from T1), or None (nothing changed) when short.
    /// Returns (key, from T1) pairs; `apply` moves them to the ghost lists.
    pub fn select(
        &self,
        chunks: &FxHashMap<BlockHash, Chunk>,
        n: usize,
        protected: &FxHashSet<BlockHash>,
    ) -> Option<Vec<(BlockHash, bool)>> {
        let usable = |k: &&BlockHash| {
            !protected.contains(*k) && chunks.get(*k).is_some_and(|c| c.ref_cnt == 0)
        };
        let mut t1 = self.t1.keys().filter(usable);
        let mut t2 = self.t2.keys().filter(usable);
        let mut t1_size = self.t1.len() as i64;
        // Python's int(): truncation toward zero of a non-negative float.
        let target = self.target.trunc() as i64;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let mut pick = None;
            if t1_size >= target {
                if let Some(k) = t1.next() {
                    pick = Some((*k, true));
                    t1_size -= 1;
                }
            }
            if pick.is_none() {
                pick = t2.next().map(|k| (*k, false));
            }
            if pick.is_none() {
                let k = t1.next()?;
                pick = Some((*k, true));
                t1_size -= 1;
            }
            out.extend(pick);
        }
        Some(out)
    }

    pub fn apply(&mut self, picked: &[(BlockHash, bool)]) {
        for (k, from_t1) in picked {
            if *from_t1 {
                self.t1.remove(k);
                self.b1.push_back(*k, ());
            } else {
                self.t2.remove(k);
                self.b2.push_back(*k, ());
            }
        }
        let cap = usize::try_from(self.capacity).unwrap_or(usize::MAX);
        for ghost in [&mut self.b1, &mut self.b2] {
            while ghost.len() > cap {
                ghost.pop_front();
            }
        }
    }

    pub fn clear(&mut self) {
        self.t1.clear();
        self.t2.clear();
        self.b1.clear();
        self.b2.clear();
        self.target = 0.0;
    }

    pub fn check(&self, chunks: &FxHashMap<BlockHash, Chunk>) -> Result<(), String> {
        if self.t1.len() + self.t2.len() != chunks.len() {
            return Err("arc: T1 + T2 do not hold exactly the stored chunks".into());
        }
        for (k, c) in chunks {
            let listed = if c.in_t2 { &self.t2 } else { &self.t1 };
            if !listed.contains(k) {
                return Err(format!("arc: key {k:?} missing from its list"));
            }
        }
        let cap = usize::try_from(self.capacity).unwrap_or(usize::MAX);
        if self.b1.len() > cap || self.b2.len() > cap {
            return Err("arc: a ghost list exceeds the capacity".into());
        }
        if !(0.0..=self.capacity as f64).contains(&self.target) {
            return Err(format!("arc: target {} out of range", self.target));
        }
        for o in [&self.t1, &self.t2, &self.b1, &self.b2] {
            if !o.consistent() {
                return Err("arc: a list's order is inconsistent".into());
            }
        }
        Ok(())
    }
}
