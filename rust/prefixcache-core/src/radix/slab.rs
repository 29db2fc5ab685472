//! The node arena: fixed-size chunks addressed by u32 slots.
//!
//! A `Vec<Node>` doubles when it grows: the copy touches the old and the new buffer, and
//! the capacity runs up to twice the nodes held. Chunks of [`CHUNK`] nodes never move,
//! so the arena holds at most one partly used chunk beyond the live slots, and growing
//! it never copies a node.

use std::ops::{Index, IndexMut};

/// Nodes per chunk (a power of two): 16384 nodes are 1.5 MB, whose pages
/// the OS backs as the nodes are written.
const CHUNK_BITS: u32 = 14;
const CHUNK: usize = 1 << CHUNK_BITS;

#[derive(Debug)]
pub(crate) struct Slab<T> {
    chunks: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Slab<T> {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Makes room for one more node, so that the next [`Slab::push`] allocates nothing.
    pub(crate) fn try_reserve_one(&mut self) -> Result<(), std::collections::TryReserveError> {
        let only = self.chunks.len() == 1;
        match self.chunks.last_mut() {
            Some(c) if c.len() < c.capacity().min(CHUNK) => Ok(()),
            // The first chunk doubles like a Vec, up to CHUNK nodes.
            Some(c) if only && c.len() < CHUNK => {
                c.try_reserve_exact(c.len().clamp(4, CHUNK - c.len()))
            }
            _ => {
                // A chunk is allocated whole, once (the first one small).
                let mut c = Vec::new();
                c.try_reserve_exact(if self.chunks.is_empty() { 4 } else { CHUNK })?;
                self.chunks.try_reserve(1)?;
                self.chunks.push(c);
                Ok(())
            }
        }
    }

    /// Appends `value` (the slot is the previous length). Allocates when there is no room
    /// (see [`Slab::try_reserve_one`]).
    pub(crate) fn push(&mut self, value: T) {
        match self.chunks.last_mut() {
            Some(c) if c.len() < CHUNK => c.push(value),
            _ => {
                // The first chunk grows like a Vec (small trees stay small); later ones
                // are allocated whole, once.
                let mut c = if self.chunks.is_empty() {
                    Vec::new()
                } else {
                    Vec::with_capacity(CHUNK)
                };
                c.push(value);
                self.chunks.push(c);
            }
        }
        self.len += 1;
    }

    /// Bytes of the chunks (their capacity: the slots held, used or not).
    pub(crate) fn bytes(&self) -> usize {
        self.chunks.iter().map(|c| c.capacity()).sum::<usize>() * std::mem::size_of::<T>()
            + self.chunks.capacity() * std::mem::size_of::<Vec<T>>()
    }

    #[inline]
    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        self.chunks
            .get(i >> CHUNK_BITS)
            .and_then(|c| c.get(i & (CHUNK - 1)))
    }
}

impl<T> Index<usize> for Slab<T> {
    type Output = T;
    #[inline]
    fn index(&self, i: usize) -> &T {
        &self.chunks[i >> CHUNK_BITS][i & (CHUNK - 1)]
    }
}

impl<T> IndexMut<usize> for Slab<T> {
    #[inline]
    fn index_mut(&mut self, i: usize) -> &mut T {
        &mut self.chunks[i >> CHUNK_BITS][i & (CHUNK - 1)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_span_chunks() {
        let mut s = Slab::default();
        for i in 0..(3 * CHUNK + 5) {
            s.push(i);
        }
        assert_eq!(s.len(), 3 * CHUNK + 5);
        for i in 0..s.len() {
            assert_eq!(s[i], i);
            assert_eq!(s.get(i), Some(&i));
        }
        assert_eq!(s.get(s.len()), None);
        s[CHUNK] = 7;
        assert_eq!(s[CHUNK], 7);
    }
}
