//! Admission control: never queue work the deadline will throw away.
//!
//! The splitter's plan carries each shard's predicted finish from the cluster state the proxy
//! tracks (every worker's backlog, its measured speed, the shards packed before it). When the
//! slowest shard of the best plan is predicted to finish after the request's deadline, sending
//! the request only adds load that delays everyone else and is then dropped at the deadline.
//! Instead the request is answered at once, by its `on_overload` policy:
//!
//! - `reject` (default): 429 with `Retry-After`, before any shard is sent;
//! - `partial`: each late shard keeps the cheapest of its items that still finish in time
//!   (its start is what its worker already has; its fixed cost and prefix are paid once), the
//!   rest are listed in `missing`; a plan with nothing left is refused as with `reject`.
//!
//! `[admission] margin` tolerates predictions late by that fraction of the time left (they are
//! estimates); `[admission] enabled = false` turns all of this off.

use sieve_shared::proxy_config::AdmissionConfig;
use sieve_shared::{ApiError, OnOverload};

use crate::metrics as m;
use crate::split::{Candidate, Plan, Request};

/// Checks `plan` against the time left. `Ok` with the items removed from the plan (empty when
/// it is admitted whole); `Err` is the 429 to answer. `best` gives the plan of smallest
/// predicted makespan when the chosen one (picked with a tolerance) is late: a request is
/// refused only when even that one is.
pub fn admit(
    cfg: &AdmissionConfig,
    policy: OnOverload,
    left_ms: f64,
    plan: &mut Plan,
    req: &Request<'_>,
    candidates: &[Candidate],
    best: impl FnOnce() -> Option<Plan>,
) -> Result<Vec<usize>, ApiError> {
    if !cfg.enabled {
        return Ok(Vec::new());
    }
    let limit = left_ms.max(0.0) * (1.0 + cfg.margin);
    if plan.makespan_ms <= limit {
        return Ok(Vec::new());
    }
    if let Some(b) = best().filter(|b| b.makespan_ms < plan.makespan_ms) {
        *plan = b;
        if plan.makespan_ms <= limit {
            return Ok(Vec::new());
        }
    }
    let refuse = |plan: &Plan| {
        metrics::counter!(m::ADMISSION_REJECTED).increment(1);
        ApiError::overloaded(format!(
            "the deadline cannot be met: the best plan is predicted to finish in {:.0} ms, {:.0} ms are left; \
             retry later, with a longer deadline_ms, or with \"on_overload\": \"partial\"",
            plan.makespan_ms, left_ms
        ))
    };
    match policy {
        OnOverload::Reject => Err(refuse(plan)),
        OnOverload::Partial => {
            let dropped = trim(plan, req, candidates, limit);
            if plan.shards.is_empty() {
                return Err(refuse(plan));
            }
            metrics::counter!(m::ADMISSION_PARTIAL).increment(1);
            metrics::counter!(m::ADMISSION_DROPPED_ITEMS).increment(dropped.len() as u64);
            Ok(dropped)
        }
    }
}

/// Cuts every shard to what finishes within `limit_ms`, keeping its cheapest items; a shard
/// left empty is removed (and costs its worker nothing, so later shards there start earlier).
/// Returns the removed items, ascending.
fn trim(plan: &mut Plan, req: &Request<'_>, candidates: &[Candidate], limit_ms: f64) -> Vec<usize> {
    let fixed = req.model.request_ms + req.model.prefix_ms(req.prefix);
    let mut at: Vec<f64> = candidates.iter().map(|c| c.available_ms).collect();
    let mut dropped = Vec::new();
    for s in &mut plan.shards {
        let tf = candidates[s.candidate].time_factor;
        let start = at[s.candidate];
        if start + s.compute_ms > limit_ms {
            let mut by_cost: Vec<(f64, usize)> =
                s.items.iter().map(|&i| (tf * req.model.pair_ms(req.item_tokens[i], req.prefix), i)).collect();
            by_cost.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            let mut compute = tf * fixed;
            let mut kept = Vec::with_capacity(by_cost.len());
            for (ms, i) in by_cost {
                if start + compute + ms <= limit_ms {
                    compute += ms;
                    kept.push(i);
                } else {
                    dropped.push(i);
                }
            }
            kept.sort_unstable();
            s.tokens = req.prefix + kept.iter().map(|&i| req.item_tokens[i]).sum::<f64>();
            s.compute_ms = if kept.is_empty() { 0.0 } else { compute };
            s.items = kept;
        }
        at[s.candidate] = start + s.compute_ms;
        s.finish_ms = at[s.candidate];
    }
    plan.shards.retain(|s| !s.items.is_empty());
    plan.makespan_ms = plan.shards.iter().map(|s| s.finish_ms).fold(0.0, f64::max);
    dropped.sort_unstable();
    dropped
}

