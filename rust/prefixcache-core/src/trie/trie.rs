//! The block trie: lookup, two-phase claim, store, extend, release (SEMANTICS.md
//! section 3).
//!
//! - Blocks `0..num_blocks` are all usable (TensorRT-LLM has no null block); the root is
//!   an extra slot that never holds tokens.
//! - A prompt of `n` tokens occupies `ceil(n / tokens_per_block)` context blocks; its
//!   first `n - 1` tokens are split into keys (the last one possibly partial).
//! - `claim` walks the trie: a full block found by its exact key is reused and the walk
//!   goes on; a non-full block found by its exact key, or (with partial reuse) the child
//!   with the longest common token prefix, is a *partial* match and ends the walk: an
//!   unreferenced leaf is taken over (it leaves the trie), otherwise a fresh block is
//!   allocated and a copy recorded; the copy source stays referenced (pinned) until
//!   `complete` (phase two). Every other block is fresh.
//! - `store` files the request's blocks under their keys, stopping at the first key
//!   another block already holds.
//! - `release` drops the references in reverse block order; blocks reaching zero become
//!   free at the back of their priority's LRU queue.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

use super::children::Children;
use super::key::{chop, context_blocks, BlockKey, MmItem, Scope, DEFAULT_PRIORITY, MAX_PRIORITY};
use crate::{Error, Result};

pub(crate) struct Block {
    /// Some iff the block is cached in the trie.
    pub key: Option<BlockKey>,
    /// The parent when cached (the root slot for first blocks).
    pub parent: u32,
    pub children: Children,
    /// References by requests' block lists plus copy pins.
    pub ref_cnt: u32,
    pub priority: u8,
    /// Retention duration in clock ticks.
    pub duration: Option<u64>,
    /// When a free block's retention ends (then it is in the expiry set).
    pub expiry: Option<u64>,
    /// Release sequence number: LRU order within a priority.
    pub seq: u64,
    /// In the evictable set.
    pub listed: bool,
    /// In the parent's partial-match index.
    pub in_partial: bool,
    /// Chained content hash reported in events (0 when not cached).
    pub hash: u64,
}

impl Block {
    fn new(seq: u64) -> Self {
        Block {
            key: None,
            parent: 0,
            children: Children::default(),
            ref_cnt: 0,
            priority: DEFAULT_PRIORITY,
            duration: None,
            expiry: None,
            seq,
            listed: false,
            in_partial: false,
            hash: 0,
        }
    }
}

/// A multimodal item of a prompt: content hash bytes and token range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MmSpan {
    pub hash: Vec<u8>,
    pub start: usize,
    pub len: usize,
}

/// The optional arguments of [`BlockTrie::claim`] and [`BlockTrie::lookup`].
#[derive(Debug, Clone, Default)]
pub struct ClaimParams<'a> {
    pub lora_id: Option<u64>,
    pub cache_salt: Option<&'a str>,
    pub mm: &'a [MmSpan],
    /// Retention priority 0..=100 for the context blocks (None: reused blocks keep theirs,
    /// new ones get the default 35).
    pub priority: Option<u8>,
    /// Retention duration (clock ticks) after which a free block's priority drops to 35.
    pub retention: Option<u64>,
    /// Extra tokens (decode lookahead) to allocate blocks for.
    pub reserve_tokens: usize,
}

/// How a partially matched block was reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartialKind {
    /// The unreferenced leaf left the trie and became the request's block.
    TakenOver,
    /// A fresh block receives a copy of the matched tokens.
    Copied,
}

