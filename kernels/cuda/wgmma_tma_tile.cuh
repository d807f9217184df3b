// wgmma_tile.cuh's 128 x BN GEMM tile fed by the Tensor Memory Accelerator (sm_90a only), with
// warp specialisation: the candidate for the last steps to cuBLAS speed on Hopper, where every
// thread of wgmma_tile.cuh's blocks spends issue slots and registers on cp.async addresses.
//
// Block: 384 threads, three warpgroups. Warpgroup 0 is the producer: one thread waits for a ring
// slot to be free (its `empty` mbarrier), arms the slot's `full` mbarrier with the stage's bytes
// (arrive.expect_tx) and issues two cp.async.bulk.tensor copies (the A box [128][64] and the B box
// [BN][64], 64 bf16 of K by rows) that complete on it. Warpgroups 1 and 2 are the consumers, rows
// 0..63 and 64..127 of the tile: each waits for a slot's `full` phase, issues the K step's wgmmas
// from the same descriptors as wgmma_tile.cuh, keeps one wgmma group in flight (wait_group 1), and
// then frees the slot of the step before (every consumer thread arrives on its `empty`: count
// 256). Round r of a slot waits on parity r & 1 of `full` and on (r & 1) ^ 1 of `empty` (the
// phase before the first counts as complete, so round 0 passes at once).
//
// The TMA writes each box in the 128-byte swizzle (CU_TENSOR_MAP_SWIZZLE_128B: 16-byte chunk c
// of box row r at r * 128 + 16 (c ^ (r % 8)) from a 1024-byte-aligned slot), the layout
// wgmma_tile.cuh's copies produce and its descriptors read; rows past the tensor's M or N and K
// past its end are zero-filled and still counted in the transaction bytes. So every stage holds
// the bytes wgmma_tile.cuh's holds and every output element gets the same wgmma sequence: the
// same bits as the cp.async-fed kernels (batch invariance as there).
//
// SwiGLU (SWIGLU = true, the MLP's gate/up GEMM): W is the stacked [gate; up] weight, n = 2 inter
// rows, and the producer loads each stage's B as two boxes of BN / 2 rows, gate rows n0 / 2 ..
// and up rows inter + n0 / 2 .., so tile column c < BN / 2 holds gate column n0 / 2 + c and
// column c + BN / 2 its up column: the same thread holds both, in register f and f + 32 NW, and
// the epilogue stores act[r, n0 / 2 + c] = bf16(silu(gate) · up) (a gate box past inter reads up
// rows, whose columns are not stored; an up box past n reads zeros). Each element is the same K
// chain as in the plain GEMM, so these are the bits of the plain GEMM, silu_mul_f32 and
// cast_bf16 in turn, as for the cp.async tile's interleaved SwiGLU. Requires inter % 8 == 0.
//
// Every mbarrier wait gives up after MBAR_TIMEOUT_NS with a trap (a launch error, not a hang):
// on a correct kernel no wait comes near it.
//
// The tensor maps are the driver's opaque 128-byte CUtensorMap (cuTensorMapEncodeTiled, built on
// the host per launch: `kernels/src/cuda/device/tma.rs`), passed by value as __grid_constant__
// parameters so the TMA reads them where they are.
#ifndef SIEVE_WGMMA_TMA_TILE_CUH
#define SIEVE_WGMMA_TMA_TILE_CUH

#include "wgmma_tile.cuh"

#define WG_TMA_THREADS 384
#define MBAR_TIMEOUT_NS 2000000000ull

struct __align__(64) TmaMap {
    unsigned long long opaque[16];
};

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrives and adds `bytes` to the transaction count the phase waits for.
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(u32 bar, u32 parity) {
    u32 done;
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    return done != 0;
}
__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
    return t;
}
// Waits for the completion of the phase of parity `parity`; traps after MBAR_TIMEOUT_NS.
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    if (mbar_try_wait(bar, parity)) return;
    const unsigned long long t0 = global_ns();
    while (!mbar_try_wait(bar, parity))
        if (global_ns() - t0 > MBAR_TIMEOUT_NS) __trap();
}
// One 2-D box of `map` at (inner coordinate c0, outer coordinate c1) into shared memory at
// `dst`, completing `bar`'s transaction bytes.
__device__ __forceinline__ void tma_load_2d(u32 dst, const TmaMap* map, int c0, int c1, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
        "[%4];\n" ::"r"(dst),
        "l"(map), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}

// The SwiGLU epilogue of the split B tile (above): gate in register f < 32 NW of the flattened
// acc[NW][64], its up in f + 32 NW; act[row_base + r, n0 / 2 + c] through gemm_store_swiglu
// (gate column 0).
template <int NW>
__device__ __forceinline__ void wgmma_store_swiglu_split(const float (&acc)[NW][64], int row_of, int tg,
                                                         bf16_t* __restrict__ act, long long row_base, u32 r0,
                                                         u32 rows, int n0, int n) {
#pragma unroll
    for (int f = 0; f < 32 * NW; f += 4)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int fg = f + 2 * half, fu = fg + 32 * NW;
            const int jg = fg / 64, ig = fg % 64, ju = fu / 64, iu = fu % 64;
            const int cl = jg * 128 + (ig >> 2) * 8 + tg * 2;
            gemm_store_swiglu(act, row_base, r0, rows, n0, n, row_of + half * 8, 0, cl, acc[jg][ig], acc[jg][ig + 1],
                              acc[ju][iu], acc[ju][iu + 1]);
        }
}

