//! KV-cache events, shaped after vLLM's `vllm/distributed/kv_events.py`.
//!
//! The core keeps hashes as [`BlockHash`] values; the bindings turn them into vLLM's
//! external form (by default the last 8 bytes read big-endian as a u64) or raw bytes.
//! Every event carries vLLM's `medium`: "GPU" for the device block pool, "CPU" for the
//! offloading tier behind it (`crate::offload`).

use crate::hash::{BlockHash, KeyValue};
use crate::Error;

/// The storage medium vLLM reports for its device block pool.
pub const MEDIUM_GPU: &str = "GPU";
/// The storage medium vLLM reports for its CPU offloading tier.
pub const MEDIUM_CPU: &str = "CPU";

/// Where the blocks of an event live (vLLM's `medium` field of BlockStored / BlockRemoved).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Medium {
    #[default]
    Gpu,
    Cpu,
}

impl Medium {
    pub fn as_str(self) -> &'static str {
        match self {
            Medium::Gpu => MEDIUM_GPU,
            Medium::Cpu => MEDIUM_CPU,
        }
    }
}

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
        medium: Medium,
    },
    /// A block's hash left the prefix cache (one event per removed hash, as vLLM).
    BlockRemoved {
        block_hashes: Vec<BlockHash>,
        group_idx: u32,
        medium: Medium,
    },
    /// `reset_prefix_cache` succeeded.
    AllBlocksCleared,
}

/// The same events with every run of consecutive `BlockRemoved` events of one group and
/// medium merged into one event carrying all their hashes, in order. An index applying them
/// ends in the same state; vLLM publishes one event per removed hash, which makes a
/// router's event stream mostly single-hash removals.
pub fn coalesce_removals(events: Vec<KvEvent>) -> Vec<KvEvent> {
    let mut out: Vec<KvEvent> = Vec::with_capacity(events.len());
    for ev in events {
        if let KvEvent::BlockRemoved {
            block_hashes,
            group_idx,
            medium,
        } = &ev
        {
            if let Some(KvEvent::BlockRemoved {
                block_hashes: last,
                group_idx: g,
                medium: m,
            }) = out.last_mut()
            {
                if g == group_idx && m == medium {
                    last.extend_from_slice(block_hashes);
                    continue;
                }
            }
        }
        out.push(ev);
    }
    out
}

/// The inverse of [`coalesce_removals`]: every `BlockRemoved` with several hashes becomes
/// one event per hash, in order (vLLM's shape).
/// Allocates everything it needs before it takes `events` apart: an `OutOfMemory` error
/// gives them back unchanged.
pub fn split_removals(
    events: Vec<KvEvent>,
) -> std::result::Result<Vec<KvEvent>, (Vec<KvEvent>, Error)> {
    let split: usize = events
        .iter()
        .map(|e| match e {
            KvEvent::BlockRemoved { block_hashes, .. } if block_hashes.len() > 1 => {
                block_hashes.len()
            }
            _ => 0,
        })
        .sum();
    if split == 0 {
        return Ok(events);
    }
    let oom = |e| Error::out_of_memory("the KV events", e);
    let mut out = Vec::new();
    if let Err(e) = out.try_reserve_exact(events.len() + split) {
        return Err((events, oom(e)));
    }
    // One single-hash list per split-off removal, allocated up front.
    let mut singles: Vec<Vec<BlockHash>> = Vec::new();
    if let Err(e) = singles.try_reserve_exact(split) {
        return Err((events, oom(e)));
    }
    for _ in 0..split {
        let mut v = Vec::new();
        if let Err(e) = v.try_reserve_exact(1) {
            return Err((events, oom(e)));
        }
        singles.push(v);
    }
    for ev in events {
        match ev {
            KvEvent::BlockRemoved {
                block_hashes,
                group_idx,
                medium,
            } if block_hashes.len() > 1 => {
                for h in block_hashes {
                    let mut one = singles.pop().unwrap_or_default();
                    one.push(h);
                    out.push(KvEvent::BlockRemoved {
                        block_hashes: one,
                        group_idx,
                        medium,
                    });
                }
            }
            other => out.push(other),
        }
    }
    Ok(out)
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

#[cfg(test)]
mod coalesce_tests {
    use super::*;

    fn removed(hashes: &[u8], group_idx: u32) -> KvEvent {
        KvEvent::BlockRemoved {
            block_hashes: hashes
                .iter()
                .filter_map(|&b| BlockHash::from_bytes(&[b; 8]))
                .collect(),
            group_idx,
            medium: Medium::Gpu,
        }
    }

    #[test]
    fn runs_of_removals_of_one_group_merge_in_order() {
        let evs = vec![
            removed(&[1], 0),
            removed(&[2, 3], 0),
            removed(&[4], 1),
            KvEvent::AllBlocksCleared,
            removed(&[5], 1),
            removed(&[6], 1),
        ];
        let out = coalesce_removals(evs);
        assert_eq!(
            out,
            vec![
                removed(&[1, 2, 3], 0),
                removed(&[4], 1),
                KvEvent::AllBlocksCleared,
                removed(&[5, 6], 1),
            ]
        );
        assert!(coalesce_removals(Vec::new()).is_empty());
    }

    #[test]
    fn split_undoes_the_merge_in_order() {
        let single = vec![
            removed(&[1], 0),
            removed(&[2], 0),
            removed(&[3], 0),
            removed(&[4], 1),
            KvEvent::AllBlocksCleared,
            removed(&[5], 1),
        ];
        let merged = coalesce_removals(single.clone());
        assert_eq!(merged.len(), 4);
        assert_eq!(split_removals(merged).unwrap(), single);
        assert_eq!(split_removals(single.clone()).unwrap(), single);
    }
}
