//! PyO3 bindings of prefixcache-core: module `prefixcache._core`.
//!
//! No logic lives here: each file wraps one core class, converting arguments
//! (`convert.rs`) and errors (`errors.rs`).

use pyo3::prelude::*;

/// mimalloc keeps freed pages for reuse: returning a large array of freed KV indices then
/// costs no fresh page faults on the next call (see docs/BENCHMARKS.md, evict-all).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod convert;
mod errors;
mod fleet_events;
mod fleet_match;
mod hasher;
mod kv_index;
mod manager;
mod pool;
mod radix;
mod shared;
mod trie;

/// `gil_used = false`: the module is safe on free-threaded CPython without the GIL. Every
/// class is a frozen pyclass whose mutable core state sits behind a `Mutex` (`shared.rs`),
/// the `PyOnceLock` statics are thread-safe, and numpy inputs are copied rather than
/// borrowed when there is no GIL (`convert.rs`). See docs/ARCHITECTURE.md, "Concurrency".
#[pymodule(gil_used = false)]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<radix::RadixCache>()?;
    m.add_class::<radix::Node>()?;
    m.add_class::<radix::MatchResult>()?;
    m.add_class::<radix::InsertResult>()?;
    m.add_class::<trie::BlockTrie>()?;
    m.add_class::<trie::Claim>()?;
    m.add_class::<trie::Lookup>()?;
    m.add_class::<hasher::PyBlockHasher>()?;
    m.add_function(wrap_pyfunction!(hasher::hash_block_tokens, m)?)?;
    m.add_class::<pool::PyBlockPool>()?;
    m.add_class::<manager::PyKVCacheManager>()?;
    m.add_class::<kv_index::PyKvIndex>()?;
    m.add_class::<fleet_match::PyFleetMatch>()?;
    m.add_function(wrap_pyfunction!(kv_index::decode_kv_frames, m)?)?;
    m.add_function(wrap_pyfunction!(kv_index::decode_kv_events, m)?)?;
    m.add_function(wrap_pyfunction!(kv_index::fleet_bitmap_walk, m)?)?;
    Ok(())
}
