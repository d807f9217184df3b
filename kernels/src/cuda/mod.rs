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
pub mod tma;
pub mod twin;

/// How the dense projections (`matmul`, `matmul_add`, `lm_logits`) run on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GemmEngine {
    /// cuBLAS `GemmEx` (bf16 in, f32 out and compute): the fastest. cuBLAS chooses its kernel
    /// by problem size, so a row's bits may depend on how many rows share the call.
    #[default]
    Cublas,
    /// Our tensor-core tile (kernels/cuda/gemm.cu, mma_tile.cuh): the same K order for every row
    /// whatever the batch — batch-invariant by construction. Needs in_features % 8 == 0 (else
    /// cuBLAS runs). With fused epilogues: GEMM operands are bf16 tensors written by the op
    /// before ([`crate::Backend::reshape_operand`]: RMSNorm stores bf16, no cast pass), and the
    /// dense MLP's gate/up GEMM applies SiLU·mul in its epilogue and stores the bf16 input of the
    /// down projection ([`crate::Backend::matmul_silu_mul`]). The same bits as
    /// [`GemmEngine::TiledUnfused`]. (A QKV epilogue running the q/k norm, RoPE and the K/V write
    /// was measured slower than the GEMM and `qk_norm_rope` apart, on both tiles, and removed.)
    Tiled,
    /// The same tile with every op in its own pass, activations f32 between them (each GEMM
    /// casts its input first): what [`GemmEngine::Tiled`] fuses, kept to measure against.
    TiledUnfused,
    /// The first tensor-core tile (mma_tile_v1.cuh), the same bits as [`GemmEngine::Tiled`];
    /// kept to measure the current tile against in the same run.
    TiledV1,
    /// Hopper's warpgroup tensor cores (kernels/cuda/gemm_wgmma.cu, moe_gemm_wgmma.cu; sm_90
    /// devices only): [`GemmEngine::Tiled`] — the same fused SwiGLU, one K order per row
    /// whatever the batch — on the instruction Hopper runs at full rate: the dense projections
    /// on the TMA-fed, warp-specialised tile (wgmma_tma_tile.cuh), the MoE grouped GEMM on the
    /// cp.async-fed one (wgmma_tile.cuh). Whether its bits equal the mma.sync tile's is the
    /// hardware's to say (tests/cuda_gpu.rs reports it).
    Wgmma,
}

impl GemmEngine {
    /// Whether a `[*, k]` projection can take the tiled path.
    pub fn tiled_for(self, k: usize) -> bool {
        matches!(self, GemmEngine::Tiled | GemmEngine::TiledUnfused | GemmEngine::TiledV1 | GemmEngine::Wgmma)
            && k.is_multiple_of(8)
            && k > 0
    }

    /// Whether GEMM operands are stored bf16 by the op that writes them and the dense MLP's
    /// SiLU·mul runs in the gate/up GEMM's epilogue ([`GemmEngine::Tiled`] and
    /// [`GemmEngine::Wgmma`]).
    pub fn fused(self) -> bool {
        matches!(self, GemmEngine::Tiled | GemmEngine::Wgmma)
    }

    /// Whether `matmul_silu_mul` of a `[*, k]` input through a `[2 * inter, k]` weight runs as
    /// one fused launch.
    pub fn swiglu_fused_for(self, k: usize, inter: usize) -> bool {
        self.fused() && self.tiled_for(k) && inter.is_multiple_of(8) && inter > 0
    }

    /// BLOCK_M of the tiled engines for an `m x n` output (speed only: every BLOCK_M gives the
    /// same bits). The first tile has BLOCK_M 64 up to 256 rows.
    pub fn block_m(self, m: usize, n: usize) -> usize {
        match self {
            GemmEngine::TiledV1 if m <= 256 => 64,
            GemmEngine::TiledV1 => 128,
            _ => tiled_block_m(m, n),
        }
    }
}

