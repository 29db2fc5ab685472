//! `BlockPool`: vLLM v1's block pool (prefixcache_core::blocks::pool) and the KV-event
//! conversion shared with `KVCacheManager`. Argument and error mapping only.

use std::sync::{Mutex, MutexGuard};

use numpy::PyArray1;
use prefixcache_core::blocks::{BlockPool, StoreInfo};
use prefixcache_core::events::{KvEvent, MEDIUM_GPU};
use prefixcache_core::hash::{BlockHash, KeyValue};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple, PyType};

use crate::convert;
use crate::errors::{invalid_input, invalid_type, IntoPyResult};
use crate::hasher::all_block_keys;

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

/// Core events as `prefixcache.events` dataclasses.
pub fn events_to_py<'py>(
    py: Python<'py>,
    events: Vec<KvEvent>,
    fmt: HashFormat,
    spec: SpecInfo,
) -> PyResult<Bound<'py, PyList>> {
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
                let hashes = PyList::empty(py);
                for h in &block_hashes {
                    hashes.append(fmt.hash(py, h)?)?;
                }
                let parent = match parent_block_hash {
                    Some(p) => Some(fmt.hash(py, &p)?),
                    None => None,
                };
                cls.stored.bind(py).call1((
                    hashes,
                    parent,
                    PyList::new(py, token_ids)?,
                    block_size,
                    lora_id,
                    MEDIUM_GPU,
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
            } => {
                let hashes = PyList::empty(py);
                for h in &block_hashes {
                    hashes.append(fmt.hash(py, h)?)?;
                }
                cls.removed
                    .bind(py)
                    .call1((hashes, MEDIUM_GPU, group_idx))?
            }
            KvEvent::AllBlocksCleared => cls.cleared.bind(py).call0()?,
        };
        out.append(obj)?;
    }
    Ok(out)
}

/// Block ids from any int sequence / integer array.
pub fn block_ids(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u32>> {
    let vals = convert::values(obj, what)?;
    let mut out = Vec::with_capacity(vals.as_slice().len());
    for (i, &v) in vals.as_slice().iter().enumerate() {
        match u32::try_from(v) {
            Ok(id) => out.push(id),
            Err(_) => {
                return Err(invalid_input(format!(
                    "{what}[{i}] = {v} is not a valid block id"
                )))
            }
        }
    }
    Ok(out)
}

/// A block hash from `bytes` (1..=32 bytes).
pub fn block_hash(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<BlockHash> {
    let Ok(b) = obj.cast::<PyBytes>() else {
        let tn = obj
            .get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default();
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

pub fn ids_array<'py>(py: Python<'py>, ids: &[u32]) -> Bound<'py, PyArray1<i64>> {
    convert::i64_array(py, ids.iter().map(|&b| i64::from(b)).collect())
}

fn count(n: i64, what: &str) -> PyResult<usize> {
    usize::try_from(n).map_err(|_| invalid_input(format!("{what} must be >= 0, got {n}")))
}

/// Lock a core structure; a poisoned lock (a panic elsewhere) becomes a RuntimeError.
pub fn lock<'a, T>(m: &'a Mutex<T>) -> PyResult<MutexGuard<'a, T>> {
    m.lock()
        .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("internal lock poisoned"))
}

/// vLLM v1's block pool: N blocks, block 0 reserved as the null block, an LRU free queue
/// and a prefix-cache table from (hash, group) to blocks.
#[pyclass(frozen, module = "prefixcache._core", name = "BlockPool")]
pub struct PyBlockPool {
    inner: Mutex<BlockPool>,
    fmt: HashFormat,
}

#[pymethods]
impl PyBlockPool {
    #[new]
    #[pyo3(signature = (num_blocks, enable_caching = true, enable_kv_cache_events = false, event_hash_format = "u64"))]
    fn new(
        num_blocks: i64,
        enable_caching: bool,
        enable_kv_cache_events: bool,
        event_hash_format: &str,
    ) -> PyResult<Self> {
        let fmt = HashFormat::parse(event_hash_format)?;
        let n = count(num_blocks, "num_blocks")?;
        Ok(PyBlockPool {
            inner: Mutex::new(BlockPool::new(n, enable_caching, enable_kv_cache_events).py_err()?),
            fmt,
        })
    }

    #[getter]
    fn num_blocks(&self) -> PyResult<usize> {
        Ok(lock(&self.inner)?.num_blocks())
    }

    #[getter]
    fn num_free_blocks(&self) -> PyResult<usize> {
        Ok(lock(&self.inner)?.num_free_blocks())
    }

    #[getter]
    fn usage(&self) -> PyResult<f64> {
        Ok(lock(&self.inner)?.usage())
    }

