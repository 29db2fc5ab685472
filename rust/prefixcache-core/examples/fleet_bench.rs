//! Core-only figures of the fleet index (docs/BENCHMARKS.md, "Fleet index"):
//! `cargo run --release -p prefixcache-core --example fleet_bench [mooncake.jsonl]`.
//!
//! - apply: vLLM-shaped frames for 64 workers (a `BlockStored` of 16 blocks with 256 token
//!   ids, then 16 single-hash `BlockRemoved`), msgpack decode included;
//! - query: longest prefix of a 144-block request over 64 workers;
//! - with a Mooncake trace: Dynamo's kv_indexer op definition (events = a store of each
//!   request's uncached suffix + removal of its last 25%; requests = one query per line).
//!
//! Each figure is the best of several runs, in thread CPU time (robust to other processes
//! on the machine).

use std::collections::HashSet;
use std::time::Instant;

use prefixcache_core::fleet::{FleetEvent, HashForm, KvIndex, Stored};
use rmpv::Value;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn s(x: &str) -> Value {
    Value::from(x)
}

fn payload(ts: f64, events: Vec<Value>) -> Vec<u8> {
    let mut out = Vec::new();
    let v = Value::Array(vec![Value::F64(ts), Value::Array(events), Value::from(0)]);
    rmpv::encode::write_value(&mut out, &v).expect("encode");
    out
}

fn stored_event(hashes: &[u64], first_token: u64) -> Value {
    Value::Map(vec![
        (s("type"), s("BlockStored")),
        (
            s("block_hashes"),
            Value::Array(hashes.iter().map(|&h| Value::from(h)).collect()),
        ),
        (s("parent_block_hash"), Value::Nil),
        (
            s("token_ids"),
            Value::Array(
                (0..hashes.len() as u64 * 16)
                    .map(|t| Value::from(first_token + t))
                    .collect(),
            ),
        ),
        (s("block_size"), Value::from(16)),
        (s("lora_id"), Value::Nil),
        (s("medium"), s("GPU")),
        (s("lora_name"), Value::Nil),
        (
            s("extra_keys"),
            Value::Array(hashes.iter().map(|_| Value::Nil).collect()),
        ),
        (s("group_idx"), Value::from(0)),
        (s("kv_cache_spec_kind"), s("full_attention")),
    ])
}

fn removed_event(h: u64) -> Value {
    Value::Map(vec![
        (s("type"), s("BlockRemoved")),
        (s("block_hashes"), Value::Array(vec![Value::from(h)])),
        (s("medium"), s("GPU")),
        (s("group_idx"), Value::from(0)),
    ])
}

/// CPU time of this thread in seconds (Linux `schedstat`), so that figures taken while
/// other processes share the cores count only our own work; wall time elsewhere.
fn cpu_seconds() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: f64 = s.split_whitespace().next()?.parse().ok()?;
    Some(ns / 1e9)
}

fn best<F: FnMut()>(runs: usize, mut f: F) -> f64 {
    (0..runs)
        .map(|_| {
            let (t, c) = (Instant::now(), cpu_seconds());
            f();
            match (c, cpu_seconds()) {
                (Some(a), Some(b)) => b - a,
                _ => t.elapsed().as_secs_f64(),
            }
        })
        .fold(f64::INFINITY, f64::min)
}

fn stored(hashes: Vec<u64>) -> FleetEvent {
    FleetEvent::Stored(Stored {
        block_hashes: hashes,
        parent_block_hash: None,
        num_tokens: 0,
        block_size: 16,
        lora_id: None,
        lora_name: None,
        medium: None,
        group_idx: 0,
    })
}

