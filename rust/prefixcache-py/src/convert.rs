//! Argument conversion: the one layer that turns Python objects into core arguments.
//!
//! Token ids (u32 in the core) and KV indices (i64) are read from, in this order:
//! 1. a [`TokenBuffer`](crate::token_buffer::TokenBuffer): its tokens, shared, no copy;
//! 2. a list or tuple (subclasses too) of ints: CPython ints are read directly from the
//!    object (no per-element call); an item that is not an exact `int` (a numpy integer
//!    scalar, an int subclass) goes through `__index__`;
//! 3. an object with the buffer protocol (`array.array` of any integer typecode, numpy
//!    arrays of any integer dtype, `memoryview`): any alignment, byte order and stride;
//! 4. an object with `__array_interface__` (typestr, shape, strides, data pointer),
//!    copied through the kernel ([`crate::checked`]): a pointer the process cannot read
//!    is refused, not read;
//! 5. an object with `__dlpack__` on the CPU (torch tensors, numpy, jax, ...): DLPack
//!    1.x when the producer takes `max_version`, else 0.x; any producer but torch is
//!    read through [`crate::checked`] as in 4;
//! 6. any other sequence (`__len__` + integer `__getitem__`), item by item.
//!
//! Rejected with `InvalidTypeError`: str, bytes, bytearray, sets, dicts, anything else;
//! bools, floats and other non-integers (as items or as dtypes). Rejected with
//! `InvalidInputError`: arrays that are not 1-dimensional, values out of range (naming
//! the position). Every accepted form gives exactly what the equivalent list gives.
//!
//! Memory safety: every array is read in one pass, with the GIL held and no Python code
//! running between its export and the read. [`tokens`] and [`read_ints`] copy it at
//! conversion (narrowed and range-checked in the same pass) into an owned `Vec`, so a
//! caller resizing or freeing the array later (another thread, or a Python hook run while
//! the next argument is converted) cannot make us read freed memory. [`input`] may instead
//! hand the core the array itself ([`Input`]): only for calls whose arguments run no
//! Python code at all ([`reads_without_python`], [`plain_int`]) and only inside
//! [`Shared::try_with`](crate::shared::Shared::try_with), which never releases the GIL;
//! such an input is copied ([`Input::into_owned`]) before anything that could let Python
//! code run. Nothing is borrowed with rust-numpy's borrow tracking (which aborted the
//! process when an array was resized under it).

use std::cell::Cell;
use std::ffi::CStr;
use std::os::raw::c_int;
use std::sync::{Arc, OnceLock};

use pyo3::exceptions::{
    PyIndexError, PyMemoryError, PyOverflowError, PyTypeError, PyUnicodeEncodeError,
};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use pyo3::sync::PyOnceLock;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyCapsule, PyDict, PyFrozenSet, PyInt, PyIterator, PyList,
    PyMemoryView, PySet, PyString, PyTuple, PyType,
};

use crate::errors::{invalid_input, invalid_type};
use crate::token_buffer::TokenBuffer;

// ---------------------------------------------------------------------------------------
// Owned results

/// Token ids read from a Python object: owned (`Send`), usable with the GIL released.
pub struct Tokens(TokensRepr);

enum TokensRepr {
    Owned(Vec<u32>),
    /// A snapshot of a `TokenBuffer` (copy-on-write: appends after this call do not
    /// change it).
    Shared(Arc<Vec<u32>>),
}

impl Tokens {
    pub fn as_slice(&self) -> &[u32] {
        match &self.0 {
            TokensRepr::Owned(v) => v,
            TokensRepr::Shared(v) => v,
        }
    }

    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// The tokens as a `Vec` of about their length, for a caller that keeps them: the
    /// buffer they were read into when it is not much larger (no copy), else a copy.
    pub fn into_vec(mut self) -> Vec<u32> {
        match &mut self.0 {
            TokensRepr::Owned(v) if v.capacity() <= v.len() + v.len() / 8 + 16 => std::mem::take(v),
            repr => match repr {
                TokensRepr::Owned(v) => v.as_slice().to_vec(),
                TokensRepr::Shared(v) => v.as_slice().to_vec(),
            },
        }
    }
}

impl Drop for Tokens {
    fn drop(&mut self) {
        if let TokensRepr::Owned(v) = &mut self.0 {
            give_back(std::mem::take(v));
        }
    }
}

/// Token ids or KV indices of a short call that keeps the GIL throughout, read in place
/// when they already are what the core reads (a `uint32` / `int64` array, native order,
/// contiguous, aligned) and copied otherwise ([`prepare`], [`Prepared::acquire`]).
///
/// Not `Send`, and only valid until Python code runs: use it inside
/// [`Shared::try_with`](crate::shared::Shared::try_with), which never releases the GIL;
/// anywhere else (a call that releases the GIL, or waits for the lock), turn it into an
/// owned copy first ([`Input::into_owned`]).
pub struct Input<'py, T: Elem>(InputRepr<'py, T>);

enum InputRepr<'py, T: Elem> {
    Owned(Vec<T>),
    Shared(Arc<Vec<T>>),
    /// `n` elements of `T` at `base` (aligned, contiguous), exported by `array`.
    InPlace(RawArray<'py>),
}

impl<'py, T: Elem> Input<'py, T> {
    pub fn as_slice(&self) -> &[T] {
        match &self.0 {
            InputRepr::Owned(v) => v,
            InputRepr::Shared(v) => v,
            // SAFETY: checked by `RawArray::is_native::<T>` when built: `n` aligned,
            // contiguous elements of `T`, exported while `self` holds the view or capsule.
            // Its callers read it with the GIL held and no Python code running (see the
            // type's documentation), so nothing can resize or free the memory meanwhile.
            // Native code of another thread that released the GIL could still write the
            // array (a data race in the caller's program, as for any C extension reading
            // it): the core then sees some mix of old and new integers, each in range
            // for `T`; callers whose result's structure depends on the values (insert's
            // key) copy them instead.
            InputRepr::InPlace(a) => unsafe { std::slice::from_raw_parts(a.base as *const T, a.n) },
        }
    }

    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// An owned copy (`Send`), usable after Python code ran or with the GIL released.
    pub fn into_owned(mut self) -> PyResult<Owned<T>> {
        let repr = std::mem::replace(&mut self.0, InputRepr::Owned(Vec::new()));
        Ok(match repr {
            InputRepr::Owned(v) => Owned(OwnedRepr::Owned(v)),
            InputRepr::Shared(v) => Owned(OwnedRepr::Shared(v)),
            InputRepr::InPlace(a) => {
                let mut v = scratch::<T>(a.n).ok_or_else(|| {
                    PyMemoryError::new_err(format!("cannot allocate {} elements", a.n))
                })?;
                // SAFETY: as in `as_slice`; the GIL is still held and no Python code ran
                // since the array was exported.
                let src = unsafe { std::slice::from_raw_parts(a.base as *const T, a.n) };
                v.extend_from_slice(src);
                Owned(OwnedRepr::Owned(v))
            }
        })
    }
}

impl<T: Elem> Drop for Input<'_, T> {
    fn drop(&mut self) {
        if let InputRepr::Owned(v) = &mut self.0 {
            give_back(std::mem::take(v));
        }
    }
}

/// Token ids or KV indices owned by the call (`Send`): what [`Input::into_owned`] gives.
pub struct Owned<T: Elem>(OwnedRepr<T>);

enum OwnedRepr<T: Elem> {
    Owned(Vec<T>),
    Shared(Arc<Vec<T>>),
}

impl<T: Elem> Owned<T> {
    pub fn as_slice(&self) -> &[T] {
        match &self.0 {
            OwnedRepr::Owned(v) => v,
            OwnedRepr::Shared(v) => v,
        }
    }
}

impl<T: Elem> Drop for Owned<T> {
    fn drop(&mut self) {
        if let OwnedRepr::Owned(v) = &mut self.0 {
            give_back(std::mem::take(v));
        }
    }
}

// ---------------------------------------------------------------------------------------
// Element types: what an element becomes in the core, and its range

/// An element type of the core (`u32` token ids, `i64` KV indices).
pub trait Elem: Copy + Send + Sync + 'static {
    /// The value as this type, or `None` when out of range.
    fn from_i64(v: i64) -> Option<Self>;
    /// The bits of an i64 that must be clear for it to be in range (the high 32 bits
    /// for `u32`): a loop ORs every value together and checks the mask once at the end.
    const HIGH: u64;
    /// The low bits of `v` as this type (the value when in range).
    fn truncate(v: i64) -> Self;
    /// Why `v` at `what[i]` is refused, for messages.
    fn out_of_range(what: &str, i: usize, v: &dyn std::fmt::Display) -> String;
    /// This thread's spare buffer of this type (see [`scratch`]).
    fn spare() -> &'static std::thread::LocalKey<Cell<Vec<Self>>>;
    /// A `TokenBuffer` snapshot as this type: shared when it is `u32`, else widened
    /// (`Err(None)`: no memory for the widened copy).
    fn from_snapshot(s: Arc<Vec<u32>>) -> Result<Arc<Vec<Self>>, Option<Vec<Self>>>;
    /// Whether the type holds values beyond i64 (`u64`: a `uint64` array's values above
    /// 2**63, which [`Src::widen`] wraps, are in range).
    const ABOVE_I64: bool = false;
    /// An exact int beyond i64 as this type (`None`: out of range). Only `u64` has any.
    ///
    /// # Safety
    /// `op` must be a live exact int, the GIL held.
    unsafe fn from_big(op: *mut ffi::PyObject) -> Option<Self> {
        let _ = op;
        None
    }
}

/// The bits of a widened `S` that must be clear for it to be a `T` (see `Elem::HIGH`).
#[inline(always)]
const fn out_mask<S: Src, T: Elem>() -> u64 {
    if T::ABOVE_I64 && S::HIGH != 0 {
        0 // u64 into u64: every value
    } else {
        S::HIGH | T::HIGH
    }
}

thread_local! {
    static SPARE_U32: Cell<Vec<u32>> = const { Cell::new(Vec::new()) };
    static SPARE_I64: Cell<Vec<i64>> = const { Cell::new(Vec::new()) };
    static SPARE_U64: Cell<Vec<u64>> = const { Cell::new(Vec::new()) };
}

/// Non-negative ids of 64 bits (request ids, token positions): `[0, 2**64)`.
impl Elem for u64 {
    #[inline(always)]
    fn from_i64(v: i64) -> Option<Self> {
        u64::try_from(v).ok()
    }
    /// The sign bit: a negative value of a signed source.
    const HIGH: u64 = 1 << 63;
    const ABOVE_I64: bool = true;
    #[inline(always)]
    fn truncate(v: i64) -> Self {
        v as u64
    }
    fn out_of_range(what: &str, i: usize, v: &dyn std::fmt::Display) -> String {
        let v = v.to_string();
        if v.starts_with('-') {
            format!("{what}[{i}] = {v} must be >= 0")
        } else {
            format!("{what}[{i}] = {v} is out of range: it must be in [0, 2**64)")
        }
    }
    fn spare() -> &'static std::thread::LocalKey<Cell<Vec<Self>>> {
        &SPARE_U64
    }
    fn from_snapshot(s: Arc<Vec<u32>>) -> Result<Arc<Vec<Self>>, Option<Vec<Self>>> {
        Err(widen_snapshot(&s))
    }
    unsafe fn from_big(op: *mut ffi::PyObject) -> Option<Self> {
        // SAFETY: an exact int (caller): no `__index__` call, no Python code.
        let v = unsafe { ffi::PyLong_AsUnsignedLongLong(op) };
        // SAFETY: GIL held.
        if v == u64::MAX && unsafe { !ffi::PyErr_Occurred().is_null() } {
            // Negative or beyond 2**64: OverflowError, cleared (the caller reports it).
            unsafe { ffi::PyErr_Clear() };
            return None;
        }
        Some(v)
    }
}

