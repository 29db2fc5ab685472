//! What it costs just to read a caller's tokens from memory, on the radix benchmark's
//! shape (2000 prompts of 2304 tokens, each read once, cold: 36 MB of int64 and 184 MB of
//! list data, beyond the last-level cache), with no cache work at all:
//! `cargo run --release -p prefixcache-core --example input_floor`.
//!
//! - int64: each prompt's int64 tokens narrowed to u32 with the range check (what any
//!   exact reader of an int64 input must do once: every token is checked);
//! - list: a CPython list's layout (an array of pointers to 32-byte int objects, made in
//!   order, as `tolist()` makes them), each object's type, size and digit read, with the
//!   objects fetched 64 items ahead;
//! - uint32: the same tokens as u32, summed (the cold read of the uint32 path).
//!
//! docs/BENCHMARKS.md ("Cold input: what reading a prompt costs") sets these beside the radix
//! figures. Each figure is the best of several passes; a 256 MB write before each pass
//! evicts the inputs from the caches.

use std::hint::black_box;
use std::time::Instant;

const PROMPTS: usize = 2000;
const TOKENS: usize = 2304;
const PASSES: usize = 5;

/// A CPython int's first 32 bytes: reference count, type, digit count, first digit.
#[repr(C)]
struct IntObject {
    refcnt: i64,
    ty: usize,
    size: i64,
    digit: u32,
    _pad: u32,
}

const INT_TYPE: usize = 0x1234;

fn evict_caches() {
    let junk = vec![1u8; 256 << 20];
    black_box(&junk);
}

fn best_us(mut pass: impl FnMut() -> u64) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..PASSES {
        evict_caches();
        let t = Instant::now();
        black_box(pass());
        best = best.min(t.elapsed().as_secs_f64() * 1e6 / PROMPTS as f64);
    }
    best
}

fn token(i: usize, j: usize) -> u32 {
    if j < 2048 {
        (i % 8) as u32 * 100_000 + (j as u32 * 7) % 32_000
    } else {
        1_000_000 + (i * 256 + j - 2048) as u32
    }
}

fn main() {
    let wide: Vec<Vec<i64>> = (0..PROMPTS)
        .map(|i| (0..TOKENS).map(|j| i64::from(token(i, j))).collect())
        .collect();
    let narrow: Vec<Vec<u32>> = (0..PROMPTS)
        .map(|i| (0..TOKENS).map(|j| token(i, j)).collect())
        .collect();
    let objects: Vec<Vec<IntObject>> = (0..PROMPTS)
        .map(|i| {
            (0..TOKENS)
                .map(|j| IntObject {
                    refcnt: 1,
                    ty: INT_TYPE,
                    size: 1,
                    digit: token(i, j),
                    _pad: 0,
                })
                .collect()
        })
        .collect();
    let lists: Vec<Vec<*const IntObject>> = objects
        .iter()
        .map(|o| o.iter().map(|x| x as *const IntObject).collect())
        .collect();
    let mut out = vec![0u32; TOKENS];

    let int64 = best_us(|| {
        let mut bad = 0u64;
        for p in &wide {
            for (d, &v) in out.iter_mut().zip(p) {
                bad |= (v as u64) >> 32;
                *d = v as u32;
            }
            black_box(&out);
        }
        bad
    });
    let uint32 = best_us(|| {
        let mut sum = 0u64;
        for p in &narrow {
            sum += p.iter().map(|&t| u64::from(t)).sum::<u64>();
        }
        sum
    });
    let list = best_us(|| {
        let mut bad = 0u64;
        for l in &lists {
            for (j, d) in out.iter_mut().enumerate() {
                if let Some(&ahead) = l.get(j + 64) {
                    prefetch(ahead);
                }
                // SAFETY: every pointer of `lists` points into `objects`, which outlives
                // this loop and is not written while it runs.
                let o = unsafe { &*l[j] };
                bad |= u64::from(o.ty != INT_TYPE) | u64::from(o.size != 1);
                *d = o.digit;
            }
            black_box(&out);
        }
        bad
    });
    let per_token = |us: f64| us * 1000.0 / TOKENS as f64;
    println!("reading one cold prompt of {TOKENS} tokens, best of {PASSES} passes:");
    println!(
        "  int64 narrowed   {int64:6.2} us  ({:.2} ns/token)",
        per_token(int64)
    );
    println!(
        "  uint32 read      {uint32:6.2} us  ({:.2} ns/token)",
        per_token(uint32)
    );
    println!(
        "  list of ints     {list:6.2} us  ({:.2} ns/token; {:.2} over uint32)",
        per_token(list),
        per_token(list - uint32)
    );
}

#[inline(always)]
fn prefetch(p: *const IntObject) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint: it never faults and reads nothing into the program,
    // whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p.cast::<i8>(), std::arch::x86_64::_MM_HINT_T0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
