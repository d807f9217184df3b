// Batch-invariant dense GEMM on Hopper's warpgroup tensor cores (wgmma, sm_90a only):
// out[M, N] = x[M, K] · W[N, K]ᵀ (+ beta · out), x and W bf16, out f32 — `GemmEngine::Wgmma`, the
// same contract as gemm.cu's tile on the instruction Hopper runs at full rate (mma.sync, which
// gemm.cu uses, reaches about two thirds of it there).
//
// dense_gemm_wgmma_bn128 / dense_gemm_wgmma_bn256: a block computes a 128 x BN output tile with
// two warpgroups (256 threads), warpgroup g owning rows 64g .. 64g + 63. K advances in WG_BK = 64
// steps through a cp.async ring of WgShape<BN>::STAGES stages in dynamic shared memory (the
// host adds 1 KiB so the ring can start on a 1024-byte boundary). A stage holds the A tile
// [128][64] and the B tile [BN][64] in the layout wgmma reads through its 128-byte-swizzle
// shared-memory descriptors (K-major): row r's 16-byte chunk c at r * 128 + 16 (c ^ (r % 8)), so
// each quarter-warp's cp.async chunks (one row's eight) land on eight different bank groups.
// Per k16 step, each warpgroup issues BN / 128 wgmma.m64n128k16, the descriptors' start moving
// 32 bytes along the swizzled row. Copies run WgShape<BN>::STAGES - 2 K steps ahead; the newest
// K step's wgmma group stays in flight while the next is issued (wgmma.wait_group 1), so the slot
// a step refills is two steps old, done by both warpgroups at the barrier before.
// Launch: grid (ceil(M / 128), ceil(N / BN)), a block's tile from gemm_block_order (mma_tile.cuh).
//
// Batch invariance: every output element is the same instruction (m64n128k16) applied to the
// same 16 k at a time from k = 0 into one accumulator, zeros past k, whatever BN, the tile's
// position or M (no split-K), so both kernels give the same bits for a row. Rows past M and
// columns past N are zero-filled in shared memory and never stored. Requires K % 8 == 0
// (16-byte cp.async chunks). Whether a row's bits also equal gemm.cu's (mma.sync m16n8k16) is
// the hardware's to say: tests/cuda_gpu.rs reports it.
#include "mma_tile.cuh"

#define WG_BM 128
#define WG_BK 64
#define WG_THREADS 256

