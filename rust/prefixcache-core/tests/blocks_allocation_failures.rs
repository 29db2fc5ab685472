//! Every allocation a block-pool call makes may fail, and none may abort the process: for
//! each call of a scenario (admissions that hit and miss, outputs that fill blocks,
//! decode steps, frees, preemptions, evictions, with KV events on), the k-th allocation of
//! the call is refused, for every k until the call makes no more. A refused call returns
//! `OutOfMemory` and leaves the manager as it was (requests, blocks, free queue, cached
//! hashes, events, counters; for `extend`, whose items apply in turn, the items before
//! the failing one stay applied); after it, the same call with memory does what it does
//! on a manager that never saw the failure.
//!
//! Its own test binary, whose global allocator counts the allocations of the thread that
//! arms it and refuses one (`refusing_allocator`).

mod refusing_allocator;

use prefixcache_core::blocks::{KVCacheManager, RequestOptions};
use prefixcache_core::events::KvEvent;
use prefixcache_core::hash::{BlockHasher, HashAlgo};
use prefixcache_core::Error;
use refusing_allocator::{arm, disarm};

#[derive(Clone, Debug)]
enum Op {
    Admit(u64, Vec<u32>),
    Finish(u64, Vec<u32>),
    Extend(Vec<(u64, usize)>, Vec<u32>),
    Free(u64),
    Preempt(u64),
    EvictBlocks(Vec<u32>),
    TakeEvents,
}

/// What a call returned, comparable across managers.
#[derive(Debug, PartialEq)]
enum Outcome {
    Admitted(Option<(usize, Vec<u32>)>),
    Finished(bool),
    Extended(Vec<u64>, usize),
    Done,
    Events(Vec<KvEvent>),
}

const IDS: u64 = 8;

/// Everything a caller can observe of a manager (events by a copy, which takes them).
fn state(m: &KVCacheManager) -> String {
    let pool = m.pool();
    let blocks: Vec<_> = (0..pool.num_blocks() as u32)
        .map(|b| (pool.ref_cnt(b).ok(), pool.block_key(b).ok().flatten()))
        .collect();
    let requests: Vec<_> = (0..IDS)
        .map(|id| {
            (
                m.block_ids(id).ok().map(<[u32]>::to_vec),
                m.num_tokens(id).ok(),
                m.num_computed_tokens(id).ok(),
            )
        })
        .collect();
    let events = m.clone().take_events().expect("events");
    format!(
        "{:?} {blocks:?} {requests:?} {:?} {events:?} {} {} {}",
        pool.free_block_ids().expect("free ids"),
        m.stats(),
        pool.num_evicted_blocks(),
        pool.num_cached_blocks(),
        m.num_requests()
    )
}

fn run(m: &mut KVCacheManager, op: &Op) -> Result<Outcome, Error> {
    match op {
        Op::Admit(id, prompt) => m
            .admit(*id, prompt, RequestOptions::default(), 4)
            .map(|a| Outcome::Admitted(a.map(|a| (a.num_hit_tokens, a.block_ids)))),
        Op::Finish(id, out) => m.finish(*id, out).map(Outcome::Finished),
        Op::Extend(items, tokens) => m
            .extend(items, tokens)
            .map(|(e, n)| Outcome::Extended(e, n)),
        Op::Free(id) => m.free(*id).map(|()| Outcome::Done),
        Op::Preempt(id) => m.preempt(*id).map(|()| Outcome::Done),
        Op::EvictBlocks(ids) => m.evict_blocks(ids).map(|()| Outcome::Done),
        Op::TakeEvents => m.take_events().map(Outcome::Events),
    }
}

fn scenario() -> Vec<Op> {
    let system: Vec<u32> = (0..40).collect();
    let prompt = |tail: u32, n: u32| -> Vec<u32> {
        let mut p = system.clone();
        p.extend((0..n).map(|j| tail * 1000 + j));
        p
    };
    vec![
        Op::Admit(0, prompt(1, 9)),
        Op::Admit(1, prompt(2, 20)),
        Op::Extend(vec![(0, 3), (1, 5)], (500..508).collect()),
        Op::Finish(0, (600..612).collect()),
        Op::TakeEvents,
        Op::Admit(2, prompt(1, 9)),
        Op::Preempt(1),
        Op::Admit(3, prompt(3, 30)),
        Op::EvictBlocks(vec![3, 4, 5]),
        Op::Finish(2, (700..720).collect()),
        Op::Free(1),
        Op::Admit(7, prompt(2, 20)),
        Op::Free(3),
        Op::Admit(4, prompt(4, 60)),
        Op::Admit(5, prompt(1, 25)),
        Op::Finish(7, (800..830).collect()),
        Op::Finish(4, vec![1, 2, 3]),
        Op::TakeEvents,
        Op::Admit(6, (0..100).collect()),
        Op::Finish(5, (900..905).collect()),
        Op::Free(6),
    ]
}

