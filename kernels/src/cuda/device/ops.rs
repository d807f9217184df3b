//! `Backend` for `CudaBackend`: shape checks (shared with the CPU twin), then one launch each.

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

use super::memory::{alloc, CudaBatch, CudaKvCache, CudaMatrix, CudaTensor, CudaVector};
use super::tma::TmaMap;
use super::{driver_err, CudaBackend};
use crate::backend::*;
use crate::cuda::checks;
use crate::cuda::layout::{attention_mma_smem_bytes, attention_smem_bytes, PackedBatch, Sharing, ATTN_UNIT_WORDS};
use crate::cuda::sources::consts::*;
use crate::cuda::tma::TmaBox;
use crate::cuda::twin::{attention_scale, attention_scale_log2, warp::to_bf16};
use crate::cuda::{GemmEngine, GemmKernel, GemmShape, WgmmaShape};

/// A dense GEMM launch of `bm x bn` tiles over an `m x n` output (row tiles in x, column tiles
/// in y), `threads` per block and `smem` bytes of dynamic shared memory.
fn tile_launch((bm, bn): (usize, usize), threads: u32, smem: usize, m: usize, n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (m.div_ceil(bm) as u32, n.div_ceil(bn) as u32, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: smem as u32,
    }
}

fn mma_launch(s: GemmShape, m: usize, n: usize) -> LaunchConfig {
    tile_launch((s.bm, s.bn), s.threads, s.smem_bytes, m, n)
}

fn wgmma_launch(s: WgmmaShape, m: usize, n: usize) -> LaunchConfig {
    tile_launch((s.bm, s.bn), s.threads, s.smem_bytes, m, n)
}

/// One block of `threads` per row.
pub(super) fn per_row(rows: usize, threads: u32, smem: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: smem as u32 }
}

/// A grid-stride launch over `n` elements.
pub(crate) fn grid_stride(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 8192) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

fn shape(t: &CudaTensor) -> (usize, usize) {
    (t.rows, t.cols)
}

/// Ops other than the projections read and write f32 tensors only.
pub(super) fn f32_only(op: &str, ts: &[&CudaTensor]) -> Result<()> {
    if ts.iter().any(|t| t.bf16) {
        return Err(KernelError::Shape(format!("{op}: a bf16 GEMM operand where an f32 tensor is needed")));
    }
    Ok(())
}

pub(crate) fn to_bf16_par(data: &[f32]) -> Vec<u16> {
    use rayon::prelude::*;
    data.par_iter().map(|&x| to_bf16(x)).collect()
}

impl CudaBackend {
    /// [`Backend::prepare_batch`] with the attention schedule's `sharing` rule: benchmarks time
    /// the tensor-core attention under both (the worker's is [`Sharing::WherePays`]).
    pub fn prepare_batch_with(&self, layout: &BatchLayout, cache: &CudaKvCache, sharing: Sharing) -> Result<CudaBatch> {
        layout.validate(cache.num_slots)?;
        let packed = PackedBatch::with_sharing(layout, sharing);
        let words = self.upload(&packed.words)?;
        Ok(CudaBatch { layout: layout.clone(), packed, words })
    }

