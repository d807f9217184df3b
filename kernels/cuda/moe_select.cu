// The MoE tile selector, on the device: from the live tokens-per-expert histogram, the padded rows
// of each grouped-GEMM variant, sum_e ceil(n_e / BM) * BM, and the padding-ratio rule: when
// BLOCK_M 128 would pad the real rows by more than `threshold` (default 1.5, calibrated by the
// start-up autotune), run BLOCK_M 64, else BLOCK_M 128. The choice (the BLOCK_M value) goes to
// a device flag that both GEMM variants read — the other one exits at once — so no layer ever
// waits on the host. `force` > 0 pins a variant (benchmarks, autotune). stats = [real rows,
// padded rows at 64, padded rows at 128, choice], read back lazily for metrics.
//
// Launch: grid (1), block SELECT_THREADS.
#include "common.cuh"

#define SELECT_THREADS 256

extern "C" __global__ void __launch_bounds__(SELECT_THREADS)
moe_select_tile(const u32* __restrict__ counts, int n_experts, float threshold, int force, int* __restrict__ choice,
                u32* __restrict__ stats) {
    __shared__ unsigned long long part[3][SELECT_THREADS];
    unsigned long long real = 0, p64 = 0, p128 = 0;
    for (int e = threadIdx.x; e < n_experts; e += SELECT_THREADS) {
        const unsigned long long n = counts[e];
        real += n;
        p64 += (n + 63) / 64 * 64;
        p128 += (n + 127) / 128 * 128;
    }
    part[0][threadIdx.x] = real;
    part[1][threadIdx.x] = p64;
    part[2][threadIdx.x] = p128;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int t = 1; t < SELECT_THREADS; ++t) {
            real += part[0][t];
            p64 += part[1][t];
            p128 += part[2][t];
        }
        int bm;
        if (force > 0) bm = force;
        else bm = (real > 0 && (double)p128 > (double)threshold * (double)real) ? 64 : 128;
        *choice = bm;
        stats[0] = (u32)real;
        stats[1] = (u32)p64;
        stats[2] = (u32)p128;
        stats[3] = (u32)bm;
    }
}
