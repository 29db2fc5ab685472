//! The free block queue: an intrusive doubly linked list of block ids, grown on demand.
//!
//! vLLM keeps its free blocks in a doubly linked list threaded through the blocks
//! themselves, so any block can leave the queue in O(1) when a request hits it. Here the
//! links live in one `Vec<[u32; 2]>` (prev, next) indexed by slot (block id + 3), with three sentinel slots:
//! `HEAD`, `TAIL`, and `FRESH`, which stands for the run of ids never handed out yet
//! (`fresh..end`, in id order). A new queue is just `[FRESH]`: its links grow one block at
//! a time as blocks leave the run (popped, or removed by a hit on a never-used id), so
//! memory follows the blocks in use, not the pool size. The order is exactly vLLM's: the
//! run sits where those ids would be in a queue built with every id up front.
//! The HEAD is reused (and its cached hash evicted) first.

use crate::sys_vec::{AllocError, SysVec};

/// Marks a block that is not in the queue.
const NOT_LINKED: u32 = u32::MAX;
/// `prev` of an unlinked block flagged by [`FreeQueue::mark`].
const MARKED: u32 = u32::MAX - 1;
const HEAD: u32 = 0;
const TAIL: u32 = 1;
const FRESH: u32 = 2;
/// Slots before the first block.
const SLOT0: u32 = 3;
/// Index of a slot's previous / next link in its `[u32; 2]`.
const P: usize = 0;
const N: usize = 1;

/// Free queue over block ids `0..end`.
#[derive(Debug, Clone)]
pub struct FreeQueue {
    /// `[prev, next]` of each slot, side by side: an unlink reads one cache line.
    links: SysVec<[u32; 2]>,
    /// Number of queued ids, the fresh run included.
    len: usize,
    /// First id of the fresh run; every id below has its links.
    fresh: u32,
    end: u32,
}

impl FreeQueue {
    /// A queue holding every block `0..n` in id order, allocating nothing per block.
    /// `n` must be below `u32::MAX - 3`.
    /// An `AllocError` when its first links cannot be allocated.
    pub fn new(n: u32) -> Result<Self, AllocError> {
        let mut links = SysVec::new();
        links.try_reserve_exact(SLOT0 as usize)?;
        links.resize(SLOT0 as usize, [NOT_LINKED; 2]);
        let mut q = FreeQueue {
            links,
            len: n as usize,
            fresh: 0,
            end: n,
        };
        q.links[HEAD as usize][N] = TAIL;
        q.links[TAIL as usize][P] = HEAD;
        if n > 0 {
            q.links[HEAD as usize][N] = FRESH;
            q.links[FRESH as usize][P] = HEAD;
            q.links[FRESH as usize][N] = TAIL;
            q.links[TAIL as usize][P] = FRESH;
        }
        Ok(q)
    }

    /// Number of block ids the queue can hold.
    pub fn capacity(&self) -> usize {
        self.end as usize
    }

    /// Ids below this have links (were handed out or hit at least once).
    pub fn materialized(&self) -> u32 {
        self.fresh
    }

