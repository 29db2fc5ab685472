//! Hash encoders and block hasher on arbitrary `KeyValue` trees.
//!
//! - pickle and CBOR writers never panic, are deterministic, and their output decodes
//!   (with the small independent decoders below) back to the same value: every opcode is
//!   known, frames are well formed, memo references point at earlier objects, CBOR heads
//!   are minimal (canonical) and bignum tags are used only beyond 64 bits;
//! - the block encoders (the allocation-free fast path included) write exactly the bytes
//!   of the general encoder for the tuple `(parent, tuple(tokens), extra)`;
//! - `hash_block` is the digest of those bytes, and `hash_blocks` equals chained
//!   `hash_block` calls.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use prefixcache_core::hash::{cbor, pickle, BigInt, BlockHash, BlockHasher, HashAlgo, KeyValue};

#[derive(Arbitrary, Debug)]
enum V {
    None,
    Bool(bool),
    Int(i64),
    Big(bool, Vec<u8>),
    Str(String),
    Bytes(Vec<u8>),
    /// A long string / bytes (framing thresholds, 2- and 4-byte length heads).
    Long(bool, u16, u8),
    Tag(u8),
    Tuple(Vec<V>),
}

fn build(v: &V, budget: &mut usize) -> KeyValue {
    *budget = budget.saturating_sub(1);
    match v {
        V::None => KeyValue::None,
        V::Bool(b) => KeyValue::Bool(*b),
        V::Int(i) => KeyValue::Int(*i),
        V::Big(neg, m) => {
            KeyValue::BigInt(BigInt::from_sign_magnitude(*neg, &m[..m.len().min(40)]))
        }
        V::Str(s) => KeyValue::Str(s.clone()),
        V::Bytes(b) => KeyValue::Bytes(b.clone()),
        V::Long(is_str, n, c) => {
            let n = usize::from(*n) * 2;
            if *is_str {
                KeyValue::Str(char::from(b'a' + c % 26).to_string().repeat(n))
            } else {
                KeyValue::Bytes(vec![*c; n])
            }
        }
        V::Tag(t) => KeyValue::Str(
            [
                "lora",
                "mm",
                "cache_salt",
                "prompt_embeds",
                "",
                "x",
                "\u{ff}",
                "\u{100}",
            ][usize::from(t % 8)]
            .into(),
        ),
        V::Tuple(items) => {
            let mut out = Vec::new();
            for it in items {
                if *budget == 0 {
                    break;
                }
                out.push(build(it, budget));
            }
            KeyValue::Tuple(out)
        }
    }
}

/// Ints as sign + magnitude, so `Int(v)` and `BigInt(v)` compare equal.
#[derive(Debug, PartialEq, Eq, Clone)]
enum N {
    None,
    Bool(bool),
    Int(bool, Vec<u8>),
    Str(String),
    Bytes(Vec<u8>),
    Tuple(Vec<N>),
}

fn int(neg: bool, be: &[u8]) -> N {
    let b = BigInt::from_sign_magnitude(neg, be);
    N::Int(b.is_negative(), b.magnitude_be().to_vec())
}

fn norm(v: &KeyValue) -> N {
    match v {
        KeyValue::None => N::None,
        KeyValue::Bool(b) => N::Bool(*b),
        KeyValue::Int(i) => int(*i < 0, &i.unsigned_abs().to_be_bytes()),
        KeyValue::BigInt(b) => int(b.is_negative(), b.magnitude_be()),
        KeyValue::Str(s) => N::Str(s.clone()),
        KeyValue::Bytes(b) => N::Bytes(b.clone()),
        KeyValue::Tuple(t) => N::Tuple(t.iter().map(norm).collect()),
    }
}

// ---- a small pickle (protocol 5) decoder for the opcodes the writer may emit ----

