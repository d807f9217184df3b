//! The load price θ: how much a plan's shards add to the waiting of the requests that arrive
//! behind them, per unit of the plan's externality. The cost split scores a plan by
//! `makespan + θ · Σ over shards (start·compute + compute²/2)`, so a request is split only while
//! the time it saves itself outweighs what its shards cost everyone else.
//!
//! Derivation. Each worker is a FIFO single-server queue with shard arrival rate λ and
//! utilisation ρ. Work x placed on a worker whose queue already holds V ms delays by x every
//! shard that arrives before that queue next empties: those arriving during the current busy
//! period, whose remaining length is V/(1 − ρ) (a busy period stretches by 1/(1 − ρ) for the
//! work arriving while it lasts), and on average by x/2 those arriving during x itself. The
//! expected waiting it adds to others is therefore
//!
//! ```text
//! λ/(1 − ρ) · (V·x + x²/2)  =  θ · (V·x + x²/2),    θ = λ/(1 − ρ)
//! ```
//!
//! Summed over a plan's shards (V: a shard's predicted start) this is both sides of splitting
//! at once. The linear term grows with every extra shard's fixed cost and prefix, weighted by
//! the backlog it queues behind; the quadratic term falls as shards shrink (one whole request
//! holds a worker, and everyone queued behind it, for its full length). On a quiet cluster θ is
//! small and the plan of least makespan wins; as backlogs grow θ·V·(fixed cost) dominates and k
//! falls toward one shard on the least-loaded worker; when the cluster empties it grows back.
//!
//! θ comes from the state the proxy already tracks, averaged over the workers: L, the mean
//! number of shards in flight per worker, and S = total backlog / total shards in flight, the
//! mean predicted shard time. Shards of a cost-balanced split are close to equal, so each
//! worker is taken as M/D/1, whose mean number in system is L = ρ(2 − ρ)/(2(1 − ρ)). Solved for
//! ρ: 1 − ρ = 1/(L + √(L² + 1)); and λ = ρ/S, so θ = ρ(L + √(L² + 1))/S. θ is 0 on an idle
//! cluster and grows without bound with the queues (≈ 2L/S); no threshold is set by hand.

use crate::cluster::worker::WorkerView;

/// θ (per ms) for the cluster `views` describe: 0 when nothing is in flight.
pub fn theta(views: &[WorkerView]) -> f64 {
    let in_flight: f64 = views.iter().map(|v| v.in_flight as f64).sum();
    let backlog: f64 = views.iter().map(|v| v.backlog_ms).filter(|b| b.is_finite() && *b > 0.0).sum();
    if views.is_empty() || in_flight <= 0.0 || backlog <= 0.0 {
        return 0.0;
    }
    theta_from(in_flight / views.len() as f64, backlog / in_flight)
}

/// θ for a mean of `l` shards in flight per worker, of mean predicted time `s_ms` (M/D/1).
pub fn theta_from(l: f64, s_ms: f64) -> f64 {
    if !(l > 0.0 && s_ms > 0.0 && l.is_finite()) {
        return 0.0;
    }
    let inv_idle = l + (l * l + 1.0).sqrt(); // 1/(1 − ρ)
    let rho = 1.0 - 1.0 / inv_idle;
    rho * inv_idle / s_ms
}

#[cfg(test)]
mod tests {
    use sieve_shared::CostModel;

    use super::*;
    use crate::split::cost::externality;
    use crate::split::{split_by_cost, split_by_cost_priced, Candidate, Request};

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

    #[test]
    fn the_externality_counts_start_and_length_of_every_shard() {
        let model = CostModel { request_ms: 10.0, token_ms: 0.1, token_context_ms: 0.0 };
        let tokens = vec![100.0; 4];
        let req = Request { item_tokens: &tokens, prefix: 0.0, model: &model };
        let c = vec![Candidate { available_ms: 5.0, time_factor: 1.0, max_batch_tokens: 0, holds_prefix: false }];
        let plan = split_by_cost(&req, &c, 1, 0.0);
        // One shard of 10 + 40 ms starting at 5 ms.
        assert!((externality(&plan) - (5.0 * 50.0 + 50.0 * 50.0 / 2.0)).abs() < 1e-9);
    }

    #[test]
    fn shards_fall_toward_one_on_the_least_loaded_as_the_cluster_fills() {
        let model = CostModel { request_ms: 10.0, token_ms: 0.02, token_context_ms: 0.0 };
        let tokens: Vec<f64> = (0..200).map(|i| 40.0 + (i % 7) as f64 * 30.0).collect();
        let req = Request { item_tokens: &tokens, prefix: 60.0, model: &model };
        let mut counts = Vec::new();
        for queued in [0u64, 1, 2, 4, 8, 16] {
            // Every worker has `queued` shards of 40 ms; the first-ranked has one fewer.
            let views: Vec<WorkerView> =
                (0..16).map(|i| view(40.0 * queued.saturating_sub(u64::from(i == 0)) as f64, queued)).collect();
            let cands: Vec<Candidate> = views.iter().map(Candidate::from).collect();
            let th = theta(&views);
            let plan = split_by_cost_priced(&req, &cands, 64, 0.02, th);
            if queued == 0 {
                assert_eq!(plan, split_by_cost(&req, &cands, 64, 0.02), "θ 0 is the plain cost split");
            }
            counts.push(plan.shards.len());
            if queued == 16 {
                assert!(plan.shards.iter().any(|s| s.candidate == 0), "the least-loaded worker is used");
            }
        }
        assert!(counts.windows(2).all(|w| w[0] >= w[1]), "shard counts fall as the queues grow: {counts:?}");
        assert!(counts[0] >= 4 * counts[5], "{counts:?}");
    }
}
