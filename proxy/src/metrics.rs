//! The proxy's metrics: descriptions, histogram buckets and the Prometheus recorder (the
//! names, `sieve_proxy_<thing>`, are in `sieve_shared::metrics_names::proxy`).
//!
//! The `metrics` facade has one recorder per process by design; it is installed once and every
//! proxy started in the process (tests start several) renders from the same handle.

use std::borrow::Cow;
use std::sync::OnceLock;

use metrics::{Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use sieve_server::service::{Protocol, Route};

// The names live with every other process's (`sieve_shared::metrics_names`); re-exported so
// the proxy records them as `metrics::NAME`.
pub use sieve_shared::metrics_names::proxy::*;

const SECONDS_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0];
const COUNT_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0];
const RATIO_BUCKETS: &[f64] = &[0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0];

/// Every status the API answers, with its `code` label.
const API_CODES: [(u16, &str); 16] = [
    (200, "200"),
    (400, "400"),
    (401, "401"),
    (403, "403"),
    (404, "404"),
    (405, "405"),
    (408, "408"),
    (413, "413"),
    (414, "414"),
    (415, "415"),
    (422, "422"),
    (429, "429"),
    (431, "431"),
    (500, "500"),
    (503, "503"),
    (504, "504"),
];

/// The `code` label of a status: a static string for every code the API answers, so counting a
/// request allocates nothing (any other code, never sent today, is formatted).
pub fn code_label(status: u16) -> Cow<'static, str> {
    match API_CODES.iter().find(|(c, _)| *c == status) {
        Some((_, label)) => Cow::Borrowed(label),
        None => Cow::Owned(status.to_string()),
    }
}

// Handles of the metrics recorded on every request, each registered on its first use and kept.
// The `metrics` macros look a metric up by its key on every call (a hash and a lock) and wrap
// the handle in a new `Arc` (an allocation): ~10 of each per request before. Kept on first use
// (the counters among them are registered at zero up front, `register_at_zero`); `handle()`
// first, so the handle is the installed recorder's, never a no-op one.
macro_rules! kept_histograms {
    ($($(#[$doc:meta])* $f:ident => $name:expr;)*) => {$(
        $(#[$doc])*
        pub fn $f() -> &'static Histogram {
            static KEPT: OnceLock<Histogram> = OnceLock::new();
            KEPT.get_or_init(|| {
                let _ = handle();
                metrics::histogram!($name)
            })
        }
    )*};
}

kept_histograms! {
    /// [`REQUEST_ITEMS`]
    request_items => REQUEST_ITEMS;
    /// [`SHARDS_PER_REQUEST`]
    shards_per_request => SHARDS_PER_REQUEST;
    /// [`SHARD_ITEMS`]
    shard_items => SHARD_ITEMS;
    /// [`SHARD_TOKENS`]
    shard_tokens => SHARD_TOKENS;
    /// [`SHARD_PREDICTED_SECONDS`]
    shard_predicted_seconds => SHARD_PREDICTED_SECONDS;
    /// [`SHARD_ACTUAL_SECONDS`]
    shard_actual_seconds => SHARD_ACTUAL_SECONDS;
    /// [`SHARD_TIME_RATIO`]
    shard_time_ratio => SHARD_TIME_RATIO;
    /// [`TOKEN_ESTIMATE_ERROR`]
    token_estimate_error => TOKEN_ESTIMATE_ERROR;
}

/// [`PREFIX_AFFINITY_CHECKS`] with `outcome` = `hit` or `miss`, kept as the histograms above.
pub fn prefix_affinity_check(hit: bool) -> &'static Counter {
    static KEPT: [OnceLock<Counter>; 2] = [const { OnceLock::new() }; 2];
    KEPT[usize::from(hit)].get_or_init(|| {
        let _ = handle();
        metrics::counter!(PREFIX_AFFINITY_CHECKS, "outcome" => if hit { "hit" } else { "miss" })
    })
}

