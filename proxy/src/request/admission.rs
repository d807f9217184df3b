//! Admission control: never queue work the deadline will throw away.
//!
//! The splitter's plan carries each shard's predicted finish from the cluster state the proxy
//! tracks (every worker's backlog, its measured speed, the shards packed before it). When the
//! slowest shard of the best plan is predicted to finish after the request's deadline, sending
//! the request only adds load that delays everyone else and is then dropped at the deadline.
//!
//! "Predicted to finish" is the prediction as the proxy has measured it to err: the plan's
//! makespan times the q quantile of actual over predicted shard time (`[admission] quantile`,
//! p99 by default: the tail the deadline is judged at; held to hedging's p95, one admitted plan
//! in twenty would be late by design, and in an overload those are the p99); a plan of k shards
//! is in time only when all k are, so each is held to the q^(1/k) quantile, for the same chance
//! q of the whole plan being in time whatever its k. The quantile is of the shards predicted at
//! least a quarter to a half as long as the plan (by power-of-two classes) ([`crate::estimate::latency_ratio`]): what a prediction
//! leaves out (a worker's tokenizing and HTTP) is a larger share of a short shard, so long plans
//! held to every shard's error were refused when they would have finished in time.
//! Taking the prediction at face value admits, in an overload, a queue that
//! reaches exactly to the deadline: every request then admitted finishes near it, about half
//! of them after it, and their work is thrown away (shards answered, the request still late)
//! while it delays the next ones. Held to the quantile, what is admitted finishes in time but
//! for that quantile's tail, and the work refused is the work that would have been wasted.
//!
//! Stalls are left out of that error. A stall (a GC pause, throttling, a noisy neighbour: one call
//! held up, with the calls queued behind it on its worker) is not predicted by load, so refusing a
//! request does not avoid one (the next request meets stalls as often), while a wide plan held to
//! the q^(1/k) quantile is held to about the worst shard of the window, which with a few percent of
//! calls stalled is a stall, and it would refuse requests that would mostly have been answered.
//! Admission is for the work *queueing* makes late, and queueing is told from a stall by what the
//! other shards of the moment did: queueing makes every shard late at once, a stall one worker's.
//! So a shard that took more than `[admission] stall_factor` (2) times the median ratio of the
//! shards measured just before it (the latest 64, this request's and others') counts as a stall and
//! is left out ([`crate::estimate::latency_ratio`]); in a burst the median rises with the lateness
//! within a fraction of a second, and from then on the late shards count. The reference is the
//! latest shards of every request rather than the request's own other shards so that a plan of one
//! shard (a whole request, which has no others) is judged the same way, and so that nothing waits
//! for a request's last shard (a stalled one may end at the deadline). A one-shard plan is thus
//! held to the q quantile of the error without stalls, like any plan: its own stall could not be
//! foreseen either. The shards that lag are still hedged (hedging's quantile counts every shard): a
//! stall is what a hedge is for. One cost: a size of shard that runs more than `stall_factor` times
//! the median error for a reason of its own (short shards run slower on a GPU) would be left out
//! too; that moves only short plans, which the deadline rarely reaches, since a plan is held to the
//! shards of about its own length.
//!
//! A plan whose every shard starts at once on an idle worker is taken at face value: it queues
//! ahead of nobody, so holding it to an error measured under an earlier overload would only
//! lose a request.
//!
//! When the chosen plan (the load-priced one) is late, a plan of more shards may still be in
//! time, and the one tried is the plan of fewest shards that is ([`fewest_shards_within`]), not
//! the fastest: each extra shard is its fixed cost and prefix of extra work, and in an overload
//! every request is near the edge, so the widest split would buy each request its deadline
//! with work that pushes the next ones past theirs (the fastest plan is 16 shards where 2
//! would do). Only when even the fastest plan is late is the request late.
//! Then it is answered at once, by its `on_overload` policy:
//!
//! - `reject` (default): 429 with `Retry-After`, before any shard is sent;
//! - `partial`: each late shard keeps the cheapest of its items that still finish in time
//!   (its start is what its worker already has; its fixed cost and prefix are paid once), the
//!   rest are listed in `missing`; a plan with nothing left is refused as with `reject`.
//!
//! `[admission] margin` tolerates predictions late by that fraction of the time left (they are
//! estimates); `[admission] enabled = false` turns all of this off.

use std::time::{Duration, Instant};

