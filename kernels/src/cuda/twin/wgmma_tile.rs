//! Twin of kernels/cuda/wgmma_tile.cuh (`wgmma_gemm_tile`): the cp.async chunk copies into the
//! 128-byte-swizzled stage ring (byte addressed from the ring's 1024-byte-aligned start, as the
//! kernel addresses it), the ring's schedule (copies STAGES - 2 K steps ahead into the slot of
//! the step two behind), and each `wgmma.mma_async.m64n128k16` evaluated from its two
//! shared-memory descriptors by the PTX ISA's definitions, independently of the copies' swizzle
//! expression: the descriptor's fields ("Matrix Descriptor Format"), the canonical K-major layout
//! with 128-byte swizzling (element (row, k) at start + (row / 8) · SBO + (row % 8) · 128 + 2k,
//! then the address's bits 4-6 XOR-ed with its bits 7-9), and the accumulator fragment of
//! m64nNk16 ("Register Fragment for matrix D"). Each k16 step's 16 products are summed in k
//! order and added to the accumulator, as fragments.rs's mma.m16n8k16: in this twin the wgmma
//! tile gives the mma.sync tile's bits; on the device, tests/cuda_gpu.rs reports whether it does.
//! The epilogues are mma_tile.rs's store helpers, fed the wgmma fragments' positions.

use super::mma_tile::{gemm_block_order, gemm_swiglu_row, store_f32, store_swiglu, Smem, Tile, TileOut};
use super::warp::from_bf16;
use crate::cuda::sources::consts::WG_BK;
use crate::cuda::tma::TmaBox;
use crate::cuda::WgmmaShape;

const BK: usize = WG_BK as usize;

/// `wg_swz`: the byte offset of 16-byte chunk `chunk` (0..7) of row `row` in a tile of
/// 128-byte rows, the chunk XOR-ed with row % 8.
fn wg_swz(row: usize, chunk: usize) -> usize {
    row * 128 + ((chunk ^ (row & 7)) << 4)
}

/// `wg_desc`: the descriptor of a 128-byte-swizzled K-major operand at shared address `addr`.
fn wg_desc(addr: usize) -> u64 {
    ((addr as u64 & 0x3FFFF) >> 4) | (1 << 16) | ((1024u64 >> 4) << 32) | (1 << 62)
}

/// The byte address of element (row, k) of a wgmma operand given by descriptor `desc`, by the
/// PTX ISA's layout for the 128-byte swizzle (the only mode the kernel uses).
fn operand_address(desc: u64, row: usize, k: usize) -> usize {
    assert_eq!(desc >> 62, 1, "descriptor {desc:#x} is not in the 128-byte swizzle mode");
    assert_eq!((desc >> 49) & 7, 0, "descriptor {desc:#x} has a base offset");
    let start = ((desc & 0x3FFF) << 4) as usize;
    let sbo = (((desc >> 32) & 0x3FFF) << 4) as usize;
    assert!(k < 16 && (start % 128) + 2 * k < 128, "k {k} leaves the 128-byte row at {start}");
    let linear = start + (row / 8) * sbo + (row % 8) * 128 + 2 * k;
    linear ^ (((linear >> 7) & 7) << 4)
}

/// `wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 d, da, db, 1, 1, 1, 0, 0`: d[t] is
/// thread t's 64 accumulators (t = 32 w + l of the warpgroup), d[t][i] the output element
/// (16 w + l / 4 + 8 ((i / 2) % 2), 8 (i / 4) + 2 (l % 4) + i % 2).
fn wgmma_m64n128k16(d: &mut [[f32; 64]], smem: &Smem, da: u64, db: u64) {
    let a: Vec<[f32; 16]> =
        (0..64).map(|r| std::array::from_fn(|k| from_bf16(smem.bf16_at(operand_address(da, r, k))))).collect();
    let b: Vec<[f32; 16]> =
        (0..128).map(|r| std::array::from_fn(|k| from_bf16(smem.bf16_at(operand_address(db, r, k))))).collect();
    for (t, dt) in d.iter_mut().enumerate() {
        let (w, l) = (t / 32, t % 32);
        for (i, di) in dt.iter_mut().enumerate() {
            let row = 16 * w + l / 4 + 8 * ((i >> 1) & 1);
            let col = 8 * (i >> 2) + 2 * (l % 4) + (i & 1);
            let mut sum = 0f32;
            for kk in 0..16 {
                sum += a[row][kk] * b[col][kk];
            }
            *di += sum;
        }
    }
}

