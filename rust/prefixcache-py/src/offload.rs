//! `CpuOffloadManager`: vLLM 0.33's CPU offloading tier (prefixcache_core::offload).
//! Argument and error mapping only.

use prefixcache_core::error::try_copy;
use prefixcache_core::hash::BlockHash;
use prefixcache_core::offload::{
    to_kv_events, CachePolicy, CpuOffloadManager, OffloadEvent, PrepareStoreOutput,
    DEFAULT_MAX_TRACKER_SIZE, MEDIUM_CPU,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::convert;
use crate::errors::IntoPyResult;
use crate::manager::PyKVCacheManager;
use crate::pool::{events_to_py, HashFormat};
use crate::shared::Shared;

// Every argument is converted by a `from_py_with` extractor, so that pyo3 converts them
// in argument order: the first bad argument is the one named (as the reference names
// it), and a later argument's hook (`__index__`) runs after the earlier ones were read.

/// The `keys` argument: a list or tuple of block hashes.
fn keys_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<BlockHash>> {
    convert::block_hash_list(obj, "keys")
}

/// The `cache_policy` argument: "lru" or "arc" (the name checked as it is read, before
/// the later arguments).
fn cache_policy_arg(obj: &Bound<'_, PyAny>) -> PyResult<CachePolicy> {
    CachePolicy::from_name(&convert::cache_policy(obj)?).py_err()
}

/// The `event_hash_format` argument: "u64" or "bytes" (checked as it is read).
fn event_hash_format_arg(obj: &Bound<'_, PyAny>) -> PyResult<HashFormat> {
    HashFormat::parse(&convert::event_hash_format(obj)?)
}

/// The `end_tokens` argument: ints in `[0, 2**63)`, any form.
fn end_tokens_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    convert::position_list(obj, "end_tokens")
}

fn bytes_list<'py>(py: Python<'py>, keys: &[BlockHash]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, keys.iter().map(|k| PyBytes::new(py, k.as_bytes())))
}

/// vLLM's `PrepareStoreOutput`: the keys to write now (in offer order), the chunk id
/// each gets, and the keys evicted to make room (in eviction order).
#[pyclass(frozen, module = "prefixcache._core", name = "PrepareStoreOutput")]
pub struct PyPrepareStoreOutput {
    inner: PrepareStoreOutput,
}

#[pymethods]
impl PyPrepareStoreOutput {
    #[getter]
    fn keys_to_store<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        bytes_list(py, &self.inner.keys_to_store)
    }

    #[getter]
    fn chunk_ids(&self) -> Vec<u64> {
        self.inner.chunk_ids.clone()
    }

    #[getter]
    fn evicted_keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        bytes_list(py, &self.inner.evicted_keys)
    }

    fn __repr__(&self) -> String {
        format!(
            "PrepareStoreOutput(keys_to_store=<{} keys>, chunk_ids={:?}, evicted_keys=<{} keys>)",
            self.inner.keys_to_store.len(),
            self.inner.chunk_ids,
            self.inner.evicted_keys.len()
        )
    }
}

/// vLLM's `OffloadingEvent`: keys stored (`removed=False`) or removed, medium "CPU".
/// `metadata_only`: a failed store released these keys (not an eviction).
#[pyclass(frozen, module = "prefixcache._core", name = "OffloadingEvent")]
pub struct PyOffloadingEvent {
    inner: OffloadEvent,
}

#[pymethods]
impl PyOffloadingEvent {
    #[getter]
    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        bytes_list(py, &self.inner.keys)
    }

    #[getter]
    fn removed(&self) -> bool {
        self.inner.removed
    }

    #[getter]
    fn medium(&self) -> &'static str {
        MEDIUM_CPU
    }

    #[getter]
    fn metadata_only(&self) -> bool {
        self.inner.metadata_only
    }

    fn __repr__(&self) -> String {
        format!(
            "OffloadingEvent(keys=<{} keys>, medium='CPU', removed={}, metadata_only={})",
            self.inner.keys.len(),
            if self.inner.removed { "True" } else { "False" },
            if self.inner.metadata_only {
                "True"
            } else {
                "False"
            },
        )
    }
}

/// vLLM 0.33's `CPUOffloadingManager` (SEMANTICS.md section 2.4).
#[pyclass(frozen, module = "prefixcache._core", name = "CpuOffloadManager")]
pub struct PyCpuOffloadManager {
    inner: Shared<CpuOffloadManager>,
}

