//! Row-wise elementwise ops: SwiGLU's `silu(gate) * up` and the score head's dot products.

use super::isa::isa_variants;
use super::math;

#[inline(always)]
fn silu_mul_rows_body(gate_up: &[f32], inter: usize, out: &mut [f32]) {
    for (gu, o) in gate_up.chunks_exact(2 * inter).zip(out.chunks_exact_mut(inter)) {
        let (g, u) = gu.split_at(inter);
        for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
            *o = math::silu(g) * u;
        }
    }
}

isa_variants! {
    /// `out[r] = silu(gate[r]) * up[r]` for consecutive rows of `[gate | up]` (2·inter columns).
    fn silu_mul_rows(gate_up: &[f32], inter: usize, out: &mut [f32]) = silu_mul_rows_body;
}

#[inline(always)]
fn dot_rows_body(x: &[f32], v: &[f32], out: &mut [f32]) {
    for (row, o) in x.chunks_exact(v.len()).zip(out.iter_mut()) {
        *o = math::dot(row, v);
    }
}

isa_variants! {
    /// `out[r] = x[r] · v` for consecutive rows of `v.len()` columns.
    fn dot_rows(x: &[f32], v: &[f32], out: &mut [f32]) = dot_rows_body;
}
