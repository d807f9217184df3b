//! Causal GQA attention over paged K/V.
//!
//! Work item = (sequence, kv head, block of query rows). An item gathers its context's K
//! (transposed, `[head_dim][keys]`) and V (`[keys][head_dim]`) into contiguous scratch once, then
//! serves every query head of the GQA group for each of its rows.
//!
//! Determinism: a query row at logical position `pos` visits keys `0..=pos` in logical order. The
//! score of a key is one chain over head_dim; keys are vectorised in chunks of 16 anchored at
//! position 0; lanes past `pos` are replaced (not multiplied) by -inf / 0, so they contribute
//! exact zeros (as do terms below e^-80 of the largest, which are flushed to avoid subnormals);
//! the softmax sum is a fixed lane order plus a fixed tree; `P·V` is one chain over `0..=pos` per
//! output element. Nothing depends on q_len, on the keys after `pos`, on where the
//! K/V physically live (shared prefix or own blocks), or on the work split.

use rayon::prelude::*;

use crate::backend::{AttnSeq, QkvLayout};

use super::isa::Isa;
use super::math::{self, LANES};
use super::scratch::ScratchPool;
use super::shared_out::SharedOut;

/// Query rows per work item: small enough to spread one long sequence over the threads, large
/// enough that the gather is amortised over many rows.
const ROWS_PER_ITEM: usize = 64;
/// Most query heads whose scores one QK call computes together.
const QK_HEADS: usize = 6;

/// Everything attention reads, for one layer.
pub(crate) struct AttnInputs<'a> {
    pub qkv: &'a [f32],
    pub layout: QkvLayout,
    /// The layer's K and V: `[slot][n_kv_heads][head_dim]`.
    pub k_cache: &'a [f32],
    pub v_cache: &'a [f32],
    pub seqs: &'a [AttnSeq],
    pub key_slots: &'a [u32],
}

#[derive(Clone, Copy)]
struct WorkItem {
    seq: usize,
    kv_head: usize,
    /// Query rows `q0..q1` of the sequence (0 = its first query row).
    q0: usize,
    q1: usize,
}

/// A reusable buffer handing out 64-byte-aligned slices (vector loads never split a cache line).
#[derive(Default)]
struct Aligned(Vec<f32>);

impl Aligned {
    /// `len` initialised values starting on a 64-byte boundary; contents are left from earlier use.
    fn slice(&mut self, len: usize) -> &mut [f32] {
        if self.0.len() < len + LANES {
            self.0.resize(len + LANES, 0.0);
        }
        let off = self.0.as_ptr().align_offset(64).min(LANES - 1);
        &mut self.0[off..off + len]
    }
}

/// Buffers of one attention work item (kept per thread by the backend).
#[derive(Default)]
pub(crate) struct Scratch {
    /// K of the context, transposed: `[head_dim][ctx_padded]`.
    kt: Aligned,
    /// V of the context: `[ctx][head_dim]`.
    v: Aligned,
    /// Scores, then probabilities, of the group's heads for one row: `[group][ctx_padded]`.
    scores: Aligned,
    /// Inverse softmax sums of the group's heads.
    inv: Vec<f32>,
    /// Accumulator of the portable P·V.
    acc: Vec<f32>,
}

/// Shapes were checked by the caller; `out` is `[rows, n_heads * head_dim]`.
pub(crate) fn attention(
    pool: &rayon::ThreadPool,
    scratch: &ScratchPool<Scratch>,
    threads: usize,
    isa: Isa,
    inp: &AttnInputs,
    out: &mut [f32],
) {
    let l = inp.layout;
    let mut items = Vec::new();
    for (si, s) in inp.seqs.iter().enumerate() {
        for kv_head in 0..l.n_kv_heads {
            for q0 in (0..s.q_len as usize).step_by(ROWS_PER_ITEM) {
                items.push(WorkItem { seq: si, kv_head, q0, q1: (q0 + ROWS_PER_ITEM).min(s.q_len as usize) });
            }
        }
    }
    // Longest contexts first, so the big items do not end up last on one thread.
    items.sort_by_key(|it| std::cmp::Reverse(context_len(&inp.seqs[it.seq], it.q1)));
    // Shared by the threads: work items write disjoint (row, head) ranges of the output.
    let out = SharedOut(out.as_mut_ptr());
    let run = |it: &WorkItem| scratch.with(|s| run_item(isa, inp, it, s, out.ptr()));
    if threads > 1 && items.len() > 1 {
        pool.install(|| items.par_iter().for_each(run));
    } else {
        items.iter().for_each(run);
    }
}

