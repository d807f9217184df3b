//! `TwinBackend`: the CUDA backend's data layout and kernels, run on the CPU. Weights and
//! embeddings are bf16, the K/V pools are bf16, activations f32, the projections are bf16 GEMMs
//! with f32 accumulation, and every other op is its kernel's twin with the launch the CUDA
//! backend would make. Tested op by op against `ReferenceBackend`; the numbers a GPU run should
//! give, within the tensor cores' and cuBLAS's own summation order.

use super::attention::{attention_prefill, AttentionArgs};
use super::attention_mma::{attention_mma, AttentionMmaArgs};
use super::elementwise::{broadcast_rows, cast_bf16, dot_rows, embed_rows, gather_rows, silu_mul_f32, write_kv};
use super::gemm::{dense_gemm, dense_gemm_swiglu, dense_gemm_v1, gemm_bf16};
use super::rmsnorm::rms_norm_rows;
use super::rope::{qk_norm_rope, qk_norm_rope_kv, rope_table_rows, KvOut, QkNormRopeArgs};
use super::warp::{from_bf16, to_bf16_vec};
use super::wgmma_tile::{dense_gemm_wgmma_tma, dense_gemm_wgmma_tma_swiglu};
use crate::backend::*;
use crate::cuda::layout::{check_rope_shape, PackedBatch};
use crate::cuda::{checks, AttentionEngine, GemmEngine, WgmmaShape};
use crate::host::HostTensor;

#[derive(Debug, Default, Clone)]
pub struct TwinBackend {
    pub gemm: GemmEngine,
    pub attention: AttentionEngine,
}

impl TwinBackend {
    /// The twin with the batch-invariant tiled GEMM for the projections.
    pub fn tiled() -> Self {
        TwinBackend { gemm: GemmEngine::Tiled, ..Default::default() }
    }
}

/// A bf16 matrix `[rows, cols]` (a linear weight `[out, in]` or an embedding `[vocab, hidden]`).
#[derive(Debug, Clone)]
pub struct TwinMatrix {
    pub data: Vec<u16>,
    pub rows: usize,
    pub cols: usize,
}

/// bf16 K/V pools: per layer `num_slots × kv_dim`.
#[derive(Debug, Clone)]
pub struct TwinKvCache {
    pub num_layers: usize,
    pub num_slots: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub k: Vec<Vec<u16>>,
    pub v: Vec<Vec<u16>>,
}

impl TwinKvCache {
    fn dims(&self) -> (usize, usize, usize) {
        (self.num_layers, self.num_slots, self.n_kv_heads * self.head_dim)
    }
}

/// A prepared batch: the layout and its packed device form.
#[derive(Debug, Clone)]
pub struct TwinBatch {
    pub layout: BatchLayout,
    pub packed: PackedBatch,
}

impl TwinBatch {
    /// attention_mma.cu's launches for this batch over `layer`: the shared passes, then the own
    /// pass, into f32 `out`, or (`out_bf16`, an operand) bf16 rows with `out` the f32 state.
    pub fn attention_mma(
        &self,
        qkv: &HostTensor,
        layout: QkvLayout,
        cache: &TwinKvCache,
        layer: usize,
        out: &mut [f32],
        mut out_bf16: Option<&mut [u16]>,
    ) {
        let p = &self.packed;
        let args = AttentionMmaArgs {
            qkv: &qkv.data,
            k_pool: &cache.k[layer],
            v_pool: &cache.v[layer],
            seqs: p.slice(&p.seqs),
            key_slots: p.slice(&p.key_slots),
            rows: p.slice(&p.attn_rows),
            qkv_cols: qkv.cols,
            n_heads: layout.n_heads,
            n_kv_heads: layout.n_kv_heads,
            head_dim: layout.head_dim,
            scale_log2: attention_scale_log2(layout.head_dim),
        };
        let mut ml = vec![0f32; p.num_rows * layout.n_heads * 2];
        for level in &p.attn_shared_levels {
            attention_mma(args, p.slice(level), out, &mut ml, out_bf16.as_deref_mut());
        }
        attention_mma(args, p.slice(&p.attn_own_units), out, &mut ml, out_bf16);
    }
}

fn shape(t: &HostTensor) -> (usize, usize) {
    (t.rows, t.cols)
}

/// The launch's angle table: rope.cu's `rope_table` at the batch's positions.
fn rope_cs(rope: RopeConfig, batch: &TwinBatch) -> Vec<f64> {
    let mut positions: Vec<usize> = batch.layout.positions.iter().map(|&p| p as usize).collect();
    positions.sort_unstable();
    positions.dedup();
    rope_table_rows(rope, batch.packed.positions_end, positions)
}