impl PartialKind {
    pub fn name(self) -> &'static str {
        match self {
            PartialKind::TakenOver => "taken_over",
            PartialKind::Copied => "copied",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartialReuse {
    /// The matched block (the copy source when copied).
    pub block_id: u32,
    pub num_tokens: usize,
    pub kind: PartialKind,
}

/// A copy the caller must perform before `complete`: the first `num_tokens` token slots
/// of block `src` into block `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyOp {
    pub src: u32,
    pub dst: u32,
    pub num_tokens: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimOutcome {
    pub block_ids: Vec<u32>,
    pub num_matched_tokens: usize,
    /// Full blocks reused by exact key.
    pub num_reused_blocks: usize,
    pub partial: Option<PartialReuse>,
    pub copies: Vec<CopyOp>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupOutcome {
    pub num_matched_tokens: usize,
    pub num_reused_blocks: usize,
    pub partial: Option<PartialReuse>,
}

/// KV-cache events: blocks entering (one event per `store` that cached blocks) and
/// leaving (one event per block) the trie.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrieEvent {
    Stored {
        block_ids: Vec<u32>,
        block_hashes: Vec<u64>,
        parent_block_hash: Option<u64>,
        token_ids: Vec<u32>,
        block_size: usize,
        lora_id: Option<u64>,
    },
    Removed {
        block_ids: Vec<u32>,
        block_hashes: Vec<u64>,
    },
}

/// Counters since construction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrieStats {
    pub claims: u64,
    pub query_tokens: u64,
    pub matched_tokens: u64,
    pub reused_blocks: u64,
    pub partial_hits: u64,
    pub partial_tokens: u64,
    pub taken_over_blocks: u64,
    pub copies: u64,
    pub copied_tokens: u64,
    pub allocated_blocks: u64,
    pub evicted_blocks: u64,
    pub evicted_tokens: u64,
    pub stored_blocks: u64,
}

impl TrieStats {
    /// `(name, value)` pairs in a fixed order.
    pub fn fields(&self) -> [(&'static str, u64); 13] {
        [
            ("claims", self.claims),
            ("query_tokens", self.query_tokens),
            ("matched_tokens", self.matched_tokens),
            ("reused_blocks", self.reused_blocks),
            ("partial_hits", self.partial_hits),
            ("partial_tokens", self.partial_tokens),
            ("taken_over_blocks", self.taken_over_blocks),
            ("copies", self.copies),
            ("copied_tokens", self.copied_tokens),
            ("allocated_blocks", self.allocated_blocks),
            ("evicted_blocks", self.evicted_blocks),
            ("evicted_tokens", self.evicted_tokens),
            ("stored_blocks", self.stored_blocks),
        ]
    }
}

/// One block as `dump` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockDump {
    pub block_id: u32,
    pub cached: bool,
    /// None for first blocks (and for blocks outside the trie).
    pub parent: Option<u32>,
    pub tokens: Vec<u32>,
    pub lora_id: Option<u64>,
    pub cache_salt: Option<String>,
    pub mm_keys: Vec<(Vec<u8>, i64)>,
    pub ref_cnt: u32,
    pub priority: u8,
}

/// Byte strings (salts, multimodal hashes) interned to small ids, each with the number of
/// holders (cached block keys and live requests); a string is dropped with its last holder
/// and its id reused, so memory follows what is cached and claimed.
#[derive(Default)]
pub(crate) struct Interner {
    ids: FxHashMap<Box<[u8]>, u32>,
    /// `(bytes, holders)` by id; a dropped id holds empty bytes and 0.
    items: Vec<(Box<[u8]>, u32)>,
    /// Dropped ids, reused last-dropped first.
    free: Vec<u32>,
}

impl Interner {
    fn get(&self, s: &[u8]) -> Option<u32> {
        self.ids.get(s).copied()
    }

    /// The id the `k`-th (from 0) new string interned from now on will get.
    fn new_id(&self, k: usize) -> u32 {
        match self.free.len().checked_sub(k + 1) {
            Some(i) => self.free[i],
            None => (self.items.len() + k - self.free.len()) as u32,
        }
    }

    /// Interns `s` (if new) and adds a holder.
    fn acquire(&mut self, s: &[u8]) -> u32 {
        if let Some(id) = self.get(s) {
            self.retain(id);
            return id;
        }
        let id = self.new_id(0);
        let entry = (Box::<[u8]>::from(s), 1);
        if self.free.pop().is_some() {
            self.items[id as usize] = entry;
        } else {
            self.items.push(entry);
        }
        self.ids.insert(Box::from(s), id);
        id
    }

    /// Adds a holder to a live id.
    fn retain(&mut self, id: u32) {
        if let Some(e) = self.items.get_mut(id as usize) {
            e.1 += 1;
        }
    }

    /// Drops a holder; the last one drops the string.
    pub(crate) fn release(&mut self, id: u32) {
        let Some(e) = self.items.get_mut(id as usize) else {
            return;
        };
        e.1 = e.1.saturating_sub(1);
        if e.1 == 0 {
            let bytes = std::mem::take(&mut e.0);
            self.ids.remove(&bytes);
            self.free.push(id);
            if self.ids.len() * 4 < self.ids.capacity() {
                self.ids.shrink_to_fit();
            }
        }
    }

    fn bytes(&self, id: u32) -> &[u8] {
        self.items.get(id as usize).map_or(&[], |v| &v.0)
    }

