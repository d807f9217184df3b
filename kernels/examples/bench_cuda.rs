//! CUDA backend throughput, ready to run where a GPU exists:
//!
//! 1. dense GEMM (bf16, f32 accumulate) on Qwen3-0.6B/4B-like projection shapes: TFLOP/s, for
//!    cuBLAS, the first batch-invariant tiled kernel (v1) and the current one at each BLOCK_M
//!    (the same-run baselines for each other);
//! 2. varlen paged attention on a scoring batch (one shared prefix, many items): tokens/s and
//!    TFLOP/s, the tensor-core kernel against the SIMT kernel in the same run;
//! 3. the MoE layer at Qwen3-30B-A3B-like expert shapes (128 experts, top-8, hidden 2048,
//!    expert size 768) for batch sizes 1..64 sequences: each fixed grouped-GEMM variant
//!    (BLOCK_M 64, BLOCK_M 128) against the device-side auto selector, with the histogram's
//!    padding ratio — the baseline is measured in the same run — and the auto selector with the
//!    gate/up GEMM's SwiGLU epilogue (the fused engine);
//! 4. one Qwen3-0.6B layer op by op (`bench_layer_ops`) at a 200- and a 500-item call's rows, on
//!    the tiled, wgmma, unfused and cuBLAS engines (where a layer's time goes, and what each
//!    fusion pays), and each projection's plain GEMM on every kernel from a bf16 operand;
//! 5. a synthetic 28-layer dense model through the `Backend` trait, per GEMM / attention engine
//!    pair (tiled, tiled v1, cuBLAS): pairs/s and tokens/s, and a call's milliseconds whole and
//!    until its launches were enqueued (close: the call is launch-bound, where CUDA graphs or
//!    fewer launches would pay), with the CPU backend on the smallest batch as the same-run
//!    baseline (`--no-cpu` skips it);
//! 6. the wgmma engine (sm_90 only): its GEMM on the shapes of 1 against cuBLAS and the mma.sync
//!    tile (and whether its bits equal the tile's), the MoE layer of 3 and the dense model of 5 on
//!    it against the fused mma.sync engine (its own section: a fault in it ends only its process);
//! 7. the TMA-fed, warp-specialised wgmma GEMM (sm_90 only) on the shapes of 1 against the
//!    cp.async-fed one and cuBLAS, and whether its bits equal the cp.async-fed kernel's (its own
//!    section too: a timed-out mbarrier wait traps).
//!
//!   cargo run --release -p sieve-kernels --example bench_cuda [-- --quick] [--no-cpu] [--only SECTION]...
//!
//! SECTION: gemm, attention, moe, layer, dense, wgmma, tma (1 to 7 above; all when none is named).
//!
//! GPU timings are CUDA-event medians of the enqueued work; end-to-end figures are wall clock.
//! Without a GPU it says so and exits with status 1.

use std::time::Instant;

use rand::{Rng, SeedableRng};
use sieve_kernels::cuda::layout::Sharing;
use sieve_kernels::cuda::moe::{BlockM, MoeDims, MoeRouting, TilePolicy};
use sieve_kernels::cuda::{
    tiled_block_m, AttentionEngine, CudaBackend, CudaMoeWeights, CudaOptions, CudaTensor, GemmEngine, GemmKernel,
    WgmmaShape,
};
use sieve_kernels::{AttnSeq, Backend, BatchLayout, CpuBackend, QkvLayout, RopeConfig, RopeLayout};

fn random(rng: &mut impl Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0) * scale).collect()
}

