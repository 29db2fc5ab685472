//! A node split whose memory cannot be allocated is an `OutOfMemory` error, not an abort,
//! and leaves the tree's shape as it was. Its own test binary: the global allocator here
//! refuses mid-size buffers while armed, which would disturb other tests running in
//! parallel threads of the same binary.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, Ordering};

use prefixcache_core::radix::{EvictionPolicy, Namespace, RadixTree};
use prefixcache_core::Error;

static REFUSE: AtomicBool = AtomicBool::new(false);

/// The system allocator, refusing buffers of 1000 bytes or more while `REFUSE` is set
/// (a radix node of 1500 narrow tokens holds 12,000 bytes; its halves 5,600 and 6,400).
struct Refusing;

// SAFETY: every call is forwarded unchanged to `System`, or answered with null (the
// documented way to report a failed allocation), which callers must handle.
unsafe impl GlobalAlloc for Refusing {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if REFUSE.load(Ordering::Relaxed) && l.size() >= 1000 {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract for `l` is `System.alloc`'s.
        unsafe { System.alloc(l) }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from `System.alloc` with the layout `l` (nothing else allocates).
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static ALLOCATOR: Refusing = Refusing;

#[test]
fn a_split_without_memory_is_an_error_and_changes_no_shape() {
    let mut t = RadixTree::new(1, EvictionPolicy::Lru).unwrap();
    let ns = Namespace::new(None, None);
    let key: Vec<u32> = (0..1500).collect();
    t.insert(&key, None, &ns, 0, 0).unwrap();
    let before = (t.num_nodes(), t.total_size(), t.dump().len());

    REFUSE.store(true, Ordering::Relaxed);
    let matched = t.match_prefix(&key[..700], &ns).map(|m| m.length);
    let inserted = t.insert(&key[..700], None, &ns, 0, 0).map(|o| o.prefix_len);
    REFUSE.store(false, Ordering::Relaxed);

    assert!(
        matches!(matched, Err(Error::OutOfMemory(..))),
        "{matched:?}"
    );
    assert!(
        matches!(inserted, Err(Error::OutOfMemory(..))),
        "{inserted:?}"
    );
    assert_eq!((t.num_nodes(), t.total_size(), t.dump().len()), before);
    // With memory the same calls split the node.
    assert_eq!(t.match_prefix(&key[..700], &ns).unwrap().length, 700);
    assert_eq!(t.num_nodes(), before.0 + 1);
    assert_eq!(t.match_prefix(&key, &ns).unwrap().length, 1500);
}
