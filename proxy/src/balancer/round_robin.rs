//! Round robin: each request starts one worker further along; shards follow in order.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::Policy;
use crate::cluster::worker::WorkerView;

#[derive(Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "round_robin"
    }

    fn rank(&self, views: &[WorkerView]) -> Vec<usize> {
        let n = views.len();
        if n == 0 {
            return Vec::new();
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        (0..n).map(|i| (start + i) % n).collect()
    }

    fn assign(&self, views: &[WorkerView], k: usize) -> Vec<usize> {
        let n = views.len();
        if n == 0 {
            return Vec::new();
        }
        let start = self.next.fetch_add(k, Ordering::Relaxed);
        (0..k).map(|j| (start + j) % n).collect()
    }
}
