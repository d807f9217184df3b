//! Power of d choices: each pick takes the least loaded of `choices` workers drawn at random
//! from those not yet picked. Nearly as good as least-loaded with one proxy, and several
//! proxies sharing stale load figures do not all herd onto the same idle worker.

use rand::Rng;

use super::{by_load, Policy};
use crate::cluster::worker::WorkerView;

pub struct PowerOfTwo {
    pub choices: usize,
}

impl Policy for PowerOfTwo {
    fn name(&self) -> &'static str {
        "power_of_two"
    }

    fn rank(&self, views: &[WorkerView]) -> Vec<usize> {
        let mut rng = rand::rng();
        let mut remaining: Vec<usize> = (0..views.len()).collect();
        let mut out = Vec::with_capacity(views.len());
        while !remaining.is_empty() {
            let d = self.choices.min(remaining.len());
            // Partial Fisher–Yates: the first d positions become a uniform sample.
            for k in 0..d {
                let j = rng.random_range(k..remaining.len());
                remaining.swap(k, j);
            }
            let best = (0..d).min_by(|&a, &b| by_load(&views[remaining[a]], &views[remaining[b]])).unwrap_or(0);
            out.push(remaining.swap_remove(best));
        }
        out
    }
}
