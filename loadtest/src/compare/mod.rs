//! `sieve-loadtest compare`: N simulated workers, one proxy per strategy, the same seeded
//! open-loop workload at several fractions of cluster capacity for each, then fault
//! scenarios (one worker 3× slower, a worker killed and restarted, a burst to 150%); a table
//! per load and scenario, plots, and a JSON file with everything.
//!
//! Capacity is computed, not guessed: N workers × slots × speed / E[compute of one request
//! sent whole], with the expectation taken over the seeded workload under the sim-workers'
//! own cost model and tokenizer. Splitting a request costs more than that in total (each
//! shard pays the call's fixed cost and the prefix again), so "70% load" keeps a whole-request
//! worker 70% busy and a splitting one busier: the utilisation column shows how much.

pub mod cluster;
pub mod strategy;
pub mod table;

use std::path::{Path, PathBuf};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;
use sieve_shared::CostModel;

use crate::arrivals::{Burst, RateProfile};
use crate::client::Http;
use crate::monitor::Monitor;
use crate::plot::{self, CdfChart, LoadChart};
use crate::report::{self, RunData, RunInfo, RunReport};
use crate::run::{self, LoadMode, RunSpec};
use crate::sim::{SimConfig, SimSettingsUpdate, Stall};
use crate::summary::Summary;
use crate::workload::WorkloadSpec;
use cluster::{ProxyCounters, ProxyProc, SimCluster};
pub use strategy::{parse_strategies, Strategy, STRATEGIES};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scenario {
    /// One worker 3× slower from a quarter of the run on.
    SlowWorker,
    /// A worker killed at a third of the run, restarted at two thirds.
    KillRestart,
    /// Traffic to 150% of capacity for 10 s (at most a third of the run) from a third on.
    Burst,
    /// Every worker stalls on [`STALL`]'s share of its calls, for heavy-tailed pauses, all run.
    Stall,
}

/// The `stall` scenario's stall model (simulated ms): 3% of calls pause for at least 25 ms,
/// Pareto tail of shape 1.2 (median ~45 ms, 1 in 100 stalls past 1 s), capped at 1 s (twice
/// the 500 ms budget).
pub const STALL: Stall = Stall { rate: 0.03, min_ms: 25.0, alpha: 1.2, max_ms: 1000.0 };

impl Scenario {
    pub fn key(&self) -> &'static str {
        match self {
            Scenario::SlowWorker => "slow",
            Scenario::KillRestart => "kill",
            Scenario::Burst => "burst",
            Scenario::Stall => "stall",
        }
    }

    pub fn describe(&self) -> &'static str {
        match self {
            Scenario::SlowWorker => "one worker 3x slower (from 1/4 of the run)",
            Scenario::KillRestart => "a worker killed at 1/3 of the run, restarted at 2/3",
            Scenario::Burst => "traffic burst to 150% of capacity for 10 s (from 1/3 of the run)",
            Scenario::Stall => "3% of calls on every worker stall (Pareto, 25 ms to 1 s of simulated time)",
        }
    }
}

pub fn parse_scenarios(s: &str) -> Result<Vec<Scenario>, String> {
    match s.trim() {
        "all" => return Ok(vec![Scenario::SlowWorker, Scenario::KillRestart, Scenario::Burst, Scenario::Stall]),
        "none" | "" => return Ok(Vec::new()),
        _ => {}
    }
    s.split(',')
        .map(|p| match p.trim() {
            "slow" => Ok(Scenario::SlowWorker),
            "kill" => Ok(Scenario::KillRestart),
            "burst" => Ok(Scenario::Burst),
            "stall" => Ok(Scenario::Stall),
            o => Err(format!("unknown scenario '{o}' (expected all, none, or a list of slow, kill, burst, stall)")),
        })
        .collect()
}

#[derive(Debug, Clone)]
pub struct CompareSpec {
    pub workers: usize,
    /// The simulated workers (cost model, slots, speed, jitter, limits); seeds vary per worker.
    pub sim: SimConfig,
    /// Offered loads, in percent of capacity.
    pub loads: Vec<f64>,
    pub duration: Duration,
    /// Per proxy, before the first measured run (its estimators learn the workers).
    pub proxy_warmup: Duration,
    pub strategies: Vec<Strategy>,
    pub scenarios: Vec<Scenario>,
    /// Load (percent of capacity) of the fault scenarios.
    pub fault_load: f64,
    pub fault_duration: Duration,
    pub workload: WorkloadSpec,
    /// Items per shard of the fixed split (default: mean items per request / workers).
    pub fixed_items: Option<usize>,
    /// Ours with the load-aware split (`[split] load_aware`).
    pub load_aware: bool,
    pub seed: u64,
    pub out: PathBuf,
    pub proxy_bin: PathBuf,
    pub progress: bool,
}