    /// Number of live strings.
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    /// Holders by live id (for the invariant check).
    pub(crate) fn holders(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.ids.values().map(|&id| (id, self.items[id as usize].1))
    }
}

struct Request {
    blocks: Vec<u32>,
    pins: Vec<u32>,
    tokens: Vec<u32>,
    scope: Scope,
    mm: Vec<MmItem>,
}

#[derive(Debug, Clone, Copy)]
enum Step {
    Reuse(u32),
    TakeOver(u32, usize),
    Copy(u32, usize),
    Fresh,
}

struct Plan {
    steps: Vec<Step>,
    matched: usize,
    reused: usize,
}

/// TensorRT-LLM's block manager with block reuse (one attention window, beam width 1).
pub struct BlockTrie {
    pub(crate) blocks: Vec<Block>,
    pub(crate) root: u32,
    tokens_per_block: usize,
    enable_partial_reuse: bool,
    copy_on_partial_reuse: bool,
    pub(crate) evictable: BTreeSet<(u8, u64, u32)>,
    pub(crate) expiring: BTreeSet<(u64, u32)>,
    pub(crate) clock: u64,
    seq: u64,
    pub(crate) num_free: usize,
    pub(crate) num_cached: usize,
    pub(crate) num_cached_tokens: usize,
    requests: FxHashMap<u64, Request>,
    pub(crate) salts: Interner,
    pub(crate) mm_hashes: Interner,
    pub(crate) events: Vec<TrieEvent>,
    pub(crate) stats: TrieStats,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv(h: &mut u64, bytes: &[u8]) {
    for &x in bytes {
        *h ^= u64::from(x);
        *h = h.wrapping_mul(FNV_PRIME);
    }
}

fn invalid(msg: String) -> Error {
    Error::InvalidArgument(msg)
}

impl BlockTrie {
    pub fn new(
        num_blocks: usize,
        tokens_per_block: usize,
        enable_partial_reuse: bool,
        copy_on_partial_reuse: bool,
    ) -> Result<Self> {
        if num_blocks == 0 || num_blocks >= u32::MAX as usize {
            return Err(invalid(format!(
                "num_blocks must be in [1, 2**32 - 1), got {num_blocks}"
            )));
        }
        if tokens_per_block == 0 {
            return Err(invalid("tokens_per_block must be >= 1, got 0".into()));
        }
        // Every size here is the caller's: reserve fallibly (MemoryError, not an abort).
        let oom = |e| Error::out_of_memory("the block trie", e);
        let mut blocks: Vec<Block> = Vec::new();
        blocks.try_reserve_exact(num_blocks + 1).map_err(oom)?;
        // The evictable set allocates node by node (no fallible API): check that its
        // ~24 bytes per block (B-tree nodes at 11 entries of 16 bytes) can be had first.
        let mut probe: Vec<u8> = Vec::new();
        probe
            .try_reserve_exact(num_blocks.saturating_mul(24))
            .map_err(oom)?;
        drop(probe);
        let root = num_blocks as u32;
        blocks.extend((0..=num_blocks).map(|i| {
            let mut b = Block::new(i as u64);
            b.parent = root;
            b
        }));
        let evictable = (0..num_blocks as u32)
            .map(|b| (DEFAULT_PRIORITY, u64::from(b), b))
            .collect();
        for b in blocks.iter_mut().take(num_blocks) {
            b.listed = true;
        }
        Ok(BlockTrie {
            blocks,
            root,
            tokens_per_block,
            enable_partial_reuse,
            copy_on_partial_reuse,
            evictable,
            expiring: BTreeSet::new(),
            clock: 0,
            seq: num_blocks as u64,
            num_free: num_blocks,
            num_cached: 0,
            num_cached_tokens: 0,
            requests: FxHashMap::default(),
            salts: Interner::default(),
            mm_hashes: Interner::default(),
            events: Vec::new(),
            stats: TrieStats::default(),
        })
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len() - 1
    }
    pub fn tokens_per_block(&self) -> usize {
        self.tokens_per_block
    }
    pub fn enable_partial_reuse(&self) -> bool {
        self.enable_partial_reuse
    }
    pub fn copy_on_partial_reuse(&self) -> bool {
        self.copy_on_partial_reuse
    }
    /// Unreferenced blocks (cached or not): what can be allocated.
    pub fn num_free_blocks(&self) -> usize {
        self.num_free
    }
    /// Blocks cached in the trie.
    pub fn num_cached_blocks(&self) -> usize {
        self.num_cached
    }
    /// Tokens in the cached blocks' keys.
    pub fn num_cached_tokens(&self) -> usize {
        self.num_cached_tokens
    }
    pub fn num_requests(&self) -> usize {
        self.requests.len()
    }
    /// The logical clock: +1 per `claim`, +ticks per `advance_clock`.
    pub fn clock(&self) -> u64 {
        self.clock
    }
    pub fn stats(&self) -> TrieStats {
        self.stats.clone()
    }
    pub fn take_events(&mut self) -> Vec<TrieEvent> {
        std::mem::take(&mut self.events)
    }

