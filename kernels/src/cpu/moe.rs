//! The CPU MoE op: routing, the permutation into expert order, the grouped expert SwiGLU in
//! several variants, and the weighted un-permute into the residual.
//!
//! Every variant runs the GEMM microkernels of `gemm_tile` with full-K chains started from zero,
//! exactly as `matmul` does, so each expert output element is the same f32 chain whichever
//! variant, tile shape, row position or thread computes it: the variants are bitwise identical
//! and differ only in cost. What they trade (see [`CpuMoeVariant`]):
//! - `grouped`: work items of up to one row block (≤ 126 rows) of one expert, each run start to
//!   finish (gate_up → silu → down) by one thread; tall tiles (14 rows × 1 panel): an expert's
//!   weights stream once per block and every panel row feeds 14 rows of FMAs.
//! - `small_m`: the same items with wide tiles (≤ 3 rows × 4 panels): four weight streams in
//!   flight per thread for the first row tile, the other row tiles re-read the panels from L2.
//!   For experts with few rows, where streaming the weights from memory is the cost.
//! - `expert_gemm`: the existing threaded GEMM per expert, one expert after another (all threads
//!   on one expert's rows, gathered); a fork-join per GEMM, no imbalance between experts.
//! - `padded64` / `padded128`: CPU twins of the GPU's BLOCK_M 64 / 128 grouped GEMM: items of one
//!   tile of BM rows, partial tiles padded with zero rows that are computed and thrown away.
//! - `grouped_bf16`: `grouped` with the experts' weights streamed as bf16 panels and widened in
//!   registers by its own microkernel (`moe_tile`): half the bytes from memory, two extra
//!   shuffle µops per panel row. Only when every expert weight of the layer is exactly a bf16
//!   (a bf16 checkpoint) and on AVX-512: then the widened values are the f32 weights and the bits
//!   those of the other variants. Otherwise it runs the f32 panels.

use std::time::{Duration, Instant};

use rayon::prelude::*;

use super::elementwise;
use super::gemm::{self, Epilogue};
use super::gemm_tile::{tile_fn, Tile, AVX2_TILE_ROWS};
use super::isa::Isa;
use super::moe_tile::{bf16_tile_fn, Bf16Panels, Bf16Tile};
use super::pack::{PackedWeight, NR};
use super::scratch::grown;
use super::shared_out::SharedOut;
use super::{check, check_tensor, CpuBackend};
use crate::backend::Result;
use crate::host::HostTensor;
use crate::moe::{
    check_routing, histogram_stats, route_row, BackendVariant, MoeLayerHost, MoeLayerStats, MoeRouting, MoeSelect,
};
use crate::moe_variants;

/// Bytes of one item's packed x rows kept in L2 (as the GEMM driver's row blocks).
const BLOCK_X_BYTES: usize = 512 << 10;
/// Most rows of a tall tile, and most tall tiles per item.
const TALL_ROWS: usize = 14;
const MAX_ROW_BLOCK: usize = 9 * TALL_ROWS;
/// Rows of one routing task (router logits → top-k), below which routing runs on one thread.
const ROUTE_CHUNK: usize = 256;

moe_variants! {
    /// The CPU's grouped-GEMM variants, in [`crate::Backend::moe_variants`] order (see the module
    /// doc for what each trades).
    pub enum CpuMoeVariant for "CPU" {
        /// Items of up to one row block of one expert per thread, tall 14-row tiles.
        Grouped => "grouped", tile_rows: MAX_ROW_BLOCK as u32, padded: false,
            "items of ≤126 rows of one expert per thread, tall 14-row tiles",
        /// `Grouped`'s items with wide 3-row × 4-panel tiles.
        SmallM => "small_m", tile_rows: MAX_ROW_BLOCK as u32, padded: false,
            "items of ≤126 rows of one expert per thread, wide 3-row × 4-panel tiles",
        /// One expert after another through the threaded GEMM.
        ExpertGemm => "expert_gemm", tile_rows: 0, padded: false,
            "one expert at a time, its gathered rows through the threaded GEMM",
        /// CPU twin of the GPU's BLOCK_M 64 tile.
        Padded64 => "padded64", tile_rows: 64, padded: true,
            "GPU BLOCK_M 64 twin: one 64-row tile per item, padding computed",
        /// CPU twin of the GPU's BLOCK_M 128 tile.
        Padded128 => "padded128", tile_rows: 128, padded: true,
            "GPU BLOCK_M 128 twin: one 128-row tile per item, padding computed",
        /// `Grouped` streaming bf16 weight panels (bf16 checkpoints on AVX-512).
        GroupedBf16 => "grouped_bf16", tile_rows: MAX_ROW_BLOCK as u32, padded: false,
            "grouped, streaming bf16 weight panels widened per panel (bf16 checkpoints)",
    }
}