/// One measured run of one strategy.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub strategy: String,
    pub strategy_key: String,
    /// `load` or a scenario key.
    pub scenario: String,
    pub load_pct: f64,
    pub qps: f64,
    /// Every request sent, the warm-up included (`summary` counts only the measured window).
    pub sent: u64,
    pub summary: Summary,
    pub proxy: CellProxy,
    /// Worker compute (slot-ms) per request sent, hedge losers and failed calls included.
    pub work_ms_per_request: f64,
    /// Hedging and cache only: worker compute per request over that of the same strategy
    /// without them ("ours") in the same run conditions, minus one (the extra work hedges cost;
    /// negative for the cache: the work it saves).
    pub extra_work_vs_ours: Option<f64>,
    /// Prefix tokens the workers' prefix caches held over those looked up (none: the workers
    /// have no prefix cache).
    pub prefix_hit_rate: Option<f64>,
    /// Mean worker utilisation over the run.
    pub utilisation: f64,
    pub dir: String,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CellProxy {
    pub shards: u64,
    pub hedges: u64,
    pub retries: u64,
    pub failures: u64,
}

impl From<ProxyCounters> for CellProxy {
    fn from(c: ProxyCounters) -> Self {
        CellProxy { shards: c.shards, hedges: c.hedges, retries: c.retries, failures: c.failures }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct CompareReport {
    pub workers: usize,
    pub slots: usize,
    pub speed: f64,
    pub jitter: f64,
    pub cost_model: CostModel,
    pub workload: WorkloadSpec,
    pub fixed_items: usize,
    pub mean_request_ms: f64,
    pub capacity_qps: f64,
    pub capacity_rule: String,
    pub duration_s: f64,
    pub fault_duration_s: f64,
    pub fault_load_pct: f64,
    pub seed: u64,
    pub cells: Vec<Cell>,
}

/// Mean compute of one request sent whole, and the cluster's capacity in requests/s.
pub fn capacity(spec: &CompareSpec) -> (f64, f64) {
    let mean_ms = spec.workload.mean_call_ms(&spec.sim.cost, 5000, spec.seed);
    let cap = spec.workers as f64 * spec.sim.slots as f64 * spec.sim.speed * 1000.0 / mean_ms;
    (mean_ms, cap)
}

struct Env<'a> {
    spec: &'a CompareSpec,
    http: Http,
    cluster: SimCluster,
    capacity_qps: f64,
}

/// The timeline of a fault scenario, run beside the load.
async fn inject(cluster: SimCluster, scenario: Scenario, d: f64) {
    match scenario {
        Scenario::SlowWorker => {
            tokio::time::sleep(Duration::from_secs_f64(d / 4.0)).await;
            if let Err(e) = cluster.update(0, &SimSettingsUpdate { slowdown: Some(3.0), ..Default::default() }) {
                eprintln!("compare: slowing worker 0: {e}");
            }
        }
        Scenario::KillRestart => {
            let victim = 1.min(cluster.len().saturating_sub(1));
            tokio::time::sleep(Duration::from_secs_f64(d / 3.0)).await;
            cluster.kill(victim);
            tokio::time::sleep(Duration::from_secs_f64(d / 3.0)).await;
            if let Err(e) = cluster.restart(victim).await {
                eprintln!("compare: {e}");
            }
        }
        Scenario::Burst => {}
        Scenario::Stall => {
            for i in 0..cluster.len() {
                if let Err(e) = cluster.update(i, &SimSettingsUpdate { stall: Some(STALL), ..Default::default() }) {
                    eprintln!("compare: stalls on worker {i}: {e}");
                }
            }
        }
    }
}

fn scenario_marks(scenario: Option<Scenario>, d: f64, burst: Option<Burst>) -> Vec<(f64, f64, String)> {
    match scenario {
        Some(Scenario::SlowWorker) => vec![(d / 4.0, d, "worker 0 3x slower".into())],
        Some(Scenario::KillRestart) => vec![(d / 3.0, 2.0 * d / 3.0, "worker 1 down".into())],
        Some(Scenario::Burst) => {
            burst.map(|b| vec![(b.start_s, b.start_s + b.duration_s, "150% burst".into())]).unwrap_or_default()
        }
        Some(Scenario::Stall) => vec![(0.0, d, "stalls on every worker".into())],
        None => Vec::new(),
    }
}

impl Env<'_> {
    /// One open-loop run of one strategy; writes its report and charts under `dir`.
    async fn cell(
        &self,
        st: &Strategy,
        proxy: &ProxyProc,
        load_pct: f64,
        scenario: Option<Scenario>,
        dir: &Path,
    ) -> Result<(Cell, Histogram<u64>), String> {
        let spec = self.spec;
        let duration = if scenario.is_some() { spec.fault_duration } else { spec.duration };
        let d = duration.as_secs_f64();
        let qps = self.capacity_qps * load_pct / 100.0;
        let burst = (scenario == Some(Scenario::Burst)).then(|| Burst {
            factor: 150.0 / load_pct,
            start_s: d / 3.0,
            duration_s: (d / 3.0).min(10.0),
        });
        let profile = RateProfile { base_qps: qps, bursts: burst.into_iter().collect() };
        let run_spec = RunSpec {
            target: proxy.api_url(),
            mode: LoadMode::Open { profile: profile.clone() },
            duration,
            max_requests: None,
            workload: spec.workload.clone(),
            seed: spec.seed,
            timeout: Duration::from_millis(spec.workload.deadline_ms.unwrap_or(10_000) + 10_000),
            verify_sim_scores: true,
            progress: spec.progress,
            label: format!(
                "{} {}",
                st.key,
                scenario.map_or_else(|| format!("{load_pct:.0}%"), |s| s.key().to_string())
            ),
            trace: None,
        };
        self.cluster.wait_idle(Duration::from_secs(10)).await;
        // The workload and arrivals come from `spec.seed` too: every strategy gets the same.
        self.cluster.reseed(spec.seed);
        let before = proxy.counters(&self.http).await;
        let busy_before = self.cluster.busy_seconds();
        let prefix_before = self.cluster.prefix_tokens();
        let monitor = Monitor::start(self.http.clone(), self.cluster.admin_urls().to_vec(), Duration::from_millis(500));
        let faults = scenario.map(|s| tokio::spawn(inject(self.cluster.clone(), s, d)));
        let out = run::run(&self.http, &run_spec).await;
        if let Some(f) = faults {
            let _ = f.await;
        }
        let util = monitor.stop();
        self.cluster.wait_idle(Duration::from_secs(10)).await;
        let busy = self.cluster.busy_seconds() - busy_before;
        let prefix_after = self.cluster.prefix_tokens();
        let looked_up = prefix_after.0.saturating_sub(prefix_before.0);
        let prefix_hit_rate =
            (looked_up > 0).then(|| prefix_after.1.saturating_sub(prefix_before.1) as f64 / looked_up as f64);
        let counters = proxy.counters(&self.http).await - before;
        self.cluster.reset_settings();
        if let Some(Scenario::KillRestart) = scenario {
            // In case the run ended before the restart.
            self.cluster.restart(1.min(self.cluster.len().saturating_sub(1))).await?;
        }
        let warmup_s = (d * 0.1).min(2.0);
        let (rep, hist): (RunReport, _) = RunData {
            info: RunInfo {
                label: format!(
                    "{} at {}",
                    st.key,
                    scenario.map_or_else(
                        || format!("{load_pct:.0}% load"),
                        |s| format!("{load_pct:.0}% load, {}", s.key())
                    )
                ),
                target: proxy.api_url(),
                load: run_spec.mode.clone(),
                duration_s: d,
                max_requests: None,
                warmup_s,
                seed: spec.seed,
                workload: spec.workload.clone(),
                utilisation: Some(util),
                marks: scenario_marks(scenario, d, burst),
            },
            records: &out.records,
            send_window_s: out.send_window_s,
        }
        .report();
        report::write(dir, &rep, &hist)?;
        proxy.snapshot(&self.http, dir).await;
        let sent = out.records.len().max(1) as f64;
        let cell = Cell {
            strategy: st.name.to_string(),
            strategy_key: st.key.to_string(),
            scenario: scenario.map_or("load", |s| s.key()).to_string(),
            load_pct,
            qps,
            sent: out.records.len() as u64,
            work_ms_per_request: busy * 1e3 / sent,
            extra_work_vs_ours: None,
            prefix_hit_rate,
            utilisation: rep.info.utilisation.as_ref().map_or(0.0, |u| u.mean()),
            summary: rep.summary,
            proxy: counters.into(),
            dir: dir.display().to_string(),
        };
        Ok((cell, hist))
    }

