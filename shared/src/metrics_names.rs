//! Metric names, `sieve_<crate>_<thing>`, in one place so dashboards and tests agree.

pub mod worker {
    pub const REQUESTS: &str = "sieve_worker_requests_total";
    pub const REQUEST_ERRORS: &str = "sieve_worker_request_errors_total";
    pub const REQUEST_SECONDS: &str = "sieve_worker_request_seconds";
    pub const QUEUE_SECONDS: &str = "sieve_worker_queue_seconds";
    pub const FORWARD_SECONDS: &str = "sieve_worker_forward_seconds";
    pub const IN_FLIGHT: &str = "sieve_worker_in_flight_requests";
    pub const QUEUED_PAIRS: &str = "sieve_worker_queued_pairs";
    pub const PAIRS: &str = "sieve_worker_pairs_total";
    pub const TOKENS_COMPUTED: &str = "sieve_worker_tokens_computed_total";
    pub const PROMPT_TOKENS: &str = "sieve_worker_prompt_tokens_total";
    pub const KV_BLOCKS_USED: &str = "sieve_worker_kv_blocks_used";
    pub const KV_BLOCKS_FREE: &str = "sieve_worker_kv_blocks_free";
    pub const BATCH_TOKENS: &str = "sieve_worker_batch_tokens";
    /// Counter: forward passes stopped between layers because no live call needed them.
    pub const PASSES_ABANDONED: &str = "sieve_worker_passes_abandoned_total";
    /// Counter: rows (tokens) of the abandoned passes.
    pub const ROWS_ABANDONED: &str = "sieve_worker_abandoned_rows_total";
    /// Counter, label `stage` = `queued` | `running`: calls whose deadline passed before every
    /// item was scored (running: answered partially or 504 within about a layer's time).
    pub const CALLS_EXPIRED: &str = "sieve_worker_calls_expired_total";
    /// Counter, label `stage`: calls whose caller went away before the answer.
    pub const CALLS_CANCELLED: &str = "sieve_worker_calls_cancelled_total";
    /// Counter: calls answered at their deadline with some items scored and the rest `missing`.
    pub const PARTIAL_ANSWERS: &str = "sieve_worker_partial_answers_total";
    /// Counter: scores that came out NaN or infinite (their calls were answered 500).
    pub const NONFINITE_SCORES: &str = "sieve_worker_nonfinite_scores_total";
    /// Gauge: 1 when the worker takes calls (model loaded, not draining).
    pub const READY: &str = "sieve_worker_ready";
    /// Gauges: prefix-cache blocks by state.
    pub const PREFIX_BLOCKS_PENDING: &str = "sieve_worker_prefix_blocks_pending";
    pub const PREFIX_BLOCKS_COMMITTED: &str = "sieve_worker_prefix_blocks_committed";
    pub const PREFIX_BLOCKS_FREE: &str = "sieve_worker_prefix_blocks_free";
    /// Counters: prefix-cache lookups, hits, rolled-back epochs, evicted blocks.
    pub const PREFIX_LOOKUPS: &str = "sieve_worker_prefix_lookups_total";
    pub const PREFIX_HITS: &str = "sieve_worker_prefix_hits_total";
    pub const PREFIX_ROLLBACKS: &str = "sieve_worker_prefix_rollbacks_total";
    pub const PREFIX_EVICTED_BLOCKS: &str = "sieve_worker_prefix_evicted_blocks_total";
    /// Counter: prefix tokens run through the model.
    pub const PREFIX_TOKENS_COMPUTED: &str = "sieve_worker_prefix_tokens_computed_total";
    /// Counter, label `scope` = `in_batch` | `cross_batch`: prefix tokens reused instead.
    pub const PREFIX_TOKENS_REUSED: &str = "sieve_worker_prefix_tokens_reused_total";
    /// Gauges: seconds the runner computed, and waited for a batch while work was queued.
    pub const RUNNER_BUSY_SECONDS: &str = "sieve_worker_runner_busy_seconds_total";
    pub const RUNNER_IDLE_WITH_WORK_SECONDS: &str = "sieve_worker_runner_idle_with_work_seconds_total";
    /// Histogram: each wait of the runner for its next batch.
    pub const RUNNER_IDLE_SECONDS: &str = "sieve_worker_runner_idle_seconds";
    /// Counter: batches that failed as a whole (forward error or panic).
    pub const BATCH_FAILURES: &str = "sieve_worker_batch_failures_total";
    /// Counter: requests refused (HTTP 503, gRPC RESOURCE_EXHAUSTED) because their bytes did not
    /// fit in `[http] max_buffered_bytes`.
    pub const BUFFER_REFUSALS: &str = "sieve_worker_buffer_refusals_total";
    /// Gauge: request bytes held in memory now (HTTP bodies and gRPC messages).
    pub const BUFFERED_BYTES: &str = "sieve_worker_buffered_bytes";
}

