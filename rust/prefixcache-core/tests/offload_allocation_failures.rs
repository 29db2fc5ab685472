//! Every allocation a CPU offloading tier call makes may fail, and none may abort the
//! process: for each call of a scenario (request keys and positions, lookups that load,
//! stores that evict, completions that succeed and fail, touches, finished requests,
//! events, a reset), under LRU, ARC and a store threshold, the k-th allocation of the
//! call is refused, for every k until the call makes no more. A refused call returns
//! `OutOfMemory` and leaves the tier as it was (chunks, policy order, tracker, request
//! contexts, events, counters); after it, the same call with memory does what it does
//! on a tier that never saw the failure.
//!
//! Its own test binary, whose global allocator counts the allocations of the thread that
//! arms it and refuses one (`refusing_allocator`).

mod refusing_allocator;

use prefixcache_core::hash::BlockHash;
use prefixcache_core::offload::{CachePolicy, CpuOffloadManager, OffloadEvent, PrepareStoreOutput};
use prefixcache_core::Error;
use refusing_allocator::{arm, disarm, paused};

#[derive(Clone, Debug)]
enum Op {
    NewRequest(u64),
    SetKeys(u64, Vec<u64>),
    SetPositions(u64, Vec<u64>, Vec<u64>),
    PrepareLoad(u64, Vec<u64>),
    PrepareLoadRange(u64, usize, usize),
    CompleteLoad(u64, Vec<u64>),
    CompleteLoadRange(u64, usize, usize),
    PrepareStore(u64, Vec<u64>),
    PrepareStoreRange(u64, usize, usize, bool),
    CompleteStore(u64, Vec<u64>, bool),
    Touch(u64, Vec<u64>),
    Finished(u64),
    TakeEvents,
    Reset,
}

fn key(x: u64) -> BlockHash {
    BlockHash::from_bytes(&x.to_le_bytes()).expect("8 bytes")
}

fn keys(xs: &[u64]) -> Vec<BlockHash> {
    xs.iter().map(|&x| key(x)).collect()
}

/// What a call returned (built without allocating: the allocator may be armed).
#[derive(Debug)]
#[allow(dead_code)] // Read through Debug only.
enum Got {
    Done,
    Ids(Vec<u64>),
    Count(usize),
    Range(Option<(usize, usize)>),
    Store(Option<PrepareStoreOutput>),
    Events(Vec<OffloadEvent>),
}

/// Runs `op`; what it returned as text (comparable across tiers).
fn run(m: &mut CpuOffloadManager, op: &Op) -> Result<String, Error> {
    // The keys are built before the call, with the allocator paused.
    let ks = paused(|| match op {
        Op::SetKeys(_, k)
        | Op::SetPositions(_, k, _)
        | Op::PrepareLoad(_, k)
        | Op::CompleteLoad(_, k)
        | Op::PrepareStore(_, k)
        | Op::CompleteStore(_, k, _)
        | Op::Touch(_, k) => keys(k),
        _ => Vec::new(),
    });
    let done = |()| Got::Done;
    let got = match op {
        Op::NewRequest(r) => m.on_new_request(*r).map(done),
        Op::SetKeys(r, _) => m.set_request_keys(*r, &ks, 16).map(done),
        Op::SetPositions(r, _, p) => m.set_offload_key_positions(*r, &ks, p).map(done),
        Op::PrepareLoad(r, _) => m.prepare_load(*r, &ks).map(Got::Ids),
        Op::PrepareLoadRange(r, a, b) => m.prepare_load_range(*r, *a, *b).map(Got::Count),
        Op::CompleteLoad(r, _) => m.complete_load(*r, &ks).map(done),
        Op::CompleteLoadRange(r, a, b) => m.complete_load_range(*r, *a, *b).map(done),
        Op::PrepareStore(r, _) => m.prepare_store(*r, &ks).map(Got::Store),
        Op::PrepareStoreRange(r, a, b, c) => m.prepare_store_range(*r, *a, *b, *c).map(Got::Range),
        Op::CompleteStore(r, _, ok) => m.complete_store(*r, &ks, *ok).map(done),
        Op::Touch(r, _) => {
            m.touch(*r, &ks);
            Ok(Got::Done)
        }
        Op::Finished(r) => m.on_request_finished(*r).map(done),
        Op::TakeEvents => m.take_events().map(Got::Events),
        Op::Reset => {
            m.reset_cache();
            Ok(Got::Done)
        }
    };
    paused(|| got.map(|g| format!("{g:?}")))
}

