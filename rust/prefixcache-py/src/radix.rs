//! `RadixCache`, `Node`, `MatchResult`, `InsertResult`: bindings of `radix::RadixTree`.

use numpy::PyArray1;
use prefixcache_core::radix::{EvictionPolicy, Namespace, NodeRef, RadixTree, WritePolicy};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList};

use crate::convert;
use crate::errors::IntoPyResult;
use crate::shared::Shared;

/// GIL release thresholds (docs/BENCHMARKS.md, "Threads and the GIL"). Releasing and
/// retaking the GIL costs ~35 ns uncontended, but a thread that released it may have to
/// wait a switch interval (5 ms) to get it back while other threads run Python, and a
/// GIL-released call must first copy its numpy key. So only calls doing >= ~5 us of core
/// work release it: shorter ones are invisible to other threads.
///
/// `match_prefix` of a cached key compares ~20 tokens/ns (65536 tokens: ~6 us; the copy
/// alone costs about as much as the match).
const DETACH_MIN_MATCH: usize = 65536;

/// `insert` and `MatchResult.indices` allocate and copy per token (4096 new tokens:
/// ~3.4 us; 16384: ~170 us, page faults included).
const DETACH_MIN_ALLOC: usize = 8192;

/// `evict(num_tokens)`: ~0.3-1 us per evicted leaf plus the freed indices' array.
const DETACH_MIN_EVICT: i64 = 1024;

/// An int64 array handed to Python.
type I64Array<'py> = Bound<'py, PyArray1<i64>>;

/// A handle to a tree node. Valid while the node exists; using it after the node was
/// evicted (or after `reset()`) raises `StaleHandleError`.
#[pyclass(frozen, eq, hash, module = "prefixcache._core")]
#[derive(PartialEq, Eq, Hash)]
pub struct Node {
    r: NodeRef,
}

#[pymethods]
impl Node {
    fn __repr__(&self) -> String {
        node_repr(self.r)
    }
}

/// The result of `RadixCache.match_prefix`. `node` and `indices` are built on first
/// access (so a match allocates neither unless they are read); read `indices` while the
/// node is alive (lock the node or read it before evicting).
#[pyclass(frozen, module = "prefixcache._core")]
pub struct MatchResult {
    #[pyo3(get)]
    length: usize,
    node_ref: NodeRef,
    node: PyOnceLock<Py<Node>>,
    /// Matched tokens beyond `length` held only in host memory (0 without a host tier).
    #[pyo3(get)]
    host_hit_length: usize,
    host_ref: NodeRef,
    last_host_node: PyOnceLock<Py<Node>>,
    cache: Py<RadixCache>,
    indices: PyOnceLock<Py<PyArray1<i64>>>,
}

/// The node handle of a result, built on first access (the same object afterwards).
fn lazy_node<'py>(
    py: Python<'py>,
    cell: &PyOnceLock<Py<Node>>,
    r: NodeRef,
) -> PyResult<Bound<'py, Node>> {
    let n = cell.get_or_try_init(py, || Py::new(py, Node { r }))?;
    Ok(n.bind(py).clone())
}

#[pymethods]
impl MatchResult {
    /// The last node of the matched prefix (the root when nothing matched).
    #[getter]
    fn node<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, Node>> {
        lazy_node(py, &self.node, self.node_ref)
    }

    /// The last node of the whole match, host part included (`node` without a host hit).
    #[getter]
    fn last_host_node<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, Node>> {
        if self.host_ref == self.node_ref {
            return self.node(py);
        }
        lazy_node(py, &self.last_host_node, self.host_ref)
    }

