//! Sending one shard: the primary attempt, a hedge when it lags past the p95 of its predicted
//! time, retries elsewhere when an attempt fails, and the deadline over all of it.
//!
//! Every attempt runs as its own task holding its worker's in-flight guard; the first success
//! wins and the others are aborted (which closes their connections, so the worker drops the
//! work). Retries and hedges are paid from token buckets, so a sick cluster is not buried
//! under extra work. What each answer teaches (tokens, compute time, worker speed, breaker) is
//! recorded here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;
use sieve_shared::api::headers;
use sieve_shared::{ApiError, ErrorKind, Item, ProxyConfig, ScoreResponse};
use tokio::task::JoinSet;

use crate::client::ClientError;
use crate::cluster::breaker::BreakerState;
use crate::cluster::worker::{Worker, WorkerView};
use crate::estimate::cost_estimator::reported_features;
use crate::estimate::token_estimator::Features;
use crate::metrics as m;
use crate::state::{lock, AppState};

/// What every shard of one request shares.
pub struct RequestCtx {
    pub state: Arc<AppState>,
    pub cfg: Arc<ProxyConfig>,
    pub query: String,
    pub instruction: Option<String>,
    pub items: Vec<Item>,
    pub item_features: Vec<Features>,
    pub query_features: Features,
    pub instruction_features: Option<Features>,
    /// Estimated own-segment tokens per item.
    pub item_tokens: Vec<f64>,
    pub prefix_tokens: f64,
    pub arrival: Instant,
    pub deadline: Instant,
}

/// A shard as planned: where it goes first and what it is predicted to take.
pub struct ShardJob {
    pub worker: Arc<Worker>,
    pub items: Vec<usize>,
    pub compute_ms: f64,
    pub finish_ms: f64,
}

pub enum ShardOutcome {
    Done(ShardDone),
    /// Every attempt failed (or one failed in a way another worker would repeat).
    Failed(ApiError),
    /// The deadline passed first.
    Missed,
}

pub struct ShardDone {
    pub response: ScoreResponse,
    /// When the winning attempt was sent, after the request's arrival.
    pub sent_after_ms: f64,
    pub hedged: bool,
    pub retries: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AttemptKind {
    Primary,
    Retry,
    Hedge,
}

#[derive(Debug)]
enum AttemptError {
    Client(ClientError),
    /// The worker answered with an error status.
    Api(ApiError),
    /// 200 with a body that is not a matching score response.
    BadResponse(String),
}

impl AttemptError {
    fn kind(&self) -> ErrorKind {
        match self {
            AttemptError::Client(ClientError::Connect(_)) => ErrorKind::NotReady,
            AttemptError::Client(_) | AttemptError::BadResponse(_) => ErrorKind::Internal,
            AttemptError::Api(e) => match e.kind {
                ErrorKind::NotFound | ErrorKind::MethodNotAllowed => ErrorKind::Internal,
                k => k,
            },
        }
    }

    /// Whether another worker might succeed.
    fn retryable(&self) -> bool {
        self.kind().is_retryable()
    }

    /// Whether it says the worker is unhealthy (breaker food). Refusals (503 draining or
    /// loading, 429 full) and deadlines are the worker working as designed.
    fn is_worker_fault(&self) -> bool {
        match self {
            AttemptError::Client(_) | AttemptError::BadResponse(_) => true,
            // 404/405: the URL does not point at a worker (misconfiguration).
            AttemptError::Api(e) => {
                matches!(e.kind, ErrorKind::Internal | ErrorKind::NotFound | ErrorKind::MethodNotAllowed)
            }
        }
    }

    fn label(&self) -> &'static str {
        match self {
            AttemptError::Client(ClientError::Connect(_)) => "connect",
            AttemptError::Client(_) => "connection",
            AttemptError::BadResponse(_) => "bad_response",
            AttemptError::Api(e) => match e.kind {
                ErrorKind::NotReady => "not_ready",
                ErrorKind::Overloaded => "overloaded",
                ErrorKind::DeadlineExceeded => "deadline",
                ErrorKind::Internal => "internal",
                _ => "client_error",
            },
        }
    }

    fn into_api(self, worker: &str) -> ApiError {
        match self {
            AttemptError::Api(e) if !matches!(e.kind, ErrorKind::NotFound | ErrorKind::MethodNotAllowed) => e,
            AttemptError::Client(ClientError::Connect(e)) => {
                ApiError::not_ready(format!("no worker could take the shard; last: {worker}: {e}"))
            }
            other => ApiError::internal(format!("worker {worker}: {}", other.message())),
        }
    }

    fn message(&self) -> String {
        match self {
            AttemptError::Client(e) => e.to_string(),
            AttemptError::Api(e) => e.message.clone(),
            AttemptError::BadResponse(m) => m.clone(),
        }
    }
}

