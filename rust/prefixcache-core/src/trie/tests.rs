//! Scenario tests of the trie and a random-operation test checking the invariants.

use proptest::prelude::*;

use super::*;
use crate::Error;

fn toks(r: std::ops::Range<u32>) -> Vec<u32> {
    r.collect()
}

fn params() -> ClaimParams<'static> {
    ClaimParams::default()
}

#[test]
fn full_blocks_are_reused_and_the_last_token_is_excluded() {
    let mut t = BlockTrie::new(16, 4, true, true).unwrap();
    let p = toks(0..9); // 8 usable tokens = 2 full blocks, 3 context blocks
    let c = t.claim(1, &p, &params()).unwrap();
    assert_eq!(c.block_ids.len(), 3);
    assert_eq!(c.num_matched_tokens, 0);
    assert_eq!(t.store(1, &p).unwrap(), 2);
    t.release(1).unwrap();
    t.check_invariants().unwrap();
    let c = t.claim(2, &p, &params()).unwrap();
    assert_eq!(c.num_matched_tokens, 8);
    assert_eq!(c.num_reused_blocks, 2);
    assert!(c.partial.is_none());
    t.check_invariants().unwrap();
}

#[test]
fn an_unreferenced_leaf_is_taken_over_and_a_referenced_one_copied() {
    let mut t = BlockTrie::new(16, 4, true, true).unwrap();
    let a = vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
    t.claim(1, &a, &params()).unwrap();
    t.store(1, &a).unwrap(); // [1..4] [5..8] [9]
                             // Shares 1..4 and 5,6: partial match of 2 tokens in block 2; block held by 1 -> copy.
    let b = vec![1, 2, 3, 4, 5, 6, 99, 98, 97];
    let c = t.claim(2, &b, &params()).unwrap();
    assert_eq!(c.num_matched_tokens, 6);
    let pr = c.partial.unwrap();
    assert_eq!(pr.kind, PartialKind::Copied);
    assert_eq!(c.copies.len(), 1);
    assert_eq!(c.copies[0].num_tokens, 2);
    t.check_invariants().unwrap();
    assert_eq!(t.complete(2).unwrap(), 1);
    t.release(2).unwrap();
    t.release(1).unwrap();
    t.check_invariants().unwrap();
    // Now block [9] (the non-full leaf) is unreferenced: the exact match takes it over.
    let c = t.claim(3, &a, &params()).unwrap();
    assert_eq!(c.num_matched_tokens, 9);
    assert_eq!(c.partial.unwrap().kind, PartialKind::TakenOver);
    assert!(c.copies.is_empty());
    let removed = t
        .take_events()
        .into_iter()
        .filter(|e| matches!(e, TrieEvent::Removed { .. }))
        .count();
    assert_eq!(removed, 1);
    t.check_invariants().unwrap();
}

#[test]
fn scopes_and_multimodal_keys_isolate_blocks() {
    let mut t = BlockTrie::new(32, 4, true, true).unwrap();
    let p = toks(0..13);
    t.claim(1, &p, &params()).unwrap();
    t.store(1, &p).unwrap();
    t.release(1).unwrap();
    let lora = ClaimParams {
        lora_id: Some(3),
        ..params()
    };
    assert_eq!(t.lookup(&p, &lora).unwrap().num_matched_tokens, 0);
    let salt = ClaimParams {
        cache_salt: Some("s"),
        ..params()
    };
    assert_eq!(t.lookup(&p, &salt).unwrap().num_matched_tokens, 0);
    let mm = [MmSpan {
        hash: vec![1; 32],
        start: 5,
        len: 2,
    }];
    let with_mm = ClaimParams {
        mm: &mm,
        ..params()
    };
    // Block 0 has no item: it matches; block 1 carries the item: no exact, no partial.
    assert_eq!(t.lookup(&p, &with_mm).unwrap().num_matched_tokens, 4);
    assert_eq!(t.lookup(&p, &params()).unwrap().num_matched_tokens, 12);
}

