//! Maps core errors to the Python exception classes defined in `prefixcache/errors.py`.

use prefixcache_core::Error;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// The Python exception classes, looked up once from `prefixcache.errors`.
pub struct Classes {
    pub invalid_input: Py<PyType>,
    pub invalid_type: Py<PyType>,
    pub stale_handle: Py<PyType>,
    pub lock_ref: Py<PyType>,
    pub block_state: Py<PyType>,
    pub unknown_request: Py<PyType>,
    pub out_of_blocks: Py<PyType>,
    pub unsupported_hash_input: Py<PyType>,
    pub unknown_worker: Py<PyType>,
    pub invalid_event: Py<PyType>,
}

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

fn classes(py: Python<'_>) -> PyResult<&Classes> {
    CLASSES.get_or_try_init(py, || {
        let m = py.import("prefixcache.errors")?;
        let get = |name: &str| -> PyResult<Py<PyType>> {
            Ok(m.getattr(name)?.cast_into::<PyType>()?.unbind())
        };
        Ok(Classes {
            invalid_input: get("InvalidInputError")?,
            invalid_type: get("InvalidTypeError")?,
            stale_handle: get("StaleHandleError")?,
            lock_ref: get("LockRefError")?,
            block_state: get("BlockStateError")?,
            unknown_request: get("UnknownRequestError")?,
            out_of_blocks: get("OutOfBlocksError")?,
            unsupported_hash_input: get("UnsupportedHashInputError")?,
            unknown_worker: get("UnknownWorkerError")?,
            invalid_event: get("InvalidEventError")?,
        })
    })
}

fn raise(py: Python<'_>, pick: fn(&Classes) -> &Py<PyType>, msg: String) -> PyErr {
    match classes(py) {
        Ok(c) => PyErr::from_type(pick(c).bind(py).clone(), msg),
        Err(e) => e,
    }
}

/// A core error as the matching Python exception.
pub fn to_py(err: Error) -> PyErr {
    Python::attach(|py| {
        let msg = err.to_string();
        let pick: fn(&Classes) -> &Py<PyType> = match err {
            Error::InvalidArgument(_) => |c| &c.invalid_input,
            Error::StaleHandle(_) => |c| &c.stale_handle,
            Error::LockRef(_) => |c| &c.lock_ref,
            Error::BlockState(_) => |c| &c.block_state,
            Error::UnknownRequest(_) => |c| &c.unknown_request,
            Error::OutOfBlocks { .. } => |c| &c.out_of_blocks,
            Error::UnsupportedHashInput(_) => |c| &c.unsupported_hash_input,
            Error::UnknownWorker(_) => |c| &c.unknown_worker,
            Error::InvalidEvent(_) => |c| &c.invalid_event,
        };
        raise(py, pick, msg)
    })
}

/// `InvalidInputError(msg)`: a bad value detected while converting arguments.
pub fn invalid_input(msg: impl Into<String>) -> PyErr {
    Python::attach(|py| raise(py, |c| &c.invalid_input, msg.into()))
}

/// `InvalidTypeError(msg)`: a bad type or dtype detected while converting arguments.
pub fn invalid_type(msg: impl Into<String>) -> PyErr {
    Python::attach(|py| raise(py, |c| &c.invalid_type, msg.into()))
}

/// `Result<T, core::Error>` -> `PyResult<T>`.
pub trait IntoPyResult<T> {
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for prefixcache_core::Result<T> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
