//! Chained block keys: block i's key hashes block i-1's key and block i's tokens, so two
//! requests share a key exactly when they share the whole prefix up to that block.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The keys of the full blocks of `tokens` (`tokens.len() / block_size` of them), chained
/// from `seed` (a namespace: requests with different seeds never share a key).
/// `block_size` 0 gives no keys.
pub fn block_keys(tokens: &[u32], block_size: usize, seed: u64) -> Vec<u64> {
    if block_size == 0 || block_size > tokens.len() {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(tokens.len() / block_size);
    let mut buf: Vec<u8> = Vec::with_capacity(block_size * 4);
    let mut parent = seed;
    for block in tokens.chunks_exact(block_size) {
        buf.clear();
        for t in block {
            buf.extend_from_slice(&t.to_le_bytes());
        }
        parent = xxh3_64_with_seed(&buf, parent);
        out.push(parent);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chained_and_namespaced() {
        let a = block_keys(&[1, 2, 3, 4, 5], 2, 0);
        let b = block_keys(&[1, 2, 3, 4], 2, 0);
        let c = block_keys(&[9, 9, 3, 4], 2, 0);
        assert_eq!(a.len(), 2);
        assert_eq!(a, b);
        assert_ne!(a[1], c[1]); // same tokens, different prefix
        assert_ne!(block_keys(&[1, 2], 2, 1), block_keys(&[1, 2], 2, 0));
        assert!(block_keys(&[1, 2], 0, 0).is_empty());
    }
}
