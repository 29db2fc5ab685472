//! Unit tests of the CPU offload tier; the full rules are checked against vLLM's own
//! manager by the recorded vectors (tests/test_offload_vectors.py).

use super::*;
use crate::hash::BlockHash;

fn k(i: u8) -> BlockHash {
    BlockHash::from_bytes(&[i; 8]).unwrap_or_else(|| unreachable!())
}

fn ks(v: &[u8]) -> Vec<BlockHash> {
    v.iter().map(|&i| k(i)).collect()
}

fn store(m: &mut CpuOffloadManager, rid: u64, keys: &[u8]) -> Option<PrepareStoreOutput> {
    let out = m
        .prepare_store(rid, &ks(keys))
        .unwrap_or_else(|e| panic!("{e}"));
    if let Some(o) = &out {
        m.complete_store(rid, &o.keys_to_store, true)
            .expect("memory");
    }
    m.check_invariants().unwrap_or_else(|e| panic!("{e}"));
    out
}

#[test]
fn lru_fresh_ids_first_then_lifo_and_oldest_evicted() {
    let mut m = CpuOffloadManager::new(3, CachePolicy::Lru, 1, 64, true).unwrap();
    let out = store(&mut m, 0, &[1, 2, 3]).unwrap();
    assert_eq!(out.chunk_ids, vec![0, 1, 2]);
    m.on_request_finished(0).expect("memory");
    // Request 1 evicts two chunks: with no positions, finishing ranked 3 < 2 < 1 oldest
    // (tail first), so 3 and 2 go.
    let out = store(&mut m, 1, &[4, 5]).unwrap();
    assert_eq!(out.evicted_keys, ks(&[3, 2]));
    assert_eq!(out.chunk_ids, vec![1, 2]);
    let ev = m.take_events().expect("events");
    assert_eq!(ev.len(), 3);
    assert!(!ev[0].removed && ev[1].removed && !ev[2].removed);
}

#[test]
fn store_refused_when_pinned_or_protected() {
    let mut m = CpuOffloadManager::new(2, CachePolicy::Lru, 1, 64, false).unwrap();
    store(&mut m, 0, &[1, 2]);
    assert_eq!(m.prepare_load(1, &ks(&[1, 2])).unwrap(), vec![0, 1]);
    assert!(store(&mut m, 2, &[3]).is_none());
    m.complete_load(1, &ks(&[1, 2])).unwrap();
    // Offered keys are protected: 1 and 2 are offered with 3, nothing can go.
    assert!(store(&mut m, 2, &[1, 2, 3]).is_none());
    assert_eq!(store(&mut m, 2, &[3]).unwrap().evicted_keys.len(), 1);
    assert!(m.complete_load(1, &ks(&[1])).is_err());
}

#[test]
fn lookup_prefix_pending_defers() {
    let mut m = CpuOffloadManager::new(4, CachePolicy::Arc, 1, 64, false).unwrap();
    let out = m.prepare_store(0, &ks(&[1, 2])).unwrap().unwrap();
    assert_eq!(m.lookup(&k(1)), LookupResult::HitPending);
    assert_eq!(m.lookup_prefix(&ks(&[1, 2, 3])), None);
    m.complete_store(0, &out.keys_to_store, true)
        .expect("memory");
    assert_eq!(m.lookup_prefix(&ks(&[1, 2, 3])), Some(2));
    assert!(m.prepare_load(0, &ks(&[3])).is_err());
}

#[test]
fn threshold_stores_on_the_kth_offer_and_tracker_is_bounded() {
    let mut m = CpuOffloadManager::new(8, CachePolicy::Lru, 2, 3, false).unwrap();
    assert!(store(&mut m, 0, &[1, 2]).unwrap().keys_to_store.is_empty());
    assert_eq!(
        store(&mut m, 1, &[1, 2]).unwrap().keys_to_store,
        ks(&[1, 2])
    );
    store(&mut m, 2, &[5, 6, 7]);
    assert!(m.num_tracked() <= 3);
}

