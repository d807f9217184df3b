//! The MoE layer on the GPU: the kernels of moe_routing.cu, moe_permute.cu, moe_select.cu and
//! moe_gemm.cu, launched back to back on the backend's stream. The host knows only the token
//! count; the histogram, offsets, tile schedules and the variant choice live on the device, so a
//! layer never waits on the host. Both grouped-GEMM variants are launched with grids sized for
//! the worst case; the one the selector did not pick exits at once.

use cudarc::driver::{CudaFunction, CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

use super::memory::{alloc, alloc_unset, CudaMatrix, CudaTensor};
use super::ops::{grid_stride, to_bf16_par};
use super::tma::TmaMap;
use super::{driver_err, CudaBackend};
use crate::backend::{Backend, KernelError, Result};
use crate::cuda::moe::{
    check_moe, fit_padding_threshold, layer_stats, pipeline_routing, tile_policy, BlockM, CudaMoeVariant, MoeDims,
    MoeRouting, SharedExpert, ThresholdSample, TileChoice, TilePolicy, CALIBRATION_TOKENS,
};
use crate::cuda::sources::consts::*;
use crate::cuda::tma::TmaBox;
use crate::cuda::twin::{max_tiles, n_chunks, offsets_smem_bytes};
use crate::cuda::{GemmEngine, GemmShape, WgmmaShape};
use crate::moe::{AutotuneReport, BackendVariant, MoeCostModel, MoeLayerHost, MoeLayerStats, MoeSelect};

/// Expert weights on the device (bf16): gate_up [n_experts, 2·inter, hidden] (gate rows then up
/// rows per expert), down [n_experts, hidden, inter].
pub struct CudaMoeWeights {
    pub(crate) dims: MoeDims,
    pub(crate) gate_up: CudaSlice<u16>,
    pub(crate) down: CudaSlice<u16>,
}

/// The selector's statistics of one MoE call, still on the device; reading them waits for the
/// stream (do it after the forward pass, for metrics).
pub struct CudaMoeStats {
    stats: CudaSlice<u32>,
    /// The token-per-expert histogram.
    counts: CudaSlice<u32>,
    n_experts: usize,
}

impl CudaMoeStats {
    pub fn read(&self, backend: &CudaBackend) -> Result<TileChoice> {
        let s: Vec<u32> = backend.lock_staging().download(&backend.stream, &self.stats, 4)?;
        Ok(TileChoice { real_rows: s[0] as u64, padded64: s[1] as u64, padded128: s[2] as u64, block_m: s[3] })
    }

    /// The histogram (rows per expert) the selector saw.
    pub fn read_counts(&self, backend: &CudaBackend) -> Result<Vec<u32>> {
        backend.lock_staging().download(&backend.stream, &self.counts, self.n_experts)
    }
}

fn launch_cfg(grid: (u32, u32), block: u32, smem: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (grid.0, grid.1, 1), block_dim: (block, 1, 1), shared_mem_bytes: smem as u32 }
}

impl CudaBackend {
    pub fn moe_expert_weights(&self, dims: MoeDims, gate_up: &[f32], down: &[f32]) -> Result<CudaMoeWeights> {
        let MoeDims { hidden, inter, n_experts } = dims;
        if gate_up.len() != n_experts * 2 * inter * hidden || down.len() != n_experts * hidden * inter {
            return Err(KernelError::Shape(format!(
                "MoE weights: gate_up {} and down {} values for {dims:?}",
                gate_up.len(),
                down.len()
            )));
        }
        Ok(CudaMoeWeights {
            dims,
            gate_up: self.upload_bulk(&to_bf16_par(gate_up))?,
            down: self.upload_bulk(&to_bf16_par(down))?,
        })
    }

