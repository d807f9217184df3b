//! The CUDA kernels' CPU twins (kernels/src/cuda/twin), run as `TwinBackend`, against the f64
//! `ReferenceBackend`, with the block tables, slot maps and tile schedules a CUDA launch gets.
//!
//! Tolerances (relative to the largest reference value):
//! - `EXACT_INPUT_TOL` 2e-5: the reference is given the same bf16-rounded inputs the device
//!   holds (weights, K/V, the GEMM's activation), so only f32-vs-f64 accumulation differs.
//! - `BF16_TOL` 2e-2: against unrounded inputs — what bf16 storage costs.
//! - `MMA_ATTENTION_TOL` 1e-2: the tensor-core attention against a reference given its bf16 Q,
//!   K and V: what rounding the softmax probabilities to bf16 for the P·V mma costs.

mod common;
mod cuda_common;

use common::*;
use sieve_kernels::cuda::layout::{PackedBatch, Sharing};
use sieve_kernels::cuda::twin::{self, warp::round_bf16, TwinBackend};
use sieve_kernels::cuda::{AttentionEngine, GemmEngine};
use sieve_kernels::host::HostTensor;
use sieve_kernels::reference::ReferenceBackend;
use sieve_kernels::{Backend, BatchLayout, KernelError, QkvLayout, RopeConfig, RopeLayout};

const EXACT_INPUT_TOL: f32 = 2e-5;
const BF16_TOL: f32 = 2e-2;
const MMA_ATTENTION_TOL: f32 = 1e-2;

fn rounded(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| round_bf16(x)).collect()
}

fn rounded_tensor(t: &HostTensor) -> HostTensor {
    HostTensor { data: rounded(&t.data), rows: t.rows, cols: t.cols }
}

#[test]
fn projections_are_bf16_gemms_with_f32_accumulation() {
    for twin in [
        TwinBackend::default(),
        TwinBackend::tiled(),
        TwinBackend { gemm: GemmEngine::TiledV1, ..Default::default() },
        TwinBackend { gemm: GemmEngine::Wgmma, ..Default::default() },
    ] {
        projections_case(&twin);
    }
}

fn projections_case(twin: &TwinBackend) {
    let r = ReferenceBackend;
    let mut g = rng(11);
    // k = 19 and 130 are not multiples of 8: the tiled engine falls back to the cuBLAS path.
    for &(m, n, k) in &[(0, 8, 16), (1, 1, 1), (5, 37, 19), (17, 64, 130), (33, 100, 64), (300, 72, 200), (70, 130, 40)]
    {
        let wd = random(&mut g, n * k);
        let bias = random(&mut g, n);
        let w = twin.linear_weight(&wd, n, k).unwrap();
        let (wr, wr_exact) = (r.linear_weight(&rounded(&wd), n, k).unwrap(), r.linear_weight(&wd, n, k).unwrap());
        let x = tensor(&mut g, m, k);
        let xr = rounded_tensor(&x);
        for b in [None, Some(&bias)] {
            let (mut got, mut want, mut want_exact) =
                (HostTensor::zeros(m, n), HostTensor::zeros(m, n), HostTensor::zeros(m, n));
            twin.matmul(&x, &w, b, &mut got).unwrap();
            r.matmul(&xr, &wr, b, &mut want).unwrap();
            r.matmul(&x, &wr_exact, b, &mut want_exact).unwrap();
            assert_close(&format!("{} matmul {m}x{n}x{k}", twin.name()), &got.data, &want.data, EXACT_INPUT_TOL);
            assert_close(&format!("matmul {m}x{n}x{k} vs f32 inputs"), &got.data, &want_exact.data, BF16_TOL);
        }
        let acc = tensor(&mut g, m, n);
        let (mut got, mut want) = (acc.clone(), acc);
        twin.matmul_add(&x, &w, &mut got).unwrap();
        r.matmul_add(&xr, &wr, &mut want).unwrap();
        assert_close(&format!("{} matmul_add {m}x{n}x{k}", twin.name()), &got.data, &want.data, EXACT_INPUT_TOL);
    }
    let x = tensor(&mut g, 3, 10);
    let w = twin.linear_weight(&random(&mut g, 40), 4, 10).unwrap();
    let mut wrong = HostTensor::zeros(3, 5);
    assert!(matches!(twin.matmul(&x, &w, None, &mut wrong), Err(KernelError::Shape(_))));
}

#[test]
fn embed_gather_and_lm_logits() {
    let (twin, r) = (TwinBackend::default(), ReferenceBackend);
    let mut g = rng(12);
    let (vocab, hidden) = (203, 40);
    let table = random(&mut g, vocab * hidden);
    let (te, tr) =
        (twin.embedding(&table, vocab, hidden).unwrap(), r.embedding(&rounded(&table), vocab, hidden).unwrap());
    let mut b = LayoutBuilder::default();
    b.push_seq(&[], 9);
    b.layout.token_ids = vec![0, 202, 5, 5, 100, 31, 32, 33, 1];
    let cache = twin.kv_cache(1, 16, 1, 4).unwrap();
    let batch = twin.prepare_batch(&b.layout, &cache).unwrap();
    let rbatch = r.prepare_batch(&b.layout, &r.kv_cache(1, 16, 1, 4).unwrap()).unwrap();
    let (mut got, mut want) = (HostTensor::zeros(9, hidden), HostTensor::zeros(9, hidden));
    twin.embed(&te, &batch, &mut got).unwrap();
    r.embed(&tr, &rbatch, &mut want).unwrap();
    assert_bits_eq("embed (bf16 table)", &got.data, &want.data);

    let x = tensor(&mut g, 6, hidden);
    let (mut got, mut want) = (HostTensor::zeros(6, vocab), HostTensor::zeros(6, vocab));
    twin.lm_logits(&x, &te, &mut got).unwrap();
    r.lm_logits(&rounded_tensor(&x), &tr, &mut want).unwrap();
    assert_close("lm_logits", &got.data, &want.data, EXACT_INPUT_TOL);

    let rows = [5u32, 0, 5, 2];
    let (mut got, mut want) = (HostTensor::zeros(4, hidden), HostTensor::zeros(4, hidden));
    twin.gather_rows(&x, &rows, &mut got).unwrap();
    r.gather_rows(&x, &rows, &mut want).unwrap();
    assert_bits_eq("gather_rows", &got.data, &want.data);
    assert!(matches!(twin.gather_rows(&x, &[6], &mut HostTensor::zeros(1, hidden)), Err(KernelError::Shape(_))));

    b.layout.token_ids[3] = vocab as u32;
    let bad = twin.prepare_batch(&b.layout, &cache).unwrap();
    let err = twin.embed(&te, &bad, &mut HostTensor::zeros(9, hidden)).unwrap_err();
    assert!(err.to_string().contains("token id 203"), "{err}");
}

