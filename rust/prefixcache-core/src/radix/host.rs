//! SGLang's HiCache host tier behind the radix tree (SEMANTICS.md 1.9).
//!
//! Host memory holds copies of nodes ("backed up"). A backed-up node evicted from the
//! device stays in the tree, host-only ("evicted"); a match walks through it and reports
//! it as the host part of the hit, `load_back` gives it device KV again, host eviction
//! deletes host-only leaves. Writes and loads complete at once (SGLang runs them
//! asynchronously and acknowledges them later; the simulator has no clock for that).
//!
//! Per-node host state lives in a side table indexed by slot ([`HostSlot`]), not in the
//! node: a tree without a host tier pays one `Option` in the tree and nothing per node.
//! Device nodes are prefix-closed (every ancestor of a device node is on the device), so
//! on any root-to-node path the host-only nodes are a tail.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::str::FromStr;

use rustc_hash::FxHashMap;

use super::children::child_key;
use super::evict::FreedSink;
use super::node::Node;
use super::policy::PolicyKey;
use super::slab::Slab;
use super::span::Span;
use super::tree::{NodeRef, RadixTree, NO_PARENT, ROOT};
use crate::{Error, Result};

/// When a node is copied to host memory (SGLang `--hicache-write-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WritePolicy {
    /// Every inserted node, at once (write-through threshold 1).
    WriteThrough,
    /// A node once its hit count reaches 2.
    WriteThroughSelective,
    /// A node only when it is evicted from the device.
    WriteBack,
}

impl WritePolicy {
    pub const ALL: [WritePolicy; 3] = [
        WritePolicy::WriteThrough,
        WritePolicy::WriteThroughSelective,
        WritePolicy::WriteBack,
    ];

    pub fn name(self) -> &'static str {
        match self {
            WritePolicy::WriteThrough => "write_through",
            WritePolicy::WriteThroughSelective => "write_through_selective",
            WritePolicy::WriteBack => "write_back",
        }
    }

    /// The hit count at which insert backs a node up (SGLang `write_through_threshold`).
    fn threshold(self) -> u64 {
        match self {
            WritePolicy::WriteThrough => 1,
            WritePolicy::WriteThroughSelective => 2,
            WritePolicy::WriteBack => u64::MAX,
        }
    }
}

impl FromStr for WritePolicy {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let norm = s.to_ascii_lowercase().replace('-', "_");
        WritePolicy::ALL
            .into_iter()
            .find(|p| p.name() == norm)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "unknown write policy {s:?}: expected one of write_through, \
                     write_through_selective, write_back"
                ))
            })
    }
}

/// The host state of one slot.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct HostSlot {
    /// A copy of the node is in host memory.
    pub(crate) backed: bool,
    /// The node has no device KV (host-only); implies `backed`.
    pub(crate) evicted: bool,
    /// Children that are on the device (a device leaf has none).
    pub(crate) device_children: u32,
}

/// Counters of the host tier, in tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostStats {
    /// Tokens written to host memory.
    pub stored_tokens: u64,
    /// Tokens dropped from host memory by host eviction.
    pub host_evicted_tokens: u64,
    /// Tokens loaded back from host memory to the device.
    pub loaded_tokens: u64,
    /// The most tokens host memory held at once.
    pub peak_host_tokens: usize,
}

type HostEntry = Reverse<(PolicyKey, u32, u64)>;

/// The host copies' values, kept when asked ([`RadixTree::set_host_events`]): per
/// backed-up slot the KV values the node had when it was copied (SGLang `host_value`),
/// and the values of the copies made and dropped since the last
/// [`RadixTree::take_host_events`].
#[derive(Debug, Default)]
struct HostValues {
    by_slot: FxHashMap<u32, HostCopy>,
    stored: Vec<HostCopy>,
    dropped: Vec<HostCopy>,
    /// A node's values on their way into a copy (kept for its capacity).
    scratch: Vec<i64>,
    /// Copies an insert made before it changed anything, for the backups it makes
    /// once it can no longer fail: `(slot, copy, twin)` ([`PENDING_LEAF`]: the leaf it
    /// is about to add).
    prepared: Vec<(u32, HostCopy, HostCopy)>,
    /// Between an insert's `host_prepare_backups` and `host_drop_prepared`: its backups
    /// must find their copies prepared (checked in debug builds).
    inserting: bool,
}

/// The slot of a prepared copy whose node (an insert's new leaf) does not exist yet.
const PENDING_LEAF: u32 = u32::MAX;

impl HostValues {
    /// The copy of `span`'s values that a backup files, its twin for the stored events,
    /// and room to file them (and to drop every copy later): allocated before the backup
    /// changes anything. An error when the memory cannot be allocated.
    fn prepare_copy(&mut self, span: &Span) -> Result<(HostCopy, HostCopy)> {
        self.scratch.clear();
        self.scratch.try_reserve(span.len()).map_err(host_oom)?;
        span.extend_values(&mut self.scratch);
        self.copy_scratch()
    }

    /// [`HostValues::prepare_copy`] of the values in `scratch`.
    fn copy_scratch(&mut self) -> Result<(HostCopy, HostCopy)> {
        let copy = HostCopy::try_new(&self.scratch)?;
        let twin = copy.try_clone()?;
        self.room_for(1)?;
        Ok((copy, twin))
    }

    /// The copy prepared for `slot`, if any.
    fn take_prepared(&mut self, slot: u32) -> Option<(HostCopy, HostCopy)> {
        let i = self.prepared.iter().position(|p| p.0 == slot)?;
        let (_, copy, twin) = self.prepared.swap_remove(i);
        Some((copy, twin))
    }

    /// The copies of the nodes `slots` and of `leaf` (its tokens and values), filed in
    /// `prepared` with the room to file them all (`host_prepare_backups`); on failure
    /// none.
    fn prepare_all(
        &mut self,
        slots: &[u32],
        nodes: &Slab<Node>,
        leaf: Option<(&[u32], Option<&[i64]>)>,
    ) -> Result<()> {
        let out = (|| {
            let n = slots.len() + usize::from(leaf.is_some());
            self.prepared.try_reserve(n).map_err(host_oom)?;
            self.room_for(n)?;
            if let Some((tokens, values)) = leaf {
                self.scratch.clear();
                self.scratch.try_reserve(tokens.len()).map_err(host_oom)?;
                match values {
                    Some(x) => self.scratch.extend_from_slice(x),
                    None => self.scratch.extend(tokens.iter().map(|&t| i64::from(t))),
                }
                let (copy, twin) = self.copy_scratch()?;
                self.prepared.push((PENDING_LEAF, copy, twin));
            }
            for &s in slots {
                let (copy, twin) = self.prepare_copy(&nodes[s as usize].span)?;
                self.prepared.push((s, copy, twin));
            }
            Ok(())
        })();
        if out.is_err() {
            self.prepared.clear();
        }
        out
    }

    /// Room to file `n` more copies, their stored events, and to drop them later.
    fn room_for(&mut self, n: usize) -> Result<()> {
        self.by_slot.try_reserve(n).map_err(host_oom)?;
        self.stored.try_reserve(n).map_err(host_oom)?;
        self.dropped
            .try_reserve(self.by_slot.len() + n)
            .map_err(host_oom)
    }

    /// Room to file one more copy (a split's second part: no stored event), and to drop
    /// every copy filed then without allocating (`dropped` always has room for all).
    fn room_for_one_more(&mut self) -> Result<()> {
        self.by_slot.try_reserve(1).map_err(host_oom)?;
        self.dropped
            .try_reserve(self.by_slot.len() + 1)
            .map_err(host_oom)
    }
}

