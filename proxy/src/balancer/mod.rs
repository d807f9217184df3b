//! Balancing policies: how workers are ranked for a request's shards. One file per policy,
//! all behind [`Policy`]. The cost split (`split::CostSplit`) takes the first k workers of
//! the ranking; a fixed split asks the policy to `assign` a worker to each shard.

mod least_loaded;
mod power_of_two;
mod random;
mod round_robin;

use std::cmp::Ordering;
use std::sync::Arc;

pub use least_loaded::LeastLoaded;
pub use power_of_two::PowerOfTwo;
pub use random::Random;
pub use round_robin::RoundRobin;
use sieve_shared::proxy_config::{BalanceConfig, PolicyKind};

use crate::cluster::worker::WorkerView;

pub trait Policy: Send + Sync {
    fn name(&self) -> &'static str;

    /// Every worker (indices into `views`), most preferred first.
    fn rank(&self, views: &[WorkerView]) -> Vec<usize>;

    /// A worker for each of `k` shards cut without regard to workers (fixed-size split). By
    /// default the ranking, cycled when there are more shards than workers.
    fn assign(&self, views: &[WorkerView], k: usize) -> Vec<usize> {
        let rank = self.rank(views);
        if rank.is_empty() {
            return Vec::new();
        }
        (0..k).map(|j| rank[j % rank.len()]).collect()
    }
}

pub fn build(cfg: &BalanceConfig) -> Arc<dyn Policy> {
    match cfg.policy {
        PolicyKind::LeastLoaded => Arc::new(LeastLoaded),
        PolicyKind::PowerOfTwo => Arc::new(PowerOfTwo { choices: cfg.choices }),
        PolicyKind::Random => Arc::new(Random),
        PolicyKind::RoundRobin => Arc::new(RoundRobin::default()),
    }
}

/// Lighter load first: predicted backlog, then shards in flight. Ties are broken by the
/// caller (randomly), so idle workers share the work instead of the first one taking all.
pub(crate) fn by_load(a: &WorkerView, b: &WorkerView) -> Ordering {
    a.backlog_ms.total_cmp(&b.backlog_ms).then(a.in_flight.cmp(&b.in_flight))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(backlog_ms: f64, in_flight: u64) -> WorkerView {
        WorkerView { backlog_ms, in_flight, time_factor: 1.0, max_batch_tokens: 0, holds_prefix: false }
    }

    fn is_permutation(r: &[usize], n: usize) -> bool {
        let mut s = r.to_vec();
        s.sort_unstable();
        s == (0..n).collect::<Vec<_>>()
    }

    #[test]
    fn least_loaded_prefers_idle_workers() {
        let views = [view(30.0, 2), view(0.0, 0), view(5.0, 1), view(0.0, 1), view(0.0, 0)];
        for _ in 0..20 {
            let r = LeastLoaded.rank(&views);
            assert!(is_permutation(&r, 5));
            let first_two: std::collections::BTreeSet<usize> = r[..2].iter().copied().collect();
            assert_eq!(first_two, [1, 4].into(), "{r:?}");
            assert_eq!(&r[2..], &[3, 2, 0]);
        }
        // Ties are broken randomly, so both idle workers lead sometimes.
        let leads: std::collections::BTreeSet<usize> = (0..200).map(|_| LeastLoaded.rank(&views)[0]).collect();
        assert_eq!(leads, [1, 4].into());
    }

    #[test]
    fn power_of_two_never_ranks_the_busiest_first_and_spreads_ties() {
        let views: Vec<WorkerView> = (0..8).map(|i| view(i as f64 * 10.0, 0)).collect();
        let p = PowerOfTwo { choices: 2 };
        let mut firsts = [0usize; 8];
        for _ in 0..2000 {
            let r = p.rank(&views);
            assert!(is_permutation(&r, 8));
            firsts[r[0]] += 1;
        }
        assert_eq!(firsts[7], 0, "the most loaded of two choices never wins the first pick");
        assert!(firsts[0] > firsts[3] && firsts[3] > 0, "{firsts:?}");
    }

    #[test]
    fn random_and_round_robin_cover_every_worker() {
        let views: Vec<WorkerView> = (0..4).map(|_| view(0.0, 0)).collect();
        assert!(is_permutation(&Random.rank(&views), 4));
        let a = Random.assign(&views, 100);
        assert_eq!(a.len(), 100);
        assert!(a.iter().all(|&i| i < 4));
        let rr = RoundRobin::default();
        let firsts: Vec<usize> = (0..4).map(|_| rr.rank(&views)[0]).collect();
        let mut sorted = firsts.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![0, 1, 2, 3], "{firsts:?}");
        assert_eq!(rr.assign(&views, 6).len(), 6);
    }
}