impl Elem for u32 {
    #[inline(always)]
    fn from_i64(v: i64) -> Option<Self> {
        u32::try_from(v).ok()
    }
    const HIGH: u64 = 0xffff_ffff_0000_0000;
    #[inline(always)]
    fn truncate(v: i64) -> Self {
        v as u32
    }
    fn out_of_range(what: &str, i: usize, v: &dyn std::fmt::Display) -> String {
        format!("{what}[{i}] = {v} is out of range: token ids must be in [0, 2**32)")
    }
    fn spare() -> &'static std::thread::LocalKey<Cell<Vec<Self>>> {
        &SPARE_U32
    }
    fn from_snapshot(s: Arc<Vec<u32>>) -> Result<Arc<Vec<Self>>, Option<Vec<Self>>> {
        Ok(s)
    }
}

impl Elem for i64 {
    #[inline(always)]
    fn from_i64(v: i64) -> Option<Self> {
        Some(v)
    }
    const HIGH: u64 = 0;
    #[inline(always)]
    fn truncate(v: i64) -> Self {
        v
    }
    fn out_of_range(what: &str, i: usize, v: &dyn std::fmt::Display) -> String {
        format!("{what}[{i}] = {v} does not fit in int64")
    }
    fn spare() -> &'static std::thread::LocalKey<Cell<Vec<Self>>> {
        &SPARE_I64
    }
    fn from_snapshot(s: Arc<Vec<u32>>) -> Result<Arc<Vec<Self>>, Option<Vec<Self>>> {
        Err(widen_snapshot(&s))
    }
}

/// Token ids widened to `T` in a buffer reserved fallibly (`None`: out of memory).
fn widen_snapshot<T: Elem>(s: &[u32]) -> Option<Vec<T>> {
    let n = s.len();
    let mut v = scratch::<T>(n)?;
    let dst = v.spare_capacity_mut()[..n].as_mut_ptr() as *mut T;
    // SAFETY: `n` u32 at `s`, room for `n` elements at `dst`; every u32 fits in `T`
    // (i64, u64).
    unsafe {
        narrow_any::<u32, T>(s.as_ptr(), dst, n);
        v.set_len(n);
    }
    Some(v)
}

/// Buffers up to this many elements go back to their thread's spare slot when a call is
/// done with them (a 2304-token prompt: 9 KB of `u32`), so the next call of the thread
/// reads into memory that is already in its cache instead of a fresh allocation.
const SPARE_MAX: usize = 1 << 16;

/// An empty `Vec` with room for `n` elements: this thread's spare buffer when it is large
/// enough, else a new allocation with an eighth more room (what [`Tokens::into_vec`]
/// still hands over as is), so that a request keeping its prompt's buffer can take a
/// short output without moving it. `None`: out of memory.
fn scratch<T: Elem>(n: usize) -> Option<Vec<T>> {
    let mut v = T::spare().try_with(Cell::take).unwrap_or_default();
    v.clear();
    if v.capacity() < n {
        v = Vec::new(); // too small: not copied into the new allocation
        v.try_reserve_exact(n.checked_add(n / 8 + 16)?).ok()?;
    }
    Some(v)
}

/// Gives a buffer back to this thread's spare slot (dropped when larger than
/// [`SPARE_MAX`]).
fn give_back<T: Elem>(mut v: Vec<T>) {
    if v.capacity() == 0 || v.capacity() > SPARE_MAX {
        return;
    }
    v.clear();
    let _ = T::spare().try_with(|c| {
        // Keep the larger of the two.
        let old = c.take();
        c.set(if old.capacity() > v.capacity() {
            old
        } else {
            v
        });
    });
}

fn range_error<T: Elem>(what: &str, i: usize, v: impl std::fmt::Display) -> PyErr {
    invalid_input(T::out_of_range(what, i, &v))
}

/// An element type of an array: read raw, byte-swapped if needed, widened to i64.
trait Src: Copy {
    /// The bits of the widened value that must be clear (bit 63 for `u64`: values
    /// beyond i64, which `widen` wraps to negative numbers).
    const HIGH: u64;
    fn swap(self) -> Self;
    /// The value as i64 (`u64` values beyond i64 wrap: see `HIGH`).
    fn widen(self) -> i64;
    fn to_i128(self) -> i128;
}

macro_rules! src {
    ($($t:ty: $high:expr),*) => {$(
        impl Src for $t {
            const HIGH: u64 = $high;
            #[inline(always)]
            fn swap(self) -> Self { self.swap_bytes() }
            #[inline(always)]
            #[allow(clippy::cast_lossless, clippy::cast_possible_wrap)]
            fn widen(self) -> i64 { self as i64 }
            #[inline(always)]
            fn to_i128(self) -> i128 { self as i128 }
        }
    )*};
}
src!(i8: 0, u8: 0, i16: 0, u16: 0, i32: 0, u32: 0, i64: 0, u64: 1 << 63);

/// Narrows `n` contiguous native-order elements at `src` into `dst`; returns the OR of
/// every widened value: all are in range when it has none of the bits `S::HIGH |
/// T::HIGH`. Branch-free so that the compiler vectorises it (one OR per vector on top
/// of the copy).
///
/// # Safety
/// `src` points at `n` readable elements (any alignment), `dst` at room for `n`.
#[inline(always)]
unsafe fn narrow_run<S: Src, T: Elem>(src: *const S, dst: *mut T, n: usize) -> u64 {
    let mut all = 0u64;
    for i in 0..n {
        // SAFETY: i < n, by the caller's contract. A raw read, never a Rust reference:
        // the memory may be written by native code on another thread (e.g. a numpy
        // operation that released the GIL), which can only make us read some other
        // integers, each range-checked here.
        let w = unsafe { std::ptr::read_unaligned(src.add(i)) }.widen();
        all |= w as u64;
        // SAFETY: i < n, room for n elements.
        unsafe { dst.add(i).write(T::truncate(w)) };
    }
    all
}

/// [`narrow_run`] compiled for AVX-512 (`vpmovqd` narrows 8 values in one instruction).
///
/// # Safety
/// As [`narrow_run`], on a CPU with AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn narrow_run_avx512<S: Src, T: Elem>(src: *const S, dst: *mut T, n: usize) -> u64 {
    // SAFETY: forwarded contract.
    unsafe { narrow_run(src, dst, n) }
}

/// [`narrow_run`] compiled for AVX2 (8 lanes of 32 bits: ~4x the baseline x86-64 loop).
///
/// # Safety
/// As [`narrow_run`], on a CPU with AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn narrow_run_avx2<S: Src, T: Elem>(src: *const S, dst: *mut T, n: usize) -> u64 {
    // SAFETY: forwarded contract.
    unsafe { narrow_run(src, dst, n) }
}

/// [`narrow_run`] with the widest instructions this CPU has; true when every element
/// is in range.
///
/// # Safety
/// As [`narrow_run`].
#[inline]
unsafe fn narrow_contiguous<S: Src, T: Elem>(src: *const S, dst: *mut T, n: usize) -> bool {
    // SAFETY: forwarded contract.
    let all = unsafe { narrow_any::<S, T>(src, dst, n) };
    all & out_mask::<S, T>() == 0
}

/// [`narrow_run`] dispatched on the CPU's vector extensions.
///
/// # Safety
/// As [`narrow_run`].
#[inline]
unsafe fn narrow_any<S: Src, T: Elem>(src: *const S, dst: *mut T, n: usize) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: forwarded contract; AVX-512F checked just above.
        return unsafe { narrow_run_avx512(src, dst, n) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: forwarded contract; AVX2 checked just above.
        return unsafe { narrow_run_avx2(src, dst, n) };
    }
    // SAFETY: forwarded contract.
    unsafe { narrow_run(src, dst, n) }
}

/// Reads `n` elements of type `S` at `base + i * stride` into a `Vec<T>`, in one pass,
/// range-checking as it goes. `Err((i, v))`: the first element out of range.
///
/// # Safety
/// `base + i * stride` for `i < n` must point at `size_of::<S>()` readable bytes (any
/// alignment), valid for the whole call.
unsafe fn gather<S: Src, T: Elem>(
    base: *const u8,
    n: usize,
    stride: isize,
    swap: bool,
) -> Result<Vec<T>, (usize, i128)> {
    let size = std::mem::size_of::<S>() as isize;
    let read = |i: usize| -> S {
        // SAFETY: in bounds by the caller's contract; `read_unaligned` allows any
        // alignment (a raw read, as in `narrow_run`).
        let x = unsafe { std::ptr::read_unaligned(base.offset(i as isize * stride) as *const S) };
        if swap {
            x.swap()
        } else {
            x
        }
    };
    let Some(mut out) = scratch::<T>(n) else {
        return Err((usize::MAX, 0));
    };
    let dst = out.spare_capacity_mut()[..n].as_mut_ptr() as *mut T;
    let ok = if stride == size && !swap {
        // SAFETY: `n` contiguous elements at `base` (caller), room for `n` at `dst`.
        unsafe { narrow_contiguous::<S, T>(base as *const S, dst, n) }
    } else {
        let mut all = 0u64;
        for i in 0..n {
            let w = read(i).widen();
            all |= w as u64;
            // SAFETY: i < n, room for n elements.
            unsafe { dst.add(i).write(T::truncate(w)) };
        }
        all & out_mask::<S, T>() == 0
    };
    // SAFETY: the first `n` elements were all written above.
    unsafe { out.set_len(n) };
    if ok {
        return Ok(out);
    }
    for i in 0..n {
        let x = read(i);
        let w = x.widen();
        if (w as u64) & out_mask::<S, T>() != 0 {
            give_back(out);
            return Err((i, x.to_i128()));
        }
    }
    Ok(out) // only when another thread rewrote the element meanwhile
}

/// An array's element layout.
#[derive(Clone, Copy)]
struct Layout {
    signed: bool,
    size: usize,
    swap: bool,
}

/// Reads a 1-D array described by `layout` (validated: size 1, 2, 4 or 8).
///
/// # Safety
/// As [`gather`]: `n` elements of `layout.size` bytes at `base + i * stride`, readable
/// for the whole call.
unsafe fn read_array<T: Elem>(
    base: *const u8,
    n: usize,
    stride: isize,
    layout: Layout,
    what: &str,
) -> PyResult<Vec<T>> {
    let Layout { signed, size, swap } = layout;
    // SAFETY: forwarded contract.
    let r = unsafe {
        match (signed, size) {
            (true, 1) => gather::<i8, T>(base, n, stride, swap),
            (false, 1) => gather::<u8, T>(base, n, stride, swap),
            (true, 2) => gather::<i16, T>(base, n, stride, swap),
            (false, 2) => gather::<u16, T>(base, n, stride, swap),
            (true, 4) => gather::<i32, T>(base, n, stride, swap),
            (false, 4) => gather::<u32, T>(base, n, stride, swap),
            (true, 8) => gather::<i64, T>(base, n, stride, swap),
            (false, 8) => gather::<u64, T>(base, n, stride, swap),
            _ => {
                return Err(invalid_type(format!(
                    "{what}: unsupported integer size {size}"
                )))
            }
        }
    };
    r.map_err(|(i, v)| {
        if i == usize::MAX {
            PyMemoryError::new_err(format!("cannot allocate {n} elements"))
        } else {
            range_error::<T>(what, i, v)
        }
    })
}

// ---------------------------------------------------------------------------------------
// Python ints, read directly

/// Whether CPython ints are laid out as this build expects (checked once at runtime).
#[cfg(not(any(Py_LIMITED_API, PyPy, GraalPy, Py_GIL_DISABLED)))]
mod fast_int {
    use super::ffi;

