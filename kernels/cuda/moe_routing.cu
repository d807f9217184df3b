// MoE router: softmax over the experts, then the top-k experts per token (ties go to the lower
// expert index), optionally renormalised so the k weights sum to 1 (qwen3_moe `norm_topk_prob`).
//
// Launch: grid (ceil(tokens / 4)), block ROUTE_THREADS: one warp per token. Lane l holds the
// logits of experts l, l + 32, ... (n_experts ≤ ROUTE_MAX_EXPERTS). max and sum-of-exp are warp
// reductions (the sum: lane-strided partial sums in expert order, then warp_sum). Each of the k
// picks is a warp argmax by butterfly over (probability desc, expert asc); the winner is marked
// used. Renormalisation sums the k weights in pick order.
#include "common.cuh"

#define ROUTE_THREADS 128
#define ROUTE_MAX_EXPERTS 512
#define ROUTE_PER_LANE (ROUTE_MAX_EXPERTS / 32)

// One token by one warp, with P logits a lane (P · 32 ≥ n_experts): the kernel picks the
// smallest P, so a 128-expert router does not run the 512-expert loops (the extra slots would
// only add zeros and lose every comparison: the same results).
template <int P>
__device__ __forceinline__ void route_token(const float* __restrict__ row, u32* __restrict__ ids_out,
                                            float* __restrict__ weights_out, int n_experts, int top_k, int renormalize,
                                            int lane) {
    float v[P];
    float local_max = neg_inf();
#pragma unroll
    for (int i = 0; i < P; ++i) {
        const int e = lane + 32 * i;
        v[i] = e < n_experts ? row[e] : neg_inf();
        local_max = fmaxf(local_max, v[i]);
    }
    const float mx = warp_max(local_max);
    float local_sum = 0.0f;
#pragma unroll
    for (int i = 0; i < P; ++i) {
        const int e = lane + 32 * i;
        v[i] = e < n_experts ? expf(v[i] - mx) : 0.0f;
        local_sum += v[i];
    }
    const float inv_sum = 1.0f / warp_sum(local_sum);
    u32 used = 0;  // bit i: expert lane + 32 i already picked
#pragma unroll
    for (int i = 0; i < P; ++i) v[i] *= inv_sum;

    float picked_sum = 0.0f;
    float my_weight = 0.0f;  // lane j keeps pick j's weight (top_k ≤ 32)
    u32 my_id = 0;
    for (int j = 0; j < top_k; ++j) {
        float best = -1.0f;
        u32 best_e = 0xffffffffu;
#pragma unroll
        for (int i = 0; i < P; ++i) {
            const u32 e = lane + 32 * i;
            if (e < (u32)n_experts && !(used >> i & 1u) && v[i] > best) {
                best = v[i];
                best_e = e;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(FULL_MASK, best, o);
            const u32 oe = __shfl_xor_sync(FULL_MASK, best_e, o);
            if (ob > best || (ob == best && oe < best_e)) {
                best = ob;
                best_e = oe;
            }
        }
        if ((best_e & 31u) == (u32)lane) used |= 1u << (best_e >> 5);
        picked_sum += best;
        if (lane == j) {
            my_weight = best;
            my_id = best_e;
        }
    }
    if (lane < top_k) {
        ids_out[lane] = my_id;
        weights_out[lane] = renormalize ? my_weight / picked_sum : my_weight;
    }
}

extern "C" __global__ void __launch_bounds__(ROUTE_THREADS)
moe_topk_softmax(const float* __restrict__ logits, u32* __restrict__ topk_ids, float* __restrict__ topk_weights,
                 int tokens, int n_experts, int top_k, int renormalize) {
    const int lane = threadIdx.x & 31;
    const int token = blockIdx.x * (ROUTE_THREADS / 32) + (threadIdx.x >> 5);
    if (token >= tokens) return;  // warp-uniform
    const float* row = logits + (long long)token * n_experts;
    u32* ids = topk_ids + (long long)token * top_k;
    float* weights = topk_weights + (long long)token * top_k;
    const int per_lane = (n_experts + 31) / 32;
    if (per_lane <= 1)
        route_token<1>(row, ids, weights, n_experts, top_k, renormalize, lane);
    else if (per_lane <= 2)
        route_token<2>(row, ids, weights, n_experts, top_k, renormalize, lane);
    else if (per_lane <= 4)
        route_token<4>(row, ids, weights, n_experts, top_k, renormalize, lane);
    else if (per_lane <= 8)
        route_token<8>(row, ids, weights, n_experts, top_k, renormalize, lane);
    else
        route_token<ROUTE_PER_LANE>(row, ids, weights, n_experts, top_k, renormalize, lane);
}
