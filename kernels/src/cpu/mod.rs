//! `CpuBackend`: the fast, deterministic CPU implementation of [`Backend`].
//!
//! f32 throughout; SIMD via AVX-512 where the CPU has it, AVX2 + FMA or plain Rust elsewhere
//! (chosen once, see [`Isa`]); multi-threaded on a rayon pool the backend owns (no global pool),
//! with per-thread scratch buffers it owns too. Every op honours the determinism contract of
//! [`crate::backend`]: a row's result depends on that row's inputs and the op's static shapes
//! only — not on the batch, the tiling, the KV slots or the thread count.
//!
//! One file per kernel family: `gemm` (driver) + `gemm_tile` (microkernels) + `pack` (weight
//! panels), `attention`, `norm_rope`, `elementwise`, with `math` (fixed-order reductions, exp).

mod attention;
mod elementwise;
mod gemm;
mod gemm_tile;
mod isa;
mod math;
mod moe;
mod moe_tile;
mod norm_rope;
mod pack;
pub mod schedstat;
mod scratch;
mod shared_out;

use std::sync::{Arc, Mutex};

use rayon::prelude::*;

use std::time::Duration;

use crate::backend::*;
use crate::host::{HostKvCache, HostTensor};
use crate::moe::{BackendVariant, MoeCostModel, MoeLayerHost, MoeLayerStats, MoeRouting, MoeSelect, MoeVariant};

pub use isa::Isa;
pub use moe::{CpuMoeVariant, CpuMoeWeights};
pub use pack::PackedWeight;

use gemm::Epilogue;
use norm_rope::RopeTable;

/// Rows per parallel chunk of the row-wise ops, in elements (rows × cols) — below it one thread.
const ROW_OP_CHUNK_ELEMS: usize = 1 << 15;

/// The CPU backend. Owns its thread pool.
pub struct CpuBackend {
    pool: rayon::ThreadPool,
    gemm_scratch: scratch::ScratchPool<Vec<f32>>,
    attention_scratch: scratch::ScratchPool<attention::Scratch>,
    /// Per-thread intermediates of the MoE variants' work items.
    moe_scratch: scratch::ScratchPool<Vec<f32>>,
    /// Per-call MoE buffers (routing, permutation, expert outputs), reused between calls.
    moe_buffers: Mutex<moe::MoeBuffers>,
    threads: usize,
    isa: Isa,
}

/// An embedding table, packed like a linear weight `[vocab, hidden]` so that it doubles as the
/// LM head; `embed` reads rows back out of the panels.
pub struct CpuEmbedding {
    packed: PackedWeight,
}

/// A [`BatchLayout`] prepared for the CPU: the layout, the distinct positions for the RoPE
/// tables, and the tables built so far (one per rope config, shared by all layers).
pub struct CpuBatch {
    layout: BatchLayout,
    /// Slots the batch was validated against.
    num_slots: usize,
    /// Row → index into `distinct_positions`.
    table_rows: Vec<u32>,
    distinct_positions: Vec<u32>,
    rope_tables: Mutex<Vec<Arc<RopeTable>>>,
}

impl CpuBatch {
    pub fn layout(&self) -> &BatchLayout {
        &self.layout
    }

    fn rope_table(&self, rope: RopeConfig) -> Arc<RopeTable> {
        let mut tables = self.rope_tables.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(t) = tables.iter().find(|t| t.rope == rope) {
            return t.clone();
        }
        let t = Arc::new(RopeTable::new(rope, &self.distinct_positions));
        tables.push(t.clone());
        t
    }
}

fn check(cond: bool, msg: impl FnOnce() -> String) -> Result<()> {
    if cond {
        Ok(())
    } else {
        Err(KernelError::Shape(msg()))
    }
}

fn check_tensor(t: &HostTensor, what: &str) -> Result<()> {
    check(t.data.len() == t.rows * t.cols, || {
        format!("{what}: tensor [{}, {}] holds {} values", t.rows, t.cols, t.data.len())
    })
}

impl CpuBackend {
    /// A backend on the fastest ISA of this CPU with `threads` threads (0 = all available).
    pub fn new(threads: usize) -> Result<Self> {
        Self::with_isa(threads, Isa::detect())
    }

