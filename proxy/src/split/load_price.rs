//! The load price: what a plan's work adds to the waiting of the requests that arrive behind
//! it. The cost split scores a plan by its makespan plus this price, so a request is split only
//! while the time it saves itself outweighs what its extra work costs everyone else. The price
//! has two forms, one per regime of the cluster model below, and `[split] load_aware` switches
//! it on:
//!
//! ```text
//! every worker busy (V_min > 0):   Θ · V_min · X      Θ = ρ/((1 − ρ)·W̄)
//! some worker idle  (V_min = 0):   θ · Σ_j (f_j² − a_j²)/2  =  θ · Σ_j (a_j·x_j + x_j²/2)
//! θ = λ/(1 − ρ),  λ = ρ/S
//! ```
//!
//! X is the plan's total work (every shard's compute: the items, and each shard's fixed cost
//! and prefix), V_min the least backlog of any worker, W̄ the mean work of a request (measured:
//! [`super::CostSplit`] keeps a running mean of its plans' X), S the mean predicted time of a
//! shard in flight, and for each worker j the plan uses, a_j its backlog, x_j the plan's work
//! there and f_j = a_j + x_j its finish.
//!
//! Derivation. Under least-loaded balancing a new arrival goes to the worker with the least
//! backlog and waits that backlog. What waits is a request: a request split k ways is late by
//! its slowest shard, once, not once per shard.
//!
//! Every worker busy. The N workers drain as one pool, N ms of work per ms whoever holds it,
//! and the backlogs stay level; work X added now is in front of every arrival until some worker
//! next goes idle, which with the work arriving meanwhile (utilisation ρ) is V_min/(1 − ρ) away,
//! and each request arriving meanwhile is X/N later, whatever its shards. Requests arrive at N·ρ/W̄ per ms (work arriving per ms over the work of
//! a request), so to first order in X: N·ρ/W̄ · V_min/(1 − ρ) · X/N = Θ·V_min·X. Counting shards
//! instead (λ = ρ/S per worker, the earlier form of this price) charges a request of k shards k
//! times: at low load, where requests split many ways, it priced a momentary full house (every
//! worker busy for a moment after one large split) at about k = W̄/S times the delay it causes,
//! and the requests planned then split fewer ways where a wider split finished sooner. Near saturation a request is one shard or two, W̄ ≈ S, and
//! the two counts agree. The price grows with the plan's work only, not with where the shards
//! go (the makespan already prices that): an extra shard adds its fixed cost and prefix c to X
//! and costs Θ·V_min·c, against the W/(k(k + 1)) it saves a request of W ms split k ways. With
//! L shards in flight per worker, Θ ≈ 2L/W̄ and V_min ≈ L·S, so an extra shard costs ≈
//! 2L²·c·S/W̄: as the queues grow (and requests split less, W̄/S toward 1) k falls as 1/L, to one
//! shard on the least-loaded worker (the one-shard plan of least makespan) once that passes W/2:
//! at saturation ours does the least work there is, as a whole request to the least-loaded
//! worker does. The per-worker form below would be wrong here: its x²/2 falls as shards shrink,
//! so it rewards splitting exactly when the cluster is full (more work, and a p99 behind the
//! whole request on the least-loaded worker); least-loaded arrivals do not queue behind one
//! worker's shard while another is freer, they queue behind the pool.
//!
//! Some worker idle. Then the backlogs are not level and the pool argument fails: the work is
//! not shared, each worker drains only its own, and the arrivals behind a plan land on the
//! workers it left least loaded, which may be the ones it just filled. A worker j taken from
//! a_j to f_j then has x_j more work in front of whatever reaches it over the next f_j ms,
//! everything up to a_j in full and then less as its own shard runs down: at λ arrivals per ms,
//! stretched by 1/(1 − ρ) as in the pool, that is θ·∫ = θ·(a_j·x_j + x_j²/2). This is not zero
//! while a worker is idle (the earlier form of this price was, and the split took the plan of
//! least makespan, over every idle worker): a plan that takes every idle worker pays for the
//! work it leaves in front of the next arrivals, a shard behind a backlog pays for it, and of
//! two plans of the same makespan the one with smaller shards on emptier workers wins. A small
//! request still splits: its shards are small, and so is x²/2.
//!
//! Here every request that lands on worker j is late by what is in front of it there, and the
//! requests landing on j are its shards: λ = ρ/S per worker counts them.
//!
//! ρ comes from the state the proxy already tracks, averaged over the workers: L, the mean
//! number of shards in flight per worker, and S = total backlog / total shards in flight, the
//! mean predicted shard time. Shards of a cost-balanced split are close to equal, so each
//! worker is taken as M/D/1, whose mean number in system is L = ρ(2 − ρ)/(2(1 − ρ)). Solved for
//! ρ: 1 − ρ = 1/(L + √(L² + 1)); so θ = ρ(L + √(L² + 1))/S and Θ = ρ(L + √(L² + 1))/W̄ (W̄
//! taken as at least S: a request is at least a shard). Both are 0 on an idle cluster and grow
//! without bound with the queues (≈ 2L/S, 2L/W̄); no threshold is set by hand: the two forms
//! meet where the model's regimes do, at V_min = 0.