/// The HTTP/1 ports of any process (API and admin; proxy, worker, simulated worker).
pub mod http {
    /// Counter, label `timer` = `send` (an answer's bytes made no progress for `[http]
    /// send_timeout_ms`, the client stopped reading: connection closed) | `evicted` (idle,
    /// closed for a new connection at `max_connections`).
    pub const TIMEOUTS: &str = "sieve_http_timeouts_total";
    /// Every `timer` label of [`TIMEOUTS`].
    pub const TIMER_LABELS: &[&str] = &["send", "evicted"];
}

/// The gRPC port of any process (proxy, worker, simulated worker).
pub mod grpc {
    /// Counter, label `timer` = `header` (no HTTP/2 preface in time) | `idle` (no call for
    /// `idle_timeout_ms`) | `send` (the socket took no bytes for `send_timeout_ms`) |
    /// `send_stream` (an answer not taken within `send_timeout_ms`, the client's flow-control
    /// window shut) | `evicted` (no call, closed for a new connection at `max_connections`);
    /// each closes the connection.
    pub const TIMEOUTS: &str = "sieve_grpc_timeouts_total";
    /// Every `timer` label of [`TIMEOUTS`].
    pub const TIMER_LABELS: &[&str] = &["header", "idle", "send", "send_stream", "evicted"];
}

/// MoE layers of a worker (per-variant selections, rows, time share).
pub mod worker_moe {
    /// Counter, label `variant`: MoE layer calls that ran the variant.
    pub const SELECTIONS: &str = "sieve_worker_moe_selections_total";
    /// Counter, label `kind` = `real` (token-expert assignments) | `padded` (rows computed).
    pub const ROWS: &str = "sieve_worker_moe_rows_total";
    /// Counter: seconds inside MoE layers.
    pub const SECONDS: &str = "sieve_worker_moe_seconds_total";
    /// Counter: seconds of the forward passes that ran MoE layers.
    pub const FORWARD_SECONDS: &str = "sieve_worker_moe_forward_seconds_total";
    /// Gauge: MoE seconds / forward seconds since start.
    pub const TIME_SHARE: &str = "sieve_worker_moe_time_share";
}

/// The proxy (`proxy/src/metrics.rs` holds their descriptions and histogram buckets).
pub mod proxy {
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
    /// Requests refused (HTTP 503, gRPC RESOURCE_EXHAUSTED) because their bytes did not fit in
    /// `[http] max_buffered_bytes`; read from the budget when scraped.
    pub const BUFFER_REFUSALS: &str = "sieve_proxy_buffer_refusals_total";
    /// Gauge: request bytes held in memory now, against `[http] max_buffered_bytes`.
    pub const BUFFERED_BYTES: &str = "sieve_proxy_buffered_bytes";
}

/// The simulated worker (`sieve-loadtest sim-worker`): its `/metrics` page.
pub mod sim {
    pub const REQUESTS: &str = "sieve_sim_requests_total";
    pub const COMPLETED: &str = "sieve_sim_completed_total";
    pub const PAIRS: &str = "sieve_sim_pairs_total";
    pub const TOKENS: &str = "sieve_sim_tokens_total";
    pub const FAILURES_INJECTED: &str = "sieve_sim_failures_injected_total";
    pub const DEADLINE_DROPS: &str = "sieve_sim_deadline_drops_total";
    pub const CANCELLED: &str = "sieve_sim_cancelled_total";
    pub const IN_FLIGHT: &str = "sieve_sim_in_flight_requests";
    pub const QUEUED_TOKENS: &str = "sieve_sim_queued_tokens";
}
