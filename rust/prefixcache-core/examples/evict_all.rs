//! Times evict-all on the benchmark workload in-process (no Python): `cargo run --release --example evict_all`.
use prefixcache_core::radix::{EvictionPolicy, Namespace, RadixTree};
use std::time::Instant;

fn main() {
    let ns = Namespace::default();
    let prompts: Vec<Vec<u32>> = (0..2000u32)
        .map(|i| {
            let sys = (0..2048u32).map(|t| (i % 8) * 100_000 + t * 7 % 32000);
            let uniq = (0..256u32).map(|t| 1_000_000 + i * 256 + t);
            sys.chain(uniq).collect()
        })
        .collect();
    for _ in 0..8 {
        let mut t = RadixTree::new(1, EvictionPolicy::Lru).unwrap();
        let s = Instant::now();
        for p in &prompts {
            t.insert(p, None, &ns, 0, 0).unwrap();
        }
        let ins = s.elapsed();
        let s = Instant::now();
        for p in &prompts {
            t.match_prefix(p, &ns).unwrap();
        }
        let mat = s.elapsed();
        let s = Instant::now();
        let freed = t.evict(i64::MAX).unwrap();
        let ev = s.elapsed();
        println!(
            "insert {:.2} us  match {:.2} us  evict-all {:.3} ms ({} freed)",
            ins.as_secs_f64() * 1e6 / 2000.0,
            mat.as_secs_f64() * 1e6 / 2000.0,
            ev.as_secs_f64() * 1e3,
            freed.len()
        );
    }
}
