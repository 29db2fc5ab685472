//! `Shared<T>`: a core structure behind a mutex, shared by Python threads.
//!
//! Every binding class keeps its core structure in a `Shared` and reaches it only through
//! [`Shared::with`] (short operations, GIL held) or [`Shared::with_gil_released`] (long
//! operations, GIL released). Both hand the closure `&mut T` and drop the guard before they return, so
//! the lock is never held outside them. The rules that make this deadlock-free and sound
//! (docs/ARCHITECTURE.md, "Concurrency"):
//!
//! 1. No thread ever waits for the GIL while it holds the lock: the closures do core work
//!    only (no Python objects, no `PyErr`: they return the core `Result`, mapped to a
//!    Python exception by the caller after the lock is released).
//! 2. No thread waits for the lock while it holds the GIL: `with` takes the lock with
//!    `try_lock` and, when another thread has it, waits with the GIL released, so a long
//!    detached operation never stalls the other Python threads.
//! 3. A closure run detached only sees owned data (`Send`), never a borrowed numpy buffer
//!    that Python code could write to (or resize) once the GIL is released. A closure
//!    that reads a buffer in place runs through [`Shared::try_with`], which never
//!    releases the GIL (it gives up instead of waiting for the lock).
//! 4. A panic inside the closure poisons the lock (the guard drops while unwinding); the
//!    call raises `RuntimeError` and every later call on that object raises `RuntimeError`
//!    too, instead of working on a possibly half-updated structure.
//! 5. After `fork()`, a lock another thread held at that moment stays locked for good in
//!    the child (that thread does not exist there), and the structure may be half-updated.
//!    A `pthread_atfork` child handler bumps [`FORK_GENERATION`]; the first call on each
//!    object in a new child process checks its lock once (see [`Shared::check_fork`]):
//!    free, the object is usable; held, every call raises `RuntimeError` instead of
//!    waiting forever.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, Once, TryLockError};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// Why a call on a `Shared` could not run (built without the GIL, raised with it).
enum Failure {
    Poisoned,
    Panicked(String),
    /// Another thread was inside a call on the object when the process forked.
    ForkedInUse,
}

/// Number of `fork()`s this process descends from (0 in the original process); bumped in
/// the child by the handler [`install_fork_handler`] registers.
static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);

/// `Shared::generation` while one thread checks the lock after a fork.
const CHECKING: u64 = u64::MAX;

extern "C" fn bump_fork_generation() {
    // Async-signal-safe: one atomic add, no allocation, no lock.
    FORK_GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// Registers the fork handler (once per process; called by the module initialiser).
pub fn install_fork_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        #[cfg(unix)]
        // SAFETY: `pthread_atfork` only records the three function pointers; the child
        // handler is a plain `extern "C" fn()` that performs one atomic add, which is
        // async-signal-safe as POSIX requires of code run in a forked child.
        unsafe {
            libc::pthread_atfork(None, None, Some(bump_fork_generation));
        }
    });
}

pub struct Shared<T> {
    inner: Mutex<T>,
    /// The Python class name, for messages.
    name: &'static str,
    /// The fork generation in which this object's lock was last known usable
    /// ([`CHECKING`] while a thread checks it).
    generation: AtomicU64,
    /// Set when a fork found the lock held: the object is unusable in this process.
    forked_in_use: AtomicBool,
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_owned()
    }
}

/// Runs `f` on the locked value; a panic drops the guard while unwinding (poisoning the
/// lock) and comes back as `Failure::Panicked`.
fn run_locked<T, R>(guard: MutexGuard<'_, T>, f: impl FnOnce(&mut T) -> R) -> Result<R, Failure> {
    // AssertUnwindSafe: after a panic the value is never observed again, because the
    // guard is dropped during unwinding, the lock is poisoned, and every later access
    // goes through `try_lock`/`lock`, which report the poison as an error.
    catch_unwind(AssertUnwindSafe(move || {
        let mut guard = guard;
        f(&mut guard)
    }))
    .map_err(|p| Failure::Panicked(panic_message(p.as_ref())))
}

impl<T: Send> Shared<T> {
    pub fn new(name: &'static str, value: T) -> Self {
        Shared {
            inner: Mutex::new(value),
            name,
            generation: AtomicU64::new(FORK_GENERATION.load(Ordering::Acquire)),
            forked_in_use: AtomicBool::new(false),
        }
    }

    /// Whether the lock can be used in this process: after a fork, the first thread to call
    /// checks whether the lock is held. No thread of the child can hold it yet (every call
    /// passes here first, and the others wait until the check is done), so a held lock was
    /// held at the fork by a thread that does not exist here: it is never released.
    fn check_fork(&self) -> Result<(), Failure> {
        let now = FORK_GENERATION.load(Ordering::Acquire);
        loop {
            let seen = self.generation.load(Ordering::Acquire);
            if seen == now {
                break;
            }
            if seen == CHECKING {
                std::thread::yield_now();
                continue;
            }
            if self
                .generation
                .compare_exchange(seen, CHECKING, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                if matches!(self.inner.try_lock(), Err(TryLockError::WouldBlock)) {
                    self.forked_in_use.store(true, Ordering::Release);
                }
                self.generation.store(now, Ordering::Release);
                break;
            }
        }
        if self.forked_in_use.load(Ordering::Acquire) {
            return Err(Failure::ForkedInUse);
        }
        Ok(())
    }

