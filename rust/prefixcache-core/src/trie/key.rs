//! Block keys: what a block's KV depends on besides its parent.
//!
//! Two blocks match only when every non-token dimension (LoRA id, cache salt, multimodal
//! keys) is equal; then the matched length is the common token prefix. Salts and
//! multimodal hashes are interned to small ids by the trie; the key keeps the ids.

use std::hash::{Hash, Hasher};

use rustc_hash::FxHasher;

/// TensorRT-LLM's default retention priority.
pub const DEFAULT_PRIORITY: u8 = 35;
/// TensorRT-LLM's default `secondary_offload_min_priority` (`evictionPolicy.cpp`): a GPU
/// victim of at least this priority is offloaded to host memory.
pub const DEFAULT_SECONDARY_OFFLOAD_MIN_PRIORITY: u8 = 30;
/// The highest retention priority (the lowest is 0).
pub const MAX_PRIORITY: u8 = 100;
/// TensorRT-LLM's default `tokens_per_block`.
pub const DEFAULT_TOKENS_PER_BLOCK: usize = 64;

/// The non-token, non-multimodal dimensions of a key: blocks of different scopes never
/// share anything, not even a partial match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub(crate) struct Scope {
    pub lora: Option<u64>,
    /// Interned cache salt.
    pub salt: Option<u32>,
}

/// One multimodal item of a prompt: an interned content hash and the token range
/// `[start, start + len)` it occupies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MmItem {
    pub id: u32,
    pub start: usize,
    pub len: usize,
}

/// The key of one block.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct BlockKey {
    pub scope: Scope,
    /// `(interned item hash, item start - block start)` for every item overlapping the
    /// block, in item order. A block with multimodal keys never matches partially.
    pub mm: Vec<(u32, i64)>,
    pub tokens: Vec<u32>,
}

impl BlockKey {
    /// Whether this is the key with these parts (compared without building it).
    pub fn is(&self, scope: Scope, mm: &[(u32, i64)], tokens: &[u32]) -> bool {
        self.scope == scope && self.tokens == tokens && self.mm == mm
    }

    /// The hash of the whole key, for the exact child map.
    pub fn exact_hash(&self) -> u64 {
        let mut h = FxHasher::default();
        self.hash(&mut h);
        h.finish()
    }
}

/// Length of the common prefix of two token slices.
#[inline]
pub(crate) fn lcp(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Number of blocks a prompt of `len` tokens occupies (TensorRT-LLM's context blocks).
pub(crate) fn context_blocks(len: usize, tokens_per_block: usize) -> usize {
    len.div_ceil(tokens_per_block)
}

/// Splits the first `len(tokens) - 1` tokens into block keys, the last one possibly
/// partial (the last token's KV is not recoverable, as in TensorRT-LLM).
pub(crate) fn chop(
    tokens: &[u32],
    tokens_per_block: usize,
    scope: Scope,
    mm: &[MmItem],
) -> Vec<BlockKey> {
    let usable = tokens.len().saturating_sub(1);
    let usable_tokens = tokens.get(..usable).unwrap_or(&[]);
    usable_tokens
        .chunks(tokens_per_block)
        .enumerate()
        .map(|(i, chunk)| {
            let b0 = i * tokens_per_block;
            BlockKey {
                scope,
                mm: block_mm(mm, b0, b0 + chunk.len()),
                tokens: chunk.to_vec(),
            }
        })
        .collect()
}

/// The multimodal keys of the block over tokens `[b0, b1)`: `(item, item start - b0)` for
/// every item overlapping it, in item order (allocates only when there is one).
pub(crate) fn block_mm(mm: &[MmItem], b0: usize, b1: usize) -> Vec<(u32, i64)> {
    mm.iter()
        .filter(|it| it.start < b1 && it.start + it.len > b0)
        .map(|it| (it.id, it.start as i64 - b0 as i64))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chop_excludes_the_last_token_and_keeps_a_partial_block() {
        let t: Vec<u32> = (0..10).collect();
        let keys = chop(&t, 4, Scope::default(), &[]);
        let lens: Vec<usize> = keys.iter().map(|k| k.tokens.len()).collect();
        assert_eq!(lens, vec![4, 4, 1]);
        assert_eq!(context_blocks(10, 4), 3);
        // len % tpb == 1: the last context block has no key.
        let keys = chop(&t[..9], 4, Scope::default(), &[]);
        assert_eq!(keys.len(), 2);
        assert_eq!(context_blocks(9, 4), 3);
        assert!(chop(&t[..1], 4, Scope::default(), &[]).is_empty());
    }

    #[test]
    fn multimodal_items_key_every_block_they_overlap() {
        let t: Vec<u32> = (0..13).collect();
        let mm = [MmItem {
            id: 7,
            start: 3,
            len: 3,
        }];
        let keys = chop(&t, 4, Scope::default(), &mm);
        assert_eq!(keys[0].mm, vec![(7, 3)]);
        assert_eq!(keys[1].mm, vec![(7, -1)]);
        assert!(keys[2].mm.is_empty());
    }

    #[test]
    fn lcp_counts_the_common_prefix() {
        assert_eq!(lcp(&[1, 2, 3], &[1, 2, 4]), 2);
        assert_eq!(lcp(&[1, 2], &[1, 2, 4]), 2);
        assert_eq!(lcp(&[], &[1]), 0);
    }
}