    /// Reserves the links for every id up to `id` (inclusive), so that no operation until
    /// then allocates. Grows by at least a quarter, so reservations stay amortised O(1).
    pub fn reserve_through(&mut self, id: u32) -> Result<(), AllocError> {
        let want = (id.min(self.end.saturating_sub(1)) + 1 + SLOT0) as usize;
        if want <= self.links.capacity() {
            return Ok(());
        }
        let grown = (self.links.len() + self.links.len() / 4)
            .max(want)
            .min((self.end + SLOT0) as usize);
        self.links.try_reserve_exact(grown - self.links.len())
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether block `id` is in the queue (false for ids out of range).
    pub fn contains(&self, id: u32) -> bool {
        id < self.end && (id >= self.fresh || self.links[(id + SLOT0) as usize][N] != NOT_LINKED)
    }

    /// The first block id (the next to be reused), if any.
    pub fn front(&self) -> Option<u32> {
        match self.links[HEAD as usize][N] {
            TAIL => None,
            FRESH => Some(self.fresh),
            s => Some(s - SLOT0),
        }
    }

    /// Gives the next fresh id its (unlinked) slots.
    fn materialize_one(&mut self) -> u32 {
        let id = self.fresh;
        self.links.push([NOT_LINKED; 2]);
        self.fresh += 1;
        if self.fresh == self.end {
            let (p, n) = (self.links[FRESH as usize][P], self.links[FRESH as usize][N]);
            self.links[p as usize][N] = n;
            self.links[n as usize][P] = p;
        }
        id
    }

    /// Remove and return the first block id.
    pub fn pop_front(&mut self) -> Option<u32> {
        let first = self.front()?;
        if first >= self.fresh {
            self.materialize_one();
            self.len -= 1;
        } else {
            self.unlink(first + SLOT0);
            self.len -= 1;
        }
        Some(first)
    }

    /// Remove `id` from wherever it is. Returns false (and changes nothing) when `id` is
    /// not in the queue. An id of the fresh run first gives links to the ids before it
    /// (queued where the run was).
    pub fn remove(&mut self, id: u32) -> bool {
        if !self.contains(id) {
            return false;
        }
        while self.fresh <= id {
            let j = self.materialize_one();
            let s = j + SLOT0;
            // Before the run; when `j` was its last id the run was just unlinked, and its
            // own links still name its old neighbours: `j` takes its place.
            let after = if self.fresh < self.end {
                FRESH
            } else {
                self.links[FRESH as usize][N]
            };
            let before = self.links[after as usize][P];
            self.links[before as usize][N] = s;
            self.links[s as usize][P] = before;
            self.links[s as usize][N] = after;
            self.links[after as usize][P] = s;
        }
        self.unlink(id + SLOT0);
        self.len -= 1;
        true
    }

    /// Put `id` at the tail (reused last). Returns false when it is already queued or out
    /// of range.
    pub fn push_back(&mut self, id: u32) -> bool {
        if id >= self.fresh || self.contains(id) {
            return false;
        }
        let before = self.links[TAIL as usize][P];
        self.link_between(before, id + SLOT0, TAIL);
        true
    }

    /// Put `id` at the head (reused first). Returns false when it is already queued or out
    /// of range.
    pub fn push_front(&mut self, id: u32) -> bool {
        if id >= self.fresh || self.contains(id) {
            return false;
        }
        let after = self.links[HEAD as usize][N];
        self.link_between(HEAD, id + SLOT0, after);
        true
    }

    /// Flags an id that has links and is not queued (scratch for one call's validation).
    pub fn mark(&mut self, id: u32) {
        if id < self.fresh && self.links[(id + SLOT0) as usize][N] == NOT_LINKED {
            self.links[(id + SLOT0) as usize][P] = MARKED;
        }
    }

    pub fn is_marked(&self, id: u32) -> bool {
        id < self.fresh && self.links[(id + SLOT0) as usize][P] == MARKED
    }

    pub fn unmark(&mut self, id: u32) {
        if self.is_marked(id) {
            self.links[(id + SLOT0) as usize][P] = NOT_LINKED;
        }
    }

    /// The queued ids from head to tail.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            queue: self,
            at: self.links[HEAD as usize][N],
            run: 0..0,
        }
    }

    /// Unlinks slot `s` (linked, checked by every caller); `len` is the caller's.
    fn unlink(&mut self, s: u32) {
        let i = s as usize;
        let (p, n) = (self.links[i][P], self.links[i][N]);
        self.links[p as usize][N] = n;
        self.links[n as usize][P] = p;
        self.links[i][P] = NOT_LINKED;
        self.links[i][N] = NOT_LINKED;
    }

    /// `before` and `after` must be adjacent and slot `s` unlinked (checked by callers).
    fn link_between(&mut self, before: u32, s: u32, after: u32) {
        self.links[before as usize][N] = s;
        self.links[s as usize][P] = before;
        self.links[s as usize][N] = after;
        self.links[after as usize][P] = s;
        self.len += 1;
    }
}

/// Iterator over a [`FreeQueue`] from head to tail.
pub struct Iter<'a> {
    queue: &'a FreeQueue,
    at: u32,
    run: std::ops::Range<u32>,
}

