//! PyO3 bindings of prefixcache-core: module `prefixcache._core`.
//!
//! No logic lives here: each file wraps one core class, converting arguments
//! (`convert.rs`) and errors (`errors.rs`).

use pyo3::prelude::*;

mod convert;
mod errors;
mod radix;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<radix::RadixCache>()?;
    m.add_class::<radix::Node>()?;
    m.add_class::<radix::MatchResult>()?;
    m.add_class::<radix::InsertResult>()?;
    Ok(())
}
