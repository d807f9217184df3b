//! The MoE op: every CPU variant against the plain per-token reference loop (f64), over
//! histograms with empty experts, one hot expert, an even spread and random routing; bitwise
//! equality across variants, batch composition and thread counts; the statistics; the selector.
//!
//! Tolerance: |cpu − reference| ≤ 5e-5 × max |reference| (two f32 GEMMs, SwiGLU and a k-term
//! weighted sum against f64; measured ≤ 1e-5).

mod common;

use std::time::Duration;

use common::*;
use rand::Rng;
use sieve_kernels::autotune::autotune;
use sieve_kernels::host::HostTensor;
use sieve_kernels::moe::{MoeCostModel, VariantCost};
use sieve_kernels::reference::ReferenceBackend;
use sieve_kernels::{Backend, CpuBackend, MoeRouting, MoeSelect};

const MOE_TOL: f32 = 5e-5;

/// Rows whose router logits put `choice[t]` first, in that order (gaps of 0.75), the other
/// experts well below; the coordinates past the experts are random.
fn rows_routed_to(g: &mut impl Rng, hidden: usize, experts: usize, choices: &[Vec<usize>]) -> HostTensor {
    let mut x = tensor(g, choices.len(), hidden);
    for (t, choice) in choices.iter().enumerate() {
        let row = x.row_mut(t);
        for v in row.iter_mut().take(experts) {
            *v = -3.0 + g.random_range(-0.3f32..0.3);
        }
        for (j, &e) in choice.iter().enumerate() {
            row[e] = 4.0 - 0.75 * j as f32;
        }
    }
    x
}

/// Named routings of `tokens` rows over `experts` experts, top-k.
fn routings(g: &mut impl Rng, tokens: usize, experts: usize, k: usize) -> Vec<(&'static str, Vec<Vec<usize>>)> {
    let distinct = |g: &mut dyn rand::RngCore, first: Option<usize>, pool: usize| {
        let mut c: Vec<usize> = first.into_iter().collect();
        while c.len() < k {
            let e = g.random_range(0..pool);
            if !c.contains(&e) {
                c.push(e);
            }
        }
        c
    };
    vec![
        ("even spread", (0..tokens).map(|t| (0..k).map(|j| (t * k + j) % experts).collect()).collect()),
        ("one hot expert", (0..tokens).map(|_| distinct(g, Some(experts / 2), experts)).collect()),
        ("empty experts", (0..tokens).map(|_| distinct(g, None, (k + 2).min(experts))).collect()),
        ("random", (0..tokens).map(|_| distinct(g, None, experts)).collect()),
    ]
}

fn run_cpu(
    cpu: &CpuBackend,
    w: &sieve_kernels::cpu::CpuMoeWeights,
    x: &HostTensor,
    acc0: &HostTensor,
    routing: MoeRouting,
    select: MoeSelect,
) -> (HostTensor, sieve_kernels::MoeLayerStats) {
    let mut acc = acc0.clone();
    let mut log = cpu.moe_log().unwrap();
    cpu.moe_ffn(x, w, routing, select, &mut acc, &mut log).unwrap();
    let stats = cpu.read_moe_log(&mut log).unwrap();
    assert_eq!(stats.len(), 1);
    assert!(cpu.read_moe_log(&mut log).unwrap().is_empty(), "reading drains the log");
    (acc, stats[0])
}