struct Rd<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Rd<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let s = self
            .b
            .get(self.pos..self.pos + n)
            .unwrap_or_else(|| panic!("truncated at {}", self.pos));
        self.pos += n;
        s
    }
    fn u8(&mut self) -> u8 {
        self.take(1)[0]
    }
    fn le(&mut self, n: usize) -> u64 {
        self.take(n)
            .iter()
            .rev()
            .fold(0u64, |a, &x| (a << 8) | u64::from(x))
    }
    fn be(&mut self, n: usize) -> u64 {
        self.take(n)
            .iter()
            .fold(0u64, |a, &x| (a << 8) | u64::from(x))
    }
}

fn signed_le(bytes: &[u8]) -> N {
    let b = BigInt::from_signed_le(bytes);
    N::Int(b.is_negative(), b.magnitude_be().to_vec())
}

fn unpickle(data: &[u8]) -> N {
    let mut r = Rd { b: data, pos: 0 };
    assert_eq!(r.take(2), [0x80, 5], "PROTO 5");
    let mut stack: Vec<Option<N>> = Vec::new(); // None = MARK
    let mut memo: Vec<N> = Vec::new();
    let mut frame_end: Option<usize> = None;
    loop {
        if let Some(e) = frame_end {
            assert!(r.pos <= e, "opcode crosses the frame end");
            if r.pos == e {
                frame_end = None;
            }
        }
        let op = r.u8();
        let push_str = |s: &[u8]| N::Str(String::from_utf8(s.to_vec()).expect("utf-8"));
        let v = match op {
            0x95 => {
                assert!(frame_end.is_none(), "FRAME inside a frame");
                let n = r.le(8) as usize;
                assert!(
                    n >= 4,
                    "frame of {n} bytes (the C pickler writes none under 4)"
                );
                assert!(r.pos + n <= data.len(), "frame past the end");
                frame_end = Some(r.pos + n);
                continue;
            }
            b'.' => {
                assert_eq!(r.pos, data.len(), "bytes after STOP");
                assert_eq!(stack.len(), 1, "STOP with a stack of {}", stack.len());
                return stack.pop().flatten().expect("STOP on a MARK");
            }
            b'N' => N::None,
            0x88 => N::Bool(true),
            0x89 => N::Bool(false),
            b'K' => int(false, &[r.u8()]),
            b'M' => int(false, &r.le(2).to_be_bytes()),
            b'J' => {
                let v = r.le(4) as u32 as i32;
                assert!(
                    !(0..=0xffff).contains(&v),
                    "BININT for a value K/M would take"
                );
                int(v < 0, &i64::from(v).unsigned_abs().to_be_bytes())
            }
            0x8a | 0x8b => {
                let n = if op == 0x8a {
                    r.u8() as usize
                } else {
                    r.le(4) as usize
                };
                let v = signed_le(r.take(n));
                if let N::Int(_, m) = &v {
                    assert!(m.len() >= 4, "LONG for a value BININT would take");
                }
                v
            }
            0x8c => {
                let n = r.u8() as usize;
                push_str(r.take(n))
            }
            b'X' => {
                let n = r.le(4) as usize;
                assert!(n > 0xff);
                push_str(r.take(n))
            }
            0x8d => {
                let n = r.le(8) as usize;
                assert!(n > 0xffff_ffff);
                push_str(r.take(n))
            }
            b'C' => {
                let n = r.u8() as usize;
                N::Bytes(r.take(n).to_vec())
            }
            b'B' => {
                let n = r.le(4) as usize;
                assert!(n > 0xff);
                N::Bytes(r.take(n).to_vec())
            }
            0x8e => {
                let n = r.le(8) as usize;
                assert!(n > 0xffff_ffff);
                N::Bytes(r.take(n).to_vec())
            }
            b')' => N::Tuple(Vec::new()),
            b'(' => {
                stack.push(None);
                continue;
            }
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                assert!(stack.len() >= n, "TUPLE{n} on a short stack");
                let items: Vec<N> = stack
                    .split_off(stack.len() - n)
                    .into_iter()
                    .map(|x| x.expect("MARK in TUPLEn"))
                    .collect();
                N::Tuple(items)
            }
            b't' => {
                let m = stack
                    .iter()
                    .rposition(Option::is_none)
                    .expect("TUPLE without MARK");
                let items: Vec<N> = stack
                    .split_off(m + 1)
                    .into_iter()
                    .map(|x| x.expect("nested MARK"))
                    .collect();
                stack.pop();
                assert!(items.len() > 3, "MARK..TUPLE for {} items", items.len());
                N::Tuple(items)
            }
            0x94 => {
                let top = stack
                    .last()
                    .cloned()
                    .flatten()
                    .expect("MEMOIZE on empty stack / MARK");
                memo.push(top);
                continue;
            }
            b'h' => memo
                .get(r.u8() as usize)
                .cloned()
                .expect("BINGET past the memo"),
            b'j' => {
                let i = r.le(4) as usize;
                assert!(i > 0xff, "LONG_BINGET for a 1-byte index");
                memo.get(i).cloned().expect("LONG_BINGET past the memo")
            }
            _ => panic!("unknown opcode {op:#x} at {}", r.pos - 1),
        };
        stack.push(Some(v));
    }
}