#[test]
fn rms_norm_silu_mul_and_dot_rows() {
    let (twin, r) = (TwinBackend::default(), ReferenceBackend);
    let mut g = rng(13);
    for &(rows, cols) in &[(1, 1), (3, 31), (7, 256), (5, 577), (2, 2048)] {
        let x = tensor(&mut g, rows, cols);
        let w = random(&mut g, cols);
        let (mut got, mut want) = (HostTensor::zeros(rows, cols), HostTensor::zeros(rows, cols));
        twin.rms_norm(&x, &w, 1e-6, &mut got).unwrap();
        r.rms_norm(&x, &w, 1e-6, &mut want).unwrap();
        assert_close(&format!("rms_norm {rows}x{cols}"), &got.data, &want.data, EXACT_INPUT_TOL);

        // The residual add fused in: the twin's rms_norm of the sum, bit for bit, near the reference.
        let delta = tensor(&mut g, rows, cols);
        let sum = HostTensor::from_vec(x.data.iter().zip(&delta.data).map(|(a, b)| a + b).collect(), rows, cols);
        let (mut xs, mut xr) = (x.clone(), x.clone());
        let mut fused = HostTensor::zeros(rows, cols);
        twin.add_rms_norm(&mut xs, &delta, &w, 1e-6, &mut fused).unwrap();
        twin.rms_norm(&sum, &w, 1e-6, &mut got).unwrap();
        assert_eq!(xs.data, sum.data, "add_rms_norm {rows}x{cols}: the sum written back");
        assert_eq!(fused.data, got.data, "add_rms_norm {rows}x{cols}: rms_norm of the sum");
        r.add_rms_norm(&mut xr, &delta, &w, 1e-6, &mut want).unwrap();
        assert_close(&format!("add_rms_norm {rows}x{cols}"), &fused.data, &want.data, EXACT_INPUT_TOL);

        let d = twin.dot_rows(&x, &w).unwrap();
        let dr = r.dot_rows(&x, &w).unwrap();
        assert_close(&format!("dot_rows {rows}x{cols}"), &d, &dr, EXACT_INPUT_TOL);

        let gu = tensor(&mut g, rows, 2 * cols);
        let (mut got, mut want) = (HostTensor::zeros(rows, cols), HostTensor::zeros(rows, cols));
        twin.silu_mul(&gu, &mut got).unwrap();
        r.silu_mul(&gu, &mut want).unwrap();
        assert_close(&format!("silu_mul {rows}x{cols}"), &got.data, &want.data, EXACT_INPUT_TOL);
    }
}

#[test]
fn qk_norm_rope_in_both_layouts_with_partial_rotary() {
    let (twin, r) = (TwinBackend::default(), ReferenceBackend);
    let mut g = rng(14);
    for &(n_heads, n_kv_heads, head_dim, rotary_dim) in
        &[(4, 2, 64, 64), (3, 1, 128, 64), (6, 6, 32, 32), (2, 1, 80, 40)]
    {
        let layout = QkvLayout { n_heads, n_kv_heads, head_dim };
        let mut b = LayoutBuilder::default();
        b.push_seq(&[], 5);
        b.layout.positions = vec![0, 1, 17, 4095, 100_000];
        let cache = twin.kv_cache(1, 8, n_kv_heads, head_dim).unwrap();
        let batch = twin.prepare_batch(&b.layout, &cache).unwrap();
        let rbatch = r.prepare_batch(&b.layout, &r.kv_cache(1, 8, n_kv_heads, head_dim).unwrap()).unwrap();
        let (qn, kn) = (random(&mut g, head_dim), random(&mut g, head_dim));
        for (rope_layout, scaling) in
            [RopeLayout::Interleaved, RopeLayout::HalfSplit].into_iter().flat_map(|l| ROPE_SCALINGS.map(|s| (l, s)))
        {
            for norms in [false, true] {
                let rope = RopeConfig { theta: 1_000_000.0, rotary_dim, layout: rope_layout, scaling };
                let qkv = tensor(&mut g, 5, layout.qkv_dim());
                let (mut got, mut want) = (qkv.clone(), qkv);
                let (q, k) = if norms { (Some(&qn), Some(&kn)) } else { (None, None) };
                twin.qk_norm_rope(&mut got, layout, q, k, 1e-6, rope, &batch).unwrap();
                r.qk_norm_rope(&mut want, layout, q, k, 1e-6, rope, &rbatch).unwrap();
                assert_close(
                    &format!("qk_norm_rope {layout:?} {rope_layout} {scaling:?} rotary {rotary_dim} norms {norms}"),
                    &got.data,
                    &want.data,
                    EXACT_INPUT_TOL,
                );
            }
        }
    }
    let layout = QkvLayout { n_heads: 2, n_kv_heads: 1, head_dim: 8 };
    let mut b = LayoutBuilder::default();
    b.push_seq(&[], 1);
    let batch = twin.prepare_batch(&b.layout, &twin.kv_cache(1, 2, 1, 8).unwrap()).unwrap();
    let bad =
        RopeConfig { theta: 10_000.0, rotary_dim: 10, layout: RopeLayout::HalfSplit, scaling: Default::default() };
    let mut qkv = tensor(&mut g, 1, layout.qkv_dim());
    assert!(twin.qk_norm_rope(&mut qkv, layout, None, None, 1e-6, bad, &batch).is_err());
}

