//! vLLM v1 block pool, free queue and request-level manager (see SEMANTICS.md section 2).
//!
//! - [`free_queue`]: the intrusive doubly linked free list (LRU order, O(1) removal).
//! - [`pool`]: `BlockPool` (reference counts, hash table, events).
//! - [`manager`]: `KVCacheManager`, the request-level manager (full attention or
//!   sliding window) that hashes requests and drives the pool as vLLM's scheduler does.

pub mod free_queue;
pub mod pool;
pub mod table;

pub use free_queue::FreeQueue;
pub use pool::{BlockPool, CacheKey, StoreInfo, NULL_BLOCK};
pub mod manager;
pub use manager::{Admission, KVCacheManager, PrefixCacheStats, RequestId, RequestOptions};
