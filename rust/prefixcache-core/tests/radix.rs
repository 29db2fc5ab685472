//! Radix tree: hand-checked cases and property tests (invariants after every operation).

use prefixcache_core::radix::{EvictionPolicy, Namespace, NodeRef, RadixTree};
use prefixcache_core::Error;
use proptest::prelude::*;

fn none() -> Namespace {
    Namespace::default()
}

fn tree(page: usize, policy: &str) -> RadixTree {
    RadixTree::new(page, policy.parse().unwrap()).unwrap()
}

#[test]
fn match_splits_and_returns_the_path() {
    let mut t = tree(1, "lru");
    let r = t
        .insert(&[1, 2, 3, 4], Some(&[10, 20, 30, 40]), &none(), 0, 0)
        .unwrap();
    assert_eq!(r.prefix_len, 0);
    let m = t.match_prefix(&[1, 2, 9], &none()).unwrap();
    assert_eq!(m.length, 2);
    assert_eq!(t.path_indices(m.node).unwrap(), vec![10, 20]);
    assert_eq!(t.num_nodes(), 2, "the match split the node");
    // the original handle keeps pointing at the full path
    assert_eq!(t.path_indices(r.node).unwrap(), vec![10, 20, 30, 40]);
    t.check_invariants().unwrap();
}

#[test]
fn insert_never_replaces_values() {
    let mut t = tree(1, "lru");
    t.insert(&[1, 2, 3], Some(&[7, 8, 9]), &none(), 0, 0)
        .unwrap();
    let r = t
        .insert(&[1, 2, 3, 4], Some(&[0, 0, 0, 5]), &none(), 0, 0)
        .unwrap();
    assert_eq!(r.prefix_len, 3);
    assert_eq!(t.path_indices(r.node).unwrap(), vec![7, 8, 9, 5]);
}

#[test]
fn page_alignment_truncates_and_splits_on_pages() {
    let mut t = tree(4, "lru");
    let r = t
        .insert(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], None, &none(), 0, 0)
        .unwrap();
    assert_eq!(t.total_size(), 8);
    assert_eq!(t.path_len(r.node).unwrap(), 8);
    let m = t.match_prefix(&[1, 2, 3, 4, 5, 6, 0, 8], &none()).unwrap();
    assert_eq!(m.length, 4, "a partial page does not match");
    let m = t.match_prefix(&[1, 2, 3], &none()).unwrap();
    assert_eq!((m.length, m.node), (0, t.root()));
    t.check_invariants().unwrap();
}

#[test]
fn whole_leaf_eviction_cascades_to_parents() {
    let mut t = tree(1, "lru");
    t.insert(&[1, 2, 3], Some(&[1, 2, 3]), &none(), 0, 0)
        .unwrap();
    t.insert(&[1, 2, 4, 5], Some(&[1, 2, 4, 5]), &none(), 0, 0)
        .unwrap();
    // [1,2] -> {[3], [4,5]}; the oldest leaf is [3]
    assert_eq!(t.evict(1).unwrap(), vec![3]);
    // then [4,5], then the parent [1,2] which became a leaf
    assert_eq!(t.evict(3).unwrap(), vec![4, 5, 1, 2]);
    assert_eq!(t.total_size(), 0);
    assert_eq!(t.num_nodes(), 0);
    t.check_invariants().unwrap();
}

#[test]
fn locks_move_sizes_and_refuse_underflow() {
    let mut t = tree(1, "lru");
    let r = t.insert(&[1, 2, 3], None, &none(), 0, 0).unwrap();
    let m = t.match_prefix(&[1, 2], &none()).unwrap();
    assert_eq!(t.inc_lock_ref(m.node).unwrap(), -2);
    assert_eq!((t.evictable_size(), t.protected_size()), (1, 2));
    assert_eq!(t.inc_lock_ref(r.node).unwrap(), -1);
    assert!(t.evict(10).unwrap().is_empty());
    assert_eq!(t.dec_lock_ref(r.node).unwrap(), 1);
    assert_eq!(t.dec_lock_ref(m.node).unwrap(), 2);
    let before = t.dump();
    assert!(matches!(t.dec_lock_ref(m.node), Err(Error::LockRef(_))));
    assert_eq!(t.dump(), before);
    assert_eq!(t.inc_lock_ref(t.root()).unwrap(), 0);
    t.check_invariants().unwrap();
}

