//! The exact bytes of CPython's `pickle.dumps(obj, protocol=5)` (the C pickler) for the
//! objects vLLM hashes: `(parent_hash, tuple(tokens), extra_keys_or_None)` and extra-key
//! values (None, bool, int of any size, str, bytes, nested tuples).
//!
//! What the C pickler does, and this module reproduces:
//! - `PROTO 5`, then framing: the output after `PROTO` is cut into frames; a frame is
//!   written as `FRAME <u64le len>` + payload when the payload has at least 4 bytes, and
//!   bare otherwise. A frame is closed at the start of saving an object once it holds at
//!   least 64 KiB, and around a str/bytes payload of at least 64 KiB, which is written
//!   outside any frame (its opcode header too). `STOP` ends the last frame.
//! - ints: `K` (0..=0xff), `M` (..=0xffff), `J` (signed 32-bit), else `LONG1`/`LONG4` with
//!   the minimal two's-complement little-endian bytes.
//! - str: `SHORT_BINUNICODE` / `BINUNICODE` / `BINUNICODE8` of the UTF-8 bytes; bytes:
//!   `SHORT_BINBYTES` / `BINBYTES` / `BINBYTES8`; both followed by `MEMOIZE`.
//! - tuples: `EMPTY_TUPLE` (not memoised), `TUPLE1..3` after the items, or `MARK` items
//!   `TUPLE`; then `MEMOIZE`.
//! - `None`, `NEWTRUE`/`NEWFALSE`; ints, bools and None are never memoised.
//! - A second occurrence of the SAME object is written as `BINGET`/`LONG_BINGET`.
//!
//! Object identity. The memo is keyed by object identity, which a value model does not
//! have, so we assume exactly what holds for the keys vLLM builds:
//! - strings equal to one of vLLM's tag literals (`"lora"`, `"mm"`, `"cache_salt"`,
//!   `"prompt_embeds"`) are one interned object, and so are CPython's singleton strings
//!   (`""` and every one-character string below U+0100): a repeat within one pickle is a
//!   `BINGET`;
//! - `b""` and one-byte bytes are singletons too (as most CPython constructors return
//!   them; `bytes(bytearray(...))` is an exception): a repeat is a `BINGET`;
//! - every other str / bytes / tuple is a distinct object even when equal to an earlier
//!   one (identifiers, names, paths, salts and digests are created per request / block).
//!
//! This differs from CPython only if one non-singleton object appears twice in the same
//! key, or a runtime string equals a tag. vLLM's key builders create each value afresh;
//! the one case we cannot see is two multimodal items of one block whose identifier
//! strings are the same object (the same image twice, if vLLM reused the hash string):
//! we treat them as two objects.

use smallvec::SmallVec;

use super::value::{BigInt, KeyValue};

const PROTO: u8 = 0x80;
const FRAME: u8 = 0x95;
const STOP: u8 = b'.';
const NONE: u8 = b'N';
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const BININT: u8 = b'J';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const LONG1: u8 = 0x8a;
const LONG4: u8 = 0x8b;
const SHORT_BINUNICODE: u8 = 0x8c;
const BINUNICODE: u8 = b'X';
const BINUNICODE8: u8 = 0x8d;
const SHORT_BINBYTES: u8 = b'C';
const BINBYTES: u8 = b'B';
const BINBYTES8: u8 = 0x8e;
const EMPTY_TUPLE: u8 = b')';
const MARK: u8 = b'(';
const TUPLE: u8 = b't';
const TUPLE1: u8 = 0x85;
const TUPLE2: u8 = 0x86;
const TUPLE3: u8 = 0x87;
const MEMOIZE: u8 = 0x94;
const BINGET: u8 = b'h';
const LONG_BINGET: u8 = b'j';

const FRAME_HEADER_SIZE: usize = 9;
const FRAME_SIZE_MIN: usize = 4;
const FRAME_SIZE_TARGET: usize = 64 * 1024;