    pub(crate) fn next_seq(&mut self) -> u64 {
        let s = self.seq;
        self.seq += 1;
        s
    }

    pub(crate) fn full(&self, k: &BlockKey) -> bool {
        k.tokens.len() == self.tokens_per_block
    }

    // ----- keys -----------------------------------------------------------------------

    /// The scope and interned multimodal items of a request, with the ids interning would
    /// give to unseen values (so planning needs no mutation).
    fn resolve(&self, tokens: &[u32], p: &ClaimParams<'_>) -> Result<(Scope, Vec<MmItem>)> {
        let salt = p
            .cache_salt
            .map(|s| self.salts.get(s.as_bytes()).unwrap_or(self.salts.new_id(0)));
        let mut unseen: Vec<&[u8]> = Vec::new();
        let mut mm = Vec::with_capacity(p.mm.len());
        for (i, span) in p.mm.iter().enumerate() {
            let end = span.start.checked_add(span.len);
            if span.len == 0 || end.is_none_or(|e| e > tokens.len()) {
                return Err(invalid(format!(
                    "mm_items[{i}] covers tokens [{}, {}+{}) outside the {} prompt tokens (or is empty)",
                    span.start,
                    span.start,
                    span.len,
                    tokens.len()
                )));
            }
            let id = match self.mm_hashes.get(&span.hash) {
                Some(id) => id,
                None => {
                    let pos = unseen.iter().position(|u| *u == span.hash.as_slice());
                    let k = pos.unwrap_or_else(|| {
                        unseen.push(&span.hash);
                        unseen.len() - 1
                    });
                    self.mm_hashes.new_id(k)
                }
            };
            mm.push(MmItem {
                id,
                start: span.start,
                len: span.len,
            });
        }
        Ok((
            Scope {
                lora: p.lora_id,
                salt,
            },
            mm,
        ))
    }

    fn chain_hash(&self, parent: Option<u64>, k: &BlockKey) -> u64 {
        let mut h = FNV_OFFSET;
        fnv(&mut h, &parent.unwrap_or(0).to_le_bytes());
        match k.scope.lora {
            None => fnv(&mut h, &[0]),
            Some(l) => {
                fnv(&mut h, &[1]);
                fnv(&mut h, &l.to_le_bytes());
            }
        }
        match k.scope.salt {
            None => fnv(&mut h, &[0]),
            Some(s) => {
                let b = self.salts.bytes(s);
                fnv(&mut h, &[1]);
                fnv(&mut h, &(b.len() as u32).to_le_bytes());
                fnv(&mut h, b);
            }
        }
        fnv(&mut h, &(k.mm.len() as u32).to_le_bytes());
        for &(id, off) in &k.mm {
            let b = self.mm_hashes.bytes(id);
            fnv(&mut h, &(b.len() as u32).to_le_bytes());
            fnv(&mut h, b);
            fnv(&mut h, &off.to_le_bytes());
        }
        fnv(&mut h, &(k.tokens.len() as u32).to_le_bytes());
        for t in &k.tokens {
            fnv(&mut h, &t.to_le_bytes());
        }
        h
    }

    // ----- lookup ---------------------------------------------------------------------

    /// The exact child of `parent` with key `k`.
    fn exact_child(&self, parent: u32, k: &BlockKey) -> Option<u32> {
        self.blocks[parent as usize]
            .children
            .exact(k.exact_hash())
            .iter()
            .copied()
            .find(|&c| self.blocks[c as usize].key.as_ref() == Some(k))
    }

    fn takeover_eligible(&self, b: u32) -> bool {
        let blk = &self.blocks[b as usize];
        blk.ref_cnt == 0 && blk.children.is_empty()
    }

