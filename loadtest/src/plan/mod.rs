//! `sieve-loadtest plan --trace FILE`: what a traced traffic needs. From the proxy's request
//! trace (`[request_trace]`), the pair-score cache's hit rate against its size ([`pair`]), the
//! workers' prefix-cache hit rate against their cache blocks ([`prefix`]), and the number of
//! sim-workers that keeps the p99 under a target under the trace's own arrivals
//! ([`capacity`]); tables, plots and a JSON report. [`crate::trace`] reads the file, and its
//! `synth` makes texts from its hashes (also for `sieve-loadtest run --trace`).

pub mod capacity;
pub mod pair;
pub mod prefix;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use crate::plot::{self, CurveChart};
use crate::trace::synth::Replay;
use capacity::{CapacityPlan, CapacitySpec};
use pair::PairPoint;
use prefix::{PrefixPoint, Routing};

#[derive(Debug, Clone)]
pub struct PlanSpec {
    pub traces: Vec<PathBuf>,
    /// Pair-cache sizes of the curve, bytes.
    pub cache_sizes: Vec<u64>,
    /// The pair cache's TTL (`[cache] ttl_ms`).
    pub ttl_ms: u64,
    /// Prefix-cache blocks per worker of the curve.
    pub prefix_blocks: Vec<usize>,
    /// Workers of the prefix-cache model (default: the capacity search's answer, else 4).
    pub prefix_workers: Option<usize>,
    /// The worker-count search (`--p99-ms`), or none.
    pub capacity: Option<CapacitySpec>,
    /// The pair-cache prediction checked: the trace replayed against a real proxy with a
    /// cache of each of these sizes (bytes), on sim-workers as `.0` says.
    pub measure: Option<(CapacitySpec, Vec<u64>)>,
    pub out: PathBuf,
    pub seed: u64,
}

