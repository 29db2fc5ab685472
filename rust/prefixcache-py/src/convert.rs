//! Argument conversion: token ids and KV indices from Python objects.
//!
//! Accepted: 1-D numpy arrays of any integer dtype (u32/i32 and i64 are borrowed without a
//! copy when contiguous), objects exposing the buffer protocol (`array.array`), and
//! sequences of Python ints. Floats, bools arrays, strings and other dtypes raise
//! `InvalidTypeError`; out-of-range values raise `InvalidInputError` naming the position.
//!
//! Borrowed arrays may be read only with the GIL held, in one stretch (no Python code in
//! between): another Python thread may write into (or resize) the array as soon as the
//! GIL is released. Code that runs with the GIL released takes `into_vec()` first. On
//! free-threaded CPython (no GIL at all) nothing is borrowed: every input is copied.

use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyString};

use crate::errors::{invalid_input, invalid_type};

/// Token ids: u32 in the core.
pub enum Tokens<'py> {
    U32(PyReadonlyArray1<'py, u32>),
    I32(PyReadonlyArray1<'py, i32>),
    Owned(Vec<u32>),
}

/// Whether contiguous numpy arrays may be borrowed instead of copied: only with a GIL.
const BORROW: bool = !cfg!(Py_GIL_DISABLED);

impl Tokens<'_> {
    /// The token ids. Borrowed: call with the GIL held and use before releasing it.
    pub fn as_slice(&self) -> &[u32] {
        match self {
            // Both arms are only constructed from contiguous arrays (checked in `extract`).
            Tokens::U32(a) => a.as_slice().unwrap_or(&[]),
            Tokens::I32(a) => bytemuck::cast_slice(a.as_slice().unwrap_or(&[])),
            Tokens::Owned(v) => v,
        }
    }

    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Owned token ids (a copy of a borrowed array), for use with the GIL released.
    pub fn into_vec(self) -> Vec<u32> {
        match self {
            Tokens::Owned(v) => v,
            t => t.as_slice().to_vec(),
        }
    }
}

/// KV indices: i64 in the core (as SGLang).
pub enum Values<'py> {
    I64(PyReadonlyArray1<'py, i64>),
    Owned(Vec<i64>),
}

impl Values<'_> {
    pub fn as_slice(&self) -> &[i64] {
        match self {
            Values::I64(a) => a.as_slice().unwrap_or(&[]),
            Values::Owned(v) => v,
        }
    }

    /// Owned values (a copy of a borrowed array), for use with the GIL released.
    pub fn into_vec(self) -> Vec<i64> {
        match self {
            Values::Owned(v) => v,
            v => v.as_slice().to_vec(),
        }
    }
}

fn token_range_error(what: &str, i: usize, v: impl std::fmt::Display) -> PyErr {
    invalid_input(format!(
        "{what}[{i}] = {v} is out of range: token ids must be in [0, 2**32)"
    ))
}

fn check_u32<T: Copy + TryInto<u32> + std::fmt::Display>(
    what: &str,
    xs: &[T],
) -> PyResult<Vec<u32>> {
    let mut out = Vec::with_capacity(xs.len());
    for (i, &x) in xs.iter().enumerate() {
        match x.try_into() {
            Ok(v) => out.push(v),
            Err(_) => return Err(token_range_error(what, i, x)),
        }
    }
    Ok(out)
}

