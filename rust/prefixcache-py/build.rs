//! Sets PyO3's interpreter cfgs (`Py_GIL_DISABLED` on free-threaded CPython), used by
//! `convert.rs` to copy numpy inputs instead of borrowing them when there is no GIL.
fn main() {
    pyo3_build_config::use_pyo3_cfgs();
}
