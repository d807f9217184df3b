//! The distribution of (actual / predicted) shard time over recent shards. A shard is hedged
//! when it has run longer than this ratio's configured quantile (p95 by default) times its
//! prediction: by construction only the slowest few percent of shards are hedged, however
//! good or bad the cost model currently is. Admission asks it for other quantiles too (a plan
//! of k shards is in time when all k are: each within the q^(1/k) quantile), over the shards
//! measured within a time window only: a refused request sends no shard and so measures
//! nothing, and without the window an overload's late shards would hold every later plan to
//! their error, refusing everything after the overload for good.
//!
//! Admission's quantiles are of shards predicted about as long as the plan asked about, or
//! longer (at least half the power of two at or below its makespan, so a quarter to a half of it;
//! the longest `min_samples` if fewer were): the error is
//! not the same at every size. What a prediction leaves out costs a short shard a larger share
//! of its time (the worker's tokenizing and HTTP, a pass's fixed cost), so holding a long plan to
//! every shard's error refused requests that would have finished in time without admission.
//!
//! Admission's quantiles leave out the shards that were *stalls*: a shard that took more than
//! `stall_factor` times the median ratio of the [`REFERENCE`] shards measured just before it.
//! Those shards ran late while the cluster's other calls of the moment (its own request's
//! siblings among them) ran on time: one call held up (a GC pause, throttling, a noisy
//! neighbour, or queued behind such a call), which no prediction of load foresees and refusing
//! a request does not avoid. Queueing makes every shard late at once, and the median with them,
//! so a burst's lateness stays in. Hedging's quantile counts every shard: it is what a hedge is for.

use sieve_shared::sync::lock;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const WINDOW: usize = 512;
/// Recompute the quantile every this many samples (a selection over 512 floats).
const REFRESH_EVERY: usize = 16;
/// How many of the latest shards the stall test compares a shard with (their median ratio):
/// a fraction of a second of shards at the loads where admission matters, so the reference
/// follows a burst's lateness within it, and enough that a few stalls do not move the median.
pub const REFERENCE: usize = 64;

pub struct RatioTracker {
    inner: Mutex<Inner>,
    quantile: f64,
}

struct Inner {
    ring: Vec<f64>,
    /// The predicted time (ms) of each ring entry's shard.
    predicted: Vec<f64>,
    /// When each ring entry was recorded.
    stamps: Vec<Instant>,
    /// The median ratio of the latest [`REFERENCE`] shards when each ring entry was recorded
    /// (0: too few to tell): what the stall test compares the entry with.
    reference: Vec<f64>,
    /// The median of the latest [`REFERENCE`] ratios, refreshed with `cached`.
    median: f64,
    next: usize,
    since_refresh: usize,
    cached: Option<f64>,
    /// The ring's entries recorded within `recent_window` of `recent_at` as (predicted ms,
    /// ratio), longest prediction first: the shards predicted at least T long are a prefix.
    recent: Vec<(f64, f64)>,
    /// Quantiles of `recent` asked for since it was built: (p, size class) → quantile.
    memo: Vec<((u64, i32), Option<f64>)>,
    recent_at: Option<Instant>,
    recent_window: Duration,
    /// The stall factor `recent` was filtered with.
    recent_stall_factor: f64,
    /// Samples recorded since `recent` was sorted.
    recent_new: usize,
}

impl RatioTracker {
    pub fn new(quantile: f64) -> Self {
        RatioTracker {
            inner: Mutex::new(Inner {
                ring: Vec::with_capacity(WINDOW),
                predicted: Vec::with_capacity(WINDOW),
                stamps: Vec::with_capacity(WINDOW),
                reference: Vec::with_capacity(WINDOW),
                median: 0.0,
                next: 0,
                since_refresh: 0,
                cached: None,
                recent: Vec::new(),
                memo: Vec::new(),
                recent_at: None,
                recent_window: Duration::ZERO,
                recent_stall_factor: 0.0,
                recent_new: 0,
            }),
            quantile,
        }
    }

    /// A shard predicted to take `predicted_ms` took `ratio` times that.
    pub fn record(&self, ratio: f64, predicted_ms: f64) {
        self.record_at(ratio, predicted_ms, Instant::now());
    }

