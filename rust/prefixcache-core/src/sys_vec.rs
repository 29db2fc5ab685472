//! A growable array of `Copy` values whose buffer comes from the system allocator
//! (`std::alloc::System`), whatever the program's global allocator is.
//!
//! The block pool's per-block arrays grow with what is cached, to hundreds of MB, a
//! quarter at a time. glibc serves such sizes with `mmap` and grows them with `mremap`:
//! the pages move, nothing is copied and no old buffer stays behind. A general-purpose
//! allocator (the Python extension's mimalloc) copies into a fresh buffer and keeps the
//! old one's pages for reuse for a while, so each growth briefly holds the array twice
//! and a run of growths holds several old copies at once: that, not the arrays
//! themselves, set the peak memory of a large replay (docs/ARCHITECTURE.md, "Memory").
//! On other systems the system allocator's `realloc` may copy; nothing else changes.

use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// A failed reservation (the size overflowed or the system allocator refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocError;

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("memory allocation failed")
    }
}

/// `Vec<T>` for `Copy` values, on the system allocator (see the module's doc). Only
/// what the pool needs: reserve, push, resize, and the slice of its elements.
pub(crate) struct SysVec<T: Copy> {
    /// The buffer: dangling while `cap == 0`, else from `System` with the layout of
    /// `cap` elements.
    ptr: NonNull<T>,
    /// Elements `..len` are initialised; `len <= cap`.
    len: usize,
    cap: usize,
}

// SAFETY: a SysVec owns its buffer exclusively (like `Vec<T>`): sending it sends the
// values, sharing it shares `&[T]`.
unsafe impl<T: Copy + Send> Send for SysVec<T> {}
// SAFETY: as above; `&SysVec` only gives out `&[T]`.
unsafe impl<T: Copy + Sync> Sync for SysVec<T> {}

impl<T: Copy> SysVec<T> {
    /// No zero-sized elements: the layouts below assume a nonzero size.
    const SIZED: () = assert!(std::mem::size_of::<T>() > 0);

    pub const fn new() -> Self {
        let () = Self::SIZED;
        SysVec {
            ptr: NonNull::dangling(),
            len: 0,
            cap: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Room for at least `additional` more elements, allocating exactly that much more
    /// when there is not. On error nothing changes.
    pub fn try_reserve_exact(&mut self, additional: usize) -> Result<(), AllocError> {
        let need = self.len.checked_add(additional).ok_or(AllocError)?;
        if need <= self.cap {
            return Ok(());
        }
        self.grow_to(need)
    }

    fn grow_to(&mut self, cap: usize) -> Result<(), AllocError> {
        let new = Layout::array::<T>(cap).map_err(|_| AllocError)?;
        let p = if self.cap == 0 {
            // SAFETY: `new` has a nonzero size (cap > self.cap >= 0 elements of a
            // nonzero size).
            unsafe { System.alloc(new) }
        } else {
            let old = Layout::array::<T>(self.cap).map_err(|_| AllocError)?;
            // SAFETY: `ptr` came from `System` with layout `old` (the buffer's current
            // layout, see the field); `new.size()` is nonzero and, being a valid
            // `Layout` of the same alignment, does not overflow `isize` when rounded up.
            unsafe { System.realloc(self.ptr.as_ptr().cast::<u8>(), old, new.size()) }
        };
        // A null pointer is a refusal; the old buffer (if any) is then untouched.
        self.ptr = NonNull::new(p.cast::<T>()).ok_or(AllocError)?;
        self.cap = cap;
        Ok(())
    }

    /// Grows for one more element: doubling, as `Vec` does.
    #[cold]
    fn grow_for_push(&mut self) {
        let cap = self.cap.saturating_mul(2).max(4);
        if self.grow_to(cap).is_err() && self.grow_to(self.len + 1).is_err() {
            // As `Vec::push` does; callers reserve first, so this is not reached.
            std::alloc::handle_alloc_error(Layout::new::<T>());
        }
    }

    /// Appends `value` (within a reservation: callers reserve first, as the pool does).
    #[inline]
    pub fn push(&mut self, value: T) {
        if self.len == self.cap {
            self.grow_for_push();
        }
        // SAFETY: len < cap now: the slot is inside the buffer and not initialised yet.
        unsafe { self.ptr.as_ptr().add(self.len).write(value) };
        self.len += 1;
    }

    /// Sets the length to `n`, new elements being `value` (within a reservation, as
    /// [`push`](Self::push)).
    pub fn resize(&mut self, n: usize, value: T) {
        if n <= self.len {
            self.len = n;
            return;
        }
        if n > self.cap && self.grow_to(n).is_err() {
            std::alloc::handle_alloc_error(Layout::new::<T>());
        }
        for i in self.len..n {
            // SAFETY: i < n <= cap: inside the buffer.
            unsafe { self.ptr.as_ptr().add(i).write(value) };
        }
        self.len = n;
    }
}

impl<T: Copy> Default for SysVec<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Copy> Drop for SysVec<T> {
    fn drop(&mut self) {
        if self.cap == 0 {
            return;
        }
        if let Ok(layout) = Layout::array::<T>(self.cap) {
            // SAFETY: `ptr` came from `System` with this layout (see the field); the
            // values are `Copy`, so nothing is dropped with them.
            unsafe { System.dealloc(self.ptr.as_ptr().cast::<u8>(), layout) };
        }
    }
}

impl<T: Copy> Deref for SysVec<T> {
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` is aligned and non-null (dangling when empty, which a slice of
        // length 0 allows), and `..len` is initialised and owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Copy> DerefMut for SysVec<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; `&mut self` makes the borrow exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Copy> Clone for SysVec<T> {
    /// Like `Vec::clone`, this aborts if the copy cannot be allocated.
    fn clone(&self) -> Self {
        let mut v = Self::new();
        if v.try_reserve_exact(self.len).is_err() {
            std::alloc::handle_alloc_error(Layout::new::<T>());
        }
        for &x in self.iter() {
            v.push(x);
        }
        v
    }
}

impl<T: Copy + fmt::Debug> fmt::Debug for SysVec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaves_as_a_vec() {
        let mut v: SysVec<[u32; 2]> = SysVec::new();
        let mut w: Vec<[u32; 2]> = Vec::new();
        assert!(v.is_empty());
        for i in 0..10_000u32 {
            if i % 7 == 0 {
                v.try_reserve_exact(i as usize % 100).unwrap();
                assert!(v.capacity() >= v.len() + i as usize % 100);
            }
            v.push([i, !i]);
            w.push([i, !i]);
            if i % 1000 == 999 {
                let n = v.len() + 37;
                v.resize(n, [1, 2]);
                w.resize(n, [1, 2]);
                v.resize(n - 5, [0, 0]);
                w.truncate(n - 5);
            }
            assert_eq!(v.len(), w.len());
        }
        assert_eq!(&v[..], &w[..]);
        v[3] = [9, 9];
        w[3] = [9, 9];
        let c = v.clone();
        assert_eq!(&c[..], &w[..]);
        assert_eq!(format!("{:?}", &c[..2]), format!("{:?}", &w[..2]));
    }

    #[test]
    fn an_impossible_reservation_fails_and_changes_nothing() {
        let mut v: SysVec<u64> = SysVec::new();
        v.push(1);
        let cap = v.capacity();
        assert_eq!(v.try_reserve_exact(usize::MAX), Err(AllocError));
        assert_eq!(v.try_reserve_exact(usize::MAX / 4), Err(AllocError));
        assert_eq!((v.len(), v.capacity(), v[0]), (1, cap, 1));
    }
}
