//! What the CUDA kernels read of a [`BatchLayout`], packed once per forward pass into one `u32`
//! buffer (one host-to-device copy), and the shape checks both the CUDA backend and its CPU twin
//! run before a launch.

use std::ops::Range;

use super::sources::consts::{AMMA_BK, AMMA_BQ, AMMA_CAUSAL, AMMA_LOAD_STATE, AMMA_STORE_STATE, ATT_BQ, ATT_MAX_HD};
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
    /// The tensor-core attention's schedule (see [`AttentionSchedule`]): its row list and the
    /// units of its shared and own passes.
    pub attn_rows: Range<usize>,
    pub attn_shared_units: Range<usize>,
    pub attn_own_units: Range<usize>,
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
        let sched = AttentionSchedule::new(layout);
        let attn_rows = push(&mut words, &mut sched.rows.into_iter());
        let attn_shared_units = push(&mut words, &mut sched.shared_units.into_iter());
        let attn_own_units = push(&mut words, &mut sched.own_units.into_iter());
        PackedBatch {
            words,
            token_ids,
            positions,
            row_slots,
            seqs,
            key_slots,
            q_tiles,
            attn_rows,
            attn_shared_units,
            attn_own_units,
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

/// Words per unit of the tensor-core attention: sequence, first index into the row list, row
/// count, first key tile, end key tile, flags.
pub const ATTN_UNIT_WORDS: usize = 6;

/// The two passes of kernels/cuda/attention_mma.cu for one batch.
///
/// Consecutive sequences whose first `t` whole key tiles (`t * AMMA_BK` positions, all before
/// each one's first query) lie in the same slots form a group: a call's items over its cached
/// query prefix. The shared pass attends those `t` tiles once for the group's query rows packed
/// 64 at a time; the own pass takes each sequence's rows in tiles of 64 from tile `t` (0 outside
/// a group) to its last row's causal end. A row's result is the same whatever the grouping (the
/// kernel carries its exact state between the passes), so grouping is purely a speed choice.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttentionSchedule {
    /// Batch row indices the units point into.
    pub rows: Vec<u32>,
    pub shared_units: Vec<u32>,
    pub own_units: Vec<u32>,
}

