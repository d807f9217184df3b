//! MoE configuration shared by the GPU pipeline and its CPU twin: routing, the tile policy and
//! the shape checks. The pipeline itself is in `device/moe.rs` (GPU) and `twin/moe.rs` (CPU).

use super::sources::consts::ROUTE_MAX_EXPERTS;
use crate::backend::{KernelError, Result};

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
        return Err(KernelError::Unsupported(format!("MoE: {n_experts} experts (the router kernel takes 1..={ROUTE_MAX_EXPERTS})")));
    }
    if routing.top_k == 0 || routing.top_k > n_experts.min(32) {
        return Err(KernelError::Unsupported(format!("MoE: top-{} of {n_experts} experts (1..=min(32, experts))", routing.top_k)));
    }
    if hidden == 0 || inter == 0 || hidden % 8 != 0 || inter % 8 != 0 {
        return Err(KernelError::Unsupported(format!("MoE: hidden {hidden} and expert size {inter} must be non-zero multiples of 8")));
    }
    Ok(())
}
