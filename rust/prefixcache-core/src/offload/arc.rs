//! vLLM 0.33's `ARCCachePolicy` (`vllm/v1/kv_offload/cpu/policies/arc.py`): T1 (stored,
//! not reused yet) and T2 (reused), each oldest first, the ghost lists B1 / B2 of keys
//! evicted from them (at most `capacity` each) and the adaptive target size of T1.
//! T1 and T2 are intrusive lists over the chunk slots; B1 and B2 are [`Ordered`] maps.

use super::chunks::{ChunkTable, List, Slot, IN_T2, PROTECTED};
use super::index::pipelined;
use super::order::{hash_of, Ordered};
use crate::hash::BlockHash;

#[derive(Debug, Clone)]
pub struct Arc {
    capacity: u64,
    /// vLLM's `target_t1_size` (a float: ghost hits move it by ratios of list sizes).
    pub target: f64,
    t1: List,
    t2: List,
    /// B1 (order 0) and B2 (order 1): disjoint, as a key enters a ghost list only when
    /// evicted and leaves both when stored again.
    ghosts: Ordered<()>,
    /// `apply`'s buffer of victims: (slot, from T1, key hash), reused across calls.
    victims: Vec<(u32, bool, u64)>,
}

const B1: usize = 0;
const B2: usize = 1;

/// What a finished request did with a key (the manager's `_RequestCacheAccess`).
#[derive(Debug, Clone, Copy)]
pub struct Finished {
    pub slot: u32,
    /// Stored by the request and not reused by it.
    pub inserted_only: bool,
    pub reused: bool,
}

impl Arc {
    pub fn new(capacity: u64) -> Self {
        Arc {
            capacity,
            target: 0.0,
            t1: List::default(),
            t2: List::default(),
            ghosts: Ordered::new(),
            victims: Vec::new(),
        }
    }

    /// Room for `n` victims, and for their keys in the ghost lists (each holds at most
    /// `capacity` keys after a trim, one more while a key joins it).
    pub fn try_reserve(&mut self, n: usize) -> crate::Result<()> {
        self.victims
            .try_reserve(n.saturating_sub(self.victims.len()))
            .map_err(|e| crate::Error::out_of_memory("the ARC's victims", e))?;
        let most = usize::try_from(self.capacity)
            .unwrap_or(usize::MAX)
            .saturating_add(1)
            .saturating_mul(2);
        self.ghosts.try_reserve(n, most)
    }

    /// A new chunk (unlinked; key hash `h`) enters T1 and leaves the ghost lists.
    pub fn insert(&mut self, slots: &mut [Slot], id: u32, h: u64) {
        slots[id as usize].flags &= !IN_T2;
        self.t1.push_back(slots, id);
        let k = slots[id as usize].key;
        self.ghosts.remove_hashed(&k, h);
    }

    /// Hints the CPU to fetch the ghost index line of hash `h`.
    pub fn prefetch(&self, h: u64) {
        self.ghosts.prefetch(h);
    }

    pub fn remove(&mut self, slots: &mut [Slot], id: u32) {
        if slots[id as usize].has(IN_T2) {
            self.t2.unlink(slots, id);
        } else {
            self.t1.unlink(slots, id);
        }
    }

    fn ghost_hit(&mut self, k: &BlockHash, h: u64) {
        let (b1, b2) = (self.ghosts.len_of(B1) as f64, self.ghosts.len_of(B2) as f64);
        // Moving a key within its list leaves the sizes as they were.
        match self.ghosts.move_to_back_hashed(k, h) {
            Some(B1) => {
                let step = (b2 / b1).max(1.0);
                self.target = (self.target + step).min(self.capacity as f64);
            }
            Some(_) => {
                let step = (b1 / b2).max(1.0);
                self.target = (self.target - step).max(0.0);
            }
            None => {}
        }
    }

    /// The keys a request offered to store for the first time (with their hashes),
    /// last first (vLLM visits them in reverse); each ghost line fetched a few keys
    /// ahead. (`keys` is the caller's buffer, mutable only for the pipeline.)
    pub fn on_store_miss(&mut self, keys: &mut [(BlockHash, u64)]) {
        pipelined(
            self,
            keys,
            |arc, &(_, h)| arc.ghosts.prefetch(h),
            |_, _| {},
            |arc, (k, h)| arc.ghost_hit(k, *h),
        );
    }

    fn promote(&mut self, slots: &mut [Slot], id: u32) {
        self.t1.unlink(slots, id);
        self.t2.push_back(slots, id);
        slots[id as usize].flags |= IN_T2;
    }

    pub fn touch(&mut self, table: &mut ChunkTable, keys: &[BlockHash]) {
        for k in keys.iter().rev() {
            let Some(id) = table.find(k) else {
                self.ghost_hit(k, hash_of(k));
                continue;
            };
            let slots = &mut table.slots[..];
            let s = slots[id as usize];
            if !s.has(IN_T2) {
                if s.ref_cnt >= 0 {
                    self.promote(slots, id);
                } else {
                    // A chunk still being stored is not a second use: newest of T1.
                    self.t1.move_to_back(slots, id);
                }
            } else {
                self.t2.move_to_back(slots, id);
            }
        }
    }

    /// The finished request's stored keys, in its order (walked newest first).
    pub fn on_finished(&mut self, slots: &mut [Slot], ordered: &[Finished]) {
        for f in ordered.iter().rev() {
            let id = f.slot;
            let in_t2 = slots[id as usize].has(IN_T2);
            if f.inserted_only {
                // Storing is not a reuse: the key keeps its list, as its newest entry.
                if in_t2 {
                    self.t2.move_to_back(slots, id);
                } else {
                    self.t1.move_to_back(slots, id);
                }
            } else if f.reused {
                if in_t2 {
                    self.t2.move_to_back(slots, id);
                } else {
                    self.promote(slots, id);
                }
            }
        }
    }

