//! The worker's Prometheus recorder: every family described (HELP), latencies as histograms
//! with buckets for 1 ms to 10 s, and every counter with the label sets known up front
//! registered at zero, so a dashboard reads a series from the first scrape (the names,
//! `sieve_worker_<thing>`, are in `sieve_shared::metrics_names`).
//!
//! Seconds counted as `f64` (the runner's busy time, the MoE layers' time) are counters, but
//! the `metrics` facade's counters are whole numbers: they are written at the scrape by
//! [`write_seconds_counters`], as the engine's running totals.

use metrics::{describe_counter, describe_gauge, describe_histogram};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use sieve_server::service::{Protocol, Route};
use sieve_shared::metrics_names::{grpc, http, worker as m, worker_moe as moe};

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
        .set_buckets_for_metric(Matcher::Full(m::BATCH_TOKENS.into()), ROWS_BUCKETS)
}

/// Installs the process's recorder, describes every family and registers the counters at zero.
pub fn install() -> Result<PrometheusHandle, BuildError> {
    let handle = builder()?.install_recorder()?;
    describe();
    register_at_zero();
    Ok(handle)
}

/// HELP text of every family the worker exports.
pub fn describe() {
    describe_counter!(m::REQUESTS, "Requests answered, by protocol (http, grpc), route and status code");
    describe_counter!(m::REQUEST_ERRORS, "Requests answered with an error status, by protocol, route and status");
    describe_histogram!(m::REQUEST_SECONDS, "Request latency, arrival to answer, by protocol and route");
    describe_histogram!(m::QUEUE_SECONDS, "Time a call waited in the engine's queue before its first pass");
    describe_histogram!(m::FORWARD_SECONDS, "Forward-pass time");
    describe_histogram!(m::BATCH_TOKENS, "Rows (tokens) of a forward pass");
    describe_histogram!(m::RUNNER_IDLE_SECONDS, "Each wait of the runner for its next batch");
    describe_gauge!(m::IN_FLIGHT, "Calls in the engine now");
    describe_gauge!(m::QUEUED_PAIRS, "Pairs queued and not yet scored");
    describe_counter!(m::PAIRS, "Pairs scored");
    describe_counter!(m::TOKENS_COMPUTED, "Tokens run through the model (prefix reuse excluded)");
    describe_counter!(m::PROMPT_TOKENS, "Prompt tokens of the scored pairs, reused prefix included");
    describe_gauge!(m::KV_BLOCKS_USED, "KV-cache blocks in use");
    describe_gauge!(m::KV_BLOCKS_FREE, "KV-cache blocks free");
    describe_counter!(m::PASSES_ABANDONED, "Forward passes stopped between layers: no live call needed them");
    describe_counter!(m::ROWS_ABANDONED, "Rows (tokens) of the abandoned passes");
    describe_counter!(m::CALLS_EXPIRED, "Calls whose deadline passed before every item was scored, by stage");
    describe_counter!(m::CALLS_CANCELLED, "Calls whose caller went away before the answer, by stage");
    describe_counter!(m::PARTIAL_ANSWERS, "Calls answered at their deadline with some items missing");
    describe_counter!(m::NONFINITE_SCORES, "Scores that came out NaN or infinite (their calls answered 500)");
    describe_gauge!(m::READY, "1 when the worker takes calls (model loaded, not draining)");
    describe_gauge!(m::PREFIX_BLOCKS_PENDING, "Prefix-cache blocks pending (their batch not yet committed)");
    describe_gauge!(m::PREFIX_BLOCKS_COMMITTED, "Prefix-cache blocks committed (visible to every batch)");
    describe_gauge!(m::PREFIX_BLOCKS_FREE, "Prefix-cache blocks free");
    describe_counter!(m::PREFIX_LOOKUPS, "Prefix-cache lookups");
    describe_counter!(m::PREFIX_HITS, "Prefix-cache lookups that found blocks");
    describe_counter!(m::PREFIX_ROLLBACKS, "Batch epochs rolled back (their pending blocks freed)");
    describe_counter!(m::PREFIX_EVICTED_BLOCKS, "Committed prefix blocks evicted");
    describe_counter!(m::PREFIX_TOKENS_COMPUTED, "Prefix tokens run through the model");
    describe_counter!(m::PREFIX_TOKENS_REUSED, "Prefix tokens reused instead of computed, by scope");
    describe_counter!(m::BATCH_FAILURES, "Batches that failed as a whole (forward error or panic)");
    describe_counter!(m::BUFFER_REFUSALS, "Requests refused because their bytes did not fit in max_buffered_bytes");
    describe_gauge!(m::BUFFERED_BYTES, "Request bytes held in memory (HTTP bodies and gRPC messages)");
    describe_counter!(moe::SELECTIONS, "MoE layer calls that ran each kernel variant");
    describe_counter!(moe::ROWS, "MoE rows: real token-expert assignments and padded rows computed");
    describe_gauge!(moe::TIME_SHARE, "MoE seconds over forward seconds since start");
    describe_counter!(http::TIMEOUTS, "HTTP/1 connections ended by a timer (send, evicted)");
    describe_counter!(grpc::TIMEOUTS, "gRPC connections or calls ended by a timer");
}

/// Every counter with its known label sets, at zero.
pub fn register_at_zero() {
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
    for name in [
        m::PAIRS,
        m::TOKENS_COMPUTED,
        m::PROMPT_TOKENS,
        m::PASSES_ABANDONED,
        m::ROWS_ABANDONED,
        m::PARTIAL_ANSWERS,
        m::NONFINITE_SCORES,
        m::PREFIX_LOOKUPS,
        m::PREFIX_HITS,
        m::PREFIX_ROLLBACKS,
        m::PREFIX_EVICTED_BLOCKS,
        m::PREFIX_TOKENS_COMPUTED,
        m::BATCH_FAILURES,
        m::BUFFER_REFUSALS,
    ] {
        metrics::counter!(name).increment(0);
    }
    for stage in ["queued", "running"] {
        metrics::counter!(m::CALLS_EXPIRED, "stage" => stage).increment(0);
        metrics::counter!(m::CALLS_CANCELLED, "stage" => stage).increment(0);
    }
    for scope in ["in_batch", "cross_batch"] {
        metrics::counter!(m::PREFIX_TOKENS_REUSED, "scope" => scope).increment(0);
    }
    for timer in http::TIMER_LABELS {
        metrics::counter!(http::TIMEOUTS, "timer" => *timer).increment(0);
    }
    for timer in grpc::TIMER_LABELS {
        metrics::counter!(grpc::TIMEOUTS, "timer" => *timer).increment(0);
    }
}

/// Writes counters of seconds (running `f64` totals) in the exposition format, each with its
/// HELP and TYPE lines.
pub fn write_seconds_counters(out: &mut String, counters: &[(&str, &str, f64)]) {
    use std::fmt::Write as _;
    for (name, help, value) in counters {
        let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}\n\n");
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
            describe();
            register_at_zero();
            metrics::histogram!(m::QUEUE_SECONDS).record(0.003);
        });
        let mut text = handle.render();
        write_seconds_counters(&mut text, &[(m::RUNNER_BUSY_SECONDS, "busy", 1.5)]);
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
