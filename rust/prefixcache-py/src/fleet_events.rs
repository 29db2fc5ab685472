//! KV event objects -> core `FleetEvent`s: prefixcache's own `prefixcache.events`
//! classes, vLLM's (any object whose class is named `BlockStored` / `BlockRemoved` /
//! `AllBlocksCleared`, read by vLLM's field names), and `"type"`-tagged dicts (a decoded
//! msgpack payload). Every problem is a message (the caller counts it on the worker and
//! raises `InvalidEventError`); nothing is applied unless the whole batch converts.

use numpy::PyArrayMethods;
use prefixcache_core::error::try_copy_str;
use prefixcache_core::fleet::{FleetEvent, HashForm, Stored};
use pyo3::exceptions::{PyAttributeError, PyMemoryError, PyUnicodeEncodeError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use pyo3::types::{PyBool, PyBytes, PyDict, PyInt, PyString};

use crate::convert::type_name;

type Conv<T> = std::result::Result<T, String>;

/// Why an event object could not be converted.
#[derive(Debug)]
pub enum ConvError {
    /// Bad input; the message names the problem.
    Bad(String),
    /// What the input holds could not be allocated (raised as `MemoryError`, not
    /// counted on the worker).
    NoMemory(String),
}

impl From<String> for ConvError {
    fn from(msg: String) -> Self {
        ConvError::Bad(msg)
    }
}

impl ConvError {
    /// The same error with `prefix` before a bad input's message.
    fn within(self, prefix: impl std::fmt::Display) -> Self {
        match self {
            ConvError::Bad(m) => ConvError::Bad(format!("{prefix}: {m}")),
            e => e,
        }
    }
}

fn no_memory(what: &str, e: impl std::fmt::Display) -> ConvError {
    ConvError::NoMemory(format!("cannot allocate memory for {what}: {e}"))
}

/// A Python error met while reading an event: `MemoryError` stays one, anything else is
/// bad input.
fn py_failure(py: Python<'_>, e: PyErr) -> ConvError {
    if e.is_instance_of::<PyMemoryError>(py) {
        ConvError::NoMemory(e.to_string())
    } else {
        ConvError::Bad(e.to_string())
    }
}

/// A field by name: a dict key or an attribute; `None` when absent or None. An attribute
/// that raises anything but `AttributeError` is an error, not an absent field (a `medium`
/// property that fails must not read as `"GPU"`).
fn field<'py>(ev: &Bound<'py, PyAny>, name: &str) -> Result<Option<Bound<'py, PyAny>>, ConvError> {
    let py = ev.py();
    let v = if let Ok(d) = ev.cast::<PyDict>() {
        d.get_item(name)
            .map_err(|e| py_failure(py, e).within(name))?
    } else {
        match ev.getattr(name) {
            Ok(v) => Some(v),
            Err(e) if e.is_instance_of::<PyAttributeError>(py) => None,
            Err(e) => return Err(py_failure(py, e).within(name)),
        }
    };
    Ok(v.filter(|v| !v.is_none()))
}

/// One block hash: an int in [0, 2**64) or bytes of the configured width.
pub fn hash_key(h: &Bound<'_, PyAny>, form: HashForm, what: &str) -> Conv<u64> {
    // Fast path: an exact int (not a bool) in range.
    if h.is_exact_instance_of::<PyInt>() {
        if let Ok(v) = h.extract::<u64>() {
            return Ok(v);
        }
    }
    if let Ok(b) = h.cast::<PyBytes>() {
        return form.key(b.as_bytes(), what).map_err(|e| e.to_string());
    }
    let int = |v: &Bound<'_, PyAny>| {
        v.extract::<u64>().map_err(|_| {
            format!(
                "{what}: block hash {} is out of range (an int in [0, 2**64) or {} bytes)",
                v.repr().map(|r| r.to_string()).unwrap_or_default(),
                form.hash_bytes
            )
        })
    };
    let not_a_hash = || {
        format!(
            "{what}: a block hash must be an int or bytes, got {}",
            type_name(h)
        )
    };
    if h.is_instance_of::<PyBool>() {
        return Err(not_a_hash());
    }
    if h.is_instance_of::<PyInt>() {
        return int(h);
    }
    // numpy integer scalars: `__index__` once, and only an int (not a bool) back.
    match h.call_method0("__index__") {
        Ok(v) if v.is_instance_of::<PyInt>() && !v.is_instance_of::<PyBool>() => int(&v),
        _ => Err(not_a_hash()),
    }
}