fn reject_non_sequence(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<()> {
    if obj.is_instance_of::<PyString>()
        || obj.is_instance_of::<PyBytes>()
        || obj.is_instance_of::<PyByteArray>()
    {
        return Err(invalid_type(format!(
            "{what} must be a sequence of ints or an integer array, not {}",
            type_name(obj)
        )));
    }
    Ok(())
}

fn numpy_array<'a, 'py>(
    obj: &'a Bound<'py, PyAny>,
    what: &str,
) -> PyResult<Option<&'a Bound<'py, PyUntypedArray>>> {
    let Ok(arr) = obj.cast::<PyUntypedArray>() else {
        return Ok(None);
    };
    if arr.ndim() != 1 {
        return Err(invalid_input(format!(
            "{what} must be 1-dimensional, got an array of shape {:?}",
            arr.shape()
        )));
    }
    Ok(Some(arr))
}

fn dtype_error(what: &str, dtype: &str) -> PyErr {
    invalid_type(format!(
        "{what} must hold integers, got an array of dtype {dtype}"
    ))
}

/// Extract token ids from any accepted object.
pub fn tokens<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Tokens<'py>> {
    reject_non_sequence(obj, what)?;
    if let Some(arr) = numpy_array(obj, what)? {
        let dt = arr.dtype();
        let contiguous = BORROW && arr.is_c_contiguous();
        if let Ok(a) = arr.cast::<PyArray1<u32>>() {
            let ro = a.try_readonly().map_err(|e| invalid_input(e.to_string()))?;
            return Ok(if contiguous {
                Tokens::U32(ro)
            } else {
                Tokens::Owned(ro.as_array().to_vec())
            });
        }
        if let Ok(a) = arr.cast::<PyArray1<i32>>() {
            let ro = a.try_readonly().map_err(|e| invalid_input(e.to_string()))?;
            if contiguous {
                let s = ro.as_slice().unwrap_or(&[]);
                if let Some(i) = s.iter().position(|&x| x < 0) {
                    return Err(token_range_error(what, i, s[i]));
                }
                return Ok(Tokens::I32(ro));
            }
            return Ok(Tokens::Owned(check_u32(what, &ro.as_array().to_vec())?));
        }
        macro_rules! widen {
            ($($t:ty),*) => {$(
                if let Ok(a) = arr.cast::<PyArray1<$t>>() {
                    let v = a.to_vec().or_else(|_| Ok::<_, PyErr>(a.readonly().as_array().to_vec()))?;
                    return Ok(Tokens::Owned(check_u32(what, &v)?));
                }
            )*};
        }
        widen!(i64, u64, i16, u16, i8, u8);
        return Err(dtype_error(what, &dt.str()?.to_string()));
    }
    if let Ok(buf) = PyBuffer::<u32>::get(obj) {
        return Ok(Tokens::Owned(buf.to_vec(obj.py())?));
    }
    macro_rules! buffer {
        ($($t:ty),*) => {$(
            if let Ok(buf) = PyBuffer::<$t>::get(obj) {
                return Ok(Tokens::Owned(check_u32(what, &buf.to_vec(obj.py())?)?));
            }
        )*};
    }
    buffer!(i32, i64, u64, i16, u16, i8, u8);
    sequence_u32(obj, what).map(Tokens::Owned)
}

fn item_type_error(what: &str, i: usize, item: &Bound<'_, PyAny>) -> PyErr {
    let tn = type_name(item);
    invalid_type(format!("{what}[{i}] must be an int, got {tn}"))
}

fn sequence_u32(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u32>> {
    let n = obj.len().map_err(|_| {
        let tn = type_name(obj);
        invalid_type(format!(
            "{what} must be a sequence of ints or an integer array, not {tn}"
        ))
    })?;
    let mut out = Vec::with_capacity(n);
    for (i, item) in obj.try_iter()?.enumerate() {
        let item = item?;
        if item.is_instance_of::<PyBool>() {
            return Err(item_type_error(what, i, &item));
        }
        let v: i128 = item
            .extract()
            .map_err(|_| item_type_error(what, i, &item))?;
        match u32::try_from(v) {
            Ok(t) => out.push(t),
            Err(_) => return Err(token_range_error(what, i, v)),
        }
    }
    Ok(out)
}

/// Extract KV indices (any int64 value) from any accepted object.
pub fn values<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Values<'py>> {
    reject_non_sequence(obj, what)?;
    if let Some(arr) = numpy_array(obj, what)? {
        let dt = arr.dtype();
        if let Ok(a) = arr.cast::<PyArray1<i64>>() {
            let ro = a.try_readonly().map_err(|e| invalid_input(e.to_string()))?;
            return Ok(if BORROW && arr.is_c_contiguous() {
                Values::I64(ro)
            } else {
                Values::Owned(ro.as_array().to_vec())
            });
        }
        macro_rules! widen {
            ($($t:ty),*) => {$(
                if let Ok(a) = arr.cast::<PyArray1<$t>>() {
                    return Ok(Values::Owned(a.readonly().as_array().iter().map(|&x| i64::from(x)).collect()));
                }
            )*};
        }
        widen!(i32, u32, i16, u16, i8, u8);
        if let Ok(a) = arr.cast::<PyArray1<u64>>() {
            let ro = a.readonly();
            let mut out = Vec::with_capacity(ro.len());
            for (i, &x) in ro.as_array().iter().enumerate() {
                out.push(i64::try_from(x).map_err(|_| {
                    invalid_input(format!("{what}[{i}] = {x} does not fit in int64"))
                })?);
            }
            return Ok(Values::Owned(out));
        }
        return Err(dtype_error(what, &dt.str()?.to_string()));
    }
    if let Ok(buf) = PyBuffer::<i64>::get(obj) {
        return Ok(Values::Owned(buf.to_vec(obj.py())?));
    }
    let n = obj.len().map_err(|_| {
        let tn = type_name(obj);
        invalid_type(format!(
            "{what} must be a sequence of ints or an integer array, not {tn}"
        ))
    })?;
    let mut out = Vec::with_capacity(n);
    for (i, item) in obj.try_iter()?.enumerate() {
        let item = item?;
        if item.is_instance_of::<PyBool>() {
            return Err(item_type_error(what, i, &item));
        }
        let v: i128 = item
            .extract()
            .map_err(|_| item_type_error(what, i, &item))?;
        out.push(
            i64::try_from(v)
                .map_err(|_| invalid_input(format!("{what}[{i}] = {v} does not fit in int64")))?,
        );
    }
    Ok(Values::Owned(out))
}

