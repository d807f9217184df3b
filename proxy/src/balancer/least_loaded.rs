//! Least loaded first: the workers with the least predicted backlog (then the fewest shards in
//! flight) lead; equal loads are ordered randomly.

use rand::Rng;

use super::{by_load, Policy};
use crate::cluster::worker::WorkerView;

pub struct LeastLoaded;

impl Policy for LeastLoaded {
    fn name(&self) -> &'static str {
        "least_loaded"
    }

    fn rank(&self, views: &[WorkerView]) -> Vec<usize> {
        let mut rng = rand::rng();
        let mut keyed: Vec<(usize, u32)> = (0..views.len()).map(|i| (i, rng.random())).collect();
        keyed.sort_by(|a, b| by_load(&views[a.0], &views[b.0]).then(a.1.cmp(&b.1)));
        keyed.into_iter().map(|(i, _)| i).collect()
    }
}
