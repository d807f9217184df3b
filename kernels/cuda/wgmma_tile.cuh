// One output tile of a bf16 GEMM on Hopper's warpgroup tensor cores (wgmma, sm_90a only), the
// counterpart of mma_tile.cuh's gemm_tile for the dense GEMM (gemm_wgmma.cu) and the grouped
// expert GEMM (moe_gemm_wgmma.cu):
//   C[row_base + r0 + r, n0 + j] = sum_k A[row_base + r0 + r, k] * W[n0 + j, k]   (+ beta * C)
// with mma_tile.cuh's epilogues (f32, SwiGLU) through its store helpers.
//
// Block: BM x BN outputs (WgShape: 128 x 128, 128 x 256 or 64 x 128) by BM / 64 warpgroups
// (BM * 2 threads), warpgroup g owning rows 64g .. 64g + 63. K advances in WG_BK = 64 steps
// through a cp.async ring of WgShape::STAGES stages in dynamic shared memory (the ring and 1 KiB
// so it can start on a 1024-byte boundary: WgmmaShape::smem_bytes on the host). A stage holds the A tile [BM][64] and
// the B tile [BN][64] in the layout wgmma reads through its 128-byte-swizzle shared-memory
// descriptors (K-major): row r's 16-byte chunk c at r * 128 + 16 (c ^ (r % 8)), so each
// quarter-warp's cp.async chunks (one row's eight) land on eight different bank groups. Per k16
// step, each warpgroup issues BN / 128 wgmma.m64n128k16, the descriptors' start moving 32 bytes
// along the swizzled row. Copies run STAGES - 2 K steps ahead; the newest K step's wgmma group
// stays in flight while the next is issued (wgmma.wait_group 1), so the slot a step refills is
// two steps old, done by every warpgroup at the barrier before.
//
// Batch invariance: every output element is the same instruction (m64n128k16) applied to the
// same 16 k at a time from k = 0 into one accumulator, zeros past k, whatever BM, BN, the tile's
// position or the number of rows (no split-K), so every shape gives the same bits for a row.
// Rows past `rows` and columns past `n` are zero-filled in shared memory and never stored.
// Requires k % 8 == 0 (16-byte cp.async chunks). Whether a row's bits also equal mma_tile.cuh's
// (mma.sync m16n8k16) is the hardware's to say: tests/cuda_gpu.rs reports it.
//
// SwiGLU (EPI = GEMM_EPI_SWIGLU): W's rows are read interleaved by 8 (gemm_swiglu_row), so n8
// blocks 2b and 2b + 1 of a wgmma — registers 8b .. 8b + 3 and 8b + 4 .. 8b + 7 of the same
// lanes — hold the gate and up of the same 8 columns. Requires beta == 0.
#ifndef SIEVE_WGMMA_TILE_CUH
#define SIEVE_WGMMA_TILE_CUH

#include "mma_tile.cuh"

#define WG_BK 64