#[test]
fn arc_reuse_promotes_to_t2_and_t1_goes_first() {
    let mut m = CpuOffloadManager::new(2, CachePolicy::Arc, 1, 64, false).unwrap();
    store(&mut m, 0, &[1, 2]);
    m.on_request_finished(0).expect("memory");
    m.prepare_load(1, &ks(&[1])).unwrap();
    m.complete_load(1, &ks(&[1])).unwrap();
    m.on_request_finished(1).expect("memory"); // 1 reused: T2
    let out = store(&mut m, 2, &[3]).unwrap();
    assert_eq!(out.evicted_keys, ks(&[2]));
}

#[test]
fn failed_store_releases_quietly() {
    let mut m = CpuOffloadManager::new(2, CachePolicy::Lru, 1, 64, true).unwrap();
    let out = m.prepare_store(0, &ks(&[1])).unwrap().unwrap();
    m.complete_store(0, &out.keys_to_store, false)
        .expect("memory");
    m.check_invariants().unwrap();
    assert_eq!(m.lookup(&k(1)), LookupResult::Miss);
    let ev = m.take_events().expect("events");
    assert_eq!(ev.len(), 1);
    assert!(ev[0].metadata_only);
    assert!(to_kv_events(&ev).is_empty());
    assert!(m.prepare_store(0, &ks(&[1, 1])).is_err());
}

#[test]
fn a_finished_requests_state_serves_the_next_request_empty() {
    // Request 0's state (keys, positions, access flags, LRU rank) is recycled for
    // request 1: nothing of it may show through.
    let mut m = CpuOffloadManager::new(4, CachePolicy::Lru, 1, 64, false).unwrap();
    m.on_new_request(0).expect("memory");
    m.set_request_keys(0, &ks(&[1, 2, 3]), 16).unwrap();
    assert_eq!(m.prepare_store_range(0, 0, 3, true).unwrap(), Some((3, 0)));
    m.on_request_finished(0).expect("memory");
    m.on_new_request(1).expect("memory");
    assert!(m.request_keys(1, 0, 10).is_empty());
    assert_eq!(m.prepare_store_range(1, 0, 3, true).unwrap(), Some((0, 0)));
    m.set_request_keys(1, &ks(&[3, 4]), 16).unwrap();
    assert_eq!(m.request_keys(1, 0, 10), ks(&[3, 4]));
    // Key 3 is stored, key 4 new: one stored, room for it without eviction.
    let out = m.prepare_store_range(1, 0, 2, true).unwrap();
    assert_eq!(out, Some((1, 0)));
    m.on_request_finished(1).expect("memory");
    m.check_invariants().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.num_stored(), 4);
}

