//! `LabCache` and `lab_block_keys`: bindings of `prefixcache_core::lab` (not an engine
//! rule: the simulator's eviction and admission lab). Argument and error mapping only.

use numpy::PyArray1;
use prefixcache_core::lab::{block_keys, Admission, LabCache as Core, NextUse, Rule};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::convert;
use crate::errors::{invalid_input, IntoPyResult};
use crate::shared::Shared;

/// A non-negative integer argument below 2**64 (the one conversion layer's rules).
fn uint(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    convert::int_in(obj, what, 0, convert::U64_MAX).map(|v| v as u64)
}

/// The chained 64-bit keys of the full blocks of `tokens` (uint32), from namespace `seed`.
#[pyfunction]
#[pyo3(signature = (tokens, block_size, seed = None))]
pub fn lab_block_keys<'py>(
    py: Python<'py>,
    tokens: &Bound<'py, PyAny>,
    block_size: &Bound<'py, PyAny>,
    seed: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArray1<u64>>> {
    let block_size = convert::size_arg(block_size, "block_size")?;
    let seed = match seed {
        Some(s) => uint(s, "seed")?,
        None => 0,
    };
    if block_size == 0 {
        return Err(invalid_input("block_size must be >= 1".to_owned()));
    }
    let tokens = convert::tokens(tokens, "tokens")?;
    let keys = block_keys(tokens.as_slice(), block_size, seed);
    Ok(PyArray1::from_vec(py, keys))
}

/// A prefix-closed block cache with a lab eviction rule and admission filter.
#[pyclass(frozen, module = "prefixcache._core")]
pub struct LabCache {
    inner: Shared<Core>,
}

/// The eviction rule's name: a str that is valid text.
fn rule_arg(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    convert::str_arg(obj, "rule")
}

#[pymethods]
impl LabCache {
    #[new]
    #[pyo3(signature = (capacity, rule = String::from("lru"), admit_after = None,
                        overcommit = false, protected = 0.8, depth_cost = 0.0, min_hit = 0.25),
           text_signature = "(capacity, rule='lru', admit_after=None, overcommit=False, \
                             protected=0.8, depth_cost=0.0, min_hit=0.25)")]
    fn new(
        capacity: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = rule_arg)] rule: String,
        admit_after: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = convert::overcommit)] overcommit: bool,
        protected: f64,
        depth_cost: f64,
        min_hit: f64,
    ) -> PyResult<Self> {
        let capacity = convert::size_arg(capacity, "capacity")?;
        let admit_after = match admit_after {
            Some(a) => u32::try_from(uint(a, "admit_after")?)
                .map_err(|_| invalid_input("admit_after must be below 2**32"))?,
            None => 1,
        };
        let rule = Rule::parse(&rule, protected, depth_cost, min_hit).py_err()?;
        let admission = if admit_after <= 1 {
            Admission::All
        } else {
            Admission::Seen(admit_after)
        };
        Ok(LabCache {
            inner: Shared::new("LabCache", Core::new(capacity, rule, admission, overcommit)),
        })
    }

    #[getter]
    fn capacity(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.with(py, |c| c.capacity())
    }

    #[getter]
    fn num_free(&self, py: Python<'_>) -> PyResult<i64> {
        self.inner.with(py, |c| c.num_free())
    }

    /// Blocks in use: cached plus held by requests.
    #[getter]
    fn num_used(&self, py: Python<'_>) -> PyResult<u64> {
        self.inner.with(py, |c| c.stats().used)
    }

    /// Cached blocks evicted so far.
    #[getter]
    fn num_evicted(&self, py: Python<'_>) -> PyResult<u64> {
        self.inner.with(py, |c| c.stats().evicted)
    }

    #[getter]
    fn num_evictable(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.with(py, |c| c.num_evictable())
    }

    fn set_overcommit(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = convert::overcommit)] on: bool,
    ) -> PyResult<()> {
        self.inner.with(py, |c| c.set_overcommit(on))?.py_err()
    }

    /// The future for the opt rule: every request's keys back to back (request r's from
    /// `offsets[r]` to `offsets[r + 1]`), the first `hittable[r]` of them hittable.
    fn set_future(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        offsets: &Bound<'_, PyAny>,
        hittable: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let offsets = convert::u64_array(offsets, "offsets")?;
        let hittable = convert::u32_array(hittable, "hittable")?;
        // The keys (every block of the sequence) are read in place, not copied.
        let keys = convert::u64_array_view(keys, "keys")?;
        let Ok(slice) = keys.as_slice() else {
            return Err(invalid_input("keys must be contiguous"));
        };
        let f = NextUse::new(slice, &offsets, &hittable).py_err()?;
        drop(keys);
        self.inner.with(py, |c| c.set_future(f))
    }

    fn lookup(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        hittable: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let hittable = convert::size_arg(hittable, "hittable")?;
        let k = convert::u64_array(keys, "keys")?;
        self.inner.with(py, |c| c.lookup(&k, hittable))
    }

    /// Hit in blocks, or None (nothing changed) when the budget is short.
    fn acquire(
        &self,
        py: Python<'_>,
        rid: &Bound<'_, PyAny>,
        keys: &Bound<'_, PyAny>,
        hittable: &Bound<'_, PyAny>,
        total: &Bound<'_, PyAny>,
    ) -> PyResult<Option<usize>> {
        let rid = uint(rid, "rid")?;
        let hittable = convert::size_arg(hittable, "hittable")?;
        let total = convert::size_arg(total, "total")?;
        let k = convert::u64_array(keys, "keys")?;
        self.inner
            .with(py, |c| c.acquire(rid, &k, hittable, total))?
            .py_err()
    }

    fn grow(
        &self,
        py: Python<'_>,
        rid: &Bound<'_, PyAny>,
        keys: &Bound<'_, PyAny>,
        total: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let rid = uint(rid, "rid")?;
        let total = convert::size_arg(total, "total")?;
        let k = convert::u64_array(keys, "keys")?;
        self.inner.with(py, |c| c.grow(rid, &k, total))?.py_err()
    }

    fn release(&self, py: Python<'_>, rid: &Bound<'_, PyAny>) -> PyResult<()> {
        let rid = uint(rid, "rid")?;
        self.inner.with(py, |c| c.release(rid))?.py_err()
    }

    /// Counters: evicted, not_admitted, cached, used, hit_blocks (blocks).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.with(py, |c| c.stats())?;
        let d = PyDict::new(py);
        d.set_item("evicted", s.evicted)?;
        d.set_item("not_admitted", s.not_admitted)?;
        d.set_item("cached", s.cached)?;
        d.set_item("used", s.used)?;
        d.set_item("hit_blocks", s.hit_blocks)?;
        Ok(d)
    }

    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        self.inner.with(py, |c| c.check_invariants())?.py_err()
    }
}
