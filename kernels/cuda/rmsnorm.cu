// Row-wise RMSNorm: out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w.
//
// rms_norm_rows_bf16 stores bf16 (the GEMM operand with fused epilogues). add_rms_norm_rows(_bf16)
// first add the previous projection's output to the residual stream (x[r] += d[r], written back),
// so that projection stores plainly instead of reading the residual in its epilogue; the norm of
// the sum then has the bits rms_norm_rows gives for x + d.
//
// Launch: grid (rows), block RMS_THREADS. Thread t accumulates x[c]^2 for c = t, t + 256, ...
// with fmaf, then block_sum. The per-head variant used for qwen3's q/k norm is fused into the
// RoPE kernel (rope.cu).
#include "common.cuh"

#define RMS_THREADS 256

__device__ __forceinline__ void store_norm(float* out, long long i, float v) { out[i] = v; }
__device__ __forceinline__ void store_norm(bf16_t* out, long long i, float v) { out[i] = f32_to_bf16(v); }

template <typename T>
__device__ __forceinline__ void rms_norm_row(const float* __restrict__ x, const float* __restrict__ w, T* __restrict__ out,
                                             int cols, float eps) {
    __shared__ float scratch[33];
    const long long base = (long long)blockIdx.x * cols;
    const float* xr = x + base;
    float acc = 0.0f;
    for (int c = threadIdx.x; c < cols; c += RMS_THREADS) acc = fmaf(xr[c], xr[c], acc);
    const float total = block_sum(acc, scratch);
    const float inv = 1.0f / sqrtf(total / (float)cols + eps);
    for (int c = threadIdx.x; c < cols; c += RMS_THREADS) store_norm(out, base + c, (xr[c] * inv) * w[c]);
}

template <typename T>
__device__ __forceinline__ void add_rms_norm_row(float* __restrict__ x, const float* __restrict__ d,
                                                 const float* __restrict__ w, T* __restrict__ out, int cols, float eps) {
    __shared__ float scratch[33];
    const long long base = (long long)blockIdx.x * cols;
    float* xr = x + base;
    const float* dr = d + base;
    float acc = 0.0f;
    for (int c = threadIdx.x; c < cols; c += RMS_THREADS) {
        const float v = xr[c] + dr[c];
        xr[c] = v;
        acc = fmaf(v, v, acc);
    }
    const float total = block_sum(acc, scratch);
    const float inv = 1.0f / sqrtf(total / (float)cols + eps);
    for (int c = threadIdx.x; c < cols; c += RMS_THREADS) store_norm(out, base + c, (xr[c] * inv) * w[c]);
}

extern "C" __global__ void __launch_bounds__(RMS_THREADS)
rms_norm_rows(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out, int cols, float eps) {
    rms_norm_row(x, w, out, cols, eps);
}

// The same row, stored as bf16: the next projection's operand, written once instead of an f32
// row that cast_bf16 then reads and rounds (the same bits, a third of the bytes).
extern "C" __global__ void __launch_bounds__(RMS_THREADS)
rms_norm_rows_bf16(const float* __restrict__ x, const float* __restrict__ w, bf16_t* __restrict__ out, int cols,
                   float eps) {
    rms_norm_row(x, w, out, cols, eps);
}

extern "C" __global__ void __launch_bounds__(RMS_THREADS)
add_rms_norm_rows(float* __restrict__ x, const float* __restrict__ d, const float* __restrict__ w,
                  float* __restrict__ out, int cols, float eps) {
    add_rms_norm_row(x, d, w, out, cols, eps);
}

extern "C" __global__ void __launch_bounds__(RMS_THREADS)
add_rms_norm_rows_bf16(float* __restrict__ x, const float* __restrict__ d, const float* __restrict__ w,
                       bf16_t* __restrict__ out, int cols, float eps) {
    add_rms_norm_row(x, d, w, out, cols, eps);
}
