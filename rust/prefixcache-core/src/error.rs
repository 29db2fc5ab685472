//! The one error type of the core. Every fallible public operation validates its input
//! before it changes any state, so an `Err` always leaves the structure unchanged.

use std::fmt;

/// What went wrong, by kind; the bindings map each kind to one Python exception class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// An argument has a bad value (negative count, wrong length, out-of-range id ...).
    InvalidArgument(String),
    /// A node handle refers to a node that was evicted (or belongs to another tree).
    StaleHandle(String),
    /// A lock would drop below zero, or the root was locked/unlocked.
    LockRef(String),
    /// A block operation that its state does not allow (double free, touching the null block ...).
    BlockState(String),
    /// A request id the manager does not know.
    UnknownRequest(String),
    /// More blocks were asked for than are free.
    OutOfBlocks { requested: usize, available: usize },
    /// A value the hash encoders cannot encode exactly as vLLM does.
    UnsupportedHashInput(String),
    /// A worker name the fleet index does not know.
    UnknownWorker(String),
    /// A KV event batch that cannot be decoded or applied (bad frame, msgpack, tag, field).
    InvalidEvent(String),
    /// Memory for a size the caller chose could not be reserved (nothing was changed).
    OutOfMemory(String),
}

impl Error {
    /// `OutOfMemory` for a failed reservation of `what`.
    pub fn out_of_memory(what: &str, err: impl fmt::Display) -> Self {
        Error::OutOfMemory(format!("cannot allocate memory for {what}: {err}"))
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// A new, empty vector with room for `n` items; `OutOfMemory` (naming `what`) when it
/// cannot be allocated.
pub fn try_vec<T>(n: usize, what: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|e| Error::out_of_memory(what, e))?;
    Ok(v)
}

/// A new vector of `n` copies of `v`; `OutOfMemory` (naming `what`) when it cannot be
/// allocated.
pub(crate) fn try_filled<T: Clone>(n: usize, v: T, what: &str) -> Result<Vec<T>> {
    let mut out = try_vec(n, what)?;
    out.resize(n, v);
    Ok(out)
}

/// `v` in a new box; `OutOfMemory` (naming `what`) when it cannot be allocated.
pub(crate) fn try_box<T>(v: T, what: &str) -> Result<Box<T>> {
    let layout = std::alloc::Layout::new::<T>();
    if layout.size() == 0 {
        return Ok(Box::new(v)); // allocates nothing
    }
    // SAFETY: the layout has a nonzero size, as `alloc` requires.
    let p = unsafe { std::alloc::alloc(layout) }.cast::<T>();
    if p.is_null() {
        return Err(Error::out_of_memory(what, "the allocator refused"));
    }
    // SAFETY: `p` is non-null, allocated by the global allocator with `T`'s layout (so
    // aligned and large enough), and written here before anything reads it; a `Box` may
    // own such a pointer (the `Box` documentation's memory layout section: a pointer from
    // the global allocator with the type's layout converts into a box), and it is not
    // used elsewhere.
    unsafe {
        p.write(v);
        Ok(Box::from_raw(p))
    }
}

/// A copy of `items` in a new vector; `OutOfMemory` (naming `what`) when it cannot be
/// allocated.
pub fn try_copy<T: Clone>(items: &[T], what: &str) -> Result<Vec<T>> {
    let mut v = try_vec(items.len(), what)?;
    v.extend_from_slice(items);
    Ok(v)
}

/// [`try_copy`] for a string.
pub fn try_copy_str(s: &str, what: &str) -> Result<String> {
    let mut c = String::new();
    c.try_reserve_exact(s.len())
        .map_err(|e| Error::out_of_memory(what, e))?;
    c.push_str(s);
    Ok(c)
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(m)
            | Error::StaleHandle(m)
            | Error::LockRef(m)
            | Error::BlockState(m)
            | Error::UnknownRequest(m)
            | Error::UnsupportedHashInput(m)
            | Error::UnknownWorker(m)
            | Error::InvalidEvent(m)
            | Error::OutOfMemory(m) => f.write_str(m),
            Error::OutOfBlocks {
                requested,
                available,
            } => write!(
                f,
                "cannot get {requested} blocks: only {available} free blocks are available"
            ),
        }
    }
}

impl std::error::Error for Error {}