/// Median milliseconds of `f`'s device work, by CUDA events around each call.
fn gpu_ms(g: &CudaBackend, reps: usize, mut f: impl FnMut()) -> f64 {
    use cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
    f();
    g.synchronize().expect("sync");
    let mut samples: Vec<f64> = (0..reps)
        .map(|_| {
            let start = g.stream().record_event(Some(CU_EVENT_DEFAULT)).expect("event");
            f();
            let end = g.stream().record_event(Some(CU_EVENT_DEFAULT)).expect("event");
            start.elapsed_ms(&end).expect("elapsed") as f64
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// One shared prefix of `prefix` tokens (already in the cache) and `items` items of `item_len`.
fn scoring_batch(prefix: usize, items: usize, item_len: usize) -> (BatchLayout, BatchLayout, usize) {
    let mut pre = BatchLayout::default();
    for p in 0..prefix {
        pre.token_ids.push((p % 50) as u32);
        pre.positions.push(p as u32);
        pre.row_slots.push(p as u32);
        pre.key_slots.push(p as u32);
    }
    pre.seqs.push(AttnSeq { q_row: 0, q_len: prefix as u32, ctx_len: prefix as u32, slot_offset: 0 });
    let mut b = BatchLayout::default();
    let mut slot = prefix as u32;
    for _ in 0..items {
        let (q_row, slot_offset) = (b.token_ids.len() as u32, b.key_slots.len() as u32);
        b.key_slots.extend(0..prefix as u32);
        for i in 0..item_len {
            b.token_ids.push((i % 50) as u32);
            b.positions.push((prefix + i) as u32);
            b.row_slots.push(slot);
            b.key_slots.push(slot);
            slot += 1;
        }
        b.seqs.push(AttnSeq { q_row, q_len: item_len as u32, ctx_len: (prefix + item_len) as u32, slot_offset });
    }
    (pre, b, slot as usize)
}

/// The GEMM tables' projections (name, N, K) and row counts.
const GEMM_SHAPES: [(&str, usize, usize); 4] =
    [("qkv 0.6B", 4096, 1024), ("gate_up 0.6B", 6144, 1024), ("down 0.6B", 1024, 3072), ("gate_up 4B", 19456, 2560)];
const GEMM_ROWS: [usize; 6] = [16, 128, 512, 2048, 4096, 8192];

fn flops(m: usize, n: usize, k: usize, ms: f64) -> f64 {
    2.0 * (m * n * k) as f64 / (ms * 1e-3) / 1e12
}

fn bench_gemm(g: &CudaBackend, rng: &mut impl Rng, reps: usize) {
    println!("\nGEMM out[M,N] = x[M,K] · W[N,K]ᵀ (bf16 in, f32 out), TFLOP/s (event median, with the bf16 cast of x):");
    println!("cuBLAS; the first tiled kernel (v1); the current one at BLOCK_M 64 and 128; the BLOCK_M");
    println!("tiled_block_m picks (auto) and its share of cuBLAS. The tiled columns give the same bits.");
    println!(
        "{:>14} {:>6} {:>9} {:>9} {:>9} {:>9} {:>6} {:>9}",
        "shape", "M", "cuBLAS", "v1", "BM64", "BM128", "auto", "auto/cuB"
    );
    for &(name, n, k) in &GEMM_SHAPES {
        let w = g.linear_weight(&random(rng, n * k, 0.05), n, k).expect("weight");
        for m in GEMM_ROWS {
            let x = g.from_host(&random(rng, m * k, 1.0), m, k).expect("x");
            let mut out = g.zeros(m, n).expect("out");
            let mut tiled = |kernel: GemmKernel| {
                flops(m, n, k, gpu_ms(g, reps, || g.matmul_on(kernel, &x, &w, &mut out).expect("tiled")))
            };
            let v1 = tiled(GemmKernel::TiledV1 { bm: GemmEngine::TiledV1.block_m(m, n) });
            let (t64, t128) = (tiled(GemmKernel::Tiled { bm: 64 }), tiled(GemmKernel::Tiled { bm: 128 }));
            let cublas = flops(m, n, k, gpu_ms(g, reps, || g.matmul(&x, &w, None, &mut out).expect("matmul")));
            let bm = tiled_block_m(m, n);
            let auto = if bm == 64 { t64 } else { t128 };
            println!(
                "{name:>14} {m:>6} {cublas:>9.1} {v1:>9.1} {t64:>9.1} {t128:>9.1} {bm:>6} {:>8.0}%",
                100.0 * auto / cublas
            );
        }
    }
}

/// The wgmma GEMM (gemm_wgmma.cu) at BLOCK_N 128 and 256 and the one `WgmmaShape::dense_bn`
/// picks, against cuBLAS and the mma.sync tile at its auto BLOCK_M, on `bench_gemm`'s shapes;
/// "bits" says whether the wgmma output equals the tile's bit for bit.
fn bench_wgmma_gemm(g: &CudaBackend, rng: &mut impl Rng, reps: usize) {
    println!("\nwgmma GEMM (gemm_wgmma.cu, sm_90a), TFLOP/s (event median, with the bf16 cast of x):");
    println!(
        "{:>14} {:>6} {:>9} {:>9} {:>9} {:>9} {:>6} {:>9} {:>9} {:>7}",
        "shape", "M", "cuBLAS", "tiled", "WG128", "WG256", "auto", "auto/cuB", "auto/tld", "bits"
    );
    for &(name, n, k) in &GEMM_SHAPES {
        let w = g.linear_weight(&random(rng, n * k, 0.05), n, k).expect("weight");
        for m in GEMM_ROWS {
            let x = g.from_host(&random(rng, m * k, 1.0), m, k).expect("x");
            let (mut out, mut tiled_out) = (g.zeros(m, n).expect("out"), g.zeros(m, n).expect("out"));
            let cublas = flops(m, n, k, gpu_ms(g, reps, || g.matmul(&x, &w, None, &mut out).expect("matmul")));
            let time = |kernel: GemmKernel, out: &mut CudaTensor| {
                flops(m, n, k, gpu_ms(g, reps, || g.matmul_on(kernel, &x, &w, out).expect("matmul_on")))
            };
            let tiled = time(GemmKernel::Tiled { bm: tiled_block_m(m, n) }, &mut tiled_out);
            let (w128, w256) =
                (time(GemmKernel::Wgmma { bn: 128 }, &mut out), time(GemmKernel::Wgmma { bn: 256 }, &mut out));
            let bn = WgmmaShape::dense_bn(m, n);
            let auto = if bn == 128 { w128 } else { w256 };
            g.matmul_on(GemmKernel::Wgmma { bn }, &x, &w, &mut out).expect("wgmma");
            let same = g.to_host(&out).expect("out") == g.to_host(&tiled_out).expect("tiled out");
            println!(
                "{name:>14} {m:>6} {cublas:>9.1} {tiled:>9.1} {w128:>9.1} {w256:>9.1} {bn:>6} {:>8.0}% {:>8.0}% {:>7}",
                100.0 * auto / cublas,
                100.0 * auto / tiled,
                if same { "same" } else { "differ" }
            );
        }
    }
}

/// The TMA-fed, warp-specialised wgmma GEMM (wgmma_tma_tile.cuh) at BLOCK_N 128 and 256 against
/// the cp.async-fed one at the BLOCK_N `WgmmaShape::dense_bn` picks and cuBLAS, on `bench_gemm`'s
/// shapes; "bits" says whether its output equals the cp.async-fed kernel's bit for bit.
fn bench_wgmma_tma_gemm(g: &CudaBackend, rng: &mut impl Rng, reps: usize) {
    println!("\nTMA-fed wgmma GEMM (wgmma_tma_tile.cuh, sm_90a), TFLOP/s (event median, with the bf16 cast of x):");
    println!(
        "{:>14} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}",
        "shape", "M", "cuBLAS", "wgmma", "TMA128", "TMA256", "best/cuB", "best/wg", "bits"
    );
    for &(name, n, k) in &GEMM_SHAPES {
        let w = g.linear_weight(&random(rng, n * k, 0.05), n, k).expect("weight");
        for m in GEMM_ROWS {
            let x = g.from_host(&random(rng, m * k, 1.0), m, k).expect("x");
            let (mut out, mut wg_out) = (g.zeros(m, n).expect("out"), g.zeros(m, n).expect("out"));
            let cublas = flops(m, n, k, gpu_ms(g, reps, || g.matmul(&x, &w, None, &mut out).expect("matmul")));
            let time = |kernel: GemmKernel, out: &mut CudaTensor| {
                flops(m, n, k, gpu_ms(g, reps, || g.matmul_on(kernel, &x, &w, out).expect("matmul_on")))
            };
            let wg = time(GemmKernel::Wgmma { bn: WgmmaShape::dense_bn(m, n) }, &mut wg_out);
            let (t128, t256) =
                (time(GemmKernel::WgmmaTma { bn: 128 }, &mut out), time(GemmKernel::WgmmaTma { bn: 256 }, &mut out));
            let same = g.to_host(&out).expect("out") == g.to_host(&wg_out).expect("wgmma out");
            let best = t128.max(t256);
            println!(
                "{name:>14} {m:>6} {cublas:>9.1} {wg:>9.1} {t128:>9.1} {t256:>9.1} {:>8.0}% {:>8.0}% {:>7}",
                100.0 * best / cublas,
                100.0 * best / wg,
                if same { "same" } else { "differ" }
            );
        }
    }
}

/// The MoE layer of `bench_moe` on the fused mma.sync engine (`tiled`) and on the wgmma engine
/// (moe_gemm_wgmma.cu), auto policy: event median ms per batch.
fn bench_moe_engines(tiled: &CudaBackend, wgmma: &CudaBackend, rng: &mut impl Rng, reps: usize) {
    let dims = MoeDims { hidden: 2048, inter: 768, n_experts: 128 };
    let routing = MoeRouting { top_k: 8, renormalize: true };
    println!(
        "\nMoE layer on each engine ({} experts top-{}, hidden {}, expert size {}; event median ms, auto policy)",
        dims.n_experts, routing.top_k, dims.hidden, dims.inter
    );
    let (wgu, wd) = (
        random(rng, dims.n_experts * 2 * dims.inter * dims.hidden, 0.02),
        random(rng, dims.n_experts * dims.hidden * dims.inter, 0.02),
    );
    let weights = |b: &CudaBackend| b.moe_expert_weights(dims, &wgu, &wd).expect("moe weights");
    let (tw, ww) = (weights(tiled), weights(wgmma));
    println!("{:>6} {:>8} {:>10} {:>10} {:>10}", "seqs", "tokens", "tiled", "wgmma", "wgmma/tld");
    for seqs in [1usize, 4, 16, 64] {
        let tokens = seqs * 120;
        let (xs, ls) = (random(rng, tokens * dims.hidden, 1.0), random(rng, tokens * dims.n_experts, 3.0));
        let time = |b: &CudaBackend, w: &CudaMoeWeights| {
            let x = b.from_host(&xs, tokens, dims.hidden).expect("x");
            let logits = b.from_host(&ls, tokens, dims.n_experts).expect("logits");
            let mut out = b.zeros(tokens, dims.hidden).expect("out");
            let policy = TilePolicy::default();
            gpu_ms(b, reps, || {
                drop(b.moe_forward(&x, &logits, w, routing, policy, &mut out, false, None).expect("moe"))
            })
        };
        let (t, w) = (time(tiled, &tw), time(wgmma, &ww));
        println!("{seqs:>6} {tokens:>8} {t:>10.3} {w:>10.3} {:>9.0}%", 100.0 * w / t);
    }
}

/// Attention FLOPs of a layout: QKᵀ and PV, 2 per multiply-add, over each row's visible keys.
fn attention_flops(b: &BatchLayout, layout: QkvLayout) -> f64 {
    let visible: u64 =
        b.seqs.iter().map(|s| (0..s.q_len as u64).map(|i| (s.ctx_len - s.q_len) as u64 + i + 1).sum::<u64>()).sum();
    4.0 * visible as f64 * (layout.n_heads * layout.head_dim) as f64
}

fn bench_attention(g: &mut CudaBackend, rng: &mut impl Rng, reps: usize) {
    println!("\nAttention (one layer, prefix already cached): query tokens/s and TFLOP/s (event median), per engine");
    println!(
        "{:>8} {:>8} {:>8} {:>14} {:>8} {:>10} {:>10} {:>10}",
        "prefix", "items", "item", "heads/kv/hd", "engine", "ms", "Mtok/s", "TFLOP/s"
    );
    for &(prefix, items, item_len, (nh, nkv, hd)) in &[
        (200, 20, 100, (16, 8, 128)),
        (200, 200, 100, (16, 8, 128)),
        (500, 1000, 60, (16, 8, 128)),
        (200, 200, 100, (32, 4, 128)),
        (200, 200, 100, (8, 8, 256)),
    ] {
        let layout = QkvLayout { n_heads: nh, n_kv_heads: nkv, head_dim: hd };
        let (pre, batch, slots) = scoring_batch(prefix, items, item_len);
        let mut cache = g.kv_cache(1, slots, nkv, hd).expect("cache");
        let pb = g.prepare_batch(&pre, &cache).expect("batch");
        let q = g
            .from_host(&random(rng, pre.num_rows() * layout.qkv_dim(), 1.0), pre.num_rows(), layout.qkv_dim())
            .expect("q");
        g.write_kv(&q, layout, &mut cache, 0, &pb).expect("kv");
        let rows = batch.num_rows();
        let bb = g.prepare_batch(&batch, &cache).expect("batch");
        // The tensor-core kernel also under the schedule that shares every prefix tile (before
        // the cost rule, `layout::sharing_pays`): the same bits, another time.
        let bb_all = g.prepare_batch_with(&batch, &cache, Sharing::Always).expect("batch");
        let q = g.from_host(&random(rng, rows * layout.qkv_dim(), 1.0), rows, layout.qkv_dim()).expect("q");
        g.write_kv(&q, layout, &mut cache, 0, &bb).expect("kv");
        let mut out = g.zeros(rows, layout.q_dim()).expect("out");
        let flops = attention_flops(&batch, layout);
        for (engine, b, name) in [
            (AttentionEngine::Mma, &bb, "Mma"),
            (AttentionEngine::Mma, &bb_all, "Mma-all"),
            (AttentionEngine::Simt, &bb, "Simt"),
        ] {
            g.set_attention_engine(engine);
            let ms = gpu_ms(g, reps, || g.attention(&q, layout, &cache, 0, b, &mut out).expect("attention"));
            println!(
                "{prefix:>8} {items:>8} {item_len:>8} {:>14} {:>8} {ms:>10.3} {:>10.2} {:>10.1}",
                format!("{nh}/{nkv}/{hd}"),
                name,
                rows as f64 / (ms * 1e-3) / 1e6,
                flops / (ms * 1e-3) / 1e12
            );
        }
    }
    g.set_attention_engine(AttentionEngine::default());
}

/// `g` runs the unfused layer (gate/up GEMM, then `silu_mul_bf16`); `fused`, on the fused
/// engine, the gate/up GEMM with the SwiGLU epilogue (column "auto fused", auto policy).
fn bench_moe(g: &CudaBackend, fused: Option<&CudaBackend>, rng: &mut impl Rng, reps: usize) {
    let dims = MoeDims { hidden: 2048, inter: 768, n_experts: 128 };
    let routing = MoeRouting { top_k: 8, renormalize: true };
    println!("\nMoE layer, {} experts top-{}, hidden {}, expert size {} (event median ms; padding ratio = padded rows at 128 / real rows)", dims.n_experts, routing.top_k, dims.hidden, dims.inter);
    let (wgu, wd) = (
        random(rng, dims.n_experts * 2 * dims.inter * dims.hidden, 0.02),
        random(rng, dims.n_experts * dims.hidden * dims.inter, 0.02),
    );
    let w = g.moe_expert_weights(dims, &wgu, &wd).expect("moe weights");
    let fw = fused.map(|f| f.moe_expert_weights(dims, &wgu, &wd).expect("moe weights"));
    println!(
        "{:>6} {:>8} {:>10} {:>10} {:>10} {:>10} {:>7} {:>10} {:>11}",
        "seqs", "tokens", "pad@128", "BM64", "BM128", "auto", "chose", "auto/best", "auto fused"
    );
    let (mut sum64, mut sum128, mut sum_auto) = (0.0, 0.0, 0.0);
    for seqs in [1usize, 2, 4, 8, 16, 32, 64] {
        let tokens = seqs * 120; // ~120 item tokens per scored pair
        let (xs, ls) = (random(rng, tokens * dims.hidden, 1.0), random(rng, tokens * dims.n_experts, 3.0));
        let upload = |b: &CudaBackend| {
            let x = b.from_host(&xs, tokens, dims.hidden).expect("x");
            (x, b.from_host(&ls, tokens, dims.n_experts).expect("logits"), b.zeros(tokens, dims.hidden).expect("out"))
        };
        let time = |b: &CudaBackend, w: &CudaMoeWeights, policy| {
            let (x, logits, mut out) = upload(b);
            gpu_ms(b, reps, || {
                drop(b.moe_forward(&x, &logits, w, routing, policy, &mut out, false, None).expect("moe"))
            })
        };
        let (t64, t128, ta) = (
            time(g, &w, TilePolicy::Fixed(BlockM::M64)),
            time(g, &w, TilePolicy::Fixed(BlockM::M128)),
            time(g, &w, TilePolicy::default()),
        );
        let t_fused = fused
            .zip(fw.as_ref())
            .map_or("-".to_string(), |(f, fw)| format!("{:.3}", time(f, fw, TilePolicy::default())));
        let (x, logits, mut out) = upload(g);
        let stats = g
            .moe_forward(&x, &logits, &w, routing, TilePolicy::default(), &mut out, false, None)
            .expect("moe")
            .read(g)
            .expect("stats");
        sum64 += t64;
        sum128 += t128;
        sum_auto += ta;
        println!(
            "{seqs:>6} {tokens:>8} {:>10.2} {t64:>10.3} {t128:>10.3} {ta:>10.3} {:>7} {:>10.3} {t_fused:>11}",
            stats.padded128 as f64 / stats.real_rows.max(1) as f64,
            stats.block_m,
            ta / t64.min(t128)
        );
    }
    println!("{:>6} {:>8} {:>10} {sum64:>10.3} {sum128:>10.3} {sum_auto:>10.3}   (sum over the sweep)", "all", "", "");
    let counts: Vec<usize> = [1usize, 2, 4, 8, 16, 32, 64].iter().map(|s| s * 120).collect();
    match g.calibrate_moe_threshold(&w, routing, &counts, reps.min(7)) {
        Ok((th, samples)) => {
            println!("autotuned padding threshold: {th:.3} (default 1.5) from");
            for s in samples {
                println!("    ratio {:>7.2}: BM64 {:>8.3} ms, BM128 {:>8.3} ms", s.ratio, s.ms64, s.ms128);
            }
        }
        Err(e) => println!("autotune failed: {e}"),
    }
}

/// One Qwen3-0.6B layer op by op, per engine, at a 200- and a 500-item call's rows: where a
/// layer's time goes (event medians, each op timed alone). Below it, each projection's plain
/// GEMM on every kernel from a bf16 operand (no cast), the same rows.
fn bench_layer_ops(engines: &[(&str, &CudaBackend)], rng: &mut impl Rng, reps: usize) {
    let (h, inter, l) = (1024, 3072, QkvLayout { n_heads: 16, n_kv_heads: 8, head_dim: 128 });
    let rope = RopeConfig {
        theta: 1_000_000.0,
        rotary_dim: l.head_dim,
        layout: RopeLayout::HalfSplit,
        scaling: Default::default(),
    };
    let (norm, hn) = (vec![1.0; h.max(inter)], vec![1.0; l.head_dim]);
    let (wqkv, wo) = (random(rng, l.qkv_dim() * h, 0.03), random(rng, h * l.q_dim(), 0.03));
    let (wgu, wd) = (random(rng, 2 * inter * h, 0.03), random(rng, h * inter, 0.02));
    // As the worker runs a layer: each projection stores plainly and the next norm adds it to
    // the residual stream (`add_rms_norm`); the last two columns, the residual read in the
    // projections' epilogue instead (`matmul_add`), for comparison, and the q/k norm, RoPE and
    // K/V write alone (`qk_norm_rope_write_kv`, in qkv+rope+kv).
    const OPS: [&str; 11] = [
        "add+norm",
        "qkv+rope+kv",
        "attention",
        "o",
        "add+norm",
        "gate_up+swiglu",
        "down",
        "layer",
        "o+res",
        "down+res",
        "rope+kv",
    ];
    for items in [200usize, 500] {
        let (pre, batch, slots) = scoring_batch(200, items, 100);
        let rows = batch.num_rows();
        let x = random(rng, rows * inter, 1.0);
        println!("\nOne Qwen3-0.6B layer op by op at {rows} rows ({items} items of 100 over a 200-token prefix): event median ms");
        print!("{:>10}", "engine");
        for op in OPS {
            print!(" {op:>14}");
        }
        println!();
        for &(name, b) in engines {
            let mut cache = b.kv_cache(1, slots, l.n_kv_heads, l.head_dim).expect("cache");
            let pb = b.prepare_batch(&pre, &cache).expect("batch");
            let q = b.zeros(pre.num_rows(), l.qkv_dim()).expect("q");
            b.write_kv(&q, l, &mut cache, 0, &pb).expect("prefix kv");
            let bb = b.prepare_batch(&batch, &cache).expect("batch");
            let (nv, hv) = (b.vector(&norm[..h]).expect("n"), b.vector(&hn).expect("n"));
            let (wqkv, wo) =
                (b.linear_weight(&wqkv, l.qkv_dim(), h).expect("w"), b.linear_weight(&wo, h, l.q_dim()).expect("w"));
            let (wgu, wd) =
                (b.linear_weight(&wgu, 2 * inter, h).expect("w"), b.linear_weight(&wd, h, inter).expect("w"));
            let (mut t, mut att, mut act, mut gu) = (
                b.zeros(0, 0).expect("t"),
                b.zeros(0, 0).expect("a"),
                b.zeros(0, 0).expect("a"),
                b.zeros(0, 0).expect("g"),
            );
            b.reshape_operand(&mut t, rows, h).expect("t");
            b.reshape_operand(&mut att, rows, l.q_dim()).expect("att");
            b.reshape_operand(&mut act, rows, inter).expect("act");
            let (mut qkv, mut acc) =
                (b.zeros(rows, l.qkv_dim()).expect("qkv"), b.from_host(&x[..rows * h], rows, h).expect("acc"));
            let mut delta = b.from_host(&x[..rows * h], rows, h).expect("delta");
            let norms = (Some(&hv), Some(&hv));
            let mut ms = [0.0f64; 11];
            ms[0] = gpu_ms(b, reps, || b.add_rms_norm(&mut acc, &delta, &nv, 1e-6, &mut t).expect("norm"));
            ms[1] = gpu_ms(b, reps, || {
                b.matmul(&t, &wqkv, None, &mut qkv).expect("qkv");
                b.qk_norm_rope_write_kv(&mut qkv, l, norms.0, norms.1, 1e-6, rope, &mut cache, 0, &bb).expect("rope")
            });
            ms[2] = gpu_ms(b, reps, || b.attention(&qkv, l, &cache, 0, &bb, &mut att).expect("attention"));
            ms[3] = gpu_ms(b, reps, || b.matmul(&att, &wo, None, &mut delta).expect("o"));
            ms[4] = ms[0];
            ms[5] = gpu_ms(b, reps, || b.matmul_silu_mul(&t, &wgu, &mut gu, &mut act).expect("gate_up"));
            ms[6] = gpu_ms(b, reps, || b.matmul(&act, &wd, None, &mut delta).expect("down"));
            ms[7] = ms[..7].iter().sum();
            ms[8] = gpu_ms(b, reps, || b.matmul_add(&att, &wo, &mut acc).expect("o+res"));
            ms[9] = gpu_ms(b, reps, || b.matmul_add(&act, &wd, &mut acc).expect("down+res"));
            ms[10] = gpu_ms(b, reps, || {
                b.qk_norm_rope_write_kv(&mut qkv, l, norms.0, norms.1, 1e-6, rope, &mut cache, 0, &bb).expect("rope")
            });
            print!("{name:>10}");
            for v in ms {
                print!(" {v:>14.3}");
            }
            println!();
        }
        // The plain GEMMs: out = x·Wᵀ from a bf16 operand, TFLOP/s.
        let g = engines[0].1;
        println!("plain GEMM from a bf16 operand at {rows} rows, TFLOP/s:");
        println!(
            "{:>10} {:>6} {:>6} {:>9} {:>9} {:>9} {:>9}",
            "proj", "N", "K", "tiled", "wgmma", "TMA", "cuBLAS+cast"
        );
        for (proj, n, k) in
            [("qkv", l.qkv_dim(), h), ("o", h, l.q_dim()), ("gate_up", 2 * inter, h), ("down", h, inter)]
        {
            let w = g.linear_weight(&random(rng, n * k, 0.03), n, k).expect("w");
            let (xf, nv) = (g.from_host(&x[..rows * k], rows, k).expect("x"), g.vector(&norm[..k]).expect("n"));
            let mut xb = g.zeros(0, 0).expect("xb");
            g.reshape_operand(&mut xb, rows, k).expect("xb");
            g.rms_norm(&xf, &nv, 1e-6, &mut xb).expect("norm");
            let mut out = g.zeros(rows, n).expect("out");
            let mut time = |kernel: GemmKernel| {
                flops(rows, n, k, gpu_ms(g, reps, || g.matmul_on(kernel, &xb, &w, &mut out).expect("matmul_on")))
            };
            let bn = WgmmaShape::dense_bn(rows, n);
            let (tl, wg, tma) = (
                time(GemmKernel::Tiled { bm: tiled_block_m(rows, n) }),
                time(GemmKernel::Wgmma { bn }),
                time(GemmKernel::WgmmaTma { bn }),
            );
            let cublas = match engines.iter().find(|e| e.0 == "cublas") {
                Some((_, c)) => {
                    let (w, xf, nv) = (
                        c.linear_weight(&random(rng, n * k, 0.03), n, k).expect("w"),
                        c.from_host(&x[..rows * k], rows, k).expect("x"),
                        c.vector(&norm[..k]).expect("n"),
                    );
                    let mut xb = c.zeros(0, 0).expect("xb");
                    c.reshape_operand(&mut xb, rows, k).expect("xb");
                    c.rms_norm(&xf, &nv, 1e-6, &mut xb).expect("norm");
                    let mut out = c.zeros(rows, n).expect("out");
                    flops(rows, n, k, gpu_ms(c, reps, || c.matmul(&xb, &w, None, &mut out).expect("matmul")))
                }
                None => f64::NAN,
            };
            println!("{proj:>10} {n:>6} {k:>6} {tl:>9.1} {wg:>9.1} {tma:>9.1} {cublas:>9.1}");
        }
    }
}

/// A Qwen3-0.6B-shaped dense stack with random weights, through the Backend trait.
struct Dense {
    layers: usize,
    hidden: usize,
    inter: usize,
    layout: QkvLayout,
}

/// One dense forward timed: pairs/s, tokens/s, and the milliseconds of one call, whole and until
/// its last layer's launches were enqueued (before the scores' download waits for the device):
/// where the two are close, the call is bound by launching, not by the device.
struct DenseTiming {
    pairs_per_s: f64,
    tokens_per_s: f64,
    enqueue_ms: f64,
    call_ms: f64,
}

impl Dense {
    fn time<B: Backend>(&self, b: &B, rng: &mut impl Rng, items: usize, item_len: usize, prefix: usize) -> DenseTiming {
        let (h, l) = (self.hidden, self.layout);
        let vocab = 1000;
        let emb = b.embedding(&random(rng, vocab * h, 1.0), vocab, h).expect("embedding");
        let norm = b.vector(&vec![1.0; h]).expect("norm");
        let hn = b.vector(&vec![1.0; l.head_dim]).expect("norm");
        let ws: Vec<_> = (0..self.layers)
            .map(|_| {
                (
                    b.linear_weight(&random(rng, l.qkv_dim() * h, 0.03), l.qkv_dim(), h).expect("w"),
                    b.linear_weight(&random(rng, h * l.q_dim(), 0.03), h, l.q_dim()).expect("w"),
                    b.linear_weight(&random(rng, 2 * self.inter * h, 0.03), 2 * self.inter, h).expect("w"),
                    b.linear_weight(&random(rng, h * self.inter, 0.02), h, self.inter).expect("w"),
                )
            })
            .collect();
        let (pre, batch, slots) = scoring_batch(prefix, items, item_len);
        let mut cache = b.kv_cache(self.layers, slots, l.n_kv_heads, l.head_dim).expect("cache");
        let rope = RopeConfig {
            theta: 1_000_000.0,
            rotary_dim: l.head_dim,
            layout: RopeLayout::HalfSplit,
            scaling: Default::default(),
        };
        // Every layer's ops, enqueued; the scores (a download: it waits for the device) apart.
        let layers = |layout: &BatchLayout, cache: &mut B::KvCache| -> B::Tensor {
            let rows = layout.num_rows();
            let pb = b.prepare_batch(layout, cache).expect("batch");
            let mut x = b.zeros(rows, h).expect("x");
            b.embed(&emb, &pb, &mut x).expect("embed");
            // As the worker runs it: the projections' inputs are operands (bf16, written by the
            // norm, the attention and the gate/up GEMM's epilogue, on the fused engine).
            let (mut t, mut qkv, mut att) =
                (b.zeros(0, 0).expect("t"), b.zeros(rows, l.qkv_dim()).expect("qkv"), b.zeros(0, 0).expect("att"));
            let (mut gu, mut act) = (b.zeros(0, 0).expect("gu"), b.zeros(0, 0).expect("act"));
            b.reshape_operand(&mut t, rows, h).expect("t");
            b.reshape_operand(&mut att, rows, l.q_dim()).expect("att");
            b.reshape_operand(&mut act, rows, self.inter).expect("act");
            // Each projection stores plainly; the next norm adds it to the residual stream.
            let mut delta = b.zeros(rows, h).expect("delta");
            for (layer, (wqkv, wo, wgu, wd)) in ws.iter().enumerate() {
                if layer == 0 {
                    b.rms_norm(&x, &norm, 1e-6, &mut t).expect("norm");
                } else {
                    b.add_rms_norm(&mut x, &delta, &norm, 1e-6, &mut t).expect("norm");
                }
                let norms = (Some(&hn), Some(&hn));
                b.matmul(&t, wqkv, None, &mut qkv).expect("qkv");
                b.qk_norm_rope_write_kv(&mut qkv, l, norms.0, norms.1, 1e-6, rope, cache, layer, &pb).expect("rope");
                b.attention(&qkv, l, cache, layer, &pb, &mut att).expect("attention");
                b.matmul(&att, wo, None, &mut delta).expect("o");
                b.add_rms_norm(&mut x, &delta, &norm, 1e-6, &mut t).expect("norm");
                b.matmul_silu_mul(&t, wgu, &mut gu, &mut act).expect("gate_up");
                b.matmul(&act, wd, None, &mut delta).expect("down");
            }
            b.add_rms_norm(&mut x, &delta, &norm, 1e-6, &mut t).expect("norm");
            x
        };
        let score = |layout: &BatchLayout, x: &B::Tensor| -> Vec<f32> {
            let last: Vec<u32> = layout.seqs.iter().map(|s| s.q_row + s.q_len - 1).collect();
            let mut xl = b.zeros(last.len(), h).expect("xl");
            b.gather_rows(x, &last, &mut xl).expect("gather");
            b.dot_rows(&xl, &norm).expect("score")
        };
        score(&pre, &layers(&pre, &mut cache));
        score(&batch, &layers(&batch, &mut cache)); // warm-up
        let reps = 3;
        let (mut enqueue, mut call) = (0.0, 0.0);
        for _ in 0..reps {
            let t = Instant::now();
            let x = layers(&batch, &mut cache);
            enqueue += t.elapsed().as_secs_f64();
            score(&batch, &x);
            call += t.elapsed().as_secs_f64();
        }
        let (enqueue, call) = (enqueue / reps as f64, call / reps as f64);
        DenseTiming {
            pairs_per_s: items as f64 / call,
            tokens_per_s: batch.num_rows() as f64 / call,
            enqueue_ms: enqueue * 1e3,
            call_ms: call * 1e3,
        }
    }
}

/// The sections, in run order; `--only NAME` (repeatable) runs just those, so that a run can
/// give each its own process (scripts/gpu-bench: a kernel fault ends one section, not all).
const SECTIONS: [&str; 7] = ["gemm", "attention", "moe", "layer", "dense", "wgmma", "tma"];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let with_cpu = !args.iter().any(|a| a == "--no-cpu");
    let only: Vec<&str> = args.windows(2).filter(|w| w[0] == "--only").map(|w| w[1].as_str()).collect();
    if let Some(bad) = only.iter().find(|s| !SECTIONS.contains(s)) {
        eprintln!("bench_cuda: no section {bad:?}; --only takes one of {SECTIONS:?}");
        std::process::exit(2);
    }
    let runs = |section: &str| only.is_empty() || only.contains(&section);
    let reps = if quick { 5 } else { 21 };
    let cache = std::env::var_os("SIEVE_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache"));
    let engine = |gemm, attention| {
        CudaBackend::with_options(&CudaOptions { gemm, attention, ..CudaOptions::new(0).with_asset_cache(&cache) })
    };
    let mut g = match engine(GemmEngine::default(), AttentionEngine::default()) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("bench_cuda: no usable GPU on this machine, nothing measured: {e}");
            std::process::exit(1);
        }
    };
    let info = g.info();
    println!(
        "device: {} (sm_{}, {} SMs, {:.1} GiB); kernels: {:?}",
        info.name,
        info.arch.number(),
        info.multiprocessors,
        info.total_memory as f64 / (1u64 << 30) as f64,
        g.kernel_load_report()
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    if runs("gemm") {
        bench_gemm(&g, &mut rng, reps);
    }
    if runs("attention") {
        bench_attention(&mut g, &mut rng, reps);
    }
    if runs("moe") {
        let fused = engine(GemmEngine::Tiled, AttentionEngine::Mma).ok();
        bench_moe(&g, fused.as_ref(), &mut rng, reps);
    }
    let model = Dense {
        layers: 28,
        hidden: 1024,
        inter: 3072,
        layout: QkvLayout { n_heads: 16, n_kv_heads: 8, head_dim: 128 },
    };
    let dense_table = |rng: &mut rand::rngs::StdRng, pairs: &[(GemmEngine, AttentionEngine)], cpu: bool| {
        println!("\nDense model (28 layers, hidden 1024, Qwen3-0.6B shapes, random weights): prefix 200 tokens + items of 100 tokens");
        println!(
            "{:>8} {:>14} {:>14} {:>12} {:>10} {:>22}",
            "items", "pairs/s", "tokens/s", "enqueue ms", "call ms", "backend"
        );
        let row = |items: usize, d: DenseTiming, name: &str| {
            let DenseTiming { pairs_per_s, tokens_per_s, enqueue_ms, call_ms } = d;
            println!(
                "{items:>8} {pairs_per_s:>14.1} {tokens_per_s:>14.0} {enqueue_ms:>12.2} {call_ms:>10.2} {name:>22}"
            );
        };
        let engines: Vec<(String, CudaBackend)> = pairs
            .iter()
            .filter_map(|&(gemm, attention)| {
                engine(gemm, attention).ok().map(|b| (format!("cuda {gemm:?}/{attention:?}"), b))
            })
            .collect();
        for items in [20usize, 100, 500] {
            for (name, e) in &engines {
                row(items, model.time(e, rng, items, 100, 200), name);
            }
            if cpu && items == 20 {
                let cpu = CpuBackend::new(0).expect("cpu");
                row(items, model.time(&cpu, rng, items, 100, 200), "cpu");
            }
        }
    };
    if runs("dense") {
        let pairs = [
            (GemmEngine::Tiled, AttentionEngine::Simt),
            (GemmEngine::Tiled, AttentionEngine::Mma),
            (GemmEngine::TiledUnfused, AttentionEngine::Mma),
            (GemmEngine::TiledV1, AttentionEngine::Mma),
            (GemmEngine::Cublas, AttentionEngine::Mma),
        ];
        dense_table(&mut rng, &pairs, with_cpu);
    }
    if runs("wgmma") {
        if g.info().arch.number() != 90 {
            println!("\nwgmma: NOT RUN (sm_{}; the wgmma GEMM needs sm_90)", g.info().arch.number());
            return;
        }
        bench_wgmma_gemm(&g, &mut rng, reps);
        match (engine(GemmEngine::Tiled, AttentionEngine::Mma), engine(GemmEngine::Wgmma, AttentionEngine::Mma)) {
            (Ok(t), Ok(w)) => bench_moe_engines(&t, &w, &mut rng, reps),
            (Err(e), _) | (_, Err(e)) => println!("wgmma MoE: no backend: {e}"),
        }
        let pairs = [(GemmEngine::Tiled, AttentionEngine::Mma), (GemmEngine::Wgmma, AttentionEngine::Mma)];
        dense_table(&mut rng, &pairs, false);
    }
    if runs("layer") {
        let names = [
            ("tiled", GemmEngine::Tiled),
            ("wgmma", GemmEngine::Wgmma),
            ("unfused", GemmEngine::TiledUnfused),
            ("cublas", GemmEngine::Cublas),
        ];
        let backends: Vec<(&str, CudaBackend)> =
            names.iter().filter_map(|&(n, e)| engine(e, AttentionEngine::Mma).ok().map(|b| (n, b))).collect();
        let refs: Vec<(&str, &CudaBackend)> = backends.iter().map(|(n, b)| (*n, b)).collect();
        bench_layer_ops(&refs, &mut rng, reps);
    }
    if runs("tma") {
        if g.info().arch.number() != 90 {
            println!("\ntma: NOT RUN (sm_{}; the TMA-fed wgmma GEMM needs sm_90)", g.info().arch.number());
            return;
        }
        bench_wgmma_tma_gemm(&g, &mut rng, reps);
    }
}
