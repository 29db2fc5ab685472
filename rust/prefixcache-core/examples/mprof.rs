use prefixcache_core::blocks::{KVCacheManager, RequestOptions};
use prefixcache_core::hash::{BlockHasher, HashAlgo};
use std::time::Instant;
fn main() {
    let h = BlockHasher::new(HashAlgo::Sha256, 16, "vllm-none-hash").unwrap();
    let mut m = KVCacheManager::new(4096, h, true, None, false).unwrap();
    let prompts: Vec<Vec<u32>> = (0..2000u32)
        .map(|i| {
            let mut v: Vec<u32> = (0..2048u32).map(|t| t + 100_000 * (i % 8)).collect();
            v.extend((0..256u32).map(|t| 10_000_000 + 256 * i + t));
            v
        })
        .collect();
    for (i, p) in prompts.iter().enumerate() {
        m.add_request(i as u64, p, RequestOptions::default())
            .unwrap();
    }
    let t = Instant::now();
    for round in 0..3u64 {
        for (i, p) in prompts.iter().enumerate() {
            let i = i as u64;
            let (b, hit) = m.get_computed_blocks(i).unwrap();
            m.allocate_slots(i, p.len() - hit, hit, &b, 0)
                .unwrap()
                .unwrap();
            m.preempt(i).unwrap();
            let _ = round;
        }
    }
    println!("laf {:.2}", t.elapsed().as_secs_f64() / 6000.0 * 1e6);
}
