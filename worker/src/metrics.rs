//! The worker's Prometheus recorder: every family described (HELP), latencies as histograms
//! with buckets for 1 ms to 10 s, and every counter with the label sets known up front
//! registered at zero, so a dashboard reads a series from the first scrape (the names,
//! `sieve_worker_<thing>`, are in `sieve_shared::metrics_names`).
//!
//! Seconds counted as `f64` (the runner's busy time, the MoE layers' time) are counters, but
//! the `metrics` facade's counters are whole numbers: they are written at the scrape
//! (`metrics_names::write_values`), as the engine's running totals.

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use sieve_server::service::{Protocol, Route};
use sieve_shared::metrics_names::{self as names, grpc, http, worker as m, worker_moe as moe};

/// Latency buckets: 1 ms to 10 s, about three per decade.
pub const SECONDS_BUCKETS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
/// Rows (tokens) of a forward pass.
const ROWS_BUCKETS: &[f64] = &[16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0];

/// The `status` labels [`m::REQUESTS`] has from the start per protocol and route; the error
/// statuses of [`m::REQUEST_ERRORS`] likewise (any other appears at its first answer).
const ZERO_STATUSES: [&str; 6] = ["200", "422", "429", "500", "503", "504"];

/// The recorder with the worker's buckets, not yet installed.
pub fn builder() -> Result<PrometheusBuilder, BuildError> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(m::BATCH_TOKENS.name.into()), ROWS_BUCKETS)
}

/// Installs the process's recorder, describes every family and registers the counters at zero.
pub fn install() -> Result<PrometheusHandle, BuildError> {
    let handle = builder()?.install_recorder()?;
    describe_and_register_at_zero();
    Ok(handle)
}

/// Every family the worker exports described (HELP), and every counter with its known label
/// sets at zero.
pub fn describe_and_register_at_zero() {
    names::describe(m::ALL);
    names::describe(moe::ALL);
    names::describe(&[http::TIMEOUTS, grpc::TIMEOUTS]);
    names::register_timeouts_at_zero();
    for p in Protocol::ALL {
        for r in Route::ALL {
            for status in ZERO_STATUSES {
                let (p, r) = (p.name(), r.name());
                metrics::counter!(m::REQUESTS, "protocol" => p, "route" => r, "status" => status).increment(0);
                if status != "200" {
                    metrics::counter!(m::REQUEST_ERRORS, "protocol" => p, "route" => r, "status" => status)
                        .increment(0);
                }
            }
        }
    }
    for stage in ["queued", "running"] {
        metrics::counter!(m::CALLS_EXPIRED, "stage" => stage).increment(0);
        metrics::counter!(m::CALLS_CANCELLED, "stage" => stage).increment(0);
    }
    for scope in ["in_batch", "cross_batch"] {
        metrics::counter!(m::PREFIX_TOKENS_REUSED, "scope" => scope).increment(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_are_histograms_with_the_buckets_and_counters_start_at_zero() {
        let recorder = builder().unwrap().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            describe_and_register_at_zero();
            metrics::histogram!(m::QUEUE_SECONDS).record(0.003);
        });
        let mut text = handle.render();
        names::write_values(&mut text, &[(m::RUNNER_BUSY_SECONDS, 1.5)]);
        assert!(text.contains(&format!("# TYPE {} histogram", m::QUEUE_SECONDS)), "{text}");
        assert!(text.contains(&format!("{}_bucket{{le=\"0.0025\"}} 0", m::QUEUE_SECONDS)), "{text}");
        assert!(text.contains(&format!("{}_bucket{{le=\"0.005\"}} 1", m::QUEUE_SECONDS)), "{text}");
        assert!(!text.contains("quantile"), "no summaries: {text}");
        let zero = format!("{}{{protocol=\"grpc\",route=\"score\",status=\"504\"}} 0", m::REQUEST_ERRORS);
        assert!(text.lines().any(|l| l == zero), "{text}");
        assert!(text.lines().any(|l| l == format!("{}{{stage=\"queued\"}} 0", m::CALLS_EXPIRED)), "{text}");
        assert!(text.contains(&format!("# TYPE {} counter\n{} 1.5\n", m::RUNNER_BUSY_SECONDS, m::RUNNER_BUSY_SECONDS)));
        // Every family has its HELP line.
        for l in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
            let name = l.split(' ').next().unwrap();
            assert!(text.contains(&format!("# HELP {name} ")), "{name} has no HELP: {text}");
        }
    }
}
