//! `BlockHasher` and `hash_block_tokens`: vLLM v1 chained block hashes
//! (prefixcache_core::hash). Argument and error mapping only.

use prefixcache_core::hash::{BigInt, BlockHash, BlockHasher, HashAlgo, KeyValue};
use prefixcache_core::Error;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyInt, PyList, PyString, PyTuple};

use crate::convert;
use crate::convert::type_name;
use crate::errors::{invalid_input, invalid_type, to_py, IntoPyResult};

/// Nesting deeper than this is refused (vLLM's keys are at most two levels deep).
const MAX_DEPTH: usize = 64;

/// Token counts from which hashing runs with the GIL released: hashing costs ~3 (xxh3)
/// to ~7 (sha256) ns per token (>= ~3-7 us from 1024 tokens), releasing the GIL ~35 ns,
/// copying the tokens out of a numpy array (needed once the GIL is released) ~0.05 ns per
/// token (docs/BENCHMARKS.md, "Threads and the GIL").
const DETACH_MIN_TOKENS: usize = 1024;

fn unsupported(msg: String) -> PyErr {
    to_py(Error::UnsupportedHashInput(msg))
}

/// Where a value sits, for messages: a root name and the indices below it. Formatted
/// only when an error is raised.
struct At<'a> {
    root: &'a str,
    path: Vec<usize>,
}

impl std::fmt::Display for At<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.root)?;
        for i in &self.path {
            write!(f, "[{i}]")?;
        }
        Ok(())
    }
}

/// One extra-key value.
fn key_value(obj: &Bound<'_, PyAny>, at: &mut At<'_>) -> PyResult<KeyValue> {
    if obj.is_none() {
        return Ok(KeyValue::None);
    }
    if obj.is_exact_instance_of::<PyString>() {
        let s = obj.cast::<PyString>()?;
        return match s.to_str() {
            Ok(v) => Ok(KeyValue::Str(v.to_owned())),
            Err(_) => Err(unsupported(format!(
                "{at}: str with lone surrogates cannot be hashed (not valid UTF-8)"
            ))),
        };
    }
    if obj.is_exact_instance_of::<PyTuple>() {
        if at.path.len() >= MAX_DEPTH {
            return Err(unsupported(format!(
                "{at}: tuples nested more than {MAX_DEPTH} deep"
            )));
        }
        let t = obj.cast::<PyTuple>()?;
        let mut items = Vec::with_capacity(t.len());
        at.path.push(0);
        for (i, item) in t.iter().enumerate() {
            if let Some(last) = at.path.last_mut() {
                *last = i;
            }
            items.push(key_value(&item, at)?);
        }
        at.path.pop();
        return Ok(KeyValue::Tuple(items));
    }
    if obj.is_exact_instance_of::<PyBool>() {
        return Ok(KeyValue::Bool(obj.is_truthy()?));
    }
    if obj.is_exact_instance_of::<PyInt>() {
        if let Ok(v) = obj.extract::<i64>() {
            return Ok(KeyValue::Int(v));
        }
        // Any size: two's-complement little-endian bytes from int.to_bytes.
        let bits: usize = obj.call_method0("bit_length")?.extract()?;
        let kwargs = PyDict::new(obj.py());
        kwargs.set_item("signed", true)?;
        let data = obj.call_method("to_bytes", (bits / 8 + 1, "little"), Some(&kwargs))?;
        let bytes: Vec<u8> = data.extract()?;
        return Ok(KeyValue::BigInt(BigInt::from_signed_le(&bytes)));
    }
    if obj.is_exact_instance_of::<PyBytes>() {
        return Ok(KeyValue::Bytes(obj.cast::<PyBytes>()?.as_bytes().to_vec()));
    }
    Err(unsupported(format!(
        "{at}: unsupported type {} (extra keys hold None, bool, int, str, bytes and \
         tuples of them; lists must be converted to tuples)",
        type_name(obj)
    )))
}

/// One block's extra keys: None, or a tuple of key values; `root` names the argument in
/// error messages. (Also used by the block-pool bindings.)
pub(crate) fn block_keys(obj: &Bound<'_, PyAny>, root: &str) -> PyResult<Option<Vec<KeyValue>>> {
    block_keys_at(
        obj,
        &mut At {
            root,
            path: Vec::new(),
        },
    )
}