#[test]
fn stale_handles_are_detected() {
    let mut t = tree(1, "lru");
    let r = t.insert(&[1, 2], None, &none(), 0, 0).unwrap();
    t.evict(2).unwrap();
    t.insert(&[5, 6], None, &none(), 0, 0).unwrap(); // reuses the slot
    assert!(matches!(t.path_indices(r.node), Err(Error::StaleHandle(_))));
    let r2 = t.insert(&[7], None, &none(), 0, 0).unwrap();
    t.reset();
    assert!(matches!(
        t.inc_lock_ref(r2.node),
        Err(Error::StaleHandle(_))
    ));
    let other = tree(1, "lru");
    assert!(matches!(
        other.node_info(t.root()),
        Err(Error::StaleHandle(_))
    ));
}

#[test]
fn namespaces_are_structured() {
    let mut t = tree(1, "lru");
    t.insert(
        &[1, 2, 3],
        None,
        &Namespace::new(Some("ab"), Some("c")),
        0,
        0,
    )
    .unwrap();
    assert_eq!(
        t.match_prefix(&[1, 2, 3], &Namespace::new(Some("a"), Some("bc")))
            .unwrap()
            .length,
        0
    );
    assert_eq!(
        t.match_prefix(&[1, 2, 3], &Namespace::new(Some("abc"), None))
            .unwrap()
            .length,
        0
    );
    assert_eq!(t.match_prefix(&[1, 2, 3], &none()).unwrap().length, 0);
    assert_eq!(
        t.match_prefix(&[1, 2, 3], &Namespace::new(Some("ab"), Some("c")))
            .unwrap()
            .length,
        3
    );
    // an empty salt is no salt
    t.insert(&[4], None, &Namespace::new(None, Some("")), 0, 0)
        .unwrap();
    assert_eq!(t.match_prefix(&[4], &none()).unwrap().length, 1);
    t.check_invariants().unwrap();
}

#[test]
fn lfu_and_priority_orders() {
    let mut t = tree(1, "lfu");
    t.insert(&[1], None, &none(), 0, 0).unwrap();
    t.insert(&[2], None, &none(), 0, 0).unwrap();
    t.insert(&[1], None, &none(), 0, 0).unwrap(); // hit_count of [1] becomes 1
    assert_eq!(t.evict(1).unwrap(), vec![2]);

    let mut t = tree(1, "priority");
    t.insert(&[1], None, &none(), 5, 0).unwrap();
    t.insert(&[2], None, &none(), 1, 0).unwrap();
    t.match_prefix(&[2], &none()).unwrap();
    assert_eq!(
        t.evict(1).unwrap(),
        vec![2],
        "lower priority goes first despite recency"
    );
}