/// Conversations over a shared system prompt, several requests in flight, driven as the
/// simulator drives the tier (range calls) with explicit-key calls mixed in: the LRU
/// runs (`Lru::fresh_in_order`, the runs of `on_access` and of evictions) leave every
/// result and the whole state exactly as rank changes made chunk by chunk do.
#[test]
fn lru_runs_equal_chunk_by_chunk_rank_changes() {
    fn key(i: u32) -> BlockHash {
        BlockHash::from_bytes(&i.to_le_bytes()).unwrap_or_else(|| unreachable!())
    }
    let mut rnd = xorshift(0x2545_F491_4F6C_DD1D);
    // The runs the fast manager moved, by kind: finishes, accesses, stores, evictions.
    let mut runs_seen = [0usize; 4];
    for (capacity, steps) in [(24u64, 3000usize), (80, 3000), (400, 2000)] {
        let mut fast = CpuOffloadManager::new(capacity, CachePolicy::Lru, 1, 64, true).unwrap();
        let mut slow = fast.clone();
        slow.lru_per_chunk();
        // Conversations: their keys so far (a shared system prompt of 6 keys first).
        let mut convs: Vec<Vec<u32>> = (0..5).map(|_| (0..6).collect()).collect();
        let mut next_key = 1000u32;
        // Requests in flight: (rid, number of keys, next key to store).
        let mut running: Vec<(u64, usize, usize)> = Vec::new();
        let mut rid = 0u64;
        for _ in 0..steps {
            let op = rnd(10);
            if running.len() < 4 && (op < 4 || running.is_empty()) {
                rid += 1;
                let c = rnd(convs.len() as u64) as usize;
                for _ in 0..1 + rnd(6) {
                    convs[c].push(next_key);
                    next_key += 1;
                }
                let keys: Vec<BlockHash> = convs[c].iter().map(|&i| key(i)).collect();
                let gpu_hit = rnd(keys.len() as u64 / 2 + 1) as usize;
                let mut next_store = 0;
                for m in [&mut fast, &mut slow] {
                    m.on_new_request(rid).expect("memory");
                    m.set_request_keys(rid, &keys, 16).unwrap();
                }
                let hit = fast.lookup_prefix_range(rid, gpu_hit, keys.len());
                assert_eq!(hit, slow.lookup_prefix_range(rid, gpu_hit, keys.len()));
                if let Some(n) = hit.filter(|&n| n > 0) {
                    for m in [&mut fast, &mut slow] {
                        m.prepare_load_range(rid, gpu_hit, gpu_hit + n).unwrap();
                        m.complete_load_range(rid, gpu_hit, gpu_hit + n).unwrap();
                    }
                    next_store = gpu_hit + n;
                }
                running.push((rid, keys.len(), next_store));
            } else if op < 8 {
                let i = rnd(running.len() as u64) as usize;
                let (r, n, from) = running[i];
                // Now and then from the first key, after keys further on were loaded.
                let from = if op == 6 { 0 } else { from };
                let out = fast.prepare_store_range(r, from, n, true);
                assert_eq!(out, slow.prepare_store_range(r, from, n, true));
                if matches!(out, Ok(Some(_))) {
                    running[i].2 = n;
                }
                if op == 7 {
                    // Some keys named explicitly, last first (a reversed access order).
                    let ks = fast.request_keys(r, 0, n);
                    let ks: Vec<BlockHash> = ks.into_iter().rev().take(3).collect();
                    fast.touch(r, &ks);
                    slow.touch(r, &ks);
                }
            } else {
                let i = rnd(running.len() as u64) as usize;
                let (r, ..) = running.swap_remove(i);
                fast.on_request_finished(r).expect("memory");
                slow.on_request_finished(r).expect("memory");
            }
            assert_eq!(
                fast.take_events().expect("events"),
                slow.take_events().expect("events")
            );
            fast.check_invariants().unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(fast.state_dump(), slow.state_dump());
        }
        for (seen, n) in runs_seen.iter_mut().zip(fast.lru_runs()) {
            *seen += n;
        }
        assert_eq!(slow.lru_runs(), [0; 4]);
    }
    assert!(
        runs_seen.iter().all(|&n| n > 0),
        "runs moved: {runs_seen:?}"
    );
}

#[test]
fn handed_out_lists_hold_no_more_room_than_their_items() {
    // A store of 2 keys into a full tier reserves its event lists for 2 keys (what it
    // may evict and complete); one is stored already, so it evicts one and completes
    // one: each event keeps a list of one.
    let mut m = CpuOffloadManager::new(4, CachePolicy::Lru, 1, 64, true).unwrap();
    m.set_request_keys(0, &ks(&[1, 2, 3, 4]), 16)
        .expect("memory");
    assert_eq!(
        m.prepare_store_range(0, 0, 4, true).expect("memory"),
        Some((4, 0))
    );
    m.on_request_finished(0).expect("memory");
    m.take_events().expect("events");
    m.set_request_keys(1, &ks(&[4, 5]), 16).expect("memory");
    assert_eq!(
        m.prepare_store_range(1, 0, 2, true).expect("memory"),
        Some((1, 1))
    );
    let ev = m.take_events().expect("events");
    assert_eq!(ev.len(), 2);
    for e in &ev {
        assert_eq!((e.keys.len(), e.keys.capacity()), (1, 1), "{e:?}");
    }
    // The same for the lists prepare_store returns.
    let out = m.prepare_store(2, &ks(&[5, 6])).expect("memory");
    let out = out.unwrap_or_else(|| panic!("room for 6"));
    for (len, cap) in [
        (out.keys_to_store.len(), out.keys_to_store.capacity()),
        (out.chunk_ids.len(), out.chunk_ids.capacity()),
        (out.evicted_keys.len(), out.evicted_keys.capacity()),
    ] {
        assert_eq!((len, cap), (1, 1), "{out:?}");
    }
}

