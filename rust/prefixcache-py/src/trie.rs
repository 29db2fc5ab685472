//! `BlockTrie`, `Claim`, `Lookup`: bindings of `trie::BlockTrie` (TensorRT-LLM's block
//! reuse). Every call that does core work releases the GIL (`Shared::with_gil_released`) and takes
//! the trie's lock inside; the lock is never held while the GIL is acquired.

use prefixcache_core::trie::{
    BlockTrie as CoreTrie, ClaimParams, MmSpan, PartialReuse, TrieEvent, TrieStats,
    DEFAULT_SECONDARY_OFFLOAD_MIN_PRIORITY, DEFAULT_TOKENS_PER_BLOCK, MAX_PRIORITY,
};
use pyo3::exceptions::PyAssertionError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple, PyType};

use crate::convert;
use crate::errors::{invalid_input, invalid_type, IntoPyResult};
use crate::shared::Shared;

/// The result of `BlockTrie.claim`.
#[pyclass(frozen, module = "prefixcache._core")]
pub struct Claim {
    /// The request's blocks: reused, taken over or fresh, then reserve blocks.
    #[pyo3(get)]
    block_ids: Vec<u32>,
    /// Tokens whose KV is reused (full blocks plus the partial block's tokens).
    #[pyo3(get)]
    num_matched_tokens: usize,
    /// Full blocks reused by exact key.
    #[pyo3(get)]
    num_reused_blocks: usize,
    p: Option<PartialReuse>,
    /// `(src, dst, num_tokens)` copies to perform before `complete`.
    #[pyo3(get)]
    copies: Vec<(u32, u32, usize)>,
    /// Matched blocks that were in host memory (onboarded, or a copy's host source).
    #[pyo3(get)]
    num_host_blocks: usize,
    /// Of `num_matched_tokens`, those read from host memory.
    #[pyo3(get)]
    num_host_tokens: usize,
}

fn partial_fields(p: Option<PartialReuse>) -> (bool, usize, Option<&'static str>, Option<u32>) {
    match p {
        Some(p) => (true, p.num_tokens, Some(p.kind.name()), Some(p.block_id)),
        None => (false, 0, None, None),
    }
}

#[pymethods]
impl Claim {
    /// Whether the last matched block was a partial match.
    #[getter]
    fn partial(&self) -> bool {
        self.p.is_some()
    }
    /// Tokens reused from the partially matched block (0 without one).
    #[getter]
    fn partial_tokens(&self) -> usize {
        partial_fields(self.p).1
    }
    /// "taken_over", "copied" or None.
    #[getter]
    fn partial_kind(&self) -> Option<&'static str> {
        partial_fields(self.p).2
    }
    /// The partially matched block (the copy source when copied), or None.
    #[getter]
    fn partial_block(&self) -> Option<u32> {
        partial_fields(self.p).3
    }
    fn __repr__(&self) -> String {
        format!(
            "Claim(blocks={}, num_matched_tokens={}, num_reused_blocks={}, partial_kind={}, copies={})",
            self.block_ids.len(),
            self.num_matched_tokens,
            self.num_reused_blocks,
            self.partial_kind().map_or("None".to_string(), |k| format!("'{k}'")),
            self.copies.len()
        )
    }
}

/// The result of `BlockTrie.lookup` (nothing is claimed).
#[pyclass(frozen, module = "prefixcache._core")]
pub struct Lookup {
    #[pyo3(get)]
    num_matched_tokens: usize,
    #[pyo3(get)]
    num_reused_blocks: usize,
    p: Option<PartialReuse>,
    #[pyo3(get)]
    num_host_blocks: usize,
    #[pyo3(get)]
    num_host_tokens: usize,
}

#[pymethods]
impl Lookup {
    #[getter]
    fn partial(&self) -> bool {
        self.p.is_some()
    }
    #[getter]
    fn partial_tokens(&self) -> usize {
        partial_fields(self.p).1
    }
    #[getter]
    fn partial_kind(&self) -> Option<&'static str> {
        partial_fields(self.p).2
    }
    #[getter]
    fn partial_block(&self) -> Option<u32> {
        partial_fields(self.p).3
    }
    fn __repr__(&self) -> String {
        format!(
            "Lookup(num_matched_tokens={}, num_reused_blocks={}, partial_kind={})",
            self.num_matched_tokens,
            self.num_reused_blocks,
            self.partial_kind()
                .map_or("None".to_string(), |k| format!("'{k}'"))
        )
    }
}

