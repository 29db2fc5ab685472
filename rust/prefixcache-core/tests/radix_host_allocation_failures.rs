//! A radix tree with a host tier (and the host copies' values kept, `host_events`): every
//! allocation a call makes may fail, and none may abort the process. For each call of a
//! scenario under each write policy (inserts that back nodes up and split backed-up
//! nodes, evictions that demote, write back and delete host-only subtrees, matches and
//! inserts through host-only nodes, host evictions, load backs, taking the events), the
//! k-th allocation of the call is refused, for every k until the call makes no more. A
//! refused call returns `OutOfMemory` and leaves what the tree caches, on the device and
//! on the host, as it was (only access times may advance and a node on the path may be
//! split, as a match would); after it, the same call with memory does what it does on a
//! tree that never saw the failure. An eviction instead frees fewer tokens and returns
//! exactly those.
//!
//! Its own test binary, whose global allocator counts the allocations of the thread that
//! arms it and refuses one (`refusing_allocator`).

mod refusing_allocator;

use prefixcache_core::radix::EvictionPolicy;
use prefixcache_core::radix::{Namespace, NodeDump, RadixTree, WritePolicy};
use prefixcache_core::Error;
use refusing_allocator::{arm, disarm, paused};

#[derive(Clone, Debug)]
enum Op {
    Insert {
        key: Vec<u32>,
        values: bool,
    },
    Match(Vec<u32>),
    Evict(i64),
    EvictCount(i64),
    EvictHost(usize),
    /// Loads the host-only tail of the key's match back (the match itself with memory).
    LoadBack(Vec<u32>),
    TakeEvents,
}

/// Per token: the path up to it, its device value (None: host-only), whether its node
/// is backed up and its host copy's value. What the tree caches, whatever its node
/// boundaries.
type Content = (
    Vec<(Vec<u32>, Option<i64>, bool, Option<i64>)>,
    usize,
    usize,
);

fn content(t: &RadixTree) -> Content {
    let dump = t.dump();
    let host = t.host_dump();
    let host_values = paused(|| t.host_values_dump()).expect("host values");
    let mut out = Vec::new();
    let mut path: Vec<(usize, usize)> = Vec::new();
    let mut tokens: Vec<u32> = Vec::new();
    for (
        (
            NodeDump {
                depth, key, value, ..
            },
            (backed, evicted),
        ),
        hv,
    ) in dump.into_iter().zip(host).zip(host_values)
    {
        while path.last().is_some_and(|&(d, _)| d >= depth) {
            path.pop();
        }
        tokens.truncate(path.last().map_or(0, |&(_, n)| n));
        for (i, &tok) in key.iter().enumerate() {
            tokens.push(tok);
            let device = (!evicted).then(|| value[i]);
            out.push((tokens.clone(), device, backed, hv.get(i).copied()));
        }
        path.push((depth, tokens.len()));
    }
    out.sort();
    (out, t.host_size(), t.evictable_size())
}

#[derive(Debug, PartialEq)]
enum Outcome {
    Len(usize),
    Freed(Vec<i64>),
    Count(usize),
    Events(Vec<i64>, Vec<i64>),
}

fn run(t: &mut RadixTree, op: &Op) -> Result<Outcome, Error> {
    let ns = Namespace::default();
    match op {
        Op::Insert { key, values } => {
            let v: Option<Vec<i64>> =
                values.then(|| paused(|| key.iter().map(|&k| i64::from(k) * 10 + 1).collect()));
            t.insert(key, v.as_deref(), &ns, 0, 0)
                .map(|o| Outcome::Len(o.prefix_len))
        }
        Op::Match(key) => t
            .match_prefix(key, &ns)
            .map(|m| Outcome::Len(m.length + m.host_length)),
        Op::Evict(n) => t.evict(*n).map(Outcome::Freed),
        Op::EvictCount(n) => t.evict_count(*n).map(Outcome::Count),
        Op::EvictHost(n) => Ok(Outcome::Count(t.evict_host(*n))),
        Op::LoadBack(key) => {
            let node = paused(|| t.match_prefix(key, &ns).map(|m| m.host_node))?;
            t.load_back(node, None).map(Outcome::Count)
        }
        Op::TakeEvents => t
            .take_host_events(false)
            .map(|(s, d)| Outcome::Events(s, d)),
    }
}

fn scenario() -> Vec<Op> {
    let ins = |key: Vec<u32>, values: bool| Op::Insert { key, values };
    let system: Vec<u32> = (0..24).collect();
    let with = |tail: &[u32]| -> Vec<u32> {
        let mut k = system.clone();
        k.extend_from_slice(tail);
        k
    };
    let mut ops = vec![ins(system.clone(), true)];
    for i in 0..6u32 {
        ops.push(ins(with(&[100 + i, 7, 8, 9]), i % 2 == 0));
    }
    ops.extend([
        // A second hit backs the path up under write_through_selective.
        ins(with(&[100, 7, 8, 9]), true),
        ins(with(&[101, 7]), false),
        Op::TakeEvents,
        // A backed-up node split by a match, then by an insert.
        Op::Match(system[..10].to_vec()),
        ins(system[..5].iter().copied().chain([77, 78]).collect(), true),
        Op::Evict(6),
        Op::EvictCount(8),
        // Through host-only nodes: a match (splitting one), an insert over them.
        Op::Match(with(&[100, 7])),
        ins(with(&[102, 7, 8, 9, 10]), true),
        Op::Evict(1 << 30),
        Op::TakeEvents,
        Op::LoadBack(with(&[103, 7, 8, 9])),
        Op::EvictHost(5),
        ins(with(&[104, 7, 8, 9, 11, 12]), false),
        Op::EvictCount(1 << 30),
        Op::EvictHost(1 << 30),
        Op::TakeEvents,
        ins(with(&[1, 2, 3]), true),
    ]);
    ops
}