use sieve_shared::proxy_config::AdmissionConfig;
use sieve_shared::{ApiError, OnOverload};

use crate::estimate::latency_ratio::RatioTracker;
use crate::metrics as m;
use crate::split::{Candidate, Plan, Request};

/// The ratio a plan of `k` shards predicted to take `makespan_ms` is held to: the q^(1/k)
/// quantile (q: `[admission] quantile`) of actual over predicted time of the shards measured
/// within `[admission] error_window_ms` that were predicted about as long and were not stalls
/// (`[admission] stall_factor`); 1 (face value) until `min_samples` such shards were measured,
/// and with the stall test on, until it can tell a stall (the first 64 shards: a cold proxy
/// held every plan to one frozen worker's stall).
pub fn late_ratio(ratios: &RatioTracker, cfg: &AdmissionConfig, min_samples: usize, k: usize, makespan_ms: f64) -> f64 {
    let q = cfg.quantile.powf(1.0 / k.max(1) as f64);
    let window = Duration::from_millis(cfg.error_window_ms);
    ratios.recent_quantile(q, min_samples, window, cfg.stall_factor, makespan_ms, Instant::now()).unwrap_or(1.0)
}

/// Checks `plan` against the time left. `Ok` with the items removed from the plan (empty when
/// it is admitted whole); `Err` is the 429 to answer. `late_ratio(k, makespan_ms)` is the
/// quantile of actual over predicted shard time a plan of k shards and that makespan is held to (1: predictions taken at face
/// value); a plan is late when its makespan times that ratio passes the time left. When the
/// chosen plan is late, `best` is asked for the plan of least work that is in time by the test
/// it is given, else the fastest there is: a request is refused only when even that one is late.
#[allow(clippy::too_many_arguments)]
pub fn admit(
    cfg: &AdmissionConfig,
    policy: OnOverload,
    left_ms: f64,
    late_ratio: impl Fn(usize, f64) -> f64,
    plan: &mut Plan,
    req: &Request<'_>,
    candidates: &[Candidate],
    best: impl FnOnce(&dyn Fn(&Plan) -> bool) -> Option<Plan>,
) -> Result<Vec<usize>, ApiError> {
    if !cfg.enabled {
        return Ok(Vec::new());
    }
    let ratio = |plan: &Plan| {
        // A plan whose every shard starts at once, on an idle worker, queues ahead of nobody:
        // if it runs late it wastes capacity nobody was waiting for, while refusing it on an
        // error measured in some earlier overload (where the error is queueing) loses a request
        // that would most likely have been answered. Only a plan that waits is held to it.
        if plan.shards.iter().all(|s| candidates.get(s.candidate).is_some_and(|c| c.available_ms <= 0.0)) {
            return 1.0;
        }
        let r = late_ratio(plan.shards.len().max(1), plan.makespan_ms);
        if r.is_finite() && r > 0.0 {
            r
        } else {
            1.0
        }
    };
    // In predicted ms: what a plan's prediction may reach and still finish in time as measured.
    let limit = |plan: &Plan| left_ms.max(0.0) * (1.0 + cfg.margin) / ratio(plan);
    let fits = |plan: &Plan| plan.makespan_ms <= limit(plan);
    if fits(plan) {
        return Ok(Vec::new());
    }
    if let Some(b) = best(&fits).filter(|b| b.makespan_ms < plan.makespan_ms) {
        *plan = b;
        if fits(plan) {
            return Ok(Vec::new());
        }
    }
    let ratio = ratio(plan);
    let limit = limit(plan);
    // The refusal states the prediction and what the deadline allows in the same terms: the
    // plan's time as measured shards of its size run (its estimate times `ratio`), against the
    // time left with `[admission] margin`; the first is over the second, or it was admitted.
    let message = refusal(plan.shards.len(), plan.makespan_ms, ratio, left_ms, cfg.margin);
    let refuse = || {
        metrics::counter!(m::ADMISSION_REJECTED).increment(1);
        ApiError::overloaded(message.clone())
    };
    match policy {
        OnOverload::Reject => Err(refuse()),
        OnOverload::Partial => {
            let dropped = trim(plan, req, candidates, limit);
            if plan.shards.is_empty() {
                return Err(refuse());
            }
            metrics::counter!(m::ADMISSION_PARTIAL).increment(1);
            metrics::counter!(m::ADMISSION_DROPPED_ITEMS).increment(dropped.len() as u64);
            Ok(dropped)
        }
    }
}

