//! How many workers keep the p99 under a target for the traced traffic: the trace replayed
//! (`run --trace`'s load source, at the trace's own arrival times) against clusters of
//! simulated workers of different sizes, each behind a fresh `sieve-proxy` (cost split,
//! least-loaded, admission; the pair-score cache as asked).
//!
//! The search: start at the lower bound the traced work allows (its compute, every request
//! sent whole to a worker of the cost model, over the trace's length and the workers' slots,
//! rounded up), then one worker more while the target is missed, or one fewer while it is met,
//! until two neighbouring sizes were run, the larger meeting the target and the smaller not.
//! A size "meets the target" when its p99 (complete and partial answers, on the trace's clock)
//! is at most `p99_ms` and at least `min_complete` of its requests were answered completely
//! (a cluster refusing most requests would otherwise have a fine p99).
//!
//! Time is stretched as in `compare`: sim-workers at `speed` < 1 and the trace replayed at
//! the same speed keep the load the same while the proxy's own CPU shrinks beside the
//! simulated compute; latencies are multiplied back by `speed`, deadlines divided by it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use sieve_shared::metrics_names::proxy as names;
use sieve_shared::CostModel;

use crate::arrivals::RateProfile;
use crate::client::Http;
use crate::compare::cluster::{ProxyProc, SimCluster};
use crate::compare::strategy::{ProxyBase, Strategy, CACHE_STRATEGY, STRATEGIES};
use crate::run::{self, LoadMode, RunSpec, TraceSource};
use crate::sim::tokens::TEMPLATE_TAIL_TOKENS;
use crate::sim::SimConfig;
use crate::summary::Summary;
use crate::trace::synth::Replay;
use crate::workload::WorkloadSpec;

#[derive(Debug, Clone)]
pub struct CapacitySpec {
    /// The p99 target, ms of trace time.
    pub p99_ms: f64,
    /// Fewest complete answers (fraction of requests) for a size to meet the target.
    pub min_complete: f64,
    /// The simulated workers (cost model, slots, speed, jitter).
    pub sim: SimConfig,
    /// The search starts here (default: the lower bound of the traced work).
    pub start: Option<usize>,
    pub max_workers: usize,
    /// Trace seconds replayed per size (from its start).
    pub duration: Duration,
    /// Wall seconds of untraced load before each size's run (the proxy learns the workers).
    pub warmup: Duration,
    /// The proxy's pair-score cache on.
    pub cache: bool,
    pub proxy_bin: PathBuf,
    /// Where the proxies' configs go.
    pub out: PathBuf,
    pub progress: bool,
    pub seed: u64,
}

