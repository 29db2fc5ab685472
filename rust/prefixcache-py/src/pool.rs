//! `BlockPool`: vLLM v1's block pool (prefixcache_core::blocks::pool) and the KV-event
//! conversion shared with `KVCacheManager`. Argument and error mapping only.

use numpy::PyArray1;
use prefixcache_core::blocks::{BlockPool, StoreInfo};
use prefixcache_core::error::try_vec;
use prefixcache_core::events::{coalesce_removals, KvEvent};
use prefixcache_core::hash::{BlockHash, KeyValue};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple, PyType};

use crate::convert;
use crate::errors::{invalid_input, invalid_type, IntoPyResult};
use crate::hasher::all_block_keys;
use crate::shared::Shared;

/// Block counts from which block-level calls (`get_new_blocks`, `free_blocks`, `touch`,
/// `evict_blocks`, `cache_full_blocks`, `allocate_slots`) run with the GIL released:
/// from 256 blocks (~20 ns each) a call does >= ~5 us of work (docs/BENCHMARKS.md,
/// "Threads and the GIL").
pub const DETACH_MIN_BLOCKS: usize = 256;

/// How KV events report block hashes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashFormat {
    /// vLLM's default: the last 8 bytes read big-endian.
    U64,
    Bytes,
}

impl HashFormat {
    pub fn parse(s: &str) -> PyResult<Self> {
        match s {
            "u64" => Ok(HashFormat::U64),
            "bytes" => Ok(HashFormat::Bytes),
            _ => Err(invalid_input(format!(
                "event_hash_format must be 'u64' or 'bytes', got {s:?}"
            ))),
        }
    }

    fn hash<'py>(self, py: Python<'py>, h: &BlockHash) -> PyResult<Bound<'py, PyAny>> {
        Ok(match self {
            HashFormat::U64 => h.to_u64().into_pyobject(py)?.into_any(),
            HashFormat::Bytes => PyBytes::new(py, h.as_bytes()).into_any(),
        })
    }

    /// An event's hashes: a list, or for compact events of u64 hashes a uint64 array
    /// (what a fleet index reads fastest).
    fn hashes<'py>(
        self,
        py: Python<'py>,
        hs: &[BlockHash],
        compact: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        if compact && matches!(self, HashFormat::U64) {
            let words: Vec<u64> = hs.iter().map(BlockHash::to_u64).collect();
            return Ok(PyArray1::from_vec(py, words).into_any());
        }
        let out = PyList::empty(py);
        for h in hs {
            out.append(self.hash(py, h)?)?;
        }
        Ok(out.into_any())
    }
}

struct EventClasses {
    stored: Py<PyType>,
    removed: Py<PyType>,
    cleared: Py<PyType>,
}

static EVENT_CLASSES: PyOnceLock<EventClasses> = PyOnceLock::new();

fn event_classes(py: Python<'_>) -> PyResult<&EventClasses> {
    EVENT_CLASSES.get_or_try_init(py, || {
        let m = py.import("prefixcache.events")?;
        let get =
            |n: &str| -> PyResult<Py<PyType>> { Ok(m.getattr(n)?.cast_into::<PyType>()?.unbind()) };
        Ok(EventClasses {
            stored: get("BlockStored")?,
            removed: get("BlockRemoved")?,
            cleared: get("AllBlocksCleared")?,
        })
    })
}

/// An extra-key value as the Python object it was made from.
fn key_value_to_py<'py>(py: Python<'py>, v: &KeyValue) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        KeyValue::None => py.None().into_bound(py),
        KeyValue::Bool(b) => pyo3::types::PyBool::new(py, *b).to_owned().into_any(),
        KeyValue::Int(i) => i.into_pyobject(py)?.into_any(),
        KeyValue::BigInt(b) => match b.to_i128() {
            Some(i) => i.into_pyobject(py)?.into_any(),
            None => {
                let n = b.bit_length() / 8 + 1;
                let kwargs = PyDict::new(py);
                kwargs.set_item("signed", true)?;
                py.get_type::<pyo3::types::PyInt>().call_method(
                    "from_bytes",
                    (PyBytes::new(py, &b.to_signed_le(n)), "little"),
                    Some(&kwargs),
                )?
            }
        },
        KeyValue::Str(s) => s.into_pyobject(py)?.into_any(),
        KeyValue::Bytes(b) => PyBytes::new(py, b).into_any(),
        KeyValue::Tuple(items) => {
            let objs = items
                .iter()
                .map(|x| key_value_to_py(py, x))
                .collect::<PyResult<Vec<_>>>()?;
            PyTuple::new(py, objs)?.into_any()
        }
    })
}