struct CpuSharedExpert {
    gate_up: PackedWeight,
    down: PackedWeight,
    gate: Vec<f32>,
}

/// One MoE layer packed for the CPU: the router and each expert's gate|up and down as GEMM
/// panels (stacked per expert), the bf16 copies of the experts' panels when the values allow
/// it, and the shared expert if any.
pub struct CpuMoeWeights {
    hidden: usize,
    num_experts: usize,
    inter: usize,
    router: PackedWeight,
    gate_up: Vec<PackedWeight>,
    down: Vec<PackedWeight>,
    /// Empty unless every expert weight of the layer is exactly a bf16.
    gate_up_bf16: Vec<Bf16Panels>,
    down_bf16: Vec<Bf16Panels>,
    shared: Option<CpuSharedExpert>,
}

impl CpuMoeWeights {
    pub fn num_experts(&self) -> usize {
        self.num_experts
    }

    /// Whether the `grouped_bf16` variant streams bf16 panels for this layer.
    pub fn has_bf16_panels(&self) -> bool {
        !self.gate_up_bf16.is_empty()
    }
}

/// Where an item's GEMM reads its weight panels from.
#[derive(Clone, Copy)]
enum Panels<'a> {
    F32(&'a PackedWeight),
    /// The bf16 copy of this weight, read by the bf16 microkernel.
    Bf16(&'a PackedWeight, &'a Bf16Panels),
}

/// Per-call buffers, kept by the backend between calls (one MoE call at a time).
#[derive(Default)]
pub(crate) struct MoeBuffers {
    logits: Vec<f32>,
    ids: Vec<u32>,
    weights: Vec<f32>,
    hist: Vec<u32>,
    offsets: Vec<u32>,
    /// Permuted position → the x row it computes (experts' rows contiguous, experts ascending).
    order: Vec<u32>,
    /// (token t, rank j) → its permuted position.
    slots: Vec<u32>,
    /// Expert outputs in permuted order, `[assignments, hidden]`.
    y: Vec<f32>,
    gemm_ws: GemmWorkspace,
    shared_out: Vec<f32>,
    shared_gate: Vec<f32>,
    synthetic_x: Vec<f32>,
}

/// Buffers of the GEMMs run on many rows at once (`expert_gemm`, the shared expert).
#[derive(Default)]
struct GemmWorkspace {
    /// `expert_gemm`: one expert's rows, gathered.
    gathered: Vec<f32>,
    mid: SwigluMid,
}

/// The intermediates of one [`CpuBackend::swiglu_gemm`]: x·[Wg|Wu], then the activation.
#[derive(Default)]
struct SwigluMid {
    gate_up: Vec<f32>,
    act: Vec<f32>,
}

/// Which rows each expert computes: expert e's are `order[offsets[e]..offsets[e + 1]]`.
struct Plan<'a> {
    x: &'a [f32],
    order: &'a [u32],
    offsets: &'a [u32],
}

