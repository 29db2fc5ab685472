//! vLLM v1's chained block hashes: block i hashes `(parent, tuple(block_i_tokens),
//! extra_keys_i)`, with the parent of block 0 being `NONE_HASH = H(seed)`.

use std::cell::RefCell;

use sha2::{Digest, Sha256};
use xxhash_rust::xxh3::{xxh3_128, xxh3_64};

use super::memo::HashMemo;
use super::value::KeyValue;
use super::{cbor, pickle, sha256, BlockHash};
use crate::error::{try_vec, Error, Result};

/// The seed vLLM hashes into `NONE_HASH` when `PYTHONHASHSEED` is unset (sha256 variants).
pub const DEFAULT_SEED: &str = "vllm-none-hash";

/// A block-hash algorithm: a byte encoding of the hashed object and a digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HashAlgo {
    /// SHA-256 of `pickle.dumps(obj, protocol=5)` (vLLM's default).
    Sha256,
    /// SHA-256 of `cbor2.dumps(obj, canonical=True)`.
    Sha256Cbor,
    /// XXH3-128 (16 bytes, big-endian) of the pickle bytes.
    Xxhash,
    /// XXH3-128 (16 bytes, big-endian) of the canonical CBOR bytes.
    XxhashCbor,
    /// prefixcache's own: XXH3-64 (8 bytes, big-endian) of the canonical CBOR bytes.
    /// Not a vLLM option; stable across versions and languages like `xxhash_cbor`.
    Xxh3_64,
}

impl HashAlgo {
    pub const ALL: [HashAlgo; 5] = [
        HashAlgo::Sha256,
        HashAlgo::Sha256Cbor,
        HashAlgo::Xxhash,
        HashAlgo::XxhashCbor,
        HashAlgo::Xxh3_64,
    ];

    /// The algorithm from vLLM's `--prefix-caching-hash-algo` name (plus `xxh3_64`).
    pub fn from_name(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "unknown hash algorithm {name:?}: expected one of \"sha256\", \
                     \"sha256_cbor\", \"xxhash\", \"xxhash_cbor\", \"xxh3_64\""
                ))
            })
    }

    pub fn name(self) -> &'static str {
        match self {
            HashAlgo::Sha256 => "sha256",
            HashAlgo::Sha256Cbor => "sha256_cbor",
            HashAlgo::Xxhash => "xxhash",
            HashAlgo::XxhashCbor => "xxhash_cbor",
            HashAlgo::Xxh3_64 => "xxh3_64",
        }
    }

    /// Length of the digest in bytes (32, 16 or 8).
    pub fn digest_len(self) -> usize {
        match self {
            HashAlgo::Sha256 | HashAlgo::Sha256Cbor => 32,
            HashAlgo::Xxhash | HashAlgo::XxhashCbor => 16,
            HashAlgo::Xxh3_64 => 8,
        }
    }

    /// Whether the hashed bytes are canonical CBOR (else pickle protocol 5).
    pub fn uses_cbor(self) -> bool {
        !matches!(self, HashAlgo::Sha256 | HashAlgo::Xxhash)
    }

    /// The digest of `data`.
    #[inline]
    pub fn digest(self, data: &[u8]) -> BlockHash {
        let mut bytes = [0u8; 32];
        let len = match self {
            HashAlgo::Sha256 | HashAlgo::Sha256Cbor => {
                bytes.copy_from_slice(&Sha256::digest(data));
                32
            }
            HashAlgo::Xxhash | HashAlgo::XxhashCbor => {
                bytes[..16].copy_from_slice(&xxh3_128(data).to_be_bytes());
                16
            }
            HashAlgo::Xxh3_64 => {
                bytes[..8].copy_from_slice(&xxh3_64(data).to_be_bytes());
                8
            }
        };
        BlockHash { len, bytes }
    }

    /// The bytes this algorithm hashes for `value` (pickle or CBOR).
    pub fn encode(self, value: &KeyValue) -> Vec<u8> {
        if self.uses_cbor() {
            cbor::dumps(value)
        } else {
            pickle::dumps(value)
        }
    }

    /// The bytes hashed for one block: `(parent, tuple(tokens), extra)`.
    pub fn encode_block(
        self,
        out: &mut Vec<u8>,
        parent: &[u8],
        tokens: &[u32],
        extra: Option<&[KeyValue]>,
    ) {
        if self.uses_cbor() {
            cbor::dumps_block(out, parent, tokens, extra);
        } else {
            pickle::dumps_block(out, parent, tokens, extra);
        }
    }
}