/// The 429's message: the best plan's predicted time (`makespan_ms` estimated, times `ratio`, the
/// lateness recent shards of its size showed) against what the deadline allows (`left_ms`, with
/// `margin`), each with a decimal so that neither reads 0 when it is not.
fn refusal(shards: usize, makespan_ms: f64, ratio: f64, left_ms: f64, margin: f64) -> String {
    let predicted = makespan_ms * ratio;
    let allowed = left_ms.max(0.0) * (1.0 + margin);
    let estimate = if (ratio - 1.0).abs() > 1e-9 {
        format!(" (estimated {makespan_ms:.1} ms x {ratio:.2}, how late recent shards of its size ran)")
    } else {
        String::new()
    };
    let left = if left_ms > 0.0 {
        format!("{left_ms:.1} ms of the deadline are left ({allowed:.1} ms with [admission] margin {margin})")
    } else {
        format!("the deadline passed {:.1} ms ago", -left_ms)
    };
    format!(
        "the deadline cannot be met: the best plan ({shards} shard{}) is predicted to take {predicted:.1} ms{estimate}, \
         and {left}; retry later, with a longer deadline (deadline_ms in the body, the x-sieve-deadline-ms header, \
         or [deadline] default_ms in the proxy's config), or with \"on_overload\": \"partial\"",
        if shards == 1 { "" } else { "s" }
    )
}