struct AttemptResult {
    worker: Arc<Worker>,
    kind: AttemptKind,
    sent: Instant,
    result: Result<ScoreResponse, AttemptError>,
}

/// The shard's request body: the `ScoreRequest` shape, borrowing the caller's items.
#[derive(Serialize)]
struct ShardBody<'a> {
    query: &'a str,
    items: Vec<&'a Item>,
    #[serde(skip_serializing_if = "Option::is_none")]
    instruction: Option<&'a str>,
    deadline_ms: u64,
}

fn remaining_ms(deadline: Instant) -> u64 {
    let left = deadline.saturating_duration_since(Instant::now());
    // Round up: a worker given 0 would refuse outright.
    left.as_micros().div_ceil(1000) as u64
}

async fn attempt(
    ctx: Arc<RequestCtx>,
    items: Arc<Vec<usize>>,
    worker: Arc<Worker>,
    kind: AttemptKind,
    predicted_ms: f64,
) -> AttemptResult {
    let guard = worker.begin(predicted_ms);
    let sent = Instant::now();
    let deadline_ms = remaining_ms(ctx.deadline).max(1);
    let body = ShardBody {
        query: &ctx.query,
        items: items.iter().map(|&i| &ctx.items[i]).collect(),
        instruction: ctx.instruction.as_deref(),
        deadline_ms,
    };
    // Sized up front: growing a large body by doubling copies it several times.
    let size_hint = 64 + ctx.query.len() + body.items.iter().map(|i| i.text().len() + 16).sum::<usize>();
    let mut bytes = Vec::with_capacity(size_hint);
    let result = match serde_json::to_writer(&mut bytes, &body) {
        Err(e) => Err(AttemptError::BadResponse(format!("encoding the shard: {e}"))),
        Ok(()) => {
            let hdrs = [(headers::DEADLINE_MS, deadline_ms.to_string())];
            match ctx.state.client.post_json(&worker.score_uri, Bytes::from(bytes), &hdrs).await {
                Err(e) => Err(AttemptError::Client(e)),
                Ok(reply) if reply.status.is_success() => match serde_json::from_slice::<ScoreResponse>(&reply.body) {
                    Ok(r) => check_shard_response(r, items.len()).map_err(AttemptError::BadResponse),
                    Err(e) => Err(AttemptError::BadResponse(format!("unreadable score response: {e}"))),
                },
                Ok(reply) => Err(AttemptError::Api(ApiError::from_response(reply.status.as_u16(), &reply.body))),
            }
        }
    };
    // The worker's load is released only now that the body is read.
    drop(guard);
    AttemptResult { worker, kind, sent, result }
}

/// A worker's 200 is usable when it has one entry per item and a score wherever `missing` does
/// not list the index. A partial answer (the worker's deadline came first) is a success, never
/// retried: its `missing` items are reported as such. A null outside `missing` (how a NaN score
/// is written in JSON) means the worker's model is broken: the attempt failed, and the shard is
/// retried elsewhere like after a 500.
fn check_shard_response(r: ScoreResponse, n_items: usize) -> Result<ScoreResponse, String> {
    if r.scores.len() != n_items {
        return Err(format!("{} scores for a shard of {} items", r.scores.len(), n_items));
    }
    let mut listed = vec![false; n_items];
    for &k in &r.missing {
        match listed.get_mut(k) {
            Some(l) => *l = true,
            None => return Err(format!("missing index {k} in a shard of {n_items} items")),
        }
    }
    if let Some(k) = r.scores.iter().zip(&listed).position(|(s, &l)| s.is_none() && !l) {
        return Err(format!("no score for items[{k}] and it is not listed missing"));
    }
    Ok(r)
}

fn launch(
    set: &mut JoinSet<AttemptResult>,
    ctx: &Arc<RequestCtx>,
    items: &Arc<Vec<usize>>,
    worker: Arc<Worker>,
    kind: AttemptKind,
    predicted_ms: f64,
) {
    worker.counters.shards.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    worker.counters.items.fetch_add(items.len() as u64, std::sync::atomic::Ordering::Relaxed);
    set.spawn(attempt(ctx.clone(), items.clone(), worker, kind, predicted_ms));
}

/// Predicted compute of these items on a worker, from the current model and its speed.
fn predict_on(ctx: &RequestCtx, items: &[usize], worker: &Worker) -> f64 {
    let model = ctx.state.cost_model();
    worker.time_factor() * model.call_ms(ctx.prefix_tokens, items.iter().map(|&i| ctx.item_tokens[i]))
}