fn host_oom(e: impl std::fmt::Display) -> Error {
    Error::out_of_memory("the host copies' values", e)
}

/// The values of `copies`, one after the other (`nonzero`: without the zeros).
fn flatten(copies: &[HostCopy], nonzero: bool) -> Result<Vec<i64>> {
    let total: usize = copies
        .iter()
        .map(|c| if nonzero { c.nonzero_len() } else { c.len() })
        .sum();
    let mut out = Vec::new();
    out.try_reserve_exact(total).map_err(host_oom)?;
    for c in copies {
        if nonzero {
            c.extend_nonzero(&mut out);
        } else {
            c.extend_into(&mut out);
        }
    }
    Ok(out)
}

/// `values` as a boxed slice, or an error when it cannot be allocated.
fn try_boxed<T: Copy>(values: &[T]) -> Result<Box<[T]>> {
    let mut v = Vec::new();
    v.try_reserve_exact(values.len()).map_err(host_oom)?;
    v.extend_from_slice(values);
    // The capacity is exact: no reallocation.
    Ok(v.into_boxed_slice())
}

/// The values of one host copy: all of them, or, when most are 0 (a publisher's block
/// labels: one id per block), the others with their offsets.
/// Not `Clone`: a copy is duplicated with [`HostCopy::try_clone`], which can fail.
#[derive(Debug)]
pub(crate) enum HostCopy {
    Dense(Box<[i64]>),
    Sparse {
        len: usize,
        at: Box<[u32]>,
        val: Box<[i64]>,
    },
}

impl HostCopy {
    /// A copy of `values`, or an error when its memory cannot be allocated.
    fn try_new(values: &[i64]) -> Result<Self> {
        let nonzero = values.iter().filter(|&&v| v != 0).count();
        // Sparse takes 12 bytes per nonzero value, dense 8 per value.
        if nonzero * 3 >= values.len() * 2 || u32::try_from(values.len()).is_err() {
            return Ok(HostCopy::Dense(try_boxed(values)?));
        }
        let mut at = Vec::new();
        let mut val = Vec::new();
        at.try_reserve_exact(nonzero).map_err(host_oom)?;
        val.try_reserve_exact(nonzero).map_err(host_oom)?;
        for (i, &v) in values.iter().enumerate() {
            if v != 0 {
                at.push(i as u32); // i < len <= u32::MAX (checked above)
                val.push(v);
            }
        }
        Ok(HostCopy::Sparse {
            len: values.len(),
            at: at.into_boxed_slice(),
            val: val.into_boxed_slice(),
        })
    }

    /// Another copy of the same values, or an error when it cannot be allocated.
    fn try_clone(&self) -> Result<Self> {
        Ok(match self {
            HostCopy::Dense(v) => HostCopy::Dense(try_boxed(v)?),
            HostCopy::Sparse { len, at, val } => HostCopy::Sparse {
                len: *len,
                at: try_boxed(at)?,
                val: try_boxed(val)?,
            },
        })
    }

    fn nonzero_len(&self) -> usize {
        match self {
            HostCopy::Dense(v) => v.iter().filter(|&&x| x != 0).count(),
            HostCopy::Sparse { val, .. } => val.len(),
        }
    }

    fn len(&self) -> usize {
        match self {
            HostCopy::Dense(v) => v.len(),
            HostCopy::Sparse { len, .. } => *len,
        }
    }

    /// Appends the values to `out`.
    fn extend_into(&self, out: &mut Vec<i64>) {
        match self {
            HostCopy::Dense(v) => out.extend_from_slice(v),
            HostCopy::Sparse { len, at, val } => {
                let base = out.len();
                out.resize(base + len, 0);
                for (&i, &v) in at.iter().zip(val.iter()) {
                    out[base + i as usize] = v;
                }
            }
        }
    }

    /// Appends the values that are not 0 to `out`.
    fn extend_nonzero(&self, out: &mut Vec<i64>) {
        match self {
            HostCopy::Dense(v) => out.extend(v.iter().filter(|&&x| x != 0)),
            // Only nonzero values are kept.
            HostCopy::Sparse { val, .. } => out.extend_from_slice(val),
        }
    }

    fn try_to_vec(&self) -> Result<Vec<i64>> {
        let mut out = Vec::new();
        out.try_reserve_exact(self.len()).map_err(host_oom)?;
        self.extend_into(&mut out);
        Ok(out)
    }

    /// The first `p` values and the rest, or an error when they cannot be allocated.
    fn try_split_at(&self, p: usize) -> Result<(HostCopy, HostCopy)> {
        let all = self.try_to_vec()?;
        let p = p.min(all.len());
        Ok((HostCopy::try_new(&all[..p])?, HostCopy::try_new(&all[p..])?))
    }
}

#[derive(Debug)]
pub(crate) struct HostTier {
    capacity: usize,
    used: usize,
    policy: WritePolicy,
    pub(crate) slots: Vec<HostSlot>,
    /// Candidate host leaves by policy key, checked when popped (a touch or a state
    /// change pushes a fresh entry instead of moving the old one). Its capacity covers
    /// every slot plus [`HEAP_SLACK`] ([`RadixTree::host_reserve`]): a push that finds it
    /// full first drops the stale entries, so it never allocates.
    heap: BinaryHeap<HostEntry>,
    /// A backup chain's nodes (room for every slot: [`RadixTree::host_reserve`]).
    chain: Vec<u32>,
    /// Rebuilds of the host order, and those a full heap forced (tests only).
    #[cfg(test)]
    rebuilds: [usize; 2],
    evicted_nodes: usize,
    stats: HostStats,
    /// `Some` when the host copies' values are kept (`set_host_events`).
    values: Option<Box<HostValues>>,
}

impl HostTier {
    fn new(capacity: usize, policy: WritePolicy) -> Self {
        HostTier {
            capacity,
            used: 0,
            policy,
            slots: Vec::new(),
            heap: BinaryHeap::new(),
            chain: Vec::new(),
            #[cfg(test)]
            rebuilds: [0; 2],
            evicted_nodes: 0,
            stats: HostStats::default(),
            values: None,
        }
    }

    fn clear(&mut self) {
        let keep = self.values.is_some();
        *self = HostTier::new(self.capacity, self.policy);
        if keep {
            self.values = Some(Box::default());
        }
    }

    #[inline]
    pub(crate) fn slot(&self, slot: u32) -> HostSlot {
        self.slots.get(slot as usize).copied().unwrap_or_default()
    }

    /// The host state of `slot`, for writing. Its room was reserved with the slot
    /// ([`RadixTree::host_reserve`]), so this never allocates.
    #[inline]
    fn slot_mut(&mut self, slot: u32) -> &mut HostSlot {
        let i = slot as usize;
        if i >= self.slots.len() {
            debug_assert!(i < self.slots.capacity(), "host slot {i} not reserved");
            self.slots.resize(i + 1, HostSlot::default());
        }
        &mut self.slots[i]
    }

    fn free(&self) -> usize {
        self.capacity - self.used
    }
}

/// Host-order entries beyond one per slot that a push may find before the stale ones
/// are dropped (fewer rebuilds of a heap with many stale entries).
const HEAP_SLACK: usize = 1024;