/// Keys visible to the last of the first `q_end` query rows of `s`.
fn context_len(s: &AttnSeq, q_end: usize) -> usize {
    (s.ctx_len - s.q_len) as usize + q_end
}

fn run_item(isa: Isa, inp: &AttnInputs, it: &WorkItem, scratch: &mut Scratch, out: *mut f32) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the ISA was checked at backend construction; `out` is the caller's output.
        Isa::Avx512 => unsafe { x86::run_item_avx512(inp, it, scratch, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { x86::run_item_avx2(inp, it, scratch, out) },
        // SAFETY: `out` is the caller's output.
        _ => unsafe { run_item_body::<Portable>(inp, it, scratch, out) },
    }
}

/// The two inner loops, by ISA.
trait Kernels {
    /// Raw scores `s[h][c*16 + l] = Σ_d q_h[d] · kt[d][c*16 + l]` for `heads` heads (q rows
    /// `head_dim` apart) and `chunks` chunks of 16 keys. The chain over d is in order.
    #[allow(clippy::too_many_arguments)]
    unsafe fn qk(
        heads: usize,
        chunks: usize,
        q: *const f32,
        hd: usize,
        kt: *const f32,
        ctxp: usize,
        s: *mut f32,
        scratch_acc: &mut Vec<f32>,
    );
    /// `o_h[d] = inv_h · Σ_{p<n} e_h[p] · v[p][d]` for `heads` heads (`e` rows `estride` apart,
    /// outputs `hd` apart). The chain over p is in order.
    #[allow(clippy::too_many_arguments)]
    unsafe fn pv(
        heads: usize,
        e: *const f32,
        estride: usize,
        v: *const f32,
        hd: usize,
        n: usize,
        o: *mut f32,
        inv: *const f32,
        scratch_acc: &mut Vec<f32>,
    );
    /// Most heads one `pv` call takes for this head_dim.
    fn pv_heads(hd: usize) -> usize;
    /// `kt[d][p] = k_cache[slots[p] * kvd + off + d]` for `p < slots.len()`, `d < hd`.
    #[inline(always)]
    unsafe fn gather_kt(
        kt: &mut [f32],
        ctxp: usize,
        k_cache: &[f32],
        slots: &[u32],
        kvd: usize,
        off: usize,
        hd: usize,
    ) {
        for (p, &slot) in slots.iter().enumerate() {
            let base = slot as usize * kvd + off;
            for (d, &kd) in k_cache[base..base + hd].iter().enumerate() {
                kt[d * ctxp + p] = kd;
            }
        }
    }
}

struct Portable;

impl Kernels for Portable {
    #[inline(always)]
    unsafe fn qk(
        heads: usize,
        chunks: usize,
        q: *const f32,
        hd: usize,
        kt: *const f32,
        ctxp: usize,
        s: *mut f32,
        _: &mut Vec<f32>,
    ) {
        for h in 0..heads {
            for c in 0..chunks {
                let mut acc = [0f32; LANES];
                for d in 0..hd {
                    let qd = *q.add(h * hd + d);
                    let k = &*(kt.add(d * ctxp + c * LANES) as *const [f32; LANES]);
                    for l in 0..LANES {
                        acc[l] += qd * k[l];
                    }
                }
                *(s.add(h * ctxp + c * LANES) as *mut [f32; LANES]) = acc;
            }
        }
    }

    #[inline(always)]
    unsafe fn pv(
        heads: usize,
        e: *const f32,
        estride: usize,
        v: *const f32,
        hd: usize,
        n: usize,
        o: *mut f32,
        inv: *const f32,
        acc: &mut Vec<f32>,
    ) {
        acc.clear();
        acc.resize(hd, 0.0);
        for h in 0..heads {
            acc.fill(0.0);
            for p in 0..n {
                let ep = *e.add(h * estride + p);
                let vp = std::slice::from_raw_parts(v.add(p * hd), hd);
                for (a, &vd) in acc.iter_mut().zip(vp) {
                    *a += ep * vd;
                }
            }
            let inv = *inv.add(h);
            for (d, &a) in acc.iter().enumerate() {
                *o.add(h * hd + d) = a * inv;
            }
        }
    }