    fn plan(&self, keys: &[BlockKey], n_ctx: usize) -> Plan {
        let mut steps = Vec::with_capacity(n_ctx);
        let mut matched = 0usize;
        let mut reused = 0usize;
        let mut cur = Some(self.root);
        for i in 0..n_ctx {
            let key = keys.get(i).filter(|k| !k.tokens.is_empty());
            let (Some(c), Some(k)) = (cur, key) else {
                steps.push(Step::Fresh);
                cur = None;
                continue;
            };
            let partial = match self.exact_child(c, k) {
                Some(b) if self.full(k) => {
                    steps.push(Step::Reuse(b));
                    matched += k.tokens.len();
                    reused += 1;
                    cur = Some(b);
                    continue;
                }
                Some(b) => Some((b, k.tokens.len())),
                None if self.enable_partial_reuse && k.mm.is_empty() => self.blocks[c as usize]
                    .children
                    .best_partial(k.scope, &k.tokens),
                None => None,
            };
            cur = None;
            match partial {
                Some((b, n)) => {
                    matched += n;
                    steps.push(if self.takeover_eligible(b) {
                        Step::TakeOver(b, n)
                    } else {
                        Step::Copy(b, n)
                    });
                }
                None => steps.push(Step::Fresh),
            }
        }
        Plan {
            steps,
            matched,
            reused,
        }
    }

    fn partial_of(steps: &[Step]) -> Option<PartialReuse> {
        steps.iter().find_map(|s| match *s {
            Step::TakeOver(b, n) => Some(PartialReuse {
                block_id: b,
                num_tokens: n,
                kind: PartialKind::TakenOver,
            }),
            Step::Copy(b, n) => Some(PartialReuse {
                block_id: b,
                num_tokens: n,
                kind: PartialKind::Copied,
            }),
            _ => None,
        })
    }

    /// What `claim` would reuse for `tokens`, without changing anything.
    pub fn lookup(&self, tokens: &[u32], p: &ClaimParams<'_>) -> Result<LookupOutcome> {
        let (scope, mm) = self.resolve(tokens, p)?;
        let keys = chop(tokens, self.tokens_per_block, scope, &mm);
        let n_ctx = context_blocks(tokens.len(), self.tokens_per_block);
        let plan = self.plan(&keys, n_ctx);
        Ok(LookupOutcome {
            num_matched_tokens: plan.matched,
            num_reused_blocks: plan.reused,
            partial: Self::partial_of(&plan.steps),
        })
    }

    // ----- references -----------------------------------------------------------------

    fn ref_inc(&mut self, b: u32) {
        if self.blocks[b as usize].ref_cnt == 0 {
            self.unlist(b);
            self.unexpire(b);
            self.num_free -= 1;
        }
        self.blocks[b as usize].ref_cnt += 1;
        self.sync(b);
    }

    fn ref_dec(&mut self, b: u32) {
        let blk = &mut self.blocks[b as usize];
        debug_assert!(blk.ref_cnt > 0, "ref_dec of a free block");
        blk.ref_cnt = blk.ref_cnt.saturating_sub(1);
        if blk.ref_cnt == 0 {
            self.num_free += 1;
            let seq = self.next_seq();
            let clock = self.clock;
            let blk = &mut self.blocks[b as usize];
            blk.seq = seq;
            if let (Some(d), true) = (blk.duration, blk.priority != DEFAULT_PRIORITY) {
                let t = clock.saturating_add(d);
                blk.expiry = Some(t);
                self.expiring.insert((t, b));
            }
        }
        self.sync(b);
    }

    fn alloc_fresh(&mut self, priority: u8, duration: Option<u64>) -> Result<u32> {
        let b = self.pop_victim().ok_or(Error::OutOfBlocks {
            requested: 1,
            available: 0,
        })?;
        self.num_free -= 1;
        let blk = &mut self.blocks[b as usize];
        blk.ref_cnt = 1;
        blk.priority = priority;
        blk.duration = duration;
        self.stats.allocated_blocks += 1;
        self.sync(b);
        Ok(b)
    }

    /// Partial-index membership: cached, no multimodal keys, and (without copy on partial
    /// reuse) an unreferenced leaf.
    pub(crate) fn wants_partial(&self, b: u32) -> bool {
        let blk = &self.blocks[b as usize];
        match &blk.key {
            Some(k) if k.mm.is_empty() => {
                self.copy_on_partial_reuse || (blk.ref_cnt == 0 && blk.children.is_empty())
            }
            _ => false,
        }
    }

    pub(crate) fn sync_partial(&mut self, b: u32) {
        let want = self.wants_partial(b);
        if want == self.blocks[b as usize].in_partial {
            return;
        }
        if want {
            let parent = self.blocks[b as usize].parent;
            if let Some(k) = self.blocks[b as usize].key.as_ref() {
                let (scope, tokens) = (k.scope, k.tokens.clone());
                self.blocks[parent as usize]
                    .children
                    .insert_partial(scope, &tokens, b);
                self.blocks[b as usize].in_partial = true;
            }
        } else {
            self.drop_partial(b);
        }
    }

