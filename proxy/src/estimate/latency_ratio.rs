//! The distribution of (actual / predicted) shard time over recent shards. A shard is hedged
//! when it has run longer than this ratio's configured quantile (p95 by default) times its
//! prediction: by construction only the slowest few percent of shards are hedged, however
//! good or bad the cost model currently is. Admission asks it for other quantiles too (a plan
//! of k shards is in time when all k are: each within the q^(1/k) quantile), over the shards
//! measured within a time window only: a refused request sends no shard and so measures
//! nothing, and without the window an overload's late shards would hold every later plan to
//! their error, refusing everything after the overload for good.

use sieve_shared::sync::lock;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const WINDOW: usize = 512;
/// Recompute the quantile every this many samples (a sort of 512 floats).
const REFRESH_EVERY: usize = 16;

pub struct RatioTracker {
    inner: Mutex<Inner>,
    quantile: f64,
}

struct Inner {
    ring: Vec<f64>,
    /// When each ring entry was recorded.
    stamps: Vec<Instant>,
    next: usize,
    since_refresh: usize,
    cached: Option<f64>,
    /// The ring's entries recorded within `recent_window` of `recent_at`, sorted: any quantile
    /// of the recent shards is one index.
    recent: Vec<f64>,
    recent_at: Option<Instant>,
    recent_window: Duration,
    /// Samples recorded since `recent` was sorted.
    recent_new: usize,
}

impl RatioTracker {
    pub fn new(quantile: f64) -> Self {
        RatioTracker {
            inner: Mutex::new(Inner {
                ring: Vec::with_capacity(WINDOW),
                stamps: Vec::with_capacity(WINDOW),
                next: 0,
                since_refresh: 0,
                cached: None,
                recent: Vec::new(),
                recent_at: None,
                recent_window: Duration::ZERO,
                recent_new: 0,
            }),
            quantile,
        }
    }

    pub fn record(&self, ratio: f64) {
        self.record_at(ratio, Instant::now());
    }

    fn record_at(&self, ratio: f64, now: Instant) {
        if !(ratio.is_finite() && ratio > 0.0) {
            return;
        }
        let mut g = lock(&self.inner);
        if g.ring.len() < WINDOW {
            g.ring.push(ratio);
            g.stamps.push(now);
        } else {
            let i = g.next;
            g.ring[i] = ratio;
            g.stamps[i] = now;
        }
        g.next = (g.next + 1) % WINDOW;
        g.since_refresh += 1;
        g.recent_new += 1;
        if g.since_refresh >= REFRESH_EVERY || g.cached.is_none() {
            g.since_refresh = 0;
            let mut sorted = g.ring.clone();
            sorted.sort_by(f64::total_cmp);
            g.cached = at(&sorted, self.quantile);
        }
    }

    pub fn samples(&self) -> usize {
        lock(&self.inner).ring.len()
    }

    /// The configured quantile (a fraction).
    pub fn configured(&self) -> f64 {
        self.quantile
    }

    /// The `p` quantile (a fraction) of the shards measured within `window` before now, once
    /// at least `min_samples` were; `None` (take predictions at face value) otherwise.
    pub fn recent_quantile(&self, p: f64, min_samples: usize, window: Duration) -> Option<f64> {
        self.recent_quantile_at(p, min_samples, window, Instant::now())
    }

    fn recent_quantile_at(&self, p: f64, min_samples: usize, window: Duration, now: Instant) -> Option<f64> {
        let mut g = lock(&self.inner);
        // Sorted again after REFRESH_EVERY new samples, or once an eighth of the window has
        // passed (so a sample stops counting at most window/8 late), not on every request.
        let stale = g.recent_at.is_none_or(|at| now.saturating_duration_since(at) >= window / 8);
        if stale || g.recent_new >= REFRESH_EVERY || g.recent_window != window {
            let g = &mut *g;
            g.recent.clear();
            let fresh = g.ring.iter().zip(&g.stamps).filter(|(_, &t)| now.saturating_duration_since(t) <= window);
            g.recent.extend(fresh.map(|(&r, _)| r));
            g.recent.sort_by(f64::total_cmp);
            g.recent_at = Some(now);
            g.recent_window = window;
            g.recent_new = 0;
        }
        if g.recent.len() >= min_samples.max(1) {
            at(&g.recent, p)
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
        let hour = Duration::from_secs(3600);
        let recent = t.recent_quantile(0.95, 20, hour).unwrap();
        assert!((recent - q).abs() < 0.02, "the configured quantile, asked for: {recent} vs {q}");
        let q99 = t.recent_quantile(0.99, 20, hour).unwrap();
        assert!((q99 - 1.99).abs() < 0.02 && t.recent_quantile(0.5, 20, hour).unwrap() < q, "{q99}");
        assert_eq!(t.recent_quantile(0.95, 2000, hour), None);
        for _ in 0..WINDOW {
            t.record(1.0);
        }
        assert_eq!(t.quantile(20), Some(1.0), "old samples age out");
    }

    #[test]
    fn an_overloads_late_shards_stop_counting_when_nothing_new_is_measured() {
        // An overload's shards ran 10x late; then requests are refused and nothing is measured.
        let t = RatioTracker::new(0.95);
        let window = Duration::from_secs(10);
        let t0 = Instant::now();
        for i in 0..50 {
            t.record_at(10.0, t0 + Duration::from_millis(i));
        }
        let during = t0 + Duration::from_secs(1);
        assert_eq!(t.recent_quantile_at(0.95, 20, window, during), Some(10.0));
        // Once the window has passed over them, predictions are taken at face value again...
        let after = t0 + window + window / 8 + Duration::from_secs(1);
        assert_eq!(t.recent_quantile_at(0.95, 20, window, after), None);
        // ...and what is measured from then on is what counts.
        for i in 0..30 {
            t.record_at(1.2, after + Duration::from_millis(i));
        }
        let later = after + Duration::from_secs(1);
        assert_eq!(t.recent_quantile_at(0.95, 20, window, later), Some(1.2));
        // The hedging quantile still sees the whole ring.
        assert_eq!(t.quantile(20), Some(10.0));
    }
}