use crate::cluster::worker::WorkerView;

/// The load price of one cluster state ([`Price::of`]); [`Price::NONE`] prices nothing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    /// θ = λ/(1 − ρ), per ms: λ the shards arriving per worker per ms (some worker idle).
    pub theta: f64,
    /// Θ = ρ/((1 − ρ)·W̄), per ms: the requests arriving per worker per ms over 1 − ρ (every
    /// worker busy).
    pub pool_theta: f64,
    /// V_min: the least predicted backlog of any worker before the plan, ms.
    pub least_backlog_ms: f64,
}

impl Price {
    /// No price: the split minimises the makespan alone.
    pub const NONE: Price = Price { theta: 0.0, pool_theta: 0.0, least_backlog_ms: 0.0 };

    /// The price of the cluster `views` describe, for requests of `mean_request_ms` of work on
    /// average (W̄): none when nothing is in flight.
    pub fn of(views: &[WorkerView], mean_request_ms: f64) -> Price {
        let least = views.iter().map(|v| v.backlog_ms).filter(|b| b.is_finite()).fold(f64::INFINITY, f64::min);
        let least_backlog_ms = if least.is_finite() && least > 0.0 { least } else { 0.0 };
        match load(views) {
            Some((l, s_ms)) => {
                let per_ms = arrivals_over_idle(l);
                // A request is at least a shard; an unknown mean counts shards.
                let w_ms = if mean_request_ms.is_finite() { mean_request_ms.max(s_ms) } else { s_ms };
                Price { theta: per_ms / s_ms, pool_theta: per_ms / w_ms, least_backlog_ms }
            }
            None => Price { least_backlog_ms, ..Price::NONE },
        }
    }

    pub fn is_none(&self) -> bool {
        !(self.theta > 0.0 && self.theta.is_finite() && self.pool_theta.is_finite())
    }

    /// What a plan adds to others' waiting, in ms: `work_ms` its total compute X, and
    /// `spread_ms2` Σ (f_j² − a_j²)/2 over its workers (a_j the backlog a worker had, f_j its
    /// finish with the plan's shards). Every worker busy: the pool's Θ·V_min·X; some idle: each
    /// worker's own θ·Σ (f_j² − a_j²)/2.
    pub fn of_plan(&self, work_ms: f64, spread_ms2: f64) -> f64 {
        if self.is_none() {
            0.0
        } else if self.least_backlog_ms > 0.0 {
            self.pool_theta * self.least_backlog_ms * work_ms
        } else {
            self.theta * spread_ms2
        }
    }
}

/// θ (per ms) for the cluster `views` describe: 0 when nothing is in flight.
pub fn theta(views: &[WorkerView]) -> f64 {
    load(views).map_or(0.0, |(l, s_ms)| theta_from(l, s_ms))
}

