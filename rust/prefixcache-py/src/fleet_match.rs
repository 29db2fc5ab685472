//! `FleetMatch`: the answer of `KvIndex.longest_prefix`, read by worker name.

use prefixcache_core::fleet::{FleetMatch, WorkerMatch};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::to_py;

/// Each worker's longest held prefix of one request (in blocks), per medium and on any
/// medium, its score and its health.
#[pyclass(name = "FleetMatch", module = "prefixcache._core", frozen)]
pub struct PyFleetMatch {
    pub inner: FleetMatch,
}

impl PyFleetMatch {
    fn get(&self, worker: &str) -> PyResult<&WorkerMatch> {
        self.inner
            .workers
            .iter()
            .find(|w| &*w.worker == worker)
            .ok_or_else(|| {
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
        self.inner
            .workers
            .iter()
            .map(|w| w.worker.to_string())
            .collect()
    }

    /// Longest prefix `worker` holds: on `medium`, or with every block on some medium.
    #[pyo3(signature = (worker, medium=None))]
    fn blocks(&self, worker: &str, medium: Option<&str>) -> PyResult<u32> {
        let w = self.get(worker)?;
        Ok(match medium {
            None => w.blocks,
            Some(m) => self
                .inner
                .media
                .iter()
                .position(|x| &**x == m)
                .and_then(|i| w.per_medium.get(i).copied())
                .unwrap_or(0),
        })
    }

    fn score(&self, worker: &str) -> PyResult<f64> {
        Ok(self.get(worker)?.score)
    }

    fn stale(&self, worker: &str) -> PyResult<bool> {
        Ok(self.get(worker)?.stale)
    }

    fn expired(&self, worker: &str) -> PyResult<bool> {
        Ok(self.get(worker)?.expired)
    }

    /// `{worker: {"blocks", "media": {medium: blocks}, "score", "stale", "expired"}}`.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        for w in &self.inner.workers {
            let d = PyDict::new(py);
            d.set_item("blocks", w.blocks)?;
            let media = PyDict::new(py);
            for (m, n) in self.inner.media.iter().zip(&w.per_medium) {
                media.set_item(&**m, *n)?;
            }
            d.set_item("media", media)?;
            d.set_item("score", w.score)?;
            d.set_item("stale", w.stale)?;
            d.set_item("expired", w.expired)?;
            out.set_item(&*w.worker, d)?;
        }
        Ok(out)
    }

    fn __len__(&self) -> usize {
        self.inner.workers.len()
    }

    fn __repr__(&self) -> String {
        let best = self.inner.workers.iter().max_by_key(|w| w.blocks);
        match best {
            Some(w) => format!(
                "FleetMatch(num_blocks={}, workers={}, best={:?} with {} blocks)",
                self.inner.num_blocks,
                self.inner.workers.len(),
                &*w.worker,
                w.blocks
            ),
            None => format!(
                "FleetMatch(num_blocks={}, workers=0)",
                self.inner.num_blocks
            ),
        }
    }
}