#[pymethods]
impl PyCpuOffloadManager {
    #[new]
    #[pyo3(signature = (num_chunks, cache_policy = CachePolicy::Lru, store_threshold = 1, max_tracker_size = DEFAULT_MAX_TRACKER_SIZE, enable_events = false))]
    #[pyo3(
        text_signature = "(num_chunks, cache_policy='lru', store_threshold=1, max_tracker_size=64000, enable_events=False)"
    )]
    fn new(
        #[pyo3(from_py_with = convert::num_chunks)] num_chunks: usize,
        #[pyo3(from_py_with = cache_policy_arg)] cache_policy: CachePolicy,
        #[pyo3(from_py_with = convert::store_threshold)] store_threshold: u32,
        #[pyo3(from_py_with = convert::max_tracker_size)] max_tracker_size: usize,
        #[pyo3(from_py_with = convert::enable_events)] enable_events: bool,
    ) -> PyResult<Self> {
        let m = CpuOffloadManager::new(
            num_chunks as u64,
            cache_policy,
            store_threshold,
            max_tracker_size,
            enable_events,
        )
        .py_err()?;
        Ok(PyCpuOffloadManager {
            inner: Shared::new("CpuOffloadManager", m),
        })
    }

    #[getter]
    fn num_chunks(&self, py: Python<'_>) -> PyResult<u64> {
        self.inner.with(py, |m| m.num_chunks())
    }

    #[getter]
    fn cache_policy(&self, py: Python<'_>) -> PyResult<&'static str> {
        self.inner.with(py, |m| m.cache_policy().name())
    }

    #[getter]
    fn store_threshold(&self, py: Python<'_>) -> PyResult<u32> {
        self.inner.with(py, |m| m.store_threshold())
    }

    #[getter]
    fn max_tracker_size(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.with(py, |m| m.max_tracker_size())
    }

    #[getter]
    fn num_stored(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.with(py, |m| m.num_stored())
    }

    #[getter]
    fn num_free_chunks(&self, py: Python<'_>) -> PyResult<u64> {
        self.inner.with(py, |m| m.num_free_chunks())
    }

    #[getter]
    fn num_idle(&self, py: Python<'_>) -> PyResult<u64> {
        self.inner.with(py, |m| m.num_idle())
    }

    #[getter]
    fn num_write_pending(&self, py: Python<'_>) -> PyResult<u64> {
        self.inner.with(py, |m| m.num_write_pending())
    }

    #[getter]
    fn num_tracked(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.with(py, |m| m.num_tracked())
    }

    #[getter]
    fn num_stored_total(&self, py: Python<'_>) -> PyResult<u64> {
        self.inner.with(py, |m| m.num_stored_total())
    }

    #[getter]
    fn num_evicted_total(&self, py: Python<'_>) -> PyResult<u64> {
        self.inner.with(py, |m| m.num_evicted_total())
    }

    fn on_new_request(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = convert::request_id)] request_id: u64,
    ) -> PyResult<()> {
        self.inner
            .with(py, |m| m.on_new_request(request_id))?
            .py_err()
    }

    fn set_offload_key_positions(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = convert::request_id)] request_id: u64,
        #[pyo3(from_py_with = keys_arg)] keys: Vec<BlockHash>,
        #[pyo3(from_py_with = end_tokens_arg)] end_tokens: Vec<u64>,
    ) -> PyResult<()> {
        self.inner
            .with(py, |m| {
                m.set_offload_key_positions(request_id, &keys, &end_tokens)
            })?
            .py_err()
    }

    /// The request's keys in block order, key i ending at token (i + 1) * tokens_per_key
    /// (the connector's offload keys): the `*_range` calls name slices of them.
    fn set_request_keys(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = convert::request_id)] request_id: u64,
        #[pyo3(from_py_with = keys_arg)] keys: Vec<BlockHash>,
        #[pyo3(from_py_with = convert::tokens_per_key)] tokens_per_key: usize,
    ) -> PyResult<()> {
        let t = tokens_per_key as u64;
        self.inner
            .with(py, |m| m.set_request_keys(request_id, &keys, t))?
            .py_err()
    }

    /// `set_request_keys` with a KVCacheManager's request: its full blocks' hashes, its
    /// block size (read without Python objects per block). UnknownRequestError when the
    /// manager has no such request.
    fn set_request_keys_from(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = convert::kv_cache_manager)] manager: Bound<'_, PyKVCacheManager>,
        #[pyo3(from_py_with = convert::request_id)] request_id: u64,
    ) -> PyResult<()> {
        let mgr = manager.get();
        let (hashes, bs) = mgr
            .inner
            .with(py, |m| {
                m.block_hashes(request_id).and_then(|h| {
                    Ok((
                        try_copy(h, "the request's block hashes")?,
                        m.block_size() as u64,
                    ))
                })
            })?
            .py_err()?;
        self.inner
            .with(py, |m| m.set_request_keys(request_id, &hashes, bs))?
            .py_err()
    }

    /// `lookup_prefix` over the request's keys `start:stop`.
    fn lookup_prefix_range(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = convert::request_id)] request_id: u64,
        #[pyo3(from_py_with = convert::start)] start: usize,
        #[pyo3(from_py_with = convert::stop)] stop: usize,
    ) -> PyResult<Option<usize>> {
        self.inner
            .with(py, |m| m.lookup_prefix_range(request_id, start, stop))
    }

    /// `prepare_load` of the request's keys `start:stop`; returns how many were pinned.
    fn prepare_load_range(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = convert::request_id)] request_id: u64,
        #[pyo3(from_py_with = convert::start)] start: usize,
        #[pyo3(from_py_with = convert::stop)] stop: usize,
    ) -> PyResult<usize> {
        self.inner
            .with(py, |m| m.prepare_load_range(request_id, start, stop))?
            .py_err()
    }

    /// `complete_load` of the request's keys `start:stop`.
    fn complete_load_range(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = convert::request_id)] request_id: u64,
        #[pyo3(from_py_with = convert::start)] start: usize,
        #[pyo3(from_py_with = convert::stop)] stop: usize,
    ) -> PyResult<()> {
        self.inner
            .with(py, |m| m.complete_load_range(request_id, start, stop))?
            .py_err()
    }

    /// `prepare_store` of the request's keys `start:stop`: (how many keys were stored,
    /// how many evicted), or None when eviction cannot free enough. With `complete`, the
    /// stored keys' `complete_store` follows at once.
    #[pyo3(signature = (request_id, start, stop, complete = false))]
    fn prepare_store_range(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = convert::request_id)] request_id: u64,
        #[pyo3(from_py_with = convert::start)] start: usize,
        #[pyo3(from_py_with = convert::stop)] stop: usize,
        #[pyo3(from_py_with = convert::complete)] complete: bool,
    ) -> PyResult<Option<(usize, usize)>> {
        self.inner
            .with(py, |m| {
                m.prepare_store_range(request_id, start, stop, complete)
            })?
            .py_err()
    }

    fn lookup(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<&'static str> {
        let k = convert::block_hash_at(key, "key", None)?;
        self.inner.with(py, |m| m.lookup(&k).name())
    }

    fn lookup_prefix(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = keys_arg)] keys: Vec<BlockHash>,
    ) -> PyResult<Option<usize>> {
        self.inner.with(py, |m| m.lookup_prefix(&keys))
    }

    fn prepare_load(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = convert::request_id)] request_id: u64,
        #[pyo3(from_py_with = keys_arg)] keys: Vec<BlockHash>,
    ) -> PyResult<Vec<u64>> {
        self.inner
            .with(py, |m| m.prepare_load(request_id, &keys))?
            .py_err()
    }

    fn touch(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = convert::request_id)] request_id: u64,
        #[pyo3(from_py_with = keys_arg)] keys: Vec<BlockHash>,
    ) -> PyResult<()> {
        self.inner.with(py, |m| m.touch(request_id, &keys))
    }

    fn complete_load(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = convert::request_id)] request_id: u64,
        #[pyo3(from_py_with = keys_arg)] keys: Vec<BlockHash>,
    ) -> PyResult<()> {
        self.inner
            .with(py, |m| m.complete_load(request_id, &keys))?
            .py_err()
    }

    fn prepare_store(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = convert::request_id)] request_id: u64,
        #[pyo3(from_py_with = keys_arg)] keys: Vec<BlockHash>,
    ) -> PyResult<Option<PyPrepareStoreOutput>> {
        let out = self
            .inner
            .with(py, |m| m.prepare_store(request_id, &keys))?
            .py_err()?;
        Ok(out.map(|inner| PyPrepareStoreOutput { inner }))
    }

    #[pyo3(signature = (request_id, keys, success = true))]
    fn complete_store(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = convert::request_id)] request_id: u64,
        #[pyo3(from_py_with = keys_arg)] keys: Vec<BlockHash>,
        #[pyo3(from_py_with = convert::success)] success: bool,
    ) -> PyResult<()> {
        self.inner
            .with(py, |m| m.complete_store(request_id, &keys, success))?
            .py_err()
    }

    fn on_request_finished(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = convert::request_id)] request_id: u64,
    ) -> PyResult<()> {
        self.inner
            .with(py, |m| m.on_request_finished(request_id))?
            .py_err()
    }

    fn reset_cache(&self, py: Python<'_>) -> PyResult<()> {
        self.inner.with(py, |m| m.reset_cache())
    }

    fn take_events(&self, py: Python<'_>) -> PyResult<Vec<PyOffloadingEvent>> {
        let evs = self.inner.with(py, |m| m.take_events())?.py_err()?;
        Ok(evs
            .into_iter()
            .map(|inner| PyOffloadingEvent { inner })
            .collect())
    }

    /// The events since the last call as the KV events vLLM's OffloadingConnector
    /// publishes for them (`prefixcache.events`, medium "CPU"); `compact` merges runs of
    /// removals.
    #[pyo3(signature = (event_hash_format = HashFormat::U64, compact = false))]
    #[pyo3(text_signature = "($self, event_hash_format='u64', compact=False)")]
    fn take_kv_events<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = event_hash_format_arg)] event_hash_format: HashFormat,
        #[pyo3(from_py_with = convert::compact)] compact: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let evs = self.inner.with(py, |m| m.take_events())?.py_err()?;
        events_to_py(py, to_kv_events(&evs), event_hash_format, None, compact)
    }

    /// Raise AssertionError if an internal invariant is broken (for tests).
    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        self.inner
            .with(py, |m| m.check_invariants())?
            .map_err(pyo3::exceptions::PyAssertionError::new_err)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        self.inner.with(py, |m| {
            format!(
                "CpuOffloadManager(num_chunks={}, cache_policy='{}', store_threshold={}, stored={})",
                m.num_chunks(),
                m.cache_policy().name(),
                m.store_threshold(),
                m.num_stored()
            )
        })
    }
}
