//! `KvIndex`: which worker holds which block hash, on which medium, fed by KV events.
//!
//! - `blocks`: hash -> [`Holders`] (per medium, a bitset over worker slots, and the copy
//!   counts of holders with several copies). vLLM may cache one hash on several blocks
//!   (and in several KV-cache groups); a worker stops holding a hash on a medium only
//!   when the last copy is removed. One table for everything: applying a block event is
//!   one probe. A worker's holdings are found by scanning it (reset, removal, listing).
//! - per worker and medium: how many distinct hashes it holds.
//! - per worker: the publisher's sequence state. Batches apply in sequence order; a batch
//!   past the next expected number is not applied and marks the worker stale until the
//!   missing batches arrive (a replay), since the events in between are unknown.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::event::{Batch, FleetEvent, HashForm, DEFAULT_MEDIUM};
use super::holders::{for_each_bit, Holders, Removal, Words};
use super::wire;
use crate::error::{try_copy, try_copy_str, try_filled, try_vec, Error, Result};

/// A name as a message shows it: at most its first 200 characters (a caller's name can
/// be of any size).
fn shown(name: &str) -> &str {
    match name.char_indices().nth(200) {
        Some((i, _)) => &name[..i],
        None => name,
    }
}

/// Distinct media names an index accepts (GPU, CPU, disk tiers ... ); more is bad input.
pub const MAX_MEDIA: usize = 64;

/// What happened to a batch with a sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyOutcome {
    /// Applied (its sequence number was the next expected one, or it had none).
    Applied,
    /// Already applied earlier (a replayed or repeated batch): ignored.
    Duplicate,
    /// Batches are missing before it: not applied, the worker is stale until they arrive.
    Gap,
}

impl ApplyOutcome {
    pub fn name(self) -> &'static str {
        match self {
            ApplyOutcome::Applied => "applied",
            ApplyOutcome::Duplicate => "duplicate",
            ApplyOutcome::Gap => "gap",
        }
    }
}

/// Per-worker counters and sequence state (a snapshot).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerStatus {
    pub worker: Arc<str>,
    /// The sequence number the next batch must carry.
    pub next_seq: u64,
    /// The highest sequence number seen but not applied (set while batches are missing).
    pub max_seen_seq: Option<u64>,
    pub stale: bool,
    pub expired: bool,
    /// Time (caller's clock, seconds) of the last valid batch, or of `add_worker`.
    pub last_seen: f64,
    pub batches: u64,
    pub block_events: u64,
    pub duplicates: u64,
    pub gaps: u64,
    /// Batches with sequence number 0 after others: the publisher restarted (the worker's
    /// holdings were cleared first, as the engine starts empty).
    pub restarts: u64,
    /// `BlockRemoved` of a hash the worker did not hold on that medium.
    pub unknown_removals: u64,
    /// Rejected batches (bad frames, msgpack, tags, field types, hash widths).
    pub errors: u64,
    pub last_error: Option<String>,
    pub dp_rank: Option<i64>,
    /// Distinct (medium, hash) pairs held.
    pub num_held: usize,
}

struct Worker {
    name: Arc<str>,
    /// Per medium id: distinct hashes held.
    held: Vec<usize>,
    next_seq: u64,
    max_seen: Option<u64>,
    /// Timestamp of the applied batch with sequence number 0 (tells a publisher restart,
    /// a new batch 0, from a repeated one).
    first_ts: Option<u64>,
    last_seen: f64,
    batches: u64,
    block_events: u64,
    duplicates: u64,
    gaps: u64,
    restarts: u64,
    unknown_removals: u64,
    errors: u64,
    last_error: Option<String>,
    dp_rank: Option<i64>,
}

impl Worker {
    fn new(name: Arc<str>, now: f64) -> Self {
        Worker {
            name,
            held: Vec::new(),
            next_seq: 0,
            max_seen: None,
            first_ts: None,
            last_seen: now,
            batches: 0,
            block_events: 0,
            duplicates: 0,
            gaps: 0,
            restarts: 0,
            unknown_removals: 0,
            errors: 0,
            last_error: None,
            dp_rank: None,
        }
    }

    fn stale(&self) -> bool {
        self.max_seen.is_some_and(|m| m >= self.next_seq)
    }

    /// Batch `seq` (its timestamp's bits `ts_bits`) is done: the next one is expected.
    fn advance(&mut self, seq: u64, ts_bits: Option<u64>) {
        if seq == 0 {
            self.first_ts = ts_bits;
        }
        self.next_seq = seq.saturating_add(1);
        if self.max_seen.is_some_and(|m| m < self.next_seq) {
            self.max_seen = None;
        }
    }
}

