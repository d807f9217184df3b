//! The CUDA backend on a real GPU: every kernel and dense op against the CPU backend (f32) and
//! against the CPU twin of the same kernels, the MoE pipeline against its twin and the per-token
//! loop, and a small model's scores end to end. On a machine without a GPU each test prints
//! "NOT RUN ... (no GPU)" and passes; `no_gpu_is_a_clear_error` runs everywhere.
//!
//! Tolerances (relative to the largest expected value unless said otherwise):
//! - vs the CPU backend (f32 weights and K/V): `BF16_TOL` 2e-2, the cost of bf16 storage.
//! - vs the twin (same bf16 data, same kernel structure): `TWIN_TOL` 1e-4 for the SIMT kernels
//!   (device expf/sincos vs Rust's, cuBLAS's summation order); `MMA_TWIN_TOL` 2e-3 for the MoE
//!   layer and the tensor-core attention (tensor-core summation order, device `exp2f`, and a
//!   one-ulp bf16 flip of a rounded activation or probability).

mod common;
mod cuda_common;

use common::{assert_bits_eq, assert_close, random, rng, LayoutBuilder, MoeLayer, ROPE_SCALINGS};
use cuda_common::{gpu, gpu_with, only_seq, prefix_and_items, MiniModel};
use sieve_kernels::cuda::moe::{BlockM, MoeDims, MoeRouting, TilePolicy};
use sieve_kernels::cuda::twin::{self, TwinBackend, TwinMoeWeights};
use sieve_kernels::cuda::{tiled_block_m, CudaBackend, CudaOptions, GemmEngine, GemmKernel};
use sieve_kernels::{Backend, BatchLayout, CpuBackend, KernelError, QkvLayout, RopeConfig, RopeLayout};

const BF16_TOL: f32 = 2e-2;
const TWIN_TOL: f32 = 1e-4;
const MMA_TWIN_TOL: f32 = 2e-3;

#[test]
fn no_gpu_is_a_clear_error() {
    match sieve_kernels::cuda::device_count() {
        Err(e) => {
            let err = CudaBackend::new(0).err().expect("no driver: CudaBackend::new must fail");
            assert!(matches!(err, KernelError::Device(_)), "{err}");
            assert!(err.to_string().contains("driver"), "{err}");
            println!("no_gpu_is_a_clear_error: no driver here ({e}); CudaBackend::new(0) -> {err}");
        }
        Ok(n) => {
            let err = CudaBackend::new(n + 7).err().expect("a missing device must fail");
            assert!(err.to_string().contains(&format!("device {}", n + 7)), "{err}");
        }
    }
}

fn three(test: &str) -> Option<(CudaBackend, TwinBackend, CpuBackend)> {
    gpu(test).map(|g| (g, TwinBackend::default(), CpuBackend::new(0).expect("cpu backend")))
}

#[allow(clippy::too_many_arguments)]
fn matmul_case<B: Backend>(
    b: &B,
    x: &[f32],
    m: usize,
    k: usize,
    w: &[f32],
    n: usize,
    bias: Option<&[f32]>,
    acc: Option<&[f32]>,
) -> Vec<f32> {
    let xt = b.from_host(x, m, k).unwrap();
    let wt = b.linear_weight(w, n, k).unwrap();
    match acc {
        Some(a) => {
            let mut out = b.from_host(a, m, n).unwrap();
            b.matmul_add(&xt, &wt, &mut out).unwrap();
            b.to_host(&out).unwrap()
        }
        None => {
            let bv = bias.map(|v| b.vector(v).unwrap());
            let mut out = b.zeros(m, n).unwrap();
            b.matmul(&xt, &wt, bv.as_ref(), &mut out).unwrap();
            b.to_host(&out).unwrap()
        }
    }
}

#[test]
fn dense_projections() {
    for (engine, twin) in [
        (GemmEngine::Cublas, TwinBackend::default()),
        (GemmEngine::Tiled, TwinBackend::tiled()),
        (GemmEngine::TiledV1, TwinBackend { gemm: GemmEngine::TiledV1, ..Default::default() }),
    ] {
        let Some(g) = gpu_with(&format!("dense_projections ({engine:?})"), engine) else { return };
        dense_projections_case(&g, &twin, &CpuBackend::new(0).expect("cpu"));
    }
}

fn dense_projections_case(g: &CudaBackend, t: &TwinBackend, c: &CpuBackend) {
    let mut r = rng(60);
    for &(m, n, k) in &[(1, 64, 64), (7, 130, 72), (64, 512, 256), (301, 1024, 576)] {
        let (x, w, bias, acc) =
            (random(&mut r, m * k), random(&mut r, n * k), random(&mut r, n), random(&mut r, m * n));
        for (bias, acc) in [(None, None), (Some(bias.as_slice()), None), (None, Some(acc.as_slice()))] {
            let what = format!("{:?} GEMM {m}x{n}x{k} bias {} acc {}", g.gemm_engine(), bias.is_some(), acc.is_some());
            let got = matmul_case(g, &x, m, k, &w, n, bias, acc);
            assert_close(&format!("{what} vs twin"), &got, &matmul_case(t, &x, m, k, &w, n, bias, acc), TWIN_TOL);
            assert_close(&format!("{what} vs cpu"), &got, &matmul_case(c, &x, m, k, &w, n, bias, acc), BF16_TOL);
        }
    }
    // lm_logits and embed share the bf16 table.
    let (vocab, hidden) = (1000, 64);
    let table = random(&mut r, vocab * hidden);
    let x = random(&mut r, 5 * hidden);
    let got = g.run(&table, vocab, hidden, &x);
    assert_close("lm_logits vs twin", &got, &t.run(&table, vocab, hidden, &x), TWIN_TOL);
    assert_close("lm_logits vs cpu", &got, &c.run(&table, vocab, hidden, &x), BF16_TOL);
}

/// embedding + lm_logits on any backend.
trait LmLogits {
    fn run(&self, table: &[f32], vocab: usize, hidden: usize, x: &[f32]) -> Vec<f32>;
}

impl<B: Backend> LmLogits for B {
    fn run(&self, table: &[f32], vocab: usize, hidden: usize, x: &[f32]) -> Vec<f32> {
        let rows = x.len() / hidden;
        let e = self.embedding(table, vocab, hidden).unwrap();
        let xt = self.from_host(x, rows, hidden).unwrap();
        let mut out = self.zeros(rows, vocab).unwrap();
        self.lm_logits(&xt, &e, &mut out).unwrap();
        self.to_host(&out).unwrap()
    }
}

