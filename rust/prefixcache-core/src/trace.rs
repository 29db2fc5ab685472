//! Traces that name their prompts by block ids (Mooncake's `hash_ids`): the tokens such
//! a prompt stands for.

use crate::error::{try_vec, Error, Result};

/// The first `len` tokens of the prompt made of blocks `ids`, block `b` standing for
/// the tokens `b * tokens_per_id .. (b + 1) * tokens_per_id` (fewer when the blocks hold
/// fewer than `len` tokens). Every token must fit in a `u32`.
pub fn expand_block_ids(ids: &[u32], tokens_per_id: u32, len: usize) -> Result<Vec<u32>> {
    if tokens_per_id == 0 {
        return Err(Error::InvalidArgument(
            "tokens_per_id must be >= 1, got 0".into(),
        ));
    }
    let per = tokens_per_id as usize;
    let n = len.min(ids.len().saturating_mul(per));
    let used = &ids[..n.div_ceil(per)];
    if let Some((i, &b)) = used.iter().enumerate().find(|&(_, &b)| {
        u64::from(b) * u64::from(tokens_per_id) + u64::from(tokens_per_id - 1) > u64::from(u32::MAX)
    }) {
        return Err(Error::InvalidArgument(format!(
            "block id {b} at position {i}: its tokens exceed 2**32 - 1 at {tokens_per_id} tokens per id"
        )));
    }
    let mut out = try_vec(n, "the expanded prompt")?;
    for &b in used {
        let first = b * tokens_per_id; // cannot overflow: checked above
        let take = (n - out.len()).min(per) as u32;
        out.extend((0..take).map(|t| first + t)); // first + t <= the block's last token
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_expand_to_consecutive_tokens_cut_at_the_length() {
        assert_eq!(
            expand_block_ids(&[2, 0], 3, 5).unwrap(),
            vec![6, 7, 8, 0, 1]
        );
        assert_eq!(
            expand_block_ids(&[2, 0], 3, 9).unwrap(),
            vec![6, 7, 8, 0, 1, 2]
        );
        assert_eq!(expand_block_ids(&[], 3, 4).unwrap(), Vec::<u32>::new());
        assert_eq!(expand_block_ids(&[5], 3, 0).unwrap(), Vec::<u32>::new());
        let top = u32::MAX / 512; // its last token is 2**32 - 1 - 511 + 511
        assert_eq!(
            *expand_block_ids(&[top], 512, 512).unwrap().last().unwrap(),
            top * 512 + 511
        );
    }

    #[test]
    fn tokens_beyond_u32_are_refused_but_unused_blocks_are_not_read() {
        let over = u32::MAX / 512 + 1;
        assert!(expand_block_ids(&[1, over], 512, 1024).is_err());
        assert_eq!(expand_block_ids(&[1, over], 512, 512).unwrap().len(), 512);
        assert!(expand_block_ids(&[1], 0, 4).is_err());
    }
}
