//! Compute for the Sieve worker. The model graphs call the [`Backend`] trait; this crate provides
//! the implementations: [`reference::ReferenceBackend`] (plain loops, the test oracle),
//! the CPU backend (SIMD, threaded) and the CUDA backend (cudarc + NVRTC kernels).
//! Nothing here knows about HTTP, tokens or requests.

pub mod autotune;
pub mod backend;
pub mod cpu;
pub mod cuda;
pub mod error;
pub mod host;
pub mod moe;
pub mod reference;

pub use backend::{AttnSeq, Backend, BatchLayout, QkvLayout, RopeConfig, RopeLayout, RopeScaling};
pub use cpu::CpuBackend;
pub use error::{KernelError, Result};
pub use moe::{
    BackendVariant, MoeCostModel, MoeLayerHost, MoeLayerStats, MoeRouting, MoeSelect, MoeVariant, SharedExpertHost,
    VariantCost,
};
