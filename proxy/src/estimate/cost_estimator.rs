//! Compute time of a shard, recalibrated online from the token counts and compute times
//! workers report.
//!
//! Two levels: one cost model `request_ms + a·tokens + b·token_context` fitted on every
//! shard's reported usage and `timing.compute_ms` divided by its worker's time factor (so the
//! model is of a worker of factor 1; the prior anchors that scale), and per worker the time
//! factor, the smoothed ratio of its measured compute time to the model's prediction, so a
//! worker that is 3× slower (older GPU, throttled, noisy neighbour) gets a third of the work.

use sieve_shared::proxy_config::EstimatorConfig;
use sieve_shared::{CostFeatures, CostModel, Usage};

use crate::estimate::online_fit::OnlineFit;

/// Feature scaling so the three weights are of similar size: requests, kilotokens, and
/// mega-(token × context).
const UNIT: [f64; 3] = [1.0, 1e-3, 1e-6];
/// Typical scaled feature values of a shard, for the prior's pull.
const SCALES: [f64; 3] = [1.0, 2.0, 2.0];

const MIN_TIME_FACTOR: f64 = 0.05;
const MAX_TIME_FACTOR: f64 = 50.0;

pub struct CostEstimator {
    fit: OnlineFit<3>,
    model: CostModel,
    recalibrate: bool,
}

impl CostEstimator {
    pub fn new(prior: CostModel, cfg: &EstimatorConfig) -> Self {
        let p = prior.as_array();
        let scaled_prior = [p[0] / UNIT[0], p[1] / UNIT[1], p[2] / UNIT[2]];
        CostEstimator {
            fit: OnlineFit::new(scaled_prior, SCALES, cfg.prior_weight, cfg.cost_decay),
            model: prior,
            recalibrate: cfg.recalibrate,
        }
    }

    pub fn model(&self) -> CostModel {
        self.model
    }

    /// Learns from one shard: its reported usage and compute time.
    pub fn observe(&mut self, f: &CostFeatures, compute_ms: f64) {
        if !(self.recalibrate && compute_ms.is_finite() && compute_ms >= 0.0) {
            return;
        }
        let x = f.as_array();
        self.fit.observe(&[x[0] * UNIT[0], x[1] * UNIT[1], x[2] * UNIT[2]], compute_ms);
        let w = self.fit.solve();
        self.model = CostModel::from_array([w[0] * UNIT[0], w[1] * UNIT[1], w[2] * UNIT[2]]);
    }

    /// Effective number of shards the model has learnt from.
    pub fn samples(&self) -> f64 {
        self.fit.samples()
    }
}

/// The cost features of a shard as the worker reported it. Item tokens a group's shared run
/// saved (`item_shared_tokens`) were not computed: the items' tokens and their attention are
/// scaled down by the share saved (where in the items they lay is not reported).
pub fn reported_features(usage: &Usage) -> CostFeatures {
    let prefix = f64::from(usage.prefix_tokens);
    let mut f = CostFeatures::of_call(
        prefix,
        f64::from(usage.cached_prefix_tokens),
        usage.item_tokens.iter().map(|&n| f64::from(n)),
    );
    let items: f64 = usage.item_tokens.iter().map(|&n| f64::from(n)).sum();
    if usage.item_shared_tokens > 0 && items > 0.0 {
        let shared = (usage.item_shared_tokens as f64).min(items);
        let bare = CostFeatures::of_call(prefix, f64::from(usage.cached_prefix_tokens), []);
        let kept = 1.0 - shared / items;
        f.tokens = bare.tokens + items - shared;
        f.token_context = bare.token_context + (f.token_context - bare.token_context) * kept;
    }
    f
}

/// Moves a worker's time factor toward its latest measured/predicted ratio.
pub fn update_time_factor(current: f64, actual_ms: f64, predicted_ms: f64, smoothing: f64) -> f64 {
    // Tiny predictions are dominated by timer and scheduling noise; they carry no signal.
    if !(predicted_ms >= 0.5 && actual_ms.is_finite() && actual_ms >= 0.0) {
        return current;
    }
    let ratio = (actual_ms / predicted_ms).clamp(MIN_TIME_FACTOR, MAX_TIME_FACTOR);
    (current + smoothing * (ratio - current)).clamp(MIN_TIME_FACTOR, MAX_TIME_FACTOR)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(prefix: f64, items: &[f64]) -> CostFeatures {
        CostFeatures::of_call(prefix, 0.0, items.iter().copied())
    }

    #[test]
    fn recalibrates_to_the_measured_law() {
        let truth = CostModel { request_ms: 4.0, token_ms: 0.012, token_context_ms: 2e-5 };
        let mut est = CostEstimator::new(CostModel::default(), &EstimatorConfig::default());
        let probe = shard(60.0, &[120.0; 40]);
        let before = (est.model().predict(&probe) - truth.predict(&probe)).abs() / truth.predict(&probe);
        for i in 0..300 {
            let n = 30.0 + ((i * 37) % 500) as f64;
            let k = 1 + (i * 13) % 60;
            let f = shard(40.0 + (i % 7) as f64 * 20.0, &vec![n; k]);
            est.observe(&f, truth.predict(&f));
        }
        let after = (est.model().predict(&probe) - truth.predict(&probe)).abs() / truth.predict(&probe);
        assert!(after < 0.02, "relative error {after:.4} after recalibration (before {before:.3})");
        let m = est.model();
        assert!((m.token_ms - truth.token_ms).abs() / truth.token_ms < 0.1, "{m:?}");
    }

    #[test]
    fn item_tokens_a_shared_run_saved_are_not_counted_as_computed() {
        let mut usage = Usage { prefix_tokens: 50, item_tokens: vec![100; 8], ..Usage::default() };
        let plain = reported_features(&usage);
        usage.item_shared_tokens = 7 * 40;
        let shared = reported_features(&usage);
        assert_eq!(plain.tokens - shared.tokens, 280.0);
        assert!(shared.token_context < plain.token_context && shared.token_context > 0.0);
        assert_eq!(shared.requests, 1.0);
    }

    #[test]
    fn time_factor_tracks_a_slow_worker() {
        let mut tf = 1.0;
        for _ in 0..40 {
            tf = update_time_factor(tf, 30.0, 10.0, 0.2);
        }
        assert!((tf - 3.0).abs() < 0.01, "{tf}");
        assert_eq!(update_time_factor(tf, 100.0, 0.1, 0.2), tf, "tiny predictions are ignored");
    }
}