fn hash_list(v: &Bound<'_, PyAny>, form: HashForm, what: &str) -> Result<Vec<u64>, ConvError> {
    // uint64 / int64 arrays in one copy (item by item they cost a Python call each). The
    // GIL is held and no Python code runs while the array is borrowed.
    if let Ok(a) = v.cast::<numpy::PyArray1<u64>>() {
        let a = a.try_readonly().map_err(|e| format!("{what}: {e}"))?;
        let a = a.as_array();
        let mut out = room(a.len(), what)?;
        out.extend(a.iter().copied());
        return Ok(out);
    }
    if let Ok(a) = v.cast::<numpy::PyArray1<i64>>() {
        let a = a.try_readonly().map_err(|e| format!("{what}: {e}"))?;
        let a = a.as_array();
        let mut out = room(a.len(), what)?;
        for (i, &x) in a.iter().enumerate() {
            out.push(u64::try_from(x).map_err(|_| format!("{what}[{i}] = {x} is negative"))?);
        }
        return Ok(out);
    }
    if v.is_instance_of::<PyString>() || v.is_instance_of::<PyBytes>() {
        return Err(format!("{what} must be a list of hashes, got {}", type_name(v)).into());
    }
    let it = v
        .try_iter()
        .map_err(|_| format!("{what} must be a list of hashes, got {}", type_name(v)))?;
    let mut out = room(v.len().unwrap_or(0), what)?;
    for h in it {
        let h = hash_key(&h.map_err(|e| py_failure(v.py(), e))?, form, what)?;
        out.try_reserve(1).map_err(|e| no_memory(what, e))?;
        out.push(h);
    }
    Ok(out)
}

/// A new vector with room for `n` items.
fn room<T>(n: usize, what: &str) -> Result<Vec<T>, ConvError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|e| no_memory(what, e))?;
    Ok(v)
}

fn opt_int(v: Option<Bound<'_, PyAny>>, what: &str) -> Conv<Option<i64>> {
    match v {
        None => Ok(None),
        Some(v) if v.is_instance_of::<PyInt>() && !v.is_instance_of::<PyBool>() => v
            .extract::<i64>()
            .map(Some)
            .map_err(|_| format!("{what} is out of the int64 range")),
        Some(v) => Err(format!(
            "{what} must be an int or None, got {}",
            type_name(&v)
        )),
    }
}

fn opt_str(v: Option<Bound<'_, PyAny>>, what: &str) -> Result<Option<String>, ConvError> {
    match v {
        None => Ok(None),
        Some(v) => match v.cast::<PyString>() {
            Ok(s) => {
                let text = s.to_str().map_err(|e| {
                    if e.is_instance_of::<PyUnicodeEncodeError>(v.py()) {
                        ConvError::Bad(format!(
                            "{what} is not valid text: it holds lone surrogates (cannot be UTF-8 encoded)"
                        ))
                    } else {
                        py_failure(v.py(), e)
                    }
                })?;
                try_copy_str(text, what)
                    .map(Some)
                    .map_err(|e| ConvError::NoMemory(e.to_string()))
            }
            Err(_) => Err(format!("{what} must be a str or None, got {}", type_name(&v)).into()),
        },
    }
}

fn group(v: Option<Bound<'_, PyAny>>) -> Conv<u32> {
    match opt_int(v, "group_idx")? {
        None => Ok(0),
        Some(g) => u32::try_from(g).map_err(|_| format!("group_idx {g} is out of range")),
    }
}

fn token_count(v: Option<Bound<'_, PyAny>>) -> Result<usize, ConvError> {
    match v {
        None => Ok(0),
        Some(v) => crate::convert::tokens(&v, "token_ids")
            .map(|t| t.len())
            .map_err(|e| py_failure(v.py(), e)),
    }
}