/// L, the mean shards in flight per worker, and S, their mean predicted time (ms); None when
/// nothing is in flight.
fn load(views: &[WorkerView]) -> Option<(f64, f64)> {
    let in_flight: f64 = views.iter().map(|v| v.in_flight as f64).sum();
    let backlog: f64 = views.iter().map(|v| v.backlog_ms).filter(|b| b.is_finite() && *b > 0.0).sum();
    if views.is_empty() || in_flight <= 0.0 || backlog <= 0.0 {
        return None;
    }
    Some((in_flight / views.len() as f64, backlog / in_flight))
}

/// θ for a mean of `l` shards in flight per worker, of mean predicted time `s_ms` (M/D/1).
pub fn theta_from(l: f64, s_ms: f64) -> f64 {
    if s_ms > 0.0 {
        arrivals_over_idle(l) / s_ms
    } else {
        0.0
    }
}

/// ρ/(1 − ρ) for a mean of `l` shards in flight per worker (M/D/1): θ·S, Θ·W̄. 0 when idle.
fn arrivals_over_idle(l: f64) -> f64 {
    if !(l > 0.0 && l.is_finite()) {
        return 0.0;
    }
    let inv_idle = l + (l * l + 1.0).sqrt(); // 1/(1 − ρ)
    let rho = 1.0 - 1.0 / inv_idle;
    rho * inv_idle
}

#[cfg(test)]
mod tests {
    use sieve_shared::CostModel;

    use super::*;
    use crate::split::{split_by_cost, split_by_cost_priced, work_ms, Candidate, Plan, Request, NO_GROUPS};

    fn view(backlog_ms: f64, in_flight: u64) -> WorkerView {
        WorkerView { backlog_ms, in_flight, time_factor: 1.0, max_batch_tokens: 0, holds_prefix: false }
    }

    #[test]
    fn theta_is_zero_when_idle_and_grows_with_the_queues() {
        assert_eq!(theta(&[]), 0.0);
        assert_eq!(theta(&[view(0.0, 0); 8]), 0.0);
        // M/D/1 at ρ = 0.5: L = 0.5 · 1.5 / 1 = 0.75; θ = λ/(1 − ρ) = (0.5/S)/0.5 = 1/S.
        assert!((theta_from(0.75, 40.0) - 1.0 / 40.0).abs() < 1e-12);
        // ρ = 0.9: L = 0.9 · 1.1 / 0.2 = 4.95; θ = (0.9/S)/0.1.
        assert!((theta_from(4.95, 40.0) - 9.0 / 40.0).abs() < 1e-9);
        let mut last = 0.0;
        for l in 1..40u64 {
            let t = theta(&vec![view(40.0 * l as f64, l); 16]);
            assert!(t > last && t.is_finite(), "L={l}: {t}");
            last = t;
        }
        assert!((last / (2.0 * 39.0 / 40.0) - 1.0).abs() < 0.02, "≈ 2L/S for long queues: {last}");
        assert_eq!(theta(&[view(f64::NAN, 3)]), 0.0, "no finite backlog: no price");
    }

    /// Σ (f_j² − a_j²)/2 over the workers of `plan`: f_j its finish there, a_j the backlog.
    fn spread(plan: &Plan, candidates: &[Candidate]) -> f64 {
        let mut finish: Vec<f64> = candidates.iter().map(|c| c.available_ms).collect();
        for s in &plan.shards {
            finish[s.candidate] = finish[s.candidate].max(s.finish_ms);
        }
        finish.iter().zip(candidates).map(|(f, c)| (f * f - c.available_ms * c.available_ms) / 2.0).sum()
    }