/// A seeded xorshift generator for the randomized tests: `rnd(n)` is in `0..n`.
pub(super) fn xorshift(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut x = seed;
    move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    }
}

/// Every call the manager refuses (lengths that disagree, end tokens past int64, keys
/// not stored and ready to load, a load completed with no load in flight, keys offered
/// twice in one store, by name or through a request's block order naming a key twice),
/// on known and unknown requests, under each policy, with and without the store
/// threshold's tracker: the call returns an error and the whole state (`state_dump`,
/// the request contexts) is as before, and the manager then answers every call as a
/// copy taken before the refusal does.
#[test]
fn refused_calls_change_nothing() {
    type Call = fn(&mut CpuOffloadManager) -> crate::error::Result<()>;
    /// Request 0 stored 1..=4 through its block order and finished; request 1's block
    /// order names key 3 twice; request 2 is storing key 6; request 3 loads 1 and 2
    /// (positions set by hand); request 5 is new; requests 6 and 7 name stored keys
    /// and, after them, a key being stored (6) or a key with no load (3). Request 9 is
    /// unknown. Events untaken.
    fn world(policy: CachePolicy, threshold: u32) -> CpuOffloadManager {
        let mut m = CpuOffloadManager::new(6, policy, threshold, 4, true).unwrap();
        m.set_request_keys(0, &ks(&[1, 2, 3, 4]), 16).unwrap();
        for _ in 0..threshold {
            m.prepare_store_range(0, 0, 4, true).unwrap();
        }
        m.on_request_finished(0).unwrap();
        m.set_request_keys(1, &ks(&[3, 5, 3]), 16).unwrap();
        for _ in 0..threshold {
            m.prepare_store(2, &ks(&[6])).unwrap();
        }
        m.set_offload_key_positions(3, &ks(&[1, 2]), &[32, 16])
            .unwrap();
        assert_eq!(m.prepare_load(3, &ks(&[1, 2])).unwrap(), vec![0, 1]);
        m.on_new_request(5).unwrap();
        m.set_request_keys(6, &ks(&[1, 2, 6]), 16).unwrap();
        m.set_request_keys(7, &ks(&[1, 2, 3]), 16).unwrap();
        assert_eq!(m.lookup(&k(6)), LookupResult::HitPending);
        m.check_invariants().unwrap_or_else(|e| panic!("{e}"));
        m
    }
    let refused: [(&str, Call); 20] = [
        ("positions of another length", |m| {
            m.set_offload_key_positions(3, &ks(&[1, 2]), &[16])
        }),
        ("positions of another length, unknown request", |m| {
            m.set_offload_key_positions(9, &ks(&[1]), &[16, 32])
        }),
        ("end tokens past int64", |m| {
            m.set_request_keys(1, &ks(&[7, 8]), 1 << 62)
        }),
        ("end tokens past u64", |m| {
            m.set_request_keys(1, &ks(&[7, 8, 9]), u64::MAX / 2)
        }),
        ("end tokens past int64, unknown request", |m| {
            m.set_request_keys(9, &ks(&[7]), u64::MAX)
        }),
        ("load of a key not stored", |m| {
            m.prepare_load(3, &ks(&[1, 7])).map(drop)
        }),
        ("load of a key being stored", |m| {
            m.prepare_load(5, &ks(&[3, 6])).map(drop)
        }),
        ("load, unknown request", |m| {
            m.prepare_load(9, &ks(&[2, 7])).map(drop)
        }),
        ("range load of a key not stored", |m| {
            m.prepare_load_range(1, 0, 3).map(drop)
        }),
        ("range load of a key being stored", |m| {
            m.prepare_load_range(6, 0, 3).map(drop)
        }),
        ("complete_load with no load in flight", |m| {
            m.complete_load(3, &ks(&[1, 3]))
        }),
        ("complete_load of a key listed twice, one load", |m| {
            m.complete_load(3, &ks(&[2, 1, 2]))
        }),
        ("complete_load of a key being stored", |m| {
            m.complete_load(2, &ks(&[6]))
        }),
        ("complete_load, unknown request", |m| {
            m.complete_load(9, &ks(&[1, 7]))
        }),
        ("range complete_load with no load in flight", |m| {
            m.complete_load_range(1, 0, 1)
        }),
        ("range complete_load past the loads", |m| {
            m.complete_load_range(7, 0, 3)
        }),
        ("store of a key twice", |m| {
            m.prepare_store(2, &ks(&[7, 8, 7])).map(drop)
        }),
        ("store of a key twice, unknown request", |m| {
            m.prepare_store(9, &ks(&[1, 1])).map(drop)
        }),
        ("range store naming a key twice", |m| {
            m.prepare_store_range(1, 0, 3, true).map(drop)
        }),
        ("range store naming a key twice, not completing", |m| {
            m.prepare_store_range(1, 0, 3, false).map(drop)
        }),
    ];
    for policy in [CachePolicy::Lru, CachePolicy::Arc] {
        for threshold in [1, 2] {
            for (what, call) in refused {
                let mut m = world(policy, threshold);
                let copy = m.clone();
                let (dump, requests) = (m.state_dump(), m.num_requests());
                let err = call(&mut m).err();
                assert!(err.is_some(), "{what} ({policy:?}, {threshold}): accepted");
                assert_eq!(
                    m.state_dump(),
                    dump,
                    "{what} ({policy:?}, {threshold}): {err:?}"
                );
                assert_eq!(m.num_requests(), requests, "{what}");
                m.check_invariants()
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                // The same calls afterwards: the same answers and states.
                let answers = [m, copy].map(|mut m| {
                    let out = (
                        m.complete_load(3, &ks(&[1, 2])),
                        m.prepare_store_range(7, 0, 3, true),
                        m.prepare_store(4, &ks(&[7, 8, 9, 10])),
                        m.complete_store(2, &ks(&[6]), true),
                        (0..10)
                            .map(|r| m.on_request_finished(r))
                            .collect::<Vec<_>>(),
                        m.prepare_store(4, &ks(&[11, 12, 13])),
                        m.take_events().map(|e| to_kv_events(&e)),
                    );
                    format!("{out:?} {}", m.state_dump())
                });
                assert_eq!(answers[0], answers[1], "{what}: afterwards");
            }
        }
    }
}

