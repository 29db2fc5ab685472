//! The engines' wire format: ZMQ frames `[topic, seq, payload]`, `seq` an 8-byte
//! big-endian integer, `payload` msgpack of `[ts, events, data_parallel_rank]` (msgspec
//! `array_like`), each event a map tagged by `"type"` (vLLM >= 0.10, SGLang) or an array
//! whose first item is the tag (older msgspec `tag=True, array_like=True` encodings).
//! Decoding is all-or-nothing: any problem is an [`Error::InvalidArgument`] naming it.

use rmpv::ValueRef;

use super::event::{Batch, FleetEvent, HashForm, Stored};
use crate::error::{Error, Result};

fn bad(msg: impl Into<String>) -> Error {
    Error::InvalidEvent(msg.into())
}

/// The sequence number frame: exactly 8 bytes, big-endian, non-negative.
pub fn decode_seq(frame: &[u8]) -> Result<u64> {
    let bytes: [u8; 8] = frame.try_into().map_err(|_| {
        bad(format!(
            "sequence frame has {} bytes, expected 8 (big-endian)",
            frame.len()
        ))
    })?;
    let seq = u64::from_be_bytes(bytes);
    if seq > i64::MAX as u64 {
        return Err(bad(format!(
            "sequence number {} is negative (an end-of-replay marker is not a batch)",
            seq as i64
        )));
    }
    Ok(seq)
}

/// A 3-part frame: `(seq, batch)`.
pub fn decode_frames(parts: &[&[u8]], form: HashForm) -> Result<(u64, Batch)> {
    if parts.len() != 3 {
        return Err(bad(format!(
            "a KV event message has 3 frames (topic, seq, payload), got {}",
            parts.len()
        )));
    }
    let seq = decode_seq(parts[1])?;
    Ok((seq, decode_payload(parts[2], form)?))
}

/// The msgpack payload of one batch.
pub fn decode_payload(payload: &[u8], form: HashForm) -> Result<Batch> {
    let mut rd = payload;
    let value = rmpv::decode::read_value_ref(&mut rd)
        .map_err(|e| bad(format!("payload is not valid msgpack: {e}")))?;
    if !rd.is_empty() {
        return Err(bad(format!(
            "payload has {} trailing bytes after the batch",
            rd.len()
        )));
    }
    let items = match value {
        ValueRef::Array(items) => items,
        other => {
            return Err(bad(format!(
                "payload: expected an array [ts, events, dp_rank], got {}",
                kind(&other)
            )))
        }
    };
    if items.len() < 2 || items.len() > 3 {
        return Err(bad(format!(
            "payload: expected [ts, events] or [ts, events, dp_rank], got {} items",
            items.len()
        )));
    }
    let ts = match &items[0] {
        ValueRef::F64(x) => *x,
        ValueRef::F32(x) => f64::from(*x),
        ValueRef::Integer(i) => i.as_f64().unwrap_or(0.0),
        other => {
            return Err(bad(format!(
                "payload: ts must be a number, got {}",
                kind(other)
            )))
        }
    };
    let raw_events = match &items[1] {
        ValueRef::Array(ev) => ev,
        other => {
            return Err(bad(format!(
                "payload: events must be an array, got {}",
                kind(other)
            )))
        }
    };
    let dp_rank = match items.get(2) {
        None | Some(ValueRef::Nil) => None,
        Some(ValueRef::Integer(i)) => Some(
            i.as_i64()
                .ok_or_else(|| bad("payload: dp_rank out of range"))?,
        ),
        Some(other) => {
            return Err(bad(format!(
                "payload: dp_rank must be an int, got {}",
                kind(other)
            )))
        }
    };
    let mut events = Vec::with_capacity(raw_events.len());
    for (i, ev) in raw_events.iter().enumerate() {
        events.push(decode_event(ev, form).map_err(|e| bad(format!("event {i}: {e}")))?);
    }
    Ok(Batch {
        ts,
        events,
        dp_rank,
    })
}

