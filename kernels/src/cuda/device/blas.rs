//! The dense projections on cuBLAS: `out[M, N] (+)= x[M, K] · W[N, K]ᵀ` with x and W bf16,
//! out f32, f32 compute (`cublasGemmEx`).
//!
//! cuBLAS is column-major; a row-major `[M, N]` matrix is a column-major `[N, M]` one, so we
//! compute outᵀ = W · xᵀ: A = W (stored [N, K] row-major = column-major [K, N], used transposed),
//! B = x (row-major [M, K] = column-major [K, M]), C = out (column-major [N, M]).

use std::sync::Arc;

use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t};
use cudarc::cublas::{result as blas_result, CudaBlas};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut};

use crate::backend::{KernelError, Result};

pub(crate) struct Blas {
    handle: CudaBlas,
    stream: Arc<CudaStream>,
}

impl Blas {
    pub fn new(stream: Arc<CudaStream>) -> Result<Self> {
        let handle = CudaBlas::new(stream.clone())
            .map_err(|e| KernelError::Device(format!("creating the cuBLAS handle: {e:?}")))?;
        Ok(Blas { handle, stream })
    }

    /// `out = x · Wᵀ + beta · out` for `m` rows; x is `[m, k]` bf16, W `[n, k]` bf16, out `[m, n]` f32.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_bf16(
        &self,
        x: &CudaView<'_, u16>,
        w: &CudaSlice<u16>,
        out: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
        beta: f32,
    ) -> Result<()> {
        if m == 0 || n == 0 {
            return Ok(());
        }
        let dim = |v: usize, what: &str| {
            i32::try_from(v)
                .map_err(|_| KernelError::Unsupported(format!("GEMM {what} {v} exceeds cuBLAS's 32-bit sizes")))
        };
        let (mi, ni, ki) = (dim(m, "rows")?, dim(n, "columns")?, dim(k, "depth")?);
        let alpha = 1.0f32;
        let (wp, _w) = w.device_ptr(&self.stream);
        let (xp, _x) = x.device_ptr(&self.stream);
        let (op, _o) = out.device_ptr_mut(&self.stream);
        // SAFETY: the pointers address buffers of at least n·k, m·k and m·n elements (checked by
        // the caller's shape checks); alpha and beta are host f32 (the handle's default pointer
        // mode); all work is on the handle's stream.
        unsafe {
            blas_result::gemm_ex(
                *self.handle.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                ni,
                mi,
                ki,
                &alpha as *const f32 as *const _,
                wp as *const _,
                cudaDataType_t::CUDA_R_16BF,
                ki,
                xp as *const _,
                cudaDataType_t::CUDA_R_16BF,
                ki,
                &beta as *const f32 as *const _,
                op as *mut _,
                cudaDataType_t::CUDA_R_32F,
                ni,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| KernelError::Device(format!("cublasGemmEx [{m}, {k}] x [{n}, {k}]ᵀ: {e:?}")))
    }
}
