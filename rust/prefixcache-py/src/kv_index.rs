//! `KvIndex`: the fleet index (prefixcache_core::fleet), plus the decoders the Redis
//! backend shares with it. Argument and error mapping only.

use std::time::{SystemTime, UNIX_EPOCH};

use numpy::{PyArray1, PyArrayDescrMethods, PyArrayMethods, PyUntypedArrayMethods};
use prefixcache_core::error::{try_copy, try_vec};
use prefixcache_core::fleet::{wire, ApplyOutcome, FleetEvent, HashForm, KvIndex, MAX_MEDIA};
use prefixcache_core::Error;
use pyo3::prelude::*;
use pyo3::pybacked::{PyBackedBytes, PyBackedStr};
use pyo3::types::{PyBool, PyDict, PyInt, PyList, PyString, PyTuple};

use crate::convert::{self, type_name};
use crate::errors::{invalid_input, invalid_type, IntoPyResult};
use crate::fleet_events::{self, ConvError};
use crate::fleet_match::PyFleetMatch;
use crate::hasher::PyBlockHasher;
use crate::shared::Shared;

/// Payloads from which `apply_frames` decodes with the GIL released (after a copy):
/// ~64 KiB of msgpack is >= ~10 us of work.
const DETACH_MIN_PAYLOAD: usize = 64 * 1024;

/// Request lengths from which queries run with the GIL released (the hashes are owned
/// already): 2048 blocks over a fleet is >= ~10 us of work.
const DETACH_MIN_BLOCKS: usize = 2048;

/// A number argument (a time, a TTL, a weight): an int or a float (or an object with
/// `__float__`, e.g. numpy's); a str, a bool or anything else is `None`. An int too large
/// for a float reads as an infinity of its sign, which the caller's range check refuses
/// (`InvalidInputError`, as for `float("inf")`), not as a wrong type.
fn number(o: &Bound<'_, PyAny>) -> Option<f64> {
    if o.is_instance_of::<PyString>() || o.is_instance_of::<PyBool>() {
        return None;
    }
    match o.extract::<f64>() {
        Ok(v) => Some(v),
        Err(_) if o.is_instance_of::<PyInt>() => {
            let negative = o.lt(0i64).unwrap_or(false);
            Some(if negative {
                f64::NEG_INFINITY
            } else {
                f64::INFINITY
            })
        }
        Err(_) => None,
    }
}

/// A `ttl` argument: None, or a number of seconds (its range checked by the core); a bool,
/// a str or anything else raises `InvalidTypeError`.
fn ttl_of(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<f64>> {
    let Some(o) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    number(o).map(Some).ok_or_else(|| {
        invalid_type(format!(
            "ttl must be None or a number of seconds, got {}",
            type_name(o)
        ))
    })
}

/// A time argument: a finite number of seconds, or None for the clock.
fn now_or(now: Option<&Bound<'_, PyAny>>) -> PyResult<f64> {
    let t = match now {
        Some(o) if !o.is_none() => number(o)
            .ok_or_else(|| invalid_type(format!("now must be a number, got {}", type_name(o))))?,
        _ => {
            return Ok(SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0))
        }
    };
    if t.is_finite() {
        Ok(t)
    } else {
        Err(invalid_input(format!("now must be a finite time, got {t}")))
    }
}

fn form_of(hash_bytes: &Bound<'_, PyAny>) -> PyResult<HashForm> {
    let n = convert::int_in(hash_bytes, "hash_bytes", convert::I64_MIN, convert::I64_MAX)?;
    usize::try_from(n)
        .map_err(|_| invalid_input(format!("hash_bytes must be between 8 and 32, got {n}")))
        .and_then(|n| HashForm::new(n).py_err())
}

/// A non-negative integer argument (sequence number, count); `InvalidInputError` below 0.
fn non_negative(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    convert::int_in(obj, what, 0, convert::SIZE_MAX).map(|v| v as u64)
}

