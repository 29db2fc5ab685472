//! The exact bytes of `cbor2.dumps(obj, canonical=True)` for the objects vLLM hashes.
//!
//! - ints: major type 0 (>= 0) or 1 (`-1 - v`), minimal-length heads; beyond 64 bits,
//!   tag 2 (positive bignum) / tag 3 (negative: `-1 - v`) around the minimal big-endian
//!   byte string, as cbor2 does;
//! - bytes: major type 2; str: major type 3 (UTF-8); tuple: major type 4 (definite length);
//! - `None` `0xf6`, `True` `0xf5`, `False` `0xf4`.
//!
//! Canonical cbor2 neither shares values nor references strings, so there is no memo.

use super::value::{BigInt, KeyValue};

const UINT: u8 = 0;
const NEGINT: u8 = 1;
const BYTES: u8 = 2;
const TEXT: u8 = 3;
const ARRAY: u8 = 4;
const TAG: u8 = 6;
const FALSE: u8 = 0xf4;
const TRUE: u8 = 0xf5;
const NULL: u8 = 0xf6;

/// A major type with its argument, in the shortest form, as (bytes, length).
#[inline(always)]
fn head_bytes(major: u8, arg: u64) -> ([u8; 9], usize) {
    let mt = major << 5;
    let mut b = [0u8; 9];
    let len = if arg < 24 {
        b[0] = mt | arg as u8;
        1
    } else if arg <= 0xff {
        b[0] = mt | 24;
        b[1] = arg as u8;
        2
    } else if arg <= 0xffff {
        b[0] = mt | 25;
        b[1..3].copy_from_slice(&(arg as u16).to_be_bytes());
        3
    } else if arg <= 0xffff_ffff {
        b[0] = mt | 26;
        b[1..5].copy_from_slice(&(arg as u32).to_be_bytes());
        5
    } else {
        b[0] = mt | 27;
        b[1..9].copy_from_slice(&arg.to_be_bytes());
        9
    };
    (b, len)
}

/// Append a major type with its argument, in the shortest form.
#[inline(always)]
fn head(out: &mut Vec<u8>, major: u8, arg: u64) {
    let (b, len) = head_bytes(major, arg);
    out.extend_from_slice(&b[..len]);
}

/// Write a head at `buf[pos..]`; returns the new position.
#[inline(always)]
fn put_head(buf: &mut [u8], pos: usize, major: u8, arg: u64) -> usize {
    let (b, len) = head_bytes(major, arg);
    buf[pos..pos + len].copy_from_slice(&b[..len]);
    pos + len
}

fn encode_i64(out: &mut Vec<u8>, v: i64) {
    if v >= 0 {
        head(out, UINT, v as u64);
    } else {
        // -1 - v = !v, which is >= 0 for v < 0
        head(out, NEGINT, !v as u64);
    }
}

fn encode_bigint(out: &mut Vec<u8>, v: &BigInt) {
    let arg = v.cbor_argument_be();
    if arg.len() <= 8 {
        let a = arg.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
        head(out, if v.is_negative() { NEGINT } else { UINT }, a);
    } else {
        head(out, TAG, if v.is_negative() { 3 } else { 2 });
        head(out, BYTES, arg.len() as u64);
        out.extend_from_slice(&arg);
    }
}

/// Append the encoding of `value`.
pub fn encode(out: &mut Vec<u8>, value: &KeyValue) {
    match value {
        KeyValue::None => out.push(NULL),
        KeyValue::Bool(b) => out.push(if *b { TRUE } else { FALSE }),
        KeyValue::Int(v) => encode_i64(out, *v),
        KeyValue::BigInt(v) => encode_bigint(out, v),
        KeyValue::Str(s) => {
            head(out, TEXT, s.len() as u64);
            out.extend_from_slice(s.as_bytes());
        }
        KeyValue::Bytes(b) => {
            head(out, BYTES, b.len() as u64);
            out.extend_from_slice(b);
        }
        KeyValue::Tuple(items) => {
            head(out, ARRAY, items.len() as u64);
            for item in items {
                encode(out, item);
            }
        }
    }
}

/// `cbor2.dumps(value, canonical=True)`.
pub fn dumps(value: &KeyValue) -> Vec<u8> {
    let mut out = Vec::new();
    encode(&mut out, value);
    out
}

/// One token id as (little-endian word, length): the minimal major-type-0 head. Branch-free.
#[inline(always)]
fn token_word(t: u32) -> (u64, usize) {
    const HEAD: [u64; 4] = [0, 0x18, 0x19, 0x1a];
    const RSHIFT: [u32; 4] = [24, 24, 16, 0];
    const LSHIFT: [u32; 4] = [0, 8, 8, 8];
    const LEN: [usize; 4] = [1, 2, 3, 5];
    let class = (usize::from(t >= 24) + usize::from(t > 0xff) + usize::from(t > 0xffff)) & 3;
    // the big-endian argument bytes, as the low bytes of a little-endian word
    let arg = u64::from(t.swap_bytes() >> RSHIFT[class]);
    ((arg << LSHIFT[class]) | HEAD[class], LEN[class])
}

/// Bytes [`write_block_fast`] may touch for a block of `n` tokens (8-byte stores included).
pub(crate) fn fast_block_bound(parent_len: usize, n: usize) -> usize {
    1 + 9 + parent_len + 9 + 5 * n + 1 + 8
}

