// Element-wise helpers around the cuBLAS GEMMs: activations are f32 on the device and GEMM
// inputs are bf16 (cublasGemmEx with bf16 A/B, f32 C and f32 compute), so `cast_bf16` rounds
// the activation once per GEMM; `broadcast_rows` writes a bias into every row of the output so
// the GEMM can add onto it (beta = 1).
//
// Launch: 1-D grid-stride, any grid/block.
#include "common.cuh"

extern "C" __global__ void cast_bf16(const float* __restrict__ x, bf16_t* __restrict__ y, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = f32_to_bf16(x[i]);
}

extern "C" __global__ void broadcast_rows(const float* __restrict__ v, float* __restrict__ out, long long n, int cols) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = v[i % cols];
}