    fn record_at(&self, ratio: f64, predicted_ms: f64, now: Instant) {
        if !(ratio.is_finite() && ratio > 0.0 && predicted_ms.is_finite() && predicted_ms > 0.0) {
            return;
        }
        let mut g = lock(&self.inner);
        let reference = g.median;
        if g.ring.len() < WINDOW {
            g.ring.push(ratio);
            g.predicted.push(predicted_ms);
            g.stamps.push(now);
            g.reference.push(reference);
        } else {
            let i = g.next;
            g.ring[i] = ratio;
            g.predicted[i] = predicted_ms;
            g.stamps[i] = now;
            g.reference[i] = reference;
        }
        g.next = (g.next + 1) % WINDOW;
        g.since_refresh += 1;
        g.recent_new += 1;
        if g.since_refresh >= REFRESH_EVERY || g.cached.is_none() {
            g.since_refresh = 0;
            let mut values = g.ring.clone();
            g.cached = at(&mut values, self.quantile);
            // The latest REFERENCE entries end just before `next` (the ring wraps).
            let n = g.ring.len();
            g.median = if n >= REFERENCE {
                let mut latest: Vec<f64> = (1..=REFERENCE).map(|back| g.ring[(g.next + n - back) % n]).collect();
                at(&mut latest, 0.5).unwrap_or(0.0)
            } else {
                0.0
            };
        }
    }

    pub fn samples(&self) -> usize {
        lock(&self.inner).ring.len()
    }

    /// The configured quantile (a fraction).
    pub fn configured(&self) -> f64 {
        self.quantile
    }

