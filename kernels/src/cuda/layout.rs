//! What the CUDA kernels read of a [`BatchLayout`], packed once per forward pass into one `u32`
//! buffer (one host-to-device copy), and the shape checks both the CUDA backend and its CPU twin
//! run before a launch.

use std::ops::Range;

use super::sources::consts::{ATT_BQ, ATT_MAX_HD};
use crate::backend::{BatchLayout, KernelError, QkvLayout, Result, RopeConfig};

/// A [`BatchLayout`] flattened for the device: every array the kernels read, back to back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedBatch {
    pub words: Vec<u32>,
    pub token_ids: Range<usize>,
    pub positions: Range<usize>,
    pub row_slots: Range<usize>,
    /// Per sequence: q_row, q_len, ctx_len, slot_offset.
    pub seqs: Range<usize>,
    pub key_slots: Range<usize>,
    /// The attention tile schedule: per tile, (sequence index, first query index in the sequence).
    pub q_tiles: Range<usize>,
    pub num_rows: usize,
    pub num_q_tiles: usize,
}

impl PackedBatch {
    /// Packs a layout that has already been validated against the cache.
    pub fn new(layout: &BatchLayout) -> Self {
        let mut words = Vec::with_capacity(
            3 * layout.num_rows()
                + 4 * layout.seqs.len()
                + layout.key_slots.len()
                + 2 * layout.num_rows() / ATT_BQ as usize
                + 2 * layout.seqs.len(),
        );
        let push = |words: &mut Vec<u32>, data: &mut dyn Iterator<Item = u32>| {
            let start = words.len();
            words.extend(data);
            start..words.len()
        };
        let token_ids = push(&mut words, &mut layout.token_ids.iter().copied());
        let positions = push(&mut words, &mut layout.positions.iter().copied());
        let row_slots = push(&mut words, &mut layout.row_slots.iter().copied());
        let seqs = push(&mut words, &mut layout.seqs.iter().flat_map(|s| [s.q_row, s.q_len, s.ctx_len, s.slot_offset]));
        let key_slots = push(&mut words, &mut layout.key_slots.iter().copied());
        let tiles = q_tile_schedule(layout);
        let num_q_tiles = tiles.len() / 2;
        let q_tiles = push(&mut words, &mut tiles.into_iter());
        PackedBatch {
            words,
            token_ids,
            positions,
            row_slots,
            seqs,
            key_slots,
            q_tiles,
            num_rows: layout.num_rows(),
            num_q_tiles,
        }
    }

    pub fn slice(&self, r: &Range<usize>) -> &[u32] {
        &self.words[r.clone()]
    }
}

/// Attention tiles: each sequence's query rows in steps of `ATT_BQ`, sequences in order.
/// Sequences with no query rows get no tile.
pub fn q_tile_schedule(layout: &BatchLayout) -> Vec<u32> {
    let mut tiles = Vec::new();
    for (i, s) in layout.seqs.iter().enumerate() {
        for q_start in (0..s.q_len).step_by(ATT_BQ as usize) {
            tiles.extend([i as u32, q_start]);
        }
    }
    tiles
}

fn check(cond: bool, msg: impl FnOnce() -> String) -> Result<()> {
    if cond {
        Ok(())
    } else {
        Err(KernelError::Shape(msg()))
    }
}

/// Shapes the attention kernel supports.
pub fn check_attention_shape(layout: QkvLayout) -> Result<()> {
    let QkvLayout { n_heads, n_kv_heads, head_dim } = layout;
    check(n_kv_heads > 0 && n_heads % n_kv_heads == 0, || {
        format!("attention: {n_heads} heads over {n_kv_heads} KV heads")
    })?;
    if head_dim == 0 || head_dim % 2 != 0 || head_dim > ATT_MAX_HD as usize {
        return Err(KernelError::Unsupported(format!(
            "attention: head_dim {head_dim} (the CUDA kernel takes even sizes up to {ATT_MAX_HD})"
        )));
    }
    Ok(())
}

/// Shapes the rotary kernel supports.
pub fn check_rope_shape(layout: QkvLayout, rope: RopeConfig) -> Result<()> {
    check(rope.rotary_dim.is_multiple_of(2) && rope.rotary_dim <= layout.head_dim, || {
        format!("rope: rotary_dim {} with head_dim {}", rope.rotary_dim, layout.head_dim)
    })
}

/// Dynamic shared memory of the attention kernel for a head size, in bytes.
pub fn attention_smem_bytes(head_dim: usize) -> usize {
    use super::sources::consts::ATT_BK;
    ATT_BQ as usize * head_dim * 4 + ATT_BK as usize * (head_dim + 2) * 2 + ATT_BK as usize * head_dim * 2
}

/// Dynamic shared memory of the rope kernel, in bytes.
pub fn rope_smem_bytes(head_dim: usize, rotary_dim: usize) -> usize {
    use super::sources::consts::ROPE_THREADS;
    rotary_dim * 8 + (ROPE_THREADS as usize / 32) * head_dim * 4
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::AttnSeq;

    #[test]
    fn q_tiles_cover_every_query_row_once() {
        let layout = BatchLayout {
            token_ids: vec![0; 50],
            positions: vec![0; 50],
            row_slots: vec![0; 50],
            seqs: vec![
                AttnSeq { q_row: 0, q_len: 16, ctx_len: 16, slot_offset: 0 },
                AttnSeq { q_row: 16, q_len: 0, ctx_len: 5, slot_offset: 16 },
                AttnSeq { q_row: 16, q_len: 34, ctx_len: 40, slot_offset: 21 },
            ],
            key_slots: vec![0; 61],
        };
        let p = PackedBatch::new(&layout);
        assert_eq!(p.slice(&p.q_tiles), &[0, 0, 2, 0, 2, 16, 2, 32]);
        assert_eq!(p.num_q_tiles, 4);
        assert_eq!(p.slice(&p.seqs)[8..12], [16, 34, 40, 21]);
        assert_eq!(p.key_slots.len(), 61);
    }
}