fn rope_args<'a>(
    qkv_cols: usize,
    layout: QkvLayout,
    q_norm: Option<&'a Vec<f32>>,
    k_norm: Option<&'a Vec<f32>>,
    eps: f32,
    (rope, rope_cs): (RopeConfig, &'a [f64]),
) -> QkNormRopeArgs<'a> {
    QkNormRopeArgs {
        qkv_cols,
        n_heads: layout.n_heads,
        n_kv_heads: layout.n_kv_heads,
        head_dim: layout.head_dim,
        eps,
        q_norm: q_norm.map(|v| v.as_slice()),
        k_norm: k_norm.map(|v| v.as_slice()),
        rope_cs,
        rotary_dim: rope.rotary_dim,
        interleaved: rope.layout == RopeLayout::Interleaved,
    }
}

impl TwinBackend {
    fn project(&self, x: &HostTensor, w: &TwinMatrix, bias: Option<&Vec<f32>>, out: &mut HostTensor, accumulate: bool) {
        let mut xb = vec![0u16; x.data.len()];
        cast_bf16(&x.data, &mut xb);
        let beta = if let Some(b) = bias {
            broadcast_rows(b, &mut out.data, w.rows);
            1.0
        } else if accumulate {
            1.0
        } else {
            0.0
        };
        if self.gemm == GemmEngine::Wgmma && self.gemm.tiled_for(w.cols) {
            let bn = WgmmaShape::dense_bn(x.rows, w.rows);
            dense_gemm_wgmma_tma(bn, &xb, &w.data, &mut out.data, x.rows, w.rows, w.cols, beta);
        } else if self.gemm.tiled_for(w.cols) {
            let bm = self.gemm.block_m(x.rows, w.rows);
            let gemm = if self.gemm == GemmEngine::TiledV1 { dense_gemm_v1 } else { dense_gemm };
            gemm(bm, &xb, &w.data, &mut out.data, x.rows, w.rows, w.cols, beta);
        } else {
            gemm_bf16(&xb, &w.data, &mut out.data, x.rows, w.rows, w.cols, beta);
        }
    }
}

impl Backend for TwinBackend {
    type Tensor = HostTensor;
    type Weight = TwinMatrix;
    type Vector = Vec<f32>;
    type Embedding = TwinMatrix;
    type KvCache = TwinKvCache;
    type Batch = TwinBatch;
    type MoeWeights = super::moe::TwinMoeLayer;
    type MoeLog = Vec<crate::moe::MoeLayerStats>;

    fn name(&self) -> String {
        format!("cuda-twin ({:?} GEMM)", self.gemm)
    }

    fn linear_weight(&self, data: &[f32], out_features: usize, in_features: usize) -> Result<TwinMatrix> {
        checks::host_data(data.len(), out_features, in_features, "weight")?;
        Ok(TwinMatrix { data: to_bf16_vec(data), rows: out_features, cols: in_features })
    }

    fn vector(&self, data: &[f32]) -> Result<Vec<f32>> {
        Ok(data.to_vec())
    }

    fn embedding(&self, data: &[f32], vocab: usize, hidden: usize) -> Result<TwinMatrix> {
        self.linear_weight(data, vocab, hidden)
    }

    fn kv_cache(&self, num_layers: usize, num_slots: usize, n_kv_heads: usize, head_dim: usize) -> Result<TwinKvCache> {
        let per_layer = crate::host::kv_cache_values(num_layers, num_slots, n_kv_heads * head_dim, size_of::<u16>())?;
        Ok(TwinKvCache {
            num_layers,
            num_slots,
            n_kv_heads,
            head_dim,
            k: vec![vec![0; per_layer]; num_layers],
            v: vec![vec![0; per_layer]; num_layers],
        })
    }

    fn zeros(&self, rows: usize, cols: usize) -> Result<HostTensor> {
        Ok(HostTensor::zeros(rows, cols))
    }

    fn from_host(&self, data: &[f32], rows: usize, cols: usize) -> Result<HostTensor> {
        checks::host_data(data.len(), rows, cols, "tensor")?;
        Ok(HostTensor { data: data.to_vec(), rows, cols })
    }

    fn to_host(&self, t: &HostTensor) -> Result<Vec<f32>> {
        Ok(t.data.clone())
    }

    fn shape(&self, t: &HostTensor) -> (usize, usize) {
        shape(t)
    }

