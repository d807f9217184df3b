//! Engine throughput on the embedded default model (SmolLM2-135M, CPU backend).
//!
//! ```text
//! cargo bench -p sieve-worker --bench engine            # all sections
//! cargo bench -p sieve-worker --bench engine -- prefill # one section: prefill | request | pipeline | catalogue
//! cargo bench -p sieve-worker --bench engine -- threshold  # only when named: item_prefix_min_tokens swept
//! ```
//! Prints: prefill tokens/s for one 512-token sequence; for a realistic call (one query, 64 items
//! of 40–120 tokens, prefix ~80 tokens) pairs/s and tokens/s with prefix reuse off, with in-batch
//! reuse, and with a cross-batch cache hit, next to the fraction of prefill tokens saved; the
//! runner's idle fraction between batches under a queued load; and item prefix sharing on and
//! off, interleaved, on a catalogue call (200 items in groups of about 8 sharing a header of about
//! 40% of an item's tokens) and on the realistic call (no shared headers).

use std::sync::Arc;
use std::time::Instant;

use sieve_kernels::{Backend, CpuBackend};
use sieve_worker::assets;
use sieve_worker::bench_support::{item_text, INSTRUCTION};
use sieve_worker::config::WorkerConfig;
use sieve_worker::device::engine_config;
use sieve_worker::engine::layout::LayoutBuilder;
use sieve_worker::engine::{CancellationToken, EngineHandle, EngineParts, EngineState, Submission};
use sieve_worker::model::loader::{self, LoadOptions, LoadedModel};
use sieve_worker::model::Scratch;

