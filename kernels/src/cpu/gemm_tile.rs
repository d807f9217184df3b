//! GEMM microkernels: one output tile of `MR` rows × `NV` 16-lane vectors (`NV / 2` packed
//! panels) over a range of K. AVX-512: up to 14 rows × 1 panel (28 accumulators) for large M,
//! wider tiles (up to 4 panels) for M ≤ 6. AVX2 + FMA: up to 2 rows × 1 panel. Portable: 1 × 1.
//!
//! Batch invariance lives here: every output element is one multiply-add chain over `k = 0..K`
//! in order, started from zero, then `+ bias` or added onto the old value. Tile shape, the tile's
//! position and the number of rows never change that chain, so any tile shape may compute any
//! row and the bits stay the same.

use super::isa::Isa;
use super::pack::NR;

/// Arguments of one tile. Pointers are valid for the tile's rows, K and columns (the driver
/// guarantees it).
pub(crate) struct Tile {
    pub k: usize,
    /// The tile's rows of x, packed k-major: element (row i, step kk) at `a[kk * MR + i]`.
    pub a: *const f32,
    /// Start of the first packed panel of this tile; panels are `panel_stride` apart.
    pub b: *const f32,
    pub panel_stride: usize,
    /// Output of the tile's first row and column; rows are `ldc` apart.
    pub c: *mut f32,
    pub ldc: usize,
    /// Real columns in this tile (≤ NV * 16); the rest are padding and are not stored.
    pub ncols: usize,
    /// Bias at the tile's first column, or null.
    pub bias: *const f32,
    /// Add the result onto `c` instead of overwriting it.
    pub accumulate: bool,
    /// K-blocking: the tile covers `k` steps of a longer chain. Unless `first`, the chain
    /// continues from the partial sums in `partial` (`[MR][NV * 16]`); unless `last`, the chain
    /// is stored there (exactly: it is f32 either way) instead of going through the epilogue.
    pub first: bool,
    pub last: bool,
    pub partial: *mut f32,
}

pub(crate) type TileFn = unsafe fn(&Tile);

/// Most rows of an AVX2 tile (one panel: 2 × 4 accumulators + 4 panel vectors + 1 broadcast).
pub(crate) const AVX2_TILE_ROWS: usize = 2;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Tile, NR};
    use std::arch::x86_64::*;

    /// Panel rows prefetched ahead (k steps): measured a few % faster than the hardware alone.
    const PF: usize = 16;

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile<const MR: usize, const NV: usize>(t: &Tile) {
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        if !t.first {
            for (i, acc) in acc.iter_mut().enumerate() {
                for (v, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm512_loadu_ps(t.partial.add((i * NV + v) * 16));
                }
            }
        }
        let mut a = t.a;
        let mut b = t.b;
        for _ in 0..t.k {
            let mut bv = [_mm512_setzero_ps(); NV];
            for (v, bv) in bv.iter_mut().enumerate() {
                *bv = _mm512_load_ps(b.add((v / 2) * t.panel_stride + (v % 2) * 16));
            }
            if PF > 0 {
                for p in 0..NV / 2 {
                    _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(p * t.panel_stride + PF * NR) as *const i8);
                    _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(p * t.panel_stride + PF * NR + 16) as *const i8);
                }
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
        if !t.last {
            for (i, acc) in acc.iter().enumerate() {
                for (v, &acc) in acc.iter().enumerate() {
                    _mm512_storeu_ps(t.partial.add((i * NV + v) * 16), acc);
                }
            }
            return;
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
                let mut r = chain;
                if !t.bias.is_null() {
                    r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(mask, t.bias.add(col)));
                }
                if t.accumulate {
                    r = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, crow.add(col)), r);
                }
                _mm512_mask_storeu_ps(crow.add(col), mask, r);
            }
        }
    }

    /// AVX2 + FMA: `MR` rows × one panel (4 vectors of 8 lanes); `NV` (16-lane units) is 2.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile_avx2<const MR: usize, const NV: usize>(t: &Tile) {
        const V8: usize = 4;
        let mut acc = [[_mm256_setzero_ps(); V8]; MR];
        if !t.first {
            for (i, acc) in acc.iter_mut().enumerate() {
                for (v, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm256_loadu_ps(t.partial.add(i * NR + v * 8));
                }
            }
        }
        let mut a = t.a;
        let mut b = t.b;
        for _ in 0..t.k {
            let mut bv = [_mm256_setzero_ps(); V8];
            for (v, bv) in bv.iter_mut().enumerate() {
                *bv = _mm256_load_ps(b.add(v * 8));
            }
            for (i, acc) in acc.iter_mut().enumerate() {
                let ai = _mm256_set1_ps(*a.add(i));
                for v in 0..V8 {
                    acc[v] = _mm256_fmadd_ps(ai, bv[v], acc[v]);
                }
            }
            a = a.add(MR);
            b = b.add(NR);
        }
        let mut lanes = [[[0f32; 8]; V8]; MR];
        for (i, acc) in acc.iter().enumerate() {
            for (v, &acc) in acc.iter().enumerate() {
                if t.last {
                    _mm256_storeu_ps(lanes[i][v].as_mut_ptr(), acc);
                } else {
                    _mm256_storeu_ps(t.partial.add(i * NR + v * 8), acc);
                }
            }
        }
        if t.last {
            for (i, row) in lanes.iter().enumerate() {
                let crow = t.c.add(i * t.ldc);
                for (j, &chain) in row.iter().flatten().enumerate().take(t.ncols) {
                    let mut r = chain;
                    if !t.bias.is_null() {
                        r += *t.bias.add(j);
                    }
                    if t.accumulate {
                        r += *crow.add(j);
                    }
                    *crow.add(j) = r;
                }
            }
        }
    }
}