    /// The KV indices of the matched prefix (numpy int64, length == `length`).
    #[getter]
    fn indices<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let arr = self.indices.get_or_try_init(py, || -> PyResult<_> {
            let r = self.node_ref;
            let v = self
                .cache
                .get()
                .inner
                .with_gil_released_if(py, self.length >= DETACH_MIN_ALLOC, |t| t.path_indices(r))?
                .py_err()?;
            Ok(convert::i64_array(py, v).unbind())
        })?;
        Ok(arr.bind(py).clone())
    }

    fn __repr__(&self) -> String {
        format!(
            "MatchResult(length={}, node={}, host_hit_length={})",
            self.length,
            node_repr(self.node_ref),
            self.host_hit_length
        )
    }
}

fn node_repr(r: NodeRef) -> String {
    format!("Node(slot={}, serial={})", r.slot, r.serial)
}

/// The result of `RadixCache.insert`.
#[pyclass(frozen, module = "prefixcache._core")]
pub struct InsertResult {
    /// Tokens that were already cached: the caller frees its own duplicate KV indices.
    #[pyo3(get)]
    prefix_len: usize,
    node_ref: NodeRef,
    node: PyOnceLock<Py<Node>>,
}

#[pymethods]
impl InsertResult {
    /// The last node of the inserted key's path.
    #[getter]
    fn node<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, Node>> {
        lazy_node(py, &self.node, self.node_ref)
    }

    fn __repr__(&self) -> String {
        format!(
            "InsertResult(prefix_len={}, node={})",
            self.prefix_len,
            node_repr(self.node_ref)
        )
    }
}

/// SGLang's RadixCache: a token-level radix tree of KV indices.
#[pyclass(frozen, module = "prefixcache._core")]
pub struct RadixCache {
    inner: Shared<RadixTree>,
}

impl RadixCache {
    fn node(&self, py: Python<'_>, r: NodeRef) -> PyResult<Py<Node>> {
        Py::new(py, Node { r })
    }
}

/// The `extra_key` and `cache_salt` arguments (each str or None), read in that order.
fn namespace(
    extra_key: Option<&Bound<'_, PyAny>>,
    cache_salt: Option<&Bound<'_, PyAny>>,
) -> PyResult<Namespace> {
    let extra_key = extra_key.map(convert::extra_key).transpose()?.flatten();
    let cache_salt = cache_salt.map(convert::cache_salt).transpose()?.flatten();
    Ok(Namespace::new(extra_key.as_deref(), cache_salt.as_deref()))
}

/// A `Node` argument; anything else raises `InvalidTypeError`.
fn node_ref(obj: &Bound<'_, PyAny>) -> PyResult<NodeRef> {
    match obj.cast::<Node>() {
        Ok(n) => Ok(n.get().r),
        Err(_) => Err(crate::errors::invalid_type(format!(
            "node must be a prefixcache Node handle, got {}",
            convert::type_name(obj)
        ))),
    }
}

// Every constructor argument is converted by a `from_py_with` extractor, so that pyo3
// converts them in argument order: the first bad argument is the one named (as the
// reference names it). A policy's name is checked as the argument is read.

/// The `page_size` argument: an int >= 1 (None: 1).
fn page_size_arg(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    convert::positive_or(Some(obj), 1, "page_size")
}

/// The `eviction_policy` argument: the name of a policy.
fn eviction_policy_arg(obj: &Bound<'_, PyAny>) -> PyResult<EvictionPolicy> {
    convert::eviction_policy(obj)?.parse().py_err()
}

/// The `host_capacity` argument: an int >= 0 (None: 0).
fn host_capacity_arg(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    convert::size_or(Some(obj), 0, "host_capacity")
}

/// The `write_policy` argument: the name of a write policy.
fn write_policy_arg(obj: &Bound<'_, PyAny>) -> PyResult<WritePolicy> {
    convert::write_policy(obj)?.parse().py_err()
}

