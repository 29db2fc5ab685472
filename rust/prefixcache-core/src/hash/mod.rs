//! vLLM v1 chained block hashing (see SEMANTICS.md section 2.1).
//!
//! - [`value`]: the extra-key value model ([`KeyValue`]).
//! - [`pickle`]: CPython's `pickle.dumps(obj, protocol=5)` bytes.
//! - [`cbor`]: `cbor2.dumps(obj, canonical=True)` bytes.
//! - [`hasher`]: [`HashAlgo`] and [`BlockHasher`] (NONE_HASH, chained block hashes).
//! - `memo`: each thread's table of recent SHA-256 block hashes.

pub mod cbor;
pub mod hasher;
mod memo;
pub mod pickle;
mod sha256;
pub mod value;

pub use hasher::{BlockHasher, HashAlgo, DEFAULT_SEED};
pub use value::{BigInt, KeyValue};

/// A block hash: up to 32 bytes (SHA-256 = 32, XXH3-128 = 16, XXH3-64 = 8).
/// `Copy`, comparable and hashable, so the block pool can key tables by it directly.
/// Ordered as Python orders `bytes` (byte by byte, a prefix first), which the offloading
/// tier's LRU ties follow.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct BlockHash {
    len: u8,
    bytes: [u8; 32],
}

impl Ord for BlockHash {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl PartialOrd for BlockHash {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl BlockHash {
    /// The hash from its bytes; `None` when longer than 32 bytes.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        if b.len() > 32 {
            return None;
        }
        let mut bytes = [0u8; 32];
        bytes[..b.len()].copy_from_slice(b);
        Some(BlockHash {
            len: b.len() as u8,
            bytes,
        })
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// All 32 bytes: the hash followed by zeros.
    #[inline]
    pub fn padded_bytes(&self) -> &[u8; 32] {
        &self.bytes
    }

    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// vLLM's default external (KV event) form: the last 8 bytes read big-endian.
    pub fn to_u64(&self) -> u64 {
        let b = self.as_bytes();
        let tail = &b[b.len().saturating_sub(8)..];
        tail.iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x))
    }
}

impl std::fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in self.as_bytes() {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}
