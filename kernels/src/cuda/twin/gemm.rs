//! The dense projections: on the device, cuBLAS `GemmEx` with bf16 A and B, f32 C, f32 compute
//! (the activation is rounded to bf16 by `cast_bf16` first). cuBLAS's reduction order is its own;
//! this twin fixes the numerics that matter — bf16 inputs, f32 accumulation — with a sequential
//! fmaf over K.

use super::mma_tile::{gemm_block_order, gemm_tile, gemm_tile_to, Tile, TileOut};
use super::warp::from_bf16;
use crate::cuda::GemmShape;

/// out[r, n] = beta * out[r, n] + Σ_k x[r, k] · w[n, k], with x and w bf16, accumulation in f32.
pub fn gemm_bf16(x: &[u16], w: &[u16], out: &mut [f32], rows: usize, n: usize, k: usize, beta: f32) {
    for r in 0..rows {
        let xr = &x[r * k..(r + 1) * k];
        for c in 0..n {
            let wr = &w[c * k..(c + 1) * k];
            let mut acc = 0f32;
            for (&a, &b) in xr.iter().zip(wr) {
                acc = from_bf16(a).mul_add(from_bf16(b), acc);
            }
            let o = &mut out[r * n + c];
            *o = if beta == 0.0 { acc } else { beta.mul_add(*o, acc) };
        }
    }
}

/// The (first row, first column) of each block's tile of a dense launch at BLOCK_M `block_m`
/// over an `m x n` output, in launch order (grid (ceil(m / bm), ceil(n / bn)), x fastest, each
/// block's tile from `gemm_block_order`).
fn dense_tiles(block_m: usize, m: usize, n: usize) -> impl Iterator<Item = (usize, usize)> {
    let bn = GemmShape::of(block_m).bn;
    let (tiles_m, tiles_n) = (m.div_ceil(block_m), n.div_ceil(bn));
    (0..tiles_n).flat_map(move |by| {
        (0..tiles_m).map(move |bx| {
            let (tm, tn) = gemm_block_order(bx, by, tiles_m, tiles_n);
            (tm * block_m, tn * bn)
        })
    })
}

/// Twin of kernels/cuda/gemm.cu's `dense_gemm_bm64` / `dense_gemm_bm128`: grid
/// (ceil(m / bm), ceil(n / bn)), each block the `gemm_tile` that `gemm_block_order` gives it.
#[allow(clippy::too_many_arguments)]
pub fn dense_gemm(block_m: usize, x: &[u16], w: &[u16], out: &mut [f32], m: usize, n: usize, k: usize, beta: f32) {
    for (r0, n0) in dense_tiles(block_m, m, n) {
        gemm_tile(block_m, Tile { a: x, w, row_base: 0, r0, rows: m, n0, n, k, beta }, out);
    }
}

/// Twin of kernels/cuda/gemm.cu's `dense_gemm_swiglu_bm64` / `dense_gemm_swiglu_bm128`: the
/// `dense_gemm` grid over the n = 2 · inter rows of the stacked [gate; up] weight, each tile
/// reading them interleaved and storing act[m, inter] = bf16(silu(gate) · up).
#[allow(clippy::too_many_arguments)]
pub fn dense_gemm_swiglu(block_m: usize, x: &[u16], w: &[u16], act: &mut [u16], m: usize, n: usize, k: usize) {
    for (r0, n0) in dense_tiles(block_m, m, n) {
        gemm_tile_to(block_m, Tile { a: x, w, row_base: 0, r0, rows: m, n0, n, k, beta: 0.0 }, TileOut::Swiglu(act));
    }
}

/// Twin of kernels/cuda/gemm.cu's `dense_gemm_v1_bm64` / `dense_gemm_v1_bm128`: grid
/// (ceil(m / bm), ceil(n / 64)), each block one `gemm_tile_v1`.
#[allow(clippy::too_many_arguments)]
pub fn dense_gemm_v1(block_m: usize, x: &[u16], w: &[u16], out: &mut [f32], m: usize, n: usize, k: usize, beta: f32) {
    use super::mma_tile::Tile;
    use super::mma_tile_v1::{gemm_tile_v1, BN};
    for bx in 0..m.div_ceil(block_m) {
        for by in 0..n.div_ceil(BN) {
            gemm_tile_v1(
                block_m,
                Tile { a: x, w, row_base: 0, r0: bx * block_m, rows: m, n0: by * BN, n, k, beta },
                out,
            );
        }
    }
}
