//! KV-cache events, shaped after vLLM's `vllm/distributed/kv_events.py`.
//!
//! The core keeps hashes as [`BlockHash`] values; the bindings turn them into vLLM's
//! external form (by default the last 8 bytes read big-endian as a u64) or raw bytes.
//! Every event carries vLLM's `medium` ("GPU" for the device pool modelled here).

use crate::hash::{BlockHash, KeyValue};

/// The storage medium vLLM reports for its device block pool.
pub const MEDIUM_GPU: &str = "GPU";

/// One event, in the order the pool emitted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// Full blocks were registered in the prefix cache (one event per
    /// `cache_full_blocks` call that had new blocks).
    BlockStored {
        /// Hashes of the newly cached (non-null) blocks, in block order.
        block_hashes: Vec<BlockHash>,
        /// Hash of the block before the first new one, `None` when the batch starts at
        /// block 0.
        parent_block_hash: Option<BlockHash>,
        /// The tokens of the new full blocks (empty when the caller gave no tokens).
        token_ids: Vec<u32>,
        block_size: u32,
        lora_id: Option<i64>,
        lora_name: Option<String>,
        /// The KV-cache group (vLLM's `group_idx`).
        group_idx: u32,
        /// Per new block, its extra keys untagged as vLLM publishes them
        /// (`("mm", id, offset)` -> `(id, offset)`, any other `(tag, value)` -> `value`);
        /// `None` when the batch has no block.
        extra_keys: Option<Vec<Option<Vec<KeyValue>>>>,
    },
    /// A block's hash left the prefix cache (one event per removed hash, as vLLM).
    BlockRemoved {
        block_hashes: Vec<BlockHash>,
        group_idx: u32,
    },
    /// `reset_prefix_cache` succeeded.
    AllBlocksCleared,
}

/// vLLM's `to_event_extra_keys` for one block's tagged keys.
pub fn untag_extra_keys(keys: &[KeyValue]) -> Vec<KeyValue> {
    keys.iter()
        .map(|k| match k {
            KeyValue::Tuple(items) if items.len() >= 2 => match &items[0] {
                KeyValue::Str(tag) if tag == "mm" => KeyValue::Tuple(items[1..].to_vec()),
                _ => items[1].clone(),
            },
            other => other.clone(),
        })
        .collect()
}
