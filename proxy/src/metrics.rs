//! Metric names (`sieve_proxy_<thing>`) and the Prometheus recorder.
//!
//! The `metrics` facade has one recorder per process by design; it is installed once and every
//! proxy started in the process (tests start several) renders from the same handle.

use std::borrow::Cow;
use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub const REQUESTS: &str = "sieve_proxy_requests_total";
pub const REQUEST_SECONDS: &str = "sieve_proxy_request_seconds";
pub const REQUEST_ITEMS: &str = "sieve_proxy_request_items";
pub const SHARDS_PER_REQUEST: &str = "sieve_proxy_shards_per_request";
pub const SHARD_ITEMS: &str = "sieve_proxy_shard_items";
pub const SHARD_TOKENS: &str = "sieve_proxy_shard_tokens";
pub const SHARD_PREDICTED_SECONDS: &str = "sieve_proxy_shard_predicted_seconds";
pub const SHARD_ACTUAL_SECONDS: &str = "sieve_proxy_shard_actual_seconds";
pub const SHARD_TIME_RATIO: &str = "sieve_proxy_shard_time_ratio";
pub const SHARD_FAILURES: &str = "sieve_proxy_shard_failures_total";
pub const RETRIES: &str = "sieve_proxy_retries_total";
pub const RETRIES_DENIED: &str = "sieve_proxy_retries_denied_total";
pub const HEDGES: &str = "sieve_proxy_hedges_total";
pub const HEDGE_WINS: &str = "sieve_proxy_hedge_wins_total";
pub const HEDGES_DENIED: &str = "sieve_proxy_hedges_denied_total";
pub const PARTIAL_RESPONSES: &str = "sieve_proxy_partial_responses_total";
pub const MISSING_ITEMS: &str = "sieve_proxy_missing_items_total";
pub const BREAKER_TRANSITIONS: &str = "sieve_proxy_breaker_transitions_total";
pub const WORKER_IN_FLIGHT: &str = "sieve_proxy_worker_in_flight_shards";
pub const WORKER_BACKLOG_SECONDS: &str = "sieve_proxy_worker_backlog_seconds";
pub const WORKER_BREAKER_STATE: &str = "sieve_proxy_worker_breaker_state";
pub const WORKER_READY: &str = "sieve_proxy_worker_ready";
pub const WORKER_TIME_FACTOR: &str = "sieve_proxy_worker_time_factor";
pub const WORKERS_ELIGIBLE: &str = "sieve_proxy_workers_eligible";
pub const TOKEN_ESTIMATE_ERROR: &str = "sieve_proxy_token_estimate_relative_error";
/// Requests refused at once (429) because no plan could meet their deadline.
pub const ADMISSION_REJECTED: &str = "sieve_proxy_admission_rejected_total";
/// Requests answered in part (`on_overload: partial`) because no plan could meet the deadline.
pub const ADMISSION_PARTIAL: &str = "sieve_proxy_admission_partial_total";
/// Items left out of those partial plans (never sent).
pub const ADMISSION_DROPPED_ITEMS: &str = "sieve_proxy_admission_dropped_items_total";
pub const CONFIG_RELOADS: &str = "sieve_proxy_config_reloads_total";
/// Pair-score cache: items answered from it, items looked up and not found, scores stored,
/// entries evicted (by size or TTL; a model change empties it without counting here), and the
/// times a model change emptied it.
pub const CACHE_HITS: &str = "sieve_proxy_cache_hits_total";
/// Answers from a worker the proxy took to hold the call's prefix, by outcome (`hit`: the
/// whole prefix came from its prefix cache; `miss`: it did not, and the holding is forgotten).
pub const PREFIX_AFFINITY_CHECKS: &str = "sieve_proxy_prefix_affinity_checks_total";
pub const CACHE_MISSES: &str = "sieve_proxy_cache_misses_total";
pub const CACHE_INSERTS: &str = "sieve_proxy_cache_inserts_total";
pub const CACHE_EVICTIONS: &str = "sieve_proxy_cache_evictions_total";
pub const CACHE_INVALIDATIONS: &str = "sieve_proxy_cache_invalidations_total";
/// Sampled trace records not written (the writer's queue full, or one line over the file bound).
pub const TRACE_DROPPED: &str = "sieve_proxy_trace_dropped_total";

const SECONDS_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0];
const COUNT_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0];
const RATIO_BUCKETS: &[f64] = &[0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0];