/// The KV-cache spec a manager reports in its `BlockStored` events
/// (`kv_cache_spec_kind`, `kv_cache_spec_sliding_window`); `None` for a bare pool.
pub type SpecInfo = Option<(&'static str, Option<usize>)>;

/// Core events as `prefixcache.events` dataclasses. `compact`: `BlockStored.token_ids`
/// is `None` and runs of `BlockRemoved` are merged (`coalesce_removals`): the same
/// index state at a fraction of the objects, for a router that reads only hashes.
pub fn events_to_py<'py>(
    py: Python<'py>,
    events: Vec<KvEvent>,
    fmt: HashFormat,
    spec: SpecInfo,
    compact: bool,
) -> PyResult<Bound<'py, PyList>> {
    let with_token_ids = !compact;
    let events = if compact {
        coalesce_removals(events)
    } else {
        events
    };
    let cls = event_classes(py)?;
    let out = PyList::empty(py);
    for ev in events {
        let obj = match ev {
            KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_id,
                lora_name,
                group_idx,
                extra_keys,
                medium,
            } => {
                let keys = match extra_keys {
                    None => None,
                    Some(per_block) => {
                        let l = PyList::empty(py);
                        for k in &per_block {
                            match k {
                                None => l.append(py.None())?,
                                Some(items) => {
                                    l.append(key_value_to_py(py, &KeyValue::Tuple(items.clone()))?)?
                                }
                            }
                        }
                        Some(l)
                    }
                };
                let hashes = fmt.hashes(py, &block_hashes, compact)?;
                let parent = match parent_block_hash {
                    Some(p) => Some(fmt.hash(py, &p)?),
                    None => None,
                };
                cls.stored.bind(py).call1((
                    hashes,
                    parent,
                    if with_token_ids {
                        PyList::new(py, token_ids)?.into_any()
                    } else {
                        py.None().into_bound(py)
                    },
                    block_size,
                    lora_id,
                    medium.as_str(),
                    lora_name,
                    keys,
                    group_idx,
                    spec.map(|s| s.0),
                    spec.and_then(|s| s.1),
                ))?
            }
            KvEvent::BlockRemoved {
                block_hashes,
                group_idx,
                medium,
            } => {
                let hashes = fmt.hashes(py, &block_hashes, compact)?;
                cls.removed
                    .bind(py)
                    .call1((hashes, medium.as_str(), group_idx))?
            }
            KvEvent::AllBlocksCleared => cls.cleared.bind(py).call0()?,
        };
        out.append(obj)?;
    }
    Ok(out)
}

/// Block ids from any int sequence / integer array.
pub fn block_ids(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u32>> {
    convert::u32_list(obj, what)
}

/// A block hash from `bytes` (1..=32 bytes).
pub fn block_hash(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<BlockHash> {
    let Ok(b) = obj.cast::<PyBytes>() else {
        let tn = crate::convert::type_name(obj);
        return Err(invalid_type(format!("{what} must be bytes, not {tn}")));
    };
    let bytes = b.as_bytes();
    if bytes.is_empty() || bytes.len() > 32 {
        return Err(invalid_input(format!(
            "{what} has {} bytes: a block hash has 1 to 32 bytes",
            bytes.len()
        )));
    }
    BlockHash::from_bytes(bytes)
        .ok_or_else(|| invalid_input(format!("{what} is longer than 32 bytes")))
}

// Every argument is converted by a `from_py_with` extractor, so that pyo3 converts them
// in argument order: the first bad argument is the one named (as the reference names
// it), and a later argument's hook (`__index__`) runs after the earlier ones were read.

/// The largest pool: block ids are u32, with room for the core's sentinels.
const MAX_NUM_BLOCKS: usize = (u32::MAX - 3) as usize;

/// A pool's `num_blocks` argument (`BlockPool`, `KVCacheManager`): an int in
/// `[1, 2**32 - 4]`, checked as it is read (as the core checks it).
pub fn pool_num_blocks(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    let n = convert::num_blocks(obj)?;
    if n == 0 || n > MAX_NUM_BLOCKS {
        return Err(invalid_input(format!(
            "num_blocks must be in [1, {MAX_NUM_BLOCKS}], got {n}"
        )));
    }
    Ok(n)
}

/// The `event_hash_format` argument: "u64" or "bytes" (checked as it is read).
pub fn event_hash_format_arg(obj: &Bound<'_, PyAny>) -> PyResult<HashFormat> {
    HashFormat::parse(&convert::event_hash_format(obj)?)
}

fn group_ids(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    convert::u32_list(obj, "group_ids")
}

/// The `block_ids` argument: block ids, any form.
fn block_ids_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    block_ids(obj, "block_ids")
}

/// The `block_hashes` argument: an iterable of block hashes.
fn block_hashes_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<BlockHash>> {
    let mut hashes = Vec::new();
    let it = convert::iter_of(obj, "block_hashes", "an iterable of block hashes")?;
    for (i, h) in it.enumerate() {
        hashes.push(block_hash(&h?, &format!("block_hashes[{i}]"))?);
    }
    Ok(hashes)
}

/// The `block_hash` argument: one block hash.
fn block_hash_arg(obj: &Bound<'_, PyAny>) -> PyResult<BlockHash> {
    block_hash(obj, "block_hash")
}

/// The `token_ids` argument: token ids, any form, or None.
fn token_ids_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<convert::Tokens>> {
    if obj.is_none() {
        return Ok(None);
    }
    convert::tokens(obj, "token_ids").map(Some)
}

/// The `extra_keys` argument: None, or one entry per block.
fn extra_keys_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<Vec<Option<Vec<KeyValue>>>>> {
    all_block_keys(Some(obj))
}

/// Block ids as an int64 array; `MemoryError` when it cannot be allocated.
pub fn ids_array<'py>(py: Python<'py>, ids: &[u32]) -> PyResult<Bound<'py, PyArray1<i64>>> {
    let mut v = try_vec(ids.len(), "the block ids").py_err()?;
    v.extend(ids.iter().map(|&b| i64::from(b)));
    Ok(convert::i64_array(py, v))
}

