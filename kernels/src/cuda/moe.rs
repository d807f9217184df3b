//! MoE configuration shared by the GPU pipeline and its CPU twin: routing, the tile policy, the
//! shape checks and qwen2_moe's shared expert. The pipeline itself is in `device/moe.rs` (GPU) and
//! `twin/moe.rs` (CPU).

use super::sources::consts::ROUTE_MAX_EXPERTS;
use crate::backend::{Backend, KernelError, Result};
use crate::moe::{BackendVariant, SharedExpertHost};

/// How tokens are routed to experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeRouting {
    pub top_k: usize,
    /// Renormalise the top-k weights to sum to 1 (qwen3_moe `norm_topk_prob`).
    pub renormalize: bool,
}

/// The grouped GEMM's row tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockM {
    M64,
    M128,
}

impl BlockM {
    pub fn rows(self) -> u32 {
        match self {
            BlockM::M64 => 64,
            BlockM::M128 => 128,
        }
    }
}

/// Which grouped-GEMM variant runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TilePolicy {
    /// The padding-ratio rule, evaluated on the device from the live histogram: BLOCK_M 64 when
    /// BLOCK_M 128 would pad the real rows by more than `threshold`, else BLOCK_M 128.
    Auto { threshold: f32 },
    /// Always this variant (benchmarks, autotune).
    Fixed(BlockM),
}

impl Default for TilePolicy {
    fn default() -> Self {
        TilePolicy::Auto { threshold: DEFAULT_PADDING_THRESHOLD }
    }
}

/// The reference system's padding-ratio threshold; the start-up autotune may replace it.
pub const DEFAULT_PADDING_THRESHOLD: f32 = 1.5;

impl TilePolicy {
    /// The kernel arguments (threshold, force): force 0 means "apply the rule".
    pub fn kernel_args(self) -> (f32, u32) {
        match self {
            TilePolicy::Auto { threshold } => (threshold, 0),
            TilePolicy::Fixed(b) => (DEFAULT_PADDING_THRESHOLD, b.rows()),
        }
    }
}

/// What the selector saw and chose for one MoE layer call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TileChoice {
    pub real_rows: u64,
    /// Σ ceil(n_e / 64) · 64.
    pub padded64: u64,
    /// Σ ceil(n_e / 128) · 128.
    pub padded128: u64,
    /// The chosen BLOCK_M, 64 or 128.
    pub block_m: u32,
}

/// Sizes of one MoE layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeDims {
    pub hidden: usize,
    /// Expert intermediate size (gate and up are `inter` wide each).
    pub inter: usize,
    pub n_experts: usize,
}

/// Checks a layer's sizes against what the kernels support.
pub fn check_moe(dims: MoeDims, routing: MoeRouting) -> Result<()> {
    let MoeDims { hidden, inter, n_experts } = dims;
    if n_experts == 0 || n_experts > ROUTE_MAX_EXPERTS as usize {
        return Err(KernelError::Unsupported(format!(
            "MoE: {n_experts} experts (the router kernel takes 1..={ROUTE_MAX_EXPERTS})"
        )));
    }
    if routing.top_k == 0 || routing.top_k > n_experts.min(32) {
        return Err(KernelError::Unsupported(format!(
            "MoE: top-{} of {n_experts} experts (1..=min(32, experts))",
            routing.top_k
        )));
    }
    if hidden == 0 || inter == 0 || hidden % 8 != 0 || inter % 8 != 0 {
        return Err(KernelError::Unsupported(format!(
            "MoE: hidden {hidden} and expert size {inter} must be non-zero multiples of 8"
        )));
    }
    Ok(())
}

/// One autotune measurement: a histogram's padding ratio (padded rows at BLOCK_M 128 / real
/// rows) and the layer time of each fixed variant on it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThresholdSample {
    pub ratio: f64,
    pub ms64: f64,
    pub ms128: f64,
}

/// The padding-ratio threshold that minimises the total time of the rule "BLOCK_M 64 when
/// ratio > threshold" over the measured samples. Candidates are the default and the midpoints
/// between consecutive measured ratios (the rule only changes there); ties keep the candidate
/// closest to the default. With no samples, the default.
pub fn fit_padding_threshold(samples: &[ThresholdSample]) -> f32 {
    let cost = |th: f64| samples.iter().map(|s| if s.ratio > th { s.ms64 } else { s.ms128 }).sum::<f64>();
    let mut ratios: Vec<f64> = samples.iter().map(|s| s.ratio).filter(|r| r.is_finite()).collect();
    ratios.sort_by(f64::total_cmp);
    ratios.dedup();
    let default = DEFAULT_PADDING_THRESHOLD as f64;
    let mut candidates = vec![default];
    if let (Some(&lo), Some(&hi)) = (ratios.first(), ratios.last()) {
        candidates.push(lo - 1e-6); // always 64
        candidates.push(hi); // never 64
    }
    candidates.extend(ratios.windows(2).map(|w| (w[0] + w[1]) / 2.0));
    let best = candidates
        .into_iter()
        .min_by(|&a, &b| cost(a).total_cmp(&cost(b)).then((a - default).abs().total_cmp(&(b - default).abs())))
        .unwrap_or(default);
    best as f32
}

