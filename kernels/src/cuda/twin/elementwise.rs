//! Twins of the row-wise and element-wise kernels: silu_mul.cu, kv_write.cu, gather.cu,
//! convert.cu and score_head.cu. Each loops like its kernel's grid.

use super::warp::{block_sum, from_bf16, strided_fma_partials, to_bf16};
use crate::cuda::sources::consts::SCORE_THREADS;

/// `silu_times` (common.cuh): silu(g) * u, the one expression of silu_mul.cu and the GEMM's
/// SwiGLU epilogue.
pub(crate) fn silu_times(g: f32, u: f32) -> f32 {
    (g / (1.0 + (-g).exp())) * u
}

fn silu_mul_one(gate_up: &[f32], i: usize, inter: usize) -> f32 {
    let (r, c) = (i / inter, i % inter);
    silu_times(gate_up[r * 2 * inter + c], gate_up[r * 2 * inter + inter + c])
}

/// `silu_mul_f32`: out[i] over rows * inter elements.
pub fn silu_mul_f32(gate_up: &[f32], out: &mut [f32], inter: usize) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = silu_mul_one(gate_up, i, inter);
    }
}

/// `silu_mul_bf16`: the same, stored as bf16 (the MoE down-projection input).
pub fn silu_mul_bf16(gate_up: &[f32], out: &mut [u16], inter: usize) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = to_bf16(silu_mul_one(gate_up, i, inter));
    }
}

/// `write_kv`: grid (rows). The pools are the layer's slices.
#[allow(clippy::too_many_arguments)]
pub fn write_kv(
    qkv: &[f32],
    row_slots: &[u32],
    k_pool: &mut [u16],
    v_pool: &mut [u16],
    qkv_cols: usize,
    k_offset: usize,
    v_offset: usize,
    kv_dim: usize,
) {
    for (row, &slot) in row_slots.iter().enumerate() {
        let src = &qkv[row * qkv_cols..(row + 1) * qkv_cols];
        let slot = slot as usize;
        for j in 0..kv_dim {
            k_pool[slot * kv_dim + j] = to_bf16(src[k_offset + j]);
            v_pool[slot * kv_dim + j] = to_bf16(src[v_offset + j]);
        }
    }
}

/// `embed_rows`: out[r] = table[ids[r]] (bf16 → f32).
pub fn embed_rows(table: &[u16], ids: &[u32], out: &mut [f32], hidden: usize) {
    for (r, &id) in ids.iter().enumerate() {
        let src = &table[id as usize * hidden..(id as usize + 1) * hidden];
        for (o, &h) in out[r * hidden..(r + 1) * hidden].iter_mut().zip(src) {
            *o = from_bf16(h);
        }
    }
}

/// `gather_rows`: out[r] = x[rows[r]].
pub fn gather_rows(x: &[f32], rows: &[u32], out: &mut [f32], cols: usize) {
    for (r, &src) in rows.iter().enumerate() {
        out[r * cols..(r + 1) * cols].copy_from_slice(&x[src as usize * cols..(src as usize + 1) * cols]);
    }
}

/// `cast_bf16`.
pub fn cast_bf16(x: &[f32], y: &mut [u16]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o = to_bf16(v);
    }
}

/// `broadcast_rows`: out[i] = v[i % cols].
pub fn broadcast_rows(v: &[f32], out: &mut [f32], cols: usize) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = v[i % cols];
    }
}

/// `dot_rows`: grid (rows), block SCORE_THREADS, lane-strided fmaf then block_sum.
pub fn dot_rows(x: &[f32], v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..rows)
        .map(|r| {
            let xr = &x[r * cols..(r + 1) * cols];
            block_sum(&strided_fma_partials(SCORE_THREADS as usize, cols, |c| (xr[c], v[c])))
        })
        .collect()
}
