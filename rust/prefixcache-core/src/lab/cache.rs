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

use hashbrown::HashTable;
use rustc_hash::{FxHashMap, FxHashSet};

use super::density::Density;
use super::future::{NextUse, NEVER};
use super::rule::{Admission, Rule};
use super::seen::SeenTable;
use crate::error::{try_vec, Error, Result};
use crate::sys_vec::SysVec;

const NONE: u32 = u32::MAX;
/// `next_use` of a block never used again (the future's u32 form of [`NEVER`]).
const NEVER_U32: u32 = u32::MAX;

/// Block flags.
const LIVE: u8 = 1;
const PROTECTED: u8 = 2;
/// In the evictable set, under the key [`LabCache::evict_key`] computes from the block's
/// fields (they do not change while it is listed).
const LISTED: u8 = 4;
/// Bits 3-4: the uses (`Density`), saturating at 3: only whether a block was used and its
/// class (once, twice, more; [`Density::class`]) are read, which 3 keeps exact.
const USES_SHIFT: u32 = 3;
const USES_MASK: u8 = 3 << USES_SHIFT;
const USES_MAX: u32 = 3;

type EvictKey = (u64, u64, u32, u32); // (primary, secondary, u32::MAX - depth, slot)

/// What every rule keeps of a block (24 bytes). The rest lives in side arrays indexed by
/// slot, each kept only by the rules that read it (see [`LabCache`]'s fields), so that a
/// block costs what its rule needs.
#[derive(Debug, Clone, Copy)]
struct Block {
    key: u64,
    parent: u32,
    depth: u32,
    children: u32,
    refs: u32,
}

/// The key map's hash of a block key (keys given by a caller need not be uniform: every
/// bit reaches the bucket bits; MurmurHash3's finaliser).
#[inline]
pub(super) fn key_hash(k: u64) -> u64 {
    let h = (k ^ (k >> 33)).wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    let h = (h ^ (h >> 33)).wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    h ^ (h >> 33)
}

/// Room for `fresh` more elements, growing by half at least (fallible; nothing changes
/// on error).
fn room<T: Copy>(v: &mut SysVec<T>, fresh: usize) -> Result<()> {
    if v.capacity() - v.len() >= fresh {
        return Ok(());
    }
    let oom = |e| Error::out_of_memory("the lab cache's blocks", e);
    let more = fresh.max(v.capacity() / 2).max(64);
    v.try_reserve_exact(more)
        .or_else(|_| v.try_reserve_exact(fresh))
        .map_err(oom)
}

