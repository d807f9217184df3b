//! Uniformly random: the request-level balancer baseline. `assign` draws every shard's worker
//! independently, so two shards of one request can land on the same worker, as they do behind
//! a per-request load balancer.

use rand::seq::SliceRandom;
use rand::Rng;

use super::Policy;
use crate::cluster::worker::WorkerView;

pub struct Random;

impl Policy for Random {
    fn name(&self) -> &'static str {
        "random"
    }

    fn rank(&self, views: &[WorkerView]) -> Vec<usize> {
        let mut r: Vec<usize> = (0..views.len()).collect();
        r.shuffle(&mut rand::rng());
        r
    }

    fn assign(&self, views: &[WorkerView], k: usize) -> Vec<usize> {
        if views.is_empty() {
            return Vec::new();
        }
        let mut rng = rand::rng();
        (0..k).map(|_| rng.random_range(0..views.len())).collect()
    }
}
