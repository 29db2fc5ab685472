//! Every allocation a fleet-index call makes may fail, and none may abort the process: for
//! each call of a scenario (batches of stores, removals and clears on workers past the
//! inline holder words, on many media, with several copies of a hash; restarts, gaps and
//! duplicates; raw frames; queries), the k-th allocation of the call is refused, for
//! every k until the call makes no more. A refused call returns `OutOfMemory` and either
//! leaves the index as it was (after which the same call with memory does what it does on
//! an index that never saw the failure), or, for a batch that ran out of memory while it
//! was being applied, drops what that worker holds and nothing else, its sequence moving
//! past the batch as if it had applied.
//!
//! Registering a worker or a medium not seen before and removing workers rebuild the
//! shared name lists (`Arc`), which cannot be allocated fallibly: those calls run with
//! memory here (the scenario's setup), and their refusals are not tested.
//!
//! Its own test binary, whose global allocator counts the allocations of the thread that
//! arms it and refuses one (`refusing_allocator`).

mod refusing_allocator;

use prefixcache_core::fleet::{
    ApplyOutcome, FleetEvent, FleetMatch, HashForm, KvIndex, Stored, WorkerMatch, WorkerStatus,
};
use prefixcache_core::Error;
use refusing_allocator::{arm, disarm};

/// Workers in the setup: past the 63 / 64 slots the inline holder words cover.
const WORKERS: usize = 70;
/// Media in the setup: more than the inline words (2) and than a small list (4).
const MEDIA: [&str; 6] = ["GPU", "CPU", "disk", "remote", "m4", "m5"];

fn name(w: usize) -> String {
    format!("w{w}")
}

/// What a call needs besides the index, made before the allocator is armed (the test's
/// own allocations must not be the ones refused).
struct Args {
    names: Vec<String>,
    weights: Vec<(String, f64)>,
}

impl Args {
    fn new() -> Self {
        Args {
            names: (0..WORKERS).map(name).collect(),
            weights: vec![("CPU".to_owned(), 0.5), ("disk".to_owned(), 0.25)],
        }
    }
}

fn stored(hashes: &[u64], medium: &str) -> FleetEvent {
    FleetEvent::Stored(Stored {
        block_hashes: hashes.to_vec(),
        parent_block_hash: None,
        num_tokens: 0,
        block_size: 16,
        lora_id: None,
        lora_name: None,
        medium: Some(medium.to_owned()),
        group_idx: 0,
    })
}

fn removed(hashes: &[u64], medium: &str) -> FleetEvent {
    FleetEvent::Removed {
        block_hashes: hashes.to_vec(),
        medium: Some(medium.to_owned()),
        group_idx: 0,
    }
}