    /// The tensor-core attention: the shared pass, then the own pass (kernels/cuda/attention_mma.cu).
    fn attention_mma(
        &self,
        qkv: &CudaTensor,
        layout: QkvLayout,
        (k, v): (&CudaView<'_, u16>, &CudaView<'_, u16>),
        batch: &CudaBatch,
        out: &mut CudaTensor,
    ) -> Result<()> {
        let p = &batch.packed;
        let f = if layout.head_dim == 64 { &self.k.attention_mma_hd64 } else { &self.k.attention_mma_hd128 };
        let (qkv_cols, n_heads, n_kv_heads) = (qkv.cols as i32, layout.n_heads as i32, layout.n_kv_heads as i32);
        let scale_log2 = attention_scale_log2(layout.head_dim);
        let mut state = self.attention_state.lock().unwrap_or_else(|e| e.into_inner());
        let super::AttentionScratch { ml, rows } = &mut *state;
        let ml = ml.get(&self.stream, p.num_rows * layout.n_heads * 2)?;
        // An operand: the own pass stores bf16 rows into `out`, the shared passes' f32 state goes
        // to scratch (a null pointer: f32 rows into `out`, the state with them). With no shared
        // pass nothing reads or writes that scratch.
        let (f32_rows, bf16_rows): (&mut CudaSlice<f32>, u64) = if out.bf16 {
            let bf16_rows = out.buf.device_ptr_mut(&self.stream).0;
            let state_len = if p.attn_shared_levels.is_empty() { 1 } else { p.num_rows * layout.q_dim() };
            (rows.get(&self.stream, state_len)?, bf16_rows)
        } else {
            (&mut out.buf, 0)
        };
        for units in p.attn_shared_levels.iter().chain([&p.attn_own_units]) {
            let n_units = units.len() / ATTN_UNIT_WORDS;
            if n_units == 0 {
                continue;
            }
            let cfg = LaunchConfig {
                grid_dim: (n_units as u32, layout.n_heads as u32, 1),
                block_dim: (AMMA_THREADS, 1, 1),
                shared_mem_bytes: attention_mma_smem_bytes(layout.head_dim) as u32,
            };
            unsafe {
                self.stream
                    .launch_builder(f)
                    .arg(&qkv.buf)
                    .arg(k)
                    .arg(v)
                    .arg(&batch.view(&p.seqs))
                    .arg(&batch.view(&p.key_slots))
                    .arg(&batch.view(&p.attn_rows))
                    .arg(&batch.view(units))
                    .arg(&mut *f32_rows)
                    .arg(&mut *ml)
                    .arg(&bf16_rows)
                    .arg(&qkv_cols)
                    .arg(&n_heads)
                    .arg(&n_kv_heads)
                    .arg(&scale_log2)
                    .launch(cfg)
            }
            .map_err(driver_err("attention_mma"))?;
        }
        Ok(())
    }

    /// attention.cu's SIMT kernel, f32 rows into `out`.
    fn attention_simt(
        &self,
        qkv: &CudaTensor,
        layout: QkvLayout,
        (k, v): (&CudaView<'_, u16>, &CudaView<'_, u16>),
        batch: &CudaBatch,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (qkv_cols, n_heads, n_kv_heads, head_dim) =
            (qkv.cols as i32, layout.n_heads as i32, layout.n_kv_heads as i32, layout.head_dim as i32);
        let scale = attention_scale(layout.head_dim);
        let cfg = LaunchConfig {
            grid_dim: (batch.packed.num_q_tiles as u32, layout.n_heads as u32, 1),
            block_dim: (ATT_THREADS, 1, 1),
            shared_mem_bytes: attention_smem_bytes(layout.head_dim) as u32,
        };
        unsafe {
            self.stream
                .launch_builder(&self.k.attention_prefill)
                .arg(&qkv.buf)
                .arg(k)
                .arg(v)
                .arg(&batch.view(&batch.packed.seqs))
                .arg(&batch.view(&batch.packed.key_slots))
                .arg(&batch.view(&batch.packed.q_tiles))
                .arg(&mut *out)
                .arg(&qkv_cols)
                .arg(&n_heads)
                .arg(&n_kv_heads)
                .arg(&head_dim)
                .arg(&scale)
                .launch(cfg)
        }
        .map_err(driver_err("attention_prefill"))?;
        Ok(())
    }

    /// out (+)= x · Wᵀ (+ bias): cast x to bf16, then cuBLAS. The cast buffer stays locked until
    /// the GEMM reading it is enqueued.
    fn project(
        &self,
        x: &CudaTensor,
        w: &CudaMatrix,
        bias: Option<&CudaVector>,
        out: &mut CudaTensor,
        accumulate: bool,
    ) -> Result<()> {
        f32_only("projection output", &[out])?;
        if x.rows == 0 {
            return Ok(());
        }
        let mut scratch = self.gemm_input.lock().unwrap_or_else(|p| p.into_inner());
        let xb = self.gemm_operand(x, &mut scratch)?;
        let beta = match bias {
            Some(b) => {
                let total = (out.rows * out.cols) as i64;
                let cols = out.cols as i32;
                unsafe {
                    self.stream
                        .launch_builder(&self.k.broadcast_rows)
                        .arg(&b.buf)
                        .arg(&mut out.buf)
                        .arg(&total)
                        .arg(&cols)
                        .launch(grid_stride(total as usize))
                }
                .map_err(driver_err("broadcast_rows"))?;
                1.0
            }
            None if accumulate => 1.0,
            None => 0.0,
        };
        if !self.gemm.tiled_for(w.cols) {
            return self.blas.gemm_bf16(&xb, &w.buf, &mut out.buf, x.rows, w.rows, w.cols, beta);
        }
        let kernel = match self.gemm {
            GemmEngine::Wgmma => GemmKernel::WgmmaTma { bn: WgmmaShape::dense_bn(x.rows, w.rows) },
            GemmEngine::TiledV1 => GemmKernel::TiledV1 { bm: self.gemm.block_m(x.rows, w.rows) },
            _ => GemmKernel::Tiled { bm: self.gemm.block_m(x.rows, w.rows) },
        };
        self.launch_gemm(kernel, &xb, w, out, x.rows, beta)
    }