#[test]
fn every_variant_matches_the_per_token_reference() {
    let r = ReferenceBackend;
    let mut g = rng(41);
    // Odd widths (not multiples of the 32-column panels), 16 experts, top-4; with and without
    // the shared expert and the renormalisation.
    for (shared, norm, bf16) in [(None, true, false), (Some(24), false, false), (None, true, true)] {
        let layer = MoeLayer::new(&mut g, 50, 16, 40, shared);
        let layer = if bf16 { layer.rounded_to_bf16() } else { layer };
        let rw = r.moe_weights(&layer.host()).unwrap();
        let routing = MoeRouting { top_k: 4, norm_topk_prob: norm };
        for cpu in backends(2) {
            let w = cpu.moe_weights(&layer.host()).unwrap();
            assert_eq!(w.has_bf16_panels(), bf16, "bf16 panels exactly when the weights are bf16");
            let variants = cpu.moe_variants();
            for &tokens in &[1usize, 9, 300] {
                for (name, choice) in routings(&mut g, tokens, layer.experts, routing.top_k) {
                    let x = rows_routed_to(&mut g, layer.hidden, layer.experts, &choice);
                    let acc0 = tensor(&mut g, tokens, layer.hidden);
                    let mut want = acc0.clone();
                    let mut rlog = r.moe_log().unwrap();
                    r.moe_ffn(&x, &rw, routing, MoeSelect::Fixed(0), &mut want, &mut rlog).unwrap();
                    let rstats = r.read_moe_log(&mut rlog).unwrap()[0];
                    let mut first: Option<HostTensor> = None;
                    for (v, variant) in variants.iter().enumerate() {
                        let what = format!(
                            "{} {} tokens={tokens} {name} shared={shared:?} norm={norm} bf16={bf16}",
                            cpu.name(),
                            variant.name
                        );
                        let (got, stats) = run_cpu(&cpu, &w, &x, &acc0, routing, MoeSelect::Fixed(v));
                        assert_close(&what, &got.data, &want.data, MOE_TOL);
                        match &first {
                            None => first = Some(got),
                            Some(f) => assert_bits_eq(&format!("{what} vs {}", variants[0].name), &got.data, &f.data),
                        }
                        assert_eq!(stats.variant as usize, v);
                        assert_eq!(
                            (stats.tokens, stats.rows, stats.active_experts, stats.max_expert_rows),
                            (rstats.tokens, rstats.rows, rstats.active_experts, rstats.max_expert_rows),
                            "{what}: stats"
                        );
                        let hist = histogram(&choice, layer.experts);
                        assert_eq!(
                            stats.padded_rows,
                            hist.iter().map(|&n| variant.computed_rows(n)).sum::<u64>(),
                            "{what}: padded rows"
                        );
                    }
                }
            }
        }
    }
}

fn histogram(choice: &[Vec<usize>], experts: usize) -> Vec<u32> {
    let mut h = vec![0u32; experts];
    for c in choice {
        for &e in c {
            h[e] += 1;
        }
    }
    h
}

#[test]
fn histograms_are_what_the_routings_say() {
    let mut g = rng(42);
    let r = routings(&mut g, 40, 16, 4);
    let hist = |name: &str| histogram(&r.iter().find(|(n, _)| *n == name).unwrap().1, 16);
    assert_eq!(hist("even spread"), vec![10; 16]);
    assert_eq!(hist("one hot expert")[8], 40);
    assert_eq!(hist("empty experts")[6..].iter().sum::<u32>(), 0);
}

#[test]
fn a_row_is_bitwise_independent_of_its_batch_variant_and_threads() {
    let mut g = rng(43);
    let layer = MoeLayer::new(&mut g, 64, 16, 48, Some(32));
    let routing = MoeRouting { top_k: 4, norm_topk_prob: true };
    // Random routing through the real router path: random router weights; bf16 experts, so
    // that grouped_bf16 streams bf16 panels.
    let mut layer_r = layer.rounded_to_bf16();
    layer_r.router = random(&mut g, 16 * 64);
    let row = random(&mut g, 64);
    let acc_row = random(&mut g, 64);
    for isa_backends in [backends(1), backends(2)].into_iter().flatten().collect::<Vec<_>>().chunks(1) {
        let cpu = &isa_backends[0];
        let w = cpu.moe_weights(&layer_r.host()).unwrap();
        let mut results = Vec::new();
        for &(m, at) in &[(1usize, 0usize), (5, 2), (200, 117)] {
            let mut x = tensor(&mut g, m, 64);
            x.row_mut(at).copy_from_slice(&row);
            let mut acc = tensor(&mut g, m, 64);
            acc.row_mut(at).copy_from_slice(&acc_row);
            for v in 0..cpu.moe_variants().len() {
                let (out, _) = run_cpu(cpu, &w, &x, &acc, routing, MoeSelect::Fixed(v));
                results.push((format!("{} m={m} at={at} variant {v}", cpu.name()), out.row(at).to_vec()));
            }
        }
        for (what, out) in &results[1..] {
            assert_bits_eq(what, out, &results[0].1);
        }
    }
    // And across thread counts (same ISA).
    let (one, two) = (CpuBackend::new(1).unwrap(), CpuBackend::new(2).unwrap());
    let x = tensor(&mut g, 77, 64);
    let acc = tensor(&mut g, 77, 64);
    let (w1, w2) = (one.moe_weights(&layer_r.host()).unwrap(), two.moe_weights(&layer_r.host()).unwrap());
    for v in 0..one.moe_variants().len() {
        let (a, _) = run_cpu(&one, &w1, &x, &acc, routing, MoeSelect::Fixed(v));
        let (b, _) = run_cpu(&two, &w2, &x, &acc, routing, MoeSelect::Fixed(v));
        assert_bits_eq(&format!("1 vs 2 threads, variant {v}"), &a.data, &b.data);
    }
}