fn block_keys_at(obj: &Bound<'_, PyAny>, at: &mut At<'_>) -> PyResult<Option<Vec<KeyValue>>> {
    if obj.is_none() {
        return Ok(None);
    }
    if !obj.is_exact_instance_of::<PyTuple>() {
        return Err(unsupported(format!(
            "{at}: a block's extra keys must be None or a tuple, not {}",
            type_name(obj)
        )));
    }
    match key_value(obj, at)? {
        KeyValue::Tuple(items) => Ok(Some(items)),
        _ => Ok(None), // unreachable: a tuple converts to a tuple
    }
}

/// One block's extra keys given as the `extra_keys` argument.
fn single_block_keys(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Vec<KeyValue>>> {
    match obj {
        Some(obj) => block_keys(obj, "extra_keys"),
        None => Ok(None),
    }
}

/// Per-block extra keys: None, or a sequence (list/tuple) with one entry per block.
/// (Also used by the block-pool bindings.)
pub(crate) fn all_block_keys(
    obj: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<Vec<Option<Vec<KeyValue>>>>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    if !(obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>()) {
        return Err(invalid_type(format!(
            "extra_keys must be None or a list with one entry per block, not {}",
            type_name(obj)
        )));
    }
    let mut out = Vec::with_capacity(obj.len()?);
    let mut at = At {
        root: "extra_keys",
        path: vec![0],
    };
    for (i, item) in obj.try_iter()?.enumerate() {
        at.path.truncate(1);
        if let Some(first) = at.path.first_mut() {
            *first = i;
        }
        out.push(block_keys_at(&item?, &mut at)?);
    }
    Ok(Some(out))
}

fn parent_hash(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<BlockHash>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let Ok(b) = obj.cast::<PyBytes>() else {
        return Err(invalid_type(format!(
            "parent must be bytes or None, not {}",
            type_name(obj)
        )));
    };
    if b.as_bytes().is_empty() {
        // vLLM: an empty (falsy) parent is the root, hashed with NONE_HASH.
        return Ok(None);
    }
    BlockHash::from_bytes(b.as_bytes())
        .map(Some)
        .ok_or_else(|| {
            invalid_input(format!(
                "parent hash has {} bytes (at most 32)",
                b.as_bytes().len()
            ))
        })
}

// Every argument is converted by a `from_py_with` extractor, so that pyo3 converts them
// in argument order: the first bad argument is the one named, and a later argument's
// hook (`__index__`) runs after the earlier ones were read.

/// The `algo` argument: one of the algorithm names (checked as it is read, before the
/// later arguments).
fn algo_arg(obj: &Bound<'_, PyAny>) -> PyResult<HashAlgo> {
    HashAlgo::from_name(&convert::algo(obj)?).py_err()
}

/// The `parent` argument: bytes, or None / empty bytes for NONE_HASH.
fn parent_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<BlockHash>> {
    parent_hash(Some(obj))
}

/// The `tokens` argument: token ids, any form.
fn tokens_arg(obj: &Bound<'_, PyAny>) -> PyResult<convert::Tokens> {
    convert::tokens(obj, "tokens")
}

/// The `extra_keys` argument of a one-block call: None or a tuple of key values.
fn block_extra_keys_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<Vec<KeyValue>>> {
    single_block_keys(Some(obj))
}

/// The `extra_keys` argument of a many-block call: None, or one entry per block.
fn all_extra_keys_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<Vec<Option<Vec<KeyValue>>>>> {
    all_block_keys(Some(obj))
}

/// vLLM v1's chained block hashes for one algorithm, block size and NONE_HASH seed.
///
/// SHA-256 hashes of blocks without extra keys (up to 16 tokens) go through a table of
/// recent hashes that each hashing thread keeps (576 KB, from its first such hash): a
/// block hashed before (a shared prefix) costs a lookup instead of SHA-256, with the
/// same result.
#[pyclass(frozen, name = "BlockHasher", module = "prefixcache._core")]
pub struct PyBlockHasher {
    pub(crate) inner: BlockHasher,
}

#[pymethods]
impl PyBlockHasher {
    #[new]
    #[pyo3(signature = (block_size=16, algo=HashAlgo::Sha256, seed=None))]
    #[pyo3(text_signature = "(block_size=16, algo='sha256', seed=None)")]
    fn new(
        #[pyo3(from_py_with = convert::block_size)] block_size: usize,
        #[pyo3(from_py_with = algo_arg)] algo: HashAlgo,
        #[pyo3(from_py_with = convert::seed)] seed: Option<String>,
    ) -> PyResult<Self> {
        let inner = BlockHasher::new(algo, block_size, &convert::seed_or_default(seed)).py_err()?;
        Ok(PyBlockHasher { inner })
    }

    /// NONE_HASH: the parent of the first block.
    #[getter]
    fn none_hash<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.inner.none_hash().as_bytes())
    }

    #[getter]
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }

    #[getter]
    fn algo(&self) -> &'static str {
        self.inner.algo().name()
    }

    #[getter]
    fn seed(&self) -> &str {
        self.inner.seed()
    }

    /// Hashes of the full blocks of `tokens` (a partial tail is not hashed).
    #[pyo3(signature = (tokens, extra_keys=None, parent=None))]
    fn hash_blocks<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = tokens_arg)] tokens: convert::Tokens,
        #[pyo3(from_py_with = all_extra_keys_arg)] extra_keys: Option<Vec<Option<Vec<KeyValue>>>>,
        #[pyo3(from_py_with = parent_arg)] parent: Option<BlockHash>,
    ) -> PyResult<Bound<'py, PyList>> {
        let extra = extra_keys;
        let inner = &self.inner;
        let extra = extra.as_deref();
        let parent = parent.as_ref();
        let hashes = if tokens.len() >= DETACH_MIN_TOKENS {
            let toks = tokens.as_slice();
            py.detach(|| inner.hash_blocks(toks, extra, parent))
        } else {
            inner.hash_blocks(tokens.as_slice(), extra, parent)
        }
        .py_err()?;
        PyList::new(py, hashes.iter().map(|h| PyBytes::new(py, h.as_bytes())))
    }

    /// The hash of one full block (exactly `block_size` tokens).
    #[pyo3(signature = (parent, tokens, extra_keys=None))]
    fn hash_block<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = parent_arg)] parent: Option<BlockHash>,
        #[pyo3(from_py_with = tokens_arg)] tokens: convert::Tokens,
        #[pyo3(from_py_with = block_extra_keys_arg)] extra_keys: Option<Vec<KeyValue>>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let extra = extra_keys;
        let h = self
            .inner
            .hash_block(parent.as_ref(), tokens.as_slice(), extra.as_deref())
            .py_err()?;
        Ok(PyBytes::new(py, h.as_bytes()))
    }

    fn __repr__(&self) -> String {
        format!(
            "BlockHasher(block_size={}, algo={:?}, seed={:?})",
            self.inner.block_size(),
            self.inner.algo().name(),
            self.inner.seed()
        )
    }
}

