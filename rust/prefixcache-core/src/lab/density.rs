//! Hit density by age (after LHD, Beckmann, Chen and Cidon, NSDI'18): the lab's
//! [`super::Rule::Density`] learns, online, how likely a block of a given age and class is
//! to be hit again, per unit of cache space-time it will still occupy, and evicts the
//! block with the least. Age counts requests (acquire calls) since the block's last use;
//! the class is how often it was used (once, twice, more). Where reuse comes after a
//! think time (a chat's next turn), a block's hazard *rises* with age for a while, and
//! recency evicts exactly the blocks about to be reused; density ranks them by the
//! measured curve instead.

/// Age bins: four per octave, up to ages of about 2^16 requests.
pub const BINS: usize = 64;
/// Classes: used once, twice, three times or more.
pub const CLASSES: usize = 3;
/// Densities are recomputed (and the counts decayed) every this many requests.
pub const PERIOD: u64 = 128;
const DECAY: f64 = 0.9;

/// The bin of an age (monotone, about four bins per doubling).
pub fn age_bin(age: u64) -> usize {
    if age < 3 {
        return age as usize; // ages 0, 1, 2: bins of their own
    }
    let a = age.saturating_add(1);
    let l = 63 - a.leading_zeros() as usize; // floor(log2 a) >= 2
    let frac = ((a >> (l - 2)) & 3) as usize;
    (l * 4 + frac).min(BINS - 1)
}

fn bin_age(b: usize) -> f64 {
    // The smallest age of the bin (inverse of age_bin up to its rounding).
    if b < 8 {
        return b.min(3) as f64;
    }
    let l = b / 4;
    let frac = (b % 4) as f64;
    ((4.0 + frac) * (1u64 << l) as f64 / 4.0 - 1.0).max(0.0)
}

/// Learned hit densities and the event counts they come from.
#[derive(Debug, Clone)]
pub struct Density {
    hits: Vec<f64>,
    evictions: Vec<f64>,
    density: Vec<f64>,
    last_update: u64,
}

impl Default for Density {
    fn default() -> Self {
        Density {
            hits: vec![0.0; CLASSES * BINS],
            evictions: vec![0.0; CLASSES * BINS],
            density: vec![0.0; CLASSES * BINS],
            last_update: 0,
        }
    }
}

impl Density {
    pub fn class(uses: u32) -> usize {
        (uses.max(1) as usize - 1).min(CLASSES - 1)
    }

    pub fn hit(&mut self, class: usize, age: u64) {
        self.hits[class * BINS + age_bin(age)] += 1.0;
    }

    pub fn evicted(&mut self, class: usize, age: u64) {
        self.evictions[class * BINS + age_bin(age)] += 1.0;
    }

    pub fn get(&self, class: usize, age: u64) -> f64 {
        self.density[class * BINS + age_bin(age)]
    }

    /// Recompute the densities when a period has passed: for a block now in bin b, the
    /// hits still to come over the space-time it will still hold, from the counts of
    /// the blocks that reached bin b.
    pub fn maybe_update(&mut self, clock: u64) {
        if clock < self.last_update + PERIOD {
            return;
        }
        self.last_update = clock;
        for c in 0..CLASSES {
            let o = c * BINS;
            for b in 0..BINS {
                let base = bin_age(b);
                let mut num = 0.0;
                let mut den = 0.0;
                for x in b..BINS {
                    num += self.hits[o + x];
                    den += (self.hits[o + x] + self.evictions[o + x]) * (bin_age(x) - base + 1.0);
                }
                self.density[o + b] = if den > 0.0 { num / den } else { 0.0 };
            }
        }
        for v in self.hits.iter_mut().chain(self.evictions.iter_mut()) {
            *v *= DECAY;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_are_monotone() {
        let mut prev = 0;
        for a in 0..100_000u64 {
            let b = age_bin(a);
            assert!(b >= prev && b < BINS);
            assert!(bin_age(b) <= a as f64 + 1e-9, "age {a} bin {b}");
            prev = b;
        }
    }

    #[test]
    fn rising_hazard_ranks_old_blocks_higher() {
        let mut d = Density::default();
        // Blocks are hit at age ~300 or evicted at ~1000: a young block is worth less
        // than one about to reach its reuse age.
        for _ in 0..100 {
            d.hit(0, 300);
            d.evicted(0, 1000);
        }
        d.maybe_update(PERIOD);
        assert!(d.get(0, 200) > d.get(0, 0));
        assert!(d.get(0, 200) > d.get(0, 500));
    }
}
