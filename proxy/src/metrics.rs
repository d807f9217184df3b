//! The proxy's metrics: histogram buckets and the Prometheus recorder (each metric's name,
//! kind and HELP text are in `sieve_shared::metrics_names::proxy`).
//!
//! The `metrics` facade has one recorder per process by design; it is installed once and every
//! proxy started in the process (tests start several) renders from the same handle.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use sieve_server::service::{Protocol, Route};
use sieve_shared::metrics_names::{self as names, grpc, http};

// Re-exported so the proxy records them as `metrics::NAME`.
pub use sieve_shared::metrics_names::proxy::*;

const SECONDS_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0];
const COUNT_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0];
const RATIO_BUCKETS: &[f64] = &[0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0];

/// The `code` labels [`REQUESTS`] has from the start, per protocol and route: success and the
/// refusals a dashboard plots (every other code appears at its first answer).
pub const ZERO_CODES: [&str; 6] = ["200", "422", "429", "500", "503", "504"];

/// The `kind` labels of [`SHARD_FAILURES`] (`AttemptError::label`).
pub const SHARD_FAILURE_KINDS: [&str; 8] =
    ["connect", "connection", "bad_response", "not_ready", "overloaded", "deadline", "internal", "client_error"];

/// Every metric described, and every counter with the label sets known up front at zero: a
/// dashboard panel over a counter that had no event yet shows 0, not "No data". (The per-worker
/// series, breaker transitions included, are rendered at each scrape: `render_per_worker`.)
fn describe_and_register_at_zero() {
    names::describe(ALL);
    names::describe(&[http::TIMEOUTS, grpc::TIMEOUTS]);
    names::register_timeouts_at_zero();
    for p in Protocol::ALL {
        for r in Route::ALL {
            for code in ZERO_CODES {
                metrics::counter!(REQUESTS, "protocol" => p.name(), "route" => r.name(), "code" => code).increment(0);
            }
        }
    }
    for kind in SHARD_FAILURE_KINDS {
        metrics::counter!(SHARD_FAILURES, "kind" => kind).increment(0);
    }
    for outcome in ["ok", "error"] {
        metrics::counter!(CONFIG_RELOADS, "outcome" => outcome).increment(0);
    }
    for outcome in ["hit", "miss"] {
        metrics::counter!(PREFIX_AFFINITY_CHECKS, "outcome" => outcome).increment(0);
    }
}

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process's recorder on first use and returns the handle that renders it.
pub fn handle() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            // Bucket lists are non-empty constants, the only thing set_buckets_for_metric rejects.
            let buckets = |b: PrometheusBuilder, m: Matcher, v: &[f64]| {
                b.set_buckets_for_metric(m, v).expect("non-empty buckets")
            };
            let mut b = PrometheusBuilder::new();
            b = buckets(b, Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS);
            b = buckets(b, Matcher::Suffix("_ratio".into()), RATIO_BUCKETS);
            for m in [REQUEST_ITEMS, SHARDS_PER_REQUEST, SHARD_ITEMS] {
                b = buckets(b, Matcher::Full(m.name.into()), COUNT_BUCKETS);
            }
            b = buckets(
                b,
                Matcher::Full(SHARD_TOKENS.name.into()),
                &[256.0, 1024.0, 4096.0, 8192.0, 16384.0, 32768.0, 65536.0, 131072.0],
            );
            b = buckets(
                b,
                Matcher::Full(TOKEN_ESTIMATE_ERROR.name.into()),
                &[-0.5, -0.25, -0.1, -0.05, 0.0, 0.05, 0.1, 0.25, 0.5],
            );
            let recorder = b.build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics will be empty");
            }
            describe_and_register_at_zero();
            handle
        })
        .clone()
}

/// Renders what `record` emits into a recorder of its own, built for this call: the per-worker
/// series, which must not go to the process's recorder. The `metrics` facade cannot forget a
/// series, so a worker that discovery or a reload removed would be reported there for ever
/// with its last values, and every worker address ever seen (pods get new ones at each
/// rollout) would stay in memory and in every scrape. Rendered from the pool as it is at the
/// scrape, the series are exactly the pool's workers.
pub fn render_per_worker(record: impl FnOnce()) -> String {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        names::describe(PER_WORKER);
        record();
    });
    handle.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the series `line_start` (name and labels) in the rendered metrics; 0 if absent.
    fn value(text: &str, line_start: &str) -> f64 {
        text.lines().find_map(|l| l.strip_prefix(line_start)?.trim().parse().ok()).unwrap_or(0.0)
    }

    #[test]
    fn the_installed_recorder_describes_every_metric_and_counts_from_zero() {
        let h = handle();
        let before = h.render();
        // Registered from the start (at zero, unless another test of this process counted).
        let series = format!("{REQUESTS}{{protocol=\"http\",route=\"score\",code=\"504\"}} ");
        assert!(before.lines().any(|l| l.starts_with(&series)), "{before}");
        assert!(before.lines().any(|l| l.starts_with(&format!("{HEDGES} "))), "{before}");
        let miss = format!("{PREFIX_AFFINITY_CHECKS}{{outcome=\"miss\"}}");
        metrics::counter!(PREFIX_AFFINITY_CHECKS, "outcome" => "miss").increment(3);
        let after = h.render();
        assert_eq!(value(&after, &miss) - value(&before, &miss), 3.0, "{after}");
        for m in ALL.iter().filter(|m| m.kind == names::Kind::Counter) {
            assert!(after.contains(&format!("# HELP {} {}\n# TYPE {} counter", m.name, m.help, m.name)), "{after}");
        }
    }
}