    #[test]
    fn the_price_is_the_pools_while_all_are_busy_and_each_workers_while_one_is_idle() {
        let model = CostModel { request_ms: 10.0, token_ms: 0.1, token_context_ms: 0.0 };
        let tokens = vec![100.0; 4];
        let req = Request { item_tokens: &tokens, prefix: 0.0, model: &model, groups: &NO_GROUPS };
        let c = vec![Candidate { available_ms: 5.0, time_factor: 1.0, max_batch_tokens: 0, holds_prefix: false }];
        let plan = split_by_cost(&req, &c, 1, 0.0);
        // One shard of 10 + 40 ms after 5 ms: X = 50, (55² − 5²)/2 = 5·50 + 50²/2 = 1500.
        assert!((work_ms(&plan) - 50.0).abs() < 1e-9);
        assert!((spread(&plan, &c) - 1500.0).abs() < 1e-9);
        let busy = [view(30.0, 1), view(10.0, 1), view(f64::NAN, 0), view(40.0, 2)];
        let p = Price::of(&busy, f64::NAN);
        assert_eq!(p.least_backlog_ms, 10.0, "V_min over the finite backlogs");
        assert!((p.theta - theta(&busy)).abs() < 1e-15);
        assert_eq!(p.pool_theta, p.theta, "no mean request known: shards are counted");
        assert!((p.of_plan(50.0, 1500.0) - p.theta * 10.0 * 50.0).abs() < 1e-9, "all busy: Θ·V_min·X");
        // S = 80/4 = 20 ms a shard; requests of four shards' work arrive a quarter as often.
        let per_request = Price::of(&busy, 80.0);
        assert_eq!(per_request.theta, p.theta, "the per-worker θ counts shards still");
        assert!((per_request.pool_theta - p.theta / 4.0).abs() < 1e-15, "Θ = θ·S/W̄");
        assert!((per_request.of_plan(50.0, 1500.0) - p.of_plan(50.0, 1500.0) / 4.0).abs() < 1e-9);
        assert_eq!(Price::of(&busy, 5.0), p, "a request is at least a shard");
        assert!(p.of_plan(60.0, 1500.0) > p.of_plan(50.0, 1500.0), "more work, a higher price");
        let one_idle = [view(0.0, 0), view(400.0, 5), view(400.0, 5)];
        let p = Price::of(&one_idle, 400.0);
        assert!(p.theta > 0.0 && p.least_backlog_ms == 0.0);
        assert!((p.of_plan(50.0, 1500.0) - p.theta * 1500.0).abs() < 1e-9, "one idle: θ·Σ(f² − a²)/2");
        assert!(p.of_plan(50.0, 1250.0) > 0.0, "work on an idle worker is not free");
        assert_eq!(Price::of(&[view(0.0, 0); 4], 50.0), Price::NONE, "nothing in flight: no load to price");
        assert_eq!(Price::NONE.of_plan(1e6, 1e6), 0.0);
        // Split four ways, the same items cost three more fixed costs of work.
        let four = vec![Candidate { available_ms: 0.0, time_factor: 1.0, max_batch_tokens: 0, holds_prefix: false }; 4];
        let split = split_by_cost(&req, &four, 4, 0.0);
        assert_eq!(split.shards.len(), 4);
        assert!((work_ms(&split) - 80.0).abs() < 1e-9);
    }

    #[test]
    fn a_quiet_cluster_splits_over_its_idle_workers_and_taking_them_all_pays() {
        let model = CostModel { request_ms: 10.0, token_ms: 0.02, token_context_ms: 0.0 };
        let tokens: Vec<f64> = (0..400).map(|i| 40.0 + (i % 7) as f64 * 30.0).collect();
        let req = Request { item_tokens: &tokens, prefix: 60.0, model: &model, groups: &NO_GROUPS };
        // Eight idle workers ranked first, eight with four 50 ms shards queued.
        let views: Vec<WorkerView> = (0..16).map(|i| if i < 8 { view(0.0, 0) } else { view(200.0, 4) }).collect();
        let cands: Vec<Candidate> = views.iter().map(Candidate::from).collect();
        let price = Price::of(&views, model.call_ms(60.0, tokens.iter().copied()));
        assert!(price.theta > 0.0 && price.least_backlog_ms == 0.0);
        let small = Request { item_tokens: &tokens[..20], ..req };
        let plan = split_by_cost_priced(&small, &cands, 16, 0.02, price);
        assert!(plan.shards.len() >= 2, "a small request still splits: {}", plan.shards.len());
        let plain = split_by_cost(&req, &cands, 16, 0.02);
        let priced = split_by_cost_priced(&req, &cands, 16, 0.02, price);
        assert!(priced.shards.len() >= 4, "a large one splits wide: {}", priced.shards.len());
        let all_idle = split_by_cost(&req, &cands, 8, 0.0);
        assert_eq!(all_idle.shards.len(), 8);
        assert!(price.of_plan(work_ms(&all_idle), spread(&all_idle, &cands)) > 0.0, "taking every idle worker pays");
        let score = |p: &Plan| p.makespan_ms + price.of_plan(work_ms(p), spread(p, &cands));
        assert!(score(&priced) <= score(&plain), "{} vs {}", score(&priced), score(&plain));
    }

