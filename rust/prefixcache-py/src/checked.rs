//! Reads of memory that a Python object only *claims* holds an array: the data pointer
//! of an `__array_interface__` dict (any Python code can write one) or of a DLPack
//! capsule returned by a Python-level `__dlpack__`. Such a pointer, length or stride may
//! be wrong; reading it directly would crash the process on an unmapped address. These
//! copies go through the kernel instead (`process_vm_readv` on the process itself, a
//! pipe elsewhere), which reports an address the process cannot read as an error rather
//! than a fault: the caller refuses the argument. A wrong pointer into readable memory
//! can still only give integers, which are range-checked like any others.

use std::mem::MaybeUninit;

/// Why a checked copy failed.
#[derive(Debug)]
pub enum Fault {
    /// Some byte of the range is not readable by the process (or the range overflows).
    Unreadable,
    /// The copy buffer could not be allocated.
    OutOfMemory,
}

/// The byte range `[lo, hi)` spanned by `n >= 1` elements of `size` bytes at
/// `base + i * stride`; `None` when it leaves the address space.
pub fn span(base: usize, n: usize, stride: isize, size: usize) -> Option<(usize, usize)> {
    let last = i128::try_from(n.checked_sub(1)?).ok()? * stride as i128;
    let a = base as i128;
    let b = a.checked_add(last)?;
    let (lo, hi) = (a.min(b), a.max(b).checked_add(size as i128)?);
    if lo < 0 || hi > usize::MAX as i128 {
        return None;
    }
    Some((lo as usize, hi as usize))
}

/// Copies `n` elements of `size` bytes at `base + i * stride` into a packed buffer of
/// `n * size` bytes, or fails without reading anything the process cannot read.
pub fn gather(base: usize, n: usize, stride: isize, size: usize) -> Result<Vec<u8>, Fault> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let (lo, hi) = span(base, n, stride, size).ok_or(Fault::Unreadable)?;
    let total = n.checked_mul(size).ok_or(Fault::OutOfMemory)?;
    let mut out: Vec<u8> = Vec::new();
    out.try_reserve_exact(total)
        .map_err(|_| Fault::OutOfMemory)?;
    // Written by the kernel, not zeroed first: a lying length costs no memory beyond
    // what was copied before the copy failed.
    let dst = &mut out.spare_capacity_mut()[..total];
    // Segments: one per element, merged when contiguous.
    let seg = |i: usize| {
        (
            base.wrapping_add((i as isize).wrapping_mul(stride) as usize),
            size,
        )
    };
    if stride == size as isize {
        copy(&[(base, total)], dst)?;
    } else if hi - lo <= total.saturating_mul(8).saturating_add(1 << 16) {
        // A strided array over a span not much larger than its elements: the span in one
        // copy (the kernel's cost is per segment), then the elements picked from it.
        let whole = gather(lo, 1, (hi - lo) as isize, hi - lo)?;
        for (i, d) in dst.chunks_exact_mut(size).enumerate() {
            let at = seg(i).0 - lo;
            for (d, &b) in d.iter_mut().zip(&whole[at..at + size]) {
                d.write(b);
            }
        }
    } else {
        // Bounded batches of segments (the kernel takes up to 1024 per call).
        const BATCH: usize = 1024;
        let mut segs = Vec::with_capacity(BATCH.min(n));
        let mut i = 0;
        while i < n {
            let end = (i + BATCH).min(n);
            segs.clear();
            segs.extend((i..end).map(seg));
            copy(&segs, &mut dst[i * size..end * size])?;
            i = end;
        }
    }
    // SAFETY: all `total` bytes were written by the complete copy above.
    unsafe { out.set_len(total) };
    Ok(out)
}

/// Copies a few small segments `(address, length)`, packed in order, in one call.
pub fn segments(segs: &[(usize, usize)]) -> Result<Vec<u8>, Fault> {
    let mut total = 0usize;
    for &(addr, len) in segs {
        addr.checked_add(len).ok_or(Fault::Unreadable)?;
        total = total.checked_add(len).ok_or(Fault::OutOfMemory)?;
    }
    let mut out: Vec<u8> = Vec::new();
    out.try_reserve_exact(total)
        .map_err(|_| Fault::OutOfMemory)?;
    copy(segs, &mut out.spare_capacity_mut()[..total])?;
    // SAFETY: all `total` bytes were written by the complete copy above.
    unsafe { out.set_len(total) };
    Ok(out)
}

/// Copies `len` bytes at `addr` (a small struct or a few integers).
pub fn bytes(addr: usize, len: usize) -> Result<Vec<u8>, Fault> {
    gather(addr, 1, len as isize, len)
}

/// Copies the segments `(address, length)` in order into `dst` (their total length).
fn copy(segs: &[(usize, usize)], dst: &mut [MaybeUninit<u8>]) -> Result<(), Fault> {
    #[cfg(target_os = "linux")]
    match vm_read(segs, dst) {
        Ok(()) => return Ok(()),
        Err(e) if e != libc::ENOSYS && e != libc::EPERM => return Err(Fault::Unreadable),
        Err(_) => {} // not allowed here (seccomp): the pipe below
    }
    #[cfg(unix)]
    {
        pipe_read(segs, dst)
    }
    #[cfg(not(unix))]
    {
        // No kernel-checked copy on this platform: the exporter's word is taken.
        let mut at = 0;
        for &(addr, len) in segs {
            // SAFETY: trusted as the exporter's contract (see above).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    addr as *const u8,
                    dst[at..at + len].as_mut_ptr().cast(),
                    len,
                )
            };
            at += len;
        }
        Ok(())
    }
}

