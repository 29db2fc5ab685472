//! The engines' wire format: ZMQ frames `[topic, seq, payload]`, `seq` an 8-byte
//! big-endian integer, `payload` msgpack of `[ts, events, data_parallel_rank]` (msgspec
//! `array_like`), each event a map tagged by `"type"` (vLLM >= 0.10, SGLang) or an array
//! whose first item is the tag (older msgspec `tag=True, array_like=True` encodings).
//! Decoding streams over the bytes ([`super::msgpack::Reader`]) and is all-or-nothing: any
//! problem is an [`Error::InvalidEvent`] naming it. Unknown map keys are skipped
//! (SGLang's `cache_salt`, `session_id`, later vLLM fields); known ones are type-checked.

use std::borrow::Cow;

use super::event::{Batch, FleetEvent, HashForm, Stored};
use super::msgpack::{Int, Kind, ReadError, Reader};
use crate::error::{try_copy_str, try_vec, Error, Result};

fn bad(msg: impl Into<String>) -> Error {
    Error::InvalidEvent(msg.into())
}

impl From<ReadError> for Error {
    fn from(e: ReadError) -> Self {
        Error::InvalidEvent(e.0)
    }
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

/// A 3-part message: `(seq, batch)`.
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
    let mut r = Reader::new(payload);
    let n = match r.array_len()? {
        Some(n) => n,
        None => {
            return Err(bad(format!(
                "payload: expected an array [ts, events, dp_rank], got {}",
                r.kind()?.name()
            )))
        }
    };
    if !(2..=3).contains(&n) {
        return Err(bad(format!(
            "payload: expected [ts, events] or [ts, events, dp_rank], got {n} items"
        )));
    }
    let ts = if let Some(x) = r.float()? {
        x
    } else if let Some(i) = r.int()? {
        match i {
            Int::U(u) => u as f64,
            Int::I(i) => i as f64,
        }
    } else {
        return Err(bad(format!(
            "payload: ts must be a number, got {}",
            r.kind()?.name()
        )));
    };
    let count = match r.array_len()? {
        Some(c) => c,
        None => {
            return Err(bad(format!(
                "payload: events must be an array, got {}",
                r.kind()?.name()
            )))
        }
    };
    // No valid event takes fewer than 15 bytes (a removal of no hashes): room for what
    // the bytes left can hold, not for what the header claims (an event is ~120 bytes
    // decoded).
    let mut events = try_vec(count.min(r.remaining() / 15), "a KV event batch")?;
    for i in 0..count {
        let ev = decode_event(&mut r, form).map_err(|e| match e {
            Error::OutOfMemory(_) => e,
            e => bad(format!("event {i}: {e}")),
        })?;
        events
            .try_reserve(1)
            .map_err(|e| Error::out_of_memory("a KV event batch", e))?;
        events.push(ev);
    }
    let dp_rank = if n == 3 && !r.nil()? {
        match r.int()? {
            Some(i) => Some(
                i.as_i64()
                    .ok_or_else(|| bad("payload: dp_rank out of range"))?,
            ),
            None => {
                return Err(bad(format!(
                    "payload: dp_rank must be an int, got {}",
                    r.kind()?.name()
                )))
            }
        }
    } else {
        None
    };
    if r.remaining() != 0 {
        return Err(bad(format!(
            "payload has {} trailing bytes after the batch",
            r.remaining()
        )));
    }
    Ok(Batch {
        ts,
        events,
        dp_rank,
    })
}

/// Fields of one event as read so far (`None`: absent or nil).
#[derive(Default)]
struct Fields {
    block_hashes: Option<Vec<u64>>,
    parent_block_hash: Option<u64>,
    num_tokens: usize,
    block_size: Option<u32>,
    lora_id: Option<i64>,
    medium: Option<String>,
    lora_name: Option<String>,
    group_idx: Option<u32>,
    num_extra_keys: Option<usize>,
}

const STORED_FIELDS: [&str; 11] = [
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
];
const REMOVED_FIELDS: [&str; 3] = ["block_hashes", "medium", "group_idx"];

