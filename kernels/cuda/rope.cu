// qk_norm_rope: in place on the fused QKV activations [rows, q | k | v], for every q head and
// k head of a row: optional per-head RMSNorm (qwen3 q_norm / k_norm, weight [head_dim]), then
// rotary embedding at the row's position. V heads are untouched.
//
// Launch: grid (rows), block ROPE_THREADS (4 warps), dynamic shared memory
//   rotary_dim/2 doubles (cos) + rotary_dim/2 doubles (sin) + 4 * head_dim floats (one head per warp).
// The angles are computed once per row in double precision (pos * theta^(-2i/rotary_dim)), so
// long positions lose no accuracy; the rotation itself is also done in double then rounded.
// Warp w handles heads w, w + 4, ... (q heads first, then k heads). Within a head, lane l owns
// dims l, l + 32, ...; the norm's sum of squares is lane-strided fmaf then warp_sum.
// Layouts: interleaved pairs (2i, 2i+1); half-split pairs (i, i + rotary_dim/2); dims
// ≥ rotary_dim pass through.
//
// With `k_pool` non-null (fused epilogues) the kernel is also kv_write.cu's `write_kv`: each
// rotated k head and each v head is stored bf16 at the row's slot of the layer's pools
// (pool[slot * kv_dim + j], kv_dim = n_kv_heads * head_dim) — the same bits as that kernel,
// without its second read of the row's K and V and its launch.
#include "common.cuh"

#define ROPE_THREADS 128
#define ROPE_WARPS (ROPE_THREADS / 32)

extern "C" __global__ void __launch_bounds__(ROPE_THREADS)
qk_norm_rope(float* __restrict__ qkv, const u32* __restrict__ positions, const float* __restrict__ q_norm,
             const float* __restrict__ k_norm, int qkv_cols, int n_heads, int n_kv_heads, int head_dim, float eps,
             int use_q_norm, int use_k_norm, double theta, int rotary_dim, int interleaved,
             const u32* __restrict__ row_slots, bf16_t* __restrict__ k_pool, bf16_t* __restrict__ v_pool) {
    extern __shared__ double rope_smem[];
    const int half = rotary_dim / 2;
    double* cos_t = rope_smem;
    double* sin_t = rope_smem + half;
    float* head_buf = (float*)(rope_smem + 2 * half);

    const int row = blockIdx.x;
    const double pos = (double)positions[row];
    for (int i = threadIdx.x; i < half; i += ROPE_THREADS) {
        const double inv_freq = pow(theta, -(2.0 * (double)i) / (double)rotary_dim);
        double s, c;
        sincos(pos * inv_freq, &s, &c);
        cos_t[i] = c;
        sin_t[i] = s;
    }
    __syncthreads();

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float* buf = head_buf + warp * head_dim;
    float* row_ptr = qkv + (long long)row * qkv_cols;
    const int q_dim = n_heads * head_dim, kv_dim = n_kv_heads * head_dim;
    const long long slot = k_pool != nullptr ? (long long)row_slots[row] : 0;
    if (k_pool != nullptr) {
        for (int j = threadIdx.x; j < kv_dim; j += ROPE_THREADS)
            v_pool[slot * kv_dim + j] = f32_to_bf16(row_ptr[q_dim + kv_dim + j]);
    }
    for (int h = warp; h < n_heads + n_kv_heads; h += ROPE_WARPS) {
        const bool is_q = h < n_heads;
        float* head = row_ptr + (is_q ? h * head_dim : q_dim + (h - n_heads) * head_dim);
        const float* w = is_q ? (use_q_norm ? q_norm : nullptr) : (use_k_norm ? k_norm : nullptr);
        for (int d = lane; d < head_dim; d += 32) buf[d] = head[d];
        if (w != nullptr) {
            float acc = 0.0f;
            for (int d = lane; d < head_dim; d += 32) acc = fmaf(buf[d], buf[d], acc);
            const float inv = 1.0f / sqrtf(warp_sum(acc) / (float)head_dim + eps);
            for (int d = lane; d < head_dim; d += 32) buf[d] = (buf[d] * inv) * w[d];
        }
        __syncwarp();
        for (int i = lane; i < half; i += 32) {
            const int a = interleaved ? 2 * i : i;
            const int b = interleaved ? 2 * i + 1 : i + half;
            const double x0 = (double)buf[a], x1 = (double)buf[b];
            buf[a] = (float)(x0 * cos_t[i] - x1 * sin_t[i]);
            buf[b] = (float)(x0 * sin_t[i] + x1 * cos_t[i]);
        }
        __syncwarp();
        for (int d = lane; d < head_dim; d += 32) head[d] = buf[d];
        if (!is_q && k_pool != nullptr) {
            bf16_t* k_dst = k_pool + slot * kv_dim + (h - n_heads) * head_dim;
            for (int d = lane; d < head_dim; d += 32) k_dst[d] = f32_to_bf16(buf[d]);
        }
        __syncwarp();
    }
}
