//! The TMA boxes of the TMA-fed wgmma GEMM (kernels/cuda/wgmma_tma_tile.cuh): a row-major bf16
//! matrix read in boxes of 64 elements of K by `box_rows` rows, in the 128-byte swizzle. One
//! description for both sides: the device encodes it with `cuTensorMapEncodeTiled`
//! (`device/tma.rs`), the twin replays the copies from it (`twin::wgmma_tile::tma_load_2d`), so a
//! wrong dimension, stride or box shows in the twin's bits.

use crate::backend::{KernelError, Result};
use crate::cuda::sources::consts::WG_BK;

/// A `[rows, cols]` row-major bf16 matrix read in `[box_rows, 64]` boxes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TmaBox {
    pub rows: usize,
    pub cols: usize,
    pub box_rows: usize,
}

impl TmaBox {
    /// The box the kernel reads from a `[rows, cols]` operand, checked against the TMA's limits
    /// (cuTensorMapEncodeTiled): a row stride in 16-byte units, at most 256 rows a box, dimensions
    /// below 2^32.
    pub fn new(rows: usize, cols: usize, box_rows: usize) -> Result<TmaBox> {
        if rows == 0 || cols == 0 || !cols.is_multiple_of(8) || !(1..=256).contains(&box_rows) || rows >= 1 << 32 {
            return Err(KernelError::Shape(format!(
                "a TMA box of {box_rows} rows over a [{rows}, {cols}] bf16 matrix: needs rows and cols \
                 in 1..2^32, cols % 8 == 0 and 1..=256 rows a box"
            )));
        }
        Ok(TmaBox { rows, cols, box_rows })
    }

    /// The boxes of `dense_gemm_wgmma_tma_bn{bn}` over an `m x n` output with K `k`: x `[m, k]`
    /// in 128-row boxes, W `[n, k]` in `bn`-row boxes. The host encodes these, the twin reads
    /// through them.
    pub fn dense_gemm(m: usize, n: usize, k: usize, bn: usize) -> Result<(TmaBox, TmaBox)> {
        Ok((TmaBox::new(m, k, 128)?, TmaBox::new(n, k, bn)?))
    }

    /// The boxes of the grouped expert GEMM's 128-row tile (`moe_gemm_wgmma_*_bm128`): the
    /// permuted activations `[a_rows, k]` in 128-row boxes, every expert's `[n, k]` weights
    /// stacked (`[n_experts · n, k]`) in 128-row boxes, or with the SwiGLU split (n = 2 · inter)
    /// 64-row ones.
    pub fn grouped_gemm(a_rows: usize, n_experts: usize, n: usize, k: usize, swiglu: bool) -> Result<(TmaBox, TmaBox)> {
        Ok((TmaBox::new(a_rows, k, 128)?, TmaBox::new(n_experts * n, k, if swiglu { 64 } else { 128 })?))
    }

    /// The encode arguments, innermost dimension first: global dims (elements), the outer
    /// dimension's stride (bytes), box dims (elements). The box's inner 64 bf16 are the 128
    /// bytes the 128-byte swizzle spans.
    pub fn encode_args(&self) -> ([u64; 2], [u64; 1], [u32; 2]) {
        ([self.cols as u64, self.rows as u64], [self.cols as u64 * 2], [WG_BK, self.box_rows as u32])
    }

    /// Bytes one box lands in shared memory (the transaction bytes, out-of-range parts included).
    pub fn box_bytes(&self) -> usize {
        WG_BK as usize * self.box_rows * 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxes_outside_the_tma_limits_are_refused_with_the_reason() {
        for (rows, cols, box_rows) in [(0, 64, 128), (64, 0, 128), (64, 60, 128), (64, 64, 0), (64, 64, 257)] {
            let err = TmaBox::new(rows, cols, box_rows).expect_err("outside the limits");
            assert!(err.to_string().contains("cols % 8 == 0"), "{err}");
        }
        let (x, w) = TmaBox::dense_gemm(1, 3072, 1024, 256).expect("a dense GEMM's boxes");
        assert_eq!(x.encode_args(), ([1024, 1], [2048], [64, 128]), "x: a box may be taller than the matrix");
        assert_eq!(w.encode_args(), ([1024, 3072], [2048], [64, 256]));
        assert_eq!(x.box_bytes() + w.box_bytes(), (128 + 256) * 64 * 2);
    }
}
