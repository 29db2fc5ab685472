//! The tokens and KV indices of one node, in one buffer.
//!
//! A [`Span`] of `n` tokens is a run of u32 words: the `n` token ids, then the `n` KV
//! indices, each in one word when every index of the node lies in `0..=u32::MAX`
//! (*narrow*, 8 bytes a token: the normal case, KV indices are pool slots) or as two words
//! (low, high) otherwise (*wide*, 12 bytes a token, any i64). Up to [`INLINE`] words are
//! kept in the node itself (a narrow node of 1-2 tokens or a wide one of 1 token: no heap
//! allocation); longer spans are one exact-size heap buffer. The stored width never
//! shows: indices are handed back as the i64 they were given.
//!
//! Layout (20 bytes, 4-byte aligned): a header word and four payload words. The header
//! holds the form (inline or heap), the width and an inline length in its low
//! [`OWN_BITS`] bits; the other 28 bits belong to the owner (the node keeps its flags and
//! namespace there, [`Span::meta`]). A heap span's payload is the buffer's address (two
//! words) and its token count (two words, u64).

use std::alloc::{GlobalAlloc, Layout, System};

use crate::{Error, Result};

/// Words kept inside the node.
const INLINE: usize = 4;

/// Header bits of the span itself; the rest are the owner's.
const OWN_BITS: u32 = 4;
const HEAP: u32 = 1;
const WIDE: u32 = 2;
const LEN_SHIFT: u32 = 2;
const LEN_MASK: u32 = 3 << LEN_SHIFT;
/// Bits of the header available to the owner.
pub(crate) const META_BITS: u32 = 32 - OWN_BITS;

#[derive(Debug)]
pub(crate) struct Span {
    hdr: u32,
    w: [u32; INLINE],
}

impl Default for Span {
    fn default() -> Self {
        Span {
            hdr: 0,
            w: [0; INLINE],
        }
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some((ptr, words)) = self.heap_raw() {
            // SAFETY: a heap span owns the buffer that `layout` took from `alloc_words`
            // with this word count; nothing else frees it.
            unsafe { free_words(ptr, words) };
        }
    }
}

/// Whether every value is in `0..2**32` (storable in one word). Branch-free: the values
/// are ORed together (a negative one sets the high bits too) and checked once, which
/// the compiler vectorises; an early exit per value kept it a scalar loop of ~10
/// instructions a value, a fifth of a 2304-token insert's instructions.
#[inline]
fn all_narrow(values: &[i64]) -> bool {
    values.iter().fold(0u64, |acc, &v| acc | v as u64) >> 32 == 0
}

/// Words for `n` tokens (`None` on overflow).
fn words(n: usize, wide: bool) -> Option<usize> {
    n.checked_mul(if wide { 3 } else { 2 })
}

/// Buffers of at least this many words come from the system allocator, smaller ones
/// from the global one. A long prompt's node is tens of KB and is freed again when a
/// later request splits it: glibc reuses such memory in place, where a general-purpose
/// allocator returns the pages to the system after a short delay and takes them back
/// (page faults) on the next allocation, which made system time the larger part of a
/// big replay. Small nodes are many and short-lived; the global allocator serves them
/// faster.
const SYSTEM_WORDS: usize = 4096;

/// A buffer for `l` (an array of u32 of at least `INLINE + 1` words), or null.
fn alloc_words(l: Layout) -> *mut u32 {
    // SAFETY: `l` has a nonzero size (more than INLINE words).
    unsafe {
        if l.size() >= 4 * SYSTEM_WORDS {
            System.alloc(l).cast::<u32>()
        } else {
            std::alloc::alloc(l).cast::<u32>()
        }
    }
}

/// Frees a buffer of `words` u32 from [`alloc_words`].
///
/// # Safety
/// `ptr` must come from `alloc_words` with the layout of `words` u32, and not be used
/// again.
unsafe fn free_words(ptr: *mut u32, words: usize) {
    if let Ok(l) = Layout::array::<u32>(words) {
        // SAFETY: the caller's contract; the allocator is chosen by size exactly as in
        // `alloc_words`.
        unsafe {
            if l.size() >= 4 * SYSTEM_WORDS {
                System.dealloc(ptr.cast::<u8>(), l);
            } else {
                std::alloc::dealloc(ptr.cast::<u8>(), l);
            }
        }
    }
}

impl Span {
    /// The owner's bits of the header (`META_BITS` wide).
    #[inline]
    pub(crate) fn meta(&self) -> u32 {
        self.hdr >> OWN_BITS
    }

    /// Sets the owner's bits (`m < 2^META_BITS`).
    #[inline]
    pub(crate) fn set_meta(&mut self, m: u32) {
        debug_assert!(m < 1 << META_BITS);
        self.hdr = (self.hdr & ((1 << OWN_BITS) - 1)) | (m << OWN_BITS);
    }

    /// Replaces the tokens and indices by those of `other`, keeping the owner's bits.
    pub(crate) fn replace(&mut self, mut other: Span) {
        other.set_meta(self.meta());
        *self = other;
    }

    #[inline]
    fn is_wide(&self) -> bool {
        self.hdr & WIDE != 0
    }

