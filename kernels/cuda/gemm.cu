// Batch-invariant dense GEMM on tensor cores: out[M, N] = x[M, K] . W[N, K]^T (+ beta * out),
// x and W bf16, out f32 — the alternative to cuBLAS for the dense projections
// (`GemmEngine::Tiled`). cuBLAS picks its kernel (tile shape, split-K) by M, so a row's bits may
// depend on how many rows share the call; here every row is computed by the same tile code with
// the same K order whatever M is (mma_tile.cuh), so a pair's score cannot depend on its batch.
//
// dense_gemm_bm64 / dense_gemm_bm128: the current tile (mma_tile.cuh). Launch: grid
// (ceil(M / BM), ceil(N / BN)), block and dynamic shared memory by the tile's shape; a block's
// tile comes from gemm_block_order. dense_gemm_v1_bm64 / dense_gemm_v1_bm128: the first tile
// (mma_tile_v1.cuh, `GemmEngine::TiledV1`), kept to measure against: grid (ceil(M / BM),
// ceil(N / 64)), block BM * 2 threads, static shared memory. All four give the same bits; the
// host picks the BM by shape for speed. Requires K % 8 == 0.
//
// dense_gemm_swiglu_bm64 / dense_gemm_swiglu_bm128: the current tile with the SwiGLU epilogue
// (mma_tile.cuh): x · [gate; up]ᵀ with w the stacked [2 * inter, K] weight, stored as
// act[M, inter] = bf16(silu(gate) * up) — the dense MLP's gate/up projection, silu_mul and the
// down projection's cast in one launch. Same grid as dense_gemm_* over n = 2 * inter.
// Requires inter % 8 == 0.

#include "mma_tile.cuh"
#include "mma_tile_v1.cuh"

extern "C" __global__ void __launch_bounds__(128, 4)
dense_gemm_bm64(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, float* __restrict__ out, int m, int n, int k,
                float beta) {
    u32 tm, tn;
    gemm_block_order(tm, tn);
    gemm_tile<64>(x, w, out, 0, tm * 64, (u32)m, tn * GEMM_BN_BM64, n, k, beta);
}

extern "C" __global__ void __launch_bounds__(256, 2)
dense_gemm_bm128(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, float* __restrict__ out, int m, int n,
                 int k, float beta) {
    u32 tm, tn;
    gemm_block_order(tm, tn);
    gemm_tile<128>(x, w, out, 0, tm * 128, (u32)m, tn * GEMM_BN_BM128, n, k, beta);
}

extern "C" __global__ void __launch_bounds__(128)
dense_gemm_v1_bm64(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, float* __restrict__ out, int m, int n,
                   int k, float beta) {
    gemm_tile_v1<64>(x, w, out, 0, blockIdx.x * 64, (u32)m, blockIdx.y * GEMM_V1_BN, n, k, beta);
}

extern "C" __global__ void __launch_bounds__(256)
dense_gemm_v1_bm128(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, float* __restrict__ out, int m, int n,
                    int k, float beta) {
    gemm_tile_v1<128>(x, w, out, 0, blockIdx.x * 128, (u32)m, blockIdx.y * GEMM_V1_BN, n, k, beta);
}

extern "C" __global__ void __launch_bounds__(128, 4)
dense_gemm_swiglu_bm64(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, bf16_t* __restrict__ act, int m,
                       int n, int k) {
    u32 tm, tn;
    gemm_block_order(tm, tn);
    gemm_tile<64, GEMM_EPI_SWIGLU>(x, w, reinterpret_cast<float*>(act), 0, tm * 64, (u32)m, tn * GEMM_BN_BM64, n, k, 0.0f);
}

extern "C" __global__ void __launch_bounds__(256, 2)
dense_gemm_swiglu_bm128(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, bf16_t* __restrict__ act, int m,
                        int n, int k) {
    u32 tm, tn;
    gemm_block_order(tm, tn);
    gemm_tile<128, GEMM_EPI_SWIGLU>(x, w, reinterpret_cast<float*>(act), 0, tm * 128, (u32)m, tn * GEMM_BN_BM128, n, k, 0.0f);
}
