//! Every allocation a radix call makes may fail, and none may abort the process: for each
//! call of a scenario (inserts that split nodes and fill child tables past their inline
//! forms, namespaces, priorities, pages, matches that split, locks, evictions), the k-th
//! allocation of the call is refused, for every k until the call makes no more. A refused
//! call returns `OutOfMemory` and leaves what the tree caches as it was (only access times
//! may advance and a node on the path may be split, as a match would); after it, the same
//! call with memory does what it does on a tree that never saw the failure. An eviction
//! instead frees fewer tokens and returns exactly those (its list of freed indices could
//! not grow), or does all it should (a freed slot could not be filed for reuse).
//!
//! Its own test binary, whose global allocator counts the allocations of the thread that
//! arms it and refuses one (`refusing_allocator`).

mod refusing_allocator;

use prefixcache_core::radix::{EvictionPolicy, Namespace, NodeDump, RadixTree};
use prefixcache_core::Error;
use refusing_allocator::{arm, disarm, paused};

#[derive(Clone, Debug)]
enum Op {
    Insert {
        key: Vec<u32>,
        values: bool,
        ns: Namespace,
        priority: i64,
    },
    Match {
        key: Vec<u32>,
        ns: Namespace,
    },
    /// Locks the node of the key's match (the match itself with memory).
    Lock {
        key: Vec<u32>,
        ns: Namespace,
    },
    Unlock {
        key: Vec<u32>,
        ns: Namespace,
    },
    Evict(i64),
    EvictCount(i64),
}

/// Per cached token: its namespace, the path up to it, its value, its node's lock count,
/// priority and hits. What a tree caches, whatever its node boundaries.
type Content = Vec<(
    (Option<String>, Option<String>),
    Vec<u32>,
    i64,
    u64,
    i64,
    u64,
)>;

fn content(t: &RadixTree) -> Content {
    let mut out = Vec::new();
    let mut path: Vec<(usize, usize)> = Vec::new(); // (depth, tokens up to the node)
    let mut tokens: Vec<u32> = Vec::new();
    for NodeDump {
        depth,
        key,
        value,
        lock_ref,
        hit_count,
        priority,
        namespace,
        ..
    } in t.dump()
    {
        while path.last().is_some_and(|&(d, _)| d >= depth) {
            path.pop();
        }
        tokens.truncate(path.last().map_or(0, |&(_, n)| n));
        for (i, &tok) in key.iter().enumerate() {
            tokens.push(tok);
            out.push((
                (namespace.extra_key.clone(), namespace.cache_salt.clone()),
                tokens.clone(),
                value[i],
                lock_ref,
                priority,
                hit_count,
            ));
        }
        path.push((depth, tokens.len()));
    }
    out.sort();
    out
}

/// What a call returned, comparable across trees.
#[derive(Debug, PartialEq)]
enum Outcome {
    Len(usize),
    Freed(Vec<i64>),
    Count(usize),
    Lock(i64),
}

/// The KV indices an insert passes (made before the allocator is armed).
fn values_of(op: &Op) -> Option<Vec<i64>> {
    match op {
        Op::Insert {
            key, values: true, ..
        } => Some(key.iter().map(|&k| i64::from(k) * 10 + 1).collect()),
        _ => None,
    }
}

fn run(t: &mut RadixTree, op: &Op, values: Option<&[i64]>) -> Result<Outcome, Error> {
    match op {
        Op::Insert {
            key, ns, priority, ..
        } => t
            .insert(key, values, ns, *priority, 0)
            .map(|o| Outcome::Len(o.prefix_len)),
        Op::Match { key, ns } => t.match_prefix(key, ns).map(|m| Outcome::Len(m.length)),
        Op::Lock { key, ns } | Op::Unlock { key, ns } => {
            let node = paused(|| t.match_prefix(key, ns).map(|m| m.node))?;
            if matches!(op, Op::Lock { .. }) {
                t.inc_lock_ref(node).map(Outcome::Lock)
            } else {
                t.dec_lock_ref(node).map(Outcome::Lock)
            }
        }
        Op::Evict(n) => t.evict(*n).map(Outcome::Freed),
        Op::EvictCount(n) => t.evict_count(*n).map(Outcome::Count),
    }
}

