//! Every CpuBackend op against the f64 ReferenceBackend on random inputs with odd shapes, on the
//! detected ISA and on the portable path. Tolerances are relative to the largest reference value.

mod common;

use common::*;
use sieve_kernels::host::HostTensor;
use sieve_kernels::reference::ReferenceBackend;
use sieve_kernels::{Backend, CpuBackend, KernelError, QkvLayout, RopeConfig, RopeLayout};

/// f32 accumulation over K ≤ ~1.5k terms vs f64: a few ulps of the magnitude.
const GEMM_TOL: f32 = 2e-5;
const ELEMENTWISE_TOL: f32 = 1e-5;

#[test]
fn matmul_and_matmul_add_match_reference() {
    let r = ReferenceBackend;
    let mut g = rng(1);
    for cpu in backends(2) {
        for &(n, k) in &[(1, 1), (37, 19), (33, 65), (100, 70), (130, 40), (64, 576), (40, 4500)] {
            let wd = random(&mut g, n * k);
            let bias = random(&mut g, n);
            let (w, wr) = (cpu.linear_weight(&wd, n, k).unwrap(), r.linear_weight(&wd, n, k).unwrap());
            for &m in &[0, 1, 3, 5, 17, 100] {
                let x = tensor(&mut g, m, k);
                let what = format!("{} matmul m={m} n={n} k={k}", cpu.name());
                for b in [None, Some(&bias)] {
                    let (mut got, mut want) = (HostTensor::zeros(m, n), HostTensor::zeros(m, n));
                    cpu.matmul(&x, &w, b, &mut got).unwrap();
                    r.matmul(&x, &wr, b, &mut want).unwrap();
                    assert_close(&what, &got.data, &want.data, GEMM_TOL);
                }
                let acc0 = tensor(&mut g, m, n);
                let (mut got, mut want) = (acc0.clone(), acc0);
                cpu.matmul_add(&x, &w, &mut got).unwrap();
                r.matmul_add(&x, &wr, &mut want).unwrap();
                assert_close(&format!("{what} (add)"), &got.data, &want.data, GEMM_TOL);
            }
        }
    }
}

#[test]
fn embed_and_lm_logits_match_reference() {
    let r = ReferenceBackend;
    let mut g = rng(2);
    let (vocab, hidden) = (203, 40);
    let table = random(&mut g, vocab * hidden);
    for cpu in backends(2) {
        let (te, tr) = (cpu.embedding(&table, vocab, hidden).unwrap(), r.embedding(&table, vocab, hidden).unwrap());
        let mut b = LayoutBuilder::default();
        b.push_seq(&[], 9);
        b.layout.token_ids = vec![0, 202, 5, 5, 100, 31, 32, 33, 1];
        let cache = cpu.kv_cache(1, 16, 1, 4).unwrap();
        let batch = cpu.prepare_batch(&b.layout, &cache).unwrap();
        let rbatch = r.prepare_batch(&b.layout, &cache).unwrap();
        let (mut got, mut want) = (HostTensor::zeros(9, hidden), HostTensor::zeros(9, hidden));
        cpu.embed(&te, &batch, &mut got).unwrap();
        r.embed(&tr, &rbatch, &mut want).unwrap();
        assert_bits_eq("embed", &got.data, &want.data);

        let x = tensor(&mut g, 3, hidden);
        let (mut got, mut want) = (HostTensor::zeros(3, vocab), HostTensor::zeros(3, vocab));
        cpu.lm_logits(&x, &te, &mut got).unwrap();
        r.lm_logits(&x, &tr, &mut want).unwrap();
        assert_close("lm_logits", &got.data, &want.data, GEMM_TOL);
    }
}

