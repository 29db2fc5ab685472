//! vLLM 0.33's CPU offloading tier behind the GPU block pool (SEMANTICS.md section 2.4).
//!
//! - [`manager`]: `CpuOffloadManager` (vLLM's `CPUOffloadingManager`): chunk ids, ref
//!   counts, the store-threshold tracker, request access state, events, the range calls.
//! - [`chunks`]: the chunk table (one 64-byte slot per chunk id, found through
//!   [`index`]) and the intrusive lists the policies link slots into.
//! - [`index`]: a hash index of 8-byte words (linear probing), prefetchable.
//! - `entry_index`: a request's key entries by key hash (linear probing, 4-byte slots).
//! - [`lru`], [`arc`]: the two cache policies vLLM ships.
//! - [`order`]: insertion-ordered key maps (Python's `OrderedDict`).
//!
//! Keys are block hashes; vLLM appends the KV-cache group index (4 bytes), which is the
//! same for every key with one group.

pub mod arc;
pub mod chunks;
mod entry_index;
pub mod index;
pub mod lru;
pub mod manager;
pub mod order;

pub use manager::{
    to_kv_events, CachePolicy, CpuOffloadManager, LookupResult, OffloadEvent, PrepareStoreOutput,
    DEFAULT_MAX_TRACKER_SIZE, MEDIUM_CPU,
};

#[cfg(test)]
mod tests;
