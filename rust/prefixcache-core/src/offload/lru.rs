//! vLLM 0.33's `LRUCachePolicy` (`vllm/v1/kv_offload/cpu/policies/lru.py`).
//!
//! Every stored chunk has a rank; the idle chunk (ref count 0) of smallest rank is
//! evicted first (ties by key). A rank is `(r, -position)` for a key a request accessed
//! at that end token (all keys of one request share r, so a request's tails go before
//! its heads), or `(r, 0)` with r fresh from the global counter (insert without a
//! position, touch, request finish).
//!
//! vLLM keeps the idle chunks in a lazily invalidated min-heap of `(rank, key)`. Here
//! every stored chunk (idle or not) sits in one doubly-linked list in `(rank, key)`
//! order, and eviction walks it from the head past the chunks that are busy, being
//! stored or protected; the order is the same, every rank change is O(1):
//! - a fresh rank is the largest so far: the chunk goes to the tail;
//! - a request's rank r is the largest when the request gets it: a sentinel node is
//!   appended for it then, and the keys later ranked `(r, -position)` (its group) are
//!   linked after that sentinel in `(-position, key)` order, before every later rank.
//!   They arrive in block order (each goes first in the group) or in reverse (each goes
//!   last), both O(1); any other order walks the group. The sentinel goes when the
//!   request has finished (its keys then take fresh ranks) and its group is empty.
//! - Runs: a finish freshens the request's keys last position first, the order of its
//!   group, so the group's members move to the tail as one run
//!   ([`Lru::fresh_in_order`]); a later request that reaches them in block order finds
//!   them linked in reverse and moves them to the front of its group as one run
//!   ([`Lru::on_access`]). Both leave the list, ranks and flags exactly as the
//!   chunk-by-chunk moves would (a unit test runs the two side by side).

use rustc_hash::FxHashMap;

use super::chunks::{Links, LinksRead, List, Rank, Slot, GROUPED, NIL, PROTECTED, SENTINEL_BASE};

#[derive(Debug, Clone, Copy)]
struct Sentinel {
    prev: u32,
    next: u32,
    /// The request rank.
    r: u64,
    /// The group's last chunk (NIL: empty group).
    last: u32,
    /// The request still holds the rank (more keys may join).
    open: bool,
}

/// Chunk slots and sentinels as one node space.
struct Nodes<'a> {
    slots: &'a mut [Slot],
    sents: &'a mut [Sentinel],
}

/// The same, read only.
struct NodesRef<'a> {
    slots: &'a [Slot],
    sents: &'a [Sentinel],
}

fn prev_of(slots: &[Slot], sents: &[Sentinel], n: u32) -> u32 {
    if n >= SENTINEL_BASE {
        sents[(n - SENTINEL_BASE) as usize].prev
    } else {
        slots[n as usize].prev
    }
}

fn next_of(slots: &[Slot], sents: &[Sentinel], n: u32) -> u32 {
    if n >= SENTINEL_BASE {
        sents[(n - SENTINEL_BASE) as usize].next
    } else {
        slots[n as usize].next
    }
}

impl LinksRead for NodesRef<'_> {
    fn prev(&self, n: u32) -> u32 {
        prev_of(self.slots, self.sents, n)
    }
    fn next(&self, n: u32) -> u32 {
        next_of(self.slots, self.sents, n)
    }
}

impl LinksRead for Nodes<'_> {
    fn prev(&self, n: u32) -> u32 {
        prev_of(self.slots, self.sents, n)
    }
    fn next(&self, n: u32) -> u32 {
        next_of(self.slots, self.sents, n)
    }
}

