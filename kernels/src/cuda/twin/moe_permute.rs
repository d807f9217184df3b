//! Twins of kernels/cuda/moe_permute.cu and moe_select.cu: the per-chunk histogram, the offsets
//! and both tile schedules, the device-side tile selector, the scatter and the un-permute.

use super::warp::{from_bf16, to_bf16};
use crate::cuda::moe::TileChoice;
use crate::cuda::sources::consts::PERM_CHUNK;

/// Number of chunks of assignments.
pub fn n_chunks(n_assign: usize) -> usize {
    n_assign.div_ceil(PERM_CHUNK as usize)
}

/// `moe_offsets`' dynamic shared memory, in bytes: three scans of `n_experts + 1` and the partial
/// sums of each expert's chunk ranges (as many ranges as the block's threads allow per expert).
pub fn offsets_smem_bytes(n_chunks: usize, n_experts: usize) -> usize {
    use crate::cuda::sources::consts::PERM_OFFSET_THREADS;
    let parts = (PERM_OFFSET_THREADS as usize / n_experts.max(1)).min(n_chunks).max(1);
    (3 * (n_experts + 1) + parts * n_experts) * 4
}

/// `moe_chunk_counts`: chunk_counts[c][e].
pub fn moe_chunk_counts(topk_ids: &[u32], n_experts: usize) -> Vec<u32> {
    let chunks = n_chunks(topk_ids.len());
    let mut counts = vec![0u32; chunks * n_experts];
    for (a, &e) in topk_ids.iter().enumerate() {
        counts[(a / PERM_CHUNK as usize) * n_experts + e as usize] += 1;
    }
    counts
}

/// What `moe_offsets` writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offsets {
    /// [n_chunks][n_experts]: assignments to e in earlier chunks.
    pub chunk_base: Vec<u32>,
    pub counts: Vec<u32>,
    /// [n_experts + 1]: first permuted row of each expert.
    pub offsets: Vec<u32>,
    /// (expert, first row within the expert) per tile, 2 words each.
    pub tiles64: Vec<u32>,
    pub tiles128: Vec<u32>,
    /// [tiles at 64, tiles at 128].
    pub n_tiles: [u32; 2],
}

/// `moe_offsets` (one block; its chunk ranges' partial sums are integers, so the twin sums each
/// expert's chunks in order).
pub fn moe_offsets(chunk_counts: &[u32], n_chunks: usize, n_experts: usize) -> Offsets {
    let mut chunk_base = vec![0u32; n_chunks * n_experts];
    let mut counts = vec![0u32; n_experts];
    for e in 0..n_experts {
        let mut running = 0;
        for c in 0..n_chunks {
            chunk_base[c * n_experts + e] = running;
            running += chunk_counts[c * n_experts + e];
        }
        counts[e] = running;
    }
    let scan = |f: &dyn Fn(u32) -> u32| {
        let mut off = vec![0u32; n_experts + 1];
        for e in 0..n_experts {
            off[e + 1] = off[e] + f(counts[e]);
        }
        off
    };
    let offsets = scan(&|n| n);
    let t64 = scan(&|n| n.div_ceil(64));
    let t128 = scan(&|n| n.div_ceil(128));
    let tiles = |off: &[u32], bm: u32| {
        let mut tiles = vec![0u32; 2 * off[n_experts] as usize];
        for e in 0..n_experts {
            for t in off[e]..off[e + 1] {
                tiles[2 * t as usize] = e as u32;
                tiles[2 * t as usize + 1] = (t - off[e]) * bm;
            }
        }
        tiles
    };
    Offsets {
        chunk_base,
        tiles64: tiles(&t64, 64),
        tiles128: tiles(&t128, 128),
        n_tiles: [t64[n_experts], t128[n_experts]],
        counts,
        offsets,
    }
}

/// `moe_select_tile`: the padding-ratio rule; `force` > 0 pins the BLOCK_M.
pub fn moe_select_tile(counts: &[u32], threshold: f32, force: u32) -> TileChoice {
    let (mut real, mut p64, mut p128) = (0u64, 0u64, 0u64);
    for &n in counts {
        let n = n as u64;
        real += n;
        p64 += n.div_ceil(64) * 64;
        p128 += n.div_ceil(128) * 128;
    }
    let block_m = if force > 0 {
        force
    } else if real > 0 && p128 as f64 > threshold as f64 * real as f64 {
        64
    } else {
        128
    };
    TileChoice { real_rows: real, padded64: p64, padded128: p128, block_m }
}

/// `moe_scatter`: destination row of each assignment, and the permuted bf16 rows.
pub fn moe_scatter(
    x: &[f32],
    topk_ids: &[u32],
    off: &Offsets,
    top_k: usize,
    hidden: usize,
    n_experts: usize,
) -> (Vec<u32>, Vec<u16>) {
    let n_assign = topk_ids.len();
    let chunk = PERM_CHUNK as usize;
    let mut dest = vec![0u32; n_assign];
    let mut xp = vec![0u16; n_assign * hidden];
    for c in 0..n_chunks(n_assign) {
        let a0 = c * chunk;
        let ids = &topk_ids[a0..(a0 + chunk).min(n_assign)];
        for (i, &e) in ids.iter().enumerate() {
            let rank = ids[..i].iter().filter(|&&x| x == e).count() as u32;
            dest[a0 + i] = off.offsets[e as usize] + off.chunk_base[c * n_experts + e as usize] + rank;
        }
        for j in 0..ids.len() {
            let src = &x[((a0 + j) / top_k) * hidden..][..hidden];
            let dst = &mut xp[dest[a0 + j] as usize * hidden..][..hidden];
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = to_bf16(s);
            }
        }
    }
    (dest, xp)
}

/// qwen2_moe's shared expert as `moe_unpermute` adds it: its output `[tokens, hidden]` and its
/// gate's logit per token.
#[derive(Debug, Clone, Copy)]
pub struct SharedTerm<'a> {
    pub y: &'a [f32],
    pub gate_logits: &'a [f32],
}

/// `moe_unpermute`: out[t] (+)= Σ_j w[t, j] · yp[dest[t, j]] (+ sigmoid(gate_t) · shared_y[t]),
/// j in pick order, fmaf; yp the experts' bf16 outputs.
#[allow(clippy::too_many_arguments)]
pub fn moe_unpermute(
    yp: &[u16],
    dest: &[u32],
    weights: &[f32],
    shared: Option<SharedTerm<'_>>,
    out: &mut [f32],
    top_k: usize,
    hidden: usize,
    accumulate: bool,
) {
    for t in 0..out.len() / hidden {
        let gate = shared.map(|s| 1.0 / (1.0 + (-s.gate_logits[t]).exp()));
        for c in 0..hidden {
            let mut acc = 0f32;
            for j in 0..top_k {
                acc = weights[t * top_k + j].mul_add(from_bf16(yp[dest[t * top_k + j] as usize * hidden + c]), acc);
            }
            if let (Some(g), Some(s)) = (gate, shared) {
                acc = g.mul_add(s.y[t * hidden + c], acc);
            }
            let o = &mut out[t * hidden + c];
            *o = if accumulate { *o + acc } else { acc };
        }
    }
}
