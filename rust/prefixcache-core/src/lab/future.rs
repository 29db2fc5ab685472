//! The future a Belady cache reads: for every block key, the requests (by index in the
//! request sequence) in which that key is next *hittable* - inside the prefix the request may
//! reuse (the engines cap reuse at `len(prompt) - 1` tokens).

use hashbrown::hash_table::Entry;
use hashbrown::HashTable;

use crate::error::{try_copy, try_filled, Error, Result};

/// "Never used again".
pub const NEVER: u64 = u64::MAX;

/// The next hittable use of every block of every request, computed in one backward
/// pass over the sequence: `next[offsets[r] + i]` is the first request after `r` in which
/// request r's block i is hittable, unless a request before that one brings the block
/// outside its hittable prefix (inserting it again at no cost): then none.
#[derive(Debug, Default, Clone)]
pub struct NextUse {
    offsets: Vec<u64>,
    next: Vec<u32>,
}

const NEVER_U32: u32 = u32::MAX;

/// A position in the keys (u32 while they fit: a table slot costs 4 bytes then).
trait Pos: Copy + TryFrom<usize> + Into<u64> {}
impl Pos for u32 {}
impl Pos for u64 {}

/// The backward pass of [`NextUse::new`] (arguments checked). Each key's latest later
/// hittable use is held as the position of that use in `keys` (the key is read from
/// there, the request found from `offsets`), so the table costs a position per key.
fn next_uses<P: Pos>(keys: &[u64], offsets: &[u64], hittable: &[u32]) -> Result<Vec<u32>> {
    let hash = |k: u64| {
        // MurmurHash3's finaliser: caller-given keys need not be uniform.
        let h = (k ^ (k >> 33)).wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        let h = (h ^ (h >> 33)).wrapping_mul(0xC4CE_B9FE_1A85_EC53);
        h ^ (h >> 33)
    };
    let key_at = |p: P| keys[Into::<u64>::into(p) as usize];
    // The request holding position p: the last r with offsets[r] <= p (requests are
    // never empty there: p is one of their keys).
    let request_of = |p: P| {
        let p: u64 = p.into();
        (offsets.partition_point(|&o| o <= p) - 1) as u32
    };
    let mut next = try_filled(keys.len(), NEVER_U32, "the future")?;
    let mut later: HashTable<P> = HashTable::new();
    let oom = |e: hashbrown::TryReserveError| {
        Error::out_of_memory("the future's key table", format!("{e:?}"))
    };
    for r in (0..hittable.len()).rev() {
        let a = offsets[r] as usize;
        let b = offsets[r + 1] as usize;
        for (slot, &k) in next[a..b].iter_mut().zip(&keys[a..b]) {
            if let Some(&p) = later.find(hash(k), |&p| key_at(p) == k) {
                *slot = request_of(p);
            }
        }
        let h = hittable[r] as usize;
        let fresh = keys[a..a + h]
            .iter()
            .filter(|&&k| later.find(hash(k), |&p| key_at(p) == k).is_none())
            .count();
        later
            .try_reserve(fresh, |&p| hash(key_at(p)))
            .map_err(oom)?;
        for (i, &k) in keys.iter().enumerate().skip(a).take(h) {
            let Ok(p) = P::try_from(i) else {
                return Err(Error::InvalidArgument("too many keys".into()));
            };
            match later.entry(hash(k), |&q| key_at(q) == k, |&q| hash(key_at(q))) {
                Entry::Occupied(mut e) => *e.get_mut() = p,
                Entry::Vacant(e) => {
                    e.insert(p);
                }
            }
        }
        // A key the request brings past its hittable prefix (its last, unhittable block;
        // its output) is inserted again there at no cost: kept until then, its block
        // would gain nothing, so before this request its next hittable use is none (the
        // block brought here reads its own from this request).
        for &k in &keys[a + h..b] {
            if let Ok(e) = later.find_entry(hash(k), |&p| key_at(p) == k) {
                e.remove();
            }
        }
    }
    Ok(next)
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
        if n >= NEVER_U32 as usize {
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
        if offsets.first().is_some_and(|&o| o != 0) || offsets[n] != keys.len() as u64 {
            return Err(Error::InvalidArgument(
                "offsets must start at 0 and end at the number of keys".into(),
            ));
        }
        let next = if u32::try_from(keys.len()).is_ok() {
            next_uses::<u32>(keys, offsets, hittable)?
        } else {
            next_uses::<u64>(keys, offsets, hittable)?
        };
        Ok(NextUse {
            offsets: try_copy(offsets, "the future's offsets")?,
            next,
        })
    }

    /// The first request after `rid` in which block `pos` of request `rid` is hittable,
    /// or [`NEVER`] (also for a request or block the sequence does not have).
    pub fn at(&self, rid: u64, pos: usize) -> u64 {
        // Any rid and pos a caller passes: past the sequence (or past usize) is NEVER.
        let Some((&start, &end)) = usize::try_from(rid).ok().and_then(|r| {
            let end = self.offsets.get(r.checked_add(1)?)?;
            Some((self.offsets.get(r)?, end))
        }) else {
            return NEVER;
        };
        let Some(i) = usize::try_from(start)
            .ok()
            .and_then(|s| s.checked_add(pos))
            .filter(|&i| (i as u64) < end)
        else {
            return NEVER;
        };
        match self.next[i] {
            NEVER_U32 => NEVER,
            j => u64::from(j),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_hittable_use() {
        // r0: [1, 2] (2 hittable), r1: [1, 3] (1 hittable), r2: [1, 2] (2)
        let f = NextUse::new(&[1, 2, 1, 3, 1, 2], &[0, 2, 4, 6], &[2, 1, 2]).unwrap();
        assert_eq!(f.at(0, 0), 1);
        assert_eq!(f.at(0, 1), 2);
        assert_eq!(f.at(1, 1), NEVER); // key 3 is never hittable
        assert_eq!(f.at(2, 0), NEVER);
        assert_eq!(f.at(7, 0), NEVER);
        assert_eq!(f.at(u64::MAX, 0), NEVER);
        assert_eq!(f.at(0, usize::MAX), NEVER);
        assert_eq!(f.at(2, 2), NEVER);
        assert!(NextUse::new(&[1], &[0, 2], &[1]).is_err());
    }

    #[test]
    fn an_unhittable_use_ends_the_wait() {
        // r0: [1] (1 hittable), r1: [1] (0 hittable: brought again, at no cost), r2: [1] (1)
        let f = NextUse::new(&[1, 1, 1], &[0, 1, 2, 3], &[1, 0, 1]).unwrap();
        assert_eq!(f.at(0, 0), NEVER);
        assert_eq!(f.at(1, 0), 2);
    }
}
