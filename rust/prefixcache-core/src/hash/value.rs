//! The value model of vLLM's per-block extra keys: the Python objects its hash encoders
//! see (`None`, `bool`, `int` of any size, `str`, `bytes`, `tuple`).

use std::cmp::Ordering;

/// An integer of any size, as sign + magnitude (big-endian, no leading zero bytes).
///
/// Values that fit in an `i64` may be held here too: the encoders produce the same bytes
/// for `KeyValue::Int(v)` and `KeyValue::BigInt(BigInt::from_i64(v))`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BigInt {
    negative: bool,
    magnitude: Vec<u8>,
}

impl BigInt {
    /// The integer `(-1)^negative * magnitude` (`magnitude` big-endian; leading zero bytes
    /// are stripped, and zero is never negative).
    pub fn from_sign_magnitude(negative: bool, magnitude_be: &[u8]) -> Self {
        let start = magnitude_be
            .iter()
            .position(|&b| b != 0)
            .unwrap_or(magnitude_be.len());
        let magnitude = magnitude_be[start..].to_vec();
        let negative = negative && !magnitude.is_empty();
        BigInt {
            negative,
            magnitude,
        }
    }

    /// The integer whose two's-complement little-endian bytes are `bytes` (as Python's
    /// `int.from_bytes(bytes, "little", signed=True)`; empty = 0).
    pub fn from_signed_le(bytes: &[u8]) -> Self {
        let negative = bytes.last().is_some_and(|&b| b & 0x80 != 0);
        let mut be: Vec<u8> = bytes.iter().rev().copied().collect();
        if negative {
            // magnitude = -(value) = !value + 1 over the same width
            for b in be.iter_mut() {
                *b = !*b;
            }
            add_one_be(&mut be);
        }
        Self::from_sign_magnitude(negative, &be)
    }

    pub fn from_i128(v: i128) -> Self {
        Self::from_sign_magnitude(v < 0, &v.unsigned_abs().to_be_bytes())
    }

    pub fn from_i64(v: i64) -> Self {
        Self::from_i128(i128::from(v))
    }

    pub fn is_negative(&self) -> bool {
        self.negative
    }

    pub fn is_zero(&self) -> bool {
        self.magnitude.is_empty()
    }

    /// |value|, big-endian without leading zero bytes (empty for zero).
    pub fn magnitude_be(&self) -> &[u8] {
        &self.magnitude
    }

    /// The value when it fits in an `i128`.
    pub fn to_i128(&self) -> Option<i128> {
        if self.magnitude.len() > 16 {
            return None;
        }
        let m = self
            .magnitude
            .iter()
            .fold(0u128, |acc, &b| (acc << 8) | u128::from(b));
        if self.negative {
            match m.cmp(&(1u128 << 127)) {
                Ordering::Greater => None,
                Ordering::Equal => Some(i128::MIN),
                Ordering::Less => i128::try_from(m).ok().map(|x| -x),
            }
        } else {
            i128::try_from(m).ok()
        }
    }

    /// Number of bits of |value| (Python's `int.bit_length()`).
    pub fn bit_length(&self) -> usize {
        match self.magnitude.first() {
            None => 0,
            Some(&top) => (self.magnitude.len() - 1) * 8 + (8 - top.leading_zeros() as usize),
        }
    }

    /// Two's-complement little-endian bytes over exactly `n` bytes (caller makes `n` wide
    /// enough: `n * 8 > bit_length` for non-negative values, `>=` for negatives).
    pub fn to_signed_le(&self, n: usize) -> Vec<u8> {
        let mut out: Vec<u8> = self.magnitude.iter().rev().copied().collect();
        out.resize(n, 0);
        if self.negative {
            for b in out.iter_mut() {
                *b = !*b;
            }
            // +1 in little-endian
            for b in out.iter_mut() {
                let (v, carry) = b.overflowing_add(1);
                *b = v;
                if !carry {
                    break;
                }
            }
        }
        out
    }

    /// For a negative value `v`, the big-endian minimal bytes of `-1 - v` = |v| - 1 (CBOR's
    /// encoding of negative integers); for non-negative values, the magnitude.
    pub fn cbor_argument_be(&self) -> Vec<u8> {
        let mut m = self.magnitude.clone();
        if self.negative {
            // |v| >= 1, so subtracting one never underflows.
            for b in m.iter_mut().rev() {
                let (v, borrow) = b.overflowing_sub(1);
                *b = v;
                if !borrow {
                    break;
                }
            }
            let start = m.iter().position(|&b| b != 0).unwrap_or(m.len());
            m.drain(..start);
        }
        m
    }
}

