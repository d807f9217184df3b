// The folded score head: one dot product per row, out[r] = x[r] . v (v = W[yes] - W[no] or the
// classifier's score vector).
//
// Launch: grid (rows), block SCORE_THREADS; thread t accumulates c = t, t + 256, ... with fmaf,
// then block_sum.
#include "common.cuh"

#define SCORE_THREADS 256

extern "C" __global__ void __launch_bounds__(SCORE_THREADS)
dot_rows(const float* __restrict__ x, const float* __restrict__ v, float* __restrict__ out, int cols) {
    __shared__ float scratch[33];
    const float* xr = x + (long long)blockIdx.x * cols;
    float acc = 0.0f;
    for (int c = threadIdx.x; c < cols; c += SCORE_THREADS) acc = fmaf(xr[c], v[c], acc);
    const float total = block_sum(acc, scratch);
    if (threadIdx.x == 0) out[blockIdx.x] = total;
}
