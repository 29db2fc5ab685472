//! prefixcache-core: exact, fast models of the KV prefix caches of LLM engines.
//!
//! Pure Rust, no Python. The Python bindings live in the `prefixcache-py` crate and only
//! convert arguments and errors.
//!
//! - [`radix`]: SGLang's token-level radix tree (`RadixCache`) with its eviction policies.
//! - [`hash`]: vLLM v1 chained block hashes (pickle / CBOR byte streams, SHA-256, XXH3).
//! - [`blocks`]: vLLM v1 block pool, LRU free queue and request-level manager.
//! - [`trie`]: TensorRT-LLM's per-block trie with partial reuse and priority-LRU eviction.
//! - [`fleet`]: the fleet index: which worker holds a prefix, fed by engines' KV events.
//! - [`offload`]: vLLM's CPU offloading tier (LRU / ARC, store threshold, events).
//! - [`lab`]: not an engine rule: the offline optimum (Belady) and online eviction and
//!   admission policies over a prefix-closed block cache, for the simulator's lab.

pub mod blocks;
pub mod error;
pub mod events;
pub mod fleet;
pub mod hash;
pub mod lab;
pub mod offload;
pub mod radix;
mod sys_vec;
pub mod trace;
pub mod trie;

pub use error::{Error, Result};