/// What each thread keeps for hashing: the byte-stream buffers and the table of recent
/// SHA-256 block hashes.
#[derive(Default)]
struct Scratch {
    bufs: Buffers,
    memo: HashMemo,
}

/// Reusable buffers for the byte streams: 64-byte blocks for the fast path (so SHA-256 pads
/// and compresses in place) and a byte vector for the general encoders.
#[derive(Default)]
struct Buffers {
    blocks: Vec<[u8; 64]>,
    bytes: Vec<u8>,
}

impl Buffers {
    /// Give back buffers grown past 1 MiB by a huge block, so a thread does not keep them.
    fn trim(&mut self) {
        const KEEP: usize = 1 << 20;
        if self.blocks.len() * 64 > KEEP {
            self.blocks = Vec::new();
        }
        if self.bytes.capacity() > KEEP {
            self.bytes = Vec::new();
        }
    }

    /// [`Buffers::reserve_fast`], fallibly: an `OutOfMemory` error when the room cannot
    /// be allocated (the buffers are then as they were).
    fn try_reserve_fast(&mut self, bound: usize) -> Result<()> {
        let n = sha256::padded_blocks(bound);
        if self.blocks.len() < n {
            self.blocks
                .try_reserve(n - self.blocks.len())
                .map_err(|e| Error::out_of_memory("the hash buffers", e))?;
            self.blocks.resize(n, [0u8; 64]);
        }
        Ok(())
    }

    /// Make room for a fast-path stream whose writer touches up to `bound` bytes.
    fn reserve_fast(&mut self, bound: usize) {
        let n = sha256::padded_blocks(bound);
        if self.blocks.len() < n {
            self.blocks.resize(n, [0u8; 64]);
        }
    }
}

thread_local! {
    /// Scratch buffers reused by every hash on this thread (no allocation per block), and
    /// its table of recent SHA-256 block hashes.
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Computes vLLM's chained block hashes for one algorithm, block size and seed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockHasher {
    algo: HashAlgo,
    block_size: usize,
    seed: String,
    none_hash: BlockHash,
}

impl BlockHasher {
    /// A hasher; `NONE_HASH` = H(seed) with the seed hashed as a Python `str` (as vLLM's
    /// `init_none_hash` does with `PYTHONHASHSEED`). `block_size` must be >= 1.
    pub fn new(algo: HashAlgo, block_size: usize, seed: &str) -> Result<Self> {
        if block_size == 0 {
            return Err(Error::InvalidArgument(
                "block_size must be >= 1, got 0".to_owned(),
            ));
        }
        let none_hash = algo.digest(&algo.encode(&KeyValue::Str(seed.to_owned())));
        Ok(BlockHasher {
            algo,
            block_size,
            seed: seed.to_owned(),
            none_hash,
        })
    }

    /// The seed prefixcache uses: `PYTHONHASHSEED` when set, else `"vllm-none-hash"`, for
    /// every algorithm. (vLLM draws a random NONE_HASH when PYTHONHASHSEED is unset, at
    /// least for the xxhash variants, so its hashes differ between processes and no two
    /// instances can share cached blocks or KV events; a fixed default keeps hashes
    /// reproducible across runs and instances.)
    pub fn default_seed(pythonhashseed: Option<&str>) -> String {
        pythonhashseed.unwrap_or(DEFAULT_SEED).to_owned()
    }