    /// out (+)= MoE(x): x [tokens, hidden], router_logits [tokens, n_experts] (f32). `shared`:
    /// qwen2_moe's shared expert, its output `[tokens, hidden]` and its gate's logit `[tokens, 1]`
    /// ([`SharedExpert::forward`]), added to each row's routed sum by the un-permute.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_forward(
        &self,
        x: &CudaTensor,
        router_logits: &CudaTensor,
        w: &CudaMoeWeights,
        routing: MoeRouting,
        policy: TilePolicy,
        out: &mut CudaTensor,
        accumulate: bool,
        shared: Option<(&CudaTensor, &CudaTensor)>,
    ) -> Result<CudaMoeStats> {
        let MoeDims { hidden, inter, n_experts } = w.dims;
        check_moe(w.dims, routing)?;
        if x.bf16 || router_logits.bf16 || out.bf16 {
            return Err(KernelError::Shape("moe: a bf16 GEMM operand where an f32 tensor is needed".into()));
        }
        let tokens = x.rows;
        if x.cols != hidden
            || router_logits.rows != tokens
            || router_logits.cols != n_experts
            || out.rows != tokens
            || out.cols != hidden
        {
            return Err(KernelError::Shape(format!(
                "MoE: x [{}, {}], logits [{}, {}], out [{}, {}] for {w_dims:?}",
                x.rows,
                x.cols,
                router_logits.rows,
                router_logits.cols,
                out.rows,
                out.cols,
                w_dims = w.dims
            )));
        }
        if let Some((y, logit)) = shared {
            if y.bf16 || logit.bf16 || (y.rows, y.cols, logit.rows, logit.cols) != (tokens, hidden, tokens, 1) {
                return Err(KernelError::Shape(format!(
                    "MoE shared expert: output [{}, {}], gate logits [{}, {}] for {tokens} tokens of {hidden}",
                    y.rows, y.cols, logit.rows, logit.cols
                )));
            }
        }
        let s = &self.stream;
        // The call's statistics start at zero: with no tokens no kernel writes them.
        let stats = alloc::<u32>(s, 4)?;
        let mut counts = alloc::<u32>(s, n_experts)?;
        let k = routing.top_k;
        let n_assign = tokens * k;
        if n_assign == 0 {
            return Ok(CudaMoeStats { stats, counts, n_experts });
        }
        let chunks = n_chunks(n_assign);
        let (max64, max128) = (max_tiles(n_assign, n_experts, 64), max_tiles(n_assign, n_experts, 128));
        // The kernels write every element of these that a later kernel reads (the routing, the
        // histogram per chunk, offsets, each schedule up to its tile count, the choice, every
        // permuted row and its expert output): no zero fill, which at thousands of tokens is
        // gigabytes per layer, and at a few tokens a dozen launches.
        let mut ids = alloc_unset::<u32>(s, n_assign)?;
        let mut weights = alloc_unset::<f32>(s, n_assign)?;
        let mut chunk_counts = alloc_unset::<u32>(s, chunks * n_experts)?;
        let mut chunk_base = alloc_unset::<u32>(s, chunks * n_experts)?;
        let mut offsets = alloc_unset::<u32>(s, n_experts + 1)?;
        let mut tiles64 = alloc_unset::<u32>(s, 2 * max64)?;
        let mut tiles128 = alloc_unset::<u32>(s, 2 * max128)?;
        let mut n_tiles = alloc_unset::<u32>(s, 2)?;
        let mut choice = alloc_unset::<i32>(s, 1)?;
        let mut stats = stats;
        let mut xp = alloc_unset::<u16>(s, n_assign * hidden)?;
        let mut dest = alloc_unset::<u32>(s, n_assign)?;
        let mut act = alloc_unset::<u16>(s, n_assign * inter)?;
        let mut y = alloc_unset::<u16>(s, n_assign * hidden)?;

        let (tokens_i, ne_i, k_i, renorm) = (tokens as i32, n_experts as i32, k as i32, routing.renormalize as i32);
        let (n_assign_i, chunks_i, hidden_i, inter_i, accumulate_i) =
            (n_assign as i32, chunks as i32, hidden as i32, inter as i32, accumulate as i32);
        let (threshold, force) = policy.kernel_args();
        let force_i = force as i32;
        // SAFETY (every launch below): arguments match the kernel signatures in kernels/cuda/moe_*.cu;
        // buffers are sized above from tokens, top_k and the shapes checked by check_moe.
        unsafe {
            s.launch_builder(&self.k.moe_topk_softmax)
                .arg(&router_logits.buf)
                .arg(&mut ids)
                .arg(&mut weights)
                .arg(&tokens_i)
                .arg(&ne_i)
                .arg(&k_i)
                .arg(&renorm)
                .launch(launch_cfg((tokens.div_ceil(ROUTE_THREADS as usize / 32) as u32, 1), ROUTE_THREADS, 0))
        }
        .map_err(driver_err("moe_topk_softmax"))?;
        unsafe {
            s.launch_builder(&self.k.moe_chunk_counts)
                .arg(&ids)
                .arg(&mut chunk_counts)
                .arg(&n_assign_i)
                .arg(&ne_i)
                .launch(launch_cfg((chunks as u32, 1), PERM_CHUNK, n_experts * 4))
        }
        .map_err(driver_err("moe_chunk_counts"))?;
        unsafe {
            s.launch_builder(&self.k.moe_offsets)
                .arg(&chunk_counts)
                .arg(&mut chunk_base)
                .arg(&mut counts)
                .arg(&mut offsets)
                .arg(&mut tiles64)
                .arg(&mut tiles128)
                .arg(&mut n_tiles)
                .arg(&chunks_i)
                .arg(&ne_i)
                .launch(launch_cfg((1, 1), PERM_OFFSET_THREADS, offsets_smem_bytes(chunks, n_experts)))
        }
        .map_err(driver_err("moe_offsets"))?;
        unsafe {
            s.launch_builder(&self.k.moe_select_tile)
                .arg(&counts)
                .arg(&ne_i)
                .arg(&threshold)
                .arg(&force_i)
                .arg(&mut choice)
                .arg(&mut stats)
                .launch(launch_cfg((1, 1), SELECT_THREADS, 0))
        }
        .map_err(driver_err("moe_select_tile"))?;
        unsafe {
            s.launch_builder(&self.k.moe_scatter)
                .arg(&x.buf)
                .arg(&ids)
                .arg(&chunk_base)
                .arg(&offsets)
                .arg(&mut xp)
                .arg(&mut dest)
                .arg(&n_assign_i)
                .arg(&k_i)
                .arg(&hidden_i)
                .arg(&ne_i)
                .launch(launch_cfg((chunks as u32, 1), PERM_CHUNK, 0))
        }
        .map_err(driver_err("moe_scatter"))?;

        // Both variants of a grouped GEMM (the one the selector did not choose exits at once);
        // `c` (a device address) is f32 [n_assign, n], with the SwiGLU pair the bf16 act
        // [n_assign, n / 2], with the bf16 pair (the down projection) bf16 [n_assign, n]. On the
        // wgmma engine, moe_gemm_wgmma.cu's (BM x 128 tiles; at BM 128 TMA-fed, through tensor
        // maps over A and all the experts' weights).
        let wgmma = if self.gemm == GemmEngine::Wgmma { Some(self.hopper()?) } else { None };
        let (plain, swiglu, to_bf16) = match wgmma {
            Some(h) => (
                [&h.moe_gemm_wgmma_bm64, &h.moe_gemm_wgmma_bm128],
                [&h.moe_gemm_wgmma_swiglu_bm64, &h.moe_gemm_wgmma_swiglu_bm128],
                [&h.moe_gemm_wgmma_bf16_bm64, &h.moe_gemm_wgmma_bf16_bm128],
            ),
            None => (
                [&self.k.moe_gemm_bm64, &self.k.moe_gemm_bm128],
                [&self.k.moe_gemm_swiglu_bm64, &self.k.moe_gemm_swiglu_bm128],
                [&self.k.moe_gemm_bf16_bm64, &self.k.moe_gemm_bf16_bm128],
            ),
        };
        let gemm = |pair: [&CudaFunction; 2],
                    a: &CudaSlice<u16>,
                    wts: &CudaSlice<u16>,
                    c: u64,
                    n: usize,
                    kdim: usize,
                    swiglu: bool|
         -> Result<()> {
            let (n_i, k_i) = (n as i32, kdim as i32);
            for (f, tiles, grid_x, bm) in [(pair[0], &tiles64, max64, 64), (pair[1], &tiles128, max128, 128)] {
                let tma = wgmma.is_some() && bm == 128;
                let (bn, threads, smem) = match wgmma {
                    Some(_) => {
                        let t = WgmmaShape::of(bm, 128);
                        (t.bn, if tma { WG_TMA_THREADS } else { t.threads }, t.smem_bytes)
                    }
                    None => {
                        let t = GemmShape::of(bm);
                        (t.bn, t.threads, t.smem_bytes)
                    }
                };
                let maps = if tma {
                    let (a_box, w_box) = TmaBox::grouped_gemm(n_assign, n_experts, n, kdim, swiglu)?;
                    Some((TmaMap::encode(&a_box, a.device_ptr(s).0)?, TmaMap::encode(&w_box, wts.device_ptr(s).0)?))
                } else {
                    None
                };
                let mut b = s.launch_builder(f);
                match &maps {
                    Some((a_map, w_map)) => b.arg(a_map).arg(w_map),
                    None => b.arg(a).arg(wts),
                };
                b.arg(&c);
                b.arg(&counts).arg(&offsets).arg(tiles).arg(&n_tiles).arg(&choice).arg(&n_i).arg(&k_i);
                unsafe { b.launch(launch_cfg((grid_x as u32, n.div_ceil(bn) as u32), threads, smem)) }
                    .map_err(driver_err("moe_gemm"))?;
            }
            Ok(())
        };
        if self.gemm.swiglu_fused_for(hidden, inter) {
            gemm(swiglu, &xp, &w.gate_up, act.device_ptr_mut(s).0, 2 * inter, hidden, true)?;
        } else {
            let mut gate_up_out = alloc_unset::<f32>(s, n_assign * 2 * inter)?;
            let c = gate_up_out.device_ptr_mut(s).0;
            gemm(plain, &xp, &w.gate_up, c, 2 * inter, hidden, false)?;
            let n_act = (n_assign * inter) as i64;
            unsafe {
                s.launch_builder(&self.k.silu_mul_bf16)
                    .arg(&gate_up_out)
                    .arg(&mut act)
                    .arg(&n_act)
                    .arg(&inter_i)
                    .launch(grid_stride(n_act as usize))
            }
            .map_err(driver_err("silu_mul_bf16"))?;
        }
        gemm(to_bf16, &act, &w.down, y.device_ptr_mut(s).0, hidden, inter, false)?;
        // Without a shared expert its two pointers are never read: any valid ones.
        let (shared_y, shared_gate, has_shared) = match shared {
            Some((sy, logit)) => (&sy.buf, &logit.buf, 1i32),
            None => (&weights, &weights, 0),
        };
        unsafe {
            s.launch_builder(&self.k.moe_unpermute)
                .arg(&y)
                .arg(&dest)
                .arg(&weights)
                .arg(shared_y)
                .arg(shared_gate)
                .arg(&mut out.buf)
                .arg(&k_i)
                .arg(&hidden_i)
                .arg(&accumulate_i)
                .arg(&has_shared)
                .launch(launch_cfg((tokens as u32, 1), PERM_UNPERM_THREADS, 0))
        }
        .map_err(driver_err("moe_unpermute"))?;
        Ok(CudaMoeStats { stats, counts, n_experts })
    }
}

