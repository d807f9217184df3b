//! CPU backend throughput: our GEMM vs the `gemm` crate on SmolLM2-135M's projection shapes (same
//! run, same thread count), attention on a realistic scoring batch (one shared prefix + many
//! items), and one whole decoder layer on that batch with the prefill rate it implies.
//!
//!   cargo run --release -p sieve-kernels --example bench_cpu
//!
//! Options: `--threads N` (default: all), `--quick` (shorter timing), `--isa avx512|avx2|portable`,
//! `--m 1,64` / `--shapes 0,3` / `--shape NxK` (restrict or replace the GEMM table),
//! `--no-attention`, `--no-layer`. Environment: `BENCH_OURS_ONLY=1` / `BENCH_GEMM_ONLY=1` time
//! only our GEMM / only the `gemm` crate,
//! `BENCH_REPS=N` runs each case exactly N times (for CPU-time counters such as `perf stat`).
//!
//! Each case is timed repeatedly; "median" is the typical call on whatever else the machine is
//! doing, "best" the fastest call (closest to an idle machine). Compare columns of one run.

use std::time::Instant;

use rand::{Rng, SeedableRng};
use sieve_kernels::cpu::Isa;
use sieve_kernels::host::HostTensor;
use sieve_kernels::{AttnSeq, Backend, BatchLayout, CpuBackend, QkvLayout};