    /// The head of a CPython `PyLongObject` (3.12+: `long_value.lv_tag` then digits).
    #[cfg(Py_3_12)]
    #[repr(C)]
    struct Head {
        ob_base: ffi::PyObject,
        lv_tag: usize,
        digit0: u32,
    }

    /// The head of a CPython `PyLongObject` (3.10, 3.11: signed digit count then digits).
    #[cfg(not(Py_3_12))]
    #[repr(C)]
    struct Head {
        ob_base: ffi::PyVarObject,
        digit0: u32,
    }

    /// The value of an exact `int` of at most one 30-bit digit, `None` for larger ones.
    ///
    /// # Safety
    /// `op` must be a live object whose type is exactly `int`.
    #[inline(always)]
    pub unsafe fn compact(op: *mut ffi::PyObject) -> Option<i64> {
        let h = op as *const Head;
        #[cfg(Py_3_12)]
        {
            // SAFETY: an exact int has this layout (CPython's Include/cpython/longintrepr.h:
            // sign in bits 0-1, digit count from bit 3; one digit is always allocated).
            let tag = unsafe { (*h).lv_tag };
            if tag >= (2 << 3) {
                return None;
            }
            let d = i64::from(unsafe { (*h).digit0 });
            Some((1 - (tag & 3) as i64) * d)
        }
        #[cfg(not(Py_3_12))]
        {
            // SAFETY: as above for 3.10/3.11 (ob_size = signed digit count; one digit is
            // always allocated, so digit0 is readable even for 0).
            let size = unsafe { (*h).ob_base.ob_size };
            match size {
                0 => Some(0),
                1 => Some(i64::from(unsafe { (*h).digit0 })),
                -1 => Some(-i64::from(unsafe { (*h).digit0 })),
                _ => None,
            }
        }
    }
}

/// Whether the direct int reader agrees with CPython on this interpreter (once).
fn fast_ints_ok(py: Python<'_>) -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        #[cfg(not(any(Py_LIMITED_API, PyPy, GraalPy, Py_GIL_DISABLED)))]
        {
            let probes: [i64; 9] = [0, 1, -1, 7, 255, 1000, -123456, (1 << 30) - 1, -(1 << 29)];
            probes.iter().all(|&v| {
                let o = v.into_pyobject(py).map(|o| o.into_any());
                match o {
                    // SAFETY: `o` is a live exact int.
                    Ok(o) => (unsafe { fast_int::compact(o.as_ptr()) }) == Some(v),
                    Err(_) => false,
                }
            }) && [1i64 << 30, -(1 << 31), i64::MAX].iter().all(|&v| {
                let o = v.into_pyobject(py).map(|o| o.into_any());
                // SAFETY: as above; larger ints must not read as compact.
                matches!(o, Ok(o) if unsafe { fast_int::compact(o.as_ptr()) }.is_none())
            })
        }
        #[cfg(any(Py_LIMITED_API, PyPy, GraalPy, Py_GIL_DISABLED))]
        {
            let _ = py;
            false
        }
    })
}

/// One exact `int` as i64 (`None`: beyond i64).
///
/// # Safety
/// `op` must be a live exact int, the GIL held.
#[inline(always)]
unsafe fn exact_int(op: *mut ffi::PyObject, fast: bool) -> Option<i64> {
    #[cfg(not(any(Py_LIMITED_API, PyPy, GraalPy, Py_GIL_DISABLED)))]
    if fast {
        // SAFETY: forwarded contract.
        if let Some(v) = unsafe { fast_int::compact(op) } {
            return Some(v);
        }
    }
    let _ = fast;
    let mut overflow: c_int = 0;
    // SAFETY: an exact int: no `__index__` call, no Python code, no exception on overflow.
    let v = unsafe { ffi::PyLong_AsLongLongAndOverflow(op, &mut overflow) };
    if overflow != 0 {
        return None;
    }
    if v == -1 {
        // Cannot fail for an exact int short of a bug; clear any error to stay consistent.
        // SAFETY: GIL held.
        unsafe {
            if !ffi::PyErr_Occurred().is_null() {
                ffi::PyErr_Clear();
            }
        }
    }
    Some(v)
}

fn item_type_error(what: &str, i: usize, item: &Bound<'_, PyAny>) -> PyErr {
    invalid_type(format!(
        "{what}[{i}] must be an int, got {}",
        type_name(item)
    ))
}

/// One item that is not an exact int: through `__index__` (numpy integer scalars, int
/// subclasses); bools and everything else raise.
fn slow_item<T: Elem>(item: &Bound<'_, PyAny>, what: &str, i: usize) -> PyResult<T> {
    if item.is_instance_of::<PyBool>() {
        return Err(item_type_error(what, i, item));
    }
    match index(item) {
        Ok(Some(v)) => T::from_i64(v).ok_or_else(|| range_error::<T>(what, i, v)),
        Ok(None) => big::<T>(item).ok_or_else(|| range_error::<T>(what, i, display(item))),
        Err(_) => Err(item_type_error(what, i, item)),
    }
}

/// An integer beyond i64 (its `__index__` already gave an int) as `T`, when `T` holds it.
fn big<T: Elem>(item: &Bound<'_, PyAny>) -> Option<T> {
    if !T::ABOVE_I64 {
        return None;
    }
    let py = item.py();
    // SAFETY: GIL held; a new reference or NULL with an error set.
    let r = unsafe { ffi::PyNumber_Index(item.as_ptr()) };
    if r.is_null() {
        let _ = PyErr::take(py);
        return None;
    }
    // SAFETY: `r` is a new, owned reference to an exact int.
    let r = unsafe { Bound::from_owned_ptr(py, r) };
    // SAFETY: a live exact int, GIL held.
    unsafe { T::from_big(r.as_ptr()) }
}

/// `operator.index(obj)` as i64: `Ok(None)` when beyond i64, `Err` when not an integer.
fn index(obj: &Bound<'_, PyAny>) -> PyResult<Option<i64>> {
    let py = obj.py();
    // SAFETY: GIL held; `PyNumber_Index` returns a new reference or NULL with an error set.
    let r = unsafe { ffi::PyNumber_Index(obj.as_ptr()) };
    if r.is_null() {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `r` is a new, owned reference to an exact int.
    let r = unsafe { Bound::from_owned_ptr(py, r) };
    // SAFETY: `r` is a live exact int (PyNumber_Index returns exact ints).
    Ok(unsafe { exact_int(r.as_ptr(), false) })
}

fn display(obj: &Bound<'_, PyAny>) -> String {
    obj.str()
        .map(|s| s.to_string())
        .unwrap_or_else(|_| "?".to_owned())
}

/// Item `i` of a list, tuple or sequence, `None` past its end. A list or tuple (subclasses
/// too) is read at the C level, as the direct reader reads it: its own `__len__` and
/// `__getitem__` overrides are not called, so one object is never read two ways.
fn item_at<'py>(
    obj: &Bound<'py, PyAny>,
    i: usize,
    what: &str,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    if let Ok(l) = obj.cast::<PyList>() {
        return (i < l.len()).then(|| l.get_item(i)).transpose();
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        return (i < t.len()).then(|| t.get_item(i)).transpose();
    }
    let n = obj.len()?;
    if i >= n {
        return Ok(None);
    }
    match obj.get_item(i) {
        Ok(item) => Ok(Some(item)),
        // The sequence ended before the length it gave.
        Err(e) if e.is_instance_of::<PyIndexError>(obj.py()) => {
            let err = invalid_input(format!(
                "{what}: its __len__ gives {n} but item {i} raised IndexError"
            ));
            err.set_cause(obj.py(), Some(e));
            Err(err)
        }
        Err(e) => Err(e),
    }
}

/// Items `[from, len)` of a list or sequence, item by item through the safe API (Python
/// code may run: the length is checked again for every item).
fn items_slow<T: Elem>(
    obj: &Bound<'_, PyAny>,
    from: usize,
    out: &mut Vec<T>,
    what: &str,
) -> PyResult<()> {
    let mut i = from;
    loop {
        let Some(item) = item_at(obj, i, what)? else {
            return Ok(());
        };
        // SAFETY (of the call below): `exact_int` only reads an exact int.
        let v = if item
            .get_type()
            .is(obj.py().get_type::<pyo3::types::PyInt>())
        {
            // SAFETY: `item` is a live exact int.
            match unsafe { exact_int(item.as_ptr(), fast_ints_ok(obj.py())) } {
                Some(v) => T::from_i64(v).ok_or_else(|| range_error::<T>(what, i, v))?,
                // SAFETY: a live exact int.
                None => match unsafe { T::from_big(item.as_ptr()) } {
                    Some(v) => v,
                    None => return Err(range_error::<T>(what, i, display(&item))),
                },
            }
        } else {
            slow_item(&item, what, i)?
        };
        out.try_reserve(1)
            .map_err(|_| PyMemoryError::new_err("cannot allocate"))?;
        out.push(v);
        i += 1;
    }
}

/// How many items ahead the int objects of a list are prefetched: a list that is not in
/// the cache costs one memory access per int object otherwise.
const PREFETCH: usize = 64;

/// Items of a list or tuple (`items`, `n` of them, owned by `obj`).
///
/// # Safety
/// `items[0..n]` must be the object's item array, valid until Python code runs; GIL held.
unsafe fn read_item_array<T: Elem>(
    obj: &Bound<'_, PyAny>,
    items: *const *mut ffi::PyObject,
    n: usize,
    what: &str,
) -> PyResult<Vec<T>> {
    let py = obj.py();
    let fast = fast_ints_ok(py);
    let mut out = scratch::<T>(n)
        .ok_or_else(|| PyMemoryError::new_err(format!("cannot allocate {n} elements")))?;
    // SAFETY: `items[0..n]` is the array (caller) and no Python code runs in the reader.
    let done = unsafe { exact_ints_into(items, &mut out.spare_capacity_mut()[..n], fast) };
    // SAFETY: elements [0, done) were written.
    unsafe { out.set_len(done) };
    if done < n {
        // SAFETY: still alive (no Python code ran); borrowed to look at it.
        let item = unsafe { Bound::from_borrowed_ptr(py, *items.add(done)) };
        if item.is_exact_instance_of::<PyInt>() {
            // An exact int out of range.
            // SAFETY: a live exact int, GIL held.
            return Err(match unsafe { exact_int(item.as_ptr(), fast) } {
                Some(v) => range_error::<T>(what, done, v),
                None => range_error::<T>(what, done, display(&item)),
            });
        }
        // Not an exact int at `done`: Python code may run from here on (`__index__`).
        items_slow(obj, done, &mut out, what)?;
    }
    Ok(out)
}

/// The item array and length of a list or tuple (subclasses included: the same C
/// layout), read without running Python code; `None` for anything else.
///
/// # Safety
/// The pointer is valid only until Python code runs (or the GIL is released).
#[cfg(not(any(Py_LIMITED_API, PyPy, GraalPy, Py_GIL_DISABLED)))]
unsafe fn item_array(obj: &Bound<'_, PyAny>) -> Option<(*const *mut ffi::PyObject, usize)> {
    // SAFETY: the casts check the layouts; GIL held (a `Bound` exists).
    unsafe {
        if let Ok(l) = obj.cast::<PyList>() {
            let p = l.as_ptr() as *mut ffi::PyListObject;
            let n = usize::try_from(ffi::PyList_GET_SIZE(l.as_ptr())).ok()?;
            return Some(((*p).ob_item as *const _, n));
        }
        if let Ok(t) = obj.cast::<PyTuple>() {
            let p = t.as_ptr() as *mut ffi::PyTupleObject;
            let n = usize::try_from(ffi::PyTuple_GET_SIZE(t.as_ptr())).ok()?;
            return Some(((*p).ob_item.as_ptr() as *const _, n));
        }
    }
    None
}

