//! `ReferenceBackend`: the plainest possible implementation of every op, with f64 accumulation.
//! It is the oracle the fast backends (CPU SIMD, CUDA) are tested against, never a serving path.

mod moe;

use std::time::{Duration, Instant};

use crate::backend::*;
use crate::host::{HostKvCache, HostTensor};
use crate::moe::{
    BackendVariant, MoeCostModel, MoeLayerHost, MoeLayerStats, MoeRouting, MoeSelect, MoeVariant, VariantCost,
};
pub use moe::{route as moe_route, PlainMoe, PlainShared, ReferenceMoeVariant};

#[derive(Debug, Default, Clone)]
pub struct ReferenceBackend;

/// A weight kept as plain row-major `[out, in]`.
#[derive(Debug, Clone)]
pub struct PlainWeight {
    pub data: Vec<f32>,
    pub out_features: usize,
    pub in_features: usize,
}

fn check(cond: bool, msg: impl FnOnce() -> String) -> Result<()> {
    if cond {
        Ok(())
    } else {
        Err(KernelError::Shape(msg()))
    }
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// Rotates one head in place; `pos` is the logical position.
pub fn rope_head_reference(head: &mut [f32], pos: u32, rope: RopeConfig) {
    let (d, scale) = (rope.rotary_dim, rope.attention_scaling());
    for (i, inv_freq) in rope.inv_freq().into_iter().enumerate() {
        let angle = pos as f64 * inv_freq;
        let (sin, cos) = angle.sin_cos();
        let (sin, cos) = (sin * scale, cos * scale);
        let (a, b) = match rope.layout {
            RopeLayout::Interleaved => (2 * i, 2 * i + 1),
            RopeLayout::HalfSplit => (i, i + d / 2),
        };
        let (x0, x1) = (head[a] as f64, head[b] as f64);
        head[a] = (x0 * cos - x1 * sin) as f32;
        head[b] = (x0 * sin + x1 * cos) as f32;
    }
}

fn rms_norm_row(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ms = x.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps as f64).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = (v as f64 * inv * g as f64) as f32;
    }
}

impl Backend for ReferenceBackend {
    type Tensor = HostTensor;
    type Weight = PlainWeight;
    type Vector = Vec<f32>;
    type Embedding = PlainWeight;
    type KvCache = HostKvCache;
    type Batch = BatchLayout;
    type MoeWeights = PlainMoe;
    type MoeLog = Vec<MoeLayerStats>;

    fn name(&self) -> String {
        "reference".into()
    }

    fn linear_weight(&self, data: &[f32], out_features: usize, in_features: usize) -> Result<PlainWeight> {
        check(data.len() == out_features * in_features, || {
            format!("weight [{out_features}, {in_features}] from {} values", data.len())
        })?;
        Ok(PlainWeight { data: data.to_vec(), out_features, in_features })
    }

    fn vector(&self, data: &[f32]) -> Result<Vec<f32>> {
        Ok(data.to_vec())
    }

    fn embedding(&self, data: &[f32], vocab: usize, hidden: usize) -> Result<PlainWeight> {
        self.linear_weight(data, vocab, hidden)
    }

    fn kv_cache(&self, num_layers: usize, num_slots: usize, n_kv_heads: usize, head_dim: usize) -> Result<HostKvCache> {
        HostKvCache::new(num_layers, num_slots, n_kv_heads, head_dim)
    }

    fn zeros(&self, rows: usize, cols: usize) -> Result<HostTensor> {
        Ok(HostTensor::zeros(rows, cols))
    }

    fn from_host(&self, data: &[f32], rows: usize, cols: usize) -> Result<HostTensor> {
        check(data.len() == rows * cols, || format!("tensor [{rows}, {cols}] from {} values", data.len()))?;
        Ok(HostTensor::from_vec(data.to_vec(), rows, cols))
    }

    fn to_host(&self, t: &HostTensor) -> Result<Vec<f32>> {
        Ok(t.data.clone())
    }

