//! Builds the [`BatchLayout`] of one forward pass from sequences described by their new tokens
//! and the KV slots of their whole context.

use sieve_kernels::{AttnSeq, BatchLayout};

/// Slots of logical positions `0..len` of a segment stored in `blocks`.
pub fn segment_slots(blocks: &[u32], block_size: usize, len: usize) -> impl Iterator<Item = u32> + '_ {
    (0..len).map(move |p| blocks[p / block_size] * block_size as u32 + (p % block_size) as u32)
}

#[derive(Debug, Default)]
pub struct LayoutBuilder {
    layout: BatchLayout,
}

impl LayoutBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a sequence whose context has KV at `ctx_slots` (one per logical position) and whose
    /// last `new_tokens.len()` positions are computed in this pass. Returns the row of its last
    /// new token (where its score is read), or `None` when it computes nothing.
    pub fn push(&mut self, new_tokens: &[u32], ctx_slots: &[u32]) -> Option<u32> {
        debug_assert!(new_tokens.len() <= ctx_slots.len());
        let l = &mut self.layout;
        let q_row = l.token_ids.len() as u32;
        let start = ctx_slots.len() - new_tokens.len();
        l.token_ids.extend_from_slice(new_tokens);
        l.positions.extend((start..ctx_slots.len()).map(|p| p as u32));
        l.row_slots.extend_from_slice(&ctx_slots[start..]);
        let slot_offset = l.key_slots.len() as u32;
        l.key_slots.extend_from_slice(ctx_slots);
        l.seqs.push(AttnSeq { q_row, q_len: new_tokens.len() as u32, ctx_len: ctx_slots.len() as u32, slot_offset });
        (!new_tokens.is_empty()).then(|| q_row + new_tokens.len() as u32 - 1)
    }

    pub fn num_rows(&self) -> usize {
        self.layout.token_ids.len()
    }

    pub fn finish(self) -> BatchLayout {
        self.layout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_and_item_share_slots() {
        let prefix_slots: Vec<u32> = segment_slots(&[7, 2], 4, 6).collect();
        assert_eq!(prefix_slots, vec![28, 29, 30, 31, 8, 9]);
        let mut b = LayoutBuilder::new();
        assert_eq!(b.push(&[1, 2, 3, 4, 5, 6], &prefix_slots), Some(5));
        let own: Vec<u32> = segment_slots(&[3], 4, 2).collect();
        let ctx: Vec<u32> = prefix_slots.iter().copied().chain(own).collect();
        assert_eq!(b.push(&[10, 11], &ctx), Some(7));
        let l = b.finish();
        assert_eq!(l.positions, vec![0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(l.row_slots[6..], [12, 13]);
        assert_eq!(l.seqs[1].ctx_len, 8);
        assert!(l.validate(64).is_ok());
    }
}