/// A batch with a shared prefix (its KV written by an earlier pass), items that extend it,
/// a sub-tile remainder, contexts longer than one key tile and queries spanning several q tiles;
/// with a prefix of `prefix_len` ≥ 2 key tiles of the tensor-core kernel, groups of items whose
/// whole prefix tiles go through its shared pass.
fn attention_case(twin: &TwinBackend, r: &ReferenceBackend, layout: QkvLayout, seed: u64, prefix_len: usize) {
    let mut g = rng(seed);
    let (num_slots, hd) = (512, layout.head_dim);
    let mma = twin.attention.mma_for(hd);
    let mut tc = twin.kv_cache(2, num_slots, layout.n_kv_heads, hd).unwrap();
    let mut rc = r.kv_cache(2, num_slots, layout.n_kv_heads, hd).unwrap();
    let mut rc_exact = r.kv_cache(2, num_slots, layout.n_kv_heads, hd).unwrap();

    // Pass 1: the shared prefix (not block aligned; prefix slots need not start at 0).
    let mut b = LayoutBuilder { next_slot: 7, ..Default::default() };
    b.push_seq(&[], prefix_len);
    let prefix = b.context_slots(0);
    let next_slot = b.next_slot;
    let run = |b: &LayoutBuilder, tc: &mut _, rc: &mut _, rc_exact: &mut _, g: &mut rand::rngs::StdRng| {
        let rows = b.layout.num_rows();
        let qkv = tensor(g, rows, layout.qkv_dim());
        let qkv_r = {
            // The device stores K and V as bf16 (the tensor-core kernel also reads Q as bf16);
            // the reference gets the same rounded values.
            let mut t = qkv.clone();
            let first = if mma { 0 } else { layout.k_offset() };
            for row in 0..rows {
                for c in first..layout.qkv_dim() {
                    t.data[row * layout.qkv_dim() + c] = round_bf16(t.data[row * layout.qkv_dim() + c]);
                }
            }
            t
        };
        let batch = twin.prepare_batch(&b.layout, tc).unwrap();
        let rbatch = r.prepare_batch(&b.layout, rc).unwrap();
        twin.write_kv(&qkv, layout, tc, 1, &batch).unwrap();
        r.write_kv(&qkv_r, layout, rc, 1, &rbatch).unwrap();
        r.write_kv(&qkv, layout, rc_exact, 1, &rbatch).unwrap();
        let (mut got, mut want, mut want_exact) = (
            HostTensor::zeros(rows, layout.q_dim()),
            HostTensor::zeros(rows, layout.q_dim()),
            HostTensor::zeros(rows, layout.q_dim()),
        );
        twin.attention(&qkv, layout, tc, 1, &batch, &mut got).unwrap();
        r.attention(&qkv_r, layout, rc, 1, &rbatch, &mut want).unwrap();
        r.attention(&qkv, layout, rc_exact, 1, &rbatch, &mut want_exact).unwrap();
        let what = format!("attention {layout:?}, {} seqs", b.layout.seqs.len());
        assert_close(&what, &got.data, &want.data, if mma { MMA_ATTENTION_TOL } else { EXACT_INPUT_TOL });
        assert_close(&format!("{what} vs f32 K/V"), &got.data, &want_exact.data, BF16_TOL);
        got
    };
    run(&b, &mut tc, &mut rc, &mut rc_exact, &mut g);

    // Pass 2: items over the prefix, as the worker lays them out (prefix slots shared).
    let mut b = LayoutBuilder { next_slot, ..Default::default() };
    b.push_seq(&prefix, 1);
    b.push_seq(&prefix, 16);
    b.push_seq(&prefix[..20], 37);
    b.push_seq(&[], 3);
    b.push_seq(&prefix, 70);
    b.push_seq(&prefix, 100);
    run(&b, &mut tc, &mut rc, &mut rc_exact, &mut g);
}

#[test]
fn attention_over_a_shared_prefix_matches_reference() {
    let r = ReferenceBackend;
    let simt = TwinBackend { attention: AttentionEngine::Simt, ..Default::default() };
    for (i, &(n_heads, n_kv_heads, head_dim)) in
        [(4, 2, 64), (2, 2, 128), (6, 2, 96), (3, 1, 256), (2, 1, 18)].iter().enumerate()
    {
        attention_case(&simt, &r, QkvLayout { n_heads, n_kv_heads, head_dim }, 20 + i as u64, 45);
    }
}

/// The tensor-core kernel (head sizes 64 and 128), short and long prefixes: with 150 prefix
/// tokens, two groups of items go through its shared pass.
#[test]
fn tensor_core_attention_over_a_shared_prefix_matches_reference() {
    let (twin, r) = (TwinBackend::default(), ReferenceBackend);
    assert_eq!(twin.attention, AttentionEngine::Mma);
    for (i, &(n_heads, n_kv_heads, head_dim, prefix)) in
        [(4, 2, 64, 45), (2, 2, 128, 150), (4, 1, 64, 150)].iter().enumerate()
    {
        attention_case(&twin, &r, QkvLayout { n_heads, n_kv_heads, head_dim }, 40 + i as u64, prefix);
    }
}