/// A worker name: a str that is valid text, read in place (not copied: a name can be of
/// any size).
pub(crate) fn worker_arg(obj: &Bound<'_, PyAny>) -> PyResult<PyBackedStr> {
    convert::str_ref(obj, "worker")
}

/// A medium name, or None (read in place).
pub(crate) fn medium_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<PyBackedStr>> {
    if obj.is_none() {
        return Ok(None);
    }
    convert::str_ref(obj, "medium").map(Some)
}

/// A sequence number argument named `what` (an int in `[0, 2**63)`), or None.
fn opt_seq(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<u64>> {
    match obj {
        Some(o) if !o.is_none() => non_negative(o, what).map(Some),
        _ => Ok(None),
    }
}

/// Frames as owned-or-borrowed byte buffers; a wrong count or type is a message.
fn frame_parts(frames: &Bound<'_, PyAny>) -> std::result::Result<Vec<PyBackedBytes>, String> {
    if frames.is_instance_of::<PyString>() {
        return Err("frames must be a list of bytes, got str".to_owned());
    }
    let it = frames
        .try_iter()
        .map_err(|_| format!("frames must be a list of bytes, got {}", type_name(frames)))?;
    // A message has 3 frames: past them, only counted (a long iterable holds no more).
    let mut out = Vec::with_capacity(3);
    let mut count = 0usize;
    for (i, f) in it.enumerate() {
        let f = f.map_err(|e| e.to_string())?;
        let f = f
            .extract::<PyBackedBytes>()
            .map_err(|_| format!("frame {i} must be bytes, got {}", type_name(&f)))?;
        count += 1;
        if out.len() < 3 {
            out.push(f);
        }
    }
    if count > 3 {
        return Err(format!(
            "a KV event message has 3 frames (topic, seq, payload), got {count}"
        ));
    }
    Ok(out)
}

/// A request's block hashes: ints (list or uint64/int64 array) or digests of `hash_bytes`.
fn query_hashes(obj: &Bound<'_, PyAny>, form: HashForm) -> PyResult<Vec<u64>> {
    if let Ok(a) = obj.cast::<PyArray1<u64>>() {
        let a = a.readonly();
        let a = a.as_array();
        let mut out = try_vec(a.len(), "the hashes").py_err()?;
        out.extend(a.iter().copied());
        return Ok(out);
    }
    if let Ok(a) = obj.cast::<PyArray1<i64>>() {
        let a = a.readonly();
        let a = a.as_array();
        let mut out = try_vec(a.len(), "the hashes").py_err()?;
        for (i, &x) in a.iter().enumerate() {
            out.push(
                u64::try_from(x)
                    .map_err(|_| invalid_input(format!("hashes[{i}] = {x} is negative")))?,
            );
        }
        return Ok(out);
    }
    if let Ok(a) = obj.cast::<numpy::PyUntypedArray>() {
        if a.ndim() != 1 {
            return Err(invalid_input(format!(
                "hashes: a numpy array must be 1-D, got shape ({})",
                a.shape()
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        // Any other integer dtype, byte order or stride: read as token ids are (the values
        // the equivalent list holds).
        if matches!(a.dtype().kind(), b'i' | b'u') {
            return convert::u64_list(obj, "hashes");
        }
        return Err(invalid_type(format!(
            "hashes: a numpy array must have an integer dtype, got {}",
            a.dtype()
        )));
    }
    let key = |i: usize, h: &Bound<'_, PyAny>| {
        fleet_events::hash_key(h, form, "hashes")
            .map_err(|e| invalid_input(format!("{e} (at position {i})")))
    };
    if let Ok(list) = obj.cast::<PyList>() {
        let mut out = try_vec(list.len(), "the hashes").py_err()?;
        for (i, h) in list.iter().enumerate() {
            // Room checked: an item's `__index__` may lengthen the list.
            if out.len() == out.capacity() {
                out.try_reserve(1)
                    .map_err(|e| Error::out_of_memory("the hashes", e))
                    .py_err()?;
            }
            out.push(key(i, &h)?);
        }
        return Ok(out);
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        let mut out = try_vec(t.len(), "the hashes").py_err()?;
        for (i, h) in t.iter().enumerate() {
            out.push(key(i, &h)?);
        }
        return Ok(out);
    }
    if convert::not_a_sequence_of_ints(obj) {
        return Err(invalid_type(format!(
            "hashes must be a sequence of block hashes, got {}",
            type_name(obj)
        )));
    }
    let it = obj.try_iter().map_err(|_| {
        invalid_type(format!(
            "hashes must be a sequence of block hashes, got {}",
            type_name(obj)
        ))
    })?;
    let mut out = try_vec(obj.len().unwrap_or(0), "the hashes").py_err()?;
    for (i, h) in it.enumerate() {
        let h = h?;
        let h = fleet_events::hash_key(&h, form, "hashes")
            .map_err(|e| invalid_input(format!("{e} (at position {i})")))?;
        if out.len() == out.capacity() {
            out.try_reserve(1)
                .map_err(|e| Error::out_of_memory("the hashes", e))
                .py_err()?;
        }
        out.push(h);
    }
    Ok(out)
}

/// `hashes`, or the hashes of `tokens` under `hasher` (last 8 bytes, big-endian).
fn request_hashes(
    py: Python<'_>,
    form: HashForm,
    hashes: Option<&Bound<'_, PyAny>>,
    tokens: Option<&Bound<'_, PyAny>>,
    hasher: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<u64>> {
    match (hashes, tokens, hasher) {
        (Some(h), None, None) => query_hashes(h, form),
        (None, Some(t), Some(hs)) => {
            let hs = hs.cast::<PyBlockHasher>().map_err(|_| {
                invalid_type(format!(
                    "hasher must be a BlockHasher, got {}",
                    type_name(hs)
                ))
            })?;
            let toks = convert::tokens(t, "tokens")?;
            let hasher = &hs.get().inner;
            let t = toks.as_slice();
            let digests = if t.len() >= 1024 {
                py.detach(|| hasher.hash_blocks(t, None, None))
            } else {
                hasher.hash_blocks(t, None, None)
            }
            .py_err()?;
            let mut out = try_vec(digests.len(), "the hashes").py_err()?;
            out.extend(digests.iter().map(|d| d.to_u64()));
            Ok(out)
        }
        _ => Err(invalid_input(
            "give either hashes, or tokens together with a hasher (BlockHasher)",
        )),
    }
}

/// The `k` of `top_k`: a count, 1 when None.
fn k_arg(k: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
    match k {
        Some(k) if !k.is_none() => Ok(usize::try_from(non_negative(k, "k")?).unwrap_or(usize::MAX)),
        _ => Ok(1),
    }
}

fn weights_arg(weights: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Vec<(String, f64)>>> {
    let Some(w) = weights.filter(|w| !w.is_none()) else {
        return Ok(None);
    };
    let d = w.cast::<PyDict>().map_err(|_| {
        invalid_type(format!(
            "weights must be a dict of medium -> weight, got {}",
            type_name(w)
        ))
    })?;
    // A snapshot of the items: a weight's `__float__` may change the dict (iterating a
    // dict that changes size would panic).
    let items = d.items();
    let mut out = Vec::with_capacity(items.len());
    for kv in items.iter() {
        let (k, v) = kv.extract::<(Bound<'_, PyAny>, Bound<'_, PyAny>)>()?;
        let name = convert::str_arg(&k, "weights: a medium name")?;
        let x = number(&v).ok_or_else(|| {
            invalid_type(format!(
                "weights[{name:?}] must be a number, got {}",
                type_name(&v)
            ))
        })?;
        out.push((name, x));
    }
    prefixcache_core::fleet::check_weights(&out).py_err()?;
    Ok(Some(out))
}

fn outcome(o: ApplyOutcome) -> &'static str {
    o.name()
}

/// Which workers hold which block hashes, per medium, fed by the engines' KV events.
#[pyclass(name = "KvIndex", module = "prefixcache._core", frozen)]
pub struct PyKvIndex {
    inner: Shared<KvIndex>,
    form: HashForm,
    ttl: Option<f64>,
}

#[pymethods]
impl PyKvIndex {
    #[new]
    #[pyo3(signature = (ttl=None, hash_bytes=None))]
    fn new(
        ttl: Option<&Bound<'_, PyAny>>,
        hash_bytes: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        // The ttl's range is checked as it is read, before `hash_bytes` (argument order).
        let ttl = ttl_of(ttl)?;
        prefixcache_core::fleet::check_ttl(ttl).py_err()?;
        let form = match hash_bytes {
            Some(h) => form_of(h)?,
            None => HashForm::default(),
        };
        Ok(PyKvIndex {
            inner: Shared::new("KvIndex", KvIndex::new(form, ttl).py_err()?),
            form,
            ttl,
        })
    }

    #[getter]
    fn ttl(&self) -> Option<f64> {
        self.ttl
    }

    #[getter]
    fn hash_bytes(&self) -> usize {
        self.form.hash_bytes
    }

    /// Distinct hashes held by at least one worker.
    #[getter]
    fn num_hashes(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.with(py, |ix| ix.num_hashes())
    }

    #[getter]
    fn media(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        self.inner
            .with(py, |ix| ix.media().iter().map(|m| m.to_string()).collect())
    }

    fn workers(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        self.inner
            .with(py, |ix| {
                ix.workers()
                    .map(|w| w.iter().map(|m| m.to_string()).collect())
            })?
            .py_err()
    }

    #[pyo3(signature = (worker, now=None))]
    fn add_worker(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = worker_arg)] worker: PyBackedStr,
        now: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let now = now_or(now)?;
        self.inner
            .with(py, |ix| ix.add_worker(&worker, now).map(|_| ()))?
            .py_err()
    }

    fn remove_worker(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = worker_arg)] worker: PyBackedStr,
    ) -> PyResult<()> {
        self.inner
            .with(py, |ix| ix.remove_worker(&worker))?
            .py_err()
    }

    #[pyo3(signature = (worker, next_seq=None))]
    fn reset_worker(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = worker_arg)] worker: PyBackedStr,
        next_seq: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let next_seq = opt_seq(next_seq, "next_seq")?.unwrap_or(0);
        self.inner
            .with(py, |ix| ix.reset_worker(&worker, next_seq))?
            .py_err()
    }

    /// Applies event objects; returns "applied", "duplicate" or "gap".
    #[pyo3(signature = (worker, events, seq=None, now=None))]
    fn apply(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = worker_arg)] worker: PyBackedStr,
        events: &Bound<'_, PyAny>,
        seq: Option<&Bound<'_, PyAny>>,
        now: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<&'static str> {
        // `seq` and `now` in argument order, before the events (whose refusal is recorded
        // on the worker at `now`).
        let seq = opt_seq(seq, "seq")?;
        let now = now_or(now)?;
        let converted = fleet_events::events(events, self.form);
        self.inner
            .with(py, |ix| match converted {
                Ok(evs) => ix.apply(&worker, &evs, seq, now),
                Err(ConvError::Bad(msg)) => {
                    ix.record_error(&worker, &msg, now);
                    Err(Error::InvalidEvent(msg))
                }
                Err(ConvError::NoMemory(msg)) => Err(Error::OutOfMemory(msg)),
            })?
            .py_err()
            .map(outcome)
    }

    /// Applies one ZMQ message `[topic, seq, payload]` as the engines send it.
    #[pyo3(signature = (worker, frames, now=None))]
    fn apply_frames(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = worker_arg)] worker: PyBackedStr,
        frames: &Bound<'_, PyAny>,
        now: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<&'static str> {
        let now = now_or(now)?;
        let parts = match frame_parts(frames) {
            Ok(p) => p,
            Err(msg) => {
                return self
                    .inner
                    .with(py, |ix| {
                        ix.record_error(&worker, &msg, now);
                        Err(Error::InvalidEvent(msg))
                    })?
                    .py_err();
            }
        };
        let size: usize = parts.iter().map(|p| p.len()).sum();
        let out = if size >= DETACH_MIN_PAYLOAD {
            // Copied, as the GIL is released while they are decoded.
            let mut owned: Vec<Vec<u8>> = try_vec(parts.len(), "the frames").py_err()?;
            for p in &parts {
                owned.push(try_copy(p, "the frames").py_err()?);
            }
            self.inner.with_gil_released(py, move |ix| {
                let refs: Vec<&[u8]> = owned.iter().map(|p| p.as_slice()).collect();
                ix.apply_frames(&worker, &refs, now)
            })?
        } else {
            self.inner.with(py, |ix| {
                let refs: Vec<&[u8]> = parts.iter().map(|p| &**p).collect();
                ix.apply_frames(&worker, &refs, now)
            })?
        };
        out.py_err().map(outcome)
    }

    /// Every worker's longest held prefix of a request (its block hashes, or its tokens
    /// and a `BlockHasher`), per medium and on any medium.
    #[pyo3(signature = (hashes=None, *, tokens=None, hasher=None, weights=None, now=None))]
    fn longest_prefix(
        &self,
        py: Python<'_>,
        hashes: Option<&Bound<'_, PyAny>>,
        tokens: Option<&Bound<'_, PyAny>>,
        hasher: Option<&Bound<'_, PyAny>>,
        weights: Option<&Bound<'_, PyAny>>,
        now: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyFleetMatch> {
        // In argument order: the first bad argument is the one named.
        let hs = request_hashes(py, self.form, hashes, tokens, hasher)?;
        let weights = weights_arg(weights)?;
        let now = now_or(now)?;
        let m = self
            .inner
            .with_gil_released_if(py, hs.len() >= DETACH_MIN_BLOCKS, |ix| {
                ix.longest_prefix(&hs, now, weights.as_deref())
            })?
            .py_err()?;
        Ok(PyFleetMatch { inner: m })
    }

    /// The `k` best workers as `(worker, score, blocks)`, best first.
    #[pyo3(signature = (hashes=None, k=None, *, tokens=None, hasher=None, weights=None, now=None, include_unhealthy=None))]
    #[pyo3(
        text_signature = "($self, hashes=None, k=None, *, tokens=None, hasher=None, weights=None, now=None, include_unhealthy=False)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn top_k(
        &self,
        py: Python<'_>,
        hashes: Option<&Bound<'_, PyAny>>,
        k: Option<&Bound<'_, PyAny>>,
        tokens: Option<&Bound<'_, PyAny>>,
        hasher: Option<&Bound<'_, PyAny>>,
        weights: Option<&Bound<'_, PyAny>>,
        now: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = convert::given)] include_unhealthy: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Vec<(String, f64, u32)>> {
        // In argument order: the first bad argument is the one named (`k` comes after
        // `hashes`, before the keyword-only `tokens` and `hasher`).
        let (k, hs) = if hashes.is_some() {
            let hs = request_hashes(py, self.form, hashes, tokens, hasher)?;
            (k_arg(k)?, hs)
        } else {
            let k = k_arg(k)?;
            (k, request_hashes(py, self.form, hashes, tokens, hasher)?)
        };
        let weights = weights_arg(weights)?;
        let now = now_or(now)?;
        let include_unhealthy = match include_unhealthy {
            Some(o) => convert::include_unhealthy(&o)?,
            None => false,
        };
        let top = self
            .inner
            .with_gil_released_if(py, hs.len() >= DETACH_MIN_BLOCKS, |ix| {
                ix.top_k(&hs, k, now, weights.as_deref(), include_unhealthy)
            })?
            .py_err()?;
        Ok(top
            .into_iter()
            .map(|w| (w.worker.to_string(), w.score, w.blocks))
            .collect())
    }

    /// Sequence state, health and counters of one worker.
    #[pyo3(signature = (worker, now=None))]
    fn status<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = worker_arg)] worker: PyBackedStr,
        now: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let now = now_or(now)?;
        let s = self
            .inner
            .with(py, |ix| ix.status(&worker, now))?
            .py_err()?;
        let d = PyDict::new(py);
        d.set_item("worker", &*s.worker)?;
        d.set_item("next_seq", s.next_seq)?;
        d.set_item("max_seen_seq", s.max_seen_seq)?;
        d.set_item("stale", s.stale)?;
        d.set_item("expired", s.expired)?;
        d.set_item("last_seen", s.last_seen)?;
        d.set_item("batches", s.batches)?;
        d.set_item("block_events", s.block_events)?;
        d.set_item("duplicates", s.duplicates)?;
        d.set_item("gaps", s.gaps)?;
        d.set_item("restarts", s.restarts)?;
        d.set_item("unknown_removals", s.unknown_removals)?;
        d.set_item("errors", s.errors)?;
        d.set_item("last_error", s.last_error)?;
        d.set_item("dp_rank", s.dp_rank)?;
        d.set_item("num_held", s.num_held)?;
        Ok(d)
    }

    /// The hashes `worker` holds (on `medium`, or on any medium), sorted.
    #[pyo3(signature = (worker, medium=None))]
    fn cached_hashes(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = worker_arg)] worker: PyBackedStr,
        #[pyo3(from_py_with = medium_arg)] medium: Option<PyBackedStr>,
    ) -> PyResult<Vec<u64>> {
        self.inner
            .with(py, |ix| ix.cached_hashes(&worker, medium.as_deref()))?
            .py_err()
    }

    /// Removes the workers silent for longer than the TTL; returns their names.
    #[pyo3(signature = (now=None))]
    fn prune_expired(
        &self,
        py: Python<'_>,
        now: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<String>> {
        let now = now_or(now)?;
        self.inner
            .with(py, |ix| {
                ix.prune_expired(now)
                    .map(|gone| gone.iter().map(|n| n.to_string()).collect())
            })?
            .py_err()
    }

    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        self.inner
            .with_gil_released(py, |ix| ix.check_invariants())?
            .map_err(pyo3::exceptions::PyAssertionError::new_err)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        self.inner.with(py, |ix| {
            format!(
                "KvIndex(workers={}, hashes={}, media={:?})",
                ix.num_workers(),
                ix.num_hashes(),
                ix.media().iter().map(|m| m.to_string()).collect::<Vec<_>>()
            )
        })
    }
}

