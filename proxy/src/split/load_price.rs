//! The price of work: what one more millisecond of compute sent to the cluster costs every
//! other request, in milliseconds of their queueing. The cost split adds it to a plan's
//! predicted makespan (`makespan + price x total work`), so a request is split only while the
//! time it saves itself outweighs what its extra shards (each pays the call's fixed cost and
//! the prefix again) add to everyone's waiting.
//!
//! Derivation: each worker is a single-server queue with utilisation ρ. For M/M/1 the total
//! waiting per unit time is λ·W_q = λ·ρ·S/(1 − ρ) with ρ = λ·S; adding δ of work to every job
//! (arrival rate λ fixed) changes it by λ·δ·ρ(2 − ρ)/(1 − ρ)², that is by
//!
//! ```text
//! price(ρ) = ρ(2 − ρ) / (1 − ρ)²     ms of others' waiting per ms of work added
//! ```
//!
//! 0 on an idle cluster (split freely: the extra work delays nobody), about 1 at ρ = 0.3, 3 at
//! 0.5, 99 at 0.9, unbounded as ρ → 1 (one shard, on the least-loaded worker: the least work).
//! ρ is read from the state the proxy already tracks: for any single-server queue the chance
//! that it is busy is its utilisation, so ρ is estimated as the share of candidate workers
//! with predicted backlog. No load threshold is set by hand; the only constant, [`MAX_PRICE`],
//! keeps the arithmetic finite when every worker is busy.
//!
//! Off by default (`[split] load_aware`): in a short comparison run (16 sim-workers, 3 s per
//! load) it removed the 90%-load misses but raised ours' p99 at 50% load from ~210 to ~670 ms.
//! The M/M/1 price counts only what extra work adds to others' queueing; it ignores that
//! smaller shards also shorten the residual service others wait behind (the E[S²] term of
//! Pollaczek-Khinchine), so it overprices splitting at moderate load.

use super::Candidate;

/// Stands for an unbounded price: far above any makespan, so the plan of least work wins.
pub const MAX_PRICE: f64 = 1e9;

/// The cluster's utilisation as the share of candidates with work queued or running.
pub fn utilisation(candidates: &[Candidate]) -> f64 {
    if candidates.is_empty() {
        return 0.0;
    }
    candidates.iter().filter(|c| c.available_ms > 0.0).count() as f64 / candidates.len() as f64
}

/// Others' waiting per unit of work added at utilisation `rho` (M/M/1), at most [`MAX_PRICE`].
pub fn price_at(rho: f64) -> f64 {
    if rho.is_nan() || rho <= 0.0 {
        return 0.0;
    }
    if rho >= 1.0 {
        return MAX_PRICE;
    }
    (rho * (2.0 - rho) / ((1.0 - rho) * (1.0 - rho))).min(MAX_PRICE)
}

/// The price of work on these candidates now.
pub fn price(candidates: &[Candidate]) -> f64 {
    price_at(utilisation(candidates))
}

#[cfg(test)]
mod tests {
    use sieve_shared::CostModel;

    use super::*;
    use crate::split::{split_by_cost, split_by_cost_priced, Request};

    fn cands(backlogs: &[f64]) -> Vec<Candidate> {
        backlogs.iter().map(|&b| Candidate { available_ms: b, time_factor: 1.0, max_batch_tokens: 0 }).collect()
    }

    #[test]
    fn the_price_grows_with_utilisation_without_bound() {
        assert_eq!(price(&cands(&[0.0; 8])), 0.0);
        assert_eq!(price(&[]), 0.0);
        assert!((price_at(0.5) - 3.0).abs() < 1e-12);
        assert!((price_at(0.9) - 99.0).abs() < 1e-9);
        let mut last = 0.0;
        for busy in 1..8 {
            let mut b = vec![0.0; 8];
            b[..busy].iter_mut().for_each(|x| *x = 10.0);
            let p = price(&cands(&b));
            assert!(p > last, "{busy} busy: {p}");
            last = p;
        }
        assert_eq!(price(&cands(&[5.0; 8])), MAX_PRICE);
    }

    #[test]
    fn shards_fall_toward_one_on_the_least_loaded_as_the_cluster_fills() {
        let model = CostModel { request_ms: 10.0, token_ms: 0.02, token_context_ms: 0.0 };
        let tokens: Vec<f64> = (0..200).map(|i| 40.0 + (i % 7) as f64 * 30.0).collect();
        let req = Request { item_tokens: &tokens, prefix: 60.0, model: &model };
        let mut counts = Vec::new();
        for busy in [0, 4, 8, 12, 16] {
            // Ranked least-loaded first, as the policy gives them; the busy ones have 50 ms.
            let backlog: Vec<f64> = (0..16).map(|i| if i >= 16 - busy { 50.0 } else { 0.0 }).collect();
            let c = cands(&backlog);
            let plan = split_by_cost_priced(&req, &c, 64, 0.02, price(&c));
            if busy == 0 {
                assert_eq!(plan, split_by_cost(&req, &c, 64, 0.02), "price 0 is the plain cost split");
            }
            counts.push(plan.shards.len());
            if busy == 16 {
                assert_eq!(plan.shards.len(), 1, "a full cluster gets the least work");
                assert_eq!(plan.shards[0].candidate, 0, "on the least-loaded worker");
            }
        }
        assert!(counts.windows(2).all(|w| w[0] >= w[1]), "shard counts fall as load rises: {counts:?}");
        assert!(counts[0] >= 4 * counts[4], "{counts:?}");
    }
}
