//! TensorRT-LLM's KV block reuse: a per-block trie with partial reuse of the last block
//! and priority-aware LRU eviction (SEMANTICS.md section 3).
//!
//! - [`key`]: the block key (LoRA id, tokens, multimodal keys, cache salt) and the split of
//!   a prompt into block keys.
//! - [`arena`]: the blocks by id, each made on its first use.
//! - [`children`]: the per-block child index: exact keys in a hash map, partial-match
//!   candidates in an ordered index so the longest common prefix is found in O(log n).
//! - [`evict`]: the priority-LRU sets of evictable free blocks (one per level: GPU and
//!   host) and retention expiry.
//! - [`host`]: the secondary (host) tier: offload of a GPU victim, onboarding of a match.
//! - [`trie`]: the blocks, requests and state of the trie, constructor and getters.
//! - [`types`]: the public argument and result types.
//! - [`interner`]: salts and multimodal hashes, reference-counted by their holders.
//! - [`lookup`]: keys, the event hash and the plan of a claim.
//! - [`refs`]: references, allocation and the partial-match index.
//! - [`requests`]: claim (phase one) / complete (phase two) / store / extend / release.
//! - [`invariants`]: the full consistency check used by tests.

mod arena;
mod children;
mod evict;
mod host;
mod interner;
mod invariants;
mod key;
mod lookup;
mod refs;
mod requests;
#[allow(clippy::module_inception)] // the layout names the file after the structure
mod trie;
mod types;

#[cfg(test)]
mod tests;

pub use key::{
    DEFAULT_PRIORITY, DEFAULT_SECONDARY_OFFLOAD_MIN_PRIORITY, DEFAULT_TOKENS_PER_BLOCK,
    MAX_PRIORITY,
};
pub use trie::BlockTrie;
pub use types::{
    BlockDump, ClaimOutcome, ClaimParams, CopyOp, LookupOutcome, Medium, MmSpan, PartialKind,
    PartialReuse, TrieEvent, TrieHostStats, TrieStats,
};
