//! The MoE kernels' CPU twins against a plain per-token loop: route each token (softmax, top-k,
//! renormalise), run its top-k experts' SwiGLU MLPs, sum weighted by the routing weights.
//! Histograms cover empty experts, one hot expert and a uniform spread; both grouped-GEMM
//! variants and the auto selector must give the same result.
//!
//! Tolerances (relative to the largest reference value):
//! - `BF16_AWARE_TOL` 1e-3: the plain loop rounds the expert inputs, the SwiGLU activation and
//!   each expert's output to bf16 where the device does, so only summation order (f32 vs f64) and
//!   a rare one-ulp bf16 rounding flip differ.
//! - `PLAIN_TOL` 2e-2: against the loop in f64 with only the weights in bf16 (the checkpoint).

mod common;

use common::*;
use rand::Rng;
use sieve_kernels::cuda::moe::{BlockM, MoeDims, MoeRouting, TilePolicy};
use sieve_kernels::cuda::twin::{self, warp::round_bf16, GroupedGemmArgs, TwinMoeWeights};
use sieve_kernels::cuda::GemmEngine;

const BF16_AWARE_TOL: f32 = 1e-3;
const PLAIN_TOL: f32 = 2e-2;

/// Softmax then top-k (probability descending, expert ascending on ties), optional renorm.
fn route(logits: &[f32], k: usize, renormalize: bool) -> Vec<(usize, f64)> {
    let mx = logits.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
    let exps: Vec<f64> = logits.iter().map(|&v| (v as f64 - mx).exp()).collect();
    let sum: f64 = exps.iter().sum();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| exps[b].partial_cmp(&exps[a]).unwrap().then(a.cmp(&b)));
    let picks: Vec<(usize, f64)> = order[..k].iter().map(|&e| (e, exps[e] / sum)).collect();
    let total: f64 = picks.iter().map(|p| p.1).sum();
    picks.into_iter().map(|(e, w)| (e, if renormalize { w / total } else { w })).collect()
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// The plain per-token MoE loop. `bf16_aware` rounds the expert inputs and the activation.
#[allow(clippy::too_many_arguments)]
fn plain_moe(
    x: &[f32],
    logits: &[f32],
    gate_up: &[f32],
    down: &[f32],
    dims: MoeDims,
    routing: MoeRouting,
    bf16_aware: bool,
) -> Vec<f32> {
    let MoeDims { hidden: h, inter: i, n_experts: ne } = dims;
    let tokens = x.len() / h;
    let rb = |v: f64| if bf16_aware { round_bf16(v as f32) as f64 } else { v };
    let mut out = vec![0f32; tokens * h];
    for t in 0..tokens {
        let xt: Vec<f64> = x[t * h..(t + 1) * h].iter().map(|&v| rb(v as f64)).collect();
        let mut acc = vec![0f64; h];
        for (e, w) in route(&logits[t * ne..(t + 1) * ne], routing.top_k, routing.renormalize) {
            let wgu = &gate_up[e * 2 * i * h..(e + 1) * 2 * i * h];
            let act: Vec<f64> = (0..i)
                .map(|c| {
                    let dot = |row: usize| {
                        wgu[row * h..(row + 1) * h]
                            .iter()
                            .zip(&xt)
                            .map(|(&a, &b)| round_bf16(a) as f64 * b)
                            .sum::<f64>()
                    };
                    rb(silu(dot(c)) * dot(i + c))
                })
                .collect();
            let wd = &down[e * h * i..(e + 1) * h * i];
            for (c, a) in acc.iter_mut().enumerate() {
                *a += w * rb(wd[c * i..(c + 1) * i]
                    .iter()
                    .zip(&act)
                    .map(|(&p, &q)| round_bf16(p) as f64 * q)
                    .sum::<f64>());
            }
        }
        for (o, a) in out[t * h..(t + 1) * h].iter_mut().zip(acc) {
            *o = a as f32;
        }
    }
    out
}

#[derive(Debug, Clone, Copy)]
enum Spread {
    Uniform,
    /// Every token's first pick is expert 3.
    OneHot,
    /// Only experts 0..4 are ever picked; the rest stay empty.
    FewExperts,
}