    #[getter]
    fn enable_caching(&self) -> PyResult<bool> {
        Ok(lock(&self.inner)?.enable_caching())
    }

    fn get_new_blocks<'py>(
        &self,
        py: Python<'py>,
        num_blocks: i64,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let n = count(num_blocks, "num_blocks")?;
        let ids = lock(&self.inner)?.get_new_blocks(n).py_err()?;
        Ok(ids_array(py, &ids))
    }

    fn touch(&self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = self::block_ids(block_ids, "block_ids")?;
        lock(&self.inner)?.touch(&ids).py_err()
    }

    fn free_blocks(&self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = self::block_ids(block_ids, "block_ids")?;
        lock(&self.inner)?.free_blocks(&ids).py_err()
    }

    #[pyo3(signature = (block_ids, block_hashes, num_cached_blocks, num_full_blocks, block_size, group_id = 0, token_ids = None, lora_id = None, lora_name = None, extra_keys = None))]
    #[allow(clippy::too_many_arguments)]
    fn cache_full_blocks(
        &self,
        block_ids: &Bound<'_, PyAny>,
        block_hashes: &Bound<'_, PyAny>,
        num_cached_blocks: i64,
        num_full_blocks: i64,
        block_size: i64,
        group_id: u32,
        token_ids: Option<&Bound<'_, PyAny>>,
        lora_id: Option<i64>,
        lora_name: Option<String>,
        extra_keys: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let ids = self::block_ids(block_ids, "block_ids")?;
        let keys = all_block_keys(extra_keys)?.unwrap_or_default();
        let mut hashes = Vec::new();
        for (i, h) in block_hashes.try_iter()?.enumerate() {
            hashes.push(block_hash(&h?, &format!("block_hashes[{i}]"))?);
        }
        let tokens = match token_ids {
            Some(t) if !t.is_none() => Some(convert::tokens(t, "token_ids")?),
            _ => None,
        };
        let info = StoreInfo {
            token_ids: tokens.as_ref().map(|t| t.as_slice()),
            lora_id,
            lora_name: lora_name.as_deref(),
            block_extra_keys: &keys,
            default_extra_keys: None,
        };
        lock(&self.inner)?
            .cache_full_blocks(
                &ids,
                &hashes,
                count(num_cached_blocks, "num_cached_blocks")?,
                count(num_full_blocks, "num_full_blocks")?,
                count(block_size, "block_size")?,
                group_id,
                info,
            )
            .py_err()
    }

    #[pyo3(signature = (block_hash, group_ids = vec![0]))]
    fn get_cached_block(
        &self,
        block_hash: &Bound<'_, PyAny>,
        group_ids: Vec<u32>,
    ) -> PyResult<Option<Vec<u32>>> {
        let h = self::block_hash(block_hash, "block_hash")?;
        lock(&self.inner)?.get_cached_block(&h, &group_ids).py_err()
    }

    fn evict_blocks(&self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = self::block_ids(block_ids, "block_ids")?;
        lock(&self.inner)?.evict_blocks(&ids).py_err()
    }

    fn reset_prefix_cache(&self) -> PyResult<bool> {
        Ok(lock(&self.inner)?.reset_prefix_cache())
    }

    fn take_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let events = lock(&self.inner)?.take_events();
        events_to_py(py, events, self.fmt, None)
    }

    fn ref_cnt(&self, block_id: i64) -> PyResult<u32> {
        let id = u32::try_from(block_id)
            .map_err(|_| invalid_input(format!("bad block id {block_id}")))?;
        lock(&self.inner)?.ref_cnt(id).py_err()
    }

    fn block_hash<'py>(
        &self,
        py: Python<'py>,
        block_id: i64,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let id = u32::try_from(block_id)
            .map_err(|_| invalid_input(format!("bad block id {block_id}")))?;
        let key = lock(&self.inner)?.block_key(id).py_err()?;
        Ok(key.map(|k| PyBytes::new(py, k.hash.as_bytes())))
    }

    fn free_block_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let ids = lock(&self.inner)?.free_block_ids();
        Ok(ids_array(py, &ids))
    }

    /// Raise AssertionError if an internal invariant is broken (for tests).
    fn check_invariants(&self) -> PyResult<()> {
        lock(&self.inner)?
            .check_invariants()
            .map_err(pyo3::exceptions::PyAssertionError::new_err)
    }

    fn __repr__(&self) -> PyResult<String> {
        let p = lock(&self.inner)?;
        Ok(format!(
            "BlockPool(num_blocks={}, num_free_blocks={}, cached_keys={})",
            p.num_blocks(),
            p.num_free_blocks(),
            p.num_cached_keys()
        ))
    }
}