fn rowwise_case<B: Backend>(
    b: &B,
    x: &[f32],
    rows: usize,
    cols: usize,
    w: &[f32],
    gu: &[f32],
) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let xt = b.from_host(x, rows, cols).unwrap();
    let wv = b.vector(w).unwrap();
    let mut out = b.zeros(rows, cols).unwrap();
    b.rms_norm(&xt, &wv, 1e-6, &mut out).unwrap();
    let norm = b.to_host(&out).unwrap();
    let dots = b.dot_rows(&xt, &wv).unwrap();
    let gut = b.from_host(gu, rows, 2 * cols).unwrap();
    b.silu_mul(&gut, &mut out).unwrap();
    let silu = b.to_host(&out).unwrap();
    let idx: Vec<u32> = (0..rows as u32).rev().step_by(2).collect();
    let mut gathered = b.zeros(idx.len(), cols).unwrap();
    b.gather_rows(&xt, &idx, &mut gathered).unwrap();
    (norm, dots, silu, b.to_host(&gathered).unwrap())
}

#[test]
fn row_ops_and_host_round_trip() {
    let Some((g, t, c)) = three("row_ops_and_host_round_trip") else { return };
    let mut r = rng(61);
    for &(rows, cols) in &[(1, 8), (9, 333), (128, 2048), (3, 5120)] {
        let (x, w, gu) = (random(&mut r, rows * cols), random(&mut r, cols), random(&mut r, rows * 2 * cols));
        let xt = g.from_host(&x, rows, cols).unwrap();
        assert_bits_eq("from_host/to_host", &g.to_host(&xt).unwrap(), &x);
        let got = rowwise_case(&g, &x, rows, cols, &w, &gu);
        for (name, other, tol) in [
            ("twin", rowwise_case(&t, &x, rows, cols, &w, &gu), TWIN_TOL),
            ("cpu", rowwise_case(&c, &x, rows, cols, &w, &gu), 1e-4),
        ] {
            let what = format!("{rows}x{cols} vs {name}");
            assert_close(&format!("rms_norm {what}"), &got.0, &other.0, tol);
            assert_close(&format!("dot_rows {what}"), &got.1, &other.1, tol);
            assert_close(&format!("silu_mul {what}"), &got.2, &other.2, tol);
            assert_bits_eq(&format!("gather_rows {what}"), &got.3, &other.3);
        }
        // The residual add fused into the norm: the bits of rms_norm over the sum, f32 and bf16
        // outputs; the sum written back is exactly x + d.
        let d = &gu[..rows * cols];
        let sum: Vec<f32> = x.iter().zip(d).map(|(a, b)| a + b).collect();
        let (st, dt, wv) =
            (g.from_host(&sum, rows, cols).unwrap(), g.from_host(d, rows, cols).unwrap(), g.vector(&w).unwrap());
        for operand in [false, true] {
            let (mut want, mut got) = (g.zeros(0, 0).unwrap(), g.zeros(0, 0).unwrap());
            for t in [&mut want, &mut got] {
                if operand {
                    g.reshape_operand(t, rows, cols).unwrap();
                } else {
                    g.reshape_scratch(t, rows, cols).unwrap();
                }
            }
            g.rms_norm(&st, &wv, 1e-6, &mut want).unwrap();
            let mut xt = g.from_host(&x, rows, cols).unwrap();
            g.add_rms_norm(&mut xt, &dt, &wv, 1e-6, &mut got).unwrap();
            let what = format!("add_rms_norm {rows}x{cols} (operand: {operand})");
            assert_bits_eq(&what, &g.to_host(&got).unwrap(), &g.to_host(&want).unwrap());
            assert_bits_eq(&format!("{what}: the sum"), &g.to_host(&xt).unwrap(), &sum);
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn embed_rope_case<B: Backend>(
    b: &B,
    table: &[f32],
    vocab: usize,
    layout: QkvLayout,
    qkv: &[f32],
    batch: &BatchLayout,
    rope: RopeConfig,
    norms: Option<(&[f32], &[f32])>,
) -> (Vec<f32>, Vec<f32>) {
    let rows = batch.num_rows();
    let cache = b.kv_cache(1, 64, layout.n_kv_heads, layout.head_dim).unwrap();
    let pb = b.prepare_batch(batch, &cache).unwrap();
    let e = b.embedding(table, vocab, layout.qkv_dim()).unwrap();
    let mut emb = b.zeros(rows, layout.qkv_dim()).unwrap();
    b.embed(&e, &pb, &mut emb).unwrap();
    let mut q = b.from_host(qkv, rows, layout.qkv_dim()).unwrap();
    let nv = norms.map(|(qn, kn)| (b.vector(qn).unwrap(), b.vector(kn).unwrap()));
    b.qk_norm_rope(&mut q, layout, nv.as_ref().map(|n| &n.0), nv.as_ref().map(|n| &n.1), 1e-6, rope, &pb).unwrap();
    (b.to_host(&emb).unwrap(), b.to_host(&q).unwrap())
}

#[test]
fn embed_and_qk_norm_rope() {
    let Some((g, t, c)) = three("embed_and_qk_norm_rope") else { return };
    let mut r = rng(62);
    for &(n_heads, n_kv_heads, head_dim, rotary_dim) in
        &[(16, 8, 128, 128), (9, 3, 64, 64), (4, 1, 256, 128), (2, 2, 80, 40)]
    {
        let layout = QkvLayout { n_heads, n_kv_heads, head_dim };
        let mut lb = LayoutBuilder::default();
        lb.push_seq(&[], 6);
        lb.layout.positions = vec![0, 1, 31, 1000, 32767, 131_071];
        lb.layout.token_ids = vec![0, 5, 9, 5, 2, 10];
        let vocab = 11;
        let table = random(&mut r, vocab * layout.qkv_dim());
        let qkv = random(&mut r, 6 * layout.qkv_dim());
        let (qn, kn) = (random(&mut r, head_dim), random(&mut r, head_dim));
        for (rl, scaling) in
            [RopeLayout::Interleaved, RopeLayout::HalfSplit].into_iter().flat_map(|l| ROPE_SCALINGS.map(|s| (l, s)))
        {
            for norms in [None, Some((qn.as_slice(), kn.as_slice()))] {
                let rope = RopeConfig { theta: 1_000_000.0, rotary_dim, layout: rl, scaling };
                let what = format!("{layout:?} {rl} {scaling:?} rotary {rotary_dim} norms {}", norms.is_some());
                let got = embed_rope_case(&g, &table, vocab, layout, &qkv, &lb.layout, rope, norms);
                let tw = embed_rope_case(&t, &table, vocab, layout, &qkv, &lb.layout, rope, norms);
                let cp = embed_rope_case(&c, &table, vocab, layout, &qkv, &lb.layout, rope, norms);
                assert_bits_eq(&format!("embed {what} vs twin"), &got.0, &tw.0);
                assert_close(&format!("embed {what} vs cpu"), &got.0, &cp.0, BF16_TOL);
                assert_close(&format!("qk_norm_rope {what} vs twin"), &got.1, &tw.1, TWIN_TOL);
                assert_close(&format!("qk_norm_rope {what} vs cpu"), &got.1, &cp.1, 1e-4);
            }
        }
    }
}

/// [`prefix_and_items`]' two passes, each with random QKV rows for `layout`; and the slots.
fn prefix_and_items_with_qkv(r: &mut impl rand::Rng, layout: QkvLayout) -> (Vec<(BatchLayout, Vec<f32>)>, usize) {
    let (batches, slots) = prefix_and_items(r, 10);
    let passes = batches
        .into_iter()
        .map(|b| {
            let q = random(r, b.num_rows() * layout.qkv_dim());
            (b, q)
        })
        .collect();
    (passes, slots)
}

/// `qk_norm_rope_write_kv` then attention, pass after pass over one cache: each pass's rotated
/// rows and attention output.
fn rope_kv_attention_case<B: Backend>(
    b: &B,
    layout: QkvLayout,
    passes: &[(BatchLayout, Vec<f32>)],
    num_slots: usize,
    norms: (&[f32], &[f32]),
    rope: RopeConfig,
) -> Vec<(Vec<f32>, Vec<f32>)> {
    let mut cache = b.kv_cache(2, num_slots, layout.n_kv_heads, layout.head_dim).unwrap();
    let (qn, kn) = (b.vector(norms.0).unwrap(), b.vector(norms.1).unwrap());
    passes
        .iter()
        .map(|(batch, qkv)| {
            let pb = b.prepare_batch(batch, &cache).unwrap();
            let mut q = b.from_host(qkv, batch.num_rows(), layout.qkv_dim()).unwrap();
            b.qk_norm_rope_write_kv(&mut q, layout, Some(&qn), Some(&kn), 1e-6, rope, &mut cache, 1, &pb).unwrap();
            let mut out = b.zeros(batch.num_rows(), layout.q_dim()).unwrap();
            b.attention(&q, layout, &cache, 1, &pb, &mut out).unwrap();
            (b.to_host(&q).unwrap(), b.to_host(&out).unwrap())
        })
        .collect()
}

/// rope.cu's `qk_norm_rope` with its K/V write (the fused engine) against `qk_norm_rope` then
/// kv_write.cu's `write_kv` (the unfused engine), on the device: the same rotated rows, and the
/// same pools as the attention reads them back (bitwise), and the twin's rows. Also rows whose
/// heads are not 16-byte multiples (the kernel's scalar path: head size 6, rows of 30 floats) and
/// more heads than one shared-memory chunk holds (18 heads of 256: q and k heads in one chunk,
/// k heads alone in the next). CPU twin: cuda_twin_dense.rs `fused_rope_kv_write_is_bitwise_the_two_kernels`.
#[test]
fn fused_rope_kv_write_gives_the_two_kernels_bits() {
    let Some(fused) = gpu_with("fused_rope_kv_write_gives_the_two_kernels_bits", GemmEngine::Tiled) else { return };
    let unfused =
        gpu_with("fused_rope_kv_write_gives_the_two_kernels_bits (unfused)", GemmEngine::TiledUnfused).expect("gpu");
    let twin = TwinBackend::default();
    let mut r = rng(64);
    for &(n_heads, n_kv_heads, head_dim) in &[(16, 8, 128), (3, 1, 6), (12, 6, 256), (16, 4, 64)] {
        let layout = QkvLayout { n_heads, n_kv_heads, head_dim };
        let (passes, slots) = prefix_and_items_with_qkv(&mut r, layout);
        let (qn, kn) = (random(&mut r, head_dim), random(&mut r, head_dim));
        for rl in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
            let rope = RopeConfig { theta: 1_000_000.0, rotary_dim: head_dim, layout: rl, scaling: Default::default() };
            let f = rope_kv_attention_case(&fused, layout, &passes, slots, (&qn, &kn), rope);
            let u = rope_kv_attention_case(&unfused, layout, &passes, slots, (&qn, &kn), rope);
            let t = rope_kv_attention_case(&twin, layout, &passes, slots, (&qn, &kn), rope);
            for p in 0..passes.len() {
                let what = format!("{layout:?} {rl} pass {p}");
                assert_bits_eq(&format!("{what}: rotated rows, fused vs unfused"), &f[p].0, &u[p].0);
                assert_bits_eq(&format!("{what}: attention over the pools, fused vs unfused"), &f[p].1, &u[p].1);
                assert_close(&format!("{what}: rotated rows vs twin"), &f[p].0, &t[p].0, TWIN_TOL);
            }
        }
    }
}

/// write_kv then attention over a prefix pass and an items pass (shared prefix slots), into
/// f32 rows or (`operand`) a GEMM operand.
fn attention_case<B: Backend>(
    b: &B,
    layout: QkvLayout,
    passes: &[(BatchLayout, Vec<f32>)],
    num_slots: usize,
    operand: bool,
) -> Vec<Vec<f32>> {
    let mut cache = b.kv_cache(2, num_slots, layout.n_kv_heads, layout.head_dim).unwrap();
    passes
        .iter()
        .map(|(batch, qkv)| {
            let rows = batch.num_rows();
            let pb = b.prepare_batch(batch, &cache).unwrap();
            let q = b.from_host(qkv, rows, layout.qkv_dim()).unwrap();
            b.write_kv(&q, layout, &mut cache, 1, &pb).unwrap();
            let mut out = b.zeros(rows, layout.q_dim()).unwrap();
            if operand {
                b.reshape_operand(&mut out, rows, layout.q_dim()).unwrap();
            }
            b.attention(&q, layout, &cache, 1, &pb, &mut out).unwrap();
            b.to_host(&out).unwrap()
        })
        .collect()
}

#[test]
fn paged_attention_over_a_shared_prefix() {
    let Some((g, t, c)) = three("paged_attention_over_a_shared_prefix") else { return };
    let fused = gpu_with("paged_attention_over_a_shared_prefix (fused)", GemmEngine::Tiled).expect("gpu");
    assert!(fused.gemm_engine().fused());
    let mut r = rng(63);
    for &(n_heads, n_kv_heads, head_dim) in &[(16, 8, 128), (8, 2, 64), (4, 4, 256), (6, 2, 96), (2, 1, 18)] {
        let layout = QkvLayout { n_heads, n_kv_heads, head_dim };
        let (passes, slots) = prefix_and_items_with_qkv(&mut r, layout);
        let got = attention_case(&g, layout, &passes, slots, false);
        let tw = attention_case(&t, layout, &passes, slots, false);
        let cp = attention_case(&c, layout, &passes, slots, false);
        let twin_tol = if t.attention.mma_for(head_dim) { MMA_TWIN_TOL } else { TWIN_TOL };
        for p in 0..passes.len() {
            assert_close(&format!("attention {layout:?} pass {p} vs twin"), &got[p], &tw[p], twin_tol);
            assert_close(&format!("attention {layout:?} pass {p} vs cpu"), &got[p], &cp[p], BF16_TOL);
        }
        // Into the O projection's operand (bf16 with fused epilogues): the f32 rows rounded once.
        let (f32_rows, op) = (
            attention_case(&fused, layout, &passes, slots, false),
            attention_case(&fused, layout, &passes, slots, true),
        );
        for p in 0..passes.len() {
            let rounded: Vec<f32> = f32_rows[p].iter().map(|&x| twin::warp::round_bf16(x)).collect();
            assert_bits_eq(&format!("attention {layout:?} pass {p}: operand vs f32 rounded"), &op[p], &rounded);
        }
        // Batch invariance on the device: each item alone gives the same bits.
        for i in 0..passes[1].0.seqs.len() {
            let alone = only_seq(&passes[1].0, i);
            let s = passes[1].0.seqs[i];
            let w = layout.qkv_dim();
            let q = passes[1].1[s.q_row as usize * w..(s.q_row + s.q_len) as usize * w].to_vec();
            let solo = attention_case(&g, layout, &[passes[0].clone(), (alone, q)], slots, false);
            let od = layout.q_dim();
            assert_bits_eq(
                &format!("attention {layout:?} item {i} alone vs batched"),
                &solo[1],
                &got[1][s.q_row as usize * od..(s.q_row + s.q_len) as usize * od],
            );
        }
    }
}

/// Also the fused engine's gate/up GEMM with the SwiGLU epilogue (`moe_gemm_swiglu_*`): bitwise
/// the unfused GEMM and `silu_mul_bf16` at each variant (CPU twin: cuda_twin_moe.rs
/// `moe_layer_matches_the_per_token_loop_for_every_variant`).
#[test]
fn moe_layer_matches_twin_for_every_variant() {
    let Some(g) = gpu("moe_layer_matches_twin_for_every_variant") else { return };
    let f = gpu_with("moe_layer_matches_twin_for_every_variant (fused)", GemmEngine::Tiled).expect("gpu");
    assert!(!g.gemm_engine().fused() && f.gemm_engine().fused());
    let mut r = rng(64);
    let dims = MoeDims { hidden: 256, inter: 192, n_experts: 64 };
    let gate_up: Vec<f32> = random(&mut r, 64 * 2 * 192 * 256).iter().map(|v| v * 0.1).collect();
    let down: Vec<f32> = random(&mut r, 64 * 256 * 192).iter().map(|v| v * 0.1).collect();
    let tw = TwinMoeWeights::new(dims, &gate_up, &down).unwrap();
    let gw = g.moe_expert_weights(dims, &gate_up, &down).unwrap();
    let fw = f.moe_expert_weights(dims, &gate_up, &down).unwrap();
    // 1,500 tokens: 47 chunks of assignments, in moe_offsets' ranges of 3 (the last of 2).
    for &(tokens, top_k) in &[(1usize, 8usize), (13, 8), (200, 4), (1024, 8), (1500, 8)] {
        let routing = MoeRouting { top_k, renormalize: true };
        let x = random(&mut r, tokens * 256);
        let logits: Vec<f32> = random(&mut r, tokens * 64).iter().map(|v| v * 4.0).collect();
        let xt = g.from_host(&x, tokens, 256).unwrap();
        let lt = g.from_host(&logits, tokens, 64).unwrap();
        let mut outs = Vec::new();
        for policy in [TilePolicy::default(), TilePolicy::Fixed(BlockM::M64), TilePolicy::Fixed(BlockM::M128)] {
            let mut out = g.zeros(tokens, 256).unwrap();
            let stats = g.moe_forward(&xt, &lt, &gw, routing, policy, &mut out, false, None).unwrap();
            let got = g.to_host(&out).unwrap();
            let choice = stats.read(&g).unwrap();
            let (want, want_choice) = twin::moe_forward(&x, &logits, &tw, routing, policy).unwrap();
            assert_eq!(choice, want_choice, "{tokens} tokens {policy:?}: selector");
            assert_close(&format!("MoE {tokens} tokens top-{top_k} {policy:?} vs twin"), &got, &want, MMA_TWIN_TOL);
            let (fx, fl) = (f.from_host(&x, tokens, 256).unwrap(), f.from_host(&logits, tokens, 64).unwrap());
            let mut fused = f.zeros(tokens, 256).unwrap();
            f.moe_forward(&fx, &fl, &fw, routing, policy, &mut fused, false, None).unwrap();
            assert_bits_eq(
                &format!("MoE {tokens} tokens {policy:?}: SwiGLU epilogue vs unfused"),
                &f.to_host(&fused).unwrap(),
                &got,
            );
            outs.push(got);
        }
        assert_bits_eq(&format!("MoE {tokens} tokens: auto vs BLOCK_M 64"), &outs[0], &outs[1]);
        assert_bits_eq(&format!("MoE {tokens} tokens: auto vs BLOCK_M 128"), &outs[0], &outs[2]);
    }
}

/// The router kernel at each of its per-lane widths (1, 2, 4, 8 and 16 logits a lane: 8 to 512
/// experts) through the whole layer, against the twin; small experts keep it quick.
#[test]
fn moe_routing_at_every_expert_count() {
    let Some(g) = gpu("moe_routing_at_every_expert_count") else { return };
    let mut r = rng(65);
    for n_experts in [8usize, 60, 128, 300, 512] {
        let dims = MoeDims { hidden: 16, inter: 8, n_experts };
        let gate_up = random(&mut r, n_experts * 2 * 8 * 16);
        let down = random(&mut r, n_experts * 16 * 8);
        let tw = TwinMoeWeights::new(dims, &gate_up, &down).unwrap();
        let gw = g.moe_expert_weights(dims, &gate_up, &down).unwrap();
        let (tokens, top_k) = (37, n_experts.min(8));
        let routing = MoeRouting { top_k, renormalize: n_experts % 2 == 0 };
        let x = random(&mut r, tokens * 16);
        let logits: Vec<f32> = random(&mut r, tokens * n_experts).iter().map(|v| v * 4.0).collect();
        let (xt, lt) = (g.from_host(&x, tokens, 16).unwrap(), g.from_host(&logits, tokens, n_experts).unwrap());
        let mut out = g.zeros(tokens, 16).unwrap();
        let stats = g.moe_forward(&xt, &lt, &gw, routing, TilePolicy::default(), &mut out, false, None).unwrap();
        let (want, want_choice) = twin::moe_forward(&x, &logits, &tw, routing, TilePolicy::default()).unwrap();
        assert_eq!(stats.read(&g).unwrap(), want_choice, "{n_experts} experts: selector");
        assert_eq!(
            stats.read_counts(&g).unwrap().iter().map(|&c| c as usize).sum::<usize>(),
            tokens * top_k,
            "{n_experts} experts: every pick counted"
        );
        assert_close(&format!("MoE with {n_experts} experts vs twin"), &g.to_host(&out).unwrap(), &want, MMA_TWIN_TOL);
    }
}

/// qwen2_moe's shared expert (its projections, then the gated add in `moe_unpermute`) through
/// `Backend::moe_ffn`: the twin's values (CPU twin: cuda_twin_moe.rs
/// `the_shared_expert_on_the_gpu_pipeline_matches_the_reference`), and each row's bits alone as
/// in the batch.
#[test]
fn moe_layer_with_a_shared_expert_matches_its_twin() {
    use sieve_kernels::MoeSelect;
    let Some(g) = gpu_with("moe_layer_with_a_shared_expert_matches_its_twin", GemmEngine::Tiled) else { return };
    let t = TwinBackend::tiled();
    let mut r = rng(65);
    let hidden = 256;
    let layer = MoeLayer::new(&mut r, hidden, 60, 96, Some(352));
    let host = layer.host();
    let (gw, tw) = (g.moe_weights(&host).unwrap(), t.moe_weights(&host).unwrap());
    let routing = sieve_kernels::MoeRouting { top_k: 4, norm_topk_prob: false };
    for tokens in [1usize, 13, 300] {
        let (x, acc0) = (random(&mut r, tokens * hidden), random(&mut r, tokens * hidden));
        let on_gpu = |x: &[f32], acc: &[f32], rows: usize| {
            let (xt, mut at, mut log) =
                (g.from_host(x, rows, hidden).unwrap(), g.from_host(acc, rows, hidden).unwrap(), g.moe_log().unwrap());
            g.moe_ffn(&xt, &gw, routing, MoeSelect::Fixed(0), &mut at, &mut log).unwrap();
            g.to_host(&at).unwrap()
        };
        let got = on_gpu(&x, &acc0, tokens);
        let (xt, mut want, mut log) = (
            t.from_host(&x, tokens, hidden).unwrap(),
            t.from_host(&acc0, tokens, hidden).unwrap(),
            t.moe_log().unwrap(),
        );
        t.moe_ffn(&xt, &tw, routing, MoeSelect::Fixed(0), &mut want, &mut log).unwrap();
        assert_close(&format!("shared-expert MoE, {tokens} tokens, vs twin"), &got, &want.data, MMA_TWIN_TOL);
        let row = |v: &[f32], i: usize| v[i * hidden..(i + 1) * hidden].to_vec();
        for i in [0, tokens / 2, tokens - 1] {
            let alone = on_gpu(&row(&x, i), &row(&acc0, i), 1);
            assert_bits_eq(&format!("shared-expert MoE: row {i} alone vs {tokens} rows"), &alone, &row(&got, i));
        }
    }
}

#[test]
fn small_model_scores_match_the_cpu_backend() {
    let Some((g, t, c)) = three("small_model_scores_match_the_cpu_backend") else { return };
    let mut r = rng(65);
    let model = MiniModel::random(&mut r, 3);
    let (passes, slots) = prefix_and_items(&mut r, model.vocab);
    let got = model.scores(&g, &passes, slots);
    let tw = model.scores(&t, &passes, slots);
    let cp = model.scores(&c, &passes, slots);
    for p in 0..passes.len() {
        for i in 0..got[p].len() {
            assert!((got[p][i] - tw[p][i]).abs() <= 1e-3, "pass {p} item {i}: gpu {} vs twin {}", got[p][i], tw[p][i]);
            assert!(
                (got[p][i] - cp[p][i]).abs() <= BF16_TOL,
                "pass {p} item {i}: gpu {} vs cpu {}",
                got[p][i],
                cp[p][i]
            );
        }
    }
    println!("scores gpu {got:?}\n       cpu {cp:?}");
}

#[test]
fn a_second_start_loads_kernels_from_the_cache() {
    let Some(g) = gpu("a_second_start_loads_kernels_from_the_cache") else { return };
    // Every source, and on a 9.0 device the sm_90a ones beside them.
    let hopper = if g.info().arch.number() == 90 { sieve_kernels::cuda::sources::HOPPER.len() } else { 0 };
    drop(g);
    let opts = CudaOptions::new(0).with_asset_cache(&cuda_common::asset_cache());
    let again = CudaBackend::with_options(&opts).unwrap();
    let report = again.kernel_load_report();
    assert!(report.compiled.is_empty(), "recompiled at the second start: {report:?}");
    assert_eq!(report.from_cache.len(), sieve_kernels::cuda::sources::ALL.len() + hopper);
}

/// A row's projection bits must not depend on how many rows share the call (the determinism
/// contract). `rows` of one x, projected all together and each alone.
fn projection_rows_alone_and_batched(g: &CudaBackend, n: usize, k: usize) {
    let mut r = rng(66);
    let m = 777;
    let x = random(&mut r, m * k);
    let w = g.linear_weight(&random(&mut r, n * k), n, k).unwrap();
    let xt = g.from_host(&x, m, k).unwrap();
    let mut all = g.zeros(m, n).unwrap();
    g.matmul(&xt, &w, None, &mut all).unwrap();
    let all = g.to_host(&all).unwrap();
    for (row, rows) in [(0usize, 1usize), (5, 3), (100, 64), (300, 200)] {
        let part = g.from_host(&x[row * k..(row + rows) * k], rows, k).unwrap();
        let mut out = g.zeros(rows, n).unwrap();
        g.matmul(&part, &w, None, &mut out).unwrap();
        assert_bits_eq(
            &format!("{:?} {n}x{k}: rows {row}..{} in a call of {rows} vs of {m}", g.gemm_engine(), row + rows),
            &g.to_host(&out).unwrap(),
            &all[row * n..(row + rows) * n],
        );
    }
}

#[test]
fn tiled_projections_are_batch_invariant() {
    let Some(g) = gpu_with("tiled_projections_are_batch_invariant", GemmEngine::Tiled) else { return };
    projection_rows_alone_and_batched(&g, 1024, 1024);
    // 777 rows of 8192 columns take BLOCK_M 128, a few rows BLOCK_M 64.
    assert_eq!((tiled_block_m(777, 8192), tiled_block_m(64, 8192)), (128, 64));
    projection_rows_alone_and_batched(&g, 8192, 256);
}

/// A twin GEMM over (bf16 x, bf16 W) into the f32 output.
type TwinGemm = dyn Fn(&[u16], &[u16], &mut [f32]);

/// The GEMM test shapes (m, n, k): one row, partial row and column tiles, K off the K steps, and
/// sizes where the large tiles run.
const GEMM_TEST_SHAPES: [(usize, usize, usize); 5] =
    [(1, 128, 64), (77, 130, 72), (300, 200, 136), (1000, 1024, 1024), (2048, 512, 2048)];

/// Each of `kernels` on all m rows of x (the first kernel's output is returned) gives the first
/// kernel's bits, and on a row alone and on a run of rows the bits those rows get among all;
/// the first kernel agrees with `twin` if given (which sums each k16 step's products in its own
/// order) where the twin is quick enough.
#[allow(clippy::too_many_arguments)]
fn gemm_kernels_agree(
    g: &CudaBackend,
    kernels: &[GemmKernel],
    (x, wd): (&[f32], &[f32]),
    (m, n, k): (usize, usize, usize),
    twin: Option<&TwinGemm>,
) -> Vec<f32> {
    let w = g.linear_weight(wd, n, k).unwrap();
    let run = |kernel: GemmKernel, x: &[f32], rows: usize| {
        let xt = g.from_host(x, rows, k).unwrap();
        let mut out = g.zeros(rows, n).unwrap();
        g.matmul_on(kernel, &xt, &w, &mut out).unwrap();
        g.to_host(&out).unwrap()
    };
    let base = run(kernels[0], x, m);
    for &kernel in kernels {
        let what = format!("{m}x{n}x{k} {kernel:?}");
        assert_bits_eq(&format!("{what} vs {:?}", kernels[0]), &run(kernel, x, m), &base);
        for (row, rows) in [(0usize, 1usize), (m / 3, (m - m / 3).min(65))] {
            let part = run(kernel, &x[row * k..(row + rows) * k], rows);
            assert_bits_eq(
                &format!("{what}: rows {row}..{} alone", row + rows),
                &part,
                &base[row * n..(row + rows) * n],
            );
        }
    }
    if let Some(twin_gemm) = twin.filter(|_| m * n * k <= 10_000_000) {
        let xb: Vec<u16> = x.iter().map(|&v| twin::warp::to_bf16(v)).collect();
        let wb: Vec<u16> = wd.iter().map(|&v| twin::warp::to_bf16(v)).collect();
        let mut want = vec![0f32; m * n];
        twin_gemm(&xb, &wb, &mut want);
        assert_close(&format!("{m}x{n}x{k} {:?} vs twin", kernels[0]), &base, &want, TWIN_TOL);
    }
    base
}

/// The index probes (cuda_common.rs `gemm_index_probes`) on `kernel`, whole tiles and partial
/// ones: a kernel that pairs the wrong elements fails here first, with the indices it read.
fn gemm_index_probes_pass(g: &CudaBackend, kernel: GemmKernel) {
    let run = |x: &[f32], wd: &[f32], m: usize, n: usize, k: usize| {
        let (xt, w) = (g.from_host(x, m, k).unwrap(), g.linear_weight(wd, n, k).unwrap());
        let mut out = g.zeros(m, n).unwrap();
        g.matmul_on(kernel, &xt, &w, &mut out).unwrap();
        g.to_host(&out).unwrap()
    };
    for shape in [(256, 256, 128), (77, 200, 72)] {
        let wrong = cuda_common::gemm_index_probes(run, shape);
        assert!(wrong.is_empty(), "{kernel:?} reads operands out of place: {wrong:#?}");
    }
}

/// The tiled kernels side by side on the device: the current tile at BLOCK_M 64 and 128 and the
/// first tile at both pass the index probes, give the same bits, on all rows and on a few of them
/// alone, and agree with the twin.
#[test]
fn tiled_gemm_kernels_agree_bitwise() {
    let Some(g) = gpu("tiled_gemm_kernels_agree_bitwise") else { return };
    let mut r = rng(70);
    let kernels = [128, 64].map(|bm| GemmKernel::Tiled { bm });
    let kernels = [kernels[0], kernels[1], GemmKernel::TiledV1 { bm: 64 }, GemmKernel::TiledV1 { bm: 128 }];
    for kernel in kernels {
        gemm_index_probes_pass(&g, kernel);
    }
    for (m, n, k) in GEMM_TEST_SHAPES {
        let (x, wd) = (random(&mut r, m * k), random(&mut r, n * k));
        let twin_gemm = move |xb: &[u16], wb: &[u16], out: &mut [f32]| twin::dense_gemm(128, xb, wb, out, m, n, k, 0.0);
        gemm_kernels_agree(&g, &kernels, (&x, &wd), (m, n, k), Some(&twin_gemm));
    }
}

/// The wgmma GEMM (gemm_wgmma.cu, sm_90 only) on the device: both BLOCK_N pass the index probes
/// and give the same bits, on all rows and on a few alone, and agree with the twin (which replays
/// the descriptors' layout). Prints whether its bits equal the mma.sync tile's (nothing relies on it: the
/// engines are separate). Then the engine through the Backend: a small model's scores near the
/// twin's, and an item's score alone the same bits as in the batch.
/// CPU twin: cuda_twin_dense.rs `tiled_gemm_kernels_agree_bitwise_across_tiles_and_batches`.
#[test]
fn wgmma_gemm_is_batch_invariant_and_matches_its_twin() {
    let test = "wgmma_gemm_is_batch_invariant_and_matches_its_twin";
    let Some(g) = hopper(test) else { return };
    for bn in [128, 256] {
        gemm_index_probes_pass(&g, GemmKernel::Wgmma { bn });
    }
    let mut r = rng(72);
    for (m, n, k) in GEMM_TEST_SHAPES {
        let (x, wd) = (random(&mut r, m * k), random(&mut r, n * k));
        let kernels = [GemmKernel::Wgmma { bn: 256 }, GemmKernel::Wgmma { bn: 128 }];
        let twin_gemm =
            move |xb: &[u16], wb: &[u16], out: &mut [f32]| twin::dense_gemm_wgmma(256, xb, wb, out, m, n, k, 0.0);
        let base = gemm_kernels_agree(&g, &kernels, (&x, &wd), (m, n, k), Some(&twin_gemm));
        let tiled = gemm_kernels_agree(&g, &[GemmKernel::Tiled { bm: 128 }], (&x, &wd), (m, n, k), None);
        let differ = base.iter().zip(&tiled).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        println!("{test}: {m}x{n}x{k}: {differ} of {} outputs differ in bits from the mma.sync tile", m * n);
    }
    let model = MiniModel::random(&mut r, 2);
    let (passes, slots) = prefix_and_items(&mut r, model.vocab);
    let batched = model.scores(&g, &passes, slots);
    let twin = model.scores(&TwinBackend { gemm: GemmEngine::Wgmma, ..Default::default() }, &passes, slots);
    for (i, &score) in batched[1].iter().enumerate() {
        assert!((score - twin[1][i]).abs() <= 1e-3, "item {i}: gpu {score} vs twin {}", twin[1][i]);
        let alone = model.scores(&g, &[passes[0].clone(), only_seq(&passes[1], i)], slots);
        assert_eq!(alone[1][0].to_bits(), score.to_bits(), "item {i}: alone {} vs batched {score}", alone[1][0]);
    }
}

/// The TMA-fed, warp-specialised wgmma GEMM (wgmma_tma_tile.cuh) passes the index probes, gives
/// the cp.async-fed wgmma kernel's bits at both BLOCK_N, on all rows and on a few alone, and
/// agrees with the twin. Its name sorts it last: an mbarrier wait that times out traps, and a
/// trap ends the process's CUDA context. CPU twins: cuda_twin_dense.rs
/// `tiled_gemm_kernels_agree_bitwise_across_tiles_and_batches` (the TMA boxes from their encode
/// arguments) and the mbarrier protocol model in `twin/wgmma_tma.rs`.
#[test]
fn wgmma_tma_gemm_gives_the_wgmma_bits() {
    let Some(g) = hopper("wgmma_tma_gemm_gives_the_wgmma_bits") else { return };
    for bn in [128, 256] {
        gemm_index_probes_pass(&g, GemmKernel::WgmmaTma { bn });
    }
    let mut r = rng(74);
    for (m, n, k) in GEMM_TEST_SHAPES {
        let (x, wd) = (random(&mut r, m * k), random(&mut r, n * k));
        let kernels =
            [GemmKernel::Wgmma { bn: 256 }, GemmKernel::WgmmaTma { bn: 256 }, GemmKernel::WgmmaTma { bn: 128 }];
        let twin_gemm =
            move |xb: &[u16], wb: &[u16], out: &mut [f32]| twin::dense_gemm_wgmma_tma(256, xb, wb, out, m, n, k, 0.0);
        gemm_kernels_agree(&g, &kernels, (&x, &wd), (m, n, k), Some(&twin_gemm));
    }
}

/// The GPU's backend on the wgmma engine, when it is an sm_90; elsewhere the engine must be
/// refused with a reason, and the test says it did not run.
fn hopper(test: &str) -> Option<CudaBackend> {
    let g = gpu(test)?;
    if g.info().arch.number() != 90 {
        println!("{test}: NOT RUN on this GPU: sm_{} (the wgmma kernels need sm_90)", g.info().arch.number());
        let opts = CudaOptions {
            gemm: GemmEngine::Wgmma,
            ..CudaOptions::new(0).with_asset_cache(&cuda_common::asset_cache())
        };
        let err = CudaBackend::with_options(&opts).err().expect("the wgmma engine must be refused here");
        assert!(err.to_string().contains("wgmma"), "{err}");
        return None;
    }
    gpu_with(test, GemmEngine::Wgmma)
}

/// The wgmma engine's fused SwiGLU (the TMA-fed tile's split epilogue) and grouped GEMM on the
/// device. SwiGLU: the fused activation is the same backend's plain TMA-fed GEMM and `silu_mul`,
/// rounded, and near its twin. MoE: every variant the same bits, near the twin.
/// CPU twins: cuda_twin_dense.rs `fused_swiglu_gemm_is_bitwise_the_unfused_passes`;
/// cuda_twin_moe.rs.
#[test]
fn wgmma_fused_epilogues_and_moe_give_the_unfused_bits() {
    let Some(g) = hopper("wgmma_fused_epilogues_and_moe_give_the_unfused_bits") else { return };
    let mut r = rng(73);
    let round = |v: &[f32]| -> Vec<f32> { v.iter().map(|&x| twin::warp::round_bf16(x)).collect() };
    for &(m, hidden, inter) in &[(1usize, 1024usize, 3072usize), (77, 256, 200), (2049, 1024, 3072)] {
        let (x, wgu) = (random(&mut r, m * hidden), random(&mut r, 2 * inter * hidden));
        let (xt, gu_w) = (g.from_host(&x, m, hidden).unwrap(), g.linear_weight(&wgu, 2 * inter, hidden).unwrap());
        let (mut act, mut gu) = (g.zeros(0, 0).unwrap(), g.zeros(0, 0).unwrap());
        g.reshape_operand(&mut act, m, inter).unwrap();
        g.matmul_silu_mul(&xt, &gu_w, &mut gu, &mut act).unwrap();
        let (mut gate_up, mut plain) = (g.zeros(m, 2 * inter).unwrap(), g.zeros(m, inter).unwrap());
        g.matmul(&xt, &gu_w, None, &mut gate_up).unwrap();
        g.silu_mul(&gate_up, &mut plain).unwrap();
        let (fused, unfused) = (g.to_host(&act).unwrap(), round(&g.to_host(&plain).unwrap()));
        let what = format!("{m} rows, hidden {hidden}, inter {inter}");
        assert_bits_eq(&format!("{what}: SwiGLU epilogue"), &fused, &unfused);
        let (xb, wb): (Vec<u16>, Vec<u16>) = (
            x.iter().map(|&v| twin::warp::to_bf16(v)).collect(),
            wgu.iter().map(|&v| twin::warp::to_bf16(v)).collect(),
        );
        let mut want = vec![0u16; m * inter];
        twin::dense_gemm_wgmma_tma_swiglu(256, &xb, &wb, &mut want, m, 2 * inter, hidden);
        let want: Vec<f32> = want.iter().map(|&v| twin::warp::from_bf16(v)).collect();
        // bf16 outputs: the device's and the twin's f32 sums may round to neighbouring bf16
        // values (the H200 run: 700 against 704, one step apart), so one bf16 step of the
        // largest value is allowed; a wrong gate/up pairing is off by the values themselves.
        assert_close(&format!("{what}: SwiGLU epilogue vs twin"), &fused, &want, 1.0 / 128.0);
    }
    let dims = MoeDims { hidden: 256, inter: 192, n_experts: 64 };
    let gate_up: Vec<f32> = random(&mut r, 64 * 2 * 192 * 256).iter().map(|v| v * 0.1).collect();
    let down: Vec<f32> = random(&mut r, 64 * 256 * 192).iter().map(|v| v * 0.1).collect();
    let tw = TwinMoeWeights::new(dims, &gate_up, &down).unwrap();
    let gw = g.moe_expert_weights(dims, &gate_up, &down).unwrap();
    for &(tokens, top_k) in &[(1usize, 8usize), (200, 4), (1024, 8)] {
        let routing = MoeRouting { top_k, renormalize: true };
        let x = random(&mut r, tokens * 256);
        let logits: Vec<f32> = random(&mut r, tokens * 64).iter().map(|v| v * 4.0).collect();
        let (xt, lt) = (g.from_host(&x, tokens, 256).unwrap(), g.from_host(&logits, tokens, 64).unwrap());
        let mut outs = Vec::new();
        for policy in [TilePolicy::default(), TilePolicy::Fixed(BlockM::M64), TilePolicy::Fixed(BlockM::M128)] {
            let mut out = g.zeros(tokens, 256).unwrap();
            g.moe_forward(&xt, &lt, &gw, routing, policy, &mut out, false, None).unwrap();
            let got = g.to_host(&out).unwrap();
            let (want, _, _) =
                twin::moe_forward_with_counts(&x, &logits, &tw, routing, policy, GemmEngine::Wgmma, None).unwrap();
            let what = format!("wgmma MoE {tokens} tokens top-{top_k} {policy:?}");
            assert_close(&format!("{what} vs twin"), &got, &want, MMA_TWIN_TOL);
            outs.push(got);
        }
        assert_bits_eq(&format!("wgmma MoE {tokens} tokens: auto vs BLOCK_M 64"), &outs[0], &outs[1]);
        assert_bits_eq(&format!("wgmma MoE {tokens} tokens: auto vs BLOCK_M 128"), &outs[0], &outs[2]);
    }
}

/// If this fails on a GPU, cuBLAS picked kernels with different reduction orders for different
/// row counts: scores then depend on the batch, and the worker must run `GemmEngine::Tiled`
/// (or pin cuBLAS's algorithm) to keep the determinism contract.
#[test]
fn cublas_projections_are_batch_invariant() {
    let Some(g) = gpu_with("cublas_projections_are_batch_invariant", GemmEngine::Cublas) else { return };
    projection_rows_alone_and_batched(&g, 1024, 1024);
}

#[test]
fn small_model_scores_with_the_tiled_gemm_do_not_depend_on_the_batch() {
    let Some(g) = gpu_with("small_model_scores_with_the_tiled_gemm_do_not_depend_on_the_batch", GemmEngine::Tiled)
    else {
        return;
    };
    let mut r = rng(67);
    let model = MiniModel::random(&mut r, 2);
    let (passes, slots) = prefix_and_items(&mut r, model.vocab);
    let batched = model.scores(&g, &passes, slots);
    let twin = model.scores(&TwinBackend::tiled(), &passes, slots);
    for (i, &score) in batched[1].iter().enumerate() {
        assert!((score - twin[1][i]).abs() <= 1e-3, "item {i}: gpu {score} vs twin {}", twin[1][i]);
        let alone = model.scores(&g, &[passes[0].clone(), only_seq(&passes[1], i)], slots);
        assert_eq!(alone[1][0].to_bits(), score.to_bits(), "item {i}: alone {} vs batched {score}", alone[1][0]);
    }
}

#[test]
fn moe_threshold_autotune_runs_and_fits() {
    let Some(g) = gpu("moe_threshold_autotune_runs_and_fits") else { return };
    let mut r = rng(68);
    let dims = MoeDims { hidden: 256, inter: 128, n_experts: 32 };
    let w = g.moe_expert_weights(dims, &random(&mut r, 32 * 256 * 256), &random(&mut r, 32 * 256 * 128)).unwrap();
    let (th, samples) =
        g.calibrate_moe_threshold(&w, MoeRouting { top_k: 4, renormalize: true }, &[4, 64, 1024], 3).unwrap();
    assert_eq!(samples.len(), 3);
    assert!(samples[0].ratio > samples[2].ratio, "fewer tokens pad more: {samples:?}");
    assert!(th.is_finite() && th > 0.0, "threshold {th}");
    println!("calibrated threshold {th}: {samples:?}");
}

/// The fused engine (`GemmEngine::Tiled`: bf16 operands written by the norm, SiLU·mul in the
/// gate/up GEMM's epilogue) against the same tile unfused (`TiledUnfused`) on the device: the
/// norm's bf16 operand is the unfused f32 norm rounded, the fused activation the unfused one
/// rounded, and the down projection's output and the small model's scores the same bits. An
/// intermediate size the fused kernel cannot take (36) runs the unfused GEMM and `silu_mul_bf16`.
#[test]
fn fused_epilogues_give_the_unfused_bits() {
    let Some(f) = gpu_with("fused_epilogues_give_the_unfused_bits", GemmEngine::Tiled) else { return };
    let u = gpu_with("fused_epilogues_give_the_unfused_bits (unfused)", GemmEngine::TiledUnfused).expect("gpu");
    let mut r = rng(71);
    let round = |v: &[f32]| -> Vec<f32> { v.iter().map(|&x| twin::warp::round_bf16(x)).collect() };
    for &(m, hidden, inter) in &[(1usize, 1024usize, 3072usize), (77, 256, 200), (5, 64, 36), (2049, 1024, 3072)] {
        let (x, nw) = (random(&mut r, m * hidden), random(&mut r, hidden));
        let (wgu, wd) = (random(&mut r, 2 * inter * hidden), random(&mut r, hidden * inter));
        let run = |b: &CudaBackend| {
            let xt = b.from_host(&x, m, hidden).unwrap();
            let nv = b.vector(&nw).unwrap();
            let (gu_w, d_w) =
                (b.linear_weight(&wgu, 2 * inter, hidden).unwrap(), b.linear_weight(&wd, hidden, inter).unwrap());
            let (mut xn, mut act, mut gu) = (b.zeros(0, 0).unwrap(), b.zeros(0, 0).unwrap(), b.zeros(0, 0).unwrap());
            b.reshape_operand(&mut xn, m, hidden).unwrap();
            b.rms_norm(&xt, &nv, 1e-6, &mut xn).unwrap();
            b.reshape_operand(&mut act, m, inter).unwrap();
            b.matmul_silu_mul(&xn, &gu_w, &mut gu, &mut act).unwrap();
            let mut acc = b.from_host(&x, m, hidden).unwrap();
            b.matmul_add(&act, &d_w, &mut acc).unwrap();
            assert_eq!((xn.is_bf16(), act.is_bf16()), (b.gemm_engine().fused(), b.gemm_engine().fused()));
            (b.to_host(&xn).unwrap(), b.to_host(&act).unwrap(), b.to_host(&acc).unwrap())
        };
        let ((fx, fa, fo), (ux, ua, uo)) = (run(&f), run(&u));
        let what = format!("{m} rows, hidden {hidden}, inter {inter}");
        assert_bits_eq(&format!("{what}: bf16 norm vs the f32 norm rounded"), &fx, &round(&ux));
        assert_bits_eq(&format!("{what}: fused activation vs unfused rounded"), &fa, &round(&ua));
        assert_bits_eq(&format!("{what}: down projection"), &fo, &uo);
    }
    // Operand rows gathered as they are (the last layer's scored rows).
    let (x, nw) = (random(&mut r, 5 * 64), random(&mut r, 64));
    let gathered = |b: &CudaBackend| {
        let (xt, nv) = (b.from_host(&x, 5, 64).unwrap(), b.vector(&nw).unwrap());
        let (mut xn, mut out) = (b.zeros(0, 0).unwrap(), b.zeros(0, 0).unwrap());
        b.reshape_operand(&mut xn, 5, 64).unwrap();
        b.rms_norm(&xt, &nv, 1e-6, &mut xn).unwrap();
        b.reshape_operand(&mut out, 3, 64).unwrap();
        b.gather_rows(&xn, &[4, 0, 4], &mut out).unwrap();
        b.to_host(&out).unwrap()
    };
    assert_bits_eq("gathered operand rows vs the f32 rows rounded", &gathered(&f), &round(&gathered(&u)));
    let model = MiniModel::random(&mut r, 2);
    let (passes, slots) = prefix_and_items(&mut r, model.vocab);
    let (a, b) = (model.scores(&f, &passes, slots), model.scores(&u, &passes, slots));
    for (p, (a, b)) in a.iter().zip(&b).enumerate() {
        assert_bits_eq(&format!("model scores, pass {p}: fused vs unfused"), a, b);
    }
}