    /// A projection's bf16 input: an operand as it is, else `x` cast into `scratch` (held by
    /// the caller until the GEMM reading it is enqueued).
    pub(super) fn gemm_operand<'a>(
        &self,
        x: &'a CudaTensor,
        scratch: &'a mut super::memory::Scratch<u16>,
    ) -> Result<CudaView<'a, u16>> {
        if x.bf16 {
            return x.bf16_view();
        }
        let n = x.rows * x.cols;
        let xb = scratch.get(&self.stream, n)?;
        self.cast_bf16(&x.buf, &mut xb.slice_mut(0..n), n)?;
        Ok(xb.slice(0..n))
    }

    /// convert.cu's `cast_bf16`: the first `n` values of `x`, rounded, into `out`.
    fn cast_bf16(&self, x: &CudaSlice<f32>, out: &mut CudaViewMut<'_, u16>, n: usize) -> Result<()> {
        let n_i64 = n as i64;
        // SAFETY (all launches in this file): arguments match the kernel's signature; every index
        // a kernel forms is bounded by the shape checks run before it.
        unsafe { self.stream.launch_builder(&self.k.cast_bf16).arg(x).arg(out).arg(&n_i64).launch(grid_stride(n)) }
            .map_err(driver_err("cast_bf16"))?;
        Ok(())
    }

    /// The fused SwiGLU GEMM: act = bf16(silu(x·Gᵀ) · (x·Uᵀ)); gemm.cu's `dense_gemm_swiglu_*`,
    /// or on the wgmma engine gemm_wgmma.cu's TMA-fed `dense_gemm_wgmma_tma_swiglu_*` (W read
    /// in two boxes of BN / 2 rows, the gate's and the up's).
    fn launch_swiglu(&self, x: &CudaTensor, w: &CudaMatrix, act: &mut CudaTensor) -> Result<()> {
        let mut scratch = self.gemm_input.lock().unwrap_or_else(|p| p.into_inner());
        let xb = self.gemm_operand(x, &mut scratch)?;
        let (m, n) = (x.rows, w.rows);
        let mut out = act.bf16_view_mut()?;
        let (mi, ni, ki) = (m as i32, n as i32, w.cols as i32);
        if self.gemm == GemmEngine::Wgmma {
            let h = self.hopper()?;
            let s = WgmmaShape::dense(m, n);
            let f =
                if s.bn == 128 { &h.dense_gemm_wgmma_tma_swiglu_bn128 } else { &h.dense_gemm_wgmma_tma_swiglu_bn256 };
            let x_map = TmaMap::encode(&TmaBox::new(m, w.cols, 128)?, xb.device_ptr(&self.stream).0)?;
            let w_map = TmaMap::encode(&TmaBox::new(n, w.cols, s.bn / 2)?, w.buf.device_ptr(&self.stream).0)?;
            let cfg = tile_launch((128, s.bn), WG_TMA_THREADS, s.smem_bytes, m, n);
            let mut b = self.stream.launch_builder(f);
            b.arg(&x_map).arg(&w_map).arg(&mut out).arg(&mi).arg(&ni).arg(&ki);
            // SAFETY: the arguments match the kernel's signature; the shapes were checked by the caller.
            return unsafe { b.launch(cfg) }.map(drop).map_err(driver_err("dense_gemm_wgmma_tma_swiglu"));
        }
        let bm = self.gemm.block_m(m, n);
        let f = if bm == 64 { &self.k.dense_gemm_swiglu_bm64 } else { &self.k.dense_gemm_swiglu_bm128 };
        unsafe {
            self.stream
                .launch_builder(f)
                .arg(&xb)
                .arg(&w.buf)
                .arg(&mut out)
                .arg(&mi)
                .arg(&ni)
                .arg(&ki)
                .launch(mma_launch(GemmShape::of(bm), m, n))
        }
        .map_err(driver_err("dense_gemm_swiglu"))?;
        Ok(())
    }

    /// One plain GEMM launch of `kernel`: out (+)= xb · Wᵀ over `m` rows of bf16 `xb`. A clear
    /// error for the wgmma kernels on a device without the sm_90a kernels. The TMA-fed kernel
    /// gets tensor maps of x's first `m` rows and of W in place of their addresses.
    fn launch_gemm(
        &self,
        kernel: GemmKernel,
        xb: &CudaView<'_, u16>,
        w: &CudaMatrix,
        out: &mut CudaTensor,
        m: usize,
        beta: f32,
    ) -> Result<()> {
        let mut maps = None;
        let (f, cfg) = match kernel {
            GemmKernel::TiledV1 { bm } => {
                let (f, threads) =
                    if bm == 64 { (&self.k.dense_gemm_v1_bm64, 128) } else { (&self.k.dense_gemm_v1_bm128, 256) };
                (f, tile_launch((bm, GEMM_V1_BN as usize), threads, 0, m, w.rows))
            }
            GemmKernel::Tiled { bm } => {
                let f = if bm == 64 { &self.k.dense_gemm_bm64 } else { &self.k.dense_gemm_bm128 };
                (f, mma_launch(GemmShape::of(bm), m, w.rows))
            }
            GemmKernel::Wgmma { bn } => {
                let h = self.hopper()?;
                let f = if bn == 128 { &h.dense_gemm_wgmma_bn128 } else { &h.dense_gemm_wgmma_bn256 };
                (f, wgmma_launch(WgmmaShape::of(128, bn), m, w.rows))
            }
            GemmKernel::WgmmaTma { bn } => {
                let h = self.hopper()?;
                let f = if bn == 128 { &h.dense_gemm_wgmma_tma_bn128 } else { &h.dense_gemm_wgmma_tma_bn256 };
                let (x_box, w_box) = TmaBox::dense_gemm(m, w.rows, w.cols, bn)?;
                maps = Some((
                    TmaMap::encode(&x_box, xb.device_ptr(&self.stream).0)?,
                    TmaMap::encode(&w_box, w.buf.device_ptr(&self.stream).0)?,
                ));
                let smem = WgmmaShape::of(128, bn).smem_bytes;
                (f, tile_launch((128, bn), WG_TMA_THREADS, smem, m, w.rows))
            }
        };
        let (m, n, k) = (m as i32, w.rows as i32, w.cols as i32);
        let mut launch = self.stream.launch_builder(f);
        match &maps {
            Some((x_map, w_map)) => launch.arg(x_map).arg(w_map),
            None => launch.arg(xb).arg(&w.buf),
        };
        unsafe { launch.arg(&mut out.buf).arg(&m).arg(&n).arg(&k).arg(&beta).launch(cfg) }
            .map_err(driver_err("dense_gemm"))?;
        Ok(())
    }

    /// The sm_90a kernels, or why this backend has none.
    pub(super) fn hopper(&self) -> Result<&super::kernels::HopperKernels> {
        self.hopper.as_ref().map_err(|why| KernelError::Unsupported(format!("wgmma GEMM: {why}")))
    }

    /// out = x · Wᵀ on a chosen GEMM kernel whatever the backend's engine: for tests and benches
    /// that compare the kernels in one run. Needs x.cols % 8 == 0 (and an sm_90 GPU for wgmma).
    pub fn matmul_on(&self, kernel: GemmKernel, x: &CudaTensor, w: &CudaMatrix, out: &mut CudaTensor) -> Result<()> {
        checks::matmul(shape(x), (w.rows, w.cols), shape(out), None)?;
        let tile_ok = match kernel {
            GemmKernel::Tiled { bm } | GemmKernel::TiledV1 { bm } => bm == 64 || bm == 128,
            GemmKernel::Wgmma { bn } | GemmKernel::WgmmaTma { bn } => bn == 128 || bn == 256,
        };
        if !tile_ok || !GemmEngine::Tiled.tiled_for(w.cols) {
            return Err(KernelError::Shape(format!(
                "{kernel:?} with K {}: needs BLOCK_M 64 or 128 (BLOCK_N 128 or 256 for wgmma) and K % 8 == 0",
                w.cols
            )));
        }
        f32_only("matmul_on", &[out])?;
        if x.rows == 0 {
            return Ok(());
        }
        let mut scratch = self.gemm_input.lock().unwrap_or_else(|p| p.into_inner());
        let xb = self.gemm_operand(x, &mut scratch)?;
        self.launch_gemm(kernel, &xb, w, out, x.rows, 0.0)
    }
}