fn decode_event(r: &mut Reader<'_>, form: HashForm) -> Result<FleetEvent> {
    let mut f = Fields::default();
    // Borrowed from the frame (copied only when not valid UTF-8, to name it).
    let tag: Cow<'_, str>;
    if let Some(n) = r.map_len()? {
        let mut found = None;
        for _ in 0..n {
            let key = match r.str_bytes()? {
                Some(k) => k,
                None => {
                    return Err(bad(format!(
                        "event map keys must be str, got {}",
                        r.kind()?.name()
                    )))
                }
            };
            if key == b"type" {
                match r.str_bytes()? {
                    Some(t) => found = Some(String::from_utf8_lossy(t)),
                    None => {
                        return Err(bad(format!(
                            "\"type\" must be a str, got {}",
                            r.kind()?.name()
                        )))
                    }
                }
            } else {
                read_field(r, key, &mut f, form)?;
            }
        }
        tag = found.ok_or_else(|| bad("event map has no \"type\" tag"))?;
    } else if let Some(n) = r.array_len()? {
        tag = match (n, r.str_bytes()?) {
            (1.., Some(t)) => String::from_utf8_lossy(t),
            _ => return Err(bad("event array does not start with its type tag")),
        };
        let names: &[&str] = match &*tag {
            "BlockStored" => &STORED_FIELDS,
            "BlockRemoved" => &REMOVED_FIELDS,
            _ => &[],
        };
        for i in 0..n - 1 {
            match names.get(i) {
                Some(name) => read_field(r, name.as_bytes(), &mut f, form)?,
                None => r.skip()?,
            }
        }
    } else {
        return Err(bad(format!(
            "an event must be a map or an array, got {}",
            r.kind()?.name()
        )));
    }
    match &*tag {
        "BlockStored" => {
            let block_hashes = f
                .block_hashes
                .ok_or_else(|| bad("BlockStored without block_hashes"))?;
            if let Some(k) = f.num_extra_keys {
                if k != block_hashes.len() {
                    return Err(bad(format!(
                        "extra_keys has {k} entries for {} blocks",
                        block_hashes.len()
                    )));
                }
            }
            Ok(FleetEvent::Stored(Stored {
                block_hashes,
                parent_block_hash: f.parent_block_hash,
                num_tokens: f.num_tokens,
                block_size: f
                    .block_size
                    .ok_or_else(|| bad("BlockStored without block_size"))?,
                lora_id: f.lora_id,
                lora_name: f.lora_name,
                medium: f.medium,
                group_idx: f.group_idx.unwrap_or(0),
            }))
        }
        "BlockRemoved" => Ok(FleetEvent::Removed {
            block_hashes: f
                .block_hashes
                .ok_or_else(|| bad("BlockRemoved without block_hashes"))?,
            medium: f.medium,
            group_idx: f.group_idx.unwrap_or(0),
        }),
        "AllBlocksCleared" => Ok(FleetEvent::Cleared),
        other => Err(bad(format!(
            "unknown event type {other:?} (expected BlockStored, BlockRemoved or AllBlocksCleared)"
        ))),
    }
}