/// The event's type tag, read in place (a caller's str can be of any size).
fn event_tag(ev: &Bound<'_, PyAny>) -> Result<PyBackedStr, ConvError> {
    let py = ev.py();
    let name = if let Ok(d) = ev.cast::<PyDict>() {
        match d.get_item("type").map_err(|e| py_failure(py, e))? {
            Some(t) => t.cast_into::<PyString>().map_err(|t| {
                format!(
                    "\"type\" must be a str, got {}",
                    type_name(t.into_inner().as_any())
                )
            })?,
            None => return Err("event dict has no \"type\" key".to_owned().into()),
        }
    } else {
        ev.get_type().name().map_err(|e| py_failure(py, e))?
    };
    PyBackedStr::try_from(name).map_err(|e| py_failure(py, e))
}

/// One event object.
pub fn event(ev: &Bound<'_, PyAny>, form: HashForm) -> Result<FleetEvent, ConvError> {
    let tag = event_tag(ev)?;
    match &*tag {
        "BlockStored" => {
            let block_hashes = match field(ev, "block_hashes")? {
                Some(v) => hash_list(&v, form, "block_hashes")?,
                None => return Err("BlockStored without block_hashes".to_owned().into()),
            };
            let parent_block_hash = match field(ev, "parent_block_hash")? {
                Some(v) => Some(hash_key(&v, form, "parent_block_hash")?),
                None => None,
            };
            let block_size = match opt_int(field(ev, "block_size")?, "block_size")? {
                // 0: vLLM's OffloadingConnector publishes hash-only placeholders.
                Some(b) if (0..=i64::from(u32::MAX)).contains(&b) => b as u32,
                Some(b) => return Err(format!("block_size must be in [0, 2**32), got {b}").into()),
                None => return Err("BlockStored without block_size".to_owned().into()),
            };
            if let Some(k) = field(ev, "extra_keys")? {
                let n = k
                    .len()
                    .map_err(|_| format!("extra_keys must be a list, got {}", type_name(&k)))?;
                if n != block_hashes.len() {
                    return Err(format!(
                        "extra_keys has {n} entries for {} blocks",
                        block_hashes.len()
                    )
                    .into());
                }
            }
            Ok(FleetEvent::Stored(Stored {
                num_tokens: token_count(field(ev, "token_ids")?)?,
                block_size,
                lora_id: opt_int(field(ev, "lora_id")?, "lora_id")?,
                lora_name: opt_str(field(ev, "lora_name")?, "lora_name")?,
                medium: opt_str(field(ev, "medium")?, "medium")?,
                group_idx: group(field(ev, "group_idx")?)?,
                block_hashes,
                parent_block_hash,
            }))
        }
        "BlockRemoved" => Ok(FleetEvent::Removed {
            block_hashes: match field(ev, "block_hashes")? {
                Some(v) => hash_list(&v, form, "block_hashes")?,
                None => return Err("BlockRemoved without block_hashes".to_owned().into()),
            },
            medium: opt_str(field(ev, "medium")?, "medium")?,
            group_idx: group(field(ev, "group_idx")?)?,
        }),
        "AllBlocksCleared" => Ok(FleetEvent::Cleared),
        other => Err(format!(
            "unknown event type {other:?} (expected BlockStored, BlockRemoved or AllBlocksCleared)"
        )
        .into()),
    }
}

/// A batch of event objects (any iterable), all or nothing.
pub fn events(objs: &Bound<'_, PyAny>, form: HashForm) -> Result<Vec<FleetEvent>, ConvError> {
    let it = objs.try_iter().map_err(|_| {
        format!(
            "events must be an iterable of events, got {}",
            type_name(objs)
        )
    })?;
    let mut out = Vec::new();
    for (i, ev) in it.enumerate() {
        let ev = ev.map_err(|e| py_failure(objs.py(), e))?;
        let ev = event(&ev, form).map_err(|e| e.within(format_args!("event {i}")))?;
        out.try_reserve(1).map_err(|e| no_memory("the events", e))?;
        out.push(ev);
    }
    Ok(out)
}
