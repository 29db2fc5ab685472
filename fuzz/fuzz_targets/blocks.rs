//! Block pool and KV-cache manager: arbitrary operation sequences on tight pools,
//! full-attention and sliding-window managers. After every operation the invariants
//! hold; the pool's reference counts equal a naive count kept here; an operation that
//! fails leaves the observable state exactly as it was (compared against a snapshot).
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use prefixcache_core::blocks::{BlockPool, CacheKey, KVCacheManager, RequestOptions, StoreInfo};
use prefixcache_core::hash::{BlockHash, BlockHasher, HashAlgo, KeyValue};
use prefixcache_core::Error;

#[derive(Arbitrary, Debug)]
enum PoolOp {
    GetNew {
        n: u8,
    },
    Touch {
        ids: Vec<u8>,
    },
    Free {
        ids: Vec<u8>,
    },
    /// Cache `held[start..start+len]` under hashes derived from `seed`.
    Cache {
        start: u8,
        len: u8,
        num_cached: u8,
        seed: u8,
        group: u8,
        wide: bool,
    },
    Evict {
        ids: Vec<u8>,
    },
    Reset,
    Lookup {
        seed: u8,
        group: u8,
    },
}

#[derive(Arbitrary, Debug)]
enum MgrOp {
    Add {
        id: u8,
        prompt: Vec<u8>,
        salt: bool,
    },
    Append {
        id: u8,
        tokens: Vec<u8>,
    },
    /// get_computed_blocks then allocate_slots with the hit (admission step).
    Schedule {
        id: u8,
        extra: u8,
        lookahead: u8,
    },
    /// allocate_slots for a running request (decode step).
    Step {
        id: u8,
        n: u8,
        lookahead: u8,
    },
    /// allocate_slots with arbitrary (possibly wrong) arguments.
    RawAllocate {
        id: u8,
        n: u8,
        hit: u8,
        blocks: Vec<u8>,
        lookahead: u8,
    },
    Free {
        id: u8,
    },
    Preempt {
        id: u8,
    },
    Reset,
    Evict {
        ids: Vec<u8>,
    },
    Admit {
        id: u8,
        prompt: Vec<u8>,
        lookahead: u8,
    },
    Finish {
        id: u8,
        output: Vec<u8>,
    },
}

#[derive(Arbitrary, Debug)]
enum Input {
    Pool {
        num_blocks: u8,
        caching: bool,
        ops: Vec<PoolOp>,
    },
    Manager {
        num_blocks: u8,
        block_size: u8,
        algo: u8,
        window: u8,
        caching: bool,
        ops: Vec<MgrOp>,
    },
}

type Snapshot = (Vec<u32>, Vec<(u32, Option<CacheKey>)>, usize, usize);

fn pool_snapshot(p: &BlockPool) -> Snapshot {
    let blocks = (0..p.num_blocks() as u32)
        .map(|i| {
            (
                p.ref_cnt(i).expect("ref_cnt"),
                p.block_key(i).expect("block_key"),
            )
        })
        .collect();
    (
        p.free_block_ids().expect("free ids"),
        blocks,
        p.num_cached_keys(),
        p.num_free_blocks(),
    )
}

fn hash(seed: u8, wide: bool) -> BlockHash {
    let mut b = [0u8; 32];
    b[0] = seed;
    b[31] = seed.wrapping_mul(7);
    BlockHash::from_bytes(if wide { &b[..32] } else { &b[..8] }).expect("hash bytes")
}

