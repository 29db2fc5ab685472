//! [`LabCache`]: a prefix-closed block cache with pluggable eviction and admission.
//!
//! Requests hold blocks while they run: `acquire` looks up the longest cached prefix of
//! the request's block keys, references the blocks it finds and allocates the others
//! (plus anonymous blocks for a non-full tail and reserved output), evicting cached
//! blocks when short; `grow` adds blocks while it decodes; `release` drops the
//! references, and the admission rule decides which released blocks stay cached.
//! With `overcommit` (the request-sequence model), `acquire` never evicts: the cache
//! goes over its budget with the request's blocks and `release` evicts back down to it,
//! so the eviction rule may also choose the blocks just brought in (Belady's bypass).

use std::collections::BTreeSet;

use rustc_hash::{FxHashMap, FxHashSet};

use super::density::Density;
use super::future::{NextUse, NEVER};
use super::rule::{Admission, Rule};
use crate::error::{Error, Result};

const NONE: u32 = u32::MAX;

type EvictKey = (u64, u64, u32, u32); // (primary, secondary, u32::MAX - depth, slot)

#[derive(Debug, Clone)]
struct Block {
    key: u64,
    parent: u32,
    depth: u32,
    children: u32,
    refs: u32,
    last: u64,
    hits: u32,
    uses: u32,
    next_use: u64,
    protected: bool,
    live: bool,
    listed: Option<EvictKey>,
    priority: f64, // Rule::Cost
}

#[derive(Debug, Default)]
struct Held {
    blocks: Vec<u32>,
    anon: usize,
}

/// Counters of a [`LabCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LabStats {
    /// Cached blocks dropped to make room.
    pub evicted: u64,
    /// Released blocks the admission rule did not keep.
    pub not_admitted: u64,
    /// Blocks held by the cache without a request (cached).
    pub cached: u64,
    /// Blocks in use: cached plus held by requests (keyed or anonymous).
    pub used: u64,
    /// Hit blocks over every `acquire`.
    pub hit_blocks: u64,
}

/// See the module documentation.
#[derive(Debug)]
pub struct LabCache {
    capacity: usize,
    rule: Rule,
    admission: Admission,
    overcommit: bool,
    blocks: Vec<Block>,
    free_slots: Vec<u32>,
    map: FxHashMap<u64, u32>,
    evictable: BTreeSet<EvictKey>,
    used: usize,
    /// Unreferenced cached blocks. A request holds a whole root path, so every one of
    /// them can be evicted (leaves first): this is what eviction can free.
    cached: usize,
    clock: u64,
    held: FxHashMap<u64, Held>,
    seen: FxHashMap<u64, u32>,
    future: Option<NextUse>,
    aging: f64,
    protected: BTreeSet<(u64, u32)>,
    protected_cap: usize,
    /// Live blocks outside the protected / main segment (Rule::TwoQ).
    window_len: usize,
    window_cap: usize,
    /// Rule::Density: learned densities, the evictable blocks as a vector to sample
    /// from (with each slot's position in it), the sampler's state.
    density: Density,
    pool: Vec<u32>,
    pool_pos: Vec<u32>,
    rng: u64,
    stats: LabStats,
}

