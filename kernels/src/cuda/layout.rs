//! What the CUDA kernels read of a [`BatchLayout`], packed once per forward pass into one `u32`
//! buffer (one host-to-device copy), and the shape checks both the CUDA backend and its CPU twin
//! run before a launch.

use std::collections::HashMap;
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
    /// The tensor-core attention's schedule (see [`AttentionSchedule`]): its row list, the
    /// units of each shared pass (in launch order) and of the own pass.
    pub attn_rows: Range<usize>,
    pub attn_shared_levels: Vec<Range<usize>>,
    pub attn_own_units: Range<usize>,
    pub num_rows: usize,
    pub num_q_tiles: usize,
    /// One past the largest row position: the rows the RoPE angle table must have.
    pub positions_end: usize,
}

impl PackedBatch {
    /// Packs a layout that has already been validated against the cache.
    pub fn new(layout: &BatchLayout) -> Self {
        Self::with_sharing(layout, Sharing::WherePays)
    }

    /// [`PackedBatch::new`] with the attention schedule's `sharing` rule (benchmarks and tests
    /// compare the rules; the rows' bits are the same under both).
    pub fn with_sharing(layout: &BatchLayout, sharing: Sharing) -> Self {
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
        let sched = AttentionSchedule::with_sharing(layout, sharing);
        let attn_rows = push(&mut words, &mut sched.rows.into_iter());
        let attn_shared_levels =
            sched.shared_levels.into_iter().map(|units| push(&mut words, &mut units.into_iter())).collect();
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
            attn_shared_levels,
            attn_own_units,
            num_rows: layout.num_rows(),
            num_q_tiles,
            positions_end: layout.positions.iter().max().map_or(0, |&p| p as usize + 1),
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

/// The passes of kernels/cuda/attention_mma.cu for one batch.
///
/// Sequences whose first whole key tiles (`AMMA_BK` positions each, all before each one's first
/// query) lie in the same slots share them: a call's items over its cached query prefix, and
/// deeper, the items of a group over their shared run. The shared tiles form a tree (a trie over
/// each sequence's tiles, by their slots); every node that at least two sequences pass through
/// attends its tiles once for all of their query rows, packed 64 at a time, and leaves each row's
/// state at the node's end. Nodes at the same depth are one launch (a level); a level continues
/// from the state its parents left. The own pass then takes each sequence's rows in tiles of 64
/// from where its deepest shared node ended to its last row's causal end. A row's result is the
/// same whatever the tree (the kernel carries its exact state between passes): the schedule is
/// purely a speed choice, and a sequence joins a node only where that pays ([`sharing_pays`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttentionSchedule {
    /// Batch row indices the units point into.
    pub rows: Vec<u32>,
    /// The shared passes, launched in order: each one's units.
    pub shared_levels: Vec<Vec<u32>>,
    pub own_units: Vec<u32>,
}

/// Which sequences join a shared node of the [`AttentionSchedule`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Sharing {
    /// Those for whom [`sharing_pays`] (the worker's schedule).
    #[default]
    WherePays,
    /// Every sequence that has the node's tiles (the schedule before the cost rule).
    Always,
}

impl AttentionSchedule {
    pub fn new(layout: &BatchLayout) -> Self {
        Self::with_sharing(layout, Sharing::WherePays)
    }

