//! The future a Belady cache reads: for every block key, the requests (by index in the
//! request sequence) in which that key is *hittable* - inside the prefix the request may
//! reuse (the engines cap reuse at `len(prompt) - 1` tokens).

use rustc_hash::FxHashMap;

use crate::error::{Error, Result};

/// "Never used again".
pub const NEVER: u64 = u64::MAX;

/// Hittable uses per key, as one sorted index array (CSR): `uses[start[k]..start[k]+len]`.
#[derive(Debug, Default, Clone)]
pub struct NextUse {
    ranges: FxHashMap<u64, (u32, u32)>,
    uses: Vec<u32>,
}

impl NextUse {
    /// `keys` holds every request's block keys back to back, request r's from
    /// `offsets[r]` to `offsets[r + 1]`; its first `hittable[r]` keys are hittable.
    pub fn new(keys: &[u64], offsets: &[u64], hittable: &[u32]) -> Result<Self> {
        let n = hittable.len();
        if offsets.len() != n + 1 {
            return Err(Error::InvalidArgument(format!(
                "offsets must have one entry more than hittable ({} + 1), got {}",
                n,
                offsets.len()
            )));
        }
        if n > u32::MAX as usize {
            return Err(Error::InvalidArgument("too many requests".into()));
        }
        for r in 0..n {
            let (a, b) = (offsets[r], offsets[r + 1]);
            if a > b || b > keys.len() as u64 || u64::from(hittable[r]) > b - a {
                return Err(Error::InvalidArgument(format!(
                    "request {r}: offsets {a}..{b} / hittable {} do not fit {} keys",
                    hittable[r],
                    keys.len()
                )));
            }
        }
        // Pairs (key, request) of hittable uses, grouped by key in request order.
        let total: usize = hittable.iter().map(|&h| h as usize).sum();
        let mut pairs: Vec<(u64, u32)> = Vec::with_capacity(total);
        for r in 0..n {
            let a = offsets[r] as usize;
            let h = hittable[r] as usize;
            pairs.extend(keys[a..a + h].iter().map(|&k| (k, r as u32)));
        }
        pairs.sort_unstable();
        let mut ranges: FxHashMap<u64, (u32, u32)> = FxHashMap::default();
        ranges.reserve(pairs.len() / 2);
        let mut uses = Vec::with_capacity(pairs.len());
        let mut i = 0;
        while i < pairs.len() {
            let k = pairs[i].0;
            let start = uses.len() as u32;
            while i < pairs.len() && pairs[i].0 == k {
                if uses.len() as u32 == start || *uses.last().unwrap_or(&u32::MAX) != pairs[i].1 {
                    uses.push(pairs[i].1);
                }
                i += 1;
            }
            ranges.insert(k, (start, uses.len() as u32 - start));
        }
        Ok(NextUse { ranges, uses })
    }

    /// The first request after `now` in which `key` is hittable, or [`NEVER`].
    pub fn after(&self, key: u64, now: u64) -> u64 {
        match self.ranges.get(&key) {
            None => NEVER,
            Some(&(s, l)) => {
                let u = &self.uses[s as usize..(s + l) as usize];
                let i = u.partition_point(|&r| u64::from(r) <= now);
                u.get(i).map_or(NEVER, |&r| u64::from(r))
            }
        }
    }

    /// How many keys have at least one hittable use.
    pub fn keys(&self) -> usize {
        self.ranges.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_hittable_use() {
        // r0: [1, 2] (2 hittable), r1: [1, 3] (1 hittable), r2: [1, 2] (2)
        let f = NextUse::new(&[1, 2, 1, 3, 1, 2], &[0, 2, 4, 6], &[2, 1, 2]).unwrap();
        assert_eq!(f.after(1, 0), 1);
        assert_eq!(f.after(2, 0), 2);
        assert_eq!(f.after(3, 0), NEVER); // never hittable
        assert_eq!(f.after(1, 2), NEVER);
        assert!(NextUse::new(&[1], &[0, 2], &[1]).is_err());
    }
}