/// How a tile's stages are filled.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Feed<'a> {
    /// wgmma_tile.cuh: every thread's cp.async chunks, STAGES - 2 K steps ahead.
    CpAsync,
    /// wgmma_tma_tile.cuh: the producer's TMA boxes per K step (tiles of 128 rows), through the
    /// boxes the host encodes: `a_box` over the tile's `a`, `w_box` over `w_all`, the whole weight
    /// matrix the map covers, in which the tile's weight row 0 is `w_row0` (an expert's first
    /// row in the grouped GEMM; 0 in the dense one). The twin fills each step's slot just before
    /// the consumers read it; that the kernel's mbarriers give the same order is shown by the
    /// model in `twin/wgmma_tma.rs`.
    Tma { a_box: TmaBox, w_box: TmaBox, w_all: &'a [u16], w_row0: usize },
}

/// `wgmma_gemm_tile<BM, BN, EPI>` (`feed` CpAsync) or `wgmma_tma_gemm_tile<BN>` (`feed` Tma):
/// one block, its threads replayed in order between the kernel's barriers.
pub(crate) fn wgmma_gemm_tile(bm: usize, bn: usize, t: Tile<'_>, out: TileOut<'_>, feed: Feed<'_>) {
    let shape = WgmmaShape::of(bm, bn);
    let (stages, threads) = (shape.stages, shape.threads as usize);
    let swiglu = matches!(out, TileOut::Swiglu(_));
    let nw = bn / 128;
    let (a_stage, stage) = (bm * BK * 2, (bm + bn) * BK * 2);
    let (a_chunks, b_chunks) = (bm * 8 / threads, bn * 8 / threads);
    assert_eq!(stages * stage + 1024, shape.smem_bytes);
    let mut smem = Smem::new(stages * stage);
    let load_stage = |smem: &mut Smem, slot: usize, k0: usize| {
        let (as_, bs) = (slot * stage, slot * stage + a_stage);
        for tid in 0..threads {
            for i in 0..a_chunks {
                let id = tid + i * threads;
                let (r, ch) = (id >> 3, id & 7);
                let ok = t.r0 + r < t.rows && k0 + ch * 8 < t.k;
                let src = ok.then(|| &t.a[(t.row_base + t.r0 + r) * t.k + ch * 8 + k0..]);
                smem.cp_async16(as_ + wg_swz(r, ch), src);
            }
            for i in 0..b_chunks {
                let id = tid + i * threads;
                let (r, ch) = (id >> 3, id & 7);
                let ok = t.n0 + r < t.n && k0 + ch * 8 < t.k;
                let w_row = if swiglu { gemm_swiglu_row(t.n0 + r, t.n >> 1) } else { t.n0 + r };
                let src = ok.then(|| &t.w[w_row * t.k + ch * 8 + k0..]);
                smem.cp_async16(bs + wg_swz(r, ch), src);
            }
        }
    };

    // acc[wg][j][thread of the warpgroup][i]
    let mut acc = vec![vec![vec![[0f32; 64]; 128]; nw]; bm / 64];
    let n_k = t.k.div_ceil(BK);
    // The TMA tile's SwiGLU reads W as two boxes of bn / 2 rows (gate rows n0 / 2 .., up rows
    // n / 2 + n0 / 2 ..): the split layout its epilogue reads.
    let tma = match feed {
        Feed::Tma { a_box, w_box, w_all, w_row0 } => Some((a_box, w_box, w_all, w_row0)),
        Feed::CpAsync => None,
    };
    let split = tma.is_some() && swiglu;
    if let Some((a, b, ..)) = &tma {
        assert_eq!(bm, 128, "the TMA tile has 128 rows");
        let w_boxes = if split { 2 } else { 1 };
        assert_eq!(a.box_bytes() + w_boxes * b.box_bytes(), stage, "the transaction bytes are the stage");
    }
    if tma.is_none() {
        for s in 0..stages - 2 {
            if s < n_k {
                load_stage(&mut smem, s, s * BK);
            }
        }
    }
    for kt in 0..n_k {
        let next = kt + stages - 2;
        if let Some((a, b, w_all, w_row0)) = &tma {
            let dst = (kt % stages) * stage;
            tma_load_2d(&mut smem, dst, t.a, a, kt * BK, t.row_base + t.r0);
            if split {
                tma_load_2d(&mut smem, dst + a_stage, w_all, b, kt * BK, w_row0 + t.n0 / 2);
                let up = w_row0 + t.n / 2 + t.n0 / 2;
                tma_load_2d(&mut smem, dst + a_stage + (bn / 2) * BK * 2, w_all, b, kt * BK, up);
            } else {
                tma_load_2d(&mut smem, dst + a_stage, w_all, b, kt * BK, w_row0 + t.n0);
            }
        } else if next < n_k {
            load_stage(&mut smem, next % stages, next * BK);
        }
        for (wg, acc_wg) in acc.iter_mut().enumerate() {
            let as_ = (kt % stages) * stage + wg * (64 * 128);
            let bs = (kt % stages) * stage + a_stage;
            for kk in 0..BK / 16 {
                for (j, acc_j) in acc_wg.iter_mut().enumerate() {
                    wgmma_m64n128k16(acc_j, &smem, wg_desc(as_ + kk * 32), wg_desc(bs + j * (128 * 128) + kk * 32));
                }
            }
        }
    }

    if split {
        // wgmma_store_swiglu_split: a thread's gate in flat register f < 32 nw of acc[..][nw][64],
        // its up in f + 32 nw; act[r, n0 / 2 + c] for tile column c.
        let TileOut::Swiglu(act) = out else { unreachable!("split is SwiGLU") };
        for (wg, acc_wg) in acc.iter().enumerate() {
            for tw in 0..128 {
                let (warp, lane) = (tw / 32, tw % 32);
                for f in (0..32 * nw).step_by(4) {
                    for half in 0..2 {
                        let (fg, rl) = (f + 2 * half, wg * 64 + warp * 16 + (lane >> 2) + half * 8);
                        let fu = fg + 32 * nw;
                        let (g, u) = (&acc_wg[fg / 64][tw], &acc_wg[fu / 64][tw]);
                        let (ig, iu) = (fg % 64, fu % 64);
                        let cl = (fg / 64) * 128 + (ig >> 2) * 8 + (lane & 3) * 2;
                        store_swiglu(act, &t, rl, 0, cl, [g[ig], g[ig + 1]], [u[iu], u[iu + 1]]);
                    }
                }
            }
        }
        return;
    }

    // Every thread's registers per wgmma with its tile-local row and n8 block: block b of a
    // wgmma is registers 4b .. 4b + 3, (4b, 4b + 1) on row rl and (4b + 2, 4b + 3) on rl + 8.
    // SwiGLU visits the gate blocks (b even); the up block b + 1 is 4 registers on.
    let step = if swiglu { 2 } else { 1 };
    let mut pairs = Vec::new(); // (rl, block column, tg, the registers, i)
    for (wg, acc_wg) in acc.iter().enumerate() {
        for (j, acc_j) in acc_wg.iter().enumerate() {
            for (tw, d) in acc_j.iter().enumerate() {
                let (warp, lane) = (tw / 32, tw % 32);
                for b in (0..16).step_by(step) {
                    for half in 0..2 {
                        let rl = wg * 64 + warp * 16 + (lane >> 2) + half * 8;
                        pairs.push((rl, j * 128 + b * 8, lane & 3, d, 4 * b + 2 * half));
                    }
                }
            }
        }
    }
    match out {
        TileOut::F32(c) => {
            for (rl, block_col, tg, d, i) in pairs {
                store_f32(c, &t, rl, block_col + tg * 2, [d[i], d[i + 1]]);
            }
        }
        TileOut::Swiglu(act) => {
            for (rl, block_col, tg, d, i) in pairs {
                let (gate, up) = ([d[i], d[i + 1]], [d[i + 4], d[i + 5]]);
                store_swiglu(act, &t, rl, block_col, block_col + tg * 2, gate, up);
            }
        }
    }
}