/// vLLM's `hash_block_tokens(hash_fn, parent, tokens, extra_keys)` for any token count;
/// parent None = NONE_HASH of `algo` and `seed` (default as `BlockHasher`).
#[pyfunction]
#[pyo3(signature = (algo, parent, tokens, extra_keys=None, seed=None))]
pub fn hash_block_tokens<'py>(
    py: Python<'py>,
    #[pyo3(from_py_with = algo_arg)] algo: HashAlgo,
    #[pyo3(from_py_with = parent_arg)] parent: Option<BlockHash>,
    #[pyo3(from_py_with = tokens_arg)] tokens: convert::Tokens,
    #[pyo3(from_py_with = block_extra_keys_arg)] extra_keys: Option<Vec<KeyValue>>,
    #[pyo3(from_py_with = convert::seed)] seed: Option<String>,
) -> PyResult<Bound<'py, PyBytes>> {
    let extra = extra_keys;
    let hasher = BlockHasher::new(algo, 1, &convert::seed_or_default(seed)).py_err()?;
    let (parent, extra) = (parent.as_ref(), extra.as_deref());
    let h = if tokens.len() >= DETACH_MIN_TOKENS {
        let toks = tokens.as_slice();
        py.detach(|| hasher.hash_block_tokens(parent, toks, extra))
    } else {
        hasher.hash_block_tokens(parent, tokens.as_slice(), extra)
    }
    .py_err()?;
    Ok(PyBytes::new(py, h.as_bytes()))
}
