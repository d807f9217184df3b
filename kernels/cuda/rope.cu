// qk_norm_rope: in place on the fused QKV activations [rows, q | k | v], for every q head and
// k head of a row: optional per-head RMSNorm (qwen3 q_norm / k_norm, weight [head_dim]; null:
// none), then rotary embedding at the row's position (rope.cuh's norm_rope_head). V heads are
// untouched.
//
// Launch: grid (rows), block ROPE_THREADS (4 warps), dynamic shared memory chunk_heads * head_dim
// floats. The block copies up to chunk_heads of the row's heads (q heads first, then k heads) into
// shared memory at once (16-byte `cp.async`, all in flight together: a block per row that loaded a
// head at a time per warp kept too few loads in flight to reach the memory's bandwidth), then warp
// w norms and rotates the chunk's heads w, w + 4, ... there, and the block stores them back. A
// head's bits do not depend on the warp or the chunk that takes it. The angles are row
// positions[row] of the table rope_cs (rope_table below).
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

// 16-byte copies global → shared that do not wait (the row's heads all in flight at once).
__device__ __forceinline__ void rope_cp_async16(float* smem, const float* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((u32)__cvta_generic_to_shared(smem)), "l"(gmem));
}

// n floats of src as bf16 at dst, by the block; 16-byte loads and 8-byte stores with `vec`.
__device__ __forceinline__ void rows_to_bf16(const float* __restrict__ src, bf16_t* __restrict__ dst, int n, bool vec) {
    if (vec) {
        for (int j = threadIdx.x; j < n / 4; j += ROPE_THREADS)
            store_bf16x4(dst + 4 * j, reinterpret_cast<const float4*>(src)[j]);
    } else {
        for (int j = threadIdx.x; j < n; j += ROPE_THREADS) dst[j] = f32_to_bf16(src[j]);
    }
}

// At least 12 blocks an SM (40 registers): with 64 the compiler's own choice fit 8.
extern "C" __global__ void __launch_bounds__(ROPE_THREADS, 12)
qk_norm_rope(float* __restrict__ qkv, const u32* __restrict__ positions, const double* __restrict__ rope_cs,
             const float* __restrict__ q_norm, const float* __restrict__ k_norm, int qkv_cols, int n_heads,
             int n_kv_heads, int head_dim, float eps, int rotary_dim, int interleaved,
             const u32* __restrict__ row_slots, bf16_t* __restrict__ k_pool, bf16_t* __restrict__ v_pool,
             int chunk_heads) {
    extern __shared__ float heads_buf[];  // chunk_heads * head_dim floats
    const int row = blockIdx.x;
    const double* cs = rope_cs + (long long)positions[row] * rotary_dim;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float* row_ptr = qkv + (long long)row * qkv_cols;
    const int n_all = n_heads + n_kv_heads;
    const int q_dim = n_heads * head_dim, kv_dim = n_kv_heads * head_dim;
    const long long slot = k_pool != nullptr ? (long long)row_slots[row] : 0;
    // 16-byte moves where the row, every head and the pools are 16- (pools: 8-) byte aligned:
    // every real model (head sizes are multiples of 4); the same values either way.
    const bool vec = (((unsigned long long)row_ptr | (unsigned long long)(head_dim * 4)) & 15) == 0 &&
                     (((unsigned long long)k_pool | (unsigned long long)v_pool) & 7) == 0;
    // q heads then k heads are contiguous in the row: head h at h * head_dim.
    for (int h0 = 0; h0 < n_all; h0 += chunk_heads) {
        const int nh = min(chunk_heads, n_all - h0);
        const int len = nh * head_dim;
        float* src = row_ptr + (long long)h0 * head_dim;
        if (vec) {
            for (int j = threadIdx.x; j < len / 4; j += ROPE_THREADS) rope_cp_async16(heads_buf + 4 * j, src + 4 * j);
            asm volatile("cp.async.commit_group;\n" ::);
        } else {
            for (int j = threadIdx.x; j < len; j += ROPE_THREADS) heads_buf[j] = src[j];
        }
        // The V heads go to their pool while the chunk's copies are in flight.
        if (h0 == 0 && k_pool != nullptr) rows_to_bf16(row_ptr + q_dim + kv_dim, v_pool + slot * kv_dim, kv_dim, vec);
        if (vec) asm volatile("cp.async.wait_all;\n" ::);
        __syncthreads();
        for (int h = warp; h < nh; h += ROPE_WARPS) {
            float* buf = heads_buf + h * head_dim;
            auto at = [buf](int d) -> float& { return buf[d]; };
            norm_rope_head(at, h0 + h < n_heads ? q_norm : k_norm, eps, head_dim, cs, rotary_dim, interleaved, lane);
        }
        __syncthreads();
        if (vec) {
            for (int j = threadIdx.x; j < len / 4; j += ROPE_THREADS)
                reinterpret_cast<float4*>(src)[j] = reinterpret_cast<const float4*>(heads_buf)[j];
        } else {
            for (int j = threadIdx.x; j < len; j += ROPE_THREADS) src[j] = heads_buf[j];
        }
        // The chunk's k heads, rotated, to the K pool.
        const int k0 = max(h0, n_heads);
        if (k_pool != nullptr && k0 < h0 + nh)
            rows_to_bf16(heads_buf + (k0 - h0) * head_dim, k_pool + slot * kv_dim + (long long)(k0 - n_heads) * head_dim,
                         (h0 + nh - k0) * head_dim, vec);
        if (h0 + chunk_heads < n_all) __syncthreads();  // the next chunk reuses heads_buf
    }
}