    pub(crate) fn drop_partial(&mut self, b: u32) {
        if !self.blocks[b as usize].in_partial {
            return;
        }
        let parent = self.blocks[b as usize].parent;
        if let Some(k) = self.blocks[b as usize].key.as_ref() {
            let (scope, tokens) = (k.scope, k.tokens.clone());
            self.blocks[parent as usize]
                .children
                .remove_partial(scope, &tokens);
        }
        self.blocks[b as usize].in_partial = false;
    }

    fn attach(&mut self, b: u32, parent: u32, key: BlockKey) {
        let parent_hash = (parent != self.root).then(|| self.blocks[parent as usize].hash);
        let hash = self.chain_hash(parent_hash, &key);
        let key_len = key.tokens.len();
        self.blocks[parent as usize]
            .children
            .insert_exact(key.exact_hash(), b);
        if let Some(s) = key.scope.salt {
            self.salts.retain(s);
        }
        for &(id, _) in &key.mm {
            self.mm_hashes.retain(id);
        }
        let blk = &mut self.blocks[b as usize];
        blk.key = Some(key);
        blk.parent = parent;
        blk.hash = hash;
        self.num_cached += 1;
        self.num_cached_tokens += key_len;
        self.sync(b);
        self.sync(parent);
    }

    // ----- requests -------------------------------------------------------------------

    /// Phase one: looks up `tokens` and takes references on everything it reuses, in one
    /// step. Copy sources stay referenced until [`BlockTrie::complete`].
    pub fn claim(
        &mut self,
        request_id: u64,
        tokens: &[u32],
        p: &ClaimParams<'_>,
    ) -> Result<ClaimOutcome> {
        if self.requests.contains_key(&request_id) {
            return Err(invalid(format!(
                "request {request_id} already holds blocks: release it first"
            )));
        }
        if tokens.is_empty() {
            return Err(invalid("tokens must not be empty".into()));
        }
        if let Some(pr) = p.priority {
            if pr > MAX_PRIORITY {
                return Err(invalid(format!(
                    "priority must be in [0, {MAX_PRIORITY}], got {pr}"
                )));
            }
        }
        let tpb = self.tokens_per_block;
        let (scope, mm) = self.resolve(tokens, p)?;
        let keys = chop(tokens, tpb, scope, &mm);
        let n_ctx = context_blocks(tokens.len(), tpb);
        let total_tokens = tokens
            .len()
            .checked_add(p.reserve_tokens)
            .ok_or_else(|| invalid("reserve_tokens is too large".into()))?;
        let n_total = context_blocks(total_tokens, tpb);
        let plan = self.plan(&keys, n_ctx);

        // Capacity, before any change.
        let mut fresh = n_total - n_ctx;
        let mut leaving = 0usize;
        for s in &plan.steps {
            match *s {
                Step::Reuse(b) | Step::TakeOver(b, _) => {
                    leaving += usize::from(self.blocks[b as usize].ref_cnt == 0)
                }
                Step::Copy(b, _) => {
                    leaving += usize::from(self.blocks[b as usize].ref_cnt == 0);
                    fresh += 1;
                }
                Step::Fresh => fresh += 1,
            }
        }
        if fresh + leaving > self.num_free {
            return Err(Error::OutOfBlocks {
                requested: fresh,
                available: self.num_free - leaving.min(self.num_free),
            });
        }

        // Commit: intern (the request holds its salt and each multimodal item), tick the
        // clock, apply retention expiry.
        if let Some(s) = p.cache_salt {
            self.salts.acquire(s.as_bytes());
        }
        for span in p.mm {
            self.mm_hashes.acquire(&span.hash);
        }
        self.clock += 1;
        self.refresh();

        // References first, so that no allocation below can evict a matched block.
        let mut pins = Vec::new();
        for s in &plan.steps {
            match *s {
                Step::Reuse(b) => {
                    self.ref_inc(b);
                    self.set_retention(b, p.priority, p.retention);
                }
                Step::TakeOver(b, _) => {
                    self.ref_inc(b);
                    self.set_retention(b, p.priority, p.retention);
                    self.detach(b);
                    self.stats.taken_over_blocks += 1;
                }
                Step::Copy(b, _) => {
                    self.ref_inc(b);
                    pins.push(b);
                }
                Step::Fresh => {}
            }
        }
        let mut block_ids = Vec::with_capacity(n_total);
        let mut copies = Vec::new();
        for s in &plan.steps {
            let b = match *s {
                Step::Reuse(b) | Step::TakeOver(b, _) => b,
                Step::Copy(src, n) => {
                    let (pr, d) = {
                        let sb = &self.blocks[src as usize];
                        (sb.priority, sb.duration)
                    };
                    let dst = self.alloc_fresh(pr, d)?;
                    copies.push(CopyOp {
                        src,
                        dst,
                        num_tokens: n,
                    });
                    self.stats.copies += 1;
                    self.stats.copied_tokens += n as u64;
                    dst
                }
                Step::Fresh => {
                    self.alloc_fresh(p.priority.unwrap_or(DEFAULT_PRIORITY), p.retention)?
                }
            };
            block_ids.push(b);
        }
        for _ in n_ctx..n_total {
            block_ids.push(self.alloc_fresh(DEFAULT_PRIORITY, None)?);
        }

        let partial = Self::partial_of(&plan.steps);
        self.stats.claims += 1;
        self.stats.query_tokens += tokens.len() as u64;
        self.stats.matched_tokens += plan.matched as u64;
        self.stats.reused_blocks += plan.reused as u64;
        if let Some(pr) = partial {
            self.stats.partial_hits += 1;
            self.stats.partial_tokens += pr.num_tokens as u64;
        }
        self.requests.insert(
            request_id,
            Request {
                blocks: block_ids.clone(),
                pins,
                tokens: tokens.to_vec(),
                scope,
                mm,
            },
        );
        Ok(ClaimOutcome {
            block_ids,
            num_matched_tokens: plan.matched,
            num_reused_blocks: plan.reused,
            partial,
            copies,
        })
    }