/// A slice of one expert's rows, run start to finish by one thread.
#[derive(Clone, Copy)]
struct Item {
    expert: u32,
    /// First permuted position.
    start: u32,
    rows: u32,
    /// Rows computed (≥ rows: padding).
    computed: u32,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Tiles {
    Tall,
    Wide,
}

/// Splits `n` into `parts` near-equal consecutive ranges; range `i` is returned.
fn balanced(n: usize, parts: usize, i: usize) -> (usize, usize) {
    let (base, extra) = (n / parts, n % parts);
    let start = i * base + i.min(extra);
    (start, start + base + usize::from(i < extra))
}

/// Panels per tile and most rows per tile for `rows` rows (any shape gives the same bits).
fn tile_shape(isa: Isa, rows: usize, tiles: Tiles) -> (usize, usize) {
    match isa {
        Isa::Avx2 => (1, rows.clamp(1, AVX2_TILE_ROWS)),
        Isa::Portable => (1, 1),
        Isa::Avx512 => match (tiles, rows) {
            (Tiles::Wide, _) | (Tiles::Tall, 0..=3) => (4, rows.clamp(1, 3)),
            (Tiles::Tall, 4..=6) => (2, rows),
            (Tiles::Tall, _) => (1, TALL_ROWS),
        },
    }
}

/// Rows of an item of the `grouped` and `small_m` variants: the packed x rows stay in L2.
fn row_block(hidden: usize) -> usize {
    ((BLOCK_X_BYTES / (hidden.max(1) * 4)) / TALL_ROWS * TALL_ROWS).clamp(TALL_ROWS, MAX_ROW_BLOCK)
}

/// Packs `m` rows, `rows_of(i)` (None: a zero padding row), into row tiles of the given count,
/// each tile k-major (`dst[tile_start·k + kk·tile_rows + i]`).
fn pack_rows<'x>(dst: &mut [f32], k: usize, m: usize, row_tiles: usize, rows_of: impl Fn(usize) -> Option<&'x [f32]>) {
    for t in 0..row_tiles {
        let (r, r_end) = balanced(m, row_tiles, t);
        let rows = r_end - r;
        let tile = &mut dst[r * k..r_end * k];
        for i in 0..rows {
            match rows_of(r + i) {
                Some(src) => {
                    for (d, &v) in tile[i..].iter_mut().step_by(rows).zip(src) {
                        *d = v;
                    }
                }
                None => {
                    for d in tile[i..].iter_mut().step_by(rows) {
                        *d = 0.0;
                    }
                }
            }
        }
    }
}

/// `c[m, N] = packed · Wᵀ` on the calling thread: every panel group, every row tile.
///
/// # Safety
/// `c` must be valid for `m` rows of `ldc` floats, `N ≤ ldc`; `packed` holds `m × K` values
/// packed by [`pack_rows`] with the same `row_tiles`; bf16 panels only on AVX-512.
// The microkernel driver takes the GEMM's raw geometry as scalars, as BLAS does.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_rows(
    isa: Isa,
    packed: &[f32],
    m: usize,
    row_tiles: usize,
    np: usize,
    panels_of: Panels,
    c: *mut f32,
    ldc: usize,
) {
    let w = match panels_of {
        Panels::F32(w) | Panels::Bf16(w, _) => w,
    };
    let (k, n) = (w.in_features, w.out_features);
    let panels = w.panels();
    let stride = w.panel_stride();
    for g in 0..panels.div_ceil(np) {
        let p0 = g * np;
        let npp = np.min(panels - p0);
        let col0 = p0 * NR;
        let ncols = (npp * NR).min(n - col0);
        for t in 0..row_tiles {
            let (r, r_end) = balanced(m, row_tiles, t);
            let rows = r_end - r;
            if let Panels::Bf16(_, half) = panels_of {
                let Some(kernel) = bf16_tile_fn(rows, npp) else {
                    unreachable!("bf16 tile {rows}x{npp} outside the table")
                };
                let tile = Bf16Tile {
                    k,
                    a: packed[r * k..].as_ptr(),
                    b: half.as_slice()[p0 * stride..].as_ptr(),
                    panel_stride: stride,
                    c: c.add(r * ldc + col0),
                    ldc,
                    ncols,
                };
                kernel(&tile);
                continue;
            }
            let Some(kernel) = tile_fn(isa, rows, npp) else { unreachable!("tile {rows}x{npp} outside the table") };
            let tile = Tile {
                k,
                a: packed[r * k..].as_ptr(),
                b: w.data.as_slice()[p0 * stride..].as_ptr(),
                panel_stride: stride,
                c: c.add(r * ldc + col0),
                ldc,
                ncols,
                bias: std::ptr::null(),
                accumulate: false,
                // The whole K in one chain: the same bits as the K-blocked GEMM.
                first: true,
                last: true,
                partial: std::ptr::null_mut(),
            };
            kernel(&tile);
        }
    }
}