fn kind(v: &ValueRef<'_>) -> &'static str {
    match v {
        ValueRef::Nil => "nil",
        ValueRef::Boolean(_) => "bool",
        ValueRef::Integer(_) => "int",
        ValueRef::F32(_) | ValueRef::F64(_) => "float",
        ValueRef::String(_) => "str",
        ValueRef::Binary(_) => "bytes",
        ValueRef::Array(_) => "array",
        ValueRef::Map(_) => "map",
        ValueRef::Ext(..) => "ext",
    }
}

/// Field access over both encodings (map by name, array by position after the tag).
enum Fields<'v, 'a> {
    Map(&'v [(ValueRef<'a>, ValueRef<'a>)]),
    Array(&'v [ValueRef<'a>]),
}

impl<'v, 'a> Fields<'v, 'a> {
    fn get(&self, name: &str, pos: usize) -> Option<&'v ValueRef<'a>> {
        match self {
            Fields::Map(entries) => entries.iter().find_map(|(k, v)| match k {
                ValueRef::String(s) if s.as_str() == Some(name) => Some(v),
                _ => None,
            }),
            Fields::Array(items) => items.get(pos),
        }
    }
}

fn decode_event(ev: &ValueRef<'_>, form: HashForm) -> Result<FleetEvent> {
    let (tag, fields) = match ev {
        ValueRef::Map(entries) => {
            let tag = entries.iter().find_map(|(k, v)| match k {
                ValueRef::String(s) if s.as_str() == Some("type") => Some(v),
                _ => None,
            });
            match tag {
                Some(ValueRef::String(s)) => (s.as_str().unwrap_or(""), Fields::Map(entries)),
                Some(other) => {
                    return Err(bad(format!("\"type\" must be a str, got {}", kind(other))))
                }
                None => return Err(bad("event map has no \"type\" tag")),
            }
        }
        ValueRef::Array(items) => match items.first() {
            Some(ValueRef::String(s)) => (s.as_str().unwrap_or(""), Fields::Array(&items[1..])),
            _ => return Err(bad("event array does not start with its type tag")),
        },
        other => {
            return Err(bad(format!(
                "an event must be a map or an array, got {}",
                kind(other)
            )))
        }
    };
    match tag {
        "BlockStored" => {
            let block_hashes = hashes(req(&fields, "block_hashes", 0)?, "block_hashes", form)?;
            let parent_block_hash = match fields.get("parent_block_hash", 1) {
                None | Some(ValueRef::Nil) => None,
                Some(v) => Some(hash(v, "parent_block_hash", form)?),
            };
            let num_tokens = token_ids(fields.get("token_ids", 2))?;
            let block_size = match req(&fields, "block_size", 3)? {
                ValueRef::Integer(i) => i
                    .as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .filter(|&x| x > 0)
                    .ok_or_else(|| bad("block_size must be a positive int below 2**32"))?,
                other => {
                    return Err(bad(format!(
                        "block_size must be an int, got {}",
                        kind(other)
                    )))
                }
            };
            let lora_id = opt_int(fields.get("lora_id", 4), "lora_id")?;
            let medium = opt_str(fields.get("medium", 5), "medium")?;
            let lora_name = opt_str(fields.get("lora_name", 6), "lora_name")?;
            match fields.get("extra_keys", 7) {
                None | Some(ValueRef::Nil) => {}
                Some(ValueRef::Array(per_block)) => {
                    if per_block.len() != block_hashes.len() {
                        return Err(bad(format!(
                            "extra_keys has {} entries for {} blocks",
                            per_block.len(),
                            block_hashes.len()
                        )));
                    }
                    for k in per_block {
                        if !matches!(k, ValueRef::Nil | ValueRef::Array(_)) {
                            return Err(bad(format!(
                                "extra_keys entries must be nil or arrays, got {}",
                                kind(k)
                            )));
                        }
                    }
                }
                Some(other) => {
                    return Err(bad(format!(
                        "extra_keys must be an array, got {}",
                        kind(other)
                    )))
                }
            }
            let group_idx = group(fields.get("group_idx", 8))?;
            opt_str(fields.get("kv_cache_spec_kind", 9), "kv_cache_spec_kind")?;
            opt_int(
                fields.get("kv_cache_spec_sliding_window", 10),
                "kv_cache_spec_sliding_window",
            )?;
            Ok(FleetEvent::Stored(Stored {
                block_hashes,
                parent_block_hash,
                num_tokens,
                block_size,
                lora_id,
                lora_name,
                medium,
                group_idx,
            }))
        }
        "BlockRemoved" => Ok(FleetEvent::Removed {
            block_hashes: hashes(req(&fields, "block_hashes", 0)?, "block_hashes", form)?,
            medium: opt_str(fields.get("medium", 1), "medium")?,
            group_idx: group(fields.get("group_idx", 2))?,
        }),
        "AllBlocksCleared" => Ok(FleetEvent::Cleared),
        other => Err(bad(format!(
            "unknown event type {other:?} (expected BlockStored, BlockRemoved or AllBlocksCleared)"
        ))),
    }
}

fn req<'v, 'a>(fields: &Fields<'v, 'a>, name: &str, pos: usize) -> Result<&'v ValueRef<'a>> {
    fields
        .get(name, pos)
        .ok_or_else(|| bad(format!("missing field {name}")))
}

fn hash(v: &ValueRef<'_>, what: &str, form: HashForm) -> Result<u64> {
    match v {
        ValueRef::Integer(i) => i.as_u64().ok_or_else(|| {
            bad(format!(
                "{what}: block hash {i} is out of range (a u64 or {} bytes)",
                form.hash_bytes
            ))
        }),
        ValueRef::Binary(b) => form.key(b, what),
        other => Err(bad(format!(
            "{what}: a block hash must be an int or bytes, got {}",
            kind(other)
        ))),
    }
}

fn hashes(v: &ValueRef<'_>, what: &str, form: HashForm) -> Result<Vec<u64>> {
    match v {
        ValueRef::Array(items) => items.iter().map(|h| hash(h, what, form)).collect(),
        other => Err(bad(format!("{what} must be an array, got {}", kind(other)))),
    }
}

fn token_ids(v: Option<&ValueRef<'_>>) -> Result<usize> {
    match v {
        None | Some(ValueRef::Nil) => Ok(0),
        Some(ValueRef::Array(items)) => {
            for t in items {
                match t {
                    ValueRef::Integer(i)
                        if i.as_u64().is_some_and(|x| x <= u64::from(u32::MAX)) => {}
                    other => {
                        return Err(bad(format!(
                            "token_ids must hold ints in 0..2**32, got {}",
                            kind(other)
                        )))
                    }
                }
            }
            Ok(items.len())
        }
        Some(other) => Err(bad(format!(
            "token_ids must be an array, got {}",
            kind(other)
        ))),
    }
}

fn opt_int(v: Option<&ValueRef<'_>>, what: &str) -> Result<Option<i64>> {
    match v {
        None | Some(ValueRef::Nil) => Ok(None),
        Some(ValueRef::Integer(i)) => i
            .as_i64()
            .map(Some)
            .ok_or_else(|| bad(format!("{what} is out of range"))),
        Some(other) => Err(bad(format!(
            "{what} must be an int or nil, got {}",
            kind(other)
        ))),
    }
}

fn opt_str(v: Option<&ValueRef<'_>>, what: &str) -> Result<Option<String>> {
    match v {
        None | Some(ValueRef::Nil) => Ok(None),
        Some(ValueRef::String(s)) => s
            .as_str()
            .map(|s| Some(s.to_owned()))
            .ok_or_else(|| bad(format!("{what} is not valid UTF-8"))),
        Some(other) => Err(bad(format!(
            "{what} must be a str or nil, got {}",
            kind(other)
        ))),
    }
}

fn group(v: Option<&ValueRef<'_>>) -> Result<u32> {
    match v {
        None | Some(ValueRef::Nil) => Ok(0),
        Some(ValueRef::Integer(i)) => i
            .as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .ok_or_else(|| bad("group_idx must be an int in 0..2**32")),
        Some(other) => Err(bad(format!(
            "group_idx must be an int, got {}",
            kind(other)
        ))),
    }
}