    fn error(&self, f: Failure) -> PyErr {
        match f {
            Failure::Poisoned => PyRuntimeError::new_err(format!(
                "{} is unusable: an earlier call panicked inside it and its state may be \
                 inconsistent; create a new one",
                self.name
            )),
            Failure::Panicked(msg) => PyRuntimeError::new_err(format!(
                "internal error in {} (a bug in prefixcache, please report it): {msg}; \
                 this {} is unusable from now on",
                self.name, self.name
            )),
            Failure::ForkedInUse => PyRuntimeError::new_err(format!(
                "{} is unusable in this process: another thread was inside a call on it when \
                 the process forked, so its state here is unknown; create a new one in the \
                 child (or fork before starting threads, or use the 'spawn' start method)",
                self.name
            )),
        }
    }

    /// Short operation: runs `f` with the GIL held. When another thread holds the lock,
    /// waits for it with the GIL released, then retries: Python code may run before `f`
    /// does, so `f` must not read inputs borrowed from Python objects (see
    /// [`Shared::try_with`]).
    pub fn with<R>(&self, py: Python<'_>, f: impl FnOnce(&mut T) -> R) -> PyResult<R> {
        self.check_fork().map_err(|e| self.error(e))?;
        loop {
            match self.inner.try_lock() {
                Ok(guard) => return run_locked(guard, f).map_err(|e| self.error(e)),
                Err(TryLockError::Poisoned(_)) => return Err(self.error(Failure::Poisoned)),
                Err(TryLockError::WouldBlock) => {
                    // Block until the holder is done, without the GIL; the guard is
                    // dropped at once (a poisoned lock is reported by the next try_lock).
                    py.detach(|| drop(self.inner.lock()));
                }
            }
        }
    }

    /// Short operation on inputs read in place from Python objects
    /// ([`convert::Input`](crate::convert::Input)): runs `f` with the GIL held throughout,
    /// taking the lock without waiting, so no Python code runs between the caller's export
    /// of its inputs and `f`'s read. `Ok(None)`, `f` not run, when another thread holds
    /// the lock: the caller then copies its inputs and waits with [`Shared::with`].
    pub fn try_with<R>(&self, py: Python<'_>, f: impl FnOnce(&mut T) -> R) -> PyResult<Option<R>> {
        let _ = py; // proof that the GIL is held
        self.check_fork().map_err(|e| self.error(e))?;
        match self.inner.try_lock() {
            Ok(guard) => run_locked(guard, f).map(Some).map_err(|e| self.error(e)),
            Err(TryLockError::Poisoned(_)) => Err(self.error(Failure::Poisoned)),
            Err(TryLockError::WouldBlock) => Ok(None),
        }
    }

    /// Long operation: releases the GIL, takes the lock and runs `f`. `f` must own its
    /// inputs (`Send`): copy borrowed numpy buffers first.
    pub fn with_gil_released<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut T) -> R + Send,
    ) -> PyResult<R> {
        self.check_fork().map_err(|e| self.error(e))?;
        py.detach(|| match self.inner.lock() {
            Ok(guard) => run_locked(guard, f),
            Err(_) => Err(Failure::Poisoned),
        })
        .map_err(|e| self.error(e))
    }

    /// [`Shared::with_gil_released`] when `release_gil`, else [`Shared::with`].
    pub fn with_gil_released_if<R: Send>(
        &self,
        py: Python<'_>,
        release_gil: bool,
        f: impl FnOnce(&mut T) -> R + Send,
    ) -> PyResult<R> {
        if release_gil {
            self.with_gil_released(py, f)
        } else {
            self.with(py, f)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(py: Python<'_>, e: &PyErr) -> String {
        assert!(e.is_instance_of::<PyRuntimeError>(py));
        e.value(py).to_string()
    }

    #[test]
    fn try_with_gives_up_instead_of_waiting_for_the_lock() {
        Python::initialize();
        Python::attach(|py| {
            let s = Shared::new("Thing", 1u32);
            assert_eq!(s.try_with(py, |v| *v).ok().flatten(), Some(1));
            let held = s.inner.lock();
            assert!(matches!(s.try_with(py, |v| *v), Ok(None)));
            drop(held);
            assert_eq!(s.try_with(py, |v| *v + 1).ok().flatten(), Some(2));
        });
    }

    #[test]
    fn a_panic_raises_and_poisons_for_later_calls() {
        Python::initialize();
        Python::attach(|py| {
            for detach in [false, true] {
                let s = Shared::new("Thing", vec![1u32]);
                assert_eq!(
                    s.with_gil_released_if(py, detach, |v| v.len()).ok(),
                    Some(1)
                );
                let err = s
                    .with_gil_released_if(py, detach, |v: &mut Vec<u32>| -> usize {
                        v.push(2);
                        panic!("boom")
                    })
                    .err();
                let err = err.map(|e| message(py, &e)).unwrap_or_default();
                assert!(err.contains("internal error in Thing") && err.contains("boom"));
                for again in [false, true] {
                    let e = s.with_gil_released_if(py, again, |v| v.len()).err();
                    let e = e.map(|e| message(py, &e)).unwrap_or_default();
                    assert!(e.contains("Thing is unusable"), "{e}");
                }
            }
        });
    }
}