impl AttentionSchedule {
    pub fn new(layout: &BatchLayout) -> Self {
        let (bq, bk) = (AMMA_BQ as usize, AMMA_BK as usize);
        let mut sched = AttentionSchedule::default();
        let live: Vec<usize> = (0..layout.seqs.len()).filter(|&i| layout.seqs[i].q_len > 0).collect();
        let shared_tiles = |i: usize| {
            let s = &layout.seqs[i];
            (s.ctx_len - s.q_len) as usize / bk
        };
        let slots = |i: usize, len: usize| {
            let off = layout.seqs[i].slot_offset as usize;
            &layout.key_slots[off..off + len]
        };
        // Groups of consecutive sequences: (members, shared whole tiles).
        let mut groups: Vec<(Vec<usize>, usize)> = Vec::new();
        for &i in &live {
            if let Some((members, t)) = groups.last_mut() {
                let joins = *t > 0 && shared_tiles(i) >= *t && slots(members[0], *t * bk) == slots(i, *t * bk);
                if joins {
                    members.push(i);
                    continue;
                }
            }
            groups.push((vec![i], shared_tiles(i)));
        }
        for (members, t) in &mut groups {
            // A lone sequence gains nothing from a separate shared pass.
            if members.len() < 2 {
                *t = 0;
                continue;
            }
            let group_rows: Vec<u32> = members
                .iter()
                .flat_map(|&i| layout.seqs[i].q_row..layout.seqs[i].q_row + layout.seqs[i].q_len)
                .collect();
            for chunk in group_rows.chunks(bq) {
                sched.shared_units.extend([
                    members[0] as u32,
                    sched.rows.len() as u32,
                    chunk.len() as u32,
                    0,
                    *t as u32,
                    AMMA_STORE_STATE,
                ]);
                sched.rows.extend_from_slice(chunk);
            }
        }
        for (members, t) in &groups {
            for &i in members {
                let s = &layout.seqs[i];
                let first_pos = s.ctx_len - s.q_len;
                for start in (0..s.q_len).step_by(bq) {
                    let n = (s.q_len - start).min(bq as u32);
                    let last_pos = first_pos + start + n - 1;
                    let flags = AMMA_CAUSAL | if *t > 0 { AMMA_LOAD_STATE } else { 0 };
                    sched.own_units.extend([
                        i as u32,
                        sched.rows.len() as u32,
                        n,
                        *t as u32,
                        (last_pos + bk as u32) / bk as u32,
                        flags,
                    ]);
                    sched.rows.extend(s.q_row + start..s.q_row + start + n);
                }
            }
        }
        sched
    }
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

/// Whether the tensor-core attention kernel takes this head size (others run the SIMT kernel).
pub fn attention_mma_supports(head_dim: usize) -> bool {
    matches!(head_dim, 64 | 128)
}

/// Dynamic shared memory of the tensor-core attention kernel, in bytes: the query tile and two
/// stages of K and V tiles, bf16 rows padded by `AMMA_PAD`.
pub fn attention_mma_smem_bytes(head_dim: usize) -> usize {
    use super::sources::consts::AMMA_PAD;
    (AMMA_BQ + 4 * AMMA_BK) as usize * (head_dim + AMMA_PAD as usize) * 2
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

    /// Items over a 150-token prefix: consecutive ones sharing its two whole tiles are grouped
    /// for the shared pass; every query row is in exactly one own unit, whose key tiles start
    /// where its group's shared tiles end and stop at its last row's causal end.
    #[test]
    fn attention_schedule_groups_items_over_a_shared_prefix() {
        let prefix: Vec<u32> = (100..250).collect();
        let mut layout = BatchLayout::default();
        let mut next = 1000u32;
        let mut push = |layout: &mut BatchLayout, ctx: &[u32], n: u32| {
            let q_row = layout.token_ids.len() as u32;
            let slot_offset = layout.key_slots.len() as u32;
            layout.key_slots.extend_from_slice(ctx);
            for i in 0..n {
                layout.token_ids.push(0);
                layout.positions.push(ctx.len() as u32 + i);
                layout.row_slots.push(next);
                layout.key_slots.push(next);
                next += 1;
            }
            layout.seqs.push(AttnSeq { q_row, q_len: n, ctx_len: ctx.len() as u32 + n, slot_offset });
        };
        push(&mut layout, &prefix, 70); // group A (2 tiles)
        push(&mut layout, &prefix, 1); // group A
        push(&mut layout, &prefix[..100], 5); // 1 whole tile, other slots: alone
        push(&mut layout, &[], 3); // no prefix
        push(&mut layout, &prefix, 10); // group B
        push(&mut layout, &prefix, 64); // group B
        let sched = AttentionSchedule::new(&layout);
        let units = |w: &[u32]| w.chunks(ATTN_UNIT_WORDS).map(|u| u.to_vec()).collect::<Vec<_>>();
        let shared = units(&sched.shared_units);
        let own = units(&sched.own_units);
        // Group A: 71 rows in tiles of 64; group B: 74 rows.
        let shared_shape: Vec<(u32, u32, u32, u32)> = shared.iter().map(|u| (u[0], u[2], u[3], u[4])).collect();
        assert_eq!(shared_shape, vec![(0, 64, 0, 2), (0, 7, 0, 2), (4, 64, 0, 2), (4, 10, 0, 2)]);
        assert!(shared.iter().all(|u| u[5] == AMMA_STORE_STATE));
        let shared_rows: Vec<u32> =
            shared.iter().flat_map(|u| sched.rows[u[1] as usize..(u[1] + u[2]) as usize].to_vec()).collect();
        let want_shared: Vec<u32> = (0..71).chain(79..153).collect();
        assert_eq!(shared_rows, want_shared);

        let mut seen = vec![0; layout.num_rows()];
        for u in &own {
            let s = layout.seqs[u[0] as usize];
            let grouped = [0, 1, 4, 5].contains(&u[0]);
            assert_eq!(u[3], if grouped { 2 } else { 0 }, "first key tile of {u:?}");
            assert_eq!(u[5], AMMA_CAUSAL | if grouped { AMMA_LOAD_STATE } else { 0 });
            let rows = &sched.rows[u[1] as usize..(u[1] + u[2]) as usize];
            let last_pos = s.ctx_len - s.q_len + (rows[rows.len() - 1] - s.q_row);
            assert_eq!(u[4], last_pos / AMMA_BK + 1, "end key tile of {u:?}");
            for &r in rows {
                assert!(r >= s.q_row && r < s.q_row + s.q_len);
                seen[r as usize] += 1;
            }
        }
        assert!(seen.iter().all(|&n| n == 1), "{seen:?}");
    }

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