#[test]
fn row_ops_match_reference() {
    let r = ReferenceBackend;
    let mut g = rng(3);
    for cpu in backends(2) {
        for &(rows, cols) in &[(1, 576), (3, 37), (17, 1), (100, 130), (300, 576)] {
            let x = tensor(&mut g, rows, cols);
            let w = random(&mut g, cols);
            let (mut got, mut want) = (HostTensor::zeros(rows, cols), HostTensor::zeros(rows, cols));
            cpu.rms_norm(&x, &w, 1e-5, &mut got).unwrap();
            r.rms_norm(&x, &w, 1e-5, &mut want).unwrap();
            assert_close(&format!("rms_norm {rows}x{cols}"), &got.data, &want.data, ELEMENTWISE_TOL);

            // The residual add fused in: the sum written back exactly, the norm near the reference's.
            let delta = tensor(&mut g, rows, cols);
            let sum: Vec<f32> = x.data.iter().zip(&delta.data).map(|(a, b)| a + b).collect();
            let (mut xc, mut xr) = (x.clone(), x.clone());
            cpu.add_rms_norm(&mut xc, &delta, &w, 1e-5, &mut got).unwrap();
            r.add_rms_norm(&mut xr, &delta, &w, 1e-5, &mut want).unwrap();
            assert_eq!(xc.data, sum, "add_rms_norm {rows}x{cols}: the sum written back");
            assert_close(&format!("add_rms_norm {rows}x{cols}"), &got.data, &want.data, ELEMENTWISE_TOL);

            assert_close(
                &format!("dot_rows {rows}x{cols}"),
                &cpu.dot_rows(&x, &w).unwrap(),
                &r.dot_rows(&x, &w).unwrap(),
                ELEMENTWISE_TOL,
            );

            // silu_mul over [gate | up] with gate values over a wide range.
            let mut gu = tensor(&mut g, rows, 2 * cols);
            gu.data.iter_mut().step_by(3).for_each(|v| *v *= 30.0);
            let (mut got, mut want) = (HostTensor::zeros(rows, cols), HostTensor::zeros(rows, cols));
            cpu.silu_mul(&gu, &mut got).unwrap();
            r.silu_mul(&gu, &mut want).unwrap();
            assert_close(&format!("silu_mul {rows}x{cols}"), &got.data, &want.data, ELEMENTWISE_TOL);

            let idx: Vec<u32> = (0..7).map(|i| (i * 13 % rows) as u32).collect();
            let (mut got, mut want) = (HostTensor::zeros(7, cols), HostTensor::zeros(7, cols));
            cpu.gather_rows(&x, &idx, &mut got).unwrap();
            r.gather_rows(&x, &idx, &mut want).unwrap();
            assert_bits_eq("gather_rows", &got.data, &want.data);
        }
    }
}

/// One varlen batch: a prefix sequence, items that share its K/V, and a standalone sequence.
fn attention_batch(prefix: usize, items: &[usize]) -> LayoutBuilder {
    let mut b = LayoutBuilder::default();
    b.push_seq(&[], prefix);
    let prefix_slots = b.context_slots(0);
    for &n in items {
        b.push_seq(&prefix_slots, n);
    }
    b.push_seq(&[], 5);
    b
}

fn layouts() -> Vec<(QkvLayout, RopeConfig, bool)> {
    let rope = |rotary_dim, layout| RopeConfig { theta: 10000.0, rotary_dim, layout, scaling: Default::default() };
    vec![
        // SmolLM2: GQA group 3, interleaved (GGUF)
        (QkvLayout { n_heads: 9, n_kv_heads: 3, head_dim: 64 }, rope(64, RopeLayout::Interleaved), false),
        // Qwen3-like: head_dim 128, q/k norm, half-split
        (QkvLayout { n_heads: 4, n_kv_heads: 2, head_dim: 128 }, rope(128, RopeLayout::HalfSplit), true),
        // group 1, partial rotary
        (QkvLayout { n_heads: 3, n_kv_heads: 3, head_dim: 64 }, rope(32, RopeLayout::HalfSplit), false),
        (QkvLayout { n_heads: 2, n_kv_heads: 1, head_dim: 64 }, rope(48, RopeLayout::Interleaved), true),
        // head_dim not a multiple of 16, group 8
        (QkvLayout { n_heads: 8, n_kv_heads: 1, head_dim: 40 }, rope(40, RopeLayout::HalfSplit), false),
        // RoPE scaling: Llama 3.1's, linear and YaRN
        (
            QkvLayout { n_heads: 4, n_kv_heads: 2, head_dim: 128 },
            RopeConfig { scaling: ROPE_SCALINGS[2], ..rope(128, RopeLayout::HalfSplit) },
            true,
        ),
        (
            QkvLayout { n_heads: 9, n_kv_heads: 3, head_dim: 64 },
            RopeConfig { scaling: ROPE_SCALINGS[1], ..rope(64, RopeLayout::Interleaved) },
            false,
        ),
        (
            QkvLayout { n_heads: 4, n_kv_heads: 2, head_dim: 64 },
            RopeConfig { scaling: ROPE_SCALINGS[3], ..rope(64, RopeLayout::HalfSplit) },
            true,
        ),
    ]
}

