//! Block trie: claim / complete / extend / store / release / clock under memory pressure.
//!
//! After every operation: `check_invariants()`; each request holds exactly the blocks the
//! target recorded from `claim` / `extend`; every block's reference count equals the number
//! of times requests hold it plus its pending copy pins; the free count is the number of
//! unreferenced blocks; `claim` agrees with the `lookup` made just before it; an operation
//! that fails leaves dump, stats, counters and events unchanged.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use prefixcache_core::trie::{BlockTrie, ClaimParams, MmSpan};
use prefixcache_core::Error;

#[derive(Arbitrary, Debug)]
enum Op {
    Claim {
        id: u8,
        tokens: Vec<u8>,
        lora: u8,
        salt: u8,
        priority: Option<u8>,
        retention: Option<u8>,
        reserve: u8,
        mm: Option<(u8, u8, u8)>,
    },
    Complete {
        id: u8,
    },
    Extend {
        id: u8,
        num_tokens: u8,
    },
    /// Store the request's own tokens plus `more` generated ones (or a conflicting list).
    Store {
        id: u8,
        more: Vec<u8>,
        conflict: bool,
    },
    Release {
        id: u8,
    },
    Clock {
        ticks: u8,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    num_blocks: u8,
    tokens_per_block: u8,
    partial: bool,
    copy: bool,
    ops: Vec<Op>,
}

const IDS: u64 = 5;

#[derive(Default, Clone)]
struct Req {
    blocks: Vec<u32>,
    pins: Vec<u32>,
    tokens: Vec<u32>,
}

type Snap = (
    Vec<prefixcache_core::trie::BlockDump>,
    usize,
    usize,
    usize,
    usize,
);

fn snap(t: &BlockTrie) -> Snap {
    (
        t.dump().expect("dump of a small trie"),
        t.num_free_blocks(),
        t.num_cached_blocks(),
        t.num_cached_tokens(),
        t.num_requests(),
    )
}

fn toks(raw: &[u8]) -> Vec<u32> {
    raw.iter().take(40).map(|&b| u32::from(b % 3)).collect()
}

fuzz_target!(|input: Input| {
    let n = usize::from(input.num_blocks % 12) + 1;
    let tpb = usize::from(input.tokens_per_block % 4) + 1;
    let mut t = BlockTrie::new(n, tpb, input.partial, input.copy).expect("trie");
    let mut reqs: BTreeMap<u64, Req> = BTreeMap::new();
    for op in input.ops.into_iter().take(200) {
        let before = snap(&t);
        let stats = t.stats();
        t.take_events();
        let r: Result<(), Error> = match op {
            Op::Claim {
                id,
                tokens,
                lora,
                salt,
                priority,
                retention,
                reserve,
                mm,
            } => {
                let id = u64::from(id) % IDS;
                let tokens = toks(&tokens);
                let mm: Vec<MmSpan> = mm
                    .map(|(h, s, l)| MmSpan {
                        hash: vec![h % 2; 4],
                        start: usize::from(s % 16),
                        len: usize::from(l % 8),
                    })
                    .into_iter()
                    .collect();
                let p = ClaimParams {
                    lora_id: (lora % 3 != 0).then_some(u64::from(lora % 3)),
                    cache_salt: [None, Some("a"), Some("")][usize::from(salt % 3)],
                    mm: &mm,
                    priority: priority.map(|x| x % 110),
                    retention: retention.map(u64::from),
                    reserve_tokens: usize::from(reserve % 6),
                };
                let look = t.lookup(&tokens, &p);
                match t.claim(id, &tokens, &p) {
                    Ok(out) => {
                        let look = look.expect("lookup failed where claim succeeded");
                        assert_eq!(
                            look.num_matched_tokens, out.num_matched_tokens,
                            "claim vs lookup"
                        );
                        assert_eq!(
                            look.num_reused_blocks, out.num_reused_blocks,
                            "claim vs lookup"
                        );
                        assert_eq!(look.partial, out.partial, "claim vs lookup");
                        assert!(out.num_matched_tokens < tokens.len().max(1));
                        assert_eq!(t.request_blocks(id).expect("blocks"), out.block_ids);
                        let prev = reqs.insert(
                            id,
                            Req {
                                blocks: out.block_ids.clone(),
                                pins: out.copies.iter().map(|c| c.src).collect(),
                                tokens,
                            },
                        );
                        assert!(prev.is_none(), "claim of a live request id succeeded");
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            Op::Complete { id } => {
                let id = u64::from(id) % IDS;
                t.complete(id).map(|k| {
                    let r = reqs
                        .get_mut(&id)
                        .expect("complete of an unknown request succeeded");
                    assert_eq!(k, r.pins.len());
                    r.pins.clear();
                })
            }
            Op::Extend { id, num_tokens } => {
                let id = u64::from(id) % IDS;
                t.extend(id, usize::from(num_tokens % 48)).map(|new| {
                    reqs.get_mut(&id)
                        .expect("extend of an unknown request succeeded")
                        .blocks
                        .extend(new);
                })
            }
            Op::Store { id, more, conflict } => {
                let id = u64::from(id) % IDS;
                let mut tokens = reqs.get(&id).map(|r| r.tokens.clone()).unwrap_or_default();
                if conflict && !tokens.is_empty() {
                    tokens[0] += 7;
                }
                tokens.extend(toks(&more));
                t.store(id, &tokens).map(|_| {
                    let r = reqs
                        .get_mut(&id)
                        .expect("store of an unknown request succeeded");
                    if tokens.len() > r.tokens.len() {
                        r.tokens = tokens;
                    }
                })
            }
            Op::Release { id } => {
                let id = u64::from(id) % IDS;
                t.release(id).map(|()| {
                    assert!(
                        reqs.remove(&id).is_some(),
                        "release of an unknown request succeeded"
                    );
                })
            }
            Op::Clock { ticks } => {
                t.advance_clock(u64::from(ticks));
                Ok(())
            }
        };
        if let Err(e) = r {
            assert_eq!(before, snap(&t), "failed op changed the trie: {e:?}");
            assert_eq!(stats, t.stats(), "failed op changed the stats: {e:?}");
            assert!(
                t.take_events().is_empty(),
                "failed op emitted events: {e:?}"
            );
        }
        if let Err(e) = t.check_invariants() {
            panic!("trie invariants: {e}");
        }
        let mut refs = vec![0u32; n];
        for (id, r) in &reqs {
            assert_eq!(
                t.request_blocks(*id).expect("request_blocks"),
                r.blocks,
                "request {id} blocks"
            );
            for &b in r.blocks.iter().chain(&r.pins) {
                refs[b as usize] += 1;
            }
        }
        assert_eq!(t.num_requests(), reqs.len());
        let dump = t.dump().expect("dump of a small trie");
        for d in &dump {
            if (d.block_id as usize) < n {
                assert_eq!(
                    d.ref_cnt, refs[d.block_id as usize],
                    "ref count of block {}",
                    d.block_id
                );
            }
        }
        assert_eq!(
            t.num_free_blocks(),
            refs.iter().filter(|&&r| r == 0).count(),
            "free count"
        );
    }
});