// ---- a small canonical CBOR decoder ----

fn cbor_item(r: &mut Rd<'_>) -> N {
    let ib = r.u8();
    let (major, info) = (ib >> 5, ib & 0x1f);
    if major == 7 {
        return match ib {
            0xf4 => N::Bool(false),
            0xf5 => N::Bool(true),
            0xf6 => N::None,
            _ => panic!("unexpected simple value {ib:#x}"),
        };
    }
    let arg = match info {
        0..=23 => u64::from(info),
        24 => {
            let v = r.be(1);
            assert!(v >= 24, "non-minimal head");
            v
        }
        25 => {
            let v = r.be(2);
            assert!(v > 0xff, "non-minimal head");
            v
        }
        26 => {
            let v = r.be(4);
            assert!(v > 0xffff, "non-minimal head");
            v
        }
        27 => {
            let v = r.be(8);
            assert!(v > 0xffff_ffff, "non-minimal head");
            v
        }
        _ => panic!("indefinite or reserved length {info}"),
    };
    match major {
        0 => int(false, &arg.to_be_bytes()),
        1 => int(true, &(u128::from(arg) + 1).to_be_bytes()),
        2 => N::Bytes(r.take(arg as usize).to_vec()),
        3 => N::Str(String::from_utf8(r.take(arg as usize).to_vec()).expect("utf-8")),
        4 => N::Tuple((0..arg).map(|_| cbor_item(r)).collect()),
        6 => {
            assert!(arg == 2 || arg == 3, "tag {arg}");
            let N::Bytes(m) = cbor_item(r) else {
                panic!("bignum tag without bytes")
            };
            assert!(
                m.first().is_some_and(|&b| b != 0),
                "bignum with leading zero"
            );
            assert!(m.len() > 8, "bignum tag for a 64-bit value");
            if arg == 2 {
                int(false, &m)
            } else {
                // -1 - m: magnitude m + 1
                let mut mag = m.clone();
                let mut i = mag.len();
                loop {
                    if i == 0 {
                        mag.insert(0, 1);
                        break;
                    }
                    i -= 1;
                    if mag[i] == 0xff {
                        mag[i] = 0;
                    } else {
                        mag[i] += 1;
                        break;
                    }
                }
                int(true, &mag)
            }
        }
        _ => panic!("major type {major}"),
    }
}

fn uncbor(data: &[u8]) -> N {
    let mut r = Rd { b: data, pos: 0 };
    let v = cbor_item(&mut r);
    assert_eq!(r.pos, data.len(), "bytes after the CBOR item");
    v
}

#[derive(Arbitrary, Debug)]
struct Input {
    value: V,
    algo: u8,
    block_size: u8,
    seed: String,
    tokens: Vec<u32>,
    /// Per block: whether it has extra keys, and which of `keys` to use.
    extra: Vec<Option<Vec<V>>>,
}

