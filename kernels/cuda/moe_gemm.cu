// Grouped expert GEMM on tensor cores: for every expert e, C[rows of e] = A[rows of e] . W_e^T,
// A the permuted activations [n_rows, K] (bf16), W [n_experts, N, K] (bf16, nn.Linear layout),
// C [n_rows, N] (f32). Rows of expert e are [offsets[e], offsets[e] + counts[e]) (moe_permute.cu).
//
// Tiles: BLOCK_M x GEMM_BN output per block, K in steps of GEMM_BK through a 2-stage cp.async
// pipeline; warps in a (BLOCK_M/32) x 2 grid, each computing a 32x32 warp tile with
// mma.sync.m16n8k16 (bf16 in, f32 accumulate). blockIdx.x indexes this variant's tile schedule
// (expert, first row), blockIdx.y the N tile. The grid is sized on the host for the worst case;
// a block whose tile index is past the device-computed tile count exits, and every block of a
// variant that the selector did not choose exits at once (the `choice` flag).
// Rows past the expert's count and K/N past the matrix edge are zero-filled in shared memory
// and never stored. Each output element accumulates its K products in k16 steps in order, so
// the result does not depend on BLOCK_M — both variants give the same bits.
// Requires K % 8 == 0 (16-byte cp.async chunks), checked on the host.
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

template <int BM>
__device__ __forceinline__ void grouped_gemm_tile(const bf16_t* __restrict__ a, const bf16_t* __restrict__ w,
                                                  float* __restrict__ c, const u32* __restrict__ counts,
                                                  const u32* __restrict__ offsets, const u32* __restrict__ tiles,
                                                  u32 n_tiles, int n, int k) {
    constexpr int THREADS = BM * 2;  // (BM/32) x 2 warps
    __shared__ __align__(16) bf16_t a_s[2][BM][GEMM_LD];
    __shared__ __align__(16) bf16_t b_s[2][GEMM_BN][GEMM_LD];

    const u32 tile = blockIdx.x;
    if (tile >= n_tiles) return;
    const u32 e = tiles[2 * tile], r0 = tiles[2 * tile + 1];
    const u32 rows_e = counts[e];
    const long long row_base = offsets[e];
    const int n0 = blockIdx.y * GEMM_BN;
    const bf16_t* w_e = w + (long long)e * n * k;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int warp_m = warp >> 1, warp_n = warp & 1;
    const int g = lane >> 2, tg = lane & 3;

    auto load_stage = [&](int stage, int k0) {
        // A: BM rows x 4 chunks of 8 bf16; B: GEMM_BN rows x 4 chunks.
        for (int id = tid; id < BM * 4; id += THREADS) {
            const int r = id >> 2, kc = (id & 3) * 8;
            const bool ok = r0 + r < rows_e && k0 + kc < k;
            const bf16_t* src = ok ? a + (row_base + r0 + r) * k + k0 + kc : a;
            cp_async16(&a_s[stage][r][kc], src, ok);
        }
        for (int id = tid; id < GEMM_BN * 4; id += THREADS) {
            const int r = id >> 2, kc = (id & 3) * 8;
            const bool ok = n0 + r < n && k0 + kc < k;
            const bf16_t* src = ok ? w_e + (long long)(n0 + r) * k + k0 + kc : w;
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
                if (r >= rows_e) continue;
                float* dst = c + (row_base + r) * n;
                if (col < n) dst[col] = acc[mi][ni][half * 2];
                if (col + 1 < n) dst[col + 1] = acc[mi][ni][half * 2 + 1];
            }
}

// n_tiles = [tiles at BLOCK_M 64, tiles at BLOCK_M 128] (moe_offsets); choice = the selector's BLOCK_M.
extern "C" __global__ void __launch_bounds__(128)
moe_gemm_bm64(const bf16_t* __restrict__ a, const bf16_t* __restrict__ w, float* __restrict__ c,
              const u32* __restrict__ counts, const u32* __restrict__ offsets, const u32* __restrict__ tiles,
              const u32* __restrict__ n_tiles, const int* __restrict__ choice, int n, int k) {
    if (*choice != 64) return;
    grouped_gemm_tile<64>(a, w, c, counts, offsets, tiles, n_tiles[0], n, k);
}

extern "C" __global__ void __launch_bounds__(256)
moe_gemm_bm128(const bf16_t* __restrict__ a, const bf16_t* __restrict__ w, float* __restrict__ c,
               const u32* __restrict__ counts, const u32* __restrict__ offsets, const u32* __restrict__ tiles,
               const u32* __restrict__ n_tiles, const int* __restrict__ choice, int n, int k) {
    if (*choice != 128) return;
    grouped_gemm_tile<128>(a, w, c, counts, offsets, tiles, n_tiles[1], n, k);
}
