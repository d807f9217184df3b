//! The per-call record of a MoE op: what was routed and what the chosen variant computed.

use serde::Serialize;

use super::MoeVariant;

/// What one `moe_ffn` call routed and ran. A backend appends one per call to its log; the
/// worker reads the log once per forward pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MoeLayerStats {
    /// Index into the backend's `Backend::moe_variants`.
    pub variant: u32,
    pub tokens: u32,
    /// Token-expert assignments (tokens × top_k): the rows the experts really compute.
    pub rows: u64,
    /// Rows the chosen variant computed, padding included.
    pub padded_rows: u64,
    pub active_experts: u32,
    pub max_expert_rows: u32,
}

/// Summary of a token-per-expert histogram.
pub fn histogram_stats(hist: &[u32], variant: &MoeVariant) -> (u64, u64, u32, u32) {
    let rows = hist.iter().map(|&n| n as u64).sum();
    let padded = hist.iter().map(|&n| variant.computed_rows(n)).sum();
    let active = hist.iter().filter(|&&n| n > 0).count() as u32;
    let max = hist.iter().copied().max().unwrap_or(0);
    (rows, padded, active, max)
}