mod portable {
    use super::{Tile, NR};

    #[inline(always)]
    unsafe fn tile_body<const MR: usize, const NV: usize>(t: &Tile) {
        let mut acc = [[[0f32; 16]; NV]; MR];
        if !t.first {
            for (i, acc) in acc.iter_mut().enumerate() {
                for (v, acc) in acc.iter_mut().enumerate() {
                    *acc = *(t.partial.add((i * NV + v) * 16) as *const [f32; 16]);
                }
            }
        }
        for kk in 0..t.k {
            let mut bv = [[0f32; 16]; NV];
            for (v, bv) in bv.iter_mut().enumerate() {
                let src = t.b.add((v / 2) * t.panel_stride + kk * NR + (v % 2) * 16);
                *bv = *(src as *const [f32; 16]);
            }
            for (i, acc) in acc.iter_mut().enumerate() {
                let ai = *t.a.add(kk * MR + i);
                for v in 0..NV {
                    for l in 0..16 {
                        acc[v][l] += ai * bv[v][l];
                    }
                }
            }
        }
        if !t.last {
            for (i, acc) in acc.iter().enumerate() {
                for (v, acc) in acc.iter().enumerate() {
                    *(t.partial.add((i * NV + v) * 16) as *mut [f32; 16]) = *acc;
                }
            }
            return;
        }
        for (i, acc) in acc.iter().enumerate() {
            let crow = t.c.add(i * t.ldc);
            for (v, chain) in acc.iter().enumerate() {
                let col = v * 16;
                for (l, &chain) in chain.iter().enumerate().take(t.ncols.saturating_sub(col)) {
                    let mut r = chain;
                    if !t.bias.is_null() {
                        r += *t.bias.add(col + l);
                    }
                    let dst = crow.add(col + l);
                    if t.accumulate {
                        r += *dst;
                    }
                    *dst = r;
                }
            }
        }
    }

    pub(super) unsafe fn tile<const MR: usize, const NV: usize>(t: &Tile) {
        tile_body::<MR, NV>(t)
    }
}

macro_rules! tile_table {
    ($module:ident :: $kernel:ident; $mr:expr, $np:expr; $( ($m:literal, $p:literal) ),* $(,)?) => {
        match ($mr, $np) {
            $( ($m, $p) => Some($module::$kernel::<$m, { 2 * $p }> as TileFn), )*
            _ => None,
        }
    };
}

macro_rules! all_tiles {
    ($module:ident :: $kernel:ident, $mr:expr, $np:expr) => {
        tile_table!($module::$kernel; $mr, $np;
            (1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1), (7, 1), (8, 1), (9, 1), (10, 1), (11, 1), (12, 1), (13, 1), (14, 1),
            (1, 2), (2, 2), (3, 2), (4, 2), (5, 2), (6, 2),
            (1, 3), (2, 3), (3, 3), (4, 3),
            (1, 4), (2, 4), (3, 4),
        )
    };
}

/// The microkernel for `rows × panels` on `isa`, or None for a shape it has none for.
pub(crate) fn tile_fn(isa: Isa, rows: usize, panels: usize) -> Option<TileFn> {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => all_tiles!(x86::tile, rows, panels),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => tile_table!(x86::tile_avx2; rows, panels; (1, 1), (2, 1)),
        _ => tile_table!(portable::tile; rows, panels; (1, 1)),
    }
}