    fn pv_heads(_: usize) -> usize {
        usize::MAX
    }
}

/// Softmax of one head's raw scores in place over `n_valid` keys (padded to whole chunks):
/// leaves `e^(s·scale - max)` (0 past `n_valid`) and returns `1 / Σ e`. Full chunks and the
/// masked last chunk are separate loops, written with selects so that both vectorise.
#[inline(always)]
fn softmax_in_place(s: &mut [f32], n_valid: usize, scale: f32) -> f32 {
    let full = n_valid / LANES;
    let tail = n_valid % LANES;
    let mut max = [f32::NEG_INFINITY; LANES];
    for (c, chunk) in s.chunks_exact_mut(LANES).enumerate() {
        let chunk: &mut [f32; LANES] = chunk.try_into().unwrap_or_else(|_| unreachable!());
        let valid = if c < full { LANES } else { tail };
        for l in 0..LANES {
            let x = if l < valid { chunk[l] * scale } else { f32::NEG_INFINITY };
            chunk[l] = x;
            max[l] = if x > max[l] { x } else { max[l] };
        }
    }
    let m = max.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
    let mut sum = [0f32; LANES];
    for (c, chunk) in s.chunks_exact_mut(LANES).enumerate() {
        let chunk: &mut [f32; LANES] = chunk.try_into().unwrap_or_else(|_| unreachable!());
        let valid = if c < full { LANES } else { tail };
        for l in 0..LANES {
            let x = chunk[l] - m;
            // Terms below e^-80 (relative to the largest, 1) are flushed to an exact 0: they are
            // invisible in the sum, and as subnormal products in P·V they would cost microcode
            // assists on x86.
            let e = if l < valid && x > -80.0 { math::exp(x) } else { 0.0 };
            chunk[l] = e;
            sum[l] += e;
        }
    }
    1.0 / math::reduce_sum(sum)
}

/// Splits `n` heads into at most `per_call`-sized near-equal blocks: `(first, count)`.
#[inline(always)]
fn head_blocks(n: usize, per_call: usize) -> impl Iterator<Item = (usize, usize)> {
    let blocks = n.div_ceil(per_call.max(1));
    let base = n / blocks.max(1);
    let extra = n % blocks.max(1);
    (0..blocks).scan(0usize, move |start, b| {
        let count = base + usize::from(b < extra);
        let first = *start;
        *start += count;
        Some((first, count))
    })
}

