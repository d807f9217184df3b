//! Mixture-of-experts: the parts every backend shares.
//!
//! A MoE layer (qwen3_moe, qwen2_moe) runs as one backend op, `Backend::moe_ffn`:
//! routing (router GEMM, softmax, top-k, optional renormalisation), the token-per-expert
//! histogram, the choice of a grouped-GEMM variant from that histogram, the permutation of the
//! rows into expert order, each expert's SwiGLU, and the weighted un-permute into the residual.
//!
//! This folder holds what is not device code, one job per file:
//! - `mod.rs` (here): the op's inputs — the layer's host-side weights ([`MoeLayerHost`]), its
//!   routing settings ([`MoeRouting`]) — and [`MoeSelect`], which variant a call runs;
//! - `routing.rs`: the routing rule ([`route_row`]) and its checks;
//! - `variant.rs`: the variants' descriptions ([`MoeVariant`]) and [`BackendVariant`], the enum
//!   of variants each backend declares;
//! - `stats.rs`: the per-call record ([`MoeLayerStats`]);
//! - `cost.rs`: the cost model and the selector ([`MoeCostModel`], [`VariantCost`]);
//!
//! The start-up calibration that fits the cost model is `crate::autotune`: it drives a backend,
//! and nothing here imports the backend trait (the trait's signatures use these types).
//!
//! The device code is per backend: `cpu/moe.rs` (+ `cpu/moe_tile.rs`), `reference/moe.rs`,
//! `cuda/moe.rs` (+ `cuda/device/moe.rs`, `cuda/twin/moe*.rs`, `kernels/cuda/moe_*.cu`).
//!
//! # Variants across backends
//! Each backend names its variants with an enum ([`crate::cpu::CpuMoeVariant`],
//! [`crate::cuda::moe::CudaMoeVariant`], [`crate::reference::ReferenceMoeVariant`]) that
//! implements [`BackendVariant`]: `ALL` in the backend's order, `name()`, `FromStr`. The
//! interface shared by every backend — `Backend::moe_variants`, [`MoeSelect::Fixed`],
//! [`MoeLayerStats::variant`], the cost model's entries — stays by *index into that order* (and
//! by name in the cost model, which is serialised and cached): the worker and the selector are
//! generic over the backend and never need to know its enum, and a backend converts the index
//! to its enum once, at the top of its op ([`BackendVariant::from_index`]).
//!
//! # Selector
//! Every variant computes the same bits for every row (see the determinism contract in
//! `backend.rs`); they differ only in cost, and the cost depends on how the rows spread
//! over the experts. The selector predicts each variant's cost from the live histogram with a
//! calibrated [`MoeCostModel`] and runs the cheapest. The GPU rule "BLOCK_M 64 when padded rows /
//! real rows at BLOCK_M 128 exceeds 1.5" is one such model ([`MoeCostModel::padding_ratio_rule`]).

mod cost;
mod routing;
mod stats;
mod variant;

pub use cost::{AutotuneReport, ChoiceRange, MoeCostModel, VariantCost, COST_KNOTS};
pub use routing::{check_routing, route_row};
pub use stats::{histogram_stats, MoeLayerStats};
pub use variant::{BackendVariant, MoeVariant};

use crate::error::{KernelError, Result};

/// How a MoE layer routes its rows (HF `num_experts_per_tok`, `norm_topk_prob`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeRouting {
    pub top_k: usize,
    /// Renormalise the top-k probabilities to sum to 1 (qwen3_moe: true; qwen2_moe: false).
    pub norm_topk_prob: bool,
}

/// qwen2_moe's always-on shared expert: `sigmoid(x · gate) * down(silu(x·Wg) * (x·Wu))`.
#[derive(Debug, Clone, Copy)]
pub struct SharedExpertHost<'a> {
    pub inter: usize,
    /// `[2·inter, hidden]`: the gate projection's rows, then the up projection's.
    pub gate_up: &'a [f32],
    /// `[hidden, inter]`.
    pub down: &'a [f32],
    /// `[hidden]`: the sigmoid gate (HF `shared_expert_gate.weight`, one output).
    pub gate: &'a [f32],
}

/// One MoE layer's weights in host memory, HF layout with the experts stacked.
#[derive(Debug, Clone, Copy)]
pub struct MoeLayerHost<'a> {
    pub hidden: usize,
    pub num_experts: usize,
    /// Width of each expert's SwiGLU (HF `moe_intermediate_size`).
    pub expert_inter: usize,
    /// `[num_experts, hidden]` (HF `mlp.gate.weight`).
    pub router: &'a [f32],
    /// `[num_experts, 2·expert_inter, hidden]`: per expert its gate rows, then its up rows.
    pub gate_up: &'a [f32],
    /// `[num_experts, hidden, expert_inter]`.
    pub down: &'a [f32],
    pub shared: Option<SharedExpertHost<'a>>,
}

impl MoeLayerHost<'_> {
    /// Checks every slice against the shapes; a backend calls this in `moe_weights`.
    pub fn validate(&self) -> Result<()> {
        let (h, e, i) = (self.hidden, self.num_experts, self.expert_inter);
        let bad = |m: String| Err(KernelError::Shape(format!("moe weights: {m}")));
        if h == 0 || e == 0 || i == 0 {
            return bad(format!("hidden {h}, {e} experts of width {i}"));
        }
        let want = |name: &str, got: usize, dims: &[usize]| -> Result<()> {
            let n = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            if n != Some(got) {
                return Err(KernelError::Shape(format!("moe weights: {name} has {got} values, shape {dims:?}")));
            }
            Ok(())
        };
        want("router", self.router.len(), &[e, h])?;
        want("experts gate_up", self.gate_up.len(), &[e, 2 * i, h])?;
        want("experts down", self.down.len(), &[e, h, i])?;
        if let Some(s) = &self.shared {
            if s.inter == 0 {
                return bad("shared expert of width 0".into());
            }
            want("shared gate_up", s.gate_up.len(), &[2 * s.inter, h])?;
            want("shared down", s.down.len(), &[h, s.inter])?;
            want("shared gate", s.gate.len(), &[h])?;
        }
        Ok(())
    }
}

/// Which variant a `moe_ffn` call runs.
#[derive(Debug, Clone, Copy)]
pub enum MoeSelect<'a> {
    /// Always this variant (index into `Backend::moe_variants`).
    Fixed(usize),
    /// The cheapest by the cost model, for this call's histogram.
    Auto(&'a MoeCostModel),
}

impl MoeSelect<'_> {
    pub fn choose(&self, hist: &[u32], variants: &[MoeVariant]) -> Result<usize> {
        match *self {
            MoeSelect::Fixed(v) if v < variants.len() => Ok(v),
            MoeSelect::Fixed(v) => Err(KernelError::Shape(format!("moe variant {v} of {}", variants.len()))),
            MoeSelect::Auto(m) => Ok(m.select(hist, variants)),
        }
    }
}
