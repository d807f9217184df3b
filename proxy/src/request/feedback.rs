//! Stage 4, feedback: what each attempt's answer teaches. A success closes the worker's
//! breaker and updates the shard-time ratios (for hedging), the token estimator, the cost
//! model and the worker's speed, and (a complete answer) that the worker holds the call's prefix
//! in its prefix cache; a failure feeds the breaker, or holds back a worker that
//! refused for now (draining or loading). Called by the dispatcher as answers arrive.

use std::time::{Duration, Instant};

use sieve_shared::sync::lock;
use sieve_shared::{ErrorKind, ProxyConfig, ScoreResponse};

use super::dispatch::attempt::{AttemptError, AttemptKind};
use super::RequestCtx;
use crate::cluster::breaker::BreakerState;
use crate::cluster::worker::Worker;
use crate::estimate::cost_estimator::reported_features;
use crate::metrics as m;

/// Logs and counts a breaker state change (the count is the worker's: its series go when it
/// leaves the pool, `crate::metrics::render_per_worker`).
pub fn note_breaker(worker: &Worker, change: Option<BreakerState>) {
    if let Some(state) = change {
        tracing::info!(worker = worker.url(), state = state.name(), "breaker");
        worker.counters.note_breaker(state);
    }
}

/// Records what a successful answer teaches: breaker, token counts, compute time, speed,
/// and the shard's actual-over-predicted time.
pub fn on_success(
    ctx: &RequestCtx,
    items: &[usize],
    worker: &Worker,
    response: &ScoreResponse,
    predicted_finish_ms: f64,
    shard_start: Instant,
    kind: AttemptKind,
) {
    let now = Instant::now();
    note_breaker(worker, worker.on_success(now));
    let elapsed_ms = now.saturating_duration_since(shard_start).as_secs_f64() * 1e3;
    metrics::histogram!(m::SHARD_ACTUAL_SECONDS).record(elapsed_ms / 1e3);
    if kind != AttemptKind::Retry && predicted_finish_ms > 0.0 {
        let ratio = elapsed_ms / predicted_finish_ms;
        ctx.state.ratios.record(ratio, predicted_finish_ms);
        metrics::histogram!(m::SHARD_TIME_RATIO).record(ratio);
    }
    // A partial answer's compute covers only some of its items: it would teach the cost model
    // that items are cheaper than they are (and its batch may not have committed the prefix).
    if !response.missing.is_empty() {
        return;
    }
    // A complete answer committed the call's prefix on the worker: it holds it for a while.
    let usage = &response.usage;
    ctx.state.prefix_holders.observe(ctx.prefix_digest, worker, usage.prefix_tokens, usage.cached_prefix_tokens, now);
    if !ctx.cfg.estimator.recalibrate {
        return;
    }
    // A cut item's count is its cap, not what its text would take: no lesson for the estimator.
    if usage.item_tokens.len() == items.len() && usage.truncated_items == 0 {
        let estimated: f64 = items.iter().map(|&i| ctx.item_tokens[i]).sum();
        let reported: f64 = usage.item_tokens.iter().map(|&n| f64::from(n)).sum();
        if reported > 0.0 {
            metrics::histogram!(m::TOKEN_ESTIMATE_ERROR).record((estimated - reported) / reported);
        }
        lock(&ctx.state.tokens).observe(
            items.iter().map(|&i| &ctx.item_features[i]).zip(usage.item_tokens.iter().copied()),
            &ctx.query_features,
            ctx.instruction_features.as_ref(),
            usage.prefix_tokens,
        );
        let features = reported_features(usage);
        let compute_ms = response.timing.compute_ms;
        // The model is of a worker of time factor 1: each worker's times are divided by its
        // factor before fitting. Fitting raw times would confound speed with size, because
        // balanced shards give slow workers fewer tokens for the same time; and a worker's
        // first shards only measure its factor, so an unknown speed teaches the model nothing.
        let predicted = {
            let mut cost = lock(&ctx.state.cost);
            let before = cost.model().predict(&features);
            if let Some(tf) = worker.calibrated_time_factor() {
                cost.observe(&features, compute_ms / tf);
            }
            before
        };
        worker.observe_compute(compute_ms, predicted, ctx.cfg.estimator.speed_smoothing);
    }
}

/// Records what a failed attempt says about its worker: a fault feeds the breaker; a refusal
/// (draining or loading) keeps the worker out until a health check says ready.
pub fn on_failure(worker: &Worker, e: &AttemptError, cfg: &ProxyConfig) {
    let now = Instant::now();
    metrics::counter!(m::SHARD_FAILURES, "kind" => e.label()).increment(1);
    tracing::debug!(worker = worker.url(), "shard attempt failed: {}", e.message());
    if e.is_worker_fault() {
        note_breaker(worker, worker.on_failure(now, e.message()));
    } else if e.kind() == ErrorKind::NotReady {
        // Draining or loading: nothing more until a health check says ready.
        worker.on_refused(now + Duration::from_millis(cfg.health.interval_ms), e.message());
    }
}
