//! Every metric, `sieve_<crate>_<thing>`, defined once: its name, kind, labels and HELP text, so
//! dashboards, tests and each process's `/metrics` page agree. A process describes its list
//! (`ALL`) with [`describe`], which also registers its label-less counters at zero; the
//! `metrics` macros take a [`Metric`] where they take a name (`metrics::counter!(m::PAIRS)`).

use std::fmt;

/// What a metric is on the exposition page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    /// The `# TYPE` word.
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric: name, kind, label names and HELP text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Metric {
    pub name: &'static str,
    pub kind: Kind,
    /// Label names of its series (none: one series, a counter of them registered at zero).
    pub labels: &'static [&'static str],
    pub help: &'static str,
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// The `metrics` macros take anything `Into<KeyName>`, which this gives a [`Metric`].
impl From<Metric> for metrics::SharedString {
    fn from(m: Metric) -> Self {
        metrics::SharedString::const_str(m.name)
    }
}

/// Describes (HELP and type) every metric of `list` in the current recorder, and registers the
/// label-less counters at zero, so a dashboard reads them from the first scrape.
pub fn describe(list: &[Metric]) {
    for m in list {
        match m.kind {
            Kind::Counter => {
                metrics::describe_counter!(*m, m.help);
                if m.labels.is_empty() {
                    metrics::counter!(*m).increment(0);
                }
            }
            Kind::Gauge => metrics::describe_gauge!(*m, m.help),
            Kind::Histogram => metrics::describe_histogram!(*m, m.help),
        }
    }
}