/// One item start to finish on the calling thread: gather and pack its x rows, gate_up,
/// silu·up, down, into `out` (`rows` rows of `hidden`; padding rows go to scratch only).
///
/// # Safety
/// `out` must be valid for `item.rows` rows of `w.hidden` floats, written by no one else.
#[allow(clippy::too_many_arguments)]
unsafe fn run_item(
    isa: Isa,
    w: &CpuMoeWeights,
    item: Item,
    tiles: Tiles,
    bf16: bool,
    plan: &Plan,
    scratch: &mut Vec<f32>,
    out: *mut f32,
) {
    let (h, i) = (w.hidden, w.inter);
    let (m, real) = (item.computed as usize, item.rows as usize);
    let padded = m > real;
    let (np, mr) = tile_shape(isa, m, tiles);
    let row_tiles = m.div_ceil(mr);
    let bf16 = bf16 && isa == Isa::Avx512 && w.has_bf16_panels();
    let buf = grown(scratch, m * (2 * h + 4 * i));
    let (px, rest) = buf.split_at_mut(m * h);
    let (gu, rest) = rest.split_at_mut(m * 2 * i);
    let (act, rest) = rest.split_at_mut(m * i);
    let (pa, tmp) = rest.split_at_mut(m * i);
    let start = item.start as usize;
    pack_rows(px, h, m, row_tiles, |r| {
        (r < real).then(|| {
            let t = plan.order[start + r] as usize;
            &plan.x[t * h..(t + 1) * h]
        })
    });
    let e = item.expert as usize;
    let (wgu, wd) = if bf16 {
        (Panels::Bf16(&w.gate_up[e], &w.gate_up_bf16[e]), Panels::Bf16(&w.down[e], &w.down_bf16[e]))
    } else {
        (Panels::F32(&w.gate_up[e]), Panels::F32(&w.down[e]))
    };
    gemm_rows(isa, px, m, row_tiles, np, wgu, gu.as_mut_ptr(), 2 * i);
    elementwise::silu_mul_rows(isa, gu, i, act);
    pack_rows(pa, i, m, row_tiles, |r| Some(&act[r * i..(r + 1) * i]));
    if padded {
        gemm_rows(isa, pa, m, row_tiles, np, wd, tmp.as_mut_ptr(), h);
        std::ptr::copy_nonoverlapping(tmp.as_ptr(), out, real * h);
    } else {
        gemm_rows(isa, pa, m, row_tiles, np, wd, out, h);
    }
}

/// The work items of a tiled variant: each expert's rows cut into `block`-row slices
/// (balanced), padded to `block` when `pad`; largest first, for balance across threads.
fn items(hist: &[u32], offsets: &[u32], block: usize, pad: bool) -> Vec<Item> {
    let mut out = Vec::new();
    for (e, &n) in hist.iter().enumerate() {
        let n = n as usize;
        if n == 0 {
            continue;
        }
        let parts = n.div_ceil(block);
        for p in 0..parts {
            let (a, b) = if pad { (p * block, ((p + 1) * block).min(n)) } else { balanced(n, parts, p) };
            let computed = if pad { block } else { b - a };
            out.push(Item {
                expert: e as u32,
                start: offsets[e] + a as u32,
                rows: (b - a) as u32,
                computed: computed as u32,
            });
        }
    }
    out.sort_by(|a, b| b.computed.cmp(&a.computed).then(a.expert.cmp(&b.expert)));
    out
}

