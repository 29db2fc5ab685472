//! What the lab cache evicts first ([`Rule`]) and what it keeps at all ([`Admission`]).

use crate::error::{Error, Result};

/// Eviction order over the evictable blocks (unreferenced, cached, childless). Every rule
/// breaks ties toward the deeper block, so a prefix loses its tail first.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    /// Least recently used first.
    Lru,
    /// Belady: the block whose next hittable use is farthest in the future first (needs
    /// the future, [`super::NextUse`]).
    Opt,
    /// Segmented LRU: blocks hit at least once move to a protected segment holding at
    /// most `protected` of the capacity (fraction); the probationary segment is evicted
    /// first, and the protected segment's least recent block is demoted when it is full.
    Slru { protected: f64 },
    /// Fewest hits first, then least recent (hits per token: every block holds the same
    /// number of tokens; SGLang's size-aware proposal ranks nodes by hits / tokens).
    Lfu,
    /// GreedyDual-Size-Frequency: priority = L + (hits + 1) * cost / size, lowest first;
    /// L rises to each evicted block's priority (aging). cost = 1 + `depth_cost` x (block
    /// depth + 1/2): recomputing a deeper block costs more (attention over its prefix).
    Cost { depth_cost: f64 },
}

impl Rule {
    pub fn parse(name: &str, protected: f64, depth_cost: f64) -> Result<Rule> {
        let r = match name {
            "lru" => Rule::Lru,
            "opt" => Rule::Opt,
            "slru" => Rule::Slru { protected },
            "lfu" => Rule::Lfu,
            "cost" => Rule::Cost { depth_cost },
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "unknown lab eviction rule {name:?}; expected lru, opt, slru, lfu or cost"
                )))
            }
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