/// One size tried.
#[derive(Debug, Clone, Serialize)]
pub struct Trial {
    pub workers: usize,
    pub requests: u64,
    /// Complete answers over requests.
    pub complete: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub meets: bool,
    /// Mean worker busy fraction over the run.
    pub utilisation: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct CapacityPlan {
    pub p99_target_ms: f64,
    pub min_complete: f64,
    /// The fewest workers that met the target with one fewer missing it; none when even
    /// `max_workers` missed it.
    pub workers: Option<usize>,
    /// Workers the traced work keeps busy (whole requests, cost model), before rounding.
    pub busy_workers: f64,
    pub search: String,
    pub trials: Vec<Trial>,
}

/// Workers the traced work keeps busy: its compute at speed 1 (every request whole) over its
/// length, per slot.
pub fn busy_workers(replay: &Replay, cost: &CostModel, slots: usize) -> f64 {
    let work_ms: f64 = replay
        .records()
        .iter()
        .map(|r| {
            let prefix = f64::from(r.prefix_tokens.max(1));
            let items = (0..r.items.len()).map(|k| {
                let t = r.item_tokens.get(k).copied().filter(|&t| t > 0);
                f64::from(t.unwrap_or_else(|| replay.lengths().item_words(r.items[k]) + TEMPLATE_TAIL_TOKENS))
            });
            cost.call_ms(prefix, items)
        })
        .sum();
    work_ms / (replay.span_s().max(1e-3) * 1e3) / slots.max(1) as f64
}

/// Runs the search.
pub async fn plan(replay: Arc<Replay>, spec: &CapacitySpec) -> Result<CapacityPlan, String> {
    if !(spec.p99_ms.is_finite() && spec.p99_ms > 0.0) {
        return Err(format!("--p99-ms must be positive, got {}", spec.p99_ms));
    }
    let busy = busy_workers(&replay, &spec.sim.cost, spec.sim.slots);
    let max = spec.max_workers.max(1);
    let mut w = spec.start.unwrap_or(busy.ceil() as usize).clamp(1, max);
    let search = format!(
        "start at {w} ({}), then +1 while the target is missed or -1 while it is met, until sizes n and n-1 \
         were both run with n meeting it and n-1 not (at most {max}); meeting it: p99 <= {} ms and >= {:.1}% complete",
        if spec.start.is_some() {
            "given".to_string()
        } else {
            format!("{busy:.2} workers busy with the traced work, rounded up")
        },
        spec.p99_ms,
        spec.min_complete * 100.0
    );
    println!("  capacity search: {search}");
    let mut trials: Vec<Trial> = Vec::new();
    let found = loop {
        let t = trial(&replay, spec, w).await?;
        println!(
            "    {:>3} workers: p50 {:>8.1} ms  p99 {:>8.1} ms  complete {:>6.2}%  busy {:>4.0}%  {}",
            t.workers,
            t.p50_ms,
            t.p99_ms,
            t.complete * 100.0,
            t.utilisation * 100.0,
            if t.meets { "meets" } else { "misses" }
        );
        let meets = t.meets;
        trials.push(t);
        let tried = |n: usize| trials.iter().find(|t| t.workers == n).map(|t| t.meets);
        if meets {
            if w == 1 || tried(w - 1) == Some(false) {
                break Some(w);
            }
            w -= 1;
        } else {
            if tried(w + 1) == Some(true) {
                break Some(w + 1);
            }
            if w >= max {
                break None;
            }
            w += 1;
        }
    };
    Ok(CapacityPlan {
        p99_target_ms: spec.p99_ms,
        min_complete: spec.min_complete,
        workers: found,
        busy_workers: busy,
        search,
        trials,
    })
}

/// The strategy the planner's proxies run.
fn strategy(cache: bool) -> Strategy {
    if cache {
        CACHE_STRATEGY
    } else {
        STRATEGIES[3]
    }
}

/// The proxy's pair-cache counters over a replay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CacheCounts {
    pub hits: u64,
    pub misses: u64,
}

impl CacheCounts {
    pub fn hit_rate(&self) -> f64 {
        self.hits as f64 / (self.hits + self.misses).max(1) as f64
    }

    /// The counters in a Prometheus text page (absent: 0).
    pub fn of_metrics(text: &str) -> CacheCounts {
        let value = |name: &str| {
            text.lines()
                .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>() as u64
        };
        CacheCounts { hits: value(names::CACHE_HITS.name), misses: value(names::CACHE_MISSES.name) }
    }
}

async fn cache_counts(http: &Http, proxy: &ProxyProc) -> CacheCounts {
    let url = format!("{}/metrics", proxy.admin_url());
    match http.send(hyper::Method::GET, &url, bytes::Bytes::new(), Duration::from_secs(2)).await {
        Ok(r) => CacheCounts::of_metrics(&String::from_utf8_lossy(&r.body)),
        Err(_) => CacheCounts::default(),
    }
}

/// One size: a fresh cluster and proxy, a warm-up, the trace.
async fn trial(replay: &Arc<Replay>, spec: &CapacitySpec, workers: usize) -> Result<Trial, String> {
    Ok(replay_on_cluster(replay, spec, workers, None).await?.0)
}

