//! The hedge decision: when a shard has lagged long enough to send a copy elsewhere (past the
//! configured quantile of actual over predicted shard time), and to which worker. Hedges are
//! paid from a token bucket in milliseconds of predicted work, so a slow cluster is not doubled.
//! A shard is looked at again after each hedge decision ([`next_at`]): a copy can stall too,
//! and a hedge denied for want of an idle worker may find one a little later.
//!
//! A copy is sent only when it is predicted to finish before the original ([`pays`]): its
//! target's backlog and compute against the original's expected remaining time, which the
//! measured ratios give: the shards that ran longer than this one has so far ran, on average,
//! [`RatioTracker::mean_excess`](crate::estimate::latency_ratio::RatioTracker::mean_excess)
//! times their prediction longer still. Without stalls a shard past the p95 is late by noise
//! and the model's error, and ends within a few percent of its prediction: a copy, which must
//! compute the whole shard again, almost never won (6 of 184 at 30% load), and each losing copy
//! took an idle worker from the requests planned meanwhile. A stall's lateness is heavy-tailed
//! (the longer a shard has run late, the longer it is expected to run still), which is when a
//! copy wins. No threshold is set by hand: the tail of the ratios decides.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{fits, predict_on, ranked_others};
use crate::cluster::worker::Worker;
use crate::request::RequestCtx;

/// When to hedge a shard sent at `start` and predicted to finish `finish_ms` later; `None`
/// when hedging is off.
pub fn hedge_at(ctx: &RequestCtx, finish_ms: f64, start: Instant) -> Option<tokio::time::Instant> {
    let cfg = &ctx.cfg.hedge;
    cfg.enabled.then(|| {
        let q = ctx.state.ratios.quantile(cfg.min_samples).unwrap_or(cfg.initial_multiplier);
        let delay_ms = (q * finish_ms).max(cfg.min_delay_ms);
        tokio::time::Instant::from_std(start + Duration::from_secs_f64(delay_ms / 1e3))
    })
}

/// When to look at the shard again after the hedge timer fired at `now`: after a copy was sent
/// (`sent`: its predicted compute), by the same rule as for the first attempt; when none could
/// be, once the shard's predicted compute has passed (about when a busy worker frees up).
pub fn next_at(ctx: &RequestCtx, sent: Option<f64>, compute_ms: f64, now: Instant) -> Option<tokio::time::Instant> {
    match sent {
        Some(predicted_ms) => hedge_at(ctx, predicted_ms, now),
        None => {
            let wait_ms = compute_ms.max(ctx.cfg.hedge.min_delay_ms).max(1.0);
            Some(tokio::time::Instant::from_std(now + Duration::from_secs_f64(wait_ms / 1e3)))
        }
    }
}

/// The original's expected remaining time (ms) when it has run `elapsed_ms` of a shard
/// predicted to take `finish_ms`: what the shards measured lately that ran longer still ran on
/// average. `None` when unknown: before enough shards were measured, or when this one is later
/// than any of them.
fn original_remaining_ms(ctx: &RequestCtx, elapsed_ms: f64, finish_ms: f64) -> Option<f64> {
    if finish_ms.is_nan() || finish_ms <= 0.0 {
        return None;
    }
    let excess = ctx.state.ratios.mean_excess(elapsed_ms / finish_ms, ctx.cfg.hedge.min_samples)??;
    Some(excess * finish_ms)
}

/// Whether a copy predicted to finish `copy_finish_ms` from now pays: it is expected to beat
/// the original, whose expected remaining time is `original_remaining_ms` (`None`: unknown, the
/// shard is later than anything measured, so a copy is the only bound on it).
pub fn pays(copy_finish_ms: f64, original_remaining_ms: Option<f64>) -> bool {
    original_remaining_ms.is_none_or(|left| copy_finish_ms < left)
}

/// The first worker in the policy's order not yet tried, not too busy, predicted to finish
/// before the deadline and before the original (the shard has run `elapsed_ms` of a predicted
/// `finish_ms`), with its predicted compute, paid from the hedge budget; `None` when there is
/// none or the budget cannot pay.
pub fn pick(
    ctx: &RequestCtx,
    items: &[usize],
    tried: &[Arc<Worker>],
    elapsed_ms: f64,
    finish_ms: f64,
) -> Option<(Arc<Worker>, f64)> {
    let max_in_flight = ctx.cfg.hedge.max_target_in_flight;
    let left = original_remaining_ms(ctx, elapsed_ms, finish_ms);
    ranked_others(ctx, items, tried)
        .into_iter()
        .find(|(_, view, finish)| view.in_flight <= max_in_flight && fits(ctx, *finish) && pays(*finish, left))
        .and_then(|(w, _, _)| {
            let predicted = predict_on(ctx, items, &w);
            ctx.state.hedge_budget.try_withdraw(predicted).then_some((w, predicted))
        })
}

#[cfg(test)]
mod tests {
    use super::pays;

    #[test]
    fn a_copy_pays_only_when_predicted_to_beat_the_original() {
        // Late by noise: 2 ms left expected, a copy needs 40 ms of compute.
        assert!(!pays(40.0, Some(2.0)));
        // Behind a stall: 300 ms left expected on the original.
        assert!(pays(40.0, Some(300.0)));
        // A tie does not pay: the copy would only add work.
        assert!(!pays(40.0, Some(40.0)));
        // Later than anything measured: the copy is the only bound.
        assert!(pays(40.0, None));
    }
}
