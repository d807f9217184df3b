//! A GEMM microkernel reading its weight panels as bf16 (AVX-512): the panel layout of
//! `pack` (`[k][NR]` per panel), two bytes per value, widened to f32 in registers right before
//! the FMAs. It is the `gemm_tile` AVX-512 tile with the weight loads replaced: the same
//! accumulators, the same `fma(a_i, b, acc)` chain over k = 0..K from zero, the same masked
//! store — so for weights that are exactly bf16 it gives the f32 tile's bits while streaming
//! half the bytes. The widening costs two shuffle-port µops per panel row, which compete with
//! the FMAs when the tile is compute-bound (many rows): the MoE selector weighs the two.

use super::pack::{AlignedVec, NR};

/// Arguments of one tile; pointers valid for the tile's rows, K and columns.
pub(crate) struct Bf16Tile {
    pub k: usize,
    /// The tile's rows of x, packed k-major: element (row i, step kk) at `a[kk * MR + i]`.
    pub a: *const f32,
    /// First bf16 panel of this tile; panels are `panel_stride` values apart.
    pub b: *const u16,
    pub panel_stride: usize,
    pub c: *mut f32,
    pub ldc: usize,
    /// Real columns of this tile (≤ NV · 16).
    pub ncols: usize,
}

pub(crate) type Bf16TileFn = unsafe fn(&Bf16Tile);

/// A weight in the panel layout of `PackedWeight`, each value held as the top half of its f32
/// bits (a bf16), 64-byte aligned. Built only from weights whose values are all exactly bf16.
pub(crate) struct Bf16Panels {
    storage: AlignedVec,
    len: usize,
}

impl Bf16Panels {
    pub fn from_exact(values: &[f32]) -> Option<Self> {
        if values.iter().any(|v| v.to_bits() & 0xffff != 0) {
            return None;
        }
        let mut storage = AlignedVec::zeros(values.len().div_ceil(2));
        // SAFETY: the storage holds `2 · ceil(len / 2) ≥ len` u16s, suitably aligned.
        let dst =
            unsafe { std::slice::from_raw_parts_mut(storage.as_mut_slice().as_mut_ptr() as *mut u16, values.len()) };
        for (d, v) in dst.iter_mut().zip(values) {
            *d = (v.to_bits() >> 16) as u16;
        }
        Some(Bf16Panels { storage, len: values.len() })
    }

    pub fn as_slice(&self) -> &[u16] {
        // SAFETY: as in `from_exact`.
        unsafe { std::slice::from_raw_parts(self.storage.as_slice().as_ptr() as *const u16, self.len) }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Bf16Tile, NR};
    use std::arch::x86_64::*;

    /// Panel rows prefetched ahead (k steps of one 64-byte line each).
    const PF: usize = 32;

    #[target_feature(enable = "avx512f,avx2")]
    pub(super) unsafe fn tile<const MR: usize, const NV: usize>(t: &Bf16Tile) {
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        let mut a = t.a;
        let mut b = t.b;
        for _ in 0..t.k {
            let mut bv = [_mm512_setzero_ps(); NV];
            for (v, bv) in bv.iter_mut().enumerate() {
                let half = _mm256_loadu_si256(b.add((v / 2) * t.panel_stride + (v % 2) * 16) as *const __m256i);
                *bv = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(half)));
            }
            for p in 0..NV / 2 {
                _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(p * t.panel_stride + PF * NR) as *const i8);
            }
            for (i, acc) in acc.iter_mut().enumerate() {
                let ai = _mm512_set1_ps(*a.add(i));
                for v in 0..NV {
                    acc[v] = _mm512_fmadd_ps(ai, bv[v], acc[v]);
                }
            }
            a = a.add(MR);
            b = b.add(NR);
        }
        for (i, acc) in acc.iter().enumerate() {
            let crow = t.c.add(i * t.ldc);
            for (v, &chain) in acc.iter().enumerate() {
                let col = v * 16;
                if col >= t.ncols {
                    break;
                }
                let rem = t.ncols - col;
                let mask: __mmask16 = if rem >= 16 { 0xffff } else { (1u16 << rem) - 1 };
                _mm512_mask_storeu_ps(crow.add(col), mask, chain);
            }
        }
    }
}

/// The bf16-panel tile for `rows × panels` (AVX-512 only; the same shapes as the f32 table).
#[cfg(target_arch = "x86_64")]
pub(crate) fn bf16_tile_fn(rows: usize, panels: usize) -> Option<Bf16TileFn> {
    macro_rules! table {
        ($( ($m:literal, $p:literal) ),* $(,)?) => {
            match (rows, panels) {
                $( ($m, $p) => Some(x86::tile::<$m, { 2 * $p }> as Bf16TileFn), )*
                _ => None,
            }
        };
    }
    table!(
        (1, 1),
        (2, 1),
        (3, 1),
        (4, 1),
        (5, 1),
        (6, 1),
        (7, 1),
        (8, 1),
        (9, 1),
        (10, 1),
        (11, 1),
        (12, 1),
        (13, 1),
        (14, 1),
        (1, 2),
        (2, 2),
        (3, 2),
        (4, 2),
        (5, 2),
        (6, 2),
        (1, 3),
        (2, 3),
        (3, 3),
        (4, 3),
        (1, 4),
        (2, 4),
        (3, 4),
    )
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn bf16_tile_fn(_rows: usize, _panels: usize) -> Option<Bf16TileFn> {
    None
}