impl Links for Nodes<'_> {
    fn set_prev(&mut self, n: u32, v: u32) {
        if n >= SENTINEL_BASE {
            self.sents[(n - SENTINEL_BASE) as usize].prev = v;
        } else {
            self.slots[n as usize].prev = v;
        }
    }
    fn set_next(&mut self, n: u32, v: u32) {
        if n >= SENTINEL_BASE {
            self.sents[(n - SENTINEL_BASE) as usize].next = v;
        } else {
            self.slots[n as usize].next = v;
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Lru {
    list: List,
    sents: Vec<Sentinel>,
    free_sents: Vec<u32>,
    /// Request rank -> its sentinel (index into `sents`).
    groups: FxHashMap<u64, u32>,
    counter: u64,
    /// Tests: every rank change chunk by chunk (no runs), the reference for the runs.
    #[cfg(test)]
    pub(crate) per_chunk: bool,
    /// Tests: the runs moved by `fresh_in_order`, `on_access` and `insert_all`, and the
    /// evictions that left as one run (`remove_evicted`).
    #[cfg(test)]
    pub(crate) runs: [usize; 4],
}

/// `-(position)` as vLLM's rank holds it.
fn neg(pos: u64) -> i64 {
    (pos as i64).wrapping_neg()
}

impl Lru {
    pub fn new() -> Self {
        Lru::default()
    }

    /// Whether rank changes may move runs of chunks (always, but in the tests' reference).
    fn runs(&self) -> bool {
        #[cfg(test)]
        if self.per_chunk {
            return false;
        }
        true
    }

    /// Room for a new request group (a sentinel and its map entry), and for filing every
    /// sentinel as free, so that no rank change allocates. Called before a call changes
    /// anything; nothing changes on failure.
    pub fn try_reserve_group(&mut self) -> crate::Result<()> {
        let oom = |e| crate::Error::out_of_memory("the LRU's request groups", e);
        self.sents.try_reserve(1).map_err(oom)?;
        let all = self.sents.len() + 1;
        self.free_sents
            .try_reserve(all.saturating_sub(self.free_sents.len()))
            .map_err(oom)?;
        self.groups.try_reserve(1).map_err(oom)
    }

    /// The request's rank, drawn from the counter on its first use (a new group at the
    /// tail).
    pub fn request_rank(&mut self, slots: &mut [Slot], lru_rank: &mut Option<u64>) -> u64 {
        if let Some(r) = *lru_rank {
            return r;
        }
        self.counter += 1;
        let r = self.counter;
        *lru_rank = Some(r);
        let s = Sentinel {
            prev: NIL,
            next: NIL,
            r,
            last: NIL,
            open: true,
        };
        let i = match self.free_sents.pop() {
            Some(i) => {
                self.sents[i as usize] = s;
                i
            }
            None => {
                self.sents.push(s);
                (self.sents.len() - 1) as u32
            }
        };
        self.groups.insert(r, i);
        let mut nodes = Nodes {
            slots,
            sents: &mut self.sents,
        };
        self.list.push_back(&mut nodes, SENTINEL_BASE + i);
        r
    }

    fn drop_sentinel(&mut self, slots: &mut [Slot], i: u32) {
        let r = self.sents[i as usize].r;
        let mut nodes = Nodes {
            slots,
            sents: &mut self.sents,
        };
        self.list.unlink(&mut nodes, SENTINEL_BASE + i);
        self.groups.remove(&r);
        self.free_sents.push(i);
    }

    /// Unlinks chunk `id` (leaving its group, if any).
    pub fn remove(&mut self, slots: &mut [Slot], id: u32) {
        let s = slots[id as usize];
        if s.flags & GROUPED != 0 {
            slots[id as usize].flags &= !GROUPED;
            if let Some(&g) = self.groups.get(&s.rank.0) {
                let sent = &mut self.sents[g as usize];
                if sent.last == id {
                    sent.last = if s.prev == SENTINEL_BASE + g {
                        NIL
                    } else {
                        s.prev
                    };
                }
                if sent.last == NIL && !sent.open {
                    let mut nodes = Nodes {
                        slots,
                        sents: &mut self.sents,
                    };
                    self.list.unlink(&mut nodes, id);
                    self.drop_sentinel(slots, g);
                    return;
                }
            }
        }
        let mut nodes = Nodes {
            slots,
            sents: &mut self.sents,
        };
        self.list.unlink(&mut nodes, id);
    }

    /// Unlinks the chunks `evict` picked, in its order. When they are the list's first
    /// chunks (none skipped, no group reached: the usual eviction), they leave as one run;
    /// else one by one, as `remove` does.
    pub fn remove_evicted(&mut self, slots: &mut [Slot], picked: &[u32]) {
        let Some(&last) = picked.last() else {
            return;
        };
        if self.runs() && self.is_front(slots, picked) {
            let next = slots[last as usize].next;
            self.list.head = next;
            if next == NIL {
                self.list.tail = NIL;
            } else {
                let mut nodes = Nodes {
                    slots,
                    sents: &mut self.sents,
                };
                nodes.set_prev(next, NIL);
            }
            self.list.len -= picked.len();
            for &id in picked {
                let s = &mut slots[id as usize];
                s.prev = NIL;
                s.next = NIL;
            }
            #[cfg(test)]
            {
                self.runs[3] += 1;
            }
            return;
        }
        for &id in picked {
            self.remove(slots, id);
        }
    }

    /// Whether `picked` are the list's first chunks, in order, none in a group.
    fn is_front(&self, slots: &[Slot], picked: &[u32]) -> bool {
        let mut at = self.list.head;
        for &id in picked {
            // A sentinel's node id is never a chunk id.
            if at != id || slots[id as usize].flags & GROUPED != 0 {
                return false;
            }
            at = slots[id as usize].next;
        }
        true
    }

    /// Links unlinked chunk `id` at rank `rank`.
    fn link(&mut self, slots: &mut [Slot], id: u32, rank: Rank) {
        slots[id as usize].rank = rank;
        let group = self.groups.get(&rank.0).copied();
        let Some(g) = group else {
            // A fresh rank: the largest so far.
            slots[id as usize].flags &= !GROUPED;
            let mut nodes = Nodes {
                slots,
                sents: &mut self.sents,
            };
            self.list.push_back(&mut nodes, id);
            return;
        };
        slots[id as usize].flags |= GROUPED;
        let sent_node = SENTINEL_BASE + g;
        let last = self.sents[g as usize].last;
        let mut nodes = Nodes {
            slots,
            sents: &mut self.sents,
        };
        if last == NIL {
            self.list.insert_after(&mut nodes, sent_node, id);
            nodes.sents[g as usize].last = id;
            return;
        }
        let first = nodes.next(sent_node);
        // `(rank, key)` of chunk `a` against chunk `b`'s (the key compared only on equal
        // ranks, which the positions of one request's distinct keys rarely give).
        let cmp = |slots: &[Slot], a: u32, b: u32| {
            let (a, b) = (&slots[a as usize], &slots[b as usize]);
            a.rank.cmp(&b.rank).then_with(|| a.key.cmp(&b.key))
        };
        if cmp(nodes.slots, id, first).is_lt() {
            self.list.insert_after(&mut nodes, sent_node, id);
        } else if cmp(nodes.slots, id, last).is_gt() {
            self.list.insert_after(&mut nodes, last, id);
            nodes.sents[g as usize].last = id;
        } else {
            // Between the first and the last member: walk (the last is larger, so the
            // walk stops inside the group).
            let mut at = nodes.next(first);
            while at != NIL && at < SENTINEL_BASE && cmp(nodes.slots, at, id).is_lt() {
                at = nodes.next(at);
            }
            match at {
                NIL => self.list.push_back(&mut nodes, id),
                at => self.list.insert_before(&mut nodes, at, id),
            }
        }
    }

    /// A fresh counter rank for chunk `id` (`_update_recency` of one key).
    pub fn fresh(&mut self, slots: &mut [Slot], id: u32) {
        self.counter += 1;
        let r = (self.counter, 0);
        self.remove(slots, id);
        self.push_fresh(slots, id, r);
    }

    /// `fresh` of each of `ids` (distinct stored chunks) in turn: a request's finish,
    /// `r` its rank. The finish freshens the request's keys last position first, which
    /// is the order of its open group (`(r, -position)`), so a stretch of `ids` that
    /// starts at the group's first member and follows its links moves to the tail as
    /// one run, with the ranks and links the chunk-by-chunk calls would give it.
    pub fn fresh_in_order(&mut self, slots: &mut [Slot], ids: &[u32], r: Option<u64>) {
        let group = r
            .and_then(|r| self.groups.get(&r).copied())
            .filter(|&g| self.sents[g as usize].open && self.runs());
        let mut i = 0;
        while i < ids.len() {
            let n = group.map_or(0, |g| self.head_run(slots, g, &ids[i..]));
            if n == 0 {
                self.fresh(slots, ids[i]);
                i += 1;
                continue;
            }
            let (g, run) = (group.unwrap_or(0), &ids[i..i + n]);
            let (a, b) = (run[0], run[n - 1]);
            let sent = &mut self.sents[g as usize];
            if sent.last == b {
                sent.last = NIL;
            }
            let mut nodes = Nodes {
                slots,
                sents: &mut self.sents,
            };
            self.list.move_run_after(&mut nodes, a, b, NIL);
            #[cfg(test)]
            {
                self.runs[0] += 1;
            }
            for &id in run {
                self.counter += 1;
                let s = &mut slots[id as usize];
                s.rank = (self.counter, 0);
                s.flags &= !GROUPED;
            }
            i += n;
        }
    }

    /// How many of `ids` are group `g`'s first members in its order (0: `ids[0]` is not
    /// its first member).
    fn head_run(&self, slots: &[Slot], g: u32, ids: &[u32]) -> usize {
        let sent = &self.sents[g as usize];
        if sent.last == NIL || ids.first() != Some(&sent.next) {
            return 0;
        }
        let mut n = 1;
        let mut at = sent.next;
        while at != sent.last && n < ids.len() && slots[at as usize].next == ids[n] {
            at = ids[n];
            n += 1;
        }
        n
    }

    /// Links unlinked chunk `id` at fresh rank `rank` (just drawn from the counter, so
    /// the largest and no request's group rank): at the tail.
    fn push_fresh(&mut self, slots: &mut [Slot], id: u32, rank: Rank) {
        let s = &mut slots[id as usize];
        s.rank = rank;
        s.flags &= !GROUPED;
        let mut nodes = Nodes {
            slots,
            sents: &mut self.sents,
        };
        self.list.push_back(&mut nodes, id);
    }

    /// A newly stored chunk (unlinked): ranked `(request rank, -position)` when the
    /// request gave its key a position, else fresh.
    pub fn insert(
        &mut self,
        slots: &mut [Slot],
        id: u32,
        position: Option<u64>,
        lru_rank: &mut Option<u64>,
    ) {
        let rank = match position {
            Some(pos) => (self.request_rank(slots, lru_rank), neg(pos)),
            None => {
                self.counter += 1;
                return self.push_fresh(slots, id, (self.counter, 0));
            }
        };
        self.link(slots, id, rank);
    }

    /// `insert` of each of `items` (newly stored chunks, unlinked, with their positions)
    /// in turn: a store. A store offers a request's keys in block order, so their ranks
    /// `(r, -position)` fall one after another and each goes first in the request's
    /// group: once one is linked first, the following ones that rank below it are
    /// linked in front of it as one run, with the ranks, flags and links the chunk by
    /// chunk inserts would give them.
    pub fn insert_all(
        &mut self,
        slots: &mut [Slot],
        items: &[(u32, Option<u64>)],
        lru_rank: &mut Option<u64>,
    ) {
        let mut i = 0;
        while i < items.len() {
            let (id, pos) = items[i];
            self.insert(slots, id, pos, lru_rank);
            i += 1;
            let (Some(pos), Some(r)) = (pos, *lru_rank) else {
                continue;
            };
            let Some(&g) = self.groups.get(&r).filter(|_| self.runs()) else {
                continue;
            };
            let sent_node = SENTINEL_BASE + g;
            if self.sents[g as usize].next != id {
                continue;
            }
            // items[i..i + n] each rank below the one before: each would go first.
            let mut prev = neg(pos);
            let mut n = 0;
            while let Some(&(_, Some(p))) = items.get(i + n) {
                if neg(p) >= prev {
                    break;
                }
                prev = neg(p);
                n += 1;
            }
            if n == 0 {
                continue;
            }
            let mut ahead = id;
            for &(next, p) in &items[i..i + n] {
                let s = &mut slots[next as usize];
                // Every one of them has a position (the scan above).
                s.rank = (r, neg(p.unwrap_or_default()));
                s.flags |= GROUPED;
                s.next = ahead;
                slots[ahead as usize].prev = next;
                ahead = next;
            }
            slots[ahead as usize].prev = sent_node;
            self.sents[g as usize].next = ahead;
            self.list.len += n;
            #[cfg(test)]
            {
                self.runs[2] += 1;
            }
            i += n;
        }
    }

    /// `on_request_access` for the keys a request sees first (stored ones, with their
    /// positions): each takes the request's rank at its position when that raises it.
    pub fn on_access(
        &mut self,
        slots: &mut [Slot],
        keys: &[(u32, u64)],
        lru_rank: &mut Option<u64>,
    ) {
        let r = self.request_rank(slots, lru_rank);
        let group = self.groups.get(&r).copied().filter(|_| self.runs());
        let mut i = 0;
        while i < keys.len() {
            let n = group.map_or(0, |g| self.front_run(slots, g, r, &keys[i..]));
            if n == 0 {
                let (id, pos) = keys[i];
                let rank = (r, neg(pos));
                if slots[id as usize].rank < rank {
                    self.remove(slots, id);
                    self.link(slots, id, rank);
                }
                i += 1;
                continue;
            }
            // keys[i..i + n] lie in the list in reverse, each linked before the one
            // ahead of it: one run, moved to the front of the group.
            let (g, run) = (group.unwrap_or(0), &keys[i..i + n]);
            let (a, b) = (run[n - 1].0, run[0].0);
            for &(id, pos) in run {
                let s = &mut slots[id as usize];
                s.rank = (r, neg(pos));
                s.flags |= GROUPED;
            }
            let sent = &mut self.sents[g as usize];
            if sent.last == NIL {
                sent.last = b;
            }
            let mut nodes = Nodes {
                slots,
                sents: &mut self.sents,
            };
            self.list
                .move_run_after(&mut nodes, a, b, SENTINEL_BASE + g);
            #[cfg(test)]
            {
                self.runs[1] += 1;
            }
            i += n;
        }
    }

    /// How many of `keys` (from the first) the per-key `on_access` would each move from
    /// outside any group to the front of request rank `r`'s group, while each lies in
    /// the list right before the one ahead of it (the order a finish left them in):
    /// 0 when the first would not. Fewer than two is no run. `g`: the group of `r`.
    fn front_run(&self, slots: &[Slot], g: u32, r: u64, keys: &[(u32, u64)]) -> usize {
        let sent = &self.sents[g as usize];
        let takes = |id: u32, rank: Rank| {
            let s = &slots[id as usize];
            s.flags & GROUPED == 0 && s.rank < rank
        };
        let (id, pos) = keys[0];
        let mut prev = (r, neg(pos));
        if !takes(id, prev) {
            return 0;
        }
        if sent.last != NIL {
            let first = &slots[sent.next as usize];
            if (prev, slots[id as usize].key) >= (first.rank, first.key) {
                return 0;
            }
        }
        let mut n = 1;
        while n < keys.len() {
            let (id, pos) = keys[n];
            let (ahead, rank) = (keys[n - 1].0, (r, neg(pos)));
            let s = &slots[id as usize];
            if s.next != ahead
                || !takes(id, rank)
                || (rank, s.key) >= (prev, slots[ahead as usize].key)
            {
                break;
            }
            prev = rank;
            n += 1;
        }
        if n < 2 {
            0
        } else {
            n
        }
    }

    /// The request no longer holds rank `r` (it finished): its group goes once empty.
    pub fn close(&mut self, slots: &mut [Slot], r: Option<u64>) {
        let Some(r) = r else {
            return;
        };
        let Some(&g) = self.groups.get(&r) else {
            return;
        };
        self.sents[g as usize].open = false;
        if self.sents[g as usize].last == NIL {
            self.drop_sentinel(slots, g);
        }
    }

    /// The `n` idle unprotected chunks of smallest rank, smallest first, into `picked`
    /// (cleared first; the caller removes them); false (nothing changed) when there are
    /// fewer.
    pub fn evict(&self, slots: &[Slot], n: usize, picked: &mut Vec<u32>) -> bool {
        picked.clear();
        let mut at = self.list.head;
        while picked.len() < n && at != NIL {
            if at >= SENTINEL_BASE {
                at = self.sents[(at - SENTINEL_BASE) as usize].next;
                continue;
            }
            let s = &slots[at as usize];
            if s.ref_cnt == 0 && s.flags & PROTECTED == 0 {
                picked.push(at);
            }
            at = s.next;
        }
        picked.len() == n
    }

    pub fn clear(&mut self) {
        *self = Lru::default();
    }

    /// The state but for `per_chunk`, as text.
    pub(crate) fn dump(&self) -> String {
        let mut groups: Vec<_> = self.groups.iter().collect();
        groups.sort();
        format!(
            "{:?} {:?} {:?} {groups:?} {}",
            self.list, self.sents, self.free_sents, self.counter
        )
    }

    /// The list holds every stored chunk once, in strictly increasing `(rank, key)`
    /// order, each group right after its sentinel and ending at its `last`.
    pub fn check(&self, slots: &[Slot], num_stored: usize) -> Result<(), String> {
        let nodes = NodesRef {
            slots,
            sents: &self.sents,
        };
        let limit = num_stored + self.sents.len() + 1;
        let Some(order) = self.list.walk(&nodes, limit) else {
            return Err("lru: the list's links are inconsistent".into());
        };
        if self.groups.len() + self.free_sents.len() != self.sents.len() {
            return Err("lru: sentinels lost or doubled".into());
        }
        let mut prev: Option<(Rank, crate::hash::BlockHash)> = None;
        let mut floor = 0u64; // the largest sentinel rank passed
                              // The group being read: (r, sentinel, its last member reached).
        let mut cur: Option<(u64, u32, bool)> = None;
        let mut chunks = 0usize;
        let mut sentinels = 0usize;
        let unfinished = |cur: Option<(u64, u32, bool)>| {
            cur.is_some_and(|(_, g, done)| !done && self.sents[g as usize].last != NIL)
        };
        for n in order {
            if n >= SENTINEL_BASE {
                let i = n - SENTINEL_BASE;
                let s = &self.sents[i as usize];
                sentinels += 1;
                if self.groups.get(&s.r) != Some(&i) || prev.is_some_and(|(p, _)| p.0 >= s.r) {
                    return Err("lru: a group sentinel is out of place".into());
                }
                if !s.open && s.last == NIL {
                    return Err("lru: a finished request's empty group was kept".into());
                }
                if unfinished(cur) {
                    return Err("lru: a group's last member is wrong".into());
                }
                floor = s.r;
                cur = Some((s.r, i, s.last == NIL));
                continue;
            }
            let s = &slots[n as usize];
            if !s.live() {
                return Err("lru: a free slot is listed".into());
            }
            chunks += 1;
            let me = (s.rank, s.key);
            if prev.is_some_and(|p| p >= me) || s.rank.0 < floor {
                return Err("lru: the list is not in (rank, key) order".into());
            }
            prev = Some(me);
            match cur {
                Some((r, g, false)) if r == s.rank.0 => {
                    if !s.has(GROUPED) {
                        return Err("lru: a group member is not flagged".into());
                    }
                    if self.sents[g as usize].last == n {
                        cur = Some((r, g, true));
                    }
                }
                _ => {
                    if unfinished(cur) {
                        return Err("lru: a group's last member is wrong".into());
                    }
                    if s.has(GROUPED) {
                        return Err("lru: a chunk outside a group is flagged".into());
                    }
                }
            }
        }
        if unfinished(cur) {
            return Err("lru: a group's last member is wrong".into());
        }
        if sentinels != self.groups.len() {
            return Err("lru: a group sentinel is not listed".into());
        }
        if chunks != num_stored {
            return Err(format!("lru: {chunks} chunks listed, {num_stored} stored"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod insert_all_tests {
    use super::*;
    use crate::hash::BlockHash;
    use crate::offload::chunks::LIVE;

    fn state(l: &Lru, slots: &[Slot]) -> String {
        let s: Vec<_> = slots
            .iter()
            .map(|s| (s.flags, s.prev, s.next, s.rank))
            .collect();
        format!("{} {:?}", l.dump(), s)
    }

    #[test]
    fn insert_all_equals_insert_per_item() {
        let mut rnd = crate::offload::tests::xorshift(0x9E37_79B9_7F4A_7C15);
        let mut total_runs = 0usize;
        for round in 0..400 {
            let cap = 200usize;
            let mut slots = vec![Slot::default(); cap];
            for (i, s) in slots.iter_mut().enumerate() {
                let len = 1 + (i * 7 + round) % 9;
                let mut b = vec![0u8; len];
                for (j, v) in b.iter_mut().enumerate() {
                    *v = ((i * 31 + j * 17 + round) % 5) as u8;
                }
                b[0] = (i % 256) as u8; // distinct keys mostly
                b.push((i / 256) as u8);
                s.key = BlockHash::from_bytes(&b).unwrap();
            }
            let mut fast = Lru::new();
            let mut slow = Lru::new();
            slow.per_chunk = true;
            let mut fslots = slots.clone();
            let mut sslots = slots.clone();
            let mut franks: Vec<Option<u64>> = vec![None; 6];
            let mut sranks = franks.clone();
            let mut linked: Vec<u32> = Vec::new();
            let mut free: Vec<u32> = (0..cap as u32).rev().collect();
            for _ in 0..60 {
                let op = rnd(10);
                let q = rnd(6) as usize;
                if op < 6 && !free.is_empty() {
                    let n = 1 + rnd(free.len().min(12) as u64) as usize;
                    let mut items = Vec::new();
                    let base = rnd(50);
                    let mode = rnd(7);
                    for k in 0..n {
                        let id = free.pop().unwrap();
                        let pos = match mode {
                            0 => Some(base + k as u64),
                            1 => Some(base + 16 * k as u64),
                            2 => Some(base),
                            3 => Some(base + 20 - k as u64),
                            4 => {
                                if rnd(3) == 0 {
                                    None
                                } else {
                                    Some(base + rnd(6))
                                }
                            }
                            5 => Some(match rnd(4) {
                                0 => u64::MAX - rnd(3),
                                1 => i64::MAX as u64 + rnd(3) - 1,
                                2 => 0,
                                _ => rnd(1000),
                            }),
                            _ => Some(base + k as u64 + rnd(2)),
                        };
                        items.push((id, pos));
                        fslots[id as usize].flags = LIVE;
                        sslots[id as usize].flags = LIVE;
                        linked.push(id);
                    }
                    fast.insert_all(&mut fslots, &items, &mut franks[q]);
                    for &(id, pos) in &items {
                        slow.insert(&mut sslots, id, pos, &mut sranks[q]);
                    }
                    total_runs += 1;
                } else if op < 7 && !linked.is_empty() {
                    let i = rnd(linked.len() as u64) as usize;
                    let id = linked.swap_remove(i);
                    fast.remove(&mut fslots, id);
                    slow.remove(&mut sslots, id);
                    fslots[id as usize].flags = 0;
                    sslots[id as usize].flags = 0;
                    free.push(id);
                } else if op < 8 {
                    fast.close(&mut fslots, franks[q]);
                    slow.close(&mut sslots, sranks[q]);
                    franks[q] = None;
                    sranks[q] = None;
                } else if !linked.is_empty() {
                    let i = rnd(linked.len() as u64) as usize;
                    let id = linked[i];
                    fast.fresh(&mut fslots, id);
                    slow.fresh(&mut sslots, id);
                }
                assert_eq!(franks, sranks);
                assert_eq!(state(&fast, &fslots), state(&slow, &sslots));
                fast.check(&fslots, linked.len()).unwrap();
            }
        }
        assert!(total_runs > 0);
    }
}