/// `NAME: Kind("name", ["label", ...], "help");` lines: a `pub const NAME: Metric` each, and
/// `pub const $list: &[Metric]` of them all.
macro_rules! define {
    ($list:ident { $($(#[$doc:meta])* $c:ident: $kind:ident($name:literal $(, [$($l:literal),*])?, $help:literal);)* }) => {
        $($(#[$doc])* pub const $c: $crate::metrics_names::Metric = $crate::metrics_names::Metric {
            name: $name,
            kind: $crate::metrics_names::Kind::$kind,
            labels: &[$($($l),*)?],
            help: $help,
        };)*
        /// Every metric of this group.
        pub const $list: &[$crate::metrics_names::Metric] = &[$($c),*];
    };
}

pub mod worker {
    define! { ALL {
        REQUESTS: Counter("sieve_worker_requests_total", ["protocol", "route", "status"],
            "Requests answered, by protocol (http, grpc), route and status code");
        REQUEST_ERRORS: Counter("sieve_worker_request_errors_total", ["protocol", "route", "status"],
            "Requests answered with an error status, by protocol, route and status");
        REQUEST_SECONDS: Histogram("sieve_worker_request_seconds", ["protocol", "route"],
            "Request latency, arrival to answer, by protocol and route");
        QUEUE_SECONDS: Histogram("sieve_worker_queue_seconds",
            "Time a call waited in the engine's queue before its first pass");
        FORWARD_SECONDS: Histogram("sieve_worker_forward_seconds", "Forward-pass time");
        TOKENIZE_SECONDS: Histogram("sieve_worker_tokenize_seconds",
            "Time to tokenize a call's prompts (part of its queue time)");
        IN_FLIGHT: Gauge("sieve_worker_in_flight_requests", "Calls in the engine now");
        QUEUED_PAIRS: Gauge("sieve_worker_queued_pairs", "Pairs queued and not yet scored");
        PAIRS: Counter("sieve_worker_pairs_total", "Pairs scored");
        TOKENS_COMPUTED: Counter("sieve_worker_tokens_computed_total",
            "Tokens run through the model (prefix reuse excluded)");
        PROMPT_TOKENS: Counter("sieve_worker_prompt_tokens_total",
            "Prompt tokens of the scored pairs, reused prefix included");
        KV_BLOCKS_USED: Gauge("sieve_worker_kv_blocks_used", "KV-cache blocks in use");
        KV_BLOCKS_FREE: Gauge("sieve_worker_kv_blocks_free", "KV-cache blocks free");
        BATCH_TOKENS: Histogram("sieve_worker_batch_tokens", "Rows (tokens) of a forward pass");
        PASSES_ABANDONED: Counter("sieve_worker_passes_abandoned_total",
            "Forward passes stopped between layers: no live call needed them");
        ROWS_ABANDONED: Counter("sieve_worker_abandoned_rows_total", "Rows (tokens) of the abandoned passes");
        /// `stage` = `queued` | `running` (running: answered partially or 504 within about a
        /// layer's time).
        CALLS_EXPIRED: Counter("sieve_worker_calls_expired_total", ["stage"],
            "Calls whose deadline passed before every item was scored, by stage");
        CALLS_CANCELLED: Counter("sieve_worker_calls_cancelled_total", ["stage"],
            "Calls whose caller went away before the answer, by stage");
        PARTIAL_ANSWERS: Counter("sieve_worker_partial_answers_total",
            "Calls answered at their deadline with some items missing");
        NONFINITE_SCORES: Counter("sieve_worker_nonfinite_scores_total",
            "Scores that came out NaN or infinite (their calls answered 500)");
        READY: Gauge("sieve_worker_ready", "1 when the worker takes calls (model loaded, not draining)");
        PREFIX_BLOCKS_PENDING: Gauge("sieve_worker_prefix_blocks_pending",
            "Prefix-cache blocks pending (their batch not yet committed)");
        PREFIX_BLOCKS_COMMITTED: Gauge("sieve_worker_prefix_blocks_committed",
            "Prefix-cache blocks committed (visible to every batch)");
        PREFIX_BLOCKS_FREE: Gauge("sieve_worker_prefix_blocks_free", "Prefix-cache blocks free");
        PREFIX_LOOKUPS: Counter("sieve_worker_prefix_lookups_total", "Prefix-cache lookups");
        PREFIX_HITS: Counter("sieve_worker_prefix_hits_total", "Prefix-cache lookups that found blocks");
        PREFIX_ROLLBACKS: Counter("sieve_worker_prefix_rollbacks_total",
            "Batch epochs rolled back (their pending blocks freed)");
        PREFIX_EVICTED_BLOCKS: Counter("sieve_worker_prefix_evicted_blocks_total", "Committed prefix blocks evicted");
        PREFIX_TOKENS_COMPUTED: Counter("sieve_worker_prefix_tokens_computed_total",
            "Prefix tokens run through the model");
        /// `scope` = `in_batch` | `cross_batch`.
        PREFIX_TOKENS_REUSED: Counter("sieve_worker_prefix_tokens_reused_total", ["scope"],
            "Prefix tokens reused instead of computed, by scope");
        RUNNER_IDLE_SECONDS: Histogram("sieve_worker_runner_idle_seconds",
            "Each wait of the runner for its next batch");
        BATCH_FAILURES: Counter("sieve_worker_batch_failures_total",
            "Batches that failed as a whole (forward error or panic)");
        /// Requests refused (HTTP 503, gRPC RESOURCE_EXHAUSTED): their bytes did not fit in
        /// `[http] max_buffered_bytes`.
        BUFFER_REFUSALS: Counter("sieve_worker_buffer_refusals_total",
            "Requests refused because their bytes did not fit in max_buffered_bytes");
        BUFFERED_BYTES: Gauge("sieve_worker_buffered_bytes",
            "Request bytes held in memory (HTTP bodies and gRPC messages)");
    }}
    // Counters of seconds, `f64` running totals written at the scrape (`write_values`).
    define! { WRITTEN {
        RUNNER_BUSY_SECONDS: Counter("sieve_worker_runner_busy_seconds_total", "Seconds the runner computed");
        RUNNER_IDLE_WITH_WORK_SECONDS: Counter("sieve_worker_runner_idle_with_work_seconds_total",
            "Seconds the runner waited for a batch while work was queued");
    }}
}

/// The HTTP/1 ports of any process (API and admin; proxy, worker, simulated worker).
pub mod http {
    define! { ALL {
        /// `timer` = `send` (an answer's bytes made no progress for `[http] send_timeout_ms`, the
        /// client stopped reading: connection closed) | `evicted` (idle, closed for a new
        /// connection at `max_connections`).
        TIMEOUTS: Counter("sieve_http_timeouts_total", ["timer"],
            "HTTP/1 connections ended by a timer (send: the client took no bytes of an answer for send_timeout_ms)");
    }}
    /// Every `timer` label of [`TIMEOUTS`].
    pub const TIMER_LABELS: &[&str] = &["send", "evicted"];
}

/// The gRPC port of any process (proxy, worker, simulated worker).
pub mod grpc {
    define! { ALL {
        /// `timer` = `header` (no HTTP/2 preface in time) | `idle` (no call for `idle_timeout_ms`)
        /// | `send` (the socket took no bytes for `send_timeout_ms`) | `send_stream` (an answer not
        /// taken within `send_timeout_ms`, the client's flow-control window shut) | `evicted` (no
        /// call, closed for a new connection at `max_connections`); each closes the connection.
        TIMEOUTS: Counter("sieve_grpc_timeouts_total", ["timer"],
            "gRPC connections or calls ended by a timer: header, idle, send (socket), send_stream (flow-control window shut)");
    }}
    /// Every `timer` label of [`TIMEOUTS`].
    pub const TIMER_LABELS: &[&str] = &["header", "idle", "send", "send_stream", "evicted"];
}

/// Both transports' timer counters, with every `timer` label at zero.
pub fn register_timeouts_at_zero() {
    for timer in http::TIMER_LABELS {
        metrics::counter!(http::TIMEOUTS, "timer" => *timer).increment(0);
    }
    for timer in grpc::TIMER_LABELS {
        metrics::counter!(grpc::TIMEOUTS, "timer" => *timer).increment(0);
    }
}

/// MoE layers of a worker (per-variant selections, rows, time share).
pub mod worker_moe {
    define! { ALL {
        SELECTIONS: Counter("sieve_worker_moe_selections_total", ["variant"],
            "MoE layer calls that ran each kernel variant");
        /// `kind` = `real` (token-expert assignments) | `padded` (rows computed).
        ROWS: Counter("sieve_worker_moe_rows_total", ["kind"],
            "MoE rows: real token-expert assignments and padded rows computed");
        TIME_SHARE: Gauge("sieve_worker_moe_time_share", "MoE seconds over forward seconds since start");
    }}
    // Counters of seconds, `f64` running totals written at the scrape (`write_values`).
    define! { WRITTEN {
        SECONDS: Counter("sieve_worker_moe_seconds_total", "Seconds inside MoE layers");
        FORWARD_SECONDS: Counter("sieve_worker_moe_forward_seconds_total",
            "Seconds of the forward passes that ran MoE layers");
    }}
}

/// The proxy (`proxy/src/metrics.rs` holds the histogram buckets).
pub mod proxy {
    define! { ALL {
        REQUESTS: Counter("sieve_proxy_requests_total", ["protocol", "route", "code"],
            "Requests answered, by protocol (http, grpc), route and status code");
        REQUEST_SECONDS: Histogram("sieve_proxy_request_seconds", ["protocol", "route"],
            "Request latency, arrival to response, by protocol and route");
        REQUEST_ITEMS: Histogram("sieve_proxy_request_items", "Items per request");
        SHARDS_PER_REQUEST: Histogram("sieve_proxy_shards_per_request", "Shards a request was split into");
        SHARD_ITEMS: Histogram("sieve_proxy_shard_items", "Items per shard");
        SHARD_TOKENS: Histogram("sieve_proxy_shard_tokens", "Estimated tokens per shard");
        SHARD_PREDICTED_SECONDS: Histogram("sieve_proxy_shard_predicted_seconds",
            "Predicted shard time (queue + compute), at dispatch");
        SHARD_ACTUAL_SECONDS: Histogram("sieve_proxy_shard_actual_seconds", "Actual shard time, dispatch to response");
        SHARD_TIME_RATIO: Histogram("sieve_proxy_shard_time_ratio", "Actual over predicted shard time");
        SHARD_FAILURES: Counter("sieve_proxy_shard_failures_total", ["kind"], "Failed shard attempts by kind");
        RETRIES: Counter("sieve_proxy_retries_total", "Shard retries sent");
        RETRIES_DENIED: Counter("sieve_proxy_retries_denied_total", "Retries not sent (budget, attempts or no worker)");
        HEDGES: Counter("sieve_proxy_hedges_total", "Hedged shard attempts sent");
        HEDGE_WINS: Counter("sieve_proxy_hedge_wins_total", "Hedges that answered first");
        HEDGES_DENIED: Counter("sieve_proxy_hedges_denied_total",
            "Hedges not sent for lack of budget or an idle worker");
        PARTIAL_RESPONSES: Counter("sieve_proxy_partial_responses_total", "Responses with missing items (deadline)");
        MISSING_ITEMS: Counter("sieve_proxy_missing_items_total", "Items left unscored by the deadline");
        WORKERS_ELIGIBLE: Gauge("sieve_proxy_workers_eligible", "Workers that can take shards");
        TOKEN_ESTIMATE_ERROR: Histogram("sieve_proxy_token_estimate_relative_error",
            "(estimated - reported) / reported tokens per item");
        ADMISSION_REJECTED: Counter("sieve_proxy_admission_rejected_total",
            "Requests refused at once (429): no plan could meet their deadline");
        ADMISSION_PARTIAL: Counter("sieve_proxy_admission_partial_total",
            "Requests answered in part (on_overload: partial): no plan could meet their deadline");
        ADMISSION_DROPPED_ITEMS: Counter("sieve_proxy_admission_dropped_items_total",
            "Items left out of admission's partial plans (never sent)");
        CONFIG_RELOADS: Counter("sieve_proxy_config_reloads_total", ["outcome"], "Config reloads by outcome");
        CACHE_HITS: Counter("sieve_proxy_cache_hits_total", "Items answered from the pair-score cache");
        /// `outcome` = `hit` (the whole prefix came from the worker's prefix cache) | `miss` (it did
        /// not, and the holding is forgotten).
        PREFIX_AFFINITY_CHECKS: Counter("sieve_proxy_prefix_affinity_checks_total", ["outcome"],
            "Answers of workers expected to hold the prefix, by outcome");
        CACHE_MISSES: Counter("sieve_proxy_cache_misses_total",
            "Items looked up in the pair-score cache and not found");
        CACHE_INSERTS: Counter("sieve_proxy_cache_inserts_total", "Scores stored in the pair-score cache");
        /// By size or TTL; a model change empties the cache without counting here.
        CACHE_EVICTIONS: Counter("sieve_proxy_cache_evictions_total",
            "Pair-score cache entries evicted by size or TTL");
        CACHE_INVALIDATIONS: Counter("sieve_proxy_cache_invalidations_total",
            "Times the pair-score cache was emptied by a change of model");
        /// The writer's queue full, or one line over the file bound.
        TRACE_DROPPED: Counter("sieve_proxy_trace_dropped_total", "Sampled request-trace records not written");
        /// HTTP 503, gRPC RESOURCE_EXHAUSTED; read from the budget when scraped.
        BUFFER_REFUSALS: Counter("sieve_proxy_buffer_refusals_total",
            "Requests refused because their bytes did not fit in max_buffered_bytes");
        BUFFERED_BYTES: Gauge("sieve_proxy_buffered_bytes",
            "Request bytes held in memory (HTTP bodies and gRPC messages)");
    }}
    // Per worker: rendered at each scrape from the pool, in a recorder of its own (`render_per_worker`).
    define! { PER_WORKER {
        BREAKER_TRANSITIONS: Counter("sieve_proxy_breaker_transitions_total", ["worker", "state"],
            "Circuit breaker transitions by worker and new state");
        WORKER_IN_FLIGHT: Gauge("sieve_proxy_worker_in_flight_shards", ["worker"], "Shards in flight per worker");
        WORKER_BACKLOG_SECONDS: Gauge("sieve_proxy_worker_backlog_seconds", ["worker"], "Predicted backlog per worker");
        WORKER_BREAKER_STATE: Gauge("sieve_proxy_worker_breaker_state", ["worker"],
            "Breaker state per worker: 0 closed, 1 half-open, 2 open");
        WORKER_READY: Gauge("sieve_proxy_worker_ready", ["worker"], "1 when the worker can take shards");
        WORKER_TIME_FACTOR: Gauge("sieve_proxy_worker_time_factor", ["worker"],
            "Measured time per unit of predicted cost (1 = average worker)");
    }}
}

/// The simulated worker (`sieve-loadtest sim-worker`): its `/metrics` page, written by hand.
pub mod sim {
    define! { ALL {
        REQUESTS: Counter("sieve_sim_requests_total", "Scoring calls received");
        COMPLETED: Counter("sieve_sim_completed_total", "Scoring calls answered in full");
        PAIRS: Counter("sieve_sim_pairs_total", "Pairs scored");
        TOKENS: Counter("sieve_sim_tokens_total", "Simulated tokens computed");
        FAILURES_INJECTED: Counter("sieve_sim_failures_injected_total",
            "Calls failed on purpose by the failure settings");
        DEADLINE_DROPS: Counter("sieve_sim_deadline_drops_total",
            "Calls whose deadline passed before they were scored");
        CANCELLED: Counter("sieve_sim_cancelled_total", "Calls whose caller went away");
        IN_FLIGHT: Gauge("sieve_sim_in_flight_requests", "Calls in progress now");
        QUEUED_TOKENS: Gauge("sieve_sim_queued_tokens", "Simulated tokens queued now");
    }}
}

/// Writes metrics whose values the caller holds (`f64` running totals, the simulated worker's
/// atomics) in the exposition format, each with its HELP and TYPE lines.
pub fn write_values(out: &mut String, values: &[(Metric, f64)]) {
    use std::fmt::Write as _;
    for (m, v) in values {
        let (name, help, kind) = (m.name, m.help, m.kind.as_str());
        let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n\n");
    }
}
