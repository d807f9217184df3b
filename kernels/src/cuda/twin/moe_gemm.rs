//! Twin of kernels/cuda/moe_gemm.cu and moe_gemm_wgmma.cu: the grouped launch over the
//! device-built tile schedule, each block one `gemm_tile` (twin in mma_tile.rs) or, on the wgmma
//! engine, one `wgmma_gemm_tile` of BM x 128 (wgmma_tile.rs), cp.async-fed at BM 64 and
//! TMA-fed at BM 128 through the boxes the host encodes (`TmaBox::grouped_gemm`: over all the
//! permuted rows and all the experts' weights, at the expert's first row of each).

use super::mma_tile::{gemm_tile_to, Tile, TileOut};
use super::wgmma_tile::{wgmma_gemm_tile, Feed};
use crate::cuda::tma::TmaBox;
use crate::cuda::GemmShape;

/// Arguments of one grouped-GEMM launch (both variants get the same).
#[derive(Debug, Clone, Copy)]
pub struct GroupedGemmArgs<'a> {
    /// Permuted activations [rows, k], bf16.
    pub a: &'a [u16],
    /// Expert weights [n_experts, n, k], bf16.
    pub w: &'a [u16],
    pub counts: &'a [u32],
    pub offsets: &'a [u32],
    /// This variant's tile schedule (expert, first row) pairs.
    pub tiles: &'a [u32],
    /// [tiles at 64, tiles at 128].
    pub n_tiles: [u32; 2],
    /// The selector's BLOCK_M.
    pub choice: u32,
    pub n: usize,
    pub k: usize,
}

/// `moe_gemm_bm64` / `moe_gemm_bm128`: grid (the host's worst-case tile count, ceil(n / BN)).
/// Writes only rows of scheduled tiles; `c` must be sized [rows, n].
pub fn moe_gemm(block_m: usize, args: GroupedGemmArgs<'_>, grid_x: usize, c: &mut [f32]) {
    moe_gemm_to(block_m, false, args, grid_x, TileOut::F32(c))
}

/// `moe_gemm_swiglu_bm64` / `moe_gemm_swiglu_bm128`: the same launch over the stacked [gate; up]
/// weights (n = 2 · inter), storing act [rows, inter] = bf16(silu(gate) · up).
pub fn moe_gemm_swiglu(block_m: usize, args: GroupedGemmArgs<'_>, grid_x: usize, act: &mut [u16]) {
    moe_gemm_to(block_m, false, args, grid_x, TileOut::Swiglu(act))
}

/// `moe_gemm_wgmma_bm64` / `_bm128`: [`moe_gemm`] on the wgmma tile (columns in 128s).
pub fn moe_gemm_wgmma(block_m: usize, args: GroupedGemmArgs<'_>, grid_x: usize, c: &mut [f32]) {
    moe_gemm_to(block_m, true, args, grid_x, TileOut::F32(c))
}

/// `moe_gemm_wgmma_swiglu_bm64` / `_bm128`: [`moe_gemm_swiglu`] on the wgmma tile.
pub fn moe_gemm_wgmma_swiglu(block_m: usize, args: GroupedGemmArgs<'_>, grid_x: usize, act: &mut [u16]) {
    moe_gemm_to(block_m, true, args, grid_x, TileOut::Swiglu(act))
}

fn moe_gemm_to(block_m: usize, wgmma: bool, args: GroupedGemmArgs<'_>, grid_x: usize, mut out: TileOut<'_>) {
    assert!(block_m == 64 || block_m == 128, "BLOCK_M {block_m}");
    if args.choice != block_m as u32 {
        return;
    }
    let n_tiles = if block_m == 64 { args.n_tiles[0] } else { args.n_tiles[1] };
    let (n, k) = (args.n, args.k);
    let bn = if wgmma { 128 } else { GemmShape::of(block_m).bn };
    let swiglu = matches!(out, TileOut::Swiglu(_));
    let n_experts = args.w.len() / (n * k);
    // The 128-row wgmma tiles' TMA boxes, as the host encodes them.
    let boxes = (wgmma && block_m == 128)
        .then(|| TmaBox::grouped_gemm(args.a.len() / k, n_experts, n, k, swiglu).expect("the grouped GEMM's boxes"));
    for tile in 0..grid_x {
        if tile as u32 >= n_tiles {
            continue;
        }
        let (e, r0) = (args.tiles[2 * tile] as usize, args.tiles[2 * tile + 1] as usize);
        for by in 0..n.div_ceil(bn) {
            let t = Tile {
                a: args.a,
                w: &args.w[e * n * k..(e + 1) * n * k],
                row_base: args.offsets[e] as usize,
                r0,
                rows: args.counts[e] as usize,
                n0: by * bn,
                n,
                k,
                beta: 0.0,
            };
            if wgmma {
                let feed = match boxes {
                    Some((a_box, w_box)) => Feed::Tma { a_box, w_box, w_all: args.w, w_row0: e * n },
                    None => Feed::CpAsync,
                };
                wgmma_gemm_tile(block_m, bn, t, out.reborrow(), feed);
            } else {
                gemm_tile_to(block_m, t, out.reborrow());
            }
        }
    }
}

/// Upper bound on a variant's tile count, from host-known sizes only: what the host sizes the
/// grid by (the exact count is computed on the device).
pub fn max_tiles(n_assign: usize, n_experts: usize, block_m: usize) -> usize {
    n_assign / block_m + n_assign.min(n_experts)
}