    /// A short unmeasured run at 30% load: the proxy's estimators learn (again) how the
    /// workers behave.
    async fn settle(&self, proxy: &ProxyProc, duration: Duration, seed: u64) {
        let spec = RunSpec {
            target: proxy.api_url(),
            mode: LoadMode::Open { profile: RateProfile::constant(self.capacity_qps * 0.3) },
            duration,
            max_requests: None,
            workload: self.spec.workload.clone(),
            seed,
            timeout: Duration::from_secs(30),
            verify_sim_scores: false,
            progress: false,
            label: "settle".into(),
            trace: None,
        };
        let _ = run::run(&self.http, &spec).await;
        self.cluster.wait_idle(Duration::from_secs(10)).await;
    }
}

/// Runs the whole comparison. Must run on the thread that stays alive until it returns (the
/// proxy processes die with the thread that started them).
pub async fn compare(spec: &CompareSpec) -> Result<CompareReport, String> {
    if spec.workers == 0 {
        return Err("--workers must be at least 1".into());
    }
    std::fs::create_dir_all(&spec.out).map_err(|e| format!("{}: {e}", spec.out.display()))?;
    let (mean_ms, capacity_qps) = capacity(spec);
    let mean_items = spec.workload.items.mean();
    let fixed_items = spec.fixed_items.unwrap_or_else(|| ((mean_items / spec.workers as f64).round() as usize).max(1));
    let rule = format!(
        "capacity = workers x slots x speed / E[compute of one request sent whole] = {} x {} x {} / {:.2} ms = {:.2} requests/s",
        spec.workers, spec.sim.slots, spec.sim.speed, mean_ms, capacity_qps
    );
    println!(
        "Sieve strategy comparison: {} simulated workers, {} strategies, loopback.",
        spec.workers,
        spec.strategies.len()
    );
    println!("  {rule}");
    println!(
        "  workload: items {}, item tokens {}, query tokens {}, reuse {}, deadline {:?} ms; fixed split: {} items per shard",
        spec.workload.items, spec.workload.item_tokens, spec.workload.query_tokens, spec.workload.reuse, spec.workload.deadline_ms, fixed_items
    );

    let http = Http::new();
    let cluster = SimCluster::start(spec.workers, &spec.sim).await?;
    let base = strategy::ProxyBase {
        workers: cluster.endpoints().to_vec(),
        // The proxies' prior: what the simulated workers really cost at their speed.
        cost: CostModel::from_array(spec.sim.cost.as_array().map(|v| v / spec.sim.speed)),
        fixed_items,
        default_deadline_ms: spec.workload.deadline_ms.unwrap_or(500),
        load_aware: spec.load_aware,
    };
    let cfg_dir = spec.out.join("proxy-configs");
    std::fs::create_dir_all(&cfg_dir).map_err(|e| format!("{}: {e}", cfg_dir.display()))?;
    let mut proxies = Vec::with_capacity(spec.strategies.len());
    for st in &spec.strategies {
        let p = ProxyProc::start(&spec.proxy_bin, &st.proxy_config(&base), &cfg_dir.join(format!("{}.toml", st.key)))?;
        proxies.push(p);
    }
    for p in &proxies {
        p.wait_workers(&http, spec.workers, Duration::from_secs(30)).await?;
    }
    let env = Env { spec, http, cluster, capacity_qps };
    for (i, p) in proxies.iter().enumerate() {
        env.settle(p, spec.proxy_warmup, spec.seed.wrapping_add(1000 + i as u64)).await;
    }

    let mut cells = Vec::new();
    let mut cdfs: Vec<CdfGroup> = Vec::new();
    for &load in &spec.loads {
        let mut hs = Vec::new();
        for (st, p) in spec.strategies.iter().zip(&proxies) {
            let dir = spec.out.join(format!("load{load:.0}")).join(st.key);
            let (cell, h) = env.cell(st, p, load, None, &dir).await?;
            table::print_progress_row(&cell);
            hs.push((st.name.to_string(), h));
            cells.push(cell);
        }
        set_extra_work(cells.iter_mut().filter(|c| c.scenario == "load" && c.load_pct == load));
        cdfs.push((format!("load{load:.0}"), hs));
        table::print_table(
            &format!("{load:.0}% of capacity ({:.1} requests/s)", capacity_qps * load / 100.0),
            cells.iter().filter(|c| c.scenario == "load" && c.load_pct == load),
        );
    }
    for &sc in &spec.scenarios {
        let mut hs = Vec::new();
        for (st, p) in spec.strategies.iter().zip(&proxies) {
            env.settle(
                p,
                Duration::from_secs(2).min(spec.proxy_warmup.max(Duration::from_millis(500))),
                spec.seed.wrapping_add(2000),
            )
            .await;
            let dir = spec.out.join(sc.key()).join(st.key);
            let (cell, h) = env.cell(st, p, spec.fault_load, Some(sc), &dir).await?;
            table::print_progress_row(&cell);
            hs.push((st.name.to_string(), h));
            cells.push(cell);
        }
        set_extra_work(cells.iter_mut().filter(|c| c.scenario == sc.key()));
        cdfs.push((sc.key().to_string(), hs));
        table::print_table(
            &format!("{} at {:.0}% load", sc.describe(), spec.fault_load),
            cells.iter().filter(|c| c.scenario == sc.key()),
        );
    }

    let report = CompareReport {
        workers: spec.workers,
        slots: spec.sim.slots,
        speed: spec.sim.speed,
        jitter: spec.sim.jitter,
        cost_model: spec.sim.cost,
        workload: spec.workload.clone(),
        fixed_items,
        mean_request_ms: mean_ms,
        capacity_qps,
        capacity_rule: rule,
        duration_s: spec.duration.as_secs_f64(),
        fault_duration_s: spec.fault_duration.as_secs_f64(),
        fault_load_pct: spec.fault_load,
        seed: spec.seed,
        cells,
    };
    write_outputs(spec, &report, &cdfs)?;
    Ok(report)
}

