//! The KV events the fleet index applies, decoded and validated.
//!
//! Field names and defaults follow vLLM's `vllm/distributed/kv_events.py` (SGLang publishes
//! the same shapes). Block hashes are kept in vLLM's external int form: a u64, the last 8
//! bytes of the digest read big-endian ([`HashForm::key`] reduces byte hashes to it).

use crate::error::{Error, Result};

/// The medium vLLM reports when an event names none.
pub const DEFAULT_MEDIUM: &str = "GPU";

/// How block hashes arrive: ints (vLLM's default `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`)
/// are always accepted; raw digests must be exactly `hash_bytes` long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashForm {
    /// Width of a byte-string hash: 32 for sha256, 16 for xxhash, 8 for xxh3_64.
    pub hash_bytes: usize,
}

impl Default for HashForm {
    fn default() -> Self {
        HashForm { hash_bytes: 32 }
    }
}

impl HashForm {
    pub fn new(hash_bytes: usize) -> Result<Self> {
        if !(8..=32).contains(&hash_bytes) {
            return Err(Error::InvalidArgument(format!(
                "hash_bytes must be between 8 and 32, got {hash_bytes}"
            )));
        }
        Ok(HashForm { hash_bytes })
    }

    /// The index key of a byte-string hash: its last 8 bytes read big-endian (vLLM's
    /// external int form), so a fleet mixing int and byte publishers agrees.
    pub fn key(&self, bytes: &[u8], what: &str) -> Result<u64> {
        if bytes.len() != self.hash_bytes {
            return Err(Error::InvalidEvent(format!(
                "{what}: a block hash of {} bytes, expected {} (or an int below 2**64)",
                bytes.len(),
                self.hash_bytes
            )));
        }
        let tail = &bytes[bytes.len() - 8..];
        Ok(tail.iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
    }
}

/// `BlockStored`: full blocks entered a worker's prefix cache.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    pub block_hashes: Vec<u64>,
    pub parent_block_hash: Option<u64>,
    /// Number of token ids the event carried (the ids themselves are validated, not kept).
    pub num_tokens: usize,
    pub block_size: u32,
    pub lora_id: Option<i64>,
    pub lora_name: Option<String>,
    /// `None` means vLLM's default, "GPU".
    pub medium: Option<String>,
    pub group_idx: u32,
}

/// One event, validated.
#[derive(Debug, Clone, PartialEq)]
pub enum FleetEvent {
    Stored(Stored),
    /// `BlockRemoved`: one copy of each hash left the worker's cache.
    Removed {
        block_hashes: Vec<u64>,
        medium: Option<String>,
        group_idx: u32,
    },
    /// `AllBlocksCleared`: the worker's prefix cache was reset.
    Cleared,
}

impl FleetEvent {
    /// The medium the event is about (`None` for `AllBlocksCleared`, which clears all).
    pub fn medium(&self) -> Option<&str> {
        match self {
            FleetEvent::Stored(s) => Some(s.medium.as_deref().unwrap_or(DEFAULT_MEDIUM)),
            FleetEvent::Removed { medium, .. } => Some(medium.as_deref().unwrap_or(DEFAULT_MEDIUM)),
            FleetEvent::Cleared => None,
        }
    }

    /// Number of block events it carries (one per hash; one for a clear).
    pub fn num_block_events(&self) -> usize {
        match self {
            FleetEvent::Stored(s) => s.block_hashes.len(),
            FleetEvent::Removed { block_hashes, .. } => block_hashes.len(),
            FleetEvent::Cleared => 1,
        }
    }
}

/// One published batch: vLLM's `KVEventBatch` `[ts, events, data_parallel_rank]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub ts: f64,
    pub events: Vec<FleetEvent>,
    pub dp_rank: Option<i64>,
}
