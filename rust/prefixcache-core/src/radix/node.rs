//! The node record (56 bytes) and the side tables that keep it small.
//!
//! A node's logical times, serial and hit count are u64 values in the tree's contract;
//! the node stores them as 32-bit words: the times as offsets from the tree's time base,
//! the serial as an offset from its serial base, the hit count as is. When a value does
//! not fit (a node untouched for 2^31 calls, created 2^31 serials ago, or hit more than
//! u32::MAX times) the node is *wide*: its four values live, exactly, in a side table
//! ([`Sides`]) and its words are unused. The bases move forward (`rebase`) before an
//! offset of the current clock or serial could overflow, so a node touched within the
//! last 2^31 calls stays narrow; a rebase costs one pass over the nodes every 2^31
//! calls or node creations. A non-zero priority, and a namespace id too large for the
//! node's 26 bits, are kept in side tables too. Nothing of this shows outside: every
//! value reads back as the u64 / i64 it was set to.
//!
//! The node's flags and namespace id sit in the spare bits of its span's header word
//! ([`Span::meta`]); a childless node's evictable-heap position shares the child
//! index's words ([`Children::heap_pos`]); a listed node with children (host tier: a
//! device leaf over host-only children) has it in the tree's `heap_side` (evict.rs).

use rustc_hash::FxHashMap;

use super::children::Children;
use super::policy::PolicyKey;
use super::span::{Span, META_BITS};
use super::tree::{RadixTree, NO_PARENT, ROOT};
use crate::{Error, Result};

/// Meta bit: the stamps live in [`Sides::wide`].
const WIDE: u32 = 1;
/// Meta bit: the priority is non-zero and lives in [`Sides::priority`].
const PRIO: u32 = 2;
const NS_SHIFT: u32 = 2;
/// The namespace field of the meta bits; all ones: the id lives in [`Sides::ns`].
const NS_MASK: u32 = (1 << (META_BITS - NS_SHIFT)) - 1;

#[derive(Debug)]
pub(crate) struct Node {
    /// The tokens and their KV indices; the header's spare bits hold the flags and the
    /// namespace id.
    pub(crate) span: Span,
    /// The child index; a childless node's heap position (a listed node with children
    /// has it in the tree's `heap_side`).
    pub(crate) children: Children,
    pub(crate) parent: u32,
    /// Outstanding locks through this node. 32 bits: `inc_lock_ref` refuses to pass
    /// u32::MAX (a LockRef error, nothing changed) instead of wrapping.
    pub(crate) lock_ref: u32,
    /// Offsets from the bases, and the hit count (narrow nodes only).
    serial: u32,
    last_access: u32,
    creation: u32,
    hits: u32,
}

impl Node {
    /// A node under `parent` with no tokens, no children and zero stamps (set them with
    /// [`RadixTree::set_stamps`] once allocated).
    pub(crate) fn new(parent: u32) -> Self {
        Node {
            span: Span::default(),
            children: Children::default(),
            parent,
            lock_ref: 0,
            serial: 0,
            last_access: 0,
            creation: 0,
            hits: 0,
        }
    }
}

/// The u64 stamps of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamps {
    pub(crate) serial: u64,
    pub(crate) last_access: u64,
    pub(crate) creation: u64,
    pub(crate) hits: u64,
}

impl Stamps {
    /// A new node's stamps: created and last accessed at `now`, no hit.
    pub(crate) fn new(serial: u64, last_access: u64, creation: u64) -> Self {
        Stamps {
            serial,
            last_access,
            creation,
            hits: 0,
        }
    }
}

/// What does not fit in the nodes, by slot.
#[derive(Debug)]
pub(crate) struct Sides {
    /// The values the nodes' time and serial offsets count from.
    time_base: u64,
    serial_base: u64,
    /// The largest offset or hit count a node holds itself (u32::MAX; smaller in tests).
    narrow_max: u64,
    /// Namespace ids from this one up live in `ns` (NS_MASK; smaller in tests).
    ns_side_from: u32,
    wide: FxHashMap<u32, Stamps>,
    priority: FxHashMap<u32, i64>,
    ns: FxHashMap<u32, u32>,
}

