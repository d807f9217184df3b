//! `sieve-loadtest`: load tests for Sieve. Subcommands: `run` (load against any deployment),
//! `sim-worker` (a simulated worker), `calibrate` (fit a sim cost model to a real worker),
//! `compare` (the strategy comparison on a simulated cluster), `plan` (cache sizes and workers
//! for a request trace).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use sieve_loadtest::arrivals::{Burst, RateProfile};
use sieve_loadtest::calibrate::{self, CalibrateSpec};
use sieve_loadtest::client::Http;
use sieve_loadtest::compare::{self, CompareSpec};
use sieve_loadtest::dist::Dist;
use sieve_loadtest::monitor::{self, Monitor};
use sieve_loadtest::plan::capacity::CapacitySpec;
use sieve_loadtest::plan::{self, PlanSpec};
use sieve_loadtest::report::{self, RunData, RunInfo};
use sieve_loadtest::run::{self, LoadMode, RunSpec, TraceSource};
use sieve_loadtest::sim::{SimConfig, SimFileConfig, SimWorker, Slowdown, Stall};
use sieve_loadtest::trace;
use sieve_loadtest::trace::synth::Replay;
use sieve_loadtest::workload::WorkloadSpec;
use sieve_shared::grpc_config::GrpcConfig;
use sieve_shared::CostModel;

#[derive(Parser)]
#[command(name = "sieve-loadtest", version, about = "Sieve load tests and simulated workers")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Drive load at a proxy or worker: open loop (Poisson) or closed loop; JSON report and plots.
    Run(RunArgs),
    /// Serve the worker API and admin endpoints with compute times from a cost model.
    SimWorker(SimWorkerArgs),
    /// Measure a real worker over a sweep of batch shapes and write the cost model sim-workers load.
    Calibrate(CalibrateArgs),
    /// Simulated cluster + one proxy per strategy: the same seeded load at several fractions of
    /// capacity, then fault scenarios; tables, plots, JSON.
    Compare(CompareArgs),
    /// From a proxy request trace ([request_trace]): pair-cache hit rate against its size,
    /// prefix-cache hit rate against worker cache blocks, and (--p99-ms) the workers needed for
    /// a p99 target on sim-workers; tables, plots, JSON.
    Plan(PlanArgs),
}

/// What the requests look like (a workload file, then flags over it).
#[derive(Args, Clone)]
struct WorkloadArgs {
    /// Workload file (TOML or JSON): items, item_tokens, query_tokens, reuse, reuse_pool,
    /// deadline_ms, instruction. Flags below override it.
    #[arg(long)]
    workload: Option<PathBuf>,
    /// Items per query: N | uniform:MIN,MAX | lognormal:MEDIAN,SIGMA[,MIN,MAX] | pareto:SCALE,ALPHA[,MAX].
    /// Default lognormal:200,0.3,20,1000.
    #[arg(long)]
    items: Option<Dist>,
    /// Tokens per item text (same forms). Default pareto:40,1.2,300 (40-300, heavy tail).
    #[arg(long)]
    item_tokens: Option<Dist>,
    /// Tokens per query (same forms). Default uniform:2,8.
    #[arg(long)]
    query_tokens: Option<Dist>,
    /// Fraction of requests repeating an earlier one (same query and items). Default 0.2.
    #[arg(long)]
    reuse: Option<f64>,
    /// deadline_ms sent with every request. Default 500.
    #[arg(long)]
    deadline_ms: Option<u64>,
    /// Send no deadline (the server's default budget applies).
    #[arg(long, conflicts_with = "deadline_ms")]
    no_deadline: bool,
    /// Instruction sent with every request.
    #[arg(long)]
    instruction: Option<String>,
}