#[test]
fn auto_runs_the_variant_the_cost_model_picks() {
    let mut g = rng(44);
    let layer = MoeLayer::new(&mut g, 48, 16, 32, None);
    let cpu = CpuBackend::new(2).unwrap();
    let w = cpu.moe_weights(&layer.host()).unwrap();
    let variants = cpu.moe_variants();
    let routing = MoeRouting { top_k: 2, norm_topk_prob: true };
    let idx = |name: &str| variants.iter().position(|v| v.name == name).unwrap();
    // The GPU padding-ratio rule over the CPU twins of BLOCK_M 128 / 64.
    let rule = MoeCostModel::padding_ratio_rule("padded128", "padded64", 1.5);
    rule.validate(&variants).unwrap();
    // 8 rows per active expert: padded 128 / 8 = 16 > 1.5 → padded64.
    let few: Vec<Vec<usize>> = (0..32).map(|t| vec![t % 8, 8 + t % 8]).collect();
    let x = rows_routed_to(&mut g, 48, 16, &few);
    let acc = tensor(&mut g, 32, 48);
    let (_, s) = run_cpu(&cpu, &w, &x, &acc, routing, MoeSelect::Auto(&rule));
    assert_eq!(s.variant as usize, idx("padded64"));
    assert_eq!(s.padded_rows, 16 * 64);
    // 120 rows on each of 2 experts: 256 / 240 ≈ 1.07 → padded128.
    let many: Vec<Vec<usize>> = (0..120).map(|_| vec![3, 11]).collect();
    let x = rows_routed_to(&mut g, 48, 16, &many);
    let acc = tensor(&mut g, 120, 48);
    let (_, s) = run_cpu(&cpu, &w, &x, &acc, routing, MoeSelect::Auto(&rule));
    assert_eq!(s.variant as usize, idx("padded128"));
    assert_eq!((s.rows, s.padded_rows, s.active_experts, s.max_expert_rows), (240, 256, 2, 120));
    // A table model: small_m at 1 row per expert, grouped at 4.
    let table = MoeCostModel {
        variants: vec![
            VariantCost {
                variant: "small_m".into(),
                per_call: 0.0,
                per_expert: vec![1.0, 2.0, 4.0, 8.0],
                per_row: 0.0,
                per_padded_row: 0.0,
            },
            VariantCost {
                variant: "grouped".into(),
                per_call: 0.0,
                per_expert: vec![2.0, 3.0, 3.5, 6.0],
                per_row: 0.0,
                per_padded_row: 0.0,
            },
        ],
        origin: "test".into(),
        tie_margin: 0.0,
    };
    let (_, s) = run_cpu(
        &cpu,
        &w,
        &rows_routed_to(&mut g, 48, 16, &few),
        &tensor(&mut g, 32, 48),
        routing,
        MoeSelect::Auto(&table),
    );
    assert_eq!(s.variant as usize, idx("grouped"));
    let sparse: Vec<Vec<usize>> = (0..8).map(|t| vec![t, 8 + t]).collect();
    let (_, s) = run_cpu(
        &cpu,
        &w,
        &rows_routed_to(&mut g, 48, 16, &sparse),
        &tensor(&mut g, 8, 48),
        routing,
        MoeSelect::Auto(&table),
    );
    assert_eq!(s.variant as usize, idx("small_m"));
}