/// `count` items whose own segments (item text + template suffix, after the shared prefix) are
/// spread over 40–120 tokens.
fn realistic_items(m: &LoadedModel<CpuBackend>, count: usize) -> Vec<String> {
    let own_tokens = |text: &str| {
        let call = m.builder.tokenize_call(m.tokenizer.as_ref(), Some(INSTRUCTION), QUERY, &[text]).expect("tokenize");
        call.prompts[0].len() - call.prefix_len
    };
    (0..count)
        .map(|i| {
            let target = 40 + (i * 37) % 81; // 40..=120 tokens, spread
                                             // The longest text of at most `target` tokens: own_tokens grows with the word count.
            let (mut lo, mut hi) = (1usize, 200usize);
            while lo < hi {
                let mid = (lo + hi).div_ceil(2);
                if own_tokens(&item_text(i as u64 + 1, mid)) <= target {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            item_text(i as u64 + 1, lo)
        })
        .collect()
}

const QUERY: &str = "lightweight waterproof trail running shoes for women with good grip and cushioning, size 8";

fn prefill(m: &LoadedModel<CpuBackend>, backend: &CpuBackend) {
    let c = &m.model.config;
    let n = 512;
    let text = (0..200).map(|i| item_text(i, 12)).collect::<Vec<_>>().join(" ");
    let mut ids = m.tokenizer.encode_plain(&text).expect("tokenize");
    ids.truncate(n);
    let mut kv = backend.kv_cache(c.n_layers, n, c.n_kv_heads, c.head_dim).expect("kv");
    let slots: Vec<u32> = (0..n as u32).collect();
    let mut lb = LayoutBuilder::new();
    let last = lb.push(&ids, &slots).expect("rows");
    let layout = lb.finish();
    let mut scratch = Scratch::new(backend).expect("scratch");
    let mut run = |kv: &mut _| {
        let (t, c) = (Instant::now(), cpu_seconds());
        m.model.forward(backend, &layout, kv, &[last], None, &mut scratch).expect("forward");
        (t.elapsed().as_secs_f64(), cpu_seconds() - c)
    };
    run(&mut kv); // warm-up
    let times: Vec<(f64, f64)> = (0..3).map(|_| run(&mut kv)).collect();
    let best = times.iter().map(|t| t.0).fold(f64::INFINITY, f64::min);
    let best_cpu = times.iter().map(|t| t.1).fold(f64::INFINITY, f64::min);
    let mean = times.iter().map(|t| t.0).sum::<f64>() / times.len() as f64;
    println!(
        "prefill, one sequence of {n} tokens: {:.0} tokens/s (best of 3: {:.3} s, {:.2} CPU-s; mean {:.0} tokens/s)",
        n as f64 / best,
        best,
        best_cpu,
        n as f64 / mean
    );
}

fn start(m: LoadedModel<CpuBackend>, backend: CpuBackend, reuse: bool) -> Arc<EngineHandle> {
    start_with(m, backend, reuse, true)
}

fn start_with(m: LoadedModel<CpuBackend>, backend: CpuBackend, reuse: bool, item_sharing: bool) -> Arc<EngineHandle> {
    start_sharing(m, backend, reuse, item_sharing.then_some(WorkerConfig::default().engine.item_prefix_min_tokens))
}

/// An engine sharing items' leading runs of at least `min_tokens` (None: no item sharing).
fn start_sharing(
    m: LoadedModel<CpuBackend>,
    backend: CpuBackend,
    reuse: bool,
    min_tokens: Option<usize>,
) -> Arc<EngineHandle> {
    let mut cfg = WorkerConfig::default();
    cfg.engine.prefix_reuse = reuse;
    cfg.engine.item_prefix_sharing = min_tokens.is_some();
    if let Some(n) = min_tokens {
        cfg.engine.item_prefix_min_tokens = n;
    }
    let ecfg = engine_config(&cfg, &m.model.config).expect("engine config");
    let parts = EngineParts { backend, model: m.model, encoder: m.tokenizer, builder: m.builder };
    EngineHandle::start(parts, ecfg, Arc::new(EngineState::default())).expect("engine")
}

/// CPU seconds used by this process so far (all threads): robust to other processes competing
/// for the cores, where wall time is not.
fn cpu_seconds() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we own.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn call(e: &EngineHandle, query: &str, items: &[String]) -> (f64, sieve_shared::Usage, Vec<Option<f32>>) {
    let t = Instant::now();
    let rx = e
        .submit(Submission {
            query: query.into(),
            items: items.to_vec(),
            instruction: Some(INSTRUCTION.into()),
            arrived: t,
            deadline: None,
            cancel: CancellationToken::new(),
            span: tracing::Span::none(),
            truncate: None,
        })
        .expect("submit");
    let out = rx.blocking_recv().expect("reply").expect("scores");
    (t.elapsed().as_secs_f64(), out.usage, out.scores)
}

fn load(threads: usize) -> (LoadedModel<CpuBackend>, CpuBackend) {
    let path = assets::resolve_model("default").expect("default model");
    let backend = CpuBackend::new(threads).expect("backend");
    let m = loader::load(&backend, &path, &LoadOptions::default()).expect("load");
    (m, backend)
}

fn request_section() {
    let (m, backend) = load(0);
    let items = realistic_items(&m, 64);
    let off = start(m, backend, false);
    // Warm-up on another query.
    call(&off, "warm up", &items[..4]);

    let reps = 3;
    let mut rows = vec![];
    let (mut t_off, mut t_in, mut t_hit) = (f64::INFINITY, f64::INFINITY, f64::INFINITY);
    let (mut c_off, mut c_in, mut c_hit) = (f64::INFINITY, f64::INFINITY, f64::INFINITY);
    let (mut u_off, mut u_in, mut u_hit) = (Default::default(), Default::default(), Default::default());
    let timed = |e: &EngineHandle, q: &str| {
        let c0 = cpu_seconds();
        let (t, u, s) = call(e, q, &items);
        (t, cpu_seconds() - c0, u, s)
    };
    for r in 0..reps {
        let q = format!("{QUERY} (variant {r})");
        let (t, c, u, s_off) = timed(&off, &q);
        (t_off, c_off) = (t_off.min(t), c_off.min(c));
        u_off = u;
        // A fresh engine each rep: its prefix cache is cold, so the first call shares its prefix
        // only within the batch (a warm engine would already hold the system prompt's blocks);
        // the same call again is the cross-batch hit.
        let (m, backend) = load(0);
        let on = start(m, backend, true);
        let (t, c, u, s_in) = timed(&on, &q);
        (t_in, c_in) = (t_in.min(t), c_in.min(c));
        u_in = u;
        let (t, c, u, s_hit) = timed(&on, &q);
        (t_hit, c_hit) = (t_hit.min(t), c_hit.min(c));
        u_hit = u;
        assert_eq!(s_off, s_in, "reuse must not change scores");
        assert_eq!(s_in, s_hit, "a cache hit must not change scores");
        on.shutdown();
    }
    let u: &sieve_shared::Usage = &u_off;
    let own: u64 = u.item_tokens.iter().map(|&t| t as u64).sum();
    println!(
        "realistic call: 64 items of {}–{} own tokens (mean {:.0}), prefix {} tokens, {} prompt tokens",
        u.item_tokens.iter().min().unwrap_or(&0),
        u.item_tokens.iter().max().unwrap_or(&0),
        own as f64 / 64.0,
        u.prefix_tokens,
        u.prompt_tokens
    );
    println!("  (best of {reps}; CPU-s is the process's CPU time for the call, all threads)");
    for (name, t, c, u) in [
        ("reuse off", t_off, c_off, &u_off),
        ("in-batch reuse", t_in, c_in, &u_in),
        ("cross-batch hit", t_hit, c_hit, &u_hit),
    ] {
        rows.push((name, t, c, u.computed_tokens));
        println!(
            "  {name:<16} {:7.3} s ({:6.2} CPU-s)  {:6.1} pairs/s  {:6.0} computed tokens/s  {:6.0} prompt tokens/s  ({} tokens computed)",
            t,
            c,
            64.0 / t,
            u.computed_tokens as f64 / t,
            u.prompt_tokens as f64 / t,
            u.computed_tokens
        );
    }
    let base = rows[0].3 as f64;
    for (name, t, c, computed) in &rows[1..] {
        let saved = 1.0 - *computed as f64 / base;
        let time_saved = 1.0 - t / t_off;
        let cpu_saved = 1.0 - c / c_off;
        println!(
            "  {name}: prefill tokens saved {:.1}%; wall time saved {:.1}% ({:.0}% of the token saving), CPU time saved {:.1}% ({:.0}%); speed-up {:.2}x",
            saved * 100.0,
            time_saved * 100.0,
            time_saved / saved.max(1e-9) * 100.0,
            cpu_saved * 100.0,
            cpu_saved / saved.max(1e-9) * 100.0,
            t_off / t
        );
    }
    off.shutdown();
}

fn pipeline_section() {
    let (m, backend) = load(0);
    let items = realistic_items(&m, 64);
    let e = start(m, backend, true);
    call(&e, "warm up", &items[..4]);
    let before = e.state.pipeline();
    // 12 calls of 16 items queued at once: one batch each, prepared while the previous runs.
    let t = Instant::now();
    let rxs: Vec<_> = (0..12)
        .map(|i| {
            e.submit(Submission {
                query: format!("{QUERY} #{i}"),
                items: items[(i * 4) % 48..(i * 4) % 48 + 16].to_vec(),
                instruction: Some(INSTRUCTION.into()),
                arrived: Instant::now(),
                deadline: None,
                cancel: CancellationToken::new(),
                span: tracing::Span::none(),
                truncate: None,
            })
            .expect("submit")
        })
        .collect();
    for rx in rxs {
        rx.blocking_recv().expect("reply").expect("scores");
    }
    let wall = t.elapsed().as_secs_f64();
    let after = e.state.pipeline();
    let busy = after.runner_busy_seconds - before.runner_busy_seconds;
    let idle_work = after.runner_idle_with_work_seconds - before.runner_idle_with_work_seconds;
    println!(
        "pipeline: 12 queued calls x 16 items in {:.2} s over {} batches; runner busy {:.3} s, idle while work was queued {:.4} s ({:.3}% idle)",
        wall,
        after.batches - before.batches,
        busy,
        idle_work,
        idle_work / (busy + idle_work) * 100.0
    );
    e.shutdown();
}

/// `count` catalogue items in groups of `group`: each group's items open with the same header
/// (category path, brand block, spec header) and end with their own words.
fn catalogue_items(count: usize, group: usize, header_words: usize, own_words: usize) -> Vec<String> {
    (0..count)
        .map(|i| {
            let g = (i / group) as u64;
            let header = item_text(1000 + g, header_words);
            format!("Category: {} > {}. {header}. Variant: {}", g % 7, g % 3, item_text(i as u64 + 1, own_words))
        })
        .collect()
}

/// Item prefix sharing on and off on the same calls, alternating, best of `reps`.
fn sharing_case(name: &str, items: &[String], reps: usize) {
    let (m, backend) = load(0);
    let on = start_with(m, backend, true, true);
    let (m, backend) = load(0);
    let off = start_with(m, backend, true, false);
    call(&on, "warm up", &items[..4]);
    call(&off, "warm up", &items[..4]);
    let mut best = [(f64::INFINITY, f64::INFINITY); 2];
    let mut usage: [sieve_shared::Usage; 2] = Default::default();
    for r in 0..reps {
        // A new query each rep: the prefix and the runs are computed, not found in the cache.
        let q = format!("{QUERY} (rep {r})");
        let mut scores = vec![];
        for (k, e) in [&on, &off].into_iter().enumerate() {
            let c0 = cpu_seconds();
            let (t, u, s) = call(e, &q, items);
            best[k] = (best[k].0.min(t), best[k].1.min(cpu_seconds() - c0));
            usage[k] = u;
            scores.push(s);
        }
        assert_eq!(scores[0], scores[1], "item sharing must not change scores");
    }
    let n = items.len() as f64;
    let own: u64 = usage[1].item_tokens.iter().map(|&t| u64::from(t)).sum();
    println!(
        "{name}: {} items, {:.0} own tokens each on average, prefix {} tokens; best of {reps}, interleaved",
        items.len(),
        own as f64 / n,
        usage[1].prefix_tokens
    );
    for (k, label) in ["sharing on", "sharing off"].iter().enumerate() {
        println!(
            "  {label:<12} {:7.3} s ({:6.2} CPU-s)  {:6.1} pairs/s  {:7} tokens computed  {:6} item tokens shared",
            best[k].0,
            best[k].1,
            n / best[k].0,
            usage[k].computed_tokens,
            usage[k].item_shared_tokens
        );
    }
    println!(
        "  computed tokens {:+.1}%, pairs/s {:+.1}% (wall), {:+.1}% (CPU time)",
        (usage[0].computed_tokens as f64 / usage[1].computed_tokens as f64 - 1.0) * 100.0,
        (best[1].0 / best[0].0 - 1.0) * 100.0,
        (best[1].1 / best[0].1 - 1.0) * 100.0
    );
    on.shutdown();
    off.shutdown();
}

fn catalogue_section() {
    // Headers of 12 words (~40% of an item's tokens), 18 words of its own.
    sharing_case("catalogue call", &catalogue_items(200, 8, 12, 18), 3);
    let (m, _) = load(1);
    let items = realistic_items(&m, 64);
    drop(m);
    sharing_case("realistic call (no shared headers)", &items, 3);
}

/// The shortest shared run (`[engine] item_prefix_min_tokens`) swept on the catalogue call: one
/// engine per threshold and one without sharing, the same calls interleaved across them.
fn threshold_section() {
    let items = catalogue_items(200, 8, 12, 18);
    let thresholds: Vec<Option<usize>> = std::env::var("SIEVE_BENCH_MIN_TOKENS")
        .unwrap_or_else(|_| "4,8,16,32".into())
        .split(',')
        .filter_map(|t| t.trim().parse().ok())
        .map(Some)
        .chain([None])
        .collect();
    let engines: Vec<Arc<EngineHandle>> = thresholds
        .iter()
        .map(|&t| {
            let (m, backend) = load(0);
            let e = start_sharing(m, backend, true, t);
            call(&e, "warm up", &items[..4]);
            e
        })
        .collect();
    let reps = 2;
    let mut best = vec![(f64::INFINITY, f64::INFINITY); engines.len()];
    let mut usage: Vec<sieve_shared::Usage> = vec![Default::default(); engines.len()];
    for r in 0..reps {
        let q = format!("{QUERY} (threshold rep {r})");
        let mut scores = vec![];
        // Each rep in another order, so no variant always runs first or last.
        let order: Vec<usize> = (0..engines.len()).map(|i| (i + r) % engines.len()).collect();
        for &k in &order {
            let c0 = cpu_seconds();
            let (t, u, s) = call(&engines[k], &q, &items);
            best[k] = (best[k].0.min(t), best[k].1.min(cpu_seconds() - c0));
            usage[k] = u;
            scores.push(s);
        }
        assert!(scores.windows(2).all(|w| w[0] == w[1]), "the threshold must not change scores");
    }
    let off = engines.len() - 1;
    println!("threshold sweep, catalogue call: {} items, best of {reps}, interleaved", items.len());
    for (k, t) in thresholds.iter().enumerate() {
        let label = t.map_or("off".to_string(), |t| format!("min {t}"));
        println!(
            "  {label:<8} {:7.3} s ({:6.2} CPU-s)  {:7} tokens computed  {:6} item tokens shared  CPU time {:+.1}% vs off",
            best[k].0,
            best[k].1,
            usage[k].computed_tokens,
            usage[k].item_shared_tokens,
            (best[k].1 / best[off].1 - 1.0) * 100.0
        );
    }
    for e in engines {
        e.shutdown();
    }
}

fn main() {
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let want = |s: &str| filter.is_empty() || filter.iter().any(|f| s.contains(f.as_str()));
    println!("threads: {}", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    if want("prefill") {
        let (m, backend) = load(0);
        prefill(&m, &backend);
    }
    if want("request") {
        request_section();
    }
    if want("pipeline") {
        pipeline_section();
    }
    if want("catalogue") {
        catalogue_section();
    }
    // Only when named: it loads one engine per threshold.
    if filter.iter().any(|f| f == "threshold") {
        threshold_section();
    }
}