fn ops_list<'py>(py: Python<'py>, events: &[FleetEvent]) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for ev in events {
        let t = match ev {
            FleetEvent::Stored(s) => ("stored", ev.medium(), s.block_hashes.clone()),
            FleetEvent::Removed { block_hashes, .. } => {
                ("removed", ev.medium(), block_hashes.clone())
            }
            FleetEvent::Cleared => ("cleared", None, Vec::new()),
        };
        out.append(PyTuple::new(
            py,
            [
                t.0.into_pyobject(py)?.into_any(),
                t.1.into_pyobject(py)?.into_any(),
                t.2.into_pyobject(py)?.into_any(),
            ],
        )?)?;
    }
    Ok(out)
}

/// `(seq, ts, dp_rank, ops)` of one ZMQ message, ops as `(kind, medium, hashes)`.
#[pyfunction]
#[pyo3(signature = (frames, hash_bytes=None))]
#[allow(clippy::type_complexity)]
pub fn decode_kv_frames<'py>(
    py: Python<'py>,
    frames: &Bound<'py, PyAny>,
    hash_bytes: Option<&Bound<'py, PyAny>>,
) -> PyResult<(u64, f64, Option<i64>, Bound<'py, PyList>)> {
    let form = hash_bytes.map_or(Ok(HashForm::default()), form_of)?;
    let parts = frame_parts(frames).map_err(|m| crate::errors::to_py(Error::InvalidEvent(m)))?;
    let refs: Vec<&[u8]> = parts.iter().map(|p| &**p).collect();
    let (seq, batch) = wire::decode_frames(&refs, form).py_err()?;
    Ok((seq, batch.ts, batch.dp_rank, ops_list(py, &batch.events)?))
}

