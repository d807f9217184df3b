// The first tensor-core GEMM tile, kept to measure the current tile (mma_tile.cuh) against in
// the same run (`GemmEngine::TiledV1`, `dense_gemm_v1_bm64/bm128` in gemm.cu):
//   C[row_base + r0 + r, n0 + j] = sum_k A[row_base + r0 + r, k] * W[n0 + j, k]   (+ beta * C)
// for r < BM with r0 + r < rows, j < GEMM_V1_BN with n0 + j < n. A is row-major [.., k] bf16, W is
// row-major [n, k] bf16 (nn.Linear layout), C row-major [.., n] f32.
//
// K advances in GEMM_V1_BK steps through a 2-stage cp.async pipeline into padded static shared
// tiles; the block's (BM/32) x 2 warps each own a 32x32 warp tile computed with
// mma.sync.m16n8k16 from plain 32-bit shared loads. Each output element accumulates its K
// products in k16 steps from k = 0 in one accumulator, the same order as the current tile, so
// both give the same bits. Requires k % 8 == 0 (16-byte cp.async chunks).
#ifndef SIEVE_MMA_TILE_V1_CUH
#define SIEVE_MMA_TILE_V1_CUH

#include "mma_tile.cuh"  // cp.async and mma.sync wrappers

#define GEMM_V1_BN 64
#define GEMM_V1_BK 32
#define GEMM_V1_LD (GEMM_V1_BK + 8)  // 80-byte rows: 16-byte aligned, conflict-free 32-bit fragment loads

// Block: BM * 2 threads. `a` points at row 0 of the row space, `w` at the [n, k] weight.
template <int BM>
__device__ __forceinline__ void gemm_tile_v1(const bf16_t* __restrict__ a, const bf16_t* __restrict__ w,
                                          float* __restrict__ c, long long row_base, u32 r0, u32 rows, int n0,
                                          int n, int k, float beta) {
    constexpr int THREADS = BM * 2;
    __shared__ __align__(16) bf16_t a_s[2][BM][GEMM_V1_LD];
    __shared__ __align__(16) bf16_t b_s[2][GEMM_V1_BN][GEMM_V1_LD];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int warp_m = warp >> 1, warp_n = warp & 1;
    const int g = lane >> 2, tg = lane & 3;

    auto load_stage = [&](int stage, int k0) {
        // A: BM rows x 4 chunks of 8 bf16; B: GEMM_V1_BN rows x 4 chunks.
        for (int id = tid; id < BM * 4; id += THREADS) {
            const int r = id >> 2, kc = (id & 3) * 8;
            const bool ok = r0 + r < rows && k0 + kc < k;
            const bf16_t* src = ok ? a + (row_base + r0 + r) * k + k0 + kc : a;
            cp_async16(smem_u32(&a_s[stage][r][kc]), src, ok);
        }
        for (int id = tid; id < GEMM_V1_BN * 4; id += THREADS) {
            const int r = id >> 2, kc = (id & 3) * 8;
            const bool ok = n0 + r < n && k0 + kc < k;
            const bf16_t* src = ok ? w + (long long)(n0 + r) * k + k0 + kc : w;
            cp_async16(smem_u32(&b_s[stage][r][kc]), src, ok);
        }
        cp_async_commit();
    };

    float acc[2][4][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[mi][ni][q] = 0.0f;

    const int n_k = (k + GEMM_V1_BK - 1) / GEMM_V1_BK;
    load_stage(0, 0);
    for (int kt = 0; kt < n_k; ++kt) {
        const int stage = kt & 1;
        if (kt + 1 < n_k) {
            load_stage(stage ^ 1, (kt + 1) * GEMM_V1_BK);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GEMM_V1_BK; kk += 16) {
            u32 af[2][4], bfr[4][2];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
                const int rm = warp_m * 32 + mi * 16 + g;
                af[mi][0] = *(const u32*)&a_s[stage][rm][kk + tg * 2];
                af[mi][1] = *(const u32*)&a_s[stage][rm + 8][kk + tg * 2];
                af[mi][2] = *(const u32*)&a_s[stage][rm][kk + tg * 2 + 8];
                af[mi][3] = *(const u32*)&a_s[stage][rm + 8][kk + tg * 2 + 8];
            }
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                const int cn = warp_n * 32 + ni * 8 + g;
                bfr[ni][0] = *(const u32*)&b_s[stage][cn][kk + tg * 2];
                bfr[ni][1] = *(const u32*)&b_s[stage][cn][kk + tg * 2 + 8];
            }
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                for (int ni = 0; ni < 4; ++ni)
                    mma_bf16_16816(acc[mi][ni], af[mi][0], af[mi][1], af[mi][2], af[mi][3], bfr[ni][0], bfr[ni][1]);
        }
        __syncthreads();  // this stage is overwritten by the load issued next iteration
    }

#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const u32 r = r0 + warp_m * 32 + mi * 16 + g + half * 8;
                const int col = n0 + warp_n * 32 + ni * 8 + tg * 2;
                if (r >= rows) continue;
                float* dst = c + (row_base + r) * n;
                if (col < n) dst[col] = beta != 0.0f ? acc[mi][ni][half * 2] + beta * dst[col] : acc[mi][ni][half * 2];
                if (col + 1 < n) dst[col + 1] = beta != 0.0f ? acc[mi][ni][half * 2 + 1] + beta * dst[col + 1] : acc[mi][ni][half * 2 + 1];
            }
}

#endif  // SIEVE_MMA_TILE_V1_CUH
