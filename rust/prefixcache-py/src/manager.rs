//! `KVCacheManager`: vLLM v1's request-level KV-cache manager
//! (prefixcache_core::blocks::manager). Argument and error mapping only.

use numpy::PyArray1;
use prefixcache_core::blocks::{KVCacheManager, PrefixCacheStats, RequestOptions};
use prefixcache_core::hash::{BlockHasher, HashAlgo, KeyValue};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::convert;
use crate::convert::Tokens;
use crate::errors::IntoPyResult;
use crate::hasher::{all_block_keys, block_keys};
use crate::pool::{
    block_ids, event_hash_format_arg, events_to_py, ids_array, pool_num_blocks, HashFormat,
    DETACH_MIN_BLOCKS,
};
use crate::shared::Shared;

/// Token counts from which `add_request`, `admit`, `append_tokens` and `finish` run with
/// the GIL released: hashing costs ~3 (xxh3) to ~7 (sha256) ns per token, so from 1024
/// tokens the call does >= ~3-7 us of work, against ~35 ns for releasing the GIL and
/// ~0.05 ns per token for copying the prompt (docs/BENCHMARKS.md, "Threads and the GIL").
const DETACH_MIN_TOKENS: usize = 1024;

use crate::convert::request_id as rid;

fn stats_dict<'py>(py: Python<'py>, s: PrefixCacheStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("requests", s.requests)?;
    d.set_item("queries", s.queries)?;
    d.set_item("hits", s.hits)?;
    d.set_item("preempted_requests", s.preempted_requests)?;
    d.set_item("preempted_queries", s.preempted_queries)?;
    d.set_item("preempted_hits", s.preempted_hits)?;
    d.set_item("reset", s.reset)?;
    Ok(d)
}

// Every argument is converted by a `from_py_with` extractor, so that pyo3 converts them
// in argument order: the first bad argument is the one named (as the reference names
// it), and a later argument's hook (`__index__`) runs after the earlier ones were read
// (what it changes in them is not seen).

/// The `hash_algo` argument: one of the algorithm names (checked as it is read, before
/// the later arguments).
fn hash_algo_arg(obj: &Bound<'_, PyAny>) -> PyResult<HashAlgo> {
    HashAlgo::from_name(&convert::str_arg(obj, "hash_algo")?).py_err()
}

/// The `sliding_window` argument: None, or a window of at least 2 tokens (checked as it
/// is read, as the core checks it).
fn sliding_window_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
    let window = convert::sliding_window(obj)?;
    if let Some(w) = window.filter(|&w| w < 2) {
        return Err(crate::errors::invalid_input(format!(
            "sliding_window must be >= 2 tokens, got {w}"
        )));
    }
    Ok(window)
}

/// The `prompt_tokens` argument: token ids, any form.
fn prompt_tokens_arg(obj: &Bound<'_, PyAny>) -> PyResult<Tokens> {
    convert::tokens(obj, "prompt_tokens")
}

/// The `tokens` argument: token ids, any form.
fn tokens_arg(obj: &Bound<'_, PyAny>) -> PyResult<Tokens> {
    convert::tokens(obj, "tokens")
}

/// The `output_tokens` argument: token ids, any form, or None (no output).
fn output_tokens_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<Tokens>> {
    if obj.is_none() {
        return Ok(None);
    }
    convert::tokens(obj, "output_tokens").map(Some)
}

/// The `extra_keys` argument: None, or one entry per block.
fn extra_keys_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<Vec<Option<Vec<KeyValue>>>>> {
    all_block_keys(Some(obj))
}

/// The `default_extra_keys` argument: None, or a tuple of key values.
fn default_extra_keys_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<Vec<KeyValue>>> {
    if obj.is_none() {
        return Ok(None);
    }
    block_keys(obj, "default_extra_keys")
}

/// The `new_computed_blocks` argument: block ids, any form, or None (no hit).
fn new_computed_blocks_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    if obj.is_none() {
        return Ok(Vec::new());
    }
    block_ids(obj, "new_computed_blocks")
}

/// The `request_ids` argument: ints in `[0, 2**64)`, any form.
fn request_ids_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    convert::u64_list(obj, "request_ids")
}

/// The `counts` argument: ints in `[0, 2**64)`, any form.
fn counts_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    convert::u64_list(obj, "counts")
}

/// The `block_ids` argument: block ids, any form.
fn block_ids_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    block_ids(obj, "block_ids")
}

