// Batch-invariant dense GEMM on tensor cores: out[M, N] = x[M, K] . W[N, K]^T (+ beta * out),
// x and W bf16, out f32 — the alternative to cuBLAS for the dense projections
// (`GemmEngine::Tiled`). cuBLAS picks its kernel (tile shape, split-K) by M, so a row's bits may
// depend on how many rows share the call; here every row is computed by the same tile code with
// the same K order whatever M is (mma_tile.cuh), so a pair's score cannot depend on its batch.
//
// Launch: grid (ceil(M / BM), ceil(N / GEMM_BN)), block BM * 2 threads. Both BM give the same
// bits; the host picks by M for speed. Requires K % 8 == 0.
#include "mma_tile.cuh"

extern "C" __global__ void __launch_bounds__(128)
dense_gemm_bm64(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, float* __restrict__ out, int m, int n, int k,
                float beta) {
    gemm_tile<64>(x, w, out, 0, blockIdx.x * 64, (u32)m, blockIdx.y * GEMM_BN, n, k, beta);
}

extern "C" __global__ void __launch_bounds__(256)
dense_gemm_bm128(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, float* __restrict__ out, int m, int n, int k,
                 float beta) {
    gemm_tile<128>(x, w, out, 0, blockIdx.x * 128, (u32)m, blockIdx.y * GEMM_BN, n, k, beta);
}
