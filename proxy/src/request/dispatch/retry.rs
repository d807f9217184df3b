//! The retry decision after a failed attempt: whether the failure is worth another worker, and
//! which one. Retries are paid from a token bucket (every shard sent earns a fraction of one),
//! so a failing cluster is not buried under repeated work.

use std::sync::Arc;
use std::time::Instant;

use sieve_shared::ErrorKind;

use super::attempt::AttemptError;
use super::{fits, ranked_others};
use crate::cluster::worker::Worker;
use crate::request::RequestCtx;

/// A worker's 504: it could not finish in time, but a less busy one may.
pub fn refused_for_time(e: &AttemptError) -> bool {
    e.kind() == ErrorKind::DeadlineExceeded
}

/// Whether another worker might succeed where this attempt failed.
pub fn worth_retrying(e: &AttemptError) -> bool {
    e.retryable() || refused_for_time(e)
}

/// The worker to send the shard to next, its retry paid from the budget; `None` when the
/// attempts or the deadline are used up, no worker is left (or, for a shard refused for time,
/// none would finish before the deadline), or the budget is empty. With nobody else, the same
/// worker again beats giving up, except for a refusal for time.
pub fn next_worker(
    ctx: &RequestCtx,
    items: &[usize],
    tried: &[Arc<Worker>],
    attempts: u32,
    for_time: bool,
) -> Option<Arc<Worker>> {
    if attempts >= ctx.cfg.retry.max_attempts || Instant::now() >= ctx.deadline {
        return None;
    }
    let mut others = ranked_others(ctx, items, tried);
    if others.is_empty() && !for_time {
        others = ranked_others(ctx, items, &[]);
    }
    others
        .into_iter()
        .find(|(_, _, finish)| !for_time || fits(ctx, *finish))
        .filter(|_| ctx.state.retry_budget.try_withdraw(1.0))
        .map(|(w, _, _)| w)
}