#[test]
fn attention_rejects_head_sizes_the_kernel_cannot_take() {
    let twin = TwinBackend::default();
    for hd in [258, 7] {
        let layout = QkvLayout { n_heads: 1, n_kv_heads: 1, head_dim: hd };
        let mut b = LayoutBuilder::default();
        b.push_seq(&[], 2);
        let cache = twin.kv_cache(1, 4, 1, hd).unwrap();
        let batch = twin.prepare_batch(&b.layout, &cache).unwrap();
        let qkv = HostTensor::zeros(2, layout.qkv_dim());
        let err = twin.attention(&qkv, layout, &cache, 0, &batch, &mut HostTensor::zeros(2, hd)).unwrap_err();
        assert!(matches!(err, KernelError::Unsupported(_)), "{err}");
    }
}

/// The tensor-core kernel's promise: an item's rows are bitwise the same whether its prefix tiles
/// went through the shared pass with other items, it was scored alone over the cached prefix, or
/// the prefix was computed in the same sequence (no prefix reuse).
#[test]
fn tensor_core_attention_rows_do_not_depend_on_prefix_sharing() {
    let twin = TwinBackend::default();
    let layout = QkvLayout { n_heads: 4, n_kv_heads: 2, head_dim: 128 };
    let mut g = rng(31);
    let p = 150;
    let prefix = tensor(&mut g, p, layout.qkv_dim());
    let lens = [20, 64, 70, 1, 33];
    let items: Vec<HostTensor> = lens.iter().map(|&n| tensor(&mut g, n, layout.qkv_dim())).collect();
    let stack = |parts: &[&HostTensor]| {
        let mut t = HostTensor::zeros(0, layout.qkv_dim());
        for part in parts {
            t.data.extend_from_slice(&part.data);
            t.rows += part.rows;
        }
        t
    };
    let attend = |b: &LayoutBuilder, qkv: &HostTensor, cache: &mut _| {
        let batch = twin.prepare_batch(&b.layout, cache).unwrap();
        twin.write_kv(qkv, layout, cache, 0, &batch).unwrap();
        let mut out = HostTensor::zeros(qkv.rows, layout.q_dim());
        twin.attention(qkv, layout, cache, 0, &batch, &mut out).unwrap();
        out
    };
    let rows_of =
        |t: &HostTensor, first: usize, n: usize| t.data[first * layout.q_dim()..(first + n) * layout.q_dim()].to_vec();
    // The prefix pass, then the items over its slots.
    let cached_prefix = |cache: &mut _| {
        let mut b = LayoutBuilder { next_slot: 3, ..Default::default() };
        b.push_seq(&[], p);
        attend(&b, &prefix, cache);
        (b.context_slots(0), b.next_slot)
    };

    let mut cache = twin.kv_cache(1, 1024, 2, 128).unwrap();
    let (slots, next_slot) = cached_prefix(&mut cache);
    let mut b = LayoutBuilder { next_slot, ..Default::default() };
    let firsts: Vec<usize> = lens.iter().map(|&n| b.push_seq(&slots, n)).collect();
    assert!(!PackedBatch::new(&b.layout).attn_shared_levels.is_empty(), "no shared pass");
    let together = attend(&b, &stack(&items.iter().collect::<Vec<_>>()), &mut cache);

    for (i, item) in items.iter().enumerate() {
        let n = lens[i];
        let want = rows_of(&together, firsts[i], n);
        let mut cache = twin.kv_cache(1, 1024, 2, 128).unwrap();
        let (slots, next_slot) = cached_prefix(&mut cache);
        let mut b = LayoutBuilder { next_slot: next_slot + 50, ..Default::default() };
        b.push_seq(&slots, n);
        let alone = attend(&b, item, &mut cache);
        assert_bits_eq(&format!("item {i}: alone vs with the others"), &alone.data, &want);

        let mut cache = twin.kv_cache(1, 1024, 2, 128).unwrap();
        let mut b = LayoutBuilder { next_slot: 11, ..Default::default() };
        b.push_seq(&[], p + n);
        let whole = attend(&b, &stack(&[&prefix, item]), &mut cache);
        assert_bits_eq(&format!("item {i}: in one sequence with its prefix"), &rows_of(&whole, p, n), &want);
    }
}

/// A prefix of `p` tokens in the cache (its K/V written), then items of `lens` rows over its
/// slots with random QKV rows (seed `seed`), their K/V written too: the cache, the items' layout
/// and their QKV rows.
fn items_over_a_cached_prefix(
    twin: &TwinBackend,
    layout: QkvLayout,
    seed: u64,
    p: usize,
    lens: &[usize],
) -> (<TwinBackend as Backend>::KvCache, BatchLayout, HostTensor) {
    let mut g = rng(seed);
    let mut cache = twin.kv_cache(1, 2048, layout.n_kv_heads, layout.head_dim).unwrap();
    let mut b = LayoutBuilder { next_slot: 3, ..Default::default() };
    b.push_seq(&[], p);
    let prefix = tensor(&mut g, p, layout.qkv_dim());
    let batch = twin.prepare_batch(&b.layout, &cache).unwrap();
    twin.write_kv(&prefix, layout, &mut cache, 0, &batch).unwrap();
    let slots = b.context_slots(0);
    let mut b = LayoutBuilder { next_slot: b.next_slot, ..Default::default() };
    for &n in lens {
        b.push_seq(&slots, n);
    }
    let qkv = tensor(&mut g, b.layout.num_rows(), layout.qkv_dim());
    let batch = twin.prepare_batch(&b.layout, &cache).unwrap();
    twin.write_kv(&qkv, layout, &mut cache, 0, &batch).unwrap();
    (cache, b.layout, qkv)
}

