// Row gathers: the embedding lookup (bf16 table -> f32 rows) and gather_rows (f32 -> f32; bf16
// operand rows are moved as f32 bits, two to a word, with half the columns).
//
// Launch: grid (output rows), block GATHER_THREADS. Indices are validated on the host.
#include "common.cuh"

#define GATHER_THREADS 256

extern "C" __global__ void __launch_bounds__(GATHER_THREADS)
embed_rows(const bf16_t* __restrict__ table, const u32* __restrict__ ids, float* __restrict__ out, int hidden) {
    const long long r = blockIdx.x;
    const bf16_t* src = table + (long long)ids[r] * hidden;
    for (int c = threadIdx.x; c < hidden; c += GATHER_THREADS) out[r * hidden + c] = bf16_to_f32(src[c]);
}

extern "C" __global__ void __launch_bounds__(GATHER_THREADS)
gather_rows(const float* __restrict__ x, const u32* __restrict__ rows, float* __restrict__ out, int cols) {
    const long long r = blockIdx.x;
    const float* src = x + (long long)rows[r] * cols;
    for (int c = threadIdx.x; c < cols; c += GATHER_THREADS) out[r * cols + c] = src[c];
}
