//! Eviction policies: which evictable leaf goes first (SEMANTICS.md 1.6).

use std::str::FromStr;

use crate::Error;

/// A node's place in the eviction order: compared lexicographically, smallest first.
pub(crate) type PolicyKey = [i64; 3];

/// SGLang's eviction strategies. The leaf with the smallest key is evicted first.
///
/// Ties: one call stamps every node it touches with one clock value, so the tail of a
/// node split by an insert and the new leaf beside it can share a timestamp. SGLang reads
/// its clock again when it creates the leaf, so the leaf counts as later: the key ends
/// with the node's creation serial, negated for the policies that reverse time (mru, filo).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictionPolicy {
    /// Least recently used: `last_access_time`.
    Lru,
    /// Least frequently used: `(hit_count, last_access_time)`.
    Lfu,
    /// First in, first out: `creation_time`.
    Fifo,
    /// Most recently used: `-last_access_time`.
    Mru,
    /// First in, last out: `-creation_time`.
    Filo,
    /// Lowest priority first, then LRU: `(priority, last_access_time)`.
    Priority,
    /// Segmented LRU: probationary (hit_count < 2) before protected, LRU within.
    Slru,
}

impl EvictionPolicy {
    pub const ALL: [EvictionPolicy; 7] = [
        EvictionPolicy::Lru,
        EvictionPolicy::Lfu,
        EvictionPolicy::Fifo,
        EvictionPolicy::Mru,
        EvictionPolicy::Filo,
        EvictionPolicy::Priority,
        EvictionPolicy::Slru,
    ];

    pub fn name(self) -> &'static str {
        match self {
            EvictionPolicy::Lru => "lru",
            EvictionPolicy::Lfu => "lfu",
            EvictionPolicy::Fifo => "fifo",
            EvictionPolicy::Mru => "mru",
            EvictionPolicy::Filo => "filo",
            EvictionPolicy::Priority => "priority",
            EvictionPolicy::Slru => "slru",
        }
    }

    /// The ordering key of a node under this policy (smaller is evicted first).
    #[inline]
    pub(crate) fn key(
        self,
        last_access: u64,
        creation: u64,
        hit_count: u64,
        priority: i64,
        serial: u64,
    ) -> PolicyKey {
        // Logical times, hit counts and serials stay far below 2^63 (one tick per call).
        let la = last_access as i64;
        let cr = creation as i64;
        let s = serial as i64;
        match self {
            EvictionPolicy::Lru => [la, 0, s],
            EvictionPolicy::Lfu => [hit_count as i64, la, s],
            EvictionPolicy::Fifo => [cr, 0, s],
            EvictionPolicy::Mru => [-la, 0, -s],
            EvictionPolicy::Filo => [-cr, 0, -s],
            EvictionPolicy::Priority => [priority, la, s],
            EvictionPolicy::Slru => [i64::from(hit_count >= 2), la, s],
        }
    }
}

impl FromStr for EvictionPolicy {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let lower = s.to_ascii_lowercase();
        EvictionPolicy::ALL
            .into_iter()
            .find(|p| p.name() == lower)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "unknown eviction policy {s:?}: expected one of lru, lfu, fifo, mru, filo, priority, slru"
                ))
            })
    }
}