impl CudaBackend {
    /// Start-up autotune of the padding-ratio threshold for a layer's shapes: for each token
    /// count, random routing (small counts give high padding ratios), the layer time of each
    /// fixed variant (CUDA events, median of `reps`), then [`fit_padding_threshold`]. Bounded by
    /// the token counts and reps the caller passes; returns the threshold and the samples.
    pub fn calibrate_moe_threshold(
        &self,
        w: &CudaMoeWeights,
        routing: MoeRouting,
        token_counts: &[usize],
        reps: usize,
    ) -> Result<(f32, Vec<ThresholdSample>)> {
        use cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
        let MoeDims { hidden, n_experts, .. } = w.dims;
        let mut samples = Vec::new();
        // A fixed pseudo-random sequence (xorshift): the autotune must not depend on global state.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 11) as f64 / (1u64 << 53) as f64) as f32 * 2.0 - 1.0
        };
        for &tokens in token_counts.iter().filter(|&&t| t > 0) {
            let x = self.from_host(&(0..tokens * hidden).map(|_| next()).collect::<Vec<_>>(), tokens, hidden)?;
            let logits =
                self.from_host(&(0..tokens * n_experts).map(|_| 3.0 * next()).collect::<Vec<_>>(), tokens, n_experts)?;
            let mut out = self.zeros(tokens, hidden)?;
            let mut time = |policy: TilePolicy| -> Result<(f64, TileChoice)> {
                let stats = self.moe_forward(&x, &logits, w, routing, policy, &mut out, false, None)?; // warm-up
                let choice = stats.read(self)?;
                let mut ms = Vec::with_capacity(reps.max(1));
                for _ in 0..reps.max(1) {
                    let start = self.stream.record_event(Some(CU_EVENT_DEFAULT)).map_err(driver_err("event"))?;
                    self.moe_forward(&x, &logits, w, routing, policy, &mut out, false, None)?;
                    let end = self.stream.record_event(Some(CU_EVENT_DEFAULT)).map_err(driver_err("event"))?;
                    ms.push(start.elapsed_ms(&end).map_err(driver_err("event timing"))? as f64);
                }
                ms.sort_by(f64::total_cmp);
                Ok((ms[ms.len() / 2], choice))
            };
            let (ms64, choice) = time(TilePolicy::Fixed(BlockM::M64))?;
            let (ms128, _) = time(TilePolicy::Fixed(BlockM::M128))?;
            samples.push(ThresholdSample {
                ratio: choice.padded128 as f64 / choice.real_rows.max(1) as f64,
                ms64,
                ms128,
            });
        }
        Ok((fit_padding_threshold(&samples), samples))
    }
}

