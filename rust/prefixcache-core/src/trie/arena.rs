//! The blocks by id, each made on its first use.
//!
//! A trie over `num_blocks` GPU blocks and `host_blocks` host blocks names them `0..num_blocks`
//! and `num_blocks..num_blocks + host_blocks` at first (offloading and onboarding swap a
//! block's level later, not its id), and the root `num_blocks + host_blocks`. Every block
//! starts free, uncached, at the default priority, with its id as its release sequence, so
//! a block that was never used is fully described by its id: it is not stored. Each level
//! keeps its used blocks in a vector (ids in order from the level's first id) and hands
//! out the next id of its range when the eviction order reaches it, so memory follows the
//! blocks in use or cached, not `num_blocks` (`BlockTrie(num_blocks=2**31)` costs nothing
//! until it is filled).

use std::ops::{Index, IndexMut};

use super::trie::Block;
use crate::{Error, Result};

pub(crate) struct BlockArena {
    /// GPU-range blocks used so far: ids `0..gpu.len()`.
    gpu: Vec<Block>,
    /// Host-range blocks used so far: ids `num_gpu..num_gpu + host.len()`.
    host: Vec<Block>,
    root: Block,
    num_gpu: usize,
    num_host: usize,
}

impl BlockArena {
    /// The arena of `num_gpu` GPU and `num_host` host blocks; their sum is the root's id
    /// (the caller checks it fits a `u32` below `u32::MAX`).
    pub(crate) fn new(num_gpu: usize, num_host: usize) -> Self {
        let root_id = num_gpu + num_host;
        let mut root = Block::new(root_id as u64);
        root.parent = root_id as u32;
        BlockArena {
            gpu: Vec::new(),
            host: Vec::new(),
            root,
            num_gpu,
            num_host,
        }
    }

    /// The root's id: one past the last block id.
    pub(crate) fn root_id(&self) -> u32 {
        (self.num_gpu + self.num_host) as u32
    }

    /// The lowest never-used id of a level's range, if any is left.
    #[inline]
    pub(crate) fn next_unused(&self, host: bool) -> Option<u32> {
        let (used, size, base) = self.range(host);
        (used < size).then_some((base + used) as u32)
    }

    fn range(&self, host: bool) -> (usize, usize, usize) {
        if host {
            (self.host.len(), self.num_host, self.num_gpu)
        } else {
            (self.gpu.len(), self.num_gpu, 0)
        }
    }

    /// Room to make `n` more blocks of each level without allocating (each level at most
    /// what its range has left), and ~24 bytes a block for the entries the evictable sets
    /// will take (they allocate node by node, infallibly). Nothing changes on failure.
    pub(crate) fn try_reserve_unused(&mut self, n: usize) -> Result<()> {
        let oom = |e| Error::out_of_memory("the block trie", e);
        let g = n.min(self.num_gpu - self.gpu.len());
        let h = n.min(self.num_host - self.host.len());
        if g + h == 0 {
            return Ok(());
        }
        let mut probe: Vec<u8> = Vec::new();
        probe
            .try_reserve_exact((g + h).saturating_mul(24))
            .map_err(oom)?;
        drop(probe);
        self.gpu.try_reserve(g).map_err(oom)?;
        self.host.try_reserve(h).map_err(oom)
    }

    /// Makes the level's next never-used block (free, uncached, unlisted) and returns its
    /// id; None when the range is used up. Allocates only without room reserved before.
    pub(crate) fn take_unused(&mut self, host: bool) -> Option<u32> {
        let id = self.next_unused(host)?;
        let mut b = Block::new(u64::from(id));
        b.parent = self.root_id();
        b.host = host;
        if host {
            self.host.push(b);
        } else {
            self.gpu.push(b);
        }
        Some(id)
    }

    /// Block `id` when it has been used (the root always), None for a never-used id.
    pub(crate) fn get(&self, id: u32) -> Option<&Block> {
        let id = id as usize;
        match id.checked_sub(self.num_gpu) {
            None => self.gpu.get(id),
            Some(h) if h < self.num_host => self.host.get(h),
            Some(h) if h == self.num_host => Some(&self.root),
            Some(_) => None,
        }
    }

    /// Never-used blocks of each level: (GPU range, host range).
    pub(crate) fn num_unused(&self) -> (usize, usize) {
        (
            self.num_gpu - self.gpu.len(),
            self.num_host - self.host.len(),
        )
    }

    /// The ids of the used blocks (not the root), in order.
    pub(crate) fn used_ids(&self) -> impl Iterator<Item = u32> {
        let g = self.num_gpu;
        (0..self.gpu.len())
            .chain(g..g + self.host.len())
            .map(|i| i as u32)
    }

    /// Every used block and the root.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Block> {
        self.gpu
            .iter()
            .chain(&self.host)
            .chain(std::iter::once(&self.root))
    }
}

impl Index<usize> for BlockArena {
    type Output = Block;

    /// Block `id`, which must have been used (ids come from the evictable order, the trie
    /// and the requests, which only hold used blocks).
    #[inline]
    fn index(&self, id: usize) -> &Block {
        match id.checked_sub(self.num_gpu) {
            None => &self.gpu[id],
            Some(h) if h < self.num_host => &self.host[h],
            Some(h) if h == self.num_host => &self.root,
            Some(_) => panic!("block id {id} out of range"),
        }
    }
}

impl IndexMut<usize> for BlockArena {
    #[inline]
    fn index_mut(&mut self, id: usize) -> &mut Block {
        match id.checked_sub(self.num_gpu) {
            None => &mut self.gpu[id],
            Some(h) if h < self.num_host => &mut self.host[h],
            Some(h) if h == self.num_host => &mut self.root,
            Some(_) => panic!("block id {id} out of range"),
        }
    }
}