fn main() {
    let mut rng = Rng(7);
    let names: Vec<String> = (0..64).map(|w| format!("w{w}")).collect();

    // apply
    let mut msgs: Vec<(usize, [Vec<u8>; 3])> = Vec::new();
    let mut block_events = 0usize;
    let mut seqs = [0u64; 64];
    for step in 0..40u64 {
        for (w, seq) in seqs.iter_mut().enumerate() {
            let hashes: Vec<u64> = (0..16).map(|_| rng.next()).collect();
            let st = payload(1.7e9 + step as f64, vec![stored_event(&hashes, step * 256)]);
            let rm = payload(
                1.7e9 + step as f64,
                hashes.iter().rev().map(|&h| removed_event(h)).collect(),
            );
            for p in [st, rm] {
                msgs.push((w, [b"kv@w@m".to_vec(), seq.to_be_bytes().to_vec(), p]));
                *seq += 1;
            }
            block_events += 32;
        }
    }
    let t = best(7, || {
        let mut ix = KvIndex::new(HashForm::default(), None).expect("index");
        for (w, f) in &msgs {
            let parts = [f[0].as_slice(), f[1].as_slice(), f[2].as_slice()];
            ix.apply_frames(&names[*w], &parts, 0.0).expect("apply");
        }
    });
    println!(
        "apply_frames (decode + apply): {} messages, {block_events} block events: {:.2} M block events/s ({:.2} us per message)",
        msgs.len(),
        block_events as f64 / t / 1e6,
        t / msgs.len() as f64 * 1e6
    );
    // apply of decoded events (index only)
    let decoded: Vec<(usize, Vec<FleetEvent>)> = msgs
        .iter()
        .map(|(w, f)| {
            let (_, b) = prefixcache_core::fleet::wire::decode_frames(
                &[f[0].as_slice(), f[1].as_slice(), f[2].as_slice()],
                HashForm::default(),
            )
            .expect("decode");
            (*w, b.events)
        })
        .collect();
    let t = best(7, || {
        let mut ix = KvIndex::new(HashForm::default(), None).expect("index");
        for (w, evs) in &decoded {
            ix.apply(&names[*w], evs, None, 0.0).expect("apply");
        }
    });
    println!(
        "apply (decoded events, index only): {:.2} M block events/s",
        block_events as f64 / t / 1e6
    );

    // query: 64 workers holding random prefixes of 8 system prompts of 128 blocks
    let systems: Vec<Vec<u64>> = (0..8)
        .map(|_| (0..128).map(|_| rng.next()).collect())
        .collect();
    let mut ix = KvIndex::new(HashForm::default(), None).expect("index");
    for name in &names {
        for k in 0..3 {
            let sys = &systems[(rng.next() % 8) as usize];
            let n = 1 + (rng.next() % 128) as usize;
            let tail: Vec<u64> = (0..64).map(|_| rng.next()).collect();
            ix.apply(name, &[stored(sys[..n].to_vec()), stored(tail)], None, 0.0)
                .expect("fill");
            let _ = k;
        }
    }
    let requests: Vec<Vec<u64>> = (0..64)
        .map(|i| {
            let mut r = systems[i % 8].clone();
            r.extend((0..16).map(|_| rng.next()));
            r
        })
        .collect();
    let n = 20_000;
    let t = best(7, || {
        for i in 0..n {
            let m = ix
                .longest_prefix(&requests[i % 64], 0.0, None)
                .expect("query");
            std::hint::black_box(m);
        }
    });
    println!(
        "longest_prefix 144 blocks x 64 workers: {:.2} us",
        t / n as f64 * 1e6
    );
    let t = best(7, || {
        for i in 0..n {
            let m = ix
                .top_k(&requests[i % 64], 4, 0.0, None, false)
                .expect("query");
            std::hint::black_box(m);
        }
    });
    println!("top_k(4): {:.2} us", t / n as f64 * 1e6);

    // Dynamo's op definition on a Mooncake trace
    if let Some(path) = std::env::args().nth(1) {
        let text = std::fs::read_to_string(&path).expect("trace");
        let mut seen = HashSet::new();
        let mut events = Vec::new();
        let mut reqs = Vec::new();
        for line in text.lines() {
            let v: Value = {
                // the trace is JSON; hash_ids is the only field used
                let start = line.find("\"hash_ids\": [").expect("hash_ids") + 13;
                let end = start + line[start..].find(']').expect("]");
                Value::Array(
                    line[start..end]
                        .split(',')
                        .filter(|x| !x.trim().is_empty())
                        .map(|x| Value::from(x.trim().parse::<u64>().expect("id")))
                        .collect(),
                )
            };
            let ids: Vec<u64> = v
                .as_array()
                .expect("ids")
                .iter()
                .map(|x| x.as_u64().expect("u64"))
                .collect();
            reqs.push(ids.clone());
            let Some(start) = ids.iter().position(|h| !seen.contains(h)) else {
                continue;
            };
            let new = ids[start..].to_vec();
            let keep = (new.len() as f64 * 0.75) as usize;
            seen.extend(new[..keep].iter().copied());
            events.push(stored(new.clone()));
            if keep < new.len() {
                events.push(FleetEvent::Removed {
                    block_hashes: new[keep..].iter().rev().copied().collect(),
                    medium: None,
                    group_idx: 0,
                });
            }
        }
        let blocks: usize = events.iter().map(|e| e.num_block_events()).sum();
        let mut ix = KvIndex::new(HashForm::default(), None).expect("index");
        let t = best(3, || {
            ix = KvIndex::new(HashForm::default(), None).expect("index");
            for e in &events {
                ix.apply("w0", std::slice::from_ref(e), None, 0.0)
                    .expect("apply");
            }
        });
        println!(
            "Dynamo op definition: {} events ({blocks} blocks): {:.0} event ops/s ({:.1} M blocks/s)",
            events.len(),
            events.len() as f64 / t,
            blocks as f64 / t / 1e6
        );
        let nb: usize = reqs.iter().map(Vec::len).sum();
        let t = best(3, || {
            for r in &reqs {
                std::hint::black_box(ix.longest_prefix(r, 0.0, None).expect("query"));
            }
        });
        println!(
            "  requests: {} : {:.0} request ops/s ({:.1} M blocks/s)",
            reqs.len(),
            reqs.len() as f64 / t,
            nb as f64 / t / 1e6
        );
    }
}
