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

/// A major type with its argument, in the shortest form.
#[inline(always)]
pub(crate) fn head(out: &mut Vec<u8>, major: u8, arg: u64) {
    let mt = major << 5;
    if arg < 24 {
        out.push(mt | arg as u8);
    } else if arg <= 0xff {
        out.extend_from_slice(&[mt | 24, arg as u8]);
    } else if arg <= 0xffff {
        out.push(mt | 25);
        out.extend_from_slice(&(arg as u16).to_be_bytes());
    } else if arg <= 0xffff_ffff {
        out.push(mt | 26);
        out.extend_from_slice(&(arg as u32).to_be_bytes());
    } else {
        out.push(mt | 27);
        out.extend_from_slice(&arg.to_be_bytes());
    }
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

/// `cbor2.dumps((parent, tuple(tokens), extra), canonical=True)` into `out` (cleared
/// first); `extra` `None` is CBOR null, `Some(keys)` the array of `keys`.
pub fn dumps_block(out: &mut Vec<u8>, parent: &[u8], tokens: &[u32], extra: Option<&[KeyValue]>) {
    out.clear();
    out.push((ARRAY << 5) | 3);
    head(out, BYTES, parent.len() as u64);
    out.extend_from_slice(parent);
    head(out, ARRAY, tokens.len() as u64);
    for &t in tokens {
        head(out, UINT, u64::from(t));
    }
    match extra {
        None => out.push(NULL),
        Some(keys) => {
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
    fn block_matches_generic_encoding() {
        let parent = [9u8; 16];
        let tokens = [0u32, 23, 24, 255, 256, 65535, 65536, u32::MAX];
        let mut out = Vec::new();
        dumps_block(&mut out, &parent, &tokens, None);
        let generic = dumps(&KeyValue::tuple([
            KeyValue::Bytes(parent.to_vec()),
            KeyValue::Tuple(tokens.iter().map(|&t| KeyValue::from(t)).collect()),
            KeyValue::None,
        ]));
        assert_eq!(out, generic);
    }
}
