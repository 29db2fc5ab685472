//! The tokens and KV indices of one node, in one buffer.
//!
//! A [`Span`] of `n` tokens is a run of u32 words: the `n` token ids, then the `n` KV
//! indices, each in one word when every index of the node lies in `0..=u32::MAX`
//! (*narrow*, 8 bytes a token: the normal case, KV indices are pool slots) or as two words
//! (low, high) otherwise (*wide*, 12 bytes a token, any i64). Up to [`INLINE`] words are
//! kept in the node itself (a narrow node of 1-2 tokens or a wide one of 1 token: no heap
//! allocation); longer spans are one exact-size boxed slice. The stored width never
//! shows: indices are handed back as the i64 they were given.

use crate::{Error, Result};

/// Words kept inside the node.
const INLINE: usize = 4;

#[derive(Debug)]
pub(crate) enum Span {
    Inline {
        len: u8,
        wide: bool,
        buf: [u32; INLINE],
    },
    Heap {
        wide: bool,
        buf: Box<[u32]>,
    },
}

impl Default for Span {
    fn default() -> Self {
        Span::Inline {
            len: 0,
            wide: false,
            buf: [0; INLINE],
        }
    }
}

#[inline]
fn fits_narrow(v: i64) -> bool {
    (0..=i64::from(u32::MAX)).contains(&v)
}

/// Words for `n` tokens (`None` on overflow).
fn words(n: usize, wide: bool) -> Option<usize> {
    n.checked_mul(if wide { 3 } else { 2 })
}

impl Span {
    /// Lays out `key` and the index words written by `fill` (given the `n` or `2n` words
    /// after the tokens). `fallible`: a failed allocation is an `OutOfMemory` error
    /// instead of an abort (for sizes a caller chose; a split only re-packs memory that
    /// is already held).
    fn layout(
        key: &[u32],
        wide: bool,
        fallible: bool,
        fill: impl FnOnce(&mut [u32]),
    ) -> Result<Span> {
        let n = key.len();
        let total = words(n, wide)
            .ok_or_else(|| Error::out_of_memory("a radix node", "capacity overflow"))?;
        if total <= INLINE {
            let mut buf = [0u32; INLINE];
            buf[..n].copy_from_slice(key);
            fill(&mut buf[n..total]);
            return Ok(Span::Inline {
                len: n as u8,
                wide,
                buf,
            });
        }
        let mut v: Vec<u32> = Vec::new();
        if fallible {
            v.try_reserve_exact(total)
                .map_err(|e| Error::out_of_memory("a radix node", e))?;
        } else {
            v.reserve_exact(total);
        }
        v.extend_from_slice(key);
        v.resize(total, 0);
        fill(&mut v[n..]);
        // len == capacity: no reallocation.
        Ok(Span::Heap {
            wide,
            buf: v.into_boxed_slice(),
        })
    }

    fn write_wide(dst: &mut [u32], values: impl Iterator<Item = i64>) {
        for (d, v) in dst.chunks_exact_mut(2).zip(values) {
            d[0] = v as u32;
            d[1] = ((v as u64) >> 32) as u32;
        }
    }

    /// `key` with the KV indices `values` (same length).
    pub(crate) fn from_values(key: &[u32], values: &[i64]) -> Result<Span> {
        debug_assert_eq!(key.len(), values.len());
        let wide = !values.iter().all(|&v| fits_narrow(v));
        Span::layout(key, wide, true, |dst| {
            if wide {
                Span::write_wide(dst, values.iter().copied());
            } else {
                for (d, &v) in dst.iter_mut().zip(values) {
                    *d = v as u32;
                }
            }
        })
    }

    /// `key` whose KV indices are the tokens themselves.
    pub(crate) fn from_tokens(key: &[u32]) -> Result<Span> {
        Span::layout(key, false, true, |dst| dst.copy_from_slice(key))
    }

    #[inline]
    fn parts(&self) -> (&[u32], usize, bool) {
        match self {
            Span::Inline { len, wide, buf } => (&buf[..], usize::from(*len), *wide),
            Span::Heap { wide, buf } => {
                let n = if *wide { buf.len() / 3 } else { buf.len() / 2 };
                (&buf[..], n, *wide)
            }
        }
    }

    /// Number of tokens.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.parts().1
    }

    /// The token ids.
    #[inline]
    pub(crate) fn key(&self) -> &[u32] {
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
    /// narrow again where its own indices allow.
    pub(crate) fn split_at(&self, p: usize) -> (Span, Span) {
        let (buf, n, wide) = self.parts();
        let halves = if wide {
            let values = self.values();
            let head_wide = !values[..p].iter().all(|&v| fits_narrow(v));
            let tail_wide = !values[p..].iter().all(|&v| fits_narrow(v));
            let head = Span::layout(&buf[..p], head_wide, false, |dst| {
                if head_wide {
                    Span::write_wide(dst, values[..p].iter().copied());
                } else {
                    for (d, &v) in dst.iter_mut().zip(&values[..p]) {
                        *d = v as u32;
                    }
                }
            });
            let tail = Span::layout(&buf[p..n], tail_wide, false, |dst| {
                if tail_wide {
                    Span::write_wide(dst, values[p..].iter().copied());
                } else {
                    for (d, &v) in dst.iter_mut().zip(&values[p..]) {
                        *d = v as u32;
                    }
                }
            });
            (head, tail)
        } else {
            let vals = &buf[n..2 * n];
            let head = Span::layout(&buf[..p], false, false, |dst| {
                dst.copy_from_slice(&vals[..p]);
            });
            let tail = Span::layout(&buf[p..n], false, false, |dst| {
                dst.copy_from_slice(&vals[p..]);
            });
            (head, tail)
        };
        match halves {
            (Ok(h), Ok(t)) => (h, t),
            // Unreachable: both halves are shorter than this span, so their word counts
            // cannot overflow, and an infallible reservation aborts rather than failing.
            _ => (Span::default(), Span::default()),
        }
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
        ];
        for values in cases {
            let key: Vec<u32> = (0..values.len() as u32).map(|t| t * 7).collect();
            let s = Span::from_values(&key, &values).expect("alloc");
            assert_eq!(s.len(), key.len());
            assert_eq!(s.key(), &key[..]);
            assert_eq!(s.values(), values);
            for p in 1..values.len() {
                let (h, t) = s.split_at(p);
                assert_eq!(h.key(), &key[..p]);
                assert_eq!(t.key(), &key[p..]);
                assert_eq!(h.values(), &values[..p]);
                assert_eq!(t.values(), &values[p..]);
            }
        }
        let s = Span::from_tokens(&[1, 2, 3]).expect("alloc");
        assert_eq!(s.values(), vec![1, 2, 3]);
        assert!(std::mem::size_of::<Span>() <= 24);
    }
}
