// One output tile of a bf16 GEMM on tensor cores, shared by the grouped expert GEMM
// (moe_gemm.cu) and the batch-invariant dense GEMM (gemm.cu):
//   C[row_base + r0 + r, n0 + j] = sum_k A[row_base + r0 + r, k] * W[n0 + j, k]   (+ beta * C)
// for r < BM with r0 + r < rows, j < BN with n0 + j < n. A is row-major [.., k] bf16, W is
// row-major [n, k] bf16 (nn.Linear layout), C row-major [.., n] f32.
//
// Two block tiles (GemmShape): BM 64 is 64 x 64 with 4 warps (2 x 2) of 32 x 32, for few rows,
// where more, smaller blocks fill the GPU; BM 128 is 128 x 128 with 8 warps (2 x 4) of 64 x 32,
// which reads each shared-memory byte for more mma per byte. K advances in GEMM_BK steps through
// a GEMM_STAGES-deep cp.async ring in dynamic shared memory (gemm_smem_bytes; over the 48 KiB
// default for BM 128, so the host raises the kernel's limit). Shared rows are 64 bytes (GEMM_BK
// bf16) with their four 16-byte chunks XOR-swizzled by row (gemm_swz), so that the eight row
// addresses of every ldmatrix phase and every cp.async quarter-warp hit eight different 16-byte
// bank groups. Fragments come from ldmatrix.x4 (a whole m16k16 A fragment, or the k16 B
// fragments of two n8 tiles) and feed mma.sync.m16n8k16 (bf16 in, f32 accumulate).
//
// Batch invariance: each output element accumulates its K products in k16 steps from k = 0 into
// one accumulator, with zeros past k, whatever BM, the tile's position or the number of rows (no
// split-K). Both shapes, and the first tile (mma_tile_v1.cuh), give the same bits for a row.
// Rows past `rows` and columns past `n` are zero-filled in shared memory and never stored.
// Requires k % 8 == 0 (16-byte cp.async chunks).
//
// SwiGLU epilogue (EPI = GEMM_EPI_SWIGLU, gemm.cu's dense_gemm_swiglu_*): W is the MLP's stacked
// [gate; up] weight, n = 2 * inter rows, and the tile runs over its rows interleaved in blocks of
// 8 — tile column 16b + j is gate row 8b + j for j < 8 and up row inter + 8b + j - 8 otherwise
// (gemm_swiglu_row: only the rows the B copies read move, the weight is not re-laid). So n8
// tiles 2i and 2i + 1 of a warp hold the gate and up of the same 8 columns in the same lanes'
// registers, and the epilogue stores act[r, 8b + j] = bf16(silu_times(gate, up)) to a bf16
// [.., inter] output instead of the f32 gate/up pair: the same bits as the plain GEMM, silu_mul_f32
// and cast_bf16 in turn (each gate and up element is the same K chain whatever its tile column).
// Requires inter % 8 == 0 and beta == 0.
#ifndef SIEVE_MMA_TILE_CUH
#define SIEVE_MMA_TILE_CUH

#include "common.cuh"

// gemm_tile's epilogues.
#define GEMM_EPI_F32 0
#define GEMM_EPI_SWIGLU 1
// c is bf16 [.., n]: each f32 accumulator rounded once (the MoE down projection's expert
// outputs, which only moe_unpermute reads); requires beta == 0.
#define GEMM_EPI_BF16 2

#define GEMM_BK 32
#define GEMM_STAGES 4
#define GEMM_BN_BM64 64
#define GEMM_BN_BM128 128
// Dense launches visit GEMM_GROUP_M row tiles per column tile before moving on (gemm_block_order).
#define GEMM_GROUP_M 8

__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp_async16(u32 smem, const void* gmem, bool valid) {
    const int src_size = valid ? 16 : 0;  // 0: writes 16 zero bytes, reads nothing
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(src_size));
}
// The same, asking L2 to fetch the whole 128-byte line: a tile row's 64 bytes of this K step and
// the next, which the ring copies GEMM_STAGES - 1 steps later.
__device__ __forceinline__ void cp_async16_l2(u32 smem, const void* gmem, bool valid) {
    const int src_size = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(src_size));
}
// The same from a generic pointer into shared memory (attention_mma.cu).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
    cp_async16(smem_u32(smem), gmem, valid);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, and lane t gets
// matrix i's row t/4, elements 2(t%4) and 2(t%4)+1, in r[i].
__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem));
}

