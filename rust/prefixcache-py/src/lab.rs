//! `LabCache` and `lab_block_keys`: bindings of `prefixcache_core::lab` (not an engine
//! rule: the simulator's eviction and admission lab). Argument and error mapping only.

use numpy::{PyArray1, PyReadonlyArray1};
use prefixcache_core::lab::{block_keys, Admission, LabCache as Core, NextUse, Rule};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{invalid_input, invalid_type, IntoPyResult};
use crate::shared::Shared;

/// A non-negative integer argument below 2**64 (Python ints only: no bools or floats).
fn uint(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    if obj.is_instance_of::<pyo3::types::PyBool>() {
        return Err(invalid_type(format!("{what} must be an int, got bool")));
    }
    let v: i128 = obj.extract().map_err(|_| {
        let tn = obj
            .get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_else(|_| "?".to_owned());
        invalid_type(format!("{what} must be an int, got {tn}"))
    })?;
    u64::try_from(v).map_err(|_| invalid_input(format!("{what} must be in [0, 2**64), got {v}")))
}

/// [`uint`] as a count of blocks or tokens.
fn size(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<usize> {
    usize::try_from(uint(obj, what)?).map_err(|_| invalid_input(format!("{what} is too large")))
}

/// The chained 64-bit keys of the full blocks of `tokens` (uint32), from namespace `seed`.
#[pyfunction]
#[pyo3(signature = (tokens, block_size, seed = None))]
pub fn lab_block_keys<'py>(
    py: Python<'py>,
    tokens: PyReadonlyArray1<'py, u32>,
    block_size: &Bound<'py, PyAny>,
    seed: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArray1<u64>>> {
    let block_size = size(block_size, "block_size")?;
    let seed = match seed {
        Some(s) => uint(s, "seed")?,
        None => 0,
    };
    if block_size == 0 {
        return Err(invalid_input("block_size must be >= 1".to_owned()));
    }
    let keys = block_keys(tokens.as_slice()?, block_size, seed);
    Ok(PyArray1::from_vec(py, keys))
}

/// A prefix-closed block cache with a lab eviction rule and admission filter.
#[pyclass(frozen, module = "prefixcache._core")]
pub struct LabCache {
    inner: Shared<Core>,
}

#[pymethods]
impl LabCache {
    #[new]
    #[pyo3(signature = (capacity, rule = "lru", admit_after = None, overcommit = false,
                        protected = 0.8, depth_cost = 0.0, min_hit = 0.25))]
    fn new(
        capacity: &Bound<'_, PyAny>,
        rule: &str,
        admit_after: Option<&Bound<'_, PyAny>>,
        overcommit: bool,
        protected: f64,
        depth_cost: f64,
        min_hit: f64,
    ) -> PyResult<Self> {
        let capacity = size(capacity, "capacity")?;
        let admit_after = match admit_after {
            Some(a) => u32::try_from(uint(a, "admit_after")?)
                .map_err(|_| invalid_input("admit_after must be below 2**32"))?,
            None => 1,
        };
        let rule = Rule::parse(rule, protected, depth_cost, min_hit).py_err()?;
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

    fn set_overcommit(&self, py: Python<'_>, on: bool) -> PyResult<()> {
        self.inner.with(py, |c| c.set_overcommit(on))
    }

    /// The future for the opt rule: every request's keys back to back (request r's from
    /// `offsets[r]` to `offsets[r + 1]`), the first `hittable[r]` of them hittable.
    fn set_future(
        &self,
        py: Python<'_>,
        keys: PyReadonlyArray1<'_, u64>,
        offsets: PyReadonlyArray1<'_, u64>,
        hittable: PyReadonlyArray1<'_, u32>,
    ) -> PyResult<()> {
        let f =
            NextUse::new(keys.as_slice()?, offsets.as_slice()?, hittable.as_slice()?).py_err()?;
        self.inner.with(py, |c| c.set_future(f))
    }

    fn lookup(
        &self,
        py: Python<'_>,
        keys: PyReadonlyArray1<'_, u64>,
        hittable: usize,
    ) -> PyResult<usize> {
        let k = keys.as_slice()?;
        self.inner.with(py, |c| c.lookup(k, hittable))
    }

    /// Hit in blocks, or None (nothing changed) when the budget is short.
    fn acquire(
        &self,
        py: Python<'_>,
        rid: &Bound<'_, PyAny>,
        keys: PyReadonlyArray1<'_, u64>,
        hittable: &Bound<'_, PyAny>,
        total: &Bound<'_, PyAny>,
    ) -> PyResult<Option<usize>> {
        let rid = uint(rid, "rid")?;
        let hittable = size(hittable, "hittable")?;
        let total = size(total, "total")?;
        let k = keys.as_slice()?;
        self.inner
            .with(py, |c| c.acquire(rid, k, hittable, total))?
            .py_err()
    }

    fn grow(
        &self,
        py: Python<'_>,
        rid: &Bound<'_, PyAny>,
        keys: PyReadonlyArray1<'_, u64>,
        total: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let rid = uint(rid, "rid")?;
        let total = size(total, "total")?;
        let k = keys.as_slice()?;
        self.inner.with(py, |c| c.grow(rid, k, total))?.py_err()
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