impl Default for Sides {
    fn default() -> Self {
        Sides {
            time_base: 0,
            serial_base: 0,
            narrow_max: u64::from(u32::MAX),
            ns_side_from: NS_MASK,
            wide: FxHashMap::default(),
            priority: FxHashMap::default(),
            ns: FxHashMap::default(),
        }
    }
}

impl Sides {
    /// Empties the tables (the tree is reset); the bases become the current clock and
    /// serial, so the new nodes are narrow.
    pub(crate) fn reset(&mut self, clock: u64, next_serial: u64) {
        *self = Sides {
            time_base: clock,
            serial_base: next_serial,
            narrow_max: self.narrow_max,
            ns_side_from: self.ns_side_from,
            ..Sides::default()
        };
    }

    /// Bytes held by the tables (capacity x entry, keys included; no allocator overhead).
    pub(crate) fn bytes(&self) -> usize {
        fn table<V>(m: &FxHashMap<u32, V>) -> usize {
            // hashbrown: one (key, value) slot and one control byte a bucket.
            m.capacity() * (std::mem::size_of::<(u32, V)>() + 1)
        }
        table(&self.wide) + table(&self.priority) + table(&self.ns)
    }
}

/// Memory follows content: a table that emptied out gives back its buckets.
pub(crate) fn shrink<V>(m: &mut FxHashMap<u32, V>) {
    if m.capacity() > 64 && m.len() * 4 < m.capacity() {
        shrink_map(m, m.len() * 2);
    }
}

/// Moves `m` into a table for `cap` entries (at least its length), rather than
/// `shrink_to`, which aborts when its new table cannot be allocated: without memory the
/// table keeps its size.
pub(crate) fn shrink_map<K: std::hash::Hash + Eq, V>(m: &mut FxHashMap<K, V>, cap: usize) {
    let mut smaller = FxHashMap::default();
    if smaller.try_reserve(cap.max(m.len())).is_ok() {
        smaller.extend(m.drain());
        *m = smaller;
    }
}

/// Shrinks `v` to `cap` (at least its length) when a smaller buffer can be allocated, by
/// copying (a `Vec`'s own `shrink_to` aborts when its reallocation fails).
pub(crate) fn shrink_vec<T: Copy>(v: &mut Vec<T>, cap: usize) {
    let mut smaller = Vec::new();
    if smaller.try_reserve_exact(cap.max(v.len())).is_ok() {
        smaller.extend_from_slice(v);
        *v = smaller;
    }
}

impl RadixTree {
    /// A tree whose nodes hold offsets up to `narrow_max` and namespace ids below
    /// `ns_side_from` (the rest goes to the side tables): small limits drive the
    /// overflow paths in tests.
    #[cfg(test)]
    pub(crate) fn with_narrow_limits(
        page_size: usize,
        policy: super::policy::EvictionPolicy,
        narrow_max: u64,
        ns_side_from: u32,
    ) -> Self {
        let mut t = RadixTree::new(page_size, policy).expect("tree");
        t.sides.narrow_max = narrow_max.clamp(2, u64::from(u32::MAX));
        t.sides.ns_side_from = ns_side_from.min(NS_MASK);
        t
    }

    /// Number of wide nodes and of side-table priorities and namespaces (tests).
    #[cfg(test)]
    pub(crate) fn side_counts(&self) -> (usize, usize, usize) {
        (
            self.sides.wide.len(),
            self.sides.priority.len(),
            self.sides.ns.len(),
        )
    }

    #[inline(always)]
    fn meta(&self, slot: u32) -> u32 {
        self.nodes[slot as usize].span.meta()
    }