__device__ __forceinline__ void mma_bf16_16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Byte offset of 16-byte chunk `chunk` (0..3) of row `row` in a stage tile of 64-byte rows:
// chunk ^ ((row / 2) % 4), so rows r..r+7 (r even) put any one chunk in eight different 16-byte
// bank groups: (row % 2) picks the half of the 128-byte line, the XOR the quarter within it.
__device__ __forceinline__ u32 gemm_swz(int row, int chunk) {
    return (u32)(row * (GEMM_BK * 2) + ((chunk ^ ((row >> 1) & 3)) << 4));
}

template <int BM>
struct GemmShape;
template <>
struct GemmShape<64> {
    static constexpr int BN = GEMM_BN_BM64, WM = 32, WN = 32;
};
template <>
struct GemmShape<128> {
    static constexpr int BN = GEMM_BN_BM128, WM = 64, WN = 32;
};

// The weight row of tile column `col` with the SwiGLU interleave (n = 2 * inter columns).
__device__ __forceinline__ int gemm_swiglu_row(int col, int inter) {
    const int b = col >> 4, j = col & 15;
    return j < 8 ? b * 8 + j : inter + b * 8 + j - 8;
}

// Epilogue helpers, shared with gemm_wgmma.cu's tile: each takes one accumulator pair at
// tile-local row rl and columns cl, cl + 1 (the tile's first row r0 of `rows` valid from
// row_base, its first column n0 of n).

// c = acc + beta * c for the pair; one 8-byte store when both columns exist and n is even.
__device__ __forceinline__ void gemm_store_f32(float* __restrict__ c, long long row_base, u32 r0, u32 rows, int n0,
                                               int n, float beta, int rl, int cl, float v0, float v1) {
    const u32 r = r0 + rl;
    const int col = n0 + cl;
    if (r >= rows || col >= n) return;
    float* dst = c + (row_base + r) * n + col;
    if ((n & 1) == 0) {  // col + 1 < n: col is even and n is even
        float2* d2 = reinterpret_cast<float2*>(dst);
        if (beta != 0.0f) {
            const float2 old = *d2;
            v0 = fmaf(beta, old.x, v0);
            v1 = fmaf(beta, old.y, v1);
        }
        *d2 = make_float2(v0, v1);
    } else {
        dst[0] = beta != 0.0f ? fmaf(beta, dst[0], v0) : v0;
        if (col + 1 < n) dst[1] = beta != 0.0f ? fmaf(beta, dst[1], v1) : v1;
    }
}

// The pair rounded to bf16; one 4-byte store when both columns exist and n is even.
__device__ __forceinline__ void gemm_store_bf16(bf16_t* __restrict__ c, long long row_base, u32 r0, u32 rows, int n0,
                                                int n, int rl, int cl, float v0, float v1) {
    const u32 r = r0 + rl;
    const int col = n0 + cl;
    if (r >= rows || col >= n) return;
    bf16_t* dst = c + (row_base + r) * n + col;
    if ((n & 1) == 0) {
        *reinterpret_cast<u32*>(dst) = (u32)f32_to_bf16(v0) | ((u32)f32_to_bf16(v1) << 16);
    } else {
        dst[0] = f32_to_bf16(v0);
        if (col + 1 < n) dst[1] = f32_to_bf16(v1);
    }
}

// SwiGLU: the gate pair (g0, g1) at columns cl, cl + 1 of a gate n8 tile whose first tile column
// is `gate_col` (a multiple of 16), the up pair the same lanes' of the n8 tile after it; stores
// act[r, ((n0 + gate_col) / 2) + (cl - gate_col)] and the next as one 4-byte bf16 pair.
__device__ __forceinline__ void gemm_store_swiglu(bf16_t* __restrict__ act, long long row_base, u32 r0, u32 rows,
                                                  int n0, int n, int rl, int gate_col, int cl, float g0, float g1,
                                                  float u0, float u1) {
    const int inter = n >> 1;
    const u32 r = r0 + rl;
    const int col = ((n0 + gate_col) >> 1) + (cl - gate_col);
    if (r >= rows || col >= inter) return;
    *reinterpret_cast<u32*>(act + (row_base + r) * inter + col) =
        (u32)f32_to_bf16(silu_times(g0, u0)) | ((u32)f32_to_bf16(silu_times(g1, u1)) << 16);
}

