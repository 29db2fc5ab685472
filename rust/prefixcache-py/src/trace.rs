//! Trace helpers: the tokens of a prompt named by block ids.

use numpy::PyArray1;
use prefixcache_core::trace::expand_block_ids as expand;
use pyo3::prelude::*;

use crate::convert;
use crate::errors::IntoPyResult;

/// The first `length` tokens of the prompt made of blocks `block_ids` (any integer form),
/// block `b` standing for tokens `b * tokens_per_id ..` (uint32 array).
#[pyfunction]
pub fn expand_block_ids<'py>(
    py: Python<'py>,
    block_ids: &Bound<'py, PyAny>,
    tokens_per_id: &Bound<'py, PyAny>,
    length: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyArray1<u32>>> {
    let per = convert::u32_arg(tokens_per_id, "tokens_per_id")?;
    let len = convert::size_arg(length, "length")?;
    let ids = convert::tokens(block_ids, "block_ids")?;
    let out = expand(ids.as_slice(), per, len).py_err()?;
    Ok(PyArray1::from_vec(py, out))
}