    /// The stamps of a wide node.
    #[cold]
    #[inline(never)]
    fn wide_stamps(&self, slot: u32) -> Stamps {
        let s = self.sides.wide.get(&slot).copied();
        debug_assert!(s.is_some(), "wide node {slot} without its stamps");
        s.unwrap_or(Stamps::new(0, 0, 0))
    }

    /// The node's stamps read against the given bases.
    #[inline(always)]
    fn stamps_with(&self, slot: u32, time_base: u64, serial_base: u64) -> Stamps {
        let n = &self.nodes[slot as usize];
        if n.span.meta() & WIDE != 0 {
            return self.wide_stamps(slot);
        }
        Stamps {
            serial: serial_base + u64::from(n.serial),
            last_access: time_base + u64::from(n.last_access),
            creation: time_base + u64::from(n.creation),
            hits: u64::from(n.hits),
        }
    }

    /// Room in the side tables for one node more, as [`RadixTree::set_stamps`],
    /// [`RadixTree::set_priority`] and [`RadixTree::set_ns`] would store it.
    pub(crate) fn reserve_sides(&mut self, st: &Stamps, priority: i64, ns: u32) -> Result<()> {
        let oom = |e| Error::out_of_memory("a radix node's side tables", e);
        let (tb, sb, max) = (
            self.sides.time_base,
            self.sides.serial_base,
            self.sides.narrow_max,
        );
        let fits = |v: u64, base: u64| v.checked_sub(base).is_some_and(|o| o <= max);
        let narrow = fits(st.serial, sb)
            && fits(st.last_access, tb)
            && fits(st.creation, tb)
            && st.hits <= max;
        if !narrow {
            self.sides.wide.try_reserve(1).map_err(oom)?;
        }
        if priority != 0 {
            self.sides.priority.try_reserve(1).map_err(oom)?;
        }
        if ns >= self.sides.ns_side_from {
            self.sides.ns.try_reserve(1).map_err(oom)?;
        }
        Ok(())
    }

    /// Whether any node's hit count can have reached the narrow limit: a node takes at
    /// most one hit per insert, and every insert ticks the clock.
    #[inline]
    pub(crate) fn hits_may_widen(&self) -> bool {
        self.clock >= self.sides.narrow_max
    }

    /// Whether one more hit moves the node's stamps to the wide table.
    pub(crate) fn hit_widens(&self, slot: u32) -> bool {
        let n = &self.nodes[slot as usize];
        n.span.meta() & WIDE == 0 && u64::from(n.hits) >= self.sides.narrow_max
    }

    /// Room in the wide-stamp table for `n` more nodes.
    pub(crate) fn reserve_wide(&mut self, n: usize) -> Result<()> {
        self.sides
            .wide
            .try_reserve(n)
            .map_err(|e| Error::out_of_memory("a radix node's stamps", e))
    }

    /// Room in the priority table for `n` more nodes.
    pub(crate) fn reserve_priorities(&mut self, n: usize) -> Result<()> {
        self.sides
            .priority
            .try_reserve(n)
            .map_err(|e| Error::out_of_memory("a radix node's priority", e))
    }

    /// The node's serial, times and hit count.
    #[inline(always)]
    pub(crate) fn stamps(&self, slot: u32) -> Stamps {
        self.stamps_with(slot, self.sides.time_base, self.sides.serial_base)
    }

    /// Stores `st` against the given bases: in the node when every value fits, else
    /// in the wide table.
    fn set_stamps_with(&mut self, slot: u32, st: Stamps, time_base: u64, serial_base: u64) {
        let max = self.sides.narrow_max;
        let off = |v: u64, base: u64| v.checked_sub(base).filter(|&o| o <= max);
        let narrow = (
            off(st.serial, serial_base),
            off(st.last_access, time_base),
            off(st.creation, time_base),
            (st.hits <= max).then_some(st.hits),
        );
        let n = &mut self.nodes[slot as usize];
        let meta = n.span.meta();
        if let (Some(s), Some(la), Some(cr), Some(h)) = narrow {
            (n.serial, n.last_access, n.creation, n.hits) =
                (s as u32, la as u32, cr as u32, h as u32);
            if meta & WIDE != 0 {
                n.span.set_meta(meta & !WIDE);
                self.sides.wide.remove(&slot);
                shrink(&mut self.sides.wide);
            }
        } else {
            (n.serial, n.last_access, n.creation, n.hits) = (0, 0, 0, 0);
            n.span.set_meta(meta | WIDE);
            // In place when the node is wide already (as for priorities).
            match self.sides.wide.get_mut(&slot) {
                Some(w) => *w = st,
                None => {
                    self.sides.wide.insert(slot, st);
                }
            }
        }
    }

