//! The distribution of (actual / predicted) shard time over recent shards. A shard is hedged
//! when it has run longer than this ratio's configured quantile (p95 by default) times its
//! prediction: by construction only the slowest few percent of shards are hedged, however
//! good or bad the cost model currently is.

use sieve_shared::sync::lock;
use std::sync::Mutex;

const WINDOW: usize = 512;
/// Recompute the quantile every this many samples (a sort of 512 floats).
const REFRESH_EVERY: usize = 16;

pub struct RatioTracker {
    inner: Mutex<Inner>,
    quantile: f64,
}

struct Inner {
    ring: Vec<f64>,
    next: usize,
    since_refresh: usize,
    cached: Option<f64>,
}

impl RatioTracker {
    pub fn new(quantile: f64) -> Self {
        RatioTracker {
            inner: Mutex::new(Inner { ring: Vec::with_capacity(WINDOW), next: 0, since_refresh: 0, cached: None }),
            quantile,
        }
    }

    pub fn record(&self, ratio: f64) {
        if !(ratio.is_finite() && ratio > 0.0) {
            return;
        }
        let mut g = lock(&self.inner);
        if g.ring.len() < WINDOW {
            g.ring.push(ratio);
        } else {
            let i = g.next;
            g.ring[i] = ratio;
        }
        g.next = (g.next + 1) % WINDOW;
        g.since_refresh += 1;
        if g.since_refresh >= REFRESH_EVERY || g.cached.is_none() {
            g.since_refresh = 0;
            let mut sorted = g.ring.clone();
            sorted.sort_by(f64::total_cmp);
            let idx = ((sorted.len() as f64 - 1.0) * self.quantile).round() as usize;
            g.cached = sorted.get(idx).copied();
        }
    }

    pub fn samples(&self) -> usize {
        lock(&self.inner).ring.len()
    }

    /// The quantile once `min_samples` were recorded.
    pub fn quantile(&self, min_samples: usize) -> Option<f64> {
        let g = lock(&self.inner);
        if g.ring.len() >= min_samples.max(1) {
            g.cached
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p95_of_recent_ratios() {
        let t = RatioTracker::new(0.95);
        assert_eq!(t.quantile(1), None);
        for i in 0..1000 {
            t.record(1.0 + (i % 100) as f64 / 100.0);
        }
        let q = t.quantile(20).unwrap();
        assert!((q - 1.95).abs() < 0.02, "{q}");
        for _ in 0..WINDOW {
            t.record(1.0);
        }
        assert_eq!(t.quantile(20), Some(1.0), "old samples age out");
    }
}
