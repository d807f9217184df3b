// rope.cu's per-head work (qk_norm_rope): one warp's RMSNorm and rotation of one head.
//
// RoPE angle table (rope.cu's rope_table, one per (theta, rotary_dim), built once for the
// positions a batch reaches): row p holds cos(p · theta^(-2i / rotary_dim)) for the
// rotary_dim / 2 pairs i, then their sin, all in double, so long positions lose no accuracy.
//
// norm_rope_head: one head of one row, by one warp, in place in shared memory through `at(d)`
// (dim d's float). Optional RMSNorm with weight `w` (null: none): lane l sums dims l, l + 32, ...
// by fmaf, then warp_sum. Then the rotation by the row's table row `cs`, in double (explicit
// _rn products: no contraction, the order the CPU twin replays), rounded once to f32. Pairs are
// interleaved (2i, 2i + 1) or half-split (i, i + rotary_dim / 2); dims ≥ rotary_dim pass through.
#ifndef SIEVE_ROPE_CUH
#define SIEVE_ROPE_CUH

#include "common.cuh"

template <class At>
__device__ __forceinline__ void norm_rope_head(At at, const float* __restrict__ w, float eps, int head_dim,
                                               const double* __restrict__ cs, int rotary_dim, int interleaved,
                                               int lane) {
    if (w != nullptr) {
        float acc = 0.0f;
        for (int d = lane; d < head_dim; d += 32) acc = fmaf(at(d), at(d), acc);
        const float inv = 1.0f / sqrtf(warp_sum(acc) / (float)head_dim + eps);
        for (int d = lane; d < head_dim; d += 32) at(d) = (at(d) * inv) * w[d];
    }
    __syncwarp();
    const int half = rotary_dim / 2;
    for (int i = lane; i < half; i += 32) {
        const int a = interleaved ? 2 * i : i;
        const int b = interleaved ? 2 * i + 1 : i + half;
        const double x0 = (double)at(a), x1 = (double)at(b), c = cs[i], s = cs[half + i];
        at(a) = (float)__dsub_rn(__dmul_rn(x0, c), __dmul_rn(x1, s));
        at(b) = (float)__dadd_rn(__dmul_rn(x0, s), __dmul_rn(x1, c));
    }
    __syncwarp();
}

#endif  // SIEVE_ROPE_CUH