template <int BN>
struct WgShape;
template <>
struct WgShape<128> {
    static constexpr int STAGES = 6;  // 6 x 32 KiB
};
template <>
struct WgShape<256> {
    static constexpr int STAGES = 4;  // 4 x 48 KiB
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

template <int BN>
__device__ __forceinline__ void wgmma_gemm_tile(const bf16_t* __restrict__ a, const bf16_t* __restrict__ w,
                                                float* __restrict__ c, u32 r0, u32 rows, int n0, int n, int k,
                                                float beta) {
    constexpr int STAGES = WgShape<BN>::STAGES, NW = BN / 128;
    constexpr int A_STAGE = WG_BM * WG_BK * 2, STAGE = (WG_BM + BN) * WG_BK * 2;  // bytes
    constexpr int A_CHUNKS = WG_BM * 8 / WG_THREADS, B_CHUNKS = BN * 8 / WG_THREADS;  // per thread and stage
    extern __shared__ __align__(1024) unsigned char wg_smem[];
    const u32 ring = (smem_u32(wg_smem) + 1023u) & ~1023u;

    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;

    // This thread's chunks: chunk id = tid + i * WG_THREADS, row id / 8, 16-byte chunk id % 8.
    // Source rows are fixed for the whole K loop; only k0 moves.
    const bf16_t* a_src[A_CHUNKS];
    bool a_ok[A_CHUNKS];
#pragma unroll
    for (int i = 0; i < A_CHUNKS; ++i) {
        const int id = tid + i * WG_THREADS, r = id >> 3;
        a_ok[i] = r0 + r < rows;
        a_src[i] = a + (a_ok[i] ? (long long)(r0 + r) * k : 0) + (id & 7) * 8;
    }
    const bf16_t* b_src[B_CHUNKS];
    bool b_ok[B_CHUNKS];
#pragma unroll
    for (int i = 0; i < B_CHUNKS; ++i) {
        const int id = tid + i * WG_THREADS, r = id >> 3;
        b_ok[i] = n0 + r < n;
        b_src[i] = w + (b_ok[i] ? (long long)(n0 + r) * k : 0) + (id & 7) * 8;
    }
    auto load_stage = [&](int slot, int k0) {
        const u32 as = ring + slot * STAGE, bs = as + A_STAGE;
#pragma unroll
        for (int i = 0; i < A_CHUNKS; ++i) {
            const int id = tid + i * WG_THREADS;
            const bool ok = a_ok[i] && k0 + (id & 7) * 8 < k;
            cp_async16(as + wg_swz(id >> 3, id & 7), ok ? a_src[i] + k0 : a, ok);
        }
#pragma unroll
        for (int i = 0; i < B_CHUNKS; ++i) {
            const int id = tid + i * WG_THREADS;
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
        // Both warpgroups passed wgmma_wait<1> after issuing step kt - 1, so step kt - 2's
        // wgmma is done and its slot is refilled now.
        const int next = kt + STAGES - 2;
        if (next < n_k) load_stage(next % STAGES, next * WG_BK);
        cp_async_commit();

        const u32 as = ring + (kt % STAGES) * STAGE + wg * (64 * 128), bs = ring + (kt % STAGES) * STAGE + A_STAGE;
#pragma unroll
        for (int j = 0; j < NW; ++j) wgmma_fence_operands(acc[j]);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < WG_BK / 16; ++kk)
#pragma unroll
            for (int j = 0; j < NW; ++j) wgmma_m64n128k16(acc[j], wg_desc(as + kk * 32), wg_desc(bs + j * (128 * 128) + kk * 32));
        wgmma_commit();
        wgmma_wait<1>();
#pragma unroll
        for (int j = 0; j < NW; ++j) wgmma_fence_operands(acc[j]);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int j = 0; j < NW; ++j) wgmma_fence_operands(acc[j]);
    cp_async_wait<0>();  // only empty groups remain; leave none behind

    // Lane (warp, lane) holds rows 16 warp + lane / 4 (+ 8) and columns 8 (i / 4) + 2 (lane % 4)
    // (+ 1) of its warpgroup's 64 x 128 per wgmma; pairs go as one 8-byte store when n is even.
    const bool pairs = (n & 1) == 0;
#pragma unroll
    for (int j = 0; j < NW; ++j)
#pragma unroll
        for (int i = 0; i < 64; i += 2) {
            const u32 r = r0 + wg * 64 + warp * 16 + (lane >> 2) + ((i >> 1) & 1) * 8;
            const int col = n0 + j * 128 + (i >> 2) * 8 + (lane & 3) * 2;
            if (r >= rows || col >= n) continue;
            float* dst = c + (long long)r * n + col;
            float v0 = acc[j][i], v1 = acc[j][i + 1];
            if (pairs) {  // col + 1 < n: col is even and n is even
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
}

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)
dense_gemm_wgmma_bn128(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, float* __restrict__ out, int m,
                       int n, int k, float beta) {
    u32 tm, tn;
    gemm_block_order(tm, tn);
    wgmma_gemm_tile<128>(x, w, out, tm * WG_BM, (u32)m, tn * 128, n, k, beta);
}

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)
dense_gemm_wgmma_bn256(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, float* __restrict__ out, int m,
                       int n, int k, float beta) {
    u32 tm, tn;
    gemm_block_order(tm, tn);
    wgmma_gemm_tile<256>(x, w, out, tm * WG_BM, (u32)m, tn * 256, n, k, beta);
}