/// `tma_load_2d` (cp.async.bulk.tensor.2d, CU_TENSOR_MAP_SWIZZLE_128B): the box of `b` at (inner
/// coordinate `c0`, outer `c1`) of the row-major bf16 matrix `src` into shared memory at `dst`
/// (1024-byte aligned), from the encode arguments the device gets: the box row-major, its inner
/// dimension contiguous, then the address's bits 4-6 XOR-ed with its bits 7-9; elements outside
/// the global dimensions read as zero.
pub(crate) fn tma_load_2d(smem: &mut Smem, dst: usize, src: &[u16], b: &TmaBox, c0: usize, c1: usize) {
    assert_eq!(dst % 1024, 0, "TMA destination {dst} is not 1024-byte aligned");
    let ([cols, rows], [stride], [box_cols, box_rows]) = b.encode_args();
    assert_eq!(box_cols * 2, 128, "the 128-byte swizzle spans the box's inner dimension");
    for r in 0..box_rows as usize {
        for e in 0..box_cols as usize {
            let (gr, gc) = (c1 + r, c0 + e);
            let v = if (gr as u64) < rows && (gc as u64) < cols { src[gr * (stride as usize / 2) + gc] } else { 0 };
            let linear = dst + (r * box_cols as usize + e) * 2;
            smem.set_bf16(linear ^ (((linear >> 7) & 7) << 4), v);
        }
    }
}