/// The schedule's sharing rule is a speed choice only: items of 1 to 100 rows over a 200-token
/// prefix (three whole tiles; the short ones share them under the cost rule, the long ones do
/// not) give the same bits when every item shares the prefix's tiles, and both schedules differ.
#[test]
fn tensor_core_attention_rows_do_not_depend_on_the_sharing_rule() {
    let twin = TwinBackend::default();
    let layout = QkvLayout { n_heads: 4, n_kv_heads: 2, head_dim: 64 };
    let (cache, items, qkv) = items_over_a_cached_prefix(&twin, layout, 38, 200, &[10, 100, 1, 64, 33, 70, 5]);
    let rows = items.num_rows();
    let mut batch = twin.prepare_batch(&items, &cache).unwrap();
    let attend = |batch: &twin::TwinBatch| {
        let mut out = vec![0f32; rows * layout.q_dim()];
        batch.attention_mma(&qkv, layout, &cache, 0, &mut out, None);
        out
    };
    let by_rule = attend(&batch);
    let all = PackedBatch::with_sharing(&items, Sharing::Always);
    assert_ne!(all.attn_shared_levels, batch.packed.attn_shared_levels, "the rules schedule alike");
    assert!(!batch.packed.attn_shared_levels.is_empty(), "no item shares under the rule");
    batch.packed = all;
    assert_bits_eq("every item sharing vs the cost rule", &attend(&batch), &by_rule);
}

/// The kernel's operand output (fused epilogues): the own pass stores each row's f32 value
/// rounded once to bf16, the value the O projection's cast would make, while the shared passes'
/// state stays f32 in `out`.
#[test]
fn tensor_core_attention_into_an_operand_is_the_f32_rows_rounded() {
    let twin = TwinBackend::default();
    let layout = QkvLayout { n_heads: 4, n_kv_heads: 2, head_dim: 64 };
    let (cache, items, qkv) = items_over_a_cached_prefix(&twin, layout, 37, 150, &[20, 64, 1, 33]);
    let rows = items.num_rows();
    let batch = twin.prepare_batch(&items, &cache).unwrap();
    assert!(!batch.packed.attn_shared_levels.is_empty(), "no shared pass");
    let q_dim = layout.q_dim();
    let mut f32_rows = vec![0f32; rows * q_dim];
    batch.attention_mma(&qkv, layout, &cache, 0, &mut f32_rows, None);
    let (mut state, mut operand) = (vec![0f32; rows * q_dim], vec![0u16; rows * q_dim]);
    batch.attention_mma(&qkv, layout, &cache, 0, &mut state, Some(&mut operand));
    let operand: Vec<f32> = operand.iter().map(|&h| twin::warp::from_bf16(h)).collect();
    assert_bits_eq("operand vs the f32 rows rounded", &operand, &rounded(&f32_rows));
}

/// Two levels of sharing, as a call whose items share a run after the query prefix lays them
/// out: prefix tiles for every item, then the run's tiles for the items of the group, in two
/// shared passes. Each item's rows are bitwise those of its whole prompt as one sequence.
#[test]
fn tensor_core_attention_over_a_two_level_tree_matches_each_prompt_alone() {
    let twin = TwinBackend::default();
    let layout = QkvLayout { n_heads: 2, n_kv_heads: 1, head_dim: 64 };
    let w = layout.qkv_dim();
    let mut g = rng(32);
    let (p, r) = (150, 100);
    let prefix = tensor(&mut g, p, w);
    let run = tensor(&mut g, r, w);
    // (in the group, own rows)
    let items: Vec<(bool, HostTensor)> = [(true, 12), (false, 20), (true, 64), (false, 50), (true, 1)]
        .iter()
        .map(|&(inr, n)| (inr, tensor(&mut g, n, w)))
        .collect();
    let stack = |parts: &[&HostTensor]| {
        let mut t = HostTensor::zeros(0, w);
        for part in parts {
            t.data.extend_from_slice(&part.data);
            t.rows += part.rows;
        }
        t
    };
    let attend = |b: &LayoutBuilder, qkv: &HostTensor, cache: &mut _| {
        let batch = twin.prepare_batch(&b.layout, cache).unwrap();
        twin.write_kv(qkv, layout, cache, 0, &batch).unwrap();
        let mut out = HostTensor::zeros(qkv.rows, layout.q_dim());
        twin.attention(qkv, layout, cache, 0, &batch, &mut out).unwrap();
        out
    };
    let mut cache = twin.kv_cache(1, 2048, 1, 64).unwrap();
    let mut b = LayoutBuilder { next_slot: 5, ..Default::default() };
    b.push_seq(&[], p);
    attend(&b, &prefix, &mut cache);
    let prefix_slots = b.context_slots(0);
    let mut b = LayoutBuilder { next_slot: b.next_slot + 7, ..Default::default() };
    b.push_seq(&prefix_slots, r);
    attend(&b, &run, &mut cache);
    let run_slots = b.context_slots(0);
    let mut b = LayoutBuilder { next_slot: b.next_slot + 3, ..Default::default() };
    let firsts: Vec<usize> =
        items.iter().map(|(inr, t)| b.push_seq(if *inr { &run_slots } else { &prefix_slots }, t.rows)).collect();
    let packed = PackedBatch::new(&b.layout);
    assert_eq!(packed.attn_shared_levels.len(), 2, "prefix tiles, then the run's");
    let all = attend(&b, &stack(&items.iter().map(|(_, t)| t).collect::<Vec<_>>()), &mut cache);
    let od = layout.q_dim();
    for (i, (inr, item)) in items.iter().enumerate() {
        let whole_qkv = if *inr { stack(&[&prefix, &run, item]) } else { stack(&[&prefix, item]) };
        let mut cache = twin.kv_cache(1, 2048, 1, 64).unwrap();
        let mut b = LayoutBuilder { next_slot: 9, ..Default::default() };
        b.push_seq(&[], whole_qkv.rows);
        let whole = attend(&b, &whole_qkv, &mut cache);
        let skip = whole_qkv.rows - item.rows;
        assert_bits_eq(
            &format!("item {i}: in the tree vs its whole prompt"),
            &all.data[firsts[i] * od..(firsts[i] + item.rows) * od],
            &whole.data[skip * od..],
        );
    }
}