    /// The heap buffer's address and word count, for a heap span.
    #[inline]
    fn heap_raw(&self) -> Option<(*mut u32, usize)> {
        if self.hdr & HEAP == 0 {
            return None;
        }
        let addr = (u64::from(self.w[0]) | (u64::from(self.w[1]) << 32)) as usize;
        let n = (u64::from(self.w[2]) | (u64::from(self.w[3]) << 32)) as usize;
        let words = if self.is_wide() { 3 * n } else { 2 * n };
        Some((std::ptr::with_exposed_provenance_mut(addr), words))
    }

    /// A heap span owning the buffer at `ptr` (`n` tokens, allocated by `alloc_words`
    /// with the layout of its word count).
    fn into_heap(ptr: *mut u32, n: usize, wide: bool) -> Span {
        let addr = ptr.expose_provenance() as u64;
        let n = n as u64;
        Span {
            hdr: HEAP | if wide { WIDE } else { 0 },
            w: [addr as u32, (addr >> 32) as u32, n as u32, (n >> 32) as u32],
        }
    }

    /// Lays out `key` and the index words written by `fill` (given the `n` or `2n` words
    /// after the tokens). A failed allocation is an `OutOfMemory` error.
    fn layout(key: &[u32], wide: bool, fill: impl FnOnce(&mut [u32])) -> Result<Span> {
        let n = key.len();
        let total = words(n, wide)
            .ok_or_else(|| Error::out_of_memory("a radix node", "capacity overflow"))?;
        if total <= INLINE {
            let mut w = [0u32; INLINE];
            w[..n].copy_from_slice(key);
            fill(&mut w[n..total]);
            return Ok(Span {
                hdr: ((n as u32) << LEN_SHIFT) | if wide { WIDE } else { 0 },
                w,
            });
        }
        let oom = |why| Error::out_of_memory("a radix node", why);
        let l = Layout::array::<u32>(total).map_err(|_| oom("capacity overflow"))?;
        let ptr = alloc_words(l);
        if ptr.is_null() {
            return Err(oom("memory allocation failed"));
        }
        // SAFETY: `ptr` is a fresh, exclusively owned buffer of `total` u32 (n <= total):
        // the key fills its first `n` words and the rest is zeroed, so every word is
        // initialised before the slice of the index words is made.
        let indices = unsafe {
            std::ptr::copy_nonoverlapping(key.as_ptr(), ptr, n);
            let rest = ptr.add(n);
            rest.write_bytes(0, total - n);
            std::slice::from_raw_parts_mut(rest, total - n)
        };
        fill(indices);
        Ok(Span::into_heap(ptr, n, wide))
    }

    /// Writes `values` as index words: two per value when `wide`, else one (each value
    /// then in `0..2**32`, see [`all_narrow`]).
    fn write_values(dst: &mut [u32], values: &[i64], wide: bool) {
        if wide {
            for (d, &v) in dst.chunks_exact_mut(2).zip(values) {
                d[0] = v as u32;
                d[1] = ((v as u64) >> 32) as u32;
            }
        } else {
            for (d, &v) in dst.iter_mut().zip(values) {
                *d = v as u32;
            }
        }
    }

    /// `key` with the KV indices `values` (same length).
    pub(crate) fn from_values(key: &[u32], values: &[i64]) -> Result<Span> {
        debug_assert_eq!(key.len(), values.len());
        let wide = !all_narrow(values);
        Span::layout(key, wide, |dst| Span::write_values(dst, values, wide))
    }

    /// `key` whose KV indices are the tokens themselves.
    pub(crate) fn from_tokens(key: &[u32]) -> Result<Span> {
        Span::layout(key, false, |dst| dst.copy_from_slice(key))
    }

    /// The words, the token count and the width.
    #[inline]
    fn parts(&self) -> (&[u32], usize, bool) {
        match self.heap_raw() {
            None => (
                &self.w[..],
                ((self.hdr & LEN_MASK) >> LEN_SHIFT) as usize,
                self.is_wide(),
            ),
            Some((ptr, words)) => {
                // SAFETY: the buffer (`words` initialised u32 at `ptr`, see `into_heap`)
                // is owned by this span and lives as long as it; the slice borrows it.
                let buf = unsafe { std::slice::from_raw_parts(ptr, words) };
                let n = (u64::from(self.w[2]) | (u64::from(self.w[3]) << 32)) as usize;
                (buf, n, self.is_wide())
            }
        }
    }

