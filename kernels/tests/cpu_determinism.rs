//! Bitwise batch invariance of the CPU backend: a row's result must not depend on the batch it
//! is in, its position there, the thread count, or whether its context is a shared prefix.

mod common;

use common::*;
use sieve_kernels::cpu::Isa;
use sieve_kernels::host::HostTensor;
use sieve_kernels::{Backend, BatchLayout, CpuBackend, QkvLayout, RopeConfig, RopeLayout};

/// Rows of a batch of `m` random rows with `row` placed at index `at`.
fn batch_with(g: &mut impl rand::Rng, row: &[f32], m: usize, at: usize) -> HostTensor {
    let k = row.len();
    let mut x = tensor(g, m, k);
    x.data[at * k..(at + 1) * k].copy_from_slice(row);
    x
}

#[test]
fn gemm_row_is_bitwise_independent_of_batch_and_threads() {
    let mut g = rng(10);
    for isa in [Isa::Avx512, Isa::Avx2, Isa::Portable].into_iter().filter(|isa| isa.is_supported()) {
        let one = CpuBackend::with_isa(1, isa).unwrap();
        let two = CpuBackend::with_isa(2, isa).unwrap();
        // SmolLM2's projection shapes, odd ones, and a K long enough to be split in K blocks.
        for &(n, k) in &[(960, 576), (576, 1536), (3072, 576), (100, 70), (33, 17), (40, 4500)] {
            if isa != Isa::detect() && n * k > 600_000 {
                continue; // the fallback paths are slower; the odd shapes cover them
            }
            let wd = random(&mut g, n * k);
            let bias = random(&mut g, n);
            let (w1, w2) = (one.linear_weight(&wd, n, k).unwrap(), two.linear_weight(&wd, n, k).unwrap());
            let row = random(&mut g, k);
            let acc_row = random(&mut g, n);
            let mut results = Vec::new();
            for &(m, at) in &[(1, 0), (7, 3), (300, 211), (16, 15), (64, 5)] {
                let x = batch_with(&mut g, &row, m, at);
                for (cpu, w) in [(&one, &w1), (&two, &w2)] {
                    let mut out = HostTensor::zeros(m, n);
                    cpu.matmul(&x, w, Some(&bias), &mut out).unwrap();
                    let mut acc = batch_with(&mut g, &acc_row, m, at);
                    cpu.matmul_add(&x, w, &mut acc).unwrap();
                    results.push((
                        format!("m={m} at={at} threads={}", cpu.threads()),
                        out.row(at).to_vec(),
                        acc.row(at).to_vec(),
                    ));
                }
            }
            let (_, first, first_acc) = &results[0];
            for (what, out, acc) in &results[1..] {
                assert_bits_eq(&format!("{isa:?} matmul {n}x{k} {what}"), out, first);
                assert_bits_eq(&format!("{isa:?} matmul_add {n}x{k} {what}"), acc, first_acc);
            }
        }
    }
}

#[test]
fn every_tile_shape_gives_the_single_row_bits() {
    // M = 1..=30 walks every tile shape (1..14 rows, 1..4 panels, tail tiles and panel groups);
    // N = 130 is 5 panels (a partial one), so 4-panel groups leave a 1-panel tail.
    let mut g = rng(14);
    let (n, k) = (130, 37);
    for isa in [Isa::Avx512, Isa::Avx2, Isa::Portable].into_iter().filter(|isa| isa.is_supported()) {
        let cpu = CpuBackend::with_isa(2, isa).unwrap();
        let wd = random(&mut g, n * k);
        let w = cpu.linear_weight(&wd, n, k).unwrap();
        let bias = random(&mut g, n);
        let x = tensor(&mut g, 30, k);
        let single: Vec<Vec<f32>> = (0..30)
            .map(|r| {
                let mut out = HostTensor::zeros(1, n);
                cpu.matmul(&HostTensor::from_vec(x.row(r).to_vec(), 1, k), &w, Some(&bias), &mut out).unwrap();
                out.data
            })
            .collect();
        for m in 1..=30 {
            let xm = HostTensor::from_vec(x.data[..m * k].to_vec(), m, k);
            let mut out = HostTensor::zeros(m, n);
            cpu.matmul(&xm, &w, Some(&bias), &mut out).unwrap();
            for (r, want) in single.iter().enumerate().take(m) {
                assert_bits_eq(&format!("{isa:?} m={m} row {r}"), out.row(r), want);
            }
        }
    }
}

#[test]
fn row_ops_are_bitwise_independent_of_batch_and_threads() {
    let mut g = rng(11);
    let (one, two) = (CpuBackend::new(1).unwrap(), CpuBackend::new(2).unwrap());
    let cols = 576;
    let w = random(&mut g, 2 * cols);
    let row = random(&mut g, 2 * cols);
    let mut seen: Vec<(Vec<f32>, Vec<f32>, f32)> = Vec::new();
    for &(m, at) in &[(1, 0), (3000, 2500)] {
        for cpu in [&one, &two] {
            let x = batch_with(&mut g, &row, m, at);
            let mut normed = HostTensor::zeros(m, 2 * cols);
            cpu.rms_norm(&x, &w, 1e-5, &mut normed).unwrap();
            let mut activated = HostTensor::zeros(m, cols);
            cpu.silu_mul(&x, &mut activated).unwrap();
            let dots = cpu.dot_rows(&x, &w).unwrap();
            seen.push((normed.row(at).to_vec(), activated.row(at).to_vec(), dots[at]));
        }
    }
    for s in &seen[1..] {
        assert_bits_eq("rms_norm", &s.0, &seen[0].0);
        assert_bits_eq("silu_mul", &s.1, &seen[0].1);
        assert_eq!(s.2.to_bits(), seen[0].2.to_bits(), "dot_rows");
    }
}