// Block: GemmShape<BM> threads ((BM / WM) * (BN / WN) warps), gemm_smem_bytes of dynamic shared
// memory. `a` points at row 0 of the row space, `w` at the [n, k] weight. With
// GEMM_EPI_SWIGLU, `c` is the bf16 [.., n / 2] activation; with GEMM_EPI_BF16, bf16 [.., n].
template <int BM, int EPI = GEMM_EPI_F32>
__device__ __forceinline__ void gemm_tile(const bf16_t* __restrict__ a, const bf16_t* __restrict__ w,
                                          float* __restrict__ c, long long row_base, u32 r0, u32 rows, int n0,
                                          int n, int k, float beta) {
    constexpr bool SWIGLU = EPI == GEMM_EPI_SWIGLU;
    constexpr int BN = GemmShape<BM>::BN, WM = GemmShape<BM>::WM, WN = GemmShape<BM>::WN;
    constexpr int WARPS_N = BN / WN, THREADS = (BM / WM) * WARPS_N * 32;
    constexpr int MI = WM / 16, NI = WN / 8;
    constexpr int A_STAGE = BM * GEMM_BK * 2, B_STAGE = BN * GEMM_BK * 2;  // bytes
    constexpr int A_CHUNKS = BM * 4 / THREADS, B_CHUNKS = BN * 4 / THREADS;  // per thread and stage
    static_assert(A_CHUNKS * THREADS == BM * 4 && B_CHUNKS * THREADS == BN * 4, "whole chunks per thread");
    static_assert(NI % 2 == 0, "B fragments load two n8 tiles at a time");
    extern __shared__ __align__(128) unsigned char gemm_smem[];
    const u32 a_s = smem_u32(gemm_smem);
    const u32 b_s = a_s + GEMM_STAGES * A_STAGE;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;
    const int g = lane >> 2, tg = lane & 3;

    // This thread's cp.async chunks: chunk id = tid + i * THREADS, row id / 4, 16-byte chunk id % 4.
    // Source rows are fixed for the whole K loop; only k0 moves.
    const bf16_t* a_src[A_CHUNKS];
    bool a_ok[A_CHUNKS];
    u32 a_dst[A_CHUNKS];
#pragma unroll
    for (int i = 0; i < A_CHUNKS; ++i) {
        const int id = tid + i * THREADS, r = id >> 2, ch = id & 3;
        a_ok[i] = r0 + r < rows;
        a_src[i] = a + (a_ok[i] ? (row_base + r0 + r) * k : 0) + ch * 8;
        a_dst[i] = gemm_swz(r, ch);
    }
    const bf16_t* b_src[B_CHUNKS];
    bool b_ok[B_CHUNKS];
    u32 b_dst[B_CHUNKS];
#pragma unroll
    for (int i = 0; i < B_CHUNKS; ++i) {
        const int id = tid + i * THREADS, r = id >> 2, ch = id & 3;
        b_ok[i] = n0 + r < n;
        const int w_row = SWIGLU ? gemm_swiglu_row(n0 + r, n >> 1) : n0 + r;
        b_src[i] = w + (b_ok[i] ? (long long)w_row * k : 0) + ch * 8;
        b_dst[i] = gemm_swz(r, ch);
    }
    auto load_stage = [&](int stage, int k0) {
#pragma unroll
        for (int i = 0; i < A_CHUNKS; ++i) {
            const bool ok = a_ok[i] && k0 + ((tid + i * THREADS) & 3) * 8 < k;
            cp_async16_l2(a_s + stage * A_STAGE + a_dst[i], ok ? a_src[i] + k0 : a, ok);
        }
#pragma unroll
        for (int i = 0; i < B_CHUNKS; ++i) {
            const bool ok = b_ok[i] && k0 + ((tid + i * THREADS) & 3) * 8 < k;
            cp_async16_l2(b_s + stage * B_STAGE + b_dst[i], ok ? b_src[i] + k0 : w, ok);
        }
    };

    // ldmatrix row addresses. A (x4 = a0..a3 of one m16k16 fragment): lane l gives row l % 16,
    // chunk l / 16 — matrices (rows 0-7, k 0-7), (8-15, k 0-7), (0-7, k 8-15), (8-15, k 8-15).
    // B (x4 = b0, b1 of n8 tiles 2j and 2j+1): lane l gives weight row (l % 8) + 8 (l / 16),
    // chunk (l / 8) % 2 — matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
    // A weight row is a column of the mma's B, k-contiguous: ldmatrix without .trans gives lane t
    // (n = t/4, k = 2(t%4), 2(t%4)+1), the b0/b1 layout.
    const int a_row = warp_m * WM + (lane & 15), a_ch = lane >> 4;
    const int b_row = warp_n * WN + (lane & 7) + ((lane >> 4) << 3), b_ch = (lane >> 3) & 1;

    float acc[MI][NI][4];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[mi][ni][q] = 0.0f;

    const int n_k = (k + GEMM_BK - 1) / GEMM_BK;
    // Prologue: stages 0 .. GEMM_STAGES - 2 in flight, one commit group each (empty past n_k, so
    // that the group count below stays exact).
#pragma unroll
    for (int s = 0; s < GEMM_STAGES - 1; ++s) {
        if (s < n_k) load_stage(s, s * GEMM_BK);
        cp_async_commit();
    }
    for (int kt = 0; kt < n_k; ++kt) {
        // Groups committed so far: GEMM_STAGES - 1 + kt; all but the newest GEMM_STAGES - 2 are
        // done, so k tile kt has landed (for this thread's copies; the barrier for everyone's).
        cp_async_wait<GEMM_STAGES - 2>();
        __syncthreads();
        // The barrier also means every warp is done with tile kt - 1, whose slot is refilled now.
        const int next = kt + GEMM_STAGES - 1;
        if (next < n_k) load_stage(next % GEMM_STAGES, next * GEMM_BK);
        cp_async_commit();

        const int stage = kt % GEMM_STAGES;
        const u32 as = a_s + stage * A_STAGE, bs = b_s + stage * B_STAGE;
#pragma unroll
        for (int kk = 0; kk < GEMM_BK / 16; ++kk) {
            u32 af[MI][4], bfr[NI][2];
#pragma unroll
            for (int mi = 0; mi < MI; ++mi) ldmatrix_x4(af[mi], as + gemm_swz(a_row + mi * 16, kk * 2 + a_ch));
#pragma unroll
            for (int nj = 0; nj < NI / 2; ++nj) {
                u32 t[4];
                ldmatrix_x4(t, bs + gemm_swz(b_row + nj * 16, kk * 2 + b_ch));
                bfr[2 * nj][0] = t[0];
                bfr[2 * nj][1] = t[1];
                bfr[2 * nj + 1][0] = t[2];
                bfr[2 * nj + 1][1] = t[3];
            }
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                for (int ni = 0; ni < NI; ++ni)
                    mma_bf16_16816(acc[mi][ni], af[mi][0], af[mi][1], af[mi][2], af[mi][3], bfr[ni][0], bfr[ni][1]);
        }
    }
    cp_async_wait<0>();  // only empty groups remain; leave none behind

    // Lane (g, tg) holds rows g and g + 8, columns 2tg and 2tg + 1 of each 16x8 tile. SwiGLU: n8
    // tiles (2i, 2i + 1) are the gate and up of the same act columns.
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ni += SWIGLU ? 2 : 1)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int rl = warp_m * WM + mi * 16 + g + half * 8, tile_col = warp_n * WN + ni * 8;
                const float* v = &acc[mi][ni][half * 2];
                if (SWIGLU) {
                    const float* u = &acc[mi][ni + 1][half * 2];
                    gemm_store_swiglu(reinterpret_cast<bf16_t*>(c), row_base, r0, rows, n0, n, rl, tile_col,
                                      tile_col + tg * 2, v[0], v[1], u[0], u[1]);
                } else if (EPI == GEMM_EPI_BF16) {
                    gemm_store_bf16(reinterpret_cast<bf16_t*>(c), row_base, r0, rows, n0, n, rl, tile_col + tg * 2,
                                    v[0], v[1]);
                } else {
                    gemm_store_f32(c, row_base, r0, rows, n0, n, beta, rl, tile_col + tg * 2, v[0], v[1]);
                }
            }
}

// Dense launches: which (row tile, column tile) block (blockIdx.x, blockIdx.y) of a grid
// (row tiles, column tiles) computes. Blocks start in linear order (x fastest); this hands them
// out GEMM_GROUP_M row tiles at a time down each column tile, so that the blocks running together
// share a few A row panels and W column panels in L2 instead of sweeping all of A per panel of W.
// A bijection of the grid; which block computes a tile does not change its bits.
__device__ __forceinline__ void gemm_block_order(u32& tile_m, u32& tile_n) {
    const u32 tiles_m = gridDim.x, tiles_n = gridDim.y;
    const u32 id = blockIdx.y * tiles_m + blockIdx.x;
    const u32 per_group = GEMM_GROUP_M * tiles_n;
    const u32 first_m = id / per_group * GEMM_GROUP_M;
    const u32 group_m = min(tiles_m - first_m, (u32)GEMM_GROUP_M);
    const u32 in_group = id % per_group;
    tile_m = first_m + in_group % group_m;
    tile_n = in_group / group_m;
}

#endif  // SIEVE_MMA_TILE_CUH