    pub fn with_sharing(layout: &BatchLayout, sharing: Sharing) -> Self {
        let bk = AMMA_BK as usize;
        let mut s = AttentionSchedule::default();
        let live: Vec<usize> = (0..layout.seqs.len()).filter(|&i| layout.seqs[i].q_len > 0).collect();
        // Per sequence: the tile its state is at when its own pass starts.
        let mut state_at = vec![0usize; layout.seqs.len()];
        let mut stack = vec![(live.clone(), 0usize, 0usize)];
        while let Some((members, d0, level)) = stack.pop() {
            let shareable = |i: usize| {
                let q = &layout.seqs[i];
                (q.ctx_len - q.q_len) as usize / bk
            };
            let tile = |i: usize, d: usize| {
                let off = layout.seqs[i].slot_offset as usize + d * bk;
                &layout.key_slots[off..off + bk]
            };
            let extent = |cont: &[usize]| {
                let end = cont.iter().map(|&i| shareable(i)).min().unwrap_or(d0);
                let mut d = d0;
                while d < end && cont.iter().all(|&i| tile(i, d) == tile(cont[0], d)) {
                    d += 1;
                }
                d
            };
            let mut cont: Vec<usize> = members.into_iter().filter(|&i| shareable(i) > d0).collect();
            if cont.len() < 2 {
                continue;
            }
            // Where the members part at once, no node: their children are found below. Else
            // only those for whom the node's tiles are worth their state's round trip stay;
            // without the others the node may reach deeper (never shallower), which only adds
            // to their gain. One who leaves cannot join a deeper node (its state stays here).
            let mut d = extent(&cont);
            if d > d0 && sharing == Sharing::WherePays {
                cont.retain(|&i| sharing_pays(layout.seqs[i].q_len as usize, d - d0));
                if cont.len() < 2 {
                    continue;
                }
                d = extent(&cont);
            }
            let mut next_level = level;
            if d > d0 {
                if s.shared_levels.len() <= level {
                    s.shared_levels.resize(level + 1, vec![]);
                }
                let flags = AMMA_STORE_STATE | if d0 > 0 { AMMA_LOAD_STATE } else { 0 };
                let rows: Vec<u32> = cont
                    .iter()
                    .flat_map(|&i| layout.seqs[i].q_row..layout.seqs[i].q_row + layout.seqs[i].q_len)
                    .collect();
                for chunk in rows.chunks(AMMA_BQ as usize) {
                    let unit = [cont[0] as u32, s.rows.len() as u32, chunk.len() as u32, d0 as u32, d as u32, flags];
                    s.shared_levels[level].extend(unit);
                    s.rows.extend_from_slice(chunk);
                }
                for &i in &cont {
                    state_at[i] = d;
                }
                next_level = level + 1;
            }
            // The sequences that go on past `d`, split by the slots of tile `d` (first seen first;
            // hashed, as a call's items each have a tile of their own there).
            let mut children: Vec<Vec<usize>> = vec![];
            let mut child_of: HashMap<&[u32], usize> = HashMap::new();
            for i in cont.into_iter().filter(|&i| shareable(i) > d) {
                let c = *child_of.entry(tile(i, d)).or_insert_with(|| {
                    children.push(vec![]);
                    children.len() - 1
                });
                children[c].push(i);
            }
            // Pushed in reverse so that they are visited (and their rows listed) in batch order.
            for c in children.into_iter().rev() {
                stack.push((c, d, next_level));
            }
        }
        for &i in &live {
            let q = &layout.seqs[i];
            let first_pos = q.ctx_len - q.q_len;
            let t = state_at[i];
            for start in (0..q.q_len).step_by(AMMA_BQ as usize) {
                let n = (q.q_len - start).min(AMMA_BQ);
                let last_pos = first_pos + start + n - 1;
                let flags = AMMA_CAUSAL | if t > 0 { AMMA_LOAD_STATE } else { 0 };
                s.own_units.extend([i as u32, s.rows.len() as u32, n, t as u32, last_pos / AMMA_BK + 1, flags]);
                s.rows.extend(q.q_row + start..q.q_row + start + n);
            }
        }
        s
    }
}

