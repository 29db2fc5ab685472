//! A streaming msgpack reader over a byte slice: reads the values the KV event decoder
//! needs without building a value tree (token ids are validated and counted, not stored).
//! Marker bytes are classified by `rmp::Marker`; every length is checked against the
//! bytes left before anything is read, and nesting is bounded, so hostile input only ever
//! produces an error.

use rmp::Marker;

/// Deepest nesting [`Reader::skip`] follows.
const MAX_DEPTH: u32 = 64;

/// A decode error: what went wrong and at which byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError(pub String);

pub type ReadResult<T> = std::result::Result<T, ReadError>;

/// An integer as msgpack stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Int {
    U(u64),
    I(i64),
}

impl Int {
    pub fn as_u64(self) -> Option<u64> {
        match self {
            Int::U(u) => Some(u),
            Int::I(i) => u64::try_from(i).ok(),
        }
    }

    pub fn as_i64(self) -> Option<i64> {
        match self {
            Int::U(u) => i64::try_from(u).ok(),
            Int::I(i) => Some(i),
        }
    }
}

/// The kind of the next value, for messages and dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Nil,
    Bool,
    Int,
    Float,
    Str,
    Bin,
    Array,
    Map,
    Ext,
    Reserved,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Nil => "nil",
            Kind::Bool => "bool",
            Kind::Int => "int",
            Kind::Float => "float",
            Kind::Str => "str",
            Kind::Bin => "bytes",
            Kind::Array => "array",
            Kind::Map => "map",
            Kind::Ext => "ext",
            Kind::Reserved => "reserved byte 0xc1",
        }
    }
}

fn kind_of(m: Marker) -> Kind {
    match m {
        Marker::Null => Kind::Nil,
        Marker::True | Marker::False => Kind::Bool,
        Marker::FixPos(_)
        | Marker::FixNeg(_)
        | Marker::U8
        | Marker::U16
        | Marker::U32
        | Marker::U64
        | Marker::I8
        | Marker::I16
        | Marker::I32
        | Marker::I64 => Kind::Int,
        Marker::F32 | Marker::F64 => Kind::Float,
        Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => Kind::Str,
        Marker::Bin8 | Marker::Bin16 | Marker::Bin32 => Kind::Bin,
        Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => Kind::Array,
        Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => Kind::Map,
        Marker::FixExt1
        | Marker::FixExt2
        | Marker::FixExt4
        | Marker::FixExt8
        | Marker::FixExt16
        | Marker::Ext8
        | Marker::Ext16
        | Marker::Ext32 => Kind::Ext,
        Marker::Reserved => Kind::Reserved,
    }
}

pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn eof(&self, need: usize) -> ReadError {
        ReadError(format!(
            "payload is not valid msgpack: truncated at byte {} (needs {need} more bytes, {} left)",
            self.pos,
            self.remaining()
        ))
    }

    fn take(&mut self, n: usize) -> ReadResult<&'a [u8]> {
        if self.remaining() < n {
            return Err(self.eof(n));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn be(&mut self, n: usize) -> ReadResult<u64> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |a, &b| (a << 8) | u64::from(b)))
    }

    fn peek(&self) -> ReadResult<Marker> {
        self.buf
            .get(self.pos)
            .map(|&b| Marker::from_u8(b))
            .ok_or_else(|| self.eof(1))
    }

    /// The kind of the next value (without consuming it).
    pub fn kind(&self) -> ReadResult<Kind> {
        self.peek().map(kind_of)
    }

    /// Consumes a nil if one is next; returns whether it did.
    pub fn nil(&mut self) -> ReadResult<bool> {
        if self.peek()? == Marker::Null {
            self.pos += 1;
            return Ok(true);
        }
        Ok(false)
    }

    pub fn int(&mut self) -> ReadResult<Option<Int>> {
        let v = match self.peek()? {
            Marker::FixPos(v) => Int::U(u64::from(v)),
            Marker::FixNeg(v) => Int::I(i64::from(v)),
            Marker::U8 => {
                self.pos += 1;
                return Ok(Some(Int::U(self.be(1)?)));
            }
            Marker::U16 => {
                self.pos += 1;
                return Ok(Some(Int::U(self.be(2)?)));
            }
            Marker::U32 => {
                self.pos += 1;
                return Ok(Some(Int::U(self.be(4)?)));
            }
            Marker::U64 => {
                self.pos += 1;
                return Ok(Some(Int::U(self.be(8)?)));
            }
            Marker::I8 => {
                self.pos += 1;
                return Ok(Some(Int::I(i64::from(self.take(1)?[0] as i8))));
            }
            Marker::I16 => {
                self.pos += 1;
                return Ok(Some(Int::I(i64::from(self.be(2)? as u16 as i16))));
            }
            Marker::I32 => {
                self.pos += 1;
                return Ok(Some(Int::I(i64::from(self.be(4)? as u32 as i32))));
            }
            Marker::I64 => {
                self.pos += 1;
                return Ok(Some(Int::I(self.be(8)? as i64)));
            }
            _ => return Ok(None),
        };
        self.pos += 1;
        Ok(Some(v))
    }

    pub fn float(&mut self) -> ReadResult<Option<f64>> {
        match self.peek()? {
            Marker::F32 => {
                self.pos += 1;
                Ok(Some(f64::from(f32::from_bits(self.be(4)? as u32))))
            }
            Marker::F64 => {
                self.pos += 1;
                Ok(Some(f64::from_bits(self.be(8)?)))
            }
            _ => Ok(None),
        }
    }

    /// A str (as bytes: UTF-8 is checked by the caller when it keeps the text).
    pub fn str_bytes(&mut self) -> ReadResult<Option<&'a [u8]>> {
        let n = match self.peek()? {
            Marker::FixStr(n) => {
                self.pos += 1;
                usize::from(n)
            }
            Marker::Str8 => {
                self.pos += 1;
                self.be(1)? as usize
            }
            Marker::Str16 => {
                self.pos += 1;
                self.be(2)? as usize
            }
            Marker::Str32 => {
                self.pos += 1;
                self.be(4)? as usize
            }
            _ => return Ok(None),
        };
        self.take(n).map(Some)
    }

    pub fn bin(&mut self) -> ReadResult<Option<&'a [u8]>> {
        let n = match self.peek()? {
            Marker::Bin8 => {
                self.pos += 1;
                self.be(1)? as usize
            }
            Marker::Bin16 => {
                self.pos += 1;
                self.be(2)? as usize
            }
            Marker::Bin32 => {
                self.pos += 1;
                self.be(4)? as usize
            }
            _ => return Ok(None),
        };
        self.take(n).map(Some)
    }

    /// An array header: its length, checked against the bytes left (>= 1 byte per item).
    pub fn array_len(&mut self) -> ReadResult<Option<usize>> {
        let n = match self.peek()? {
            Marker::FixArray(n) => {
                self.pos += 1;
                usize::from(n)
            }
            Marker::Array16 => {
                self.pos += 1;
                self.be(2)? as usize
            }
            Marker::Array32 => {
                self.pos += 1;
                self.be(4)? as usize
            }
            _ => return Ok(None),
        };
        if n > self.remaining() {
            return Err(self.eof(n));
        }
        Ok(Some(n))
    }

    /// A map header: its number of pairs, checked against the bytes left.
    pub fn map_len(&mut self) -> ReadResult<Option<usize>> {
        let n = match self.peek()? {
            Marker::FixMap(n) => {
                self.pos += 1;
                usize::from(n)
            }
            Marker::Map16 => {
                self.pos += 1;
                self.be(2)? as usize
            }
            Marker::Map32 => {
                self.pos += 1;
                self.be(4)? as usize
            }
            _ => return Ok(None),
        };
        if n.saturating_mul(2) > self.remaining() {
            return Err(self.eof(n.saturating_mul(2)));
        }
        Ok(Some(n))
    }

    /// Skips one value of any kind (nesting bounded by [`MAX_DEPTH`]).
    pub fn skip(&mut self) -> ReadResult<()> {
        self.skip_at(0)
    }

    fn skip_at(&mut self, depth: u32) -> ReadResult<()> {
        if depth > MAX_DEPTH {
            return Err(ReadError(format!(
                "payload nests deeper than {MAX_DEPTH} levels at byte {}",
                self.pos
            )));
        }
        let m = self.peek()?;
        match kind_of(m) {
            Kind::Nil | Kind::Bool => {
                self.pos += 1;
            }
            Kind::Int => {
                self.int()?;
            }
            Kind::Float => {
                self.float()?;
            }
            Kind::Str => {
                self.str_bytes()?;
            }
            Kind::Bin => {
                self.bin()?;
            }
            Kind::Array => {
                let n = self.array_len()?.unwrap_or(0);
                for _ in 0..n {
                    self.skip_at(depth + 1)?;
                }
            }
            Kind::Map => {
                let n = self.map_len()?.unwrap_or(0);
                for _ in 0..2 * n {
                    self.skip_at(depth + 1)?;
                }
            }
            Kind::Ext => {
                self.pos += 1;
                let n = match m {
                    Marker::FixExt1 => 1,
                    Marker::FixExt2 => 2,
                    Marker::FixExt4 => 4,
                    Marker::FixExt8 => 8,
                    Marker::FixExt16 => 16,
                    Marker::Ext8 => self.be(1)? as usize,
                    Marker::Ext16 => self.be(2)? as usize,
                    _ => self.be(4)? as usize,
                };
                self.take(n.saturating_add(1))?;
            }
            Kind::Reserved => {
                return Err(ReadError(format!(
                    "payload is not valid msgpack: reserved byte 0xc1 at byte {}",
                    self.pos
                )))
            }
        }
        Ok(())
    }
}