/// vLLM's tag literals: interned strings, so equal occurrences are one object.
pub const INTERNED_TAGS: [&str; 4] = ["lora", "mm", "cache_salt", "prompt_embeds"];

/// Whether CPython would hand out one shared object for every str equal to `s`.
fn str_is_shared(s: &str) -> bool {
    let mut chars = s.chars();
    match (chars.next(), chars.next()) {
        (None, _) => true,
        (Some(c), None) => u32::from(c) < 0x100,
        _ => INTERNED_TAGS.contains(&s),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Shared<'v> {
    Str(&'v str),
    Bytes(&'v [u8]),
}

/// A protocol-5 pickler writing into a caller's buffer.
struct Pickler<'v, 'o> {
    out: &'o mut Vec<u8>,
    /// Where the current frame's 9-byte header placeholder starts.
    frame_start: Option<usize>,
    framing: bool,
    memo_len: u32,
    shared: SmallVec<[(Shared<'v>, u32); 8]>,
}

impl<'v, 'o> Pickler<'v, 'o> {
    fn start(out: &'o mut Vec<u8>) -> Self {
        out.clear();
        out.extend_from_slice(&[PROTO, 5]);
        Pickler {
            out,
            frame_start: None,
            framing: true,
            memo_len: 0,
            shared: SmallVec::new(),
        }
    }

    fn finish(mut self) {
        self.write(&[STOP]);
        self.commit_frame();
    }

    fn write(&mut self, data: &[u8]) {
        if self.framing && self.frame_start.is_none() {
            self.frame_start = Some(self.out.len());
            self.out.extend_from_slice(&[0u8; FRAME_HEADER_SIZE]);
        }
        self.out.extend_from_slice(data);
    }

    fn commit_frame(&mut self) {
        let Some(start) = self.frame_start.take() else {
            return;
        };
        let len = self.out.len() - start - FRAME_HEADER_SIZE;
        if len >= FRAME_SIZE_MIN {
            let mut header = [0u8; FRAME_HEADER_SIZE];
            header[0] = FRAME;
            header[1..].copy_from_slice(&(len as u64).to_le_bytes());
            self.out[start..start + FRAME_HEADER_SIZE].copy_from_slice(&header);
        } else {
            self.out.drain(start..start + FRAME_HEADER_SIZE);
        }
    }

    /// Called at the start of saving every object.
    fn opcode_boundary(&mut self) {
        if let Some(start) = self.frame_start {
            if self.out.len() - start - FRAME_HEADER_SIZE >= FRAME_SIZE_TARGET {
                self.commit_frame();
            }
        }
    }

    /// A str/bytes opcode header and its payload; large payloads go outside frames.
    fn write_payload(&mut self, header: &[u8], data: &[u8]) {
        if data.len() >= FRAME_SIZE_TARGET {
            self.commit_frame();
            let framing = std::mem::replace(&mut self.framing, false);
            self.write(header);
            self.write(data);
            self.framing = framing;
        } else {
            self.write(header);
            self.write(data);
        }
    }

    fn memoize(&mut self) {
        self.write(&[MEMOIZE]);
        self.memo_len += 1;
    }

    /// `BINGET` for a shared value seen before; otherwise remember where it will be.
    fn lookup_shared(&mut self, key: Shared<'v>) -> bool {
        if let Some(&(_, idx)) = self.shared.iter().find(|(k, _)| *k == key) {
            match u8::try_from(idx) {
                Ok(i) => self.write(&[BINGET, i]),
                Err(_) => {
                    let mut op = [LONG_BINGET, 0, 0, 0, 0];
                    op[1..].copy_from_slice(&idx.to_le_bytes());
                    self.write(&op);
                }
            }
            return true;
        }
        // The value is written next and gets memo index `memo_len`.
        self.shared.push((key, self.memo_len));
        false
    }

    fn save(&mut self, v: &'v KeyValue) {
        self.opcode_boundary();
        match v {
            KeyValue::None => self.write(&[NONE]),
            KeyValue::Bool(b) => self.write(&[if *b { NEWTRUE } else { NEWFALSE }]),
            KeyValue::Int(x) => self.save_i64(*x),
            KeyValue::BigInt(x) => self.save_bigint(x),
            KeyValue::Str(s) => {
                if str_is_shared(s) && self.lookup_shared(Shared::Str(s)) {
                    return;
                }
                self.save_str(s);
            }
            KeyValue::Bytes(b) => {
                if b.len() <= 1 && self.lookup_shared(Shared::Bytes(b)) {
                    return;
                }
                self.save_bytes(b);
            }
            KeyValue::Tuple(items) => {
                self.begin_tuple(items.len());
                for item in items {
                    self.save(item);
                }
                self.end_tuple(items.len());
            }
        }
    }

    /// The items of a token tuple (each an int saved with its own opcode boundary).
    fn save_tokens(&mut self, tokens: &[u32]) {
        let in_frame = self
            .frame_start
            .map_or(0, |start| self.out.len() - start - FRAME_HEADER_SIZE);
        if self.frame_start.is_some()
            && in_frame + MAX_TOKEN_BYTES * tokens.len() < FRAME_SIZE_TARGET
        {
            // No boundary inside the tuple can close the frame: write the ids in bulk.
            let start = self.out.len();
            self.out
                .resize(start + MAX_TOKEN_BYTES * tokens.len() + 8, 0);
            let mut pos = start;
            for &t in tokens {
                let (word, len) = token_word(t);
                self.out[pos..pos + 8].copy_from_slice(&word.to_le_bytes());
                pos += len;
            }
            self.out.truncate(pos);
            return;
        }
        let mut buf = [0u8; 8];
        for &t in tokens {
            self.opcode_boundary();
            let n = encode_token(t, &mut buf);
            self.write(&buf[..n]);
        }
    }

    fn begin_tuple(&mut self, n: usize) {
        if n > 3 {
            self.write(&[MARK]);
        }
    }

    fn end_tuple(&mut self, n: usize) {
        match n {
            0 => self.write(&[EMPTY_TUPLE]),
            1 => self.write(&[TUPLE1]),
            2 => self.write(&[TUPLE2]),
            3 => self.write(&[TUPLE3]),
            _ => self.write(&[TUPLE]),
        }
        if n > 0 {
            self.memoize();
        }
    }

    fn save_i64(&mut self, x: i64) {
        if let Ok(small) = i32::try_from(x) {
            let mut buf = [0u8; 5];
            let n = encode_small_int(small, &mut buf);
            self.write(&buf[..n]);
        } else {
            self.save_long(&BigInt::from_i64(x));
        }
    }

    fn save_bigint(&mut self, x: &BigInt) {
        match x.to_i128().and_then(|v| i64::try_from(v).ok()) {
            Some(v) => self.save_i64(v),
            None => self.save_long(x),
        }
    }

    /// `LONG1` / `LONG4` with Python's `encode_long` bytes (never called for 0).
    fn save_long(&mut self, x: &BigInt) {
        let data = encode_long(x);
        if let Ok(n) = u8::try_from(data.len()) {
            self.write(&[LONG1, n]);
        } else {
            let mut op = [LONG4, 0, 0, 0, 0];
            op[1..].copy_from_slice(&(data.len() as u32).to_le_bytes());
            self.write(&op);
        }
        self.write(&data);
    }

    fn save_str(&mut self, s: &str) {
        let b = s.as_bytes();
        let mut header = [0u8; 9];
        let n = sized_header(
            &mut header,
            b.len(),
            SHORT_BINUNICODE,
            BINUNICODE,
            BINUNICODE8,
        );
        self.write_payload(&header[..n], b);
        self.memoize();
    }

    fn save_bytes(&mut self, b: &[u8]) {
        let mut header = [0u8; 9];
        let n = sized_header(&mut header, b.len(), SHORT_BINBYTES, BINBYTES, BINBYTES8);
        self.write_payload(&header[..n], b);
        self.memoize();
    }
}

/// Opcode + length for str/bytes: 1-byte length up to 255, 4-byte up to 2^32-1, else 8.
fn sized_header(out: &mut [u8; 9], len: usize, short: u8, mid: u8, long: u8) -> usize {
    if let Ok(l) = u8::try_from(len) {
        out[0] = short;
        out[1] = l;
        2
    } else if let Ok(l) = u32::try_from(len) {
        out[0] = mid;
        out[1..5].copy_from_slice(&l.to_le_bytes());
        5
    } else {
        out[0] = long;
        out[1..9].copy_from_slice(&(len as u64).to_le_bytes());
        9
    }
}

/// `K` / `M` / `J` for an int in the signed 32-bit range; returns the length written.
#[inline(always)]
fn encode_small_int(x: i32, buf: &mut [u8; 5]) -> usize {
    if (0..=0xff).contains(&x) {
        buf[0] = BININT1;
        buf[1] = x as u8;
        2
    } else if (0..=0xffff).contains(&x) {
        buf[0] = BININT2;
        buf[1..3].copy_from_slice(&(x as u16).to_le_bytes());
        3
    } else {
        buf[0] = BININT;
        buf[1..5].copy_from_slice(&x.to_le_bytes());
        5
    }
}

/// Python's `pickle.encode_long`: `(bit_length >> 3) + 1` two's-complement little-endian
/// bytes, minus one redundant 0xff sign byte for some negatives.
fn encode_long(x: &BigInt) -> Vec<u8> {
    if x.is_zero() {
        return Vec::new();
    }
    let nbytes = (x.bit_length() >> 3) + 1;
    let mut data = x.to_signed_le(nbytes);
    if x.is_negative() && nbytes > 1 {
        if let [.., second_last, last] = data[..] {
            if last == 0xff && second_last & 0x80 != 0 {
                data.pop();
            }
        }
    }
    data
}

/// One token id as pickle writes the Python int, as (little-endian word, length):
/// `K`/`M`/`J`, or `LONG1` with 5 bytes for ids >= 2^31 (J is signed). Branch-free.
#[inline(always)]
fn token_word(t: u32) -> (u64, usize) {
    let class = token_class(t);
    (
        (u64::from(t) << TOKEN_SHIFT[class]) | TOKEN_HEAD[class],
        TOKEN_LEN[class],
    )
}

/// Per token class: the opcode (and `LONG1`'s length byte), where the id's bytes start,
/// and the bytes written.
const TOKEN_HEAD: [u64; 4] = [
    BININT1 as u64,
    BININT2 as u64,
    BININT as u64,
    LONG1 as u64 | (5 << 8),
];
const TOKEN_SHIFT: [u32; 4] = [8, 8, 8, 16];
const TOKEN_LEN: [usize; 4] = [2, 3, 5, 7];

/// The opcode class of a token id in [`token_word`]'s tables (0: `K`, 1: `M`, 2: `J`,
/// 3: `LONG1`).
#[inline(always)]
fn token_class(t: u32) -> usize {
    (usize::from(t > 0xff) + usize::from(t > 0xffff) + usize::from(t > 0x7fff_ffff)) & 3
}

/// The pickle bytes of `tokens` at `buf[pos..]` (8 bytes of room past the end); returns
/// the position after them. When every token has the same opcode (block-hash streams of
/// large ids, e.g. Mooncake prompts, are all `J`), each lands at a fixed place: no chain
/// through the stream position.
#[inline(always)]
fn write_tokens(buf: &mut [u8], pos: usize, tokens: &[u32]) -> usize {
    let (lo, hi) = tokens
        .iter()
        .fold((u32::MAX, 0u32), |(lo, hi), &t| (lo.min(t), hi.max(t)));
    if tokens.is_empty() || token_class(lo) != token_class(hi) {
        let mut pos = pos;
        for &t in tokens {
            let (word, len) = token_word(t);
            buf[pos..pos + 8].copy_from_slice(&word.to_le_bytes());
            pos += len;
        }
        return pos;
    }
    match token_class(lo) {
        0 => write_fixed::<0>(buf, pos, tokens),
        1 => write_fixed::<1>(buf, pos, tokens),
        2 => write_fixed::<2>(buf, pos, tokens),
        _ => write_fixed::<3>(buf, pos, tokens),
    }
}

/// [`write_tokens`] for tokens that are all of class `C`.
#[inline(always)]
fn write_fixed<const C: usize>(buf: &mut [u8], pos: usize, tokens: &[u32]) -> usize {
    let (head, shift, w) = (TOKEN_HEAD[C], TOKEN_SHIFT[C], TOKEN_LEN[C]);
    let end = pos + w * tokens.len();
    let out = &mut buf[pos..end + 8];
    for (k, &t) in tokens.iter().enumerate() {
        let word = (u64::from(t) << shift) | head;
        out[w * k..w * k + 8].copy_from_slice(&word.to_le_bytes());
    }
    end
}

/// One token id's pickle bytes into `buf`; returns the length.
#[inline(always)]
fn encode_token(t: u32, buf: &mut [u8; 8]) -> usize {
    let (word, len) = token_word(t);
    *buf = word.to_le_bytes();
    len
}

/// Largest pickled size of one token id.
const MAX_TOKEN_BYTES: usize = 7;

/// Bytes [`write_block_fast`] may touch for a block of `n` tokens (8-byte stores included).
pub(crate) fn fast_block_bound(parent_len: usize, n: usize) -> usize {
    24 + parent_len + MAX_TOKEN_BYTES * n + 8
}

/// Whether a block takes the fast path: no extra keys, parent <= 255 bytes, and a stream
/// far below the 64 KiB frame target (so exactly one frame and no memo lookups).
pub(crate) fn fast_path_applies(parent_len: usize, n: usize) -> bool {
    parent_len <= 255 && n <= 8192
}

/// The common block without the frame bookkeeping: `PROTO 5 FRAME <len> SHORT_BINBYTES
/// parent MEMOIZE [MARK] tokens TUPLE* MEMOIZE NONE TUPLE3 MEMOIZE STOP`. The payload is
/// always >= 4 bytes, so it is framed. `buf` must hold [`fast_block_bound`] bytes (bytes
/// past the returned length may be overwritten); returns the stream length.
#[inline]
pub(crate) fn write_block_fast(buf: &mut [u8], parent: &[u8], tokens: &[u32]) -> usize {
    let p = parent.len();
    buf[..11].copy_from_slice(&[PROTO, 5, FRAME, 0, 0, 0, 0, 0, 0, 0, 0]);
    buf[11] = SHORT_BINBYTES;
    buf[12] = p as u8;
    buf[13..13 + p].copy_from_slice(parent);
    buf[13 + p] = MEMOIZE;
    let mut pos = 14 + p;
    if tokens.len() > 3 {
        buf[pos] = MARK;
        pos += 1;
    }
    pos = write_tokens(buf, pos, tokens);
    let tail: &[u8] = match tokens.len() {
        0 => &[EMPTY_TUPLE, NONE, TUPLE3, MEMOIZE, STOP],
        1 => &[TUPLE1, MEMOIZE, NONE, TUPLE3, MEMOIZE, STOP],
        2 => &[TUPLE2, MEMOIZE, NONE, TUPLE3, MEMOIZE, STOP],
        3 => &[TUPLE3, MEMOIZE, NONE, TUPLE3, MEMOIZE, STOP],
        _ => &[TUPLE, MEMOIZE, NONE, TUPLE3, MEMOIZE, STOP],
    };
    buf[pos..pos + tail.len()].copy_from_slice(tail);
    pos += tail.len();
    buf[3..11].copy_from_slice(&((pos - 11) as u64).to_le_bytes());
    pos
}

/// `pickle.dumps(value, protocol=5)`.
pub fn dumps(value: &KeyValue) -> Vec<u8> {
    let mut out = Vec::new();
    dumps_into(&mut out, value);
    out
}

/// `pickle.dumps(value, protocol=5)` into `out` (cleared first).
pub fn dumps_into(out: &mut Vec<u8>, value: &KeyValue) {
    let mut p = Pickler::start(out);
    p.save(value);
    p.finish();
}

/// `pickle.dumps((parent, tuple(tokens), extra), protocol=5)` into `out` (cleared first),
/// with `extra` `None` for a pickled `None` and `Some(keys)` for the tuple of `keys`.
pub fn dumps_block(out: &mut Vec<u8>, parent: &[u8], tokens: &[u32], extra: Option<&[KeyValue]>) {
    if extra.is_none() && fast_path_applies(parent.len(), tokens.len()) {
        out.clear();
        out.resize(fast_block_bound(parent.len(), tokens.len()), 0);
        let len = write_block_fast(out, parent, tokens);
        out.truncate(len);
        return;
    }
    let mut p = Pickler::start(out);
    p.opcode_boundary(); // the outer tuple
    p.opcode_boundary(); // the parent bytes
    if parent.len() <= 1 {
        // A singleton bytes object: nothing is memoised before it, so no lookup hits.
        p.shared.push((Shared::Bytes(parent), 0));
    }
    p.save_bytes(parent);
    p.opcode_boundary(); // the token tuple
    p.begin_tuple(tokens.len());
    p.save_tokens(tokens);
    p.end_tuple(tokens.len());
    match extra {
        None => {
            p.opcode_boundary();
            p.write(&[NONE]);
        }
        Some(keys) => {
            p.opcode_boundary();
            p.begin_tuple(keys.len());
            for k in keys {
                p.save(k);
            }
            p.end_tuple(keys.len());
        }
    }
    p.write(&[TUPLE3]);
    p.memoize();
    p.finish();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn small_objects_are_not_framed() {
        assert_eq!(hex(&dumps(&KeyValue::None)), "80054e2e");
        assert_eq!(hex(&dumps(&KeyValue::Int(1))), "80054b012e");
        assert_eq!(hex(&dumps(&KeyValue::Tuple(vec![]))), "8005292e");
    }

    #[test]
    fn hand_checked_streams() {
        // pickle.dumps('ab', protocol=5)
        assert_eq!(
            hex(&dumps(&KeyValue::from("ab"))),
            "80059506000000000000008c026162942e"
        );
        // pickle.dumps((None, None), protocol=5)
        assert_eq!(
            hex(&dumps(&KeyValue::tuple([KeyValue::None, KeyValue::None]))),
            "80059505000000000000004e4e86942e"
        );
        // pickle.dumps(('mm', 'mm'), protocol=5): the interned tag is memoised once
        assert_eq!(
            hex(&dumps(&KeyValue::tuple(["mm".into(), "mm".into()]))),
            "8005950a000000000000008c026d6d94680086942e"
        );
        // pickle.dumps(2**31, protocol=5) and pickle.dumps(-2**31 - 1, ...)
        assert_eq!(
            hex(&dumps(&KeyValue::Int(1 << 31))),
            "80059508000000000000008a0500000080002e"
        );
        assert_eq!(
            hex(&dumps(&KeyValue::Int(-(1 << 31) - 1))),
            "80059508000000000000008a05ffffff7fff2e"
        );
        // pickle.dumps(-128, protocol=5) is J; pickle.dumps(-2**63, ...) drops a sign byte
        assert_eq!(
            hex(&dumps(&KeyValue::Int(-128))),
            "80059506000000000000004a80ffffff2e"
        );
        assert_eq!(
            hex(&dumps(&KeyValue::Int(i64::MIN))),
            "8005950b000000000000008a0800000000000000802e"
        );
    }

    #[test]
    fn block_fast_and_generic_paths_agree() {
        let parent = [7u8; 32];
        let tokens: Vec<u32> = vec![
            0,
            255,
            256,
            65535,
            65536,
            0x7fff_ffff,
            0x8000_0000,
            u32::MAX,
        ];
        for n in 0..tokens.len() {
            let mut fast = vec![0u8; fast_block_bound(32, n)];
            let len = write_block_fast(&mut fast, &parent, &tokens[..n]);
            fast.truncate(len);
            let generic = dumps(&KeyValue::tuple([
                KeyValue::Bytes(parent.to_vec()),
                KeyValue::Tuple(tokens[..n].iter().map(|&t| KeyValue::from(t)).collect()),
                KeyValue::None,
            ]));
            assert_eq!(hex(&fast), hex(&generic), "{n} tokens");
            let mut via_block = Vec::new();
            dumps_block(&mut via_block, &parent, &tokens[..n], Some(&[]));
            let generic_extra = dumps(&KeyValue::tuple([
                KeyValue::Bytes(parent.to_vec()),
                KeyValue::Tuple(tokens[..n].iter().map(|&t| KeyValue::from(t)).collect()),
                KeyValue::Tuple(vec![]),
            ]));
            assert_eq!(hex(&via_block), hex(&generic_extra));
        }
    }

    #[test]
    fn large_payload_goes_outside_frames() {
        let s = "x".repeat(FRAME_SIZE_TARGET);
        let out = dumps(&KeyValue::tuple([KeyValue::Int(1), KeyValue::Str(s)]));
        // PROTO, then the 2-byte frame for `K 1` is too small and left bare, then the
        // BINUNICODE header and payload, then a bare frame of MEMOIZE TUPLE2 MEMOIZE STOP.
        assert_eq!(hex(&out[..9]), "80054b015800000100");
        assert_eq!(out.len(), 2 + 2 + 5 + FRAME_SIZE_TARGET + 9 + 4);
        assert_eq!(hex(&out[out.len() - 13..]), "9504000000000000009486942e");
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

        /// Blocks whose tokens share one opcode (written at fixed places), and the same
        /// with one token of another class in any position (the variable-width path).
        #[test]
        fn fast_block_path_equals_the_general_encoder_per_token_class(
            class in 0usize..4,
            picks in proptest::collection::vec(proptest::prelude::any::<u32>(), 0..40),
            odd in proptest::option::of((proptest::prelude::any::<usize>(), 0usize..4)),
        ) {
            const LO: [u32; 4] = [0, 0x100, 0x1_0000, 0x8000_0000];
            const SPAN: [u32; 4] = [0x100, 0xff00, 0x7fff_0000, 0x8000_0000];
            let in_class = |c: usize, x: u32| LO[c] + x % SPAN[c];
            let mut tokens: Vec<u32> = picks.iter().map(|&x| in_class(class, x)).collect();
            if let (Some((at, c)), false) = (odd, tokens.is_empty()) {
                let i = at % tokens.len();
                tokens[i] = in_class(c, picks[i]);
            }
            let mut fast = Vec::new();
            dumps_block(&mut fast, &[3u8; 32], &tokens, None);
            let generic = dumps(&KeyValue::tuple([
                KeyValue::Bytes(vec![3u8; 32]),
                KeyValue::Tuple(tokens.iter().map(|&t| KeyValue::from(t)).collect()),
                KeyValue::None,
            ]));
            proptest::prop_assert_eq!(fast, generic);
        }
    }
}