#[test]
fn negative_evict_is_refused() {
    let mut t = tree(1, "lru");
    assert!(matches!(t.evict(-1), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        t.insert(&[1, 2], Some(&[1]), &none(), 0, 0),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(t.clock(), 0, "a refused insert does not advance the clock");
    assert!(RadixTree::new(0, EvictionPolicy::Lru).is_err());
    assert!("nope".parse::<EvictionPolicy>().is_err());
}

#[derive(Debug, Clone)]
enum Op {
    Insert {
        seq: usize,
        len: usize,
        ns: u8,
        prio: i64,
        inserted_len: usize,
    },
    Match {
        seq: usize,
        len: usize,
        ns: u8,
    },
    Lock(usize),
    Unlock(usize),
    Evict(i64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..6usize, 0..24usize, 0..3u8, 0..4i64, 0..12usize)
            .prop_map(|(seq, len, ns, prio, inserted_len)| Op::Insert { seq, len, ns, prio, inserted_len }),
        3 => (0..6usize, 0..24usize, 0..3u8).prop_map(|(seq, len, ns)| Op::Match { seq, len, ns }),
        2 => (0..64usize).prop_map(Op::Lock),
        2 => (0..64usize).prop_map(Op::Unlock),
        2 => (0..30i64).prop_map(Op::Evict),
    ]
}

/// Six token sequences sharing prefixes in various ways.
fn sequence(seq: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|i| match seq {
            0 => i as u32,
            1 => {
                if i < 8 {
                    i as u32
                } else {
                    100 + i as u32
                }
            }
            2 => {
                if i < 4 {
                    i as u32
                } else {
                    200 + i as u32
                }
            }
            3 => {
                if i < 12 {
                    i as u32
                } else {
                    300 + i as u32
                }
            }
            4 => 1000 + i as u32,
            _ => (i % 3) as u32,
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn invariants_hold_after_every_operation(
        page in prop_oneof![Just(1usize), Just(2), Just(4)],
        policy in 0..7usize,
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let mut t = RadixTree::new(page, EvictionPolicy::ALL[policy]).unwrap();
        let mut locked: Vec<NodeRef> = Vec::new();
        let mut next_value = 0i64;
        let mut cached: std::collections::BTreeSet<i64> = Default::default();
        let nss = [Namespace::default(), Namespace::new(Some("a"), None), Namespace::new(Some("a"), Some("s"))];
        for op in ops {
            match op {
                Op::Insert { seq, len, ns, prio, inserted_len } => {
                    let key = sequence(seq, len);
                    let values: Vec<i64> = (0..len as i64).map(|i| next_value + i).collect();
                    next_value += len as i64;
                    let before = t.total_size();
                    let r = t.insert(&key, Some(&values), &nss[ns as usize], prio, inserted_len).unwrap();
                    let aligned = len - len % page;
                    prop_assert_eq!(t.total_size() - before, aligned - r.prefix_len);
                    prop_assert_eq!(t.path_len(r.node).unwrap(), aligned);
                    for &v in &values[r.prefix_len..aligned] {
                        prop_assert!(cached.insert(v));
                    }
                }
                Op::Match { seq, len, ns } => {
                    let m = t.match_prefix(&sequence(seq, len), &nss[ns as usize]).unwrap();
                    prop_assert_eq!(m.length % page, 0);
                    prop_assert_eq!(t.path_indices(m.node).unwrap().len(), m.length);
                    if m.node != t.root() {
                        locked.push(m.node);
                        t.inc_lock_ref(m.node).unwrap();
                    }
                }
                Op::Lock(i) => {
                    if let Some(&n) = locked.get(i) {
                        if t.inc_lock_ref(n).is_ok() { locked.push(n); }
                    }
                }
                Op::Unlock(i) => {
                    if i < locked.len() {
                        let n = locked.swap_remove(i);
                        t.dec_lock_ref(n).unwrap();
                    }
                }
                Op::Evict(k) => {
                    let before = t.evictable_size();
                    let freed = t.evict(k).unwrap();
                    prop_assert!(freed.len() as i64 >= k.min(before as i64));
                    prop_assert_eq!(before - t.evictable_size(), freed.len());
                    for v in freed {
                        prop_assert!(cached.remove(&v), "freed an index that was not cached");
                    }
                }
            }
            if let Err(e) = t.check_invariants() {
                return Err(TestCaseError::fail(e));
            }
            let mut in_tree: Vec<i64> = t.dump().into_iter().flat_map(|d| d.value).collect();
            in_tree.sort_unstable();
            prop_assert_eq!(in_tree, cached.iter().copied().collect::<Vec<_>>());
        }
    }
}

#[test]
fn split_tail_and_new_leaf_share_a_timestamp_and_the_leaf_counts_as_later() {
    // insert [1,2,3] then [1,2,4]: the tail [3] and the new leaf [4] are both stamped by
    // the second call; SGLang stamps the leaf later (it reads its clock again).
    for (policy, first) in [
        ("lru", 3),
        ("mru", 4),
        ("fifo", 3),
        ("filo", 4),
        ("lfu", 3),
        ("slru", 3),
        ("priority", 3),
    ] {
        let mut t = tree(1, policy);
        t.insert(&[1, 2, 3], None, &none(), 0, 0).unwrap();
        t.insert(&[1, 2, 4], None, &none(), 0, 0).unwrap();
        assert_eq!(t.evict(1).unwrap(), vec![first], "policy {policy}");
    }
}

#[test]
fn namespaces_are_dropped_with_their_last_node_and_on_reset() {
    let mut t = tree(1, "lru");
    for i in 0..100u32 {
        let ns = Namespace::new(None, Some(&format!("salt{i}")));
        t.insert(&[i, i + 1], None, &ns, 0, 0).unwrap();
        t.match_prefix(&[i], &Namespace::new(Some("unseen"), None))
            .unwrap();
    }
    assert_eq!(t.num_namespaces(), 101, "100 salts and no namespace");
    t.evict(150).unwrap();
    assert!(t.num_namespaces() < 101);
    t.evict(1000).unwrap();
    assert_eq!(
        t.num_namespaces(),
        1,
        "every node evicted: only no namespace left"
    );
    t.check_invariants().unwrap();
    // An insert that creates no node keeps no namespace; a split keeps it alive.
    let ns = Namespace::new(Some("k"), None);
    t.insert(&[1, 2, 3], None, &ns, 0, 0).unwrap();
    t.insert(&[1, 2], None, &ns, 0, 0).unwrap();
    assert_eq!(t.num_namespaces(), 2);
    t.evict(1).unwrap(); // the lower half [3]
    assert_eq!(
        t.num_namespaces(),
        2,
        "the upper half [1, 2] is still in it"
    );
    // A recycled id does not alias the dropped namespace.
    t.evict(10).unwrap();
    assert_eq!(t.num_namespaces(), 1);
    let other = Namespace::new(Some("other"), None);
    t.insert(&[1, 2, 3], None, &other, 0, 0).unwrap();
    assert_eq!(t.match_prefix(&[1, 2, 3], &ns).unwrap().length, 0);
    assert_eq!(t.match_prefix(&[1, 2, 3], &other).unwrap().length, 3);
    t.reset();
    assert_eq!(t.num_namespaces(), 1);
    t.check_invariants().unwrap();
}

#[test]
fn unlocking_an_ancestor_locked_only_through_a_descendant_is_rejected() {
    let mut t = tree(1, "lru");
    let a = t.insert(&[1, 2], None, &none(), 0, 0).unwrap().node;
    let b = t.insert(&[1, 2, 3, 4], None, &none(), 0, 0).unwrap().node;
    t.inc_lock_ref(b).unwrap();
    let before = (t.evictable_size(), t.protected_size(), t.dump());
    assert!(matches!(t.dec_lock_ref(a), Err(Error::LockRef(_))));
    assert_eq!((t.evictable_size(), t.protected_size(), t.dump()), before);
    t.check_invariants().unwrap();
    // Its own lock on top of the descendant's: that one may be released.
    t.inc_lock_ref(a).unwrap();
    t.dec_lock_ref(a).unwrap();
    assert!(matches!(t.dec_lock_ref(a), Err(Error::LockRef(_))));
    t.dec_lock_ref(b).unwrap();
    assert_eq!(t.evict(100).unwrap().len(), 4);
    t.check_invariants().unwrap();
}