#[test]
fn eviction_is_lowest_priority_first_then_lru_and_retention_expires() {
    let mut t = BlockTrie::new(4, 2, false, false).unwrap();
    // Request 1: one block at priority 80 kept 5 ticks; request 2: one at 10.
    let hi = ClaimParams {
        priority: Some(80),
        retention: Some(5),
        ..params()
    };
    let c1 = t.claim(1, &[1, 2, 3], &hi).unwrap();
    let lo = ClaimParams {
        priority: Some(10),
        ..params()
    };
    let c2 = t.claim(2, &[4, 5, 6], &lo).unwrap();
    t.store(1, &[1, 2, 3]).unwrap();
    t.store(2, &[4, 5, 6]).unwrap();
    t.release(1).unwrap();
    t.release(2).unwrap();
    // Priority 10 first (request 2's blocks, tail first), then 80 (request 1's).
    let c = t.claim(3, &[9, 9, 9, 9, 9], &params()).unwrap();
    assert_eq!(
        c.block_ids,
        vec![c2.block_ids[1], c2.block_ids[0], c1.block_ids[1]]
    );
    t.release(3).unwrap();
    t.check_invariants().unwrap();
    // After the retention, c1's block is at priority 35 at the back of that queue.
    t.advance_clock(10);
    let d = t.dump().unwrap();
    assert_eq!(d[c1.block_ids[0] as usize].priority, DEFAULT_PRIORITY);
    t.check_invariants().unwrap();
}

#[test]
fn claim_fails_cleanly_when_out_of_blocks_or_given_bad_input() {
    let mut t = BlockTrie::new(2, 4, true, true).unwrap();
    let e = t.claim(1, &toks(0..20), &params()).unwrap_err();
    assert!(matches!(e, Error::OutOfBlocks { .. }));
    assert!(t.claim(1, &[], &params()).is_err());
    let bad = ClaimParams {
        priority: Some(101),
        ..params()
    };
    assert!(t.claim(1, &[1], &bad).is_err());
    assert!(matches!(t.release(9), Err(Error::UnknownRequest(_))));
    assert_eq!(t.num_free_blocks(), 2);
    assert_eq!(t.clock(), 0);
    t.check_invariants().unwrap();
}

#[test]
fn partial_match_scales_to_many_children() {
    let mut t = BlockTrie::new(4000, 4, true, true).unwrap();
    for i in 0..1000u32 {
        let p = vec![i / 100, i % 100, i, 7, 0];
        t.claim(u64::from(i), &p, &params()).unwrap();
        t.store(u64::from(i), &p).unwrap();
    }
    t.check_invariants().unwrap();
    let l = t.lookup(&[5, 55, 555, 1, 0], &params()).unwrap();
    assert_eq!(l.num_matched_tokens, 3);
    assert_eq!(l.partial.unwrap().kind, PartialKind::Copied);
}

#[derive(Debug, Clone)]
enum Op {
    Claim(u8, Vec<u32>, Option<u8>, u8),
    Store(u8, u8),
    Complete(u8),
    Release(u8),
    Tick(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..6, prop::collection::vec(0u32..3, 1..14), prop::option::of(prop_oneof![Just(10u8), Just(35u8), Just(80u8)]), 0u8..3)
            .prop_map(|(r, t, p, e)| Op::Claim(r, t, p, e)),
        3 => (0u8..6, 0u8..6).prop_map(|(r, n)| Op::Store(r, n)),
        1 => (0u8..6).prop_map(Op::Complete),
        3 => (0u8..6).prop_map(Op::Release),
        1 => (0u8..4).prop_map(Op::Tick),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn random_operations_keep_the_invariants(
        ops in prop::collection::vec(op(), 1..60),
        partial in any::<bool>(),
        copy in any::<bool>(),
    ) {
        let mut t = BlockTrie::new(12, 3, partial, copy).unwrap();
        let mut prompts: std::collections::HashMap<u8, Vec<u32>> = Default::default();
        for o in ops {
            match o {
                Op::Claim(r, tokens, pr, extra) => {
                    let p = ClaimParams { priority: pr, retention: Some(2), reserve_tokens: extra as usize, ..ClaimParams::default() };
                    if t.claim(u64::from(r), &tokens, &p).is_ok() {
                        prompts.insert(r, tokens);
                    }
                }
                Op::Store(r, n) => {
                    if let Some(p) = prompts.get_mut(&r) {
                        p.extend((0..n).map(|i| u32::from(i % 2)));
                        let _ = t.extend(u64::from(r), p.len());
                        let _ = t.store(u64::from(r), p);
                    }
                }
                Op::Complete(r) => { let _ = t.complete(u64::from(r)); }
                Op::Release(r) => {
                    if t.release(u64::from(r)).is_ok() { prompts.remove(&r); }
                }
                Op::Tick(n) => t.advance_clock(u64::from(n)),
            }
            prop_assert_eq!(t.check_invariants(), Ok(()));
        }
    }
}