/// One dense GEMM kernel at one tile, named for [`CudaBackend::matmul_on`] (tests and benches
/// comparing kernels in one run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmKernel {
    /// gemm.cu's `dense_gemm_bm{bm}` (mma_tile.cuh).
    Tiled { bm: usize },
    /// gemm.cu's `dense_gemm_v1_bm{bm}` (mma_tile_v1.cuh).
    TiledV1 { bm: usize },
    /// gemm_wgmma.cu's `dense_gemm_wgmma_bn{bn}` (wgmma_tile.cuh, cp.async-fed, sm_90 only).
    Wgmma { bn: usize },
    /// gemm_wgmma.cu's `dense_gemm_wgmma_tma_bn{bn}` (wgmma_tma_tile.cuh: TMA-fed and
    /// warp-specialised, sm_90 only): the wgmma engine's dense projections.
    WgmmaTma { bn: usize },
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

/// A block tile of the tensor-core GEMM (kernels/cuda/mma_tile.cuh `GemmShape`): `bm x bn`
/// outputs per block of `threads`, with `smem_bytes` of dynamic shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmShape {
    pub bm: usize,
    pub bn: usize,
    pub threads: u32,
    pub smem_bytes: usize,
}

impl GemmShape {
    /// The tile of a BLOCK_M (64 or 128).
    pub fn of(bm: usize) -> GemmShape {
        use sources::consts::{GEMM_BK, GEMM_BN_BM128, GEMM_BN_BM64, GEMM_STAGES};
        let (bn, warps) = match bm {
            64 => (GEMM_BN_BM64 as usize, 4),   // 2 x 2 warps of 32 x 32
            128 => (GEMM_BN_BM128 as usize, 8), // 2 x 4 warps of 64 x 32
            _ => panic!("no GEMM tile with BLOCK_M {bm}"),
        };
        let smem_bytes = GEMM_STAGES as usize * (bm + bn) * GEMM_BK as usize * 2;
        GemmShape { bm, bn, threads: warps * 32, smem_bytes }
    }
}

/// A block tile of the wgmma GEMM (kernels/cuda/wgmma_tile.cuh `WgShape`): `bm x bn` outputs
/// by `bm / 64` warpgroups, with `smem_bytes` of dynamic shared memory (its ring, and 1 KiB to
/// align it). The dense kernels are 128 x 128 or 128 x 256; the grouped expert GEMM's 64 x 128 or
/// 128 x 128.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WgmmaShape {
    pub bm: usize,
    pub bn: usize,
    pub stages: usize,
    pub threads: u32,
    pub smem_bytes: usize,
}

impl WgmmaShape {
    pub fn of(bm: usize, bn: usize) -> WgmmaShape {
        let stages = match (bm, bn) {
            (128, 128) => 6,
            (128, 256) | (64, 128) => 4,
            _ => panic!("no wgmma GEMM tile {bm} x {bn}"),
        };
        let smem_bytes = stages * (bm + bn) * sources::consts::WG_BK as usize * 2 + 1024;
        WgmmaShape { bm, bn, stages, threads: bm as u32 * 2, smem_bytes }
    }

    /// The dense kernels' BLOCK_N for an `m x n` output (speed only: both give the same bits):
    /// 256 reads each A byte from shared memory for twice the outputs, taken once its grid has
    /// about one block per SM of an H100-class GPU (132).
    pub fn dense_bn(m: usize, n: usize) -> usize {
        if m.div_ceil(128) * n.div_ceil(256) >= 128 {
            256
        } else {
            128
        }
    }

    /// The dense kernels' tile for an `m x n` output.
    pub fn dense(m: usize, n: usize) -> WgmmaShape {
        WgmmaShape::of(128, Self::dense_bn(m, n))
    }
}

/// BLOCK_M of the tiled dense GEMM for an `m x n` output: speed only, both give the same bits.
/// The 128 x 128 tile reads half the bytes from L2 per output of the 64 x 64 one and does more
/// mma per shared-memory byte, but makes a quarter of the blocks; it is taken once its grid has
/// about one block for each SM of an H100-class GPU (132), below which most SMs would idle.
pub fn tiled_block_m(m: usize, n: usize) -> usize {
    if m.div_ceil(128) * n.div_ceil(128) >= 128 {
        128
    } else {
        64
    }
}

pub use device::{
    device_count, CudaBackend, CudaBatch, CudaKvCache, CudaMatrix, CudaMoeLayer, CudaMoeLog, CudaMoeStats,
    CudaMoeWeights, CudaOptions, CudaTensor, CudaVector, DeviceInfo, KernelLoadReport,
};
pub use libs::{cublas_present, driver_present, nvrtc_present};