    /// The `n` chunks to evict in vLLM's order (each from T1 while T1 is at least its
    /// target, else from T2, else from T1), or None (nothing changed) when short.
    /// Fills `out` (cleared first) with (slot, from T1) pairs; `apply` moves them to the
    /// ghost lists. False when short (`out` then holds no valid selection).
    pub fn select(&self, slots: &[Slot], n: usize, out: &mut Vec<(u32, bool)>) -> bool {
        let usable = |id: u32| {
            let s = &slots[id as usize];
            s.ref_cnt == 0 && s.flags & PROTECTED == 0
        };
        let walk = |head: u32| {
            let mut at = head;
            std::iter::from_fn(move || {
                while at != super::chunks::NIL {
                    let id = at;
                    at = slots[id as usize].next;
                    if usable(id) {
                        return Some(id);
                    }
                }
                None
            })
        };
        let mut t1 = walk(self.t1.head);
        let mut t2 = walk(self.t2.head);
        let mut t1_size = self.t1.len as i64;
        // Python's int(): truncation toward zero of a non-negative float.
        let target = self.target.trunc() as i64;
        out.clear();
        for _ in 0..n {
            let mut pick = None;
            if t1_size >= target {
                if let Some(id) = t1.next() {
                    pick = Some((id, true));
                    t1_size -= 1;
                }
            }
            if pick.is_none() {
                pick = t2.next().map(|id| (id, false));
            }
            if pick.is_none() {
                let Some(id) = t1.next() else {
                    return false;
                };
                pick = Some((id, true));
                t1_size -= 1;
            }
            out.extend(pick);
        }
        true
    }

    /// Unlinks the picked chunks and files their keys in the ghost lists, each list
    /// then trimmed to the capacity from its oldest end (the caller frees the slots).
    /// A list is trimmed as each key joins it: the same keys leave as trimming once at
    /// the end, and each trim's lookahead has the next key's work to land in.
    pub fn apply(&mut self, slots: &mut [Slot], picked: &[(u32, bool)]) {
        let mut victims = std::mem::take(&mut self.victims);
        victims.clear();
        victims.extend(
            picked
                .iter()
                .map(|&(id, t1)| (id, t1, hash_of(&slots[id as usize].key))),
        );
        self.ghosts.prefetch_front(B1);
        self.ghosts.prefetch_front(B2);
        let cap = usize::try_from(self.capacity).unwrap_or(usize::MAX);
        pipelined(
            &mut (&mut *self, &mut *slots),
            &mut victims,
            |(arc, _), &(_, _, h)| arc.ghosts.prefetch(h),
            |_, _| {},
            |(arc, slots), &mut (id, from_t1, h)| {
                let k = slots[id as usize].key;
                // A stored key is in no ghost list (storing took it out).
                let o = if from_t1 {
                    arc.t1.unlink(*slots, id);
                    B1
                } else {
                    arc.t2.unlink(*slots, id);
                    B2
                };
                arc.ghosts.push_new_hashed(o, k, h, ());
                if arc.ghosts.len_of(o) > cap {
                    arc.ghosts.pop_front_of(o);
                }
            },
        );
        self.victims = victims;
        for o in [B1, B2] {
            while self.ghosts.len_of(o) > cap {
                self.ghosts.pop_front_of(o);
            }
        }
    }

    /// The state as text: the target, T1 and T2's ends (their order is in the slots'
    /// links) and the ghost lists, oldest first.
    pub(crate) fn dump(&self) -> String {
        let b1: Vec<_> = self.ghosts.keys_of(B1).collect();
        let b2: Vec<_> = self.ghosts.keys_of(B2).collect();
        format!("{} {:?} {:?} {b1:?} {b2:?}", self.target, self.t1, self.t2)
    }

    pub fn clear(&mut self) {
        self.t1.clear();
        self.t2.clear();
        self.ghosts.clear();
        self.target = 0.0;
    }

    pub fn check(&self, table: &ChunkTable) -> Result<(), String> {
        let slots = &table.slots[..];
        let limit = table.len() + 1;
        let (Some(t1), Some(t2)) = (self.t1.walk(slots, limit), self.t2.walk(slots, limit)) else {
            return Err("arc: a list's links are inconsistent".into());
        };
        if t1.len() + t2.len() != table.len() {
            return Err("arc: T1 + T2 do not hold exactly the stored chunks".into());
        }
        for (ids, in_t2) in [(&t1, false), (&t2, true)] {
            for &id in ids {
                let s = &slots[id as usize];
                if !s.live() || s.has(IN_T2) != in_t2 {
                    return Err(format!("arc: key {:?} missing from its list", s.key));
                }
            }
        }
        let cap = usize::try_from(self.capacity).unwrap_or(usize::MAX);
        if self.ghosts.len_of(B1) > cap || self.ghosts.len_of(B2) > cap {
            return Err("arc: a ghost list exceeds the capacity".into());
        }
        if table.live().any(|(_, s)| self.ghosts.contains(&s.key)) {
            return Err("arc: a stored key is in a ghost list".into());
        }
        if !(0.0..=self.capacity as f64).contains(&self.target) {
            return Err(format!("arc: target {} out of range", self.target));
        }
        if !self.ghosts.consistent() {
            return Err("arc: a ghost list's order is inconsistent".into());
        }
        Ok(())
    }
}