#[test]
fn salts_and_multimodal_hashes_follow_what_is_cached_and_claimed() {
    let mut t = BlockTrie::new(8, 4, true, true).unwrap();
    let p = toks(0..9);
    for i in 0..200u64 {
        let salt = format!("salt{i}");
        let mm = [MmSpan {
            hash: i.to_le_bytes().to_vec(),
            start: 1,
            len: 2,
        }];
        let params = ClaimParams {
            cache_salt: Some(&salt),
            mm: &mm,
            ..ClaimParams::default()
        };
        t.lookup(&p, &params).unwrap();
        t.claim(i, &p, &params).unwrap();
        t.store(i, &p).unwrap();
        t.release(i).unwrap();
        t.check_invariants().unwrap();
        let (salts, mms) = t.num_interned();
        // At most 8 blocks are cached: at most 8 salts and hashes are held.
        assert!(salts <= 8 && mms <= 8, "{salts} salts, {mms} hashes");
    }
    // Claimed but not stored: the request alone holds them.
    let mm = [MmSpan {
        hash: vec![7; 32],
        start: 0,
        len: 8,
    }];
    let params = ClaimParams {
        cache_salt: Some("held"),
        mm: &mm,
        ..ClaimParams::default()
    };
    let mut t = BlockTrie::new(8, 4, true, true).unwrap();
    t.claim(1, &p, &params).unwrap();
    assert_eq!(t.num_interned(), (1, 1));
    t.check_invariants().unwrap();
    t.release(1).unwrap();
    assert_eq!(t.num_interned(), (0, 0));
    // Ids dropped and reused: a new claim with a new salt matches nothing of the old.
    t.claim(2, &p, &params).unwrap();
    t.store(2, &p).unwrap();
    t.release(2).unwrap();
    let other = ClaimParams {
        cache_salt: Some("other"),
        ..ClaimParams::default()
    };
    assert_eq!(t.lookup(&p, &other).unwrap().num_matched_tokens, 0);
    assert_eq!(t.lookup(&p, &params).unwrap().num_matched_tokens, 8);
    t.check_invariants().unwrap();
}

// ----- the host tier ---------------------------------------------------------------------

fn moved(events: &[TrieEvent]) -> Vec<(u32, Medium)> {
    events
        .iter()
        .filter_map(|e| match e {
            TrieEvent::Moved {
                block_ids, medium, ..
            } => Some((block_ids[0], *medium)),
            _ => None,
        })
        .collect()
}

fn removed(events: &[TrieEvent]) -> Vec<u32> {
    events
        .iter()
        .filter_map(|e| match e {
            TrieEvent::Removed { block_ids, .. } => Some(block_ids[0]),
            _ => None,
        })
        .collect()
}

/// Claims, stores and releases `tokens` as request `rid`.
fn cache(t: &mut BlockTrie, rid: u64, tokens: &[u32], p: &ClaimParams<'_>) -> ClaimOutcome {
    let c = t.claim(rid, tokens, p).unwrap();
    t.complete(rid).unwrap();
    t.store(rid, tokens).unwrap();
    t.release(rid).unwrap();
    t.check_invariants().unwrap();
    c
}