/// Eligible workers not in `exclude`, in the configured policy's order, with the predicted
/// time from now until each would be done with these items (its backlog, then the compute).
fn ranked_others(ctx: &RequestCtx, items: &[usize], exclude: &[Arc<Worker>]) -> Vec<(Arc<Worker>, WorkerView, f64)> {
    let now = Instant::now();
    let model = ctx.state.cost_model();
    let params = AppState::view_params(&ctx.cfg);
    let candidates: Vec<Arc<Worker>> =
        ctx.state.pool.eligible(now).into_iter().filter(|w| !exclude.iter().any(|x| Arc::ptr_eq(x, w))).collect();
    let views: Vec<WorkerView> = candidates.iter().map(|w| w.view(now, &model, &params)).collect();
    let compute = model.call_ms(ctx.prefix_tokens, items.iter().map(|&i| ctx.item_tokens[i]));
    ctx.state
        .policy()
        .rank(&views)
        .into_iter()
        .map(|i| (candidates[i].clone(), views[i], views[i].backlog_ms + views[i].time_factor * compute))
        .collect()
}

/// Whether work predicted to take `finish_ms` from now ends before the deadline.
fn fits(ctx: &RequestCtx, finish_ms: f64) -> bool {
    Instant::now() + Duration::from_secs_f64(finish_ms.max(0.0) / 1e3) < ctx.deadline
}

fn note_breaker(worker: &Worker, change: Option<BreakerState>) {
    if let Some(state) = change {
        tracing::info!(worker = worker.url(), state = state.name(), "breaker");
        metrics::counter!(m::BREAKER_TRANSITIONS, "worker" => worker.url().to_string(), "state" => state.name())
            .increment(1);
    }
}

/// Runs one shard to an outcome.
pub async fn run_shard(ctx: Arc<RequestCtx>, job: ShardJob) -> ShardOutcome {
    let cfg = ctx.cfg.clone();
    let items = Arc::new(job.items);
    let shard_start = Instant::now();
    let deadline = tokio::time::Instant::from_std(ctx.deadline);
    let mut set = JoinSet::new();
    let mut tried: Vec<Arc<Worker>> = vec![job.worker.clone()];
    let mut attempts = 1u32;
    let mut retries = 0u32;
    let mut hedged = false;
    launch(&mut set, &ctx, &items, job.worker.clone(), AttemptKind::Primary, job.compute_ms);

    let hedge_at = cfg.hedge.enabled.then(|| {
        let q = ctx.state.ratios.quantile(cfg.hedge.min_samples).unwrap_or(cfg.hedge.initial_multiplier);
        let delay_ms = (q * job.finish_ms).max(cfg.hedge.min_delay_ms);
        tokio::time::Instant::from_std(shard_start + Duration::from_secs_f64(delay_ms / 1e3))
    });
    let mut hedge_armed = hedge_at.is_some();
    let mut last_error: Option<(AttemptError, String)> = None;

    loop {
        tokio::select! {
            joined = set.join_next() => {
                let Some(joined) = joined else {
                    // Nothing in flight and nothing more to try.
                    let (e, url) = last_error.take().unwrap_or((AttemptError::BadResponse("no attempt".into()), String::new()));
                    return ShardOutcome::Failed(e.into_api(&url));
                };
                let r = match joined {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::error!("shard attempt task failed: {e}");
                        continue;
                    }
                };
                match r.result {
                    Ok(response) => {
                        learn(&ctx, &items, &r.worker, &response, job.finish_ms, shard_start, r.kind);
                        if r.kind == AttemptKind::Hedge {
                            metrics::counter!(m::HEDGE_WINS).increment(1);
                        }
                        return ShardOutcome::Done(ShardDone {
                            response,
                            sent_after_ms: r.sent.saturating_duration_since(ctx.arrival).as_secs_f64() * 1e3,
                            hedged,
                            retries,
                        });
                    }
                    Err(e) => {
                        let now = Instant::now();
                        metrics::counter!(m::SHARD_FAILURES, "kind" => e.label()).increment(1);
                        tracing::debug!(worker = r.worker.url(), "shard attempt failed: {}", e.message());
                        if e.is_worker_fault() {
                            note_breaker(&r.worker, r.worker.on_failure(now, e.message()));
                        } else if e.kind() == ErrorKind::NotReady {
                            // Draining or loading: nothing more until a health check says ready.
                            r.worker.on_refused(now + Duration::from_millis(cfg.health.interval_ms), e.message());
                        }
                        // A worker's 504 means it could not finish in time; a less busy one may.
                        let refused_for_time = e.kind() == ErrorKind::DeadlineExceeded;
                        if !e.retryable() && !refused_for_time {
                            return ShardOutcome::Failed(e.into_api(r.worker.url()));
                        }
                        last_error = Some((e, r.worker.url().to_string()));
                        if !set.is_empty() {
                            continue; // a hedge is still running
                        }
                        let retry = if attempts >= cfg.retry.max_attempts || Instant::now() >= ctx.deadline {
                            None
                        } else {
                            let mut others = ranked_others(&ctx, &items, &tried);
                            if others.is_empty() && !refused_for_time {
                                // Nobody else: the same worker again beats giving up.
                                others = ranked_others(&ctx, &items, &[]);
                            }
                            others
                                .into_iter()
                                .find(|(_, _, finish)| !refused_for_time || fits(&ctx, *finish))
                                .filter(|_| ctx.state.retry_budget.try_withdraw(1.0))
                        };
                        match retry {
                            Some((w, _, _)) => {
                                attempts += 1;
                                retries += 1;
                                metrics::counter!(m::RETRIES).increment(1);
                                w.counters.retries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                let predicted = predict_on(&ctx, &items, &w);
                                tried.push(w.clone());
                                launch(&mut set, &ctx, &items, w, AttemptKind::Retry, predicted);
                            }
                            None => {
                                metrics::counter!(m::RETRIES_DENIED).increment(1);
                                if refused_for_time {
                                    return ShardOutcome::Missed;
                                }
                                let (e, url) = last_error.take().unwrap_or((AttemptError::BadResponse("no attempt".into()), String::new()));
                                return ShardOutcome::Failed(e.into_api(&url));
                            }
                        }
                    }
                }
            }
            _ = tokio::time::sleep_until(hedge_at.unwrap_or(deadline)), if hedge_armed => {
                hedge_armed = false;
                let max_in_flight = cfg.hedge.max_target_in_flight;
                let sent = ranked_others(&ctx, &items, &tried)
                    .into_iter()
                    .find(|(_, view, finish)| view.in_flight <= max_in_flight && fits(&ctx, *finish))
                    .and_then(|(w, _, _)| {
                        let predicted = predict_on(&ctx, &items, &w);
                        ctx.state.hedge_budget.try_withdraw(predicted).then_some((w, predicted))
                    });
                match sent {
                    Some((w, predicted)) => {
                        hedged = true;
                        metrics::counter!(m::HEDGES).increment(1);
                        w.counters.hedges.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tried.push(w.clone());
                        launch(&mut set, &ctx, &items, w, AttemptKind::Hedge, predicted);
                    }
                    None => metrics::counter!(m::HEDGES_DENIED).increment(1),
                }
            }
            _ = tokio::time::sleep_until(deadline) => {
                // Dropping the set aborts the attempts: their connections close.
                return ShardOutcome::Missed;
            }
        }
    }
}

