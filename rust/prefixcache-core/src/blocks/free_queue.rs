//! The free block queue: an intrusive doubly linked list of block ids.
//!
//! vLLM keeps its free blocks in a doubly linked list threaded through the blocks
//! themselves, so any block can leave the queue in O(1) when a request hits it. Here the
//! links live in two `Vec<u32>` indexed by block id, with two sentinel slots (`head` at
//! index `n`, `tail` at `n + 1`) so every real block always has both neighbours.
//! The HEAD is reused (and its cached hash evicted) first.

/// Marks a block that is not in the queue.
const NOT_LINKED: u32 = u32::MAX;

/// Free queue over block ids `0..n`.
#[derive(Debug, Clone)]
pub struct FreeQueue {
    prev: Vec<u32>,
    next: Vec<u32>,
    len: usize,
}

impl FreeQueue {
    /// A queue holding every block `0..n` in id order. `n` must be below `u32::MAX - 2`.
    pub fn new(n: u32) -> Self {
        let head = n;
        let tail = n + 1;
        let slots = n as usize + 2;
        let mut prev = vec![NOT_LINKED; slots];
        let mut next = vec![NOT_LINKED; slots];
        let mut last = head;
        for id in 0..n {
            next[last as usize] = id;
            prev[id as usize] = last;
            last = id;
        }
        next[last as usize] = tail;
        prev[tail as usize] = last;
        FreeQueue {
            prev,
            next,
            len: n as usize,
        }
    }

    fn head(&self) -> u32 {
        (self.prev.len() - 2) as u32
    }

    fn tail(&self) -> u32 {
        (self.prev.len() - 1) as u32
    }

    /// Number of block ids the queue can hold.
    pub fn capacity(&self) -> usize {
        self.prev.len() - 2
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether block `id` is in the queue (false for ids out of range).
    pub fn contains(&self, id: u32) -> bool {
        (id as usize) < self.capacity() && self.next[id as usize] != NOT_LINKED
    }

    /// The first block id (the next to be reused), if any.
    pub fn front(&self) -> Option<u32> {
        let first = self.next[self.head() as usize];
        (first != self.tail()).then_some(first)
    }

    /// Remove and return the first block id.
    pub fn pop_front(&mut self) -> Option<u32> {
        let first = self.front()?;
        self.unlink(first);
        Some(first)
    }

    /// Remove `id` from wherever it is. Returns false (and changes nothing) when `id` is
    /// not in the queue.
    pub fn remove(&mut self, id: u32) -> bool {
        if !self.contains(id) {
            return false;
        }
        self.unlink(id);
        true
    }

    /// Put `id` at the tail (reused last). Returns false when it is already queued or out
    /// of range.
    pub fn push_back(&mut self, id: u32) -> bool {
        if (id as usize) >= self.capacity() || self.contains(id) {
            return false;
        }
        let tail = self.tail();
        let before = self.prev[tail as usize];
        self.link_between(before, id, tail);
        true
    }

    /// Put `id` at the head (reused first). Returns false when it is already queued or out
    /// of range.
    pub fn push_front(&mut self, id: u32) -> bool {
        if (id as usize) >= self.capacity() || self.contains(id) {
            return false;
        }
        let head = self.head();
        let after = self.next[head as usize];
        self.link_between(head, id, after);
        true
    }

    /// The queued ids from head to tail.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            queue: self,
            at: self.next[self.head() as usize],
        }
    }

    /// `id` must be linked (checked by every caller).
    fn unlink(&mut self, id: u32) {
        let i = id as usize;
        let (p, n) = (self.prev[i], self.next[i]);
        self.next[p as usize] = n;
        self.prev[n as usize] = p;
        self.prev[i] = NOT_LINKED;
        self.next[i] = NOT_LINKED;
        self.len -= 1;
    }

    /// `before` and `after` must be adjacent and `id` unlinked (checked by every caller).
    fn link_between(&mut self, before: u32, id: u32, after: u32) {
        self.next[before as usize] = id;
        self.prev[id as usize] = before;
        self.next[id as usize] = after;
        self.prev[after as usize] = id;
        self.len += 1;
    }
}

/// Iterator over a [`FreeQueue`] from head to tail.
pub struct Iter<'a> {
    queue: &'a FreeQueue,
    at: u32,
}

impl Iterator for Iter<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        if self.at == self.queue.tail() {
            return None;
        }
        let id = self.at;
        self.at = self.queue.next[id as usize];
        Some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(q: &FreeQueue) -> Vec<u32> {
        q.iter().collect()
    }

    #[test]
    fn starts_in_id_order() {
        let q = FreeQueue::new(5);
        assert_eq!(ids(&q), vec![0, 1, 2, 3, 4]);
        assert_eq!(q.len(), 5);
        assert_eq!(FreeQueue::new(0).pop_front(), None);
    }

    #[test]
    fn pop_remove_push() {
        let mut q = FreeQueue::new(6);
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
        let mut q = FreeQueue::new(16);
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