    fn shape(&self, t: &HostTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn reshape_scratch(&self, t: &mut HostTensor, rows: usize, cols: usize) -> Result<()> {
        t.reshape_scratch(rows, cols);
        Ok(())
    }

    fn prepare_batch(&self, layout: &BatchLayout, cache: &HostKvCache) -> Result<BatchLayout> {
        layout.validate(cache.num_slots)?;
        Ok(layout.clone())
    }

    fn embed(&self, table: &PlainWeight, batch: &BatchLayout, out: &mut HostTensor) -> Result<()> {
        check(out.rows == batch.num_rows() && out.cols == table.in_features, || "embed: output shape".into())?;
        for (r, &id) in batch.token_ids.iter().enumerate() {
            check((id as usize) < table.out_features, || format!("token id {id} ≥ vocab {}", table.out_features))?;
            let h = table.in_features;
            out.row_mut(r).copy_from_slice(&table.data[id as usize * h..(id as usize + 1) * h]);
        }
        Ok(())
    }

    fn matmul(&self, x: &HostTensor, w: &PlainWeight, bias: Option<&Vec<f32>>, out: &mut HostTensor) -> Result<()> {
        check(x.cols == w.in_features && out.rows == x.rows && out.cols == w.out_features, || {
            format!(
                "matmul [{}, {}] x [{}, {}]ᵀ -> [{}, {}]",
                x.rows, x.cols, w.out_features, w.in_features, out.rows, out.cols
            )
        })?;
        for r in 0..x.rows {
            let xr = x.row(r);
            for n in 0..w.out_features {
                let wr = &w.data[n * w.in_features..(n + 1) * w.in_features];
                let mut acc: f64 = xr.iter().zip(wr).map(|(&a, &b)| a as f64 * b as f64).sum();
                if let Some(b) = bias {
                    acc += b[n] as f64;
                }
                out.data[r * out.cols + n] = acc as f32;
            }
        }
        Ok(())
    }

    fn matmul_add(&self, x: &HostTensor, w: &PlainWeight, acc: &mut HostTensor) -> Result<()> {
        let mut tmp = HostTensor::zeros(acc.rows, acc.cols);
        self.matmul(x, w, None, &mut tmp)?;
        for (a, t) in acc.data.iter_mut().zip(&tmp.data) {
            *a += *t;
        }
        Ok(())
    }

    fn rms_norm(&self, x: &HostTensor, w: &Vec<f32>, eps: f32, out: &mut HostTensor) -> Result<()> {
        check(x.cols == w.len() && out.rows == x.rows && out.cols == x.cols, || "rms_norm: shapes".into())?;
        for r in 0..x.rows {
            let (xr, or) = (x.row(r).to_vec(), out.row_mut(r));
            rms_norm_row(&xr, w, eps, or);
        }
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
        let shapes_ok = delta.rows == x.rows
            && delta.cols == x.cols
            && x.cols == w.len()
            && (out.rows, out.cols) == (x.rows, x.cols);
        check(shapes_ok, || "add_rms_norm: shapes".into())?;
        for (v, d) in x.data.iter_mut().zip(&delta.data) {
            *v += d;
        }
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
        batch: &BatchLayout,
    ) -> Result<()> {
        check(qkv.cols == layout.qkv_dim() && qkv.rows == batch.num_rows(), || "qk_norm_rope: shapes".into())?;
        let hd = layout.head_dim;
        for r in 0..qkv.rows {
            let pos = batch.positions[r];
            let row = qkv.row_mut(r);
            let heads = (0..layout.n_heads)
                .map(|h| (h * hd, q_norm))
                .chain((0..layout.n_kv_heads).map(|h| (layout.k_offset() + h * hd, k_norm)));
            for (off, norm) in heads {
                let head = &mut row[off..off + hd];
                if let Some(w) = norm {
                    let src = head.to_vec();
                    rms_norm_row(&src, w, eps, head);
                }
                rope_head_reference(head, pos, rope);
            }
        }
        Ok(())
    }

    fn write_kv(
        &self,
        qkv: &HostTensor,
        layout: QkvLayout,
        cache: &mut HostKvCache,
        layer: usize,
        batch: &BatchLayout,
    ) -> Result<()> {
        let kvd = layout.kv_dim();
        check(layer < cache.num_layers && cache.kv_dim() == kvd, || "write_kv: cache shape".into())?;
        for r in 0..qkv.rows {
            let slot = batch.row_slots[r] as usize;
            let row = qkv.row(r);
            cache.k[layer][slot * kvd..(slot + 1) * kvd]
                .copy_from_slice(&row[layout.k_offset()..layout.k_offset() + kvd]);
            cache.v[layer][slot * kvd..(slot + 1) * kvd]
                .copy_from_slice(&row[layout.v_offset()..layout.v_offset() + kvd]);
        }
        Ok(())
    }

    fn attention(
        &self,
        qkv: &HostTensor,
        layout: QkvLayout,
        cache: &HostKvCache,
        layer: usize,
        batch: &BatchLayout,
        out: &mut HostTensor,
    ) -> Result<()> {
        check(out.rows == qkv.rows && out.cols == layout.q_dim(), || "attention: output shape".into())?;
        let (hd, kvd) = (layout.head_dim, layout.kv_dim());
        let group = layout.n_heads / layout.n_kv_heads;
        let scale = 1.0 / (hd as f64).sqrt();
        let (kc, vc) = (&cache.k[layer], &cache.v[layer]);
        for s in &batch.seqs {
            let slots = &batch.key_slots[s.slot_offset as usize..(s.slot_offset + s.ctx_len) as usize];
            for qi in 0..s.q_len as usize {
                let r = s.q_row as usize + qi;
                let pos = (s.ctx_len - s.q_len) as usize + qi; // keys 0..=pos are visible
                for h in 0..layout.n_heads {
                    let kvh = h / group;
                    let q = &qkv.row(r)[h * hd..(h + 1) * hd];
                    let scores: Vec<f64> = (0..=pos)
                        .map(|p| {
                            let k = &kc[slots[p] as usize * kvd + kvh * hd..][..hd];
                            q.iter().zip(k).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * scale
                        })
                        .collect();
                    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let denom: f64 = exps.iter().sum();
                    let o = &mut out.data[r * layout.q_dim() + h * hd..][..hd];
                    for (d, od) in o.iter_mut().enumerate() {
                        let mut acc = 0.0f64;
                        for (p, e) in exps.iter().enumerate() {
                            acc += e * vc[slots[p] as usize * kvd + kvh * hd + d] as f64;
                        }
                        *od = (acc / denom) as f32;
                    }
                }
            }
        }
        Ok(())
    }

    fn silu_mul(&self, gate_up: &HostTensor, out: &mut HostTensor) -> Result<()> {
        let i = gate_up.cols / 2;
        check(gate_up.cols == 2 * i && out.cols == i && out.rows == gate_up.rows, || "silu_mul: shapes".into())?;
        for r in 0..gate_up.rows {
            let gu = gate_up.row(r).to_vec();
            for (c, o) in out.row_mut(r).iter_mut().enumerate() {
                *o = (silu(gu[c] as f64) * gu[i + c] as f64) as f32;
            }
        }
        Ok(())
    }

    fn gather_rows(&self, x: &HostTensor, rows: &[u32], out: &mut HostTensor) -> Result<()> {
        check(out.rows == rows.len() && out.cols == x.cols, || "gather_rows: shapes".into())?;
        for (i, &r) in rows.iter().enumerate() {
            check((r as usize) < x.rows, || format!("gather_rows: row {r} ≥ {}", x.rows))?;
            out.row_mut(i).copy_from_slice(x.row(r as usize));
        }
        Ok(())
    }

    fn dot_rows(&self, x: &HostTensor, v: &Vec<f32>) -> Result<Vec<f32>> {
        check(x.cols == v.len(), || "dot_rows: shapes".into())?;
        Ok((0..x.rows)
            .map(|r| x.row(r).iter().zip(v).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() as f32)
            .collect())
    }

    fn lm_logits(&self, x: &HostTensor, table: &PlainWeight, out: &mut HostTensor) -> Result<()> {
        self.matmul(x, table, None, out)
    }

    fn moe_weights(&self, w: &MoeLayerHost) -> Result<PlainMoe> {
        PlainMoe::new(w)
    }

    fn moe_variants(&self) -> Vec<MoeVariant> {
        ReferenceMoeVariant::descriptions()
    }

    fn moe_default_cost(&self, _hidden: usize, _expert_inter: usize) -> MoeCostModel {
        MoeCostModel {
            variants: vec![VariantCost {
                variant: ReferenceMoeVariant::PerToken.name().into(),
                per_call: 0.0,
                per_expert: vec![],
                per_row: 1.0,
                per_padded_row: 0.0,
            }],
            origin: "default".into(),
            tie_margin: 0.0,
        }
    }

    fn moe_log(&self) -> Result<Vec<MoeLayerStats>> {
        Ok(Vec::new())
    }

    fn moe_ffn(
        &self,
        x: &HostTensor,
        w: &PlainMoe,
        routing: MoeRouting,
        select: MoeSelect,
        acc: &mut HostTensor,
        log: &mut Vec<MoeLayerStats>,
    ) -> Result<()> {
        select.choose(&[], &ReferenceMoeVariant::descriptions())?;
        log.push(moe::moe_ffn(x, w, routing, acc)?);
        Ok(())
    }

    fn read_moe_log(&self, log: &mut Vec<MoeLayerStats>) -> Result<Vec<MoeLayerStats>> {
        Ok(std::mem::take(log))
    }

    fn moe_time_variant(&self, w: &PlainMoe, variant: usize, histogram: &[u32]) -> Result<Duration> {
        check(variant == 0 && histogram.len() == w.num_experts, || {
            format!("moe_time_variant: variant {variant}, {} counts for {} experts", histogram.len(), w.num_experts)
        })?;
        // The expert loop alone, on zero rows: one token per assignment.
        let x = vec![0f32; w.hidden];
        let (h, i) = (w.hidden, w.inter);
        let t = Instant::now();
        for (e, &n) in histogram.iter().enumerate() {
            for _ in 0..n {
                std::hint::black_box(moe::swiglu_expert(&x, w, e, h, i));
            }
        }
        Ok(t.elapsed())
    }

    fn moe_autotune(
        &self,
        w: &PlainMoe,
        _routing: MoeRouting,
        num_experts: usize,
        budget: Duration,
    ) -> Result<(MoeCostModel, crate::moe::AutotuneReport)> {
        crate::autotune::autotune(self, w, num_experts, budget)
    }
}
