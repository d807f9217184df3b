// The grouped expert GEMM (moe_gemm.cu) on Hopper's warpgroup tensor cores (wgmma, sm_90a only,
// compiled and loaded on compute capability 9.0 devices alone) — the MoE layer on
// `GemmEngine::Wgmma`: the same device-built tile schedules and `choice` flag as moe_gemm.cu's
// variants. BLOCK_M 64: wgmma_tile.cuh's 64 x 128 tile (one warpgroup, 128 threads, cp.async).
// BLOCK_M 128: wgmma_tma_tile.cuh's 128 x 128 tile (TMA-fed, warp-specialised, 384 threads), the
// dense projections' kernel, at the expert's first permuted row and first weight row. Launch:
// grid (the host's worst-case tile count, ceil(N / 128)), WgmmaShape::of(BM, 128).smem_bytes of
// dynamic shared memory. Both variants give the same bits (one instruction shape, one K order,
// the same shared-memory layout).
//
// moe_gemm_wgmma_bm64 / _bm128: C [n_rows, N] f32. moe_gemm_wgmma_swiglu_bm64 / _bm128: over the
// experts' stacked [gate; up] weights (n = 2 * inter), act[rows, inter] = bf16(silu(gate) * up).
// moe_gemm_wgmma_bf16_bm64 / _bm128: C [n_rows, N] bf16 (the down projection's expert outputs).
// The _bm128 kernels take `a_map` over A (dims {K, A's rows}, box {64, 128}) and `w_map` over all
// the experts' weights (dims {K, n_experts * N}, box {64, 128}; SwiGLU {64, 64}) in place of the
// pointers.
#include "wgmma_tma_tile.cuh"

template <int BM, int EPI = GEMM_EPI_F32>
__device__ __forceinline__ void grouped_wgmma(const bf16_t* __restrict__ a, const bf16_t* __restrict__ w,
                                              float* __restrict__ c, const u32* __restrict__ counts,
                                              const u32* __restrict__ offsets, const u32* __restrict__ tiles,
                                              u32 n_tiles, int n, int k) {
    const u32 tile = blockIdx.x;
    if (tile >= n_tiles) return;
    const u32 e = tiles[2 * tile], r0 = tiles[2 * tile + 1];
    wgmma_gemm_tile<BM, 128, EPI>(a, w + (long long)e * n * k, c, offsets[e], r0, counts[e], blockIdx.y * 128, n, k,
                                  0.0f);
}

#define MOE_WGMMA_ARGS                                                                                           \
    const bf16_t *__restrict__ a, const bf16_t *__restrict__ w, float *__restrict__ c,                           \
        const u32 *__restrict__ counts, const u32 *__restrict__ offsets, const u32 *__restrict__ tiles,          \
        const u32 *__restrict__ n_tiles, const int *__restrict__ choice, int n, int k

// The 128-row tile of expert tiles[2 tile] from its permuted row tiles[2 tile + 1], TMA-fed.
template <int EPI>
__device__ __forceinline__ void grouped_wgmma_tma(const TmaMap* a_map, const TmaMap* w_map, float* __restrict__ c,
                                                  const u32* __restrict__ counts, const u32* __restrict__ offsets,
                                                  const u32* __restrict__ tiles, u32 n_tiles, int n, int k) {
    const u32 tile = blockIdx.x;
    if (tile >= n_tiles) return;  // the whole block, before any barrier
    const u32 e = tiles[2 * tile], r0 = tiles[2 * tile + 1];
    wgmma_tma_gemm_tile<128, EPI>(a_map, w_map, c, offsets[e], r0, counts[e], (int)(e * n), blockIdx.y * 128, n, k,
                                  0.0f);
}

#define MOE_WGMMA_TMA_ARGS                                                                                       \
    const __grid_constant__ TmaMap a_map, const __grid_constant__ TmaMap w_map, float *__restrict__ c,           \
        const u32 *__restrict__ counts, const u32 *__restrict__ offsets, const u32 *__restrict__ tiles,          \
        const u32 *__restrict__ n_tiles, const int *__restrict__ choice, int n, int k

// n_tiles = [tiles at BLOCK_M 64, tiles at BLOCK_M 128] (moe_offsets); choice = the selector's BLOCK_M.
extern "C" __global__ void __launch_bounds__(128, 2) moe_gemm_wgmma_bm64(MOE_WGMMA_ARGS) {
    if (*choice != 64) return;
    grouped_wgmma<64>(a, w, c, counts, offsets, tiles, n_tiles[0], n, k);
}

extern "C" __global__ void __launch_bounds__(WG_TMA_THREADS, 1) moe_gemm_wgmma_bm128(MOE_WGMMA_TMA_ARGS) {
    if (*choice != 128) return;
    grouped_wgmma_tma<GEMM_EPI_F32>(&a_map, &w_map, c, counts, offsets, tiles, n_tiles[1], n, k);
}

// c is the bf16 activation [rows, n / 2].
extern "C" __global__ void __launch_bounds__(128, 2) moe_gemm_wgmma_swiglu_bm64(MOE_WGMMA_ARGS) {
    if (*choice != 64) return;
    grouped_wgmma<64, GEMM_EPI_SWIGLU>(a, w, c, counts, offsets, tiles, n_tiles[0], n, k);
}

extern "C" __global__ void __launch_bounds__(WG_TMA_THREADS, 1) moe_gemm_wgmma_swiglu_bm128(MOE_WGMMA_TMA_ARGS) {
    if (*choice != 128) return;
    grouped_wgmma_tma<GEMM_EPI_SWIGLU>(&a_map, &w_map, c, counts, offsets, tiles, n_tiles[1], n, k);
}

// c is bf16 [rows, n] (the down projection's expert outputs).
extern "C" __global__ void __launch_bounds__(128, 2) moe_gemm_wgmma_bf16_bm64(MOE_WGMMA_ARGS) {
    if (*choice != 64) return;
    grouped_wgmma<64, GEMM_EPI_BF16>(a, w, c, counts, offsets, tiles, n_tiles[0], n, k);
}

extern "C" __global__ void __launch_bounds__(WG_TMA_THREADS, 1) moe_gemm_wgmma_bf16_bm128(MOE_WGMMA_TMA_ARGS) {
    if (*choice != 128) return;
    grouped_wgmma_tma<GEMM_EPI_BF16>(&a_map, &w_map, c, counts, offsets, tiles, n_tiles[1], n, k);
}
