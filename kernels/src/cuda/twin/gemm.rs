//! The dense projections: on the device, cuBLAS `GemmEx` with bf16 A and B, f32 C, f32 compute
//! (the activation is rounded to bf16 by `cast_bf16` first). cuBLAS's reduction order is its own;
//! this twin fixes the numerics that matter — bf16 inputs, f32 accumulation — with a sequential
//! fmaf over K.

use super::warp::from_bf16;

/// out[r, n] = beta * out[r, n] + Σ_k x[r, k] · w[n, k], with x and w bf16, accumulation in f32.
pub fn gemm_bf16(x: &[u16], w: &[u16], out: &mut [f32], rows: usize, n: usize, k: usize, beta: f32) {
    for r in 0..rows {
        let xr = &x[r * k..(r + 1) * k];
        for c in 0..n {
            let wr = &w[c * k..(c + 1) * k];
            let mut acc = 0f32;
            for (&a, &b) in xr.iter().zip(wr) {
                acc = from_bf16(a).mul_add(from_bf16(b), acc);
            }
            let o = &mut out[r * n + c];
            *o = if beta == 0.0 { acc } else { beta.mul_add(*o, acc) };
        }
    }
}