/// What the trace holds.
#[derive(Debug, Clone, Serialize)]
pub struct TraceStats {
    pub files: Vec<String>,
    pub requests: usize,
    /// First arrival to last.
    pub span_s: f64,
    pub qps: f64,
    pub items: u64,
    pub distinct_pairs: usize,
    /// Requests whose (instruction, query, items) came earlier in the trace.
    pub repeated_requests: usize,
    /// Requests not answered 200 (nothing of theirs is cached).
    pub failed_requests: usize,
    /// Items the proxy answered from its cache when the trace was taken.
    pub traced_cached_items: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct PlanReport {
    pub trace: TraceStats,
    pub ttl_ms: u64,
    pub pair_cache: Vec<PairPoint>,
    pub prefix_workers: usize,
    pub prefix_cache: Vec<PrefixPoint>,
    pub capacity: Option<CapacityPlan>,
    /// Predicted against measured pair-cache hit rates (`--measure-cache-mib`).
    pub measured_pair_cache: Vec<MeasuredPoint>,
}

/// The pair cache's hit rate predicted by the replay and measured on a real proxy.
#[derive(Debug, Clone, Serialize)]
pub struct MeasuredPoint {
    pub max_bytes: u64,
    pub workers: usize,
    pub predicted: f64,
    /// `sieve_proxy_cache_hits_total / (hits + misses)` over the replay.
    pub measured: f64,
    pub hits: u64,
    pub lookups: u64,
    /// Requests sent and how many were answered completely.
    pub requests: u64,
    pub complete: f64,
}

pub fn stats(files: &[PathBuf], replay: &Replay) -> TraceStats {
    let r = replay.records();
    let mut pairs = HashSet::new();
    let mut requests = HashSet::new();
    let mut repeated = 0;
    for rec in r {
        for &i in &rec.items {
            pairs.insert((rec.query, rec.instruction, i));
        }
        if !requests.insert((rec.query, rec.instruction, rec.items.clone())) {
            repeated += 1;
        }
    }
    TraceStats {
        files: files.iter().map(|f| f.display().to_string()).collect(),
        requests: r.len(),
        span_s: replay.span_s(),
        qps: r.len() as f64 / replay.span_s().max(1e-3),
        items: r.iter().map(|x| x.items.len() as u64).sum(),
        distinct_pairs: pairs.len(),
        repeated_requests: repeated,
        failed_requests: r.iter().filter(|x| !x.answered()).count(),
        traced_cached_items: r.iter().map(|x| u64::from(x.cached_items)).sum(),
    }
}

/// Runs the plan: reads the trace, prints the tables, writes `plan.json` and the plots.
pub async fn plan(spec: &PlanSpec) -> Result<PlanReport, String> {
    let records = crate::trace::read(&spec.traces)?;
    let replay = Arc::new(Replay::new(records));
    let st = stats(&spec.traces, &replay);
    println!(
        "trace: {} requests over {:.1} s ({:.2} requests/s), {} items, {} distinct pairs, {} repeated requests, {} failed",
        st.requests, st.span_s, st.qps, st.items, st.distinct_pairs, st.repeated_requests, st.failed_requests
    );

    let pair_cache = pair::curve(&replay, &spec.cache_sizes, spec.ttl_ms);
    println!("\npair-score cache (the proxy's moka cache replayed, TTL {} ms):", spec.ttl_ms);
    println!("  {:>12} {:>10} {:>12} {:>12} {:>9}", "max_bytes", "entries", "hits", "lookups", "hit rate");
    for p in &pair_cache {
        println!(
            "  {:>12} {:>10} {:>12} {:>12} {:>8.2}%",
            bytes(p.max_bytes),
            p.entries,
            p.hits,
            p.lookups,
            p.hit_rate * 100.0
        );
    }

    let capacity = match &spec.capacity {
        Some(c) => {
            println!("\nworkers for p99 <= {} ms (sim-workers, the trace replayed):", c.p99_ms);
            Some(capacity::plan(replay.clone(), c).await?)
        }
        None => None,
    };
    if let Some(CapacityPlan { workers, .. }) = &capacity {
        match workers {
            Some(n) => println!("  => {n} workers"),
            None => println!("  => not met with the most workers tried"),
        }
    }

    let prefix_workers = spec.prefix_workers.or(capacity.as_ref().and_then(|c| c.workers)).unwrap_or(4);
    let prefix_cache = prefix::curve(&replay, prefix_workers, &spec.prefix_blocks, spec.seed);
    println!(
        "\nprefix cache ({prefix_workers} workers, {}-token blocks, LRU per worker; model, see docs/benchmarks/planner.md):",
        prefix::BLOCK_TOKENS
    );
    println!(
        "  {:>8} {:>8} {:>12} {:>12} {:>9} {:>14}",
        "routing", "blocks", "hits", "lookups", "hit rate", "tokens saved/req"
    );
    for p in &prefix_cache {
        println!(
            "  {:>8} {:>8} {:>12} {:>12} {:>8.2}% {:>14.1}",
            p.routing.key(),
            p.blocks_per_worker,
            p.hits,
            p.lookups,
            p.hit_rate * 100.0,
            p.saved_tokens_per_request
        );
    }

    let mut measured_pair_cache = Vec::new();
    if let Some((env, sizes)) = &spec.measure {
        let workers = spec.prefix_workers.or(capacity.as_ref().and_then(|c| c.workers)).unwrap_or(4);
        println!("\npair-score cache, predicted against a real proxy replaying the trace ({workers} sim-workers):");
        println!(
            "  {:>12} {:>10} {:>10} {:>10} {:>12} {:>10}",
            "max_bytes", "predicted", "measured", "diff pp", "lookups", "complete"
        );
        // The prediction over what the run sends: the trace's first `duration` seconds.
        let sent = replay.truncated(env.duration.as_secs_f64());
        for &b in sizes {
            let predicted = pair::hit_rate(&sent, b, spec.ttl_ms).hit_rate;
            let (trial, counts) = capacity::replay_on_cluster(&replay, env, workers, Some(b)).await?;
            let m = MeasuredPoint {
                max_bytes: b,
                workers,
                predicted,
                measured: counts.hit_rate(),
                hits: counts.hits,
                lookups: counts.hits + counts.misses,
                requests: trial.requests,
                complete: trial.complete,
            };
            println!(
                "  {:>12} {:>9.2}% {:>9.2}% {:>+10.2} {:>12} {:>9.2}%",
                bytes(b),
                m.predicted * 100.0,
                m.measured * 100.0,
                (m.measured - m.predicted) * 100.0,
                m.lookups,
                m.complete * 100.0
            );
            measured_pair_cache.push(m);
        }
    }

    let report = PlanReport {
        trace: st,
        ttl_ms: spec.ttl_ms,
        pair_cache,
        prefix_workers,
        prefix_cache,
        capacity,
        measured_pair_cache,
    };
    let files = write(&spec.out, &report)?;
    println!("\n  report: {}", files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", "));
    Ok(report)
}

fn bytes(b: u64) -> String {
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{} MiB", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

/// `plan.json` and the two curves as SVG and PNG.
pub fn write(dir: &Path, report: &PlanReport) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let json = dir.join("plan.json");
    let text = serde_json::to_string_pretty(report).map_err(|e| e.to_string())?;
    std::fs::write(&json, text).map_err(|e| format!("{}: {e}", json.display()))?;
    let mut files = vec![json];
    let pair = CurveChart {
        title: format!("pair-score cache hit rate ({} requests)", report.trace.requests),
        x_desc: "cache size (MiB)".into(),
        y_desc: "items answered from cache".into(),
        series: vec![(
            "moka replay".into(),
            report.pair_cache.iter().map(|p| (p.max_bytes as f64 / f64::from(1 << 20), p.hit_rate)).collect(),
        )],
    };
    files.extend(plot::save(&pair, &dir.join("pair_cache"))?);
    let series = [Routing::Spread, Routing::Affine]
        .iter()
        .map(|&r| {
            let pts =
                report.prefix_cache.iter().filter(|p| p.routing == r).map(|p| (p.blocks_per_worker as f64, p.hit_rate));
            (format!("{} routing", r.key()), pts.collect())
        })
        .collect();
    let prefix = CurveChart {
        title: format!("prefix-cache hit rate ({} workers)", report.prefix_workers),
        x_desc: "cache blocks per worker (16 tokens each)".into(),
        y_desc: "prefix blocks found".into(),
        series,
    };
    files.extend(plot::save(&prefix, &dir.join("prefix_cache"))?);
    Ok(files)
}