fn scenario(page: usize) -> Vec<Op> {
    let none = Namespace::new(None, None);
    let tenant = Namespace::new(Some("tenant-a"), Some("salt"));
    let p = page as u32;
    let system: Vec<u32> = (0..24 * p).collect();
    let with = |tail: &[u32]| -> Vec<u32> {
        let mut k = system.clone();
        k.extend(tail.iter().flat_map(|&t| (0..p).map(move |j| t * 100 + j)));
        k
    };
    let mut ops = vec![Op::Insert {
        key: system.clone(),
        values: true,
        ns: none.clone(),
        priority: 0,
    }];
    // A chain of nodes, one page each, then one insert raising all their priorities.
    let chain = |n: u32| -> Vec<u32> { (0..n * p).map(|t| 50_000 + t).collect() };
    for n in 1..=10 {
        ops.push(Op::Insert {
            key: chain(n),
            values: n % 3 == 0,
            ns: none.clone(),
            priority: 0,
        });
    }
    ops.push(Op::Insert {
        key: chain(11),
        values: true,
        ns: none.clone(),
        priority: 7,
    });
    // Children of the system prompt's node: few, then inline, then a map.
    for i in 0..14u32 {
        ops.push(Op::Insert {
            key: with(&[1000 + i, 7, 8]),
            values: i % 2 == 0,
            ns: none.clone(),
            priority: if i % 5 == 3 { 4 } else { 0 },
        });
    }
    ops.extend([
        // A split by a match, then by an insert, in the middle of the system prompt.
        Op::Match {
            key: system[..10 * page].to_vec(),
            ns: none.clone(),
        },
        Op::Insert {
            key: system[..5 * page]
                .iter()
                .copied()
                .chain((0..p).map(|j| 77_000 + j))
                .collect(),
            values: true,
            ns: none.clone(),
            priority: -2,
        },
        Op::Lock {
            key: with(&[1003, 7]),
            ns: none.clone(),
        },
        // A new namespace, with priorities.
        Op::Insert {
            key: with(&[5, 6]),
            values: true,
            ns: tenant.clone(),
            priority: 9,
        },
        Op::Insert {
            key: with(&[5, 9, 9]),
            values: false,
            ns: tenant.clone(),
            priority: 3,
        },
        Op::Match {
            key: with(&[5, 6, 1]),
            ns: tenant.clone(),
        },
        Op::Evict(3 * page as i64),
        Op::EvictCount(5 * page as i64),
        Op::Unlock {
            key: with(&[1003, 7]),
            ns: none.clone(),
        },
        Op::Insert {
            key: with(&[1003, 7, 8, 9, 10]),
            values: true,
            ns: none.clone(),
            priority: 0,
        },
        Op::Evict(40 * page as i64),
        Op::Insert {
            key: with(&[1, 2, 3]),
            values: true,
            ns: tenant.clone(),
            priority: 0,
        },
        Op::Evict(1 << 40),
        Op::Insert {
            key: with(&[4]),
            values: true,
            ns: tenant.clone(),
            priority: 1,
        },
    ]);
    // Unlocks at every size of the evictable set, one of them with the set full.
    for i in 0..36u32 {
        let key = with(&[2000 + i]);
        ops.extend([
            Op::Lock {
                key: with(&[4]),
                ns: tenant.clone(),
            },
            Op::Insert {
                key,
                values: true,
                ns: none.clone(),
                priority: 0,
            },
            Op::Unlock {
                key: with(&[4]),
                ns: tenant.clone(),
            },
        ]);
    }
    ops
}

fn fresh(page: usize, ops: &[Op]) -> RadixTree {
    let mut t = RadixTree::new(page, EvictionPolicy::Lru).expect("tree");
    for op in ops {
        run(&mut t, op, values_of(op).as_deref()).expect("scenario call with memory");
    }
    t
}