/// Event objects as `(kind, medium, hashes)` ops (the conversion `KvIndex.apply` uses).
#[pyfunction]
#[pyo3(signature = (events, hash_bytes=None))]
pub fn decode_kv_events<'py>(
    py: Python<'py>,
    events: &Bound<'py, PyAny>,
    hash_bytes: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyList>> {
    let form = hash_bytes.map_or(Ok(HashForm::default()), form_of)?;
    let evs = fleet_events::events(events, form).map_err(|e| {
        crate::errors::to_py(match e {
            ConvError::Bad(m) => Error::InvalidEvent(m),
            ConvError::NoMemory(m) => Error::OutOfMemory(m),
        })
    })?;
    ops_list(py, &evs)
}

/// The longest-prefix walk over Redis holder bitmaps (the Redis backend's queries):
/// `rows[m * n + i]` is the bitmap of block `i` on medium `m` or None; returns per worker
/// of `slots`: (blocks, per-medium blocks flattened, scores).
#[pyfunction]
#[pyo3(signature = (rows, num_media, slots, weights=None))]
#[allow(clippy::type_complexity)]
pub fn fleet_bitmap_walk(
    rows: &Bound<'_, PyAny>,
    num_media: &Bound<'_, PyAny>,
    slots: &Bound<'_, PyAny>,
    weights: Option<Vec<f64>>,
) -> PyResult<(Vec<u32>, Vec<u32>, Vec<f64>)> {
    let nm = usize::try_from(non_negative(num_media, "num_media")?).unwrap_or(usize::MAX);
    if nm > MAX_MEDIA {
        return Err(invalid_input(format!(
            "num_media = {nm} is more than an index holds ({MAX_MEDIA})"
        )));
    }
    if let Some(w) = weights
        .iter()
        .flatten()
        .find(|w| !(w.is_finite() && **w >= 0.0))
    {
        return Err(invalid_input(format!(
            "a medium weight must be a finite number >= 0, got {w}"
        )));
    }
    let slots = convert::u32_list(slots, "slots")?;
    if let Some(&s) = slots.iter().find(|&&s| s >= 1 << 20) {
        return Err(invalid_input(format!("slot {s} is out of range (< 2**20)")));
    }
    let list = rows
        .cast::<PyList>()
        .map_err(|_| invalid_type(format!("rows must be a list, got {}", type_name(rows))))?;
    let mut owned: Vec<Option<PyBackedBytes>> = Vec::with_capacity(list.len());
    for (i, r) in list.iter().enumerate() {
        owned.push(if r.is_none() {
            None
        } else {
            Some(r.extract::<PyBackedBytes>().map_err(|_| {
                invalid_type(format!(
                    "rows[{i}] must be bytes or None, got {}",
                    type_name(&r)
                ))
            })?)
        });
    }
    if nm == 0 && !owned.is_empty() || nm != 0 && owned.len() % nm != 0 {
        return Err(invalid_input(format!(
            "rows has {} entries, not a multiple of num_media = {nm}",
            owned.len()
        )));
    }
    let n = owned.len().checked_div(nm).unwrap_or(0);
    let refs: Vec<Option<&[u8]>> = owned.iter().map(|r| r.as_deref()).collect();
    let r = prefixcache_core::fleet::bitmaps::walk(&refs, nm, n, &slots, weights.as_deref());
    Ok((r.blocks, r.per_medium, r.score))
}