impl Backend for CudaBackend {
    type Tensor = CudaTensor;
    type Weight = CudaMatrix;
    type Vector = CudaVector;
    type Embedding = CudaMatrix;
    type KvCache = CudaKvCache;
    type Batch = CudaBatch;
    type MoeWeights = super::moe::CudaMoeLayer;
    type MoeLog = super::moe::CudaMoeLog;

    fn name(&self) -> String {
        format!("cuda:{} ({}, sm_{})", self.info.ordinal, self.info.name, self.info.arch.number())
    }

    fn linear_weight(&self, data: &[f32], out_features: usize, in_features: usize) -> Result<CudaMatrix> {
        checks::host_data(data.len(), out_features, in_features, "weight")?;
        Ok(CudaMatrix { buf: self.upload_bulk(&to_bf16_par(data))?, rows: out_features, cols: in_features })
    }

    fn vector(&self, data: &[f32]) -> Result<CudaVector> {
        Ok(CudaVector { buf: self.upload_bulk(data)?, len: data.len() })
    }

    fn embedding(&self, data: &[f32], vocab: usize, hidden: usize) -> Result<CudaMatrix> {
        self.linear_weight(data, vocab, hidden)
    }

    fn kv_cache(&self, num_layers: usize, num_slots: usize, n_kv_heads: usize, head_dim: usize) -> Result<CudaKvCache> {
        let kv_dim = n_kv_heads * head_dim;
        let (per_layer, bytes) = crate::host::kv_cache_size(num_layers, num_slots, kv_dim, size_of::<u16>())?;
        let len = per_layer * num_layers; // no overflow: the bytes did not
        let size = crate::host::gib(bytes);
        let no_room = |e: KernelError| match e {
            KernelError::OutOfMemory(_) => KernelError::OutOfMemory(format!(
                "a KV cache of {size} ({num_layers} layers x {num_slots} slots x {kv_dim} bf16, K and V) \
                 does not fit the GPU's free memory"
            )),
            e => e,
        };
        super::memory::trim_pool(&self.ctx, &self.stream)?;
        let k = alloc(&self.stream, len).map_err(no_room)?;
        let v = alloc(&self.stream, len).map_err(no_room)?;
        Ok(CudaKvCache { k, v, num_layers, num_slots, kv_dim })
    }