/// One answered request: [`REQUESTS`] by protocol, route and code, [`REQUEST_SECONDS`] by
/// protocol and route, with handles kept per label set (a code the API never answers is counted
/// through the macro).
pub fn observe_request(protocol: Protocol, route: Route, status: u16, elapsed_secs: f64) {
    const P: usize = Protocol::ALL.len();
    const R: usize = Route::ALL.len();
    static SECONDS: [[OnceLock<Histogram>; R]; P] = [const { [const { OnceLock::new() }; R] }; P];
    static COUNTS: [[[OnceLock<Counter>; API_CODES.len()]; R]; P] =
        [const { [const { [const { OnceLock::new() }; API_CODES.len()] }; R] }; P];
    let p = Protocol::ALL.iter().position(|&x| x == protocol).unwrap_or(0);
    let r = Route::ALL.iter().position(|&x| x == route).unwrap_or(0);
    match API_CODES.iter().position(|(c, _)| *c == status) {
        Some(c) => COUNTS[p][r][c]
            .get_or_init(|| {
                let _ = handle();
                requests(protocol, route, API_CODES[c].1)
            })
            .increment(1),
        None => metrics::counter!(
            REQUESTS, "protocol" => protocol.name(), "route" => route.name(), "code" => code_label(status)
        )
        .increment(1),
    }
    SECONDS[p][r]
        .get_or_init(|| {
            let _ = handle();
            metrics::histogram!(REQUEST_SECONDS, "protocol" => protocol.name(), "route" => route.name())
        })
        .record(elapsed_secs);
}

/// [`REQUESTS`] of one label set, from the recorder installed now (called by `handle()`'s own
/// initialisation, so it must not call `handle()`).
fn requests(protocol: Protocol, route: Route, code: &'static str) -> Counter {
    metrics::counter!(REQUESTS, "protocol" => protocol.name(), "route" => route.name(), "code" => code)
}

/// The `code` labels [`REQUESTS`] has from the start, per protocol and route: success and the
/// refusals a dashboard plots (every other code appears at its first answer).
pub const ZERO_CODES: [&str; 6] = ["200", "422", "429", "500", "503", "504"];