    fn prepare_batch(&self, layout: &BatchLayout, cache: &TwinKvCache) -> Result<TwinBatch> {
        layout.validate(cache.num_slots)?;
        Ok(TwinBatch { layout: layout.clone(), packed: PackedBatch::new(layout) })
    }

    fn embed(&self, table: &TwinMatrix, batch: &TwinBatch, out: &mut HostTensor) -> Result<()> {
        checks::embed((table.rows, table.cols), &batch.layout, shape(out))?;
        embed_rows(&table.data, &batch.layout.token_ids, &mut out.data, table.cols);
        Ok(())
    }

    fn matmul(&self, x: &HostTensor, w: &TwinMatrix, bias: Option<&Vec<f32>>, out: &mut HostTensor) -> Result<()> {
        checks::matmul(shape(x), (w.rows, w.cols), shape(out), bias.map(|b| b.len()))?;
        self.project(x, w, bias, out, false);
        Ok(())
    }

    fn matmul_add(&self, x: &HostTensor, w: &TwinMatrix, acc: &mut HostTensor) -> Result<()> {
        checks::matmul(shape(x), (w.rows, w.cols), shape(acc), None)?;
        self.project(x, w, None, acc, true);
        Ok(())
    }

    fn rms_norm(&self, x: &HostTensor, w: &Vec<f32>, eps: f32, out: &mut HostTensor) -> Result<()> {
        checks::rms_norm(shape(x), w.len(), shape(out))?;
        rms_norm_rows(&x.data, w, &mut out.data, x.rows, x.cols, eps);
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
        checks::add_rms_norm(shape(x), shape(delta), w.len(), shape(out))?;
        for (v, d) in x.data.iter_mut().zip(&delta.data) {
            *v += d;
        }
        rms_norm_rows(&x.data, w, &mut out.data, x.rows, x.cols, eps);
        Ok(())
    }

    fn qk_norm_rope(
        &self,
        qkv: &mut HostTensor,
        layout: QkvLayout,
        q_norm: Option<&Vec<f32>>,
        k_norm: Option<&Vec<f32>>,
        eps: f32,
        rope: RopeConfig,
        batch: &TwinBatch,
    ) -> Result<()> {
        checks::qk_norm_rope(
            shape(qkv),
            layout,
            q_norm.map(|v| v.len()),
            k_norm.map(|v| v.len()),
            batch.packed.num_rows,
        )?;
        check_rope_shape(layout, rope)?;
        let cs = rope_cs(rope, batch);
        let args = rope_args(qkv.cols, layout, q_norm, k_norm, eps, (rope, &cs));
        qk_norm_rope(&mut qkv.data, &batch.layout.positions, args);
        Ok(())
    }

    /// With fused epilogues ([`GemmEngine::fused`]), rope.cu's `qk_norm_rope` with its K/V write.
    fn qk_norm_rope_write_kv(
        &self,
        qkv: &mut HostTensor,
        layout: QkvLayout,
        q_norm: Option<&Vec<f32>>,
        k_norm: Option<&Vec<f32>>,
        eps: f32,
        rope: RopeConfig,
        cache: &mut TwinKvCache,
        layer: usize,
        batch: &TwinBatch,
    ) -> Result<()> {
        if !self.gemm.fused() {
            self.qk_norm_rope(qkv, layout, q_norm, k_norm, eps, rope, batch)?;
            return self.write_kv(qkv, layout, cache, layer, batch);
        }
        let norms = (q_norm.map(|v| v.len()), k_norm.map(|v| v.len()));
        checks::qk_norm_rope_write_kv(shape(qkv), layout, norms, rope, cache.dims(), layer, batch.packed.num_rows)?;
        let cs = rope_cs(rope, batch);
        let args = rope_args(qkv.cols, layout, q_norm, k_norm, eps, (rope, &cs));
        let kv = KvOut { row_slots: &batch.layout.row_slots, k_pool: &mut cache.k[layer], v_pool: &mut cache.v[layer] };
        qk_norm_rope_kv(&mut qkv.data, &batch.layout.positions, args, Some(kv));
        Ok(())
    }

    fn write_kv(
        &self,
        qkv: &HostTensor,
        layout: QkvLayout,
        cache: &mut TwinKvCache,
        layer: usize,
        batch: &TwinBatch,
    ) -> Result<()> {
        checks::write_kv(shape(qkv), layout, cache.dims(), layer, batch.packed.num_rows)?;
        let (k, v) = (&mut cache.k[layer], &mut cache.v[layer]);
        write_kv(
            &qkv.data,
            &batch.layout.row_slots,
            k,
            v,
            qkv.cols,
            layout.k_offset(),
            layout.v_offset(),
            layout.kv_dim(),
        );
        Ok(())
    }