    /// Stores the node's serial, times and hit count.
    pub(crate) fn set_stamps(&mut self, slot: u32, st: Stamps) {
        self.set_stamps_with(slot, st, self.sides.time_base, self.sides.serial_base);
    }

    #[inline(always)]
    pub(crate) fn serial(&self, slot: u32) -> u64 {
        self.stamps(slot).serial
    }

    /// Sets the last access time (`t` is the current clock: its offset fits unless the
    /// node is wide).
    #[inline(always)]
    pub(crate) fn set_last_access(&mut self, slot: u32, t: u64) {
        let base = self.sides.time_base;
        let max = self.sides.narrow_max;
        let n = &mut self.nodes[slot as usize];
        if n.span.meta() & WIDE == 0 && t >= base && t - base <= max {
            n.last_access = (t - base) as u32;
            return;
        }
        self.set_last_access_slow(slot, t);
    }

    #[cold]
    #[inline(never)]
    fn set_last_access_slow(&mut self, slot: u32, t: u64) {
        let mut st = self.stamps(slot);
        st.last_access = t;
        self.set_stamps(slot, st);
    }

    /// One more hit (an insert through the node).
    #[inline(always)]
    pub(crate) fn add_hit(&mut self, slot: u32) {
        let max = self.sides.narrow_max;
        let n = &mut self.nodes[slot as usize];
        if n.span.meta() & WIDE == 0 && u64::from(n.hits) < max {
            n.hits += 1;
            return;
        }
        self.add_hit_slow(slot);
    }

    #[cold]
    #[inline(never)]
    fn add_hit_slow(&mut self, slot: u32) {
        let mut st = self.stamps(slot);
        st.hits += 1;
        self.set_stamps(slot, st);
    }

    #[inline(always)]
    pub(crate) fn priority(&self, slot: u32) -> i64 {
        if self.meta(slot) & PRIO == 0 {
            return 0;
        }
        self.side_priority(slot)
    }

    #[cold]
    #[inline(never)]
    fn side_priority(&self, slot: u32) -> i64 {
        self.sides.priority.get(&slot).copied().unwrap_or(0)
    }

    /// Whether the node's priority is in the side table (a raise then allocates nothing).
    #[inline]
    pub(crate) fn has_side_priority(&self, slot: u32) -> bool {
        self.meta(slot) & PRIO != 0
    }

    /// `priority = max(priority, p)`.
    #[inline(always)]
    pub(crate) fn raise_priority(&mut self, slot: u32, p: i64) {
        if p > self.priority(slot) {
            self.set_priority(slot, p);
        }
    }

    #[inline(always)]
    pub(crate) fn set_priority(&mut self, slot: u32, p: i64) {
        if p == 0 && self.meta(slot) & PRIO == 0 {
            return;
        }
        self.set_priority_slow(slot, p);
    }

    #[inline(never)]
    fn set_priority_slow(&mut self, slot: u32, p: i64) {
        let span = &mut self.nodes[slot as usize].span;
        let meta = span.meta();
        if p == 0 {
            if meta & PRIO != 0 {
                span.set_meta(meta & !PRIO);
                self.sides.priority.remove(&slot);
                shrink(&mut self.sides.priority);
            }
        } else if let Some(v) = self.sides.priority.get_mut(&slot) {
            // In place: `insert` makes room for a new key before it looks for this one,
            // which can allocate when the table is full.
            *v = p;
        } else {
            span.set_meta(meta | PRIO);
            self.sides.priority.insert(slot, p);
        }
    }