impl Iterator for Iter<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        if let Some(id) = self.run.next() {
            return Some(id);
        }
        match self.at {
            TAIL => None,
            FRESH => {
                self.run = self.queue.fresh..self.queue.end;
                self.at = self.queue.links[FRESH as usize][N];
                self.run.next()
            }
            s => {
                self.at = self.queue.links[s as usize][N];
                Some(s - SLOT0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(q: &FreeQueue) -> Vec<u32> {
        q.iter().collect()
    }

    #[test]
    fn hits_on_never_used_ids_keep_the_order_of_a_full_queue() {
        use std::collections::VecDeque;
        for n in [1u32, 2, 5, 40] {
            let mut q = FreeQueue::new(n).unwrap();
            let mut model: VecDeque<u32> = (0..n).collect();
            let mut x: u64 = 0x2545_f491_4f6c_dd1d ^ u64::from(n);
            for _ in 0..3000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let id = (x % u64::from(n)) as u32;
                match (x >> 8) % 5 {
                    0 => assert_eq!(q.pop_front(), model.pop_front()),
                    1 | 4 => {
                        let pos = model.iter().position(|&b| b == id);
                        assert_eq!(q.remove(id), pos.is_some());
                        if let Some(p) = pos {
                            model.remove(p);
                        }
                    }
                    2 => {
                        let ok = id < q.materialized() && !model.contains(&id);
                        assert_eq!(q.push_back(id), ok);
                        if ok {
                            model.push_back(id);
                        }
                    }
                    _ => {
                        let ok = id < q.materialized() && !model.contains(&id);
                        assert_eq!(q.push_front(id), ok);
                        if ok {
                            model.push_front(id);
                        }
                    }
                }
                assert_eq!(q.len(), model.len());
                assert_eq!(ids(&q), model.iter().copied().collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn starts_in_id_order() {
        let q = FreeQueue::new(5).unwrap();
        assert_eq!(ids(&q), vec![0, 1, 2, 3, 4]);
        assert_eq!(q.len(), 5);
        assert_eq!(FreeQueue::new(0).unwrap().pop_front(), None);
    }

    #[test]
    fn pop_remove_push() {
        let mut q = FreeQueue::new(6).unwrap();
        assert_eq!(q.pop_front(), Some(0));
        assert!(q.remove(3));
        assert!(!q.remove(3));
        assert!(!q.push_back(1));
        assert!(q.push_back(3));
        assert!(q.push_front(0));
        assert_eq!(ids(&q), vec![0, 1, 2, 4, 5, 3]);
        assert!(q.remove(0) && q.remove(3) && q.remove(5));
        assert_eq!(ids(&q), vec![1, 2, 4]);
        assert!(!q.push_back(6));
        assert!(!q.contains(6));
        while q.pop_front().is_some() {}
        assert!(q.is_empty());
        assert!(q.push_back(2));
        assert_eq!(ids(&q), vec![2]);
    }

    #[test]
    fn matches_a_vecdeque_model() {
        use std::collections::VecDeque;
        let mut q = FreeQueue::new(16).unwrap();
        let mut model: VecDeque<u32> = (0..16).collect();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..5000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let id = (x % 16) as u32;
            match (x >> 8) % 4 {
                0 => assert_eq!(q.pop_front(), model.pop_front()),
                1 => {
                    let pos = model.iter().position(|&b| b == id);
                    assert_eq!(q.remove(id), pos.is_some());
                    if let Some(p) = pos {
                        model.remove(p);
                    }
                }
                2 => {
                    let fresh = !model.contains(&id);
                    assert_eq!(q.push_back(id), fresh);
                    if fresh {
                        model.push_back(id);
                    }
                }
                _ => {
                    let fresh = !model.contains(&id);
                    assert_eq!(q.push_front(id), fresh);
                    if fresh {
                        model.push_front(id);
                    }
                }
            }
            assert_eq!(q.len(), model.len());
        }
        assert_eq!(ids(&q), model.into_iter().collect::<Vec<_>>());
    }
}