fn read_field(r: &mut Reader<'_>, key: &[u8], f: &mut Fields, form: HashForm) -> Result<()> {
    match key {
        b"block_hashes" => f.block_hashes = Some(hashes(r, "block_hashes", form)?),
        b"parent_block_hash" => {
            f.parent_block_hash = if r.nil()? {
                None
            } else {
                Some(hash(r, "parent_block_hash", form)?)
            }
        }
        b"token_ids" => f.num_tokens = token_ids(r)?,
        b"block_size" => {
            f.block_size = match r.int()? {
                Some(i) => Some(
                    // 0: vLLM's OffloadingConnector publishes hash-only placeholders.
                    i.as_u64()
                        .and_then(|x| u32::try_from(x).ok())
                        .ok_or_else(|| bad("block_size must be an int in [0, 2**32)"))?,
                ),
                None => {
                    return Err(bad(format!(
                        "block_size must be an int, got {}",
                        r.kind()?.name()
                    )))
                }
            }
        }
        b"lora_id" => f.lora_id = opt_int(r, "lora_id")?,
        b"medium" => f.medium = opt_str(r, "medium")?,
        b"lora_name" => f.lora_name = opt_str(r, "lora_name")?,
        b"group_idx" => {
            f.group_idx = match opt_int(r, "group_idx")? {
                None => None,
                Some(g) => Some(
                    u32::try_from(g).map_err(|_| bad("group_idx must be an int in 0..2**32"))?,
                ),
            }
        }
        b"extra_keys" => {
            f.num_extra_keys = if r.nil()? {
                None
            } else {
                let n = r
                    .array_len()?
                    .ok_or_else(|| bad("extra_keys must be an array or nil"))?;
                for _ in 0..n {
                    match r.kind()? {
                        Kind::Nil | Kind::Array => r.skip()?,
                        other => {
                            return Err(bad(format!(
                                "extra_keys entries must be nil or arrays, got {}",
                                other.name()
                            )))
                        }
                    }
                }
                Some(n)
            }
        }
        b"kv_cache_spec_kind" => {
            opt_str(r, "kv_cache_spec_kind")?;
        }
        b"kv_cache_spec_sliding_window" => {
            opt_int(r, "kv_cache_spec_sliding_window")?;
        }
        _ => r.skip()?,
    }
    Ok(())
}

fn hash(r: &mut Reader<'_>, what: &str, form: HashForm) -> Result<u64> {
    if let Some(i) = r.int()? {
        return i.as_u64().ok_or_else(|| {
            bad(format!(
                "{what}: block hash {} is out of range (a u64 or {} bytes)",
                i.as_i64().unwrap_or(0),
                form.hash_bytes
            ))
        });
    }
    if let Some(b) = r.bin()? {
        return form.key(b, what);
    }
    Err(bad(format!(
        "{what}: a block hash must be an int or bytes, got {}",
        r.kind()?.name()
    )))
}

fn hashes(r: &mut Reader<'_>, what: &str, form: HashForm) -> Result<Vec<u64>> {
    let n = match r.array_len()? {
        Some(n) => n,
        None => {
            return Err(bad(format!(
                "{what} must be an array, got {}",
                r.kind()?.name()
            )))
        }
    };
    let mut out = try_vec(n, what)?;
    for _ in 0..n {
        out.push(hash(r, what, form)?);
    }
    Ok(out)
}

fn token_ids(r: &mut Reader<'_>) -> Result<usize> {
    if r.nil()? {
        return Ok(0);
    }
    let n = match r.array_len()? {
        Some(n) => n,
        None => {
            return Err(bad(format!(
                "token_ids must be an array, got {}",
                r.kind()?.name()
            )))
        }
    };
    for _ in 0..n {
        match r.int()? {
            Some(i) if i.as_u64().is_some_and(|x| x <= u64::from(u32::MAX)) => {}
            Some(_) => return Err(bad("token_ids must hold ints in 0..2**32")),
            None => {
                return Err(bad(format!(
                    "token_ids must hold ints in 0..2**32, got {}",
                    r.kind()?.name()
                )))
            }
        }
    }
    Ok(n)
}

fn opt_int(r: &mut Reader<'_>, what: &str) -> Result<Option<i64>> {
    if r.nil()? {
        return Ok(None);
    }
    match r.int()? {
        Some(i) => i
            .as_i64()
            .map(Some)
            .ok_or_else(|| bad(format!("{what} is out of range"))),
        None => Err(bad(format!(
            "{what} must be an int or nil, got {}",
            r.kind()?.name()
        ))),
    }
}

fn opt_str(r: &mut Reader<'_>, what: &str) -> Result<Option<String>> {
    if r.nil()? {
        return Ok(None);
    }
    match r.str_bytes()? {
        Some(b) => match std::str::from_utf8(b) {
            Ok(s) => Ok(Some(try_copy_str(s, what)?)),
            Err(_) => Err(bad(format!("{what} is not valid UTF-8"))),
        },
        None => Err(bad(format!(
            "{what} must be a str or nil, got {}",
            r.kind()?.name()
        ))),
    }
}