// ---- the `Backend` MoE ops on the GPU pipeline (CudaBackend and its twin) ----

crate::moe_variants! {
    /// The GPU's grouped-GEMM variants, in [`crate::Backend::moe_variants`] order: index 0 is
    /// BLOCK_M 128, index 1 BLOCK_M 64 (the kernel's `force` argument is the tile's rows).
    pub enum CudaMoeVariant for "CUDA" {
        /// BLOCK_M 128.
        Bm128 => "bm128", tile_rows: 128, padded: true, "grouped tensor-core GEMM, BLOCK_M 128 (moe_gemm.cu)",
        /// BLOCK_M 64.
        Bm64 => "bm64", tile_rows: 64, padded: true, "grouped tensor-core GEMM, BLOCK_M 64 (moe_gemm.cu)",
    }
}

impl CudaMoeVariant {
    /// The row tile the variant runs.
    pub fn block_m(self) -> BlockM {
        match self {
            CudaMoeVariant::Bm128 => BlockM::M128,
            CudaMoeVariant::Bm64 => BlockM::M64,
        }
    }

    /// The variant of a BLOCK_M (the selector's record gives the rows, 64 or 128).
    pub fn of_block_rows(rows: u32) -> Self {
        if rows == BlockM::M64.rows() {
            CudaMoeVariant::Bm64
        } else {
            CudaMoeVariant::Bm128
        }
    }
}

/// The GPU's variants' descriptions ([`crate::Backend::moe_variants`]).
pub fn gpu_variants() -> Vec<crate::moe::MoeVariant> {
    CudaMoeVariant::descriptions()
}

/// The GPU cost model before calibration: the reference system's padding-ratio rule.
pub fn gpu_default_cost() -> crate::moe::MoeCostModel {
    let (large, small) = (CudaMoeVariant::Bm128.name(), CudaMoeVariant::Bm64.name());
    let mut m = crate::moe::MoeCostModel::padding_ratio_rule(large, small, DEFAULT_PADDING_THRESHOLD as f64);
    m.origin = "default".into();
    m
}

/// What the device-side selector (moe_select.cu) runs for a [`crate::MoeSelect`]: a fixed tile,
/// or the padding-ratio rule with the model's threshold. The selector never leaves the device,
/// so it evaluates that one rule only; any other cost model is refused with the reason.
pub fn tile_policy(select: crate::MoeSelect) -> Result<TilePolicy> {
    match select {
        crate::MoeSelect::Fixed(v) => Ok(TilePolicy::Fixed(CudaMoeVariant::from_index(v)?.block_m())),
        crate::MoeSelect::Auto(m) => match m.padding_threshold(CudaMoeVariant::Bm128.name(), CudaMoeVariant::Bm64.name()) {
            Some(t) if t.is_finite() && t > 0.0 => Ok(TilePolicy::Auto { threshold: t as f32 }),
            _ => Err(KernelError::Unsupported(format!(
                "the GPU selects the MoE tile on the device by the padding-ratio rule only (bm128 costed by padded rows, bm64 by real rows × threshold); this cost model ({}) is not one",
                m.origin
            ))),
        },
    }
}

/// Routing settings of the `Backend` API in the pipeline's form.
pub fn pipeline_routing(r: crate::moe::MoeRouting) -> MoeRouting {
    MoeRouting { top_k: r.top_k, renormalize: r.norm_topk_prob }
}

/// The record of one MoE call from the selector's statistics and the histogram.
pub fn layer_stats(tokens: usize, choice: TileChoice, counts: &[u32]) -> crate::moe::MoeLayerStats {
    let variant = CudaMoeVariant::of_block_rows(choice.block_m);
    crate::moe::MoeLayerStats {
        variant: variant.index() as u32,
        tokens: tokens as u32,
        rows: choice.real_rows,
        padded_rows: match variant {
            CudaMoeVariant::Bm64 => choice.padded64,
            CudaMoeVariant::Bm128 => choice.padded128,
        },
        active_experts: counts.iter().filter(|&&n| n > 0).count() as u32,
        max_expert_rows: counts.iter().copied().max().unwrap_or(0),
    }
}

/// qwen2_moe's always-on shared expert on a GPU backend (or its twin): bf16 weights in the dense
/// layers' layout. Its SwiGLU MLP runs on the dense MLP's ops and its gate's logit is a projection
/// ([`SharedExpert::forward`]); the un-permute adds `sigmoid(logit) · output` to each row's
/// routed sum.
#[derive(Debug, Clone)]
pub struct SharedExpert<W> {
    /// `[2·inter, hidden]`: the gate projection's rows, then the up projection's.
    pub gate_up: W,
    /// `[hidden, inter]`.
    pub down: W,
    /// `[1, hidden]`: the sigmoid gate's weight.
    pub gate: W,
    pub inter: usize,
}