fn run_pool(num_blocks: u8, caching: bool, ops: Vec<PoolOp>) {
    let n = usize::from(num_blocks % 12) + 1;
    let mut pool = BlockPool::new(n, caching, true).expect("pool");
    let mut refs = vec![0u32; n];
    let mut held: Vec<u32> = Vec::new();
    let id = |b: u8| u32::from(b) % (n as u32 + 2);
    for op in ops.into_iter().take(300) {
        let before = pool_snapshot(&pool);
        pool.take_events().expect("events with memory");
        let r: Result<(), Error> = match op {
            PoolOp::GetNew { n: k } => pool.get_new_blocks(usize::from(k % 8)).map(|ids| {
                for &b in &ids {
                    assert_eq!(refs[b as usize], 0, "handed out a referenced block");
                    assert_ne!(b, 0, "handed out the null block");
                    refs[b as usize] = 1;
                    assert_eq!(
                        pool.block_key(b).expect("key"),
                        None,
                        "new block kept its hash"
                    );
                }
                held.extend(ids);
            }),
            PoolOp::Touch { ids } => {
                let ids: Vec<u32> = ids.iter().take(8).map(|&b| id(b)).collect();
                pool.touch(&ids).map(|()| {
                    for &b in &ids {
                        refs[b as usize] += 1;
                        held.push(b);
                    }
                })
            }
            PoolOp::Free { ids } => {
                // Mostly blocks we hold, sometimes arbitrary ids (double frees).
                let ids: Vec<u32> = ids
                    .iter()
                    .take(8)
                    .map(|&b| {
                        if b & 1 == 0 && !held.is_empty() {
                            held[usize::from(b >> 1) % held.len()]
                        } else {
                            id(b >> 1)
                        }
                    })
                    .collect();
                pool.free_blocks(&ids).map(|()| {
                    for &b in &ids {
                        refs[b as usize] -= 1;
                        let pos = held
                            .iter()
                            .position(|&h| h == b)
                            .expect("freed a block we did not hold");
                        held.swap_remove(pos);
                    }
                })
            }
            PoolOp::Cache {
                start,
                len,
                num_cached,
                seed,
                group,
                wide,
            } => {
                if held.is_empty() {
                    continue;
                }
                let s = usize::from(start) % held.len();
                let e = (s + usize::from(len % 6)).min(held.len());
                let ids = held[s..e].to_vec();
                let hashes: Vec<BlockHash> = (0..ids.len())
                    .map(|i| hash(seed.wrapping_add(i as u8), wide))
                    .collect();
                pool.cache_full_blocks(
                    &ids,
                    &hashes,
                    usize::from(num_cached % 3),
                    ids.len(),
                    4,
                    u32::from(group % 2),
                    StoreInfo::default(),
                )
            }
            PoolOp::Evict { ids } => {
                let ids: Vec<u32> = ids.iter().take(8).map(|&b| id(b)).collect();
                pool.evict_blocks(&ids).map(|()| {
                    for &b in &ids {
                        assert_eq!(pool.block_key(b).expect("key"), None);
                    }
                })
            }
            PoolOp::Reset => {
                let all_free = refs.iter().all(|&r| r == 0);
                assert_eq!(
                    pool.reset_prefix_cache().expect("reset_prefix_cache"),
                    all_free,
                    "reset_prefix_cache"
                );
                if all_free {
                    assert_eq!(pool.num_cached_keys(), 0);
                }
                Ok(())
            }
            PoolOp::Lookup { seed, group } => {
                for wide in [false, true] {
                    let h = hash(seed, wide);
                    if let Some(b) = pool.lookup(&h, u32::from(group % 2)) {
                        assert_eq!(
                            pool.block_key(b).expect("key"),
                            Some(CacheKey {
                                hash: h,
                                group: u32::from(group % 2)
                            })
                        );
                    }
                }
                Ok(())
            }
        };
        if let Err(e) = r {
            assert!(
                !matches!(e, Error::UnsupportedHashInput(_) | Error::UnknownRequest(_)),
                "{e:?}"
            );
            assert_eq!(
                before,
                pool_snapshot(&pool),
                "failed pool op changed the state: {e:?}"
            );
            assert!(
                pool.take_events().expect("take_events").is_empty(),
                "failed pool op emitted events"
            );
        }
        if let Err(e) = pool.check_invariants() {
            panic!("pool invariants: {e}");
        }
        for (i, &r) in refs.iter().enumerate() {
            assert_eq!(
                pool.ref_cnt(i as u32).expect("ref_cnt"),
                r,
                "ref count of block {i}"
            );
        }
        let free = refs.iter().skip(1).filter(|&&r| r == 0).count();
        assert_eq!(pool.num_free_blocks(), free);
    }
}

const IDS: u64 = 6;

type MgrSnapshot = (
    Snapshot,
    Vec<Option<(Vec<u32>, usize, usize, Vec<BlockHash>)>>,
    usize,
);

fn mgr_snapshot(m: &KVCacheManager) -> MgrSnapshot {
    let reqs = (0..IDS)
        .map(|id| {
            m.contains(id).then(|| {
                (
                    m.block_ids(id).expect("ids").to_vec(),
                    m.num_tokens(id).expect("tokens"),
                    m.num_computed_tokens(id).expect("computed"),
                    m.block_hashes(id).expect("hashes").to_vec(),
                )
            })
        })
        .collect();
    (pool_snapshot(m.pool()), reqs, m.num_requests())
}

fn toks(raw: &[u8]) -> Vec<u32> {
    raw.iter().take(40).map(|&b| u32::from(b % 4)).collect()
}

