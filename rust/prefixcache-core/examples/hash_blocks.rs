//! Pure-Rust timing of `BlockHasher::hash_blocks` (no Python): one 32,768-token prompt of
//! 16-token blocks, token ids uniform below 151,936, every algorithm, best of 15 x 10 passes.
//! Run: `cargo run --release -p prefixcache-core --example hash_blocks`

use std::time::Instant;

use prefixcache_core::hash::{BlockHasher, HashAlgo, DEFAULT_SEED};

fn main() -> Result<(), prefixcache_core::Error> {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let tokens: Vec<u32> = (0..32_768)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % 151_936) as u32
        })
        .collect();
    let blocks = tokens.len() / 16;
    for algo in HashAlgo::ALL {
        let hasher = BlockHasher::new(algo, 16, DEFAULT_SEED)?;
        let mut best = f64::MAX;
        let mut sink = 0u64;
        for _ in 0..15 {
            let start = Instant::now();
            for _ in 0..10 {
                let hashes = hasher.hash_blocks(&tokens, None, None)?;
                sink = sink.wrapping_add(hashes.last().map_or(0, |h| h.to_u64()));
            }
            best = best.min(start.elapsed().as_secs_f64() / 10.0);
        }
        println!(
            "{:12} {:6.1} ns/block  (checksum {sink:x})",
            algo.name(),
            best / blocks as f64 * 1e9
        );
    }
    Ok(())
}