/// `(parent, tuple(tokens), None)` into `buf` (which must hold [`fast_block_bound`] bytes;
/// bytes past the returned length may be overwritten); returns the stream length.
#[inline]
pub(crate) fn write_block_fast(buf: &mut [u8], parent: &[u8], tokens: &[u32]) -> usize {
    buf[0] = (ARRAY << 5) | 3;
    let mut pos = put_head(buf, 1, BYTES, parent.len() as u64);
    buf[pos..pos + parent.len()].copy_from_slice(parent);
    pos = put_head(buf, pos + parent.len(), ARRAY, tokens.len() as u64);
    if tokens.iter().all(|&t| t > 0xffff) {
        // Every token takes 5 bytes (0x1a and its 4 big-endian bytes): fixed places, no
        // chain through the stream position (Mooncake prompts and simulated outputs).
        let end = pos + 5 * tokens.len();
        for (dst, &t) in buf[pos..end].chunks_exact_mut(5).zip(tokens) {
            dst[0] = (UINT << 5) | 26;
            dst[1..].copy_from_slice(&t.to_be_bytes());
        }
        pos = end;
    } else {
        for &t in tokens {
            let (word, len) = token_word(t);
            buf[pos..pos + 8].copy_from_slice(&word.to_le_bytes());
            pos += len;
        }
    }
    buf[pos] = NULL;
    pos + 1
}

/// `cbor2.dumps((parent, tuple(tokens), extra), canonical=True)` into `out` (cleared
/// first); `extra` `None` is CBOR null, `Some(keys)` the array of `keys`.
pub fn dumps_block(out: &mut Vec<u8>, parent: &[u8], tokens: &[u32], extra: Option<&[KeyValue]>) {
    out.clear();
    out.resize(fast_block_bound(parent.len(), tokens.len()), 0);
    let len = write_block_fast(out, parent, tokens);
    match extra {
        None => out.truncate(len),
        Some(keys) => {
            out.truncate(len - 1); // the trailing null becomes the array of keys
            head(out, ARRAY, keys.len() as u64);
            for k in keys {
                encode(out, k);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn hand_checked_streams() {
        // cbor2.dumps((1, -1, 'a', b'b', None, True, False), canonical=True)
        let v = KeyValue::tuple([
            KeyValue::Int(1),
            KeyValue::Int(-1),
            "a".into(),
            KeyValue::Bytes(b"b".to_vec()),
            KeyValue::None,
            true.into(),
            false.into(),
        ]);
        assert_eq!(hex(&dumps(&v)), "87012061614162f6f5f4");
        assert_eq!(hex(&dumps(&KeyValue::Int(24))), "1818");
        assert_eq!(hex(&dumps(&KeyValue::Int(65536))), "1a00010000");
        assert_eq!(hex(&dumps(&KeyValue::Int(-25))), "3818");
        assert_eq!(
            hex(&dumps(&KeyValue::int(1 << 64))),
            "c249010000000000000000"
        );
        assert_eq!(
            hex(&dumps(&KeyValue::int(-(1 << 64)))),
            "3bffffffffffffffff"
        );
        assert_eq!(
            hex(&dumps(&KeyValue::int(-(1 << 64) - 1))),
            "c349010000000000000000"
        );
        assert_eq!(hex(&dumps(&KeyValue::Tuple(vec![]))), "80");
    }

    #[test]
    fn token_words_match_heads() {
        for t in [
            0u32,
            1,
            23,
            24,
            25,
            255,
            256,
            4660,
            65535,
            65536,
            0x0102_0304,
            u32::MAX,
        ] {
            let (word, len) = token_word(t);
            let mut expect = Vec::new();
            head(&mut expect, UINT, u64::from(t));
            assert_eq!(&word.to_le_bytes()[..len], &expect[..], "{t}");
        }
    }

    #[test]
    fn block_matches_generic_encoding() {
        let parent = [9u8; 16];
        let all = [0u32, 23, 24, 255, 256, 65535, 65536, u32::MAX];
        // Only 5-byte tokens (the fixed-width path) and mixed ones.
        let big = [65536u32, 0x0102_0304, u32::MAX, 1 << 31];
        for (n, set) in [0usize, 1, 8, 23, 24, 300]
            .into_iter()
            .flat_map(|n| [(n, &all[..]), (n, &big[..])])
        {
            let tokens: Vec<u32> = set.iter().copied().cycle().take(n).collect();
            let mut out = Vec::new();
            dumps_block(&mut out, &parent, &tokens, None);
            let generic = dumps(&KeyValue::tuple([
                KeyValue::Bytes(parent.to_vec()),
                KeyValue::Tuple(tokens.iter().map(|&t| KeyValue::from(t)).collect()),
                KeyValue::None,
            ]));
            assert_eq!(out, generic, "{n} tokens");
        }
    }

    proptest::proptest! {
        #[test]
        fn fast_block_path_equals_the_general_encoder(
            tokens in proptest::collection::vec(proptest::prelude::any::<u32>(), 0..200),
            parent in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
        ) {
            let mut fast = Vec::new();
            dumps_block(&mut fast, &parent, &tokens, None);
            let generic = dumps(&KeyValue::tuple([
                KeyValue::Bytes(parent.clone()),
                KeyValue::Tuple(tokens.iter().map(|&t| KeyValue::from(t)).collect()),
                KeyValue::None,
            ]));
            proptest::prop_assert_eq!(fast, generic);
        }
    }
}
