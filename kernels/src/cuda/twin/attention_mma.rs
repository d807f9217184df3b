//! Twin of kernels/cuda/attention_mma.cu (`attention_mma_hd*`), down to the fragments: the bf16
//! query tile and K/V tiles in the kernel's padded shared layout, each lane's registers read with
//! the kernel's index expressions (plain words for Q, `ldmatrix` for K, `ldmatrix.trans` for V), the score
//! and output mmas, the masked base-2 online softmax with its quad butterflies, and the state
//! the shared pass leaves for the own pass. Units and flags as the host schedule builds them
//! (`layout::AttentionSchedule`).

use super::fragments::{ldmatrix_x4, ldmatrix_x4_trans, mma_m16n8k16, pack, AFrag, BFrag, CFrag};
use super::warp::to_bf16;
use crate::cuda::layout::ATTN_UNIT_WORDS;
use crate::cuda::sources::consts::{AMMA_BK, AMMA_BQ, AMMA_CAUSAL, AMMA_LOAD_STATE, AMMA_PAD, AMMA_STORE_STATE};

/// Arguments of one `attention_mma_hd*` launch (pools are the layer's slices).
#[derive(Debug, Clone, Copy)]
pub struct AttentionMmaArgs<'a> {
    pub qkv: &'a [f32],
    pub k_pool: &'a [u16],
    pub v_pool: &'a [u16],
    /// 4 words per sequence: q_row, q_len, ctx_len, slot_offset.
    pub seqs: &'a [u32],
    pub key_slots: &'a [u32],
    /// The schedule's row list.
    pub rows: &'a [u32],
    pub qkv_cols: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// `scale · log2(e)`: scores are exponentiated in base 2.
    pub scale_log2: f32,
}

fn pack_f32(lo: f32, hi: f32) -> u32 {
    pack(to_bf16(lo), to_bf16(hi))
}

/// `__shfl_xor_sync` butterfly over each quad (xor 1, then 2) with `op`.
fn quad_reduce(v: &mut [f32; 32], op: impl Fn(f32, f32) -> f32) {
    for mask in [1, 2] {
        let prev = *v;
        for lane in 0..32 {
            v[lane] = op(prev[lane], prev[lane ^ mask]);
        }
    }
}