fuzz_target!(|input: Input| {
    let mut budget = 200;
    let value = build(&input.value, &mut budget);
    let n = norm(&value);

    let p = pickle::dumps(&value);
    assert_eq!(p, pickle::dumps(&value), "pickle not deterministic");
    assert_eq!(unpickle(&p), n, "pickle round trip");
    let c = cbor::dumps(&value);
    assert_eq!(c, cbor::dumps(&value), "cbor not deterministic");
    assert_eq!(uncbor(&c), n, "cbor round trip");

    let algo = HashAlgo::ALL[usize::from(input.algo) % HashAlgo::ALL.len()];
    let bs = usize::from(input.block_size % 8) + 1;
    let hasher = BlockHasher::new(algo, bs, &input.seed).expect("hasher");
    assert_eq!(
        hasher.none_hash(),
        algo.digest(&algo.encode(&KeyValue::Str(input.seed.clone()))),
        "NONE_HASH"
    );
    let tokens: Vec<u32> = input.tokens.iter().take(64).copied().collect();
    let n_full = tokens.len() / bs;
    let mut extra: Vec<Option<Vec<KeyValue>>> = input
        .extra
        .iter()
        .take(n_full + 1)
        .map(|e| {
            e.as_ref().map(|ks| {
                let mut b = 40;
                ks.iter().take(4).map(|k| build(k, &mut b)).collect()
            })
        })
        .collect();
    if extra.len() < n_full {
        assert!(
            hasher.hash_blocks(&tokens, Some(&extra), None).is_err(),
            "short extra_keys accepted"
        );
        extra.resize(n_full, None);
    }
    let chained = hasher
        .hash_blocks(&tokens, Some(&extra), None)
        .expect("hash_blocks");
    assert_eq!(chained.len(), n_full);
    let mut parent: Option<BlockHash> = None;
    let mut buf = Vec::new();
    for i in 0..n_full {
        let block = &tokens[i * bs..(i + 1) * bs];
        let keys = extra[i].as_deref();
        let h = hasher
            .hash_block(parent.as_ref(), block, keys)
            .expect("hash_block");
        assert_eq!(h, chained[i], "hash_blocks != chained hash_block at {i}");
        // The block's bytes equal the general encoder's bytes for the same tuple.
        let par = parent.unwrap_or(hasher.none_hash());
        buf.clear();
        algo.encode_block(&mut buf, par.as_bytes(), block, keys);
        let tuple = KeyValue::Tuple(vec![
            KeyValue::Bytes(par.as_bytes().to_vec()),
            KeyValue::Tuple(block.iter().map(|&t| KeyValue::Int(i64::from(t))).collect()),
            keys.map_or(KeyValue::None, |k| KeyValue::Tuple(k.to_vec())),
        ]);
        assert_eq!(
            buf,
            algo.encode(&tuple),
            "block encoder != general encoder at {i}"
        );
        assert_eq!(h, algo.digest(&buf), "hash_block != digest(bytes) at {i}");
        parent = Some(h);
    }
    if n_full == 0 {
        assert!(chained.is_empty());
    }
    // Without extra keys (the fast path) too.
    let plain = hasher
        .hash_blocks(&tokens, None, None)
        .expect("hash_blocks");
    let mut parent: Option<BlockHash> = None;
    for (i, h) in plain.iter().enumerate() {
        let block = &tokens[i * bs..(i + 1) * bs];
        let one = hasher
            .hash_block(parent.as_ref(), block, None)
            .expect("hash_block");
        assert_eq!(*h, one);
        buf.clear();
        algo.encode_block(
            &mut buf,
            parent.unwrap_or(hasher.none_hash()).as_bytes(),
            block,
            None,
        );
        assert_eq!(*h, algo.digest(&buf));
        parent = Some(one);
    }
    // A parent of the wrong length is refused.
    if let Some(bad) = BlockHash::from_bytes(&[1u8; 3]) {
        if bs <= tokens.len() {
            assert!(hasher.hash_block(Some(&bad), &tokens[..bs], None).is_err());
        }
    }
});
