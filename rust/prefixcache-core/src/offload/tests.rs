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
        m.complete_store(rid, &o.keys_to_store, true);
    }
    m.check_invariants().unwrap_or_else(|e| panic!("{e}"));
    out
}

#[test]
fn lru_fresh_ids_first_then_lifo_and_oldest_evicted() {
    let mut m = CpuOffloadManager::new(3, CachePolicy::Lru, 1, 64, true).unwrap();
    let out = store(&mut m, 0, &[1, 2, 3]).unwrap();
    assert_eq!(out.chunk_ids, vec![0, 1, 2]);
    m.on_request_finished(0);
    // Request 1 evicts two chunks: with no positions, finishing ranked 3 < 2 < 1 oldest
    // (tail first), so 3 and 2 go.
    let out = store(&mut m, 1, &[4, 5]).unwrap();
    assert_eq!(out.evicted_keys, ks(&[3, 2]));
    assert_eq!(out.chunk_ids, vec![1, 2]);
    let ev = m.take_events();
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
    m.complete_store(0, &out.keys_to_store, true);
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
    m.on_request_finished(0);
    m.prepare_load(1, &ks(&[1])).unwrap();
    m.complete_load(1, &ks(&[1])).unwrap();
    m.on_request_finished(1); // 1 reused: T2
    let out = store(&mut m, 2, &[3]).unwrap();
    assert_eq!(out.evicted_keys, ks(&[2]));
}

#[test]
fn failed_store_releases_quietly() {
    let mut m = CpuOffloadManager::new(2, CachePolicy::Lru, 1, 64, true).unwrap();
    let out = m.prepare_store(0, &ks(&[1])).unwrap().unwrap();
    m.complete_store(0, &out.keys_to_store, false);
    m.check_invariants().unwrap();
    assert_eq!(m.lookup(&k(1)), LookupResult::Miss);
    let ev = m.take_events();
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
    m.on_new_request(0);
    m.set_request_keys(0, &ks(&[1, 2, 3]), 16).unwrap();
    assert_eq!(m.prepare_store_range(0, 0, 3, true).unwrap(), Some((3, 0)));
    m.on_request_finished(0);
    m.on_new_request(1);
    assert!(m.request_keys(1, 0, 10).is_empty());
    assert_eq!(m.prepare_store_range(1, 0, 3, true).unwrap(), Some((0, 0)));
    m.set_request_keys(1, &ks(&[3, 4]), 16).unwrap();
    assert_eq!(m.request_keys(1, 0, 10), ks(&[3, 4]));
    // Key 3 is stored, key 4 new: one stored, room for it without eviction.
    let out = m.prepare_store_range(1, 0, 2, true).unwrap();
    assert_eq!(out, Some((1, 0)));
    m.on_request_finished(1);
    m.check_invariants().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.num_stored(), 4);
}
