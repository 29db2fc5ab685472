//! A fixed radix workload for instruction counts (docs/BENCHMARKS.md, "Radix tree: bytes
//! per node"): `cargo run --release --example radix_ops <branchy|long> <phases> <policy>`
//! under `valgrind --tool=callgrind`. Phases: 1 = insert every key, 2 = then match every
//! key, 3 = then evict everything; each phase's cost is the difference between runs.
//! `branchy`: 200,000 random 12-token keys over a 3-token alphabet; `long`: 2000 prompts
//! of 2304 tokens (8 shared 2048-token prefixes), the shape of `benches/bench_radix.py`.
use prefixcache_core::radix::{EvictionPolicy, Namespace, RadixTree};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: radix_ops <branchy|long> <phases 1-3> <policy>";
    let workload = args.get(1).expect(usage);
    let phases: u32 = args.get(2).and_then(|p| p.parse().ok()).expect(usage);
    let policy: EvictionPolicy = args.get(3).and_then(|p| p.parse().ok()).expect(usage);
    let ns = Namespace::default();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut below = |n: u64| {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    };
    let keys: Vec<Vec<u32>> = if workload == "branchy" {
        (0..200_000)
            .map(|_| (0..12).map(|_| below(3) as u32).collect())
            .collect()
    } else {
        (0..2000u32)
            .map(|i| {
                let sys = (0..2048u32).map(move |t| (i % 8) * 100_000 + t * 7 % 32000);
                let uniq = (0..256u32).map(move |t| 1_000_000 + i * 256 + t);
                sys.chain(uniq).collect()
            })
            .collect()
    };
    let mut t = RadixTree::new(1, policy).expect("tree");
    for k in &keys {
        t.insert(k, None, &ns, 0, 0).expect("insert");
    }
    if phases >= 2 {
        for k in &keys {
            t.match_prefix(k, &ns).unwrap();
        }
    }
    if phases >= 3 {
        t.evict(i64::MAX).expect("evict");
    }
    // Only what every build has (the counts compare builds before and after a change).
    println!("{} nodes", t.num_nodes());
}