/// `process_vm_readv` on this process: `Err(errno)` (`EFAULT` for an unreadable byte;
/// a short copy counts as `EFAULT`).
#[cfg(target_os = "linux")]
fn vm_read(segs: &[(usize, usize)], dst: &mut [MaybeUninit<u8>]) -> Result<(), i32> {
    // Large contiguous ranges go in pieces (the kernel caps one call's transfer).
    const PIECE: usize = 1 << 24;
    let mut at = 0usize;
    let mut remote: Vec<libc::iovec> = Vec::with_capacity(segs.len());
    let mut pieces = segs.iter().flat_map(|&(addr, len)| {
        (0..len.div_ceil(PIECE).max(1)).map(move |k| {
            let off = k * PIECE;
            (addr.wrapping_add(off), (len - off).min(PIECE))
        })
    });
    loop {
        remote.clear();
        let mut want = 0usize;
        for (addr, len) in pieces.by_ref() {
            remote.push(libc::iovec {
                iov_base: addr as *mut libc::c_void,
                iov_len: len,
            });
            want += len;
            if remote.len() == 1024 || want >= PIECE {
                break;
            }
        }
        if remote.is_empty() {
            return Ok(());
        }
        let local = libc::iovec {
            iov_base: dst[at..].as_mut_ptr().cast(),
            iov_len: want,
        };
        // SAFETY: `local` is `want` writable bytes of `dst` (the segments' total length
        // is `dst.len()`); the remote addresses are only read by the kernel, which
        // checks them and fails with EFAULT instead of faulting.
        let got = unsafe {
            libc::process_vm_readv(
                libc::getpid(),
                &local,
                1,
                remote.as_ptr(),
                remote.len() as libc::c_ulong,
                0,
            )
        };
        if got < 0 {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EFAULT));
        }
        if got as usize != want {
            return Err(libc::EFAULT);
        }
        at += want;
    }
}

/// The same copy through a pipe: `write` fails with `EFAULT` on a buffer the process
/// cannot read. Chunks of at most 4096 bytes, each read back before the next (an empty
/// pipe always takes that much without blocking).
#[cfg(unix)]
fn pipe_read(segs: &[(usize, usize)], dst: &mut [MaybeUninit<u8>]) -> Result<(), Fault> {
    struct Pipe([libc::c_int; 2]);
    impl Drop for Pipe {
        fn drop(&mut self) {
            // SAFETY: both descriptors were opened by `pipe` below and are closed once.
            unsafe {
                libc::close(self.0[0]);
                libc::close(self.0[1]);
            }
        }
    }
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(Fault::Unreadable);
    }
    let p = Pipe(fds);
    let mut at = 0usize;
    for &(addr, len) in segs {
        let mut off = 0usize;
        while off < len {
            let k = (len - off).min(4096);
            let src = addr.wrapping_add(off);
            // SAFETY: the kernel reads `k` bytes at `src`, failing with EFAULT when it
            // cannot; nothing is read by this process.
            let w = unsafe { libc::write(p.0[1], src as *const libc::c_void, k) };
            if w != k as isize {
                return Err(Fault::Unreadable);
            }
            let mut got = 0usize;
            while got < k {
                // SAFETY: room for `k - got` bytes at `dst[at + got..]`.
                let r = unsafe { libc::read(p.0[0], dst[at + got..].as_mut_ptr().cast(), k - got) };
                if r <= 0 {
                    return Err(Fault::Unreadable);
                }
                got += r as usize;
            }
            at += k;
            off += k;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_readable_memory_and_refuses_the_rest() {
        let v: Vec<u64> = (0..5000).collect();
        let base = v.as_ptr() as usize;
        let got = gather(base, 5000, 8, 8).ok().unwrap_or_default();
        assert_eq!(got.len(), 40000);
        assert_eq!(&got[8..16], &1u64.to_ne_bytes());
        let odd = gather(base + 8 * 4999, 2500, -16, 8)
            .ok()
            .unwrap_or_default();
        assert_eq!(&odd[8..16], &4997u64.to_ne_bytes());
        assert!(matches!(gather(8, 4, 8, 8), Err(Fault::Unreadable)));
        assert!(matches!(
            gather(base, 4, 1 << 40, 8),
            Err(Fault::Unreadable)
        ));
        assert!(matches!(
            gather(usize::MAX - 4, 1, 8, 8),
            Err(Fault::Unreadable)
        ));
        #[cfg(unix)]
        {
            let mut out = [MaybeUninit::new(0u8); 16];
            assert!(pipe_read(&[(base, 16)], &mut out).is_ok());
            // SAFETY: initialised above.
            let b: Vec<u8> = out.iter().map(|x| unsafe { x.assume_init() }).collect();
            assert_eq!(&b[8..16], &1u64.to_ne_bytes());
            assert!(pipe_read(&[(8, 16)], &mut out).is_err());
        }
    }
}
