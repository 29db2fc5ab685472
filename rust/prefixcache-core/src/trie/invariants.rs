//! A full consistency check of the trie, for tests (O(blocks + children)).

use rustc_hash::FxHashMap;

use super::trie::BlockTrie;

impl BlockTrie {
    /// Checks every structural invariant; returns a description of the first violation.
    ///
    /// - cached blocks are filed under their parent by their exact key, parents are cached
    ///   (or the root), and only full blocks have children;
    /// - reference counts equal the requests' block lists plus copy pins, and a referenced
    ///   cached block's parent is referenced too;
    /// - the free count, the cached count, the evictable set (exactly the unreferenced
    ///   childless blocks, under their current priority and sequence), the expiry set and
    ///   the partial-match indexes agree with the blocks;
    /// - host tier: `num_blocks` blocks are on the GPU and `host_blocks` on host, a cached
    ///   GPU block's parent is on the GPU (host blocks form subtrees below GPU blocks),
    ///   requests hold GPU blocks only (copy pins may be host blocks), each block's count
    ///   of GPU children is right, and each level's evictable set holds exactly its
    ///   evictable blocks.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut refs: FxHashMap<u32, u32> = FxHashMap::default();
        for (blocks, pins) in self.held() {
            for &b in blocks.iter().chain(pins) {
                *refs.entry(b).or_default() += 1;
            }
            if let Some(&b) = blocks
                .iter()
                .chain(pins)
                .find(|&&b| self.blocks.get(b).is_none())
            {
                return Err(format!("a request holds block {b}, which was never used"));
            }
            if let Some(&b) = blocks.iter().find(|&&b| self.blocks[b as usize].host) {
                return Err(format!(
                    "a request holds block {b}, which is in host memory"
                ));
            }
        }
        // Never-used blocks: free, uncached, on their range's level, in no set (arena.rs).
        let (unused_gpu, unused_host) = self.blocks.num_unused();
        let mut on_host = unused_host;
        let mut host_listed = 0usize;
        let mut host_cached = 0usize;
        let mut host_cached_tokens = 0usize;
        let mut gpu_children: FxHashMap<u32, u32> = FxHashMap::default();
        let mut free = unused_gpu;
        let mut cached = 0usize;
        let mut cached_tokens = 0usize;
        let mut listed = 0usize;
        let mut partial_entries: FxHashMap<u32, usize> = FxHashMap::default();
        for b in self.blocks.used_ids() {
            let blk = &self.blocks[b as usize];
            let want_refs = refs.get(&b).copied().unwrap_or(0);
            if blk.ref_cnt != want_refs {
                return Err(format!(
                    "block {b}: ref_cnt {} but requests hold {want_refs}",
                    blk.ref_cnt
                ));
            }
            on_host += usize::from(blk.host);
            if blk.ref_cnt == 0 && !blk.host {
                free += 1;
            }
            if let Some(k) = &blk.key {
                if blk.host {
                    host_cached += 1;
                    host_cached_tokens += k.tokens.len();
                } else {
                    cached += 1;
                    cached_tokens += k.tokens.len();
                    *gpu_children.entry(blk.parent).or_default() += 1;
                }
                let p = blk.parent;
                if self.blocks.get(p).is_none() {
                    return Err(format!("block {b}: parent {p} was never used"));
                }
                if !blk.host && p != self.root && self.blocks[p as usize].host {
                    return Err(format!(
                        "block {b} is on the GPU but its parent {p} is in host memory"
                    ));
                }
                if p != self.root && self.blocks[p as usize].key.is_none() {
                    return Err(format!("block {b}: parent {p} is not cached"));
                }
                if !self.blocks[p as usize]
                    .children
                    .exact(k.exact_hash())
                    .contains(&b)
                {
                    return Err(format!("block {b} is not filed under its parent {p}"));
                }
                if p != self.root {
                    let pk = self.blocks[p as usize].key.as_ref();
                    if pk.is_some_and(|pk| !self.full(pk)) {
                        return Err(format!("block {b}: parent {p} is not full"));
                    }
                    if blk.ref_cnt > 0 && self.blocks[p as usize].ref_cnt == 0 {
                        return Err(format!("block {b} is referenced but its parent {p} is not"));
                    }
                }
                if k.tokens.is_empty() || k.tokens.len() > self.tokens_per_block() {
                    return Err(format!("block {b}: key of {} tokens", k.tokens.len()));
                }
            } else if !blk.children.is_empty() {
                return Err(format!("block {b} is not cached but has children"));
            }
            for c in blk.children.ids() {
                if self.blocks.get(c).is_none() {
                    return Err(format!("block {c} is filed under {b} but was never used"));
                }
                if self.blocks[c as usize].parent != b || self.blocks[c as usize].key.is_none() {
                    return Err(format!(
                        "block {c} is filed under {b} but does not point back"
                    ));
                }
            }
            let should_list = self.should_list(b);
            if should_list != blk.listed {
                return Err(format!(
                    "block {b}: listed={} but evictable={should_list}",
                    blk.listed
                ));
            }
            if blk.listed {
                let set = if blk.host {
                    host_listed += 1;
                    &self.host_evictable
                } else {
                    listed += 1;
                    &self.evictable
                };
                if !set.contains(&(blk.priority, blk.seq, b)) {
                    return Err(format!("block {b} is listed under a stale key"));
                }
            }
            match blk.expiry {
                Some(t) if blk.ref_cnt > 0 || !self.expiring.contains(&(t, b)) => {
                    return Err(format!("block {b}: bad expiry entry"));
                }
                _ => {}
            }
            if blk.in_partial != self.wants_partial(b) {
                return Err(format!("block {b}: partial-index membership is stale"));
            }
            if blk.in_partial {
                let k = blk.key.as_ref().ok_or("partial entry without key")?;
                let p = blk.parent as usize;
                if !self.blocks[p]
                    .children
                    .partial_contains(k.scope, &k.tokens, b)
                {
                    return Err(format!(
                        "block {b} is missing from its parent's partial index"
                    ));
                }
                *partial_entries.entry(blk.parent).or_default() += 1;
            }
        }
        for (p, blk) in self
            .blocks
            .used_ids()
            .chain([self.root])
            .map(|p| (p, &self.blocks[p as usize]))
        {
            let cnt = gpu_children.get(&p).copied().unwrap_or(0);
            let recorded = blk.gpu_children;
            if recorded != cnt {
                return Err(format!(
                    "block {p}: {cnt} children on the GPU, recorded {recorded}"
                ));
            }
        }
        let sets = self.evictable.iter().chain(&self.host_evictable);
        if let Some((_, _, b)) = sets.clone().find(|e| self.blocks.get(e.2).is_none()) {
            return Err(format!(
                "block {b} is in an evictable set but was never used"
            ));
        }
        if on_host != self.host_blocks {
            return Err(format!(
                "{on_host} blocks in host memory, the host tier has {}",
                self.host_blocks
            ));
        }
        if host_listed != self.host_evictable.len() {
            return Err(format!(
                "{host_listed} evictable host blocks but the set holds {}",
                self.host_evictable.len()
            ));
        }
        if host_cached != self.num_host_cached
            || host_cached_tokens != self.num_host_cached_tokens
            || host_cached_tokens as u64 > self.host_stats.peak_host_tokens
        {
            return Err(format!(
                "counted {host_cached} host blocks ({host_cached_tokens} tokens), recorded {} ({}), peak {}",
                self.num_host_cached, self.num_host_cached_tokens, self.host_stats.peak_host_tokens
            ));
        }
        for p in self.blocks.used_ids().chain([self.root]) {
            let cnt = partial_entries.get(&p).copied().unwrap_or(0);
            let recorded = self.blocks[p as usize].children.num_partial();
            if recorded != cnt {
                return Err(format!("block {p}: partial index holds stale entries"));
            }
        }
        if free != self.num_free
            || cached != self.num_cached
            || cached_tokens != self.num_cached_tokens
        {
            return Err(format!(
                "counted free {free} cached {cached} ({cached_tokens} tokens), recorded {} {} ({})",
                self.num_free, self.num_cached, self.num_cached_tokens
            ));
        }
        if listed != self.evictable.len() {
            return Err(format!(
                "{listed} evictable blocks but the set holds {}",
                self.evictable.len()
            ));
        }
        if self
            .expiring
            .iter()
            .any(|&(t, b)| self.blocks.get(b).is_none_or(|blk| blk.expiry != Some(t)))
        {
            return Err("the expiry set holds stale entries".into());
        }
        self.check_interned()
    }

    /// Each interned salt and multimodal hash has exactly as many holders as cached keys
    /// and live requests use it, and none is kept without a holder.
    fn check_interned(&self) -> Result<(), String> {
        let mut salts: FxHashMap<u32, u32> = FxHashMap::default();
        let mut mm: FxHashMap<u32, u32> = FxHashMap::default();
        let keys = self.blocks.iter().filter_map(|b| b.key.as_ref());
        for (salt, ids) in keys
            .map(|k| (k.scope.salt, k.mm.iter().map(|m| m.0).collect::<Vec<_>>()))
            .chain(self.requests_interned())
        {
            if let Some(s) = salt {
                *salts.entry(s).or_default() += 1;
            }
            for id in ids {
                *mm.entry(id).or_default() += 1;
            }
        }
        for (what, interner, want) in [
            ("salt", &self.salts, salts),
            ("multimodal hash", &self.mm_hashes, mm),
        ] {
            let have: FxHashMap<u32, u32> = interner.holders().collect();
            if have != want {
                return Err(format!(
                    "interned {what} holders {have:?}, but keys and requests hold {want:?}"
                ));
            }
        }
        Ok(())
    }
}