/// Two requests over a tier of 6 chunks: loads, stores that evict (one while a load
/// pins chunks), completions that succeed and fail, touches, finishes, a reset.
fn scenario() -> Vec<Op> {
    vec![
        Op::NewRequest(0),
        Op::SetKeys(0, vec![1, 2, 3, 4]),
        Op::PrepareStoreRange(0, 0, 4, true),
        Op::Finished(0),
        Op::NewRequest(1),
        Op::SetKeys(1, vec![1, 2, 3, 10, 11, 12]),
        Op::PrepareLoadRange(1, 0, 3),
        Op::PrepareStoreRange(1, 3, 6, false),
        Op::CompleteStore(1, vec![10, 11, 12], true),
        Op::PrepareLoadRange(1, 3, 6),
        Op::CompleteLoadRange(1, 0, 6),
        Op::Touch(1, vec![2, 10, 99]),
        Op::TakeEvents,
        Op::SetPositions(2, vec![20, 21], vec![16, 32]),
        Op::PrepareStore(2, vec![20, 21, 1]),
        Op::CompleteStore(2, vec![20, 21], false),
        Op::PrepareLoad(1, vec![1, 2]),
        Op::CompleteLoad(1, vec![1, 2]),
        Op::Finished(1),
        Op::PrepareStore(3, vec![30, 31, 32, 33]),
        Op::TakeEvents,
        Op::CompleteStore(3, vec![30, 31, 32, 33], true),
        Op::Finished(2),
        Op::SetKeys(4, vec![30, 31, 40, 41, 42]),
        Op::PrepareLoadRange(4, 0, 2),
        Op::PrepareStoreRange(4, 2, 5, true),
        Op::Finished(3),
        Op::TakeEvents,
        Op::Reset,
        Op::PrepareStoreRange(4, 0, 5, true),
        Op::Finished(4),
        // Accessed out of block order: the finish sorts the accesses by position.
        Op::SetKeys(5, vec![40, 41, 42, 43]),
        Op::PrepareStoreRange(5, 2, 4, true),
        Op::PrepareStoreRange(5, 0, 2, true),
        Op::Finished(5),
    ]
}

/// Offers counted by a tracker of 3 keys (store threshold 2): keys stored at their
/// second offer, the oldest tracked keys dropped for new ones.
fn offers() -> Vec<Op> {
    vec![
        Op::SetKeys(0, vec![1, 2, 3, 4]),
        Op::PrepareStoreRange(0, 0, 4, true),
        Op::PrepareStoreRange(0, 0, 4, true),
        Op::Finished(0),
        Op::SetKeys(1, vec![1, 2, 5, 6]),
        Op::PrepareStoreRange(1, 0, 4, true),
        Op::PrepareStore(2, vec![7, 8]),
        Op::PrepareStore(2, vec![7, 8, 5]),
        Op::CompleteStore(2, vec![7, 8, 5], true),
        Op::Finished(1),
        Op::Finished(2),
        Op::TakeEvents,
    ]
}

/// Five requests of four new keys each through 6 chunks: evictions past the ghost lists'
/// capacity (ARC trims them).
fn churn() -> Vec<Op> {
    (0..5u64)
        .flat_map(|r| {
            let keys = (0..4).map(|i| 10 * r + i + 1).collect();
            [
                Op::SetKeys(r, keys),
                Op::PrepareStoreRange(r, 0, 4, true),
                Op::Finished(r),
            ]
        })
        .chain([Op::TakeEvents])
        .collect()
}

