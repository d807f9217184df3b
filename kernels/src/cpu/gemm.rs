//! The GEMM driver: `out = x · Wᵀ (+ bias)` or `out += x · Wᵀ` with W packed in panels.
//!
//! Work is split into tasks of (row block × panel range) run on the backend's thread pool; within
//! a task, each group of panels stays in cache while the row tiles of the block stream past it.
//! K is never split: each output element is one chain over the full K (see `gemm_tile`), so the
//! split — which depends on M and the thread count — never changes a bit of the result.

use rayon::prelude::*;

use super::gemm_tile::{max_rows, tile_fn, Tile};
use super::isa::Isa;
use super::pack::{PackedWeight, NR};

/// What happens to each finished output element.
#[derive(Clone, Copy)]
pub(crate) enum Epilogue<'a> {
    /// `out = chain (+ bias)`; the bias has `out_features` values.
    Store { bias: Option<&'a [f32]> },
    /// `out = out + chain`.
    Accumulate,
}

/// Rows per tile and panels per tile for large M.
const BIG_TILE_ROWS: usize = 14;
const BIG_TILE_PANELS: usize = 1;
/// Rows per task block for large M (a multiple of the tile rows keeps the tail tile last).
const BLOCK_TILES: usize = 9;
/// Below this many multiply-adds a GEMM runs on the calling thread.
const PARALLEL_MIN_FMAS: usize = 1 << 18;

#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
// SAFETY: tasks write disjoint (row, column) ranges of the output.
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

/// The tile shape for a GEMM of `m` rows: small M gets wide tiles so that enough independent
/// accumulator chains hide the FMA latency.
fn tile_shape(m: usize) -> (usize, usize) {
    if m >= 8 {
        (BIG_TILE_ROWS, BIG_TILE_PANELS)
    } else if m >= 4 {
        (m, 2)
    } else {
        (m, 4)
    }
}

/// Shapes are checked by the caller: `x.len() == m * K`, `out.len() == m * N`, bias of N.
pub(crate) fn gemm(pool: &rayon::ThreadPool, threads: usize, isa: Isa, x: &[f32], m: usize, w: &PackedWeight, epi: Epilogue, out: &mut [f32]) {
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
    let (mr, np) = tile_shape(m);
    let block_rows = if m >= 8 { mr * BLOCK_TILES } else { m };
    let row_blocks = m.div_ceil(block_rows);
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
    let out_ptr = SharedOut(out.as_mut_ptr());
    let wdata = w.data.as_slice();
    let run_task = |task: usize| {
        let out_ptr = out_ptr;
        let (rb, cc) = (task / col_chunks, task % col_chunks);
        let (r0, r1) = (rb * block_rows, ((rb + 1) * block_rows).min(m));
        let (g0, g1) = (cc * groups_per_chunk, ((cc + 1) * groups_per_chunk).min(groups));
        for g in g0..g1 {
            let p0 = g * np;
            let npp = np.min(panels - p0);
            let col0 = p0 * NR;
            let ncols = (npp * NR).min(n - col0);
            let mut r = r0;
            while r < r1 {
                let rows = mr.min(r1 - r).min(max_rows(npp));
                let Some(kernel) = tile_fn(isa, rows, npp) else { unreachable!("tile {rows}x{npp} outside the table") };
                let tile = Tile {
                    k,
                    a: x[r * k..].as_ptr(),
                    lda: k,
                    b: wdata[p0 * w.panel_stride()..].as_ptr(),
                    panel_stride: w.panel_stride(),
                    // SAFETY: (r, col0) is inside `out`; tasks own disjoint tiles.
                    c: unsafe { out_ptr.0.add(r * n + col0) },
                    ldc: n,
                    ncols,
                    bias: bias.map_or(std::ptr::null(), |b| b[col0..].as_ptr()),
                    accumulate,
                };
                // SAFETY: the tile's rows, K, panels and columns are in bounds of x, W and out.
                unsafe { kernel(&tile) };
                r += rows;
            }
        }
    };
    if tasks > 1 {
        pool.install(|| (0..tasks).into_par_iter().with_max_len(1).for_each(run_task));
    } else {
        run_task(0);
    }
}
