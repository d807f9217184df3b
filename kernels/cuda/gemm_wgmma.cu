// Batch-invariant dense GEMM on Hopper's warpgroup tensor cores (wgmma, sm_90a only, compiled
// and loaded on compute capability 9.0 devices alone) — `GemmEngine::Wgmma`: gemm.cu's kernels
// on a 128 x BN wgmma tile, the instruction Hopper runs at full rate (mma.sync, which gemm.cu
// uses, reaches about two thirds of it there).
//
// dense_gemm_wgmma_bn128 / _bn256: out[M, N] = x[M, K] · W[N, K]ᵀ (+ beta · out), x and W bf16,
// out f32, on the cp.async-fed tile (wgmma_tile.cuh): the baseline the TMA-fed kernels below are
// measured against (`GemmKernel::Wgmma`).
// Launch: grid (ceil(M / 128), ceil(N / BN)), 256 threads, WgmmaShape::of(128, BN).smem_bytes of
// dynamic shared memory; a block's tile from gemm_block_order. Both BN give the same bits for a row (the
// host picks by shape for speed). Requires K % 8 == 0.
#include "wgmma_tile.cuh"

#define WG_THREADS 256

template <int BN>
__device__ __forceinline__ void dense_wgmma(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w,
                                            float* __restrict__ out, int m, int n, int k, float beta) {
    u32 tm, tn;
    gemm_block_order(tm, tn);
    wgmma_gemm_tile<128, BN>(x, w, out, 0, tm * 128, (u32)m, tn * BN, n, k, beta);
}

#define DENSE_WGMMA_ARGS \
    const bf16_t *__restrict__ x, const bf16_t *__restrict__ w, float *__restrict__ out, int m, int n, int k, float beta

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1) dense_gemm_wgmma_bn128(DENSE_WGMMA_ARGS) {
    dense_wgmma<128>(x, w, out, m, n, k, beta);
}

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1) dense_gemm_wgmma_bn256(DENSE_WGMMA_ARGS) {
    dense_wgmma<256>(x, w, out, m, n, k, beta);
}

// dense_gemm_wgmma_tma_bn128 / _bn256: dense_gemm_wgmma_bn* on wgmma_tma_tile.cuh (TMA-fed,
// warp-specialised; the same bits), the wgmma engine's plain projections.
// dense_gemm_wgmma_tma_swiglu_bn128 / _bn256: its gate/up GEMM with the split SwiGLU epilogue
// (act = bf16(silu(gate) · up), [M, N / 2]; the same bits as the other SwiGLU kernels).
// Launch: grid (ceil(M / 128), ceil(N / BN)), 384 threads, WgmmaShape::of(128, BN).smem_bytes of
// dynamic shared memory; `x_map` over x (dims {K, M}, box {64, 128}) and `w_map` over W (dims
// {K, N}, box {64, BN}; SwiGLU {64, BN / 2}), both in the 128-byte swizzle.
#include "wgmma_tma_tile.cuh"

#define DENSE_WGMMA_TMA_ARGS                                                                                       \
    const __grid_constant__ TmaMap x_map, const __grid_constant__ TmaMap w_map, float *__restrict__ out, int m, \
        int n, int k, float beta

template <int BN, int EPI = GEMM_EPI_F32>
__device__ __forceinline__ void dense_wgmma_tma(const TmaMap* x_map, const TmaMap* w_map, float* __restrict__ out, int m,
                                                int n, int k, float beta) {
    u32 tm, tn;
    gemm_block_order(tm, tn);
    wgmma_tma_gemm_tile<BN, EPI>(x_map, w_map, out, 0, tm * 128, (u32)m, 0, tn * BN, n, k, beta);
}

extern "C" __global__ void __launch_bounds__(WG_TMA_THREADS, 1) dense_gemm_wgmma_tma_bn128(DENSE_WGMMA_TMA_ARGS) {
    dense_wgmma_tma<128>(&x_map, &w_map, out, m, n, k, beta);
}

extern "C" __global__ void __launch_bounds__(WG_TMA_THREADS, 1) dense_gemm_wgmma_tma_bn256(DENSE_WGMMA_TMA_ARGS) {
    dense_wgmma_tma<256>(&x_map, &w_map, out, m, n, k, beta);
}

#define DENSE_WGMMA_TMA_SWIGLU_ARGS \
    const __grid_constant__ TmaMap x_map, const __grid_constant__ TmaMap w_map, bf16_t *__restrict__ act, int m, int n, int k

extern "C" __global__ void __launch_bounds__(WG_TMA_THREADS, 1)
    dense_gemm_wgmma_tma_swiglu_bn128(DENSE_WGMMA_TMA_SWIGLU_ARGS) {
    dense_wgmma_tma<128, GEMM_EPI_SWIGLU>(&x_map, &w_map, reinterpret_cast<float*>(act), m, n, k, 0.0f);
}

extern "C" __global__ void __launch_bounds__(WG_TMA_THREADS, 1)
    dense_gemm_wgmma_tma_swiglu_bn256(DENSE_WGMMA_TMA_SWIGLU_ARGS) {
    dense_wgmma_tma<256, GEMM_EPI_SWIGLU>(&x_map, &w_map, reinterpret_cast<float*>(act), m, n, k, 0.0f);
}
