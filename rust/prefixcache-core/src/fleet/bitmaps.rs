//! The longest-prefix walk over holder bitmaps read from Redis (`SETBIT` layout: worker
//! slot `s` is bit `7 - s % 8` of byte `s / 8`), the same walk `KvIndex::longest_prefix`
//! does over its own bitsets. Used by the Redis backend's queries.

use super::holders::for_each_bit;

/// One bitmap as words with slot `s` at bit `s % 64` of word `s / 64`.
fn words(bitmap: Option<&[u8]>, nwords: usize) -> Vec<u64> {
    let mut out = vec![0u64; nwords];
    if let Some(b) = bitmap {
        for (k, &byte) in b.iter().enumerate().take(nwords * 8) {
            out[k / 8] |= u64::from(byte.reverse_bits()) << ((k % 8) * 8);
        }
    }
    out
}

/// Per-worker answers of a walk (in the order of `slots`).
#[derive(Debug, Clone, PartialEq)]
pub struct WalkResult {
    pub blocks: Vec<u32>,
    /// `worker * num_media + medium`.
    pub per_medium: Vec<u32>,
    pub score: Vec<f64>,
}

/// `rows[m * n + i]`: the bitmap of block `i` on medium `m` (`None` when no worker holds
/// it). `slots`: the workers' slots. `weights`: per medium (`None`: score = blocks).
pub fn walk(
    rows: &[Option<&[u8]>],
    num_media: usize,
    n: usize,
    slots: &[u32],
    weights: Option<&[f64]>,
) -> WalkResult {
    let nslots = slots.iter().map(|&s| s as usize + 1).max().unwrap_or(0);
    let nw = nslots.div_ceil(64);
    let mut live = vec![0u64; nw];
    for &s in slots {
        live[s as usize / 64] |= 1 << (s % 64);
    }
    let mut lens = vec![n as u32; (num_media + 1) * nslots];
    let mut score = vec![0.0f64; nslots];
    let mut active: Vec<Vec<u64>> = vec![live.clone(); num_media + 1];
    for i in 0..n {
        if active.iter().all(|a| a.iter().all(|&w| w == 0)) {
            break;
        }
        let holds: Vec<Vec<u64>> = (0..num_media)
            .map(|m| words(rows.get(m * n + i).copied().flatten(), nw))
            .collect();
        let mut any = vec![0u64; nw];
        for (m, h) in holds.iter().enumerate() {
            for j in 0..nw {
                any[j] |= h[j];
                let a = active[m][j];
                let kept = a & h[j];
                for_each_bit(j, a & !kept, |s| lens[m * nslots + s] = i as u32);
                active[m][j] = kept;
            }
        }
        for j in 0..nw {
            let a = active[num_media][j];
            let kept = a & any[j];
            for_each_bit(j, a & !kept, |s| lens[num_media * nslots + s] = i as u32);
            active[num_media][j] = kept;
            if let Some(wt) = weights {
                let mut order: Vec<usize> = (0..num_media).collect();
                order.sort_by(|&x, &y| {
                    let (wx, wy) = (
                        wt.get(x).copied().unwrap_or(1.0),
                        wt.get(y).copied().unwrap_or(1.0),
                    );
                    wy.total_cmp(&wx)
                });
                let mut covered = 0u64;
                for m in order {
                    let add = kept & holds[m][j] & !covered;
                    covered |= add;
                    let w = wt.get(m).copied().unwrap_or(1.0);
                    for_each_bit(j, add, |s| score[s] += w);
                }
            }
        }
    }
    let mut out = WalkResult {
        blocks: Vec::with_capacity(slots.len()),
        per_medium: Vec::with_capacity(slots.len() * num_media),
        score: Vec::with_capacity(slots.len()),
    };
    for &s in slots {
        let s = s as usize;
        let b = lens[num_media * nslots + s];
        out.blocks.push(b);
        out.per_medium
            .extend((0..num_media).map(|m| lens[m * nslots + s]));
        out.score.push(if weights.is_some() {
            score[s]
        } else {
            f64::from(b)
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bitmap(slots: &[u32]) -> Vec<u8> {
        let mut b = vec![0u8; 16];
        for &s in slots {
            b[s as usize / 8] |= 0x80 >> (s % 8);
        }
        b
    }

    #[test]
    fn walk_matches_by_hand() {
        // slots 0, 9, 70; block 0 held by all on GPU, block 1 by 0 and 70 (70 on CPU)
        let b0 = bitmap(&[0, 9, 70]);
        let b1g = bitmap(&[0]);
        let b1c = bitmap(&[70]);
        let rows = [Some(&b0[..]), Some(&b1g[..]), None, Some(&b1c[..])];
        let r = walk(&rows, 2, 2, &[0, 9, 70], None);
        assert_eq!(r.blocks, vec![2, 1, 2]);
        assert_eq!(r.per_medium, vec![2, 0, 1, 0, 1, 0]);
        let r = walk(&rows, 2, 2, &[0, 9, 70], Some(&[1.0, 0.5]));
        assert_eq!(r.score, vec![2.0, 1.0, 1.5]);
    }
}
