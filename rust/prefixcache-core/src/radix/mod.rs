//! SGLang's RadixCache: a token-level compressed radix tree (SEMANTICS.md section 1).
//!
//! - [`tree`]: the node arena, match / insert / split, locks, sizes and inspection.
//! - [`children`]: the per-node child index (first token or first page, plus namespace).
//! - [`evict`]: the incrementally maintained set of evictable leaves and `evict`.
//! - [`host`]: the HiCache host tier (host copies, host-only nodes, load back).
//! - [`node`]: the 56-byte node record and the side tables for what does not fit in it.
//! - [`policy`]: the eviction policies and their ordering keys.
//! - [`slab`]: the node arena, chunks that never move.
//! - [`span`]: the tokens and KV indices of one node, in one buffer.

mod children;
mod evict;
mod host;
mod invariants;
mod node;
mod policy;
mod slab;
mod span;
mod tree;

pub use host::{HostStats, WritePolicy};
pub use policy::EvictionPolicy;
pub use tree::{InsertOutcome, MatchOutcome, Namespace, NodeDump, NodeInfo, NodeRef, RadixTree};
