//! `Shared<T>`: a core structure behind a mutex, shared by Python threads.
//!
//! Every binding class keeps its core structure in a `Shared` and reaches it only through
//! [`Shared::with`] (short operations, GIL held) or [`Shared::detached`] (long operations,
//! GIL released). Both hand the closure `&mut T` and drop the guard before they return, so
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
//!    that Python code could write to (or resize) once the GIL is released.
//! 4. A panic inside the closure poisons the lock (the guard drops while unwinding); the
//!    call raises `RuntimeError` and every later call on that object raises `RuntimeError`
//!    too, instead of working on a possibly half-updated structure.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, MutexGuard, TryLockError};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// Why a call on a `Shared` could not run (built without the GIL, raised with it).
enum Failure {
    Poisoned,
    Panicked(String),
}

pub struct Shared<T> {
    inner: Mutex<T>,
    /// The Python class name, for messages.
    name: &'static str,
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
        }
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
        }
    }

    /// Short operation: runs `f` with the GIL held. When another thread holds the lock,
    /// waits for it with the GIL released, then retries. `f` may read borrowed (numpy)
    /// inputs: it runs in one stretch with the GIL held, so no Python code runs meanwhile.
    pub fn with<R>(&self, py: Python<'_>, f: impl FnOnce(&mut T) -> R) -> PyResult<R> {
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

    /// Long operation: releases the GIL, takes the lock and runs `f`. `f` must own its
    /// inputs (`Send`): copy borrowed numpy buffers first.
    pub fn detached<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut T) -> R + Send,
    ) -> PyResult<R> {
        py.detach(|| match self.inner.lock() {
            Ok(guard) => run_locked(guard, f),
            Err(_) => Err(Failure::Poisoned),
        })
        .map_err(|e| self.error(e))
    }

    /// [`Shared::detached`] when `detach`, else [`Shared::with`].
    pub fn run<R: Send>(
        &self,
        py: Python<'_>,
        detach: bool,
        f: impl FnOnce(&mut T) -> R + Send,
    ) -> PyResult<R> {
        if detach {
            self.detached(py, f)
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
    fn a_panic_raises_and_poisons_for_later_calls() {
        Python::initialize();
        Python::attach(|py| {
            for detach in [false, true] {
                let s = Shared::new("Thing", vec![1u32]);
                assert_eq!(s.run(py, detach, |v| v.len()).ok(), Some(1));
                let err = s
                    .run(py, detach, |v: &mut Vec<u32>| -> usize {
                        v.push(2);
                        panic!("boom")
                    })
                    .err();
                let err = err.map(|e| message(py, &e)).unwrap_or_default();
                assert!(err.contains("internal error in Thing") && err.contains("boom"));
                for again in [false, true] {
                    let e = s.run(py, again, |v| v.len()).err();
                    let e = e.map(|e| message(py, &e)).unwrap_or_default();
                    assert!(e.contains("Thing is unusable"), "{e}");
                }
            }
        });
    }
}