template <int BM, int BN>
struct WgShape;
template <>
struct WgShape<128, 128> {
    static constexpr int STAGES = 6;  // 6 x 32 KiB
};
template <>
struct WgShape<128, 256> {
    static constexpr int STAGES = 4;  // 4 x 48 KiB
};
template <>
struct WgShape<64, 128> {
    static constexpr int STAGES = 4;  // 4 x 24 KiB: two blocks per SM
};

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` in a 128-byte-swizzled tile.
__device__ __forceinline__ u32 wg_swz(int row, int chunk) { return (u32)(row * 128 + ((chunk ^ (row & 7)) << 4)); }

// A shared-memory matrix descriptor for a K-major operand in the 128-byte swizzle at `addr`
// (1024-byte aligned, plus 32 bytes per k16 step): start address >> 4 in bits 0-13, the leading
// byte offset (unused by this layout) 1 in bits 16-29, the stride byte offset between 8-row
// groups (1024 bytes) >> 4 in bits 32-45, base offset 0, swizzle mode 1 (128 bytes) in bits 62-63.
__device__ __forceinline__ unsigned long long wg_desc(u32 addr) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) |
           (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads or writes across a wgmma in flight.
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// cp.async writes shared memory through the generic proxy and wgmma reads it through the async
// proxy: each thread fences its landed copies before the barrier that hands them to wgmma.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// One wgmma.mma_async m64n128k16 (bf16 in, f32 accumulate) from two shared-memory
// descriptors: d += A[64 x 16] · B[128 x 16]ᵀ. Lane l of warp w (of the warpgroup) holds
// d[i] = D[16w + l / 4 + 8 ((i / 2) % 2)][8 (i / 4) + 2 (l % 4) + i % 2].
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], unsigned long long da, unsigned long long db) {
    asm volatile(
        "{\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, 1, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db));
}

// One K step of a warpgroup: WG_BK / 16 k16 steps of NW wgmma.m64n128k16 each, from its A slice
// at `as` and the B tile at `bs` (shared addresses of 1024-byte-aligned 128-byte-swizzled tiles,
// the descriptors' start moving 32 bytes a k16 step), committed as one group; returns with that
// group in flight and every earlier one done (wait_group 1).
template <int NW>
__device__ __forceinline__ void wgmma_k_step(float (&acc)[NW][64], u32 as, u32 bs) {
#pragma unroll
    for (int j = 0; j < NW; ++j) wgmma_fence_operands(acc[j]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < WG_BK / 16; ++kk)
#pragma unroll
        for (int j = 0; j < NW; ++j)
            wgmma_m64n128k16(acc[j], wg_desc(as + kk * 32), wg_desc(bs + j * (128 * 128) + kk * 32));
    wgmma_commit();
    wgmma_wait<1>();
#pragma unroll
    for (int j = 0; j < NW; ++j) wgmma_fence_operands(acc[j]);
}

// The f32, bf16 and SwiGLU epilogues of a warpgroup's NW wgmma accumulators: lane (warp, lane) holds,
// per wgmma, rows row_of (+ 8 for registers i with (i / 2) % 2 == 1) and columns
// 8 (i / 4) + 2 tg (+ 1) of the wgmma's 64 x 128, row_of = 64 (warpgroup) + 16 warp + lane / 4.
// n8 block b of a wgmma is registers 4b .. 4b + 3: (4b, 4b + 1) on row rl, (4b + 2, 4b + 3) on
// rl + 8. SwiGLU visits the gate blocks (b even); the up block b + 1 is 4 registers on.
template <int NW, int EPI>
__device__ __forceinline__ void wgmma_store_acc(const float (&acc)[NW][64], int row_of, int tg, float* __restrict__ c,
                                                long long row_base, u32 r0, u32 rows, int n0, int n, float beta) {
    constexpr bool SWIGLU = EPI == GEMM_EPI_SWIGLU;
#pragma unroll
    for (int j = 0; j < NW; ++j)
#pragma unroll
        for (int b = 0; b < 16; b += SWIGLU ? 2 : 1)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int i = 4 * b + 2 * half, rl = row_of + half * 8, block_col = j * 128 + b * 8;
                if (SWIGLU) {
                    gemm_store_swiglu(reinterpret_cast<bf16_t*>(c), row_base, r0, rows, n0, n, rl, block_col,
                                      block_col + tg * 2, acc[j][i], acc[j][i + 1], acc[j][i + 4], acc[j][i + 5]);
                } else if (EPI == GEMM_EPI_BF16) {
                    gemm_store_bf16(reinterpret_cast<bf16_t*>(c), row_base, r0, rows, n0, n, rl, block_col + tg * 2,
                                    acc[j][i], acc[j][i + 1]);
                } else {
                    gemm_store_f32(c, row_base, r0, rows, n0, n, beta, rl, block_col + tg * 2, acc[j][i], acc[j][i + 1]);
                }
            }
}

template <int BM, int BN, int EPI = GEMM_EPI_F32>
__device__ __forceinline__ void wgmma_gemm_tile(const bf16_t* __restrict__ a, const bf16_t* __restrict__ w,
                                                float* __restrict__ c, long long row_base, u32 r0, u32 rows, int n0,
                                                int n, int k, float beta) {
    constexpr bool SWIGLU = EPI == GEMM_EPI_SWIGLU;
    constexpr int STAGES = WgShape<BM, BN>::STAGES, NW = BN / 128, THREADS = BM * 2;
    constexpr int A_STAGE = BM * WG_BK * 2, STAGE = (BM + BN) * WG_BK * 2;  // bytes
    constexpr int A_CHUNKS = BM * 8 / THREADS, B_CHUNKS = BN * 8 / THREADS;  // per thread and stage
    extern __shared__ __align__(1024) unsigned char wg_smem[];
    const u32 ring = (smem_u32(wg_smem) + 1023u) & ~1023u;

    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;

    // This thread's chunks: chunk id = tid + i * THREADS, row id / 8, 16-byte chunk id % 8.
    // Source rows are fixed for the whole K loop; only k0 moves.
    const bf16_t* a_src[A_CHUNKS];
    bool a_ok[A_CHUNKS];
#pragma unroll
    for (int i = 0; i < A_CHUNKS; ++i) {
        const int id = tid + i * THREADS, r = id >> 3;
        a_ok[i] = r0 + r < rows;
        a_src[i] = a + (a_ok[i] ? (row_base + r0 + r) * k : 0) + (id & 7) * 8;
    }
    const bf16_t* b_src[B_CHUNKS];
    bool b_ok[B_CHUNKS];
#pragma unroll
    for (int i = 0; i < B_CHUNKS; ++i) {
        const int id = tid + i * THREADS, r = id >> 3;
        b_ok[i] = n0 + r < n;
        const int w_row = SWIGLU ? gemm_swiglu_row(n0 + r, n >> 1) : n0 + r;
        b_src[i] = w + (b_ok[i] ? (long long)w_row * k : 0) + (id & 7) * 8;
    }
    auto load_stage = [&](int slot, int k0) {
        const u32 as = ring + slot * STAGE, bs = as + A_STAGE;
#pragma unroll
        for (int i = 0; i < A_CHUNKS; ++i) {
            const int id = tid + i * THREADS;
            const bool ok = a_ok[i] && k0 + (id & 7) * 8 < k;
            cp_async16(as + wg_swz(id >> 3, id & 7), ok ? a_src[i] + k0 : a, ok);
        }
#pragma unroll
        for (int i = 0; i < B_CHUNKS; ++i) {
            const int id = tid + i * THREADS;
            const bool ok = b_ok[i] && k0 + (id & 7) * 8 < k;
            cp_async16(bs + wg_swz(id >> 3, id & 7), ok ? b_src[i] + k0 : w, ok);
        }
    };

    float acc[NW][64];
#pragma unroll
    for (int j = 0; j < NW; ++j)
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[j][i] = 0.0f;

    const int n_k = (k + WG_BK - 1) / WG_BK;
    // Prologue: K steps 0 .. STAGES - 3 in flight, one commit group each (empty past n_k, so
    // that the group count below stays exact).
#pragma unroll
    for (int s = 0; s < STAGES - 2; ++s) {
        if (s < n_k) load_stage(s, s * WG_BK);
        cp_async_commit();
    }
    for (int kt = 0; kt < n_k; ++kt) {
        // Groups committed so far: STAGES - 2 + kt; all but the newest STAGES - 3 are done, so
        // K step kt has landed (this thread's copies; the barrier makes it everyone's).
        cp_async_wait<STAGES - 3>();
        fence_proxy_async();
        __syncthreads();
        // Every warpgroup passed wgmma_wait<1> after issuing step kt - 1, so step kt - 2's
        // wgmma is done and its slot is refilled now.
        const int next = kt + STAGES - 2;
        if (next < n_k) load_stage(next % STAGES, next * WG_BK);
        cp_async_commit();

        const u32 as = ring + (kt % STAGES) * STAGE + wg * (64 * 128), bs = ring + (kt % STAGES) * STAGE + A_STAGE;
        wgmma_k_step<NW>(acc, as, bs);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int j = 0; j < NW; ++j) wgmma_fence_operands(acc[j]);
    cp_async_wait<0>();  // only empty groups remain; leave none behind

    // Lane (warp, lane) of warpgroup wg holds, per wgmma, rows 64 wg + 16 warp + lane / 4 (+ 8
    // for registers i with (i / 2) % 2 == 1) and columns 8 (i / 4) + 2 (lane % 4) (+ 1) of the
    // wgmma's 64 x 128.
    const int row_of = wg * 64 + warp * 16 + (lane >> 2), tg = lane & 3;
    wgmma_store_acc<NW, EPI>(acc, row_of, tg, c, row_base, r0, rows, n0, n, beta);
}

#endif  // SIEVE_WGMMA_TILE_CUH
