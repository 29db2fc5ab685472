//! Keys and lookup: resolving a request's salt and multimodal items, the chained event
//! hash, and the plan of a claim (what is reused, taken over, copied or fresh).

use super::key::{chop, context_blocks, BlockKey, MmItem, Scope};
use super::trie::{invalid, BlockTrie};
use super::types::{ClaimParams, LookupOutcome, PartialKind, PartialReuse};
use crate::Result;

#[derive(Debug, Clone, Copy)]
pub(super) enum Step {
    Reuse(u32),
    TakeOver(u32, usize),
    Copy(u32, usize),
    Fresh,
}

pub(super) struct Plan {
    pub(super) steps: Vec<Step>,
    pub(super) matched: usize,
    pub(super) reused: usize,
    /// Matched blocks in host memory and their matched tokens.
    pub(super) host_blocks: usize,
    pub(super) host_tokens: usize,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv(h: &mut u64, bytes: &[u8]) {
    for &x in bytes {
        *h ^= u64::from(x);
        *h = h.wrapping_mul(FNV_PRIME);
    }
}

impl BlockTrie {
    // ----- keys -----------------------------------------------------------------------

    /// The scope and interned multimodal items of a request, with the ids interning would
    /// give to unseen values (so planning needs no mutation).
    pub(super) fn resolve(
        &self,
        tokens: &[u32],
        p: &ClaimParams<'_>,
    ) -> Result<(Scope, Vec<MmItem>)> {
        let salt = p
            .cache_salt
            .map(|s| self.salts.get(s.as_bytes()).unwrap_or(self.salts.new_id(0)));
        let mut unseen: Vec<&[u8]> = Vec::new();
        let mut mm = Vec::with_capacity(p.mm.len());
        for (i, span) in p.mm.iter().enumerate() {
            let end = span.start.checked_add(span.len);
            if span.len == 0 || end.is_none_or(|e| e > tokens.len()) {
                return Err(invalid(format!(
                    "mm_items[{i}] covers tokens [{}, {}+{}) outside the {} prompt tokens (or is empty)",
                    span.start,
                    span.start,
                    span.len,
                    tokens.len()
                )));
            }
            let id = match self.mm_hashes.get(&span.hash) {
                Some(id) => id,
                None => {
                    let pos = unseen.iter().position(|u| *u == span.hash.as_slice());
                    let k = pos.unwrap_or_else(|| {
                        unseen.push(&span.hash);
                        unseen.len() - 1
                    });
                    self.mm_hashes.new_id(k)
                }
            };
            mm.push(MmItem {
                id,
                start: span.start,
                len: span.len,
            });
        }
        Ok((
            Scope {
                lora: p.lora_id,
                salt,
            },
            mm,
        ))
    }

    pub(super) fn chain_hash(&self, parent: Option<u64>, k: &BlockKey) -> u64 {
        let mut h = FNV_OFFSET;
        fnv(&mut h, &parent.unwrap_or(0).to_le_bytes());
        match k.scope.lora {
            None => fnv(&mut h, &[0]),
            Some(l) => {
                fnv(&mut h, &[1]);
                fnv(&mut h, &l.to_le_bytes());
            }
        }
        match k.scope.salt {
            None => fnv(&mut h, &[0]),
            Some(s) => {
                let b = self.salts.bytes(s);
                fnv(&mut h, &[1]);
                fnv(&mut h, &(b.len() as u32).to_le_bytes());
                fnv(&mut h, b);
            }
        }
        fnv(&mut h, &(k.mm.len() as u32).to_le_bytes());
        for &(id, off) in &k.mm {
            let b = self.mm_hashes.bytes(id);
            fnv(&mut h, &(b.len() as u32).to_le_bytes());
            fnv(&mut h, b);
            fnv(&mut h, &off.to_le_bytes());
        }
        fnv(&mut h, &(k.tokens.len() as u32).to_le_bytes());
        for t in &k.tokens {
            fnv(&mut h, &t.to_le_bytes());
        }
        h
    }

    // ----- lookup ---------------------------------------------------------------------

    /// The exact child of `parent` with key `k`.
    pub(super) fn exact_child(&self, parent: u32, k: &BlockKey) -> Option<u32> {
        self.blocks[parent as usize]
            .children
            .exact(k.exact_hash())
            .iter()
            .copied()
            .find(|&c| self.blocks[c as usize].key.as_ref() == Some(k))
    }

    pub(super) fn takeover_eligible(&self, b: u32) -> bool {
        let blk = &self.blocks[b as usize];
        blk.ref_cnt == 0 && blk.children.is_empty()
    }

    pub(super) fn plan(&self, keys: &[BlockKey], n_ctx: usize) -> Plan {
        let mut steps = Vec::with_capacity(n_ctx);
        let mut matched = 0usize;
        let mut reused = 0usize;
        let (mut host_blocks, mut host_tokens) = (0usize, 0usize);
        let mut cur = Some(self.root);
        for i in 0..n_ctx {
            let key = keys.get(i).filter(|k| !k.tokens.is_empty());
            let (Some(c), Some(k)) = (cur, key) else {
                steps.push(Step::Fresh);
                cur = None;
                continue;
            };
            let partial = match self.exact_child(c, k) {
                Some(b) if self.full(k) => {
                    steps.push(Step::Reuse(b));
                    matched += k.tokens.len();
                    reused += 1;
                    if self.blocks[b as usize].host {
                        host_blocks += 1;
                        host_tokens += k.tokens.len();
                    }
                    cur = Some(b);
                    continue;
                }
                Some(b) => Some((b, k.tokens.len())),
                None if self.enable_partial_reuse && k.mm.is_empty() => self.blocks[c as usize]
                    .children
                    .best_partial(k.scope, &k.tokens, |x| self.key_of(x)),
                None => None,
            };
            cur = None;
            match partial {
                Some((b, n)) => {
                    matched += n;
                    if self.blocks[b as usize].host {
                        host_blocks += 1;
                        host_tokens += n;
                    }
                    steps.push(if self.takeover_eligible(b) {
                        Step::TakeOver(b, n)
                    } else {
                        Step::Copy(b, n)
                    });
                }
                None => steps.push(Step::Fresh),
            }
        }
        Plan {
            steps,
            matched,
            reused,
            host_blocks,
            host_tokens,
        }
    }

    pub(super) fn partial_of(steps: &[Step]) -> Option<PartialReuse> {
        steps.iter().find_map(|s| match *s {
            Step::TakeOver(b, n) => Some(PartialReuse {
                block_id: b,
                num_tokens: n,
                kind: PartialKind::TakenOver,
            }),
            Step::Copy(b, n) => Some(PartialReuse {
                block_id: b,
                num_tokens: n,
                kind: PartialKind::Copied,
            }),
            _ => None,
        })
    }

    /// What `claim` would reuse for `tokens`, without changing anything.
    pub fn lookup(&self, tokens: &[u32], p: &ClaimParams<'_>) -> Result<LookupOutcome> {
        let (scope, mm) = self.resolve(tokens, p)?;
        let keys = chop(tokens, self.tokens_per_block, scope, &mm);
        let n_ctx = context_blocks(tokens.len(), self.tokens_per_block);
        let plan = self.plan(&keys, n_ctx);
        Ok(LookupOutcome {
            num_matched_tokens: plan.matched,
            num_reused_blocks: plan.reused,
            partial: Self::partial_of(&plan.steps),
            num_host_blocks: plan.host_blocks,
            num_host_tokens: plan.host_tokens,
        })
    }
}