    #[test]
    fn shards_fall_toward_one_on_the_least_loaded_as_the_cluster_fills() {
        let model = CostModel { request_ms: 10.0, token_ms: 0.02, token_context_ms: 0.0 };
        let tokens: Vec<f64> = (0..200).map(|i| 40.0 + (i % 7) as f64 * 30.0).collect();
        let req = Request { item_tokens: &tokens, prefix: 60.0, model: &model, groups: &NO_GROUPS };
        let mut counts = Vec::new();
        for queued in [0u64, 1, 2, 4, 8, 16] {
            // Every worker has `queued` shards of 40 ms; the first-ranked has one fewer.
            let views: Vec<WorkerView> =
                (0..16).map(|i| view(40.0 * queued.saturating_sub(u64::from(i == 0)) as f64, queued)).collect();
            let cands: Vec<Candidate> = views.iter().map(Candidate::from).collect();
            let price = Price::of(&views, model.call_ms(req.prefix, tokens.iter().copied()));
            let plan = split_by_cost_priced(&req, &cands, 64, 0.02, price);
            if queued == 0 {
                assert_eq!(plan, split_by_cost(&req, &cands, 64, 0.02), "θ 0 is the plain cost split");
            }
            counts.push(plan.shards.len());
            if queued == 16 {
                assert_eq!(plan.shards.len(), 1, "saturated: one shard");
                assert_eq!(plan.shards[0].candidate, 0, "on the least-loaded worker");
            }
        }
        assert!(counts.windows(2).all(|w| w[0] >= w[1]), "shard counts fall as the queues grow: {counts:?}");
        assert!(counts[0] >= 8, "a quiet cluster splits: {counts:?}");
    }

    #[test]
    fn a_momentary_full_house_at_low_load_still_splits_a_large_request_wide() {
        // Just after a large request was split 16 ways at 30% load: every worker busy for a
        // moment, one or two shards each, the backlogs far from level (46 to 196 ms).
        let model = CostModel { request_ms: 8.0, token_ms: 0.02, token_context_ms: 0.0 };
        let tokens: Vec<f64> = (0..300).map(|i| 50.0 + (i % 7) as f64 * 20.0).collect();
        let req = Request { item_tokens: &tokens, prefix: 60.0, model: &model, groups: &NO_GROUPS };
        let views: Vec<WorkerView> = (0..16).map(|i| view(46.0 + 10.0 * i as f64, 1 + u64::from(i >= 8))).collect();
        let cands: Vec<Candidate> = views.iter().map(Candidate::from).collect();
        let whole = model.call_ms(req.prefix, tokens.iter().copied());
        let per_request = split_by_cost_priced(&req, &cands, 16, 0.02, Price::of(&views, whole));
        let per_shard = split_by_cost_priced(&req, &cands, 16, 0.02, Price::of(&views, f64::NAN));
        let plain = split_by_cost(&req, &cands, 16, 0.02);
        // Counting shards charges this request for every shard of the requests behind it: 4
        // ways, 235 ms; counting requests, 8 ways, 173 ms (the plain cost split: 10, 167 ms).
        assert!(per_shard.shards.len() <= 5, "per shard: {}", per_shard.shards.len());
        assert!(per_request.shards.len() >= 7, "per request: {}", per_request.shards.len());
        assert!(per_request.shards.len() <= plain.shards.len());
        assert!(
            per_request.makespan_ms < 0.8 * per_shard.makespan_ms,
            "{} vs {}",
            per_request.makespan_ms,
            per_shard.makespan_ms
        );
    }
}
