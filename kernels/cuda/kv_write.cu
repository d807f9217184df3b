// write_kv: copies each row's K and V heads out of the fused QKV activations into the layer's
// paged bf16 pools at the row's slot: pool[slot * kv_dim + j] = bf16(qkv[row, offset + j]).
//
// Launch: grid (rows), block KV_THREADS; the pools passed are the layer's own slices.
#include "common.cuh"

#define KV_THREADS 128

extern "C" __global__ void __launch_bounds__(KV_THREADS)
write_kv(const float* __restrict__ qkv, const u32* __restrict__ row_slots, bf16_t* __restrict__ k_pool,
         bf16_t* __restrict__ v_pool, int qkv_cols, int k_offset, int v_offset, int kv_dim) {
    const long long row = blockIdx.x;
    const long long slot = row_slots[row];
    const float* src = qkv + row * qkv_cols;
    for (int j = threadIdx.x; j < kv_dim; j += KV_THREADS) {
        k_pool[slot * kv_dim + j] = f32_to_bf16(src[k_offset + j]);
        v_pool[slot * kv_dim + j] = f32_to_bf16(src[v_offset + j]);
    }
}