/// One latency CDF chart: its file name and a histogram per strategy.
type CdfGroup = (String, Vec<(String, Histogram<u64>)>);

/// Fills `extra_work_vs_ours` of the hedging and cache cells of one load or scenario.
fn set_extra_work<'a>(cells: impl Iterator<Item = &'a mut Cell>) {
    let group: Vec<&mut Cell> = cells.collect();
    let Some(base) = group.iter().find(|c| c.strategy_key == "ours").map(|c| c.work_ms_per_request) else {
        return;
    };
    for c in group {
        if matches!(c.strategy_key.as_str(), "ours-hedge" | "ours-cache" | "ours-affinity") && base > 0.0 {
            c.extra_work_vs_ours = Some(c.work_ms_per_request / base - 1.0);
        }
    }
}

fn write_outputs(spec: &CompareSpec, report: &CompareReport, cdfs: &[CdfGroup]) -> Result<(), String> {
    let json = spec.out.join("compare.json");
    std::fs::write(&json, serde_json::to_string_pretty(report).map_err(|e| e.to_string())?)
        .map_err(|e| format!("{}: {e}", json.display()))?;
    let md = spec.out.join("compare.md");
    std::fs::write(&md, table::markdown(report)).map_err(|e| format!("{}: {e}", md.display()))?;
    for (name, hs) in cdfs {
        let title = match name.strip_prefix("load") {
            Some(l) => format!("Latency CDF at {l}% of capacity"),
            None => format!("Latency CDF, {} at {:.0}% load", name, spec.fault_load),
        };
        plot::save(
            &CdfChart { title, series: hs.iter().map(|(n, h)| (n.clone(), h)).collect() },
            &spec.out.join(format!("cdf_{name}")),
        )?;
    }
    if !spec.loads.is_empty() {
        for (what, f) in
            [("p99", (|c: &Cell| c.summary.latency_ms.p99) as fn(&Cell) -> f64), ("p50", |c| c.summary.latency_ms.p50)]
        {
            let series = spec
                .strategies
                .iter()
                .map(|st| {
                    let pts = report
                        .cells
                        .iter()
                        .filter(|c| c.scenario == "load" && c.strategy_key == st.key)
                        .map(|c| (c.load_pct, f(c)))
                        .collect();
                    (st.name.to_string(), pts)
                })
                .collect();
            plot::save(
                &LoadChart {
                    title: format!("{what} latency against load, {} simulated workers", spec.workers),
                    y_desc: format!("{what} latency (ms)"),
                    series,
                },
                &spec.out.join(format!("{what}_vs_load")),
            )?;
        }
    }
    println!("\nResults: {} (compare.md, compare.json, plots; per-run reports in subfolders)", spec.out.display());
    Ok(())
}