#[test]
fn a_gpu_victim_is_offloaded_and_a_match_onboards_it() {
    // 2 GPU blocks (ids 0, 1) and 4 host blocks (ids 2..6) of 2 tokens.
    let mut t = BlockTrie::with_host_tier(2, 2, true, true, 4, 30).unwrap();
    assert_eq!((t.num_blocks(), t.host_blocks()), (2, 4));
    assert_eq!(
        t.host_dump().unwrap(),
        vec![false, false, true, true, true, true]
    );
    cache(&mut t, 1, &[1, 2, 3], &params()); // [1, 2] cached in block 0
    t.take_events();
    // The next claim needs both GPU blocks: block 0 (priority 35 >= 30) goes to host
    // memory and host block 2 takes its place on the GPU.
    let c = cache(&mut t, 2, &[7, 8, 9], &params());
    assert_eq!(c.block_ids, vec![1, 2]);
    let ev = t.take_events();
    assert_eq!(moved(&ev), vec![(0, Medium::Cpu)]);
    assert!(removed(&ev).is_empty());
    assert_eq!(
        t.host_dump().unwrap(),
        vec![true, false, false, true, true, true]
    );
    assert_eq!((t.num_cached_blocks(), t.num_host_cached_blocks()), (1, 1));
    let hs = t.host_stats();
    assert_eq!((hs.offloaded_blocks, hs.stored_tokens), (1, 2));
    // A lookup sees the host block; the claim onboards it into GPU block 2 (uncached,
    // the least recently released), which becomes a host block; the fresh second block
    // is block 1, whose cached [7, 8] is offloaded in turn into host block 3.
    let l = t.lookup(&[1, 2, 3], &params()).unwrap();
    assert_eq!(
        (l.num_matched_tokens, l.num_host_blocks, l.num_host_tokens),
        (2, 1, 2)
    );
    let c = t.claim(3, &[1, 2, 3], &params()).unwrap();
    assert_eq!(c.block_ids, vec![0, 3]);
    assert_eq!((c.num_host_blocks, c.num_host_tokens), (1, 2));
    let ev = t.take_events();
    assert_eq!(moved(&ev), vec![(0, Medium::Gpu), (1, Medium::Cpu)]);
    assert_eq!(
        t.host_dump().unwrap(),
        vec![false, true, true, false, true, true]
    );
    let hs = t.host_stats();
    assert_eq!((hs.onboarded_blocks, hs.loaded_tokens), (1, 2));
    assert_eq!((hs.offloaded_blocks, hs.peak_host_tokens), (2, 2));
    t.check_invariants().unwrap();
    t.release(3).unwrap();
    assert_eq!(t.stats().evicted_blocks, 0);
    t.check_invariants().unwrap();
}

#[test]
fn a_minimum_priority_above_the_blocks_disables_offload() {
    let mut t = BlockTrie::with_host_tier(2, 2, true, true, 4, 50).unwrap();
    cache(&mut t, 1, &[1, 2, 3], &params());
    t.take_events();
    cache(&mut t, 2, &[7, 8, 9], &params());
    let ev = t.take_events();
    assert!(moved(&ev).is_empty());
    assert_eq!(removed(&ev), vec![0]);
    assert_eq!(t.stats().evicted_blocks, 1);
    assert_eq!(t.host_stats(), TrieHostStats::default());
    assert_eq!(
        t.lookup(&[1, 2, 3], &params()).unwrap().num_matched_tokens,
        0
    );
    // At priority 50 the blocks are offloaded again.
    let hi = ClaimParams {
        priority: Some(50),
        ..params()
    };
    cache(&mut t, 3, &[1, 2, 3], &hi);
    cache(&mut t, 4, &[5, 6, 7], &params());
    let l = t.lookup(&[1, 2, 3], &params()).unwrap();
    assert_eq!((l.num_matched_tokens, l.num_host_tokens), (2, 2));
}

#[test]
fn the_host_pool_evicts_its_lru_block_and_a_victim_below_the_minimum_takes_its_host_subtree() {
    // 3 GPU blocks and 1 host block.
    let mut t = BlockTrie::with_host_tier(3, 2, true, true, 1, 30).unwrap();
    let lo = ClaimParams {
        priority: Some(10),
        ..params()
    };
    // [1, 2] at priority 10; then [1, 2][3, 4] reuses it (keeping 10) and adds [3, 4] at 35.
    let a = cache(&mut t, 1, &[1, 2, 3], &lo).block_ids[0];
    let b = cache(&mut t, 2, &[1, 2, 3, 4, 5], &params()).block_ids[1];
    t.take_events();
    // Three fresh blocks: the victims are the uncached third block, then `a`? No: `a`
    // has a GPU child; the order is (priority, seq): `b` (35) is offloaded only after the
    // uncached blocks, and `a` (10) goes once its child left the GPU.
    let c = cache(&mut t, 3, &[9, 9, 9, 9, 9], &params());
    assert_eq!(c.block_ids.len(), 3);
    let ev = t.take_events();
    assert_eq!(moved(&ev), vec![(b, Medium::Cpu)]);
    // `a` (priority 10) was evicted without offload, and its host child `b` with it,
    // child first.
    assert_eq!(&removed(&ev)[..2], &[b, a]);
    let hs = t.host_stats();
    assert_eq!((hs.host_evicted_blocks, hs.host_evicted_tokens), (1, 2));
    assert_eq!(t.num_host_cached_blocks(), 0);
    t.check_invariants().unwrap();
    // With one host block, a second offload pushes the first out of host memory.
    let mut t = BlockTrie::with_host_tier(2, 2, true, true, 1, 30).unwrap();
    cache(&mut t, 1, &[1, 2, 0], &params());
    cache(&mut t, 2, &[3, 4, 0], &params()); // [1, 2] offloaded
    t.take_events();
    cache(&mut t, 3, &[5, 6, 0], &params()); // [3, 4] offloaded, [1, 2] leaves host memory
    let ev = t.take_events();
    assert_eq!(removed(&ev).len(), 1);
    assert_eq!(t.host_stats().host_evicted_blocks, 1);
    assert_eq!(
        t.lookup(&[1, 2, 0], &params()).unwrap().num_matched_tokens,
        0
    );
    assert_eq!(t.lookup(&[3, 4, 0], &params()).unwrap().num_host_tokens, 2);
}

