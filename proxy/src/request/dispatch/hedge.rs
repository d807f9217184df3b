//! The hedge decision: when a shard has lagged long enough to send a copy elsewhere (past the
//! configured quantile of actual over predicted shard time), and to which worker. Hedges are
//! paid from a token bucket in milliseconds of predicted work, so a slow cluster is not doubled.
//! A shard is looked at again after each hedge decision ([`next_at`]): a copy can stall too,
//! and a hedge denied for want of an idle worker may find one a little later.

use std::sync::Arc;
use std::time::Instant;

use super::{after, fits, predict_on, ranked_others};
use crate::cluster::worker::Worker;
use crate::request::RequestCtx;

/// When to hedge a shard sent at `start` and predicted to finish `finish_ms` later; `None`
/// when hedging is off.
pub fn hedge_at(ctx: &RequestCtx, finish_ms: f64, start: Instant) -> Option<tokio::time::Instant> {
    let cfg = &ctx.cfg.hedge;
    if !cfg.enabled {
        return None;
    }
    let q = ctx.state.ratios.quantile(cfg.min_samples).unwrap_or(cfg.initial_multiplier);
    // Past the end of time (a prediction or ratio out of range) there is no hedge.
    timer(start, (q * finish_ms).max(cfg.min_delay_ms))
}

/// [`after`] as a tokio timer instant.
fn timer(at: Instant, ms: f64) -> Option<tokio::time::Instant> {
    after(at, ms).map(tokio::time::Instant::from_std)
}

/// When to look at the shard again after the hedge timer fired at `now`: after a copy was sent
/// (`sent`: its predicted compute), by the same rule as for the first attempt; when none could
/// be, once the shard's predicted compute has passed (about when a busy worker frees up).
pub fn next_at(ctx: &RequestCtx, sent: Option<f64>, compute_ms: f64, now: Instant) -> Option<tokio::time::Instant> {
    match sent {
        Some(predicted_ms) => hedge_at(ctx, predicted_ms, now),
        None => timer(now, compute_ms.max(ctx.cfg.hedge.min_delay_ms).max(1.0)),
    }
}

/// The first worker in the policy's order not yet tried, not too busy, and predicted to finish
/// before the deadline, with its predicted compute, paid from the hedge budget; `None` when
/// there is none or the budget cannot pay.
pub fn pick(ctx: &RequestCtx, items: &[usize], tried: &[Arc<Worker>]) -> Option<(Arc<Worker>, f64)> {
    let max_in_flight = ctx.cfg.hedge.max_target_in_flight;
    ranked_others(ctx, items, tried)
        .into_iter()
        .find(|(_, view, finish)| view.in_flight <= max_in_flight && fits(ctx, *finish))
        .and_then(|(w, _, _)| {
            let predicted = predict_on(ctx, items, &w);
            ctx.state.hedge_budget.try_withdraw(predicted).then_some((w, predicted))
        })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_delay_past_the_end_of_time_is_no_hedge_not_a_panic() {
        let now = Instant::now();
        assert_eq!(timer(now, 5.0), Some(tokio::time::Instant::from_std(now + Duration::from_millis(5))));
        assert_eq!(timer(now, -3.0), Some(tokio::time::Instant::from_std(now)));
        for ms in [f64::INFINITY, f64::MAX, 1e300 * 1e10] {
            assert_eq!(timer(now, ms), None, "{ms}");
        }
    }
}
