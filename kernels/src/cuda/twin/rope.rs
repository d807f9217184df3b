//! Twin of kernels/cuda/rope.cu (`rope_table`, `qk_norm_rope`) and rope.cuh (`norm_rope_head`).

use super::warp::{to_bf16, warp_sum};
use crate::cuda::sources::consts::ROPE_THREADS;
use crate::RopeConfig;

/// Arguments of one `qk_norm_rope` launch.
#[derive(Debug, Clone, Copy)]
pub struct QkNormRopeArgs<'a> {
    pub qkv_cols: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub eps: f32,
    pub q_norm: Option<&'a [f32]>,
    pub k_norm: Option<&'a [f32]>,
    /// The angle table ([`rope_table`]), covering every row's position.
    pub rope_cs: &'a [f64],
    pub rotary_dim: usize,
    pub interleaved: bool,
}

/// The K/V write fused into `qk_norm_rope` (a non-null `k_pool`): the layer's pools and each
/// row's slot.
pub struct KvOut<'a> {
    pub row_slots: &'a [u32],
    pub k_pool: &'a mut [u16],
    pub v_pool: &'a mut [u16],
}

/// `rope_table`: row p is cos(p · inv_freq[i]) for the rotary_dim / 2 pairs i, then their sin,
/// in double, times `scale` (`inv_freq` and `scale`: [`RopeConfig::inv_freq`] and
/// [`RopeConfig::attention_scaling`], passed by the host).
pub fn rope_table(rope: RopeConfig, n_pos: usize) -> Vec<f64> {
    rope_table_rows(rope, n_pos, 0..n_pos)
}

/// The `n_pos` rows of [`rope_table`], computed only at `positions` (the rest zero): what a
/// launch reads of it, without the cost of every row up to a large position.
pub fn rope_table_rows(rope: RopeConfig, n_pos: usize, positions: impl IntoIterator<Item = usize>) -> Vec<f64> {
    let (inv_freq, scale) = (rope.inv_freq(), rope.attention_scaling());
    let (half, rotary_dim) = (inv_freq.len(), 2 * inv_freq.len());
    let mut cs = vec![0f64; n_pos * rotary_dim];
    for p in positions {
        for (i, &f) in inv_freq.iter().enumerate() {
            let (s, c) = (p as f64 * f).sin_cos();
            cs[p * rotary_dim + i] = c * scale;
            cs[p * rotary_dim + half + i] = s * scale;
        }
    }
    cs
}

/// rope.cuh's `norm_rope_head` on one head: optional RMSNorm (lane-strided fmaf + warp_sum),
/// then the rotation by the row's table row `cs`, in double, rounded once.
pub(crate) fn norm_rope_head(
    buf: &mut [f32],
    w: Option<&[f32]>,
    eps: f32,
    cs: &[f64],
    rotary_dim: usize,
    interleaved: bool,
) {
    let hd = buf.len();
    if let Some(w) = w {
        let lanes: [f32; 32] = std::array::from_fn(|lane| {
            let mut acc = 0f32;
            let mut d = lane;
            while d < hd {
                acc = buf[d].mul_add(buf[d], acc);
                d += 32;
            }
            acc
        });
        let inv = 1.0f32 / (warp_sum(lanes) / hd as f32 + eps).sqrt();
        for d in 0..hd {
            buf[d] = (buf[d] * inv) * w[d];
        }
    }
    let half = rotary_dim / 2;
    for i in 0..half {
        let (ia, ib) = if interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
        let (x0, x1) = (buf[ia] as f64, buf[ib] as f64);
        let (c, s) = (cs[i], cs[half + i]);
        buf[ia] = (x0 * c - x1 * s) as f32;
        buf[ib] = (x0 * s + x1 * c) as f32;
    }
}

/// grid (rows), block ROPE_THREADS: the row's heads staged in shared memory (in chunks of
/// `rope_chunk_heads`), warp w takes a chunk's heads w, w + 4, ...: `norm_rope_head` at the row's
/// table row, then the heads stored back. A head's bits depend on nothing but its own values, so
/// the twin replays the heads in order.
pub fn qk_norm_rope(qkv: &mut [f32], positions: &[u32], a: QkNormRopeArgs<'_>) {
    qk_norm_rope_kv(qkv, positions, a, None)
}

/// `qk_norm_rope` with its K/V write (`kv` is `Some`): the row's v heads to the V pool, each
/// rotated k head to the K pool, bf16 at the row's slot.
pub fn qk_norm_rope_kv(qkv: &mut [f32], positions: &[u32], a: QkNormRopeArgs<'_>, mut kv: Option<KvOut<'_>>) {
    let hd = a.head_dim;
    let warps = ROPE_THREADS as usize / 32;
    for (row, &pos) in positions.iter().enumerate() {
        let cs = &a.rope_cs[pos as usize * a.rotary_dim..(pos as usize + 1) * a.rotary_dim];
        let row_vals = &mut qkv[row * a.qkv_cols..(row + 1) * a.qkv_cols];
        let (q_dim, kv_dim) = (a.n_heads * hd, a.n_kv_heads * hd);
        let slot = kv.as_ref().map_or(0, |kv| kv.row_slots[row] as usize);
        if let Some(kv) = kv.as_mut() {
            for j in 0..kv_dim {
                kv.v_pool[slot * kv_dim + j] = to_bf16(row_vals[q_dim + kv_dim + j]);
            }
        }
        // Warps are independent (disjoint heads); replay them one after another.
        for warp in 0..warps {
            let mut h = warp;
            while h < a.n_heads + a.n_kv_heads {
                let is_q = h < a.n_heads;
                let off = if is_q { h * hd } else { a.n_heads * hd + (h - a.n_heads) * hd };
                let w = if is_q { a.q_norm } else { a.k_norm };
                let mut buf = row_vals[off..off + hd].to_vec();
                norm_rope_head(&mut buf, w, a.eps, cs, a.rotary_dim, a.interleaved);
                row_vals[off..off + hd].copy_from_slice(&buf);
                if let (false, Some(kv)) = (is_q, kv.as_mut()) {
                    let k_dst = slot * kv_dim + (h - a.n_heads) * hd;
                    for (d, &v) in buf.iter().enumerate() {
                        kv.k_pool[k_dst + d] = to_bf16(v);
                    }
                }
                h += warps;
            }
        }
    }
}