impl LabCache {
    /// A cache of `capacity` blocks.
    pub fn new(capacity: usize, rule: Rule, admission: Admission, overcommit: bool) -> Self {
        let protected_cap = match rule {
            Rule::Slru { protected } | Rule::Session { protected, .. } => {
                (capacity as f64 * protected) as usize
            }
            _ => 0,
        };
        LabCache {
            capacity,
            rule,
            admission,
            overcommit,
            blocks: Vec::new(),
            free_slots: Vec::new(),
            map: FxHashMap::default(),
            evictable: BTreeSet::new(),
            used: 0,
            cached: 0,
            clock: 0,
            held: FxHashMap::default(),
            seen: FxHashMap::default(),
            future: None,
            aging: 0.0,
            protected: BTreeSet::new(),
            protected_cap,
            window_len: 0,
            window_cap: match rule {
                Rule::TwoQ { window } => (capacity as f64 * window) as usize,
                _ => 0,
            },
            density: Density::default(),
            pool: Vec::new(),
            pool_pos: Vec::new(),
            rng: 0x9E37_79B9_7F4A_7C15,
            stats: LabStats::default(),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn rule(&self) -> Rule {
        self.rule
    }

    /// Switches the request-sequence model on or off. Turning it off while over the
    /// budget evicts cached blocks down to it; when the blocks running requests hold
    /// exceed the budget by themselves, it is refused and nothing changes.
    pub fn set_overcommit(&mut self, on: bool) -> Result<()> {
        if !on && self.used > self.capacity {
            // Every cached block can go (leaves first): a held block's ancestors are held.
            let held = self.used - self.cached;
            if held > self.capacity {
                return Err(Error::BlockState(format!(
                    "cannot turn overcommit off: running requests hold {held} blocks, more \
                     than the capacity of {}; release some first",
                    self.capacity
                )));
            }
            while self.used > self.capacity && self.evict_one() {}
        }
        self.overcommit = on;
        Ok(())
    }

    /// Give the cache the future (required by [`Rule::Opt`]; request ids are then the
    /// requests' indices in the sequence the future was built from).
    pub fn set_future(&mut self, future: NextUse) {
        self.future = Some(future);
    }

    /// Free blocks (negative while an overcommitted request is held).
    pub fn num_free(&self) -> i64 {
        self.capacity as i64 - self.used as i64
    }

    /// `total` more blocks in use stay countable (`num_free` is an i64).
    fn check_total(&self, total: usize) -> Result<()> {
        match self.used.checked_add(total) {
            Some(u) if i64::try_from(u).is_ok() => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "total {total} blocks on top of the {} in use overflow the count",
                self.used
            ))),
        }
    }

    /// The keys' cached blocks chain as the keys do: each cached key's block is a child
    /// of the block of the key before it (`parent` for the first), and no cached key
    /// follows an uncached one. Keys that break it (not chained as `lab_block_keys`
    /// makes them) would pin blocks whose ancestors then cannot be evicted.
    fn check_chain(&self, keys: &[u64], mut parent: u32) -> Result<()> {
        let mut gone = false;
        for (i, k) in keys.iter().enumerate() {
            match self.map.get(k) {
                Some(&s) if !gone && self.blocks[s as usize].parent == parent => parent = s,
                Some(_) => {
                    return Err(Error::InvalidArgument(format!(
                        "key {k} (position {i}) is cached after another key than the one \
                         before it: keys must chain as the cached blocks do"
                    )))
                }
                None => gone = true,
            }
        }
        Ok(())
    }

    /// Cached blocks no request holds: all of them can be evicted (leaves first).
    pub fn num_evictable(&self) -> usize {
        self.cached
    }

    pub fn stats(&self) -> LabStats {
        let mut s = self.stats;
        s.used = self.used as u64;
        s.cached = self.cached as u64;
        s
    }

    /// The longest cached prefix of `keys[..hittable]`, in blocks (no state change).
    pub fn lookup(&self, keys: &[u64], hittable: usize) -> usize {
        keys[..hittable.min(keys.len())]
            .iter()
            .take_while(|k| self.map.contains_key(k))
            .count()
    }

    fn evict_key(&self, b: &Block, slot: u32) -> EvictKey {
        let (p, s) = match self.rule {
            Rule::Lru => (b.last, 0),
            Rule::Opt => (u64::MAX - b.next_use, 0),
            Rule::Slru { .. } | Rule::Session { .. } | Rule::TwoQ { .. } => {
                (u64::from(b.protected), b.last)
            }
            Rule::Lfu => (u64::from(b.hits), b.last),
            Rule::Density { .. } => (0, 0),
            // Priorities are >= 0, so their IEEE bits order as the values do.
            Rule::Cost { .. } => (b.priority.to_bits(), b.last),
        };
        (p, s, u32::MAX - b.depth, slot)
    }

    fn list(&mut self, slot: u32) {
        let b = &self.blocks[slot as usize];
        debug_assert!(b.live && b.refs == 0 && b.children == 0 && b.listed.is_none());
        let k = self.evict_key(b, slot);
        self.evictable.insert(k);
        self.blocks[slot as usize].listed = Some(k);
        if matches!(self.rule, Rule::Density { .. }) {
            if self.pool_pos.len() <= slot as usize {
                self.pool_pos.resize(slot as usize + 1, NONE);
            }
            self.pool_pos[slot as usize] = self.pool.len() as u32;
            self.pool.push(slot);
        }
    }

    fn unlist(&mut self, slot: u32) {
        if let Some(k) = self.blocks[slot as usize].listed.take() {
            self.evictable.remove(&k);
            if matches!(self.rule, Rule::Density { .. }) {
                let i = self.pool_pos[slot as usize] as usize;
                self.pool.swap_remove(i);
                if let Some(&moved) = self.pool.get(i) {
                    self.pool_pos[moved as usize] = i as u32;
                }
                self.pool_pos[slot as usize] = NONE;
            }
        }
    }

    fn next_random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x
    }

    /// Rule::Density: the evictable block of least hit density among `samples` drawn
    /// (all of them when there are no more); ties to the older, then the deeper block.
    fn density_victim(&mut self, samples: u32) -> Option<u32> {
        let n = self.pool.len();
        if n == 0 {
            return None;
        }
        let draws = (samples as usize).max(1);
        let mut best: Option<(f64, u64, u32, u32)> = None;
        for i in 0..draws.min(n) {
            let idx = if n <= draws {
                i
            } else {
                (self.next_random() % n as u64) as usize
            };
            let s = self.pool[idx];
            let b = &self.blocks[s as usize];
            let age = self.clock - b.last.min(self.clock);
            let d = self.density.get(Density::class(b.uses), age);
            let better = match best {
                None => true,
                Some((bd, ba, bdep, _)) => {
                    d < bd || (d == bd && (age > ba || (age == ba && b.depth > bdep)))
                }
            };
            if better {
                best = Some((d, age, b.depth, s));
            }
        }
        best.map(|b| b.3)
    }

    fn relist(&mut self, slot: u32) {
        if self.blocks[slot as usize].listed.is_some() {
            self.unlist(slot);
            self.list(slot);
        }
    }

    fn evict_one(&mut self) -> bool {
        let main_first =
            matches!(self.rule, Rule::TwoQ { .. }) && self.window_len <= self.window_cap;
        let pick = if let Rule::Density { samples } = self.rule {
            self.density_victim(samples)
                .and_then(|s| self.blocks[s as usize].listed)
        } else if main_first {
            self.evictable
                .range((1, 0, 0, 0)..)
                .next()
                .copied()
                .or_else(|| self.evictable.first().copied())
        } else {
            self.evictable.first().copied()
        };
        let Some(k) = pick else {
            return false;
        };
        let slot = k.3;
        self.unlist(slot);
        let (key, parent, protected, last, priority, uses) = {
            let b = &mut self.blocks[slot as usize];
            b.live = false;
            (b.key, b.parent, b.protected, b.last, b.priority, b.uses)
        };
        if matches!(self.rule, Rule::Density { .. }) {
            self.density
                .evicted(Density::class(uses), self.clock - last.min(self.clock));
        }
        if protected {
            self.protected.remove(&(last, slot));
        } else {
            self.window_len -= 1;
        }
        if let Rule::Cost { .. } = self.rule {
            self.aging = self.aging.max(priority);
        }
        self.map.remove(&key);
        self.free_slots.push(slot);
        self.used -= 1;
        self.cached -= 1;
        self.stats.evicted += 1;
        self.detach_child(parent);
        true
    }

    fn detach_child(&mut self, parent: u32) {
        if parent != NONE {
            let p = &mut self.blocks[parent as usize];
            p.children -= 1;
            if p.children == 0 && p.refs == 0 && p.live {
                self.list(parent);
            }
        }
    }

    fn new_block(&mut self, key: u64, parent: u32, depth: u32) -> u32 {
        let b = Block {
            key,
            parent,
            depth,
            children: 0,
            refs: 0,
            last: 0,
            hits: 0,
            uses: 0,
            next_use: NEVER,
            protected: false,
            live: true,
            listed: None,
            priority: 0.0,
        };
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.blocks[s as usize] = b;
                s
            }
            None => {
                self.blocks.push(b);
                (self.blocks.len() - 1) as u32
            }
        };
        if parent != NONE {
            self.blocks[parent as usize].children += 1;
        }
        self.map.insert(key, slot);
        self.used += 1;
        self.window_len += 1;
        slot
    }

    fn pin(&mut self, slot: u32) {
        self.unlist(slot);
        let b = &mut self.blocks[slot as usize];
        if b.refs == 0 {
            self.cached -= 1;
        }
        b.refs += 1;
    }

    fn unpin_restore(&mut self, slot: u32) {
        let b = &mut self.blocks[slot as usize];
        b.refs -= 1;
        if b.refs == 0 {
            self.cached += 1;
            if b.children == 0 {
                self.list(slot);
            }
        }
    }

    /// Promote `slot` to the protected segment (SLRU) and demote the least recent
    /// protected blocks beyond the segment's size.
    fn protect(&mut self, slot: u32) {
        let b = &mut self.blocks[slot as usize];
        if b.protected {
            return;
        }
        b.protected = true;
        self.protected.insert((b.last, slot));
        self.window_len -= 1;
        if matches!(self.rule, Rule::TwoQ { .. }) {
            self.relist(slot);
            return; // the main segment is not capped
        }
        while self.protected.len() > self.protected_cap {
            let Some((_, s)) = self.protected.pop_first() else {
                break;
            };
            let c = &mut self.blocks[s as usize];
            c.protected = false;
            self.window_len += 1;
            c.last = self.clock; // to the probationary segment's most recent end
            self.relist(s);
        }
    }

    /// Stamp an access at request `rid`: recency, frequency, next use, priority.
    fn touch(&mut self, slot: u32, rid: u64, hit: bool, promote: bool) {
        let clock = self.clock;
        let next = match &self.future {
            Some(f) if self.rule == Rule::Opt => {
                f.at(rid, self.blocks[slot as usize].depth as usize)
            }
            _ => NEVER,
        };
        let aging = self.aging;
        let b = &mut self.blocks[slot as usize];
        let was_protected = b.protected;
        let old_last = b.last;
        if b.uses > 0 && matches!(self.rule, Rule::Density { .. }) {
            let (class, age) = (Density::class(b.uses), clock - old_last.min(clock));
            self.density.hit(class, age);
        }
        let b = &mut self.blocks[slot as usize];
        b.uses = b.uses.saturating_add(1);
        b.last = clock;
        b.next_use = next;
        if hit {
            b.hits += 1;
        }
        if let Rule::Cost { depth_cost } = self.rule {
            let cost = 1.0 + depth_cost * (f64::from(b.depth) + 0.5);
            b.priority = aging + f64::from(b.hits + 1) * cost;
        }
        if was_protected {
            self.protected.remove(&(old_last, slot));
            self.protected.insert((clock, slot));
        } else if promote {
            self.protect(slot);
        }
        if matches!(self.admission, Admission::Seen(_)) || matches!(self.rule, Rule::TwoQ { .. }) {
            let key = self.blocks[slot as usize].key;
            let n = self.seen.entry(key).or_insert(0);
            *n += 1;
            if *n >= 2 && matches!(self.rule, Rule::TwoQ { .. }) {
                self.protect(slot);
            }
        }
    }

    fn check_rule(&self) -> Result<()> {
        if self.rule == Rule::Opt && self.future.is_none() {
            return Err(Error::InvalidArgument(
                "the opt rule needs the future: call set_future first".into(),
            ));
        }
        Ok(())
    }

    /// Look up and take blocks for request `rid`: `keys` are its full blocks' keys, the
    /// first `hittable` of which may hit; `total` blocks are held in all (the keyed ones
    /// plus anonymous ones for the tail and reserved output). Returns the hit in blocks,
    /// or `None` (nothing changed) when the budget is short even after evicting.
    pub fn acquire(
        &mut self,
        rid: u64,
        keys: &[u64],
        hittable: usize,
        total: usize,
    ) -> Result<Option<usize>> {
        self.check_rule()?;
        if self.held.contains_key(&rid) {
            return Err(Error::InvalidArgument(format!(
                "request {rid} already holds blocks"
            )));
        }
        if hittable > keys.len() || total < keys.len() {
            return Err(Error::InvalidArgument(format!(
                "hittable {hittable} and total {total} must bracket {} keys",
                keys.len()
            )));
        }
        distinct(keys)?;
        self.check_chain(keys, NONE)?;
        let anon = total - keys.len();
        self.check_total(total)?;
        let hit = self.lookup(keys, hittable);
        // Pin every present block first, so eviction cannot take them.
        let mut present: Vec<Option<u32>> = Vec::with_capacity(keys.len());
        for k in keys {
            let s = self.map.get(k).copied();
            if let Some(s) = s {
                self.pin(s);
            }
            present.push(s);
        }
        let absent = present.iter().filter(|p| p.is_none()).count();
        let need = absent + anon;
        if !self.overcommit {
            let free = self.capacity.saturating_sub(self.used);
            if need > free && need - free > self.cached {
                for s in present.iter().flatten() {
                    self.unpin_restore(*s);
                }
                return Ok(None);
            }
            for _ in free..need {
                self.evict_one();
            }
        }
        self.clock += 1;
        if matches!(self.rule, Rule::Density { .. }) {
            self.density.maybe_update(self.clock);
        }
        let session = match self.rule {
            Rule::Session { min_hit, .. } => hit > 0 && hit as f64 >= min_hit * hittable as f64,
            _ => false,
        };
        let mut slots = Vec::with_capacity(keys.len());
        let mut parent = NONE;
        for (i, (k, p)) in keys.iter().zip(present).enumerate() {
            let s = match p {
                Some(s) => s,
                None => {
                    let s = self.new_block(*k, parent, i as u32);
                    self.blocks[s as usize].refs = 1;
                    s
                }
            };
            let promote = match self.rule {
                Rule::Slru { .. } => i < hit,
                Rule::Session { .. } => session,
                _ => false,
            };
            self.touch(s, rid, i < hit, promote);
            slots.push(s);
            parent = s;
        }
        self.used += anon;
        self.stats.hit_blocks += hit as u64;
        self.held.insert(
            rid,
            Held {
                blocks: slots,
                anon,
            },
        );
        Ok(Some(hit))
    }

    /// Request `rid` computed more blocks: `new_keys` extend its keyed blocks and it now
    /// holds `total` blocks in all. False (nothing changed) when the budget is short.
    pub fn grow(&mut self, rid: u64, new_keys: &[u64], total: usize) -> Result<bool> {
        let Some(h) = self.held.get(&rid) else {
            return Err(Error::UnknownRequest(format!(
                "request {rid} holds no blocks"
            )));
        };
        let keyed = h.blocks.len() + new_keys.len();
        if total < keyed {
            return Err(Error::InvalidArgument(format!(
                "total {total} is below the {keyed} keyed blocks"
            )));
        }
        distinct(new_keys)?;
        if let Some(k) = new_keys
            .iter()
            .find(|k| self.map.get(k).is_some_and(|s| h.blocks.contains(s)))
        {
            return Err(Error::InvalidArgument(format!(
                "key {k} is already one of request {rid}'s blocks"
            )));
        }
        self.check_chain(new_keys, h.blocks.last().copied().unwrap_or(NONE))?;
        self.check_total(total)?;
        let old_anon = h.anon;
        let mut parent = h.blocks.last().copied().unwrap_or(NONE);
        let depth0 = h.blocks.len();
        let mut present: Vec<Option<u32>> = Vec::with_capacity(new_keys.len());
        for k in new_keys {
            let s = self.map.get(k).copied();
            if let Some(s) = s {
                self.pin(s);
            }
            present.push(s);
        }
        let absent = present.iter().filter(|p| p.is_none()).count();
        let anon = total - keyed;
        let need = (absent + anon) as i64 - old_anon as i64;
        if !self.overcommit && need > 0 {
            let need = need as usize;
            let free = self.capacity.saturating_sub(self.used);
            if need > free && need - free > self.cached {
                for s in present.iter().flatten() {
                    self.unpin_restore(*s);
                }
                return Ok(false);
            }
            for _ in free..need {
                self.evict_one();
            }
        }
        self.clock += 1;
        let mut slots = Vec::with_capacity(new_keys.len());
        for (i, (k, p)) in new_keys.iter().zip(present).enumerate() {
            let s = match p {
                Some(s) => s,
                None => {
                    let s = self.new_block(*k, parent, (depth0 + i) as u32);
                    self.blocks[s as usize].refs = 1;
                    s
                }
            };
            let promote = match self.rule {
                Rule::Session { .. } => self.blocks[parent_of(s, &self.blocks)].protected,
                _ => false,
            };
            self.touch(s, rid, false, promote);
            slots.push(s);
            parent = s;
        }
        self.used = self.used + anon - old_anon;
        let h = self
            .held
            .get_mut(&rid)
            .ok_or_else(|| Error::UnknownRequest(format!("request {rid} holds no blocks")))?;
        h.blocks.extend(slots);
        h.anon = anon;
        Ok(true)
    }

    fn admitted(&self, key: u64) -> bool {
        match self.admission {
            Admission::All => true,
            Admission::Seen(k) => self.seen.get(&key).copied().unwrap_or(0) >= k,
        }
    }

    /// Request `rid` ends: its blocks are released (kept cached as the admission rule
    /// says), its anonymous blocks freed; with overcommit the cache then evicts down to
    /// its budget.
    pub fn release(&mut self, rid: u64) -> Result<()> {
        let Some(h) = self.held.remove(&rid) else {
            return Err(Error::UnknownRequest(format!(
                "request {rid} holds no blocks"
            )));
        };
        self.used -= h.anon;
        for &s in h.blocks.iter().rev() {
            let b = &mut self.blocks[s as usize];
            b.refs -= 1;
            if b.refs > 0 {
                continue;
            }
            self.cached += 1;
            if b.children > 0 {
                continue;
            }
            let key = b.key;
            if self.admitted(key) {
                self.list(s);
            } else {
                let b = &mut self.blocks[s as usize];
                let (parent, protected, last) = (b.parent, b.protected, b.last);
                b.live = false;
                if protected {
                    self.protected.remove(&(last, s));
                } else {
                    self.window_len -= 1;
                }
                self.map.remove(&key);
                self.free_slots.push(s);
                self.used -= 1;
                self.cached -= 1;
                self.stats.not_admitted += 1;
                self.detach_child(parent);
            }
        }
        if self.overcommit {
            while self.used > self.capacity && self.evict_one() {}
        }
        Ok(())
    }

    /// Full consistency check (tests).
    pub fn check_invariants(&self) -> Result<()> {
        let fail = |m: String| Err(Error::InvalidArgument(format!("lab cache invariant: {m}")));
        let mut refs = vec![0u32; self.blocks.len()];
        let mut anon = 0usize;
        for h in self.held.values() {
            anon += h.anon;
            for &s in &h.blocks {
                refs[s as usize] += 1;
            }
        }
        let mut children = vec![0u32; self.blocks.len()];
        let mut live = 0usize;
        for (i, b) in self.blocks.iter().enumerate() {
            if !b.live {
                continue;
            }
            live += 1;
            if b.parent != NONE {
                if !self.blocks[b.parent as usize].live {
                    return fail(format!("block {i} has an evicted parent"));
                }
                children[b.parent as usize] += 1;
            }
            if self.map.get(&b.key) != Some(&(i as u32)) {
                return fail(format!("block {i} missing from the key map"));
            }
        }
        for (i, b) in self.blocks.iter().enumerate() {
            if !b.live {
                continue;
            }
            if b.refs != refs[i] || b.children != children[i] {
                return fail(format!("block {i}: refs/children counts are off"));
            }
            let should = b.refs == 0 && b.children == 0;
            if should != b.listed.is_some() {
                return fail(format!(
                    "block {i}: listed {} but evictable {should}",
                    b.listed.is_some()
                ));
            }
            if let Some(k) = b.listed {
                if !self.evictable.contains(&k) || k != self.evict_key(b, i as u32) {
                    return fail(format!("block {i}: stale eviction key"));
                }
            }
        }
        let window = self
            .blocks
            .iter()
            .filter(|b| b.live && !b.protected)
            .count();
        if window != self.window_len {
            return fail(format!("window count {} != {window}", self.window_len));
        }
        let cached = self.blocks.iter().filter(|b| b.live && b.refs == 0).count();
        if cached != self.cached {
            return fail(format!("cached count {} != {cached}", self.cached));
        }
        if self.map.len() != live || self.evictable.len() > live {
            return fail("map / evictable sizes".into());
        }
        if self.used != live + anon {
            return fail(format!(
                "used {} != {live} live + {anon} anonymous",
                self.used
            ));
        }
        if !self.overcommit && self.used > self.capacity {
            return fail(format!("{} blocks used of {}", self.used, self.capacity));
        }
        Ok(())
    }
}