/// One worker's part of a query answer.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerMatch {
    pub worker: Arc<str>,
    /// Longest prefix held with each block on any medium.
    pub blocks: u32,
    /// Longest prefix held entirely on each medium (indexed like [`FleetMatch::media`]).
    pub per_medium: Vec<u32>,
    /// Sum over the `blocks` prefix of the best weight among the media holding each block
    /// (equals `blocks` with the default weights, 1 for every medium).
    pub score: f64,
    pub stale: bool,
    pub expired: bool,
}

/// A query answer for every worker, in slot order, column by column (cheap to build:
/// the name and media lists are shared snapshots of the index).
#[derive(Debug, Clone, PartialEq)]
pub struct FleetMatch {
    pub num_blocks: usize,
    pub media: Arc<[Arc<str>]>,
    pub workers: Arc<[Arc<str>]>,
    /// Per worker: longest prefix on any medium.
    pub blocks: Vec<u32>,
    /// Per worker and medium (`worker * media.len() + medium`): longest prefix.
    pub per_medium: Vec<u32>,
    pub score: Vec<f64>,
    pub stale: Vec<bool>,
    pub expired: Vec<bool>,
}

impl FleetMatch {
    /// Position of `worker` in [`FleetMatch::workers`].
    pub fn position(&self, worker: &str) -> Option<usize> {
        self.workers.iter().position(|w| &**w == worker)
    }

    /// The answer for the worker at position `i`.
    pub fn get(&self, i: usize) -> Option<WorkerMatch> {
        self.try_get(i).ok().flatten()
    }

    /// [`FleetMatch::get`]; `OutOfMemory` when its per-medium list cannot be allocated.
    pub fn try_get(&self, i: usize) -> Result<Option<WorkerMatch>> {
        let nm = self.media.len();
        let Some(worker) = self.workers.get(i) else {
            return Ok(None);
        };
        Ok(Some(WorkerMatch {
            worker: worker.clone(),
            blocks: self.blocks[i],
            per_medium: try_copy(
                &self.per_medium[i * nm..(i + 1) * nm],
                "a fleet query's answer",
            )?,
            score: self.score[i],
            stale: self.stale[i],
            expired: self.expired[i],
        }))
    }

    pub fn len(&self) -> usize {
        self.workers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }
}

/// The fleet index (see the module docs).
pub struct KvIndex {
    form: HashForm,
    ttl: Option<f64>,
    media: Vec<Arc<str>>,
    /// Snapshots shared with query answers: media names, and worker names with their
    /// slots in slot order (rebuilt when a medium or worker comes or goes).
    media_snapshot: Arc<[Arc<str>]>,
    names_snapshot: Arc<[Arc<str>]>,
    slots_snapshot: Vec<u32>,
    slots: Vec<Option<Worker>>,
    free_slots: Vec<u32>,
    names: FxHashMap<Arc<str>, u32>,
    blocks: FxHashMap<u64, Holders>,
}

impl KvIndex {
    /// `ttl`: seconds of silence after which a worker counts as expired (`None`: never).
    pub fn new(form: HashForm, ttl: Option<f64>) -> Result<Self> {
        check_ttl(ttl)?;
        Ok(KvIndex {
            form,
            ttl,
            media: Vec::new(),
            media_snapshot: Arc::from(Vec::new()),
            names_snapshot: Arc::from(Vec::new()),
            slots_snapshot: Vec::new(),
            slots: Vec::new(),
            free_slots: Vec::new(),
            names: FxHashMap::default(),
            blocks: FxHashMap::default(),
        })
    }

    pub fn hash_form(&self) -> HashForm {
        self.form
    }

    pub fn ttl(&self) -> Option<f64> {
        self.ttl
    }

    /// Distinct hashes held by at least one worker.
    pub fn num_hashes(&self) -> usize {
        self.blocks.len()
    }

    pub fn media(&self) -> &[Arc<str>] {
        &self.media
    }

    /// Workers known.
    pub fn num_workers(&self) -> usize {
        self.names.len()
    }

    /// Worker names in slot order.
    pub fn workers(&self) -> Result<Vec<Arc<str>>> {
        let mut out = try_vec(self.names_snapshot.len(), "the worker names")?;
        out.extend_from_slice(&self.names_snapshot);
        Ok(out)
    }

    fn slot_of(&self, name: &str) -> Result<u32> {
        self.names
            .get(name)
            .copied()
            .ok_or_else(|| Error::UnknownWorker(format!("unknown worker {:?}", shown(name))))
    }