impl CpuBackend {
    pub(crate) fn pack_moe(&self, w: &MoeLayerHost) -> Result<CpuMoeWeights> {
        w.validate()?;
        let (h, e, i) = (w.hidden, w.num_experts, w.expert_inter);
        let pack = |data: &[f32], n: usize, k: usize| PackedWeight::pack(&self.pool, data, n, k);
        let gate_up: Vec<PackedWeight> = w.gate_up.chunks_exact(2 * i * h).map(|d| pack(d, 2 * i, h)).collect();
        let down: Vec<PackedWeight> = w.down.chunks_exact(h * i).map(|d| pack(d, h, i)).collect();
        let halves = |ws: &[PackedWeight]| {
            ws.iter().map(|w| Bf16Panels::from_exact(w.data.as_slice())).collect::<Option<Vec<_>>>()
        };
        let (gate_up_bf16, down_bf16) = match (halves(&gate_up), halves(&down)) {
            (Some(a), Some(b)) => (a, b),
            _ => (vec![], vec![]),
        };
        let shared = w.shared.map(|s| CpuSharedExpert {
            gate_up: pack(s.gate_up, 2 * s.inter, h),
            down: pack(s.down, h, s.inter),
            gate: s.gate.to_vec(),
        });
        Ok(CpuMoeWeights {
            hidden: h,
            num_experts: e,
            inter: i,
            router: pack(w.router, e, h),
            gate_up,
            down,
            gate_up_bf16,
            down_bf16,
            shared,
        })
    }

    /// Computes `y` (permuted order) for every row of `plan` with `variant`.
    fn run_variant(
        &self,
        w: &CpuMoeWeights,
        variant: CpuMoeVariant,
        plan: &Plan,
        hist: &[u32],
        ws: &mut GemmWorkspace,
        y: &mut [f32],
    ) {
        let (h, isa) = (w.hidden, self.isa);
        let (tiles, block, pad, bf16) = match variant {
            CpuMoeVariant::Grouped => (Tiles::Tall, row_block(h), false, false),
            CpuMoeVariant::SmallM => (Tiles::Wide, row_block(h), false, false),
            CpuMoeVariant::Padded64 => (Tiles::Tall, 64, true, false),
            CpuMoeVariant::Padded128 => (Tiles::Tall, 128, true, false),
            CpuMoeVariant::GroupedBf16 => (Tiles::Tall, row_block(h), false, true),
            CpuMoeVariant::ExpertGemm => return self.run_expert_gemm(w, plan, hist, ws, y),
        };
        let work = items(hist, plan.offsets, block, pad);
        // Shared by the threads: items write disjoint row ranges of the output.
        let out = SharedOut(y.as_mut_ptr());
        let run = |it: &Item| {
            self.moe_scratch.with(|scratch| {
                // SAFETY: the item's rows `start..start + rows` of y are its own.
                unsafe { run_item(isa, w, *it, tiles, bf16, plan, scratch, out.ptr().add(it.start as usize * h)) }
            })
        };
        if self.threads > 1 && work.len() > 1 {
            self.pool.install(|| work.par_iter().with_max_len(1).for_each(run));
        } else {
            work.iter().for_each(run);
        }
    }

    fn run_expert_gemm(&self, w: &CpuMoeWeights, plan: &Plan, hist: &[u32], ws: &mut GemmWorkspace, y: &mut [f32]) {
        let h = w.hidden;
        for (e, &n) in hist.iter().enumerate() {
            let n = n as usize;
            if n == 0 {
                continue;
            }
            let start = plan.offsets[e] as usize;
            let x = grown(&mut ws.gathered, n * h);
            for (dst, &t) in x.chunks_exact_mut(h).zip(&plan.order[start..start + n]) {
                dst.copy_from_slice(&plan.x[t as usize * h..(t as usize + 1) * h]);
            }
            self.swiglu_gemm(x, n, &w.gate_up[e], &w.down[e], &mut ws.mid, &mut y[start * h..(start + n) * h]);
        }
    }

