//! A global allocator for the allocation-failure tests: the system allocator, counting
//! the allocations of the thread that arms it and refusing one. A test binary that
//! includes this module (`mod refusing_allocator;`) allocates through it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    /// Allocations (and reallocations) this thread may still make before one fails: the
    /// one made when it is 0 fails, and the counter disarms (later ones, such as the error
    /// message's, succeed). `usize::MAX`: not armed.
    static LEFT: Cell<usize> = const { Cell::new(usize::MAX) };
    /// Whether an allocation was refused since the thread armed the counter.
    static REFUSED: Cell<bool> = const { Cell::new(false) };
}

/// One allocation more; false when it must fail.
fn allowed() -> bool {
    LEFT.with(|left| match left.get() {
        usize::MAX => true,
        0 => {
            left.set(usize::MAX);
            REFUSED.with(|r| r.set(true));
            false
        }
        n => {
            left.set(n - 1);
            true
        }
    })
}

/// Arms the counter: the `k`-th allocation from now on (0: the next) fails.
pub fn arm(k: usize) {
    REFUSED.with(|r| r.set(false));
    LEFT.with(|left| left.set(k));
}

/// Disarms; true when an allocation was refused.
pub fn disarm() -> bool {
    LEFT.with(|left| left.set(usize::MAX));
    REFUSED.with(|r| r.get())
}

struct Counting;

// SAFETY: every call is forwarded unchanged to `System`, or answered with null (the
// documented way to report a failed allocation, shrinking reallocations included), which
// callers must handle. The thread-locals are const-initialised `Cell`s without
// destructors: reading them never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if !allowed() {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract for `l` is `System.alloc`'s.
        unsafe { System.alloc(l) }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from `System` with the layout `l` (nothing else allocates).
        unsafe { System.dealloc(p, l) }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        if !allowed() {
            return std::ptr::null_mut();
        }
        // SAFETY: `p` came from `System` with the layout `l`; the caller's contract for
        // `new_size` is `System.realloc`'s.
        unsafe { System.realloc(p, l, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f` with the counter paused (its allocations are neither counted nor refused).
#[allow(dead_code)] // Not every test binary that includes this module pauses.
pub fn paused<R>(f: impl FnOnce() -> R) -> R {
    let left = LEFT.with(|l| l.replace(usize::MAX));
    let r = f();
    LEFT.with(|l| l.set(left));
    r
}