impl RadixTree {
    /// Puts a host tier of `capacity` tokens behind the device (SGLang HiCache). Only on
    /// an empty tree; a capacity of 0 removes the tier.
    pub fn set_host_tier(&mut self, capacity: usize, policy: WritePolicy) -> Result<()> {
        if self.num_nodes != 0 {
            return Err(Error::InvalidArgument(
                "set_host_tier: the tree must be empty".into(),
            ));
        }
        let old = self.host.take();
        self.host = (capacity > 0).then(|| Box::new(HostTier::new(capacity, policy)));
        if let Err(e) = self.host_reserve() {
            self.host = old;
            return Err(e);
        }
        Ok(())
    }

    /// With the copies' values kept: makes, before an insert changes anything, the
    /// copies its backups will file once it can no longer fail, with the room to file
    /// them. The backups are the nodes in `backups` (on the insert's path, top-down)
    /// and, when `leaf` is given (its tokens and values: the inserted ones, or None for
    /// the tokens), the leaf it is about to add under `path_end`, each with the unbacked
    /// ancestors its chain copies. On failure nothing is kept and nothing changed.
    pub(crate) fn host_prepare_backups(
        &mut self,
        path_end: u32,
        backups: &[u32],
        leaf: Option<(&[u32], Option<&[i64]>)>,
    ) -> Result<()> {
        let Some(h) = self.host.as_mut() else {
            return Ok(());
        };
        if h.values.is_none() {
            return Ok(());
        }
        // The nodes the backup chains will copy, in the chain buffer (room for every
        // slot): walking up from the deepest backup, each backup and the unbacked nodes
        // above it up to the first backed one (`backup_chain`).
        let mut chain = std::mem::take(&mut h.chain);
        chain.clear();
        let mut pending = backups.len(); // `backups[..pending]`: not met yet (top-down)
        let (mut cur, mut active) = match (leaf, backups.last()) {
            (Some(_), _) => (path_end, true),
            (None, Some(&b)) => (b, false),
            (None, None) => (ROOT, false),
        };
        while cur != ROOT {
            if pending > 0 && backups[pending - 1] == cur {
                pending -= 1;
                active = true;
            }
            if h.slot(cur).backed {
                active = false;
            } else if active {
                chain.push(cur);
            }
            cur = self.nodes[cur as usize].parent;
        }
        let out = match h.values.as_mut() {
            Some(v) => {
                let out = v.prepare_all(&chain, &self.nodes, leaf);
                v.inserting = out.is_ok();
                out
            }
            None => Ok(()),
        };
        h.chain = chain;
        out
    }

    /// The insert's new leaf is `slot`: its prepared copy (if any) is its own now.
    pub(crate) fn host_name_leaf(&mut self, slot: u32) {
        if let Some(v) = self.host.as_mut().and_then(|h| h.values.as_mut()) {
            if let Some(p) = v.prepared.iter_mut().find(|p| p.0 == PENDING_LEAF) {
                p.0 = slot;
            }
        }
    }

    /// Drops the copies an insert prepared and did not file (their nodes did not fit).
    pub(crate) fn host_drop_prepared(&mut self) {
        if let Some(v) = self.host.as_mut().and_then(|h| h.values.as_mut()) {
            v.prepared.clear();
            v.inserting = false;
        }
    }

    /// Room in the host tier's per-slot tables for every slot the tree has and the next
    /// one it allocates (called with [`RadixTree::reserve_node`]), so that no host state
    /// change allocates. Nothing changes on failure.
    pub(crate) fn host_reserve(&mut self) -> Result<()> {
        let slots = self.nodes.len() + 1;
        let Some(h) = self.host.as_mut() else {
            return Ok(());
        };
        let oom = |e| Error::out_of_memory("the host tier's node tables", e);
        // Device leaves with host-only children keep their heap positions there (room
        // for twice the slots: see `set_side_heap_pos`).
        self.heap_side
            .try_reserve((2 * slots).saturating_sub(self.heap_side.len()))
            .map_err(oom)?;
        h.slots
            .try_reserve(slots.saturating_sub(h.slots.len()))
            .map_err(oom)?;
        h.chain
            .try_reserve(slots.saturating_sub(h.chain.len()))
            .map_err(oom)?;
        h.heap
            .try_reserve((slots + HEAP_SLACK).saturating_sub(h.heap.len()))
            .map_err(oom)
    }

    /// Keeps (or stops keeping) the values of the host copies, so that
    /// [`RadixTree::take_host_events`] can report the copies made and dropped. Only on an
    /// empty tree with a host tier.
    pub fn set_host_events(&mut self, on: bool) -> Result<()> {
        if self.num_nodes != 0 {
            return Err(Error::InvalidArgument(
                "set_host_events: the tree must be empty".into(),
            ));
        }
        match self.host.as_mut() {
            Some(h) => h.values = on.then(Box::default),
            None if on => {
                return Err(Error::InvalidArgument(
                    "host_events needs a host tier (host_capacity > 0)".into(),
                ))
            }
            None => {}
        }
        Ok(())
    }

    /// Whether the host copies' values are kept ([`RadixTree::set_host_events`]).
    pub fn host_events(&self) -> bool {
        self.host.as_ref().is_some_and(|h| h.values.is_some())
    }

    /// The values of the host copies made and of those dropped since the last call, in
    /// order, each copy's values as the node had them when it was copied (one entry per
    /// token; a split copy is reported in its parts). Empty unless
    /// [`RadixTree::set_host_events`] is on. A copy both made and dropped since the last
    /// call is in both; [`RadixTree::reset`] drops every copy without reporting it.
    /// `nonzero`: leave out the values that are 0 (for a caller that labels only some
    /// tokens, as a publisher labels one token per block).
    /// Without the memory for the lists, an `OutOfMemory` error and the events stay.
    pub fn take_host_events(&mut self, nonzero: bool) -> Result<(Vec<i64>, Vec<i64>)> {
        let Some(v) = self.host.as_mut().and_then(|h| h.values.as_mut()) else {
            return Ok((Vec::new(), Vec::new()));
        };
        let out = (flatten(&v.stored, nonzero)?, flatten(&v.dropped, nonzero)?);
        v.stored.clear();
        v.dropped.clear();
        Ok(out)
    }

    /// The values of `slot`'s host copy, if kept.
    fn host_values_of(&self, slot: u32) -> Result<Option<Vec<i64>>> {
        self.host
            .as_ref()
            .and_then(|h| h.values.as_ref())
            .and_then(|v| v.by_slot.get(&slot))
            .map(HostCopy::try_to_vec)
            .transpose()
    }

    /// Host capacity in tokens (0 without a tier).
    pub fn host_capacity(&self) -> usize {
        self.host.as_ref().map_or(0, |h| h.capacity)
    }

    /// Tokens in host memory (backed-up nodes, host-only or not).
    pub fn host_size(&self) -> usize {
        self.host.as_ref().map_or(0, |h| h.used)
    }

    /// Host-only nodes: backed up, their device KV evicted (0 without a tier).
    pub fn num_host_only_nodes(&self) -> usize {
        self.host.as_ref().map_or(0, |h| h.evicted_nodes)
    }

    /// The write policy (None without a tier).
    pub fn write_policy(&self) -> Option<WritePolicy> {
        self.host.as_ref().map(|h| h.policy)
    }

    /// The tier's counters (zeros without one).
    pub fn host_stats(&self) -> HostStats {
        self.host
            .as_ref()
            .map_or_else(HostStats::default, |h| h.stats)
    }