    pub fn none_hash(&self) -> BlockHash {
        self.none_hash
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn algo(&self) -> HashAlgo {
        self.algo
    }

    pub fn seed(&self) -> &str {
        &self.seed
    }

    fn check_parent(&self, parent: Option<&BlockHash>) -> Result<BlockHash> {
        match parent {
            None => Ok(self.none_hash),
            Some(p) if p.len() == self.algo.digest_len() => Ok(*p),
            Some(p) => Err(Error::InvalidArgument(format!(
                "parent hash has {} bytes, but {} hashes have {}",
                p.len(),
                self.algo.name(),
                self.algo.digest_len()
            ))),
        }
    }

    /// Room in this thread's buffers and in a vector for the hashes of `n` blocks (whose
    /// first parent is `parent_len` bytes long) without extra keys, so that hashing them
    /// allocates nothing more: an `OutOfMemory` error when it cannot be had.
    fn reserve_for_blocks(
        &self,
        buf: &mut Scratch,
        parent_len: usize,
        n: usize,
    ) -> Result<Vec<BlockHash>> {
        let out = try_vec(n, "the block hashes")?;
        if n > 0 {
            let parent_len = parent_len.max(self.algo.digest_len());
            if let Some(bound) = self.fast_bound(parent_len, self.block_size) {
                buf.bufs.try_reserve_fast(bound)?;
            }
        }
        Ok(out)
    }

    /// Whether `(parent, tokens, None)` takes the allocation-free fast path.
    fn fast_bound(&self, parent_len: usize, n: usize) -> Option<usize> {
        if self.algo.uses_cbor() {
            Some(cbor::fast_block_bound(parent_len, n))
        } else if pickle::fast_path_applies(parent_len, n) {
            Some(pickle::fast_block_bound(parent_len, n))
        } else {
            None
        }
    }

    /// The hash of one block; a SHA-256 block without extra keys through this thread's
    /// table of recent hashes (the same digest, without the compressions on a hit).
    #[inline]
    fn hash_unchecked(
        &self,
        scratch: &mut Scratch,
        parent: &BlockHash,
        tokens: &[u32],
        extra: Option<&[KeyValue]>,
    ) -> BlockHash {
        let sha = matches!(self.algo, HashAlgo::Sha256 | HashAlgo::Sha256Cbor);
        if !sha || extra.is_some() {
            return self.hash_uncached(&mut scratch.bufs, parent, tokens, extra);
        }
        let Scratch { bufs, memo } = scratch;
        // check_parent made a SHA-256 parent 32 bytes long: padded_bytes() is all of it.
        let bytes = memo.digest(self.algo.uses_cbor(), parent.padded_bytes(), tokens, || {
            self.hash_uncached(bufs, parent, tokens, None).bytes
        });
        BlockHash { len: 32, bytes }
    }

    #[inline(always)]
    fn hash_uncached(
        &self,
        scratch: &mut Buffers,
        parent: &BlockHash,
        tokens: &[u32],
        extra: Option<&[KeyValue]>,
    ) -> BlockHash {
        let parent = parent.as_bytes();
        let bound = match extra {
            None => self.fast_bound(parent.len(), tokens.len()),
            Some(_) => None,
        };
        let sha = matches!(self.algo, HashAlgo::Sha256 | HashAlgo::Sha256Cbor);
        let len = match bound {
            Some(bound) => {
                scratch.reserve_fast(bound);
                let flat = scratch.blocks.as_flattened_mut();
                if self.algo.uses_cbor() {
                    cbor::write_block_fast(flat, parent, tokens)
                } else {
                    pickle::write_block_fast(flat, parent, tokens)
                }
            }
            None => {
                self.algo
                    .encode_block(&mut scratch.bytes, parent, tokens, extra);
                if !sha {
                    return self.algo.digest(&scratch.bytes);
                }
                // SHA-256 pads in place: move the stream into the block buffer.
                let len = scratch.bytes.len();
                scratch.reserve_fast(len);
                scratch.blocks.as_flattened_mut()[..len].copy_from_slice(&scratch.bytes);
                len
            }
        };
        if sha {
            return BlockHash {
                len: 32,
                bytes: sha256::digest_padded(&mut scratch.blocks, len),
            };
        }
        let flat = scratch.blocks.as_flattened();
        self.algo.digest(&flat[..len])
    }

    /// The hash of one full block (`tokens.len() == block_size`); parent `None` = NONE_HASH;
    /// `extra_keys` `None` hashes a `None`, `Some(keys)` the tuple of `keys`.
    pub fn hash_block(
        &self,
        parent: Option<&BlockHash>,
        tokens: &[u32],
        extra_keys: Option<&[KeyValue]>,
    ) -> Result<BlockHash> {
        if tokens.len() != self.block_size {
            return Err(Error::InvalidArgument(format!(
                "a block holds exactly {} tokens, got {}",
                self.block_size,
                tokens.len()
            )));
        }
        self.hash_block_tokens(parent, tokens, extra_keys)
    }

    /// vLLM's `hash_block_tokens` for any number of tokens (no block-size check).
    pub fn hash_block_tokens(
        &self,
        parent: Option<&BlockHash>,
        tokens: &[u32],
        extra_keys: Option<&[KeyValue]>,
    ) -> Result<BlockHash> {
        let parent = self.check_parent(parent)?;
        Ok(SCRATCH.with_borrow_mut(|scratch| {
            let h = self.hash_unchecked(scratch, &parent, tokens, extra_keys);
            scratch.bufs.trim();
            h
        }))
    }

    /// The chained hashes of the full blocks of `tokens` (a partial tail is not hashed),
    /// the first block's parent being `parent` (None = NONE_HASH), block `i` (counted from
    /// the first of `tokens`) with the extra keys `extra(i)`; `visit(i, hash)` is called
    /// on each hash as soon as it is computed (e.g. a lookup, whose memory accesses then
    /// overlap the next block's hashing). One borrow of the scratch buffers for all blocks.
    pub fn hash_blocks_with<'k>(
        &self,
        tokens: &[u32],
        parent: Option<&BlockHash>,
        extra: impl Fn(usize) -> Option<&'k [KeyValue]>,
        mut visit: impl FnMut(usize, &BlockHash),
    ) -> Result<Vec<BlockHash>> {
        let mut parent = self.check_parent(parent)?;
        SCRATCH.with_borrow_mut(|buf| {
            let n = tokens.len() / self.block_size;
            let mut out = self.reserve_for_blocks(buf, parent.as_bytes().len(), n)?;
            for (i, block) in tokens.chunks_exact(self.block_size).enumerate() {
                parent = self.hash_unchecked(buf, &parent, block, extra(i));
                visit(i, &parent);
                out.push(parent);
            }
            buf.bufs.trim();
            Ok(out)
        })
    }

