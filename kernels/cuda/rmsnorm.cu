// Row-wise RMSNorm: out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w.
//
// Launch: grid (rows), block RMS_THREADS. Thread t accumulates x[c]^2 for c = t, t + 256, ...
// with fmaf, then block_sum. The per-head variant used for qwen3's q/k norm is fused into the
// RoPE kernel (rope.cu).
#include "common.cuh"

#define RMS_THREADS 256

extern "C" __global__ void __launch_bounds__(RMS_THREADS)
rms_norm_rows(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out, int cols, float eps) {
    __shared__ float scratch[33];
    const long long base = (long long)blockIdx.x * cols;
    const float* xr = x + base;
    float acc = 0.0f;
    for (int c = threadIdx.x; c < cols; c += RMS_THREADS) acc = fmaf(xr[c], xr[c], acc);
    const float total = block_sum(acc, scratch);
    const float inv = 1.0f / sqrtf(total / (float)cols + eps);
    for (int c = threadIdx.x; c < cols; c += RMS_THREADS) out[base + c] = (xr[c] * inv) * w[c];
}