    /// Whether `node` has a host copy and whether it is host-only.
    pub fn host_state(&self, node: NodeRef) -> Result<(bool, bool)> {
        let slot = self.resolve(node)?;
        let s = self.host_slot(slot);
        Ok((s.backed, s.evicted))
    }

    #[inline]
    pub(crate) fn host_slot(&self, slot: u32) -> HostSlot {
        self.host
            .as_ref()
            .map_or_else(HostSlot::default, |h| h.slot(slot))
    }

    /// Whether `slot` is host-only (no device KV).
    #[inline]
    pub(crate) fn is_evicted(&self, slot: u32) -> bool {
        self.host.as_ref().is_some_and(|h| h.slot(slot).evicted)
    }

    /// Whether `slot` has children on the device (with a tier), or any child (without).
    #[inline]
    pub(crate) fn has_device_children(&self, slot: u32) -> bool {
        match &self.host {
            None => !self.nodes[slot as usize].children.is_empty(),
            Some(h) => h.slot(slot).device_children > 0,
        }
    }

    /// A slot was (re)allocated: fresh host state.
    #[inline]
    pub(crate) fn host_on_alloc(&mut self, slot: u32) {
        if let Some(h) = self.host.as_mut() {
            *h.slot_mut(slot) = HostSlot::default();
        }
    }

    /// A slot was released: its host state goes (and its host copy, if any).
    #[inline]
    pub(crate) fn host_on_release(&mut self, slot: u32) {
        if let Some(h) = self.host.as_mut() {
            if let Some(s) = h.slots.get_mut(slot as usize) {
                *s = HostSlot::default();
            }
            if let Some(v) = h.values.as_mut() {
                if let Some(old) = v.by_slot.remove(&slot) {
                    // Room was made when the copy was filed (`room_for_one_more`).
                    debug_assert!(v.dropped.len() < v.dropped.capacity());
                    v.dropped.push(old);
                }
            }
        }
    }

    pub(crate) fn host_on_reset(&mut self) {
        if let Some(h) = self.host.as_mut() {
            h.clear();
        }
    }

    /// The two parts of `child`'s host copy when it is split after `p` tokens, and room
    /// to file them (None when it has no copy kept): allocated before the split changes
    /// anything.
    pub(crate) fn host_prepare_split(
        &mut self,
        child: u32,
        p: usize,
    ) -> Result<Option<(HostCopy, HostCopy)>> {
        let Some(v) = self.host.as_mut().and_then(|h| h.values.as_mut()) else {
            return Ok(None);
        };
        let Some(old) = v.by_slot.get(&child) else {
            return Ok(None);
        };
        let parts = old.try_split_at(p)?;
        v.room_for_one_more()?;
        Ok(Some(parts))
    }

    /// `child` was split after `p` tokens: `head` took its first part and became its
    /// parent. The head shares the child's host state (SGLang splits `host_value` with
    /// `value`); `parts` are its copy's ([`RadixTree::host_prepare_split`]).
    pub(crate) fn host_on_split(
        &mut self,
        child: u32,
        head: u32,
        parts: Option<(HostCopy, HostCopy)>,
    ) {
        if let Some(h) = self.host.as_mut() {
            if let (Some(v), Some((first, rest))) = (h.values.as_mut(), parts) {
                // The room for the head's entry was made with the parts; the child's is
                // replaced in place (an insert of a present key may still grow a full
                // table).
                if let Some(c) = v.by_slot.get_mut(&child) {
                    *c = rest;
                }
                v.by_slot.insert(head, first);
            }
            let c = h.slot(child);
            *h.slot_mut(head) = HostSlot {
                backed: c.backed,
                evicted: c.evicted,
                device_children: u32::from(!c.evicted),
            };
            if c.evicted {
                h.evicted_nodes += 1;
            }
        }
    }

    /// A device child was added under `parent` (a new leaf).
    #[inline(always)]
    pub(crate) fn host_on_device_child(&mut self, parent: u32) {
        if let Some(h) = self.host.as_mut() {
            h.slot_mut(parent).device_children += 1;
        }
    }

    /// A device child of `parent` left the device (deleted or demoted).
    fn host_device_child_gone(&mut self, parent: u32) {
        if let Some(h) = self.host.as_mut() {
            let s = h.slot_mut(parent);
            s.device_children = s.device_children.saturating_sub(1);
        }
    }

    /// Offers `slot` to the host eviction order if it is a host leaf now.
    pub(crate) fn host_offer(&mut self, slot: u32) {
        if !self.is_host_leaf(slot) {
            return;
        }
        let key = self.policy_key(slot);
        let serial = self.serial(slot);
        if self
            .host
            .as_ref()
            .is_some_and(|h| h.heap.len() == h.heap.capacity())
        {
            #[cfg(test)]
            if let Some(h) = self.host.as_mut() {
                h.rebuilds[1] += 1;
            }
            self.rebuild_host_heap();
        }
        if let Some(h) = self.host.as_mut() {
            // After a rebuild the heap holds at most one entry per slot: room is left.
            debug_assert!(h.heap.len() < h.heap.capacity());
            h.heap.push(Reverse((key, slot, serial)));
            if h.heap.len() > 2 * h.evicted_nodes + HEAP_SLACK {
                self.rebuild_host_heap();
            }
        }
    }

    /// Drops the stale and repeated entries of the host order, in place (no allocation).
    /// Every change that makes a node a host leaf or changes its key pushes an entry
    /// (`check_host_invariants` checks that each host leaf has one after every call), so
    /// what is left is one entry per host leaf, and a node that becomes one again later
    /// is pushed again then.
    fn rebuild_host_heap(&mut self) {
        let Some(h) = self.host.as_mut() else {
            return;
        };
        let mut entries = std::mem::take(&mut h.heap).into_vec();
        entries.retain(|&Reverse((key, slot, serial))| self.host_entry_current(key, slot, serial));
        entries.sort_unstable();
        entries.dedup();
        if let Some(h) = self.host.as_mut() {
            h.heap = BinaryHeap::from(entries);
            #[cfg(test)]
            {
                h.rebuilds[0] += 1;
            }
        }
    }

    /// Whether a host-order entry names a live host leaf with its current key.
    fn host_entry_current(&self, key: PolicyKey, slot: u32, serial: u64) -> bool {
        // A free slot's stamps are stale: test liveness first.
        let live = self
            .nodes
            .get(slot as usize)
            .is_some_and(|n| n.parent != NO_PARENT)
            && self.serial(slot) == serial;
        live && self.is_host_leaf(slot) && self.policy_key(slot) == key
    }

    /// SGLang `_is_host_leaf`: host-only, childless, unlocked, not the root (nor a free
    /// slot).
    fn is_host_leaf(&self, slot: u32) -> bool {
        let n = &self.nodes[slot as usize];
        slot != ROOT
            && n.parent != NO_PARENT
            && self.is_evicted(slot)
            && n.children.is_empty()
            && n.lock_ref == 0
    }

    /// Evicts host-only leaves in policy order until `num_tokens` host tokens are freed
    /// or none is left (SGLang `drive_host_eviction`). Returns the tokens freed.
    pub fn evict_host(&mut self, num_tokens: usize) -> usize {
        let mut freed = 0;
        while freed < num_tokens {
            let Some(Reverse((key, slot, serial))) = self.host.as_mut().and_then(|h| h.heap.pop())
            else {
                break;
            };
            if !self.host_entry_current(key, slot, serial) {
                continue;
            }
            freed += self.delete_host_only(slot);
        }
        freed
    }