/// Exact ints in range of `T` from an item array into `out` (as long as the array), read
/// directly with the int objects fetched [`PREFETCH`] items ahead; returns how many were
/// written: `out.len()`, or the index of the first item that is not an exact int in
/// range (`out[i..]` is then unwritten).
///
/// # Safety
/// `items[0..out.len()]` must be a live list's or tuple's item array, no Python code
/// running meanwhile; GIL held; `fast` only when `fast_ints_ok`.
unsafe fn exact_ints_into<T: Elem>(
    items: *const *mut ffi::PyObject,
    out: &mut [std::mem::MaybeUninit<T>],
    fast: bool,
) -> usize {
    let n = out.len();
    // Only the address of the static is taken (no read or write).
    let int_type = &raw mut ffi::PyLong_Type;
    for (i, d) in out.iter_mut().enumerate() {
        // SAFETY: i < n, within the item array (forwarded contract).
        let item = unsafe { *items.add(i) };
        #[cfg(target_arch = "x86_64")]
        if i + PREFETCH < n {
            // SAFETY: in bounds (checked); a prefetch is only a hint and never faults.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                _mm_prefetch::<_MM_HINT_T0>(*items.add(i + PREFETCH) as *const i8);
            }
        }
        // SAFETY: a live object (forwarded contract).
        if unsafe { ffi::Py_TYPE(item) } != int_type {
            return i;
        }
        // SAFETY: a live exact int, GIL held (`from_big`: beyond i64 only).
        let v = unsafe { exact_int(item, fast) };
        match v.map_or_else(|| unsafe { T::from_big(item) }, T::from_i64) {
            Some(x) => {
                d.write(x);
            }
            None => return i,
        }
    }
    n
}

/// Token ids and KV indices from two lists or tuples of exact ints of the same length
/// (or one object given as both), read in one pass: the two arrays' int objects are
/// fetched side by side; one object given as both is read once, as tokens, and its values
/// widened from the tokens (no second read of any object). `None` when
/// this does not apply, or when any item is not an exact int in range: the caller then
/// reads them one after the other ([`input`]), which raises the errors in argument
/// order. No Python code runs.
pub fn tokens_and_values<'py>(
    tokens: &Bound<'py, PyAny>,
    values: &Bound<'py, PyAny>,
) -> Option<(Input<'py, u32>, Input<'py, i64>)> {
    #[cfg(not(any(Py_LIMITED_API, PyPy, GraalPy, Py_GIL_DISABLED)))]
    {
        if !fast_ints_ok(tokens.py()) {
            return None;
        }
        // SAFETY: no Python code runs in this block (exact ints are read directly), so
        // both item arrays and their items stay alive and unchanged.
        let (keys, n) = unsafe { item_array(tokens) }?;
        let (vals, m) = unsafe { item_array(values) }?;
        if n != m {
            return None;
        }
        let mut k_out = Input(InputRepr::Owned(scratch::<u32>(n)?));
        let mut v_out = Input(InputRepr::Owned(scratch::<i64>(n)?));
        let (InputRepr::Owned(kv), InputRepr::Owned(vv)) = (&mut k_out.0, &mut v_out.0) else {
            return None;
        };
        if tokens.is(values) {
            // SAFETY: the item array holds n items and stays alive (above); the direct
            // reader was checked; the first n tokens are written before `set_len`.
            unsafe {
                if exact_ints_into(keys, &mut kv.spare_capacity_mut()[..n], true) < n {
                    return None;
                }
                kv.set_len(n);
            }
            vv.extend(kv.iter().map(|&t| i64::from(t)));
            return Some((k_out, v_out));
        }
        // Two objects: their int objects are fetched side by side (one walk over the
        // memory each, interleaved), which is faster than two passes.
        let int_type = &raw mut ffi::PyLong_Type;
        let kd = &mut kv.spare_capacity_mut()[..n];
        let vd = &mut vv.spare_capacity_mut()[..n];
        for (i, (kd, vd)) in kd.iter_mut().zip(vd.iter_mut()).enumerate() {
            // SAFETY: i < n = m; the arrays are alive (above).
            let (k, v) = unsafe { (*keys.add(i), *vals.add(i)) };
            #[cfg(target_arch = "x86_64")]
            if i + PREFETCH < n {
                // SAFETY: in bounds (checked); a prefetch is only a hint and never faults.
                unsafe {
                    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                    _mm_prefetch::<_MM_HINT_T0>(*keys.add(i + PREFETCH) as *const i8);
                    _mm_prefetch::<_MM_HINT_T0>(*vals.add(i + PREFETCH) as *const i8);
                }
            }
            // SAFETY: live objects; their int fields are read only once the type is
            // exactly int (GIL held, the direct reader checked by `fast_ints_ok`).
            unsafe {
                if ffi::Py_TYPE(k) != int_type || ffi::Py_TYPE(v) != int_type {
                    return None;
                }
                kd.write(exact_int(k, true).and_then(<u32 as Elem>::from_i64)?);
                vd.write(exact_int(v, true)?);
            }
        }
        // SAFETY: elements [0, n) of both were written above.
        unsafe {
            kv.set_len(n);
            vv.set_len(n);
        }
        Some((k_out, v_out))
    }
    #[cfg(any(Py_LIMITED_API, PyPy, GraalPy, Py_GIL_DISABLED))]
    {
        let _ = (tokens, values);
        None
    }
}

fn list_ints<T: Elem>(l: &Bound<'_, PyList>, what: &str) -> PyResult<Vec<T>> {
    #[cfg(not(any(Py_LIMITED_API, PyPy, GraalPy, Py_GIL_DISABLED)))]
    {
        // SAFETY: `l` is a list (exact or subclass: same C layout); GIL held; the item
        // array is read before any Python code can run.
        unsafe {
            let p = l.as_ptr() as *mut ffi::PyListObject;
            let n = usize::try_from(ffi::PyList_GET_SIZE(l.as_ptr())).unwrap_or(0);
            read_item_array(l.as_any(), (*p).ob_item, n, what)
        }
    }
    #[cfg(any(Py_LIMITED_API, PyPy, GraalPy, Py_GIL_DISABLED))]
    {
        let mut out = Vec::new();
        items_slow(l.as_any(), 0, &mut out, what)?;
        Ok(out)
    }
}

fn tuple_ints<T: Elem>(t: &Bound<'_, PyTuple>, what: &str) -> PyResult<Vec<T>> {
    #[cfg(not(any(Py_LIMITED_API, PyPy, GraalPy, Py_GIL_DISABLED)))]
    {
        // SAFETY: `t` is a tuple (immutable item array); GIL held.
        unsafe {
            let p = t.as_ptr() as *mut ffi::PyTupleObject;
            let n = usize::try_from(ffi::PyTuple_GET_SIZE(t.as_ptr())).unwrap_or(0);
            read_item_array(t.as_any(), (*p).ob_item.as_ptr(), n, what)
        }
    }
    #[cfg(any(Py_LIMITED_API, PyPy, GraalPy, Py_GIL_DISABLED))]
    {
        let mut out = Vec::new();
        items_slow(t.as_any(), 0, &mut out, what)?;
        Ok(out)
    }
}

// ---------------------------------------------------------------------------------------
// Arrays: buffer protocol, __array_interface__, DLPack

fn not_1d(what: &str, shape: &[i64]) -> PyErr {
    let dims: Vec<String> = shape.iter().map(i64::to_string).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    invalid_input(format!(
        "{what} must be 1-dimensional, got an array of shape {shape}"
    ))
}

fn dtype_error(obj: &Bound<'_, PyAny>, what: &str, fallback: &str) -> PyErr {
    let dtype = obj
        .getattr("dtype")
        .and_then(|d| d.str().map(|s| s.to_string()))
        .unwrap_or_else(|_| fallback.to_owned());
    invalid_type(format!(
        "{what} must hold integers, got an array of dtype {dtype}"
    ))
}

/// The element layout of a struct-module format (`q`, `<i`, `=I`, ...): `Ok(None)` for a
/// non-integer format.
fn buffer_layout(format: &[u8], itemsize: usize) -> Option<Layout> {
    let (order, code) = match format {
        [c] => (b'@', *c),
        [o @ (b'@' | b'=' | b'<' | b'>' | b'!'), c] => (*o, *c),
        _ => return None,
    };
    let signed = match code {
        b'b' | b'h' | b'i' | b'l' | b'q' | b'n' => true,
        b'B' | b'H' | b'I' | b'L' | b'Q' | b'N' => false,
        _ => return None,
    };
    let big = matches!(order, b'>' | b'!');
    let little = order == b'<';
    let swap = (big && cfg!(target_endian = "little")) || (little && cfg!(target_endian = "big"));
    matches!(itemsize, 1 | 2 | 4 | 8).then_some(Layout {
        signed,
        size: itemsize,
        swap,
    })
}

/// Whether `obj`'s type implements the buffer protocol (without raising anything).
fn has_buffer(obj: &Bound<'_, PyAny>) -> bool {
    #[cfg(not(any(Py_LIMITED_API, PyPy, GraalPy)))]
    {
        // SAFETY: reads two slots of a live type object, GIL held.
        unsafe {
            let tp = ffi::Py_TYPE(obj.as_ptr());
            let b = (*tp).tp_as_buffer;
            !b.is_null() && (*b).bf_getbuffer.is_some()
        }
    }
    #[cfg(any(Py_LIMITED_API, PyPy, GraalPy))]
    {
        let _ = obj;
        true
    }
}

/// A buffer obtained with `PyObject_GetBuffer`, released on drop.
struct BufferView(ffi::Py_buffer);

impl Drop for BufferView {
    fn drop(&mut self) {
        // SAFETY: obtained by a successful `PyObject_GetBuffer`, released once, GIL held
        // (dropped inside the conversion, which holds it).
        unsafe { ffi::PyBuffer_Release(&mut self.0) };
    }
}

/// A 1-D integer array exported by a Python object: its memory stays valid (and, with
/// the GIL held and no Python code running, unchanged in size) while `hold` lives.
struct RawArray<'py> {
    /// Keeps the memory exported: a buffer view or a DLPack capsule.
    _hold: Hold<'py>,
    base: *const u8,
    n: usize,
    /// In bytes.
    stride: isize,
    layout: Layout,
    /// Only the exporter's word (a Python `__dlpack__`): read through
    /// [`crate::checked`], never in place.
    untrusted: bool,
}

/// Held only for its `Drop` (which releases the export).
#[allow(dead_code)]
enum Hold<'py> {
    Buffer(BufferView),
    Capsule(Bound<'py, PyCapsule>),
    /// The exporting object itself (a DLPack view, valid while it lives and no Python
    /// code runs).
    Object(Bound<'py, PyAny>),
}

impl RawArray<'_> {
    /// The elements as `T`, copied (narrowed and range-checked).
    fn read<T: Elem>(&self, what: &str) -> PyResult<Vec<T>> {
        if self.n == 0 {
            return Ok(Vec::new());
        }
        if self.untrusted {
            return read_untrusted(self.base as usize, self.n, self.stride, self.layout, what);
        }
        // SAFETY: the exporter guarantees `n` elements at `base + i * stride` while the
        // view / capsule is held (it is: `self` holds it); GIL held, no Python code runs
        // while reading.
        unsafe { read_array::<T>(self.base, self.n, self.stride, self.layout, what) }
    }

    /// Whether the elements are already `T` in memory (native order, contiguous,
    /// aligned), so the core can read them in place.
    fn is_native<T: Elem>(&self) -> bool {
        let size = std::mem::size_of::<T>();
        let signed = T::from_i64(-1).is_some();
        self.n > 0
            && !self.untrusted
            && self.layout.size == size
            && self.layout.signed == signed
            && !self.layout.swap
            && self.stride == size as isize
            && (self.base as usize) % std::mem::align_of::<T>() == 0
    }
}

