//! A small qwen3-style model (tests/cuda_common) run end to end on the CUDA backend's CPU twin and
//! on the CPU backend, over a shared prefix and items: the twin's bf16 storage costs a bounded
//! error in the scores, and its scores do not depend on the batch.

mod common;
mod cuda_common;

use common::rng;
use cuda_common::{prefix_and_items, MiniModel};
use sieve_kernels::cuda::twin::TwinBackend;
use sieve_kernels::{Backend, CpuBackend};

/// Scores are sigmoids in (0, 1); bf16 weights and K/V move them by well under 0.02 here.
const SCORE_TOL: f32 = 2e-2;

#[test]
fn twin_model_scores_match_the_cpu_backend() {
    let mut g = rng(50);
    let model = MiniModel::random(&mut g, 2);
    let (passes, slots) = prefix_and_items(&mut g, model.vocab);
    let cpu = CpuBackend::new(2).unwrap();
    let want = model.scores(&cpu, &passes, slots);
    for twin in [TwinBackend::default(), TwinBackend::tiled()] {
        let got = model.scores(&twin, &passes, slots);
        compare(&twin.name(), &got, &want);
    }
}

fn compare(what: &str, got: &[Vec<f32>], want: &[Vec<f32>]) {
    assert_eq!(got.len(), want.len());
    let mut max_err = 0f32;
    for (p, (a, b)) in got.iter().zip(want).enumerate() {
        assert_eq!(a.len(), b.len(), "pass {p}");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= SCORE_TOL, "{what}: pass {p} sequence {i}: twin {x} vs cpu {y}");
            max_err = max_err.max((x - y).abs());
        }
    }
    println!(
        "{what} vs cpu: max score difference {max_err:.2e} over {} scores",
        want.iter().map(|v| v.len()).sum::<usize>()
    );
    // The scores are not all equal (a degenerate model would pass any tolerance).
    let flat: Vec<f32> = want.iter().flatten().copied().collect();
    assert!(flat.iter().any(|&s| (s - flat[0]).abs() > 0.05), "scores do not vary: {flat:?}");
}

#[test]
fn twin_model_scores_do_not_depend_on_the_batch() {
    let mut g = rng(51);
    let model = MiniModel::random(&mut g, 2);
    let (passes, slots) = prefix_and_items(&mut g, model.vocab);
    // The tiled engine: every op of the twin is batch-invariant by construction.
    let twin = TwinBackend::tiled();
    let batched = model.scores(&twin, &passes, slots);
    for (i, &score) in batched[1].iter().enumerate() {
        let alone = model.scores(&twin, &[passes[0].clone(), cuda_common::only_seq(&passes[1], i)], slots);
        assert_eq!(alone[1][0].to_bits(), score.to_bits(), "item {i}: alone {} vs batched {score}", alone[1][0]);
    }
}

/// Fused epilogues change no bit: the small model's scores on the fused tiled engine equal the
/// unfused one's (the twin's dense MLP runs the fused SwiGLU GEMM's twin). The wgmma engine's
/// twin gives them too (its tensor-core model is the mma.sync one's; on a GPU, cuda_gpu.rs
/// reports whether the hardware's does).
#[test]
fn twin_model_scores_are_bitwise_the_same_fused_unfused_and_on_wgmma() {
    use sieve_kernels::cuda::GemmEngine;
    let mut g = rng(52);
    let model = MiniModel::random(&mut g, 2);
    let (passes, slots) = prefix_and_items(&mut g, model.vocab);
    let fused = model.scores(&TwinBackend::tiled(), &passes, slots);
    for engine in [GemmEngine::TiledUnfused, GemmEngine::Wgmma] {
        let other = model.scores(&TwinBackend { gemm: engine, ..Default::default() }, &passes, slots);
        for (p, (a, b)) in fused.iter().zip(&other).enumerate() {
            let (a, b): (Vec<u32>, Vec<u32>) =
                (a.iter().map(|s| s.to_bits()).collect(), b.iter().map(|s| s.to_bits()).collect());
            assert_eq!(a, b, "pass {p}: fused vs {engine:?} score bits");
        }
    }
}