#[derive(Clone, Debug)]
enum Op {
    Apply {
        worker: usize,
        events: Vec<FleetEvent>,
        seq: Option<u64>,
        ts: Option<f64>,
    },
    Frames {
        worker: usize,
        seq: u64,
        payload: Vec<u8>,
    },
    Reset(usize, u64),
    Longest(Vec<u64>, bool),
    TopK(Vec<u64>, usize),
    Cached(usize, Option<&'static str>),
    Status(usize),
    Workers,
}

#[derive(Debug, PartialEq)]
enum Outcome {
    Applied(ApplyOutcome),
    Unit,
    Match(FleetMatch),
    Top(Vec<WorkerMatch>),
    Hashes(Vec<u64>),
    Status(WorkerStatus),
    Names(usize),
}

const NOW: f64 = 100.0;

fn run(ix: &mut KvIndex, op: &Op, a: &Args) -> Result<Outcome, Error> {
    let name = |w: usize| a.names[w].as_str();
    let weights = &a.weights[..];
    Ok(match op {
        Op::Apply {
            worker,
            events,
            seq,
            ts,
        } => Outcome::Applied(ix.apply_stamped(name(*worker), events, *seq, *ts, NOW)?),
        Op::Frames {
            worker,
            seq,
            payload,
        } => {
            let seq = seq.to_be_bytes();
            let parts: [&[u8]; 3] = [b"kv-events", &seq, payload];
            Outcome::Applied(ix.apply_frames(name(*worker), &parts, NOW)?)
        }
        Op::Reset(w, next) => {
            ix.reset_worker(name(*w), *next)?;
            Outcome::Unit
        }
        Op::Longest(hashes, weighted) => {
            Outcome::Match(ix.longest_prefix(hashes, NOW, weighted.then_some(weights))?)
        }
        Op::TopK(hashes, k) => Outcome::Top(ix.top_k(hashes, *k, NOW, Some(weights), true)?),
        Op::Cached(w, medium) => Outcome::Hashes(ix.cached_hashes(name(*w), *medium)?),
        Op::Status(w) => Outcome::Status(ix.status(name(*w), NOW)?),
        Op::Workers => Outcome::Names(ix.workers()?.len()),
    })
}

// -- a little msgpack, for the frames ---------------------------------------------------
fn mp_uint(out: &mut Vec<u8>, v: u64) {
    out.push(0xcf);
    out.extend_from_slice(&v.to_be_bytes());
}

fn mp_str(out: &mut Vec<u8>, s: &str) {
    out.push(0xd9);
    out.push(s.len() as u8);
    out.extend_from_slice(s.as_bytes());
}

/// `[ts, [event, ...], nil]` with map events `{"type", "block_hashes", "block_size",
/// "medium"}` (stores) and `{"type", "block_hashes", "medium"}` (removals).
fn payload(events: &[(bool, &[u64], &str)]) -> Vec<u8> {
    let mut out = vec![0x93, 0xcb];
    out.extend_from_slice(&1.5f64.to_be_bytes());
    out.push(0xdd);
    out.extend_from_slice(&(events.len() as u32).to_be_bytes());
    for &(store, hashes, medium) in events {
        out.push(if store { 0x84 } else { 0x83 });
        mp_str(&mut out, "type");
        mp_str(&mut out, if store { "BlockStored" } else { "BlockRemoved" });
        mp_str(&mut out, "block_hashes");
        out.push(0xdd);
        out.extend_from_slice(&(hashes.len() as u32).to_be_bytes());
        for &h in hashes {
            mp_uint(&mut out, h);
        }
        if store {
            mp_str(&mut out, "block_size");
            mp_uint(&mut out, 16);
        }
        mp_str(&mut out, "medium");
        mp_str(&mut out, medium);
    }
    out.push(0xc0);
    out
}

/// An index with every worker and medium registered (with memory: their names are
/// shared lists, see the module docs).
fn setup() -> KvIndex {
    let mut ix = KvIndex::new(HashForm::default(), Some(1000.0)).expect("index");
    for w in 0..WORKERS {
        ix.add_worker(&name(w), 0.0).expect("worker");
    }
    let events: Vec<FleetEvent> = MEDIA.iter().map(|m| stored(&[9000], m)).collect();
    ix.apply_stamped(&name(0), &events, None, None, 0.0)
        .expect("media");
    ix
}

fn scenario() -> Vec<Op> {
    let apply = |worker: usize, events: Vec<FleetEvent>, seq: Option<u64>| Op::Apply {
        worker,
        events,
        seq,
        ts: Some(1.0),
    };
    let hs: Vec<u64> = (1..=12).collect();
    vec![
        // Inline holders: medium 0 on slot 1, medium 1 on slot 2.
        apply(1, vec![stored(&hs, "GPU")], Some(0)),
        apply(2, vec![stored(&hs[..6], "CPU")], Some(0)),
        // Past the inline words: slot 65, and a third medium on slot 1.
        apply(65, vec![stored(&hs[..8], "GPU")], Some(0)),
        apply(
            1,
            vec![stored(&hs[4..10], "disk"), stored(&hs[..3], "m5")],
            Some(1),
        ),
        // Several copies, then one copy removed, a last copy removed, an unknown one.
        apply(
            1,
            vec![
                stored(&hs[..4], "GPU"),
                removed(&hs[..2], "GPU"),
                removed(&hs[10..], "GPU"),
                removed(&[777], "CPU"),
            ],
            Some(2),
        ),
        // Slot 69 on media 1 and 4 in one batch with new hashes (the table grows).
        apply(
            69,
            vec![
                stored(&(100..160).collect::<Vec<_>>(), "CPU"),
                stored(&hs, "m4"),
            ],
            Some(0),
        ),
        // A gap, a duplicate, then the missing batch.
        apply(2, vec![stored(&[500], "GPU")], Some(2)),
        apply(2, vec![stored(&[501], "GPU")], Some(0)),
        apply(2, vec![stored(&[502, 503], "remote")], Some(1)),
        // A clear inside a batch, and a publisher restart (batch 0 with another ts).
        apply(
            65,
            vec![FleetEvent::Cleared, stored(&hs[..2], "GPU")],
            Some(1),
        ),
        Op::Apply {
            worker: 2,
            events: vec![stored(&[600, 601], "GPU")],
            seq: Some(0),
            ts: Some(7.0),
        },
        // Raw frames: decoding allocates the events, their hash lists and strings.
        Op::Frames {
            worker: 3,
            seq: 0,
            payload: payload(&[
                (true, &[1, 2, 3, 4, 5], "GPU"),
                (true, &[1, 2], "CPU"),
                (false, &[2], "GPU"),
            ]),
        },
        // Unsequenced batch on a boxed holder set.
        apply(
            66,
            vec![
                stored(&hs, "GPU"),
                stored(&hs, "GPU"),
                removed(&hs[..3], "GPU"),
            ],
            None,
        ),
        Op::Reset(69, 5),
        Op::Longest(hs.clone(), false),
        Op::Longest(hs.clone(), true),
        Op::TopK(hs.clone(), 5),
        Op::Cached(1, None),
        Op::Cached(66, Some("GPU")),
        Op::Status(1),
        Op::Workers,
    ]
}

fn fresh(ops: &[Op], a: &Args) -> KvIndex {
    let mut ix = setup();
    for op in ops {
        run(&mut ix, op, a).expect("scenario call with memory");
    }
    ix
}

/// The dump without worker `w`'s own line (its counters).
fn without_worker(dump: &str, w: usize) -> String {
    let who = format!("{:?}", name(w));
    dump.lines()
        .filter(|l| !(l.starts_with("worker ") && l.contains(&who)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Random batches (seeded): stores, removals and clears of hashes from a small set, on
/// random workers and media, so that copies, boxed holders and their demotions meet.
fn random_batches(seed: u64, n: usize) -> Vec<Op> {
    let mut x = seed;
    let mut next = move |m: u64| {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (x >> 33) % m
    };
    let mut seqs = [0u64; WORKERS];
    (0..n)
        .map(|_| {
            let worker = [1, 2, 62, 63, 64, 69][next(6) as usize];
            let events = (0..1 + next(3))
                .map(|_| {
                    let medium = MEDIA[next(MEDIA.len() as u64) as usize];
                    let hashes: Vec<u64> = (0..1 + next(5)).map(|_| 1 + next(12)).collect();
                    match next(10) {
                        0 => FleetEvent::Cleared,
                        1..=3 => removed(&hashes, medium),
                        _ => stored(&hashes, medium),
                    }
                })
                .collect();
            let seq = match next(4) {
                0 => None,
                _ => {
                    seqs[worker] += 1;
                    Some(seqs[worker] - 1)
                }
            };
            Op::Apply {
                worker,
                events,
                seq,
                ts: Some(1.0),
            }
        })
        .collect()
}

#[test]
fn no_refused_allocation_aborts_a_fleet_index_call() {
    refuse_each_allocation_of_each_call(&scenario(), 60, 5);
}

#[test]
fn no_refused_allocation_aborts_random_batches() {
    for seed in 0..4 {
        refuse_each_allocation_of_each_call(&random_batches(seed, 60), 20, 1);
    }
}

/// Refuses each allocation of each call of `ops` in turn; `least`: how many refusals the
/// scenario must see, `least_dropped`: how many batches must run out of memory part-way.
fn refuse_each_allocation_of_each_call(ops: &[Op], least: usize, least_dropped: usize) {
    let a = Args::new();
    let mut refusals = 0;
    let mut dropped = 0;
    for (j, op) in ops.iter().enumerate() {
        let mut clean = fresh(&ops[..j], &a);
        let expected = run(&mut clean, op, &a).expect("call with memory");
        let expected_state = clean.state_dump();
        for k in 0.. {
            let mut ix = fresh(&ops[..j], &a);
            let before = ix.state_dump();
            arm(k);
            let got = run(&mut ix, op, &a);
            let refused = disarm();
            ix.check_invariants()
                .unwrap_or_else(|e| panic!("call {j} ({op:?}), allocation {k} refused: {e}"));
            if !refused {
                assert_eq!(got.as_ref().ok(), Some(&expected), "call {j}");
                assert_eq!(ix.state_dump(), expected_state, "call {j}");
                break;
            }
            refusals += 1;
            let Err(Error::OutOfMemory(_)) = got else {
                panic!("call {j} ({op:?}), allocation {k} refused: {got:?}");
            };
            let now = ix.state_dump();
            if now == before {
                let again = run(&mut ix, op, &a).expect("the call again, with memory");
                assert_eq!(again, expected, "call {j} ({op:?}) after refusal {k}");
                assert_eq!(
                    ix.state_dump(),
                    expected_state,
                    "call {j} after refusal {k}"
                );
                continue;
            }
            // A batch that ran out of memory as it was applied: its worker holds nothing
            // now and counts an error; nothing else changed. Reset on both sides, the
            // index and the one that applied the batch with memory agree.
            let (worker, seq) = match op {
                Op::Apply { worker, seq, .. } => (*worker, *seq),
                Op::Frames { worker, seq, .. } => (*worker, Some(*seq)),
                _ => panic!("call {j} ({op:?}) changed the index and failed: {now}"),
            };
            dropped += 1;
            let w = name(worker);
            let st = ix.status(&w, NOW).expect("status");
            let was = fresh(&ops[..j], &a).status(&w, NOW).expect("status");
            // The sequence moved past the batch as if it had applied.
            let applied = clean.status(&w, NOW).expect("status");
            let next = seq.map_or(was.next_seq, |s| s + 1);
            assert_eq!(st.num_held, 0, "call {j}, allocation {k}");
            assert_eq!(st.errors, was.errors + 1, "call {j}, allocation {k}");
            assert_eq!(st.batches, was.batches, "call {j}, allocation {k}");
            let seq_state = |s: &WorkerStatus| (s.next_seq, s.max_seen_seq, s.stale);
            assert_eq!(
                seq_state(&st),
                seq_state(&applied),
                "call {j}, allocation {k}"
            );
            assert_eq!(st.next_seq, next, "call {j}, allocation {k}");
            let mut reference = fresh(&ops[..=j], &a);
            reference.reset_worker(&w, next).expect("reset");
            ix.reset_worker(&w, next).expect("reset");
            assert_eq!(
                without_worker(&ix.state_dump(), worker),
                without_worker(&reference.state_dump(), worker),
                "call {j} ({op:?}), allocation {k}"
            );
        }
    }
    assert!(refusals >= least, "{refusals} refusals");
    assert!(dropped >= least_dropped, "{dropped} batches dropped");
}

#[test]
fn a_removal_allocates_nothing() {
    // Whatever the table's fill (so also exactly full), removing held hashes makes no
    // allocation: no removal can run out of memory.
    for n in 1..=80u64 {
        let mut ix = KvIndex::new(HashForm::default(), None).expect("index");
        let all: Vec<u64> = (1..=n).collect();
        ix.apply("w", &[stored(&all, "GPU")], None, 0.0)
            .expect("store");
        let events = [removed(&[1, n + 1], "GPU")];
        arm(0);
        let got = ix.apply("w", &events, None, 0.0);
        let refused = disarm();
        assert!(!refused, "{n} hashes: the removal allocated");
        assert_eq!(got.ok(), Some(ApplyOutcome::Applied));
        ix.check_invariants().expect("invariants");
    }
}

#[test]
fn a_replayed_batch_stays_a_duplicate_after_a_dropped_batch() {
    let mut ix = KvIndex::new(HashForm::default(), None).expect("index");
    let first = [stored(&[1, 2], "GPU")];
    let big: Vec<u64> = (10..2000).collect();
    let second = [stored(&big, "GPU")];
    let third = [stored(&[5], "GPU")];
    assert_eq!(
        ix.apply_stamped("w", &first, Some(0), Some(1.0), 0.0).ok(),
        Some(ApplyOutcome::Applied)
    );
    arm(0); // the table's room for the batch's hashes
    let got = ix.apply_stamped("w", &second, Some(1), Some(1.0), 0.0);
    assert!(disarm());
    assert!(matches!(got, Err(Error::OutOfMemory(_))), "{got:?}");
    assert_eq!(ix.status("w", NOW).expect("status").num_held, 0);
    // A replay of batch 0 (same timestamp) is a duplicate, not a publisher restart, and
    // the stream goes on.
    let again = ix.apply_stamped("w", &first, Some(0), Some(1.0), 0.0);
    assert_eq!(again.ok(), Some(ApplyOutcome::Duplicate));
    let next = ix.apply_stamped("w", &third, Some(2), Some(1.0), 0.0);
    assert_eq!(next.ok(), Some(ApplyOutcome::Applied));
    let st = ix.status("w", NOW).expect("status");
    assert_eq!((st.restarts, st.stale, st.next_seq), (0, false, 3));
    assert_eq!(ix.cached_hashes("w", None).expect("hashes"), vec![5]);
}
