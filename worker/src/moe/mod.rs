//! The worker's side of mixture-of-experts, in one place (the op itself, its variants, the cost
//! model and the calibration are in `sieve_kernels::moe` and the backends):
//! - the MoE layer itself is part of the model (`crate::model::moe_layer`: loading its HF
//!   tensors stacked per layer, the `MoePolicy` that picks the grouped-GEMM variant, what a
//!   forward pass records);
//! - [`setup`]: start-up, from the `[moe]` config: a fixed variant, the padding-ratio rule, or a
//!   cost model calibrated on the loaded model and cached per model and machine;
//! - [`stats`]: the live figures (variant choices, real and padded rows, MoE time) behind
//!   `/stats` and the `sieve_worker_moe_*` metrics.
//!
//! The `[moe]` config section (`MoeSection`, its `policy` and `variant` typed) is
//! `crate::config::moe`.

pub mod setup;
pub mod stats;

pub use setup::MoeSetup;
pub use stats::MoeMonitor;