/// The `code` label of a status: a static string for every code the API answers, so counting a
/// request allocates nothing (any other code, never sent today, is formatted).
pub fn code_label(status: u16) -> Cow<'static, str> {
    Cow::Borrowed(match status {
        200 => "200",
        400 => "400",
        401 => "401",
        403 => "403",
        404 => "404",
        405 => "405",
        408 => "408",
        413 => "413",
        414 => "414",
        422 => "422",
        429 => "429",
        431 => "431",
        500 => "500",
        503 => "503",
        504 => "504",
        other => return Cow::Owned(other.to_string()),
    })
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
            for name in [REQUEST_ITEMS, SHARDS_PER_REQUEST, SHARD_ITEMS] {
                b = buckets(b, Matcher::Full(name.into()), COUNT_BUCKETS);
            }
            b = buckets(
                b,
                Matcher::Full(SHARD_TOKENS.into()),
                &[256.0, 1024.0, 4096.0, 8192.0, 16384.0, 32768.0, 65536.0, 131072.0],
            );
            b = buckets(
                b,
                Matcher::Full(TOKEN_ESTIMATE_ERROR.into()),
                &[-0.5, -0.25, -0.1, -0.05, 0.0, 0.05, 0.1, 0.25, 0.5],
            );
            let recorder = b.build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics will be empty");
            }
            describe();
            handle
        })
        .clone()
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(REQUESTS, "Requests by route and status code");
    describe_histogram!(REQUEST_SECONDS, "Request latency, arrival to response");
    describe_histogram!(REQUEST_ITEMS, "Items per request");
    describe_histogram!(SHARDS_PER_REQUEST, "Shards a request was split into");
    describe_histogram!(SHARD_ITEMS, "Items per shard");
    describe_histogram!(SHARD_TOKENS, "Estimated tokens per shard");
    describe_histogram!(SHARD_PREDICTED_SECONDS, "Predicted shard time (queue + compute), at dispatch");
    describe_histogram!(SHARD_ACTUAL_SECONDS, "Actual shard time, dispatch to response");
    describe_histogram!(SHARD_TIME_RATIO, "Actual over predicted shard time");
    describe_counter!(SHARD_FAILURES, "Failed shard attempts by kind");
    describe_counter!(RETRIES, "Shard retries sent");
    describe_counter!(RETRIES_DENIED, "Retries not sent (budget, attempts or no worker)");
    describe_counter!(HEDGES, "Hedged shard attempts sent");
    describe_counter!(HEDGE_WINS, "Hedges that answered first");
    describe_counter!(HEDGES_DENIED, "Hedges not sent for lack of budget or an idle worker");
    describe_counter!(PARTIAL_RESPONSES, "Responses with missing items (deadline)");
    describe_counter!(MISSING_ITEMS, "Items left unscored by the deadline");
    describe_counter!(BREAKER_TRANSITIONS, "Circuit breaker transitions by worker and new state");
    describe_gauge!(WORKER_IN_FLIGHT, "Shards in flight per worker");
    describe_gauge!(WORKER_BACKLOG_SECONDS, "Predicted backlog per worker");
    describe_gauge!(WORKER_BREAKER_STATE, "Breaker state per worker: 0 closed, 1 half-open, 2 open");
    describe_gauge!(WORKER_READY, "1 when the worker can take shards");
    describe_gauge!(WORKER_TIME_FACTOR, "Measured time per unit of predicted cost (1 = average worker)");
    describe_gauge!(WORKERS_ELIGIBLE, "Workers that can take shards");
    describe_histogram!(TOKEN_ESTIMATE_ERROR, "(estimated - reported) / reported tokens per item");
    describe_counter!(CONFIG_RELOADS, "Config reloads by outcome");
    describe_counter!(CACHE_HITS, "Items answered from the pair-score cache");
    describe_counter!(PREFIX_AFFINITY_CHECKS, "Answers of workers expected to hold the prefix, by outcome");
    describe_counter!(CACHE_MISSES, "Items looked up in the pair-score cache and not found");
    describe_counter!(CACHE_INSERTS, "Scores stored in the pair-score cache");
    describe_counter!(CACHE_EVICTIONS, "Pair-score cache entries evicted by size or TTL");
    describe_counter!(CACHE_INVALIDATIONS, "Times the pair-score cache was emptied by a change of model");
    describe_counter!(TRACE_DROPPED, "Sampled request-trace records not written");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_labels_are_the_codes_and_static_for_every_api_status() {
        for code in 100..600u16 {
            let label = code_label(code);
            assert_eq!(label, code.to_string());
            let api_status = code == 200 || sieve_shared::ErrorKind::from_status(code).is_some();
            assert_eq!(matches!(label, Cow::Borrowed(_)), api_status, "{code}");
        }
    }
}
