//! Requests: claim (phase one), complete (phase two), extend, store, release.

use super::key::{block_mm, chop, context_blocks, BlockKey, DEFAULT_PRIORITY, MAX_PRIORITY};
use super::lookup::Step;
use super::trie::{invalid, BlockTrie, Request};
use super::types::{ClaimOutcome, ClaimParams, CopyOp, TrieEvent};
use crate::{Error, Result};

impl BlockTrie {
    // ----- requests -------------------------------------------------------------------

    /// Phase one: looks up `tokens` and takes references on everything it reuses, in one
    /// step. Copy sources stay referenced until [`BlockTrie::complete`].
    pub fn claim(
        &mut self,
        request_id: u64,
        tokens: &[u32],
        p: &ClaimParams<'_>,
    ) -> Result<ClaimOutcome> {
        if self.requests.contains_key(&request_id) {
            return Err(invalid(format!(
                "request {request_id} already holds blocks: release it first"
            )));
        }
        if tokens.is_empty() {
            return Err(invalid("tokens must not be empty".into()));
        }
        if let Some(pr) = p.priority {
            if pr > MAX_PRIORITY {
                return Err(invalid(format!(
                    "priority must be in [0, {MAX_PRIORITY}], got {pr}"
                )));
            }
        }
        let tpb = self.tokens_per_block;
        let (scope, mm) = self.resolve(tokens, p)?;
        let keys = chop(tokens, tpb, scope, &mm);
        let n_ctx = context_blocks(tokens.len(), tpb);
        let total_tokens = tokens
            .len()
            .checked_add(p.reserve_tokens)
            .ok_or_else(|| invalid("reserve_tokens is too large".into()))?;
        let n_total = context_blocks(total_tokens, tpb);
        let plan = self.plan(&keys, n_ctx);

        // Capacity, before any change.
        let mut fresh = n_total - n_ctx;
        let mut leaving = 0usize;
        for s in &plan.steps {
            match *s {
                // A host block is onboarded: it takes a GPU block.
                Step::Reuse(b) | Step::TakeOver(b, _) if self.blocks[b as usize].host => fresh += 1,
                Step::Reuse(b) | Step::TakeOver(b, _) => {
                    leaving += usize::from(self.blocks[b as usize].ref_cnt == 0)
                }
                Step::Copy(b, _) => {
                    let blk = &self.blocks[b as usize];
                    leaving += usize::from(blk.ref_cnt == 0 && !blk.host);
                    fresh += 1;
                }
                Step::Fresh => fresh += 1,
            }
        }
        if fresh + leaving > self.num_free {
            return Err(Error::OutOfBlocks {
                requested: fresh,
                available: self.num_free - leaving.min(self.num_free),
            });
        }
        // Each block taken may be one never used before, and offload a victim to one.
        self.blocks.try_reserve_unused(fresh)?;

        // Commit: intern (the request holds its salt and each multimodal item), tick the
        // clock, apply retention expiry.
        if let Some(s) = p.cache_salt {
            self.salts.acquire(s.as_bytes());
        }
        for span in p.mm {
            self.mm_hashes.acquire(&span.hash);
        }
        // Saturates at 2**64 - 1, as `advance_clock` does (a wrap to 0 would put every
        // retention expiry out of reach).
        self.clock = self.clock.saturating_add(1);
        self.refresh();

        // References first, so that no allocation below can evict a matched block.
        let mut pins = Vec::new();
        for s in &plan.steps {
            match *s {
                Step::Reuse(b) => {
                    self.ref_inc(b);
                    self.set_retention(b, p.priority, p.retention);
                }
                Step::TakeOver(b, _) => {
                    self.ref_inc(b);
                    self.set_retention(b, p.priority, p.retention);
                    self.detach(b);
                    self.stats.taken_over_blocks += 1;
                }
                Step::Copy(b, _) => {
                    self.ref_inc(b);
                    pins.push(b);
                }
                Step::Fresh => {}
            }
        }
        let mut block_ids = Vec::with_capacity(n_total);
        let mut copies = Vec::new();
        for s in &plan.steps {
            let b = match *s {
                Step::Reuse(b) | Step::TakeOver(b, _) => {
                    if self.blocks[b as usize].host {
                        self.onboard(b)?;
                    }
                    b
                }
                Step::Copy(src, n) => {
                    let (pr, d) = {
                        let sb = &self.blocks[src as usize];
                        (sb.priority, sb.duration)
                    };
                    let dst = self.alloc_fresh(pr, d)?;
                    copies.push(CopyOp {
                        src,
                        dst,
                        num_tokens: n,
                    });
                    self.stats.copies += 1;
                    self.stats.copied_tokens += n as u64;
                    dst
                }
                Step::Fresh => {
                    self.alloc_fresh(p.priority.unwrap_or(DEFAULT_PRIORITY), p.retention)?
                }
            };
            block_ids.push(b);
        }
        for _ in n_ctx..n_total {
            block_ids.push(self.alloc_fresh(DEFAULT_PRIORITY, None)?);
        }

        let partial = Self::partial_of(&plan.steps);
        self.stats.claims += 1;
        self.stats.query_tokens += tokens.len() as u64;
        self.stats.matched_tokens += plan.matched as u64;
        self.stats.reused_blocks += plan.reused as u64;
        if let Some(pr) = partial {
            self.stats.partial_hits += 1;
            self.stats.partial_tokens += pr.num_tokens as u64;
        }
        self.host_stats.loaded_tokens += plan.host_tokens as u64;
        self.requests.insert(
            request_id,
            Request {
                blocks: block_ids.clone(),
                pins,
                tokens: tokens.to_vec(),
                scope,
                mm,
            },
        );
        Ok(ClaimOutcome {
            block_ids,
            num_matched_tokens: plan.matched,
            num_reused_blocks: plan.reused,
            partial,
            copies,
            num_host_blocks: plan.host_blocks,
            num_host_tokens: plan.host_tokens,
        })
    }