#[inline(always)]
unsafe fn run_item_body<K: Kernels>(inp: &AttnInputs, it: &WorkItem, scratch: &mut Scratch, out: *mut f32) {
    let l = inp.layout;
    let (hd, kvd, qkv_dim, q_dim) = (l.head_dim, l.kv_dim(), l.qkv_dim(), l.q_dim());
    let group = l.n_heads / l.n_kv_heads;
    let s = &inp.seqs[it.seq];
    let n_ctx = context_len(s, it.q1);
    let chunks = n_ctx.div_ceil(LANES);
    let ctxp = chunks * LANES;
    let slots = &inp.key_slots[s.slot_offset as usize..][..n_ctx];

    // Gather the context's K (transposed) and V for this kv head.
    let Scratch { kt, v, scores, inv, acc } = scratch;
    let kt = kt.slice(hd * ctxp);
    let v = v.slice(n_ctx * hd);
    K::gather_kt(kt, ctxp, inp.k_cache, slots, kvd, it.kv_head * hd, hd);
    for (p, &slot) in slots.iter().enumerate() {
        let base = slot as usize * kvd + it.kv_head * hd;
        v[p * hd..(p + 1) * hd].copy_from_slice(&inp.v_cache[base..base + hd]);
    }
    let scores = scores.slice(group * ctxp);
    inv.resize(group, 0.0);
    let scale = (1.0 / (hd as f64).sqrt()) as f32;

    for qi in it.q0..it.q1 {
        let row = s.q_row as usize + qi;
        let n_valid = context_len(s, qi + 1);
        let row_chunks = n_valid.div_ceil(LANES);
        let q_head0 = inp.qkv[row * qkv_dim + it.kv_head * group * hd..].as_ptr();
        for (h0, hb) in head_blocks(group, QK_HEADS) {
            let mut c = 0;
            while c < row_chunks {
                let ch = match row_chunks - c {
                    1 => 1,
                    2 | 3 => 2,
                    _ => 4,
                };
                K::qk(
                    hb,
                    ch,
                    q_head0.add(h0 * hd),
                    hd,
                    kt[c * LANES..].as_ptr(),
                    ctxp,
                    scores[h0 * ctxp + c * LANES..].as_mut_ptr(),
                    acc,
                );
                c += ch;
            }
        }
        for h in 0..group {
            inv[h] = softmax_in_place(&mut scores[h * ctxp..h * ctxp + row_chunks * LANES], n_valid, scale);
        }
        let o_head0 = out.add(row * q_dim + it.kv_head * group * hd);
        for (h0, hb) in head_blocks(group, K::pv_heads(hd)) {
            K::pv(
                hb,
                scores[h0 * ctxp..].as_ptr(),
                ctxp,
                v.as_ptr(),
                hd,
                n_valid,
                o_head0.add(h0 * hd),
                inv[h0..].as_ptr(),
                acc,
            );
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
    pub(super) unsafe fn run_item_avx512(inp: &AttnInputs, it: &WorkItem, scratch: &mut Scratch, out: *mut f32) {
        run_item_body::<Avx512>(inp, it, scratch, out)
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn run_item_avx2(inp: &AttnInputs, it: &WorkItem, scratch: &mut Scratch, out: *mut f32) {
        run_item_body::<Portable>(inp, it, scratch, out)
    }

    struct Avx512;

    #[target_feature(enable = "avx512f")]
    unsafe fn qk_tile<const HB: usize, const CH: usize>(
        q: *const f32,
        hd: usize,
        kt: *const f32,
        ctxp: usize,
        s: *mut f32,
    ) {
        let mut acc = [[_mm512_setzero_ps(); CH]; HB];
        for d in 0..hd {
            let mut k = [_mm512_setzero_ps(); CH];
            for (c, k) in k.iter_mut().enumerate() {
                *k = _mm512_loadu_ps(kt.add(d * ctxp + c * LANES));
            }
            for (h, acc) in acc.iter_mut().enumerate() {
                let qd = _mm512_set1_ps(*q.add(h * hd + d));
                for c in 0..CH {
                    acc[c] = _mm512_fmadd_ps(qd, k[c], acc[c]);
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            for (c, &a) in acc.iter().enumerate() {
                _mm512_storeu_ps(s.add(h * ctxp + c * LANES), a);
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn pv_tile<const HB: usize, const DV: usize>(
        e: *const f32,
        estride: usize,
        v: *const f32,
        n: usize,
        o: *mut f32,
        inv: *const f32,
    ) {
        let hd = DV * LANES;
        let mut acc = [[_mm512_setzero_ps(); DV]; HB];
        for p in 0..n {
            let mut vv = [_mm512_setzero_ps(); DV];
            for (j, vv) in vv.iter_mut().enumerate() {
                *vv = _mm512_loadu_ps(v.add(p * hd + j * LANES));
            }
            for (h, acc) in acc.iter_mut().enumerate() {
                let ep = _mm512_set1_ps(*e.add(h * estride + p));
                for j in 0..DV {
                    acc[j] = _mm512_fmadd_ps(ep, vv[j], acc[j]);
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            let s = _mm512_set1_ps(*inv.add(h));
            for (j, &a) in acc.iter().enumerate() {
                _mm512_storeu_ps(o.add(h * hd + j * LANES), _mm512_mul_ps(a, s));
            }
        }
    }

    macro_rules! qk_table {
        ($hb:expr, $ch:expr; $( $h:literal ),*) => {
            match ($hb, $ch) {
                $( ($h, 1) => qk_tile::<$h, 1> as QkFn, ($h, 2) => qk_tile::<$h, 2> as QkFn, ($h, 4) => qk_tile::<$h, 4> as QkFn, )*
                _ => unreachable!("qk tile {}x{}", $hb, $ch),
            }
        };
    }
    type QkFn = unsafe fn(*const f32, usize, *const f32, usize, *mut f32);
    type PvFn = unsafe fn(*const f32, usize, *const f32, usize, *mut f32, *const f32);

    fn pv_fn(heads: usize, dv: usize) -> Option<PvFn> {
        Some(match (heads, dv) {
            (1, 2) => pv_tile::<1, 2>,
            (2, 2) => pv_tile::<2, 2>,
            (3, 2) => pv_tile::<3, 2>,
            (4, 2) => pv_tile::<4, 2>,
            (5, 2) => pv_tile::<5, 2>,
            (6, 2) => pv_tile::<6, 2>,
            (7, 2) => pv_tile::<7, 2>,
            (8, 2) => pv_tile::<8, 2>,
            (1, 4) => pv_tile::<1, 4>,
            (2, 4) => pv_tile::<2, 4>,
            (3, 4) => pv_tile::<3, 4>,
            (4, 4) => pv_tile::<4, 4>,
            (5, 4) => pv_tile::<5, 4>,
            (6, 4) => pv_tile::<6, 4>,
            (1, 6) => pv_tile::<1, 6>,
            (2, 6) => pv_tile::<2, 6>,
            (3, 6) => pv_tile::<3, 6>,
            (4, 6) => pv_tile::<4, 6>,
            (1, 8) => pv_tile::<1, 8>,
            (2, 8) => pv_tile::<2, 8>,
            (3, 8) => pv_tile::<3, 8>,
            _ => return None,
        })
    }

    impl Kernels for Avx512 {
        #[inline(always)]
        unsafe fn qk(
            heads: usize,
            chunks: usize,
            q: *const f32,
            hd: usize,
            kt: *const f32,
            ctxp: usize,
            s: *mut f32,
            _: &mut Vec<f32>,
        ) {
            let f = qk_table!(heads, chunks; 1, 2, 3, 4, 5, 6);
            f(q, hd, kt, ctxp, s)
        }

        #[inline(always)]
        unsafe fn pv(
            heads: usize,
            e: *const f32,
            estride: usize,
            v: *const f32,
            hd: usize,
            n: usize,
            o: *mut f32,
            inv: *const f32,
            acc: &mut Vec<f32>,
        ) {
            match hd.is_multiple_of(LANES).then(|| pv_fn(heads, hd / LANES)).flatten() {
                Some(f) => f(e, estride, v, n, o, inv),
                None => Portable::pv(heads, e, estride, v, hd, n, o, inv, acc),
            }
        }

        /// 16 keys at a time with a masked gather per dimension (offsets fit i32: checked).
        #[inline(always)]
        unsafe fn gather_kt(
            kt: &mut [f32],
            ctxp: usize,
            k_cache: &[f32],
            slots: &[u32],
            kvd: usize,
            off: usize,
            hd: usize,
        ) {
            if k_cache.len() > i32::MAX as usize {
                return Portable::gather_kt(kt, ctxp, k_cache, slots, kvd, off, hd);
            }
            for (c, keys) in slots.chunks(LANES).enumerate() {
                let mut idx = [0i32; LANES];
                for (i, &slot) in keys.iter().enumerate() {
                    idx[i] = (slot as usize * kvd + off) as i32;
                }
                let idx = _mm512_loadu_si512(idx.as_ptr() as *const _);
                let mask: __mmask16 = if keys.len() == LANES { 0xffff } else { (1u16 << keys.len()) - 1 };
                let dst = kt[c * LANES..].as_mut_ptr();
                for d in 0..hd {
                    let k = _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), mask, idx, k_cache.as_ptr().add(d));
                    _mm512_storeu_ps(dst.add(d * ctxp), k);
                }
            }
        }

        fn pv_heads(hd: usize) -> usize {
            match hd {
                32 => 8,
                64 => 6,
                96 => 4,
                128 => 3,
                _ => usize::MAX,
            }
        }
    }
}