// ---- the `Backend` MoE ops (see `ops.rs`) ----

/// One MoE layer for [`crate::Backend::moe_ffn`]: the router as a bf16 projection, the experts,
/// and qwen2_moe's shared expert.
pub struct CudaMoeLayer {
    pub(crate) router: CudaMatrix,
    pub(crate) experts: CudaMoeWeights,
    pub(crate) shared: Option<SharedExpert<CudaMatrix>>,
}

/// The per-call records of a forward pass, still on the device: read once, after the pass.
#[derive(Default)]
pub struct CudaMoeLog {
    calls: Vec<(usize, CudaMoeStats)>,
}

impl CudaBackend {
    pub(crate) fn moe_layer(&self, w: &MoeLayerHost) -> Result<CudaMoeLayer> {
        w.validate()?;
        let dims = MoeDims { hidden: w.hidden, inter: w.expert_inter, n_experts: w.num_experts };
        check_moe(dims, MoeRouting { top_k: 1, renormalize: false })?;
        Ok(CudaMoeLayer {
            router: self.linear_weight(w.router, w.num_experts, w.hidden)?,
            experts: self.moe_expert_weights(dims, w.gate_up, w.down)?,
            shared: w
                .shared
                .map(|s| SharedExpert::upload(&s, w.hidden, |d, r, c| self.linear_weight(d, r, c)))
                .transpose()?,
        })
    }