/// Writes `value` at `slot` (`slot == len`: appends, within a reservation).
#[inline]
fn put<T: Copy>(v: &mut SysVec<T>, slot: u32, value: T) {
    match v.get_mut(slot as usize) {
        Some(x) => *x = value,
        None => v.push(value),
    }
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
    blocks: SysVec<Block>,
    /// Per slot: [`LIVE`], [`PROTECTED`], [`LISTED`].
    flags: SysVec<u8>,
    /// Per slot, the clock of the last use (every rule but `Opt`).
    last: SysVec<u64>,
    /// Per slot, the next hittable use ([`NEVER_U32`]: never; `Opt` only).
    next_use: SysVec<u32>,
    /// Per slot, the hits (`Lfu`, `Cost`).
    hits: SysVec<u32>,
    /// Per slot, the GDSF priority (`Cost`).
    priority: SysVec<f64>,
    free_slots: Vec<u32>,
    /// The live blocks' slots, found by their keys (read from `blocks`): 4 bytes a slot.
    map: HashTable<u32>,
    evictable: BTreeSet<EvictKey>,
    used: usize,
    /// Unreferenced cached blocks. A request holds a whole root path, so every one of
    /// them can be evicted (leaves first): this is what eviction can free.
    cached: usize,
    clock: u64,
    held: FxHashMap<u64, Held>,
    /// Rule::TwoQ and Admission::Seen: how often requests brought each key, per slot for
    /// the live blocks and in `seen` for the keys no longer cached.
    seen_live: SysVec<u32>,
    seen: SeenTable,
    future: Option<NextUse>,
    aging: f64,
    /// Slru and Session: the protected blocks by recency, `(last use, slot)`, for
    /// demotion. Built when the segment first outgrows its cap (until then nothing is
    /// demoted and no order is needed; with an unlimited budget, never).
    protected: BTreeSet<(u64, u32)>,
    protected_ordered: bool,
    /// Slru and Session: the protected blocks.
    protected_len: usize,
    protected_cap: usize,
    /// Live blocks outside the protected / main segment (Rule::TwoQ).
    window_len: usize,
    window_cap: usize,
    /// Rule::Density: learned densities, the evictable blocks as a vector to sample
    /// from (with each slot's position in it), the sampler's state.
    density: Density,
    pool: Vec<u32>,
    pool_pos: SysVec<u32>,
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
            blocks: SysVec::new(),
            flags: SysVec::new(),
            last: SysVec::new(),
            next_use: SysVec::new(),
            hits: SysVec::new(),
            priority: SysVec::new(),
            free_slots: Vec::new(),
            map: HashTable::new(),
            evictable: BTreeSet::new(),
            used: 0,
            cached: 0,
            clock: 0,
            held: FxHashMap::default(),
            seen_live: SysVec::new(),
            seen: SeenTable::default(),
            future: None,
            aging: 0.0,
            protected: BTreeSet::new(),
            protected_ordered: false,
            protected_len: 0,
            protected_cap,
            window_len: 0,
            window_cap: match rule {
                Rule::TwoQ { window } => (capacity as f64 * window) as usize,
                _ => 0,
            },
            density: Density::default(),
            pool: Vec::new(),
            pool_pos: SysVec::new(),
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
            self.reserve_departures(self.used - self.capacity)?;
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
            match self.slot_of(*k) {
                Some(s) if !gone && self.blocks[s as usize].parent == parent => parent = s,
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
            .take_while(|k| self.slot_of(**k).is_some())
            .count()
    }

    /// The slot of the live block of key `k`.
    #[inline]
    fn slot_of(&self, k: u64) -> Option<u32> {
        let blocks = &self.blocks;
        self.map
            .find(key_hash(k), |&s| blocks[s as usize].key == k)
            .copied()
    }

    fn map_remove(&mut self, k: u64) {
        let blocks = &self.blocks;
        if let Ok(e) = self
            .map
            .find_entry(key_hash(k), |&s| blocks[s as usize].key == k)
        {
            e.remove();
        }
    }

    #[inline]
    fn has(&self, slot: u32, flag: u8) -> bool {
        self.flags[slot as usize] & flag != 0
    }

    /// `Density`'s use count of `slot` (saturating at [`USES_MAX`]).
    #[inline]
    fn uses_of(&self, slot: u32) -> u32 {
        u32::from((self.flags[slot as usize] & USES_MASK) >> USES_SHIFT)
    }

    #[inline]
    fn set(&mut self, slot: u32, flag: u8, on: bool) {
        let f = &mut self.flags[slot as usize];
        *f = if on { *f | flag } else { *f & !flag };
    }

    /// The clock of `slot`'s last use (0 for a rule that does not keep it).
    #[inline]
    fn last_of(&self, slot: u32) -> u64 {
        self.last.get(slot as usize).copied().unwrap_or(0)
    }

    #[inline]
    fn set_last(&mut self, slot: u32, clock: u64) {
        if let Some(x) = self.last.get_mut(slot as usize) {
            *x = clock;
        }
    }

    /// Room for `fresh` more blocks (the map's entries and, past the free slots, every
    /// per-slot array the rule keeps), before anything changes: `OutOfMemory` otherwise,
    /// nothing changed.
    fn reserve_blocks(&mut self, fresh: usize) -> Result<()> {
        if fresh == 0 {
            return Ok(());
        }
        let slots = fresh.saturating_sub(self.free_slots.len());
        // Slots are u32 and u32::MAX means none.
        if self.blocks.len().saturating_add(slots) >= NONE as usize {
            return Err(Error::out_of_memory(
                "the lab cache's blocks",
                format!("more than {} blocks", NONE - 1),
            ));
        }
        if slots > 0 {
            room(&mut self.blocks, slots)?;
            room(&mut self.flags, slots)?;
            let rule = self.rule;
            if rule != Rule::Opt {
                room(&mut self.last, slots)?;
            }
            if rule == Rule::Opt {
                room(&mut self.next_use, slots)?;
            }
            if matches!(rule, Rule::Lfu | Rule::Cost { .. }) {
                room(&mut self.hits, slots)?;
            }
            if matches!(rule, Rule::Cost { .. }) {
                room(&mut self.priority, slots)?;
            }
            if self.counts_keys() {
                room(&mut self.seen_live, slots)?;
            }
        }
        if matches!(self.rule, Rule::Density { .. }) {
            // The sampling pool and its positions index every slot there may be.
            let oom = |e| Error::out_of_memory("the lab cache's sampling pool", e);
            let slots_after = self.blocks.len() + slots;
            let more = slots_after.saturating_sub(self.pool_pos.len());
            room(&mut self.pool_pos, more)?;
            let more = slots_after.saturating_sub(self.pool.len());
            self.pool.try_reserve(more).map_err(oom)?;
        }
        let blocks = &self.blocks;
        self.map
            .try_reserve(fresh, |&s| key_hash(blocks[s as usize].key))
            .map_err(|e| Error::out_of_memory("the lab cache's key map", format!("{e:?}")))?;
        Ok(())
    }

    /// Whether keys' use counts are kept (2Q, the admission filter).
    fn counts_keys(&self) -> bool {
        matches!(self.admission, Admission::Seen(_)) || matches!(self.rule, Rule::TwoQ { .. })
    }

    /// Room for `n` blocks to leave the cache (their keys' counts move to `seen`).
    fn reserve_departures(&mut self, n: usize) -> Result<()> {
        if self.counts_keys() && n > 0 {
            self.seen.reserve(n)?;
        }
        Ok(())
    }

    /// A block leaves the cache: its key's count moves to `seen` (reserved).
    fn depart(&mut self, key: u64, slot: u32) {
        if self.counts_keys() {
            self.seen.put(key, self.seen_live[slot as usize]);
        }
    }

    /// The block's key in the evictable set, from its fields (which do not change while
    /// it is listed: a block is unlisted before its stamps change).
    fn evict_key(&self, slot: u32) -> EvictKey {
        let i = slot as usize;
        let last = self.last_of(slot);
        let (p, s) = match self.rule {
            Rule::Lru => (last, 0),
            Rule::Opt => {
                let next = match self.next_use[i] {
                    NEVER_U32 => NEVER,
                    j => u64::from(j),
                };
                (u64::MAX - next, 0)
            }
            Rule::Slru { .. } | Rule::Session { .. } | Rule::TwoQ { .. } => {
                (u64::from(self.has(slot, PROTECTED)), last)
            }
            Rule::Lfu => (u64::from(self.hits[i]), last),
            Rule::Density { .. } => (0, 0),
            // Priorities are >= 0, so their IEEE bits order as the values do.
            Rule::Cost { .. } => (self.priority[i].to_bits(), last),
        };
        (p, s, u32::MAX - self.blocks[i].depth, slot)
    }

    fn list(&mut self, slot: u32) {
        let b = &self.blocks[slot as usize];
        debug_assert!(
            self.has(slot, LIVE) && b.refs == 0 && b.children == 0 && !self.has(slot, LISTED)
        );
        let k = self.evict_key(slot);
        self.evictable.insert(k);
        self.set(slot, LISTED, true);
        if matches!(self.rule, Rule::Density { .. }) {
            if self.pool_pos.len() <= slot as usize {
                self.pool_pos.resize(slot as usize + 1, NONE);
            }
            self.pool_pos[slot as usize] = self.pool.len() as u32;
            self.pool.push(slot);
        }
    }

    fn unlist(&mut self, slot: u32) {
        if self.has(slot, LISTED) {
            let k = self.evict_key(slot);
            self.evictable.remove(&k);
            self.set(slot, LISTED, false);
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
            let age = self.clock - self.last_of(s).min(self.clock);
            let d = self.density.get(Density::class(self.uses_of(s)), age);
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

    fn evict_one(&mut self) -> bool {
        let main_first =
            matches!(self.rule, Rule::TwoQ { .. }) && self.window_len <= self.window_cap;
        let pick = if let Rule::Density { samples } = self.rule {
            self.density_victim(samples)
                .filter(|&s| self.has(s, LISTED))
                .map(|s| self.evict_key(s))
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
        let (key, parent, protected, last) = {
            let b = &self.blocks[slot as usize];
            (
                b.key,
                b.parent,
                self.has(slot, PROTECTED),
                self.last_of(slot),
            )
        };
        if matches!(self.rule, Rule::Density { .. }) {
            let uses = self.uses_of(slot);
            self.density
                .evicted(Density::class(uses), self.clock - last.min(self.clock));
        }
        self.flags[slot as usize] = 0; // free: not live, protected or listed, no uses
        if protected {
            self.unprotect_entry(last, slot);
        } else {
            self.window_len -= 1;
        }
        if let Rule::Cost { .. } = self.rule {
            self.aging = self.aging.max(self.priority[slot as usize]);
        }
        self.depart(key, slot);
        self.map_remove(key);
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
            if p.children == 0 && p.refs == 0 && self.has(parent, LIVE) {
                self.list(parent);
            }
        }
    }

    /// A new live block (within a [`reserve_blocks`](Self::reserve_blocks) reservation).
    fn new_block(&mut self, key: u64, parent: u32, depth: u32) -> u32 {
        let b = Block {
            key,
            parent,
            depth,
            children: 0,
            refs: 0,
        };
        let slot = self.free_slots.pop().unwrap_or(self.blocks.len() as u32);
        put(&mut self.blocks, slot, b);
        put(&mut self.flags, slot, LIVE);
        let rule = self.rule;
        if rule != Rule::Opt {
            put(&mut self.last, slot, 0);
        }
        if rule == Rule::Opt {
            put(&mut self.next_use, slot, NEVER_U32);
        }
        if matches!(rule, Rule::Lfu | Rule::Cost { .. }) {
            put(&mut self.hits, slot, 0);
        }
        if matches!(rule, Rule::Cost { .. }) {
            put(&mut self.priority, slot, 0.0);
        }
        if self.counts_keys() {
            let n = self.seen.take(key);
            put(&mut self.seen_live, slot, n);
        }
        if parent != NONE {
            self.blocks[parent as usize].children += 1;
        }
        let blocks = &self.blocks;
        self.map
            .insert_unique(key_hash(key), slot, |&s| key_hash(blocks[s as usize].key));
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

    /// The protected segment's recency order is kept for the rules that demote from it
    /// (`Slru`, `Session`); 2Q's main segment is not capped, so it needs none.
    fn tracks_protected(&self) -> bool {
        matches!(self.rule, Rule::Slru { .. } | Rule::Session { .. })
    }

    fn unprotect_entry(&mut self, last: u64, slot: u32) {
        if self.tracks_protected() {
            self.protected_len -= 1;
            if self.protected_ordered {
                self.protected.remove(&(last, slot));
            }
        }
    }

    /// Promote `slot` to the protected segment (SLRU) and demote the least recent
    /// protected blocks beyond the segment's size.
    fn protect(&mut self, slot: u32) {
        if self.has(slot, PROTECTED) {
            return;
        }
        let listed = self.has(slot, LISTED);
        if listed {
            self.unlist(slot);
        }
        self.set(slot, PROTECTED, true);
        if self.tracks_protected() {
            self.protected_len += 1;
            if self.protected_ordered {
                self.protected.insert((self.last_of(slot), slot));
            }
        }
        self.window_len -= 1;
        if listed {
            self.list(slot);
        }
        if matches!(self.rule, Rule::TwoQ { .. }) {
            return; // the main segment is not capped
        }
        while self.protected_len > self.protected_cap {
            if !self.protected_ordered {
                // A protected block's last use is its entry's (both change together).
                for s in 0..self.blocks.len() as u32 {
                    if self.has(s, LIVE) && self.has(s, PROTECTED) {
                        self.protected.insert((self.last_of(s), s));
                    }
                }
                self.protected_ordered = true;
            }
            let Some((_, s)) = self.protected.pop_first() else {
                break;
            };
            self.protected_len -= 1;
            let listed = self.has(s, LISTED);
            if listed {
                self.unlist(s);
            }
            self.set(s, PROTECTED, false);
            self.window_len += 1;
            self.set_last(s, self.clock); // to the probationary segment's most recent end
            if listed {
                self.list(s);
            }
        }
    }

    /// Stamp an access at request `rid`: recency, frequency, next use, priority. The
    /// block is not listed (pinned or new), so its eviction key may change.
    fn touch(&mut self, slot: u32, rid: u64, hit: bool, promote: bool) {
        let clock = self.clock;
        let i = slot as usize;
        let rule = self.rule;
        if rule == Rule::Opt {
            let next = match &self.future {
                Some(f) => f.at(rid, self.blocks[i].depth as usize),
                None => NEVER,
            };
            // The future's uses are request indices below u32::MAX; NEVER maps to its
            // u32 form.
            self.next_use[i] = u32::try_from(next).unwrap_or(NEVER_U32);
        }
        let was_protected = self.has(slot, PROTECTED);
        let old_last = self.last_of(slot);
        if matches!(rule, Rule::Density { .. }) {
            let uses = self.uses_of(slot);
            if uses > 0 {
                let (class, age) = (Density::class(uses), clock - old_last.min(clock));
                self.density.hit(class, age);
            }
            let f = &mut self.flags[i];
            *f = (*f & !USES_MASK) | ((uses + 1).min(USES_MAX) << USES_SHIFT) as u8;
        }
        self.set_last(slot, clock);
        if hit && matches!(rule, Rule::Lfu | Rule::Cost { .. }) {
            self.hits[i] = self.hits[i].saturating_add(1);
        }
        if let Rule::Cost { depth_cost } = rule {
            let cost = 1.0 + depth_cost * (f64::from(self.blocks[i].depth) + 0.5);
            self.priority[i] = self.aging + (f64::from(self.hits[i]) + 1.0) * cost;
        }
        if was_protected {
            if self.tracks_protected() && self.protected_ordered {
                self.protected.remove(&(old_last, slot));
                self.protected.insert((clock, slot));
            }
        } else if promote {
            self.protect(slot);
        }
        if self.counts_keys() {
            let n = self.seen_live[i].saturating_add(1);
            self.seen_live[i] = n;
            if n >= 2 && matches!(rule, Rule::TwoQ { .. }) {
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
        let fresh = keys.iter().filter(|k| self.slot_of(**k).is_none()).count();
        self.reserve_blocks(fresh)?;
        if !self.overcommit {
            let free = self.capacity.saturating_sub(self.used);
            let evictions = (fresh + anon).saturating_sub(free).min(self.cached);
            self.reserve_departures(evictions)?;
        }
        self.held
            .try_reserve(1)
            .map_err(|e| Error::out_of_memory("the lab cache's requests", e))?;
        let hit = self.lookup(keys, hittable);
        // Pin every present block first, so eviction cannot take them.
        let mut present: Vec<Option<u32>> = try_vec(keys.len(), "a request's blocks")?;
        let mut slots: Vec<u32> = try_vec(keys.len(), "a request's blocks")?;
        for k in keys {
            let s = self.slot_of(*k);
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
            .find(|k| self.slot_of(**k).is_some_and(|s| h.blocks.contains(&s)))
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
        let fresh = new_keys
            .iter()
            .filter(|k| self.slot_of(**k).is_none())
            .count();
        self.reserve_blocks(fresh)?;
        if !self.overcommit {
            let free = self.capacity.saturating_sub(self.used);
            let need = (fresh + (total - keyed)).saturating_sub(old_anon);
            self.reserve_departures(need.saturating_sub(free).min(self.cached))?;
        }
        if let Some(h) = self.held.get_mut(&rid) {
            h.blocks
                .try_reserve(new_keys.len())
                .map_err(|e| Error::out_of_memory("a request's blocks", e))?;
        }
        let mut present: Vec<Option<u32>> = try_vec(new_keys.len(), "a request's blocks")?;
        let mut slots: Vec<u32> = try_vec(new_keys.len(), "a request's blocks")?;
        for k in new_keys {
            let s = self.slot_of(*k);
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
                Rule::Session { .. } => self.has(parent_of(s, &self.blocks) as u32, PROTECTED),
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

    fn admitted(&self, slot: u32) -> bool {
        match self.admission {
            Admission::All => true,
            Admission::Seen(k) => self.seen_live[slot as usize] >= k,
        }
    }

    /// Request `rid` ends: its blocks are released (kept cached as the admission rule
    /// says), its anonymous blocks freed; with overcommit the cache then evicts down to
    /// its budget.
    pub fn release(&mut self, rid: u64) -> Result<()> {
        // Blocks that may leave: the request's (not admitted) and, with overcommit, those
        // evicted back down to the budget.
        let leaving = self.held.get(&rid).map_or(0, |h| h.blocks.len());
        let over = if self.overcommit {
            self.used.saturating_sub(self.capacity)
        } else {
            0
        };
        self.reserve_departures(leaving.saturating_add(over))?;
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
            if self.admitted(s) {
                self.list(s);
            } else {
                let parent = self.blocks[s as usize].parent;
                let (protected, last) = (self.has(s, PROTECTED), self.last_of(s));
                self.flags[s as usize] = 0; // free
                if protected {
                    self.unprotect_entry(last, s);
                } else {
                    self.window_len -= 1;
                }
                self.depart(key, s);
                self.map_remove(key);
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
        let live_at = |i: usize| self.flags[i] & LIVE != 0;
        let mut live = 0usize;
        let mut listed = 0usize;
        for (i, b) in self.blocks.iter().enumerate() {
            if !live_at(i) {
                if self.flags[i] != 0 {
                    return fail(format!("free slot {i} has flags {}", self.flags[i]));
                }
                continue;
            }
            live += 1;
            if b.parent != NONE {
                if !live_at(b.parent as usize) {
                    return fail(format!("block {i} has an evicted parent"));
                }
                children[b.parent as usize] += 1;
            }
            if self.slot_of(b.key) != Some(i as u32) {
                return fail(format!("block {i} missing from the key map"));
            }
        }
        for (i, b) in self.blocks.iter().enumerate() {
            if !live_at(i) {
                continue;
            }
            if b.refs != refs[i] || b.children != children[i] {
                return fail(format!("block {i}: refs/children counts are off"));
            }
            let should = b.refs == 0 && b.children == 0;
            let is = self.has(i as u32, LISTED);
            if should != is {
                return fail(format!("block {i}: listed {is} but evictable {should}"));
            }
            if is {
                listed += 1;
                if !self.evictable.contains(&self.evict_key(i as u32)) {
                    return fail(format!("block {i}: stale eviction key"));
                }
            }
        }
        if listed != self.evictable.len() {
            return fail(format!(
                "{listed} blocks listed, {} in the evictable set",
                self.evictable.len()
            ));
        }
        let window = (0..self.blocks.len())
            .filter(|&i| live_at(i) && self.flags[i] & PROTECTED == 0)
            .count();
        if window != self.window_len {
            return fail(format!("window count {} != {window}", self.window_len));
        }
        if self.tracks_protected() {
            if self.protected_len != live - window {
                return fail(format!(
                    "{} protected blocks counted, {} flagged",
                    self.protected_len,
                    live - window
                ));
            }
            if self.protected_ordered
                && (self.protected.len() != self.protected_len
                    || self.protected.iter().any(|&(last, s)| {
                        !(live_at(s as usize) && self.has(s, PROTECTED) && self.last_of(s) == last)
                    }))
            {
                return fail("protected order".into());
            }
        }
        let cached = (0..self.blocks.len())
            .filter(|&i| live_at(i) && self.blocks[i].refs == 0)
            .count();
        if cached != self.cached {
            return fail(format!("cached count {} != {cached}", self.cached));
        }
        if self.counts_keys() {
            if !self.seen.consistent() {
                return fail("seen keys table".into());
            }
            if let Some(i) = (0..self.blocks.len())
                .find(|&i| live_at(i) && self.seen.contains(self.blocks[i].key))
            {
                return fail(format!("block {i}'s key is also among the departed keys"));
            }
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
        seen.try_reserve(keys.len())
            .map_err(|e| Error::out_of_memory("a request's keys", e))?;
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
