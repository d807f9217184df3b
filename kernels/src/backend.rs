//! The one seam between the model graphs and the hardware.
//!
//! A forward pass is a sequence of calls on a [`Backend`]: the worker builds a [`BatchLayout`]
//! once per pass (which rows belong to which sequence, where each row's K/V goes, which slots
//! each sequence's attention reads), uploads it with [`Backend::prepare_batch`], then runs the
//! layer ops in order. Ops are issued in program order on one stream, so a K/V write always
//! completes before any attention that reads it.
//!
//! # Determinism contract
//! Every op computes each output row from that row's inputs alone (attention: from its
//! sequence's keys, visited in logical-position order) with a reduction order fixed by the op's
//! static shapes (hidden size, head_dim, ...) — never by the number of rows, the batch layout,
//! the physical KV slots or the thread count. That is what makes a pair's score independent of
//! what else is in its batch, the split, and prefix reuse.

use std::fmt;
use std::time::Duration;

pub use crate::error::{KernelError, Result};
use crate::moe::{AutotuneReport, MoeCostModel, MoeLayerHost, MoeLayerStats, MoeRouting, MoeSelect, MoeVariant};

/// How rotary embedding pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeLayout {
    /// Adjacent pairs (2i, 2i+1): GGUF llama checkpoints (llama.cpp permutes Q/K at conversion).
    Interleaved,
    /// Halves (i, i + d/2): HF checkpoints (GPT-NeoX style `rotate_half`).
    HalfSplit,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeConfig {
    pub theta: f32,
    /// Rotated dimensions per head (≤ head_dim; the rest pass through).
    pub rotary_dim: usize,
    pub layout: RopeLayout,
    pub scaling: RopeScaling,
}

/// RoPE frequency scaling, as transformers computes it (`rope_scaling.rope_type`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum RopeScaling {
    #[default]
    None,
    /// `linear`: every frequency divided by `factor`.
    Linear { factor: f32 },
    /// `llama3` (Llama 3.1 and later): frequencies whose wavelength is past
    /// `original_max_position / low_freq_factor` divided by `factor`, those under
    /// `original_max_position / high_freq_factor` kept, a smooth blend between.
    Llama3 { factor: f32, low_freq_factor: f32, high_freq_factor: f32, original_max_position: u32 },
    /// `yarn` (YaRN, as Qwen2.5 / Qwen3 document for long contexts): frequencies whose
    /// rotations over `original_max_position` lie between `beta_slow` and `beta_fast` blended
    /// from kept to divided by `factor` (low-frequency ones divided), and cos and sin scaled by
    /// `attention_factor` (resolved from the file's `mscale` fields when it gives none).
    /// `truncate`: the blend's bounds rounded out to whole pairs, transformers' default.
    Yarn {
        factor: f32,
        original_max_position: u32,
        beta_fast: f32,
        beta_slow: f32,
        truncate: bool,
        attention_factor: f32,
    },
    /// `dynamic` (NTK): transformers rescales the base only for a batch reaching past the model's
    /// `max_position_embeddings`; the worker serves prompts within it (`ModelConfig::prompt_limit`),
    /// where it is unscaled.
    Dynamic { factor: f32 },
}