/// Whether a sequence of `q_len` query rows gains by attending `tiles` key tiles in a shared
/// pass, packed with other sequences' rows, rather than in its own pass.
///
/// Alone, its rows fill `ceil(q_len / 64)` query tiles, so every one of those key tiles is
/// attended for `pad = ceil(q_len / 64) · 64 − q_len` padding rows too. Shared, each row costs
/// a state round trip instead (1.5 KiB a head: the query read again, the f32 state stored and
/// loaded), about 2.35 padding rows' worth of a tile: from the H200 fit of the kernel's time to
/// 1.36 µs of an SM per 64×64 tile and, for those bytes, 0.05 µs per row at the SM's share of
/// memory bandwidth. So short items share a long prefix (a 10-row item over three tiles: 162
/// against 23.5), items of a few tiles do not (100 rows over three: 84 against 235).
pub fn sharing_pays(q_len: usize, tiles: usize) -> bool {
    let bq = AMMA_BQ as usize;
    let pad = q_len.div_ceil(bq) * bq - q_len;
    // In hundredths: tiles · pad > 2.35 · q_len.
    100 * tiles * pad > 235 * q_len
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

/// Dynamic shared memory of the tensor-core attention kernel, in bytes: two stages of K and V
/// tiles (the query tile is staged in one), bf16 rows padded by `AMMA_PAD`.
pub fn attention_mma_smem_bytes(head_dim: usize) -> usize {
    use super::sources::consts::AMMA_PAD;
    4 * AMMA_BK as usize * (head_dim + AMMA_PAD as usize) * 2
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

/// Shared memory a `qk_norm_rope` block stages a row's heads in, at most (so that ~14 blocks of
/// 4 warps still fit an SM).
const ROPE_SMEM_BUDGET: usize = 16 << 10;

/// How many of a row's q and k heads `qk_norm_rope` stages at once: all of them for every real
/// model (Qwen3-0.6B: 24 heads of 128, 12 KiB), else as many as the budget holds (at least one).
pub fn rope_chunk_heads(layout: QkvLayout) -> usize {
    (ROPE_SMEM_BUDGET / (layout.head_dim * 4).max(1)).clamp(1, (layout.n_heads + layout.n_kv_heads).max(1))
}

/// Dynamic shared memory of the rope kernel, in bytes: [`rope_chunk_heads`] heads.
pub fn rope_smem_bytes(layout: QkvLayout) -> usize {
    rope_chunk_heads(layout) * layout.head_dim * 4
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::AttnSeq;

    /// A row's heads in one chunk for real models; larger rows in chunks within the budget, and a
    /// head larger than the budget alone.
    #[test]
    fn rope_chunks_hold_a_whole_row_of_real_models() {
        let l = |n_heads, n_kv_heads, head_dim| QkvLayout { n_heads, n_kv_heads, head_dim };
        assert_eq!((rope_chunk_heads(l(16, 8, 128)), rope_smem_bytes(l(16, 8, 128))), (24, 12 << 10));
        assert_eq!(rope_chunk_heads(l(16, 4, 64)), 20);
        assert_eq!((rope_chunk_heads(l(12, 6, 256)), rope_smem_bytes(l(12, 6, 256))), (16, 16 << 10));
        assert_eq!((rope_chunk_heads(l(2, 1, 8192)), rope_smem_bytes(l(2, 1, 8192))), (1, 32 << 10));
    }

    /// Items over a 150-token prefix (two whole tiles) and one over its first 100 tokens (one
    /// whole tile, other slots after it): the first tile is attended once for the three short
    /// ones that share it, the second once for the two of them that go on, wherever they sit in
    /// the batch; the items of 64 and 70 rows gain nothing from packing and attend the prefix in
    /// their own units. Every query row is in exactly one own unit, which starts where its
    /// deepest shared tile ended.
    #[test]
    fn attention_schedule_shares_tiles_as_a_tree() {
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
        push(&mut layout, &prefix, 70); // rows 0..70
        push(&mut layout, &prefix, 1); // row 70
        let mut other: Vec<u32> = prefix[..64].to_vec();
        other.extend(5000..5036);
        push(&mut layout, &other, 5); // rows 71..76: shares tile 0 only
        push(&mut layout, &[], 3); // rows 76..79: no context
        push(&mut layout, &prefix, 10); // rows 79..89
        push(&mut layout, &prefix, 64); // rows 89..153
        let sched = AttentionSchedule::new(&layout);
        let units = |w: &[u32]| w.chunks(ATTN_UNIT_WORDS).map(|u| u.to_vec()).collect::<Vec<_>>();
        let rows_of = |us: &[Vec<u32>]| -> Vec<u32> {
            us.iter().flat_map(|u| sched.rows[u[1] as usize..(u[1] + u[2]) as usize].to_vec()).collect()
        };
        assert_eq!(sched.shared_levels.len(), 2);
        let level0 = units(&sched.shared_levels[0]);
        assert!(level0.iter().all(|u| (u[3], u[4], u[5]) == (0, 1, AMMA_STORE_STATE)), "{level0:?}");
        assert_eq!(rows_of(&level0), (70..76).chain(79..89).collect::<Vec<u32>>());
        let level1 = units(&sched.shared_levels[1]);
        assert!(level1.iter().all(|u| (u[3], u[4], u[5]) == (1, 2, AMMA_STORE_STATE | AMMA_LOAD_STATE)), "{level1:?}");
        assert_eq!(rows_of(&level1), (70..71).chain(79..89).collect::<Vec<u32>>());
        assert!(level0.iter().chain(&level1).all(|u| u[2] as usize <= AMMA_BQ as usize));

        let mut seen = vec![0; layout.num_rows()];
        for u in units(&sched.own_units) {
            let s = layout.seqs[u[0] as usize];
            let from = match u[0] {
                1 | 4 => 2,
                2 => 1,
                _ => 0,
            };
            assert_eq!(u[3], from, "first key tile of {u:?}");
            assert_eq!(u[5], AMMA_CAUSAL | if from > 0 { AMMA_LOAD_STATE } else { 0 });
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

    /// The benchmark's call (100-row items over a 200-token prefix) attends in own units alone;
    /// 10-row items share the prefix's three whole tiles, also when two calls' items are in one
    /// batch (a node per call); sharing pays more over more tiles.
    #[test]
    fn only_items_that_gain_share_the_prefix_tiles() {
        let batch = |calls: &[u32]| {
            let mut layout = BatchLayout::default();
            for (c, &item_rows) in calls.iter().enumerate() {
                let prefix: Vec<u32> = (0..200).map(|p| c as u32 * 100_000 + p).collect();
                for i in 0..20u32 {
                    let q_row = layout.token_ids.len() as u32;
                    let slot_offset = layout.key_slots.len() as u32;
                    layout.key_slots.extend_from_slice(&prefix);
                    for r in 0..item_rows {
                        layout.token_ids.push(0);
                        layout.positions.push(200 + r);
                        let slot = c as u32 * 100_000 + 1000 + i * 1000 + r;
                        layout.row_slots.push(slot);
                        layout.key_slots.push(slot);
                    }
                    layout.seqs.push(AttnSeq { q_row, q_len: item_rows, ctx_len: 200 + item_rows, slot_offset });
                }
            }
            AttentionSchedule::new(&layout)
        };
        assert!(batch(&[100]).shared_levels.is_empty());
        assert!(batch(&[60]).shared_levels.is_empty());
        let units = |levels: &[Vec<u32>]| levels.iter().map(|l| l.len() / ATTN_UNIT_WORDS).collect::<Vec<_>>();
        assert_eq!(units(&batch(&[10]).shared_levels), [(20 * 10usize).div_ceil(64)]);
        // Two calls: a node each, one level; the 100-row call's items stay out.
        let two = batch(&[10, 100, 10]);
        assert_eq!(units(&two.shared_levels), [2 * (20 * 10usize).div_ceil(64)]);
        assert!(two.own_units.chunks(ATTN_UNIT_WORDS).all(|u| u[3] == if (20..40).contains(&u[0]) { 0 } else { 3 }));
        assert!(sharing_pays(1, 1) && sharing_pays(33, 3) && !sharing_pays(33, 2) && !sharing_pays(64, 100));
        assert!(!sharing_pays(100, 8) && sharing_pays(100, 9));
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
