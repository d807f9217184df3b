//! RMSNorm, the per-head q/k norm and rotary embedding.
//!
//! RoPE angles are exact enough for long positions: `inv_freq = θ^(-2i/d)` and `pos·inv_freq`
//! are computed in f64 and their cos/sin rounded to f32 once per distinct position of a batch
//! ([`RopeTable`], cached in the batch for all layers); the rotation itself is f32.

use crate::backend::{QkvLayout, RopeConfig, RopeLayout};

use super::isa::isa_variants;
use super::math;

/// `out = x / sqrt(mean(x²) + eps) * w` for one row.
#[inline(always)]
pub(crate) fn rms_norm_row(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let inv = 1.0 / (math::sum_squares(x) / x.len() as f32 + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * inv * g;
    }
}

#[inline(always)]
fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let inv = 1.0 / (math::sum_squares(x) / x.len() as f32 + eps).sqrt();
    for (v, &g) in x.iter_mut().zip(w) {
        *v = *v * inv * g;
    }
}

#[inline(always)]
fn rms_norm_rows_body(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let cols = w.len();
    for (xr, or) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        rms_norm_row(xr, w, eps, or);
    }
}

isa_variants! {
    /// RMSNorm of consecutive rows of `w.len()` columns.
    fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) = rms_norm_rows_body;
}

/// cos/sin of every rotary pair at each distinct position of a batch.
pub(crate) struct RopeTable {
    /// What the table is for (a batch holds one per RoPE config it meets).
    pub rope: RopeConfig,
    /// `[distinct position][rotary_dim / 2]`
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
}

impl RopeTable {
    /// `positions` are the batch's distinct positions; row `i` of the table is `positions[i]`.
    pub fn new(rope: RopeConfig, positions: &[u32]) -> Self {
        let half = rope.rotary_dim / 2;
        let (inv_freq, scale) = (rope.inv_freq(), rope.attention_scaling());
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &pos in positions {
            for &f in &inv_freq {
                let (s, c) = (pos as f64 * f).sin_cos();
                cos.push((c * scale) as f32);
                sin.push((s * scale) as f32);
            }
        }
        RopeTable { rope, cos, sin }
    }
}

#[inline(always)]
fn rotate(head: &mut [f32], cos: &[f32], sin: &[f32], layout: RopeLayout) {
    let half = cos.len();
    match layout {
        RopeLayout::Interleaved => {
            for (i, (&c, &s)) in cos.iter().zip(sin).enumerate() {
                let (a, b) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = a * c - b * s;
                head[2 * i + 1] = a * s + b * c;
            }
        }
        RopeLayout::HalfSplit => {
            let (lo, hi) = head[..2 * half].split_at_mut(half);
            for i in 0..half {
                let (a, b) = (lo[i], hi[i]);
                lo[i] = a * cos[i] - b * sin[i];
                hi[i] = a * sin[i] + b * cos[i];
            }
        }
    }
}

/// Per-call arguments of [`qk_norm_rope_rows`] that are the same for every row.
pub(crate) struct QkNormRope<'a> {
    pub layout: QkvLayout,
    pub q_norm: Option<&'a [f32]>,
    pub k_norm: Option<&'a [f32]>,
    pub eps: f32,
    pub rope: RopeConfig,
    pub table: &'a RopeTable,
}

#[inline(always)]
fn qk_norm_rope_rows_body(qkv: &mut [f32], table_rows: &[u32], args: &QkNormRope) {
    let l = args.layout;
    let (hd, half) = (l.head_dim, args.rope.rotary_dim / 2);
    for (row, &t) in qkv.chunks_exact_mut(l.qkv_dim()).zip(table_rows) {
        let cos = &args.table.cos[t as usize * half..][..half];
        let sin = &args.table.sin[t as usize * half..][..half];
        let (q, rest) = row.split_at_mut(l.q_dim());
        let k = &mut rest[..l.kv_dim()];
        for (heads, norm) in [(q, args.q_norm), (k, args.k_norm)] {
            for head in heads.chunks_exact_mut(hd) {
                if let Some(w) = norm {
                    rms_norm_in_place(head, w, args.eps);
                }
                rotate(head, cos, sin, args.rope.layout);
            }
        }
    }
}

isa_variants! {
    /// q/k norm and RoPE of consecutive fused-QKV rows; `table_rows[i]` is row i's table row.
    fn qk_norm_rope_rows(qkv: &mut [f32], table_rows: &[u32], args: &QkNormRope) = qk_norm_rope_rows_body;
}
