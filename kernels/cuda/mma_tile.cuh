// One output tile of a bf16 GEMM on tensor cores, shared by the grouped expert GEMM
// (moe_gemm.cu) and the batch-invariant dense GEMM (gemm.cu):
//   C[row_base + r0 + r, n0 + j] = sum_k A[row_base + r0 + r, k] * W[n0 + j, k]   (+ beta * C)
// for r < BM with r0 + r < rows, j < GEMM_BN with n0 + j < n. A is row-major [.., k] bf16, W is
// row-major [n, k] bf16 (nn.Linear layout), C row-major [.., n] f32.
//
// K advances in GEMM_BK steps through a 2-stage cp.async pipeline into padded shared tiles; the
// block's (BM/32) x 2 warps each own a 32x32 warp tile computed with mma.sync.m16n8k16 (bf16 in,
// f32 accumulate). Rows past `rows`, columns past `n` and K past `k` are zero-filled in shared
// memory and never stored. Each output element accumulates its K products in k16 steps in the
// same order whatever BM, the tile's position or the number of rows: results do not depend on
// the batch or the variant. Requires k % 8 == 0 (16-byte cp.async chunks).
#ifndef SIEVE_MMA_TILE_CUH
#define SIEVE_MMA_TILE_CUH

#include "common.cuh"

#define GEMM_BN 64
#define GEMM_BK 32
#define GEMM_PAD 8
#define GEMM_LD (GEMM_BK + GEMM_PAD)  // 80-byte rows: 16-byte aligned, conflict-free fragment loads

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
    const u32 s = (u32)__cvta_generic_to_shared(smem);
    const int src_size = valid ? 16 : 0;  // 0: writes 16 zero bytes, reads nothing
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_size));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void mma_bf16_16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Block: BM * 2 threads. `a` points at row 0 of the row space, `w` at the [n, k] weight.
template <int BM>
__device__ __forceinline__ void gemm_tile(const bf16_t* __restrict__ a, const bf16_t* __restrict__ w,
                                          float* __restrict__ c, long long row_base, u32 r0, u32 rows, int n0,
                                          int n, int k, float beta) {
    constexpr int THREADS = BM * 2;
    __shared__ __align__(16) bf16_t a_s[2][BM][GEMM_LD];
    __shared__ __align__(16) bf16_t b_s[2][GEMM_BN][GEMM_LD];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int warp_m = warp >> 1, warp_n = warp & 1;
    const int g = lane >> 2, tg = lane & 3;

    auto load_stage = [&](int stage, int k0) {
        // A: BM rows x 4 chunks of 8 bf16; B: GEMM_BN rows x 4 chunks.
        for (int id = tid; id < BM * 4; id += THREADS) {
            const int r = id >> 2, kc = (id & 3) * 8;
            const bool ok = r0 + r < rows && k0 + kc < k;
            const bf16_t* src = ok ? a + (row_base + r0 + r) * k + k0 + kc : a;
            cp_async16(&a_s[stage][r][kc], src, ok);
        }
        for (int id = tid; id < GEMM_BN * 4; id += THREADS) {
            const int r = id >> 2, kc = (id & 3) * 8;
            const bool ok = n0 + r < n && k0 + kc < k;
            const bf16_t* src = ok ? w + (long long)(n0 + r) * k + k0 + kc : w;
            cp_async16(&b_s[stage][r][kc], src, ok);
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

    const int n_k = (k + GEMM_BK - 1) / GEMM_BK;
    load_stage(0, 0);
    for (int kt = 0; kt < n_k; ++kt) {
        const int stage = kt & 1;
        if (kt + 1 < n_k) {
            load_stage(stage ^ 1, (kt + 1) * GEMM_BK);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GEMM_BK; kk += 16) {
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

#endif  // SIEVE_MMA_TILE_CUH