/// vLLM v1's request-level KV-cache manager over one block pool (one KV-cache group,
/// full attention or sliding window). Request ids are ints in [0, 2**64).
#[pyclass(frozen, module = "prefixcache._core", name = "KVCacheManager")]
pub struct PyKVCacheManager {
    pub(crate) inner: Shared<KVCacheManager>,
    fmt: HashFormat,
    /// Immutable after construction: read without the lock.
    block_size: usize,
}

/// Per-request block counts as an int64 array.
fn counts_array(py: Python<'_>, counts: Vec<u64>) -> Bound<'_, PyArray1<i64>> {
    let counts = counts
        .into_iter()
        .map(|e| i64::try_from(e).unwrap_or(i64::MAX))
        .collect();
    convert::i64_array(py, counts)
}

impl PyKVCacheManager {
    /// `f(manager, request id, tokens)`, the GIL released for long token lists.
    fn with_request_tokens(
        &self,
        py: Python<'_>,
        request_id: u64,
        tokens: Tokens,
        f: impl FnOnce(&mut KVCacheManager, u64, &[u32]) -> prefixcache_core::Result<()> + Send,
    ) -> PyResult<()> {
        let t = tokens.as_slice();
        self.inner
            .with_gil_released_if(py, t.len() >= DETACH_MIN_TOKENS, |m| f(m, request_id, t))?
            .py_err()
    }
}

#[pymethods]
impl PyKVCacheManager {
    #[new]
    #[pyo3(signature = (num_blocks, block_size = 16, hash_algo = HashAlgo::Sha256, enable_caching = true, sliding_window = None, enable_kv_cache_events = false, seed = None, event_hash_format = HashFormat::U64))]
    #[pyo3(
        text_signature = "(num_blocks, block_size=16, hash_algo='sha256', enable_caching=True, sliding_window=None, enable_kv_cache_events=False, seed=None, event_hash_format='u64')"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        #[pyo3(from_py_with = pool_num_blocks)] num_blocks: usize,
        #[pyo3(from_py_with = convert::block_size)] block_size: usize,
        #[pyo3(from_py_with = hash_algo_arg)] hash_algo: HashAlgo,
        #[pyo3(from_py_with = convert::enable_caching)] enable_caching: bool,
        #[pyo3(from_py_with = sliding_window_arg)] sliding_window: Option<usize>,
        #[pyo3(from_py_with = convert::enable_kv_cache_events)] enable_kv_cache_events: bool,
        #[pyo3(from_py_with = convert::seed)] seed: Option<String>,
        #[pyo3(from_py_with = event_hash_format_arg)] event_hash_format: HashFormat,
    ) -> PyResult<Self> {
        let seed = convert::seed_or_default(seed);
        let hasher = BlockHasher::new(hash_algo, block_size, &seed).py_err()?;
        let mgr = KVCacheManager::new(
            num_blocks,
            hasher,
            enable_caching,
            sliding_window,
            enable_kv_cache_events,
        )
        .py_err()?;
        Ok(PyKVCacheManager {
            inner: Shared::new("KVCacheManager", mgr),
            fmt: event_hash_format,
            block_size,
        })
    }

    #[getter]
    fn num_blocks(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.with(py, |m| m.pool().num_blocks())
    }

    #[getter]
    fn block_size(&self) -> usize {
        self.block_size
    }

    #[getter]
    fn sliding_window(&self, py: Python<'_>) -> PyResult<Option<usize>> {
        self.inner.with(py, |m| m.sliding_window())
    }

    #[getter]
    fn enable_caching(&self, py: Python<'_>) -> PyResult<bool> {
        self.inner.with(py, |m| m.enable_caching())
    }

    #[getter]
    fn num_free_blocks(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.with(py, |m| m.pool().num_free_blocks())
    }

    /// Cached blocks whose hash was dropped because the block was reused (evictions).
    #[getter]
    fn num_evicted_blocks(&self, py: Python<'_>) -> PyResult<u64> {
        self.inner.with(py, |m| m.pool().num_evicted_blocks())
    }

    /// Blocks that carry a hash now: what the prefix cache holds.
    #[getter]
    fn num_cached_blocks(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.with(py, |m| m.pool().num_cached_blocks())
    }

    /// Blocks that were ever handed out or hit: the pool's memory follows this count,
    /// not `num_blocks`.
    #[getter]
    fn num_touched_blocks(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.with(py, |m| m.pool().num_touched_blocks())
    }

    #[getter]
    fn usage(&self, py: Python<'_>) -> PyResult<f64> {
        self.inner.with(py, |m| m.usage())
    }

    /// Prefix-cache stats (vLLM's PrefixCacheStats fields) as a dict, since construction
    /// or the last `take_stats()`, which resets them.
    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.with(py, |m| m.stats())?;
        stats_dict(py, s)
    }

    /// The stats since the last call, resetting them (vLLM's make_prefix_cache_stats).
    fn take_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.with(py, |m| m.take_stats())?;
        stats_dict(py, s)
    }

    #[pyo3(signature = (request_id, prompt_tokens, extra_keys = None, default_extra_keys = None, lora_id = None, lora_name = None))]
    #[allow(clippy::too_many_arguments)]
    fn add_request(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = rid)] request_id: u64,
        #[pyo3(from_py_with = prompt_tokens_arg)] prompt_tokens: Tokens,
        #[pyo3(from_py_with = extra_keys_arg)] extra_keys: Option<Vec<Option<Vec<KeyValue>>>>,
        #[pyo3(from_py_with = default_extra_keys_arg)] default_extra_keys: Option<Vec<KeyValue>>,
        #[pyo3(from_py_with = convert::lora_id)] lora_id: Option<i64>,
        #[pyo3(from_py_with = convert::lora_name)] lora_name: Option<String>,
    ) -> PyResult<()> {
        let tokens = prompt_tokens;
        let opts = RequestOptions {
            block_extra_keys: extra_keys.unwrap_or_default(),
            default_extra_keys,
            lora_id,
            lora_name,
        };
        let long = tokens.len() >= DETACH_MIN_TOKENS;
        // The request keeps the buffer the tokens were read into (no copy).
        let t = tokens.into_vec();
        self.inner
            .with_gil_released_if(py, long, |m| m.add_request_owned(request_id, t, opts))?
            .py_err()
    }

    fn append_tokens(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = rid)] request_id: u64,
        #[pyo3(from_py_with = tokens_arg)] tokens: Tokens,
    ) -> PyResult<()> {
        self.with_request_tokens(py, request_id, tokens, KVCacheManager::append_tokens)
    }

    /// (hit block ids, hit length in tokens); null blocks (0) mark skipped window blocks.
    fn get_computed_blocks<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = rid)] request_id: u64,
    ) -> PyResult<(Bound<'py, PyArray1<i64>>, usize)> {
        let (blocks, hit) = self
            .inner
            .with(py, |m| m.get_computed_blocks(request_id))?
            .py_err()?;
        Ok((ids_array(py, &blocks)?, hit))
    }

    #[pyo3(
        signature = (request_id, num_new_tokens, num_new_computed_tokens = 0, new_computed_blocks = Vec::new(), num_lookahead_tokens = 0),
        text_signature = "($self, request_id, num_new_tokens, num_new_computed_tokens=0, new_computed_blocks=None, num_lookahead_tokens=0)"
    )]
    fn allocate_slots<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = rid)] request_id: u64,
        #[pyo3(from_py_with = convert::num_new_tokens)] num_new_tokens: usize,
        #[pyo3(from_py_with = convert::num_new_computed_tokens)] num_new_computed_tokens: usize,
        #[pyo3(from_py_with = new_computed_blocks_arg)] new_computed_blocks: Vec<u32>,
        #[pyo3(from_py_with = convert::num_lookahead_tokens)] num_lookahead_tokens: usize,
    ) -> PyResult<Option<Bound<'py, PyArray1<i64>>>> {
        let (hit_blocks, lookahead) = (new_computed_blocks, num_lookahead_tokens);
        let (new, computed) = (num_new_tokens, num_new_computed_tokens);
        let blocks = new.saturating_add(lookahead) / self.block_size.max(1);
        let long = blocks.max(hit_blocks.len()) >= DETACH_MIN_BLOCKS;
        let got = self
            .inner
            .with_gil_released_if(py, long, |m| {
                m.allocate_slots(request_id, new, computed, &hit_blocks, lookahead)
            })?
            .py_err()?;
        got.map(|ids| ids_array(py, &ids)).transpose()
    }

    fn free(&self, py: Python<'_>, #[pyo3(from_py_with = rid)] request_id: u64) -> PyResult<()> {
        self.inner.with(py, |m| m.free(request_id))?.py_err()
    }

    fn preempt(&self, py: Python<'_>, #[pyo3(from_py_with = rid)] request_id: u64) -> PyResult<()> {
        self.inner.with(py, |m| m.preempt(request_id))?.py_err()
    }

    /// add_request + get_computed_blocks + allocate_slots(prompt remainder, lookahead):
    /// (hit tokens, the request's block ids), or None (request forgotten) when short.
    #[pyo3(
        signature = (request_id, prompt_tokens, num_lookahead_tokens = 0, extra_keys = None, default_extra_keys = None, lora_id = None, lora_name = None),
        text_signature = "($self, request_id, prompt_tokens, num_lookahead_tokens=0, extra_keys=None, default_extra_keys=None, lora_id=None, lora_name=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn admit<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = rid)] request_id: u64,
        #[pyo3(from_py_with = prompt_tokens_arg)] prompt_tokens: Tokens,
        #[pyo3(from_py_with = convert::num_lookahead_tokens)] num_lookahead_tokens: usize,
        #[pyo3(from_py_with = extra_keys_arg)] extra_keys: Option<Vec<Option<Vec<KeyValue>>>>,
        #[pyo3(from_py_with = default_extra_keys_arg)] default_extra_keys: Option<Vec<KeyValue>>,
        #[pyo3(from_py_with = convert::lora_id)] lora_id: Option<i64>,
        #[pyo3(from_py_with = convert::lora_name)] lora_name: Option<String>,
    ) -> PyResult<Option<(usize, Bound<'py, PyArray1<i64>>)>> {
        let (tokens, lookahead) = (prompt_tokens, num_lookahead_tokens);
        let opts = RequestOptions {
            block_extra_keys: extra_keys.unwrap_or_default(),
            default_extra_keys,
            lora_id,
            lora_name,
        };
        let long = tokens.len() >= DETACH_MIN_TOKENS;
        // The request keeps the buffer the tokens were read into (no copy).
        let t = tokens.into_vec();
        let got = self
            .inner
            .with_gil_released_if(py, long, |m| m.admit_owned(request_id, t, opts, lookahead))?
            .py_err()?;
        got.map(|a| Ok((a.num_hit_tokens, ids_array(py, &a.block_ids)?)))
            .transpose()
    }

    /// append_tokens(output) + allocate_slots(len(output)) + free. False when the pool
    /// could not take the output (nothing of it cached); the request is freed either way.
    #[pyo3(signature = (request_id, output_tokens = None))]
    fn finish(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = rid)] request_id: u64,
        #[pyo3(from_py_with = output_tokens_arg)] output_tokens: Option<Tokens>,
    ) -> PyResult<bool> {
        let out: &[u32] = output_tokens.as_ref().map(|t| t.as_slice()).unwrap_or(&[]);
        self.inner
            .with_gil_released_if(py, out.len() >= DETACH_MIN_TOKENS, |m| {
                m.finish(request_id, out)
            })?
            .py_err()
    }

    /// append_tokens + allocate_slots for several running requests in one call (decode
    /// steps): request_ids[j] takes the next counts[j] of tokens. Stops at the first
    /// request the pool cannot take (which changes nothing). (blocks each applied item
    /// evicted, as an int64 array as long as the items applied; the most cached blocks
    /// before the first item or after any applied one).
    fn extend<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = request_ids_arg)] request_ids: Vec<u64>,
        #[pyo3(from_py_with = tokens_arg)] tokens: Tokens,
        #[pyo3(from_py_with = counts_arg)] counts: Vec<u64>,
    ) -> PyResult<(Bound<'py, PyArray1<i64>>, usize)> {
        let ids = request_ids;
        if ids.len() != counts.len() {
            return Err(crate::errors::invalid_input(format!(
                "request_ids has {} items but counts has {}",
                ids.len(),
                counts.len()
            )));
        }
        let items: Vec<(u64, usize)> = ids
            .into_iter()
            .zip(counts)
            .map(|(i, n)| (i, usize::try_from(n).unwrap_or(usize::MAX)))
            .collect();
        let t = tokens.as_slice();
        let (evicted, peak) = self
            .inner
            .with_gil_released_if(py, t.len() >= DETACH_MIN_TOKENS, |m| m.extend(&items, t))?
            .py_err()?;
        Ok((counts_array(py, evicted), peak))
    }

    fn block_ids<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = rid)] request_id: u64,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let ids = self
            .inner
            .with(py, |m| m.block_ids(request_id).map(<[u32]>::to_vec))?
            .py_err()?;
        ids_array(py, &ids)
    }

    /// Queue tokens that the request appends over its next decode steps (decode_steps).
    fn queue_tokens(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = rid)] request_id: u64,
        #[pyo3(from_py_with = tokens_arg)] tokens: Tokens,
    ) -> PyResult<()> {
        self.with_request_tokens(py, request_id, tokens, KVCacheManager::queue_tokens)
    }

    fn num_queued_tokens(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = rid)] request_id: u64,
    ) -> PyResult<usize> {
        self.inner
            .with(py, |m| m.num_queued_tokens(request_id))?
            .py_err()
    }

    /// num_steps decode steps of each request, in order: its next queued tokens appended
    /// and computed. (blocks each applied request evicted, int64 array; the most cached
    /// blocks before the first or after any applied request).
    fn decode_steps<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = request_ids_arg)] request_ids: Vec<u64>,
        #[pyo3(from_py_with = convert::num_steps)] num_steps: usize,
    ) -> PyResult<(Bound<'py, PyArray1<i64>>, usize)> {
        let ids = request_ids;
        let (evicted, peak) = self
            .inner
            .with(py, |m| m.decode_steps(&ids, num_steps))?
            .py_err()?;
        Ok((counts_array(py, evicted), peak))
    }

    /// The most decode steps (<= max_steps) every request can take with the free blocks.
    fn max_decode_steps(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = request_ids_arg)] request_ids: Vec<u64>,
        #[pyo3(from_py_with = convert::max_steps)] max_steps: usize,
    ) -> PyResult<usize> {
        let ids = request_ids;
        self.inner
            .with(py, |m| m.max_decode_steps(&ids, max_steps))?
            .py_err()
    }

    fn num_tokens(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = rid)] request_id: u64,
    ) -> PyResult<usize> {
        self.inner.with(py, |m| m.num_tokens(request_id))?.py_err()
    }

    fn num_computed_tokens(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = rid)] request_id: u64,
    ) -> PyResult<usize> {
        self.inner
            .with(py, |m| m.num_computed_tokens(request_id))?
            .py_err()
    }

    fn block_hashes<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = rid)] request_id: u64,
    ) -> PyResult<Bound<'py, PyList>> {
        let hashes = self
            .inner
            .with(py, |m| m.block_hashes(request_id).map(<[_]>::to_vec))?
            .py_err()?;
        PyList::new(py, hashes.iter().map(|h| PyBytes::new(py, h.as_bytes())))
    }

    fn __contains__(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        let Ok(request_id) = rid(request_id) else {
            return Ok(false);
        };
        self.inner.with(py, |m| m.contains(request_id))
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.with(py, |m| m.num_requests())
    }

    /// O(num_blocks): runs with the GIL released.
    fn reset_prefix_cache(&self, py: Python<'_>) -> PyResult<bool> {
        self.inner
            .with_gil_released(py, |m| m.reset_prefix_cache())?
            .py_err()
    }

    fn evict_blocks(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = block_ids_arg)] block_ids: Vec<u32>,
    ) -> PyResult<()> {
        let ids = block_ids;
        let long = ids.len() >= DETACH_MIN_BLOCKS;
        self.inner
            .with_gil_released_if(py, long, |m| m.evict_blocks(&ids))?
            .py_err()
    }

    /// The KV events since the last call, as vLLM publishes them; `compact`: without
    /// token ids and with runs of removals merged (what a router's index needs).
    #[pyo3(signature = (compact=false))]
    fn take_events<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = convert::compact)] compact: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let (events, window) = self.inner.with(py, |m| {
            let evs = if compact {
                Ok(m.take_events_merged())
            } else {
                m.take_events()
            };
            (evs, m.sliding_window())
        })?;
        let events = events.py_err()?;
        let spec = match window {
            None => ("full_attention", None),
            Some(w) => ("sliding_window", Some(w)),
        };
        events_to_py(py, events, self.fmt, Some(spec), compact)
    }

    fn free_block_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let ids = self
            .inner
            .with_gil_released(py, |m| m.pool().free_block_ids())?
            .py_err()?;
        ids_array(py, &ids)
    }

    fn ref_cnt(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = convert::block_id)] block_id: u32,
    ) -> PyResult<u32> {
        let id = block_id;
        self.inner.with(py, |m| m.pool().ref_cnt(id))?.py_err()
    }

    fn block_hash<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = convert::block_id)] block_id: u32,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let id = block_id;
        let key = self.inner.with(py, |m| m.pool().block_key(id))?.py_err()?;
        Ok(key.map(|k| PyBytes::new(py, k.hash.as_bytes())))
    }

    /// Raise AssertionError if an internal invariant is broken (for tests).
    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        self.inner
            .with_gil_released(py, |m| m.check_invariants())?
            .map_err(pyo3::exceptions::PyAssertionError::new_err)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        self.inner.with(py, |g| {
            format!(
                "KVCacheManager(num_blocks={}, block_size={}, sliding_window={:?}, requests={}, num_free_blocks={})",
                g.pool().num_blocks(),
                g.block_size(),
                g.sliding_window(),
                g.num_requests(),
                g.pool().num_free_blocks()
            )
        })
    }
}