    fn attention(
        &self,
        qkv: &HostTensor,
        layout: QkvLayout,
        cache: &TwinKvCache,
        layer: usize,
        batch: &TwinBatch,
        out: &mut HostTensor,
    ) -> Result<()> {
        checks::attention(shape(qkv), layout, cache.dims(), layer, batch.packed.num_rows, shape(out))?;
        let p = &batch.packed;
        if self.attention.mma_for(layout.head_dim) {
            batch.attention_mma(qkv, layout, cache, layer, &mut out.data, None);
            return Ok(());
        }
        let args = AttentionArgs {
            qkv: &qkv.data,
            k_pool: &cache.k[layer],
            v_pool: &cache.v[layer],
            seqs: p.slice(&p.seqs),
            key_slots: p.slice(&p.key_slots),
            q_tiles: p.slice(&p.q_tiles),
            qkv_cols: qkv.cols,
            n_heads: layout.n_heads,
            n_kv_heads: layout.n_kv_heads,
            head_dim: layout.head_dim,
            scale: attention_scale(layout.head_dim),
        };
        attention_prefill(args, &mut out.data);
        Ok(())
    }

    fn silu_mul(&self, gate_up: &HostTensor, out: &mut HostTensor) -> Result<()> {
        checks::silu_mul(shape(gate_up), shape(out))?;
        silu_mul_f32(&gate_up.data, &mut out.data, out.cols);
        Ok(())
    }

    /// With fused epilogues ([`GemmEngine::fused`]), gemm.cu's `dense_gemm_swiglu_*` (on the
    /// wgmma engine gemm_wgmma.cu's `dense_gemm_wgmma_tma_swiglu_*`): `out` holds the bf16
    /// activation the kernel stores (as f32 values).
    fn matmul_silu_mul(
        &self,
        x: &HostTensor,
        w: &TwinMatrix,
        gate_up: &mut HostTensor,
        out: &mut HostTensor,
    ) -> Result<()> {
        let (rows, inter) = shape(out);
        checks::matmul(shape(x), (w.rows, w.cols), (rows, 2 * inter), None)?;
        if self.gemm.swiglu_fused_for(w.cols, inter) {
            let mut xb = vec![0u16; x.data.len()];
            cast_bf16(&x.data, &mut xb);
            let mut act = vec![0u16; rows * inter];
            if self.gemm == GemmEngine::Wgmma {
                let bn = WgmmaShape::dense_bn(rows, w.rows);
                dense_gemm_wgmma_tma_swiglu(bn, &xb, &w.data, &mut act, rows, w.rows, w.cols);
            } else {
                let bm = self.gemm.block_m(rows, w.rows);
                dense_gemm_swiglu(bm, &xb, &w.data, &mut act, rows, w.rows, w.cols);
            }
            for (o, &a) in out.data.iter_mut().zip(&act) {
                *o = from_bf16(a);
            }
            return Ok(());
        }
        self.reshape_scratch(gate_up, rows, 2 * inter)?;
        self.matmul(x, w, None, gate_up)?;
        self.silu_mul(gate_up, out)
    }

    fn gather_rows(&self, x: &HostTensor, rows: &[u32], out: &mut HostTensor) -> Result<()> {
        checks::gather_rows(shape(x), rows, shape(out))?;
        gather_rows(&x.data, rows, &mut out.data, x.cols);
        Ok(())
    }

    fn dot_rows(&self, x: &HostTensor, v: &Vec<f32>) -> Result<Vec<f32>> {
        checks::dot_rows(shape(x), v.len())?;
        Ok(dot_rows(&x.data, v, x.rows, x.cols))
    }

    fn lm_logits(&self, x: &HostTensor, table: &TwinMatrix, out: &mut HostTensor) -> Result<()> {
        checks::matmul(shape(x), (table.rows, table.cols), shape(out), None)?;
        self.project(x, table, None, out, false);
        Ok(())
    }