    fn zeros(&self, rows: usize, cols: usize) -> Result<CudaTensor> {
        Ok(CudaTensor::f32(alloc(&self.stream, rows * cols)?, rows, cols))
    }

    fn from_host(&self, data: &[f32], rows: usize, cols: usize) -> Result<CudaTensor> {
        checks::host_data(data.len(), rows, cols, "tensor")?;
        Ok(CudaTensor::f32(self.upload(data)?, rows, cols))
    }

    fn to_host(&self, t: &CudaTensor) -> Result<Vec<f32>> {
        let n = t.rows * t.cols;
        if !t.bf16 {
            return self.lock_staging().download(&self.stream, &t.buf, n);
        }
        // Two bf16 to a word, the lower index in the low half.
        let words: Vec<f32> = self.lock_staging().download(&self.stream, &t.buf, n.div_ceil(2))?;
        Ok((0..n).map(|i| f32::from_bits(((words[i / 2].to_bits() >> (16 * (i % 2))) & 0xffff) << 16)).collect())
    }

    fn reshape_scratch(&self, t: &mut CudaTensor, rows: usize, cols: usize) -> Result<()> {
        if t.bf16 || shape(t) != (rows, cols) {
            *t = self.zeros(rows, cols)?;
        }
        Ok(())
    }

    fn reshape_operand(&self, t: &mut CudaTensor, rows: usize, cols: usize) -> Result<()> {
        if !self.gemm.fused() {
            return self.reshape_scratch(t, rows, cols);
        }
        if !t.bf16 || shape(t) != (rows, cols) {
            let words = (rows * cols).div_ceil(2);
            *t = CudaTensor { buf: alloc(&self.stream, words)?, rows, cols, bf16: true };
        }
        Ok(())
    }

    fn shape(&self, t: &CudaTensor) -> (usize, usize) {
        shape(t)
    }

    fn prepare_batch(&self, layout: &BatchLayout, cache: &CudaKvCache) -> Result<CudaBatch> {
        self.prepare_batch_with(layout, cache, Sharing::WherePays)
    }

    fn embed(&self, table: &CudaMatrix, batch: &CudaBatch, out: &mut CudaTensor) -> Result<()> {
        checks::embed((table.rows, table.cols), &batch.layout, shape(out))?;
        if out.rows == 0 {
            return Ok(());
        }
        let hidden = table.cols as i32;
        unsafe {
            self.stream
                .launch_builder(&self.k.embed_rows)
                .arg(&table.buf)
                .arg(&batch.view(&batch.packed.token_ids))
                .arg(&mut out.buf)
                .arg(&hidden)
                .launch(per_row(out.rows, GATHER_THREADS, 0))
        }
        .map_err(driver_err("embed_rows"))?;
        Ok(())
    }