    pub(super) fn set_retention(&mut self, b: u32, priority: Option<u8>, duration: Option<u64>) {
        let blk = &mut self.blocks[b as usize];
        if let Some(pr) = priority {
            blk.priority = pr;
        }
        blk.duration = duration;
    }

    pub(super) fn request(&self, request_id: u64) -> Result<&Request> {
        self.requests
            .get(&request_id)
            .ok_or_else(|| Error::UnknownRequest(format!("unknown request {request_id}")))
    }

    /// Phase two: the copies recorded by `claim` are done; their sources are released.
    /// Returns the number of copies completed.
    pub fn complete(&mut self, request_id: u64) -> Result<usize> {
        self.request(request_id)?;
        let pins = self
            .requests
            .get_mut(&request_id)
            .map(|r| std::mem::take(&mut r.pins))
            .unwrap_or_default();
        for &b in &pins {
            self.ref_dec(b);
        }
        Ok(pins.len())
    }

    /// The blocks a request holds, in order.
    pub fn request_blocks(&self, request_id: u64) -> Result<Vec<u32>> {
        Ok(self.request(request_id)?.blocks.clone())
    }

    /// Allocates blocks so that the request holds at least `ceil(num_tokens /
    /// tokens_per_block)`; returns the new block ids (default priority).
    pub fn extend(&mut self, request_id: u64, num_tokens: usize) -> Result<Vec<u32>> {
        let held = self.request(request_id)?.blocks.len();
        let need = context_blocks(num_tokens, self.tokens_per_block).saturating_sub(held);
        if need > self.num_free {
            return Err(Error::OutOfBlocks {
                requested: need,
                available: self.num_free,
            });
        }
        self.blocks.try_reserve_unused(need)?;
        let mut new = Vec::with_capacity(need);
        for _ in 0..need {
            new.push(self.alloc_fresh(DEFAULT_PRIORITY, None)?);
        }
        if let Some(r) = self.requests.get_mut(&request_id) {
            r.blocks.extend_from_slice(&new);
        }
        Ok(new)
    }