/// Router logits with well-separated values (no near-ties at the top-k boundary).
fn router_logits(g: &mut impl Rng, tokens: usize, n_experts: usize, spread: Spread) -> Vec<f32> {
    let mut logits = Vec::with_capacity(tokens * n_experts);
    for _ in 0..tokens {
        let mut order: Vec<usize> = (0..n_experts).collect();
        for j in (1..n_experts).rev() {
            order.swap(j, g.random_range(0..=j));
        }
        let mut row = vec![0f32; n_experts];
        for (rank, &e) in order.iter().enumerate() {
            row[e] = -(rank as f32) * 0.37 + g.random_range(-0.05..0.05);
        }
        match spread {
            Spread::Uniform => {}
            Spread::OneHot => row[3] = 40.0,
            Spread::FewExperts => {
                for (e, v) in row.iter_mut().enumerate() {
                    if e >= 4 {
                        *v -= 100.0;
                    }
                }
            }
        }
        logits.extend(row);
    }
    logits
}

#[test]
fn routing_picks_the_softmax_top_k() {
    let mut g = rng(40);
    for &(tokens, ne, k, renorm) in
        &[(1, 8, 2, true), (33, 64, 8, true), (17, 128, 4, false), (5, 512, 8, true), (9, 40, 32, false)]
    {
        let logits = router_logits(&mut g, tokens, ne, Spread::Uniform);
        let (mut ids, mut w) = (vec![0u32; tokens * k], vec![0f32; tokens * k]);
        twin::moe_topk_softmax(&logits, &mut ids, &mut w, tokens, ne, k, renorm);
        for t in 0..tokens {
            let want = route(&logits[t * ne..(t + 1) * ne], k, renorm);
            for (j, (e, wt)) in want.into_iter().enumerate() {
                assert_eq!(ids[t * k + j] as usize, e, "token {t} pick {j} ({ne} experts, top-{k})");
                assert!(
                    (w[t * k + j] as f64 - wt).abs() <= 1e-6,
                    "token {t} pick {j}: weight {} vs {wt}",
                    w[t * k + j]
                );
            }
        }
    }
    // Ties go to the lower expert.
    let logits = [1.0f32, 3.0, 3.0, 0.0, 3.0];
    let (mut ids, mut w) = (vec![0u32; 3], vec![0f32; 3]);
    twin::moe_topk_softmax(&logits, &mut ids, &mut w, 1, 5, 3, false);
    assert_eq!(ids, [1, 2, 4]);
}

#[test]
fn permutation_groups_rows_by_expert_in_assignment_order() {
    let mut g = rng(41);
    let (tokens, k, ne, hidden) = (300, 4, 16, 8); // 1200 assignments: 5 chunks
    let ids: Vec<u32> =
        (0..tokens * k).map(|_| if g.random_bool(0.5) { 2 } else { g.random_range(0..ne as u32) }).collect();
    let counts = twin::moe_chunk_counts(&ids, ne);
    let off = twin::moe_offsets(&counts, twin::n_chunks(ids.len()), ne);
    let x = random(&mut g, tokens * hidden);
    let (dest, xp) = twin::moe_scatter(&x, &ids, &off, k, hidden, ne);
    // dest is a bijection onto 0..A; rows of e are [offsets[e], offsets[e+1]) in assignment order.
    let mut seen = vec![false; ids.len()];
    for (a, &d) in dest.iter().enumerate() {
        assert!(!seen[d as usize], "row {d} written twice");
        seen[d as usize] = true;
        let e = ids[a] as usize;
        assert!(off.offsets[e] <= d && d < off.offsets[e + 1], "assignment {a} of expert {e} at row {d}");
        let earlier = ids[..a].iter().filter(|&&x| x as usize == e).count() as u32;
        assert_eq!(d, off.offsets[e] + earlier, "assignment order within expert {e}");
        for c in 0..hidden {
            assert_eq!(xp[d as usize * hidden + c], twin::warp::to_bf16(x[(a / k) * hidden + c]));
        }
    }
    for e in 0..ne {
        assert_eq!(off.counts[e] as usize, ids.iter().filter(|&&x| x as usize == e).count());
    }
    // Tile schedules: every row of every expert in exactly one tile per variant.
    for (bm, tiles, n) in [(64u32, &off.tiles64, off.n_tiles[0]), (128, &off.tiles128, off.n_tiles[1])] {
        let mut covered = vec![0u32; ids.len()];
        for t in 0..n as usize {
            let (e, r0) = (tiles[2 * t] as usize, tiles[2 * t + 1]);
            assert!(r0 < off.counts[e], "empty tile");
            for r in r0..(r0 + bm).min(off.counts[e]) {
                covered[(off.offsets[e] + r) as usize] += 1;
            }
        }
        assert!(covered.iter().all(|&c| c == 1), "BLOCK_M {bm}: rows not covered exactly once");
        assert!(n as usize <= twin::max_tiles(ids.len(), ne, bm as usize));
    }
}