    fn matmul(&self, x: &CudaTensor, w: &CudaMatrix, bias: Option<&CudaVector>, out: &mut CudaTensor) -> Result<()> {
        checks::matmul(shape(x), (w.rows, w.cols), shape(out), bias.map(|b| b.len))?;
        self.project(x, w, bias, out, false)
    }

    fn matmul_add(&self, x: &CudaTensor, w: &CudaMatrix, acc: &mut CudaTensor) -> Result<()> {
        checks::matmul(shape(x), (w.rows, w.cols), shape(acc), None)?;
        self.project(x, w, None, acc, true)
    }

    fn rms_norm(&self, x: &CudaTensor, w: &CudaVector, eps: f32, out: &mut CudaTensor) -> Result<()> {
        checks::rms_norm(shape(x), w.len, shape(out))?;
        f32_only("rms_norm input", &[x])?;
        if x.rows == 0 {
            return Ok(());
        }
        let (cols, cfg) = (x.cols as i32, per_row(x.rows, RMS_THREADS, 0));
        if out.bf16 {
            let mut o = out.bf16_view_mut()?;
            let mut b = self.stream.launch_builder(&self.k.rms_norm_rows_bf16);
            b.arg(&x.buf).arg(&w.buf).arg(&mut o).arg(&cols).arg(&eps);
            unsafe { b.launch(cfg) }.map_err(driver_err("rms_norm_rows_bf16"))?;
            return Ok(());
        }
        unsafe {
            self.stream
                .launch_builder(&self.k.rms_norm_rows)
                .arg(&x.buf)
                .arg(&w.buf)
                .arg(&mut out.buf)
                .arg(&cols)
                .arg(&eps)
                .launch(cfg)
        }
        .map_err(driver_err("rms_norm_rows"))?;
        Ok(())
    }

    fn add_rms_norm(
        &self,
        x: &mut CudaTensor,
        delta: &CudaTensor,
        w: &CudaVector,
        eps: f32,
        out: &mut CudaTensor,
    ) -> Result<()> {
        checks::add_rms_norm(shape(x), shape(delta), w.len, shape(out))?;
        f32_only("add_rms_norm input", &[&*x, delta])?;
        if x.rows == 0 {
            return Ok(());
        }
        let (cols, cfg) = (x.cols as i32, per_row(x.rows, RMS_THREADS, 0));
        if out.bf16 {
            let mut o = out.bf16_view_mut()?;
            let mut b = self.stream.launch_builder(&self.k.add_rms_norm_rows_bf16);
            b.arg(&mut x.buf).arg(&delta.buf).arg(&w.buf).arg(&mut o).arg(&cols).arg(&eps);
            unsafe { b.launch(cfg) }.map_err(driver_err("add_rms_norm_rows_bf16"))?;
            return Ok(());
        }
        let mut b = self.stream.launch_builder(&self.k.add_rms_norm_rows);
        b.arg(&mut x.buf).arg(&delta.buf).arg(&w.buf).arg(&mut out.buf).arg(&cols).arg(&eps);
        unsafe { b.launch(cfg) }.map_err(driver_err("add_rms_norm_rows"))?;
        Ok(())
    }

    fn qk_norm_rope(
        &self,
        qkv: &mut CudaTensor,
        layout: QkvLayout,
        q_norm: Option<&CudaVector>,
        k_norm: Option<&CudaVector>,
        eps: f32,
        rope: RopeConfig,
        batch: &CudaBatch,
    ) -> Result<()> {
        self.launch_qk_norm_rope(qkv, layout, (q_norm, k_norm), eps, rope, batch, None)
    }

    fn qk_norm_rope_write_kv(
        &self,
        qkv: &mut CudaTensor,
        layout: QkvLayout,
        q_norm: Option<&CudaVector>,
        k_norm: Option<&CudaVector>,
        eps: f32,
        rope: RopeConfig,
        cache: &mut CudaKvCache,
        layer: usize,
        batch: &CudaBatch,
    ) -> Result<()> {
        if !self.gemm.fused() {
            self.qk_norm_rope(qkv, layout, q_norm, k_norm, eps, rope, batch)?;
            return self.write_kv(qkv, layout, cache, layer, batch);
        }
        checks::write_kv(shape(qkv), layout, cache.dims(), layer, batch.packed.num_rows)?;
        self.launch_qk_norm_rope(qkv, layout, (q_norm, k_norm), eps, rope, batch, Some((cache, layer)))
    }