/// Every counter of the process's recorder with the label sets known up front, at zero: a
/// dashboard panel over a counter that had no event yet shows 0, not "No data". (The per-worker
/// series, breaker transitions included, are rendered at each scrape: `render_per_worker`.)
fn register_at_zero() {
    for p in Protocol::ALL {
        for r in Route::ALL {
            for code in ZERO_CODES {
                requests(p, r, code).increment(0);
            }
        }
    }
    for name in [
        RETRIES,
        RETRIES_DENIED,
        HEDGES,
        HEDGE_WINS,
        HEDGES_DENIED,
        PARTIAL_RESPONSES,
        MISSING_ITEMS,
        ADMISSION_REJECTED,
        ADMISSION_PARTIAL,
        ADMISSION_DROPPED_ITEMS,
        CACHE_HITS,
        CACHE_MISSES,
        CACHE_INSERTS,
        CACHE_EVICTIONS,
        CACHE_INVALIDATIONS,
        TRACE_DROPPED,
        BUFFER_REFUSALS,
    ] {
        metrics::counter!(name).increment(0);
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
    let timers = sieve_shared::metrics_names::http::TIMER_LABELS;
    for timer in timers {
        metrics::counter!(sieve_shared::metrics_names::http::TIMEOUTS, "timer" => *timer).increment(0);
    }
    for timer in sieve_shared::metrics_names::grpc::TIMER_LABELS {
        metrics::counter!(sieve_shared::metrics_names::grpc::TIMEOUTS, "timer" => *timer).increment(0);
    }
}

/// The `kind` labels of [`SHARD_FAILURES`] (`AttemptError::label`).
pub const SHARD_FAILURE_KINDS: [&str; 8] =
    ["connect", "connection", "bad_response", "not_ready", "overloaded", "deadline", "internal", "client_error"];

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
            register_at_zero();
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
    use metrics::{describe_counter, describe_gauge};
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        describe_counter!(BREAKER_TRANSITIONS, "Circuit breaker transitions by worker and new state");
        describe_gauge!(WORKER_IN_FLIGHT, "Shards in flight per worker");
        describe_gauge!(WORKER_BACKLOG_SECONDS, "Predicted backlog per worker");
        describe_gauge!(WORKER_BREAKER_STATE, "Breaker state per worker: 0 closed, 1 half-open, 2 open");
        describe_gauge!(WORKER_READY, "1 when the worker can take shards");
        describe_gauge!(WORKER_TIME_FACTOR, "Measured time per unit of predicted cost (1 = average worker)");
        record();
    });
    handle.render()
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(REQUESTS, "Requests answered, by protocol (http, grpc), route and status code");
    describe_histogram!(REQUEST_SECONDS, "Request latency, arrival to response, by protocol and route");
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
    describe_gauge!(WORKERS_ELIGIBLE, "Workers that can take shards");
    describe_counter!(ADMISSION_REJECTED, "Requests refused at once (429): no plan could meet their deadline");
    describe_counter!(
        ADMISSION_PARTIAL,
        "Requests answered in part (on_overload: partial): no plan could meet their deadline"
    );
    describe_counter!(ADMISSION_DROPPED_ITEMS, "Items left out of admission's partial plans (never sent)");
    describe_histogram!(TOKEN_ESTIMATE_ERROR, "(estimated - reported) / reported tokens per item");
    describe_counter!(CONFIG_RELOADS, "Config reloads by outcome");
    describe_counter!(CACHE_HITS, "Items answered from the pair-score cache");
    describe_counter!(PREFIX_AFFINITY_CHECKS, "Answers of workers expected to hold the prefix, by outcome");
    describe_counter!(CACHE_MISSES, "Items looked up in the pair-score cache and not found");
    describe_counter!(CACHE_INSERTS, "Scores stored in the pair-score cache");
    describe_counter!(CACHE_EVICTIONS, "Pair-score cache entries evicted by size or TTL");
    describe_counter!(CACHE_INVALIDATIONS, "Times the pair-score cache was emptied by a change of model");
    describe_counter!(TRACE_DROPPED, "Sampled request-trace records not written");
    describe_counter!(BUFFER_REFUSALS, "Requests refused because their bytes did not fit in max_buffered_bytes");
    describe_gauge!(BUFFERED_BYTES, "Request bytes held in memory (HTTP bodies and gRPC messages)");
    // The transport's own, named for any process (`sieve_shared::metrics_names`).
    describe_counter!(
        sieve_shared::metrics_names::http::TIMEOUTS,
        "HTTP/1 connections ended by a timer (send: the client took no bytes of an answer for send_timeout_ms)"
    );
    describe_counter!(
        sieve_shared::metrics_names::grpc::TIMEOUTS,
        "gRPC connections or calls ended by a timer: header, idle, send (socket), send_stream (flow-control window shut)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the series `line_start` (name and labels) in the rendered metrics; 0 if absent.
    fn value(text: &str, line_start: &str) -> f64 {
        text.lines().find_map(|l| l.strip_prefix(line_start)?.trim().parse().ok()).unwrap_or(0.0)
    }

    #[test]
    fn kept_handles_record_into_the_installed_recorder() {
        let h = handle();
        let counted = |text: &str, code: &str| {
            value(text, &format!("{REQUESTS}{{protocol=\"grpc\",route=\"vllm_score\",code=\"{code}\"}}"))
        };
        let seconds =
            |text: &str| value(text, &format!("{REQUEST_SECONDS}_count{{protocol=\"grpc\",route=\"vllm_score\"}}"));
        let before = h.render();
        // Registered from the start (at zero, unless another test of this process counted).
        let series = format!("{REQUESTS}{{protocol=\"http\",route=\"score\",code=\"504\"}} ");
        assert!(before.lines().any(|l| l.starts_with(&series)), "{before}");
        assert!(before.lines().any(|l| l.starts_with(&format!("{HEDGES} "))), "{before}");
        observe_request(Protocol::Grpc, Route::VllmScore, 431, 0.5);
        observe_request(Protocol::Grpc, Route::VllmScore, 431, 0.25);
        // A code the API never answers: counted all the same.
        observe_request(Protocol::Grpc, Route::VllmScore, 299, 0.5);
        prefix_affinity_check(false).increment(3);
        let after = h.render();
        assert_eq!(counted(&after, "431") - counted(&before, "431"), 2.0, "{after}");
        assert_eq!(counted(&after, "299") - counted(&before, "299"), 1.0, "{after}");
        assert_eq!(seconds(&after) - seconds(&before), 3.0, "{after}");
        let miss = format!("{PREFIX_AFFINITY_CHECKS}{{outcome=\"miss\"}}");
        assert_eq!(value(&after, &miss) - value(&before, &miss), 3.0, "{after}");
    }

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