#[test]
fn selector_applies_the_padding_ratio_rule() {
    // 8 experts with 1 row each: padded 1024 / real 8 → BLOCK_M 64.
    let c = twin::moe_select_tile(&[1; 8], 1.5, 0);
    assert_eq!((c.real_rows, c.padded64, c.padded128, c.block_m), (8, 512, 1024, 64));
    // One full expert: ratio 1 → 128.
    assert_eq!(twin::moe_select_tile(&[256, 0, 0], 1.5, 0).block_m, 128);
    // 100 rows in one expert: 128/100 = 1.28 → 128 at 1.5, 64 at 1.2.
    assert_eq!(twin::moe_select_tile(&[100], 1.5, 0).block_m, 128);
    assert_eq!(twin::moe_select_tile(&[100], 1.2, 0).block_m, 64);
    // Exactly at the threshold stays at 128 (the rule is "exceeds").
    assert_eq!(twin::moe_select_tile(&[64, 64, 64, 64, 0, 0], 2.0, 0).block_m, 128);
    assert_eq!(twin::moe_select_tile(&[64], 2.0, 0).block_m, 128);
    assert_eq!(twin::moe_select_tile(&[64], 1.99, 0).block_m, 64);
    // No rows at all, and forced variants.
    assert_eq!(twin::moe_select_tile(&[0, 0], 1.5, 0).block_m, 128);
    assert_eq!(twin::moe_select_tile(&[1; 8], 1.5, 128).block_m, 128);
    assert_eq!(twin::moe_select_tile(&[256], 1.5, 64).block_m, 64);
}

/// The grouped GEMM twin (fragment-level mma emulation) against a plain f64 GEMM per expert, on
/// odd N and K (N not a multiple of 64, K not a multiple of 32), empty and >128-row experts.
#[test]
fn grouped_gemm_fragments_compute_each_experts_product() {
    let mut g = rng(42);
    let ne = 6;
    let counts_per_expert = [0u32, 1, 130, 64, 0, 17];
    for &(n, k) in &[(72usize, 40usize), (64, 64), (8, 8), (130, 96)] {
        let ids: Vec<u32> = counts_per_expert
            .iter()
            .enumerate()
            .flat_map(|(e, &c)| std::iter::repeat_n(e as u32, c as usize))
            .collect();
        let n_assign = ids.len();
        let chunk_counts = twin::moe_chunk_counts(&ids, ne);
        let off = twin::moe_offsets(&chunk_counts, twin::n_chunks(n_assign), ne);
        let a: Vec<u16> = (0..n_assign * k).map(|_| twin::warp::to_bf16(g.random_range(-1.0..1.0))).collect();
        let w: Vec<u16> = (0..ne * n * k).map(|_| twin::warp::to_bf16(g.random_range(-1.0..1.0))).collect();
        let mut want = vec![0f32; n_assign * n];
        for e in 0..ne {
            for r in off.offsets[e] as usize..off.offsets[e + 1] as usize {
                for c in 0..n {
                    let dot: f64 = (0..k)
                        .map(|kk| {
                            twin::warp::from_bf16(a[r * k + kk]) as f64
                                * twin::warp::from_bf16(w[(e * n + c) * k + kk]) as f64
                        })
                        .sum();
                    want[r * n + c] = dot as f32;
                }
            }
        }
        // A variant's launch arguments, with the selector's choice.
        let args = |bm: usize, choice: usize| GroupedGemmArgs {
            a: &a,
            w: &w,
            counts: &off.counts,
            offsets: &off.offsets,
            tiles: if bm == 64 { &off.tiles64 } else { &off.tiles128 },
            n_tiles: off.n_tiles,
            choice: choice as u32,
            n,
            k,
        };
        let mut results = Vec::new();
        for bm in [64usize, 128] {
            let mut c = vec![f32::NAN; n_assign * n];
            twin::moe_gemm(bm, args(bm, bm), twin::max_tiles(n_assign, ne, bm), &mut c);
            // The other variant's launch exits at once.
            let other = if bm == 64 { 128 } else { 64 };
            let mut untouched = vec![f32::NAN; n_assign * n];
            twin::moe_gemm(other, args(other, bm), twin::max_tiles(n_assign, ne, other), &mut untouched);
            assert!(untouched.iter().all(|v| v.is_nan()), "BLOCK_M {other} ran although {bm} was chosen");
            assert_close(&format!("grouped GEMM BLOCK_M {bm}, n {n}, k {k}"), &c, &want, 1e-5);
            results.push(c);
        }
        assert_bits_eq(&format!("BLOCK_M 64 vs 128, n {n}, k {k}"), &results[0], &results[1]);
        // moe_gemm_wgmma.cu's variants, on the same schedules (BM x 128 tiles).
        for bm in [64usize, 128] {
            let mut c = vec![f32::NAN; n_assign * n];
            twin::moe_gemm_wgmma(bm, args(bm, bm), twin::max_tiles(n_assign, ne, bm), &mut c);
            assert_close(&format!("wgmma grouped GEMM BLOCK_M {bm}, n {n}, k {k}"), &c, &want, 1e-5);
            assert_bits_eq(&format!("wgmma BLOCK_M {bm} vs mma.sync, n {n}, k {k}"), &c, &results[0]);
        }
    }
}

