// Helpers shared by every Sieve kernel: bf16 storage, warp and block reductions.
//
// The kernels include no CUDA header (NVRTC provides the built-ins they use), so compiling them
// needs only libnvrtc: a GPU host without the CUDA toolkit headers can still build them at start-up.
// bf16 values are carried as raw 16-bit patterns and converted with PTX `cvt` (sm_80+).
//
// Reductions have a fixed shape (lane-strided partial sums, then an xor butterfly), so a result
// depends only on the values reduced and the block size — never on the grid or the batch. The
// CPU twins in kernels/src/cuda/twin/ replay exactly these orders.
#ifndef SIEVE_COMMON_CUH
#define SIEVE_COMMON_CUH

typedef unsigned short bf16_t;
typedef unsigned int u32;

#define FULL_MASK 0xffffffffu

// -inf (NVRTC has no <math.h> INFINITY without headers).
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float bf16_to_f32(bf16_t h) {
    return __uint_as_float(((u32)h) << 16);
}

// Round to nearest even (what `half::bf16::from_f32` does on the CPU).
__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}

// Two bf16 packed in one 32-bit word: the lower address (lower index) in the low half.
__device__ __forceinline__ float bf16x2_lo(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16x2_hi(u32 w) { return __uint_as_float(w & 0xffff0000u); }

// Four f32 as four bf16 in one 8-byte store (dst 8-byte aligned).
__device__ __forceinline__ void store_bf16x4(bf16_t* dst, float4 v) {
    const u32 lo = (u32)f32_to_bf16(v.x) | ((u32)f32_to_bf16(v.y) << 16);
    const u32 hi = (u32)f32_to_bf16(v.z) | ((u32)f32_to_bf16(v.w) << 16);
    *reinterpret_cast<uint2*>(dst) = make_uint2(lo, hi);
}

// SwiGLU of one element, silu(g) * u: the one expression of silu_mul.cu and of the GEMM's fused
// epilogue (mma_tile.cuh), so that both give the same bits.
__device__ __forceinline__ float silu_times(float g, float u) { return (g / (1.0f + expf(-g))) * u; }

// Sum over the 32 lanes by an xor butterfly: every lane ends with the same value.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// Block-wide sum for blockDim.x a multiple of 32 (≤ 1024): each warp's butterfly, then warp 0
// butterflies the per-warp sums (missing warps count as 0). `scratch` holds 33 floats.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < nwarps ? scratch[lane] : 0.0f;
        w = warp_sum(w);
        if (lane == 0) scratch[32] = w;
    }
    __syncthreads();
    float total = scratch[32];
    __syncthreads();  // scratch may be reused by the caller's next reduction
    return total;
}

#endif  // SIEVE_COMMON_CUH