    /// The node's namespace id.
    #[inline(always)]
    pub(crate) fn ns(&self, slot: u32) -> u32 {
        let f = (self.meta(slot) >> NS_SHIFT) & NS_MASK;
        if f != NS_MASK {
            return f;
        }
        self.side_ns(slot)
    }

    #[cold]
    #[inline(never)]
    fn side_ns(&self, slot: u32) -> u32 {
        self.sides.ns.get(&slot).copied().unwrap_or(0)
    }

    #[inline(always)]
    pub(crate) fn set_ns(&mut self, slot: u32, ns: u32) {
        let from = self.sides.ns_side_from;
        let span = &mut self.nodes[slot as usize].span;
        if span.meta() & (NS_MASK << NS_SHIFT) == 0 && ns < from {
            // From "no namespace" to one that fits (the common case).
            span.set_meta(span.meta() | (ns << NS_SHIFT));
            return;
        }
        self.set_ns_slow(slot, ns);
    }

    #[inline(never)]
    fn set_ns_slow(&mut self, slot: u32, ns: u32) {
        let span = &mut self.nodes[slot as usize].span;
        let meta = span.meta() & !(NS_MASK << NS_SHIFT);
        if (span.meta() >> NS_SHIFT) & NS_MASK == NS_MASK {
            self.sides.ns.remove(&slot);
            shrink(&mut self.sides.ns);
        }
        if ns < self.sides.ns_side_from {
            span.set_meta(meta | (ns << NS_SHIFT));
        } else {
            span.set_meta(meta | (NS_MASK << NS_SHIFT));
            self.sides.ns.insert(slot, ns);
        }
    }

    /// Drops what the side tables hold for `slot` (being freed) and clears its flags.
    #[inline]
    pub(crate) fn forget_sides(&mut self, slot: u32) {
        let span = &mut self.nodes[slot as usize].span;
        let m = span.meta();
        if m & (WIDE | PRIO) == 0 && (m >> NS_SHIFT) & NS_MASK != NS_MASK {
            span.set_meta(0);
            return;
        }
        self.set_priority(slot, 0);
        self.set_ns(slot, 0);
        let span = &mut self.nodes[slot as usize].span;
        if span.meta() & WIDE != 0 {
            span.set_meta(span.meta() & !WIDE);
            self.sides.wide.remove(&slot);
            shrink(&mut self.sides.wide);
        }
    }

    /// Bytes the tree holds for its nodes: the node arena (its capacity), the tokens'
    /// heap buffers, the evictable heap, the free-slot list, the large child indexes and
    /// the side tables; counted as capacity x element size, without the allocator's own
    /// overhead or the namespaces' strings. A structural figure (deterministic), next to
    /// the resident-memory one of `benches/bench_scale.py`.
    pub fn memory_bytes(&self) -> usize {
        let spans: usize = (0..self.nodes.len())
            .map(|i| self.nodes[i].span.heap_bytes())
            .sum();
        self.nodes.bytes()
            + spans
            + 4 * (self.evictable.capacity() + self.free_slots.capacity())
            + self.indexes.bytes()
            + self.sides.bytes()
            + self.heap_side.capacity() * (std::mem::size_of::<(u32, u32)>() + 1)
    }

    /// The node's place in the eviction order (unique: it ends with the serial).
    #[inline(always)]
    pub(crate) fn policy_key(&self, slot: u32) -> PolicyKey {
        let n = &self.nodes[slot as usize];
        if n.span.meta() & (WIDE | PRIO) == 0 {
            let tb = self.sides.time_base;
            return self.policy.key(
                tb + u64::from(n.last_access),
                tb + u64::from(n.creation),
                u64::from(n.hits),
                0,
                self.sides.serial_base + u64::from(n.serial),
            );
        }
        self.policy_key_slow(slot)
    }