#[test]
fn moe_layer_matches_the_per_token_loop_for_every_variant() {
    let mut g = rng(43);
    let dims = MoeDims { hidden: 64, inter: 48, n_experts: 16 };
    let (h, i, ne) = (dims.hidden, dims.inter, dims.n_experts);
    let gate_up: Vec<f32> = random(&mut g, ne * 2 * i * h).iter().map(|v| v * 0.3).collect();
    let down: Vec<f32> = random(&mut g, ne * h * i).iter().map(|v| v * 0.3).collect();
    let weights = TwinMoeWeights::new(dims, &gate_up, &down).unwrap();
    for &(tokens, spread, top_k, renormalize) in &[
        (1, Spread::Uniform, 4, true),
        (40, Spread::Uniform, 4, true),
        (70, Spread::OneHot, 2, true),
        (50, Spread::FewExperts, 4, false),
        (300, Spread::Uniform, 8, true),
    ] {
        let routing = MoeRouting { top_k, renormalize };
        let x = random(&mut g, tokens * h);
        let logits = router_logits(&mut g, tokens, ne, spread);
        let want = plain_moe(&x, &logits, &gate_up, &down, dims, routing, true);
        let want_plain = plain_moe(&x, &logits, &gate_up, &down, dims, routing, false);
        let mut outs = Vec::new();
        for policy in [TilePolicy::default(), TilePolicy::Fixed(BlockM::M64), TilePolicy::Fixed(BlockM::M128)] {
            let (got, choice) = twin::moe_forward(&x, &logits, &weights, routing, policy).unwrap();
            let what = format!("MoE {tokens} tokens {spread:?} top-{top_k} {policy:?} (chose {})", choice.block_m);
            assert_eq!(choice.real_rows, (tokens * top_k) as u64, "{what}");
            assert_close(&what, &got, &want, BF16_AWARE_TOL);
            assert_close(&format!("{what} vs f64 loop"), &got, &want_plain, PLAIN_TOL);
            outs.push(got);
        }
        assert_bits_eq("auto vs BLOCK_M 64", &outs[0], &outs[1]);
        assert_bits_eq("auto vs BLOCK_M 128", &outs[0], &outs[2]);
        // The fused engine's gate/up GEMM stores the activation itself (moe_gemm_swiglu_*):
        // the same bits as the GEMM then silu_mul_bf16, at each variant.
        for (policy, unfused) in
            [TilePolicy::Fixed(BlockM::M64), TilePolicy::Fixed(BlockM::M128)].into_iter().zip(&outs[1..])
        {
            for engine in [GemmEngine::Tiled, GemmEngine::Wgmma] {
                let (fused, _, _) =
                    twin::moe_forward_with_counts(&x, &logits, &weights, routing, policy, engine, None).unwrap();
                assert_bits_eq(&format!("MoE {tokens} tokens {policy:?}: {engine:?} vs unfused"), &fused, unfused);
            }
        }
    }
}

#[test]
fn the_selector_follows_the_histogram() {
    let mut g = rng(44);
    let dims = MoeDims { hidden: 16, inter: 16, n_experts: 32 };
    let weights = TwinMoeWeights::new(dims, &random(&mut g, 32 * 32 * 16), &random(&mut g, 32 * 16 * 16)).unwrap();
    let routing = MoeRouting { top_k: 1, renormalize: true };
    // 20 tokens spread over 32 experts: mostly 1-row experts, padding ratio ≫ 1.5 → 64.
    let x = random(&mut g, 20 * 16);
    let (_, c) = twin::moe_forward(
        &x,
        &router_logits(&mut g, 20, 32, Spread::Uniform),
        &weights,
        routing,
        TilePolicy::default(),
    )
    .unwrap();
    assert_eq!(c.block_m, 64, "{c:?}");
    // 256 tokens all on one expert: no padding → 128.
    let x = random(&mut g, 256 * 16);
    let (_, c) = twin::moe_forward(
        &x,
        &router_logits(&mut g, 256, 32, Spread::OneHot),
        &weights,
        routing,
        TilePolicy::default(),
    )
    .unwrap();
    assert_eq!((c.block_m, c.real_rows, c.padded128), (128, 256, 256), "{c:?}");
}