    fn worker(&self, slot: u32) -> &Worker {
        match self.slots.get(slot as usize) {
            Some(Some(w)) => w,
            // `names` only maps to occupied slots (checked by `check_invariants`).
            _ => unreachable!("slot {slot} of a known worker is empty"),
        }
    }

    fn worker_mut(&mut self, slot: u32) -> &mut Worker {
        match self.slots.get_mut(slot as usize) {
            Some(Some(w)) => w,
            _ => unreachable!("slot {slot} of a known worker is empty"),
        }
    }

    /// Adds a worker (no-op when known); returns its slot. `now` starts its TTL.
    pub fn add_worker(&mut self, name: &str, now: f64) -> Result<u32> {
        if let Some(&s) = self.names.get(name) {
            return Ok(s);
        }
        let oom = |e| Error::out_of_memory("the fleet index's workers", e);
        self.slots.try_reserve(1).map_err(oom)?;
        self.names.try_reserve(1).map_err(oom)?;
        let snapshot = self.names_room(self.names.len() + 1)?;
        let name: Arc<str> = Arc::from(name);
        let w = Worker::new(name.clone(), now);
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(w);
                s
            }
            None => {
                self.slots.push(Some(w));
                (self.slots.len() - 1) as u32
            }
        };
        self.names.insert(name, slot);
        self.refresh_names(snapshot);
        Ok(slot)
    }

    /// Room for the name snapshots of `n` workers ([`KvIndex::refresh_names`]).
    fn names_room(&self, n: usize) -> Result<(Vec<Arc<str>>, Vec<u32>)> {
        Ok((
            try_vec(n, "the fleet index's workers")?,
            try_vec(n, "the fleet index's workers")?,
        ))
    }

    /// Rebuilds the name snapshots in `room` (from [`KvIndex::names_room`], for as many
    /// workers as there are now).
    fn refresh_names(&mut self, room: (Vec<Arc<str>>, Vec<u32>)) {
        let (mut names, mut slots) = room;
        for (s, w) in self.slots.iter().enumerate() {
            if let Some(w) = w {
                names.push(w.name.clone());
                slots.push(s as u32);
            }
        }
        self.names_snapshot = Arc::from(names);
        self.slots_snapshot = slots;
    }

    /// Removes a worker and everything it holds.
    pub fn remove_worker(&mut self, name: &str) -> Result<()> {
        let slot = self.slot_of(name)?;
        self.free_slots
            .try_reserve(1)
            .map_err(|e| Error::out_of_memory("the fleet index's workers", e))?;
        let snapshot = self.names_room(self.names.len())?;
        self.clear_slot(slot);
        self.slots[slot as usize] = None;
        self.names.remove(name);
        self.free_slots.push(slot);
        self.refresh_names(snapshot);
        Ok(())
    }

    /// Forgets what the worker holds and expects `next_seq` next (a resync point chosen
    /// by the caller, e.g. after a gap no replay can fill: the index then knows only the
    /// blocks stored from there on).
    pub fn reset_worker(&mut self, name: &str, next_seq: u64) -> Result<()> {
        let slot = self.slot_of(name)?;
        self.clear_slot(slot);
        let w = self.worker_mut(slot);
        w.next_seq = next_seq;
        w.max_seen = None;
        w.first_ts = None;
        Ok(())
    }

    fn clear_slot(&mut self, slot: u32) {
        let KvIndex { slots, blocks, .. } = self;
        let Some(Some(w)) = slots.get_mut(slot as usize) else {
            return;
        };
        if w.held.iter().all(|&n| n == 0) {
            return;
        }
        let held = &mut w.held;
        blocks.retain(|_, hs| {
            hs.clear_slot(slot, |m| held[m as usize] -= 1);
            !hs.is_empty()
        });
    }

    fn medium_id(&self, name: &str) -> Option<u8> {
        self.media
            .iter()
            .position(|m| &**m == name)
            .map(|i| i as u8)
    }

    /// The media of `events` not interned yet; fails past [`MAX_MEDIA`] (changes nothing).
    fn new_media(&self, events: &[FleetEvent]) -> Result<Vec<Arc<str>>> {
        let mut new: Vec<Arc<str>> = Vec::new();
        for m in events.iter().filter_map(FleetEvent::medium) {
            if self.medium_id(m).is_none() && !new.iter().any(|x| &**x == m) {
                new.try_reserve(1)
                    .map_err(|e| Error::out_of_memory("the fleet index's media", e))?;
                new.push(Arc::from(m));
                // Checked as each one comes, so that a batch naming many holds few.
                if self.media.len() + new.len() > MAX_MEDIA {
                    return Err(Error::InvalidEvent(format!(
                        "more than {MAX_MEDIA} distinct media (new: {new:?})"
                    )));
                }
            }
        }
        Ok(new)
    }

    /// Records a rejected batch for `name` (adding the worker when new).
    /// Without memory for a new worker or for the message, it records what it can.
    pub fn record_error(&mut self, name: &str, message: &str, now: f64) {
        let Ok(slot) = self.add_worker(name, now) else {
            return;
        };
        let w = self.worker_mut(slot);
        w.errors += 1;
        w.last_error = try_copy_str(message, "an error message").ok();
    }

    /// Decodes `[topic, seq, payload]` and applies it. A bad message is counted on the
    /// worker, changes nothing else, and comes back as the error.
    pub fn apply_frames(&mut self, name: &str, parts: &[&[u8]], now: f64) -> Result<ApplyOutcome> {
        match wire::decode_frames(parts, self.form) {
            Ok((seq, batch)) => self.apply_batch(name, &batch, Some(seq), now),
            // Not the batch's fault: nothing is recorded.
            Err(e @ Error::OutOfMemory(_)) => Err(e),
            Err(e) => {
                self.record_error(name, &e.to_string(), now);
                Err(e)
            }
        }
    }

    /// Applies a decoded batch. The `dp_rank` of an applied batch is recorded (None for a
    /// batch without one); a duplicate or a gap is not applied and changes nothing of it.
    pub fn apply_batch(
        &mut self,
        name: &str,
        batch: &Batch,
        seq: Option<u64>,
        now: f64,
    ) -> Result<ApplyOutcome> {
        let out = self.apply_stamped(name, &batch.events, seq, Some(batch.ts), now);
        if matches!(out, Ok(ApplyOutcome::Applied)) {
            if let Some(&slot) = self.names.get(name) {
                self.worker_mut(slot).dp_rank = batch.dp_rank;
            }
        }
        out
    }

    /// Applies `events` to worker `name` (added when new). With `seq`, the batch is
    /// applied only if it is the next one expected (see [`ApplyOutcome`]).
    pub fn apply(
        &mut self,
        name: &str,
        events: &[FleetEvent],
        seq: Option<u64>,
        now: f64,
    ) -> Result<ApplyOutcome> {
        self.apply_stamped(name, events, seq, None, now)
    }

    /// [`KvIndex::apply`] with the batch's timestamp `ts`: a batch with sequence number 0
    /// after others, with another timestamp than the first batch 0, means the publisher
    /// restarted (a new stream): the worker's holdings are cleared first. Without a
    /// timestamp a repeated sequence number 0 is a duplicate.
    pub fn apply_stamped(
        &mut self,
        name: &str,
        events: &[FleetEvent],
        seq: Option<u64>,
        ts: Option<f64>,
        now: f64,
    ) -> Result<ApplyOutcome> {
        let ts_bits = ts.map(f64::to_bits);
        let new_media = match self.new_media(events) {
            Ok(m) => m,
            Err(e @ Error::OutOfMemory(_)) => return Err(e),
            Err(e) => {
                self.record_error(name, &e.to_string(), now);
                return Err(e);
            }
        };
        let slot = self.add_worker(name, now)?;
        self.media
            .try_reserve(new_media.len())
            .map_err(|e| Error::out_of_memory("the fleet index's media", e))?;
        let media_room = if new_media.is_empty() {
            Vec::new()
        } else {
            try_vec(
                self.media.len() + new_media.len(),
                "the fleet index's media",
            )?
        };
        {
            let w = self.worker_mut(slot);
            w.last_seen = w.last_seen.max(now);
            if let Some(s) = seq {
                if s == 0 && w.next_seq > 0 && ts_bits.is_some() && ts_bits != w.first_ts {
                    w.restarts += 1;
                    w.max_seen = None;
                    w.next_seq = 0;
                    self.clear_slot(slot);
                } else if s < w.next_seq {
                    w.duplicates += 1;
                    return Ok(ApplyOutcome::Duplicate);
                } else if s > w.next_seq {
                    w.gaps += 1;
                    w.max_seen = Some(w.max_seen.map_or(s, |m| m.max(s)));
                    return Ok(ApplyOutcome::Gap);
                }
            }
        }
        if !new_media.is_empty() {
            self.media.extend(new_media);
            let mut snapshot = media_room;
            snapshot.extend_from_slice(&self.media);
            self.media_snapshot = Arc::from(snapshot);
        }
        for ev in events {
            if let Err(e) = self.apply_event(slot, ev) {
                self.drop_holdings(slot, seq, ts_bits);
                return Err(e);
            }
        }
        let w = self.worker_mut(slot);
        w.batches += 1;
        w.block_events += events
            .iter()
            .map(|e| e.num_block_events() as u64)
            .sum::<u64>();
        if let Some(s) = seq {
            w.advance(s, ts_bits);
        }
        Ok(ApplyOutcome::Applied)
    }

    /// A batch that ran out of memory as it was applied: the worker's holdings are
    /// dropped (what the batch applied with them), the batch counts as an error, and the
    /// worker's sequence moves past it as if it had applied (a replay of an earlier batch
    /// stays a duplicate). Allocates nothing but the message (left out when that fails
    /// too).
    fn drop_holdings(&mut self, slot: u32, seq: Option<u64>, ts_bits: Option<u64>) {
        self.clear_slot(slot);
        let w = self.worker_mut(slot);
        if let Some(s) = seq {
            w.advance(s, ts_bits);
        }
        w.errors += 1;
        w.last_error = None; // frees the old message first
        w.last_error = try_copy_str(
            "out of memory while applying a batch: the worker's holdings were dropped",
            "an error message",
        )
        .ok();
    }

    /// Applies one event; `OutOfMemory` when a holding cannot be recorded (the events
    /// applied so far stay: the caller drops the worker's holdings).
    fn apply_event(&mut self, slot: u32, ev: &FleetEvent) -> Result<()> {
        let medium = match ev.medium() {
            // Interned (`new_media`) before any event is applied.
            Some(m) => self.medium_id(m).unwrap_or(0),
            None => {
                self.clear_slot(slot);
                return Ok(());
            }
        };
        let KvIndex { slots, blocks, .. } = self;
        let Some(Some(w)) = slots.get_mut(slot as usize) else {
            return Ok(());
        };
        let m = medium as usize;
        if w.held.len() <= m {
            w.held
                .try_reserve(m + 1 - w.held.len())
                .map_err(|e| Error::out_of_memory("the fleet index's workers", e))?;
            w.held.resize(m + 1, 0);
        }
        let held = &mut w.held[m];
        match ev {
            FleetEvent::Stored(s) => {
                blocks
                    .try_reserve(s.block_hashes.len())
                    .map_err(|e| Error::out_of_memory("the fleet index's table", e))?;
                for &h in &s.block_hashes {
                    match blocks.entry(h).or_default().try_add(medium, slot) {
                        Ok(true) => *held += 1,
                        Ok(false) => {}
                        Err(e) => {
                            // A hash new to the table lists no holder: not kept.
                            if blocks.get(&h).is_some_and(Holders::is_empty) {
                                blocks.remove(&h);
                            }
                            return Err(e);
                        }
                    }
                }
            }
            FleetEvent::Removed { block_hashes, .. } => {
                for &h in block_hashes {
                    // Not `entry`, which may grow a full table (allocate) for any hash:
                    // a removal allocates nothing.
                    let Some(hs) = blocks.get_mut(&h) else {
                        w.unknown_removals += 1;
                        continue;
                    };
                    match hs.remove(medium, slot) {
                        Removal::Unknown => w.unknown_removals += 1,
                        Removal::Copy => {}
                        Removal::Last => {
                            *held -= 1;
                            if hs.is_empty() {
                                blocks.remove(&h);
                            }
                        }
                    }
                }
            }
            FleetEvent::Cleared => {}
        }
        Ok(())
    }

    fn expired(&self, w: &Worker, now: f64) -> bool {
        self.ttl.is_some_and(|t| now - w.last_seen > t)
    }

    pub fn status(&self, name: &str, now: f64) -> Result<WorkerStatus> {
        let w = self.worker(self.slot_of(name)?);
        Ok(WorkerStatus {
            worker: w.name.clone(),
            next_seq: w.next_seq,
            max_seen_seq: w.max_seen,
            stale: w.stale(),
            expired: self.expired(w, now),
            last_seen: w.last_seen,
            batches: w.batches,
            block_events: w.block_events,
            duplicates: w.duplicates,
            gaps: w.gaps,
            restarts: w.restarts,
            unknown_removals: w.unknown_removals,
            errors: w.errors,
            last_error: match &w.last_error {
                Some(m) => Some(try_copy_str(m, "the worker's status")?),
                None => None,
            },
            dp_rank: w.dp_rank,
            num_held: w.held.iter().sum(),
        })
    }

    /// The hashes `name` holds (on `medium`, or on any medium), sorted.
    pub fn cached_hashes(&self, name: &str, medium: Option<&str>) -> Result<Vec<u64>> {
        let slot = self.slot_of(name)?;
        // The media asked about, as bits (ids are below 64).
        let media: u64 = match medium {
            Some(m) => self.medium_id(m).map_or(0, |id| 1 << id),
            None => u64::MAX,
        };
        let w = self.worker(slot);
        let n = (0..w.held.len())
            .filter(|&m| media & (1 << m) != 0)
            .map(|m| w.held[m])
            .sum();
        let mut out = try_vec(n, "the worker's hashes")?;
        out.extend(
            self.blocks
                .iter()
                .filter(|(_, hs)| {
                    hs.media()
                        .any(|(m, _)| media & (1 << m) != 0 && hs.holds(m, slot))
                })
                .map(|(&h, _)| h),
        );
        out.sort_unstable();
        Ok(out)
    }

    /// Workers silent for longer than the TTL, removed; returns their names.
    pub fn prune_expired(&mut self, now: f64) -> Result<Vec<Arc<str>>> {
        let n = self
            .slots
            .iter()
            .flatten()
            .filter(|w| self.expired(w, now))
            .count();
        let mut gone = try_vec(n, "the pruned workers' names")?;
        gone.extend(
            self.slots
                .iter()
                .flatten()
                .filter(|w| self.expired(w, now))
                .map(|w| w.name.clone()),
        );
        if gone.is_empty() {
            return Ok(gone);
        }
        self.free_slots
            .try_reserve(gone.len())
            .map_err(|e| Error::out_of_memory("the fleet index's workers", e))?;
        let snapshot = self.names_room(self.names.len() - gone.len())?;
        for n in &gone {
            // Listed just above, so known.
            let Some(slot) = self.names.remove(n) else {
                continue;
            };
            self.clear_slot(slot);
            self.slots[slot as usize] = None;
            self.free_slots.push(slot);
        }
        self.refresh_names(snapshot);
        Ok(gone)
    }

    /// Per-medium weights by medium id (1.0 for media not named).
    fn weight_table(&self, weights: Option<&[(String, f64)]>) -> Result<Option<Vec<f64>>> {
        let Some(ws) = weights else {
            return Ok(None);
        };
        let mut table = try_vec(self.media.len(), "the medium weights")?;
        table.resize(self.media.len(), 1.0);
        check_weights(ws)?;
        for (name, w) in ws {
            if let Some(id) = self.medium_id(name) {
                table[id as usize] = *w;
            }
        }
        Ok(Some(table))
    }

    /// Every worker's longest held prefix of `hashes` (a request's block hashes in order),
    /// per medium and on any medium, with its score (see [`WorkerMatch`]).
    pub fn longest_prefix(
        &self,
        hashes: &[u64],
        now: f64,
        weights: Option<&[(String, f64)]>,
    ) -> Result<FleetMatch> {
        let weights = self.weight_table(weights)?;
        let n = hashes.len() as u32;
        let nslots = self.slots.len();
        let words = nslots.div_ceil(64);
        let nm = self.media.len();
        let what = "a fleet query's answer";
        let mut live = try_filled(words, 0u64, what)?;
        for (s, w) in self.slots.iter().enumerate() {
            if w.is_some() {
                live[s / 64] |= 1 << (s % 64);
            }
        }
        let live_count: usize = live.iter().map(|w| w.count_ones() as usize).sum();
        // Rows 0..nm: per medium; row nm: any medium.
        let mut active: Vec<u64> = try_vec((nm + 1) * words, what)?;
        for _ in 0..=nm {
            active.extend_from_slice(&live);
        }
        let mut lens = try_filled((nm + 1) * nslots, n, what)?;
        let mut score = try_filled(if weights.is_some() { nslots } else { 0 }, 0.0f64, what)?;
        let mut remaining = live_count * (nm + 1);
        let mut any_hold = try_filled(words, 0u64, what)?;
        // (medium, weight) of the media holding a block: at most one entry per medium.
        let mut order: Vec<(u8, f64)> = try_vec(if weights.is_some() { nm } else { 0 }, what)?;
        for (i, h) in hashes.iter().enumerate() {
            if remaining == 0 {
                break;
            }
            let holders = self.blocks.get(h);
            any_hold.fill(0);
            for m in 0..nm {
                let held_by = holders.map_or(Words::NONE, |x| x.on(m as u8));
                let hb = held_by.as_slice();
                let row = &mut active[m * words..(m + 1) * words];
                for (j, a) in row.iter_mut().enumerate() {
                    let hw = hb.get(j).copied().unwrap_or(0);
                    any_hold[j] |= hw;
                    if *a == 0 {
                        continue;
                    }
                    let kept = *a & hw;
                    let dropped = *a & !kept;
                    if dropped != 0 {
                        remaining -= dropped.count_ones() as usize;
                        let base = m * nslots;
                        for_each_bit(j, dropped, |s| lens[base + s] = i as u32);
                        *a = kept;
                    }
                }
            }
            let row = &mut active[nm * words..];
            for (j, a) in row.iter_mut().enumerate() {
                if *a == 0 {
                    continue;
                }
                let kept = *a & any_hold[j];
                let dropped = *a & !kept;
                if dropped != 0 {
                    remaining -= dropped.count_ones() as usize;
                    let base = nm * nslots;
                    for_each_bit(j, dropped, |s| lens[base + s] = i as u32);
                    *a = kept;
                }
                if let (Some(wt), Some(hs)) = (&weights, holders) {
                    // Best weight first: each worker counts the block once, at the best
                    // weight among the media it holds the block on.
                    order.clear();
                    order.extend(hs.media().map(|(m, _)| (m, wt[m as usize])));
                    order.sort_by(|x, y| y.1.total_cmp(&x.1));
                    let mut covered = 0u64;
                    for &(m, wm) in &order {
                        let add =
                            kept & hs.on(m).as_slice().get(j).copied().unwrap_or(0) & !covered;
                        covered |= add;
                        for_each_bit(j, add, |s| score[s] += wm);
                    }
                }
            }
        }
        let nw = self.slots_snapshot.len();
        let mut blocks = try_vec(nw, what)?;
        let mut per_medium = try_vec(nw * nm, what)?;
        let mut scores = try_vec(nw, what)?;
        let mut stale = try_vec(nw, what)?;
        let mut expired = try_vec(nw, what)?;
        for &slot in &self.slots_snapshot {
            let s = slot as usize;
            let b = lens[nm * nslots + s];
            blocks.push(b);
            per_medium.extend((0..nm).map(|m| lens[m * nslots + s]));
            scores.push(if weights.is_some() {
                score[s]
            } else {
                f64::from(b)
            });
            let w = self.worker(slot);
            stale.push(w.stale());
            expired.push(self.expired(w, now));
        }
        Ok(FleetMatch {
            num_blocks: hashes.len(),
            media: self.media_snapshot.clone(),
            workers: self.names_snapshot.clone(),
            blocks,
            per_medium,
            score: scores,
            stale,
            expired,
        })
    }

    /// The `k` best workers by score (ties: longer prefix, then slot order). Stale and
    /// expired workers are left out unless `include_unhealthy`.
    pub fn top_k(
        &self,
        hashes: &[u64],
        k: usize,
        now: f64,
        weights: Option<&[(String, f64)]>,
        include_unhealthy: bool,
    ) -> Result<Vec<WorkerMatch>> {
        let m = self.longest_prefix(hashes, now, weights)?;
        let what = "a fleet query's answer";
        let mut order: Vec<usize> = try_vec(m.len(), what)?;
        order.extend((0..m.len()).filter(|&i| include_unhealthy || !(m.stale[i] || m.expired[i])));
        // Best first, slot order among equals; the `k` best picked first, then sorted
        // (neither allocates).
        let best_first = |&a: &usize, &b: &usize| {
            m.score[b]
                .total_cmp(&m.score[a])
                .then(m.blocks[b].cmp(&m.blocks[a]))
                .then(a.cmp(&b))
        };
        if k < order.len() {
            order.select_nth_unstable_by(k, best_first);
            order.truncate(k);
        }
        order.sort_unstable_by(best_first);
        let mut out = try_vec(order.len(), what)?;
        for i in order {
            if let Some(w) = m.try_get(i)? {
                out.push(w);
            }
        }
        Ok(out)
    }

    /// Everything the index holds, canonically (tests compare it): media, workers with
    /// their sequence state and counters, the shared name lists, free slots, and every
    /// hash's holders by medium and its multi-copy counts, by hash.
    pub fn state_dump(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(out, "media {:?} {:?}", self.media, self.media_snapshot);
        let _ = writeln!(
            out,
            "names {:?} {:?} free {:?}",
            self.names_snapshot, self.slots_snapshot, self.free_slots
        );
        for (s, w) in self.slots.iter().enumerate() {
            let Some(w) = w else { continue };
            let _ = writeln!(
                out,
                "worker {s} {:?} next {} max {:?} first {:?} seen {} batches {} events {} \
                 duplicates {} gaps {} restarts {} unknown {} errors {} last {:?} dp {:?} \
                 held {:?}",
                w.name,
                w.next_seq,
                w.max_seen,
                w.first_ts,
                w.last_seen,
                w.batches,
                w.block_events,
                w.duplicates,
                w.gaps,
                w.restarts,
                w.unknown_removals,
                w.errors,
                w.last_error,
                w.dp_rank,
                w.held,
            );
        }
        let mut hashes: Vec<(&u64, &Holders)> = self.blocks.iter().collect();
        hashes.sort_by_key(|(h, _)| **h);
        for (h, hs) in hashes {
            let mut media: Vec<(u8, Vec<u64>)> = hs
                .media()
                .map(|(m, w)| (m, w.as_slice().to_vec()))
                .collect();
            media.sort();
            let mut copies = hs.multi_copies().to_vec();
            copies.sort();
            let _ = writeln!(out, "hash {h} {media:?} {copies:?}");
        }
        out
    }

    /// Full consistency check (tests): holders and per-worker copies agree exactly.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        for (name, &slot) in &self.names {
            match self.slots.get(slot as usize) {
                Some(Some(w)) if *w.name == **name => {}
                _ => {
                    return Err(format!(
                        "name {name:?} maps to slot {slot}, which is not it"
                    ))
                }
            }
        }
        let occupied = self.slots.iter().flatten().count();
        if occupied != self.names.len() {
            return Err(format!(
                "{occupied} occupied slots, {} names",
                self.names.len()
            ));
        }
        // Recount every worker's distinct hashes per medium from the holder bits.
        let mut counted: Vec<Vec<usize>> = vec![Vec::new(); self.slots.len()];
        for (h, hs) in &self.blocks {
            if hs.is_empty() {
                return Err(format!("hash {h} listed with no holder"));
            }
            for (m, words) in hs.media() {
                let b = words.as_slice();
                if b.last() == Some(&0) {
                    return Err(format!("hash {h} medium {m}: trailing zero word"));
                }
                for (j, word) in b.iter().enumerate() {
                    let mut bad = None;
                    for_each_bit(j, *word, |s| match counted.get_mut(s) {
                        Some(c) if matches!(self.slots.get(s), Some(Some(_))) => {
                            if c.len() <= m as usize {
                                c.resize(m as usize + 1, 0);
                            }
                            c[m as usize] += 1;
                        }
                        _ => bad = Some(s),
                    });
                    if let Some(s) = bad {
                        return Err(format!("hash {h} lists slot {s}, which holds no worker"));
                    }
                }
            }
            for &(m, s, c) in hs.multi_copies() {
                if c < 2 || !hs.holds(m, s) {
                    return Err(format!("hash {h}: {c} copies on slot {s} medium {m}"));
                }
            }
            if hs.needlessly_boxed() {
                return Err(format!("hash {h}: boxed holders that fit inline"));
            }
        }
        for (s, w) in self.slots.iter().enumerate() {
            let Some(w) = w else { continue };
            let n = w.held.len().max(counted[s].len());
            for m in 0..n {
                let have = w.held.get(m).copied().unwrap_or(0);
                let found = counted[s].get(m).copied().unwrap_or(0);
                if have != found {
                    return Err(format!(
                        "worker {:?} medium {m}: counts {have} hashes, holds {found}",
                        w.name
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The default medium's name.
pub fn default_medium() -> &'static str {
    DEFAULT_MEDIUM
}

/// A worker TTL: None, or a positive finite number of seconds.
pub fn check_ttl(ttl: Option<f64>) -> Result<()> {
    match ttl {
        Some(t) if !(t > 0.0 && t.is_finite()) => Err(Error::InvalidArgument(format!(
            "ttl must be a positive number of seconds, got {t}"
        ))),
        _ => Ok(()),
    }
}

/// Per-medium weights of a query: each a finite number >= 0.
pub fn check_weights(weights: &[(String, f64)]) -> Result<()> {
    match weights.iter().find(|(_, w)| !(w.is_finite() && *w >= 0.0)) {
        Some((name, w)) => Err(Error::InvalidArgument(format!(
            "weight of medium {name:?} must be a finite number >= 0, got {w}"
        ))),
        None => Ok(()),
    }
}