/// TensorRT-LLM's KV block reuse: a per-block trie keyed by (LoRA id, tokens, multimodal
/// keys, cache salt) with partial reuse of the last block and priority-LRU eviction.
#[pyclass(frozen, module = "prefixcache._core")]
pub struct BlockTrie {
    inner: Shared<CoreTrie>,
}

impl BlockTrie {
    /// Runs `f` on the trie with the GIL released (its inputs are owned copies).
    fn with<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut CoreTrie) -> R + Send,
    ) -> PyResult<R> {
        self.inner.with_gil_released(py, f)
    }

    /// Short reads: with the GIL held (when another thread holds the trie, waits for it
    /// with the GIL released).
    fn read<R>(&self, py: Python<'_>, f: impl FnOnce(&CoreTrie) -> R) -> PyResult<R> {
        self.inner.with(py, |t| f(t))
    }
}

use crate::convert::request_id;

/// A non-negative integer argument (`[0, 2**63 - 1]`), or `default` when None / absent.
fn nonneg(obj: Option<&Bound<'_, PyAny>>, default: u64, what: &str) -> PyResult<u64> {
    convert::int_or(obj, i128::from(default), what, 0, convert::SIZE_MAX).map(|v| v as u64)
}

fn mm_spans(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<MmSpan>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    let items = convert::iter_of(
        obj,
        "mm_items",
        "None or a sequence of (hash, start, length) tuples",
    )?;
    for (i, item) in items.enumerate() {
        let item = item?;
        let bad = || {
            invalid_type(format!(
                "mm_items[{i}] must be a (hash: bytes | str, start: int, length: int) tuple"
            ))
        };
        let t = item.cast::<PyTuple>().map_err(|_| bad())?;
        if t.len() != 3 {
            return Err(bad());
        }
        let h = t.get_item(0)?;
        let hash = if let Ok(b) = h.cast::<PyBytes>() {
            b.as_bytes().to_vec()
        } else if h.is_instance_of::<PyString>() {
            convert::str_arg(&h, &format!("mm_items[{i}] hash"))?.into_bytes()
        } else {
            return Err(bad());
        };
        let start = convert::size_arg(&t.get_item(1)?, &format!("mm_items[{i}] start"))?;
        let len = convert::size_arg(&t.get_item(2)?, &format!("mm_items[{i}] length"))?;
        out.push(MmSpan { hash, start, len });
    }
    Ok(out)
}

fn lora(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
    match obj.filter(|o| !o.is_none()) {
        None => Ok(None),
        Some(o) => nonneg(Some(o), 0, "lora_id").map(Some),
    }
}

struct EventClasses {
    stored: Py<PyType>,
    removed: Py<PyType>,
    moved: Py<PyType>,
}

static EVENT_CLASSES: PyOnceLock<EventClasses> = PyOnceLock::new();

fn event_classes(py: Python<'_>) -> PyResult<&EventClasses> {
    EVENT_CLASSES.get_or_try_init(py, || {
        let m = py.import("prefixcache.trie_events")?;
        Ok(EventClasses {
            stored: m
                .getattr("TrieBlockStored")?
                .cast_into::<PyType>()?
                .unbind(),
            removed: m
                .getattr("TrieBlockRemoved")?
                .cast_into::<PyType>()?
                .unbind(),
            moved: m.getattr("TrieBlockMoved")?.cast_into::<PyType>()?.unbind(),
        })
    })
}

fn stats_dict<'py>(py: Python<'py>, s: &TrieStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in s.fields() {
        d.set_item(k, v)?;
    }
    Ok(d)
}

// Every constructor argument is converted by a `from_py_with` extractor, so that pyo3
// converts them in argument order: the first bad argument is the one named (as the
// reference names it).

/// The `num_blocks` argument: an int in `[1, 2**32 - 1)` (block ids are u32), its range
/// checked as it is read (as the core checks it).
fn num_blocks_arg(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    let n = convert::num_blocks(obj)?;
    if n == 0 || n >= u32::MAX as usize {
        return Err(invalid_input(format!(
            "num_blocks must be in [1, 2**32 - 1), got {n}"
        )));
    }
    Ok(n)
}

/// The `tokens_per_block` argument: an int >= 1 (None: the default).
fn tokens_per_block_arg(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    convert::positive_or(Some(obj), DEFAULT_TOKENS_PER_BLOCK, "tokens_per_block")
}

/// The `host_blocks` argument: an int >= 0 (None: 0).
fn host_blocks_arg(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    convert::size_or(Some(obj), 0, "host_blocks")
}