    /// A backend on a given ISA (tests use it to exercise the portable path).
    pub fn with_isa(threads: usize, isa: Isa) -> Result<Self> {
        if !isa.is_supported() {
            return Err(KernelError::Unsupported(format!("this CPU cannot run the {isa:?} path")));
        }
        let threads = if threads == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { threads };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("sieve-cpu-{i}"))
            .build()
            .map_err(|e| KernelError::Device(format!("cannot start {threads} CPU threads: {e}")))?;
        Ok(CpuBackend {
            pool,
            gemm_scratch: scratch::ScratchPool::new(threads),
            attention_scratch: scratch::ScratchPool::new(threads),
            moe_scratch: scratch::ScratchPool::new(threads),
            moe_buffers: Mutex::new(moe::MoeBuffers::default()),
            threads,
            isa,
        })
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f` over chunks of whole rows of `(input, output)`, in parallel when large.
    fn for_row_chunks<F>(&self, rows: usize, in_cols: usize, out_cols: usize, input: &[f32], output: &mut [f32], f: F)
    where
        F: Fn(&[f32], &mut [f32]) + Sync + Send,
    {
        if rows == 0 {
            return;
        }
        let per_chunk = (ROW_OP_CHUNK_ELEMS / in_cols.max(out_cols).max(1)).max(1);
        if self.threads == 1 || rows <= per_chunk {
            f(input, output);
            return;
        }
        let in_chunks = input.par_chunks(per_chunk * in_cols.max(1));
        let out_chunks = output.par_chunks_mut(per_chunk * out_cols.max(1));
        self.pool.install(|| in_chunks.zip(out_chunks).for_each(|(i, o)| f(i, o)));
    }

    fn check_gemm(&self, x: &HostTensor, w: &PackedWeight, out: &HostTensor, op: &str) -> Result<()> {
        check_tensor(x, op)?;
        check_tensor(out, op)?;
        check(x.cols == w.in_features && out.rows == x.rows && out.cols == w.out_features, || {
            format!(
                "{op}: [{}, {}] x [{}, {}]ᵀ -> [{}, {}]",
                x.rows, x.cols, w.out_features, w.in_features, out.rows, out.cols
            )
        })
    }

    /// The one call into the tiled GEMM (`matmul`, `matmul_add`, `lm_logits`): this backend's
    /// pool, scratch, thread count and ISA; the caller has run `check_gemm`.
    fn run_gemm(&self, x: &HostTensor, w: &PackedWeight, epi: Epilogue, out: &mut HostTensor) {
        gemm::gemm(&self.pool, &self.gemm_scratch, self.threads, self.isa, &x.data, x.rows, w, epi, &mut out.data);
    }

    fn check_qkv(&self, qkv: &HostTensor, layout: QkvLayout, batch: &CpuBatch, op: &str) -> Result<()> {
        check_tensor(qkv, op)?;
        check(layout.n_heads > 0 && layout.n_kv_heads > 0 && layout.head_dim > 0, || {
            format!("{op}: empty head layout {layout:?}")
        })?;
        check(layout.n_heads.is_multiple_of(layout.n_kv_heads), || {
            format!("{op}: {} heads not a multiple of {} kv heads", layout.n_heads, layout.n_kv_heads)
        })?;
        check(qkv.cols == layout.qkv_dim(), || {
            format!("{op}: qkv has {} columns, layout {layout:?} needs {}", qkv.cols, layout.qkv_dim())
        })?;
        check(qkv.rows == batch.layout.num_rows(), || {
            format!("{op}: qkv has {} rows, the batch {}", qkv.rows, batch.layout.num_rows())
        })
    }

    fn check_cache(
        &self,
        cache: &HostKvCache,
        layout: QkvLayout,
        layer: usize,
        batch: &CpuBatch,
        op: &str,
    ) -> Result<()> {
        check(
            layer < cache.num_layers && cache.k.len() == cache.num_layers && cache.v.len() == cache.num_layers,
            || format!("{op}: layer {layer} of a {}-layer cache", cache.num_layers),
        )?;
        check(cache.n_kv_heads == layout.n_kv_heads && cache.head_dim == layout.head_dim, || {
            format!(
                "{op}: cache has {}x{} kv heads, layout {}x{}",
                cache.n_kv_heads, cache.head_dim, layout.n_kv_heads, layout.head_dim
            )
        })?;
        let per_layer = cache.num_slots * cache.kv_dim();
        check(cache.k[layer].len() == per_layer && cache.v[layer].len() == per_layer, || {
            format!("{op}: cache layer {layer} is not {} values", per_layer)
        })?;
        check(batch.num_slots <= cache.num_slots, || {
            format!("{op}: batch prepared for {} slots, cache has {}", batch.num_slots, cache.num_slots)
        })
    }
}

impl Backend for CpuBackend {
    type Tensor = HostTensor;
    type Weight = PackedWeight;
    type Vector = Vec<f32>;
    type Embedding = CpuEmbedding;
    type KvCache = HostKvCache;
    type Batch = CpuBatch;
    type MoeWeights = CpuMoeWeights;
    type MoeLog = Vec<MoeLayerStats>;

    fn name(&self) -> String {
        format!("cpu ({:?}, {} threads)", self.isa, self.threads)
    }

    fn linear_weight(&self, data: &[f32], out_features: usize, in_features: usize) -> Result<PackedWeight> {
        check(out_features.checked_mul(in_features) == Some(data.len()), || {
            format!("weight [{out_features}, {in_features}] from {} values", data.len())
        })?;
        Ok(PackedWeight::pack(&self.pool, data, out_features, in_features))
    }

    fn vector(&self, data: &[f32]) -> Result<Vec<f32>> {
        Ok(data.to_vec())
    }

    fn embedding(&self, data: &[f32], vocab: usize, hidden: usize) -> Result<CpuEmbedding> {
        Ok(CpuEmbedding { packed: self.linear_weight(data, vocab, hidden)? })
    }

    fn kv_cache(&self, num_layers: usize, num_slots: usize, n_kv_heads: usize, head_dim: usize) -> Result<HostKvCache> {
        HostKvCache::new(num_layers, num_slots, n_kv_heads, head_dim)
    }

    fn zeros(&self, rows: usize, cols: usize) -> Result<HostTensor> {
        check(rows.checked_mul(cols).is_some(), || format!("tensor [{rows}, {cols}] overflows"))?;
        Ok(HostTensor::zeros(rows, cols))
    }

    fn from_host(&self, data: &[f32], rows: usize, cols: usize) -> Result<HostTensor> {
        check(rows.checked_mul(cols) == Some(data.len()), || {
            format!("tensor [{rows}, {cols}] from {} values", data.len())
        })?;
        Ok(HostTensor { data: data.to_vec(), rows, cols })
    }

    fn to_host(&self, t: &HostTensor) -> Result<Vec<f32>> {
        Ok(t.data.clone())
    }

    fn shape(&self, t: &HostTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn reshape_scratch(&self, t: &mut HostTensor, rows: usize, cols: usize) -> Result<()> {
        check(rows.checked_mul(cols).is_some(), || format!("tensor [{rows}, {cols}] overflows"))?;
        t.reshape_scratch(rows, cols);
        Ok(())
    }

    fn prepare_batch(&self, layout: &BatchLayout, cache: &HostKvCache) -> Result<CpuBatch> {
        layout.validate(cache.num_slots)?;
        // Attention writes each sequence's query rows from its own threads: they must not overlap.
        let mut q_ranges: Vec<(u32, u32)> =
            layout.seqs.iter().filter(|s| s.q_len > 0).map(|s| (s.q_row, s.q_row + s.q_len)).collect();
        q_ranges.sort_unstable();
        if let Some(w) = q_ranges.windows(2).find(|w| w[1].0 < w[0].1) {
            return Err(KernelError::Shape(format!(
                "batch layout: sequences share query rows {}..{} and {}..{}",
                w[0].0, w[0].1, w[1].0, w[1].1
            )));
        }
        let mut distinct_positions = layout.positions.clone();
        distinct_positions.sort_unstable();
        distinct_positions.dedup();
        let table_rows = layout
            .positions
            .iter()
            // Every position is in the sorted list it was taken from.
            .map(|p| distinct_positions.binary_search(p).unwrap_or(0) as u32)
            .collect();
        Ok(CpuBatch {
            layout: layout.clone(),
            num_slots: cache.num_slots,
            table_rows,
            distinct_positions,
            rope_tables: Mutex::new(Vec::new()),
        })
    }

    fn embed(&self, table: &CpuEmbedding, batch: &CpuBatch, out: &mut HostTensor) -> Result<()> {
        let (vocab, hidden) = (table.packed.out_features, table.packed.in_features);
        check_tensor(out, "embed")?;
        check(out.rows == batch.layout.num_rows() && out.cols == hidden, || {
            format!(
                "embed: output [{}, {}] for {} tokens of width {hidden}",
                out.rows,
                out.cols,
                batch.layout.num_rows()
            )
        })?;
        if let Some(&id) = batch.layout.token_ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(KernelError::Shape(format!("embed: token id {id} ≥ vocab {vocab}")));
        }
        if hidden == 0 {
            return Ok(());
        }
        let ids = &batch.layout.token_ids;
        let fill = |(r, row): (usize, &mut [f32])| table.packed.unpack_row(ids[r] as usize, row);
        if self.threads > 1 && out.data.len() > ROW_OP_CHUNK_ELEMS {
            self.pool.install(|| out.data.par_chunks_mut(hidden).enumerate().for_each(fill));
        } else {
            out.data.chunks_mut(hidden).enumerate().for_each(fill);
        }
        Ok(())
    }

    fn matmul(&self, x: &HostTensor, w: &PackedWeight, bias: Option<&Vec<f32>>, out: &mut HostTensor) -> Result<()> {
        self.check_gemm(x, w, out, "matmul")?;
        if let Some(b) = bias {
            check(b.len() == w.out_features, || format!("matmul: bias of {} for {} outputs", b.len(), w.out_features))?;
        }
        self.run_gemm(x, w, Epilogue::Store { bias: bias.map(|b| b.as_slice()) }, out);
        Ok(())
    }

    fn matmul_add(&self, x: &HostTensor, w: &PackedWeight, acc: &mut HostTensor) -> Result<()> {
        self.check_gemm(x, w, acc, "matmul_add")?;
        self.run_gemm(x, w, Epilogue::Accumulate, acc);
        Ok(())
    }

    fn rms_norm(&self, x: &HostTensor, w: &Vec<f32>, eps: f32, out: &mut HostTensor) -> Result<()> {
        check_tensor(x, "rms_norm")?;
        check_tensor(out, "rms_norm")?;
        check(x.cols == w.len() && out.rows == x.rows && out.cols == x.cols, || {
            format!("rms_norm: x [{}, {}], weight {}, out [{}, {}]", x.rows, x.cols, w.len(), out.rows, out.cols)
        })?;
        if x.cols == 0 {
            return Ok(());
        }
        let isa = self.isa;
        self.for_row_chunks(x.rows, x.cols, x.cols, &x.data, &mut out.data, |xi, oi| {
            norm_rope::rms_norm_rows(isa, xi, w, eps, oi)
        });
        Ok(())
    }

    fn add_rms_norm(
        &self,
        x: &mut HostTensor,
        delta: &HostTensor,
        w: &Vec<f32>,
        eps: f32,
        out: &mut HostTensor,
    ) -> Result<()> {
        check_tensor(x, "add_rms_norm")?;
        check_tensor(delta, "add_rms_norm")?;
        check_tensor(out, "add_rms_norm")?;
        check(
            delta.rows == x.rows
                && delta.cols == x.cols
                && x.cols == w.len()
                && out.rows == x.rows
                && out.cols == x.cols,
            || {
                format!(
                    "add_rms_norm: x [{}, {}], delta [{}, {}], weight {}, out [{}, {}]",
                    x.rows,
                    x.cols,
                    delta.rows,
                    delta.cols,
                    w.len(),
                    out.rows,
                    out.cols
                )
            },
        )?;
        self.for_row_chunks(x.rows, x.cols, x.cols, &delta.data, &mut x.data, |d, xi| {
            for (v, dv) in xi.iter_mut().zip(d) {
                *v += dv;
            }
        });
        self.rms_norm(x, w, eps, out)
    }

    fn qk_norm_rope(
        &self,
        qkv: &mut HostTensor,
        layout: QkvLayout,
        q_norm: Option<&Vec<f32>>,
        k_norm: Option<&Vec<f32>>,
        eps: f32,
        rope: RopeConfig,
        batch: &CpuBatch,
    ) -> Result<()> {
        self.check_qkv(qkv, layout, batch, "qk_norm_rope")?;
        let hd = layout.head_dim;
        check(rope.rotary_dim <= hd && rope.rotary_dim.is_multiple_of(2), || {
            format!("qk_norm_rope: rotary_dim {} for head_dim {hd}", rope.rotary_dim)
        })?;
        for (name, norm) in [("q_norm", q_norm), ("k_norm", k_norm)] {
            if let Some(w) = norm {
                check(w.len() == hd, || format!("qk_norm_rope: {name} of {} for head_dim {hd}", w.len()))?;
            }
        }
        if qkv.rows == 0 {
            return Ok(());
        }
        let table = batch.rope_table(rope);
        let args = norm_rope::QkNormRope {
            layout,
            q_norm: q_norm.map(|w| w.as_slice()),
            k_norm: k_norm.map(|w| w.as_slice()),
            eps,
            rope,
            table: &table,
        };
        let (isa, cols) = (self.isa, qkv.cols);
        let per_chunk = (ROW_OP_CHUNK_ELEMS / cols).max(1);
        let rows_of = |chunk: (usize, &mut [f32])| {
            let (i, data) = chunk;
            let first = i * per_chunk;
            norm_rope::qk_norm_rope_rows(isa, data, &batch.table_rows[first..first + data.len() / cols], &args);
        };
        if self.threads > 1 && qkv.rows > per_chunk {
            self.pool.install(|| qkv.data.par_chunks_mut(per_chunk * cols).enumerate().for_each(rows_of));
        } else {
            qkv.data.chunks_mut(per_chunk * cols).enumerate().for_each(rows_of);
        }
        Ok(())
    }

    fn write_kv(
        &self,
        qkv: &HostTensor,
        layout: QkvLayout,
        cache: &mut HostKvCache,
        layer: usize,
        batch: &CpuBatch,
    ) -> Result<()> {
        self.check_qkv(qkv, layout, batch, "write_kv")?;
        self.check_cache(cache, layout, layer, batch, "write_kv")?;
        let kvd = layout.kv_dim();
        let (k, v) = (&mut cache.k[layer], &mut cache.v[layer]);
        for (row, &slot) in qkv.data.chunks_exact(qkv.cols).zip(&batch.layout.row_slots) {
            let slot = slot as usize;
            k[slot * kvd..(slot + 1) * kvd].copy_from_slice(&row[layout.k_offset()..layout.k_offset() + kvd]);
            v[slot * kvd..(slot + 1) * kvd].copy_from_slice(&row[layout.v_offset()..layout.v_offset() + kvd]);
        }
        Ok(())
    }

    fn attention(
        &self,
        qkv: &HostTensor,
        layout: QkvLayout,
        cache: &HostKvCache,
        layer: usize,
        batch: &CpuBatch,
        out: &mut HostTensor,
    ) -> Result<()> {
        self.check_qkv(qkv, layout, batch, "attention")?;
        self.check_cache(cache, layout, layer, batch, "attention")?;
        check_tensor(out, "attention")?;
        check(out.rows == qkv.rows && out.cols == layout.q_dim(), || {
            format!("attention: output [{}, {}], needs [{}, {}]", out.rows, out.cols, qkv.rows, layout.q_dim())
        })?;
        let inputs = attention::AttnInputs {
            qkv: &qkv.data,
            layout,
            k_cache: &cache.k[layer],
            v_cache: &cache.v[layer],
            seqs: &batch.layout.seqs,
            key_slots: &batch.layout.key_slots,
        };
        attention::attention(&self.pool, &self.attention_scratch, self.threads, self.isa, &inputs, &mut out.data);
        Ok(())
    }

    fn silu_mul(&self, gate_up: &HostTensor, out: &mut HostTensor) -> Result<()> {
        check_tensor(gate_up, "silu_mul")?;
        check_tensor(out, "silu_mul")?;
        let inter = out.cols;
        check(gate_up.cols == 2 * inter && out.rows == gate_up.rows, || {
            format!("silu_mul: gate_up [{}, {}] -> out [{}, {}]", gate_up.rows, gate_up.cols, out.rows, out.cols)
        })?;
        if inter == 0 {
            return Ok(());
        }
        let isa = self.isa;
        self.for_row_chunks(gate_up.rows, gate_up.cols, inter, &gate_up.data, &mut out.data, |gu, o| {
            elementwise::silu_mul_rows(isa, gu, inter, o)
        });
        Ok(())
    }

    fn gather_rows(&self, x: &HostTensor, rows: &[u32], out: &mut HostTensor) -> Result<()> {
        check_tensor(x, "gather_rows")?;
        check_tensor(out, "gather_rows")?;
        check(out.rows == rows.len() && out.cols == x.cols, || {
            format!("gather_rows: {} rows of width {} into [{}, {}]", rows.len(), x.cols, out.rows, out.cols)
        })?;
        if let Some(&r) = rows.iter().find(|&&r| r as usize >= x.rows) {
            return Err(KernelError::Shape(format!("gather_rows: row {r} ≥ {}", x.rows)));
        }
        if x.cols == 0 {
            return Ok(());
        }
        for (dst, &r) in out.data.chunks_exact_mut(x.cols).zip(rows) {
            dst.copy_from_slice(x.row(r as usize));
        }
        Ok(())
    }

    fn dot_rows(&self, x: &HostTensor, v: &Vec<f32>) -> Result<Vec<f32>> {
        check_tensor(x, "dot_rows")?;
        check(x.cols == v.len(), || format!("dot_rows: x has {} columns, v {}", x.cols, v.len()))?;
        let mut out = vec![0.0; x.rows];
        if x.cols > 0 {
            let isa = self.isa;
            self.for_row_chunks(x.rows, x.cols, 1, &x.data, &mut out, |xi, oi| elementwise::dot_rows(isa, xi, v, oi));
        }
        Ok(out)
    }

    fn lm_logits(&self, x: &HostTensor, table: &CpuEmbedding, out: &mut HostTensor) -> Result<()> {
        self.check_gemm(x, &table.packed, out, "lm_logits")?;
        self.run_gemm(x, &table.packed, Epilogue::Store { bias: None }, out);
        Ok(())
    }

    fn moe_weights(&self, w: &MoeLayerHost) -> Result<CpuMoeWeights> {
        self.pack_moe(w)
    }

    fn moe_variants(&self) -> Vec<MoeVariant> {
        CpuMoeVariant::descriptions()
    }

    fn moe_default_cost(&self, hidden: usize, expert_inter: usize) -> MoeCostModel {
        moe::default_cost(hidden, expert_inter, self.threads)
    }

    fn moe_log(&self) -> Result<Vec<MoeLayerStats>> {
        Ok(Vec::new())
    }

    fn moe_ffn(
        &self,
        x: &HostTensor,
        w: &CpuMoeWeights,
        routing: MoeRouting,
        select: MoeSelect,
        acc: &mut HostTensor,
        log: &mut Vec<MoeLayerStats>,
    ) -> Result<()> {
        log.push(self.moe_ffn_impl(x, w, routing, select, acc)?);
        Ok(())
    }

    fn read_moe_log(&self, log: &mut Vec<MoeLayerStats>) -> Result<Vec<MoeLayerStats>> {
        Ok(std::mem::take(log))
    }

    fn moe_time_variant(&self, w: &CpuMoeWeights, variant: usize, histogram: &[u32]) -> Result<Duration> {
        self.moe_time_variant_impl(w, variant, histogram)
    }

    fn moe_autotune(
        &self,
        w: &CpuMoeWeights,
        _routing: MoeRouting,
        num_experts: usize,
        budget: Duration,
    ) -> Result<(MoeCostModel, crate::moe::AutotuneReport)> {
        crate::autotune::autotune(self, w, num_experts, budget)
    }
}