fn tree(policy: EvictionPolicy, write: WritePolicy, host: usize) -> RadixTree {
    let mut t = RadixTree::new(1, policy).expect("tree");
    t.set_host_tier(host, write).expect("host tier");
    t.set_host_events(true).expect("host events");
    t
}

fn fresh(policy: EvictionPolicy, write: WritePolicy, host: usize, ops: &[Op]) -> RadixTree {
    let mut t = tree(policy, write, host);
    for op in ops {
        run(&mut t, op).expect("scenario call with memory");
    }
    t
}

fn refuse_each_allocation_of_each_call(
    policy: EvictionPolicy,
    write: WritePolicy,
    host: usize,
    ops: &[Op],
) -> usize {
    let mut refusals = 0;
    for (j, op) in ops.iter().enumerate() {
        let mut clean = fresh(policy, write, host, &ops[..j]);
        let expected = run(&mut clean, op).expect("call with memory");
        let expected_content = content(&clean);
        for k in 0.. {
            let mut t = fresh(policy, write, host, &ops[..j]);
            let before = content(&t);
            arm(k);
            let got = run(&mut t, op);
            let refused = disarm();
            let at = format!("{policy:?}, {write:?}, call {j} ({op:?}), allocation {k}");
            t.check_invariants()
                .unwrap_or_else(|e| panic!("{at} refused: {e}"));
            if !refused {
                assert_eq!(got.as_ref().ok(), Some(&expected), "{at}");
                break;
            }
            refusals += 1;
            match got {
                Err(Error::OutOfMemory(_)) => {
                    assert_eq!(content(&t), before, "{at}");
                    let again = run(&mut t, op).expect("the call again, with memory");
                    assert_eq!(again, expected, "{at}: again");
                    assert_eq!(content(&t), expected_content, "{at}: again");
                }
                Ok(out) if out == expected => {
                    // An eviction that could not file a freed node's slot for reuse
                    // leaves the slot unused and goes on (an insert's too: its backups
                    // evict host leaves when short).
                    assert!(
                        matches!(
                            op,
                            Op::Evict(_) | Op::EvictCount(_) | Op::EvictHost(_) | Op::Insert { .. }
                        ),
                        "{at}"
                    );
                    assert_eq!(content(&t), expected_content, "{at}");
                }
                Ok(Outcome::Freed(freed)) => {
                    // An eviction that could not allocate what its next leaf needs stops
                    // there: what it returns is exactly what left the device.
                    let Outcome::Freed(all) = &expected else {
                        unreachable!()
                    };
                    assert!(freed.len() < all.len(), "{at}");
                    assert_eq!(freed[..], all[..freed.len()], "{at}");
                }
                Ok(Outcome::Count(n)) => {
                    let Outcome::Count(all) = &expected else {
                        unreachable!()
                    };
                    assert!(matches!(op, Op::EvictCount(_)) && n < *all, "{at}: {n}");
                }
                other => panic!("{at} refused: {other:?}"),
            }
        }
    }
    refusals
}

#[test]
fn no_refused_allocation_aborts_a_radix_call_with_a_host_tier() {
    // Every eviction policy: under some (lfu, slru) the hits an insert counts on its
    // path re-key a host-only leaf before the call can still fail.
    for policy in EvictionPolicy::ALL {
        for write in WritePolicy::ALL {
            // Host memory for everything, then for a few nodes only (backups evict host
            // leaves, or do not fit).
            for host in [1 << 20, 40] {
                let refusals =
                    refuse_each_allocation_of_each_call(policy, write, host, &scenario());
                assert!(
                    refusals >= 40,
                    "{policy:?}, {write:?}, host {host}: {refusals} refusals"
                );
            }
        }
    }
}

/// A call that brings host-only nodes back to the device lists them as device leaves:
/// when the evictable set is full, that needs room too (here the set holds 4 leaves in
/// room for 4, and the revived node's parent is the root, which is never listed).
#[test]
fn reviving_host_only_nodes_into_a_full_evictable_set_does_not_abort() {
    let ins = |key: Vec<u32>| Op::Insert { key, values: true };
    for revive in [ins(vec![9, 9]), Op::LoadBack(vec![9, 9])] {
        for policy in [EvictionPolicy::Lru, EvictionPolicy::Lfu] {
            for write in WritePolicy::ALL {
                // [9, 9] host-only under the root (backed up on its second hit, or on
                // eviction under write_back), then 4 device leaves.
                let mut ops = vec![ins(vec![9, 9]), ins(vec![9, 9]), Op::Evict(1 << 30)];
                ops.extend((1..=4).map(|i| ins(vec![i])));
                let t = fresh(policy, write, 1 << 10, &ops);
                assert_eq!((t.num_evictable_leaves(), t.num_host_only_nodes()), (4, 1));
                ops.push(revive.clone());
                refuse_each_allocation_of_each_call(policy, write, 1 << 10, &ops);
            }
        }
    }
}
