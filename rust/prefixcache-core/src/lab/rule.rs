//! What the lab cache evicts first ([`Rule`]) and what it keeps at all ([`Admission`]).

use crate::error::{Error, Result};

/// Eviction order over the evictable blocks (unreferenced, cached, childless). Every rule
/// breaks ties toward the deeper block, so a prefix loses its tail first.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    /// Least recently used first.
    Lru,
    /// Belady: the block whose next hittable use is farthest in the future first (needs
    /// the future, [`super::NextUse`]; a block brought again unhittable before then is
    /// not needed until then).
    Opt,
    /// Segmented LRU: blocks hit at least once move to a protected segment holding at
    /// most `protected` of the capacity (fraction); the probationary segment is evicted
    /// first, and the protected segment's least recent block is demoted when it is full.
    Slru { protected: f64 },
    /// Segmented LRU by request: every block of a request that hits at least
    /// `min_hit` of its hittable prefix (a continuing conversation) goes to the protected
    /// segment (`protected` of the capacity), including the blocks it brings; the blocks
    /// of requests that hit less (one-off prompts, first turns) age in the probationary
    /// segment, which is evicted first.
    Session { protected: f64, min_hit: f64 },
    /// 2Q (Johnson and Shasha): blocks brought for the first time enter a probationary
    /// window; a block brought again (hit, or re-fetched after eviction: every key ever
    /// seen is counted) moves to the main segment. The window's least recent block is
    /// evicted while the window holds more than `window` of the capacity, the main
    /// segment's least recent otherwise. The lab runs it with a 5% window.
    TwoQ { window: f64 },
    /// Least hit density first (LHD): the expected hits per unit of space-time still to
    /// be held, learned online per age (requests since the last use) and use count
    /// (`density.rs`); candidates are `samples` random evictable blocks.
    Density { samples: u32 },
    /// Fewest hits first, then least recent (hits per token: every block holds the same
    /// number of tokens; SGLang's size-aware proposal ranks nodes by hits / tokens).
    Lfu,
    /// GreedyDual-Size-Frequency: priority = L + (hits + 1) * cost / size, lowest first;
    /// L rises to each evicted block's priority (aging). cost = 1 + `depth_cost` x (block
    /// depth + 1/2): recomputing a deeper block costs more (attention over its prefix).
    Cost { depth_cost: f64 },
}

impl Rule {
    pub fn parse(name: &str, protected: f64, depth_cost: f64, min_hit: f64) -> Result<Rule> {
        if !(0.0..=1.0).contains(&min_hit) {
            return Err(Error::InvalidArgument(format!(
                "min_hit must be in [0, 1], got {min_hit}"
            )));
        }
        let r = match name {
            "session" => Rule::Session { protected, min_hit },
            "2q" => Rule::TwoQ { window: 0.05 },
            "density" => Rule::Density { samples: 64 },
            "lru" => Rule::Lru,
            "opt" => Rule::Opt,
            "slru" => Rule::Slru { protected },
            "lfu" => Rule::Lfu,
            "cost" => Rule::Cost { depth_cost },
            _ => return Err(Error::InvalidArgument(format!(
                "unknown lab eviction rule {name:?}; expected lru, opt, slru, session, 2q, density, lfu or cost"
            ))),
        };
        if !(0.0..=1.0).contains(&protected) {
            return Err(Error::InvalidArgument(format!(
                "protected must be in [0, 1], got {protected}"
            )));
        }
        if !(depth_cost >= 0.0 && depth_cost.is_finite()) {
            return Err(Error::InvalidArgument(format!(
                "depth_cost must be finite and >= 0, got {depth_cost}"
            )));
        }
        Ok(r)
    }
}

/// Which released blocks stay cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Every block (what the engines do).
    All,
    /// A block only once requests have brought it at least k times (k = 2: vLLM's CPU
    /// offloading filter). Counting is exact (one counter per key ever seen). With chained
    /// keys a key recurs exactly when the whole prefix up to it recurs, so k = 2 is also
    /// "only prefixes shared by at least two requests".
    Seen(u32),
}