/// The determinism contract on the kernel design: a sequence's attention output is bitwise the
/// same alone or batched with others at other rows and slots (other q tiles, other blocks).
#[test]
fn attention_rows_do_not_depend_on_the_batch() {
    let twin = TwinBackend::default();
    let layout = QkvLayout { n_heads: 4, n_kv_heads: 2, head_dim: 64 };
    let mut g = rng(30);
    let own = tensor(&mut g, 40, layout.qkv_dim());
    let other = tensor(&mut g, 23, layout.qkv_dim());

    let alone = {
        let mut b = LayoutBuilder::default();
        b.push_seq(&[], 40);
        let mut cache = twin.kv_cache(1, 200, 2, 64).unwrap();
        let batch = twin.prepare_batch(&b.layout, &cache).unwrap();
        twin.write_kv(&own, layout, &mut cache, 0, &batch).unwrap();
        let mut out = HostTensor::zeros(40, layout.q_dim());
        twin.attention(&own, layout, &cache, 0, &batch, &mut out).unwrap();
        out
    };
    let batched = {
        let mut b = LayoutBuilder { next_slot: 90, ..Default::default() };
        b.push_seq(&[], 23);
        b.push_seq(&[], 40);
        let mut qkv = other.clone();
        qkv.data.extend_from_slice(&own.data);
        qkv.rows += 40;
        let mut cache = twin.kv_cache(1, 200, 2, 64).unwrap();
        let batch = twin.prepare_batch(&b.layout, &cache).unwrap();
        twin.write_kv(&qkv, layout, &mut cache, 0, &batch).unwrap();
        let mut out = HostTensor::zeros(63, layout.q_dim());
        twin.attention(&qkv, layout, &cache, 0, &batch, &mut out).unwrap();
        out
    };
    assert_bits_eq("sequence alone vs batched", &alone.data, &batched.data[23 * layout.q_dim()..]);
}

/// The tiled engine's promise: a row's bits do not depend on how many rows share the GEMM (nor on
/// the BLOCK_M picked for that count).
#[test]
fn tiled_projections_are_batch_invariant() {
    let twin = TwinBackend::tiled();
    let mut g = rng(15);
    let (n, k) = (96, 64);
    let w = twin.linear_weight(&random(&mut g, n * k), n, k).unwrap();
    let bias = random(&mut g, n);
    let x = tensor(&mut g, 300, k); // 300 rows: BLOCK_M 128; a single row: BLOCK_M 64
    let (mut all, mut all_acc) = (HostTensor::zeros(300, n), tensor(&mut g, 300, n));
    twin.matmul(&x, &w, Some(&bias), &mut all).unwrap();
    let acc0 = all_acc.clone();
    twin.matmul_add(&x, &w, &mut all_acc).unwrap();
    for r in [0usize, 1, 63, 64, 200, 299] {
        let xr = HostTensor { data: x.row(r).to_vec(), rows: 1, cols: k };
        let mut one = HostTensor::zeros(1, n);
        twin.matmul(&xr, &w, Some(&bias), &mut one).unwrap();
        assert_bits_eq(&format!("row {r} alone vs in 300"), &one.data, all.row(r));
        let mut one_acc = HostTensor { data: acc0.row(r).to_vec(), rows: 1, cols: n };
        twin.matmul_add(&xr, &w, &mut one_acc).unwrap();
        assert_bits_eq(&format!("row {r} alone vs in 300 (add)"), &one_acc.data, all_acc.row(r));
    }
}

/// The index probes the GPU tests run first on every GEMM tile (cuda_common.rs
/// `gemm_index_probes`) pass on the twins: the probes' expectations are right, so on a GPU a
/// mismatch is the kernel's.
#[test]
fn gemm_index_probes_pass_on_every_twin_tile() {
    type Gemm = fn(usize, &[u16], &[u16], &mut [f32], usize, usize, usize, f32);
    let tiles: [(&str, Gemm, usize); 6] = [
        ("BLOCK_M 64", twin::dense_gemm, 64),
        ("BLOCK_M 128", twin::dense_gemm, 128),
        ("wgmma BLOCK_N 128", twin::dense_gemm_wgmma, 128),
        ("wgmma BLOCK_N 256", twin::dense_gemm_wgmma, 256),
        ("wgmma TMA BLOCK_N 128", twin::dense_gemm_wgmma_tma, 128),
        ("wgmma TMA BLOCK_N 256", twin::dense_gemm_wgmma_tma, 256),
    ];
    for (name, gemm, tile) in tiles {
        let run = |x: &[f32], w: &[f32], m: usize, n: usize, k: usize| {
            let (xb, wb): (Vec<u16>, Vec<u16>) = (
                x.iter().map(|&v| twin::warp::to_bf16(v)).collect(),
                w.iter().map(|&v| twin::warp::to_bf16(v)).collect(),
            );
            let mut out = vec![f32::NAN; m * n];
            gemm(tile, &xb, &wb, &mut out, m, n, k, 0.0);
            out
        };
        let wrong = cuda_common::gemm_index_probes(run, (256, 256, 128));
        assert!(wrong.is_empty(), "{name}: {wrong:#?}");
    }
    // A probe that reads the wrong k is named as such.
    let skewed = |x: &[f32], w: &[f32], m: usize, n: usize, k: usize| {
        let mut out = vec![0f32; m * n];
        for r in 0..m {
            for c in 0..n {
                out[r * n + c] = (0..k).map(|kk| x[r * k + kk] * w[c * k + (kk + 1) % k]).sum();
            }
        }
        out
    };
    let wrong = cuda_common::gemm_index_probes(skewed, (8, 8, 16));
    assert!(wrong.first().is_some_and(|s| s.contains("read W's k 1, want 0")), "{wrong:#?}");
}

