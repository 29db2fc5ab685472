//! The fleet index: which worker of a fleet of engine instances holds the longest prefix
//! of a request, kept exact from the KV events the engines publish (vLLM
//! `--kv-events-config`, SGLang's publisher). See docs/FLEET.md.
//!
//! - [`event`]: the validated events ([`FleetEvent`]), hash forms.
//! - [`wire`]: ZMQ frames and msgpack payloads -> events ([`msgpack`]: the streaming reader).
//! - [`holders`]: per-hash worker bitsets per medium; [`bitmaps`]: the same walk over
//!   Redis holder bitmaps.
//! - [`index`]: [`KvIndex`] (apply, sequence numbers, TTL, longest prefix, top-k).

pub mod bitmaps;
pub mod event;
pub mod holders;
pub mod index;
pub mod msgpack;
pub mod wire;

#[cfg(test)]
mod tests;

pub use event::{Batch, FleetEvent, HashForm, Stored, DEFAULT_MEDIUM};
pub use index::{
    check_ttl, check_weights, ApplyOutcome, FleetMatch, KvIndex, WorkerMatch, WorkerStatus,
    MAX_MEDIA,
};
