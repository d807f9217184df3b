//! Twin of kernels/cuda/rmsnorm.cu.

use super::warp::{block_sum, strided_fma_partials};
use crate::cuda::sources::consts::RMS_THREADS;

/// `rms_norm_rows`: grid (rows), block RMS_THREADS.
pub fn rms_norm_rows(x: &[f32], w: &[f32], out: &mut [f32], rows: usize, cols: usize, eps: f32) {
    for r in 0..rows {
        let xr = &x[r * cols..(r + 1) * cols];
        let partials = strided_fma_partials(RMS_THREADS as usize, cols, |c| (xr[c], xr[c]));
        let total = block_sum(&partials);
        let inv = 1.0f32 / (total / cols as f32 + eps).sqrt();
        for (c, o) in out[r * cols..(r + 1) * cols].iter_mut().enumerate() {
            *o = (xr[c] * inv) * w[c];
        }
    }
}