impl<W> SharedExpert<W> {
    /// Uploads the host weights with `weight(data, out_features, in_features)`.
    pub fn upload(
        s: &SharedExpertHost,
        hidden: usize,
        mut weight: impl FnMut(&[f32], usize, usize) -> Result<W>,
    ) -> Result<Self> {
        Ok(SharedExpert {
            gate_up: weight(s.gate_up, 2 * s.inter, hidden)?,
            down: weight(s.down, hidden, s.inter)?,
            gate: weight(s.gate, 1, hidden)?,
            inter: s.inter,
        })
    }

    /// The expert's output `down(silu(gate(x)) · up(x))` `[rows, hidden]` and its gate's logit
    /// `[rows, 1]`, by `b`'s projections: the dense MLP's ops (`matmul_silu_mul` into the down
    /// projection's operand, fused where the engine fuses it), so each row's bits are its own.
    pub fn forward<B: Backend<Weight = W>>(&self, b: &B, x: &B::Tensor) -> Result<(B::Tensor, B::Tensor)> {
        let (rows, hidden) = b.shape(x);
        let (mut gate_up, mut act) = (b.zeros(0, 0)?, b.zeros(0, 0)?);
        b.reshape_operand(&mut act, rows, self.inter)?;
        b.matmul_silu_mul(x, &self.gate_up, &mut gate_up, &mut act)?;
        let mut y = b.zeros(rows, hidden)?;
        b.matmul(&act, &self.down, None, &mut y)?;
        let mut logit = b.zeros(rows, 1)?;
        b.matmul(x, &self.gate, None, &mut logit)?;
        Ok((y, logit))
    }
}

/// Token counts the GPU calibration times (small counts give high padding ratios).
pub const CALIBRATION_TOKENS: [usize; 12] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048];

#[cfg(test)]
mod tests {
    use super::*;

    fn s(ratio: f64, ms64: f64, ms128: f64) -> ThresholdSample {
        ThresholdSample { ratio, ms64, ms128 }
    }

    #[test]
    fn the_fitted_threshold_separates_where_64_wins() {
        // 64 wins above ratio ~1.8 in these timings.
        let samples = [
            s(1.0, 1.2, 1.0),
            s(1.3, 1.1, 1.0),
            s(1.7, 1.05, 1.0),
            s(1.9, 0.9, 1.0),
            s(3.0, 0.6, 1.0),
            s(8.0, 0.3, 1.0),
        ];
        let th = fit_padding_threshold(&samples) as f64;
        assert!(th > 1.7 && th < 1.9, "threshold {th}");
        // 64 always wins: a threshold below every ratio.
        let th = fit_padding_threshold(&[s(1.2, 0.5, 1.0), s(2.0, 0.5, 1.0)]) as f64;
        assert!(th < 1.2, "threshold {th}");
        // 128 always wins: no ratio exceeds it.
        let th = fit_padding_threshold(&[s(1.2, 2.0, 1.0), s(4.0, 2.0, 1.0)]) as f64;
        assert!(th >= 4.0, "threshold {th}");
        assert_eq!(fit_padding_threshold(&[]), DEFAULT_PADDING_THRESHOLD);
        // Indifferent timings keep the default.
        assert_eq!(fit_padding_threshold(&[s(1.2, 1.0, 1.0), s(3.0, 1.0, 1.0)]), DEFAULT_PADDING_THRESHOLD);
    }

    #[test]
    fn backend_selections_map_to_device_tile_policies() {
        let vs = gpu_variants();
        let rule = gpu_default_cost();
        rule.validate(&vs).unwrap();
        assert_eq!(tile_policy(crate::MoeSelect::Auto(&rule)).unwrap(), TilePolicy::Auto { threshold: 1.5 });
        assert_eq!(tile_policy(crate::MoeSelect::Fixed(0)).unwrap(), TilePolicy::Fixed(BlockM::M128));
        assert_eq!(tile_policy(crate::MoeSelect::Fixed(1)).unwrap(), TilePolicy::Fixed(BlockM::M64));
        assert!(tile_policy(crate::MoeSelect::Fixed(2)).is_err());
        // A fitted threshold flows through; a per-expert table model is refused with the reason.
        let fitted = crate::moe::MoeCostModel::padding_ratio_rule("bm128", "bm64", 2.25);
        assert_eq!(tile_policy(crate::MoeSelect::Auto(&fitted)).unwrap(), TilePolicy::Auto { threshold: 2.25 });
        let mut table = rule.clone();
        table.variants[1].per_expert = vec![1.0, 2.0];
        assert!(tile_policy(crate::MoeSelect::Auto(&table)).unwrap_err().to_string().contains("padding-ratio rule"));
        // The host-side selector of the same rule agrees with the device rule's definition.
        assert_eq!(vs[rule.select(&[30; 10], &vs)].name, "bm64");
        assert_eq!(vs[rule.select(&[100; 10], &vs)].name, "bm128");
        let st =
            layer_stats(5, TileChoice { real_rows: 10, padded64: 128, padded128: 256, block_m: 64 }, &[0, 4, 6, 0]);
        assert_eq!((st.variant, st.padded_rows, st.active_experts, st.max_expert_rows), (1, 128, 2, 6));
    }
}