#[test]
fn qk_norm_rope_write_kv_and_attention_match_reference() {
    let r = ReferenceBackend;
    let mut g = rng(4);
    for cpu in backends(2) {
        for (layout, rope, norms) in layouts() {
            let b = attention_batch(17, &[1, 3, 16, 40]);
            let rows = b.layout.num_rows();
            let mut lay = b.layout.clone();
            // far positions check the RoPE angles
            if norms {
                lay.positions.iter_mut().for_each(|p| *p += 30_000);
            }
            let hd = layout.head_dim;
            let (qn, kn) = (random(&mut g, hd), random(&mut g, hd));
            let (qn, kn) = if norms { (Some(&qn), Some(&kn)) } else { (None, None) };
            let mut cache_c = cpu.kv_cache(2, b.next_slot as usize, layout.n_kv_heads, hd).unwrap();
            let mut cache_r = r.kv_cache(2, b.next_slot as usize, layout.n_kv_heads, hd).unwrap();
            let bc = cpu.prepare_batch(&lay, &cache_c).unwrap();
            let br = r.prepare_batch(&lay, &cache_r).unwrap();

            let qkv = tensor(&mut g, rows, layout.qkv_dim());
            let (mut qc, mut qr) = (qkv.clone(), qkv);
            cpu.qk_norm_rope(&mut qc, layout, qn, kn, 1e-6, rope, &bc).unwrap();
            r.qk_norm_rope(&mut qr, layout, qn, kn, 1e-6, rope, &br).unwrap();
            let what = format!("{} {layout:?} {:?}", cpu.name(), rope);
            assert_close(&format!("qk_norm_rope {what}"), &qc.data, &qr.data, ELEMENTWISE_TOL);

            // Attention on identical inputs (the reference's rotated qkv) to isolate its error.
            cpu.write_kv(&qr, layout, &mut cache_c, 1, &bc).unwrap();
            r.write_kv(&qr, layout, &mut cache_r, 1, &br).unwrap();
            assert_bits_eq("write_kv k", &cache_c.k[1], &cache_r.k[1]);
            assert_bits_eq("write_kv v", &cache_c.v[1], &cache_r.v[1]);
            let (mut oc, mut or) = (HostTensor::zeros(rows, layout.q_dim()), HostTensor::zeros(rows, layout.q_dim()));
            cpu.attention(&qr, layout, &cache_c, 1, &bc, &mut oc).unwrap();
            r.attention(&qr, layout, &cache_r, 1, &br, &mut or).unwrap();
            assert_close(&format!("attention {what}"), &oc.data, &or.data, ELEMENTWISE_TOL);
        }
    }
}

#[test]
fn attention_matches_reference_on_long_contexts() {
    // Scores of large magnitude and a context of several hundred keys.
    let r = ReferenceBackend;
    let mut g = rng(5);
    let cpu = CpuBackend::new(2).unwrap();
    let layout = QkvLayout { n_heads: 9, n_kv_heads: 3, head_dim: 64 };
    let b = attention_batch(333, &[70, 129]);
    let rows = b.layout.num_rows();
    let mut cache_c = cpu.kv_cache(1, b.next_slot as usize, 3, 64).unwrap();
    let mut cache_r = r.kv_cache(1, b.next_slot as usize, 3, 64).unwrap();
    let bc = cpu.prepare_batch(&b.layout, &cache_c).unwrap();
    let br = r.prepare_batch(&b.layout, &cache_r).unwrap();
    let mut qkv = tensor(&mut g, rows, layout.qkv_dim());
    qkv.data.iter_mut().for_each(|v| *v *= 4.0);
    cpu.write_kv(&qkv, layout, &mut cache_c, 0, &bc).unwrap();
    r.write_kv(&qkv, layout, &mut cache_r, 0, &br).unwrap();
    let (mut oc, mut or) = (HostTensor::zeros(rows, layout.q_dim()), HostTensor::zeros(rows, layout.q_dim()));
    cpu.attention(&qkv, layout, &cache_c, 0, &bc, &mut oc).unwrap();
    r.attention(&qkv, layout, &cache_r, 0, &br, &mut or).unwrap();
    assert_close("attention, long contexts", &oc.data, &or.data, 1e-4);
}

fn is_shape_err<T>(r: Result<T, KernelError>) -> bool {
    matches!(r, Err(KernelError::Shape(_)))
}