    /// Deletes the host-only leaf `slot`; returns its length.
    fn delete_host_only(&mut self, slot: u32) -> usize {
        let n = &self.nodes[slot as usize];
        let (parent, len) = (n.parent, n.span.len());
        let ck = child_key(self.ns(slot), n.span.key()[0]);
        if let Some(h) = self.host.as_mut() {
            h.used -= len;
            h.stats.host_evicted_tokens += len as u64;
            h.evicted_nodes -= 1;
        }
        let removed = self.remove_child(parent, ck, slot);
        debug_assert!(removed, "host eviction: leaf not filed under its parent");
        self.release(slot);
        // The parent's device state did not change: only its host-leaf status can.
        self.host_offer(parent);
        len
    }

    /// Copies `slot` to host memory, evicting host leaves if short (SGLang
    /// `_execute_kv_backup`). False when host memory cannot take it. With the copies'
    /// values kept, the copy is allocated first: without memory for it, an
    /// `OutOfMemory` error and nothing changes.
    fn backup_one(&mut self, slot: u32) -> Result<bool> {
        let len = self.nodes[slot as usize].span.len();
        let Some(h) = self.host.as_mut() else {
            return Ok(false);
        };
        let copy = match h.values.as_mut() {
            Some(v) => match v.take_prepared(slot) {
                Some(c) => Some(c),
                None => {
                    debug_assert!(!v.inserting, "an insert's backup of {slot} not prepared");
                    Some(v.prepare_copy(&self.nodes[slot as usize].span)?)
                }
            },
            None => None,
        };
        let free = h.free();
        if free < len {
            self.evict_host(len - free);
        }
        let Some(h) = self.host.as_mut() else {
            return Ok(false);
        };
        if h.free() < len {
            return Ok(false);
        }
        h.used += len;
        h.stats.stored_tokens += len as u64;
        h.stats.peak_host_tokens = h.stats.peak_host_tokens.max(h.used);
        h.slot_mut(slot).backed = true;
        if let (Some(v), Some((copy, twin))) = (h.values.as_mut(), copy) {
            v.stored.push(twin);
            v.by_slot.insert(slot, copy);
        }
        Ok(true)
    }