// The argument conversions of `KvIndex`, for the Redis backend (one conversion layer: the
// same rules and messages for both backends). Conversion only.

/// `worker` as `KvIndex` takes it.
#[pyfunction]
pub fn fleet_worker_arg(worker: &Bound<'_, PyAny>) -> PyResult<String> {
    worker_arg(worker).map(|w| w.to_string())
}

/// `medium` as `KvIndex` takes it (None or a str).
#[pyfunction]
pub fn fleet_medium_arg(medium: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    medium_arg(medium).map(|m| m.map(|m| m.to_string()))
}

/// A sequence number argument named `what`, as `KvIndex` takes it (None or an int in
/// `[0, 2**63)`).
#[pyfunction]
#[pyo3(signature = (seq, what=None))]
pub fn fleet_seq_arg(
    seq: &Bound<'_, PyAny>,
    what: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<u64>> {
    let what = match what {
        Some(w) if !w.is_none() => convert::str_arg(w, "what")?,
        _ => "seq".to_owned(),
    };
    opt_seq(Some(seq), &what)
}

/// `now` as `KvIndex` takes it: a finite time, the clock for None.
#[pyfunction]
#[pyo3(signature = (now=None))]
pub fn fleet_now_arg(now: Option<&Bound<'_, PyAny>>) -> PyResult<f64> {
    now_or(now)
}

/// `ttl` as `KvIndex` takes it (None or a positive finite number of seconds).
#[pyfunction]
#[pyo3(signature = (ttl=None))]
pub fn fleet_ttl_arg(ttl: Option<&Bound<'_, PyAny>>) -> PyResult<Option<f64>> {
    let ttl = ttl_of(ttl)?;
    prefixcache_core::fleet::check_ttl(ttl).py_err()?;
    Ok(ttl)
}

/// `hash_bytes` as `KvIndex` takes it (8 to 32).
#[pyfunction]
pub fn fleet_hash_bytes_arg(hash_bytes: &Bound<'_, PyAny>) -> PyResult<usize> {
    form_of(hash_bytes).map(|f| f.hash_bytes)
}

/// A request's block hashes as `KvIndex` queries take them: `hashes`, or `tokens` with a
/// `hasher`.
#[pyfunction]
#[pyo3(signature = (hash_bytes, hashes=None, tokens=None, hasher=None))]
pub fn fleet_request_hashes(
    py: Python<'_>,
    hash_bytes: &Bound<'_, PyAny>,
    hashes: Option<&Bound<'_, PyAny>>,
    tokens: Option<&Bound<'_, PyAny>>,
    hasher: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<u64>> {
    let form = form_of(hash_bytes)?;
    request_hashes(py, form, hashes, tokens, hasher)
}

/// `weights` as `KvIndex` takes them: None, or `(medium, weight)` pairs.
#[pyfunction]
#[pyo3(signature = (weights=None))]
pub fn fleet_weights_arg(
    weights: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<Vec<(String, f64)>>> {
    weights_arg(weights)
}

/// The `k` of `top_k` as `KvIndex` takes it (1 for None).
#[pyfunction]
#[pyo3(signature = (k=None))]
pub fn fleet_k_arg(k: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
    k_arg(k)
}

/// A bool argument named `what` (e.g. `include_unhealthy`), as `KvIndex` takes it.
#[pyfunction]
pub fn fleet_flag_arg(obj: &Bound<'_, PyAny>, what: &Bound<'_, PyAny>) -> PyResult<bool> {
    convert::flag_arg(obj, &convert::str_arg(what, "what")?)
}