/// Exports an object's buffer; `Ok(None)` when it has no buffer protocol.
fn buffer_array<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Option<RawArray<'py>>> {
    let mut view = std::mem::MaybeUninit::<ffi::Py_buffer>::zeroed();
    // SAFETY: GIL held; `view` is written by a successful call.
    let rc =
        unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), view.as_mut_ptr(), ffi::PyBUF_RECORDS_RO) };
    if rc != 0 {
        let err = PyErr::fetch(obj.py());
        // numpy arrays of dtypes without a buffer format (datetime, ...) raise here.
        if obj.cast::<numpy::PyUntypedArray>().is_ok() {
            return Err(dtype_error(obj, what, "?"));
        }
        if err.is_instance_of::<PyTypeError>(obj.py()) {
            return Ok(None);
        }
        return Err(invalid_type(format!(
            "{what}: its buffer cannot be read ({})",
            err.value(obj.py())
        )));
    }
    // SAFETY: initialised by the successful call above.
    let view = BufferView(unsafe { view.assume_init() });
    let b = &view.0;
    let ndim = usize::try_from(b.ndim).unwrap_or(0);
    if ndim != 1 {
        let shape = if b.shape.is_null() {
            Vec::new()
        } else {
            // SAFETY: `shape` holds `ndim` entries when not NULL.
            (0..ndim)
                .map(|i| unsafe { *b.shape.add(i) } as i64)
                .collect()
        };
        return Err(not_1d(what, &shape));
    }
    let format: &[u8] = if b.format.is_null() {
        b"B"
    } else {
        // SAFETY: a NUL-terminated string owned by the view.
        unsafe { CStr::from_ptr(b.format) }.to_bytes()
    };
    let itemsize = usize::try_from(b.itemsize).unwrap_or(0);
    let Some(layout) = buffer_layout(format, itemsize) else {
        let f = String::from_utf8_lossy(format).into_owned();
        drop(view);
        if obj.hasattr("dtype").unwrap_or(false) {
            return Err(dtype_error(obj, what, &f));
        }
        let kind = match f.trim_start_matches(['@', '=', '<', '>', '!']) {
            "e" | "f" | "d" => "float",
            "?" => "bool",
            _ => "a non-integer",
        };
        return Err(invalid_type(format!(
            "{what}[0] must be an int, got {kind} ({what} is a buffer of format {f:?})"
        )));
    };
    // SAFETY: ndim == 1 and PyBUF_STRIDES requested: shape[0] and strides[0] exist.
    let (n, stride) = unsafe { (*b.shape, *b.strides) };
    let n = usize::try_from(n).unwrap_or(0);
    if !b.suboffsets.is_null() {
        return Err(invalid_type(format!(
            "{what}: indirect buffers are not supported"
        )));
    }
    let base = b.buf as *const u8;
    Ok(Some(RawArray {
        _hold: Hold::Buffer(view),
        base,
        n,
        stride,
        layout,
        untrusted: false,
    }))
}

/// A 1-D integer numpy array (exactly `numpy.ndarray`) read from its C struct: the same
/// fields its buffer export would give, without building the export (~0.1 us per call:
/// numpy formats the dtype as a string for every export). `None` for anything else
/// (other dtypes, shapes or types), which the buffer protocol then reads or refuses.
fn numpy_array<'py>(obj: &Bound<'py, PyAny>) -> Option<RawArray<'py>> {
    use numpy::{PyArrayDescrMethods, PyUntypedArrayMethods};
    if !obj
        .get_type()
        .is(obj.py().get_type::<numpy::PyUntypedArray>())
    {
        return None;
    }
    // SAFETY: exactly a numpy array (checked just above).
    let arr = unsafe { obj.cast_unchecked::<numpy::PyUntypedArray>() };
    if arr.ndim() != 1 {
        return None;
    }
    let dt = arr.dtype();
    let size = dt.itemsize();
    let signed = match dt.kind() {
        b'i' => true,
        b'u' => false,
        _ => return None,
    };
    if !matches!(size, 1 | 2 | 4 | 8) {
        return None;
    }
    let swap = !dt.is_native_byteorder().unwrap_or(true);
    let n = arr.shape()[0];
    let stride = arr.strides()[0];
    // SAFETY: a live numpy array; its data pointer stays valid (and the array's size
    // fixed) while it lives and no Python code runs (held by the result).
    let base = unsafe { (*numpy::npyffi::_PyArray_GET_ITEM_DATA(arr.as_array_ptr())).data };
    Some(RawArray {
        _hold: Hold::Object(obj.clone()),
        base: if n == 0 {
            std::ptr::null()
        } else {
            base as *const u8
        },
        n,
        stride,
        layout: Layout { signed, size, swap },
        untrusted: false,
    })
}