    /// The `p` quantile (a fraction) of the shards measured within `window` before `now` that were
    /// predicted at least half the power of two at or below `predicted_ms` (a quarter to a half of
    /// it; the longest `min_samples` of them
    /// when fewer were), once at least `min_samples` were measured; `None` (take predictions at
    /// face value) otherwise. Shards that were stalls are left out: those that took more than
    /// `stall_factor` times the median ratio of the [`REFERENCE`] shards before them (0: none);
    /// until REFERENCE shards were measured there is no telling, and the answer is `None`.
    pub fn recent_quantile(
        &self,
        p: f64,
        min_samples: usize,
        window: Duration,
        stall_factor: f64,
        predicted_ms: f64,
        now: Instant,
    ) -> Option<f64> {
        let mut g = lock(&self.inner);
        // Rebuilt after REFRESH_EVERY new samples, or once an eighth of the window has passed
        // (so a sample stops counting at most window/8 late), not on every request.
        let stale = g.recent_at.is_none_or(|at| now.saturating_duration_since(at) >= window / 8);
        let refilter = g.recent_stall_factor.to_bits() != stall_factor.to_bits();
        if stale || refilter || g.recent_new >= REFRESH_EVERY || g.recent_window != window {
            let g = &mut *g;
            g.recent.clear();
            g.memo.clear();
            // A shard measured before there was a median to compare it with (the first
            // REFERENCE) is compared with today's.
            let reference = |i: usize| if g.reference[i] > 0.0 { g.reference[i] } else { g.median };
            let stall = |i: usize| stall_factor > 0.0 && reference(i) > 0.0 && g.ring[i] > stall_factor * reference(i);
            let fresh =
                (0..g.ring.len()).filter(|&i| now.saturating_duration_since(g.stamps[i]) <= window && !stall(i));
            g.recent.extend(fresh.map(|i| (g.predicted[i], g.ring[i])));
            g.recent.sort_by(|a, b| b.0.total_cmp(&a.0));
            g.recent_at = Some(now);
            g.recent_window = window;
            g.recent_stall_factor = stall_factor;
            g.recent_new = 0;
        }
        let min_samples = min_samples.max(1);
        // Until the stall test can tell a stall, predictions are taken at face value: on a
        // cold start a handful of samples, one stalled shard among them, held every plan to the
        // stall (100x), and the whole cluster was refused for one frozen worker.
        if g.recent.len() < min_samples || (stall_factor > 0.0 && g.median <= 0.0) {
            return None;
        }
        // Size classes are powers of two of the prediction: a class's shards are those predicted
        // at least half its lower bound, so a plan is compared with shards of at least a quarter
        // to a half of its length, and one quantile serves every plan of the class.
        let class = if predicted_ms.is_finite() && predicted_ms > 1.0 { predicted_ms.log2().floor() as i32 } else { 0 };
        let key = (p.to_bits(), class);
        if let Some((_, q)) = g.memo.iter().find(|(k, _)| *k == key) {
            return *q;
        }
        let floor = 2f64.powi(class - 1);
        let longer = g.recent.partition_point(|&(pred, _)| pred >= floor).max(min_samples);
        let mut ratios: Vec<f64> = g.recent[..longer].iter().map(|&(_, r)| r).collect();
        let q = at(&mut ratios, p);
        g.memo.push((key, q));
        q
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

/// The `p` quantile of `values` (nearest rank), which it reorders: the element a sort would put
/// at that rank, found by selection (linear time; a sort of the ring's 512 entries at every
/// refresh was 6 k instructions a shard).
fn at(values: &mut [f64], p: f64) -> Option<f64> {
    let p = if p.is_finite() { p.clamp(0.0, 1.0) } else { 1.0 };
    if values.is_empty() {
        return None;
    }
    let rank = ((values.len() as f64 - 1.0) * p).round() as usize;
    Some(*values.select_nth_unstable_by(rank, f64::total_cmp).1)
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The selected quantile is the element a sort puts at the nearest rank, for any values
        /// (repeats included) and any p.
        #[test]
        fn the_selected_quantile_is_the_sorted_ones(
            values in proptest::collection::vec(proptest::prop_oneof![0.0f64..4.0, proptest::sample::select(vec![0.5, 1.0, 2.0])], 0..600),
            p in 0.0f64..=1.0,
        ) {
            let mut sorted = values.clone();
            sorted.sort_by(f64::total_cmp);
            let want = sorted.get(((sorted.len() as f64 - 1.0) * p).round() as usize).copied();
            let mut v = values.clone();
            proptest::prop_assert_eq!(at(&mut v, p), want);
        }
    }

    #[test]
    fn p95_of_recent_ratios() {
        let t = RatioTracker::new(0.95);
        assert_eq!(t.quantile(1), None);
        for i in 0..1000 {
            t.record(1.0 + (i % 100) as f64 / 100.0, 10.0);
        }
        let q = t.quantile(20).unwrap();
        assert!((q - 1.95).abs() < 0.02, "{q}");
        let hour = Duration::from_secs(3600);
        let recent = t.recent_quantile(0.95, 20, hour, 0.0, 10.0, Instant::now()).unwrap();
        assert!((recent - q).abs() < 0.02, "the configured quantile, asked for: {recent} vs {q}");
        let q99 = t.recent_quantile(0.99, 20, hour, 0.0, 10.0, Instant::now()).unwrap();
        assert!(
            (q99 - 1.99).abs() < 0.02 && t.recent_quantile(0.5, 20, hour, 0.0, 10.0, Instant::now()).unwrap() < q,
            "{q99}"
        );
        assert_eq!(t.recent_quantile(0.95, 2000, hour, 0.0, 10.0, Instant::now()), None);
        for _ in 0..WINDOW {
            t.record(1.0, 10.0);
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
            t.record_at(10.0, 50.0, t0 + Duration::from_millis(i));
        }
        let during = t0 + Duration::from_secs(1);
        assert_eq!(t.recent_quantile(0.95, 20, window, 0.0, 50.0, during), Some(10.0));
        // Once the window has passed over them, predictions are taken at face value again...
        let after = t0 + window + window / 8 + Duration::from_secs(1);
        assert_eq!(t.recent_quantile(0.95, 20, window, 0.0, 50.0, after), None);
        // ...and what is measured from then on is what counts.
        for i in 0..30 {
            t.record_at(1.2, 50.0, after + Duration::from_millis(i));
        }
        let later = after + Duration::from_secs(1);
        assert_eq!(t.recent_quantile(0.95, 20, window, 0.0, 50.0, later), Some(1.2));
        // The hedging quantile still sees the whole ring.
        assert_eq!(t.quantile(20), Some(10.0));
    }

    #[test]
    fn a_long_plan_is_held_to_the_error_of_long_shards() {
        // Short shards run 3x their prediction (a fixed cost the model leaves out), long ones 1.1x.
        let t = RatioTracker::new(0.95);
        let hour = Duration::from_secs(3600);
        for i in 0..200 {
            t.record(3.0, 5.0 + (i % 10) as f64);
            t.record(1.1, 150.0 + (i % 100) as f64);
        }
        let long = t.recent_quantile(0.95, 20, hour, 0.0, 200.0, Instant::now()).unwrap();
        assert_eq!(long, 1.1, "a 200 ms plan: shards of 100 ms and more");
        let short = t.recent_quantile(0.95, 20, hour, 0.0, 8.0, Instant::now()).unwrap();
        assert_eq!(short, 3.0, "an 8 ms plan: every shard of 4 ms and more, the short ones among them");
        // Longer than anything measured: the longest min_samples shards speak for it.
        assert_eq!(t.recent_quantile(0.95, 20, hour, 0.0, 5000.0, Instant::now()), Some(1.1));
        // Asked again (memoised), the same answers.
        assert_eq!(t.recent_quantile(0.95, 20, hour, 0.0, 200.0, Instant::now()), Some(long));
        assert_eq!(t.recent_quantile(0.95, 20, hour, 0.0, 8.0, Instant::now()), Some(short));
        // Too few long shards: the longest min_samples are taken, short ones among them.
        let t = RatioTracker::new(0.95);
        for _ in 0..100 {
            t.record(3.0, 5.0);
        }
        for _ in 0..5 {
            t.record(1.1, 300.0);
        }
        assert_eq!(t.recent_quantile(0.95, 20, hour, 0.0, 300.0, Instant::now()), Some(3.0));
    }

    #[test]
    fn a_cold_start_stall_holds_no_plan_to_it() {
        // A fresh proxy: a few shards, one of them held up 100x by a frozen worker.
        let t = RatioTracker::new(0.99);
        let hour = Duration::from_secs(3600);
        for i in 0..30 {
            t.record(if i == 12 { 100.0 } else { 1.0 + (i % 4) as f64 / 32.0 }, 200.0);
        }
        // Too few to tell a stall: face value, not the stall.
        assert_eq!(t.recent_quantile(0.99, 20, hour, 2.0, 200.0, Instant::now()), None);
        assert_eq!(t.recent_quantile(0.99, 20, hour, 0.0, 200.0, Instant::now()), Some(100.0), "every shard");
        // Once REFERENCE were measured, the early stall is judged against the median then.
        for i in 30..REFERENCE + 16 {
            t.record(1.0 + (i % 4) as f64 / 32.0, 200.0);
        }
        let q = t.recent_quantile(0.99, 20, hour, 2.0, 200.0, Instant::now()).unwrap();
        assert!(q < 1.1, "the stall left out: {q}");
    }

    #[test]
    fn stalls_are_left_out_of_admissions_error_and_queueing_is_not() {
        let t = RatioTracker::new(0.99);
        let hour = Duration::from_secs(3600);
        let on_time = |i: usize| 1.0 + (i % 8) as f64 / 64.0;
        // 3% of shards stalled (5x to 40x late) among shards on time (1.0 to 1.11). The first
        // 80 are on time: until REFERENCE shards were measured there is no median to compare with.
        for i in 0..WINDOW {
            let ratio = if i >= 80 && i % 33 == 32 { 5.0 + (i % 36) as f64 } else { on_time(i) };
            t.record(ratio, 100.0 + (i % 50) as f64);
        }
        // A 16-shard plan's quantile (q^(1/16) of p99) is the window's worst: a stall, unless
        // stalls are left out; hedging still sees them.
        let q16 = 0.99f64.powf(1.0 / 16.0);
        assert!(t.recent_quantile(q16, 20, hour, 0.0, 100.0, Instant::now()).unwrap() >= 5.0);
        assert_eq!(t.recent_quantile(q16, 20, hour, 2.0, 100.0, Instant::now()), Some(on_time(7)));
        assert!(t.quantile(20).unwrap() >= 5.0, "hedging's quantile (here p99) counts every shard");
        // Queueing: every shard 3x late from one moment on. The first few are taken for stalls
        // (the median of the shards before them is on time), then the median is late too and
        // the lateness counts: the window's worst is the queueing's.
        let late = |i: usize| 3.0 + (i % 8) as f64 / 64.0;
        for i in 0..WINDOW {
            t.record(late(i), 100.0 + (i % 50) as f64);
        }
        assert_eq!(t.recent_quantile(q16, 20, hour, 2.0, 100.0, Instant::now()), Some(late(7)));
        let median = t.recent_quantile(0.5, 20, hour, 2.0, 100.0, Instant::now()).unwrap();
        assert!((3.0..3.2).contains(&median), "{median}");
    }
}