/// The tiled kernels (the current tile at BLOCK_M 64 and 128, the first tile at both, the wgmma
/// tile at BLOCK_N 128 and 256, cp.async- and TMA-fed), replayed fragment by fragment (the wgmma
/// tile by its descriptors, the TMA's boxes from their encode arguments), against the f64 reference on the same bf16 inputs, and bitwise against each
/// other and against themselves on fewer rows: every row takes the same K order in every tile and
/// every batch. The shape leaves partial row and column tiles and a K that is not a multiple of
/// either K step.
#[test]
fn tiled_gemm_kernels_agree_bitwise_across_tiles_and_batches() {
    type Gemm = fn(usize, &[u16], &[u16], &mut [f32], usize, usize, usize, f32);
    let mut g = rng(16);
    let (m, n, k) = (300, 200, 136);
    let xb: Vec<u16> = random(&mut g, m * k).iter().map(|&v| twin::warp::to_bf16(v)).collect();
    let wb: Vec<u16> = random(&mut g, n * k).iter().map(|&v| twin::warp::to_bf16(v)).collect();
    let c0 = random(&mut g, m * n);
    let f = |v: u16| twin::warp::from_bf16(v) as f64;
    let want: Vec<f32> = (0..m * n)
        .map(|i| (0..k).map(|kk| f(xb[i / n * k + kk]) * f(wb[i % n * k + kk])).sum::<f64>() as f32)
        .collect();
    let want_acc: Vec<f32> = want.iter().zip(&c0).map(|(&w, &c)| (w as f64 + c as f64) as f32).collect();
    let kernels: [(&str, Gemm, usize); 8] = [
        ("BLOCK_M 64", twin::dense_gemm, 64),
        ("BLOCK_M 128", twin::dense_gemm, 128),
        ("v1 BLOCK_M 64", twin::dense_gemm_v1, 64),
        ("v1 BLOCK_M 128", twin::dense_gemm_v1, 128),
        ("wgmma BLOCK_N 128", twin::dense_gemm_wgmma, 128),
        ("wgmma BLOCK_N 256", twin::dense_gemm_wgmma, 256),
        ("wgmma TMA BLOCK_N 128", twin::dense_gemm_wgmma_tma, 128),
        ("wgmma TMA BLOCK_N 256", twin::dense_gemm_wgmma_tma, 256),
    ];
    let mut first: Option<(Vec<f32>, Vec<f32>)> = None;
    for (name, gemm, bm) in kernels {
        let mut out = vec![f32::NAN; m * n];
        gemm(bm, &xb, &wb, &mut out, m, n, k, 0.0);
        assert_close(name, &out, &want, EXACT_INPUT_TOL);
        let mut acc = c0.clone();
        gemm(bm, &xb, &wb, &mut acc, m, n, k, 1.0);
        assert_close(&format!("{name}, beta 1"), &acc, &want_acc, EXACT_INPUT_TOL);
        for (row, rows) in [(0usize, 1usize), (7, 5), (64, 64), (130, 170)] {
            let mut part = vec![f32::NAN; rows * n];
            gemm(bm, &xb[row * k..(row + rows) * k], &wb, &mut part, rows, n, k, 0.0);
            assert_bits_eq(
                &format!("{name}: rows {row}..{} alone", row + rows),
                &part,
                &out[row * n..(row + rows) * n],
            );
        }
        match &first {
            None => first = Some((out, acc)),
            Some((out0, acc0)) => {
                assert_bits_eq(&format!("{name} vs {}", kernels[0].0), &out, out0);
                assert_bits_eq(&format!("{name} vs {}, beta 1", kernels[0].0), &acc, acc0);
            }
        }
    }
}

type PlainGemm = fn(usize, &[u16], &[u16], &mut [f32], usize, usize, usize, f32);
type SwigluGemm = fn(usize, &[u16], &[u16], &mut [u16], usize, usize, usize);