/// Reads an object with the buffer protocol; `Ok(None)` when it has none.
fn from_buffer<T: Elem>(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Option<Vec<T>>> {
    if let Some(a) = numpy_array(obj) {
        return a.read(what).map(Some);
    }
    refuse_masked(obj, what)?;
    match buffer_array(obj, what)? {
        Some(a) => a.read(what).map(Some),
        None => Ok(None),
    }
}

/// A numpy masked array with a masked entry is refused, as its list is (the masked
/// constant is not an int): its buffer holds whatever value lies under the mask. Checked
/// before the export (it runs Python code); only for numpy subclasses.
fn refuse_masked(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<()> {
    static MASKED: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let py = obj.py();
    if obj.get_type().is(py.get_type::<numpy::PyUntypedArray>())
        || !obj.is_instance_of::<numpy::PyUntypedArray>()
    {
        return Ok(());
    }
    let ty = MASKED.get_or_try_init(py, || -> PyResult<_> {
        Ok(py
            .import("numpy.ma")?
            .getattr("MaskedArray")?
            .cast_into::<PyType>()?
            .unbind())
    })?;
    if !obj.is_instance(ty.bind(py))? {
        return Ok(());
    }
    let mask = py
        .import("numpy.ma")?
        .call_method1("getmaskarray", (obj,))?;
    if mask.call_method0("any")?.is_truthy()? {
        let i: usize = mask.call_method0("argmax")?.extract()?;
        return Err(invalid_input(format!(
            "{what}[{i}] is masked (a masked array's hidden values are not read)"
        )));
    }
    Ok(())
}

/// An int from a dict entry of `__array_interface__`.
fn iface_int(v: &Bound<'_, PyAny>, what: &str) -> PyResult<i64> {
    v.extract::<i64>()
        .map_err(|_| invalid_type(format!("{what}: malformed __array_interface__")))
}

/// Reads an object exposing `__array_interface__`; `Ok(None)` when it has none.
fn from_array_interface<T: Elem>(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Option<Vec<T>>> {
    let Ok(iface) = obj.getattr("__array_interface__") else {
        return Ok(None);
    };
    let bad = || invalid_type(format!("{what}: malformed __array_interface__"));
    let d = iface.cast::<PyDict>().map_err(|_| bad())?;
    let get = |k: &str| d.get_item(k).ok().flatten();
    let shape: Vec<i64> = match get("shape") {
        Some(s) => s.extract().map_err(|_| bad())?,
        None => return Err(bad()),
    };
    if shape.len() != 1 {
        return Err(not_1d(what, &shape));
    }
    let typestr: String = get("typestr")
        .and_then(|t| t.extract().ok())
        .ok_or_else(bad)?;
    let ts = typestr.as_bytes();
    let layout = match ts {
        [order, kind @ (b'i' | b'u'), size @ ..] => {
            let size: usize = std::str::from_utf8(size)
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            let swap = (*order == b'>' && cfg!(target_endian = "little"))
                || (*order == b'<' && cfg!(target_endian = "big"));
            if !matches!(size, 1 | 2 | 4 | 8) {
                return Err(invalid_type(format!(
                    "{what} must hold integers, got an array of dtype {typestr}"
                )));
            }
            Layout {
                signed: *kind == b'i',
                size,
                swap,
            }
        }
        _ => {
            return Err(invalid_type(format!(
                "{what} must hold integers, got an array of dtype {typestr}"
            )))
        }
    };
    let n = usize::try_from(shape[0]).map_err(|_| bad())?;
    let stride = match get("strides").filter(|s| !s.is_none()) {
        Some(s) => {
            let s: Vec<i64> = s.extract().map_err(|_| bad())?;
            *s.first().ok_or_else(bad)? as isize
        }
        None => layout.size as isize,
    };
    let data = get("data").ok_or_else(bad)?;
    let Ok(data) = data.cast::<PyTuple>() else {
        return Err(invalid_type(format!(
            "{what}: __array_interface__ without a data pointer is not supported"
        )));
    };
    let ptr = iface_int(&data.get_item(0)?, what)?;
    // `offset` applies to a `data` buffer object only (which is not supported): with a
    // pointer, numpy ignores it, and so does this reader.
    if n == 0 {
        return Ok(Some(Vec::new()));
    }
    if ptr == 0 {
        return Err(bad());
    }
    let base = ptr as usize;
    // The dict is only the object's word: copied through the kernel, which refuses a
    // pointer, length or stride that leaves the memory this process can read.
    read_untrusted(base, n, stride, layout, what).map(Some)
}

/// Reads `n` elements at `base + i * stride` of memory a Python object only claims
/// holds them ([`crate::checked`]): copied through the kernel first, so a wrong
/// pointer, length or stride is refused with `InvalidInputError` instead of read.
fn read_untrusted<T: Elem>(
    base: usize,
    n: usize,
    stride: isize,
    layout: Layout,
    what: &str,
) -> PyResult<Vec<T>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let packed = crate::checked::gather(base, n, stride, layout.size).map_err(|e| match e {
        crate::checked::Fault::Unreadable => invalid_input(format!(
            "{what}: its __array_interface__ or DLPack tensor points at memory this \
             process cannot read ({n} elements of {} bytes at {base:#x}, stride {stride})",
            layout.size
        )),
        crate::checked::Fault::OutOfMemory => {
            PyMemoryError::new_err(format!("cannot allocate {n} elements"))
        }
    })?;
    // SAFETY: `packed` holds `n` contiguous elements of `layout.size` bytes, owned here.
    unsafe { read_array::<T>(packed.as_ptr(), n, layout.size as isize, layout, what) }
}

/// DLPack (dlpack.h v0.x, the `dltensor` capsule).
#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}
#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}
#[repr(C)]
struct DLTensor {
    data: *mut std::ffi::c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}
#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut std::ffi::c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

const DL_CPU: i32 = 1;
const DL_CUDA_HOST: i32 = 3;
const DL_INT: u8 = 0;
const DL_UINT: u8 = 1;

/// DLPack 1.x `DLPackDLTensorFromPyObjectNoSync`: fills a non-owning `DLTensor` view
/// of a tensor, valid until control returns to Python.
type DlTensorView = unsafe extern "C" fn(*mut std::ffi::c_void, *mut DLTensor) -> c_int;

/// DLPack 1.x `DLPackExchangeAPI` (dlpack.h), the table a tensor type publishes as
/// `__dlpack_c_exchange_api__` (a capsule named "dlpack_exchange_api").
#[repr(C)]
struct DlpackExchangeApi {
    major: u32,
    minor: u32,
    prev_api: *const std::ffi::c_void,
    managed_tensor_allocator: *const std::ffi::c_void,
    managed_tensor_from_py_object_no_sync: *const std::ffi::c_void,
    managed_tensor_to_py_object_no_sync: *const std::ffi::c_void,
    dltensor_from_py_object_no_sync: Option<DlTensorView>,
    current_work_stream: *const std::ffi::c_void,
}

/// What is known about torch, once a tensor was seen (torch is never imported by
/// prefixcache itself).
struct Torch {
    /// `torch.Tensor`, exactly (subclasses go through `__dlpack__`).
    tensor: Py<PyType>,
    /// `torch._C._to_dlpack`: the C function behind `Tensor.__dlpack__`, without its
    /// Python-level argument checks (~0.5 us instead of ~2.5 us per call).
    to_dlpack: Py<PyAny>,
    /// The DLPack exchange API's view function when torch has one (torch >= 2.10): no
    /// capsule, no allocation (tens of ns instead of ~0.5 us).
    view: Option<DlTensorView>,
    /// Keeps the exchange API's capsule alive (the table is static in torch anyway).
    _api: Option<Py<PyAny>>,
}

static TORCH: PyOnceLock<Torch> = PyOnceLock::new();

/// The exchange API's view function of a tensor type, if it publishes a DLPack 1.x one.
fn exchange_view(ty: &Bound<'_, PyType>) -> Option<(DlTensorView, Py<PyAny>)> {
    let cap = ty.getattr("__dlpack_c_exchange_api__").ok()?;
    let cap = cap.cast_into::<PyCapsule>().ok()?;
    // SAFETY: GIL held; returns NULL (error set) when the capsule has another name.
    let p = unsafe { ffi::PyCapsule_GetPointer(cap.as_ptr(), c"dlpack_exchange_api".as_ptr()) };
    if p.is_null() {
        let _ = PyErr::take(ty.py());
        return None;
    }
    // SAFETY: a "dlpack_exchange_api" capsule points at a static `DLPackExchangeAPI`
    // whose header (version) is stable across versions; the rest is read only for
    // major version 1, whose layout `DlpackExchangeApi` mirrors.
    let api = unsafe { &*(p as *const DlpackExchangeApi) };
    if api.major != 1 {
        return None;
    }
    Some((
        api.dltensor_from_py_object_no_sync?,
        cap.into_any().unbind(),
    ))
}

/// Whether `obj` is exactly a `torch.Tensor` and torch is known (so exporting it
/// imports nothing).
fn torch_tensor_known(obj: &Bound<'_, PyAny>) -> bool {
    let py = obj.py();
    TORCH
        .get(py)
        .is_some_and(|t| obj.get_type().is(t.tensor.bind(py)))
}

/// What is known about torch, when `obj` is exactly a `torch.Tensor` (looked up when
/// the first tensor is seen).
fn torch_of(obj: &Bound<'_, PyAny>) -> Option<&'static Torch> {
    let py = obj.py();
    let ty = obj.get_type();
    if let Some(t) = TORCH.get(py) {
        return ty.is(t.tensor.bind(py)).then_some(t);
    }
    let is_tensor =
        ty.name().is_ok_and(|n| n == "Tensor") && ty.module().is_ok_and(|m| m == "torch");
    if !is_tensor {
        return None;
    }
    let t = TORCH
        .get_or_try_init(py, || -> PyResult<_> {
            let f = py.import("torch")?.getattr("_C")?.getattr("_to_dlpack")?;
            let (view, api) = match exchange_view(&ty) {
                Some((v, a)) => (Some(v), Some(a)),
                None => (None, None),
            };
            Ok(Torch {
                tensor: ty.clone().unbind(),
                to_dlpack: f.unbind(),
                view,
                _api: api,
            })
        })
        .ok()?;
    ty.is(t.tensor.bind(py)).then_some(t)
}

/// Exports an object through DLPack (CPU memory only): a torch tensor through torch's
/// view function or `_to_dlpack` (`torch` given), anything else through `__dlpack__`;
/// `Ok(None)` when it has none.
fn dlpack_array<'py>(
    obj: &Bound<'py, PyAny>,
    torch: Option<&Torch>,
    what: &str,
) -> PyResult<Option<RawArray<'py>>> {
    if let Some(view) = torch.and_then(|t| t.view) {
        let mut t = std::mem::MaybeUninit::<DLTensor>::zeroed();
        // SAFETY: `obj` is a live tensor of the type the API was published by; the
        // function fills `t` (0) or sets a Python exception (-1). The view is valid
        // until control returns to Python: `RawArray` is only read before that (GIL
        // held, no Python code run), and holds `obj` meanwhile.
        if unsafe { view(obj.as_ptr().cast(), t.as_mut_ptr()) } == 0 {
            // SAFETY: filled by the successful call.
            let t = unsafe { t.assume_init() };
            return dltensor_array(obj, &t, Hold::Object(obj.clone()), what, false).map(Some);
        }
        // Not describable as a view (e.g. a lazy conjugate): the exporting call below
        // either copes or raises the error the caller sees.
        let _ = PyErr::take(obj.py());
    }
    let py = obj.py();
    let exported = match torch {
        Some(t) => t.to_dlpack.bind(py).call1((obj,)),
        None => match obj.getattr("__dlpack__") {
            // DLPack 1.x first (it can describe read-only memory); a producer that does
            // not take `max_version` raises TypeError and is asked the 0.x way.
            Ok(method) => {
                let kw = PyDict::new(py);
                kw.set_item("max_version", (1, 0))?;
                match method.call((), Some(&kw)) {
                    Err(e) if e.is_instance_of::<PyTypeError>(py) => method.call0(),
                    r => r,
                }
            }
            Err(_) => return Ok(None),
        },
    };
    let cap = exported.map_err(|e| {
        invalid_type(format!(
            "{what}: __dlpack__() failed ({}); only CPU tensors are accepted",
            e.value(py)
        ))
    })?;
    let cap = cap
        .cast_into::<PyCapsule>()
        .map_err(|_| invalid_type(format!("{what}: __dlpack__() did not return a capsule")))?;
    // A versioned capsule (DLPack 1.x) holds the tensor after a 32-byte header: version,
    // manager context, deleter, flags.
    let mut found = None;
    for (name, offset) in [(c"dltensor", 0usize), (c"dltensor_versioned", 32)] {
        // SAFETY: GIL held; returns NULL (error set) when the capsule has another name.
        let p = unsafe { ffi::PyCapsule_GetPointer(cap.as_ptr(), name.as_ptr()) };
        if p.is_null() {
            let _ = PyErr::take(py);
        } else {
            found = Some((p as usize, offset));
            break;
        }
    }
    let Some((p, offset)) = found else {
        return Err(invalid_type(format!(
            "{what}: __dlpack__() returned an unknown capsule"
        )));
    };
    if torch.is_some() {
        // SAFETY: torch's own "dltensor" capsule (offset 0) holds a DLManagedTensor,
        // valid while the capsule lives (the result holds it and does not consume it:
        // its destructor calls the producer's deleter).
        let t = unsafe { &(*(p as *const DLManagedTensor)).dl_tensor };
        return dltensor_array(obj, t, Hold::Capsule(cap), what, false).map(Some);
    }
    // Any other producer is a Python method that may hand over any capsule: its
    // structures are copied through the kernel ([`crate::checked`]) before they are read.
    let unreadable = || {
        invalid_input(format!(
            "{what}: __dlpack__() returned a capsule pointing at memory this process \
             cannot read"
        ))
    };
    // The header (versioned) and the tensor in one copy.
    let raw = crate::checked::bytes(p, offset + std::mem::size_of::<DLTensor>())
        .map_err(|_| unreadable())?;
    if offset != 0 {
        let major = u32::from_ne_bytes([raw[0], raw[1], raw[2], raw[3]]);
        if major != 1 {
            return Err(invalid_type(format!(
                "{what}: __dlpack__() returned a DLPack {major}.x tensor (1.x or 0.x \
                 are read)"
            )));
        }
    }
    // SAFETY: `raw[offset..]` holds the bytes of a `DLTensor` (plain integers and
    // pointers, any bit pattern is a value); read unaligned from the copy.
    let t = unsafe { std::ptr::read_unaligned(raw[offset..].as_ptr() as *const DLTensor) };
    dltensor_array(obj, &t, Hold::Capsule(cap), what, true).map(Some)
}

/// One entry of a DLPack shape or strides array (`untrusted`: copied through the kernel).
fn dl_entry(p: *const i64, i: usize, untrusted: bool) -> Option<i64> {
    if p.is_null() {
        return None;
    }
    let addr = (p as usize).checked_add(i.checked_mul(8)?)?;
    if untrusted {
        let b = crate::checked::bytes(addr, 8).ok()?;
        return Some(i64::from_ne_bytes(b.as_slice().try_into().ok()?));
    }
    // SAFETY: a trusted producer's (torch's) non-NULL shape and strides hold `ndim`
    // entries, and `i < ndim`.
    Some(unsafe { std::ptr::read_unaligned(addr as *const i64) })
}

/// A validated 1-D integer array in CPU memory from a DLPack tensor, kept alive by
/// `hold`. `untrusted`: a producer reached through a Python `__dlpack__` method, whose
/// shape, strides and data are only read through kernel-checked copies.
fn dltensor_array<'py>(
    obj: &Bound<'py, PyAny>,
    t: &DLTensor,
    hold: Hold<'py>,
    what: &str,
    untrusted: bool,
) -> PyResult<RawArray<'py>> {
    if t.device.device_type != DL_CPU && t.device.device_type != DL_CUDA_HOST {
        return Err(invalid_type(format!(
            "{what} must be in CPU memory, got a DLPack tensor on device type {}",
            t.device.device_type
        )));
    }
    let bad = |why: &str| invalid_input(format!("{what}: malformed DLPack tensor ({why})"));
    if t.ndim != 1 {
        // The shape only for the message, and only when it is short.
        let shape: Option<Vec<i64>> = (0..usize::try_from(t.ndim).unwrap_or(usize::MAX))
            .take_while(|&i| i < 32)
            .map(|i| dl_entry(t.shape, i, untrusted))
            .collect();
        return Err(match shape {
            Some(shape) if (0..=32).contains(&t.ndim) => not_1d(what, &shape),
            _ => invalid_input(format!(
                "{what} must be 1-dimensional, got a DLPack tensor of {} dimensions",
                t.ndim
            )),
        });
    }
    let dt = &t.dtype;
    let size = usize::from(dt.bits / 8);
    if !(matches!(dt.code, DL_INT | DL_UINT)
        && dt.lanes == 1
        && dt.bits % 8 == 0
        && matches!(size, 1 | 2 | 4 | 8))
    {
        return Err(dtype_error(
            obj,
            what,
            &format!("dlpack code {} bits {}", dt.code, dt.bits),
        ));
    }
    let layout = Layout {
        signed: dt.code == DL_INT,
        size,
        swap: false,
    };
    // The length and the stride (in elements), from one copy when untrusted.
    let (len, strides) = if untrusted && !t.shape.is_null() && !t.strides.is_null() {
        let b = crate::checked::segments(&[(t.shape as usize, 8), (t.strides as usize, 8)])
            .map_err(|_| bad("unreadable shape or strides"))?;
        let word = |k: usize| i64::from_ne_bytes(std::array::from_fn(|j| b[k * 8 + j]));
        (Some(word(0)), Some(word(1)))
    } else {
        (
            dl_entry(t.shape, 0, untrusted),
            dl_entry(t.strides, 0, untrusted),
        )
    };
    let len = len.ok_or_else(|| bad("unreadable shape"))?;
    let n = usize::try_from(len).map_err(|_| bad(&format!("shape ({len},)")))?;
    let stride = if t.strides.is_null() {
        size as isize
    } else {
        let s = strides.ok_or_else(|| bad("unreadable strides"))?;
        s.checked_mul(size as i64)
            .and_then(|b| isize::try_from(b).ok())
            .ok_or_else(|| bad(&format!("stride {s}")))?
    };
    if n == 0 {
        return Ok(RawArray {
            _hold: hold,
            base: std::ptr::null(),
            n: 0,
            stride,
            layout,
            untrusted,
        });
    }
    if t.data.is_null() {
        return Err(invalid_type(format!("{what}: DLPack tensor without data")));
    }
    // The producer says `n` elements at `base + i * stride` in host memory while `hold`
    // lives (checked when copied if `untrusted`).
    let base = (t.data as *const u8).wrapping_add(t.byte_offset as usize);
    Ok(RawArray {
        _hold: hold,
        base,
        n,
        stride,
        layout,
        untrusted,
    })
}