#[test]
fn a_partial_match_copies_from_a_host_block() {
    let mut t = BlockTrie::with_host_tier(3, 2, true, true, 4, 30).unwrap();
    cache(&mut t, 1, &[1, 2, 3, 4, 5], &params()); // [1, 2] [3, 4] + one uncached
    cache(&mut t, 2, &[7, 7, 7, 7, 7], &params()); // both offloaded
    assert_eq!(t.num_host_cached_blocks(), 2);
    // [1, 9]: a partial match of 1 token of [1, 2], which has a child: copied from host.
    let c = t.claim(3, &[1, 9, 9], &params()).unwrap();
    assert_eq!(c.partial.unwrap().kind, PartialKind::Copied);
    assert_eq!((c.num_host_blocks, c.num_host_tokens), (1, 1));
    let src = c.copies[0].src;
    assert!(t.host_dump().unwrap()[src as usize]);
    t.check_invariants().unwrap();
    t.complete(3).unwrap();
    t.release(3).unwrap();
    t.check_invariants().unwrap();
    assert_eq!(t.host_stats().loaded_tokens, 1);
    // An exact match of the host chain onboards both, in order.
    let c = t.claim(4, &[1, 2, 3, 4, 5], &params()).unwrap();
    assert_eq!((c.num_host_blocks, c.num_host_tokens), (2, 4));
    assert!(c
        .block_ids
        .iter()
        .all(|&b| !t.host_dump().unwrap()[b as usize]));
    t.check_invariants().unwrap();
}

#[test]
fn host_tier_arguments_are_checked() {
    assert!(BlockTrie::with_host_tier(4, 2, true, true, 4, 101).is_err());
    assert!(BlockTrie::with_host_tier(4, 2, true, true, u32::MAX as usize, 30).is_err());
    let t = BlockTrie::with_host_tier(4, 2, true, true, 0, 30).unwrap();
    assert_eq!(t.host_blocks(), 0);
    assert_eq!(t.dump().unwrap().len(), 4);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn random_operations_with_a_host_tier_keep_the_invariants(
        ops in prop::collection::vec(op(), 1..60),
        partial in any::<bool>(),
        copy in any::<bool>(),
        host in 0usize..5,
        min_priority in prop_oneof![Just(0u8), Just(30u8), Just(50u8)],
    ) {
        let mut t = BlockTrie::with_host_tier(8, 3, partial, copy, host, min_priority).unwrap();
        let mut prompts: std::collections::HashMap<u8, Vec<u32>> = Default::default();
        for o in ops {
            match o {
                Op::Claim(r, tokens, pr, extra) => {
                    let p = ClaimParams { priority: pr, retention: Some(2), reserve_tokens: extra as usize, ..ClaimParams::default() };
                    let before = t.lookup(&tokens, &p);
                    if let Ok(c) = t.claim(u64::from(r), &tokens, &p) {
                        let l = before.unwrap();
                        prop_assert_eq!((l.num_matched_tokens, l.num_host_tokens), (c.num_matched_tokens, c.num_host_tokens));
                        prompts.insert(r, tokens);
                    }
                }
                Op::Store(r, n) => {
                    if let Some(p) = prompts.get_mut(&r) {
                        p.extend((0..n).map(|i| u32::from(i % 2)));
                        let _ = t.extend(u64::from(r), p.len());
                        let _ = t.store(u64::from(r), p);
                    }
                }
                Op::Complete(r) => { let _ = t.complete(u64::from(r)); }
                Op::Release(r) => {
                    if t.release(u64::from(r)).is_ok() { prompts.remove(&r); }
                }
                Op::Tick(n) => t.advance_clock(u64::from(n)),
            }
            prop_assert_eq!(t.check_invariants(), Ok(()));
            if host == 0 {
                prop_assert!(moved(&t.take_events()).is_empty());
            }
        }
    }
}
