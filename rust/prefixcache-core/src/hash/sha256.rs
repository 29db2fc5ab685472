//! One-shot SHA-256 over a block-aligned scratch buffer: the message is padded in place and
//! compressed with sha2's block function (runtime dispatch: SHA-NI when the CPU has it).
//! Saves the streaming hasher's buffering for the short (2-4 block) block-hash streams.

use sha2::block_api::compress256;

/// FIPS 180-4 initial hash value of SHA-256.
const H0: [u32; 8] = [
    0x6a09_e667,
    0xbb67_ae85,
    0x3c6e_f372,
    0xa54f_f53a,
    0x510e_527f,
    0x9b05_688c,
    0x1f83_d9ab,
    0x5be0_cd19,
];

/// 64-byte blocks needed for `len` message bytes plus padding.
pub(crate) fn padded_blocks(len: usize) -> usize {
    (len + 9).div_ceil(64)
}

/// SHA-256 of the first `len` bytes of `blocks` (read as one byte string). Overwrites the
/// bytes from `len` to the end of the last padded block; `blocks` must hold
/// [`padded_blocks`]`(len)` blocks.
pub(crate) fn digest_padded(blocks: &mut [[u8; 64]], len: usize) -> [u8; 32] {
    let n = padded_blocks(len);
    let blocks = &mut blocks[..n];
    let flat = blocks.as_flattened_mut();
    let end = flat.len();
    flat[len] = 0x80;
    flat[len + 1..end - 8].fill(0);
    flat[end - 8..].copy_from_slice(&((len as u64) * 8).to_be_bytes());
    let mut state = H0;
    compress256(&mut state, blocks);
    let mut out = [0u8; 32];
    for (o, w) in out.chunks_exact_mut(4).zip(state) {
        o.copy_from_slice(&w.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    #[test]
    fn matches_the_streaming_hasher() {
        for len in 0..300usize {
            let msg: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            let mut blocks = vec![[0xaau8; 64]; padded_blocks(len)];
            blocks.as_flattened_mut()[..len].copy_from_slice(&msg);
            assert_eq!(
                digest_padded(&mut blocks, len)[..],
                Sha256::digest(&msg)[..],
                "{len}"
            );
        }
    }
}