    /// `acc += moe(x)`: the router projection, then the device pipeline of [`Self::moe_forward`]
    /// (routing, histogram, the tile choice of `select` on the device, permutation, grouped
    /// GEMMs, weighted un-permute accumulated into `acc`). No host synchronisation.
    ///
    /// Not verified on hardware here (no GPU on the machine this was written on): it compiles,
    /// each launch is the one `moe_forward` makes (whose kernels are tested against their CPU
    /// twins), and the same sequence runs on `TwinBackend` in the test suite.
    pub(crate) fn moe_layer_ffn(
        &self,
        x: &CudaTensor,
        w: &CudaMoeLayer,
        routing: crate::moe::MoeRouting,
        select: MoeSelect,
        acc: &mut CudaTensor,
        log: &mut CudaMoeLog,
    ) -> Result<()> {
        let policy = tile_policy(select)?;
        let routing = pipeline_routing(routing);
        check_moe(w.experts.dims, routing)?;
        let mut logits = self.zeros(x.rows, w.experts.dims.n_experts)?;
        self.matmul(x, &w.router, None, &mut logits)?;
        let shared = w.shared.as_ref().map(|s| s.forward(self, x)).transpose()?;
        let term = shared.as_ref().map(|(y, logit)| (y, logit));
        let stats = self.moe_forward(x, &logits, &w.experts, routing, policy, acc, true, term)?;
        log.calls.push((x.rows, stats));
        Ok(())
    }