/// A request's keys are a chain: no key may repeat.
fn distinct(keys: &[u64]) -> Result<()> {
    if keys.len() > 1 {
        let mut seen = FxHashSet::default();
        seen.reserve(keys.len());
        if let Some(k) = keys.iter().find(|k| !seen.insert(**k)) {
            return Err(Error::InvalidArgument(format!(
                "key {k} repeats: a request's block keys are a chain (lab_block_keys)"
            )));
        }
    }
    Ok(())
}

/// The slot of `s`'s parent, or `s` itself for a root block.
fn parent_of(s: u32, blocks: &[Block]) -> usize {
    let p = blocks[s as usize].parent;
    if p == NONE {
        s as usize
    } else {
        p as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(cap: usize, rule: Rule) -> LabCache {
        LabCache::new(cap, rule, Admission::All, false)
    }

    #[test]
    fn lru_evicts_tail_first_and_keeps_ancestors() {
        let mut c = cache(3, Rule::Lru);
        assert_eq!(c.acquire(0, &[1, 2, 3], 3, 3).unwrap(), Some(0));
        c.release(0).unwrap();
        assert_eq!(c.acquire(1, &[9], 1, 1).unwrap(), Some(0)); // evicts 3 (deepest)
        c.release(1).unwrap();
        c.check_invariants().unwrap();
        assert_eq!(c.lookup(&[1, 2, 3], 3), 2);
        assert_eq!(c.stats().evicted, 1);
    }

    #[test]
    fn repeated_keys_are_refused() {
        let mut c = cache(4, Rule::Lru);
        assert!(c.acquire(0, &[1, 1], 2, 2).is_err());
        c.acquire(0, &[1, 2], 2, 2).unwrap();
        assert!(c.grow(0, &[2], 2).is_err());
        c.check_invariants().unwrap();
    }

    #[test]
    fn keys_must_chain_as_the_cached_blocks_do() {
        let mut c = cache(2, Rule::Lru);
        c.acquire(0, &[1, 2], 2, 2).unwrap();
        c.release(0).unwrap();
        // 2 is cached under 1: a request starting at 2 would pin it with 1 unevictable.
        assert!(c.acquire(1, &[2, 7], 2, 2).is_err());
        assert!(c.acquire(1, &[5, 2], 2, 2).is_err());
        assert_eq!((c.num_free(), c.num_evictable()), (0, 2));
        c.check_invariants().unwrap();
        c.acquire(1, &[1], 1, 1).unwrap();
        assert!(c.grow(1, &[7, 2], 3).is_err());
        assert!(c.grow(1, &[2], 2).unwrap());
        c.check_invariants().unwrap();
    }

    #[test]
    fn totals_past_the_count_are_refused() {
        let mut c = LabCache::new(10, Rule::Lru, Admission::All, true);
        let max = i64::MAX as usize;
        assert_eq!(c.acquire(0, &[], 0, max - 1).unwrap(), Some(0));
        assert!(c.acquire(1, &[], 0, 2).is_err());
        assert!(c.grow(0, &[], max).is_err());
        assert_eq!(c.num_free(), 10 - (max as i64 - 1));
        c.check_invariants().unwrap();
    }

    #[test]
    fn short_budget_changes_nothing() {
        let mut c = cache(2, Rule::Lru);
        assert_eq!(c.acquire(0, &[1, 2], 2, 2).unwrap(), Some(0));
        assert_eq!(c.acquire(1, &[5], 1, 1).unwrap(), None);
        c.check_invariants().unwrap();
        c.release(0).unwrap();
        assert_eq!(c.acquire(1, &[1, 5], 2, 2).unwrap(), Some(1));
        c.check_invariants().unwrap();
    }

    #[test]
    fn opt_bypasses_under_overcommit() {
        let mut c = LabCache::new(1, Rule::Opt, Admission::All, true);
        // r0: [1], r1: [2], r2: [1] -> keep 1, bypass 2.
        let f = NextUse::new(&[1, 2, 1], &[0, 1, 2, 3], &[1, 1, 1]).unwrap();
        c.set_future(f);
        for (r, k) in [(0u64, 1u64), (1, 2), (2, 1)] {
            c.acquire(r, &[k], 1, 1).unwrap();
            c.release(r).unwrap();
            c.check_invariants().unwrap();
        }
        assert_eq!(c.stats().hit_blocks, 1);
    }

    #[test]
    fn overcommit_off_evicts_down_to_the_budget_or_is_refused() {
        let mut c = LabCache::new(3, Rule::Lru, Admission::All, true);
        c.acquire(0, &[1, 2], 2, 2).unwrap();
        c.release(0).unwrap();
        c.acquire(1, &[5, 6], 2, 2).unwrap(); // 2 cached + 2 held: one over
        assert_eq!(c.num_free(), -1);
        c.set_overcommit(false).unwrap();
        assert_eq!(c.num_free(), 0);
        c.check_invariants().unwrap();
        c.release(1).unwrap();
        // Held blocks alone over the budget: refused, nothing changes.
        let mut c = LabCache::new(2, Rule::Lru, Admission::All, true);
        c.acquire(0, &[1, 2, 3], 3, 3).unwrap();
        assert!(matches!(c.set_overcommit(false), Err(Error::BlockState(_))));
        assert_eq!(c.num_free(), -1);
        c.check_invariants().unwrap(); // still overcommitted
        c.release(0).unwrap();
        c.set_overcommit(false).unwrap();
        c.check_invariants().unwrap();
    }

    #[test]
    fn admission_needs_two_sightings() {
        let mut c = LabCache::new(4, Rule::Lru, Admission::Seen(2), false);
        c.acquire(0, &[1, 2], 2, 2).unwrap();
        c.release(0).unwrap();
        assert_eq!(c.lookup(&[1, 2], 2), 0);
        c.acquire(1, &[1, 2], 2, 2).unwrap();
        c.release(1).unwrap();
        assert_eq!(c.acquire(2, &[1, 2], 2, 2).unwrap(), Some(2));
        c.release(2).unwrap();
        c.check_invariants().unwrap();
    }

    #[test]
    fn slru_and_cost_keep_invariants() {
        for rule in [
            Rule::Slru { protected: 0.5 },
            Rule::Lfu,
            Rule::Cost { depth_cost: 0.1 },
        ] {
            let mut c = cache(5, rule);
            for r in 0..50u64 {
                let keys: Vec<u64> = (0..(r % 4 + 1)).map(|i| (r % 3) * 100 + i).collect();
                let n = keys.len();
                if c.acquire(r, &keys, n, n + 1).unwrap().is_some() {
                    assert!(c.grow(r, &[], n).unwrap());
                    c.release(r).unwrap();
                }
                c.check_invariants().unwrap();
            }
        }
    }
}