    /// Bytes of the heap buffer (0 inline).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.heap_raw().map_or(0, |(_, words)| 4 * words)
    }

    /// Number of tokens.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        if self.hdr & HEAP == 0 {
            ((self.hdr & LEN_MASK) >> LEN_SHIFT) as usize
        } else {
            (u64::from(self.w[2]) | (u64::from(self.w[3]) << 32)) as usize
        }
    }

    /// The token ids.
    #[inline(always)]
    pub(crate) fn key(&self) -> &[u32] {
        if self.hdr & HEAP == 0 {
            let n = ((self.hdr & LEN_MASK) >> LEN_SHIFT) as usize;
            return &self.w[..n.min(INLINE)];
        }
        let (buf, n, _) = self.parts();
        &buf[..n]
    }

    /// Appends the KV indices to `out`.
    pub(crate) fn extend_values(&self, out: &mut Vec<i64>) {
        let (buf, n, wide) = self.parts();
        if wide {
            out.extend(
                buf[n..3 * n]
                    .chunks_exact(2)
                    .map(|w| (u64::from(w[0]) | (u64::from(w[1]) << 32)) as i64),
            );
        } else {
            out.extend(buf[n..2 * n].iter().map(|&v| i64::from(v)));
        }
    }

    /// The KV indices.
    pub(crate) fn values(&self) -> Vec<i64> {
        let mut out = Vec::with_capacity(self.len());
        self.extend_values(&mut out);
        out
    }

    /// The first `p` tokens and the rest (0 < p < len), each in exact-size storage and
    /// narrow again where its own indices allow. The halves carry no owner's bits. Both
    /// are allocated while this span still holds its buffer: when either allocation fails
    /// the error is returned (and a half already made is freed), this span unchanged.
    pub(crate) fn split_at(&self, p: usize) -> Result<(Span, Span)> {
        let (buf, n, wide) = self.parts();
        let halves = if wide {
            let values = self.values();
            let (head_values, tail_values) = values.split_at(p);
            let head_wide = !all_narrow(head_values);
            let tail_wide = !all_narrow(tail_values);
            let head = Span::layout(&buf[..p], head_wide, |dst| {
                Span::write_values(dst, head_values, head_wide)
            });
            let tail = Span::layout(&buf[p..n], tail_wide, |dst| {
                Span::write_values(dst, tail_values, tail_wide)
            });
            (head, tail)
        } else {
            let vals = &buf[n..2 * n];
            let head = Span::layout(&buf[..p], false, |dst| {
                dst.copy_from_slice(&vals[..p]);
            });
            let tail = Span::layout(&buf[p..n], false, |dst| {
                dst.copy_from_slice(&vals[p..]);
            });
            (head, tail)
        };
        let (head, tail) = halves;
        Ok((head?, tail?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_narrow_wide_inline_heap() {
        let cases: Vec<Vec<i64>> = vec![
            vec![5],
            vec![5, 6],
            vec![-1],
            vec![1, 2, 3],
            vec![1, -2, 3, i64::MAX, i64::MIN, 1 << 40],
            vec![0, i64::from(u32::MAX)],
            (0..1000).collect(),
            // Heap buffers on either side of SYSTEM_WORDS (and split across it).
            (0..5000).collect(),
            (-1000..1000).collect(),
        ];
        for values in cases {
            let key: Vec<u32> = (0..values.len() as u32).map(|t| t * 7).collect();
            let mut s = Span::from_values(&key, &values).expect("alloc");
            assert_eq!(s.len(), key.len());
            assert_eq!(s.key(), &key[..]);
            assert_eq!(s.values(), values);
            s.set_meta((1 << META_BITS) - 1);
            assert_eq!(s.len(), key.len());
            assert_eq!(s.values(), values);
            for p in 1..values.len() {
                let (h, t) = s.split_at(p).unwrap();
                assert_eq!(h.key(), &key[..p]);
                assert_eq!(t.key(), &key[p..]);
                assert_eq!(h.values(), &values[..p]);
                assert_eq!(t.values(), &values[p..]);
                assert_eq!((h.meta(), t.meta()), (0, 0));
            }
            let (_, t) = s.split_at(values.len().max(2) / 2).unwrap();
            let mut r = Span::default();
            r.set_meta(12345);
            r.replace(t);
            assert_eq!(r.meta(), 12345);
        }
        // One word per value exactly when every value is in 0..2**32, and each half of a
        // split decides for itself.
        let edge = i64::from(u32::MAX);
        for (values, wide) in [
            (vec![0, edge], false),
            (vec![0, edge + 1], true),
            (vec![-1, 0], true),
            (vec![i64::MIN, 0], true),
            (vec![i64::MAX, 0], true),
            ((0..300).map(|i| edge - i).collect::<Vec<_>>(), false),
            (
                (0..300).map(|i| if i == 299 { -1 } else { i }).collect(),
                true,
            ),
        ] {
            let key: Vec<u32> = (0..values.len() as u32).collect();
            let s = Span::from_values(&key, &values).expect("alloc");
            assert_eq!(s.is_wide(), wide, "{:?}", &values[..2]);
            assert_eq!(s.values(), values);
            let p = values.len() - 1;
            let (h, t) = s.split_at(p).unwrap();
            assert_eq!(
                h.is_wide(),
                !values[..p].iter().all(|v| (0..=edge).contains(v))
            );
            assert_eq!(t.is_wide(), !(0..=edge).contains(&values[p]));
        }
        let s = Span::from_tokens(&[1, 2, 3]).expect("alloc");
        assert_eq!(s.values(), vec![1, 2, 3]);
        assert_eq!(std::mem::size_of::<Span>(), 20);
        assert_eq!(std::mem::align_of::<Span>(), 4);
    }
}
