// SwiGLU activation: out[r, c] = silu(gate[r, c]) * up[r, c], with gate_up = [gate | up] halves
// of width `inter`. f32 output for the dense MLP; bf16 output feeds the MoE down-projection GEMM.
// (With fused epilogues the dense MLP computes this in the gate/up GEMM instead: gemm.cu's
// dense_gemm_swiglu_*.)
//
// Launch: 1-D grid-stride over rows * inter elements, any grid/block.
#include "common.cuh"

__device__ __forceinline__ float silu_mul_one(const float* gate_up, long long i, int inter) {
    const long long r = i / inter, c = i % inter;
    const float g = gate_up[r * 2 * inter + c];
    const float u = gate_up[r * 2 * inter + inter + c];
    return silu_times(g, u);
}

extern "C" __global__ void silu_mul_f32(const float* __restrict__ gate_up, float* __restrict__ out, long long n, int inter) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = silu_mul_one(gate_up, i, inter);
}

extern "C" __global__ void silu_mul_bf16(const float* __restrict__ gate_up, bf16_t* __restrict__ out, long long n, int inter) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = f32_to_bf16(silu_mul_one(gate_up, i, inter));
}
