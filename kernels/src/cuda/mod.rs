//! The CUDA backend: cudarc (driver, NVRTC, cuBLAS — all loaded dynamically, so this builds and
//! runs on machines with no CUDA at all) and the kernels in `kernels/cuda/*.cu`.
//!
//! - [`sources`]: the embedded `.cu` sources and their entry points.
//! - [`nvrtc`]: compiling them with NVRTC (PTX or cubin), and the on-disk image cache.
//! - [`twin`]: a CPU twin of every kernel — the same indexing, tiling and reduction order, run on
//!   the host — and [`twin::TwinBackend`], the `Backend` the CUDA backend would be if the device
//!   were the CPU. It is how the kernels' math is tested without a GPU.
//! - [`CudaBackend`]: the `Backend` on a GPU.
//! - [`moe`]: MoE routing and tile-selection settings shared by the GPU pipeline and its twin.

pub mod checks;
mod device;
pub mod layout;
mod libs;
pub mod moe;
pub mod nvrtc;
pub mod sources;
pub mod twin;

/// How the dense projections (`matmul`, `matmul_add`, `lm_logits`) run on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GemmEngine {
    /// cuBLAS `GemmEx` (bf16 in, f32 out and compute): the fastest. cuBLAS chooses its kernel
    /// by problem size, so a row's bits may depend on how many rows share the call.
    #[default]
    Cublas,
    /// Our tensor-core tile (kernels/cuda/gemm.cu): the same K order for every row whatever the
    /// batch — batch-invariant by construction. Needs in_features % 8 == 0 (else cuBLAS runs).
    Tiled,
}

impl GemmEngine {
    /// Whether a `[*, k]` projection can take the tiled path.
    pub fn tiled_for(self, k: usize) -> bool {
        self == GemmEngine::Tiled && k.is_multiple_of(8) && k > 0
    }
}

/// How attention runs on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttentionEngine {
    /// Tensor cores (kernels/cuda/attention_mma.cu): a call's shared prefix attended once per
    /// 64 query rows of the call, for head sizes 64 and 128 (others run `Simt`).
    #[default]
    Mma,
    /// The SIMT kernel (kernels/cuda/attention.cu): any even head size up to 256; kept to
    /// compare against.
    Simt,
}

impl AttentionEngine {
    /// Whether a head size takes the tensor-core path.
    pub fn mma_for(self, head_dim: usize) -> bool {
        self == AttentionEngine::Mma && layout::attention_mma_supports(head_dim)
    }
}

/// BLOCK_M of the tiled dense GEMM for `m` rows: speed only, both give the same bits.
pub fn tiled_block_m(m: usize) -> usize {
    if m <= 256 {
        64
    } else {
        128
    }
}

pub use device::{
    device_count, CudaBackend, CudaBatch, CudaKvCache, CudaMatrix, CudaMoeLayer, CudaMoeLog, CudaMoeStats,
    CudaMoeWeights, CudaOptions, CudaTensor, CudaVector, DeviceInfo, KernelLoadReport,
};
pub use libs::{cublas_present, driver_present, nvrtc_present};