    fn write_kv(
        &self,
        qkv: &CudaTensor,
        layout: QkvLayout,
        cache: &mut CudaKvCache,
        layer: usize,
        batch: &CudaBatch,
    ) -> Result<()> {
        checks::write_kv(shape(qkv), layout, cache.dims(), layer, batch.packed.num_rows)?;
        f32_only("write_kv", &[qkv])?;
        if qkv.rows == 0 {
            return Ok(());
        }
        let range = cache.layer_range(layer);
        let (qkv_cols, k_off, v_off, kv_dim) =
            (qkv.cols as i32, layout.k_offset() as i32, layout.v_offset() as i32, layout.kv_dim() as i32);
        let mut k = cache.k.slice_mut(range.clone());
        let mut v = cache.v.slice_mut(range);
        unsafe {
            self.stream
                .launch_builder(&self.k.write_kv)
                .arg(&qkv.buf)
                .arg(&batch.view(&batch.packed.row_slots))
                .arg(&mut k)
                .arg(&mut v)
                .arg(&qkv_cols)
                .arg(&k_off)
                .arg(&v_off)
                .arg(&kv_dim)
                .launch(per_row(qkv.rows, KV_THREADS, 0))
        }
        .map_err(driver_err("write_kv"))?;
        Ok(())
    }

    fn attention(
        &self,
        qkv: &CudaTensor,
        layout: QkvLayout,
        cache: &CudaKvCache,
        layer: usize,
        batch: &CudaBatch,
        out: &mut CudaTensor,
    ) -> Result<()> {
        checks::attention(shape(qkv), layout, cache.dims(), layer, batch.packed.num_rows, shape(out))?;
        f32_only("attention", &[qkv])?;
        if batch.packed.num_q_tiles == 0 {
            return Ok(());
        }
        let range = cache.layer_range(layer);
        let (k, v) = (cache.k.slice(range.clone()), cache.v.slice(range));
        if self.attention.mma_for(layout.head_dim) {
            return self.attention_mma(qkv, layout, (&k, &v), batch, out);
        }
        if !out.bf16 {
            return self.attention_simt(qkv, layout, (&k, &v), batch, &mut out.buf);
        }
        // An operand: the SIMT kernel's f32 rows, then their cast.
        let mut state = self.attention_state.lock().unwrap_or_else(|e| e.into_inner());
        let n = out.rows * out.cols;
        let rows = state.rows.get(&self.stream, n)?;
        self.attention_simt(qkv, layout, (&k, &v), batch, rows)?;
        self.cast_bf16(rows, &mut out.bf16_view_mut()?, n)
    }

    fn silu_mul(&self, gate_up: &CudaTensor, out: &mut CudaTensor) -> Result<()> {
        checks::silu_mul(shape(gate_up), shape(out))?;
        f32_only("silu_mul input", &[gate_up])?;
        let n = out.rows * out.cols;
        if n == 0 {
            return Ok(());
        }
        let (n_i64, inter) = (n as i64, out.cols as i32);
        if out.bf16 {
            let mut o = out.bf16_view_mut()?;
            let mut b = self.stream.launch_builder(&self.k.silu_mul_bf16);
            b.arg(&gate_up.buf).arg(&mut o).arg(&n_i64).arg(&inter);
            unsafe { b.launch(grid_stride(n)) }.map_err(driver_err("silu_mul_bf16"))?;
            return Ok(());
        }
        unsafe {
            self.stream
                .launch_builder(&self.k.silu_mul_f32)
                .arg(&gate_up.buf)
                .arg(&mut out.buf)
                .arg(&n_i64)
                .arg(&inter)
                .launch(grid_stride(n))
        }
        .map_err(driver_err("silu_mul_f32"))?;
        Ok(())
    }

