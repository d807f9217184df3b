// MoE token permutation: group the (token, pick) assignments by expert so each expert's rows are
// contiguous, run the grouped GEMMs on the permuted rows, then un-permute with the routing weights.
//
// Assignment a = token * top_k + j (pick j of the token) goes to expert topk_ids[a]. Within an
// expert, rows keep assignment order, so the layout is a pure function of the routing: no atomics
// decide an order. Expert e's rows are [expert_offsets[e], expert_offsets[e] + counts[e]) —
// unpadded; the GEMM tiles mask rows past an expert's count.
//
// Pipeline (all on one stream, no host synchronisation):
//   moe_chunk_counts  grid (n_chunks), block PERM_CHUNK, dyn smem n_experts u32:
//                     per chunk of PERM_CHUNK assignments, the count per expert.
//   moe_offsets       grid (1), block PERM_OFFSET_THREADS, dyn smem twin::offsets_smem_bytes:
//                     per-expert running sums over chunks (chunk_base; each expert's chunks in
//                     ranges of their own threads), totals (counts), exclusive scan over experts (offsets), and
//                     both tile schedules (BLOCK_M 64 and 128): for each expert, ceil(n_e/BM)
//                     tiles (expert, first row within the expert), experts in order.
//   moe_select_tile   (moe_select.cu) picks the variant from the counts.
//   moe_scatter       grid (n_chunks), block PERM_CHUNK: destination row of each assignment
//                     (offset + chunk_base + rank among the chunk's earlier assignments to the same
//                     expert), then copies token rows there as bf16.
//   moe_unpermute     grid (tokens), block PERM_UNPERM_THREADS: out[t] (+)= sum_j w[t,j] * y[dest[t,j]]
//                     (y: the experts' bf16 outputs, moe_gemm*_bf16_*)
//                     (+ sigmoid(shared_gate[t]) * shared_y[t]: qwen2_moe's shared expert, its
//                     projections run before as plain GEMMs; the sum in the order the CPU's is)
//                     with j in pick order.
#include "common.cuh"

#define PERM_CHUNK 256
#define PERM_OFFSET_THREADS 1024
#define PERM_UNPERM_THREADS 256

extern "C" __global__ void __launch_bounds__(PERM_CHUNK)
moe_chunk_counts(const u32* __restrict__ topk_ids, u32* __restrict__ chunk_counts, int n_assign, int n_experts) {
    extern __shared__ u32 counts_s[];
    for (int e = threadIdx.x; e < n_experts; e += PERM_CHUNK) counts_s[e] = 0;
    __syncthreads();
    const int a = blockIdx.x * PERM_CHUNK + threadIdx.x;
    if (a < n_assign) atomicAdd(&counts_s[topk_ids[a]], 1u);
    __syncthreads();
    for (int e = threadIdx.x; e < n_experts; e += PERM_CHUNK)
        chunk_counts[(long long)blockIdx.x * n_experts + e] = counts_s[e];
}

__device__ __forceinline__ u32 ceil_div_u32(u32 a, u32 b) { return (a + b - 1) / b; }