impl WorkloadArgs {
    fn spec(&self) -> anyhow::Result<WorkloadSpec> {
        let mut w = match &self.workload {
            Some(p) => WorkloadSpec::parse(&read(p)?).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?,
            None => WorkloadSpec::default(),
        };
        if let Some(d) = self.items {
            w.items = d;
        }
        if let Some(d) = self.item_tokens {
            w.item_tokens = d;
        }
        if let Some(d) = self.query_tokens {
            w.query_tokens = d;
        }
        if let Some(r) = self.reuse {
            w.reuse = r;
        }
        if let Some(d) = self.deadline_ms {
            w.deadline_ms = Some(d);
        }
        if self.no_deadline {
            w.deadline_ms = None;
        }
        if let Some(i) = &self.instruction {
            w.instruction = Some(i.clone());
        }
        w.validate().map_err(|e| anyhow::anyhow!("workload: {e}"))?;
        Ok(w)
    }
}

fn read(p: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))
}

#[derive(Args)]
struct RunArgs {
    /// Base URL of a proxy or worker (requests go to URL/v1/score).
    #[arg(long)]
    target: String,
    /// Open loop: Poisson arrivals at this many requests per second.
    #[arg(long, conflicts_with = "concurrency")]
    qps: Option<f64>,
    /// Closed loop: this many clients, each sending its next request when answered.
    #[arg(long)]
    concurrency: Option<usize>,
    /// Replay a proxy request trace (JSON lines of [request_trace]; repeatable for rotated
    /// files): its requests at its arrival times, texts made from its hashes and token counts,
    /// its instructions and deadlines (--deadline-ms / --no-deadline override them).
    #[arg(long, conflicts_with_all = ["qps", "concurrency"])]
    trace: Vec<PathBuf>,
    /// Trace replay speed: arrival times are divided by it (2: twice as fast).
    #[arg(long, default_value_t = 1.0)]
    speed: f64,
    /// Open loop: rate multiplied by FACTOR from START_S for DURATION_S (FACTOR@START_S+DURATION_S). Repeatable.
    #[arg(long)]
    burst: Vec<Burst>,
    /// Seconds of sending.
    #[arg(long, default_value_t = 30.0)]
    duration: f64,
    /// Stop after this many requests.
    #[arg(long)]
    requests: Option<u64>,
    /// Seconds at the start not counted in the summary.
    #[arg(long, default_value_t = 0.0)]
    warmup: f64,
    #[command(flatten)]
    workload: WorkloadArgs,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Client timeout per request, ms (default: deadline + 10 s).
    #[arg(long)]
    timeout_ms: Option<u64>,
    /// Check every score against the simulated workers' deterministic scores (sim clusters only).
    #[arg(long)]
    verify_sim_scores: bool,
    /// A worker admin URL to poll for utilisation. Repeatable.
    #[arg(long = "worker-admin")]
    worker_admin: Vec<String>,
    /// A proxy admin URL: its workers' admin URLs are polled for utilisation.
    #[arg(long)]
    proxy_admin: Option<String>,
    /// Report folder (report.json, latency_cdf, latency_over_time, worker_utilisation .svg/.png).
    #[arg(long, default_value = "loadtest-report")]
    out: PathBuf,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

#[derive(Args)]
struct CalibrateArgs {
    /// Base URL of the worker's API.
    #[arg(long)]
    worker: String,
    /// The worker's admin URL (batch limits, model and device for the file header).
    #[arg(long)]
    admin: Option<String>,
    /// Cost-model file to write (TOML, for `sim-worker --cost-model` and the proxy's [cost]).
    #[arg(long, default_value = "cost-model.toml")]
    out: PathBuf,
    /// Query lengths of the sweep, in words.
    #[arg(long, value_delimiter = ',', default_value = "4,64,256")]
    query_words: Vec<u32>,
    /// Items per call of the sweep.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    items: Vec<u32>,
    /// Item lengths of the sweep, in words.
    #[arg(long, value_delimiter = ',', default_value = "16,64,256")]
    item_words: Vec<u32>,
    /// Calls per shape.
    #[arg(long, default_value_t = 2)]
    repeats: u32,
}

#[derive(Args)]
struct CompareArgs {
    /// Simulated workers.
    #[arg(long, default_value_t = 16)]
    workers: usize,
    /// Batch slots per worker (calls computed at once).
    #[arg(long, default_value_t = 1)]
    slots: usize,
    /// Prefix-cache capacity of every simulated worker, in 16-token blocks (0: none).
    #[arg(long, default_value_t = 0)]
    prefix_cache_blocks: usize,
    /// Cost model of the simulated workers (default: the built-in GPU-like one).
    #[arg(long)]
    cost_model: Option<PathBuf>,
    /// Speed of every worker: below 1 stretches time, so a machine with few cores keeps up
    /// (its own CPU time per request stays small beside the simulated compute). The default
    /// deadline is stretched the same way.
    #[arg(long, default_value_t = 0.25)]
    speed: f64,
    /// Log-normal noise on compute time (sigma of ln time).
    #[arg(long, default_value_t = 0.1)]
    jitter: f64,
    /// Offered loads, percent of capacity.
    #[arg(long, value_delimiter = ',', default_value = "30,50,70,90")]
    loads: Vec<f64>,
    /// Seconds per load run.
    #[arg(long, default_value_t = 30.0)]
    duration: f64,
    /// Seconds of unmeasured load per proxy before the first run.
    #[arg(long, default_value_t = 3.0)]
    warmup: f64,
    /// all (1-6), or a comma-separated list of 1-8 / whole-random, fixed-random, fixed-least, ours,
    /// ours-hedge, whole-least, ours-cache (7, only when named: ours with the pair-score cache),
    /// ours-affinity (8, only when named: ours with cache-aware routing).
    #[arg(long, default_value = "all")]
    strategies: String,
    /// all, none, or a comma-separated list of slow, kill, burst, stall.
    #[arg(long, default_value = "all")]
    scenarios: String,
    /// Load of the fault scenarios, percent of capacity. 50 by default: the split strategies
    /// pay a per-shard overhead, so at 70% of (whole-request) capacity they are already ~95%
    /// busy and their p99 is queueing, whatever the fault.
    #[arg(long, default_value_t = 50.0)]
    fault_load: f64,
    /// Seconds per fault run.
    #[arg(long, default_value_t = 30.0)]
    fault_duration: f64,
    /// Items per shard of the fixed split (default: mean items per request / workers).
    #[arg(long)]
    fixed_items: Option<usize>,
    /// Ours with the load-aware split (`[split] load_aware`, the proxy's default);
    /// `--load-aware false`: makespan only.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    load_aware: bool,
    #[command(flatten)]
    workload: WorkloadArgs,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Results folder.
    #[arg(long, default_value = "loadtest-compare")]
    out: PathBuf,
    /// The sieve-proxy binary (default: next to this one).
    #[arg(long)]
    proxy_bin: Option<PathBuf>,
    /// No progress bars.
    #[arg(long)]
    quiet: bool,
}

#[derive(Args)]
struct PlanArgs {
    /// The proxy's request trace (repeatable: rotated files, in any order).
    #[arg(long, required = true)]
    trace: Vec<PathBuf>,
    /// Pair-cache sizes of the hit-rate curve, MiB ([cache] max_bytes).
    #[arg(long, value_delimiter = ',', default_value = "0.25,0.5,1,2,4,8,16,32,64")]
    cache_mib: Vec<f64>,
    /// The pair cache's TTL, ms ([cache] ttl_ms).
    #[arg(long, default_value_t = 600_000)]
    ttl_ms: u64,
    /// Prefix-cache blocks per worker of the hit-rate curve (16 tokens each).
    #[arg(long, value_delimiter = ',', default_value = "2,4,8,16,64,256,1024")]
    prefix_blocks: Vec<usize>,
    /// Workers of the prefix-cache model (default: the worker count found, else 4).
    #[arg(long)]
    prefix_workers: Option<usize>,
    /// Find the fewest sim-workers whose p99 (ms of trace time) is at most this when the trace
    /// is replayed against them.
    #[arg(long)]
    p99_ms: Option<f64>,
    /// Fewest complete answers (fraction of requests) for a cluster size to meet the target.
    #[arg(long, default_value_t = 0.99)]
    min_complete: f64,
    /// First cluster size of the search (default: the workers the traced work keeps busy).
    #[arg(long)]
    workers: Option<usize>,
    /// Largest cluster size tried.
    #[arg(long, default_value_t = 32)]
    max_workers: usize,
    /// Seconds of the trace replayed per cluster size (from its start).
    #[arg(long, default_value_t = 30.0)]
    duration: f64,
    /// Seconds of untraced load before each size's run.
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Speed of the sim-workers; the trace is replayed at the same speed (below 1 stretches
    /// time, so a machine with few cores keeps up); latencies are reported on the trace's clock.
    #[arg(long, default_value_t = 0.25)]
    speed: f64,
    /// Batch slots per sim-worker.
    #[arg(long, default_value_t = 1)]
    slots: usize,
    /// Log-normal noise on compute time.
    #[arg(long, default_value_t = 0.1)]
    jitter: f64,
    /// Cost model of the sim-workers (default: the built-in GPU-like one).
    #[arg(long)]
    cost_model: Option<PathBuf>,
    /// The proxies of the search run without the pair-score cache.
    #[arg(long)]
    no_cache: bool,
    /// Check the pair-cache prediction: replay the trace against a real proxy with a cache of
    /// each of these sizes (MiB) on sim-workers (--prefix-workers of them, else the count found,
    /// else 4) and print predicted against measured hit rates.
    #[arg(long, value_delimiter = ',')]
    measure_cache_mib: Vec<f64>,
    /// The sieve-proxy binary (default: next to this one).
    #[arg(long)]
    proxy_bin: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Results folder (plan.json, pair_cache and prefix_cache .svg/.png).
    #[arg(long, default_value = "loadtest-plan")]
    out: PathBuf,
    /// No progress bars.
    #[arg(long)]
    quiet: bool,
}

#[derive(Args)]
struct SimWorkerArgs {
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// API port; 0 picks a free port.
    #[arg(long, default_value_t = 8081)]
    port: u16,
    /// Admin port; 0 picks a free port.
    #[arg(long, default_value_t = 9081)]
    admin_port: u16,
    /// gRPC API port (0 picks a free port); default the config file's `[grpc] port`, off when unset.
    #[arg(long)]
    grpc_port: Option<u16>,
    /// Cost model file (TOML or JSON: request_ms, token_ms, token_context_ms).
    #[arg(long)]
    cost_model: Option<PathBuf>,
    /// Throughput multiplier (2 = twice as fast).
    #[arg(long, default_value_t = 1.0)]
    speed: f64,
    /// Calls computed at once; more wait in a FIFO queue.
    #[arg(long, default_value_t = 1)]
    slots: usize,
    /// Log-normal noise on compute time (sigma of ln time).
    #[arg(long, default_value_t = 0.0)]
    jitter: f64,
    /// Fraction of calls failing with 500 part-way through compute.
    #[arg(long, default_value_t = 0.0)]
    fail_rate: f64,
    /// Slow down by FACTOR from START_S for DURATION_S: FACTOR[@START_S[+DURATION_S]]. Repeatable.
    #[arg(long)]
    slowdown: Vec<Slowdown>,
    /// Fraction of calls held up by a stall (GC pause, throttling, noisy neighbour).
    #[arg(long, default_value_t = 0.0)]
    stall_rate: f64,
    /// Shortest stall, ms of simulated time (the Pareto's scale).
    #[arg(long, default_value_t = 50.0)]
    stall_ms: f64,
    /// Pareto shape of stall lengths: smaller is heavier-tailed.
    #[arg(long, default_value_t = 1.5)]
    stall_alpha: f64,
    /// Longest stall, ms of simulated time.
    #[arg(long, default_value_t = 2000.0)]
    stall_max_ms: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Calls waiting for a slot beyond which new calls get 429 (0: unbounded).
    #[arg(long, default_value_t = 0)]
    max_queue: usize,
    #[arg(long, default_value_t = 32_768)]
    max_batch_tokens: u64,
    #[arg(long, default_value_t = 8192)]
    max_seq_tokens: u64,
    /// Ms of simulated time each call spends before it queues for a slot (a real worker's
    /// tokenizing), counted in queue_ms, not compute_ms: the proxy's cost model never sees it.
    #[arg(long, default_value_t = 0.0)]
    prepare_ms: f64,
    /// The same, per item of the call.
    #[arg(long, default_value_t = 0.0)]
    prepare_ms_per_item: f64,
    /// Prefix-cache capacity in 16-token blocks (LRU): a held prefix is not computed again and
    /// is reported in `cached_prefix_tokens`; 0: no prefix cache.
    #[arg(long, default_value_t = 0)]
    prefix_cache_blocks: usize,
    /// Model name reported in responses.
    #[arg(long, default_value = "sim")]
    model: String,
    /// Template identity reported in responses and `/stats` (the proxy's pair cache keys on it).
    #[arg(long, default_value = "sim-template-v1")]
    template: String,
    /// Address of the admin port (default 127.0.0.1, whatever --host says).
    #[arg(long, default_value = "127.0.0.1")]
    admin_host: String,
    /// SIGTERM: finish running calls and close every connection within this many ms.
    #[arg(long, default_value_t = 30_000)]
    drain_timeout_ms: u64,
    /// A TOML file with `[http]`, `[grpc]`, `[admin]`, `[tracing]` and `[log]` sections (the
    /// worker's keys and defaults).
    #[arg(long)]
    config: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The sim-worker's config file may ask for JSON logs and span export; it is read first.
    let mut sim_file = None;
    let _trace = match &cli.command {
        Command::SimWorker(a) => {
            let started = sim_file_config(a.config.as_deref()).and_then(|f| {
                let guard = sieve_server::cli::init_tracing_with("info", "sieve-sim-worker", &f.log, &f.tracing)
                    .map_err(|e| anyhow::anyhow!(e))?;
                sim_file = Some(f);
                Ok(guard)
            });
            match started {
                Ok(g) => Some(g),
                Err(e) => {
                    eprintln!("sieve-loadtest: {e:#}");
                    return ExitCode::from(2);
                }
            }
        }
        _ => {
            sieve_server::cli::init_tracing("info");
            None
        }
    };
    let rt = match sieve_server::cli::runtime("sieve-loadtest") {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let result = match cli.command {
        Command::Run(args) => rt.block_on(run_load(args)),
        Command::SimWorker(args) => rt.block_on(sim_worker(args, sim_file.take().unwrap_or_default())),
        Command::Calibrate(args) => rt.block_on(calibrate_worker(args)),
        // On this thread: the proxies it starts die with the thread that started them.
        Command::Compare(args) => rt.block_on(compare_strategies(args)),
        // On this thread too: the proxies of the capacity search.
        Command::Plan(args) => rt.block_on(plan_trace(args)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sieve-loadtest: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The longest a load test sends for (and its warm-up): a week.
const MAX_SECS: f64 = 7.0 * 24.0 * 3600.0;
/// The highest open-loop rate and the most closed-loop clients one generator process drives.
const MAX_QPS: f64 = 1e6;
const MAX_CONCURRENCY: usize = 100_000;

fn secs(v: f64, name: &str) -> anyhow::Result<Duration> {
    if !(v.is_finite() && (0.0..=MAX_SECS).contains(&v)) {
        anyhow::bail!("--{name} must be a number of seconds in 0..={MAX_SECS} (a week), got {v}");
    }
    Ok(Duration::from_secs_f64(v))
}

async fn run_load(a: RunArgs) -> anyhow::Result<()> {
    let workload = a.workload.spec()?;
    let mut trace = None;
    let mode = match (a.qps, a.concurrency) {
        _ if !a.trace.is_empty() => {
            if !(a.speed.is_finite() && a.speed > 0.0) {
                anyhow::bail!("--speed must be positive, got {}", a.speed);
            }
            if !a.burst.is_empty() {
                anyhow::bail!("--burst needs open loop (--qps), not a trace");
            }
            let records = trace::read(&a.trace).map_err(|e| anyhow::anyhow!("{e}"))?;
            let mut replay = Replay::new(records);
            // A deadline flag replaces the traced deadlines.
            if a.workload.deadline_ms.is_some() || a.workload.no_deadline {
                replay.set_deadlines(workload.deadline_ms);
            }
            trace = Some(TraceSource { replay: Arc::new(replay), speed: a.speed, deadline_scale: 1.0 });
            let file = a.trace.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(",");
            LoadMode::Trace { file, speed: a.speed }
        }
        (Some(q), _) if q > 0.0 && q <= MAX_QPS => {
            LoadMode::Open { profile: RateProfile { base_qps: q, bursts: a.burst.clone() } }
        }
        (Some(q), _) => anyhow::bail!("--qps must be in (0, {MAX_QPS}], got {q}"),
        (None, Some(c)) if (1..=MAX_CONCURRENCY).contains(&c) => {
            if !a.burst.is_empty() {
                anyhow::bail!("--burst needs open loop (--qps)");
            }
            LoadMode::Closed { concurrency: c }
        }
        (None, Some(c)) => anyhow::bail!("--concurrency must be in 1..={MAX_CONCURRENCY}, got {c}"),
        (None, None) => anyhow::bail!("give --qps (open loop) or --concurrency (closed loop)"),
    };
    let duration = secs(a.duration, "duration")?;
    let warmup = secs(a.warmup, "warmup")?;
    let http = Http::new();
    let mut admins = a.worker_admin.clone();
    if let Some(p) = &a.proxy_admin {
        admins.extend(monitor::workers_of_proxy(&http, p).await.map_err(|e| anyhow::anyhow!("{e}"))?);
    }
    let spec = RunSpec {
        target: a.target.trim_end_matches('/').to_string(),
        mode: mode.clone(),
        duration,
        max_requests: a.requests,
        timeout: Duration::from_millis(a.timeout_ms.unwrap_or(workload.deadline_ms.unwrap_or(30_000) + 10_000)),
        workload: workload.clone(),
        seed: a.seed,
        verify_sim_scores: a.verify_sim_scores,
        progress: !a.quiet,
        label: "run".into(),
        trace,
    };
    let mon = (!admins.is_empty()).then(|| Monitor::start(http.clone(), admins.clone(), Duration::from_millis(500)));
    let out = run::run(&http, &spec).await;
    let util = mon.map(Monitor::stop);
    let marks = match &mode {
        LoadMode::Open { profile } => profile
            .bursts
            .iter()
            .map(|b| (b.start_s, b.start_s + b.duration_s, format!("x{} burst", b.factor)))
            .collect(),
        LoadMode::Closed { .. } | LoadMode::Trace { .. } => Vec::new(),
    };
    let (rep, hist) = RunData {
        info: RunInfo {
            label: a.target.clone(),
            target: spec.target.clone(),
            load: mode,
            duration_s: duration.as_secs_f64(),
            max_requests: a.requests,
            warmup_s: warmup.as_secs_f64(),
            seed: a.seed,
            workload,
            utilisation: util,
            marks,
        },
        records: &out.records,
        send_window_s: out.send_window_s,
    }
    .report();
    report::print_summary(&rep);
    let files = report::write(&a.out, &rep, &hist).map_err(|e| anyhow::anyhow!("{e}"))?;
    println!("  report: {}", files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", "));
    Ok(())
}

async fn calibrate_worker(a: CalibrateArgs) -> anyhow::Result<()> {
    let spec = CalibrateSpec {
        query_words: a.query_words,
        items_per_call: a.items,
        item_words: a.item_words,
        repeats: a.repeats.max(1),
        ..CalibrateSpec::default()
    };
    let http = Http::new();
    let c = calibrate::calibrate(&http, &a.worker, a.admin.as_deref(), &spec, |i, n| {
        eprint!("\r  call {i}/{n}");
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    eprintln!();
    println!(
        "  {:>7} {:>6} {:>6} {:>12} {:>12} {:>7}",
        "prefix", "cached", "items", "item tokens", "compute ms", "model"
    );
    for s in &c.samples {
        println!(
            "  {:>7} {:>6} {:>6} {:>12} {:>12.2} {:>7.2}",
            s.prefix_tokens, s.cached_prefix_tokens, s.items, s.item_tokens, s.compute_ms, s.predicted_ms
        );
    }
    let text = c.to_toml();
    std::fs::write(&a.out, &text).map_err(|e| anyhow::anyhow!("{}: {e}", a.out.display()))?;
    print!("{text}");
    println!("written to {}", a.out.display());
    Ok(())
}

async fn compare_strategies(a: CompareArgs) -> anyhow::Result<()> {
    let cost = match &a.cost_model {
        Some(p) => CostModel::parse(&read(p)?).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?,
        None => CostModel::default(),
    };
    let proxy_bin = match a.proxy_bin {
        Some(p) => p,
        None => sieve_loadtest::process::locate_binary("sieve-proxy")
            .ok_or_else(|| anyhow::anyhow!("sieve-proxy not found next to sieve-loadtest: build it (cargo build -p sieve-proxy) or pass --proxy-bin"))?,
    };
    let sim = SimConfig {
        cost,
        slots: a.slots,
        speed: a.speed,
        jitter: a.jitter,
        seed: a.seed,
        prefix_cache_blocks: a.prefix_cache_blocks,
        ..SimConfig::default()
    };
    sim.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    for &l in &a.loads {
        if !(l.is_finite() && l > 0.0) {
            anyhow::bail!("--loads must be positive percentages, got {l}");
        }
    }
    let spec = CompareSpec {
        workers: a.workers,
        sim,
        loads: a.loads,
        duration: secs(a.duration, "duration")?,
        proxy_warmup: secs(a.warmup, "warmup")?,
        strategies: compare::parse_strategies(&a.strategies).map_err(|e| anyhow::anyhow!("{e}"))?,
        scenarios: compare::parse_scenarios(&a.scenarios).map_err(|e| anyhow::anyhow!("{e}"))?,
        fault_load: a.fault_load,
        fault_duration: secs(a.fault_duration, "fault-duration")?,
        load_aware: a.load_aware,
        workload: {
            let mut w = a.workload.spec()?;
            if a.workload.deadline_ms.is_none() && !a.workload.no_deadline && a.workload.workload.is_none() {
                // The default budget is for real-speed workers: simulated time is stretched.
                w.deadline_ms = w.deadline_ms.map(|d| (d as f64 / a.speed).round() as u64);
            }
            w
        },
        fixed_items: a.fixed_items,
        seed: a.seed,
        out: a.out,
        proxy_bin,
        progress: !a.quiet,
    };
    compare::compare(&spec).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

async fn plan_trace(a: PlanArgs) -> anyhow::Result<()> {
    let mut cache_sizes = Vec::new();
    for &m in &a.cache_mib {
        if !(m.is_finite() && m >= 0.0) {
            anyhow::bail!("--cache-mib must be non-negative sizes, got {m}");
        }
        cache_sizes.push((m * f64::from(1 << 20)).round() as u64);
    }
    if let Some(p) = a.p99_ms.filter(|p| !(p.is_finite() && *p > 0.0)) {
        anyhow::bail!("--p99-ms must be a positive number of ms, got {p}");
    }
    if !(0.0..=1.0).contains(&a.min_complete) {
        anyhow::bail!("--min-complete must be in [0, 1], got {}", a.min_complete);
    }
    let mut measure_sizes = Vec::new();
    for &m in &a.measure_cache_mib {
        if !(m.is_finite() && m >= 0.0) {
            anyhow::bail!("--measure-cache-mib must be non-negative sizes, got {m}");
        }
        measure_sizes.push((m * f64::from(1 << 20)).round() as u64);
    }
    // The sim cluster both the search and the measurement run on.
    let env = if a.p99_ms.is_some() || !measure_sizes.is_empty() {
        let cost = match &a.cost_model {
            Some(p) => CostModel::parse(&read(p)?).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?,
            None => CostModel::default(),
        };
        let sim =
            SimConfig { cost, slots: a.slots, speed: a.speed, jitter: a.jitter, seed: a.seed, ..SimConfig::default() };
        sim.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        let proxy_bin = match &a.proxy_bin {
            Some(p) => p.clone(),
            None => sieve_loadtest::process::locate_binary("sieve-proxy").ok_or_else(|| {
                anyhow::anyhow!("sieve-proxy not found next to sieve-loadtest: build it (cargo build -p sieve-proxy) or pass --proxy-bin")
            })?,
        };
        Some(CapacitySpec {
            p99_ms: a.p99_ms.unwrap_or(f64::INFINITY),
            min_complete: a.min_complete,
            sim,
            start: a.workers,
            max_workers: a.max_workers,
            duration: secs(a.duration, "duration")?,
            warmup: secs(a.warmup, "warmup")?,
            cache: !a.no_cache,
            proxy_bin,
            out: a.out.join("proxy-configs"),
            progress: !a.quiet,
            seed: a.seed,
        })
    } else {
        None
    };
    let capacity = env.clone().filter(|_| a.p99_ms.is_some());
    let measure = env.filter(|_| !measure_sizes.is_empty()).map(|e| (e, measure_sizes));
    let spec = PlanSpec {
        traces: a.trace,
        cache_sizes,
        ttl_ms: a.ttl_ms,
        prefix_blocks: a.prefix_blocks,
        prefix_workers: a.prefix_workers,
        capacity,
        measure,
        out: a.out,
        seed: a.seed,
    };
    plan::plan(&spec).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

/// The sim-worker's `--config` file, or the defaults without one.
fn sim_file_config(path: Option<&Path>) -> anyhow::Result<SimFileConfig> {
    match path {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
            SimFileConfig::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))
        }
        None => Ok(SimFileConfig::default()),
    }
}

async fn sim_worker(a: SimWorkerArgs, file: SimFileConfig) -> anyhow::Result<()> {
    let cost = match &a.cost_model {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
            CostModel::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?
        }
        None => CostModel::default(),
    };
    let config = SimConfig {
        api: file.api,
        http: file.http,
        grpc: GrpcConfig { port: a.grpc_port.or(file.grpc.port), ..file.grpc },
        admin: file.admin,
        admin_host: a.admin_host,
        drain_timeout_ms: a.drain_timeout_ms,
        model: a.model,
        cost,
        speed: a.speed,
        slots: a.slots,
        jitter: a.jitter,
        fail_rate: a.fail_rate,
        slowdowns: a.slowdown,
        stall: Stall { rate: a.stall_rate, min_ms: a.stall_ms, alpha: a.stall_alpha, max_ms: a.stall_max_ms },
        seed: a.seed,
        max_queue: a.max_queue,
        max_batch_tokens: a.max_batch_tokens,
        max_seq_tokens: a.max_seq_tokens,
        prefix_cache_blocks: a.prefix_cache_blocks,
        prepare_ms: a.prepare_ms,
        prepare_ms_per_item: a.prepare_ms_per_item,
        template: a.template,
        ..SimConfig::default()
    };
    let worker = SimWorker::start(config, &a.host, a.port, a.admin_port).await?;
    println!("{}", worker.listening_line());
    sieve_server::cli::shutdown_signal().await;
    // Drain like the real worker: refuse new calls, finish running ones, close the connections;
    // all within the drain timeout.
    worker.drain();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(a.drain_timeout_ms);
    while worker.engine().counters().in_flight.load(Ordering::Relaxed) > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    worker.shutdown_within(deadline.saturating_duration_since(tokio::time::Instant::now())).await;
    Ok(())
}
