// Grouped expert GEMM on tensor cores: for every expert e, C[rows of e] = A[rows of e] . W_e^T,
// A the permuted activations [n_rows, K] (bf16), W [n_experts, N, K] (bf16, nn.Linear layout),
// C [n_rows, N] (f32). Rows of expert e are [offsets[e], offsets[e] + counts[e]) (moe_permute.cu).
//
// Launch: grid (the host's worst-case tile count for the variant, ceil(N / BN)), block and
// dynamic shared memory by the tile's shape (mma_tile.cuh: BLOCK_M 64 is 64 x 64 on 128
// threads, BLOCK_M 128 is 128 x 128 on 256). blockIdx.x indexes this variant's device-built
// tile schedule (expert, first row within the expert); a block past the device's tile count
// exits, and every block of the variant the selector did not choose (the `choice` flag) exits
// at once.
// The tile itself is mma_tile.cuh's gemm_tile; both variants give the same bits.
//
// moe_gemm_swiglu_bm64 / moe_gemm_swiglu_bm128: the same launch over the experts' stacked
// [gate; up] weights (n = 2 * inter) with gemm_tile's SwiGLU epilogue: act[rows, inter] =
// bf16(silu(gate) * up), the gate/up GEMM, silu_mul_bf16 and its f32 [rows, 2 * inter] in one
// launch, with the same bits. Requires inter % 8 == 0.
//
// moe_gemm_bf16_bm64 / moe_gemm_bf16_bm128: the same launch storing C as bf16 (the down
// projection's expert outputs).
#include "mma_tile.cuh"

template <int BM, int EPI = GEMM_EPI_F32>
__device__ __forceinline__ void grouped_gemm(const bf16_t* __restrict__ a, const bf16_t* __restrict__ w,
                                             float* __restrict__ c, const u32* __restrict__ counts,
                                             const u32* __restrict__ offsets, const u32* __restrict__ tiles,
                                             u32 n_tiles, int n, int k) {
    const u32 tile = blockIdx.x;
    if (tile >= n_tiles) return;
    const u32 e = tiles[2 * tile], r0 = tiles[2 * tile + 1];
    gemm_tile<BM, EPI>(a, w + (long long)e * n * k, c, offsets[e], r0, counts[e], blockIdx.y * GemmShape<BM>::BN, n,
                       k, 0.0f);
}

// n_tiles = [tiles at BLOCK_M 64, tiles at BLOCK_M 128] (moe_offsets); choice = the selector's BLOCK_M.
extern "C" __global__ void __launch_bounds__(128, 4)
moe_gemm_bm64(const bf16_t* __restrict__ a, const bf16_t* __restrict__ w, float* __restrict__ c,
              const u32* __restrict__ counts, const u32* __restrict__ offsets, const u32* __restrict__ tiles,
              const u32* __restrict__ n_tiles, const int* __restrict__ choice, int n, int k) {
    if (*choice != 64) return;
    grouped_gemm<64>(a, w, c, counts, offsets, tiles, n_tiles[0], n, k);
}

extern "C" __global__ void __launch_bounds__(256, 2)
moe_gemm_bm128(const bf16_t* __restrict__ a, const bf16_t* __restrict__ w, float* __restrict__ c,
               const u32* __restrict__ counts, const u32* __restrict__ offsets, const u32* __restrict__ tiles,
               const u32* __restrict__ n_tiles, const int* __restrict__ choice, int n, int k) {
    if (*choice != 128) return;
    grouped_gemm<128>(a, w, c, counts, offsets, tiles, n_tiles[1], n, k);
}

extern "C" __global__ void __launch_bounds__(128, 4)
moe_gemm_swiglu_bm64(const bf16_t* __restrict__ a, const bf16_t* __restrict__ w, bf16_t* __restrict__ act,
                     const u32* __restrict__ counts, const u32* __restrict__ offsets, const u32* __restrict__ tiles,
                     const u32* __restrict__ n_tiles, const int* __restrict__ choice, int n, int k) {
    if (*choice != 64) return;
    grouped_gemm<64, GEMM_EPI_SWIGLU>(a, w, reinterpret_cast<float*>(act), counts, offsets, tiles, n_tiles[0], n, k);
}

extern "C" __global__ void __launch_bounds__(256, 2)
moe_gemm_swiglu_bm128(const bf16_t* __restrict__ a, const bf16_t* __restrict__ w, bf16_t* __restrict__ act,
                      const u32* __restrict__ counts, const u32* __restrict__ offsets, const u32* __restrict__ tiles,
                      const u32* __restrict__ n_tiles, const int* __restrict__ choice, int n, int k) {
    if (*choice != 128) return;
    grouped_gemm<128, GEMM_EPI_SWIGLU>(a, w, reinterpret_cast<float*>(act), counts, offsets, tiles, n_tiles[1], n, k);
}

// The down projection: C [n_rows, N] bf16, each expert output rounded once (moe_unpermute reads
// it; half the bytes of f32 both ways).
extern "C" __global__ void __launch_bounds__(128, 4)
moe_gemm_bf16_bm64(const bf16_t* __restrict__ a, const bf16_t* __restrict__ w, bf16_t* __restrict__ c,
                   const u32* __restrict__ counts, const u32* __restrict__ offsets, const u32* __restrict__ tiles,
                   const u32* __restrict__ n_tiles, const int* __restrict__ choice, int n, int k) {
    if (*choice != 64) return;
    grouped_gemm<64, GEMM_EPI_BF16>(a, w, reinterpret_cast<float*>(c), counts, offsets, tiles, n_tiles[0], n, k);
}

extern "C" __global__ void __launch_bounds__(256, 2)
moe_gemm_bf16_bm128(const bf16_t* __restrict__ a, const bf16_t* __restrict__ w, bf16_t* __restrict__ c,
                    const u32* __restrict__ counts, const u32* __restrict__ offsets, const u32* __restrict__ tiles,
                    const u32* __restrict__ n_tiles, const int* __restrict__ choice, int n, int k) {
    if (*choice != 128) return;
    grouped_gemm<128, GEMM_EPI_BF16>(a, w, reinterpret_cast<float*>(c), counts, offsets, tiles, n_tiles[1], n, k);
}
