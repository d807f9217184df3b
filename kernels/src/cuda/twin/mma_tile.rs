//! Twin of kernels/cuda/mma_tile.cuh (`gemm_tile`), down to the tensor-core fragments: the
//! cp.async chunk copies into the XOR-swizzled stage ring of dynamic shared memory (byte
//! addressed as the kernel addresses it), `ldmatrix.x4` evaluated from the 32 lanes' row
//! addresses by the PTX ISA's distribution, `mma.sync.m16n8k16` evaluated from each lane's
//! registers by the ISA's operand layouts ("Matrix Fragments for mma.m16n8k16 with floating point
//! type"), and the epilogue's stores. Every index is the kernel's expression, so a wrong row
//! address, chunk, swizzle, stage or fragment index in the kernel scrambles this twin's output too.

use super::elementwise::silu_times;
use super::fragments::{ldmatrix_x4, ldmatrix_x4_trans, mma_m16n8k16, AFrag, BFrag, CFrag};
use super::warp::to_bf16;
use crate::cuda::sources::consts::{GEMM_BK, GEMM_GROUP_M, GEMM_STAGES};
use crate::cuda::GemmShape;

const BK: usize = GEMM_BK as usize;
const STAGES: usize = GEMM_STAGES as usize;

/// `gemm_swz`: the byte offset of 16-byte chunk `chunk` of row `row` in a stage tile of
/// 64-byte rows, the chunk XOR-ed with (row / 2) % 4.
pub(crate) fn gemm_swz(row: usize, chunk: usize) -> usize {
    row * BK * 2 + ((chunk ^ ((row >> 1) & 3)) << 4)
}

/// A block's dynamic shared memory, addressed in bytes like the kernel's `u32` shared addresses,
/// holding bf16.
pub(crate) struct Smem {
    data: Vec<u16>,
}

impl Smem {
    pub(crate) fn new(bytes: usize) -> Self {
        Smem { data: vec![0; bytes / 2] }
    }

    /// `cp.async.cg.shared.global [dst], [src], 16, src_size`: 8 bf16 from `src`, or 16 zero
    /// bytes when `src` is `None` (src-size 0).
    pub(crate) fn cp_async16(&mut self, dst: usize, src: Option<&[u16]>) {
        assert_eq!(dst % 16, 0, "cp.async destination {dst} is not 16-byte aligned");
        let d = &mut self.data[dst / 2..dst / 2 + 8];
        match src {
            Some(s) => d.copy_from_slice(&s[..8]),
            None => d.fill(0),
        }
    }

    /// Stores the bf16 `v` at byte address `byte` (2-byte aligned): a TMA box element.
    pub(crate) fn set_bf16(&mut self, byte: usize, v: u16) {
        assert_eq!(byte % 2, 0, "bf16 address {byte} is odd");
        self.data[byte / 2] = v;
    }

    /// The bf16 at byte address `byte` (2-byte aligned).
    pub(crate) fn bf16_at(&self, byte: usize) -> u16 {
        assert_eq!(byte % 2, 0, "bf16 address {byte} is odd");
        self.data[byte / 2]
    }

    /// `ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 {r0..r3}, [addr]`: `addrs[l]` is lane
    /// l's byte address, 16-byte aligned; lanes 8i..8i+7 give the rows of matrix i. The
    /// distribution over the lanes is fragments.rs's.
    pub(crate) fn ldmatrix_x4(&self, addrs: &[usize; 32], trans: bool) -> [[u32; 4]; 32] {
        let row = |l: usize| {
            assert_eq!(addrs[l] % 16, 0, "ldmatrix row address {} is not 16-byte aligned", addrs[l]);
            addrs[l] / 2
        };
        if trans {
            ldmatrix_x4_trans(&self.data, row)
        } else {
            ldmatrix_x4(&self.data, row)
        }
    }
}

/// `GemmShape<BM>`: (BN, WM, WN).
fn warp_tiles(bm: usize) -> (usize, usize, usize) {
    match bm {
        64 => (GemmShape::of(64).bn, 32, 32),
        128 => (GemmShape::of(128).bn, 64, 32),
        _ => panic!("no GEMM tile with BLOCK_M {bm}"),
    }
}

/// Where one tile reads and writes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tile<'a> {
    /// Row space of A (row 0 at index 0), [.., k] bf16.
    pub a: &'a [u16],
    /// The weight [n, k] bf16.
    pub w: &'a [u16],
    pub row_base: usize,
    pub r0: usize,
    /// Rows valid from row_base (the tile covers r0 .. r0 + bm of them).
    pub rows: usize,
    pub n0: usize,
    pub n: usize,
    pub k: usize,
    pub beta: f32,
}