#[pymethods]
impl RadixCache {
    #[new]
    #[pyo3(signature = (page_size = 1, eviction_policy = EvictionPolicy::Lru, host_capacity = 0, write_policy = WritePolicy::WriteThrough, host_events = false))]
    #[pyo3(
        text_signature = "(page_size=None, eviction_policy='lru', host_capacity=0, write_policy='write_through', host_events=False)"
    )]
    fn new(
        #[pyo3(from_py_with = page_size_arg)] page_size: usize,
        #[pyo3(from_py_with = eviction_policy_arg)] eviction_policy: EvictionPolicy,
        #[pyo3(from_py_with = host_capacity_arg)] host_capacity: usize,
        #[pyo3(from_py_with = write_policy_arg)] write_policy: WritePolicy,
        #[pyo3(from_py_with = convert::host_events)] host_events: bool,
    ) -> PyResult<Self> {
        let mut tree = RadixTree::new(page_size, eviction_policy).py_err()?;
        tree.set_host_tier(host_capacity, write_policy).py_err()?;
        tree.set_host_events(host_events).py_err()?;
        Ok(RadixCache {
            inner: Shared::new("RadixCache", tree),
        })
    }

    /// Host memory behind the device, in tokens (0: no host tier).
    #[getter]
    fn host_capacity(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.with(py, |t| t.host_capacity())
    }

    /// When nodes are copied to host memory (None without a host tier).
    #[getter]
    fn write_policy(&self, py: Python<'_>) -> PyResult<Option<&'static str>> {
        self.inner
            .with(py, |t| t.write_policy().map(WritePolicy::name))
    }

    /// Tokens in host memory (backed-up nodes, on the device or host-only).
    fn host_size(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.with(py, |t| t.host_size())
    }

    /// Host-only nodes: backed up, their device KV evicted (0 without a host tier).
    #[getter]
    fn num_host_only_nodes(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.with(py, |t| t.num_host_only_nodes())
    }

    /// Host tier counters in tokens: stored_tokens, host_evicted_tokens, loaded_tokens,
    /// peak_host_tokens.
    fn host_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.with(py, |t| t.host_stats())?;
        let d = PyDict::new(py);
        d.set_item("stored_tokens", s.stored_tokens)?;
        d.set_item("host_evicted_tokens", s.host_evicted_tokens)?;
        d.set_item("loaded_tokens", s.loaded_tokens)?;
        d.set_item("peak_host_tokens", s.peak_host_tokens)?;
        Ok(d)
    }

    /// `(backed_up, host_only)` of `node`: has a host copy; has no device KV.
    fn host_state(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = node_ref)] node: NodeRef,
    ) -> PyResult<(bool, bool)> {
        let r = node;
        self.inner.with(py, |t| t.host_state(r))?.py_err()
    }

    /// Loads the host-only nodes on the path to `node` back to the device with KV indices
    /// `values` (default: the tokens); returns the tokens loaded. The caller makes room
    /// on the device first.
    #[pyo3(signature = (node, values = None))]
    fn load_back(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = node_ref)] node: NodeRef,
        values: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let values = values
            .map(|v| convert::input::<i64>(v, "values", false)?.into_owned())
            .transpose()?;
        let r = node;
        let v = values.as_ref().map(|v| v.as_slice());
        self.inner.with(py, |t| t.load_back(r, v))?.py_err()
    }

    /// `(backed_up, host_only)` of every non-root node, in `dump()` order.
    fn host_dump(&self, py: Python<'_>) -> PyResult<Vec<(bool, bool)>> {
        self.inner.with_gil_released(py, |t| t.host_dump())
    }

    /// Whether the host copies' values are kept (`host_events=True`).
    #[getter]
    fn host_events(&self, py: Python<'_>) -> PyResult<bool> {
        self.inner.with(py, |t| t.host_events())
    }

    /// `(stored, dropped)`: the values of the host copies made and of those dropped since
    /// the last call, each as its node had them when copied (empty without `host_events`);
    /// `nonzero`: without the values that are 0.
    #[pyo3(signature = (nonzero = false))]
    fn take_host_events<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = convert::nonzero)] nonzero: bool,
    ) -> PyResult<(I64Array<'py>, I64Array<'py>)> {
        let (stored, dropped) = self
            .inner
            .with(py, |t| t.take_host_events(nonzero))?
            .py_err()?;
        Ok((
            convert::i64_array(py, stored),
            convert::i64_array(py, dropped),
        ))
    }

    /// The values of every non-root node's host copy, in `dump()` order (empty for a node
    /// without one, or without `host_events`).
    fn host_values_dump<'py>(&self, py: Python<'py>) -> PyResult<Vec<I64Array<'py>>> {
        let all = self
            .inner
            .with_gil_released(py, |t| t.host_values_dump())?
            .py_err()?;
        Ok(all.into_iter().map(|v| convert::i64_array(py, v)).collect())
    }

    /// Evicts host-only leaves until at least `num_tokens` host tokens are freed (or none
    /// is left); returns the host tokens freed.
    fn evict_host(&self, py: Python<'_>, num_tokens: &Bound<'_, PyAny>) -> PyResult<usize> {
        let n = convert::size_arg(num_tokens, "num_tokens")?;
        self.inner.with(py, |t| t.evict_host(n))
    }

    #[getter]
    fn page_size(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.with(py, |t| t.page_size())
    }

    #[getter]
    fn eviction_policy(&self, py: Python<'_>) -> PyResult<&'static str> {
        self.inner.with(py, |t| t.policy().name())
    }

    /// The logical clock: advanced by one by every `match_prefix` and `insert` call.
    #[getter]
    fn clock(&self, py: Python<'_>) -> PyResult<u64> {
        self.inner.with(py, |t| t.clock())
    }

    /// Longest cached prefix of `tokens` (page-aligned). May split a node. With a host
    /// tier, `length`/`node` are the device part and `host_hit_length`/`last_host_node`
    /// the host-only part after it.
    #[pyo3(signature = (tokens, extra_key = None, cache_salt = None))]
    fn match_prefix(
        slf: &Bound<'_, Self>,
        tokens: &Bound<'_, PyAny>,
        extra_key: Option<&Bound<'_, PyAny>>,
        cache_salt: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<MatchResult> {
        let py = slf.py();
        // The only array argument, and nothing else runs Python code (reading a str does
        // not): read in place. The arguments are read in order.
        let in_place = convert::reads_without_python(tokens);
        let key = convert::input::<u32>(tokens, "tokens", in_place)?;
        let ns = namespace(extra_key, cache_salt)?;
        let this = slf.get();
        let m = if key.len() >= DETACH_MIN_MATCH {
            let key = key.into_owned()?;
            this.inner
                .with_gil_released(py, |t| t.match_prefix(key.as_slice(), &ns))?
        } else {
            match this
                .inner
                .try_with(py, |t| t.match_prefix(key.as_slice(), &ns))?
            {
                Some(m) => m,
                None => {
                    let key = key.into_owned()?;
                    this.inner
                        .with(py, |t| t.match_prefix(key.as_slice(), &ns))?
                }
            }
        }
        .py_err()?;
        Ok(MatchResult {
            length: m.length,
            node_ref: m.node,
            node: PyOnceLock::new(),
            host_hit_length: m.host_length,
            host_ref: m.host_node,
            last_host_node: PyOnceLock::new(),
            cache: slf.clone().unbind(),
            indices: PyOnceLock::new(),
        })
    }

    /// Inserts `tokens` with KV indices `values` (default: the tokens). Existing values
    /// are never replaced; `prefix_len` says how many tokens were already cached.
    #[pyo3(signature = (tokens, values = None, extra_key = None, cache_salt = None, priority = None, inserted_len = None))]
    #[allow(clippy::too_many_arguments)]
    fn insert(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        values: Option<&Bound<'_, PyAny>>,
        extra_key: Option<&Bound<'_, PyAny>>,
        cache_salt: Option<&Bound<'_, PyAny>>,
        priority: Option<&Bound<'_, PyAny>>,
        inserted_len: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<InsertResult> {
        // The tokens are copied (narrowed) even from a uint32 array: the tree's shape
        // follows their values, so a native writer racing with the call (another thread
        // without the GIL) must not change them between the walk and the new leaf. The
        // values, only copied into the new leaf, are read in place when no later
        // argument can run Python code (`__index__`; reading a str does not); else copied,
        // in argument order.
        let in_place = values.is_some_and(convert::reads_without_python)
            && convert::plain_int(priority)
            && convert::plain_int(inserted_len);
        // Two lists (or one list given as both) are read in one pass when they can be.
        let (tokens, values) = match values.and_then(|v| convert::tokens_and_values(tokens, v)) {
            Some((t, v)) => (t, Some(v)),
            None => (
                convert::input::<u32>(tokens, "tokens", false)?,
                values
                    .map(|v| convert::input::<i64>(v, "values", in_place))
                    .transpose()?,
            ),
        };
        let ns = namespace(extra_key, cache_salt)?;
        let priority = convert::opt_i64(priority, "priority")?.unwrap_or(0);
        let inserted_len = convert::size_or(inserted_len, 0, "inserted_len")?;
        let r = if tokens.len() >= DETACH_MIN_ALLOC {
            let key = tokens.into_owned()?;
            let values = values.map(convert::Input::into_owned).transpose()?;
            self.inner.with_gil_released(py, |t| {
                let v = values.as_ref().map(|v| v.as_slice());
                t.insert(key.as_slice(), v, &ns, priority, inserted_len)
            })?
        } else {
            let v = values.as_ref().map(|v| v.as_slice());
            match self.inner.try_with(py, |t| {
                t.insert(tokens.as_slice(), v, &ns, priority, inserted_len)
            })? {
                Some(r) => r,
                None => {
                    let key = tokens.into_owned()?;
                    let values = values.map(convert::Input::into_owned).transpose()?;
                    self.inner.with(py, |t| {
                        let v = values.as_ref().map(|v| v.as_slice());
                        t.insert(key.as_slice(), v, &ns, priority, inserted_len)
                    })?
                }
            }
        }
        .py_err()?;
        Ok(InsertResult {
            prefix_len: r.prefix_len,
            node_ref: r.node,
            node: PyOnceLock::new(),
        })
    }

    /// Locks the path from `node` to the root; returns the change of the evictable size.
    fn inc_lock_ref(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = node_ref)] node: NodeRef,
    ) -> PyResult<i64> {
        let r = node;
        self.inner.with(py, |t| t.inc_lock_ref(r))?.py_err()
    }

    /// Unlocks the path from `node` to the root; returns the change of the evictable size.
    fn dec_lock_ref(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = node_ref)] node: NodeRef,
    ) -> PyResult<i64> {
        let r = node;
        self.inner.with(py, |t| t.dec_lock_ref(r))?.py_err()
    }

    /// Evicts whole leaves until at least `num_tokens` are freed (or nothing is
    /// evictable); returns the freed KV indices in eviction order.
    fn evict<'py>(
        &self,
        py: Python<'py>,
        num_tokens: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let n = convert::size_arg(num_tokens, "num_tokens")? as i64;
        let freed = self
            .inner
            .with_gil_released_if(py, n >= DETACH_MIN_EVICT, |t| t.evict(n))?
            .py_err()?;
        Ok(convert::i64_array(py, freed))
    }

    /// Evicts exactly as `evict` does (the same leaves, in the same order) but returns
    /// only the number of tokens freed: no array of indices is built.
    fn evict_count(&self, py: Python<'_>, num_tokens: &Bound<'_, PyAny>) -> PyResult<usize> {
        let n = convert::size_arg(num_tokens, "num_tokens")? as i64;
        self.inner
            .with_gil_released_if(py, n >= DETACH_MIN_EVICT, |t| t.evict_count(n))?
            .py_err()
    }

    fn evictable_size(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.with(py, |t| t.evictable_size())
    }

    fn protected_size(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.with(py, |t| t.protected_size())
    }

    fn total_size(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.with(py, |t| t.total_size())
    }

    /// Nodes in the tree, the root excluded.
    #[getter]
    fn num_nodes(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.with(py, |t| t.num_nodes())
    }

    #[getter]
    fn root(&self, py: Python<'_>) -> PyResult<Py<Node>> {
        let r = self.inner.with(py, |t| t.root())?;
        self.node(py, r)
    }

    /// The KV indices on the path from the root to `node`.
    fn path_indices<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = node_ref)] node: NodeRef,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        // The length is unknown before the walk: released always (a rare call).
        let r = node;
        let v = self
            .inner
            .with_gil_released(py, |t| t.path_indices(r))?
            .py_err()?;
        Ok(convert::i64_array(py, v))
    }

    /// The parent of `node` (None for the root).
    fn parent(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = node_ref)] node: NodeRef,
    ) -> PyResult<Option<Py<Node>>> {
        let r = node;
        let p = self.inner.with(py, |t| t.parent(r))?.py_err()?;
        p.map(|r| self.node(py, r)).transpose()
    }

    /// Fields of one node: length, lock_ref, hit_count, priority, last_access_time,
    /// creation_time, num_children, is_root, extra_key, cache_salt.
    fn node_info<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = node_ref)] node: NodeRef,
    ) -> PyResult<Bound<'py, PyDict>> {
        let r = node;
        let i = self.inner.with(py, |t| t.node_info(r))?.py_err()?;
        let d = PyDict::new(py);
        d.set_item("length", i.length)?;
        d.set_item("lock_ref", i.lock_ref)?;
        d.set_item("hit_count", i.hit_count)?;
        d.set_item("priority", i.priority)?;
        d.set_item("last_access_time", i.last_access_time)?;
        d.set_item("creation_time", i.creation_time)?;
        d.set_item("num_children", i.num_children)?;
        d.set_item("is_root", i.is_root)?;
        d.set_item("extra_key", i.namespace.extra_key)?;
        d.set_item("cache_salt", i.namespace.cache_salt)?;
        Ok(d)
    }

    /// Every non-root node, depth first, children ordered by (namespace, key tokens).
    fn dump<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let nodes = self.inner.with_gil_released(py, |t| t.dump())?;
        let out = PyList::empty(py);
        for n in nodes {
            let d = PyDict::new(py);
            d.set_item("depth", n.depth)?;
            d.set_item("key", n.key)?;
            d.set_item("value", n.value)?;
            d.set_item("lock_ref", n.lock_ref)?;
            d.set_item("hit_count", n.hit_count)?;
            d.set_item("priority", n.priority)?;
            d.set_item("last_access_time", n.last_access_time)?;
            d.set_item("creation_time", n.creation_time)?;
            d.set_item("extra_key", n.namespace.extra_key)?;
            d.set_item("cache_salt", n.namespace.cache_salt)?;
            out.append(d)?;
        }
        Ok(out)
    }

    /// Checks every structural invariant of the tree; raises AssertionError on a violation.
    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        self.inner
            .with_gil_released(py, |t| t.check_invariants())?
            .map_err(pyo3::exceptions::PyAssertionError::new_err)
    }

    /// Empties the tree; every node handle issued before becomes stale.
    fn reset(&self, py: Python<'_>) -> PyResult<()> {
        // Frees every node: released always (a rare call, as long as the tree is large).
        self.inner.with_gil_released(py, |t| t.reset())
    }

    /// A human-readable rendering of the tree.
    fn pretty_print(&self, py: Python<'_>) -> PyResult<String> {
        self.inner.with_gil_released(py, |t| t.pretty())
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        self.inner.with(py, |t| {
            format!(
                "RadixCache(page_size={}, eviction_policy={:?}, nodes={}, total_size={})",
                t.page_size(),
                t.policy().name(),
                t.num_nodes(),
                t.total_size()
            )
        })
    }
}