    #[cold]
    #[inline(never)]
    fn policy_key_slow(&self, slot: u32) -> PolicyKey {
        let st = self.stamps(slot);
        self.policy.key(
            st.last_access,
            st.creation,
            st.hits,
            self.priority(slot),
            st.serial,
        )
    }

    /// Moves the bases forward when the clock or the next serial is about to leave the
    /// nodes' range: both end half a range behind the current values; every live node is
    /// re-stored against them (narrow again if it fits, wide if not). Called by the clock
    /// and the serial counter before handing out a value; one pass over the nodes every
    /// `narrow_max / 2` calls or serials.
    #[inline(always)]
    pub(crate) fn rebase_if_needed(&mut self, clock: u64, next_serial: u64) {
        let s = &self.sides;
        if clock - s.time_base > s.narrow_max || next_serial - s.serial_base > s.narrow_max {
            self.rebase(clock, next_serial);
        }
    }

    #[cold]
    #[inline(never)]
    fn rebase(&mut self, clock: u64, next_serial: u64) {
        let s = &self.sides;
        let half = s.narrow_max / 2;
        let (old_tb, old_sb) = (s.time_base, s.serial_base);
        let new_tb = old_tb.max(clock.saturating_sub(half));
        let new_sb = old_sb.max(next_serial.saturating_sub(half));
        for slot in 0..self.nodes.len() as u32 {
            if slot != ROOT && self.nodes[slot as usize].parent == NO_PARENT {
                continue; // a free slot
            }
            let st = self.stamps_with(slot, old_tb, old_sb);
            self.set_stamps_with(slot, st, new_tb, new_sb);
        }
        self.sides.time_base = new_tb;
        self.sides.serial_base = new_sb;
    }
}

#[cfg(test)]
mod tests {
    use super::super::policy::EvictionPolicy;
    use super::super::tree::{Namespace, NodeRef, RadixTree};

    /// xorshift64*: a fixed stream, no dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// The documented per-node figure (docs/BENCHMARKS.md): a branchy tree (random
    /// 12-token keys over a 3-token alphabet, as `bench_scale.py branchy`) holds at most
    /// 64 bytes a node, and long nodes at most 8.5 bytes a cached token, counted by
    /// `memory_bytes`.
    #[test]
    fn memory_per_node_and_per_token() {
        let ns = Namespace::default();
        let mut t = RadixTree::new(1, EvictionPolicy::Lru).expect("tree");
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..200_000 {
            let key: Vec<u32> = (0..12).map(|_| rng.below(3) as u32).collect();
            t.insert(&key, None, &ns, 0, 0).expect("insert");
        }
        let per_node = t.memory_bytes() as f64 / t.num_nodes() as f64;
        let per_token = t.memory_bytes() as f64 / t.total_size() as f64;
        println!(
            "branchy: {} nodes, {:.2} tokens a node, {per_node:.1} B/node, {per_token:.1} B/token",
            t.num_nodes(),
            t.total_size() as f64 / t.num_nodes() as f64
        );
        assert!(per_node <= 64.0, "{per_node} bytes per node");

        let mut t = RadixTree::new(1, EvictionPolicy::Lru).expect("tree");
        for i in 0..2000u32 {
            let key: Vec<u32> = (0..1000).map(|_| rng.below(32_000) as u32).collect();
            let values: Vec<i64> = (0..1000).map(|j| i64::from(i * 1000 + j)).collect();
            t.insert(&key, Some(&values), &ns, 0, 0).expect("insert");
        }
        let per_token = t.memory_bytes() as f64 / t.total_size() as f64;
        println!("long nodes: {per_token:.3} B/token");
        assert!(per_token <= 8.5, "{per_token} bytes per token");
    }

    fn same(a: NodeRef, b: NodeRef) -> bool {
        a.slot == b.slot && a.serial == b.serial
    }

