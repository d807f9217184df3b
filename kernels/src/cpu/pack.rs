//! Weight packing: a linear weight `[out, in]` (row-major, one row per output feature) is stored
//! as column panels of [`NR`] output features, each panel `[in][NR]` contiguous and 64-byte
//! aligned, so the GEMM microkernel reads one panel row per k step with aligned vector loads.
//! Features past `out` in the last panel are zero.

use rayon::prelude::*;

/// Output features per packed panel (two 16-lane vectors).
pub const NR: usize = 32;

/// One cache line of f32s; the unit of [`AlignedVec`].
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// A zero-initialised f32 buffer whose start is 64-byte aligned.
pub struct AlignedVec {
    lines: Vec<Line>,
    len: usize,
}

impl AlignedVec {
    pub fn zeros(len: usize) -> Self {
        AlignedVec { lines: vec![Line([0.0; 16]); len.div_ceil(16)], len }
    }

    pub fn as_slice(&self) -> &[f32] {
        // SAFETY: `Line` is `repr(C)` of 16 f32s, so the lines are `16 * lines.len() ≥ len` f32s.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr() as *const f32, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr() as *mut f32, self.len) }
    }
}

/// A linear weight packed into panels for the CPU GEMM.
pub struct PackedWeight {
    /// Output features (N).
    pub out_features: usize,
    /// Input features (K).
    pub in_features: usize,
    /// `panels() * in_features * NR` values: panel `p` holds features `p*NR ..` as `[k][NR]`.
    pub data: AlignedVec,
}

impl PackedWeight {
    pub fn panels(&self) -> usize {
        self.out_features.div_ceil(NR)
    }

    /// Values of one panel (`in_features * NR`).
    pub fn panel_stride(&self) -> usize {
        self.in_features * NR
    }

    /// Packs a row-major `[out, in]` matrix. The caller checked `data.len() == out * in`.
    pub fn pack(pool: &rayon::ThreadPool, data: &[f32], out_features: usize, in_features: usize) -> Self {
        let k = in_features;
        let panels = out_features.div_ceil(NR);
        let mut packed = AlignedVec::zeros(panels * k * NR);
        if k > 0 {
            let fill = |(p, panel): (usize, &mut [f32])| {
                for j in 0..NR.min(out_features - p * NR) {
                    let row = &data[(p * NR + j) * k..(p * NR + j + 1) * k];
                    for (kk, &v) in row.iter().enumerate() {
                        panel[kk * NR + j] = v;
                    }
                }
            };
            let panels = packed.as_mut_slice();
            pool.install(|| panels.par_chunks_mut(k * NR).enumerate().for_each(fill));
        }
        PackedWeight { out_features, in_features, data: packed }
    }

    /// Copies row `n` of the original `[out, in]` matrix into `dst` (length `in_features`).
    pub fn unpack_row(&self, n: usize, dst: &mut [f32]) {
        let panel = &self.data.as_slice()[(n / NR) * self.panel_stride()..][..self.panel_stride()];
        let j = n % NR;
        for (kk, d) in dst.iter_mut().enumerate() {
            *d = panel[kk * NR + j];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_then_unpack_gives_back_every_row() {
        let (n, k) = (45, 7);
        let data: Vec<f32> = (0..n * k).map(|i| i as f32).collect();
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let w = PackedWeight::pack(&pool, &data, n, k);
        assert_eq!(w.panels(), 2);
        assert_eq!(w.data.as_slice().as_ptr() as usize % 64, 0);
        let mut row = vec![0.0; k];
        for r in 0..n {
            w.unpack_row(r, &mut row);
            assert_eq!(row, &data[r * k..(r + 1) * k]);
        }
        // padding features are zero
        let pad = &w.data.as_slice()[w.panel_stride()..];
        for kk in 0..k {
            assert!(pad[kk * NR + (n - NR)..(kk + 1) * NR].iter().all(|&v| v == 0.0));
        }
    }
}