/// Small scenarios at the capacity edges of the side tables: the priority table full
/// when an insert raises a path, and when it updates a priority already there; a new
/// namespace whose first node cannot be filed under a root with three children.
fn edges(which: usize) -> Vec<Op> {
    let none = Namespace::new(None, None);
    let ins = |key: &[u32], priority: i64, ns: &Namespace| Op::Insert {
        key: key.to_vec(),
        values: false,
        ns: ns.clone(),
        priority,
    };
    match which {
        // The root's priority and two more fill the table (3 of 4 buckets).
        0 => vec![
            ins(&[1], 0, &none),
            ins(&[1, 2], 0, &none),
            ins(&[1, 2, 3], 5, &none),
        ],
        1 => vec![
            ins(&[7], 1, &none),
            ins(&[7, 8], 1, &none),
            ins(&[7, 8], 5, &none),
        ],
        _ => vec![
            ins(&[1], 0, &none),
            ins(&[2], 0, &none),
            ins(&[3], 0, &none),
            ins(&[4], 0, &Namespace::new(Some("x"), None)),
            Op::Match {
                key: vec![1],
                ns: none,
            },
        ],
    }
}

/// Refuses each allocation of each call of `ops` in turn; `least`: how many refusals
/// the scenario must see (its calls do allocate).
fn refuse_each_allocation_of_each_call(page: usize, ops: &[Op], least: usize) {
    let mut refusals = 0;
    for (j, op) in ops.iter().enumerate() {
        let values = values_of(op);
        let values = values.as_deref();
        let mut clean = fresh(page, &ops[..j]);
        let expected = run(&mut clean, op, values).expect("call with memory");
        let expected_content = content(&clean);
        for k in 0.. {
            let mut t = fresh(page, &ops[..j]);
            let before = content(&t);
            arm(k);
            let got = run(&mut t, op, values);
            let refused = disarm();
            t.check_invariants()
                .unwrap_or_else(|e| panic!("call {j} ({op:?}), allocation {k} refused: {e}"));
            if !refused {
                assert_eq!(got.as_ref().ok(), Some(&expected), "call {j}");
                break;
            }
            refusals += 1;
            match got {
                Err(Error::OutOfMemory(_)) => {
                    assert_eq!(content(&t), before, "call {j} ({op:?}), allocation {k}");
                    // The namespaces too (`check_invariants` checks their tables).
                    assert_eq!(
                        t.num_namespaces(),
                        fresh(page, &ops[..j]).num_namespaces(),
                        "call {j} ({op:?}), allocation {k}"
                    );
                    let again = run(&mut t, op, values).expect("the call again, with memory");
                    assert_eq!(again, expected, "call {j} ({op:?}) after refusal {k}");
                    assert_eq!(content(&t), expected_content, "call {j} after refusal {k}");
                }
                Ok(out) if out == expected => {
                    // An eviction that could not file a freed node's slot for reuse
                    // leaves the slot unused and goes on.
                    assert!(matches!(op, Op::Evict(_) | Op::EvictCount(_)), "call {j}");
                    assert_eq!(content(&t), expected_content, "call {j}, allocation {k}");
                }
                Ok(Outcome::Freed(freed)) => {
                    // An eviction that could not grow its list stops early: what it
                    // returns is exactly what left the tree.
                    let Outcome::Freed(all) = &expected else {
                        unreachable!()
                    };
                    assert!(freed.len() < all.len(), "call {j}, allocation {k}");
                    assert_eq!(freed[..], all[..freed.len()], "call {j}, allocation {k}");
                    assert_eq!(
                        content(&t).len() + freed.len(),
                        before.len(),
                        "call {j}, allocation {k}"
                    );
                }
                other => panic!("call {j} ({op:?}), allocation {k} refused: {other:?}"),
            }
        }
    }
    // The scenario's calls allocate (new nodes, splits, child tables, namespaces,
    // priorities, freed lists): each of those allocations was refused once.
    assert!(refusals >= least, "{refusals} refusals");
}

#[test]
fn no_refused_allocation_aborts_a_radix_call_page_1() {
    refuse_each_allocation_of_each_call(1, &scenario(1), 50);
}

#[test]
fn no_refused_allocation_aborts_a_radix_call_page_4() {
    refuse_each_allocation_of_each_call(4, &scenario(4), 50);
}

#[test]
fn no_refused_allocation_aborts_a_radix_call_at_table_edges() {
    for which in 0..3 {
        refuse_each_allocation_of_each_call(1, &edges(which), 1);
    }
}