    /// The chained hashes of the full blocks of `tokens` (a partial tail is not hashed),
    /// the first block's parent being `parent` (None = NONE_HASH).
    ///
    /// `extra_keys`, when given, holds one entry per block: `None` or the block's keys. It
    /// must cover every full block; entries past the last full block (for a partial tail
    /// that is not hashed yet) are allowed and ignored. On error nothing is computed.
    pub fn hash_blocks(
        &self,
        tokens: &[u32],
        extra_keys: Option<&[Option<Vec<KeyValue>>]>,
        parent: Option<&BlockHash>,
    ) -> Result<Vec<BlockHash>> {
        let n_full = tokens.len() / self.block_size;
        if let Some(ek) = extra_keys {
            if ek.len() < n_full {
                return Err(Error::InvalidArgument(format!(
                    "extra_keys has {} entries but there are {} full blocks \
                     ({} tokens, block_size {})",
                    ek.len(),
                    n_full,
                    tokens.len(),
                    self.block_size
                )));
            }
        }
        let mut parent = self.check_parent(parent)?;
        SCRATCH.with_borrow_mut(|buf| {
            let mut out = self.reserve_for_blocks(buf, parent.as_bytes().len(), n_full)?;
            for (i, block) in tokens.chunks_exact(self.block_size).enumerate() {
                let extra = extra_keys
                    .and_then(|ek| ek.get(i))
                    .and_then(|e| e.as_deref());
                parent = self.hash_unchecked(buf, &parent, block, extra);
                out.push(parent);
            }
            buf.bufs.trim();
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &BlockHash) -> String {
        format!("{b:?}")
    }

    #[test]
    fn none_hash_matches_vllm_vectors() {
        // From tests/data/vllm_block_hashes.json (vLLM 0.33.0).
        let h = BlockHasher::new(HashAlgo::Sha256Cbor, 16, "vllm-none-hash").unwrap();
        assert_eq!(
            hex(&h.none_hash()),
            "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0"
        );
    }

    #[test]
    fn first_blocks_match_vllm_vectors() {
        let tokens: Vec<u32> = (0..48).collect();
        let h = BlockHasher::new(HashAlgo::Sha256Cbor, 16, "vllm-none-hash").unwrap();
        let hashes = h.hash_blocks(&tokens, None, None).unwrap();
        assert_eq!(
            hex(&hashes[0]),
            "dc918a88b139e5afe60b88eda27508d4aee16c10fdc354791efea06206ac0749"
        );
        assert_eq!(
            hex(&hashes[2]),
            "117dad852830e0103c12d7c7f8b7cf58434ea8751d1f42ee07b1c93711e4da6c"
        );
    }

    #[test]
    fn sha256_pickle_matches_vllm_vectors() {
        // tests/data/vllm_block_hashes.json: sha256, PYTHONHASHSEED unset, ascending_small
        let tokens: Vec<u32> = (0..48).collect();
        let h = BlockHasher::new(HashAlgo::Sha256, 16, DEFAULT_SEED).unwrap();
        let hashes = h.hash_blocks(&tokens, None, None).unwrap();
        assert_eq!(
            hex(&h.none_hash()),
            "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198"
        );
        assert_eq!(
            hex(&hashes[0]),
            "fe8fa5dda3210d0ca2031e37cbe3b001186773cd1c710beb2d45fcb51d434798"
        );
    }

    #[test]
    fn xxh3_64_values_are_pinned() {
        // xxhash.xxh3_64_digest(cbor2.dumps(obj, canonical=True)) for the seed and for
        // (none_hash, tuple(range(16)), None): prefixcache's own algorithm must not drift.
        let h = BlockHasher::new(HashAlgo::Xxh3_64, 16, DEFAULT_SEED).unwrap();
        assert_eq!(hex(&h.none_hash()), "2764cecfde686cb2");
        let tokens: Vec<u32> = (0..16).collect();
        assert_eq!(
            hex(&h.hash_block(None, &tokens, None).unwrap()),
            "e88d66096ee66a7f"
        );
    }

    #[test]
    fn chaining_equals_hash_block() {
        for algo in HashAlgo::ALL {
            let h = BlockHasher::new(algo, 4, "s").unwrap();
            let tokens: Vec<u32> = (0..14).map(|i| i * 1_000_003).collect();
            let all = h.hash_blocks(&tokens, None, None).unwrap();
            assert_eq!(all.len(), 3);
            let mut parent = None;
            for (i, expect) in all.iter().enumerate() {
                let got = h
                    .hash_block(parent.as_ref(), &tokens[i * 4..i * 4 + 4], None)
                    .unwrap();
                assert_eq!(&got, expect);
                assert_eq!(got.len(), algo.digest_len());
                parent = Some(got);
            }
        }
    }

    #[test]
    fn keyed_chain_equals_hash_blocks() {
        for algo in HashAlgo::ALL {
            let h = BlockHasher::new(algo, 4, "s").unwrap();
            let tokens: Vec<u32> = (0..14).map(|i| i * 1_000_003).collect();
            let ek = vec![None, Some(vec![KeyValue::Int(7)]), None];
            let want = h.hash_blocks(&tokens, Some(&ek), None).unwrap();
            let got = h
                .hash_blocks_with(&tokens, None, |i| ek[i].as_deref(), |_, _| ())
                .unwrap();
            assert_eq!(got, want);
            let mut seen = Vec::new();
            let tail = h.hash_blocks_with(
                &tokens[4..],
                Some(&want[0]),
                |i| ek[i + 1].as_deref(),
                |i, h| seen.push((i, *h)),
            );
            assert_eq!(tail.unwrap(), want[1..]);
            assert_eq!(seen, vec![(0, want[1]), (1, want[2])]);
        }
    }

    /// The hash by the general encoder and a streaming SHA-256: no fast path, no table.
    fn reference_chain(h: &BlockHasher, tokens: &[u32]) -> Vec<BlockHash> {
        let mut parent = h.none_hash();
        let mut out = Vec::new();
        for block in tokens.chunks_exact(h.block_size()) {
            let mut bytes = Vec::new();
            h.algo()
                .encode_block(&mut bytes, parent.as_bytes(), block, None);
            parent = h.algo().digest(&bytes);
            out.push(parent);
        }
        out
    }

    proptest::proptest! {
        /// Prompts built from a few shared pieces, hashed one after another on one thread
        /// (so later blocks hit the table of recent hashes, and siblings, evictions and
        /// both encodings meet in it): every chain equals the reference.
        #[test]
        fn recent_hash_table_changes_no_hash(
            pieces in proptest::collection::vec(
                proptest::collection::vec(0u32..4, 1..40), 1..5),
            prompts in proptest::collection::vec(
                proptest::collection::vec(0usize..5, 1..6), 1..12),
            block in 1usize..20,
            cbor in proptest::bool::ANY,
        ) {
            let algo = if cbor { HashAlgo::Sha256Cbor } else { HashAlgo::Sha256 };
            let h = BlockHasher::new(algo, block, "s").unwrap();
            for prompt in &prompts {
                let tokens: Vec<u32> = prompt
                    .iter()
                    .flat_map(|&k| pieces[k % pieces.len()].iter().copied())
                    .collect();
                let want = reference_chain(&h, &tokens);
                proptest::prop_assert_eq!(h.hash_blocks(&tokens, None, None).unwrap(), want);
            }
        }
    }

    #[test]
    fn bad_arguments_are_rejected() {
        assert!(BlockHasher::new(HashAlgo::Sha256, 0, "s").is_err());
        assert!(HashAlgo::from_name("md5").is_err());
        let h = BlockHasher::new(HashAlgo::Sha256, 2, "s").unwrap();
        let short = BlockHash::from_bytes(&[1; 16]).unwrap();
        assert!(h.hash_block(Some(&short), &[1, 2], None).is_err());
        assert!(h.hash_block(None, &[1, 2, 3], None).is_err());
        let ek = vec![None];
        assert!(h.hash_blocks(&[1, 2, 3, 4], Some(&ek), None).is_err());
        let ek = vec![None, None, Some(vec![KeyValue::Int(1)])];
        assert_eq!(
            h.hash_blocks(&[1, 2, 3, 4, 5], Some(&ek), None)
                .unwrap()
                .len(),
            2
        );
    }

    #[test]
    fn default_seed() {
        assert_eq!(BlockHasher::default_seed(None), "vllm-none-hash");
        assert_eq!(BlockHasher::default_seed(Some("0")), "0");
    }
}