/// A request table filled to where a new context needs a larger one (14 contexts fill a
/// table of 16 places, the last one added without growing it), then a call that meets
/// it full: a new request's store (0), load (1), key positions (2) or context (3, then
/// calls on a context taken out and put back).
fn full_table(which: usize) -> Vec<Op> {
    let mut ops = vec![
        Op::SetKeys(100, vec![113]),
        Op::PrepareStoreRange(100, 0, 1, true),
        Op::Finished(100),
    ];
    ops.extend((0..14u64).map(|r| Op::SetKeys(r, vec![200 + r])));
    match which {
        0 => ops.push(Op::PrepareStore(14, vec![300])),
        1 => ops.push(Op::PrepareLoad(14, vec![113])),
        2 => ops.push(Op::SetPositions(14, vec![400], vec![16])),
        _ => ops.extend([
            Op::PrepareStoreRange(3, 0, 1, true),
            Op::NewRequest(14),
            Op::SetKeys(15, vec![500, 501]),
            Op::Finished(5),
        ]),
    }
    ops
}

/// A tier's settings: chunks, policy, store threshold, tracker size, events.
#[derive(Clone, Copy, Debug)]
struct Tier(u64, CachePolicy, u32, usize, bool);

const LRU: Tier = Tier(6, CachePolicy::Lru, 1, 3, true);
const ARC: Tier = Tier(6, CachePolicy::Arc, 1, 3, true);

/// A tier of `t` after `ops` (those that fail with memory fail the same way each time).
fn fresh(t: Tier, ops: &[Op]) -> CpuOffloadManager {
    let Tier(chunks, policy, threshold, tracker, events) = t;
    let mut m = CpuOffloadManager::new(chunks, policy, threshold, tracker, events).expect("tier");
    for op in ops {
        let _ = run(&mut m, op);
    }
    // A copy: its lists have no room beyond what they hold, so every call below must
    // reserve what it uses.
    m.clone()
}

/// Refuses each allocation of each call of `ops` in turn; `least`: how many refusals
/// the scenario must see (its calls do allocate). Every call must succeed with memory.
fn refuse_each_allocation(t: Tier, ops: &[Op], least: usize) {
    for (j, op) in ops.iter().enumerate() {
        let mut clean = fresh(t, &ops[..j]);
        run(&mut clean, op).unwrap_or_else(|e| panic!("call {j} ({op:?}) with memory: {e:?}"));
    }
    let refusals = refuse_each_allocation_of(t, ops);
    assert!(refusals >= least, "{refusals} refusals");
}

/// Refuses each allocation of each call of `ops` that succeeds with memory, in turn;
/// returns how many refusals the calls saw. (A call that fails with memory, such as a
/// load of a key not stored, is not refused anything: its error's message is allocated
/// as it is made.)
fn refuse_each_allocation_of(t: Tier, ops: &[Op]) -> usize {
    let mut refusals = 0;
    for (j, op) in ops.iter().enumerate() {
        let mut clean = fresh(t, &ops[..j]);
        let Ok(expected) = run(&mut clean, op) else {
            continue;
        };
        let expected_state = clean.state_dump();
        for k in 0.. {
            let mut m = fresh(t, &ops[..j]);
            let before = m.state_dump();
            arm(k);
            let got = run(&mut m, op);
            let refused = disarm();
            m.check_invariants()
                .unwrap_or_else(|e| panic!("call {j} ({op:?}), allocation {k} refused: {e}"));
            match got {
                // Not refused, or refused where the tier has a way around it (the chunk
                // table's slots taken whole at the first store, else grown by doubling).
                Ok(got) => {
                    assert_eq!(got, expected, "call {j} ({op:?}), allocation {k}");
                    assert_eq!(m.state_dump(), expected_state, "call {j}, allocation {k}");
                    if !refused {
                        break;
                    }
                }
                Err(Error::OutOfMemory(_)) if refused => {
                    refusals += 1;
                    assert_eq!(m.state_dump(), before, "call {j} ({op:?}), allocation {k}");
                    let again = run(&mut m, op).expect("the call again, with memory");
                    assert_eq!(again, expected, "call {j} ({op:?}) after refusal {k}");
                    assert_eq!(m.state_dump(), expected_state, "call {j} after refusal {k}");
                }
                Err(e) => panic!("call {j} ({op:?}), allocation {k} refused: {e:?}"),
            }
        }
    }
    refusals
}