/// A full request table (56 requests fill its 64 buckets), where taking an entry out and
/// putting it back needs a new table; a removal run after the events were taken.
fn full_table(which: usize) -> Vec<Op> {
    let mut ops: Vec<Op> = (0..56u64)
        .map(|id| Op::Admit(id, vec![id as u32, 1, 2]))
        .collect();
    // Each first call below meets the full table.
    match which {
        0 => ops.push(Op::Extend(vec![(2, 2)], vec![9, 9])),
        1 => ops.push(Op::Finish(3, vec![1, 2, 3, 4, 5, 6])),
        _ => ops.extend([
            Op::Preempt(0),
            Op::TakeEvents,
            Op::EvictBlocks(vec![1, 2, 3, 4]),
        ]),
    }
    ops
}

/// A sliding window of 8 tokens (2 blocks): each step past it releases the blocks it
/// leaves behind, also when the pool then turns out short.
fn window() -> Vec<Op> {
    vec![
        Op::Admit(0, (0..22).collect()),
        Op::Extend(vec![(0, 3)], vec![50, 51, 52]),
        Op::Admit(1, (0..30).collect()),
        Op::Extend(vec![(0, 9), (1, 2)], (60..71).collect()),
        Op::Finish(1, (80..86).collect()),
        Op::TakeEvents,
        Op::Preempt(0),
        Op::Admit(2, (100..140).collect()),
        Op::Free(2),
    ]
}

fn fresh_with(num_blocks: usize, window: Option<usize>, ops: &[Op]) -> KVCacheManager {
    let hasher = BlockHasher::new(HashAlgo::Sha256, 4, "seed").expect("hasher");
    let mut m = KVCacheManager::new(num_blocks, hasher, true, window, true).expect("manager");
    for op in ops {
        run(&mut m, op).expect("scenario call with memory");
    }
    m
}

#[test]
fn no_refused_allocation_aborts_a_block_pool_call() {
    refuse_each_allocation_of_each_call(48, &scenario(), 120);
}

#[test]
fn no_refused_allocation_aborts_a_block_pool_call_on_a_full_table() {
    for which in 0..3 {
        refuse_each_allocation_of_each_call(160, &full_table(which), 1);
    }
}

/// Refuses each allocation of each call of `ops` on a manager of `num_blocks` blocks in
/// turn; `least`: how many refusals the scenario must see (its calls do allocate).
fn refuse_each_allocation_of_each_call(num_blocks: usize, ops: &[Op], least: usize) {
    refuse_each_allocation_with(num_blocks, None, ops, least);
}

#[test]
fn no_refused_allocation_aborts_a_block_pool_call_with_a_sliding_window() {
    refuse_each_allocation_with(24, Some(8), &window(), 20);
}

fn refuse_each_allocation_with(num_blocks: usize, window: Option<usize>, ops: &[Op], least: usize) {
    let mut refusals = 0;
    for (j, op) in ops.iter().enumerate() {
        let mut clean = fresh_with(num_blocks, window, &ops[..j]);
        let expected = run(&mut clean, op).expect("call with memory");
        let expected_state = state(&clean);
        for k in 0.. {
            let mut m = fresh_with(num_blocks, window, &ops[..j]);
            let before = state(&m);
            arm(k);
            let got = run(&mut m, op);
            let refused = disarm();
            m.check_invariants()
                .unwrap_or_else(|e| panic!("call {j} ({op:?}), allocation {k} refused: {e}"));
            if !refused {
                assert_eq!(got.as_ref().ok(), Some(&expected), "call {j}");
                assert_eq!(state(&m), expected_state, "call {j}");
                break;
            }
            refusals += 1;
            match got {
                Err(Error::OutOfMemory(_)) if matches!(op, Op::Extend(..)) => {
                    // Items apply in turn: the one that failed changed nothing, those
                    // before it stay applied. The rest of the call, with memory, ends
                    // where the whole call does.
                    let Op::Extend(items, tokens) = op else {
                        unreachable!()
                    };
                    let now = state(&m);
                    let after = |p: usize| {
                        let mut part = fresh_with(num_blocks, window, &ops[..j]);
                        let n: usize = items[..p].iter().map(|i| i.1).sum();
                        part.extend(&items[..p], &tokens[..n]).expect("with memory");
                        state(&part)
                    };
                    let applied = (0..items.len())
                        .find(|&p| {
                            if p == 0 {
                                now == before
                            } else {
                                after(p) == now
                            }
                        })
                        .unwrap_or_else(|| panic!("call {j}, allocation {k}: {now}"));
                    let n: usize = items[..applied].iter().map(|i| i.1).sum();
                    m.extend(&items[applied..], &tokens[n..])
                        .expect("the rest, with memory");
                    assert_eq!(state(&m), expected_state, "call {j} after refusal {k}");
                }
                Err(Error::OutOfMemory(_)) => {
                    assert_eq!(state(&m), before, "call {j} ({op:?}), allocation {k}");
                    let again = run(&mut m, op).expect("the call again, with memory");
                    assert_eq!(again, expected, "call {j} ({op:?}) after refusal {k}");
                    assert_eq!(state(&m), expected_state, "call {j} after refusal {k}");
                }
                other => panic!("call {j} ({op:?}), allocation {k} refused: {other:?}"),
            }
        }
    }
    assert!(refusals >= least, "{refusals} refusals");
}