/// Records what a successful answer teaches: breaker, token counts, compute time, speed,
/// and the shard's actual-over-predicted time.
fn learn(
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
        ctx.state.ratios.record(ratio);
        metrics::histogram!(m::SHARD_TIME_RATIO).record(ratio);
    }
    // A partial answer's compute covers only some of its items: it would teach the cost model
    // that items are cheaper than they are.
    if !ctx.cfg.estimator.recalibrate || !response.missing.is_empty() {
        return;
    }
    let usage = &response.usage;
    if usage.item_tokens.len() == items.len() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use sieve_shared::{Timing, Usage};

    fn response(scores: Vec<Option<f32>>, missing: Vec<usize>) -> ScoreResponse {
        ScoreResponse {
            scores,
            ids: None,
            missing,
            usage: Usage::default(),
            timing: Timing::default(),
            model: "m".into(),
        }
    }

    #[test]
    fn a_partial_shard_is_a_success_and_a_stray_null_a_failure() {
        // The worker's deadline left items 1 and 2 unscored: usable as is (no retry).
        let partial = check_shard_response(response(vec![Some(0.5), None, None], vec![1, 2]), 3).unwrap();
        assert_eq!(partial.missing, vec![1, 2]);
        // A null nobody listed (a NaN written as JSON): a failed attempt, retryable elsewhere.
        let e = check_shard_response(response(vec![Some(0.5), None], vec![]), 2).unwrap_err();
        assert!(e.contains("items[1]"), "{e}");
        let err = AttemptError::BadResponse(e);
        assert!(err.retryable() && err.is_worker_fault());
        assert!(check_shard_response(response(vec![Some(0.5)], vec![3]), 1).is_err());
        assert!(check_shard_response(response(vec![Some(0.5)], vec![]), 2).is_err());
        // A worker's 500 (its non-finite-score error) is retried elsewhere and counts against it.
        let e500 = AttemptError::Api(ApiError::from_response(
            500,
            br#"{"error":{"type":"internal","code":500,"message":"non-finite score for items[0]"}}"#,
        ));
        assert!(e500.retryable() && e500.is_worker_fault());
    }
}