    pub(crate) fn read_moe_layer_log(&self, log: &mut CudaMoeLog) -> Result<Vec<MoeLayerStats>> {
        log.calls.drain(..).map(|(tokens, s)| Ok(layer_stats(tokens, s.read(self)?, &s.read_counts(self)?))).collect()
    }

    /// The start-up calibration on the GPU: [`Self::calibrate_moe_threshold`] over the token
    /// counts that fit the budget (each count's time predicted from the previous one), the fitted
    /// threshold as the padding-ratio rule. Runs only where a GPU is present; not exercised on
    /// hardware in this repository's test runs (see the README).
    pub(crate) fn moe_layer_autotune(
        &self,
        w: &CudaMoeLayer,
        routing: crate::moe::MoeRouting,
        budget: std::time::Duration,
    ) -> Result<(MoeCostModel, AutotuneReport)> {
        let t0 = std::time::Instant::now();
        let routing = pipeline_routing(routing);
        let mut samples = Vec::new();
        let mut last = 0.0f64;
        let mut measured = 0usize;
        for (i, &tokens) in CALIBRATION_TOKENS.iter().enumerate() {
            let spent = t0.elapsed().as_secs_f64();
            // Time grows about linearly with tokens past the first few counts.
            let predicted = if i == 0 { 0.0 } else { last * tokens as f64 / CALIBRATION_TOKENS[i - 1] as f64 };
            if i >= 2 && spent + predicted > budget.as_secs_f64() {
                break;
            }
            let tk = std::time::Instant::now();
            let (_, s) = self.calibrate_moe_threshold(&w.experts, routing, &[tokens], 5)?;
            samples.extend(s);
            last = tk.elapsed().as_secs_f64();
            measured = i + 1;
        }
        let threshold = fit_padding_threshold(&samples);
        let mut model = MoeCostModel::padding_ratio_rule(
            CudaMoeVariant::Bm128.name(),
            CudaMoeVariant::Bm64.name(),
            threshold as f64,
        );
        model.origin = "autotune".into();
        let report = AutotuneReport {
            seconds: t0.elapsed().as_secs_f64(),
            samples: samples.len() * 2,
            knots_measured: measured,
            complete: measured == CALIBRATION_TOKENS.len(),
        };
        Ok((model, report))
    }
}
