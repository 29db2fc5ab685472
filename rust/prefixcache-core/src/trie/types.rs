//! The block trie's public argument and result types.

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
    /// Matched blocks (full or partial) that were in host memory: loaded to the GPU.
    pub num_host_blocks: usize,
    /// Of `num_matched_tokens`, those read from host memory.
    pub num_host_tokens: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupOutcome {
    pub num_matched_tokens: usize,
    pub num_reused_blocks: usize,
    pub partial: Option<PartialReuse>,
    /// Matched blocks (full or partial) in host memory.
    pub num_host_blocks: usize,
    /// Of `num_matched_tokens`, those in host memory.
    pub num_host_tokens: usize,
}

/// Where a cached block's KV lives: TensorRT-LLM's primary (GPU) or secondary (host)
/// cache level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Medium {
    Gpu,
    Cpu,
}

impl Medium {
    /// "GPU" or "CPU", as in KV events.
    pub fn name(self) -> &'static str {
        match self {
            Medium::Gpu => "GPU",
            Medium::Cpu => "CPU",
        }
    }
}

/// KV-cache events: blocks entering (one event per `store` that cached blocks) and
/// leaving (one event per block) the trie, and (with a host tier) a cached block moving
/// between GPU and host memory (one event per block; TensorRT-LLM's `cacheLevelUpdated`).
/// Blocks are stored on the GPU; a consumer knows a block's medium from the `Moved`
/// events since.
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
    /// The blocks stay cached; their KV is now on `medium`.
    Moved {
        block_ids: Vec<u32>,
        block_hashes: Vec<u64>,
        medium: Medium,
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

/// Host tier counters since construction (all zero without a host tier).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrieHostStats {
    /// Cached blocks copied from the GPU to host memory when their GPU block was taken.
    pub offloaded_blocks: u64,
    /// Their tokens.
    pub stored_tokens: u64,
    /// Host blocks moved back to the GPU by a claim (reused or taken over).
    pub onboarded_blocks: u64,
    /// Matched tokens read from host memory (onboarded, or copied from a host block).
    pub loaded_tokens: u64,
    /// Cached host blocks that left the trie (their host block was reused, or their GPU
    /// ancestor was evicted without offload).
    pub host_evicted_blocks: u64,
    /// Their tokens.
    pub host_evicted_tokens: u64,
    /// Most tokens cached in host memory at once.
    pub peak_host_tokens: u64,
}

impl TrieHostStats {
    /// `(name, value)` pairs in a fixed order.
    pub fn fields(&self) -> [(&'static str, u64); 7] {
        [
            ("offloaded_blocks", self.offloaded_blocks),
            ("stored_tokens", self.stored_tokens),
            ("onboarded_blocks", self.onboarded_blocks),
            ("loaded_tokens", self.loaded_tokens),
            ("host_evicted_blocks", self.host_evicted_blocks),
            ("host_evicted_tokens", self.host_evicted_tokens),
            ("peak_host_tokens", self.peak_host_tokens),
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