/// Reads an object exposing DLPack (CPU memory only); `Ok(None)` when it has none.
fn from_dlpack<T: Elem>(
    obj: &Bound<'_, PyAny>,
    torch: Option<&Torch>,
    what: &str,
) -> PyResult<Option<Vec<T>>> {
    match dlpack_array(obj, torch, what)? {
        Some(a) => a.read(what).map(Some),
        None => Ok(None),
    }
}

// ---------------------------------------------------------------------------------------
// Entry points

fn not_ints(obj: &Bound<'_, PyAny>, what: &str) -> PyErr {
    invalid_type(format!(
        "{what} must be a sequence of ints or an integer array, not {}",
        type_name(obj)
    ))
}

/// Iterable objects that are not sequences of integers: a str or bytes (its characters),
/// a set or a dict (no order). Refused wherever integers in order are read.
pub fn not_a_sequence_of_ints(obj: &Bound<'_, PyAny>) -> bool {
    obj.is_instance_of::<PyString>()
        || obj.is_instance_of::<PyBytes>()
        || obj.is_instance_of::<PyByteArray>()
        || obj.is_instance_of::<PySet>()
        || obj.is_instance_of::<PyFrozenSet>()
        || obj.is_instance_of::<PyDict>()
}

/// Any accepted object as a `Vec<T>` (see the module documentation for the forms).
fn read_ints<T: Elem>(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<T>> {
    if let Ok(l) = obj.cast::<PyList>() {
        return list_ints(l, what);
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        return tuple_ints(t, what);
    }
    if not_a_sequence_of_ints(obj) {
        return Err(not_ints(obj, what));
    }
    // Checked in this order so that the common forms never pay for a failed lookup (a
    // raised and discarded exception costs more than reading a prompt).
    if has_buffer(obj) {
        if let Some(v) = from_buffer(obj, what)? {
            return Ok(v);
        }
    }
    if let Some(torch) = torch_of(obj) {
        return from_dlpack(obj, Some(torch), what).map(Option::unwrap_or_default);
    }
    if let Some(v) = from_array_interface(obj, what)? {
        return Ok(v);
    }
    if let Some(v) = from_dlpack(obj, None, what)? {
        return Ok(v);
    }
    // SAFETY: GIL held.
    if unsafe { ffi::PySequence_Check(obj.as_ptr()) } == 1 {
        if let Ok(n) = obj.len() {
            // Room for the length it gives, up front (as `list()` takes it): a length no
            // memory can hold raises MemoryError at once instead of after filling memory.
            let mut out = Vec::new();
            out.try_reserve_exact(n).map_err(|_| {
                PyMemoryError::new_err(format!("cannot allocate {n} elements for {what}"))
            })?;
            items_slow(obj, 0, &mut out, what)?;
            return Ok(out);
        }
    }
    Err(not_ints(obj, what))
}

/// Whether reading `obj` as token ids or KV indices runs no Python code: a
/// `TokenBuffer`, or an object of exactly one of the types whose export is C code
/// (`numpy.ndarray`, `array.array`, `memoryview`, and `torch.Tensor` once torch's export
/// function was looked up). A subclass may override anything, so it does not count.
pub fn reads_without_python(obj: &Bound<'_, PyAny>) -> bool {
    static ARRAY: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let py = obj.py();
    let ty = obj.get_type();
    if obj.cast::<TokenBuffer>().is_ok()
        || ty.is(py.get_type::<numpy::PyUntypedArray>())
        || ty.is(py.get_type::<PyMemoryView>())
    {
        return true;
    }
    if let Ok(array) = ARRAY.get_or_try_init(py, || -> PyResult<_> {
        Ok(py
            .import("array")?
            .getattr("array")?
            .cast_into::<PyType>()?
            .unbind())
    }) {
        if ty.is(array.bind(py)) {
            return true;
        }
    }
    torch_tensor_known(obj)
}

/// Whether an integer argument is read without running Python code: absent, None or an
/// exact `int` (anything else may run `__index__`).
pub fn plain_int(obj: Option<&Bound<'_, PyAny>>) -> bool {
    obj.is_none_or(|o| o.is_none() || o.is_exact_instance_of::<PyInt>())
}

/// Token ids or KV indices for a call that keeps the GIL ([`Input`]). With `in_place`
/// (only when [`reads_without_python`] holds for every array argument of the call and
/// [`plain_int`] for its integer arguments, so that no Python code runs between this
/// export and the core's read), an array that already holds `T` is read in place;
/// anything else is copied, as [`tokens`] does.
pub fn input<'py, T: Elem>(
    obj: &Bound<'py, PyAny>,
    what: &str,
    in_place: bool,
) -> PyResult<Input<'py, T>> {
    if let Ok(b) = obj.cast::<TokenBuffer>() {
        let n = b.get().snapshot().len();
        return Ok(Input(match T::from_snapshot(b.get().snapshot()) {
            Ok(s) => InputRepr::Shared(s),
            Err(Some(v)) => InputRepr::Owned(v),
            Err(None) => {
                return Err(PyMemoryError::new_err(format!(
                    "cannot allocate {n} elements for {what}"
                )))
            }
        }));
    }
    if in_place {
        let a = if has_buffer(obj) {
            match numpy_array(obj) {
                Some(a) => Some(a),
                None => buffer_array(obj, what)?,
            }
        } else {
            match torch_of(obj) {
                Some(torch) => dlpack_array(obj, Some(torch), what)?,
                None => None,
            }
        };
        if let Some(a) = a {
            if a.is_native::<T>() {
                return Ok(Input(InputRepr::InPlace(a)));
            }
            return Ok(Input(InputRepr::Owned(a.read(what)?)));
        }
    }
    read_ints::<T>(obj, what).map(|v| Input(InputRepr::Owned(v)))
}