/// One launch: grid (units, n_heads). `ml` holds (m, l) per (row, head). With `out_bf16` (the
/// O projection's operand) the own pass stores its rows there, rounded once, and `out` holds
/// only the shared passes' f32 state.
pub fn attention_mma(
    a: AttentionMmaArgs<'_>,
    units: &[u32],
    out: &mut [f32],
    ml: &mut [f32],
    mut out_bf16: Option<&mut [u16]>,
) {
    let (bq, bk, hd) = (AMMA_BQ as usize, AMMA_BK as usize, a.head_dim);
    let ld = hd + AMMA_PAD as usize;
    let (ksteps, nt_n, dt_n) = (hd / 16, bk / 8, hd / 8);
    let kv_dim = a.n_kv_heads * hd;
    let q_dim = a.n_heads * hd;
    for unit in units.chunks(ATTN_UNIT_WORDS) {
        let [seq, rows_begin, n_rows, kt_begin, kt_end, flags] = [0, 1, 2, 3, 4, 5].map(|i| unit[i] as usize);
        let s = &a.seqs[4 * seq..4 * seq + 4];
        let (q_row, q_len, ctx_len, slot_offset) = (s[0] as usize, s[1] as usize, s[2] as usize, s[3] as usize);
        let row_of = |r: usize| a.rows[rows_begin + r] as usize;
        for h in 0..a.n_heads {
            let kvh = h / (a.n_heads / a.n_kv_heads);
            let mut q_s = vec![0u16; bq * ld];
            for r in 0..n_rows {
                for d in 0..hd {
                    q_s[r * ld + d] = to_bf16(a.qkv[row_of(r) * a.qkv_cols + h * hd + d]);
                }
            }
            let word = |t: &[u16], i: usize| pack(t[i], t[i + 1]);
            for warp in 0..bq / 16 {
                if warp * 16 >= n_rows {
                    continue;
                }
                let rr = |lane: usize, x: usize| warp * 16 + (lane >> 2) + 8 * x;
                let qf: Vec<AFrag> = (0..ksteps)
                    .map(|ks| {
                        std::array::from_fn(|lane| {
                            let (r_lo, r_hi, c) = (rr(lane, 0), rr(lane, 1), ks * 16 + (lane & 3) * 2);
                            [
                                word(&q_s, r_lo * ld + c),
                                word(&q_s, r_hi * ld + c),
                                word(&q_s, r_lo * ld + c + 8),
                                word(&q_s, r_hi * ld + c + 8),
                            ]
                        })
                    })
                    .collect();
                let first_pos = ctx_len - q_len;
                let qpos = |lane: usize, x: usize| {
                    let r = rr(lane, x);
                    if flags & AMMA_CAUSAL as usize != 0 && r < n_rows {
                        first_pos + row_of(r) - q_row
                    } else {
                        usize::MAX
                    }
                };
                let mut m = [[f32::NEG_INFINITY; 2]; 32];
                let mut l = [[0f32; 2]; 32];
                let mut o: Vec<CFrag> = vec![[[0f32; 4]; 32]; dt_n];
                if flags & AMMA_LOAD_STATE as usize != 0 {
                    for lane in 0..32 {
                        for x in 0..2 {
                            let r = rr(lane, x);
                            if r >= n_rows {
                                continue;
                            }
                            let row = row_of(r);
                            m[lane][x] = ml[(row * a.n_heads + h) * 2];
                            l[lane][x] = ml[(row * a.n_heads + h) * 2 + 1];
                            for dt in 0..dt_n {
                                let src = row * q_dim + h * hd + dt * 8 + (lane & 3) * 2;
                                o[dt][lane][2 * x] = out[src];
                                o[dt][lane][2 * x + 1] = out[src + 1];
                            }
                        }
                    }
                }
                for kt in kt_begin..kt_end {
                    let (mut k_s, mut v_s) = (vec![0u16; bk * ld], vec![0u16; bk * ld]);
                    for j in 0..bk {
                        let p = kt * bk + j;
                        if p < ctx_len {
                            let off = a.key_slots[slot_offset + p] as usize * kv_dim + kvh * hd;
                            k_s[j * ld..j * ld + hd].copy_from_slice(&a.k_pool[off..off + hd]);
                            v_s[j * ld..j * ld + hd].copy_from_slice(&a.v_pool[off..off + hd]);
                        }
                    }
                    let mut s: Vec<CFrag> = vec![[[0f32; 4]; 32]; nt_n];
                    for ks in 0..ksteps {
                        for np in 0..nt_n / 2 {
                            let b = ldmatrix_x4(&k_s, |lane| {
                                (np * 16 + ((lane >> 4) << 3) + (lane & 7)) * ld + ks * 16 + ((lane >> 3) & 1) * 8
                            });
                            let (b0, b1): (BFrag, BFrag) = (
                                std::array::from_fn(|lane| [b[lane][0], b[lane][1]]),
                                std::array::from_fn(|lane| [b[lane][2], b[lane][3]]),
                            );
                            mma_m16n8k16(&mut s[2 * np], &qf[ks], &b0);
                            mma_m16n8k16(&mut s[2 * np + 1], &qf[ks], &b1);
                        }
                    }
                    let mut mx = [[f32::NEG_INFINITY; 32]; 2];
                    for (nt, snt) in s.iter_mut().enumerate() {
                        for lane in 0..32 {
                            for q in 0..4 {
                                let key = kt * bk + nt * 8 + (lane & 3) * 2 + (q & 1);
                                let v = &mut snt[lane][q];
                                *v = if key > qpos(lane, q >> 1) { f32::NEG_INFINITY } else { *v * a.scale_log2 };
                                mx[q >> 1][lane] = mx[q >> 1][lane].max(*v);
                            }
                        }
                    }
                    let mut base = [[0f32; 2]; 32];
                    let mut alpha = [[0f32; 2]; 32];
                    for x in 0..2 {
                        quad_reduce(&mut mx[x], f32::max);
                        for lane in 0..32 {
                            let m_new = m[lane][x].max(mx[x][lane]);
                            base[lane][x] = if m_new == f32::NEG_INFINITY { 0.0 } else { m_new };
                            alpha[lane][x] = (m[lane][x] - base[lane][x]).exp2();
                            m[lane][x] = m_new;
                        }
                    }
                    let mut sum = [[0f32; 32]; 2];
                    for snt in s.iter_mut() {
                        for lane in 0..32 {
                            for q in 0..4 {
                                let p = (snt[lane][q] - base[lane][q >> 1]).exp2();
                                snt[lane][q] = p;
                                sum[q >> 1][lane] += p;
                            }
                        }
                    }
                    for x in 0..2 {
                        quad_reduce(&mut sum[x], |u, v| u + v);
                        for lane in 0..32 {
                            l[lane][x] = l[lane][x] * alpha[lane][x] + sum[x][lane];
                        }
                    }
                    for odt in o.iter_mut() {
                        for lane in 0..32 {
                            for q in 0..4 {
                                odt[lane][q] *= alpha[lane][q >> 1];
                            }
                        }
                    }
                    for j in 0..bk / 16 {
                        let pa: AFrag = std::array::from_fn(|lane| {
                            let (s0, s1) = (&s[2 * j][lane], &s[2 * j + 1][lane]);
                            [
                                pack_f32(s0[0], s0[1]),
                                pack_f32(s0[2], s0[3]),
                                pack_f32(s1[0], s1[1]),
                                pack_f32(s1[2], s1[3]),
                            ]
                        });
                        for dp in 0..hd / 16 {
                            let b =
                                ldmatrix_x4_trans(&v_s, |lane| (j * 16 + (lane & 15)) * ld + dp * 16 + (lane >> 4) * 8);
                            let b_lo: BFrag = std::array::from_fn(|lane| [b[lane][0], b[lane][1]]);
                            let b_hi: BFrag = std::array::from_fn(|lane| [b[lane][2], b[lane][3]]);
                            mma_m16n8k16(&mut o[2 * dp], &pa, &b_lo);
                            mma_m16n8k16(&mut o[2 * dp + 1], &pa, &b_hi);
                        }
                    }
                }
                let store_state = flags & AMMA_STORE_STATE as usize != 0;
                for lane in 0..32 {
                    for x in 0..2 {
                        let r = rr(lane, x);
                        if r >= n_rows {
                            continue;
                        }
                        let row = row_of(r);
                        let inv_l = if store_state { 1.0 } else { 1.0 / l[lane][x] };
                        for dt in 0..dt_n {
                            let dst = row * q_dim + h * hd + dt * 8 + (lane & 3) * 2;
                            let (lo, hi) = (o[dt][lane][2 * x] * inv_l, o[dt][lane][2 * x + 1] * inv_l);
                            match out_bf16.as_deref_mut() {
                                Some(ob) if !store_state => (ob[dst], ob[dst + 1]) = (to_bf16(lo), to_bf16(hi)),
                                _ => (out[dst], out[dst + 1]) = (lo, hi),
                            }
                        }
                        if store_state && lane & 3 == 0 {
                            ml[(row * a.n_heads + h) * 2] = m[lane][x];
                            ml[(row * a.n_heads + h) * 2 + 1] = l[lane][x];
                        }
                    }
                }
            }
        }
    }
}