/// The dense kernels' grid over an `m x n` output at BLOCK_N `bn` (rows in 128s), each block's
/// tile from `gemm_block_order`, fed by `feed`, into `out`.
fn dense_tiles(bn: usize, t: Tile<'_>, mut out: TileOut<'_>, feed: Feed<'_>) {
    let (tiles_m, tiles_n) = (t.rows.div_ceil(128), t.n.div_ceil(bn));
    for by in 0..tiles_n {
        for bx in 0..tiles_m {
            let (tm, tn) = gemm_block_order(bx, by, tiles_m, tiles_n);
            wgmma_gemm_tile(128, bn, Tile { r0: tm * 128, n0: tn * bn, ..t }, out.reborrow(), feed);
        }
    }
}

/// Twin of kernels/cuda/gemm_wgmma.cu's `dense_gemm_wgmma_bn128` / `_bn256`.
#[allow(clippy::too_many_arguments)]
pub fn dense_gemm_wgmma(bn: usize, x: &[u16], w: &[u16], out: &mut [f32], m: usize, n: usize, k: usize, beta: f32) {
    dense_tiles(bn, Tile { a: x, w, row_base: 0, r0: 0, rows: m, n0: 0, n, k, beta }, TileOut::F32(out), Feed::CpAsync);
}

/// Twin of kernels/cuda/gemm_wgmma.cu's `dense_gemm_wgmma_tma_bn128` / `_bn256`.
#[allow(clippy::too_many_arguments)]
pub fn dense_gemm_wgmma_tma(bn: usize, x: &[u16], w: &[u16], out: &mut [f32], m: usize, n: usize, k: usize, beta: f32) {
    if m == 0 {
        return; // no tile (the host launches none)
    }
    let t = Tile { a: x, w, row_base: 0, r0: 0, rows: m, n0: 0, n, k, beta };
    let (a_box, w_box) = TmaBox::dense_gemm(m, n, k, bn).expect("the TMA boxes");
    dense_tiles(bn, t, TileOut::F32(out), Feed::Tma { a_box, w_box, w_all: w, w_row0: 0 });
}

/// Twin of kernels/cuda/gemm_wgmma.cu's `dense_gemm_wgmma_tma_swiglu_bn128` / `_bn256`.
pub fn dense_gemm_wgmma_tma_swiglu(bn: usize, x: &[u16], w: &[u16], act: &mut [u16], m: usize, n: usize, k: usize) {
    if m == 0 {
        return;
    }
    let t = Tile { a: x, w, row_base: 0, r0: 0, rows: m, n0: 0, n, k, beta: 0.0 };
    // As the host's launch_swiglu encodes them: W in boxes of bn / 2 rows (gate, then up).
    let (a_box, w_box) = (TmaBox::new(m, k, 128).expect("x box"), TmaBox::new(n, k, bn / 2).expect("w box"));
    dense_tiles(bn, t, TileOut::Swiglu(act), Feed::Tma { a_box, w_box, w_all: w, w_row0: 0 });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_fields_are_where_the_isa_puts_them() {
        let d = wg_desc(0x1_2400);
        assert_eq!(d & 0x3FFF, 0x1240, "start address >> 4");
        assert_eq!((d >> 16) & 0x3FFF, 1, "leading byte offset");
        assert_eq!((d >> 32) & 0x3FFF, 64, "stride byte offset 1024 >> 4");
        assert_eq!((d >> 49) & 7, 0, "base offset");
        assert_eq!(d >> 62, 1, "128-byte swizzle");
    }

    /// The copies' swizzle (wg_swz) and the layout wgmma reads by its descriptors (the ISA's)
    /// agree on every element of a 1024-byte-aligned tile, for every 64-row warpgroup slice and
    /// every k16 step's start; and a quarter-warp's eight copies (one row's chunks) land on
    /// eight different 16-byte bank groups.
    #[test]
    fn copies_put_each_element_where_the_descriptor_reads_it() {
        let tile = 3 * 1024 * 16; // a stage's A or B tile start: 1024-byte aligned
        for rows in [64usize, 128] {
            for base_row in (0..256).step_by(rows) {
                for kk in 0..BK / 16 {
                    let desc = wg_desc(tile + base_row * 128 + kk * 32);
                    for r in 0..rows {
                        for k in 0..16 {
                            let kcol = kk * 16 + k;
                            let written = tile + wg_swz(base_row + r, kcol / 8) + 2 * (kcol % 8);
                            assert_eq!(operand_address(desc, r, k), written, "row {r} k {kcol}");
                        }
                    }
                }
            }
        }
        for q in 0..256 / 8 {
            let banks: std::collections::BTreeSet<usize> =
                (0..8).map(|l| (wg_swz((q * 8 + l) >> 3, (q * 8 + l) & 7) / 16) % 8).collect();
            assert_eq!(banks.len(), 8, "quarter-warp {q}");
        }
    }
}