/// `gemm_swiglu_row`: the weight row of tile column `col` with the SwiGLU interleave.
pub(crate) fn gemm_swiglu_row(col: usize, inter: usize) -> usize {
    let (b, j) = (col >> 4, col & 15);
    if j < 8 {
        b * 8 + j
    } else {
        inter + b * 8 + j - 8
    }
}

/// Where a tile's epilogue stores: the f32 `c` or the bf16 SwiGLU activation `[.., n / 2]`
/// (`GEMM_EPI_SWIGLU`).
pub(crate) enum TileOut<'a> {
    F32(&'a mut [f32]),
    Swiglu(&'a mut [u16]),
}

impl TileOut<'_> {
    /// The same destination for one more tile.
    pub(crate) fn reborrow(&mut self) -> TileOut<'_> {
        match self {
            TileOut::F32(c) => TileOut::F32(c),
            TileOut::Swiglu(act) => TileOut::Swiglu(act),
        }
    }
}

/// `gemm_tile<BM>`: one block, its threads replayed in order between the kernel's barriers.
pub(crate) fn gemm_tile(bm: usize, t: Tile<'_>, c: &mut [f32]) {
    gemm_tile_to(bm, t, TileOut::F32(c))
}

/// `gemm_tile<BM, EPI>`.
pub(crate) fn gemm_tile_to(bm: usize, t: Tile<'_>, out: TileOut<'_>) {
    let swiglu = matches!(out, TileOut::Swiglu(_));
    let (bn, wm, wn) = warp_tiles(bm);
    let shape = GemmShape::of(bm);
    let warps_n = bn / wn;
    let threads = (bm / wm) * warps_n * 32;
    assert_eq!(threads, shape.threads as usize);
    let (mi_n, ni_n) = (wm / 16, wn / 8);
    let (a_stage, b_stage) = (bm * BK * 2, bn * BK * 2);
    let (a_chunks, b_chunks) = (bm * 4 / threads, bn * 4 / threads);
    let Tile { a, w, row_base, r0, rows, n0, n, k, .. } = t;

    let mut smem = Smem::new(shape.smem_bytes);
    let a_s = 0;
    let b_s = a_s + STAGES * a_stage;
    assert_eq!(b_s + STAGES * b_stage, shape.smem_bytes);

    let load_stage = |smem: &mut Smem, stage: usize, k0: usize| {
        for tid in 0..threads {
            for i in 0..a_chunks {
                let id = tid + i * threads;
                let (r, ch) = (id >> 2, id & 3);
                let ok = r0 + r < rows && k0 + ch * 8 < k;
                let src = (row_base + r0 + r) * k + ch * 8 + k0;
                smem.cp_async16(a_s + stage * a_stage + gemm_swz(r, ch), ok.then(|| &a[src..src + 8]));
            }
            for i in 0..b_chunks {
                let id = tid + i * threads;
                let (r, ch) = (id >> 2, id & 3);
                let ok = n0 + r < n && k0 + ch * 8 < k;
                let w_row = if swiglu { gemm_swiglu_row(n0 + r, n >> 1) } else { n0 + r };
                let src = w_row * k + ch * 8 + k0;
                smem.cp_async16(b_s + stage * b_stage + gemm_swz(r, ch), ok.then(|| &w[src..src + 8]));
            }
        }
    };

    // acc[warp][mi][ni] is the warp's registers for one 16x8 mma tile.
    let warps = threads / 32;
    let mut acc: Vec<Vec<Vec<CFrag>>> = vec![vec![vec![[[0f32; 4]; 32]; ni_n]; mi_n]; warps];
    let n_k = k.div_ceil(BK);
    for s in 0..STAGES - 1 {
        if s < n_k {
            load_stage(&mut smem, s, s * BK);
        }
    }
    for kt in 0..n_k {
        let next = kt + STAGES - 1;
        if next < n_k {
            load_stage(&mut smem, next % STAGES, next * BK);
        }
        let stage = kt % STAGES;
        let (as_, bs) = (a_s + stage * a_stage, b_s + stage * b_stage);
        for kk in 0..BK / 16 {
            for (warp, wacc) in acc.iter_mut().enumerate() {
                let (warp_m, warp_n) = (warp / warps_n, warp % warps_n);
                let lane_addr = |f: &dyn Fn(usize) -> usize| -> [usize; 32] { std::array::from_fn(f) };
                let af: Vec<AFrag> = (0..mi_n)
                    .map(|mi| {
                        let addrs = lane_addr(&|lane| {
                            let (a_row, a_ch) = (warp_m * wm + (lane & 15), lane >> 4);
                            as_ + gemm_swz(a_row + mi * 16, kk * 2 + a_ch)
                        });
                        smem.ldmatrix_x4(&addrs, false)
                    })
                    .collect();
                let mut bfr: Vec<BFrag> = vec![[[0u32; 2]; 32]; ni_n];
                for nj in 0..ni_n / 2 {
                    let addrs = lane_addr(&|lane| {
                        let (b_row, b_ch) = (warp_n * wn + (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
                        bs + gemm_swz(b_row + nj * 16, kk * 2 + b_ch)
                    });
                    let t = smem.ldmatrix_x4(&addrs, false);
                    for lane in 0..32 {
                        bfr[2 * nj][lane] = [t[lane][0], t[lane][1]];
                        bfr[2 * nj + 1][lane] = [t[lane][2], t[lane][3]];
                    }
                }
                for mi in 0..mi_n {
                    for ni in 0..ni_n {
                        mma_m16n8k16(&mut wacc[mi][ni], &af[mi], &bfr[ni]);
                    }
                }
            }
        }
    }

    match out {
        TileOut::F32(c) => for_each_pair(&acc, (warps_n, wm, wn), |rl, cl, v| store_f32(c, &t, rl, cl, v)),
        TileOut::Swiglu(act) => {
            // n8 tiles (2i, 2i + 1): the gate and up of the same act columns.
            for (warp, wacc) in acc.iter().enumerate() {
                let (warp_m, warp_n) = (warp / warps_n, warp % warps_n);
                for lane in 0..32 {
                    let (g, tg) = (lane >> 2, lane & 3);
                    for mi in 0..mi_n {
                        for ni in (0..ni_n).step_by(2) {
                            for half in 0..2 {
                                let rl = warp_m * wm + mi * 16 + g + half * 8;
                                let tile_col = warp_n * wn + ni * 8;
                                let pair = |f: &CFrag| [f[lane][half * 2], f[lane][half * 2 + 1]];
                                store_swiglu(
                                    act,
                                    &t,
                                    rl,
                                    tile_col,
                                    tile_col + tg * 2,
                                    pair(&wacc[mi][ni]),
                                    pair(&wacc[mi][ni + 1]),
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `gemm_store_f32`: c = acc + beta · c for the pair at tile-local (rl, cl), (rl, cl + 1).
pub(crate) fn store_f32(c: &mut [f32], t: &Tile<'_>, rl: usize, cl: usize, v: [f32; 2]) {
    let (r, col) = (t.r0 + rl, t.n0 + cl);
    if r >= t.rows || col >= t.n {
        return;
    }
    let dst = (t.row_base + r) * t.n + col;
    for j in 0..2 {
        if col + j < t.n {
            let o = &mut c[dst + j];
            *o = if t.beta != 0.0 { t.beta.mul_add(*o, v[j]) } else { v[j] };
        }
    }
}

/// `gemm_store_swiglu`: the gate pair at tile columns cl, cl + 1 of the gate n8 tile starting at
/// tile column `gate_col`, the up pair from the n8 tile after it, into act[r, ((n0 + gate_col) /
/// 2) + cl - gate_col ..].
pub(crate) fn store_swiglu(
    act: &mut [u16],
    t: &Tile<'_>,
    rl: usize,
    gate_col: usize,
    cl: usize,
    gate: [f32; 2],
    up: [f32; 2],
) {
    let inter = t.n >> 1;
    let (r, col) = (t.r0 + rl, ((t.n0 + gate_col) >> 1) + cl - gate_col);
    if r >= t.rows || col >= inter {
        return;
    }
    for j in 0..2 {
        act[(t.row_base + r) * inter + col + j] = to_bf16(silu_times(gate[j], up[j]));
    }
}

/// Every accumulator pair of the block's warps, with its tile-local (row, first column): lane
/// (g, tg) holds rows g and g + 8, columns 2tg and 2tg + 1 of each 16x8 mma tile.
fn for_each_pair(
    acc: &[Vec<Vec<CFrag>>],
    (warps_n, wm, wn): (usize, usize, usize),
    mut f: impl FnMut(usize, usize, [f32; 2]),
) {
    for (warp, wacc) in acc.iter().enumerate() {
        let (warp_m, warp_n) = (warp / warps_n, warp % warps_n);
        for lane in 0..32 {
            let (g, tg) = (lane >> 2, lane & 3);
            for (mi, row_tiles) in wacc.iter().enumerate() {
                for (ni, frag) in row_tiles.iter().enumerate() {
                    for half in 0..2 {
                        let (r, col) = (warp_m * wm + mi * 16 + g + half * 8, warp_n * wn + ni * 8 + tg * 2);
                        f(r, col, [frag[lane][half * 2], frag[lane][half * 2 + 1]]);
                    }
                }
            }
        }
    }
}

/// `gemm_block_order`: the (row tile, column tile) that block (bx, by) of a (tiles_m, tiles_n)
/// grid computes.
pub(crate) fn gemm_block_order(bx: usize, by: usize, tiles_m: usize, tiles_n: usize) -> (usize, usize) {
    let group = GEMM_GROUP_M as usize;
    let id = by * tiles_m + bx;
    let per_group = group * tiles_n;
    let first_m = id / per_group * group;
    let group_m = (tiles_m - first_m).min(group);
    let in_group = id % per_group;
    (first_m + in_group % group_m, in_group / group_m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swiglu_interleave_is_a_bijection_pairing_gate_and_up() {
        let inter = 48;
        let mut seen = vec![false; 2 * inter];
        for col in 0..2 * inter {
            let r = gemm_swiglu_row(col, inter);
            assert!(!std::mem::replace(&mut seen[r], true), "row {r} twice");
            // Tile columns 16b + j and 16b + 8 + j: gate and up of act column 8b + j.
            if col & 8 == 0 {
                assert_eq!(gemm_swiglu_row(col + 8, inter), r + inter, "column {col}");
            }
        }
    }

    #[test]
    fn block_order_visits_every_tile_once() {
        for (tm, tn) in [(1, 1), (3, 5), (8, 2), (17, 9), (64, 48)] {
            let mut seen = vec![false; tm * tn];
            for by in 0..tn {
                for bx in 0..tm {
                    let (m, n) = gemm_block_order(bx, by, tm, tn);
                    assert!(m < tm && n < tn, "{tm}x{tn}: block ({bx}, {by}) -> ({m}, {n})");
                    assert!(!std::mem::replace(&mut seen[m * tn + n], true), "{tm}x{tn}: ({m}, {n}) twice");
                }
            }
        }
        // The first GEMM_GROUP_M blocks go down one column of tiles.
        assert_eq!(gemm_block_order(1, 0, 16, 4), (1, 0));
        assert_eq!(gemm_block_order(8, 0, 16, 4), (0, 1));
    }

    #[test]
    fn swizzle_spreads_every_ldmatrix_phase_and_copy_over_all_banks() {
        // Eight consecutive rows from an even row, any one chunk: eight different 16-byte bank
        // groups of the 128-byte line (no bank conflict within an ldmatrix phase).
        for base in (0..128).step_by(8) {
            for ch in 0..4 {
                let mut groups: Vec<usize> = (base..base + 8).map(|r| gemm_swz(r, ch) % 128 / 16).collect();
                groups.sort();
                groups.dedup();
                assert_eq!(groups.len(), 8, "rows {base}.., chunk {ch}");
            }
        }
        // A quarter-warp of cp.async (two rows, four chunks) also covers the eight.
        for r in (0..128).step_by(2) {
            let mut groups: Vec<usize> = (0..8).map(|i| gemm_swz(r + i / 4, i % 4) % 128 / 16).collect::<Vec<_>>();
            groups.sort();
            groups.dedup();
            assert_eq!(groups.len(), 8, "rows {r}, {}", r + 1);
        }
        // And it is a permutation of a row's chunks.
        for r in 0..16 {
            let mut offs: Vec<usize> = (0..4).map(|c| gemm_swz(r, c) - r * 64).collect();
            offs.sort();
            assert_eq!(offs, [0, 16, 32, 48]);
        }
    }

    #[test]
    fn ldmatrix_distributes_rows_and_transposes() {
        // Four 8x8 matrices of distinct values, matrix i's row j at 16 * (8 i + j).
        let mut smem = Smem::new(4 * 8 * 16);
        for i in 0..4 {
            for j in 0..8 {
                let v: Vec<u16> = (0..8).map(|e| (i * 64 + j * 8 + e) as u16).collect();
                smem.cp_async16(16 * (8 * i + j), Some(&v));
            }
        }
        let addrs: [usize; 32] = std::array::from_fn(|l| 16 * l);
        let pack = super::super::fragments::pack;
        let plain = smem.ldmatrix_x4(&addrs, false);
        let trans = smem.ldmatrix_x4(&addrs, true);
        for t in 0..32 {
            for i in 0..4 {
                let (row, e) = (t / 4, 2 * (t % 4));
                let m = |r: usize, c: usize| (i * 64 + r * 8 + c) as u16;
                assert_eq!(plain[t][i], pack(m(row, e), m(row, e + 1)), "lane {t} matrix {i}");
                assert_eq!(trans[t][i], pack(m(e, row), m(e + 1, row)), "lane {t} matrix {i} .trans");
            }
        }
    }
}
