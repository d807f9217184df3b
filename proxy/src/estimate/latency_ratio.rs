//! The distribution of (actual / predicted) shard time over recent shards. A shard is hedged
//! when it has run longer than this ratio's configured quantile (p95 by default) times its
//! prediction: by construction only the slowest few percent of shards are hedged, however
//! good or bad the cost model currently is. Admission asks it for other quantiles too (a plan
//! of k shards is in time when all k are: each within the q^(1/k) quantile).

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
    /// The ring, sorted at the last refresh: any quantile is one index.
    sorted: Vec<f64>,
}

impl RatioTracker {
    pub fn new(quantile: f64) -> Self {
        RatioTracker {
            inner: Mutex::new(Inner {
                ring: Vec::with_capacity(WINDOW),
                next: 0,
                since_refresh: 0,
                cached: None,
                sorted: Vec::new(),
            }),
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
            let mut sorted = std::mem::take(&mut g.sorted);
            sorted.clone_from(&g.ring);
            sorted.sort_by(f64::total_cmp);
            g.cached = at(&sorted, self.quantile);
            g.sorted = sorted;
        }
    }

    pub fn samples(&self) -> usize {
        lock(&self.inner).ring.len()
    }

    /// The configured quantile (a fraction).
    pub fn configured(&self) -> f64 {
        self.quantile
    }

    /// The `p` quantile (a fraction) as of the last refresh, once `min_samples` were recorded.
    pub fn quantile_at(&self, p: f64, min_samples: usize) -> Option<f64> {
        let g = lock(&self.inner);
        if g.ring.len() >= min_samples.max(1) {
            at(&g.sorted, p)
        } else {
            None
        }
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

/// The `p` quantile of ascending `sorted` (nearest rank).
fn at(sorted: &[f64], p: f64) -> Option<f64> {
    let p = if p.is_finite() { p.clamp(0.0, 1.0) } else { 1.0 };
    sorted.get(((sorted.len() as f64 - 1.0) * p).round() as usize).copied()
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
        assert_eq!(t.quantile_at(0.95, 20), Some(q), "the configured quantile, asked for");
        let q99 = t.quantile_at(0.99, 20).unwrap();
        assert!((q99 - 1.99).abs() < 0.02 && t.quantile_at(0.5, 20).unwrap() < q, "{q99}");
        assert_eq!(t.quantile_at(0.95, 2000), None);
        for _ in 0..WINDOW {
            t.record(1.0);
        }
        assert_eq!(t.quantile(20), Some(1.0), "old samples age out");
    }
}