fn add_one_be(be: &mut [u8]) {
    for b in be.iter_mut().rev() {
        let (v, carry) = b.overflowing_add(1);
        *b = v;
        if !carry {
            return;
        }
    }
}

/// One extra-key value. vLLM hashes `(parent, tuple(tokens), extra_keys)` where
/// `extra_keys` is `None` or a tuple of these.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KeyValue {
    None,
    Bool(bool),
    /// Fast path for ints that fit in 64 bits.
    Int(i64),
    /// Any other int (or any int at all: encoded exactly as the same value in `Int`).
    BigInt(BigInt),
    Str(String),
    Bytes(Vec<u8>),
    Tuple(Vec<KeyValue>),
}

impl KeyValue {
    /// A tuple from its items.
    pub fn tuple<I: IntoIterator<Item = KeyValue>>(items: I) -> Self {
        KeyValue::Tuple(items.into_iter().collect())
    }

    /// An int from an `i128`, as `Int` when it fits in `i64`.
    pub fn int(v: i128) -> Self {
        match i64::try_from(v) {
            Ok(x) => KeyValue::Int(x),
            Err(_) => KeyValue::BigInt(BigInt::from_i128(v)),
        }
    }

    /// The Python type name of the value (for error messages).
    pub fn type_name(&self) -> &'static str {
        match self {
            KeyValue::None => "NoneType",
            KeyValue::Bool(_) => "bool",
            KeyValue::Int(_) | KeyValue::BigInt(_) => "int",
            KeyValue::Str(_) => "str",
            KeyValue::Bytes(_) => "bytes",
            KeyValue::Tuple(_) => "tuple",
        }
    }
}

impl From<bool> for KeyValue {
    fn from(v: bool) -> Self {
        KeyValue::Bool(v)
    }
}

impl From<i64> for KeyValue {
    fn from(v: i64) -> Self {
        KeyValue::Int(v)
    }
}

impl From<i32> for KeyValue {
    fn from(v: i32) -> Self {
        KeyValue::Int(i64::from(v))
    }
}

impl From<u32> for KeyValue {
    fn from(v: u32) -> Self {
        KeyValue::Int(i64::from(v))
    }
}

impl From<u64> for KeyValue {
    fn from(v: u64) -> Self {
        KeyValue::int(i128::from(v))
    }
}

impl From<BigInt> for KeyValue {
    fn from(v: BigInt) -> Self {
        KeyValue::BigInt(v)
    }
}

impl From<&str> for KeyValue {
    fn from(v: &str) -> Self {
        KeyValue::Str(v.to_owned())
    }
}

impl From<String> for KeyValue {
    fn from(v: String) -> Self {
        KeyValue::Str(v)
    }
}

impl From<&[u8]> for KeyValue {
    fn from(v: &[u8]) -> Self {
        KeyValue::Bytes(v.to_vec())
    }
}

impl From<Vec<u8>> for KeyValue {
    fn from(v: Vec<u8>) -> Self {
        KeyValue::Bytes(v)
    }
}

impl From<Vec<KeyValue>> for KeyValue {
    fn from(v: Vec<KeyValue>) -> Self {
        KeyValue::Tuple(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bigint_roundtrips_i128() {
        for v in [
            0i128,
            1,
            -1,
            127,
            128,
            -128,
            -129,
            255,
            256,
            i128::from(i64::MAX),
            i128::from(i64::MIN),
            i128::MAX,
            i128::MIN,
        ] {
            let b = BigInt::from_i128(v);
            assert_eq!(b.to_i128(), Some(v), "{v}");
            let n = b.bit_length() / 8 + 1;
            assert_eq!(BigInt::from_signed_le(&b.to_signed_le(n)), b, "{v}");
        }
    }

    #[test]
    fn bigint_bit_length_and_cbor_argument() {
        assert_eq!(BigInt::from_i128(0).bit_length(), 0);
        assert_eq!(BigInt::from_i128(255).bit_length(), 8);
        assert_eq!(BigInt::from_i128(-256).bit_length(), 9);
        assert_eq!(BigInt::from_i128(-256).cbor_argument_be(), vec![0xff]);
        assert_eq!(BigInt::from_i128(-1).cbor_argument_be(), Vec::<u8>::new());
        assert_eq!(
            BigInt::from_sign_magnitude(true, &[0, 0]),
            BigInt::from_i128(0)
        );
    }
}
