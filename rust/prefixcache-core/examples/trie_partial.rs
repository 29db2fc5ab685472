//! Partial matching at a branching point, in-process (no Python):
//! `cargo run --release --example trie_partial`.
//!
//! The root of a `BlockTrie` gets N cached 64-token children over a 4-token alphabet
//! (thousands share their first tokens); each query shares 1..63 tokens with one child.
//! `BlockTrie::lookup` (ordered child index) is timed against a plain scan of the same
//! children computing the longest common prefix, which is what TensorRT-LLM's
//! `findMatchingBlock` does on an exact miss.
use prefixcache_core::trie::{BlockTrie, ClaimParams};
use std::time::Instant;

const TPB: usize = 64;

fn rng(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn main() {
    let p = ClaimParams::default();
    for n in [10usize, 100, 1_000, 10_000] {
        let mut s = 0x9e37_79b9_7f4a_7c15u64 ^ n as u64;
        let mut kids: Vec<Vec<u32>> = Vec::with_capacity(n);
        let mut seen = std::collections::HashSet::new();
        while kids.len() < n {
            let c: Vec<u32> = (0..TPB).map(|_| (rng(&mut s) % 4) as u32).collect();
            if seen.insert(c.clone()) {
                kids.push(c);
            }
        }
        let mut t = BlockTrie::new(2 * n + 8, TPB, true, true).expect("trie");
        for (i, c) in kids.iter().enumerate() {
            let mut prompt = c.clone();
            prompt.push(0);
            t.claim(i as u64, &prompt, &p).expect("claim");
            t.complete(i as u64).expect("complete");
            t.store(i as u64, &prompt).expect("store");
        }
        for i in 0..n {
            t.release(i as u64).expect("release");
        }
        let queries: Vec<Vec<u32>> = (0..2000)
            .map(|_| {
                let base = &kids[(rng(&mut s) % n as u64) as usize];
                let k = 1 + (rng(&mut s) % (TPB as u64 - 1)) as usize;
                let mut q = base[..k].to_vec();
                q.resize(TPB, 5);
                q.push(0);
                q
            })
            .collect();
        let mut best_index = f64::MAX;
        let mut best_scan = f64::MAX;
        for _ in 0..5 {
            let st = Instant::now();
            let mut m1 = 0usize;
            for q in &queries {
                m1 += t.lookup(q, &p).expect("lookup").num_matched_tokens;
            }
            best_index = best_index.min(st.elapsed().as_secs_f64());
            let st = Instant::now();
            let mut m2 = 0usize;
            for q in &queries {
                let head = &q[..TPB];
                m2 += kids
                    .iter()
                    .map(|c| c.iter().zip(head).take_while(|(a, b)| a == b).count())
                    .max()
                    .unwrap_or(0);
            }
            best_scan = best_scan.min(st.elapsed().as_secs_f64());
            assert_eq!(m1, m2, "index and scan disagree");
        }
        println!(
            "{n:>6} children: lookup (index) {:.3} us   scan of the children {:.3} us   (scan / lookup {:.1}x)",
            best_index * 1e6 / 2000.0,
            best_scan * 1e6 / 2000.0,
            best_scan / best_index
        );
    }
}