fn random(rng: &mut impl Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// Seconds per call.
#[derive(Clone, Copy)]
struct Timing {
    median: f64,
    best: f64,
}

impl Timing {
    const NONE: Timing = Timing { median: f64::NAN, best: f64::NAN };
}

/// Times `f` until about `budget` seconds have passed (or exactly `BENCH_REPS` calls).
fn time(budget: f64, mut f: impl FnMut()) -> Timing {
    if let Some(reps) = std::env::var("BENCH_REPS").ok().and_then(|v| v.parse::<usize>().ok()) {
        let t = Instant::now();
        for _ in 0..reps {
            f();
        }
        let per_call = t.elapsed().as_secs_f64() / reps.max(1) as f64;
        return Timing { median: per_call, best: per_call };
    }
    f();
    let mut samples = Vec::new();
    let start = Instant::now();
    while samples.len() < 5 || (start.elapsed().as_secs_f64() < budget && samples.len() < 1000) {
        let t = Instant::now();
        f();
        samples.push(t.elapsed().as_secs_f64());
    }
    samples.sort_by(f64::total_cmp);
    Timing { median: samples[samples.len() / 2], best: samples[0] }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads = args
        .iter()
        .position(|a| a == "--threads")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let quick = args.iter().any(|a| a == "--quick");
    let budget = if quick { 0.2 } else { 1.0 };
    // --m 64,4096 and --shapes 0,3 restrict the GEMM table (for tuning runs).
    let list = |flag: &str| -> Option<Vec<usize>> {
        let i = args.iter().position(|a| a == flag)?;
        Some(args.get(i + 1)?.split(',').filter_map(|v| v.parse().ok()).collect())
    };
    let ms = list("--m").unwrap_or(vec![1, 16, 64, 512, 4096]);
    let shape_ids = list("--shapes").unwrap_or(vec![0, 1, 2, 3]);
    let skip_attention = args.iter().any(|a| a == "--no-attention");
    let isa = match args.iter().position(|a| a == "--isa").and_then(|i| args.get(i + 1)).map(String::as_str) {
        Some("avx512") => Isa::Avx512,
        Some("avx2") => Isa::Avx2,
        Some("portable") => Isa::Portable,
        _ => Isa::detect(),
    };
    let cpu = CpuBackend::with_isa(threads, isa).expect("cpu backend");
    let threads = cpu.threads();
    println!("backend: {}", cpu.name());
    let gemm_pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool");
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);

    println!("\nGEMM out[M,N] = x[M,K] · W[N,K]ᵀ, GFLOP/s, {threads} threads");
    println!("{:<18} {:>5}   {:>14}   {:>14}   {:>12}", "", "", "sieve", "gemm crate", "sieve / gemm");
    println!(
        "{:<18} {:>5}   {:>6} {:>7}   {:>6} {:>7}   {:>5} {:>6}",
        "shape (N x K)", "M", "median", "best", "median", "best", "median", "best"
    );
    let shapes = [
        ("qkv 960x576", 960, 576),
        ("o_proj 576x576", 576, 576),
        ("gate_up 3072x576", 3072, 576),
        ("down 576x1536", 576, 1536),
    ];
    // --shape NxK adds a custom shape (tuning).
    let custom: Vec<(String, usize, usize)> = args
        .iter()
        .position(|a| a == "--shape")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.split_once('x'))
        .and_then(|(n, k)| Some((format!("custom {n}x{k}"), n.parse().ok()?, k.parse().ok()?)))
        .into_iter()
        .collect();
    let selected: Vec<(String, usize, usize)> = if custom.is_empty() {
        shape_ids.iter().filter_map(|&i| shapes.get(i)).map(|&(name, n, k)| (name.to_string(), n, k)).collect()
    } else {
        custom
    };
    for (name, n, k) in selected {
        let wdata = random(&mut rng, n * k);
        let w = cpu.linear_weight(&wdata, n, k).expect("weight");
        for &m in &ms {
            let x = HostTensor::from_vec(random(&mut rng, m * k), m, k);
            let mut out = HostTensor::zeros(m, n);
            let flops = 2.0 * (m * n * k) as f64;
            let gemm_only = std::env::var_os("BENCH_GEMM_ONLY").is_some();
            let ours = if gemm_only {
                Timing::NONE
            } else {
                time(budget, || cpu.matmul(&x, &w, None, &mut out).expect("matmul"))
            };
            let mut dst = out.data.clone();
            let ours_only = std::env::var_os("BENCH_OURS_ONLY").is_some();
            let theirs = if ours_only {
                Timing::NONE
            } else {
                time(budget, || {
                    gemm_pool.install(|| unsafe {
                        gemm::gemm(
                            m,
                            n,
                            k,
                            dst.as_mut_ptr(),
                            1,
                            n as isize,
                            false,
                            x.data.as_ptr(),
                            1,
                            k as isize,
                            wdata.as_ptr(),
                            k as isize,
                            1,
                            0.0,
                            1.0,
                            false,
                            false,
                            false,
                            gemm::Parallelism::Rayon(threads),
                        )
                    })
                })
            };
            if gemm_only {
                cpu.matmul(&x, &w, None, &mut out).expect("matmul");
            }
            let max_diff = out.data.iter().zip(&dst).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(max_diff < 1e-2, "results differ by {max_diff}");
            let gflops = |t: f64| flops / t / 1e9;
            println!(
                "{:<18} {:>5}   {:>6.1} {:>7.1}   {:>6.1} {:>7.1}   {:>5.2} {:>6.2}",
                name,
                m,
                gflops(ours.median),
                gflops(ours.best),
                gflops(theirs.median),
                gflops(theirs.best),
                theirs.median / ours.median,
                theirs.best / ours.best
            );
        }
    }

    if skip_attention {
        return;
    }
    // Attention: 1 prefix of 80 tokens + 64 items of 40..120 tokens, SmolLM2 heads (its own seed:
    // the same batch whatever the GEMM table ran).
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    let layout = QkvLayout { n_heads: 9, n_kv_heads: 3, head_dim: 64 };
    let prefix = 80usize;
    let items: Vec<usize> = (0..64).map(|_| rng.random_range(40..=120)).collect();
    let rows = prefix + items.iter().sum::<usize>();
    let mut batch = BatchLayout::default();
    let push_rows = |b: &mut BatchLayout, n: usize, pos0: usize, slot0: usize| {
        for i in 0..n {
            b.token_ids.push(0);
            b.positions.push((pos0 + i) as u32);
            b.row_slots.push((slot0 + i) as u32);
        }
    };
    push_rows(&mut batch, prefix, 0, 0);
    batch.seqs.push(AttnSeq { q_row: 0, q_len: prefix as u32, ctx_len: prefix as u32, slot_offset: 0 });
    batch.key_slots.extend(0..prefix as u32);
    let (mut row, mut slot) = (prefix, prefix);
    let mut flops = 4.0 * (prefix * (prefix + 1) / 2) as f64;
    for &n in &items {
        push_rows(&mut batch, n, prefix, slot);
        batch.seqs.push(AttnSeq {
            q_row: row as u32,
            q_len: n as u32,
            ctx_len: (prefix + n) as u32,
            slot_offset: batch.key_slots.len() as u32,
        });
        batch.key_slots.extend(0..prefix as u32);
        batch.key_slots.extend(slot as u32..(slot + n) as u32);
        flops += 4.0 * (0..n).map(|i| (prefix + i + 1) as f64).sum::<f64>();
        row += n;
        slot += n;
    }
    flops *= (layout.n_heads * layout.head_dim) as f64;
    let mut cache = cpu.kv_cache(1, slot, layout.n_kv_heads, layout.head_dim).expect("cache");
    let b = cpu.prepare_batch(&batch, &cache).expect("batch");
    let qkv = HostTensor::from_vec(random(&mut rng, rows * layout.qkv_dim()), rows, layout.qkv_dim());
    cpu.write_kv(&qkv, layout, &mut cache, 0, &b).expect("write_kv");
    let mut out = HostTensor::zeros(rows, layout.q_dim());
    let t = time(budget, || cpu.attention(&qkv, layout, &cache, 0, &b, &mut out).expect("attention"));
    println!("\nattention: 1 prefix of {prefix} + {} items of 40..120 tokens ({rows} rows), 9 heads / 3 kv heads / head_dim 64", items.len());
    println!(
        "  median {:.1} ms per layer ({:.1} GFLOP/s of QK + PV), best {:.1} ms ({:.1} GFLOP/s)",
        t.median * 1e3,
        flops / t.median / 1e9,
        t.best * 1e3,
        flops / t.best / 1e9
    );

    if args.iter().any(|a| a == "--no-layer") {
        return;
    }
    // One whole SmolLM2 decoder layer on the same batch (random weights), and the prefill rate
    // it implies for the 30-layer model (embedding and score head excluded: negligible).
    let (hidden, inter) = (576usize, 1536usize);
    // Weights scaled like a trained model's (activations of order 1, a spread-out softmax).
    let mut weight = |n: usize, k: usize| {
        let data: Vec<f32> = random(&mut rng, n * k).iter().map(|v| v * (3.0 / k as f32).sqrt()).collect();
        cpu.linear_weight(&data, n, k).expect("weight")
    };
    let w_qkv = weight(layout.qkv_dim(), hidden);
    let w_o = weight(hidden, hidden);
    let w_gu = weight(2 * inter, hidden);
    let w_down = weight(hidden, inter);
    let norm = cpu.vector(&vec![1.0; hidden]).expect("v");
    let rope = sieve_kernels::RopeConfig {
        theta: 100000.0,
        rotary_dim: 64,
        layout: sieve_kernels::RopeLayout::Interleaved,
        scaling: Default::default(),
    };
    let mut h = HostTensor::from_vec(random(&mut rng, rows * hidden), rows, hidden);
    let mut x = HostTensor::zeros(rows, hidden);
    let mut qkv = HostTensor::zeros(rows, layout.qkv_dim());
    let mut att = HostTensor::zeros(rows, layout.q_dim());
    let mut gu = HostTensor::zeros(rows, 2 * inter);
    let mut act = HostTensor::zeros(rows, inter);
    let t = time(budget, || {
        cpu.rms_norm(&h, &norm, 1e-5, &mut x).expect("op");
        cpu.matmul(&x, &w_qkv, None, &mut qkv).expect("op");
        cpu.qk_norm_rope(&mut qkv, layout, None, None, 1e-5, rope, &b).expect("op");
        cpu.write_kv(&qkv, layout, &mut cache, 0, &b).expect("op");
        cpu.attention(&qkv, layout, &cache, 0, &b, &mut att).expect("op");
        cpu.matmul_add(&att, &w_o, &mut h).expect("op");
        cpu.rms_norm(&h, &norm, 1e-5, &mut x).expect("op");
        cpu.matmul(&x, &w_gu, None, &mut gu).expect("op");
        cpu.silu_mul(&gu, &mut act).expect("op");
        cpu.matmul_add(&act, &w_down, &mut h).expect("op");
        // keep the residual stream bounded over repetitions
        cpu.rms_norm(&h, &norm, 1e-5, &mut x).expect("op");
        std::mem::swap(&mut h, &mut x);
    });
    println!("\nSmolLM2 decoder layer (norms, QKV, RoPE, KV write, attention, o_proj, SwiGLU MLP) on that batch:");
    println!(
        "  median {:.1} ms per layer -> {:.0} prefill tokens/s for 30 layers; best {:.1} ms -> {:.0} tokens/s",
        t.median * 1e3,
        rows as f64 / (30.0 * t.median),
        t.best * 1e3,
        rows as f64 / (30.0 * t.best)
    );
}