#[cfg(test)]
mod tests {
    use sieve_shared::CostModel;

    use super::*;
    use crate::split::split_by_cost;

    const MODEL: CostModel = CostModel { request_ms: 10.0, token_ms: 0.1, token_context_ms: 0.0 };

    fn busy(backlog: &[f64]) -> Vec<Candidate> {
        backlog
            .iter()
            .map(|&b| Candidate { available_ms: b, time_factor: 1.0, max_batch_tokens: 0, holds_prefix: false })
            .collect()
    }

    fn on() -> AdmissionConfig {
        AdmissionConfig::default()
    }

    #[test]
    fn a_plan_that_fits_is_admitted_whole() {
        let tokens = vec![100.0; 20];
        let req = Request { item_tokens: &tokens, prefix: 50.0, model: &MODEL };
        let cands = busy(&[0.0, 0.0]);
        let mut plan = split_by_cost(&req, &cands, 8, 0.0);
        let before = plan.clone();
        let dropped = admit(&on(), OnOverload::Reject, plan.makespan_ms + 1.0, &mut plan, &req, &cands, || None);
        assert_eq!(dropped, Ok(vec![]));
        assert_eq!(plan, before);
    }

    #[test]
    fn a_late_plan_is_refused_or_trimmed_by_the_policy() {
        let tokens: Vec<f64> = (0..40).map(|i| 20.0 + 10.0 * i as f64).collect();
        let req = Request { item_tokens: &tokens, prefix: 50.0, model: &MODEL };
        // One idle worker, one with 1 s of backlog: the split keeps to the idle one.
        let cands = busy(&[0.0, 1000.0]);
        let full = split_by_cost(&req, &cands, 8, 0.0);
        let left = full.makespan_ms / 2.0;

        let mut plan = full.clone();
        let e = admit(&on(), OnOverload::Reject, left, &mut plan, &req, &cands, || None).unwrap_err();
        assert_eq!(e.status(), 429);
        assert!(e.message.contains("cannot be met"), "{}", e.message);

        let mut plan = full.clone();
        let dropped = admit(&on(), OnOverload::Partial, left, &mut plan, &req, &cands, || None).unwrap();
        assert!(!dropped.is_empty() && dropped.len() < tokens.len(), "{} dropped", dropped.len());
        assert!(plan.makespan_ms <= left + 1e-9, "trimmed plan finishes in time: {}", plan.makespan_ms);
        let mut all: Vec<usize> = plan.shards.iter().flat_map(|s| s.items.iter().copied()).chain(dropped).collect();
        all.sort_unstable();
        assert_eq!(all, (0..tokens.len()).collect::<Vec<_>>(), "every item either planned or dropped");
        for s in &plan.shards {
            let want = MODEL.call_ms(50.0, s.items.iter().map(|&i| tokens[i]));
            assert!((s.compute_ms - want).abs() < 1e-6, "{} vs {want}", s.compute_ms);
        }

        // The margin tolerates a late prediction; disabled admits anything.
        let mut plan = full.clone();
        let lax = AdmissionConfig { margin: 1.5, ..on() };
        assert_eq!(admit(&lax, OnOverload::Reject, left, &mut plan, &req, &cands, || None), Ok(vec![]));
        let off = AdmissionConfig { enabled: false, ..on() };
        assert_eq!(admit(&off, OnOverload::Reject, 0.0, &mut plan, &req, &cands, || None), Ok(vec![]));
    }

    #[test]
    fn nothing_in_time_is_refused_even_when_partial() {
        let tokens = vec![100.0; 10];
        let req = Request { item_tokens: &tokens, prefix: 50.0, model: &MODEL };
        let cands = busy(&[500.0, 600.0]);
        let mut plan = split_by_cost(&req, &cands, 8, 0.0);
        let e = admit(&on(), OnOverload::Partial, 400.0, &mut plan, &req, &cands, || None).unwrap_err();
        assert_eq!(e.status(), 429);
    }

    #[test]
    fn the_best_plan_is_tried_before_refusing() {
        let tokens = vec![100.0; 40];
        let req = Request { item_tokens: &tokens, prefix: 50.0, model: &MODEL };
        let cands = busy(&[0.0; 4]);
        let one = crate::split::split_whole(&req, &cands, 0);
        let best = split_by_cost(&req, &cands, 8, 0.0);
        assert!(best.makespan_ms < one.makespan_ms);
        let mut plan = one;
        let left = best.makespan_ms + 1.0;
        assert_eq!(admit(&on(), OnOverload::Reject, left, &mut plan, &req, &cands, || Some(best.clone())), Ok(vec![]));
        assert_eq!(plan, best);
    }
}