/// The `secondary_offload_min_priority` argument: a priority (None: the default).
fn min_priority_arg(obj: &Bound<'_, PyAny>) -> PyResult<u8> {
    convert::int_or(
        Some(obj),
        i128::from(DEFAULT_SECONDARY_OFFLOAD_MIN_PRIORITY),
        "secondary_offload_min_priority",
        0,
        i128::from(MAX_PRIORITY),
    )
    .map(|v| v as u8)
}

#[pymethods]
impl BlockTrie {
    #[new]
    #[pyo3(signature = (num_blocks, tokens_per_block = DEFAULT_TOKENS_PER_BLOCK, enable_partial_reuse = true, copy_on_partial_reuse = true, host_blocks = 0, secondary_offload_min_priority = DEFAULT_SECONDARY_OFFLOAD_MIN_PRIORITY, enable_events = true))]
    #[pyo3(
        text_signature = "(num_blocks, tokens_per_block=None, enable_partial_reuse=True, copy_on_partial_reuse=True, host_blocks=0, secondary_offload_min_priority=30, enable_events=True)"
    )]
    fn new(
        #[pyo3(from_py_with = num_blocks_arg)] num_blocks: usize,
        #[pyo3(from_py_with = tokens_per_block_arg)] tokens_per_block: usize,
        #[pyo3(from_py_with = convert::enable_partial_reuse)] enable_partial_reuse: bool,
        #[pyo3(from_py_with = convert::copy_on_partial_reuse)] copy_on_partial_reuse: bool,
        #[pyo3(from_py_with = host_blocks_arg)] host_blocks: usize,
        #[pyo3(from_py_with = min_priority_arg)] secondary_offload_min_priority: u8,
        #[pyo3(from_py_with = convert::enable_events)] enable_events: bool,
    ) -> PyResult<Self> {
        let mut t = CoreTrie::with_host_tier(
            num_blocks,
            tokens_per_block,
            enable_partial_reuse,
            copy_on_partial_reuse,
            host_blocks,
            secondary_offload_min_priority,
        )
        .py_err()?;
        t.set_events_enabled(enable_events);
        Ok(BlockTrie {
            inner: Shared::new("BlockTrie", t),
        })
    }

    /// GPU blocks (the primary pool).
    #[getter]
    fn num_blocks(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, |t| t.num_blocks())
    }
    /// Blocks of host memory behind the GPU (0: no host tier).
    #[getter]
    fn host_blocks(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, |t| t.host_blocks())
    }
    /// The lowest priority a GPU victim is offloaded at (None without a host tier).
    #[getter]
    fn secondary_offload_min_priority(&self, py: Python<'_>) -> PyResult<Option<u8>> {
        self.read(py, |t| {
            (t.host_blocks() > 0).then(|| t.secondary_offload_min_priority())
        })
    }
    /// Cached blocks in host memory.
    #[getter]
    fn num_host_cached_blocks(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, |t| t.num_host_cached_blocks())
    }
    /// Tokens in the keys of the cached blocks in host memory.
    #[getter]
    fn num_host_cached_tokens(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, |t| t.num_host_cached_tokens())
    }
    /// Host tier counters: offloaded_blocks, stored_tokens, onboarded_blocks,
    /// loaded_tokens, host_evicted_blocks, host_evicted_tokens, peak_host_tokens.
    fn host_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.read(py, |t| t.host_stats())?;
        let d = PyDict::new(py);
        for (k, v) in s.fields() {
            d.set_item(k, v)?;
        }
        Ok(d)
    }
    /// Per block id (GPU and host blocks, as `dump()`): whether it is in host memory.
    fn host_dump(&self, py: Python<'_>) -> PyResult<Vec<bool>> {
        self.with(py, |t| t.host_dump())?.py_err()
    }
    #[getter]
    fn tokens_per_block(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, |t| t.tokens_per_block())
    }
    #[getter]
    fn enable_partial_reuse(&self, py: Python<'_>) -> PyResult<bool> {
        self.read(py, |t| t.enable_partial_reuse())
    }
    #[getter]
    fn copy_on_partial_reuse(&self, py: Python<'_>) -> PyResult<bool> {
        self.read(py, |t| t.copy_on_partial_reuse())
    }
    /// Unreferenced GPU blocks, cached or not: what `claim` can allocate.
    #[getter]
    fn num_free_blocks(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, |t| t.num_free_blocks())
    }
    /// Blocks cached in the trie on the GPU.
    #[getter]
    fn num_cached_blocks(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, |t| t.num_cached_blocks())
    }
    /// Tokens in the keys of the cached GPU blocks.
    #[getter]
    fn num_cached_tokens(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, |t| t.num_cached_tokens())
    }
    /// Tokens of cached blocks that left the GPU since construction: evicted, or
    /// offloaded to host memory (stats["evicted_tokens"] + host_stats()["stored_tokens"]).
    #[getter]
    fn num_tokens_left_gpu(&self, py: Python<'_>) -> PyResult<u64> {
        self.read(py, |t| t.num_tokens_left_gpu())
    }
    /// Requests holding blocks.
    #[getter]
    fn num_requests(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, |t| t.num_requests())
    }
    /// The logical clock: +1 per claim, +ticks per advance_clock.
    #[getter]
    fn clock(&self, py: Python<'_>) -> PyResult<u64> {
        self.read(py, |t| t.clock())
    }
    /// Counters since construction (claims, query_tokens, matched_tokens, reused_blocks,
    /// partial_hits, partial_tokens, taken_over_blocks, copies, copied_tokens,
    /// allocated_blocks, evicted_blocks, evicted_tokens, stored_blocks).
    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.read(py, |t| t.stats())?;
        stats_dict(py, &s)
    }

    /// Phase one: looks up `tokens` (over its first len - 1 tokens) and takes references
    /// on everything reused, atomically. Copies (`Claim.copies`) keep their sources
    /// referenced until `complete(request_id)`.
    #[pyo3(signature = (request_id, tokens, lora_id = None, cache_salt = None, mm_items = None, priority = None, retention = None, reserve_tokens = None))]
    #[allow(clippy::too_many_arguments)]
    fn claim(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        tokens: &Bound<'_, PyAny>,
        lora_id: Option<&Bound<'_, PyAny>>,
        cache_salt: Option<&Bound<'_, PyAny>>,
        mm_items: Option<&Bound<'_, PyAny>>,
        priority: Option<&Bound<'_, PyAny>>,
        retention: Option<&Bound<'_, PyAny>>,
        reserve_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Claim> {
        let rid = self::request_id(request_id)?;
        let toks = convert::tokens(tokens, "tokens")?;
        let lora_id = lora(lora_id)?;
        let cache_salt = cache_salt.map(convert::cache_salt).transpose()?.flatten();
        let mm = mm_spans(mm_items)?;
        let max = i128::from(MAX_PRIORITY);
        let priority = match priority.filter(|o| !o.is_none()) {
            None => None,
            Some(o) => Some(convert::int_in(o, "priority", 0, max)? as u8),
        };
        let retention = match retention.filter(|o| !o.is_none()) {
            None => None,
            Some(o) => Some(nonneg(Some(o), 0, "retention")?),
        };
        let reserve = convert::size_or(reserve_tokens, 0, "reserve_tokens")?;
        let params = ClaimParams {
            lora_id,
            cache_salt: cache_salt.as_deref(),
            mm: &mm,
            priority,
            retention,
            reserve_tokens: reserve,
        };
        let c = self
            .with(py, |t| t.claim(rid, toks.as_slice(), &params))?
            .py_err()?;
        Ok(Claim {
            block_ids: c.block_ids,
            num_matched_tokens: c.num_matched_tokens,
            num_reused_blocks: c.num_reused_blocks,
            p: c.partial,
            copies: c
                .copies
                .iter()
                .map(|o| (o.src, o.dst, o.num_tokens))
                .collect(),
            num_host_blocks: c.num_host_blocks,
            num_host_tokens: c.num_host_tokens,
        })
    }

    /// What `claim` would reuse for `tokens`, without claiming anything.
    #[pyo3(signature = (tokens, lora_id = None, cache_salt = None, mm_items = None))]
    fn lookup(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        lora_id: Option<&Bound<'_, PyAny>>,
        cache_salt: Option<&Bound<'_, PyAny>>,
        mm_items: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Lookup> {
        let toks = convert::tokens(tokens, "tokens")?;
        let lora_id = lora(lora_id)?;
        let cache_salt = cache_salt.map(convert::cache_salt).transpose()?.flatten();
        let mm = mm_spans(mm_items)?;
        let params = ClaimParams {
            lora_id,
            cache_salt: cache_salt.as_deref(),
            mm: &mm,
            ..ClaimParams::default()
        };
        let l = self
            .with(py, |t| t.lookup(toks.as_slice(), &params))?
            .py_err()?;
        Ok(Lookup {
            num_matched_tokens: l.num_matched_tokens,
            num_reused_blocks: l.num_reused_blocks,
            p: l.partial,
            num_host_blocks: l.num_host_blocks,
            num_host_tokens: l.num_host_tokens,
        })
    }

    /// Phase two: the request's copies are done; releases their sources. Returns how many.
    fn complete(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        let rid = self::request_id(request_id)?;
        self.with(py, |t| t.complete(rid))?.py_err()
    }

    /// Caches the request's blocks under the keys of `tokens` (its prompt, or prompt plus
    /// generated tokens). Returns the number of blocks newly cached.
    fn store(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        tokens: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let rid = self::request_id(request_id)?;
        let toks = convert::tokens(tokens, "tokens")?;
        self.with(py, |t| t.store(rid, toks.as_slice()))?.py_err()
    }

    /// Grows the request to `ceil(num_tokens / tokens_per_block)` blocks; returns the new ids.
    fn extend(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        num_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<u32>> {
        let rid = self::request_id(request_id)?;
        let n = convert::size_arg(num_tokens, "num_tokens")?;
        self.with(py, |t| t.extend(rid, n))?.py_err()
    }

    /// Drops the request's references (pending copy sources, then blocks in reverse order).
    fn release(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let rid = self::request_id(request_id)?;
        self.with(py, |t| t.release(rid))?.py_err()
    }

    /// Advances the logical clock; free blocks whose retention ran out drop to priority 35.
    fn advance_clock(&self, py: Python<'_>, ticks: &Bound<'_, PyAny>) -> PyResult<()> {
        let n = convert::size_arg(ticks, "ticks")? as u64;
        self.with(py, |t| t.advance_clock(n))
    }

    /// The blocks a request holds, in order.
    fn request_blocks(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
        let rid = self::request_id(request_id)?;
        self.with(py, |t| t.request_blocks(rid))?.py_err()
    }

    /// The KV events since the last call (TrieBlockStored / TrieBlockRemoved /
    /// TrieBlockMoved); `compact`: stored events without their token ids.
    #[pyo3(signature = (compact = false))]
    fn take_events<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = convert::compact)] compact: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let events = self.with(py, |t| t.take_events())?;
        let cls = event_classes(py)?;
        let out = PyList::empty(py);
        for e in events {
            let obj = match e {
                TrieEvent::Stored {
                    block_ids,
                    block_hashes,
                    parent_block_hash,
                    token_ids,
                    block_size,
                    lora_id,
                } => cls.stored.bind(py).call1((
                    block_ids,
                    block_hashes,
                    parent_block_hash,
                    (!compact).then_some(token_ids),
                    block_size,
                    lora_id,
                ))?,
                TrieEvent::Removed {
                    block_ids,
                    block_hashes,
                } => cls.removed.bind(py).call1((block_ids, block_hashes))?,
                TrieEvent::Moved {
                    block_ids,
                    block_hashes,
                    medium,
                } => cls
                    .moved
                    .bind(py)
                    .call1((block_ids, block_hashes, medium.name()))?,
            };
            out.append(obj)?;
        }
        Ok(out)
    }

    /// Every block by id (GPU and host blocks): block_id, cached, parent, tokens, lora_id,
    /// cache_salt, mm_keys, ref_cnt, priority.
    fn dump<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let blocks = self.with(py, |t| t.dump())?.py_err()?;
        let out = PyList::empty(py);
        for b in blocks {
            let d = PyDict::new(py);
            d.set_item("block_id", b.block_id)?;
            d.set_item("cached", b.cached)?;
            d.set_item("parent", b.parent)?;
            d.set_item("tokens", b.tokens)?;
            d.set_item("lora_id", b.lora_id)?;
            d.set_item("cache_salt", b.cache_salt)?;
            let mm = PyList::empty(py);
            for (h, off) in b.mm_keys {
                mm.append((PyBytes::new(py, &h), off))?;
            }
            d.set_item("mm_keys", mm)?;
            d.set_item("ref_cnt", b.ref_cnt)?;
            d.set_item("priority", b.priority)?;
            out.append(d)?;
        }
        Ok(out)
    }

    /// Checks every structural invariant; raises AssertionError on a violation.
    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |t| t.check_invariants())?
            .map_err(PyAssertionError::new_err)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        self.read(py, |t| {
            format!(
                "BlockTrie(num_blocks={}, tokens_per_block={}, free={}, cached={}, requests={})",
                t.num_blocks(),
                t.tokens_per_block(),
                t.num_free_blocks(),
                t.num_cached_blocks(),
                t.num_requests()
            )
        })
    }
}
