//! PyO3 bindings of prefixcache-core: module `prefixcache._core`.
//!
//! No logic lives here: each file wraps one core class, converting arguments
//! (`convert.rs`) and errors (`errors.rs`).

use pyo3::prelude::*;

/// mimalloc keeps freed pages for reuse: returning a large array of freed KV indices then
/// costs no fresh page faults on the next call (see docs/BENCHMARKS.md, evict-all).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod checked;
mod convert;
mod errors;
mod fleet_events;
mod fleet_match;
mod hasher;
mod kv_index;
mod lab;
mod manager;
mod offload;
mod pool;
mod radix;
mod shared;
mod token_buffer;
mod trace;
mod trie;

/// The module does not declare `gil_used = false`: the code is written to be sound without
/// the GIL (frozen pyclasses, state behind `Mutex`es, inputs read into owned buffers, never
/// borrowed, see `convert.rs`), but no free-threaded CPython runs in CI, so a free-threaded
/// interpreter keeps the GIL on when it imports `_core`. See docs/ARCHITECTURE.md,
/// "Concurrency".
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    shared::install_fork_handler();
    m.add_class::<token_buffer::TokenBuffer>()?;
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
    m.add_class::<offload::PyCpuOffloadManager>()?;
    m.add_class::<offload::PyPrepareStoreOutput>()?;
    m.add_class::<offload::PyOffloadingEvent>()?;
    m.add_class::<kv_index::PyKvIndex>()?;
    m.add_class::<fleet_match::PyFleetMatch>()?;
    m.add_function(wrap_pyfunction!(kv_index::decode_kv_frames, m)?)?;
    m.add_function(wrap_pyfunction!(kv_index::decode_kv_events, m)?)?;
    m.add_function(wrap_pyfunction!(kv_index::fleet_bitmap_walk, m)?)?;
    m.add_function(wrap_pyfunction!(kv_index::fleet_worker_arg, m)?)?;
    m.add_function(wrap_pyfunction!(kv_index::fleet_medium_arg, m)?)?;
    m.add_function(wrap_pyfunction!(kv_index::fleet_seq_arg, m)?)?;
    m.add_function(wrap_pyfunction!(kv_index::fleet_now_arg, m)?)?;
    m.add_function(wrap_pyfunction!(kv_index::fleet_ttl_arg, m)?)?;
    m.add_function(wrap_pyfunction!(kv_index::fleet_hash_bytes_arg, m)?)?;
    m.add_function(wrap_pyfunction!(kv_index::fleet_request_hashes, m)?)?;
    m.add_function(wrap_pyfunction!(kv_index::fleet_weights_arg, m)?)?;
    m.add_function(wrap_pyfunction!(kv_index::fleet_k_arg, m)?)?;
    m.add_function(wrap_pyfunction!(kv_index::fleet_flag_arg, m)?)?;
    m.add_class::<lab::LabCache>()?;
    m.add_function(wrap_pyfunction!(lab::lab_block_keys, m)?)?;
    m.add_function(wrap_pyfunction!(trace::expand_block_ids, m)?)?;
    Ok(())
}