    // ---- MoE: the GPU pipeline's launches (cuda/device/moe.rs), run by the twin kernels ----
    fn moe_weights(&self, w: &crate::moe::MoeLayerHost) -> Result<super::moe::TwinMoeLayer> {
        use crate::cuda::moe::{check_moe, MoeDims, MoeRouting, SharedExpert};
        w.validate()?;
        let dims = MoeDims { hidden: w.hidden, inter: w.expert_inter, n_experts: w.num_experts };
        check_moe(dims, MoeRouting { top_k: 1, renormalize: false })?;
        Ok(super::moe::TwinMoeLayer {
            router: self.linear_weight(w.router, w.num_experts, w.hidden)?,
            experts: super::moe::TwinMoeWeights::new(dims, w.gate_up, w.down)?,
            shared: w
                .shared
                .map(|s| SharedExpert::upload(&s, w.hidden, |d, r, c| self.linear_weight(d, r, c)))
                .transpose()?,
        })
    }

    fn moe_variants(&self) -> Vec<crate::moe::MoeVariant> {
        crate::cuda::moe::gpu_variants()
    }

    fn moe_default_cost(&self, _hidden: usize, _expert_inter: usize) -> crate::moe::MoeCostModel {
        crate::cuda::moe::gpu_default_cost()
    }

    fn moe_log(&self) -> Result<Vec<crate::moe::MoeLayerStats>> {
        Ok(Vec::new())
    }

    fn moe_ffn(
        &self,
        x: &HostTensor,
        w: &super::moe::TwinMoeLayer,
        routing: crate::moe::MoeRouting,
        select: crate::moe::MoeSelect,
        acc: &mut HostTensor,
        log: &mut Vec<crate::moe::MoeLayerStats>,
    ) -> Result<()> {
        use super::moe_permute::SharedTerm;
        use crate::cuda::moe::{check_moe, layer_stats, pipeline_routing, tile_policy};
        let policy = tile_policy(select)?;
        let routing = pipeline_routing(routing);
        check_moe(w.experts.dims, routing)?;
        let n_experts = w.experts.dims.n_experts;
        if x.cols != w.experts.dims.hidden || shape(acc) != shape(x) {
            return Err(KernelError::Shape(format!(
                "moe_ffn: x {:?}, acc {:?}, hidden {}",
                shape(x),
                shape(acc),
                w.experts.dims.hidden
            )));
        }
        let mut logits = HostTensor::zeros(x.rows, n_experts);
        self.project(x, &w.router, None, &mut logits, false);
        let shared = w.shared.as_ref().map(|s| s.forward(self, x)).transpose()?;
        let term = shared.as_ref().map(|(y, logit)| SharedTerm { y: &y.data, gate_logits: &logit.data });
        let (out, choice, counts) =
            super::moe::moe_forward_with_counts(&x.data, &logits.data, &w.experts, routing, policy, self.gemm, term)?;
        // The GPU's un-permute adds into acc (accumulate = 1): acc + (Σ_j w·y + g·shared), as here.
        for (a, o) in acc.data.iter_mut().zip(&out) {
            *a += o;
        }
        log.push(layer_stats(x.rows, choice, &counts));
        Ok(())
    }

    fn read_moe_log(&self, log: &mut Vec<crate::moe::MoeLayerStats>) -> Result<Vec<crate::moe::MoeLayerStats>> {
        Ok(std::mem::take(log))
    }

    fn moe_time_variant(
        &self,
        _w: &super::moe::TwinMoeLayer,
        _variant: usize,
        _histogram: &[u32],
    ) -> Result<std::time::Duration> {
        Err(KernelError::Unsupported(
            "moe_time_variant on the CUDA twin: the GPU calibration is moe_autotune (padding-ratio threshold)".into(),
        ))
    }

    fn moe_autotune(
        &self,
        _w: &super::moe::TwinMoeLayer,
        _routing: crate::moe::MoeRouting,
        _num_experts: usize,
        _budget: std::time::Duration,
    ) -> Result<(crate::moe::MoeCostModel, crate::moe::AutotuneReport)> {
        // Timing the twin on the CPU says nothing about a GPU: keep the reference rule.
        Ok((
            crate::cuda::moe::gpu_default_cost(),
            crate::moe::AutotuneReport { seconds: 0.0, samples: 0, knots_measured: 0, complete: false },
        ))
    }
}

/// The softmax scale in base 2, `log2(e)/sqrt(head_dim)`, as the f32 both backends pass to the
/// tensor-core kernel (it exponentiates with `exp2`).
pub fn attention_scale_log2(head_dim: usize) -> f32 {
    (std::f64::consts::LOG2_E / (head_dim as f64).sqrt()) as f32
}

/// The softmax scale `1/sqrt(head_dim)`, as the f32 both backends pass to the kernel.
pub fn attention_scale(head_dim: usize) -> f32 {
    (1.0 / (head_dim as f64).sqrt()) as f32
}
