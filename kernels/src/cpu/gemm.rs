//! The GEMM driver: `out = x · Wᵀ (+ bias)` or `out += x · Wᵀ` with W packed in panels.
//!
//! Work is split into tasks of (row block × panel range) run on the backend's thread pool. A task
//! packs its block's x rows tile by tile (k-major, one sequential stream per tile, kept in L2),
//! then for each group of panels runs the row tiles of the block past it.
//!
//! K is never split across tasks: each output element is one multiply-add chain over the full K
//! in order (see `gemm_tile`; past `KC` the chain is continued, bit-exactly, from stored f32
//! partial sums), so the split — which depends on M and the thread count — and the tile shapes —
//! which depend on M — never change a bit of the result.

use rayon::prelude::*;

use super::gemm_tile::{tile_fn, Tile, AVX2_TILE_ROWS};
use super::isa::Isa;
use super::pack::{PackedWeight, NR};
use super::scratch::{grown, ScratchPool};
use super::shared_out::SharedOut;

/// What happens to each finished output element.
#[derive(Clone, Copy)]
pub(crate) enum Epilogue<'a> {
    /// `out = chain (+ bias)`; the bias has `out_features` values.
    Store { bias: Option<&'a [f32]> },
    /// `out = out + chain`.
    Accumulate,
}

/// Most rows of a tile for large M (one panel: 14 × 2 accumulators of the 32 registers).
const BIG_TILE_ROWS: usize = 14;
/// Most row tiles of a task's row block, and most bytes of its packed x rows (kept in L2 while
/// every panel of the task streams past them).
const BLOCK_TILES: usize = 9;
const BLOCK_X_BYTES: usize = 512 << 10;
/// K steps per block, for long K only: a tile's panel slice (`KC × NR` floats, 256 KiB) stays in
/// L2 while the row tiles of a block stream past it. (Shorter K runs in one block: with packed x
/// rows the panel streams from L2 fast enough, and measured no slower than L1-sized blocks.)
/// Fixed, so the blocking depends on K alone.
const KC: usize = 2048;
/// Below this many multiply-adds a GEMM runs on the calling thread.
const PARALLEL_MIN_FMAS: usize = 1 << 18;

/// Panels per tile and most rows per tile for a GEMM of `m` rows: small M gets wide tiles so
/// that enough independent accumulator chains hide the FMA latency.
fn tile_shape(isa: Isa, m: usize) -> (usize, usize) {
    match isa {
        // 16 registers of 8 (AVX2) or 4 (SSE) lanes: one or two rows of one panel.
        Isa::Avx2 => return (1, m.min(AVX2_TILE_ROWS)),
        Isa::Portable => return (1, 1),
        Isa::Avx512 => {}
    }
    match m {
        0..=3 => (4, m),
        4..=6 => (2, m),
        _ => (1, BIG_TILE_ROWS),
    }
}

/// Splits `n` into `parts` near-equal consecutive ranges; range `i` is returned.
fn balanced(n: usize, parts: usize, i: usize) -> (usize, usize) {
    let (base, extra) = (n / parts, n % parts);
    let start = i * base + i.min(extra);
    (start, start + base + usize::from(i < extra))
}