#[test]
fn inconsistent_shapes_are_errors_not_panics() {
    let cpu = CpuBackend::new(2).unwrap();
    let mut g = rng(6);
    assert!(is_shape_err(cpu.linear_weight(&[0.0; 5], 2, 3)));
    assert!(is_shape_err(cpu.from_host(&[0.0; 5], 2, 3)));
    let w = cpu.linear_weight(&random(&mut g, 12), 4, 3).unwrap();
    let x = tensor(&mut g, 2, 3);
    assert!(is_shape_err(cpu.matmul(&tensor(&mut g, 2, 4), &w, None, &mut HostTensor::zeros(2, 4))));
    assert!(is_shape_err(cpu.matmul(&x, &w, None, &mut HostTensor::zeros(3, 4))));
    assert!(is_shape_err(cpu.matmul(&x, &w, Some(&vec![0.0; 3]), &mut HostTensor::zeros(2, 4))));
    assert!(is_shape_err(cpu.matmul_add(&x, &w, &mut HostTensor::zeros(2, 5))));
    let broken = HostTensor { data: vec![0.0; 5], rows: 2, cols: 3 };
    assert!(is_shape_err(cpu.matmul(&broken, &w, None, &mut HostTensor::zeros(2, 4))));
    assert!(is_shape_err(cpu.rms_norm(&x, &vec![1.0; 2], 1e-5, &mut HostTensor::zeros(2, 3))));
    assert!(is_shape_err(cpu.silu_mul(&tensor(&mut g, 2, 5), &mut HostTensor::zeros(2, 2))));
    assert!(is_shape_err(cpu.gather_rows(&x, &[2], &mut HostTensor::zeros(1, 3))));
    assert!(is_shape_err(cpu.dot_rows(&x, &vec![1.0; 4])));
    let emb = cpu.embedding(&random(&mut g, 12), 4, 3).unwrap();
    assert!(is_shape_err(cpu.lm_logits(&x, &emb, &mut HostTensor::zeros(2, 3))));

    let layout = QkvLayout { n_heads: 2, n_kv_heads: 1, head_dim: 4 };
    let mut b = LayoutBuilder::default();
    b.push_seq(&[], 3);
    let mut cache = cpu.kv_cache(1, 3, 1, 4).unwrap();
    let batch = cpu.prepare_batch(&b.layout, &cache).unwrap();
    let mut bad_ids = b.layout.clone();
    bad_ids.token_ids[1] = 4;
    let bad_batch = cpu.prepare_batch(&bad_ids, &cache).unwrap();
    assert!(is_shape_err(cpu.embed(&emb, &bad_batch, &mut HostTensor::zeros(3, 3))));
    let mut qkv = tensor(&mut g, 3, layout.qkv_dim());
    let rope = RopeConfig { theta: 1e4, rotary_dim: 4, layout: RopeLayout::HalfSplit, scaling: Default::default() };
    assert!(is_shape_err(cpu.qk_norm_rope(
        &mut qkv,
        layout,
        None,
        None,
        1e-6,
        RopeConfig { rotary_dim: 6, ..rope },
        &batch
    )));
    assert!(is_shape_err(cpu.qk_norm_rope(&mut qkv, layout, Some(&vec![1.0; 3]), None, 1e-6, rope, &batch)));
    assert!(is_shape_err(cpu.qk_norm_rope(
        &mut qkv,
        QkvLayout { n_heads: 3, n_kv_heads: 2, head_dim: 4 },
        None,
        None,
        1e-6,
        rope,
        &batch
    )));
    assert!(is_shape_err(cpu.write_kv(&qkv, layout, &mut cache, 1, &batch)));
    assert!(is_shape_err(cpu.write_kv(&tensor(&mut g, 2, layout.qkv_dim()), layout, &mut cache, 0, &batch)));
    let mut small = cpu.kv_cache(1, 2, 1, 4).unwrap();
    assert!(is_shape_err(cpu.write_kv(&qkv, layout, &mut small, 0, &batch)));
    assert!(is_shape_err(cpu.prepare_batch(&b.layout, &small)));
    let mut overlapping = b.layout.clone();
    overlapping.seqs.push(overlapping.seqs[0]);
    assert!(is_shape_err(cpu.prepare_batch(&overlapping, &cache)));
    let mut wide = cpu.kv_cache(1, 3, 2, 4).unwrap();
    assert!(is_shape_err(cpu.write_kv(&qkv, layout, &mut wide, 0, &batch)));
    assert!(is_shape_err(cpu.attention(&qkv, layout, &cache, 0, &batch, &mut HostTensor::zeros(3, 4))));
    // and the consistent calls succeed
    cpu.qk_norm_rope(&mut qkv, layout, None, None, 1e-6, rope, &batch).unwrap();
    cpu.write_kv(&qkv, layout, &mut cache, 0, &batch).unwrap();
    cpu.attention(&qkv, layout, &cache, 0, &batch, &mut HostTensor::zeros(3, 8)).unwrap();
}
