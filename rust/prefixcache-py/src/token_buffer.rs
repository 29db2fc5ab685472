//! `TokenBuffer`: a request's token ids, converted once and passed to every call as-is.

use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::exceptions::{PyIndexError, PyMemoryError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PySlice, PyTuple};

use crate::convert;

/// A growable buffer of token ids (u32), converted once from any accepted form. Every
/// method that takes tokens accepts it without converting again; a call sees the tokens
/// as they were when it started (appends by other threads meanwhile do not change it).
#[pyclass(frozen, module = "prefixcache._core")]
pub struct TokenBuffer {
    /// Copy-on-write: a call takes a snapshot (one reference count); an append while a
    /// snapshot is alive copies the buffer first, so snapshots never change.
    inner: Mutex<Arc<Vec<u32>>>,
}

impl TokenBuffer {
    fn lock(&self) -> PyResult<MutexGuard<'_, Arc<Vec<u32>>>> {
        // Only held for a push or a reference-count increment (no Python code, no
        // panic), so it is never poisoned in practice; if it were, report it.
        self.inner
            .lock()
            .map_err(|_| PyRuntimeError::new_err("TokenBuffer is unusable (poisoned lock)"))
    }

    /// The tokens now, shared (no copy).
    pub fn snapshot(&self) -> Arc<Vec<u32>> {
        match self.inner.lock() {
            Ok(g) => Arc::clone(&g),
            Err(p) => Arc::clone(&p.into_inner()),
        }
    }

    fn extend_with(&self, more: &[u32]) -> PyResult<()> {
        let mut g = self.lock()?;
        let len = g.len();
        let v = unshared(&mut g, len, more.len())?;
        v.try_reserve(more.len())
            .map_err(|_| PyMemoryError::new_err("cannot grow the TokenBuffer"))?;
        v.extend_from_slice(more);
        Ok(())
    }
}

/// The buffer to change in place: `Arc::make_mut` with a fallible copy (of the first
/// `keep` tokens, with room for `more`) when a snapshot still shares it, so that a
/// buffer no memory can copy raises MemoryError instead of aborting the process.
fn unshared(a: &mut Arc<Vec<u32>>, keep: usize, more: usize) -> PyResult<&mut Vec<u32>> {
    if Arc::get_mut(a).is_none() {
        let keep = keep.min(a.len());
        let mut v = Vec::new();
        keep.checked_add(more)
            .and_then(|n| v.try_reserve_exact(n).ok())
            .ok_or_else(|| PyMemoryError::new_err("cannot copy the TokenBuffer"))?;
        v.extend_from_slice(&a[..keep]);
        *a = Arc::new(v);
    }
    Arc::get_mut(a).ok_or_else(|| PyMemoryError::new_err("cannot copy the TokenBuffer"))
}

#[pymethods]
impl TokenBuffer {
    /// A buffer holding `tokens` (any accepted form; empty by default).
    #[new]
    #[pyo3(signature = (tokens = None))]
    fn new(tokens: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let v = match tokens {
            Some(t) if !t.is_none() => convert::token_vec(t, "tokens")?,
            _ => Vec::new(),
        };
        Ok(TokenBuffer {
            inner: Mutex::new(Arc::new(v)),
        })
    }

    /// Appends one token id.
    fn append(&self, token: &Bound<'_, PyAny>) -> PyResult<()> {
        let t = convert::u32_arg(token, "token")?;
        self.extend_with(&[t])
    }

    /// Appends token ids (any accepted form).
    fn extend(&self, tokens: &Bound<'_, PyAny>) -> PyResult<()> {
        if let Ok(b) = tokens.cast::<TokenBuffer>() {
            let more = b.get().snapshot();
            return self.extend_with(&more);
        }
        let more = convert::token_vec(tokens, "tokens")?;
        self.extend_with(&more)
    }

    /// Keeps the first `length` tokens (no-op when it holds fewer).
    fn truncate(&self, length: &Bound<'_, PyAny>) -> PyResult<()> {
        let n = convert::size_arg(length, "length")?;
        let mut g = self.lock()?;
        if n < g.len() {
            unshared(&mut g, n, 0)?.truncate(n);
        }
        Ok(())
    }

    /// Removes every token.
    fn clear(&self) -> PyResult<()> {
        let mut g = self.lock()?;
        *g = Arc::new(Vec::new());
        Ok(())
    }

    fn __len__(&self) -> usize {
        self.snapshot().len()
    }

    /// The token at `index` (negative indices count from the end), or a new buffer of
    /// the tokens a slice names.
    fn __getitem__<'py>(&self, index: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = index.py();
        let s = self.snapshot();
        if let Ok(sl) = index.cast::<PySlice>() {
            let n = isize::try_from(s.len())
                .map_err(|_| PyMemoryError::new_err("TokenBuffer too large to slice"))?;
            if sl.getattr("step")?.eq(0)? {
                return Err(crate::errors::invalid_input("slice step cannot be zero"));
            }
            let ix = sl.indices(n)?;
            let mut v = Vec::new();
            v.try_reserve_exact(ix.slicelength)
                .map_err(|_| PyMemoryError::new_err("cannot allocate the slice"))?;
            let mut i = ix.start;
            for _ in 0..ix.slicelength {
                // In [0, len): `indices` clamps start and step to the buffer.
                v.push(s[i as usize]);
                i += ix.step;
            }
            let b = TokenBuffer {
                inner: Mutex::new(Arc::new(v)),
            };
            return Ok(Bound::new(py, b)?.into_any());
        }
        let i = convert::i64_arg(index, "index")?;
        let n = s.len() as i64;
        let j = if i < 0 { i + n } else { i };
        if j < 0 || j >= n {
            return Err(PyIndexError::new_err("TokenBuffer index out of range"));
        }
        Ok(s[j as usize].into_pyobject(py)?.into_any())
    }

    /// Equal to another `TokenBuffer` holding the same tokens (other forms compare
    /// unequal: convert them first). Unhashable, as a list: its contents change.
    fn __eq__(&self, other: &Bound<'_, Self>) -> bool {
        *self.snapshot() == *other.get().snapshot()
    }

    /// numpy's array protocol: the tokens as a new uint32 array (`np.asarray(buf)`).
    /// `copy=False` is refused, as numpy asks: the tokens are always copied.
    #[pyo3(signature = (dtype = None, copy = None))]
    fn __array__<'py>(
        &self,
        py: Python<'py>,
        dtype: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if copy == Some(false) {
            return Err(PyValueError::new_err(
                "a TokenBuffer cannot be viewed without a copy (copy=False)",
            ));
        }
        let a = numpy::PyArray1::from_slice(py, &self.snapshot()).into_any();
        match dtype {
            Some(d) if !d.is_none() => a.call_method1("astype", (d,)),
            _ => Ok(a),
        }
    }

    /// Pickles as its tokens (a uint32 array).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let a = numpy::PyArray1::from_slice(py, &slf.get().snapshot());
        PyTuple::new(
            py,
            [slf.get_type().into_any(), PyTuple::new(py, [a])?.into_any()],
        )
    }

    /// The tokens as a list of ints.
    fn tolist<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.snapshot().iter())
    }

    /// The tokens as a new uint32 numpy array (a copy).
    fn numpy<'py>(&self, py: Python<'py>) -> Bound<'py, numpy::PyArray1<u32>> {
        numpy::PyArray1::from_slice(py, &self.snapshot())
    }

    fn __repr__(&self) -> String {
        format!("TokenBuffer(len={})", self.snapshot().len())
    }
}
