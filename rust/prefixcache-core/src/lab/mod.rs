//! The eviction and admission lab: prefix caches that are *not* engine rules.
//!
//! The engine-exact structures ([`crate::radix`], [`crate::blocks`], [`crate::trie`])
//! reproduce what SGLang, vLLM and TensorRT-LLM do. This module holds what they do not:
//! the offline optimum (Belady) and online eviction and admission policies from the
//! caching literature, over one prefix-closed block cache, so that the simulator can say
//! how far recency is from the best possible and what closes the gap.
//!
//! | file | holds |
//! |---|---|
//! | `keys.rs` | chained 64-bit block keys (xxh3 of the parent key and the block's tokens) |
//! | `future.rs` | [`NextUse`]: the next hittable use of every block of every request (one backward pass), for Belady |
//! | `rule.rs` | [`Rule`] (eviction order) and [`Admission`] (what is kept at release) |
//! | `seen.rs` | use counts of the keys no longer cached (2Q, the admission filter) |
//! | `density.rs` | hit density by age and use count, learned online ([`Rule::Density`]) |
//! | `cache.rs` | [`LabCache`]: blocks, requests, eviction, admission, invariants |
//!
//! A cached block's parent is always cached (only childless blocks are evicted), so the
//! cache is a tree of blocks: with one token per block it is a token radix tree whose
//! leaves are trimmed a token at a time; with 16 it is a block pool that evicts the tails
//! of prefixes first.

mod cache;
mod density;
mod future;
mod keys;
mod rule;
mod seen;

pub use cache::{LabCache, LabStats};
pub use future::{NextUse, NEVER};
pub use keys::block_keys;
pub use rule::{Admission, Rule};