    /// `out = x · wᵀ` for `rows` rows through the threaded GEMM (no bias).
    fn gemm_store(&self, x: &[f32], rows: usize, w: &PackedWeight, out: &mut [f32]) {
        let epi = Epilogue::Store { bias: None };
        gemm::gemm(&self.pool, &self.gemm_scratch, self.threads, self.isa, x, rows, w, epi, out);
    }

    /// `out = down(silu(x·Wg) * (x·Wu))` for `n` rows through the threaded GEMM, `gate_up`
    /// holding the gate rows then the up rows: `expert_gemm`'s experts and the shared expert.
    fn swiglu_gemm(
        &self,
        x: &[f32],
        n: usize,
        gate_up: &PackedWeight,
        down: &PackedWeight,
        mid: &mut SwigluMid,
        out: &mut [f32],
    ) {
        let i = down.in_features;
        let gu = grown(&mut mid.gate_up, n * 2 * i);
        self.gemm_store(x, n, gate_up, gu);
        let act = grown(&mut mid.act, n * i);
        let isa = self.isa;
        self.for_row_chunks(n, 2 * i, i, gu, act, |g, a| elementwise::silu_mul_rows(isa, g, i, a));
        self.gemm_store(act, n, down, out);
    }

    /// Router logits → each row's top-k ids and weights.
    fn route(&self, x: &HostTensor, w: &CpuMoeWeights, routing: MoeRouting, b: &mut MoeBuffers) {
        let (t, e, k) = (x.rows, w.num_experts, routing.top_k);
        let logits = grown(&mut b.logits, t * e);
        self.gemm_store(&x.data, t, &w.router, logits);
        b.ids.resize(t * k, 0);
        b.weights.resize(t * k, 0.0);
        let route_rows = |((l, ids), ws): ((&[f32], &mut [u32]), &mut [f32])| {
            for ((l, ids), ws) in l.chunks_exact(e).zip(ids.chunks_exact_mut(k)).zip(ws.chunks_exact_mut(k)) {
                route_row(l, routing, f32::exp, ids, ws);
            }
        };
        let chunks = logits
            .chunks(ROUTE_CHUNK * e)
            .zip(b.ids.chunks_mut(ROUTE_CHUNK * k))
            .zip(b.weights.chunks_mut(ROUTE_CHUNK * k));
        if self.threads > 1 && t > ROUTE_CHUNK {
            let chunks: Vec<_> = chunks.collect();
            self.pool.install(|| chunks.into_par_iter().for_each(route_rows));
        } else {
            chunks.for_each(route_rows);
        }
    }

    /// The histogram, each expert's first permuted position, and the permutation both ways.
    fn permute(num_experts: usize, rows: usize, k: usize, b: &mut MoeBuffers) {
        b.hist.clear();
        b.hist.resize(num_experts, 0);
        for &e in &b.ids[..rows * k] {
            b.hist[e as usize] += 1;
        }
        b.offsets.clear();
        b.offsets.push(0);
        for e in 0..num_experts {
            let next = b.offsets[e] + b.hist[e];
            b.offsets.push(next);
        }
        let mut cursor = b.offsets.clone();
        b.order.resize(rows * k, 0);
        b.slots.resize(rows * k, 0);
        for (a, &e) in b.ids[..rows * k].iter().enumerate() {
            let r = cursor[e as usize];
            cursor[e as usize] += 1;
            b.order[r as usize] = (a / k) as u32;
            b.slots[a] = r;
        }
    }

    /// qwen2_moe's shared expert for every row, and its sigmoid gate.
    fn shared_expert(&self, x: &HostTensor, s: &CpuSharedExpert, b: &mut MoeBuffers) {
        let (t, h) = (x.rows, x.cols);
        let out = grown(&mut b.shared_out, t * h);
        self.swiglu_gemm(&x.data, t, &s.gate_up, &s.down, &mut b.gemm_ws.mid, out);
        let isa = self.isa;
        let gate = grown(&mut b.shared_gate, t);
        self.for_row_chunks(t, h, 1, &x.data, gate, |xi, gi| elementwise::dot_rows(isa, xi, &s.gate, gi));
        for g in gate.iter_mut() {
            *g = 1.0 / (1.0 + (-*g).exp());
        }
    }

