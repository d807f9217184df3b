//! The cost landscape of the CPU MoE variants: for evenly spread histograms (every active expert
//! holding n rows), the time of each variant's grouped expert SwiGLU, on random weights of the
//! bench qwen3_moe shapes (128 experts, hidden 1024, expert width 512) unless told otherwise.
//!
//!   cargo run --release -p sieve-kernels --example bench_moe_variants -- [--threads N]
//!       [--hidden 1024] [--inter 512] [--experts 128] [--rows 1,2,4,...] [--active 128] [--reps 5]
//!       [--f32]   (weights not bf16-exact: grouped_bf16 then runs f32 panels)
//!
//! Variants run interleaved, each figure is the minimum over the repetitions (the machine is
//! shared: the minimum is the least disturbed run). Compare columns of one run only.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use sieve_kernels::{Backend, CpuBackend, MoeLayerHost};

/// CPU time of every thread of this process so far (Linux schedstat; 0 elsewhere).
fn process_cpu_ns() -> u64 {
    sieve_kernels::cpu::schedstat::process_schedstat().running_ns
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let num = |flag: &str, d: usize| arg(flag).and_then(|v| v.parse().ok()).unwrap_or(d);
    let (threads, h, i, e) = (num("--threads", 0), num("--hidden", 1024), num("--inter", 512), num("--experts", 128));
    let reps = num("--reps", 5);
    let active = num("--active", e).min(e);
    let rows: Vec<u32> = arg("--rows")
        .map(|s| s.split(',').filter_map(|v| v.parse().ok()).collect())
        .unwrap_or(vec![1, 2, 4, 8, 12, 16, 24, 32, 64, 128, 256]);
    let cpu = CpuBackend::new(threads).expect("backend");
    let mut g = rand::rngs::StdRng::seed_from_u64(5);
    // Weights rounded to bf16 as in a bf16 checkpoint (`--f32` keeps full f32 values).
    let keep_f32 = args.iter().any(|a| a == "--f32");
    let round = |v: f32| if keep_f32 { v } else { f32::from_bits((v.to_bits() + 0x8000) & 0xffff_0000) };
    let mut w = |n: usize, fan_in: usize| -> Vec<f32> {
        (0..n).map(|_| round(g.random_range(-1f32..1.0) * (3.0 / fan_in as f32).sqrt())).collect()
    };
    let (router, gate_up, down) = (w(e * h, h), w(e * 2 * i * h, h), w(e * h * i, i));
    let layer = MoeLayerHost {
        hidden: h,
        num_experts: e,
        expert_inter: i,
        router: &router,
        gate_up: &gate_up,
        down: &down,
        shared: None,
    };
    let weights = cpu.moe_weights(&layer).expect("weights");
    drop((router, gate_up, down));
    let variants = cpu.moe_variants();
    println!("{}: {e} experts ({active} active), hidden {h}, expert width {i}; ms per layer (min of {reps}; cpu = process CPU time / threads)", cpu.name());
    print!("{:>11}", "rows/e");
    for v in &variants {
        print!(" {:>12}", v.name);
    }
    println!();
    for &n in &rows {
        let mut hist = vec![0u32; e];
        for (k, c) in hist.iter_mut().enumerate() {
            if k < active {
                *c = n;
            }
        }
        let mut best = vec![Duration::MAX; variants.len()];
        let mut best_cpu = vec![u64::MAX; variants.len()];
        for _ in 0..reps {
            for v in 0..variants.len() {
                let c0 = process_cpu_ns();
                let t = cpu.moe_time_variant(&weights, v, &hist).expect("run");
                best_cpu[v] = best_cpu[v].min(process_cpu_ns() - c0);
                best[v] = best[v].min(t);
            }
        }
        let show = |label: &str, vals: Vec<f64>| {
            print!("{n:>6} {label}");
            let min = vals.iter().copied().fold(f64::INFINITY, f64::min);
            for b in &vals {
                let mark = if *b == min { '*' } else { ' ' };
                print!(" {:>11.2}{mark}", b);
            }
            println!();
        };
        show("wall", best.iter().map(|b| b.as_secs_f64() * 1e3).collect());
        show("cpu ", best_cpu.iter().map(|&c| c as f64 / 1e6 / cpu.threads() as f64).collect());
    }
}
