//! MoE layer time by batch size, each fixed variant against the auto selector, on the bench-size
//! qwen3_moe (generated, bf16: 4 layers, hidden 1024, 128 experts of width 512, top-8) on the
//! CPU backend.
//!
//! ```text
//! cargo bench -p sieve-worker --bench moe [-- --sizes 1,2,4,8,16,32,64] [--reps 5] [--threads N]
//!                                            [--no-autotune] [--seed 1] [--variants a,b,...]
//! ```
//! `--variants` restricts both the fixed columns and auto's choice to those variants (the cost
//! model keeps only their entries), e.g. `padded64,padded128`: the GPU's BLOCK_M pair.
//! For each batch size B: B realistic prompts (the Qwen3-Reranker template around a query and a
//! product listing, 100–200 tokens each, no prefix sharing) run one forward pass that captures
//! every MoE layer's input (real activations, real routing). Then each MoE layer call of that pass
//! (three full layers, and the last layer on the scored rows only) is timed with every fixed
//! variant and with auto, back to back on the same layer (the order rotating every round), `reps`
//! rounds; a figure is the per-layer minimum over the rounds, summed over the pass's MoE layers.
//! `wall` is elapsed time; `cpu` is the process's CPU time / threads during the call (Linux),
//! steadier when other processes share the cores. `auto@fixed` prices auto's per-layer choices at
//! the fixed columns' per-layer figures: it shows whether the choices were right, free of the
//! noise between columns. `paired` is auto against the best fixed variant measured the robust
//! way: the median over rounds of (auto's pass time / that variant's pass time in the same
//! round) — both measured back to back on each layer, so slow drifts of the machine cancel. The
//! sweep summary compares auto with each fixed variant the same way (per-size paired medians,
//! weighted by that variant's time). The noise-floor line repeats the paired measure for auto
//! against the variant it ran on every layer (same kernels): what the machine's timing noise
//! alone gives. Auto's cost model comes from the worker's start-up path (the
//! calibration cache, or an autotune that fills it).
//!
//! The benchmark checkpoint is generated once into `<asset cache>/bench/` (about 2 GB).

use std::path::PathBuf;
use std::time::Instant;

use sieve_kernels::autotune::median;
use sieve_kernels::{Backend, CpuBackend, MoeSelect};
use sieve_worker::assets;
use sieve_worker::bench_support::{item_text, INSTRUCTION};
use sieve_worker::config::MoeSection;
use sieve_worker::engine::layout::LayoutBuilder;
use sieve_worker::model::loader::{self, LoadOptions};
use sieve_worker::model::testgen::{self, Preset, StoreDType, TestArch, TestModelSpec};
use sieve_worker::model::{MoePolicy, Scratch};
use sieve_worker::moe::setup as moe_setup;

const QUERIES: &[&str] = &[
    "lightweight waterproof trail running shoes for women with good grip, size 8",
    "black leather ankle boots men wide fit",
    "vegan canvas slip-on sneakers white",
    "cushioned marathon road shoes breathable mesh",
];

/// CPU time of every thread of this process so far (Linux schedstat; 0 elsewhere).
fn process_cpu_ns() -> u64 {
    sieve_kernels::cpu::schedstat::process_schedstat().running_ns
}

fn bench_model(seed: u64) -> PathBuf {
    let dir = assets::cache_dir().join(format!("bench/qwen3_moe-bench-seed{seed}-bf16"));
    if !dir.join("model.safetensors").is_file() {
        let tok = assets::cache_dir().join(assets::QWEN3_TOKENIZER);
        assert!(tok.is_file(), "{} is missing: run scripts/fetch-assets", tok.display());
        eprintln!("generating the bench qwen3_moe checkpoint into {} ...", dir.display());
        let t = Instant::now();
        let spec = TestModelSpec::preset(TestArch::Qwen3Moe, Preset::Bench, seed, StoreDType::BF16);
        let info = testgen::generate(&spec, &dir, &tok).expect("generate the bench model");
        eprintln!("  {} parameters in {:.0} s", info.n_params, t.elapsed().as_secs_f64());
    }
    dir
}

struct Timing {
    wall: f64,
    cpu: f64,
}