/// vLLM v1's block pool: N blocks, block 0 reserved as the null block, an LRU free queue
/// and a prefix-cache table from (hash, group) to blocks.
#[pyclass(frozen, module = "prefixcache._core", name = "BlockPool")]
pub struct PyBlockPool {
    inner: Shared<BlockPool>,
    fmt: HashFormat,
}

#[pymethods]
impl PyBlockPool {
    #[new]
    #[pyo3(signature = (num_blocks, enable_caching = true, enable_kv_cache_events = false, event_hash_format = HashFormat::U64))]
    #[pyo3(
        text_signature = "(num_blocks, enable_caching=True, enable_kv_cache_events=False, event_hash_format='u64')"
    )]
    fn new(
        #[pyo3(from_py_with = pool_num_blocks)] num_blocks: usize,
        #[pyo3(from_py_with = convert::enable_caching)] enable_caching: bool,
        #[pyo3(from_py_with = convert::enable_kv_cache_events)] enable_kv_cache_events: bool,
        #[pyo3(from_py_with = event_hash_format_arg)] event_hash_format: HashFormat,
    ) -> PyResult<Self> {
        let fmt = event_hash_format;
        let n = num_blocks;
        Ok(PyBlockPool {
            inner: Shared::new(
                "BlockPool",
                BlockPool::new(n, enable_caching, enable_kv_cache_events).py_err()?,
            ),
            fmt,
        })
    }

    #[getter]
    fn num_blocks(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.with(py, |p| p.num_blocks())
    }

    #[getter]
    fn num_free_blocks(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.with(py, |p| p.num_free_blocks())
    }

    /// Cached blocks whose hash was dropped because the block was reused (evictions).
    #[getter]
    fn num_evicted_blocks(&self, py: Python<'_>) -> PyResult<u64> {
        self.inner.with(py, |p| p.num_evicted_blocks())
    }

    /// Blocks that carry a hash now: what the prefix cache holds.
    #[getter]
    fn num_cached_blocks(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.with(py, |p| p.num_cached_blocks())
    }

    /// Blocks that were ever handed out or hit: the pool's memory follows this count,
    /// not `num_blocks`.
    #[getter]
    fn num_touched_blocks(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.with(py, |p| p.num_touched_blocks())
    }

    #[getter]
    fn usage(&self, py: Python<'_>) -> PyResult<f64> {
        self.inner.with(py, |p| p.usage())
    }

    #[getter]
    fn enable_caching(&self, py: Python<'_>) -> PyResult<bool> {
        self.inner.with(py, |p| p.enable_caching())
    }

    fn get_new_blocks<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = convert::num_blocks)] num_blocks: usize,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let n = num_blocks;
        let ids = self
            .inner
            .with_gil_released_if(py, n >= DETACH_MIN_BLOCKS, |p| p.get_new_blocks(n))?
            .py_err()?;
        ids_array(py, &ids)
    }

    fn touch(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = block_ids_arg)] block_ids: Vec<u32>,
    ) -> PyResult<()> {
        let ids = block_ids;
        let long = ids.len() >= DETACH_MIN_BLOCKS;
        self.inner
            .with_gil_released_if(py, long, |p| p.touch(&ids))?
            .py_err()
    }

    fn free_blocks(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = block_ids_arg)] block_ids: Vec<u32>,
    ) -> PyResult<()> {
        let ids = block_ids;
        let long = ids.len() >= DETACH_MIN_BLOCKS;
        self.inner
            .with_gil_released_if(py, long, |p| p.free_blocks(&ids))?
            .py_err()
    }

    #[pyo3(signature = (block_ids, block_hashes, num_cached_blocks, num_full_blocks, block_size, group_id = 0, token_ids = None, lora_id = None, lora_name = None, extra_keys = None))]
    #[allow(clippy::too_many_arguments)]
    fn cache_full_blocks(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = block_ids_arg)] block_ids: Vec<u32>,
        #[pyo3(from_py_with = block_hashes_arg)] block_hashes: Vec<BlockHash>,
        #[pyo3(from_py_with = convert::num_cached_blocks)] num_cached_blocks: usize,
        #[pyo3(from_py_with = convert::num_full_blocks)] num_full_blocks: usize,
        #[pyo3(from_py_with = convert::block_size)] block_size: usize,
        #[pyo3(from_py_with = convert::group_id)] group_id: u32,
        #[pyo3(from_py_with = token_ids_arg)] token_ids: Option<convert::Tokens>,
        #[pyo3(from_py_with = convert::lora_id)] lora_id: Option<i64>,
        #[pyo3(from_py_with = convert::lora_name)] lora_name: Option<String>,
        #[pyo3(from_py_with = extra_keys_arg)] extra_keys: Option<Vec<Option<Vec<KeyValue>>>>,
    ) -> PyResult<()> {
        let (ids, hashes, tokens) = (block_ids, block_hashes, token_ids);
        let keys = extra_keys.unwrap_or_default();
        let (num_cached, num_full) = (num_cached_blocks, num_full_blocks);
        let long = num_full.saturating_sub(num_cached) >= DETACH_MIN_BLOCKS;
        self.inner
            .with_gil_released_if(py, long, |p| {
                let info = StoreInfo {
                    token_ids: tokens.as_ref().map(|t| t.as_slice()),
                    lora_id,
                    lora_name: lora_name.as_deref(),
                    block_extra_keys: &keys,
                    default_extra_keys: None,
                };
                p.cache_full_blocks(
                    &ids, &hashes, num_cached, num_full, block_size, group_id, info,
                )
            })?
            .py_err()
    }

    #[pyo3(signature = (block_hash, group_ids = vec![0]))]
    fn get_cached_block(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = block_hash_arg)] block_hash: BlockHash,
        #[pyo3(from_py_with = group_ids)] group_ids: Vec<u32>,
    ) -> PyResult<Option<Vec<u32>>> {
        let h = block_hash;
        self.inner
            .with(py, |p| p.get_cached_block(&h, &group_ids))?
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
            .with_gil_released_if(py, long, |p| p.evict_blocks(&ids))?
            .py_err()
    }

    /// O(num_blocks): runs with the GIL released.
    fn reset_prefix_cache(&self, py: Python<'_>) -> PyResult<bool> {
        self.inner
            .with_gil_released(py, |p| p.reset_prefix_cache())?
            .py_err()
    }

    fn take_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let events = self.inner.with(py, |p| p.take_events())?.py_err()?;
        events_to_py(py, events, self.fmt, None, false)
    }

    fn ref_cnt(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = convert::block_id)] block_id: u32,
    ) -> PyResult<u32> {
        let id = block_id;
        self.inner.with(py, |p| p.ref_cnt(id))?.py_err()
    }

    fn block_hash<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = convert::block_id)] block_id: u32,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let id = block_id;
        let key = self.inner.with(py, |p| p.block_key(id))?.py_err()?;
        Ok(key.map(|k| PyBytes::new(py, k.hash.as_bytes())))
    }

    fn free_block_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let ids = self
            .inner
            .with_gil_released(py, |p| p.free_block_ids())?
            .py_err()?;
        ids_array(py, &ids)
    }

    /// Raise AssertionError if an internal invariant is broken (for tests).
    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        self.inner
            .with_gil_released(py, |p| p.check_invariants())?
            .map_err(pyo3::exceptions::PyAssertionError::new_err)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        self.inner.with(py, |p| {
            format!(
                "BlockPool(num_blocks={}, num_free_blocks={}, cached_keys={})",
                p.num_blocks(),
                p.num_free_blocks(),
                p.num_cached_keys()
            )
        })
    }
}