/// The dense tiles with their fused SwiGLU: (name, tile size, plain GEMM, SwiGLU) — the mma.sync
/// tile at BLOCK_M 64 and 128 (gemm.cu) and the TMA-fed wgmma tile at BLOCK_N 128 and 256
/// (gemm_wgmma.cu; its SwiGLU reads the weight's gate and up rows as two boxes). The cp.async-fed
/// wgmma tile's interleaved SwiGLU is the MoE grouped GEMM's (cuda_twin_moe.rs).
fn dense_tiles() -> [(&'static str, usize, PlainGemm, SwigluGemm); 4] {
    [
        ("BLOCK_M 64", 64, twin::dense_gemm, twin::dense_gemm_swiglu),
        ("BLOCK_M 128", 128, twin::dense_gemm, twin::dense_gemm_swiglu),
        ("wgmma TMA BLOCK_N 128", 128, twin::dense_gemm_wgmma_tma, twin::dense_gemm_wgmma_tma_swiglu),
        ("wgmma TMA BLOCK_N 256", 256, twin::dense_gemm_wgmma_tma, twin::dense_gemm_wgmma_tma_swiglu),
    ]
}

/// The fused SwiGLU GEMMs (gemm.cu `dense_gemm_swiglu_*`, gemm_wgmma.cu
/// `dense_gemm_wgmma_tma_swiglu_*`), replayed fragment by fragment with their weight rows
/// interleaved (the TMA tile's: split in two boxes): bitwise what the unfused passes give — the same tile's plain GEMM into [gate | up],
/// `silu_mul_f32`, then `cast_bf16` — on all rows and on fewer. Partial row and column tiles
/// (m 150; n = 2 · 72 = 144 is not a multiple of 64 or 128) and a K that is not a multiple of
/// either K step.
#[test]
fn fused_swiglu_gemm_is_bitwise_the_unfused_passes() {
    let mut g = rng(17);
    let (m, inter, k) = (150, 72, 136);
    let n = 2 * inter;
    let xb: Vec<u16> = random(&mut g, m * k).iter().map(|&v| twin::warp::to_bf16(v)).collect();
    let wb: Vec<u16> = random(&mut g, n * k).iter().map(|&v| twin::warp::to_bf16(v)).collect();
    for (name, bm, plain, swiglu) in dense_tiles() {
        let mut gate_up = vec![f32::NAN; m * n];
        plain(bm, &xb, &wb, &mut gate_up, m, n, k, 0.0);
        let mut act = vec![f32::NAN; m * inter];
        twin::silu_mul_f32(&gate_up, &mut act, inter);
        let mut want = vec![0u16; m * inter];
        twin::cast_bf16(&act, &mut want);
        let mut got = vec![0xffffu16; m * inter];
        swiglu(bm, &xb, &wb, &mut got, m, n, k);
        let diff = got.iter().zip(&want).position(|(a, b)| a != b);
        assert_eq!(diff, None, "{name}: first differing element (row, col) {:?}", diff.map(|i| (i / inter, i % inter)));
        for (row, rows) in [(0usize, 1usize), (7, 5), (64, 70)] {
            let mut part = vec![0xffffu16; rows * inter];
            swiglu(bm, &xb[row * k..(row + rows) * k], &wb, &mut part, rows, n, k);
            assert_eq!(part, got[row * inter..(row + rows) * inter], "{name}: rows {row}..{} alone", row + rows);
        }
    }
}

/// `matmul_silu_mul` through the Backend: the fused engine's activation is the unfused engine's
/// rounded to bf16 (the down projection rounds it anyway), whatever the batch; shapes the fused
/// kernel cannot take (inter % 8 != 0, K % 8 != 0) run the unfused passes.
#[test]
fn fused_matmul_silu_mul_matches_the_unfused_engine() {
    let fused = TwinBackend::tiled();
    let unfused = TwinBackend { gemm: GemmEngine::TiledUnfused, ..Default::default() };
    assert!(fused.gemm.fused() && !unfused.gemm.fused());
    let mut g = rng(18);
    for &(m, inter, k) in &[(1, 16, 8), (40, 24, 64), (130, 72, 40), (9, 20, 32), (9, 16, 12)] {
        let w = random(&mut g, 2 * inter * k);
        let (wf, wu) =
            (fused.linear_weight(&w, 2 * inter, k).unwrap(), unfused.linear_weight(&w, 2 * inter, k).unwrap());
        let x = tensor(&mut g, m, k);
        let mut scratch = HostTensor::zeros(0, 0);
        let (mut got, mut want) = (HostTensor::zeros(m, inter), HostTensor::zeros(m, inter));
        fused.matmul_silu_mul(&x, &wf, &mut scratch, &mut got).unwrap();
        unfused.matmul_silu_mul(&x, &wu, &mut scratch, &mut want).unwrap();
        let want = if fused.gemm.swiglu_fused_for(k, inter) { rounded(&want.data) } else { want.data };
        assert_bits_eq(&format!("{m}x{inter}x{k}"), &got.data, &want);
        let x1 = HostTensor { data: x.row(m - 1).to_vec(), rows: 1, cols: k };
        let mut one = HostTensor::zeros(1, inter);
        fused.matmul_silu_mul(&x1, &wf, &mut scratch, &mut one).unwrap();
        assert_bits_eq(&format!("{m}x{inter}x{k}: last row alone"), &one.data, got.row(m - 1));
    }
}

/// rope.cu with its K/V write (the fused engine's `qk_norm_rope_write_kv`) against
/// `qk_norm_rope` then kv_write.cu's `write_kv` (the unfused engine): the same rotated q and k
/// heads in place and the same bits in both whole pools of both layers (rows at scattered slots
/// of layer 1), for both RoPE layouts, with and without the q/k norms, GQA and MHA.
#[test]
fn fused_rope_kv_write_is_bitwise_the_two_kernels() {
    let fused = TwinBackend::tiled();
    let unfused = TwinBackend { gemm: GemmEngine::TiledUnfused, ..Default::default() };
    let mut g = rng(19);
    for &(n_heads, n_kv_heads, head_dim, rotary_dim) in
        &[(4, 2, 64, 64), (3, 3, 32, 16), (3, 1, 6, 6), (12, 6, 256, 256)]
    {
        let layout = QkvLayout { n_heads, n_kv_heads, head_dim };
        let mut b = LayoutBuilder::default();
        b.push_seq(&[], 5);
        b.layout.positions = vec![3, 0, 17, 4095, 9];
        b.layout.row_slots = vec![6, 2, 7, 0, 3];
        let (qn, kn) = (random(&mut g, head_dim), random(&mut g, head_dim));
        for rope_layout in [RopeLayout::Interleaved, RopeLayout::HalfSplit] {
            for norms in [false, true] {
                let rope = RopeConfig { theta: 10_000.0, rotary_dim, layout: rope_layout, scaling: Default::default() };
                let (q, k) = if norms { (Some(&qn), Some(&kn)) } else { (None, None) };
                let qkv = tensor(&mut g, 5, layout.qkv_dim());
                let run = |t: &TwinBackend| {
                    let mut cache = t.kv_cache(2, 8, n_kv_heads, head_dim).unwrap();
                    let batch = t.prepare_batch(&b.layout, &cache).unwrap();
                    let mut x = qkv.clone();
                    t.qk_norm_rope_write_kv(&mut x, layout, q, k, 1e-6, rope, &mut cache, 1, &batch).unwrap();
                    (x.data, cache.k, cache.v)
                };
                let ((fx, fk, fv), (ux, uk, uv)) = (run(&fused), run(&unfused));
                let what = format!("{layout:?} {rope_layout} norms {norms}");
                assert_bits_eq(&format!("{what}: qkv"), &fx, &ux);
                assert_eq!(fk, uk, "{what}: K pools");
                assert_eq!(fv, uv, "{what}: V pools");
                assert!(uk[1].iter().any(|&v| v != 0) && uv[1].iter().any(|&v| v != 0), "{what}: nothing written");
            }
        }
    }
}
