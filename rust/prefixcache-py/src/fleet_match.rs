//! `FleetMatch`: the answer of `KvIndex.longest_prefix`, read by worker name.

use prefixcache_core::fleet::FleetMatch;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use pyo3::types::PyDict;

use crate::errors::to_py;
use crate::kv_index::{medium_arg, worker_arg};

/// Each worker's longest held prefix of one request (in blocks), per medium and on any
/// medium, its score and its health.
#[pyclass(name = "FleetMatch", module = "prefixcache._core", frozen)]
pub struct PyFleetMatch {
    pub inner: FleetMatch,
}

impl PyFleetMatch {
    fn pos(&self, worker: &str) -> PyResult<usize> {
        self.inner.position(worker).ok_or_else(|| {
            to_py(prefixcache_core::Error::UnknownWorker(format!(
                "unknown worker {worker:?}"
            )))
        })
    }
}

#[pymethods]
impl PyFleetMatch {
    /// Number of blocks in the request.
    #[getter]
    fn num_blocks(&self) -> usize {
        self.inner.num_blocks
    }

    /// The media known to the index when the query ran, in the index's order.
    #[getter]
    fn media(&self) -> Vec<String> {
        self.inner.media.iter().map(|m| m.to_string()).collect()
    }

    /// Worker names, in the index's slot order.
    #[getter]
    fn workers(&self) -> Vec<String> {
        self.inner.workers.iter().map(|w| w.to_string()).collect()
    }

    /// Longest prefix `worker` holds: on `medium`, or with every block on some medium.
    #[pyo3(signature = (worker, medium=None))]
    fn blocks(
        &self,
        #[pyo3(from_py_with = worker_arg)] worker: PyBackedStr,
        #[pyo3(from_py_with = medium_arg)] medium: Option<PyBackedStr>,
    ) -> PyResult<u32> {
        let i = self.pos(&worker)?;
        Ok(match medium.as_deref() {
            None => self.inner.blocks[i],
            Some(m) => match self.inner.media.iter().position(|x| &**x == m) {
                Some(k) => self.inner.per_medium[i * self.inner.media.len() + k],
                None => 0,
            },
        })
    }

    fn score(&self, #[pyo3(from_py_with = worker_arg)] worker: PyBackedStr) -> PyResult<f64> {
        Ok(self.inner.score[self.pos(&worker)?])
    }

    fn stale(&self, #[pyo3(from_py_with = worker_arg)] worker: PyBackedStr) -> PyResult<bool> {
        Ok(self.inner.stale[self.pos(&worker)?])
    }

    fn expired(&self, #[pyo3(from_py_with = worker_arg)] worker: PyBackedStr) -> PyResult<bool> {
        Ok(self.inner.expired[self.pos(&worker)?])
    }

    /// `{worker: {"blocks", "media": {medium: blocks}, "score", "stale", "expired"}}`.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        let nm = self.inner.media.len();
        for (i, w) in self.inner.workers.iter().enumerate() {
            let d = PyDict::new(py);
            d.set_item("blocks", self.inner.blocks[i])?;
            let media = PyDict::new(py);
            for (k, m) in self.inner.media.iter().enumerate() {
                media.set_item(&**m, self.inner.per_medium[i * nm + k])?;
            }
            d.set_item("media", media)?;
            d.set_item("score", self.inner.score[i])?;
            d.set_item("stale", self.inner.stale[i])?;
            d.set_item("expired", self.inner.expired[i])?;
            out.set_item(&**w, d)?;
        }
        Ok(out)
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn __repr__(&self) -> String {
        let best = (0..self.inner.len()).max_by_key(|&i| (self.inner.blocks[i], usize::MAX - i));
        match best {
            Some(i) => format!(
                "FleetMatch(num_blocks={}, workers={}, best={:?} with {} blocks)",
                self.inner.num_blocks,
                self.inner.len(),
                &*self.inner.workers[i],
                self.inner.blocks[i]
            ),
            None => format!(
                "FleetMatch(num_blocks={}, workers=0)",
                self.inner.num_blocks
            ),
        }
    }
}