#[test]
fn bad_calls_are_errors_not_panics() {
    let mut g = rng(45);
    let layer = MoeLayer::new(&mut g, 32, 8, 16, None);
    let cpu = CpuBackend::new(2).unwrap();
    let w = cpu.moe_weights(&layer.host()).unwrap();
    let mut log = cpu.moe_log().unwrap();
    let ok = MoeRouting { top_k: 2, norm_topk_prob: true };
    let x = tensor(&mut g, 3, 32);
    let mut acc = tensor(&mut g, 3, 32);
    assert!(cpu
        .moe_ffn(&x, &w, MoeRouting { top_k: 9, norm_topk_prob: true }, MoeSelect::Fixed(0), &mut acc, &mut log)
        .is_err());
    assert!(cpu.moe_ffn(&x, &w, ok, MoeSelect::Fixed(99), &mut acc, &mut log).is_err());
    assert!(cpu.moe_ffn(&tensor(&mut g, 3, 31), &w, ok, MoeSelect::Fixed(0), &mut acc, &mut log).is_err());
    assert!(cpu.moe_time_variant(&w, 99, &[1; 8]).is_err());
    assert!(cpu.moe_time_variant(&w, 0, &[1; 7]).is_err());
    let mut short = layer.host();
    short.down = &layer.down[1..];
    assert!(cpu.moe_weights(&short).is_err());
    // Zero rows is fine and logs an empty call.
    let mut empty = HostTensor::zeros(0, 32);
    cpu.moe_ffn(&HostTensor::zeros(0, 32), &w, ok, MoeSelect::Fixed(0), &mut empty, &mut log).unwrap();
    assert_eq!(cpu.read_moe_log(&mut log).unwrap()[0].rows, 0);
}

#[test]
fn autotune_out_of_budget_before_any_whole_tile_still_costs_every_variant() {
    // A zero budget times only the first two knots (1 and 2 rows per expert): the padded
    // variants, timed only at whole tiles, get no measurement. They must be costed (at the
    // pruning floor, dearer than what was measured), not panic or be extrapolated from nothing.
    let mut g = rng(47);
    let layer = MoeLayer::new(&mut g, 64, 16, 48, None);
    let cpu = CpuBackend::new(2).unwrap();
    let w = cpu.moe_weights(&layer.host()).unwrap();
    let (model, report) = autotune(&cpu, &w, 16, Duration::ZERO).unwrap();
    model.validate(&cpu.moe_variants()).unwrap();
    assert_eq!(report.knots_measured, 2, "{report:?}");
    let costs = |name: &str| &model.variants.iter().find(|c| c.variant == name).unwrap().per_expert;
    let measured: Vec<&str> =
        model.variants.iter().map(|c| c.variant.as_str()).filter(|n| !n.starts_with("padded")).collect();
    for padded in ["padded64", "padded128"] {
        for (ki, &p) in costs(padded).iter().enumerate() {
            let cheapest = measured.iter().map(|n| costs(n)[ki]).fold(f64::INFINITY, f64::min);
            assert!(p.is_finite() && p > cheapest, "{padded} at knot {ki}: {p} vs the cheapest measured {cheapest}");
        }
    }
}

#[test]
fn autotune_fits_a_model_within_its_budget() {
    let mut g = rng(46);
    let layer = MoeLayer::new(&mut g, 64, 16, 48, None);
    let cpu = CpuBackend::new(2).unwrap();
    let w = cpu.moe_weights(&layer.host()).unwrap();
    let (model, report) = autotune(&cpu, &w, 16, Duration::from_millis(300)).unwrap();
    model.validate(&cpu.moe_variants()).unwrap();
    assert_eq!(model.variants.len(), cpu.moe_variants().len());
    assert!(report.knots_measured >= 2 && report.samples > 0);
    for c in &model.variants {
        assert_eq!(
            c.per_expert.len(),
            sieve_kernels::moe::COST_KNOTS.len(),
            "{}: extrapolated to every knot",
            c.variant
        );
        assert!(c.per_expert.iter().all(|&t| t.is_finite() && t >= 0.0), "{c:?}");
    }
    // The padded twins compute 64 / 128 rows for a 1-row expert: they must be measured dearer
    // than the exact variants there (a 64× difference in work is far above timing noise).
    let at1 = |name: &str| model.variants.iter().find(|c| c.variant == name).unwrap().per_expert[0];
    assert!(at1("padded128") > at1("grouped"), "{model:?}");
}
