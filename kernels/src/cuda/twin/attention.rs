//! Twin of kernels/cuda/attention.cu (`attention_prefill`): the same tile schedule, key tiles,
//! per-warp row ownership, lane-per-key scores and online-softmax update order.

use super::warp::{from_bf16, warp_max, warp_sum};
use crate::cuda::sources::consts::{ATT_BK, ATT_BQ, ATT_ROWS_PER_WARP, ATT_THREADS};

/// Arguments of one `attention_prefill` launch (pools are the layer's slices).
#[derive(Debug, Clone, Copy)]
pub struct AttentionArgs<'a> {
    pub qkv: &'a [f32],
    pub k_pool: &'a [u16],
    pub v_pool: &'a [u16],
    /// 4 words per sequence: q_row, q_len, ctx_len, slot_offset.
    pub seqs: &'a [u32],
    pub key_slots: &'a [u32],
    /// 2 words per tile: sequence, first query index.
    pub q_tiles: &'a [u32],
    pub qkv_cols: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
}

/// grid (num_q_tiles, n_heads).
pub fn attention_prefill(a: AttentionArgs<'_>, out: &mut [f32]) {
    let (bq, bk) = (ATT_BQ as usize, ATT_BK as usize);
    let warps = ATT_THREADS as usize / 32;
    let rows_per_warp = ATT_ROWS_PER_WARP as usize;
    let hd = a.head_dim;
    let kv_dim = a.n_kv_heads * hd;
    let group = a.n_heads / a.n_kv_heads;
    for tile in 0..a.q_tiles.len() / 2 {
        for h in 0..a.n_heads {
            let (seq, q_start) = (a.q_tiles[2 * tile] as usize, a.q_tiles[2 * tile + 1]);
            let s = &a.seqs[4 * seq..4 * seq + 4];
            let (q_row, q_len, ctx_len, slot_offset) = (s[0], s[1], s[2], s[3] as usize);
            let kvh = h / group;
            let first_pos = ctx_len - q_len;
            let rows_here = (bq as u32).min(q_len - q_start);
            let last_pos = first_pos + q_start + rows_here - 1;
            let n_key_tiles = (last_pos + bk as u32) / bk as u32;

            let mut q_s = vec![0f32; bq * hd];
            for (i, q) in q_s.iter_mut().enumerate() {
                let (r, d) = ((i / hd) as u32, i % hd);
                if r < rows_here {
                    *q = a.qkv[(q_row + q_start + r) as usize * a.qkv_cols + h * hd + d];
                }
            }
            let mut m = vec![f32::NEG_INFINITY; bq];
            let mut l = vec![0f32; bq];
            let mut o = vec![0f32; bq * hd];
            let (mut k_s, mut v_s) = (vec![0u16; bk * hd], vec![0u16; bk * hd]);

            for kt in 0..n_key_tiles {
                let key0 = kt * bk as u32;
                for j in 0..bk {
                    let p = key0 + j as u32;
                    for d in 0..hd {
                        let (kw, vw) = if p <= last_pos {
                            let off = a.key_slots[slot_offset + p as usize] as usize * kv_dim + kvh * hd;
                            (a.k_pool[off + d], a.v_pool[off + d])
                        } else {
                            (0, 0)
                        };
                        k_s[j * hd + d] = kw;
                        v_s[j * hd + d] = vw;
                    }
                }
                for warp in 0..warps {
                    for r in 0..rows_per_warp {
                        let qi = warp * rows_per_warp + r;
                        let qpos = first_pos + q_start + qi as u32;
                        if qi as u32 >= rows_here || key0 > qpos {
                            continue;
                        }
                        let q = &q_s[qi * hd..(qi + 1) * hd];
                        let s: [f32; 32] = std::array::from_fn(|lane| {
                            let p = key0 + lane as u32;
                            if p > qpos {
                                return f32::NEG_INFINITY;
                            }
                            let kr = &k_s[lane * hd..(lane + 1) * hd];
                            let mut dot = 0f32;
                            for d2 in 0..hd / 2 {
                                dot = q[2 * d2].mul_add(from_bf16(kr[2 * d2]), dot);
                                dot = q[2 * d2 + 1].mul_add(from_bf16(kr[2 * d2 + 1]), dot);
                            }
                            dot * a.scale
                        });
                        let m_new = m[qi].max(warp_max(s));
                        let pj: [f32; 32] =
                            std::array::from_fn(
                                |lane| if key0 + lane as u32 <= qpos { (s[lane] - m_new).exp() } else { 0.0 },
                            );
                        let alpha = (m[qi] - m_new).exp();
                        l[qi] = l[qi].mul_add(alpha, warp_sum(pj));
                        m[qi] = m_new;
                        let orow = &mut o[qi * hd..(qi + 1) * hd];
                        for v in orow.iter_mut() {
                            *v *= alpha;
                        }
                        let n_keys = (bk as u32).min(qpos - key0 + 1) as usize;
                        for (j, &pb) in pj.iter().enumerate().take(n_keys) {
                            let vr = &v_s[j * hd..(j + 1) * hd];
                            for (ov, &vv) in orow.iter_mut().zip(vr) {
                                *ov = pb.mul_add(from_bf16(vv), *ov);
                            }
                        }
                    }
                }
            }
            let q_dim = a.n_heads * hd;
            for qi in 0..rows_here as usize {
                let dst = (q_row + q_start) as usize + qi;
                let inv_l = 1.0f32 / l[qi];
                for d in 0..hd {
                    out[dst * q_dim + h * hd + d] = o[qi * hd + d] * inv_l;
                }
            }
        }
    }
}