/// Replays the trace on `workers` fresh sim-workers behind a fresh proxy (its pair cache of
/// `cache_bytes` when given, else `[cache]`'s default size); the run's figures and the proxy's
/// cache counters over the trace alone (the warm-up's subtracted).
pub async fn replay_on_cluster(
    replay: &Arc<Replay>,
    spec: &CapacitySpec,
    workers: usize,
    cache_bytes: Option<u64>,
) -> Result<(Trial, CacheCounts), String> {
    let http = Http::new();
    let speed = spec.sim.speed;
    let cluster = SimCluster::start(workers, &SimConfig { seed: spec.seed, ..spec.sim.clone() }).await?;
    let base = ProxyBase {
        workers: cluster.endpoints().to_vec(),
        cost: CostModel::from_array(spec.sim.cost.as_array().map(|v| v / speed)),
        fixed_items: 32,
        default_deadline_ms: (500.0 / speed).round() as u64,
        load_aware: true,
    };
    std::fs::create_dir_all(&spec.out).map_err(|e| format!("{}: {e}", spec.out.display()))?;
    let st = strategy(spec.cache || cache_bytes.is_some());
    let mut config = st.proxy_config(&base);
    if let Some(b) = cache_bytes {
        config.cache.max_bytes = b;
    }
    let name = match cache_bytes {
        Some(b) => format!("proxy-{workers}-cache{b}.toml"),
        None => format!("proxy-{workers}.toml"),
    };
    let proxy = ProxyProc::start(&spec.proxy_bin, &config, &spec.out.join(name))?;
    proxy.wait_workers(&http, workers, Duration::from_secs(30)).await?;
    let qps = replay.len() as f64 / replay.span_s().max(1e-3) * speed;
    let common = |mode, duration, workload, seed, trace, label: &str| RunSpec {
        target: proxy.api_url(),
        mode,
        duration,
        max_requests: None,
        workload,
        seed,
        timeout: Duration::from_secs_f64(60.0 / speed.max(0.01)),
        verify_sim_scores: false,
        progress: spec.progress,
        label: label.to_string(),
        trace,
    };
    if !spec.warmup.is_zero() {
        // Fresh requests (no repeats): the proxy's estimators learn, its pair cache gains
        // nothing the trace would hit.
        let warm = WorkloadSpec { reuse: 0.0, deadline_ms: Some(base.default_deadline_ms), ..WorkloadSpec::default() };
        let mode = LoadMode::Open { profile: RateProfile::constant(qps * 0.3) };
        let _ = run::run(&http, &common(mode, spec.warmup, warm, spec.seed ^ 0x3a3a, None, "warm-up")).await;
        cluster.wait_idle(Duration::from_secs(10)).await;
    }
    let busy_before = cluster.busy_seconds();
    let counts_before = cache_counts(&http, &proxy).await;
    let src = TraceSource { replay: replay.clone(), speed, deadline_scale: 1.0 / speed };
    let mode = LoadMode::Trace { file: String::new(), speed };
    let wall = Duration::from_secs_f64(spec.duration.as_secs_f64() / speed);
    let out = run::run(
        &http,
        &common(mode, wall, WorkloadSpec::default(), spec.seed, Some(src), &format!("{workers} workers")),
    )
    .await;
    let busy = cluster.busy_seconds() - busy_before;
    let after = cache_counts(&http, &proxy).await;
    let counts = CacheCounts {
        hits: after.hits.saturating_sub(counts_before.hits),
        misses: after.misses.saturating_sub(counts_before.misses),
    };
    let (s, _) = Summary::of(&out.records, 0.0, out.send_window_s.max(1e-3));
    drop(proxy);
    for i in 0..cluster.len() {
        cluster.kill(i);
    }
    let complete = s.ok as f64 / s.requests.max(1) as f64;
    let p99_ms = s.latency_ms.p99 * speed;
    let trial = Trial {
        workers,
        requests: s.requests,
        complete,
        p50_ms: s.latency_ms.p50 * speed,
        p99_ms,
        meets: s.requests > 0 && p99_ms <= spec.p99_ms && complete >= spec.min_complete,
        utilisation: busy / (out.elapsed_s.max(1e-3) * (workers * spec.sim.slots) as f64),
    };
    Ok((trial, counts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_counters_are_read_from_the_metrics_page() {
        let page = "# TYPE sieve_proxy_cache_hits_total counter\nsieve_proxy_cache_hits_total 120\n\
                    sieve_proxy_cache_hits_total_other 5\nsieve_proxy_cache_misses_total 380\n";
        let c = CacheCounts::of_metrics(page);
        assert_eq!((c.hits, c.misses), (120, 380));
        assert_eq!(c.hit_rate(), 0.24);
        assert_eq!(CacheCounts::of_metrics(""), CacheCounts::default());
    }
}