    /// `acc[t] += Σ_j w[t,j] · y[slot(t,j)] (+ gate_t · shared_t)`, in rank order.
    fn combine(&self, acc: &mut HostTensor, k: usize, shared: bool, b: &MoeBuffers) {
        let h = acc.cols;
        let (y, slots, weights) = (&b.y, &b.slots, &b.weights);
        let (sh, gate) = (&b.shared_out, &b.shared_gate);
        let rows_per_chunk = (super::ROW_OP_CHUNK_ELEMS / (h * (k + 1))).max(1);
        let combine_rows = |(c, chunk): (usize, &mut [f32])| {
            let mut s = vec![0f32; h];
            for (i, out) in chunk.chunks_exact_mut(h).enumerate() {
                let t = c * rows_per_chunk + i;
                s.fill(0.0);
                for j in 0..k {
                    let w = weights[t * k + j];
                    let r = slots[t * k + j] as usize;
                    for (s, &v) in s.iter_mut().zip(&y[r * h..(r + 1) * h]) {
                        *s += w * v;
                    }
                }
                if shared {
                    let g = gate[t];
                    for (s, &v) in s.iter_mut().zip(&sh[t * h..(t + 1) * h]) {
                        *s += g * v;
                    }
                }
                for (o, &s) in out.iter_mut().zip(&s) {
                    *o += s;
                }
            }
        };
        if self.threads > 1 && acc.rows > rows_per_chunk {
            self.pool.install(|| acc.data.par_chunks_mut(rows_per_chunk * h).enumerate().for_each(combine_rows));
        } else {
            acc.data.chunks_mut(rows_per_chunk * h).enumerate().for_each(combine_rows);
        }
    }

    pub(crate) fn moe_ffn_impl(
        &self,
        x: &HostTensor,
        w: &CpuMoeWeights,
        routing: MoeRouting,
        select: MoeSelect,
        acc: &mut HostTensor,
    ) -> Result<MoeLayerStats> {
        check_tensor(x, "moe_ffn")?;
        check_tensor(acc, "moe_ffn")?;
        check(x.cols == w.hidden && acc.cols == w.hidden && acc.rows == x.rows, || {
            format!("moe_ffn: x [{}, {}], acc [{}, {}], hidden {}", x.rows, x.cols, acc.rows, acc.cols, w.hidden)
        })?;
        check_routing(routing, w.num_experts)?;
        let variants = CpuMoeVariant::descriptions();
        let mut guard = self.moe_buffers.lock().unwrap_or_else(|p| p.into_inner());
        let b = &mut *guard;
        let (t, k, h) = (x.rows, routing.top_k, w.hidden);
        self.route(x, w, routing, b);
        Self::permute(w.num_experts, t, k, b);
        let v = select.choose(&b.hist, &variants)?;
        let variant = CpuMoeVariant::from_index(v)?;
        let y = grown(&mut b.y, t * k * h);
        let plan = Plan { x: &x.data, order: &b.order, offsets: &b.offsets };
        self.run_variant(w, variant, &plan, &b.hist, &mut b.gemm_ws, y);
        if let Some(s) = &w.shared {
            self.shared_expert(x, s, b);
        }
        self.combine(acc, k, w.shared.is_some(), b);
        let (rows, padded_rows, active_experts, max_expert_rows) = histogram_stats(&b.hist, &variants[v]);
        Ok(MoeLayerStats { variant: v as u32, tokens: t as u32, rows, padded_rows, active_experts, max_expert_rows })
    }

