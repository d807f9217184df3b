//! Stage 2, dispatch: every shard run concurrently, in the request's own task, to an outcome
//! under the request's deadline. A shard's primary attempt goes to its planned worker; a failed
//! attempt is retried elsewhere ([`retry`]); one that lags past the p95 of its predicted time is
//! hedged ([`hedge`]); the first success wins and the other attempts are dropped, which closes
//! their connections ([`attempt`]). A shard's attempts are polled in the same task
//! ([`in_flight`]). Each answer is fed back ([`feedback`](super::feedback)) as it arrives.

pub mod attempt;
mod hedge;
mod in_flight;
mod retry;
pub mod shard_body;

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::FutureExt as _;
use futures_util::stream::{FuturesUnordered, StreamExt as _};
use sieve_shared::ApiError;

use self::attempt::{AttemptError, AttemptKind, AttemptResult};
use self::in_flight::InFlight;
use super::feedback;
use super::shard::{Eligible, ShardDone, ShardJob, ShardOutcome, ShardResult};
use super::RequestCtx;
use crate::cluster::worker::{Worker, WorkerView};
use crate::metrics as m;

/// How long an attempt still out at the request's deadline is watched for its answer's lag:
/// later than this, its worker stalled.
const LATE_WATCH: Duration = Duration::from_secs(1);

/// Runs every shard concurrently; the outcomes in plan order, with each shard's items. The
/// shards are polled in the request's own task (a `FuturesUnordered` polls only those woken), as
/// their attempts are in theirs: no task is spawned and joined per shard or per call.
pub async fn run(ctx: Arc<RequestCtx>, mut jobs: Vec<ShardJob>) -> Result<Vec<ShardResult>, ApiError> {
    if jobs.len() == 1 {
        let job = jobs.remove(0);
        return Ok(vec![run_shard(ctx, job).await]);
    }
    let n = jobs.len();
    let mut shards: FuturesUnordered<_> = jobs
        .into_iter()
        .enumerate()
        .map(|(idx, job)| {
            let ctx = ctx.clone();
            async move { (idx, caught(run_shard(ctx, job)).await) }
        })
        .collect();
    let mut done = Vec::with_capacity(n);
    while let Some((idx, shard)) = shards.next().await {
        match shard {
            Ok(result) => done.push((idx, result)),
            // What a shard task's panic gave; the other shards are dropped (their connections
            // closed).
            Err(e) => return Err(ApiError::internal(format!("shard task failed: {e}"))),
        }
    }
    done.sort_unstable_by_key(|(idx, _)| *idx);
    Ok(done.into_iter().map(|(_, result)| result).collect())
}

/// `fut`'s output, or the message of its panic: a shard polled in the request's task fails its
/// request with a 500 when it panics, as a spawned shard task did.
async fn caught<F: Future>(fut: F) -> Result<F::Output, String> {
    AssertUnwindSafe(fut).catch_unwind().await.map_err(|panic| panic_message(&panic))
}

/// What a panic's payload says, when it is a message.
fn panic_message(panic: &Box<dyn Any + Send>) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(s), _) => (*s).to_string(),
        (_, Some(s)) => s.clone(),
        _ => "panic".to_string(),
    }
}

/// One shard's attempts so far.
struct Shard {
    ctx: Arc<RequestCtx>,
    items: Arc<Vec<usize>>,
    /// The attempts in flight.
    set: InFlight<AttemptResult>,
    /// Every worker sent an attempt, the primary's first.
    tried: Vec<Arc<Worker>>,
    attempts: u32,
    retries: u32,
    hedged: bool,
    last_error: Option<(AttemptError, String)>,
}

impl Shard {
    fn send(&mut self, worker: Arc<Worker>, kind: AttemptKind, predicted_ms: f64) {
        self.tried.push(worker.clone());
        attempt::launch(&mut self.set, &self.ctx, &self.items, worker, kind, predicted_ms);
    }

    /// The last attempt's error as the shard's outcome.
    fn failed(&mut self) -> ShardOutcome {
        let (e, url) =
            self.last_error.take().unwrap_or((AttemptError::BadResponse("no attempt".into()), String::new()));
        ShardOutcome::Failed(e.into_api(&url))
    }

    /// A failed attempt: fed back, then the shard fails, waits for a hedge still running, or
    /// is retried elsewhere. `Some` ends the shard.
    fn on_failure(&mut self, worker: &Worker, e: AttemptError) -> Option<ShardOutcome> {
        feedback::on_failure(worker, &e, &self.ctx.cfg);
        let for_time = retry::refused_for_time(&e);
        if !retry::worth_retrying(&e) {
            return Some(ShardOutcome::Failed(e.into_api(worker.url())));
        }
        self.last_error = Some((e, worker.url().to_string()));
        if !self.set.is_empty() {
            return None; // a hedge is still running
        }
        match retry::next_worker(&self.ctx, &self.items, &self.tried, self.attempts, for_time) {
            Some(w) => {
                self.attempts += 1;
                self.retries += 1;
                metrics::counter!(m::RETRIES).increment(1);
                w.counters.retries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let predicted = predict_on(&self.ctx, &self.items, &w);
                self.send(w, AttemptKind::Retry, predicted);
                None
            }
            None => {
                metrics::counter!(m::RETRIES_DENIED).increment(1);
                Some(if for_time { ShardOutcome::Missed } else { self.failed() })
            }
        }
    }

