//! Twin of kernels/cuda/mma_tile_v1.cuh (`gemm_tile_v1`), the first tensor-core tile, down to the
//! fragments: the cp.async chunk loads into the padded shared tiles, each lane's fragment
//! registers read with the kernel's 32-bit shared loads, the mma emulated by fragments.rs's
//! [`mma_m16n8k16`], and the epilogue's stores.

use super::fragments::{mma_m16n8k16, AFrag, BFrag};
use super::mma_tile::Tile;
use crate::cuda::sources::consts::{GEMM_V1_BK, GEMM_V1_BN};

pub(crate) const BN: usize = GEMM_V1_BN as usize;
const BK: usize = GEMM_V1_BK as usize;
const LD: usize = BK + 8;

/// A shared-memory tile of bf16, `rows × LD`.
struct SmemTile {
    data: Vec<u16>,
}

impl SmemTile {
    fn new(rows: usize) -> Self {
        SmemTile { data: vec![0; rows * LD] }
    }
    /// A 32-bit load at (row, col): col and col + 1, the lower address in the low half.
    fn word(&self, row: usize, col: usize) -> u32 {
        self.data[row * LD + col] as u32 | (self.data[row * LD + col + 1] as u32) << 16
    }
}

/// `gemm_tile_v1<BM>`: one block of `bm * 2` threads.
pub(crate) fn gemm_tile_v1(bm: usize, t: Tile<'_>, c: &mut [f32]) {
    let threads = bm * 2;
    let warps = threads / 32;
    let Tile { a, w: w_e, row_base, r0, rows: rows_e, n0, n, k, beta } = t;

    let mut a_s = [SmemTile::new(bm), SmemTile::new(bm)];
    let mut b_s = [SmemTile::new(BN), SmemTile::new(BN)];
    // cp.async of 16 bytes (8 bf16) per chunk id; src-size 0 zero-fills.
    let load_stage = |a_s: &mut SmemTile, b_s: &mut SmemTile, k0: usize| {
        for id in 0..bm * 4 {
            let (r, kc) = (id >> 2, (id & 3) * 8);
            let ok = r0 + r < rows_e && k0 + kc < k;
            for i in 0..8 {
                a_s.data[r * LD + kc + i] = if ok { a[(row_base + r0 + r) * k + k0 + kc + i] } else { 0 };
            }
        }
        for id in 0..BN * 4 {
            let (r, kc) = (id >> 2, (id & 3) * 8);
            let ok = n0 + r < n && k0 + kc < k;
            for i in 0..8 {
                b_s.data[r * LD + kc + i] = if ok { w_e[(n0 + r) * k + k0 + kc + i] } else { 0 };
            }
        }
    };

    // acc[warp][mi][ni] is the warp's registers for one 16x8 mma tile.
    let mut acc = vec![[[[[0f32; 4]; 32]; 4]; 2]; warps];
    let n_k = k.div_ceil(BK);
    {
        let (a0, b0) = (&mut a_s[0], &mut b_s[0]);
        load_stage(a0, b0, 0);
    }
    for kt in 0..n_k {
        let stage = kt & 1;
        if kt + 1 < n_k {
            let (a1, b1) = (&mut a_s[stage ^ 1], &mut b_s[stage ^ 1]);
            load_stage(a1, b1, (kt + 1) * BK);
        }
        for kk in (0..BK).step_by(16) {
            for (warp, wacc) in acc.iter_mut().enumerate() {
                let (warp_m, warp_n) = (warp >> 1, warp & 1);
                let mut af: [AFrag; 2] = [[[0u32; 4]; 32]; 2];
                let mut bfr: [BFrag; 4] = [[[0u32; 2]; 32]; 4];
                for lane in 0..32 {
                    let (g, tg) = (lane >> 2, lane & 3);
                    for (mi, afm) in af.iter_mut().enumerate() {
                        let rm = warp_m * 32 + mi * 16 + g;
                        let sa = &a_s[stage];
                        afm[lane] = [
                            sa.word(rm, kk + tg * 2),
                            sa.word(rm + 8, kk + tg * 2),
                            sa.word(rm, kk + tg * 2 + 8),
                            sa.word(rm + 8, kk + tg * 2 + 8),
                        ];
                    }
                    for (ni, bfn) in bfr.iter_mut().enumerate() {
                        let cn = warp_n * 32 + ni * 8 + g;
                        let sb = &b_s[stage];
                        bfn[lane] = [sb.word(cn, kk + tg * 2), sb.word(cn, kk + tg * 2 + 8)];
                    }
                }
                for mi in 0..2 {
                    for ni in 0..4 {
                        mma_m16n8k16(&mut wacc[mi][ni], &af[mi], &bfr[ni]);
                    }
                }
            }
        }
    }

    for (warp, wacc) in acc.iter().enumerate() {
        let (warp_m, warp_n) = (warp >> 1, warp & 1);
        for lane in 0..32 {
            let (g, tg) = (lane >> 2, lane & 3);
            for mi in 0..2 {
                for ni in 0..4 {
                    for half in 0..2 {
                        let r = r0 + warp_m * 32 + mi * 16 + g + half * 8;
                        let col = n0 + warp_n * 32 + ni * 8 + tg * 2;
                        if r >= rows_e {
                            continue;
                        }
                        let dst = (row_base + r) * n;
                        for (j, v) in [(col, wacc[mi][ni][lane][half * 2]), (col + 1, wacc[mi][ni][lane][half * 2 + 1])]
                        {
                            if j < n {
                                let o = &mut c[dst + j];
                                *o = if beta != 0.0 { v + beta * *o } else { v };
                            }
                        }
                    }
                }
            }
        }
    }
}
