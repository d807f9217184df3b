// qk_norm_rope: in place on the fused QKV activations [rows, q | k | v], for every q head and
// k head of a row: optional per-head RMSNorm (qwen3 q_norm / k_norm, weight [head_dim]; null:
// none), then rotary embedding at the row's position (rope.cuh's norm_rope_head). V heads are
// untouched.
//
// Launch: grid (rows), block ROPE_THREADS (4 warps), dynamic shared memory 4 * head_dim floats
// (one head per warp). Warp w handles heads w, w + 4, ... (q heads first, then k heads); the
// angles are row positions[row] of the table rope_cs (rope_table below).
//
// With `k_pool` non-null (fused epilogues) the kernel is also kv_write.cu's `write_kv`: each
// rotated k head and each v head is stored bf16 at the row's slot of the layer's pools
// (pool[slot * kv_dim + j], kv_dim = n_kv_heads * head_dim) — the same bits as that kernel,
// without its second read of the row's K and V and its launch.
//
// rope_table: the angle table of rope.cuh, cs[p * rotary_dim + i] = cos and
// cs[p * rotary_dim + rotary_dim / 2 + i] = sin of p · inv_freq[i], for p < n_pos, each times
// scale; inv_freq (the pairs' inverse frequencies, RoPE scaling included) and scale (YaRN's
// attention factor, else 1) come from the host's one formula (RopeConfig::inv_freq,
// attention_scaling). Launch: grid-stride over n_pos * rotary_dim / 2.
#include "rope.cuh"

#define ROPE_THREADS 128
#define ROPE_WARPS (ROPE_THREADS / 32)

extern "C" __global__ void rope_table(double* __restrict__ cs, int n_pos, const double* __restrict__ inv_freq,
                                      double scale, int rotary_dim) {
    const int half = rotary_dim / 2;
    const long long total = (long long)n_pos * half;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        const long long p = t / half;
        const int i = (int)(t % half);
        double s, c;
        sincos((double)p * inv_freq[i], &s, &c);
        cs[p * rotary_dim + i] = c * scale;
        cs[p * rotary_dim + half + i] = s * scale;
    }
}

extern "C" __global__ void __launch_bounds__(ROPE_THREADS)
qk_norm_rope(float* __restrict__ qkv, const u32* __restrict__ positions, const double* __restrict__ rope_cs,
             const float* __restrict__ q_norm, const float* __restrict__ k_norm, int qkv_cols, int n_heads,
             int n_kv_heads, int head_dim, float eps, int rotary_dim, int interleaved,
             const u32* __restrict__ row_slots, bf16_t* __restrict__ k_pool, bf16_t* __restrict__ v_pool) {
    extern __shared__ float head_buf[];
    const int row = blockIdx.x;
    const double* cs = rope_cs + (long long)positions[row] * rotary_dim;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float* buf = head_buf + warp * head_dim;
    auto at = [buf](int d) -> float& { return buf[d]; };
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
        for (int d = lane; d < head_dim; d += 32) buf[d] = head[d];
        norm_rope_head(at, is_q ? q_norm : k_norm, eps, head_dim, cs, rotary_dim, interleaved, lane);
        for (int d = lane; d < head_dim; d += 32) head[d] = buf[d];
        if (!is_q && k_pool != nullptr) {
            bf16_t* k_dst = k_pool + slot * kv_dim + (h - n_heads) * head_dim;
            for (int d = lane; d < head_dim; d += 32) k_dst[d] = f32_to_bf16(buf[d]);
        }
        __syncwarp();
    }
}