    fn matmul_silu_mul(
        &self,
        x: &CudaTensor,
        w: &CudaMatrix,
        gate_up: &mut CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<()> {
        let (rows, inter) = shape(out);
        checks::matmul(shape(x), (w.rows, w.cols), (rows, 2 * inter), None)?;
        if out.bf16 && self.gemm.swiglu_fused_for(w.cols, inter) {
            if rows == 0 {
                return Ok(());
            }
            return self.launch_swiglu(x, w, out);
        }
        self.reshape_scratch(gate_up, rows, 2 * inter)?;
        self.matmul(x, w, None, gate_up)?;
        self.silu_mul(gate_up, out)
    }

    fn gather_rows(&self, x: &CudaTensor, rows: &[u32], out: &mut CudaTensor) -> Result<()> {
        checks::gather_rows(shape(x), rows, shape(out))?;
        if x.bf16 != out.bf16 || (x.bf16 && x.cols % 2 == 1) {
            return Err(KernelError::Shape(format!(
                "gather_rows: a {} tensor into a {} one of {} columns (bf16 rows are moved as whole words)",
                if x.bf16 { "bf16" } else { "f32" },
                if out.bf16 { "bf16" } else { "f32" },
                out.cols
            )));
        }
        if rows.is_empty() {
            return Ok(());
        }
        let idx = self.upload(rows)?;
        // bf16 rows (an even count per row) are moved two to a word, as f32 bits.
        let cols = if x.bf16 { x.cols / 2 } else { x.cols } as i32;
        unsafe {
            self.stream
                .launch_builder(&self.k.gather_rows)
                .arg(&x.buf)
                .arg(&idx)
                .arg(&mut out.buf)
                .arg(&cols)
                .launch(per_row(rows.len(), GATHER_THREADS, 0))
        }
        .map_err(driver_err("gather_rows"))?;
        Ok(())
    }

    fn dot_rows(&self, x: &CudaTensor, v: &CudaVector) -> Result<Vec<f32>> {
        checks::dot_rows(shape(x), v.len)?;
        f32_only("dot_rows", &[x])?;
        if x.rows == 0 {
            return Ok(Vec::new());
        }
        let mut out = alloc::<f32>(&self.stream, x.rows)?;
        let cols = x.cols as i32;
        unsafe {
            self.stream
                .launch_builder(&self.k.dot_rows)
                .arg(&x.buf)
                .arg(&v.buf)
                .arg(&mut out)
                .arg(&cols)
                .launch(per_row(x.rows, SCORE_THREADS, 0))
        }
        .map_err(driver_err("dot_rows"))?;
        self.lock_staging().download(&self.stream, &out, x.rows)
    }

    fn lm_logits(&self, x: &CudaTensor, table: &CudaMatrix, out: &mut CudaTensor) -> Result<()> {
        checks::matmul(shape(x), (table.rows, table.cols), shape(out), None)?;
        self.project(x, table, None, out, false)
    }

    // ---- MoE: the device pipeline of device/moe.rs; the tile is chosen on the device ----
    fn moe_weights(&self, w: &crate::moe::MoeLayerHost) -> Result<super::moe::CudaMoeLayer> {
        self.moe_layer(w)
    }

    fn moe_variants(&self) -> Vec<crate::moe::MoeVariant> {
        crate::cuda::moe::gpu_variants()
    }

    fn moe_default_cost(&self, _hidden: usize, _expert_inter: usize) -> crate::moe::MoeCostModel {
        crate::cuda::moe::gpu_default_cost()
    }

    fn moe_log(&self) -> Result<super::moe::CudaMoeLog> {
        Ok(super::moe::CudaMoeLog::default())
    }

    fn moe_ffn(
        &self,
        x: &CudaTensor,
        w: &super::moe::CudaMoeLayer,
        routing: crate::moe::MoeRouting,
        select: crate::moe::MoeSelect,
        acc: &mut CudaTensor,
        log: &mut super::moe::CudaMoeLog,
    ) -> Result<()> {
        self.moe_layer_ffn(x, w, routing, select, acc, log)
    }

    fn read_moe_log(&self, log: &mut super::moe::CudaMoeLog) -> Result<Vec<crate::moe::MoeLayerStats>> {
        self.read_moe_layer_log(log)
    }

    fn moe_time_variant(
        &self,
        _w: &super::moe::CudaMoeLayer,
        _variant: usize,
        _histogram: &[u32],
    ) -> Result<std::time::Duration> {
        // Routing runs on the device from router logits, so a histogram cannot be imposed; the
        // GPU calibrates the padding-ratio threshold instead (`moe_autotune`).
        Err(KernelError::Unsupported(
            "moe_time_variant on CUDA: the GPU calibration is moe_autotune (padding-ratio threshold)".into(),
        ))
    }

    fn moe_autotune(
        &self,
        w: &super::moe::CudaMoeLayer,
        routing: crate::moe::MoeRouting,
        _num_experts: usize,
        budget: std::time::Duration,
    ) -> Result<(crate::moe::MoeCostModel, crate::moe::AutotuneReport)> {
        self.moe_layer_autotune(w, routing, budget)
    }
}