/// Shapes are checked by the caller: `x.len() == m * K`, `out.len() == m * N`, bias of N.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm(
    pool: &rayon::ThreadPool,
    scratch: &ScratchPool<Vec<f32>>,
    threads: usize,
    isa: Isa,
    x: &[f32],
    m: usize,
    w: &PackedWeight,
    epi: Epilogue,
    out: &mut [f32],
) {
    let (k, n) = (w.in_features, w.out_features);
    debug_assert_eq!(x.len(), m * k);
    debug_assert_eq!(out.len(), m * n);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // Empty sums: the chain is zero.
        for row in out.chunks_mut(n) {
            match epi {
                Epilogue::Store { bias: Some(b) } => row.copy_from_slice(b),
                Epilogue::Store { bias: None } => row.fill(0.0),
                Epilogue::Accumulate => {}
            }
        }
        return;
    }
    let (np, mr) = tile_shape(isa, m);
    // Row blocks of at most `bt` tiles, tiles of near-equal rows (tile sizes never change a
    // result bit, so they may follow M).
    let row_tiles = m.div_ceil(mr);
    let bt = (BLOCK_X_BYTES / (mr * k * 4)).clamp(1, BLOCK_TILES);
    let row_blocks = row_tiles.div_ceil(bt);
    let panels = w.panels();
    let groups = panels.div_ceil(np);
    // Enough tasks to balance the threads; for large M the row blocks alone do it.
    let parallel = threads > 1 && m * n * k >= PARALLEL_MIN_FMAS;
    let want_tasks = if parallel { 4 * threads } else { 1 };
    let col_chunks = want_tasks.div_ceil(row_blocks).clamp(1, groups);
    let groups_per_chunk = groups.div_ceil(col_chunks);
    let col_chunks = groups.div_ceil(groups_per_chunk);
    let tasks = row_blocks * col_chunks;

    let (bias, accumulate) = match epi {
        Epilogue::Store { bias } => (bias, false),
        Epilogue::Accumulate => (None, true),
    };
    // Shared by the threads: tasks write disjoint (row, column) ranges of the output.
    let out_ptr = SharedOut(out.as_mut_ptr());
    let wdata = w.data.as_slice();
    let kc = KC;
    let k_blocks = k.div_ceil(kc);
    let block_rows_max = mr * bt;
    let partial_len = if k_blocks > 1 { block_rows_max * np * NR } else { 0 };
    let run_task = |task: usize| {
        scratch.with(|buf| {
            let buf = grown(buf, partial_len + block_rows_max * k);
            // Partial chains of one panel group × the block's rows, between K blocks; and the
            // block's x rows, packed tile by tile k-major: one sequential stream per tile.
            let (partial, packed_x) = buf.split_at_mut(partial_len);
            let (rb, cc) = (task / col_chunks, task % col_chunks);
            let (t0, t1) = balanced(row_tiles, row_blocks, rb);
            let r0 = balanced(m, row_tiles, t0).0;
            for t in t0..t1 {
                let (r, r_end) = balanced(m, row_tiles, t);
                let rows = r_end - r;
                let dst = &mut packed_x[(r - r0) * k..(r_end - r0) * k];
                for (i, src) in x[r * k..r_end * k].chunks_exact(k).enumerate() {
                    for (d, &v) in dst[i..].iter_mut().step_by(rows).zip(src) {
                        *d = v;
                    }
                }
            }
            let (g0, g1) = (cc * groups_per_chunk, ((cc + 1) * groups_per_chunk).min(groups));
            for g in g0..g1 {
                let p0 = g * np;
                let npp = np.min(panels - p0);
                let col0 = p0 * NR;
                let ncols = (npp * NR).min(n - col0);
                for kb in 0..k_blocks {
                    let (k0, k1) = (kb * kc, ((kb + 1) * kc).min(k));
                    for t in t0..t1 {
                        let (r, r_end) = balanced(m, row_tiles, t);
                        let rows = r_end - r;
                        let Some(kernel) = tile_fn(isa, rows, npp) else {
                            unreachable!("tile {rows}x{npp} outside the table")
                        };
                        let tile = Tile {
                            k: k1 - k0,
                            a: packed_x[(r - r0) * k + k0 * rows..].as_ptr(),
                            b: wdata[p0 * w.panel_stride() + k0 * NR..].as_ptr(),
                            panel_stride: w.panel_stride(),
                            // SAFETY: (r, col0) is inside `out`; tasks own disjoint tiles.
                            c: unsafe { out_ptr.ptr().add(r * n + col0) },
                            ldc: n,
                            ncols,
                            bias: bias.map_or(std::ptr::null(), |b| b[col0..].as_ptr()),
                            accumulate,
                            first: kb == 0,
                            last: kb + 1 == k_blocks,
                            partial: partial.as_mut_ptr().wrapping_add((r - r0) * npp * NR),
                        };
                        // SAFETY: the tile's rows, K, panels and columns are in bounds of x, W and out,
                        // and its partial sums in bounds of `partial`.
                        unsafe { kernel(&tile) };
                    }
                }
            }
        })
    };
    if tasks > 1 {
        pool.install(|| (0..tasks).into_par_iter().with_max_len(1).for_each(run_task));
    } else {
        run_task(0);
    }
}
