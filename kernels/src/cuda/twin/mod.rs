//! CPU twins of the CUDA kernels.
//!
//! Each twin is a Rust function with the same indexing math as its `.cu` kernel: the same grid
//! and block decomposition (replayed as loops), the same tiles and tile schedules, the same
//! per-lane partial sums and butterfly reductions, the same online-softmax blocking, bf16 where
//! the kernel stores bf16. The twins are what the test suite runs on machines without a GPU to
//! prove the kernels' math; on a GPU, the GPU tests compare the kernels with the CPU backend.
//!
//! Twins index arrays with the kernels' loop variables (lane, tile, mi, ni, ...) on purpose, so
//! the correspondence with the `.cu` source stays line by line.
//!
//! What a twin cannot show: races, memory-ordering bugs and the exact rounding of device math
//! functions (`expf`, `sincos`) and of the tensor cores' internal summation.

#![allow(clippy::needless_range_loop)]

mod attention;
mod attention_mma;
mod backend;
mod elementwise;
mod fragments;
mod gemm;
mod mma_tile;
mod mma_tile_v1;
mod moe;
mod moe_gemm;
mod moe_permute;
mod moe_routing;
mod rmsnorm;
mod rope;
pub mod warp;
mod wgmma_tile;
#[cfg(test)]
mod wgmma_tma;

pub use attention::{attention_prefill, AttentionArgs};
pub use attention_mma::{attention_mma, AttentionMmaArgs};
pub use backend::{attention_scale, attention_scale_log2, TwinBackend, TwinBatch, TwinKvCache, TwinMatrix};
pub use elementwise::{
    broadcast_rows, cast_bf16, dot_rows, embed_rows, gather_rows, silu_mul_bf16, silu_mul_f32, write_kv,
};
pub use gemm::{dense_gemm, dense_gemm_swiglu, dense_gemm_v1, gemm_bf16};
pub use moe::{moe_forward, moe_forward_with_counts, TwinMoeLayer, TwinMoeWeights};
pub use moe_gemm::{max_tiles, moe_gemm, moe_gemm_swiglu, moe_gemm_wgmma, moe_gemm_wgmma_swiglu, GroupedGemmArgs};
pub use moe_permute::{
    moe_chunk_counts, moe_offsets, moe_scatter, moe_select_tile, moe_unpermute, n_chunks, offsets_smem_bytes, Offsets,
    SharedTerm,
};
pub use moe_routing::moe_topk_softmax;
pub use rmsnorm::rms_norm_rows;
pub use rope::{qk_norm_rope, qk_norm_rope_kv, rope_table, KvOut, QkNormRopeArgs};
pub use wgmma_tile::{dense_gemm_wgmma, dense_gemm_wgmma_tma, dense_gemm_wgmma_tma_swiglu};