/// Token ids from any accepted object (`what` names the argument in messages).
pub fn tokens(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Tokens> {
    if let Ok(b) = obj.cast::<TokenBuffer>() {
        return Ok(Tokens(TokensRepr::Shared(b.get().snapshot())));
    }
    read_ints::<u32>(obj, what).map(|v| Tokens(TokensRepr::Owned(v)))
}

/// Token ids as an owned `Vec` (for building a `TokenBuffer`).
pub fn token_vec(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u32>> {
    if let Ok(b) = obj.cast::<TokenBuffer>() {
        let s = b.get().snapshot();
        let mut v = Vec::new();
        v.try_reserve_exact(s.len()).map_err(|_| {
            PyMemoryError::new_err(format!("cannot allocate {} elements for {what}", s.len()))
        })?;
        v.extend_from_slice(&s);
        return Ok(v);
    }
    read_ints::<u32>(obj, what)
}

/// An int64 numpy array that takes ownership of `v` (no copy).
pub fn i64_array(py: Python<'_>, v: Vec<i64>) -> Bound<'_, numpy::PyArray1<i64>> {
    numpy::PyArray1::from_vec(py, v)
}

// ---------------------------------------------------------------------------------------
// Integer arguments: one rule for every class
//
// An integer argument is a Python int or an object with `__index__` (numpy integer
// scalars), never a bool or a float (`InvalidTypeError`). Each argument has a range; a
// value outside it, however large, raises `InvalidInputError` naming the argument and the
// range. Nothing is clamped.

/// Human form of a range bound (`2**63`, `-2**63`, plain numbers otherwise).
fn bound_str(v: i128) -> String {
    for p in [31u32, 32, 63, 64] {
        let x = 1i128 << p;
        if v == x {
            return format!("2**{p}");
        }
        if v == -x {
            return format!("-2**{p}");
        }
    }
    v.to_string()
}

/// `[lo, hi]`, written half-open (`[0, 2**64)`) when `hi + 1` is a power of two.
fn range_str(lo: i128, hi: i128) -> String {
    let end = bound_str(hi + 1);
    if end.contains("**") {
        format!("[{}, {end})", bound_str(lo))
    } else {
        format!("[{}, {}]", bound_str(lo), bound_str(hi))
    }
}

/// An integer argument in `[lo, hi]` (inclusive). Messages: `{what} must be >= {lo}, got
/// {v}` below an argument's only bound, `{what} must be an int in [lo, hi], got {v}`
/// otherwise.
pub fn int_in(obj: &Bound<'_, PyAny>, what: &str, lo: i128, hi: i128) -> PyResult<i128> {
    let type_err = || invalid_type(format!("{what} must be an int, got {}", type_name(obj)));
    if obj.is_instance_of::<PyBool>() {
        return Err(type_err());
    }
    let range_err = |shown: String, below: bool| {
        if below && lo >= 0 && (hi == SIZE_MAX || hi == I64_MAX) {
            invalid_input(format!("{what} must be >= {}, got {shown}", bound_str(lo)))
        } else {
            invalid_input(format!(
                "{what} must be an int in {}, got {shown}",
                range_str(lo, hi)
            ))
        }
    };
    let v = match obj.extract::<i128>() {
        Ok(v) => v,
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => {
            let below = obj.lt(0).unwrap_or(false);
            return Err(range_err(display(obj), below));
        }
        Err(_) => return Err(type_err()),
    };
    if v < lo || v > hi {
        return Err(range_err(v.to_string(), v < lo));
    }
    Ok(v)
}

/// An integer argument in `[lo, hi]`, or `default` when None / absent.
pub fn int_or(
    obj: Option<&Bound<'_, PyAny>>,
    default: i128,
    what: &str,
    lo: i128,
    hi: i128,
) -> PyResult<i128> {
    match obj {
        Some(o) if !o.is_none() => int_in(o, what, lo, hi),
        _ => Ok(default),
    }
}

pub const I64_MIN: i128 = i64::MIN as i128;
pub const I64_MAX: i128 = i64::MAX as i128;
pub const U64_MAX: i128 = u64::MAX as i128;
pub const U32_MAX: i128 = u32::MAX as i128;
/// The largest count or size any call takes (what fits in `usize` and `i64` alike).
pub const SIZE_MAX: i128 = if (usize::MAX as u128) < (i64::MAX as u128) {
    usize::MAX as i128
} else {
    i64::MAX as i128
};

/// A signed 64-bit argument (e.g. a priority or a count that may be negative).
pub fn i64_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<i64> {
    int_in(obj, what, I64_MIN, I64_MAX).map(|v| v as i64)
}

/// A count, size or length: `[0, 2**63 - 1]`.
pub fn size_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<usize> {
    int_in(obj, what, 0, SIZE_MAX).map(|v| v as usize)
}

/// [`size_arg`] with a default for None / absent.
pub fn size_or(obj: Option<&Bound<'_, PyAny>>, default: usize, what: &str) -> PyResult<usize> {
    int_or(obj, default as i128, what, 0, SIZE_MAX).map(|v| v as usize)
}

/// A size that must be at least 1 (block size, page size).
pub fn positive_or(obj: Option<&Bound<'_, PyAny>>, default: usize, what: &str) -> PyResult<usize> {
    int_or(obj, default as i128, what, 1, SIZE_MAX).map(|v| v as usize)
}

/// A u32 argument (block id, KV-cache group id).
pub fn u32_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u32> {
    int_in(obj, what, 0, U32_MAX).map(|v| v as u32)
}

/// An optional int64 identifier (None, or any int64).
pub fn opt_i64(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<i64>> {
    match obj {
        Some(o) if !o.is_none() => i64_arg(o, what).map(Some),
        _ => Ok(None),
    }
}

/// An optional size (None, or an int in `[0, 2**63 - 1]`).
pub fn opt_size(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Option<usize>> {
    if obj.is_none() {
        return Ok(None);
    }
    size_arg(obj, what).map(Some)
}

/// The argument as given, for `#[pyo3(from_py_with = ...)]` on an optional argument that
/// is converted later in the method (in argument order): an explicit None reaches the
/// method as `Some(None)`, so that its conversion can refuse it, where a plain `Option`
/// parameter would take it for "not given".
pub fn given<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
    Ok(Some(obj.clone()))
}

/// Extractors for `#[pyo3(from_py_with = ...)]`, one per argument name (the name is what
/// messages show).
macro_rules! named {
    ($($name:ident: $t:ty = $conv:ident;)*) => {$(
        #[doc = concat!("The `", stringify!($name), "` argument.")]
        pub fn $name(obj: &Bound<'_, PyAny>) -> PyResult<$t> {
            $conv(obj, stringify!($name))
        }
    )*};
}

named! {
    num_blocks: usize = size_arg;
    num_new_tokens: usize = size_arg;
    num_new_computed_tokens: usize = size_arg;
    num_lookahead_tokens: usize = size_arg;
    num_cached_blocks: usize = size_arg;
    num_full_blocks: usize = size_arg;
    block_id: u32 = u32_arg;
    group_id: u32 = u32_arg;
    sliding_window: Option<usize> = opt_size;
    lora_id: Option<i64> = opt_i64_named;
    num_chunks: usize = size_arg;
    start: usize = size_arg;
    stop: usize = size_arg;
    num_steps: usize = positive_named;
    max_steps: usize = size_arg;
    tokens_per_key: usize = positive_named;
    max_tracker_size: usize = positive_named;
    store_threshold: u32 = positive_u32;
    enable_caching: bool = flag_arg;
    enable_kv_cache_events: bool = flag_arg;
    enable_events: bool = flag_arg;
    enable_partial_reuse: bool = flag_arg;
    copy_on_partial_reuse: bool = flag_arg;
    host_events: bool = flag_arg;
    overcommit: bool = flag_arg;
    include_unhealthy: bool = flag_arg;
    compact: bool = flag_arg;
    complete: bool = flag_arg;
    success: bool = flag_arg;
    nonzero: bool = flag_arg;
}

/// A bool argument (a Python `bool`, or a numpy bool scalar).
pub fn flag_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<bool> {
    obj.extract::<bool>()
        .map_err(|_| invalid_type(format!("{what} must be a bool, got {}", type_name(obj))))
}

fn positive_named(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<usize> {
    int_in(obj, what, 1, SIZE_MAX).map(|v| v as usize)
}

fn positive_u32(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u32> {
    int_in(obj, what, 1, U32_MAX).map(|v| v as u32)
}

/// The `cache_policy` argument of the CPU offload tier (a str; the core checks the name).
pub fn cache_policy(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    str_arg(obj, "cache_policy")
}

fn opt_i64_named(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Option<i64>> {
    opt_i64(Some(obj), what)
}

/// A request id, the same range for every class: an int in `[0, 2**64)`.
pub fn request_id(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    int_in(obj, "request_id", 0, U64_MAX).map(|v| v as u64)
}

/// A `KVCacheManager` argument; anything else raises `InvalidTypeError` naming its type.
pub fn kv_cache_manager<'py>(
    obj: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, crate::manager::PyKVCacheManager>> {
    obj.cast::<crate::manager::PyKVCacheManager>()
        .cloned()
        .map_err(|_| {
            // Another class of the same name (the plain-Python reference's) is named with
            // its module: "got KVCacheManager" would read as no reason at all.
            let mut name = type_name(obj);
            if name == "KVCacheManager" {
                if let Ok(q) = obj.get_type().fully_qualified_name() {
                    name = q.to_string();
                }
            }
            invalid_type(format!("manager must be a KVCacheManager, got {name}"))
        })
}

/// A 1-D numpy uint64 array (the lab's block keys), copied out in one stretch with the
/// GIL held and no Python code running while it is borrowed.
pub fn u64_array(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u64>> {
    exact_array(obj, what, "uint64")
}

/// A 1-D numpy `uint32` array, copied (`what` names the argument in messages).
pub fn u32_array(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u32>> {
    exact_array(obj, what, "uint32")
}

/// A 1-D numpy `uint64` array, borrowed read-only (no copy; `what` names the argument
/// in messages).
pub fn u64_array_view<'py>(
    obj: &Bound<'py, PyAny>,
    what: &str,
) -> PyResult<numpy::PyReadonlyArray1<'py, u64>> {
    obj.extract::<numpy::PyReadonlyArray1<'py, u64>>()
        .map_err(|_| {
            invalid_type(format!(
                "{what} must be a 1-D numpy uint64 array, got {}",
                type_name(obj)
            ))
        })
}

/// A 1-D numpy array of exactly `T` (`dtype` its name in messages), copied.
fn exact_array<T: numpy::Element + Copy>(
    obj: &Bound<'_, PyAny>,
    what: &str,
    dtype: &str,
) -> PyResult<Vec<T>> {
    let arr = obj
        .extract::<numpy::PyReadonlyArray1<'_, T>>()
        .map_err(|_| {
            invalid_type(format!(
                "{what} must be a 1-D numpy {dtype} array, got {}",
                type_name(obj)
            ))
        })?;
    let v = arr.as_slice().map(<[T]>::to_vec);
    drop(arr);
    v.map_err(|_| invalid_input(format!("{what} must be contiguous")))
}

/// A short sequence of u32 ids (e.g. KV-cache group ids), item by item.
pub fn u32_list(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u32>> {
    let v = read_ints::<i64>(obj, what)?;
    v.iter()
        .enumerate()
        .map(|(i, &x)| {
            u32::try_from(x).map_err(|_| {
                invalid_input(format!(
                    "{what}[{i}] = {x} is out of range: ids must be in [0, 2**32)"
                ))
            })
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Strings

/// An iterator over `obj`; an object that cannot be iterated raises `InvalidTypeError`
/// saying what `what` must be.
pub fn iter_of<'py>(
    obj: &Bound<'py, PyAny>,
    what: &str,
    must_be: &str,
) -> PyResult<Bound<'py, PyIterator>> {
    obj.try_iter()
        .map_err(|_| invalid_type(format!("{what} must be {must_be}, got {}", type_name(obj))))
}

/// The name of `obj`'s type, for messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_owned())
}

/// A str argument as UTF-8; a str with lone surrogates raises `InvalidInputError`.
pub fn str_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    str_ref(obj, what).map(|s| s.to_string())
}

/// [`str_arg`] read in place, not copied (a caller's str can be of any size).
pub fn str_ref(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<PyBackedStr> {
    let s = obj
        .cast::<PyString>()
        .map_err(|_| invalid_type(format!("{what} must be a str, got {}", type_name(obj))))?;
    PyBackedStr::try_from(s.clone()).map_err(|e| {
        if e.is_instance_of::<PyUnicodeEncodeError>(obj.py()) {
            invalid_input(format!(
                "{what} is not valid text: it holds lone surrogates (cannot be UTF-8 encoded)"
            ))
        } else {
            e // MemoryError, for the UTF-8 form Python keeps
        }
    })
}

/// An optional str argument (None or str).
pub fn opt_str(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<String>> {
    match obj {
        Some(o) if !o.is_none() => match o.cast::<PyString>() {
            Ok(_) => str_arg(o, what).map(Some),
            Err(_) => Err(invalid_type(format!(
                "{what} must be a str or None, got {}",
                type_name(o)
            ))),
        },
        _ => Ok(None),
    }
}

/// `extra_key` argument: str or None.
pub fn extra_key(obj: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    opt_str(Some(obj), "extra_key")
}

/// `cache_salt` argument: str or None.
pub fn cache_salt(obj: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    opt_str(Some(obj), "cache_salt")
}

/// `lora_name` argument: str or None.
pub fn lora_name(obj: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    opt_str(Some(obj), "lora_name")
}

/// `seed` argument: str or None.
pub fn seed(obj: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    opt_str(Some(obj), "seed")
}

/// `algo` / `hash_algo` argument: a str.
pub fn algo(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    str_arg(obj, "algo")
}

/// `event_hash_format` argument: a str.
pub fn event_hash_format(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    str_arg(obj, "event_hash_format")
}

/// `block_size` argument: an int >= 1.
pub fn block_size(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    int_in(obj, "block_size", 1, SIZE_MAX).map(|v| v as usize)
}

/// `eviction_policy` argument: a str.
pub fn eviction_policy(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    str_arg(obj, "eviction_policy")
}

/// `write_policy` argument: a str.
pub fn write_policy(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    str_arg(obj, "write_policy")
}

/// The NONE_HASH seed used when a call passes `seed=None`, the one rule for every class:
/// the `PYTHONHASHSEED` environment variable when set (read when the hasher is built, as
/// the reference twin reads `os.environ`), else `"vllm-none-hash"`.
pub fn default_seed() -> String {
    let env = std::env::var_os("PYTHONHASHSEED").map(|v| v.to_string_lossy().into_owned());
    prefixcache_core::hash::BlockHasher::default_seed(env.as_deref())
}

/// A `seed` argument, or [`default_seed`] for None.
pub fn seed_or_default(seed: Option<String>) -> String {
    seed.unwrap_or_else(default_seed)
}

// ---------------------------------------------------------------------------------------
// Block hashes as keys (the CPU offload tier)

/// A list or tuple of block hashes, each `bytes` of 1 to 32 bytes.
pub fn block_hash_list(
    obj: &Bound<'_, PyAny>,
    what: &str,
) -> PyResult<Vec<prefixcache_core::hash::BlockHash>> {
    let items: Vec<Bound<'_, PyAny>> = if let Ok(l) = obj.cast::<PyList>() {
        l.iter().collect()
    } else if let Ok(t) = obj.cast::<PyTuple>() {
        t.iter().collect()
    } else {
        return Err(invalid_type(format!(
            "{what} must be a list or tuple of bytes, got {}",
            type_name(obj)
        )));
    };
    let mut out = Vec::new();
    out.try_reserve_exact(items.len())
        .map_err(|e| PyMemoryError::new_err(format!("cannot allocate memory for {what}: {e}")))?;
    for (i, it) in items.iter().enumerate() {
        out.push(block_hash_at(it, what, Some(i))?);
    }
    Ok(out)
}

/// One block hash: `bytes` of 1 to 32 bytes.
pub fn block_hash_at(
    obj: &Bound<'_, PyAny>,
    what: &str,
    at: Option<usize>,
) -> PyResult<prefixcache_core::hash::BlockHash> {
    let name = || match at {
        Some(i) => format!("{what}[{i}]"),
        None => what.to_owned(),
    };
    let Ok(b) = obj.cast::<PyBytes>() else {
        return Err(invalid_type(format!(
            "{} must be bytes, got {}",
            name(),
            type_name(obj)
        )));
    };
    let raw = b.as_bytes();
    if raw.is_empty() {
        return Err(invalid_input(format!(
            "{} is empty: a block hash has 1 to 32 bytes",
            name()
        )));
    }
    prefixcache_core::hash::BlockHash::from_bytes(raw).ok_or_else(|| {
        invalid_input(format!(
            "{} has {} bytes: a block hash has 1 to 32 bytes",
            name(),
            raw.len()
        ))
    })
}

/// A sequence of ints in `[0, 2**63)` (token positions), any form.
pub fn position_list(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u64>> {
    let v = read_ints::<i64>(obj, what)?;
    v.iter()
        .enumerate()
        .map(|(i, &x)| {
            u64::try_from(x).map_err(|_| invalid_input(format!("{what}[{i}] = {x} must be >= 0")))
        })
        .collect()
}

/// A sequence of ints in `[0, 2**64)` (request ids, counts), any form.
pub fn u64_list(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u64>> {
    // Read as u64 (not i64): request ids go up to 2**64 - 1 in every class.
    read_ints::<u64>(obj, what)
}