/// An int64 numpy array that takes ownership of `v` (no copy).
pub fn i64_array(py: Python<'_>, v: Vec<i64>) -> Bound<'_, PyArray1<i64>> {
    PyArray1::from_vec(py, v)
}

/// An integer argument (count, priority, length): Python ints only (no floats or bools).
/// Values beyond the i64 range are clamped (e.g. "evict 10**30 tokens" = evict all).
pub fn count(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<i64> {
    if obj.is_instance_of::<PyBool>() {
        return Err(invalid_type(format!("{what} must be an int, got bool")));
    }
    match obj.extract::<i128>() {
        Ok(v) => Ok(v.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64),
        Err(_) => {
            let tn = type_name(obj);
            Err(invalid_type(format!("{what} must be an int, got {tn}")))
        }
    }
}

/// [`count`] for an optional argument (`None` = `default`).
pub fn count_or(obj: Option<&Bound<'_, PyAny>>, default: i64, what: &str) -> PyResult<i64> {
    match obj {
        Some(o) if !o.is_none() => count(o, what),
        _ => Ok(default),
    }
}

/// The name of `obj`'s type, for messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_owned())
}

fn opt_string(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Option<String>> {
    if obj.is_none() {
        return Ok(None);
    }
    match obj.cast::<PyString>() {
        Ok(s) => Ok(Some(s.to_str()?.to_owned())),
        Err(_) => Err(invalid_type(format!(
            "{what} must be a str or None, got {}",
            type_name(obj)
        ))),
    }
}

/// `extra_key` argument: str or None (`InvalidTypeError` otherwise).
pub fn extra_key(obj: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    opt_string(obj, "extra_key")
}

/// `cache_salt` argument: str or None (`InvalidTypeError` otherwise).
pub fn cache_salt(obj: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    opt_string(obj, "cache_salt")
}

/// `eviction_policy` argument: a str (`InvalidTypeError` otherwise).
pub fn eviction_policy(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    match obj.cast::<PyString>() {
        Ok(s) => Ok(s.to_str()?.to_owned()),
        Err(_) => Err(invalid_type(format!(
            "eviction_policy must be a str, got {}",
            type_name(obj)
        ))),
    }
}

/// An integer argument (count, size or id): a Python int in the int64 range, not a float
/// or bool (`InvalidTypeError`); beyond int64, `InvalidInputError`. The call it goes to
/// checks its own range and names the argument.
pub fn int_arg(obj: &Bound<'_, PyAny>) -> PyResult<i64> {
    opt_i64_arg(obj)?.ok_or_else(|| invalid_type("an integer argument must be an int, got None"))
}

/// An integer argument that must fit in u32 (e.g. a KV-cache group id).
pub fn u32_arg(obj: &Bound<'_, PyAny>) -> PyResult<u32> {
    let v = int_arg(obj)?;
    u32::try_from(v).map_err(|_| {
        invalid_input(format!(
            "{v} is out of range: expected an int in [0, 2**32)"
        ))
    })
}

/// An optional integer identifier (e.g. a LoRA id): None, or an int in the int64 range,
/// exactly (an id is never clamped).
pub fn opt_i64_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<i64>> {
    if obj.is_none() {
        return Ok(None);
    }
    if obj.is_instance_of::<PyBool>() {
        return Err(invalid_type("an integer argument must be an int, got bool"));
    }
    let v: i128 = obj.extract().map_err(|_| {
        invalid_type(format!(
            "an integer argument must be an int, got {}",
            type_name(obj)
        ))
    })?;
    i64::try_from(v)
        .map(Some)
        .map_err(|_| invalid_input(format!("{v} is out of the int64 range")))
}

/// A short sequence of u32 ids (e.g. KV-cache group ids), item by item.
pub fn u32_list(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    reject_non_sequence(obj, "the id list")?;
    let mut out = Vec::new();
    for item in obj.try_iter().map_err(|_| {
        invalid_type(format!(
            "expected a sequence of ints, got {}",
            type_name(obj)
        ))
    })? {
        out.push(u32_arg(&item?)?);
    }
    Ok(out)
}