extern "C" __global__ void __launch_bounds__(PERM_OFFSET_THREADS)
moe_offsets(const u32* __restrict__ chunk_counts, u32* __restrict__ chunk_base, u32* __restrict__ counts,
            u32* __restrict__ offsets, u32* __restrict__ tiles64, u32* __restrict__ tiles128, u32* __restrict__ n_tiles,
            int n_chunks, int n_experts) {
    // [3][n_experts + 1]: row offsets, 64-tile offsets, 128-tile offsets; then [parts][n_experts]
    extern __shared__ u32 offs_s[];
    u32* row_off = offs_s;
    u32* t64_off = offs_s + (n_experts + 1);
    u32* t128_off = offs_s + 2 * (n_experts + 1);
    u32* part_sum = offs_s + 3 * (n_experts + 1);
    // Each expert's chunks in `parts` contiguous ranges, a thread each, so that every thread has
    // work: one thread's running sum over all of an expert's chunks (1,671 for a 500-item call) was
    // a chain of loads that took the whole layer's MoE bookkeeping time. Integer sums: the same
    // values in any order.
    const int parts = max(1, min(PERM_OFFSET_THREADS / n_experts, n_chunks));
    const int per_part = (n_chunks + parts - 1) / parts;
    for (int t = threadIdx.x; t < parts * n_experts; t += PERM_OFFSET_THREADS) {
        const int e = t % n_experts, p = t / n_experts;
        const int c1 = min(n_chunks, (p + 1) * per_part);
        u32 sum = 0;
#pragma unroll 4
        for (int c = p * per_part; c < c1; ++c) sum += chunk_counts[(long long)c * n_experts + e];
        part_sum[p * n_experts + e] = sum;
    }
    __syncthreads();
    for (int t = threadIdx.x; t < parts * n_experts; t += PERM_OFFSET_THREADS) {
        const int e = t % n_experts, p = t / n_experts;
        const int c1 = min(n_chunks, (p + 1) * per_part);
        u32 running = 0;
        for (int q = 0; q < p; ++q) running += part_sum[q * n_experts + e];
#pragma unroll 4
        for (int c = p * per_part; c < c1; ++c) {
            chunk_base[(long long)c * n_experts + e] = running;
            running += chunk_counts[(long long)c * n_experts + e];
        }
        if (p == parts - 1) {
            counts[e] = running;
            row_off[e + 1] = running;
            t64_off[e + 1] = ceil_div_u32(running, 64);
            t128_off[e + 1] = ceil_div_u32(running, 128);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {  // integer scans: exact in any order; serial keeps it simple
        row_off[0] = t64_off[0] = t128_off[0] = 0;
        for (int e = 0; e < n_experts; ++e) {
            row_off[e + 1] += row_off[e];
            t64_off[e + 1] += t64_off[e];
            t128_off[e + 1] += t128_off[e];
        }
        n_tiles[0] = t64_off[n_experts];
        n_tiles[1] = t128_off[n_experts];
    }
    __syncthreads();
    for (int e = threadIdx.x; e <= n_experts; e += PERM_OFFSET_THREADS) offsets[e] = row_off[e];
    for (int e = threadIdx.x; e < n_experts; e += PERM_OFFSET_THREADS) {
        for (u32 t = t64_off[e]; t < t64_off[e + 1]; ++t) {
            tiles64[2 * t] = e;
            tiles64[2 * t + 1] = (t - t64_off[e]) * 64;
        }
        for (u32 t = t128_off[e]; t < t128_off[e + 1]; ++t) {
            tiles128[2 * t] = e;
            tiles128[2 * t + 1] = (t - t128_off[e]) * 128;
        }
    }
}

extern "C" __global__ void __launch_bounds__(PERM_CHUNK)
moe_scatter(const float* __restrict__ x, const u32* __restrict__ topk_ids, const u32* __restrict__ chunk_base,
            const u32* __restrict__ offsets, bf16_t* __restrict__ xp, u32* __restrict__ dest, int n_assign, int top_k,
            int hidden, int n_experts) {
    __shared__ u32 ids_s[PERM_CHUNK];
    __shared__ u32 dest_s[PERM_CHUNK];
    const int a0 = blockIdx.x * PERM_CHUNK;
    const int n_here = min(PERM_CHUNK, n_assign - a0);
    const int i = threadIdx.x;
    if (i < n_here) ids_s[i] = topk_ids[a0 + i];
    __syncthreads();
    if (i < n_here) {
        const u32 e = ids_s[i];
        u32 rank = 0;
        for (int j = 0; j < i; ++j) rank += ids_s[j] == e;
        const u32 pos = offsets[e] + chunk_base[(long long)blockIdx.x * n_experts + e] + rank;
        dest_s[i] = pos;
        dest[a0 + i] = pos;
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // 16-byte loads and 8-byte stores: hidden is a multiple of 8 (check_moe) and both buffers are
    // whole allocations; the scalar loop only guards against a misaligned view.
    const bool vec = (hidden & 3) == 0 && (((unsigned long long)x & 15) | ((unsigned long long)xp & 7)) == 0;
    for (int j = warp; j < n_here; j += PERM_CHUNK / 32) {
        const float* src = x + (long long)((a0 + j) / top_k) * hidden;
        bf16_t* dst = xp + (long long)dest_s[j] * hidden;
        if (vec) {
            for (int c = lane; c < hidden / 4; c += 32) store_bf16x4(dst + 4 * c, reinterpret_cast<const float4*>(src)[c]);
        } else {
            for (int c = lane; c < hidden; c += 32) dst[c] = f32_to_bf16(src[c]);
        }
    }
}

// shared_y [tokens, hidden] and shared_gate [tokens] (the gate's logit) are read only with
// has_shared (otherwise any valid pointers).
extern "C" __global__ void __launch_bounds__(PERM_UNPERM_THREADS)
moe_unpermute(const bf16_t* __restrict__ yp, const u32* __restrict__ dest, const float* __restrict__ topk_weights,
              const float* __restrict__ shared_y, const float* __restrict__ shared_gate, float* __restrict__ out,
              int top_k, int hidden, int accumulate, int has_shared) {
    const long long t = blockIdx.x;
    const float gate = has_shared ? 1.0f / (1.0f + expf(-shared_gate[t])) : 0.0f;
    // Two columns a thread (4-byte bf16 pairs, 8-byte f32 pairs): hidden is a multiple of 8
    // (check_moe). Each column's sum is the same chain of fmaf as one column at a time.
    for (int c = 2 * threadIdx.x; c < hidden; c += 2 * PERM_UNPERM_THREADS) {
        float a0 = 0.0f, a1 = 0.0f;
        for (int j = 0; j < top_k; ++j) {
            const float w = topk_weights[t * top_k + j];
            const u32 pair = *reinterpret_cast<const u32*>(yp + (long long)dest[t * top_k + j] * hidden + c);
            a0 = fmaf(w, bf16x2_lo(pair), a0);
            a1 = fmaf(w, bf16x2_hi(pair), a1);
        }
        if (has_shared) {
            a0 = fmaf(gate, shared_y[t * hidden + c], a0);
            a1 = fmaf(gate, shared_y[t * hidden + c + 1], a1);
        }
        float2* o = reinterpret_cast<float2*>(out + t * hidden + c);
        if (accumulate) {
            const float2 prev = *o;
            a0 = prev.x + a0;
            a1 = prev.y + a1;
        }
        *o = make_float2(a0, a1);
    }
}