const LAYOUT: QkvLayout = QkvLayout { n_heads: 9, n_kv_heads: 3, head_dim: 64 };

/// Runs qk_norm_rope + write_kv + attention for `layout` with the given pre-rope QKV rows,
/// returning the attention output.
fn forward(
    cpu: &CpuBackend,
    lay: QkvLayout,
    norms: bool,
    layout: &BatchLayout,
    slots: usize,
    qkv: &HostTensor,
) -> HostTensor {
    let rope = RopeConfig {
        theta: 10000.0,
        rotary_dim: lay.head_dim,
        layout: RopeLayout::HalfSplit,
        scaling: Default::default(),
    };
    let w: Vec<f32> = (0..lay.head_dim).map(|i| 0.5 + i as f32 / lay.head_dim as f32).collect();
    let norm = norms.then_some(&w);
    let mut cache = cpu.kv_cache(1, slots, lay.n_kv_heads, lay.head_dim).unwrap();
    let batch = cpu.prepare_batch(layout, &cache).unwrap();
    let mut qkv = qkv.clone();
    cpu.qk_norm_rope(&mut qkv, lay, norm, norm, 1e-6, rope, &batch).unwrap();
    cpu.write_kv(&qkv, lay, &mut cache, 0, &batch).unwrap();
    let mut out = HostTensor::zeros(qkv.rows, lay.q_dim());
    cpu.attention(&qkv, lay, &cache, 0, &batch, &mut out).unwrap();
    out
}

#[test]
fn attention_over_a_shared_prefix_equals_each_full_prompt_alone() {
    let mut g = rng(12);
    let items = [1usize, 5, 16, 23, 70];
    for (lay, norms) in [(LAYOUT, false), (QkvLayout { n_heads: 4, n_kv_heads: 4, head_dim: 128 }, true)] {
        for isa in [Isa::Avx512, Isa::Avx2, Isa::Portable].into_iter().filter(|isa| isa.is_supported()) {
            for threads in [1, 2] {
                let cpu = CpuBackend::with_isa(threads, isa).unwrap();
                for prefix in [15usize, 16, 17, 33] {
                    // One batch: the prefix once, then every item pointing at the prefix slots.
                    let mut b = LayoutBuilder::default();
                    b.push_seq(&[], prefix);
                    let prefix_slots = b.context_slots(0);
                    let first_rows: Vec<usize> = items.iter().map(|&n| b.push_seq(&prefix_slots, n)).collect();
                    let rows = b.layout.num_rows();
                    let qkv = tensor(&mut g, rows, lay.qkv_dim());
                    let shared = forward(&cpu, lay, norms, &b.layout, b.next_slot as usize, &qkv);

                    for (i, &n) in items.iter().enumerate() {
                        // The item's full prompt (prefix rows + its rows) as one sequence, alone.
                        // (different physical slots from the shared run)
                        let mut alone = LayoutBuilder { next_slot: 5, ..Default::default() };
                        alone.push_seq(&[], prefix + n);
                        let mut data = qkv.data[..prefix * lay.qkv_dim()].to_vec();
                        data.extend_from_slice(
                            &qkv.data[first_rows[i] * lay.qkv_dim()..(first_rows[i] + n) * lay.qkv_dim()],
                        );
                        let q = HostTensor::from_vec(data, prefix + n, lay.qkv_dim());
                        let out = forward(&cpu, lay, norms, &alone.layout, alone.next_slot as usize, &q);
                        let what = format!("{isa:?} threads={threads} {lay:?} prefix={prefix} item {i} (n={n})");
                        assert_bits_eq(
                            &what,
                            &out.data[prefix * lay.q_dim()..],
                            &shared.data[first_rows[i] * lay.q_dim()..(first_rows[i] + n) * lay.q_dim()],
                        );
                        // and the prefix rows themselves match the alone run's first rows
                        assert_bits_eq(
                            &format!("{what} prefix rows"),
                            &out.data[..prefix * lay.q_dim()],
                            &shared.data[..prefix * lay.q_dim()],
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn attention_row_is_independent_of_later_keys_and_batch_mates() {
    // The first rows of a sequence give the same bits when the sequence is cut short (fewer later
    // keys / queries) or computed with other sequences in the batch.
    let mut g = rng(13);
    let cpu = CpuBackend::new(2).unwrap();
    let full = 150;
    let qkv = tensor(&mut g, full, LAYOUT.qkv_dim());
    let mut b = LayoutBuilder::default();
    b.push_seq(&[], full);
    let whole = forward(&cpu, LAYOUT, false, &b.layout, full, &qkv);
    for cut in [1usize, 17, 64, 65, 149] {
        let mut b = LayoutBuilder::default();
        let other = tensor(&mut g, 40, LAYOUT.qkv_dim());
        b.push_seq(&[], 40);
        b.push_seq(&[], cut);
        let mut data = other.data.clone();
        data.extend_from_slice(&qkv.data[..cut * LAYOUT.qkv_dim()]);
        let q = HostTensor::from_vec(data, 40 + cut, LAYOUT.qkv_dim());
        let out = forward(&cpu, LAYOUT, false, &b.layout, b.next_slot as usize, &q);
        assert_bits_eq(&format!("cut at {cut}"), &out.data[40 * LAYOUT.q_dim()..], &whole.data[..cut * LAYOUT.q_dim()]);
    }
}