fn run_manager(
    num_blocks: u8,
    block_size: u8,
    algo: u8,
    window: u8,
    caching: bool,
    ops: Vec<MgrOp>,
) {
    let n = usize::from(num_blocks % 16) + 1;
    let bs = usize::from(block_size % 4) + 1;
    let algo = HashAlgo::ALL[usize::from(algo) % HashAlgo::ALL.len()];
    let hasher = BlockHasher::new(algo, bs, "fuzz").expect("hasher");
    let window = (window % 3 != 0).then(|| usize::from(window % 12) + 2);
    let mut m = KVCacheManager::new(n, hasher, caching, window, true).expect("manager");
    for op in ops.into_iter().take(200) {
        let before = mgr_snapshot(&m);
        let stats = m.stats();
        m.take_events().expect("events with memory");
        let mut short = false;
        let r: Result<(), Error> = match op {
            MgrOp::Add { id, prompt, salt } => {
                let mut opts = RequestOptions::default();
                if salt {
                    opts.block_extra_keys = vec![Some(vec![KeyValue::Str("s".into())])];
                }
                m.add_request(u64::from(id) % IDS, &toks(&prompt), opts)
            }
            MgrOp::Append { id, tokens } => m.append_tokens(u64::from(id) % IDS, &toks(&tokens)),
            MgrOp::Schedule {
                id,
                extra,
                lookahead,
            } => {
                let id = u64::from(id) % IDS;
                match m.get_computed_blocks(id) {
                    Ok((blocks, hit)) => {
                        assert_eq!(blocks.len() * bs, hit);
                        let total = m.num_tokens(id).expect("tokens");
                        assert!(hit < total.max(1));
                        let computed = m.num_computed_tokens(id).expect("computed");
                        let new =
                            (total.saturating_sub(hit + computed)).min(usize::from(extra % 16) + 1);
                        m.allocate_slots(id, new, hit, &blocks, usize::from(lookahead % 3))
                            .map(|r| short = r.is_none())
                    }
                    Err(e) => Err(e),
                }
            }
            MgrOp::Step {
                id,
                n: k,
                lookahead,
            } => m
                .allocate_slots(
                    u64::from(id) % IDS,
                    usize::from(k % 5) + 1,
                    0,
                    &[],
                    usize::from(lookahead % 3),
                )
                .map(|r| short = r.is_none()),
            MgrOp::RawAllocate {
                id,
                n: k,
                hit,
                blocks,
                lookahead,
            } => {
                let blocks: Vec<u32> = blocks
                    .iter()
                    .take(4)
                    .map(|&b| u32::from(b) % (n as u32 + 1))
                    .collect();
                m.allocate_slots(
                    u64::from(id) % IDS,
                    usize::from(k % 6),
                    usize::from(hit % 9),
                    &blocks,
                    usize::from(lookahead % 3),
                )
                .map(|r| short = r.is_none())
            }
            MgrOp::Free { id } => m.free(u64::from(id) % IDS),
            MgrOp::Preempt { id } => m.preempt(u64::from(id) % IDS),
            MgrOp::Reset => {
                m.reset_prefix_cache().expect("reset_prefix_cache");
                Ok(())
            }
            MgrOp::Evict { ids } => {
                let ids: Vec<u32> = ids
                    .iter()
                    .take(6)
                    .map(|&b| u32::from(b) % (n as u32 + 2))
                    .collect();
                m.evict_blocks(&ids)
            }
            MgrOp::Admit {
                id,
                prompt,
                lookahead,
            } => {
                let id = u64::from(id) % IDS;
                let prompt = toks(&prompt);
                match m.admit(
                    id,
                    &prompt,
                    RequestOptions::default(),
                    usize::from(lookahead % 3),
                ) {
                    Ok(Some(a)) => {
                        assert_eq!(m.block_ids(id).expect("ids"), &a.block_ids[..]);
                        assert!(a.num_hit_tokens < prompt.len());
                        Ok(())
                    }
                    Ok(None) => {
                        assert!(!m.contains(id));
                        // Short pool: only a window's released blocks may have moved; with
                        // full attention nothing changed at all.
                        if window.is_none() {
                            assert_eq!(before, mgr_snapshot(&m), "admit -> None changed the state");
                        }
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            MgrOp::Finish { id, output } => {
                m.finish(u64::from(id) % IDS, &toks(&output)).map(|_| ())
            }
        };
        if short && window.is_none() {
            assert_eq!(
                before,
                mgr_snapshot(&m),
                "allocate_slots -> None changed the state"
            );
            assert_eq!(stats, m.stats(), "allocate_slots -> None changed the stats");
        }
        if let Err(e) = r {
            assert!(!matches!(e, Error::UnsupportedHashInput(_)), "{e:?}");
            assert_eq!(
                before,
                mgr_snapshot(&m),
                "failed manager op changed the state: {e:?}"
            );
            assert_eq!(
                stats,
                m.stats(),
                "failed manager op changed the stats: {e:?}"
            );
            assert!(
                m.take_events().expect("take_events").is_empty(),
                "failed manager op emitted events"
            );
        }
        if let Err(e) = m.check_invariants() {
            panic!("manager invariants: {e}");
        }
    }
}

fuzz_target!(|input: Input| match input {
    Input::Pool {
        num_blocks,
        caching,
        ops,
    } => run_pool(num_blocks, caching, ops),
    Input::Manager {
        num_blocks,
        block_size,
        algo,
        window,
        caching,
        ops,
    } => {
        run_manager(num_blocks, block_size, algo, window, caching, ops)
    }
});