    fn set_retention(&mut self, b: u32, priority: Option<u8>, duration: Option<u64>) {
        let blk = &mut self.blocks[b as usize];
        if let Some(pr) = priority {
            blk.priority = pr;
        }
        blk.duration = duration;
    }

    fn request(&self, request_id: u64) -> Result<&Request> {
        self.requests
            .get(&request_id)
            .ok_or_else(|| Error::UnknownRequest(format!("unknown request {request_id}")))
    }

    /// Phase two: the copies recorded by `claim` are done; their sources are released.
    /// Returns the number of copies completed.
    pub fn complete(&mut self, request_id: u64) -> Result<usize> {
        self.request(request_id)?;
        let pins = self
            .requests
            .get_mut(&request_id)
            .map(|r| std::mem::take(&mut r.pins))
            .unwrap_or_default();
        for &b in &pins {
            self.ref_dec(b);
        }
        Ok(pins.len())
    }

    /// The blocks a request holds, in order.
    pub fn request_blocks(&self, request_id: u64) -> Result<Vec<u32>> {
        Ok(self.request(request_id)?.blocks.clone())
    }

    /// Allocates blocks so that the request holds at least `ceil(num_tokens /
    /// tokens_per_block)`; returns the new block ids (default priority).
    pub fn extend(&mut self, request_id: u64, num_tokens: usize) -> Result<Vec<u32>> {
        let held = self.request(request_id)?.blocks.len();
        let need = context_blocks(num_tokens, self.tokens_per_block).saturating_sub(held);
        if need > self.num_free {
            return Err(Error::OutOfBlocks {
                requested: need,
                available: self.num_free,
            });
        }
        let mut new = Vec::with_capacity(need);
        for _ in 0..need {
            new.push(self.alloc_fresh(DEFAULT_PRIORITY, None)?);
        }
        if let Some(r) = self.requests.get_mut(&request_id) {
            r.blocks.extend_from_slice(&new);
        }
        Ok(new)
    }