    /// Every overflow path (wide stamps, rebases every few calls, side-table priorities
    /// and namespaces) against the plain layout: two trees, one with offsets limited to
    /// 3 and every namespace in the side table, run the same random calls and must agree
    /// on every outcome, handle, dump and eviction, under every policy.
    #[test]
    fn narrow_limits_change_nothing() {
        let names = [
            Namespace::default(),
            Namespace::new(Some("a"), None),
            Namespace::new(None, Some("s")),
        ];
        for policy in EvictionPolicy::ALL {
            for page in [1usize, 2] {
                let mut a = RadixTree::new(page, policy).expect("tree");
                let mut b = RadixTree::with_narrow_limits(page, policy, 3, 1);
                let mut rng = Rng(0x1234_5678 + page as u64);
                let mut locked: Vec<(NodeRef, NodeRef)> = Vec::new();
                let mut saw_wide = false;
                for step in 0..800 {
                    let len = 1 + rng.below(8) as usize;
                    let key: Vec<u32> = (0..len).map(|_| rng.below(3) as u32).collect();
                    let ns = &names[rng.below(3) as usize];
                    match rng.below(10) {
                        0..=3 => {
                            let prio = [0, 0, 1, -3, i64::MAX, i64::MIN][rng.below(6) as usize];
                            let inserted = rng.below(4) as usize;
                            let x = a.insert(&key, None, ns, prio, inserted).expect("a");
                            let y = b.insert(&key, None, ns, prio, inserted).expect("b");
                            assert_eq!(x.prefix_len, y.prefix_len);
                            assert!(same(x.node, y.node), "{policy:?} {page} {step} {x:?} {y:?}");
                            if rng.below(3) == 0 {
                                a.inc_lock_ref(x.node).expect("lock a");
                                b.inc_lock_ref(y.node).expect("lock b");
                                locked.push((x.node, y.node));
                            }
                        }
                        4..=6 => {
                            let x = a.match_prefix(&key, ns).unwrap();
                            let y = b.match_prefix(&key, ns).unwrap();
                            assert_eq!(x.length, y.length);
                            assert!(same(x.node, y.node), "{policy:?} {page} {step} {x:?} {y:?}");
                        }
                        7 if !locked.is_empty() => {
                            let (x, y) =
                                locked.swap_remove(rng.below(locked.len() as u64) as usize);
                            assert_eq!(
                                a.dec_lock_ref(x).expect("a"),
                                b.dec_lock_ref(y).expect("b")
                            );
                        }
                        8 => {
                            let n = rng.below(6) as i64;
                            assert_eq!(a.evict(n).expect("a"), b.evict(n).expect("b"));
                        }
                        _ if step % 300 == 299 => {
                            a.reset();
                            b.reset();
                            locked.clear();
                        }
                        _ => {}
                    }
                    saw_wide |= b.side_counts().0 > 0;
                    assert_eq!(a.clock(), b.clock());
                    assert_eq!(a.dump(), b.dump(), "{policy:?} page {page} step {step}");
                    for &(x, y) in &locked {
                        assert_eq!(a.node_info(x).expect("a"), b.node_info(y).expect("b"));
                    }
                    a.check_invariants().expect("a");
                    b.check_invariants().expect("b");
                }
                assert!(saw_wide, "the wide path was not exercised");
                for (x, y) in locked {
                    a.dec_lock_ref(x).expect("a");
                    b.dec_lock_ref(y).expect("b");
                }
                assert_eq!(a.evict(1 << 40).expect("a"), b.evict(1 << 40).expect("b"));
                // Only the root may be left in the tables.
                let (w, p, n) = b.side_counts();
                assert!(w <= 1 && p <= 1 && n == 0, "freed nodes left side entries");
            }
        }
    }