/// The plan of fewest shards that `fits`, else the fastest: `plan_with(cap)` plans on at most
/// `cap` shards (the fastest such plan), so a larger cap is never slower and the smallest cap
/// that fits is found by bisection (log2 `max_shards` plans).
pub fn fewest_shards_within(
    fits: &dyn Fn(&Plan) -> bool,
    max_shards: usize,
    plan_with: impl Fn(usize) -> Plan,
) -> Plan {
    let mut fit = plan_with(max_shards.max(1));
    if !fits(&fit) {
        return fit;
    }
    let (mut lo, mut hi) = (1, max_shards.max(1));
    while lo < hi {
        let mid = (lo + hi) / 2;
        let p = plan_with(mid);
        if fits(&p) {
            hi = mid;
            fit = p;
        } else {
            lo = mid + 1;
        }
    }
    fit
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
            // Items kept by their own cost; a group's members left together pay its run once.
            if !req.groups.is_empty() && !kept.is_empty() {
                compute = compute.min(tf * req.shard_ms(&candidates[s.candidate], &kept));
            }
            s.tokens = req.shard_tokens(&kept);
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
    #[test]
    fn a_refusal_states_the_prediction_over_what_the_deadline_allows() {
        let m = refusal(2, 30.0, 1.5, 20.0, 0.1);
        for part in [
            "(2 shards) is predicted to take 45.0 ms (estimated 30.0 ms x 1.50",
            "20.0 ms of the deadline are left (22.0 ms with [admission] margin 0.1)",
            "deadline_ms in the body, the x-sieve-deadline-ms header, or [deadline] default_ms",
        ] {
            assert!(m.contains(part), "{m:?} lacks {part:?}");
        }
        // A prediction under a millisecond is not "0 ms"; a deadline gone says so.
        let m = refusal(1, 0.4, 1.0, -3.0, 0.1);
        assert!(m.contains("(1 shard) is predicted to take 0.4 ms, and the deadline passed 3.0 ms ago"), "{m}");
    }

    use sieve_shared::CostModel;

    use super::*;
    use crate::split::{split_by_cost, NO_GROUPS};

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
    fn a_stall_only_window_admits_and_a_queueing_window_refuses() {
        let tokens = vec![100.0; 64];
        let req = Request { item_tokens: &tokens, prefix: 50.0, model: &MODEL, groups: &NO_GROUPS };
        // Every worker has a little backlog: the plan waits, so it is held to the measured error.
        let cands = busy(&[1.0; 8]);
        let wide = split_by_cost(&req, &cands, 8, 0.0);
        let (k, makespan) = (wide.shards.len(), wide.makespan_ms);
        assert!(k >= 4, "{k} shards");
        let left = 3.0 * makespan;
        let check = |ratios: &RatioTracker, cfg: &AdmissionConfig| {
            let mut plan = wide.clone();
            let held = |k: usize, ms: f64| late_ratio(ratios, cfg, 20, k, ms);
            admit(cfg, OnOverload::Reject, left, held, &mut plan, &req, &cands, |_| None).map_err(|e| e.status())
        };
        // Stalls: 3% of shards held up 5x to 40x, the others on time (1.0-1.11x). (The first 80
        // are on time: the stall test needs the latest 64 shards' median to compare with.)
        let on_time = |i: usize| 1.0 + (i % 8) as f64 / 64.0;
        let stalls = RatioTracker::new(0.95);
        for i in 0..512 {
            stalls.record(if i >= 80 && i % 33 == 32 { 5.0 + (i % 36) as f64 } else { on_time(i) }, makespan);
        }
        assert_eq!(late_ratio(&stalls, &on(), 20, k, makespan), on_time(7), "the error without the stalls");
        assert_eq!(check(&stalls, &on()), Ok(vec![]), "a stall is not refused for");
        // Held to every shard's error (the test off), the plan is held to a stall: refused.
        let every = AdmissionConfig { stall_factor: 0.0, ..on() };
        assert!(late_ratio(&stalls, &every, 20, k, makespan) >= 5.0);
        assert_eq!(check(&stalls, &every), Err(429));
        // Queueing: every shard late alike (3.0-3.9x), after shards that were on time.
        let late = |i: usize| 3.0 + (i % 8) as f64 / 8.0;
        let queueing = RatioTracker::new(0.95);
        for i in 0..128 {
            queueing.record(on_time(i), makespan);
        }
        for i in 0..512 {
            queueing.record(late(i), makespan);
        }
        assert_eq!(late_ratio(&queueing, &on(), 20, k, makespan), late(7));
        assert_eq!(check(&queueing, &on()), Err(429), "queueing's lateness is refused for");
        // A one-shard plan is held to the same error (q rather than q^(1/k)): stalls left out.
        assert_eq!(late_ratio(&stalls, &on(), 20, 1, makespan), on_time(7));
        assert_eq!(late_ratio(&queueing, &on(), 20, 1, makespan), late(7));
    }

    #[test]
    fn a_plan_that_fits_is_admitted_whole() {
        let tokens = vec![100.0; 20];
        let req = Request { item_tokens: &tokens, prefix: 50.0, model: &MODEL, groups: &NO_GROUPS };
        let cands = busy(&[0.0, 0.0]);
        let mut plan = split_by_cost(&req, &cands, 8, 0.0);
        let before = plan.clone();
        let dropped =
            admit(&on(), OnOverload::Reject, plan.makespan_ms + 1.0, |_, _| 1.0, &mut plan, &req, &cands, |_| None);
        assert_eq!(dropped, Ok(vec![]));
        assert_eq!(plan, before);
    }

    #[test]
    fn a_late_plan_is_refused_or_trimmed_by_the_policy() {
        let tokens: Vec<f64> = (0..40).map(|i| 20.0 + 10.0 * i as f64).collect();
        let req = Request { item_tokens: &tokens, prefix: 50.0, model: &MODEL, groups: &NO_GROUPS };
        // One idle worker, one with 1 s of backlog: the split keeps to the idle one.
        let cands = busy(&[0.0, 1000.0]);
        let full = split_by_cost(&req, &cands, 8, 0.0);
        let left = full.makespan_ms / 2.0;

        let mut plan = full.clone();
        let e = admit(&on(), OnOverload::Reject, left, |_, _| 1.0, &mut plan, &req, &cands, |_| None).unwrap_err();
        assert_eq!(e.status(), 429);
        assert!(e.message.contains("cannot be met"), "{}", e.message);

        let mut plan = full.clone();
        let dropped = admit(&on(), OnOverload::Partial, left, |_, _| 1.0, &mut plan, &req, &cands, |_| None).unwrap();
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
        assert_eq!(admit(&lax, OnOverload::Reject, left, |_, _| 1.0, &mut plan, &req, &cands, |_| None), Ok(vec![]));
        // Measured to run late, predictions count for more: a plan that waits for its worker
        // and fits the time left by less than the ratio is refused...
        let queued = busy(&[1.0, 1000.0]);
        let waits = split_by_cost(&req, &queued, 8, 0.0);
        let mut plan = waits.clone();
        let tight = waits.makespan_ms * 1.1;
        assert_eq!(admit(&on(), OnOverload::Reject, tight, |_, _| 1.0, &mut plan, &req, &queued, |_| None), Ok(vec![]));
        let e = admit(&on(), OnOverload::Reject, tight, |_, _| 1.2, &mut plan, &req, &queued, |_| None).unwrap_err();
        assert_eq!(e.status(), 429);
        let mut plan = waits.clone();
        let dropped = admit(&on(), OnOverload::Partial, tight, |_, _| 1.2, &mut plan, &req, &queued, |_| None).unwrap();
        assert!(!dropped.is_empty() && plan.makespan_ms * 1.2 <= tight + 1e-9, "trimmed to the measured error");
        // ...while one that starts at once on an idle worker is taken at face value.
        let mut plan = full.clone();
        let tight = full.makespan_ms * 1.1;
        assert_eq!(admit(&on(), OnOverload::Reject, tight, |_, _| 10.0, &mut plan, &req, &cands, |_| None), Ok(vec![]));
        let off = AdmissionConfig { enabled: false, ..on() };
        assert_eq!(admit(&off, OnOverload::Reject, 0.0, |_, _| 1.0, &mut plan, &req, &cands, |_| None), Ok(vec![]));
    }

    #[test]
    fn nothing_in_time_is_refused_even_when_partial() {
        let tokens = vec![100.0; 10];
        let req = Request { item_tokens: &tokens, prefix: 50.0, model: &MODEL, groups: &NO_GROUPS };
        let cands = busy(&[500.0, 600.0]);
        let mut plan = split_by_cost(&req, &cands, 8, 0.0);
        let e = admit(&on(), OnOverload::Partial, 400.0, |_, _| 1.0, &mut plan, &req, &cands, |_| None).unwrap_err();
        assert_eq!(e.status(), 429);
    }

    #[test]
    fn the_best_plan_is_tried_before_refusing() {
        let tokens = vec![100.0; 40];
        let req = Request { item_tokens: &tokens, prefix: 50.0, model: &MODEL, groups: &NO_GROUPS };
        let cands = busy(&[0.0; 4]);
        let one = crate::split::split_whole(&req, &cands, 0);
        let best = split_by_cost(&req, &cands, 8, 0.0);
        assert!(best.makespan_ms < one.makespan_ms);
        let mut plan = one;
        let left = best.makespan_ms + 1.0;
        assert_eq!(
            admit(&on(), OnOverload::Reject, left, |_, _| 1.0, &mut plan, &req, &cands, |_| Some(best.clone())),
            Ok(vec![])
        );
        assert_eq!(plan, best);
    }

    #[test]
    fn the_fallback_is_the_fewest_shards_in_time() {
        let tokens = vec![100.0; 64];
        let req = Request { item_tokens: &tokens, prefix: 50.0, model: &MODEL, groups: &NO_GROUPS };
        // Every worker has a little backlog: plans wait, so they are held to the ratio.
        let cands = busy(&[1.0; 8]);
        let with = |cap: usize| split_by_cost(&req, &cands, cap, 0.0);
        let (one, two, eight) = (with(1), with(2), with(8));
        assert!(eight.makespan_ms < two.makespan_ms && two.makespan_ms < one.makespan_ms);
        // Room for two shards' makespan, not one's: two shards, not the fastest eight.
        let within = |ms: f64| move |p: &Plan| p.makespan_ms <= ms;
        let plan = fewest_shards_within(&within(two.makespan_ms + 1.0), 8, with);
        assert_eq!(plan.shards.len(), 2);
        assert_eq!(fewest_shards_within(&within(one.makespan_ms), 8, with).shards.len(), 1);
        // Nothing fits: the fastest, which admission then refuses or trims.
        assert_eq!(fewest_shards_within(&within(eight.makespan_ms - 1.0), 8, with), eight);

        // Through admission: a one-shard plan, late; the two-shard plan is admitted.
        let mut plan = one.clone();
        let left = two.makespan_ms + 1.0;
        let best = |fits: &dyn Fn(&Plan) -> bool| Some(fewest_shards_within(fits, 8, with));
        assert_eq!(admit(&on(), OnOverload::Reject, left, |_, _| 1.0, &mut plan, &req, &cands, best), Ok(vec![]));
        assert_eq!(plan.shards.len(), 2);
        // Held to a stricter ratio the more shards a plan has (here k for k shards), two
        // shards are late too, and so is every wider plan: refused.
        let mut plan = one.clone();
        let per_k = |k: usize, _: f64| k as f64;
        let e = admit(&on(), OnOverload::Reject, left, per_k, &mut plan, &req, &cands, best).unwrap_err();
        assert_eq!(e.status(), 429);
    }
}