    /// Caches the request's blocks under the keys of `tokens` (the prompt, or the prompt
    /// plus generated tokens; must agree with what the request claimed or stored: extend
    /// it or be a prefix of it). Stops
    /// at the first key another block already holds. Returns the number of blocks newly
    /// cached.
    pub fn store(&mut self, request_id: u64, tokens: &[u32]) -> Result<usize> {
        let r = self.request(request_id)?;
        let common = tokens.len().min(r.tokens.len());
        if tokens[..common] != r.tokens[..common] {
            return Err(invalid(format!(
                "request {request_id}: tokens must agree with the {} tokens claimed or stored \
                 before (extend them or be a prefix of them)",
                r.tokens.len()
            )));
        }
        // The keys of `chop`, each built only when it is filed (most of a request's
        // blocks are cached already at its second store).
        let tpb = self.tokens_per_block;
        let usable = &tokens[..tokens.len().saturating_sub(1)];
        let num_keys = usable.len().div_ceil(tpb);
        if num_keys > r.blocks.len() {
            return Err(invalid(format!(
                "request {request_id} holds {} blocks but {} tokens need {num_keys}: call extend first",
                r.blocks.len(),
                tokens.len(),
            )));
        }
        let (scope, mm) = (r.scope, r.mm.clone());
        let blocks = r.blocks.clone();
        let mut cur = self.root;
        let mut new_ids = Vec::new();
        for ((i, chunk), &b) in usable.chunks(tpb).enumerate().zip(&blocks) {
            let mm_keys = block_mm(&mm, i * tpb, i * tpb + chunk.len());
            if let Some(old) = self.blocks[b as usize].key.as_ref() {
                if self.blocks[b as usize].parent != cur {
                    break;
                }
                if old.is(scope, &mm_keys, chunk) {
                    cur = b;
                    continue;
                }
            }
            let k = BlockKey {
                scope,
                mm: mm_keys,
                tokens: chunk.to_vec(),
            };
            if let Some(old) = self.blocks[b as usize].key.as_ref() {
                // The request's own non-full last block grew: re-file it.
                if self.full(old) || !self.blocks[b as usize].children.is_empty() {
                    break;
                }
                if self.exact_child(cur, &k).is_some() {
                    break;
                }
                self.detach(b);
            } else if self.exact_child(cur, &k).is_some() {
                break;
            }
            self.attach(b, cur, k);
            new_ids.push(b);
            cur = b;
        }
        if let Some(r) = self.requests.get_mut(&request_id) {
            if tokens.len() > r.tokens.len() {
                r.tokens = tokens.to_vec();
            }
        }
        if !new_ids.is_empty() && self.events_enabled {
            let first_parent = self.blocks[new_ids[0] as usize].parent;
            let parent_block_hash =
                (first_parent != self.root).then(|| self.blocks[first_parent as usize].hash);
            let mut token_ids = Vec::new();
            let mut lora_id = None;
            for &b in &new_ids {
                if let Some(k) = &self.blocks[b as usize].key {
                    token_ids.extend_from_slice(&k.tokens);
                    lora_id = k.scope.lora;
                }
            }
            self.events.push(TrieEvent::Stored {
                block_hashes: new_ids
                    .iter()
                    .map(|&b| self.blocks[b as usize].hash)
                    .collect(),
                block_ids: new_ids.clone(),
                parent_block_hash,
                token_ids,
                block_size: self.tokens_per_block,
                lora_id,
            });
        }
        self.stats.stored_blocks += new_ids.len() as u64;
        Ok(new_ids.len())
    }

    /// Drops the request: pending copy pins, then its blocks in reverse order.
    pub fn release(&mut self, request_id: u64) -> Result<()> {
        self.request(request_id)?;
        let Some(r) = self.requests.remove(&request_id) else {
            return Ok(());
        };
        for &b in &r.pins {
            self.ref_dec(b);
        }
        for &b in r.blocks.iter().rev() {
            self.ref_dec(b);
        }
        if let Some(s) = r.scope.salt {
            self.salts.release(s);
        }
        for it in &r.mm {
            self.mm_hashes.release(it.id);
        }
        Ok(())
    }

    /// Advances the logical clock (retention durations are counted in its ticks).
    pub fn advance_clock(&mut self, ticks: u64) {
        self.clock = self.clock.saturating_add(ticks);
        self.refresh();
    }
}