    /// A hit count past u32::MAX moves the node to the wide table and keeps counting.
    #[test]
    fn hit_count_past_32_bits() {
        let ns = Namespace::default();
        let mut t = RadixTree::new(1, EvictionPolicy::Lfu).expect("tree");
        let top = t.insert(&[1, 2, 3], None, &ns, 0, 0).expect("insert").node;
        let slot = t.resolve(top).expect("live");
        let mut st = t.stamps(slot);
        st.hits = u64::from(u32::MAX) - 1;
        t.set_stamps(slot, st);
        for _ in 0..3 {
            t.insert(&[1, 2, 3], None, &ns, 0, 0).expect("insert");
        }
        assert_eq!(
            t.node_info(top).expect("info").hit_count,
            u64::from(u32::MAX) + 2
        );
        assert_eq!(t.side_counts().0, 1);
        // The wide node still orders by its true count: a fresh leaf (1 hit) goes first.
        t.insert(&[7], None, &ns, 0, 0).expect("insert");
        assert_eq!(t.evict(1).expect("evict"), vec![7]);
        assert_eq!(t.evict(1).expect("evict"), vec![1, 2, 3]);
        t.check_invariants().expect("invariants");
        assert_eq!(t.side_counts(), (0, 0, 0));
    }

    /// The clock and the serial counter past 2^32: bases move, nodes untouched for
    /// 2^31 calls become wide, every value reads back exactly and handles stay valid.
    #[test]
    fn clock_and_serials_past_32_bits() {
        let ns = Namespace::default();
        for policy in EvictionPolicy::ALL {
            let mut t = RadixTree::new(1, policy).expect("tree");
            let old = t.insert(&[1, 2], None, &ns, 5, 0).expect("insert").node;
            let old_info = t.node_info(old).expect("info");
            t.clock = u64::from(u32::MAX) - 1;
            t.next_serial = u64::from(u32::MAX) - 1;
            let mut fresh = Vec::new();
            for i in 0..6u32 {
                fresh.push(t.insert(&[3, i], None, &ns, 0, 0).expect("insert").node);
            }
            assert!(t.clock() > u64::from(u32::MAX));
            assert_eq!(t.node_info(old).expect("info"), old_info);
            assert!(t.side_counts().0 >= 1, "the old node is wide");
            for (i, &h) in fresh.iter().enumerate() {
                assert!(t.resolve(h).is_ok());
                let info = t.node_info(h).expect("info");
                assert_eq!(info.creation_time, u64::from(u32::MAX) + i as u64);
            }
            assert!(fresh.iter().any(|h| h.serial > u64::from(u32::MAX)));
            // Touching the old node: its last access is recent again, its creation old.
            t.match_prefix(&[1, 2], &ns).unwrap();
            let info = t.node_info(old).expect("info");
            assert_eq!(info.last_access_time, t.clock());
            assert_eq!(info.creation_time, old_info.creation_time);
            t.check_invariants().expect("invariants");
            // Eviction order is the policy's over the true values.
            let order: Vec<i64> = t.evict(1 << 40).expect("evict");
            let expect: Vec<i64> = match policy {
                EvictionPolicy::Lru | EvictionPolicy::Priority => {
                    vec![0, 1, 2, 3, 4, 5, 3, 1, 2]
                }
                EvictionPolicy::Lfu | EvictionPolicy::Slru => vec![0, 1, 2, 3, 4, 5, 1, 2, 3],
                EvictionPolicy::Fifo => vec![1, 2, 0, 1, 2, 3, 4, 5, 3],
                EvictionPolicy::Mru => vec![1, 2, 5, 4, 3, 2, 1, 0, 3],
                EvictionPolicy::Filo => vec![5, 4, 3, 2, 1, 0, 3, 1, 2],
            };
            assert_eq!(order, expect, "{policy:?}");
            // Only the root is left: wide, with the priority 5 it was raised to.
            assert_eq!(t.side_counts(), (1, 1, 0));
            t.reset();
            assert_eq!(
                t.side_counts(),
                (0, 1, 0),
                "the new root's priority (i64::MIN)"
            );
        }
    }
}