    /// The hedge timer fired: a copy to another worker, if one qualifies and the budget pays.
    /// Returns the copy's predicted compute when one was sent.
    fn on_hedge_timer(&mut self) -> Option<f64> {
        match hedge::pick(&self.ctx, &self.items, &self.tried) {
            Some((w, predicted)) => {
                self.hedged = true;
                metrics::counter!(m::HEDGES).increment(1);
                w.counters.hedges.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.send(w, AttemptKind::Hedge, predicted);
                Some(predicted)
            }
            None => {
                metrics::counter!(m::HEDGES_DENIED).increment(1);
                None
            }
        }
    }
}

/// Runs one shard to an outcome, given back with the shard's items.
async fn run_shard(ctx: Arc<RequestCtx>, job: ShardJob) -> ShardResult {
    let items = Arc::new(job.items);
    let outcome = shard_outcome(&ctx, &items, job.worker, job.compute_ms, job.finish_ms).await;
    // The attempts are dropped by now: the items are the shard's alone again.
    let items = Arc::try_unwrap(items).unwrap_or_else(|shared| shared.as_ref().clone());
    ShardResult { items, outcome }
}

/// The shard's attempts until one succeeds, every one has failed, or the deadline passes.
async fn shard_outcome(
    ctx: &Arc<RequestCtx>,
    items: &Arc<Vec<usize>>,
    worker: Arc<Worker>,
    compute_ms: f64,
    finish_ms: f64,
) -> ShardOutcome {
    let shard_start = Instant::now();
    let deadline = tokio::time::Instant::from_std(ctx.deadline);
    let mut shard = Shard {
        ctx: ctx.clone(),
        items: items.clone(),
        set: InFlight::default(),
        tried: Vec::new(),
        attempts: 1,
        retries: 0,
        hedged: false,
        last_error: None,
    };
    shard.send(worker, AttemptKind::Primary, compute_ms);
    let mut hedge_at = hedge::hedge_at(ctx, finish_ms, shard_start);

    loop {
        // Biased: an answer already read wins over the deadline's timer firing in the same poll
        // (a worker's partial answer comes just before the proxy's deadline), and the deadline
        // over a hedge.
        tokio::select! {
            biased;
            next = shard.set.next() => {
                // Nothing in flight and nothing more to try.
                let Some(r) = next else { return shard.failed() };
                match r.result {
                    Ok(response) => {
                        feedback::on_success(ctx, &shard.items, &r.worker, &response, finish_ms, shard_start, r.kind);
                        if r.kind == AttemptKind::Hedge {
                            metrics::counter!(m::HEDGE_WINS).increment(1);
                        }
                        return ShardOutcome::Done(ShardDone {
                            response,
                            sent_after_ms: r.sent.saturating_duration_since(ctx.arrival).as_secs_f64() * 1e3,
                            hedged: shard.hedged,
                            retries: shard.retries,
                        });
                    }
                    Err(e) => {
                        if let Some(outcome) = shard.on_failure(&r.worker, e) {
                            return outcome;
                        }
                    }
                }
            }
            _ = tokio::time::sleep_until(deadline) => {
                // An attempt still out: its worker's deadline left its answer too little room, or
                // the worker stalled. It is watched for a while in the background (its worker is
                // past its own deadline: it answers at once unless stalled), so that an answer's
                // real lag is learnt ([`answer_margin`](crate::estimate::answer_margin)); then
                // dropping it closes its connection.
                if !shard.set.is_empty() {
                    let mut late = std::mem::take(&mut shard.set);
                    tokio::spawn(async move { tokio::time::timeout(LATE_WATCH, late.next()).await });
                }
                return ShardOutcome::Missed;
            }
            _ = tokio::time::sleep_until(hedge_at.unwrap_or(deadline)), if hedge_at.is_some() => {
                let sent = shard.on_hedge_timer();
                hedge_at = hedge::next_at(ctx, sent, compute_ms, Instant::now());
            }
        }
    }
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
    let Eligible { workers, views } = Eligible::at(&ctx.state, &ctx.cfg, now, &model, exclude);
    let compute = model.call_ms(ctx.prefix_tokens, items.iter().map(|&i| ctx.item_tokens[i]));
    ctx.state
        .policy()
        .rank(&views)
        .into_iter()
        .map(|i| (workers[i].clone(), views[i], views[i].backlog_ms + views[i].time_factor * compute))
        .collect()
}

/// Whether work predicted to take `finish_ms` from now ends before the deadline.
fn fits(ctx: &RequestCtx, finish_ms: f64) -> bool {
    after(Instant::now(), finish_ms).is_some_and(|f| f < ctx.deadline)
}

/// `ms` after `at` (at `at` for a negative `ms`), or `None` when that is not a representable
/// instant (infinite, NaN past the max, too far): predictions and ratios can be out of range.
fn after(at: Instant, ms: f64) -> Option<Instant> {
    at.checked_add(Duration::try_from_secs_f64(ms.max(0.0) / 1e3).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_shard_that_panics_is_an_error_not_a_lost_request() {
        assert_eq!(caught(async { 3 }).await, Ok(3));
        let e = caught(async {
            tokio::task::yield_now().await;
            panic!("shard bug {}", 1)
        })
        .await;
        assert_eq!(e, Err::<(), _>("shard bug 1".to_string()));
    }
}