impl RopeConfig {
    /// The inverse frequency of each rotated pair, in f64: the one formula every backend's
    /// angle table reads (`theta^(-2i / rotary_dim)`, then the scaling).
    pub fn inv_freq(&self) -> Vec<f64> {
        let d = self.rotary_dim as f64;
        (0..self.rotary_dim / 2)
            .map(|i| {
                let f = (self.theta as f64).powf(-(2.0 * i as f64) / d);
                match self.scaling {
                    RopeScaling::None | RopeScaling::Dynamic { .. } => f,
                    RopeScaling::Linear { factor } => f / factor as f64,
                    RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position } => {
                        let (factor, low, high, old) = (
                            factor as f64,
                            low_freq_factor as f64,
                            high_freq_factor as f64,
                            original_max_position as f64,
                        );
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen < old / high {
                            f
                        } else if wavelen > old / low {
                            f / factor
                        } else {
                            let smooth = (old / wavelen - low) / (high - low);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    }
                    RopeScaling::Yarn { factor, original_max_position, beta_fast, beta_slow, truncate, .. } => {
                        // transformers' `_compute_yarn_parameters`: the pairs that turn fewer
                        // than `beta_slow` times over the original context are interpolated,
                        // more than `beta_fast` times kept, a linear ramp between.
                        let pair_at = |rotations: f64| {
                            d * (original_max_position as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln()
                                / (2.0 * (self.theta as f64).ln())
                        };
                        let (mut low, mut high) = (pair_at(beta_fast as f64), pair_at(beta_slow as f64));
                        if truncate {
                            (low, high) = (low.floor(), high.ceil());
                        }
                        let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
                        if low == high {
                            high += 0.001;
                        }
                        let interpolated = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        f / factor as f64 * interpolated + f * (1.0 - interpolated)
                    }
                }
            })
            .collect()
    }

    /// The factor cos and sin are scaled by (YaRN's attention factor; 1 otherwise): every
    /// backend's angle table multiplies by it.
    pub fn attention_scaling(&self) -> f64 {
        match self.scaling {
            RopeScaling::Yarn { attention_factor, .. } => attention_factor as f64,
            _ => 1.0,
        }
    }
}

/// Column layout of the fused QKV projection output: `[q heads | k heads | v heads]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QkvLayout {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

impl QkvLayout {
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
    /// Total columns of the fused QKV tensor.
    pub fn qkv_dim(&self) -> usize {
        self.q_dim() + 2 * self.kv_dim()
    }
    pub fn k_offset(&self) -> usize {
        self.q_dim()
    }
    pub fn v_offset(&self) -> usize {
        self.q_dim() + self.kv_dim()
    }
}

/// One sequence of a varlen batch, as attention sees it.
///
/// The sequence's context is `ctx_len` logical positions `0..ctx_len`; its query rows are the
/// last `q_len` of them (rows `q_row .. q_row + q_len` of the batch activations). The K/V of
/// logical position `p` is at slot `key_slots[slot_offset + p]`. A shared prefix is simply
/// positions whose slots lie in the prefix blocks: its exact length needs no block alignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnSeq {
    pub q_row: u32,
    pub q_len: u32,
    pub ctx_len: u32,
    pub slot_offset: u32,
}

/// Host-side description of one forward pass over a varlen batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchLayout {
    /// Token id of each row.
    pub token_ids: Vec<u32>,
    /// Logical position of each row (RoPE angle).
    pub positions: Vec<u32>,
    /// KV slot each row's K and V are written to.
    pub row_slots: Vec<u32>,
    pub seqs: Vec<AttnSeq>,
    /// Logical position → slot, concatenated per sequence (see [`AttnSeq`]).
    pub key_slots: Vec<u32>,
}

impl BatchLayout {
    pub fn num_rows(&self) -> usize {
        self.token_ids.len()
    }

    /// Checks internal consistency; a backend calls this in `prepare_batch`.
    pub fn validate(&self, num_slots: usize) -> Result<()> {
        let n = self.token_ids.len();
        if self.positions.len() != n || self.row_slots.len() != n {
            return Err(KernelError::Shape(format!(
                "batch layout: {} tokens, {} positions, {} row slots",
                n,
                self.positions.len(),
                self.row_slots.len()
            )));
        }
        if let Some(&s) = self.row_slots.iter().chain(self.key_slots.iter()).find(|&&s| s as usize >= num_slots) {
            return Err(KernelError::Shape(format!("slot {s} out of range ({num_slots} slots)")));
        }
        for (i, s) in self.seqs.iter().enumerate() {
            let q_end = s.q_row as usize + s.q_len as usize;
            let k_end = s.slot_offset as usize + s.ctx_len as usize;
            if s.q_len > s.ctx_len || q_end > n || k_end > self.key_slots.len() {
                return Err(KernelError::Shape(format!("sequence {i} out of range: {s:?}")));
            }
        }
        Ok(())
    }
}