#[test]
fn no_refused_allocation_aborts_an_lru_tier_call() {
    refuse_each_allocation(LRU, &scenario(), 80);
    refuse_each_allocation(LRU, &churn(), 20);
}

#[test]
fn no_refused_allocation_aborts_an_arc_tier_call() {
    refuse_each_allocation(ARC, &scenario(), 80);
    refuse_each_allocation(ARC, &churn(), 20);
}

#[test]
fn no_refused_allocation_aborts_a_tier_call_with_a_store_threshold() {
    refuse_each_allocation(Tier(6, CachePolicy::Lru, 2, 3, true), &offers(), 40);
}

#[test]
fn no_refused_allocation_aborts_a_tier_call_on_a_full_request_table() {
    for which in 0..4 {
        refuse_each_allocation(LRU, &full_table(which), 14);
    }
}

/// A xorshift generator (the test needs no more).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }

    fn keys(&mut self, universe: u64, distinct: bool) -> Vec<u64> {
        let mut v: Vec<u64> = Vec::new();
        for _ in 0..1 + self.below(8) {
            let k = 1 + self.below(universe);
            if !distinct || !v.contains(&k) {
                v.push(k);
            }
        }
        v
    }
}

/// `len` calls on four requests over a few keys, any kind of call with any arguments
/// (some fail with memory: loads of keys not stored, repeated keys in a store).
fn random_calls(r: &mut Rng, len: usize) -> Vec<Op> {
    let universe = 4 + r.below(20);
    (0..len)
        .map(|_| {
            let rid = r.below(4);
            let a = r.below(6) as usize;
            let b = a + r.below(8) as usize;
            match r.below(15) {
                0 => Op::NewRequest(rid),
                1 | 2 => Op::SetKeys(rid, r.keys(universe, false)),
                3 => {
                    let k = r.keys(universe, false);
                    let p = k.iter().map(|_| 16 * (1 + r.below(10))).collect();
                    Op::SetPositions(rid, k, p)
                }
                4 => Op::PrepareLoad(rid, r.keys(universe, false)),
                5 => Op::PrepareLoadRange(rid, a, b),
                6 => Op::CompleteLoad(rid, r.keys(universe, false)),
                7 => Op::CompleteLoadRange(rid, a, b),
                8 => Op::PrepareStore(rid, r.keys(universe, true)),
                9 | 10 => Op::PrepareStoreRange(rid, a, b, r.below(2) == 0),
                11 => Op::CompleteStore(rid, r.keys(universe, false), r.below(3) != 0),
                12 => Op::Touch(rid, r.keys(universe, false)),
                13 => Op::Finished(rid),
                _ if r.below(6) == 0 => Op::Reset,
                _ => Op::TakeEvents,
            }
        })
        .collect()
}

#[test]
fn no_refused_allocation_aborts_random_tier_calls() {
    let mut refusals = 0;
    for seed in 1..=600u64 {
        let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let policy = [CachePolicy::Lru, CachePolicy::Arc][r.below(2) as usize];
        let t = Tier(
            1 + r.below(8),
            policy,
            1 + r.below(3) as u32,
            1 + r.below(6) as usize,
            r.below(4) != 0,
        );
        let ops = random_calls(&mut r, 40);
        refusals += refuse_each_allocation_of(t, &ops);
    }
    assert!(refusals >= 50_000, "{refusals} refusals");
}