#[test]
fn moe_rejects_shapes_the_kernels_cannot_take() {
    let dims = MoeDims { hidden: 12, inter: 16, n_experts: 4 };
    let w = TwinMoeWeights::new(dims, &vec![0.0; 4 * 32 * 12], &vec![0.0; 4 * 12 * 16]).unwrap();
    let err =
        twin::moe_forward(&[0.0; 12], &[0.0; 4], &w, MoeRouting { top_k: 2, renormalize: true }, TilePolicy::default())
            .unwrap_err();
    assert!(err.to_string().contains("multiples of 8"), "{err}");
    let dims = MoeDims { hidden: 16, inter: 16, n_experts: 4 };
    let w = TwinMoeWeights::new(dims, &vec![0.0; 4 * 32 * 16], &vec![0.0; 4 * 16 * 16]).unwrap();
    let err =
        twin::moe_forward(&[0.0; 16], &[0.0; 4], &w, MoeRouting { top_k: 5, renormalize: true }, TilePolicy::default())
            .unwrap_err();
    assert!(err.to_string().contains("top-5"), "{err}");
    assert!(TwinMoeWeights::new(dims, &[0.0; 3], &[0.0; 3]).is_err());
}

/// qwen2_moe's shared expert on the GPU pipeline (its projections, then the gated add in the
/// un-permute), as `TwinBackend::moe_ffn` runs it, against the reference backend's layer: close
/// at bf16's tolerance, the same bits on every GEMM engine and variant and for each row alone,
/// and far from the layer without the expert (so that leaving it out fails).
#[test]
fn the_shared_expert_on_the_gpu_pipeline_matches_the_reference() {
    use sieve_kernels::cuda::twin::TwinBackend;
    use sieve_kernels::host::HostTensor;
    use sieve_kernels::reference::ReferenceBackend;
    use sieve_kernels::{Backend, MoeSelect};
    let mut g = rng(47);
    let (hidden, tokens) = (64, 9);
    let l = MoeLayer::new(&mut g, hidden, 8, 40, Some(24));
    let no_shared = sieve_kernels::MoeLayerHost { shared: None, ..l.host() };
    let routing = sieve_kernels::MoeRouting { top_k: 2, norm_topk_prob: false };
    let x = HostTensor::from_vec(random(&mut g, tokens * hidden), tokens, hidden);
    let acc0 = HostTensor::from_vec(random(&mut g, tokens * hidden), tokens, hidden);
    fn run<B: Backend<Tensor = HostTensor>>(
        b: &B,
        w: &B::MoeWeights,
        x: &HostTensor,
        acc: &HostTensor,
        routing: sieve_kernels::MoeRouting,
        v: usize,
    ) -> Vec<f32> {
        let (mut acc, mut log) = (acc.clone(), b.moe_log().unwrap());
        b.moe_ffn(x, w, routing, MoeSelect::Fixed(v), &mut acc, &mut log).unwrap();
        acc.data
    }
    let r = ReferenceBackend;
    let want = run(&r, &r.moe_weights(&l.host()).unwrap(), &x, &acc0, routing, 0);
    let twin = TwinBackend::tiled();
    let tw = twin.moe_weights(&l.host()).unwrap();
    let got = run(&twin, &tw, &x, &acc0, routing, 0);
    assert_close("twin with the shared expert vs reference", &got, &want, PLAIN_TOL);
    let without = run(&twin, &twin.moe_weights(&no_shared).unwrap(), &x, &acc0, routing, 0);
    let max_diff = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    let (gap, err) = (max_diff(&got, &without), max_diff(&got, &want));
    assert!(gap > 10.0 * err, "the shared expert moves the output by {gap}, the twin is {err} from the reference");
    for engine in [GemmEngine::TiledUnfused, GemmEngine::Wgmma] {
        let b = TwinBackend { gemm: engine, ..Default::default() };
        let w = b.moe_weights(&l.host()).unwrap();
        for v in 0..b.moe_variants().len() {
            assert_bits_eq(&format!("{engine:?} variant {v} vs tiled"), &run(&b, &w, &x, &acc0, routing, v), &got);
        }
    }
    for t in 0..tokens {
        let row = |m: &HostTensor| HostTensor::from_vec(m.data[t * hidden..(t + 1) * hidden].to_vec(), 1, hidden);
        let alone = run(&twin, &tw, &row(&x), &row(&acc0), routing, 0);
        assert_bits_eq(&format!("row {t} alone vs in the batch"), &alone, &got[t * hidden..(t + 1) * hidden]);
    }
}