/// The compute interface. One instance per device; the worker's runner thread owns it.
pub trait Backend: Send + Sync + 'static {
    /// A 2-D row-major activation matrix `[rows, cols]` on the device.
    type Tensor: Send;
    /// A linear layer's weight, logically `[out_features, in_features]`, packed for this device.
    type Weight: Send + Sync;
    /// A 1-D parameter (norm weight, bias, folded score vector).
    type Vector: Send + Sync;
    /// An embedding table `[vocab, hidden]`.
    type Embedding: Send + Sync;
    /// Paged K/V storage for all layers: per layer, `num_slots` rows of `[n_kv_heads, head_dim]`.
    type KvCache: Send;
    /// A [`BatchLayout`] resident on the device for one forward pass.
    type Batch: Send;
    /// One MoE layer's weights (router, stacked experts, optional shared expert) on the device.
    type MoeWeights: Send + Sync;
    /// A log of [`MoeLayerStats`], one record per [`Backend::moe_ffn`] call, kept on the device
    /// until [`Backend::read_moe_log`] drains it (once per forward pass).
    type MoeLog: Send;

    fn name(&self) -> String;

    // ---- memory ----
    fn linear_weight(&self, data: &[f32], out_features: usize, in_features: usize) -> Result<Self::Weight>;
    fn vector(&self, data: &[f32]) -> Result<Self::Vector>;
    fn embedding(&self, data: &[f32], vocab: usize, hidden: usize) -> Result<Self::Embedding>;
    fn kv_cache(
        &self,
        num_layers: usize,
        num_slots: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Result<Self::KvCache>;
    fn zeros(&self, rows: usize, cols: usize) -> Result<Self::Tensor>;
    // A constructor that needs the backend (its device and pools), hence `&self`.
    #[allow(clippy::wrong_self_convention)]
    fn from_host(&self, data: &[f32], rows: usize, cols: usize) -> Result<Self::Tensor>;
    fn to_host(&self, t: &Self::Tensor) -> Result<Vec<f32>>;
    fn shape(&self, t: &Self::Tensor) -> (usize, usize);
    /// Makes `t` a `[rows, cols]` tensor whose contents are unspecified, reusing its storage when
    /// it is large enough (scratch buffers reused across layers and passes).
    fn reshape_scratch(&self, t: &mut Self::Tensor, rows: usize, cols: usize) -> Result<()> {
        if self.shape(t) != (rows, cols) {
            *t = self.zeros(rows, cols)?;
        }
        Ok(())
    }
    /// Makes `t` a `[rows, cols]` GEMM operand whose contents are unspecified: a tensor that
    /// [`Backend::rms_norm`], [`Backend::matmul_silu_mul`] or [`Backend::attention`] writes and
    /// only [`Backend::matmul`], [`Backend::matmul_add`], [`Backend::to_host`] and
    /// [`Backend::gather_rows`] (into another operand) read. A backend whose projections round
    /// their input (CUDA: bf16) may store it at that precision, so the op writing it rounds once
    /// and no cast pass runs: the same bits as an f32 tensor cast by the projection. By default
    /// an ordinary tensor.
    fn reshape_operand(&self, t: &mut Self::Tensor, rows: usize, cols: usize) -> Result<()> {
        self.reshape_scratch(t, rows, cols)
    }
    fn prepare_batch(&self, layout: &BatchLayout, cache: &Self::KvCache) -> Result<Self::Batch>;

    // ---- ops ----
    /// `out[r] = table[ids[r]]` for the batch's token ids.
    fn embed(&self, table: &Self::Embedding, batch: &Self::Batch, out: &mut Self::Tensor) -> Result<()>;
    /// `out = x · Wᵀ (+ bias)`.
    fn matmul(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        bias: Option<&Self::Vector>,
        out: &mut Self::Tensor,
    ) -> Result<()>;
    /// `acc += x · Wᵀ` (the residual add fused into the projection).
    fn matmul_add(&self, x: &Self::Tensor, w: &Self::Weight, acc: &mut Self::Tensor) -> Result<()>;
    /// Row-wise RMSNorm: `out[r] = x[r] / rms(x[r]) * w`.
    fn rms_norm(&self, x: &Self::Tensor, w: &Self::Vector, eps: f32, out: &mut Self::Tensor) -> Result<()>;
    /// `x += delta`, then [`Backend::rms_norm`] of the sum into `out`: the residual add of the
    /// projection that wrote `delta`, fused into the norm that reads the sum, so that projection
    /// stores plainly (on the GPU, a GEMM that reads the residual in its epilogue ran at half its
    /// plain speed).
    fn add_rms_norm(
        &self,
        x: &mut Self::Tensor,
        delta: &Self::Tensor,
        w: &Self::Vector,
        eps: f32,
        out: &mut Self::Tensor,
    ) -> Result<()>;
    /// In place on the fused QKV tensor: optional per-head RMSNorm of q and k heads (qwen3's
    /// `q_norm`/`k_norm`, weight of length head_dim), then RoPE of q and k heads at each row's
    /// position.
    #[allow(clippy::too_many_arguments)]
    fn qk_norm_rope(
        &self,
        qkv: &mut Self::Tensor,
        layout: QkvLayout,
        q_norm: Option<&Self::Vector>,
        k_norm: Option<&Self::Vector>,
        eps: f32,
        rope: RopeConfig,
        batch: &Self::Batch,
    ) -> Result<()>;
    /// Writes each row's K and V heads (from the fused QKV tensor) to its slot in `layer`.
    fn write_kv(
        &self,
        qkv: &Self::Tensor,
        layout: QkvLayout,
        cache: &mut Self::KvCache,
        layer: usize,
        batch: &Self::Batch,
    ) -> Result<()>;
    /// [`Backend::qk_norm_rope`], then [`Backend::write_kv`] of the same rows to `layer`; a
    /// backend may do both in one pass, with the same bits.
    #[allow(clippy::too_many_arguments)]
    fn qk_norm_rope_write_kv(
        &self,
        qkv: &mut Self::Tensor,
        layout: QkvLayout,
        q_norm: Option<&Self::Vector>,
        k_norm: Option<&Self::Vector>,
        eps: f32,
        rope: RopeConfig,
        cache: &mut Self::KvCache,
        layer: usize,
        batch: &Self::Batch,
    ) -> Result<()> {
        self.qk_norm_rope(qkv, layout, q_norm, k_norm, eps, rope, batch)?;
        self.write_kv(qkv, layout, cache, layer, batch)
    }
    /// Causal GQA attention for every query row over its sequence's context (see [`AttnSeq`]),
    /// softmax scale `1/sqrt(head_dim)`. `out` is `[rows, n_heads * head_dim]`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        qkv: &Self::Tensor,
        layout: QkvLayout,
        cache: &Self::KvCache,
        layer: usize,
        batch: &Self::Batch,
        out: &mut Self::Tensor,
    ) -> Result<()>;
    /// `out = silu(gate) * up` where `gate_up = [gate | up]` column halves.
    fn silu_mul(&self, gate_up: &Self::Tensor, out: &mut Self::Tensor) -> Result<()>;
    /// The dense MLP's first half, `out = silu(x · Gᵀ) * (x · Uᵀ)` for `w` = `[G; U]` (the gate
    /// and up weights stacked, `[2 * inter, in]`) and `out` `[rows, inter]` (ordinary or an
    /// operand, [`Backend::reshape_operand`]). `gate_up` is scratch the backend may use (made
    /// `[rows, 2 * inter]` then) or leave alone. By default [`Backend::matmul`] into `gate_up`,
    /// then [`Backend::silu_mul`]; a backend may fuse them, with the same bits.
    fn matmul_silu_mul(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        gate_up: &mut Self::Tensor,
        out: &mut Self::Tensor,
    ) -> Result<()> {
        let (rows, inter) = self.shape(out);
        self.reshape_scratch(gate_up, rows, 2 * inter)?;
        self.matmul(x, w, None, gate_up)?;
        self.silu_mul(gate_up, out)
    }
    /// `out[i] = x[rows[i]]`.
    fn gather_rows(&self, x: &Self::Tensor, rows: &[u32], out: &mut Self::Tensor) -> Result<()>;
    /// One dot product per row with `v` (the folded score head): `x[r] · v`.
    fn dot_rows(&self, x: &Self::Tensor, v: &Self::Vector) -> Result<Vec<f32>>;
    /// Full-vocabulary logits against an embedding table used as the LM head (tests, generation).
    fn lm_logits(&self, x: &Self::Tensor, table: &Self::Embedding, out: &mut Self::Tensor) -> Result<()>;

    // ---- mixture of experts (see `crate::moe`) ----
    /// Uploads one MoE layer (validated with [`MoeLayerHost::validate`]).
    fn moe_weights(&self, w: &MoeLayerHost) -> Result<Self::MoeWeights>;
    /// The grouped-GEMM variants of [`Backend::moe_ffn`], in a fixed order: a variant's index
    /// is what [`MoeSelect::Fixed`] and [`MoeLayerStats::variant`] refer to.
    fn moe_variants(&self) -> Vec<MoeVariant>;
    /// The cost model used before (or instead of) calibration, for experts of `hidden` ×
    /// `expert_inter` (a GPU backend: the padding-ratio rule).
    fn moe_default_cost(&self, hidden: usize, expert_inter: usize) -> MoeCostModel;
    fn moe_log(&self) -> Result<Self::MoeLog>;
    /// `acc += moe(x)`, for a `[rows, hidden]` `x` and `acc`:
    ///
    /// 1. router logits `x · routerᵀ` (`[rows, experts]`, a matmul) and, per row, the top-k
    ///    experts and their weights by [`crate::moe::route_row`];
    /// 2. the histogram of rows per expert, and the variant `select.choose(histogram, variants)`;
    /// 3. for every (row t, rank j) with expert e: `y[t,j] = down_e(silu(gate_e(x_t)) · up_e(x_t))`,
    ///    run by the chosen variant on the rows permuted into expert order — each element one
    ///    fixed-order f32 chain over K exactly as [`Backend::matmul`] computes it, so that the
    ///    variant, the batch and the permutation never change a bit;
    /// 4. `acc[t] += s`, with `s = Σ_j w[t,j] · y[t,j]` summed in rank order j = 0..k, then
    ///    `s += sigmoid(x_t · shared.gate) · shared(x_t)` when the layer has a shared expert.
    ///
    /// Appends one [`MoeLayerStats`] to `log`. A device backend keeps the histogram, the choice
    /// and the log on the device (the cost model is a few constants): no host synchronisation
    /// per layer.
    fn moe_ffn(
        &self,
        x: &Self::Tensor,
        w: &Self::MoeWeights,
        routing: MoeRouting,
        select: MoeSelect,
        acc: &mut Self::Tensor,
        log: &mut Self::MoeLog,
    ) -> Result<()>;
    /// Drains the log (the per-forward read-back).
    fn read_moe_log(&self, log: &mut Self::MoeLog) -> Result<Vec<MoeLayerStats>>;
    /// Calibration (start-up autotune): the wall time of step 3 of [`Backend::moe_ffn`] alone, run
    /// by `variant` on synthetic rows spread over the experts as `histogram` says (one count per
    /// expert), less what a backend can tell was time spent waiting for a core taken by other
    /// processes (the CPU backend: the threads' run-queue delay). May synchronise the device.
    fn moe_time_variant(&self, w: &Self::MoeWeights, variant: usize, histogram: &[u32]) -> Result<Duration>;
    /// Start-up calibration of the cost model on one MoE layer of the loaded model, kept within
    /// about `budget`. The CPU and reference backends run the `autotune` module (per-variant
    /// tables from [`Backend::moe_time_variant`]); a backend whose selector runs on the device
    /// fits the parameters of the rule it evaluates there instead (CUDA: the padding-ratio
    /// threshold).
    fn moe_autotune(
        &self,
        w: &Self::MoeWeights,
        routing: MoeRouting,
        num_experts: usize,
        budget: Duration,
    ) -> Result<(MoeCostModel, AutotuneReport)>
    where
        Self: Sized;
}