// C[row_base + r0 + r, n0 + j] (+)= sum_k A[row_base + r0 + r, k] * W[w_row0 + n0 + j, k] for the
// block's 128 x BN tile (rows r0 + r < rows stored), A and W read through `a_map` (dims {k, A's
// rows}, box {64, 128}) and `w_map` (dims {k, W's rows}, box {64, BN}; for SWIGLU box {64, BN / 2},
// and c is the bf16 act [.., n / 2]). The grouped expert GEMM (moe_gemm_wgmma.cu) passes an
// expert's first permuted row as row_base and its first weight row as w_row0: its boxes may read
// the next expert's rows, whose outputs are never stored, as rows past a matrix read zeros.
// EPI: GEMM_EPI_F32, GEMM_EPI_BF16 (c is bf16 [.., n]) or GEMM_EPI_SWIGLU (the split B tile).
template <int BN, int EPI = GEMM_EPI_F32>
__device__ __forceinline__ void wgmma_tma_gemm_tile(const TmaMap* a_map, const TmaMap* w_map, float* __restrict__ c,
                                                    long long row_base, u32 r0, u32 rows, int w_row0, int n0, int n,
                                                    int k, float beta) {
    constexpr bool SWIGLU = EPI == GEMM_EPI_SWIGLU;
    constexpr int STAGES = WgShape<128, BN>::STAGES, NW = BN / 128;
    constexpr int A_STAGE = 128 * WG_BK * 2, STAGE = (128 + BN) * WG_BK * 2;  // bytes
    extern __shared__ __align__(1024) unsigned char wg_smem[];
    __shared__ __align__(8) unsigned long long full[STAGES], empty[STAGES];
    const u32 ring = (smem_u32(wg_smem) + 1023u) & ~1023u;
    const int tid = threadIdx.x, wg = tid >> 7, n_k = (k + WG_BK - 1) / WG_BK;

    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(smem_u32(&full[s]), 1);
            mbar_init(smem_u32(&empty[s]), 256);
        }
        // The inits visible to the other threads and to the TMA (the async proxy).
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        fence_proxy_async();
    }
    __syncthreads();

    if (wg == 0) {
        if (tid == 0) {
            for (int kt = 0; kt < n_k; ++kt) {
                const int slot = kt % STAGES;
                const u32 f = smem_u32(&full[slot]), dst = ring + slot * STAGE;
                mbar_wait(smem_u32(&empty[slot]), ((kt / STAGES) & 1) ^ 1);
                mbar_arrive_expect_tx(f, STAGE);
                tma_load_2d(dst, a_map, kt * WG_BK, (int)(row_base + r0), f);
                if (SWIGLU) {
                    tma_load_2d(dst + A_STAGE, w_map, kt * WG_BK, w_row0 + (n0 >> 1), f);
                    tma_load_2d(dst + A_STAGE + (BN / 2) * WG_BK * 2, w_map, kt * WG_BK, w_row0 + (n >> 1) + (n0 >> 1),
                                f);
                } else {
                    tma_load_2d(dst + A_STAGE, w_map, kt * WG_BK, w_row0 + n0, f);
                }
            }
        }
        return;  // the consumers use no block-wide barrier from here on
    }

    const int cw = wg - 1, warp = (tid >> 5) & 3, lane = tid & 31;
    float acc[NW][64];
#pragma unroll
    for (int j = 0; j < NW; ++j)
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[j][i] = 0.0f;

    for (int kt = 0; kt < n_k; ++kt) {
        const int slot = kt % STAGES;
        mbar_wait(smem_u32(&full[slot]), (kt / STAGES) & 1);
        const u32 as = ring + slot * STAGE + cw * (64 * 128), bs = ring + slot * STAGE + A_STAGE;
        wgmma_k_step<NW>(acc, as, bs);
        // Step kt - 1's wgmmas are done: its slot may be refilled.
        if (kt > 0) mbar_arrive(smem_u32(&empty[(kt - 1) % STAGES]));
    }
    wgmma_wait<0>();
#pragma unroll
    for (int j = 0; j < NW; ++j) wgmma_fence_operands(acc[j]);

    const int row_of = cw * 64 + warp * 16 + (lane >> 2);
    if (SWIGLU)
        wgmma_store_swiglu_split<NW>(acc, row_of, lane & 3, reinterpret_cast<bf16_t*>(c), row_base, r0, rows, n0, n);
    else
        wgmma_store_acc<NW, EPI>(acc, row_of, lane & 3, c, row_base, r0, rows, n0, n, beta);
}

#endif  // SIEVE_WGMMA_TMA_TILE_CUH