    pub(crate) fn moe_time_variant_impl(&self, w: &CpuMoeWeights, variant: usize, hist: &[u32]) -> Result<Duration> {
        let n = CpuMoeVariant::ALL.len();
        check(variant < n, || format!("moe_time_variant: variant {variant} of {n}"))?;
        let variant = CpuMoeVariant::from_index(variant)?;
        check(hist.len() == w.num_experts, || {
            format!("moe_time_variant: {} counts for {} experts", hist.len(), w.num_experts)
        })?;
        let rows: usize = hist.iter().map(|&n| n as usize).sum();
        let h = w.hidden;
        let mut guard = self.moe_buffers.lock().unwrap_or_else(|p| p.into_inner());
        let b = &mut *guard;
        if b.synthetic_x.len() < rows * h {
            // Activations of the size a normed hidden state has; the values do not matter.
            let mut s = 0x9e37_79b9u32;
            b.synthetic_x.resize(rows * h, 0.0);
            for v in b.synthetic_x.iter_mut() {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                *v = (s as f32 / u32::MAX as f32) * 2.0 - 1.0;
            }
        }
        b.offsets.clear();
        b.offsets.push(0);
        for (e, &n) in hist.iter().enumerate() {
            let next = b.offsets[e] + n;
            b.offsets.push(next);
        }
        b.order.clear();
        b.order.extend(0..rows as u32);
        let y = grown(&mut b.y, rows * h);
        let plan = Plan { x: &b.synthetic_x, order: &b.order, offsets: &b.offsets };
        let (d0, t0) = (run_queue_delay(), Instant::now());
        self.run_variant(w, variant, &plan, hist, &mut b.gemm_ws, y);
        let wall = t0.elapsed();
        // Time the process's threads spent runnable but waiting for a core (other processes on
        // the shared cores), spread over the backend's threads, is not the variant's cost.
        let waited = run_queue_delay().saturating_sub(d0) / self.threads.max(1) as u64;
        Ok(wall.saturating_sub(Duration::from_nanos(waited)).max(wall / 4))
    }
}

/// Nanoseconds the threads of this process have spent runnable but not running, waiting for a
/// core; 0 where that is not readable.
fn run_queue_delay() -> u64 {
    super::schedstat::process_schedstat().waiting_ns
}

/// The cost model before calibration: per-expert costs from FMA and weight-streaming rates
/// typical of an AVX-512 core (measured on the bench shapes, 2 threads; the autotune replaces
/// them with this machine's figures).
pub(crate) fn default_cost(hidden: usize, inter: usize, threads: usize) -> crate::moe::MoeCostModel {
    use crate::moe::{MoeCostModel, VariantCost, COST_KNOTS};
    let flops_per_row = 6.0 * (hidden * inter) as f64;
    let weight_bytes = 12.0 * (hidden * inter) as f64;
    let threads = threads.max(1) as f64;
    // Seconds per expert computing n rows: streaming its weights once, or the FMAs, whichever
    // is longer, at `rate` FLOP/s per thread (padded variants' tables are by computed rows too).
    let table = |rate: f64, bytes_per_s: f64| -> Vec<f64> {
        COST_KNOTS
            .iter()
            .map(|&n| (weight_bytes / bytes_per_s).max(n as f64 * flops_per_row / rate) / threads)
            .collect()
    };
    let entry = |v: CpuMoeVariant, per_expert: Vec<f64>| VariantCost {
        variant: v.name().into(),
        per_call: 0.0,
        per_expert,
        per_row: 0.0,
        per_padded_row: 0.0,
    };
    MoeCostModel {
        // Generally cheapest first (near-ties go to the earlier one).
        variants: vec![
            entry(CpuMoeVariant::GroupedBf16, table(80e9, 60e9)),
            entry(CpuMoeVariant::Grouped, table(80e9, 30e9)),
            entry(CpuMoeVariant::SmallM, table(65e9, 32e9)),
            entry(CpuMoeVariant::ExpertGemm, table(70e9, 25e9)),
            entry(CpuMoeVariant::Padded64, table(80e9, 30e9)),
            entry(CpuMoeVariant::Padded128, table(80e9, 30e9)),
        ],
        origin: "default".into(),
        tie_margin: 0.03,
    }
}