    /// Write-through backup of `slot` with its unbacked ancestors, top-down, stopping at
    /// the first that does not fit (SGLang `_build_backup_kv_action` +
    /// `_execute_and_commit_kv_backup`). An `OutOfMemory` error when a copy's values
    /// cannot be allocated (the nodes before it stay backed up).
    pub(crate) fn backup_chain(&mut self, slot: u32) -> Result<()> {
        let Some(mut chain) = self.host.as_mut().map(|h| std::mem::take(&mut h.chain)) else {
            return Ok(());
        };
        chain.clear();
        // Room for every slot was reserved: the chain is a path of distinct slots.
        chain.push(slot);
        let mut cur = self.nodes[slot as usize].parent;
        while cur != ROOT && !self.host_slot(cur).backed {
            chain.push(cur);
            cur = self.nodes[cur as usize].parent;
        }
        let mut out = Ok(());
        for &s in chain.iter().rev() {
            if self.host_slot(s).backed {
                continue;
            }
            match self.backup_one(s) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    out = Err(e);
                    break;
                }
            }
        }
        if let Some(h) = self.host.as_mut() {
            h.chain = chain;
        }
        out
    }

    /// Insert's write-through rule for a node whose hit count was just counted (SGLang
    /// `_inc_hit_count_and_check`): back it up once the count reaches the threshold.
    #[inline(always)]
    pub(crate) fn wants_backup(&self, slot: u32) -> bool {
        match &self.host {
            None => false,
            Some(h) => !h.slot(slot).backed && self.stamps(slot).hits >= h.policy.threshold(),
        }
    }

    /// Whether a new leaf with `hits` hits is backed up by the insert that adds it.
    pub(crate) fn leaf_wants_backup(&self, hits: u64) -> bool {
        self.host
            .as_ref()
            .is_some_and(|h| hits >= h.policy.threshold())
    }

    /// Whether insert counts hits (SGLang skips the count under write_back).
    #[inline]
    pub(crate) fn counts_hits(&self) -> bool {
        self.host
            .as_ref()
            .is_none_or(|h| h.policy != WritePolicy::WriteBack)
    }

    /// Gives the host-only node `slot` device KV `span` (insert over it, or a load back).
    pub(crate) fn revive(&mut self, slot: u32, span: Span) {
        let len = span.len();
        let parent = self.nodes[slot as usize].parent;
        // `replace` keeps the header's flags and namespace id.
        self.nodes[slot as usize].span.replace(span);
        if let Some(h) = self.host.as_mut() {
            h.slot_mut(slot).evicted = false;
            h.evicted_nodes -= 1;
        }
        if self.nodes[slot as usize].lock_ref == 0 {
            self.evictable_size += len;
        } else {
            self.protected_size += len;
        }
        self.host_on_device_child(parent);
        self.unlist(parent);
        self.relist(slot);
    }

    /// Device eviction with a host tier (SGLang `_evict` / `evict_device_leaf`): device
    /// leaves in policy order; a backed-up leaf is demoted (stays host-only), an
    /// unbacked one is backed up first under write_back, otherwise deleted with its
    /// host-only subtree.
    ///
    /// What an eviction allocates (the freed indices, a write-back copy's values, the
    /// list of a deleted leaf's host-only subtree) is allocated before the leaf changes:
    /// when it cannot be, the eviction stops there and what was freed is returned, as
    /// without a tier.
    pub(crate) fn evict_with_host<S: FreedSink>(&mut self, target: u64, freed: &mut S) {
        let write_back = self.write_policy() == Some(WritePolicy::WriteBack);
        while (freed.count() as u64) < target {
            let Some(&slot) = self.evictable.first() else {
                break;
            };
            if !freed.make_room(self.nodes[slot as usize].span.len()) {
                break;
            }
            // A backup changes no device leaf: `slot` stays the first.
            if write_back && !self.host_slot(slot).backed && self.backup_one(slot).is_err() {
                break;
            }
            if self.host_slot(slot).backed {
                let removed = self.remove_at(0);
                debug_assert_eq!(removed, slot);
                self.demote(slot, freed);
            } else {
                let Ok(below) = self.host_subtree(slot) else {
                    break;
                };
                let removed = self.remove_at(0);
                debug_assert_eq!(removed, slot);
                self.delete_device_leaf(slot, &below, freed);
            }
        }
    }

    /// The host-only nodes below the device leaf `slot`, parents before children (the
    /// order `delete_device_leaf` releases them in, reversed), or an error when the list
    /// cannot be allocated.
    fn host_subtree(&self, slot: u32) -> Result<Vec<u32>> {
        let oom = |e| Error::out_of_memory("an evicted leaf's host-only nodes", e);
        let mut below = Vec::new();
        let mut stack: Vec<u32> = Vec::new();
        let first = &self.nodes[slot as usize].children;
        stack.try_reserve(first.len(&self.indexes)).map_err(oom)?;
        stack.extend(first.iter(&self.indexes));
        while let Some(s) = stack.pop() {
            below.try_reserve(1).map_err(oom)?;
            below.push(s);
            let children = &self.nodes[s as usize].children;
            stack
                .try_reserve(children.len(&self.indexes))
                .map_err(oom)?;
            stack.extend(children.iter(&self.indexes));
        }
        Ok(below)
    }

    /// Releases the device KV of backed-up `slot`; it stays, host-only.
    fn demote<S: FreedSink>(&mut self, slot: u32, freed: &mut S) {
        let n = &self.nodes[slot as usize];
        let parent = n.parent;
        self.evictable_size -= n.span.len();
        freed.take(&n.span);
        if let Some(h) = self.host.as_mut() {
            h.slot_mut(slot).evicted = true;
            h.evicted_nodes += 1;
        }
        self.host_device_child_gone(parent);
        self.relist(parent);
        self.host_offer(slot);
    }

    /// Deletes the unbacked device leaf `slot` and its host-only subtree (SGLang
    /// `_delete_unbacked_device_leaf`, `drop_subtree_no_host`).
    /// `below` is its host-only subtree ([`RadixTree::host_subtree`]).
    fn delete_device_leaf<S: FreedSink>(&mut self, slot: u32, below: &[u32], freed: &mut S) {
        for &s in below.iter().rev() {
            let len = self.nodes[s as usize].span.len();
            if let Some(h) = self.host.as_mut() {
                h.used -= len;
                h.stats.host_evicted_tokens += len as u64;
                h.evicted_nodes -= 1;
            }
            let n = &self.nodes[s as usize];
            let (parent, ck) = (n.parent, child_key(self.ns(s), n.span.key()[0]));
            let removed = self.remove_child(parent, ck, s);
            debug_assert!(removed, "evict: host-only node not filed under its parent");
            self.release(s);
        }
        let n = &self.nodes[slot as usize];
        let parent = n.parent;
        let ck = child_key(self.ns(slot), n.span.key()[0]);
        self.evictable_size -= n.span.len();
        freed.take(&n.span);
        let removed = self.remove_child(parent, ck, slot);
        debug_assert!(removed, "evict: leaf not filed under its parent");
        self.release(slot);
        self.host_device_child_gone(parent);
        self.relist(parent);
        self.host_offer(parent);
    }

    /// Host-only nodes on the path to `node`, bottom-up.
    fn host_tail_nodes(&self, slot: u32) -> impl Iterator<Item = u32> + '_ {
        std::iter::successors(Some(slot), |&s| Some(self.nodes[s as usize].parent))
            .take_while(|&s| s != ROOT && self.is_evicted(s))
    }

    /// Tokens on the path to `node` that are host-only (what `load_back` would load).
    pub fn host_tail_len(&self, node: NodeRef) -> Result<usize> {
        let slot = self.resolve(node)?;
        Ok(self
            .host_tail_nodes(slot)
            .map(|s| self.nodes[s as usize].span.len())
            .sum())
    }

    /// Loads the host-only nodes on the path to `node` back to the device with KV
    /// indices `values` (one per loaded token, top-down; default: the tokens), all or
    /// nothing (SGLang `load_back` / `commit_load_back`). Returns the tokens loaded. The
    /// caller makes room on the device first (SGLang evicts under a lock on the device
    /// ancestor: [`RadixTree::inc_lock_ref`] it, [`RadixTree::evict`], then load).
    pub fn load_back(&mut self, node: NodeRef, values: Option<&[i64]>) -> Result<usize> {
        let slot = self.resolve(node)?;
        let oom = |e| Error::out_of_memory("load_back", e);
        let count = self.host_tail_nodes(slot).count();
        let mut nodes = Vec::new();
        nodes.try_reserve_exact(count).map_err(oom)?;
        nodes.extend(self.host_tail_nodes(slot));
        nodes.reverse();
        let len: usize = nodes
            .iter()
            .map(|&s| self.nodes[s as usize].span.len())
            .sum();
        if let Some(v) = values {
            if v.len() != len {
                return Err(Error::InvalidArgument(format!(
                    "load_back: values has length {} but the node has {len} host-only \
                     tokens on its path: they must be equal",
                    v.len()
                )));
            }
        }
        let mut spans = Vec::new();
        spans.try_reserve_exact(nodes.len()).map_err(oom)?;
        // The revived nodes list one more device leaf at most (each one after the first
        // takes its parent's place).
        self.evictable
            .try_reserve(usize::from(!nodes.is_empty()))
            .map_err(oom)?;
        let mut off = 0;
        for &s in &nodes {
            let key = self.nodes[s as usize].span.key();
            let span = match values {
                Some(v) => Span::from_values(key, &v[off..off + key.len()])?,
                None => Span::from_tokens(key)?,
            };
            off += key.len();
            spans.push(span);
        }
        for (&s, span) in nodes.iter().zip(spans) {
            self.revive(s, span);
        }
        if let Some(h) = self.host.as_mut() {
            h.stats.loaded_tokens += len as u64;
        }
        Ok(len)
    }

    /// `(backed_up, host_only)` of every non-root node, in [`RadixTree::dump`] order.
    pub fn host_dump(&self) -> Vec<(bool, bool)> {
        let mut out = Vec::with_capacity(self.num_nodes);
        let mut stack: Vec<u32> = self.sorted_children(ROOT).into_iter().rev().collect();
        while let Some(slot) = stack.pop() {
            let s = self.host_slot(slot);
            out.push((s.backed, s.evicted));
            stack.extend(self.sorted_children(slot).into_iter().rev());
        }
        out
    }

    /// The values of every non-root node's host copy, in [`RadixTree::dump`] order (empty
    /// for a node without a copy, or when the values are not kept).
    pub fn host_values_dump(&self) -> Result<Vec<Vec<i64>>> {
        let mut out = Vec::with_capacity(self.num_nodes);
        let mut stack: Vec<u32> = self.sorted_children(ROOT).into_iter().rev().collect();
        while let Some(slot) = stack.pop() {
            out.push(self.host_values_of(slot)?.unwrap_or_default());
            stack.extend(self.sorted_children(slot).into_iter().rev());
        }
        Ok(out)
    }

    /// The host tier's part of [`RadixTree::check_invariants`].
    pub(crate) fn check_host_invariants(&self) -> std::result::Result<(), String> {
        let Some(h) = &self.host else {
            return Ok(());
        };
        let mut used = 0;
        let mut evicted = 0;
        let mut stack = vec![ROOT];
        while let Some(slot) = stack.pop() {
            let n = &self.nodes[slot as usize];
            let s = h.slot(slot);
            let mut dev = 0u32;
            for c in n.children.iter(&self.indexes) {
                let cs = h.slot(c);
                if !cs.evicted {
                    dev += 1;
                    if s.evicted {
                        return Err(format!("device node {c} under host-only node {slot}"));
                    }
                }
                stack.push(c);
            }
            if dev != s.device_children {
                return Err(format!(
                    "node {slot}: {dev} device children, recorded {}",
                    s.device_children
                ));
            }
            if slot == ROOT {
                if s.backed || s.evicted {
                    return Err("the root has host state".into());
                }
                continue;
            }
            if s.evicted && !s.backed {
                return Err(format!("node {slot} is host-only without a host copy"));
            }
            if s.backed {
                used += n.span.len();
            }
            if let Some(v) = &h.values {
                match (s.backed, v.by_slot.get(&slot)) {
                    (true, Some(vals)) if vals.len() == n.span.len() => {}
                    (false, None) => {}
                    (true, _) => return Err(format!("node {slot}: host values missing")),
                    (false, Some(_)) => {
                        return Err(format!("node {slot}: host values without a host copy"))
                    }
                }
            }
            if s.evicted {
                evicted += 1;
                if n.children.is_empty() && n.lock_ref == 0 {
                    let key = (self.policy_key(slot), slot, self.serial(slot));
                    if !h.heap.iter().any(|e| e.0 == key) {
                        return Err(format!("host leaf {slot} is not in the host order"));
                    }
                }
            }
        }
        if used != h.used || used > h.capacity {
            return Err(format!(
                "host tokens: counted {used}, recorded {}, capacity {}",
                h.used, h.capacity
            ));
        }
        if let Some(v) = &h.values {
            if v.dropped.capacity() - v.dropped.len() < v.by_slot.len() {
                return Err(format!(
                    "room to drop {} of the {} host copies",
                    v.dropped.capacity() - v.dropped.len(),
                    v.by_slot.len()
                ));
            }
            let backed = h.slots.iter().filter(|s| s.backed).count();
            if v.by_slot.len() != backed {
                return Err(format!(
                    "host values of {} nodes, {backed} backed up",
                    v.by_slot.len()
                ));
            }
        }
        if evicted != h.evicted_nodes {
            return Err(format!(
                "host-only nodes: counted {evicted}, recorded {}",
                h.evicted_nodes
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::policy::EvictionPolicy;
    use super::super::tree::{Namespace, RadixTree};
    use super::{HostCopy, WritePolicy};

    fn tree(host: usize, write: WritePolicy) -> RadixTree {
        let mut t = RadixTree::new(1, EvictionPolicy::Lru).expect("tree");
        t.set_host_tier(host, write).expect("tier");
        t
    }

    /// Demote, match through the host part, load back, evict from host: the invariants
    /// hold after each step.
    #[test]
    fn demote_match_load_and_host_evict() {
        let ns = Namespace::default();
        let mut t = tree(8, WritePolicy::WriteThrough);
        t.insert(&[1, 2, 3], Some(&[10, 11, 12]), &ns, 0, 0)
            .expect("insert");
        t.insert(&[1, 2, 3, 4, 5], Some(&[10, 11, 12, 13, 14]), &ns, 0, 0)
            .expect("insert");
        assert_eq!(t.host_size(), 5);
        assert_eq!(t.evict(2).expect("evict"), vec![13, 14]);
        t.check_invariants().expect("invariants");
        let m = t.match_prefix(&[1, 2, 3, 4, 5], &ns).unwrap();
        assert_eq!((m.length, m.host_length), (3, 2));
        t.check_invariants().expect("invariants");
        assert_eq!(t.load_back(m.host_node, Some(&[20, 21])).expect("load"), 2);
        assert_eq!(
            t.path_indices(m.host_node).expect("path"),
            vec![10, 11, 12, 20, 21]
        );
        t.check_invariants().expect("invariants");
        assert_eq!(t.evict(5).expect("evict").len(), 5);
        assert_eq!((t.total_size(), t.num_nodes(), t.host_size()), (0, 2, 5));
        assert_eq!(t.evict_host(1), 2);
        assert_eq!(t.evict_host(10), 3);
        assert_eq!((t.num_nodes(), t.host_size()), (0, 0));
        t.check_invariants().expect("invariants");
    }

    /// A device leaf over host-only children is listed with its heap position in the
    /// tree's side table (its child index's words hold its children); the position moves
    /// to the words when its last child is dropped from the host, back to the side table
    /// never (a childless node keeps it in the words), and leaves with the node.
    #[test]
    fn listed_node_with_host_only_children() {
        let ns = Namespace::default();
        for policy in EvictionPolicy::ALL {
            let mut t = RadixTree::new(1, policy).expect("tree");
            t.set_host_tier(64, WritePolicy::WriteThrough)
                .expect("tier");
            t.insert(&[1, 2], None, &ns, 0, 0).expect("insert");
            for c in 3..8u32 {
                t.insert(&[1, 2, c], None, &ns, 0, 0).expect("insert");
            }
            t.insert(&[9], None, &ns, 0, 0).expect("insert");
            t.check_invariants().expect("invariants");
            // Evict the five one-token children of [1, 2] (host-only now) and no more.
            let mut freed = 0;
            while t.heap_side.is_empty() {
                freed += t.evict(1).expect("evict").len();
                t.check_invariants().expect("invariants");
                assert!(freed <= 6, "{policy:?}");
            }
            let top = t.match_prefix(&[1, 2], &ns).unwrap().node;
            let slot = t.resolve(top).expect("live");
            assert!(t.listed(slot));
            assert_eq!(t.heap_side.len(), 1);
            // A touch re-sorts it (through the side table).
            t.match_prefix(&[1, 2], &ns).unwrap();
            t.check_invariants().expect("invariants");
            // Reviving a child takes the node out of the heap (a device child).
            t.insert(&[1, 2, 3], None, &ns, 0, 0).expect("insert");
            assert!(!t.listed(slot) && t.heap_side.is_empty());
            t.check_invariants().expect("invariants");
            // Demote it again, then drop every host-only child: the position moves to
            // the words.
            while t.heap_side.is_empty() {
                t.evict(1).expect("evict");
                t.check_invariants().expect("invariants");
            }
            while t.nodes[slot as usize].children.len(&t.indexes) > 0 {
                assert!(t.evict_host(1) > 0, "{policy:?}");
                t.check_invariants().expect("invariants");
            }
            assert!(t.heap_side.is_empty());
            assert!(t.listed(slot), "{policy:?}");
            t.evict(1 << 20).expect("evict");
            t.check_invariants().expect("invariants");
            assert!(t.heap_side.is_empty());
        }
    }

    /// The host copies' values: made at insert (write-through) with the node's values,
    /// split with the node, kept over a load back (the device takes fresh values),
    /// reported dropped by host eviction; nothing without `set_host_events`.
    #[test]
    fn host_events_write_through() {
        let ns = Namespace::default();
        let mut t = tree(8, WritePolicy::WriteThrough);
        assert!(t.set_host_events(true).is_ok() && t.host_events());
        t.insert(&[1, 2, 3, 4], Some(&[10, 11, 12, 13]), &ns, 0, 0)
            .expect("insert");
        assert_eq!(
            t.take_host_events(false).unwrap(),
            (vec![10, 11, 12, 13], vec![])
        );
        assert_eq!(t.take_host_events(false).unwrap(), (vec![], vec![]));
        // A split splits the copy.
        t.insert(&[1, 2, 7], Some(&[20, 21, 22]), &ns, 0, 0)
            .expect("insert");
        assert_eq!(t.take_host_events(false).unwrap(), (vec![22], vec![]));
        assert_eq!(
            t.host_values_dump().unwrap(),
            vec![vec![10, 11], vec![12, 13], vec![22]]
        );
        t.check_invariants().expect("invariants");
        // Demote [3, 4] and [7], load [3, 4] back with fresh values: the copy stays.
        assert_eq!(t.evict(3).expect("evict").len(), 3);
        let m = t.match_prefix(&[1, 2, 3, 4], &ns).unwrap();
        assert_eq!(t.load_back(m.host_node, Some(&[30, 31])).expect("load"), 2);
        assert_eq!(t.take_host_events(false).unwrap(), (vec![], vec![]));
        t.check_invariants().expect("invariants");
        // Host eviction drops the host-only [7].
        assert_eq!(t.evict_host(1), 1);
        assert_eq!(t.take_host_events(false).unwrap(), (vec![], vec![22]));
        assert_eq!(
            t.host_values_dump().unwrap(),
            vec![vec![10, 11], vec![12, 13]]
        );
        // A copy that does not fit evicts host leaves: both in one report, made first.
        t.evict(4).expect("evict");
        t.insert(&[5, 6, 7, 8, 9], Some(&[40, 41, 42, 43, 44]), &ns, 0, 0)
            .expect("insert");
        let (stored, dropped) = t.take_host_events(false).unwrap();
        assert_eq!(stored, vec![40, 41, 42, 43, 44]);
        assert_eq!(dropped, vec![12, 13]);
        t.check_invariants().expect("invariants");
        // A reset drops everything unreported; the tier keeps recording.
        t.reset();
        assert!(t.host_events());
        t.insert(&[1], Some(&[5]), &ns, 0, 0).expect("insert");
        assert_eq!(t.take_host_events(false).unwrap(), (vec![5], vec![]));
        // Off: nothing is kept.
        let mut off = tree(8, WritePolicy::WriteThrough);
        off.insert(&[1, 2], Some(&[10, 11]), &ns, 0, 0)
            .expect("insert");
        assert_eq!(off.take_host_events(false).unwrap(), (vec![], vec![]));
        assert_eq!(off.host_values_dump().unwrap(), vec![Vec::<i64>::new()]);
        assert!(off.set_host_events(true).is_err()); // not on a non-empty tree
        let mut none = RadixTree::new(1, EvictionPolicy::Lru).expect("tree");
        assert!(none.set_host_events(true).is_err()); // no tier
        assert!(none.set_host_events(false).is_ok());
    }

    /// Write-back copies at device eviction: the copy's values are the freed values.
    #[test]
    fn host_events_write_back() {
        let ns = Namespace::default();
        let mut t = tree(4, WritePolicy::WriteBack);
        t.set_host_events(true).expect("events");
        t.insert(&[1, 2, 3], Some(&[10, 11, 12]), &ns, 0, 0)
            .expect("insert");
        assert_eq!(t.take_host_events(false).unwrap(), (vec![], vec![]));
        assert_eq!(t.evict(3).expect("evict"), vec![10, 11, 12]);
        assert_eq!(
            t.take_host_events(false).unwrap(),
            (vec![10, 11, 12], vec![])
        );
        // A leaf too long for host memory evicts the host leaves first, then is deleted.
        t.insert(&[4, 5, 6, 7, 8], Some(&[20, 21, 22, 23, 24]), &ns, 0, 0)
            .expect("insert");
        assert_eq!(t.evict(5).expect("evict").len(), 5);
        assert_eq!(
            t.take_host_events(false).unwrap(),
            (vec![], vec![10, 11, 12])
        );
        assert_eq!((t.num_nodes(), t.host_size()), (0, 0));
        t.check_invariants().expect("invariants");
    }

    /// A host copy keeps its values dense or, mostly zeros, sparse: the same values
    /// either way, whole and split anywhere.
    #[test]
    fn host_copy_dense_and_sparse() {
        let cases: [&[i64]; 6] = [
            &[],
            &[0, 0, 0, 5],
            &[1, 2, 3],
            &[0, 7, 0, 0, 0, 0, 0, 9],
            &[-1, 0, 0, 0],
            &[0, 0, 0, 0, 0, 0],
        ];
        for values in cases {
            let c = HostCopy::try_new(values).unwrap();
            assert_eq!(
                (c.try_to_vec().unwrap(), c.len()),
                (values.to_vec(), values.len())
            );
            for p in 0..=values.len() {
                let (a, b) = c.try_split_at(p).unwrap();
                assert_eq!(
                    (a.try_to_vec().unwrap(), b.try_to_vec().unwrap()),
                    (values[..p].to_vec(), values[p..].to_vec())
                );
            }
            let mut out = vec![4];
            c.extend_into(&mut out);
            assert_eq!(out[1..], *values);
            let mut nz = vec![4];
            c.extend_nonzero(&mut nz);
            let want: Vec<i64> = values.iter().copied().filter(|&v| v != 0).collect();
            assert_eq!(nz[1..], want);
        }
        assert!(matches!(
            HostCopy::try_new(&[0, 0, 0, 0, 0, 0, 0, 9]).unwrap(),
            HostCopy::Sparse { .. }
        ));
        assert!(matches!(
            HostCopy::try_new(&[1, 2, 3]).unwrap(),
            HostCopy::Dense(_)
        ));
    }

    /// A load with values of the wrong length changes nothing.
    #[test]
    fn bad_load_changes_nothing() {
        let ns = Namespace::default();
        let mut t = tree(8, WritePolicy::WriteBack);
        t.insert(&[1, 2, 3], None, &ns, 0, 0).expect("insert");
        t.evict(3).expect("evict");
        let m = t.match_prefix(&[1, 2, 3], &ns).unwrap();
        let before = (t.dump(), t.host_dump(), t.host_size());
        assert!(t.load_back(m.host_node, Some(&[1])).is_err());
        assert_eq!((t.dump(), t.host_dump(), t.host_size()), before);
        t.check_invariants().expect("invariants");
    }
    /// Matches through host-only nodes re-key them: their old host-order entries go
    /// stale and are dropped in place, when stale entries pile up and when the order
    /// fills its room. Every host leaf keeps its entry (`check_invariants`).
    #[test]
    fn host_order_drops_stale_entries_in_place() {
        let ns = Namespace::default();
        let mut forced = 0;
        for write in WritePolicy::ALL {
            let mut t = tree(1 << 20, write);
            // The copies' values kept too: in debug builds every backup of an insert
            // checks that its copy was prepared before the insert changed anything.
            t.set_host_events(true).expect("host events");
            let mut x = 0x9E37_79B9_u64;
            let mut next = move || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            let key = |r: u64, span: u64| {
                [
                    (r % span) as u32,
                    1000 + (r >> 20) as u32 % 4,
                    2000 + (r >> 40) as u32 % 3,
                ]
            };
            // Cycles: insert keys, demote some or all of them (evict), then match many
            // (each match of a host-only leaf re-keys it: one more stale entry).
            for cycle in 0..24u64 {
                let span = 40 + 60 * (cycle % 4);
                for _ in 0..300 {
                    t.insert(&key(next(), span), None, &ns, 0, 0).unwrap();
                }
                t.evict(if cycle % 3 == 0 { 1 << 20 } else { 30 }).unwrap();
                for step in 0..1500 {
                    let r = next();
                    if r % 97 == 0 {
                        t.evict_host(3);
                        t.take_host_events(false).unwrap();
                    } else if r % 89 == 0 {
                        // Inserts through host-only nodes and partly backed paths.
                        t.insert(&key(r, span), None, &ns, 0, 0).unwrap();
                    } else {
                        t.match_prefix(&key(r, span), &ns).unwrap();
                    }
                    if step % 50 == 0 {
                        if let Err(e) = t.check_invariants() {
                            panic!("{write:?} cycle {cycle} step {step}: {e}");
                        }
                    }
                }
            }
            let h = t.host.as_ref().unwrap();
            forced += h.rebuilds[1];
            assert!(
                h.rebuilds[0] >= 3,
                "{write:?}: {:?} rebuilds, heap {}, host-only {}, nodes {}",
                h.rebuilds,
                h.heap.len(),
                h.evicted_nodes,
                t.num_nodes()
            );
            assert!(h.heap.len() <= h.heap.capacity());
        }
        assert!(forced >= 1, "no rebuild of a full host order");
    }
}