    /// Caches the request's blocks under the keys of `tokens` (the prompt, or the prompt
    /// plus generated tokens; must agree with what the request claimed or stored: extend
    /// it or be a prefix of it). Stops
    /// at the first key another block already holds. Returns the number of blocks newly
    /// cached.
    pub fn store(&mut self, request_id: u64, tokens: &[u32]) -> Result<usize> {
        let r = self.request(request_id)?;
        let common = tokens.len().min(r.tokens.len());
        if tokens[..common] != r.tokens[..common] {
            return Err(invalid(format!(
                "request {request_id}: tokens must agree with the {} tokens claimed or stored \
                 before (extend them or be a prefix of them)",
                r.tokens.len()
            )));
        }
        let keys = chop(tokens, self.tokens_per_block, r.scope, &r.mm);
        if keys.len() > r.blocks.len() {
            return Err(invalid(format!(
                "request {request_id} holds {} blocks but {} tokens need {}: call extend first",
                r.blocks.len(),
                tokens.len(),
                keys.len()
            )));
        }
        let blocks = r.blocks.clone();
        let mut cur = self.root;
        let mut new_ids = Vec::new();
        for (k, &b) in keys.into_iter().zip(&blocks) {
            if let Some(old) = self.blocks[b as usize].key.as_ref() {
                if self.blocks[b as usize].parent != cur {
                    break;
                }
                if *old == k {
                    cur = b;
                    continue;
                }
                // The request's own non-full last block grew: re-file it.
                if self.full(old) || !self.blocks[b as usize].children.is_empty() {
                    break;
                }
                if self.exact_child(cur, &k).is_some() {
                    break;
                }
                self.detach(b);
            } else if self.exact_child(cur, &k).is_some() {
                break;
            }
            self.attach(b, cur, k);
            new_ids.push(b);
            cur = b;
        }
        if let Some(r) = self.requests.get_mut(&request_id) {
            if tokens.len() > r.tokens.len() {
                r.tokens = tokens.to_vec();
            }
        }
        if !new_ids.is_empty() {
            let first_parent = self.blocks[new_ids[0] as usize].parent;
            let parent_block_hash =
                (first_parent != self.root).then(|| self.blocks[first_parent as usize].hash);
            let mut token_ids = Vec::new();
            let mut lora_id = None;
            for &b in &new_ids {
                if let Some(k) = &self.blocks[b as usize].key {
                    token_ids.extend_from_slice(&k.tokens);
                    lora_id = k.scope.lora;
                }
            }
            self.events.push(TrieEvent::Stored {
                block_hashes: new_ids
                    .iter()
                    .map(|&b| self.blocks[b as usize].hash)
                    .collect(),
                block_ids: new_ids.clone(),
                parent_block_hash,
                token_ids,
                block_size: self.tokens_per_block,
                lora_id,
            });
            self.stats.stored_blocks += new_ids.len() as u64;
        }
        Ok(new_ids.len())
    }

    /// Drops the request: pending copy pins, then its blocks in reverse order.
    pub fn release(&mut self, request_id: u64) -> Result<()> {
        self.request(request_id)?;
        let Some(r) = self.requests.remove(&request_id) else {
            return Ok(());
        };
        for &b in &r.pins {
            self.ref_dec(b);
        }
        for &b in r.blocks.iter().rev() {
            self.ref_dec(b);
        }
        if let Some(s) = r.scope.salt {
            self.salts.release(s);
        }
        for it in &r.mm {
            self.mm_hashes.release(it.id);
        }
        Ok(())
    }

    /// Advances the logical clock (retention durations are counted in its ticks).
    pub fn advance_clock(&mut self, ticks: u64) {
        self.clock = self.clock.saturating_add(ticks);
        self.refresh();
    }

    /// Every block, by id.
    pub fn dump(&self) -> Vec<BlockDump> {
        (0..self.num_blocks() as u32)
            .map(|b| {
                let blk = &self.blocks[b as usize];
                let key = blk.key.as_ref();
                BlockDump {
                    block_id: b,
                    cached: key.is_some(),
                    parent: (key.is_some() && blk.parent != self.root).then_some(blk.parent),
                    tokens: key.map(|k| k.tokens.clone()).unwrap_or_default(),
                    lora_id: key.and_then(|k| k.scope.lora),
                    cache_salt: key
                        .and_then(|k| k.scope.salt)
                        .map(|s| String::from_utf8_lossy(self.salts.bytes(s)).into_owned()),
                    mm_keys: key
                        .map(|k| {
                            k.mm.iter()
                                .map(|&(id, off)| (self.mm_hashes.bytes(id).to_vec(), off))
                                .collect()
                        })
                        .unwrap_or_default(),
                    ref_cnt: blk.ref_cnt,
                    priority: blk.priority,
                }
            })
            .collect()
    }

    /// Per request: its interned salt and multimodal ids, for the invariant check.
    pub(crate) fn requests_interned(&self) -> impl Iterator<Item = (Option<u32>, Vec<u32>)> + '_ {
        self.requests
            .values()
            .map(|r| (r.scope.salt, r.mm.iter().map(|m| m.id).collect()))
    }

    /// Number of interned salts and multimodal hashes (what cached keys and live requests
    /// hold).
    pub fn num_interned(&self) -> (usize, usize) {
        (self.salts.len(), self.mm_hashes.len())
    }

    /// Per request: (blocks, pins), for the invariant check.
    pub(crate) fn held(&self) -> impl Iterator<Item = (&[u32], &[u32])> {
        self.requests
            .values()
            .map(|r| (r.blocks.as_slice(), r.pins.as_slice()))
    }
}