/// One batch size's figures.
struct SizeResult<'a> {
    seqs: usize,
    tokens: usize,
    /// Mean rows per active expert in the first MoE layer.
    mean_rows: f64,
    /// Per column (fixed variants, then auto): per-layer minima over the rounds, summed.
    best: Vec<Timing>,
    /// Auto's choices priced at the fixed columns' per-layer minima.
    priced: Timing,
    /// Per column, per round: the pass time (summed over layers).
    rounds: Vec<Vec<Timing>>,
    chosen: Vec<&'a str>,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let sizes: Vec<usize> = arg("--sizes")
        .map(|s| s.split(',').filter_map(|v| v.parse().ok()).collect())
        .unwrap_or(vec![1, 2, 4, 8, 16, 32, 64]);
    let reps: usize = arg("--reps").and_then(|v| v.parse().ok()).unwrap_or(5).max(1);
    let threads: usize = arg("--threads").and_then(|v| v.parse().ok()).unwrap_or(0);
    let seed: u64 = arg("--seed").and_then(|v| v.parse().ok()).unwrap_or(1);
    let autotune = !args.iter().any(|a| a == "--no-autotune");

    let backend = CpuBackend::new(threads).expect("cpu backend");
    let path = bench_model(seed);
    let t = Instant::now();
    let mut loaded = loader::load(&backend, &path, &LoadOptions::default()).expect("load the bench model");
    eprintln!("loaded {} in {:.0} s on {}", loaded.name, t.elapsed().as_secs_f64(), backend.name());
    let cfg = MoeSection { autotune, ..Default::default() };
    let t = Instant::now();
    let setup = moe_setup::configure(
        &backend,
        &mut loaded.model,
        &loaded.name,
        &cfg,
        &assets::cache_dir().join("moe-autotune"),
    )
    .expect("moe setup")
    .expect("a MoE model");
    let cost = match loaded.model.moe_policy() {
        MoePolicy::Auto(m) => m.clone(),
        MoePolicy::Fixed(_) => unreachable!("auto is the default"),
    };
    println!(
        "cost model: {} ({:.1} s{}); choice by rows per expert: {}",
        setup.cost_source,
        t.elapsed().as_secs_f64(),
        setup
            .autotune
            .as_ref()
            .map(|r| format!(", {} samples, {} knots measured", r.samples, r.knots_measured))
            .unwrap_or_default(),
        setup
            .thresholds
            .iter()
            .map(|r| format!("{}..={} {}", r.from_rows, r.to_rows, r.variant))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let all_variants = backend.moe_variants();
    // The variants compared (all, or --variants): (index in the backend's list, description).
    let subset: Option<Vec<String>> = arg("--variants").map(|s| s.split(',').map(str::to_string).collect());
    let variants: Vec<(usize, &sieve_kernels::MoeVariant)> = all_variants
        .iter()
        .enumerate()
        .filter(|(_, v)| subset.as_ref().is_none_or(|s| s.iter().any(|n| n == v.name)))
        .collect();
    assert!(
        !variants.is_empty(),
        "--variants names none of {:?}",
        all_variants.iter().map(|v| v.name).collect::<Vec<_>>()
    );
    let mut cost = cost;
    cost.variants.retain(|c| variants.iter().any(|(_, v)| v.name == c.variant));
    let names: Vec<&str> = variants.iter().map(|(_, v)| v.name).chain(["auto"]).collect();
    let c = loaded.model.config.clone();
    let enc = loaded.tokenizer.clone();

    let mut results: Vec<SizeResult> = Vec::new();
    for &b in &sizes {
        // B prompts of 100–200 tokens.
        let prompts: Vec<Vec<u32>> = (0..b)
            .map(|i| {
                let target = 100 + (i * 37) % 101;
                let q = QUERIES[i % QUERIES.len()];
                let mut words = 10;
                loop {
                    let ids = loaded
                        .builder
                        .prompt_ids(enc.as_ref(), INSTRUCTION, q, &item_text(i as u64 + 1, words))
                        .expect("prompt");
                    if ids.len() >= target || words > 300 {
                        return ids;
                    }
                    words += 1 + (target - ids.len()) / 3;
                }
            })
            .collect();
        let tokens: usize = prompts.iter().map(Vec::len).sum();
        let mut kv = backend.kv_cache(c.n_layers, tokens, c.n_kv_heads, c.head_dim).expect("kv");
        let mut lb = LayoutBuilder::new();
        let mut next = 0u32;
        let mut out_rows = vec![];
        for p in &prompts {
            let slots: Vec<u32> = (next..next + p.len() as u32).collect();
            next += p.len() as u32;
            out_rows.push(lb.push(p, &slots).expect("rows"));
        }
        let layout = lb.finish();
        let mut scratch = Scratch::new(&backend).expect("scratch");
        scratch.moe.capture_inputs = true;
        loaded.model.forward(&backend, &layout, &mut kv, &out_rows, None, &mut scratch).expect("forward");
        let inputs: Vec<sieve_kernels::host::HostTensor> = scratch
            .moe
            .captured
            .iter()
            .map(|x| sieve_kernels::host::HostTensor::from_vec(x.clone(), x.len() / c.hidden, c.hidden))
            .collect();
        let layers: Vec<_> = loaded.model.moe_layers().collect();
        assert_eq!(inputs.len(), layers.len());
        let mean_rows = {
            let s = scratch.moe.pass.layers[0];
            s.rows as f64 / s.active_experts.max(1) as f64
        };
        drop(scratch);
        // min over rounds, per (variant, layer)
        let n = names.len();
        let mut best = vec![vec![(f64::INFINITY, f64::INFINITY); layers.len()]; n];
        let mut chosen = vec![""; layers.len()];
        let mut chosen_column = vec![0usize; layers.len()];
        let mut rounds: Vec<Vec<Timing>> =
            (0..n).map(|_| (0..reps).map(|_| Timing { wall: 0.0, cpu: 0.0 }).collect()).collect();
        let mut log = backend.moe_log().expect("log");
        #[allow(clippy::needless_range_loop)] // `round` also rotates the variant order
        for round in 0..reps {
            for (l, (x, layer)) in inputs.iter().zip(&layers).enumerate() {
                for i in 0..n {
                    let v = (i + round) % n;
                    let select =
                        if v < variants.len() { MoeSelect::Fixed(variants[v].0) } else { MoeSelect::Auto(&cost) };
                    let mut acc = backend.zeros(x.rows, x.cols).expect("acc");
                    let (c0, t0) = (process_cpu_ns(), Instant::now());
                    backend.moe_ffn(x, &layer.weights, layer.routing, select, &mut acc, &mut log).expect("moe");
                    let wall = t0.elapsed().as_secs_f64();
                    let cpu = (process_cpu_ns() - c0) as f64 / 1e9 / backend.threads() as f64;
                    best[v][l].0 = best[v][l].0.min(wall);
                    best[v][l].1 = best[v][l].1.min(cpu);
                    rounds[v][round].wall += wall;
                    rounds[v][round].cpu += cpu;
                    let rec = backend.read_moe_log(&mut log).expect("log");
                    if v == variants.len() {
                        let idx = rec[0].variant as usize;
                        chosen[l] = all_variants[idx].name;
                        chosen_column[l] =
                            variants.iter().position(|(i, _)| *i == idx).expect("auto chose a listed variant");
                    }
                }
            }
        }
        let timings = best
            .iter()
            .map(|per_layer| Timing {
                wall: per_layer.iter().map(|t| t.0).sum(),
                cpu: per_layer.iter().map(|t| t.1).sum(),
            })
            .collect();
        let priced = Timing {
            wall: chosen_column.iter().enumerate().map(|(l, &c)| best[c][l].0).sum(),
            cpu: chosen_column.iter().enumerate().map(|(l, &c)| best[c][l].1).sum(),
        };
        results.push(SizeResult { seqs: b, tokens, mean_rows, best: timings, priced, rounds, chosen });
        eprintln!("batch {b} done");
    }

    for (label, pick) in [("wall", 0usize), ("cpu", 1)] {
        let get = |t: &Timing| if pick == 0 { t.wall } else { t.cpu };
        println!(
            "\nMoE time per forward pass ({} MoE layers), ms, {label} (min of {reps} rounds); * = best fixed variant",
            results.first().map_or(0, |r| r.chosen.len())
        );
        print!("{:>5} {:>6} {:>7}", "seqs", "tokens", "rows/e");
        for n in &names {
            print!(" {:>12}", n);
        }
        println!(" {:>9} {:>10} {:>7}  auto's choice per layer", "auto/best", "auto@fixed", "paired");
        let mut worst_ratio = 0f64;
        let auto_col = variants.len();
        // Auto / fixed variant v at one size: the median over rounds of the paired ratios.
        let paired = |r: &SizeResult, v: usize| {
            median(&(0..reps).map(|i| get(&r.rounds[auto_col][i]) / get(&r.rounds[v][i])).collect::<Vec<_>>())
        };
        for r in &results {
            let (b, tokens, mean_rows, t, priced, chosen) =
                (r.seqs, r.tokens, r.mean_rows, &r.best, &r.priced, &r.chosen);
            let fixed = &t[..variants.len()];
            let best = fixed.iter().map(get).fold(f64::INFINITY, f64::min);
            print!("{b:>5} {tokens:>6} {mean_rows:>7.1}");
            for x in fixed {
                let mark = if get(x) == best { '*' } else { ' ' };
                print!(" {:>11.1}{mark}", get(x) * 1e3);
            }
            let auto = get(&t[variants.len()]);
            let best_col = (0..variants.len()).min_by(|&a, &c| get(&fixed[a]).total_cmp(&get(&fixed[c]))).unwrap_or(0);
            let p = paired(r, best_col);
            worst_ratio = worst_ratio.max(p);
            println!(
                " {:>12.1} {:>9.3} {:>10.3} {:>7.3}  {}",
                auto * 1e3,
                auto / best,
                get(priced) / best,
                p,
                chosen.join(" ")
            );
        }
        // Over the sweep: total time, and the geometric mean of time / best fixed (every size
        // weighted alike).
        print!("{:>20}", "total");
        let totals: Vec<f64> = (0..names.len()).map(|v| results.iter().map(|r| get(&r.best[v])).sum()).collect();
        for t in &totals {
            print!(" {:>12.1}", t * 1e3);
        }
        println!();
        print!("{:>20}", "geomean vs best");
        let geo: Vec<f64> = (0..names.len())
            .map(|v| {
                let logs: f64 = results
                    .iter()
                    .map(|r| {
                        let best = r.best[..variants.len()].iter().map(get).fold(f64::INFINITY, f64::min);
                        (get(&r.best[v]) / best).ln()
                    })
                    .sum();
                (logs / results.len() as f64).exp()
            })
            .collect();
        for g in &geo {
            print!(" {:>12.3}", g);
        }
        println!();
        // Over the sweep, auto against each fixed variant: per-size paired ratios weighted by the
        // variant's time (= auto's total / the variant's total, estimated pairwise).
        print!("{:>20}", "auto/this, sweep");
        let sweep: Vec<f64> = (0..variants.len())
            .map(|v| {
                results.iter().map(|r| paired(r, v) * get(&r.best[v])).sum::<f64>()
                    / results.iter().map(|r| get(&r.best[v])).sum::<f64>()
            })
            .collect();
        for s in &sweep {
            print!(" {:>12.3}", s);
        }
        println!();
        // The timing noise floor: at sizes where auto ran one fixed variant's kernel on every
        // layer, auto against that variant compares the same code with itself.
        let same: Vec<String> = results
            .iter()
            .filter_map(|r| {
                let first = r.chosen.first()?;
                let col = variants.iter().position(|(_, v)| v.name == *first)?;
                r.chosen.iter().all(|c| c == first).then(|| format!("{}: {:.3}", r.seqs, paired(r, col)))
            })
            .collect();
        println!("noise floor (paired auto / the variant it ran on every layer, same kernels): {}", same.join(", "));
        let not_beaten: Vec<&str> =
            variants.iter().zip(&sweep).filter(|(_, &s)| s >= 1.0).map(|((_, v), _)| v.name).collect();
        println!(
            "auto (paired): worst ratio to the best fixed variant {:.3} ({}); over the sweep {}",
            worst_ratio,
            if worst_ratio <= 1.05 { "within 5% at every size" } else { "NOT within 5% everywhere" },
            if not_beaten.is_empty() {
                "strictly better than each fixed variant".to_string()
            } else {
                format!("not better than {not_beaten:?}")
            }
        );
    }
}