impl fmt::Display for RopeLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RopeLayout::Interleaved => f.write_str("interleaved"),
            RopeLayout::HalfSplit => f.write_str("half-split"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{RopeConfig, RopeLayout, RopeScaling};

    /// Llama 3.1 8B's RoPE (theta 500,000, head 128, `llama3` factor 8, low 1, high 4, original
    /// context 8,192) against transformers' `_compute_llama3_parameters`, written as it is there
    /// (masks over the whole vector), and linear scaling against the unscaled frequencies.
    #[test]
    fn scaled_inverse_frequencies_are_transformers_ones() {
        let plain =
            RopeConfig { theta: 500_000.0, rotary_dim: 128, layout: RopeLayout::HalfSplit, scaling: RopeScaling::None };
        let base = plain.inv_freq();
        assert_eq!(base.len(), 64);
        assert_eq!(base[0], 1.0);
        let (factor, low, high, old) = (8.0f64, 1.0f64, 4.0f64, 8192.0f64);
        let wavelen: Vec<f64> = base.iter().map(|f| 2.0 * std::f64::consts::PI / f).collect();
        let llama: Vec<f64> =
            base.iter().zip(&wavelen).map(|(f, w)| if *w > old / low { f / factor } else { *f }).collect();
        let smoothed: Vec<f64> = llama
            .iter()
            .zip(&wavelen)
            .map(|(f, w)| {
                let s = (old / w - low) / (high - low);
                (1.0 - s) * f / factor + s * f
            })
            .collect();
        let want: Vec<f64> = (0..64)
            .map(|i| if wavelen[i] >= old / high && wavelen[i] <= old / low { smoothed[i] } else { llama[i] })
            .collect();
        let llama3 = RopeConfig {
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position: 8192,
            },
            ..plain
        };
        let got = llama3.inv_freq();
        for i in 0..64 {
            assert!((got[i] - want[i]).abs() <= 1e-15 * want[i], "pair {i}: {} vs {}", got[i], want[i]);
        }
        // The three bands are all there: kept, blended, divided by the factor.
        assert_eq!(got[0], base[0]);
        assert!(got[30] < base[30] && got[30] > base[30] / 8.0, "pair 30 is blended");
        assert_eq!(got[63], base[63] / 8.0);
        let linear = RopeConfig { scaling: RopeScaling::Linear { factor: 4.0 }, ..plain }.inv_freq();
        assert!(linear.iter().zip(&base).all(|(l, b)| *l == b / 4.0));
    }

    /// YaRN as Qwen3 documents it (theta 10⁶, head 128, factor 4 over an original context of
    /// 32,768), then with every optional field set, against the frequencies transformers 5.24's
    /// `_compute_yarn_parameters` printed for the same configs (f32, so agreement to 1e-6
    /// relative). Its attention factors, resolved from the file's fields when the config is read
    /// (`model::config`'s tests), are the table's scale.
    #[test]
    fn yarn_frequencies_and_attention_factor_are_transformers_ones() {
        let yarn = |beta_fast, beta_slow, truncate, attention_factor| RopeConfig {
            theta: 1e6,
            rotary_dim: 128,
            layout: RopeLayout::HalfSplit,
            scaling: RopeScaling::Yarn {
                factor: 4.0,
                original_max_position: 32768,
                beta_fast,
                beta_slow,
                truncate,
                attention_factor,
            },
        };
        let transformers_default: [(usize, f64); 7] = [
            (0, 1.0),
            (10, 0.11547820270061493),
            (20, 0.01333521492779255),
            (25, 0.004131738096475601),
            (30, 0.0010643609566614032),
            (40, 4.4456985051510856e-05),
            (63, 3.102344408034696e-07),
        ];
        // beta_fast 16, beta_slow 2, truncate false (its mscale 2 / mscale_all_dim 1 only set
        // the attention factor, resolved when the file is read).
        let transformers_set: [(usize, f64); 7] = [
            (0, 1.0),
            (10, 0.11547820270061493),
            (20, 0.01333521492779255),
            (25, 0.004531583748757839),
            (30, 0.0011570935603231192),
            (40, 4.4456985051510856e-05),
            (63, 3.102344408034696e-07),
        ];
        let cases = [
            (yarn(32.0, 1.0, true, 1.138_629_4), transformers_default, 1.138629436111989),
            (yarn(16.0, 2.0, false, 1.121_751_1), transformers_set, 1.121751143713058),
        ];
        for (rope, want, attention) in cases {
            let got = rope.inv_freq();
            for (i, w) in want {
                assert!((got[i] - w).abs() <= 1e-6 * w, "{rope:?} pair {i}: {} vs transformers' {w}", got[i]);
            }
            assert!((rope.attention_scaling() - attention).abs() < 1e-6);
        }
        let plain = RopeConfig { scaling: RopeScaling::None, ..yarn(32.0, 1.0, true, 1.0) };
        assert_eq!(plain.attention_scaling(), 1.0);
        // Dynamic NTK is unscaled where the worker serves it (within max_position_embeddings).
        assert_eq!(RopeConfig { scaling: RopeScaling::Dynamic { factor: 2.0 }, ..plain }.inv_freq(), plain.inv_freq());
    }
}