#[test]
fn a_load_past_the_chunks_count_is_refused_and_changes_nothing() {
    use super::manager::MAX_LOADS;
    for policy in [CachePolicy::Lru, CachePolicy::Arc] {
        let mut m = CpuOffloadManager::new(4, policy, 1, 64, true).unwrap();
        store(&mut m, 0, &[1, 2]);
        m.take_events().expect("events");
        m.set_loads(&k(1), MAX_LOADS - 2);
        m.set_request_keys(1, &ks(&[1, 2, 1]), 16).unwrap();
        // Two loads of key 1 in one call: the count reaches the bound exactly.
        assert_eq!(m.prepare_load_range(1, 0, 3).unwrap(), 3);
        let before = m.state_dump();
        let refused = [
            m.prepare_load(1, &ks(&[2, 1])).map(|_| ()),
            m.prepare_load_range(1, 2, 3).map(|_| ()),
        ];
        for e in refused {
            let e = e.expect_err("a load past the bound");
            assert!(
                e.to_string().contains("a chunk counts at most 2**31 - 1"),
                "{e}"
            );
            assert_eq!(m.state_dump(), before);
        }
        assert_eq!(m.lookup(&k(1)), LookupResult::Hit);
        m.check_invariants().unwrap_or_else(|e| panic!("{e}"));
        // One load released: room for one, not for two.
        m.complete_load(1, &ks(&[1])).unwrap();
        assert_eq!(m.prepare_load(1, &ks(&[1])).unwrap(), vec![0]);
        m.complete_load(1, &ks(&[1])).unwrap();
        let before = m.state_dump();
        assert!(m.prepare_load_range(1, 0, 3).is_err());
        assert_eq!(m.state_dump(), before);
        m.check_invariants().unwrap_or_else(|e| panic!("{e}"));
    }
}
