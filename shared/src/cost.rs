//! The compute-cost model of a scoring call, shared by the proxy (which predicts shard times with
//! it and recalibrates it online), the simulated worker (which sleeps for what it predicts) and
//! the load-test calibration (which fits it to a real worker and writes it to a file).
//!
//! Prefill of one call computes the shared prefix once (P tokens, causal), then each item's own
//! segment (n tokens) attending to the prefix and causally to itself:
//!
//! ```text
//! time ≈ request_ms + a·(P + Σn) + b·(P²/2 + Σ n·(P + n/2))
//! ```
//!
//! `a` (`token_ms`) is the per-token cost of the dense layers, `b` (`token_context_ms`) the
//! per-(token × context position) cost of attention, and `request_ms` the fixed cost of a call.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CostModel {
    /// Fixed cost of one call (scheduling, launch overheads, the score head), in ms.
    pub request_ms: f64,
    /// Cost per computed token (dense layers), in ms.
    pub token_ms: f64,
    /// Cost per token per context position it attends to (attention), in ms.
    pub token_context_ms: f64,
}

impl Default for CostModel {
    /// A single-GPU worker running a ~0.6B reranker: ~200k prefill tokens/s, attention a tenth
    /// of the dense cost at typical lengths, 2 ms per call.
    fn default() -> Self {
        CostModel { request_ms: 2.0, token_ms: 0.005, token_context_ms: 5e-6 }
    }
}

/// The quantities a call's cost is linear in: `cost = features · [request_ms, token_ms,
/// token_context_ms]`. Fitting the model online works on these.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CostFeatures {
    /// Calls (1 for one call).
    pub requests: f64,
    /// Tokens computed: the uncached part of the prefix plus every item's own tokens.
    pub tokens: f64,
    /// Σ over computed tokens of the context they attend to.
    pub token_context: f64,
}

impl CostFeatures {
    /// Features of one call with a `prefix`-token shared prefix of which `cached_prefix` tokens
    /// came from a cache, and items of the given own-segment lengths.
    pub fn of_call(prefix: f64, cached_prefix: f64, items: impl IntoIterator<Item = f64>) -> Self {
        let cached = cached_prefix.clamp(0.0, prefix);
        let computed_prefix = prefix - cached;
        // Attention of prefix tokens cached..P: Σ_{t=cached}^{P} t ≈ (P² − cached²)/2.
        let mut f = CostFeatures {
            requests: 1.0,
            tokens: computed_prefix,
            token_context: (prefix * prefix - cached * cached) / 2.0,
        };
        for n in items {
            f.tokens += n;
            f.token_context += n * (prefix + n / 2.0);
        }
        f
    }

    /// Adds items of own lengths `items` that share their first `run` tokens (after a
    /// `prefix`-token prefix) computed once: the run attends to the prefix, each item's rest
    /// to the prefix and the run. One item alone costs what [`Self::of_call`] counts for it.
    pub fn add_run_group(&mut self, prefix: f64, run: f64, items: impl IntoIterator<Item = f64>) {
        self.tokens += run;
        self.token_context += run * (prefix + run / 2.0);
        for n in items {
            let rest = (n - run).max(0.0);
            self.tokens += rest;
            self.token_context += rest * (prefix + run + rest / 2.0);
        }
    }

    pub fn as_array(&self) -> [f64; 3] {
        [self.requests, self.tokens, self.token_context]
    }
}

impl CostModel {
    pub fn as_array(&self) -> [f64; 3] {
        [self.request_ms, self.token_ms, self.token_context_ms]
    }

    pub fn from_array(w: [f64; 3]) -> Self {
        CostModel { request_ms: w[0], token_ms: w[1], token_context_ms: w[2] }
    }

    /// Cost of computing a `prefix`-token shared prefix once.
    pub fn prefix_ms(&self, prefix: f64) -> f64 {
        self.token_ms * prefix + self.token_context_ms * prefix * prefix / 2.0
    }

    /// Marginal cost of one item of `n` own tokens after a `prefix`-token prefix.
    pub fn pair_ms(&self, n: f64, prefix: f64) -> f64 {
        self.token_ms * n + self.token_context_ms * n * (prefix + n / 2.0)
    }

    /// Cost of a whole call: fixed cost, the prefix once, every item.
    pub fn call_ms(&self, prefix: f64, items: impl IntoIterator<Item = f64>) -> f64 {
        self.predict(&CostFeatures::of_call(prefix, 0.0, items))
    }

    pub fn predict(&self, f: &CostFeatures) -> f64 {
        self.request_ms * f.requests + self.token_ms * f.tokens + self.token_context_ms * f.token_context
    }

    /// Parses a cost model written as JSON (text starting with `{`) or TOML, and validates it.
    /// Reading the file is the caller's job: this crate does no I/O.
    pub fn parse(text: &str) -> Result<Self, String> {
        let model: CostModel = if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| format!("cost model JSON: {e}"))?
        } else {
            toml::from_str(text).map_err(|e| format!("cost model TOML: {e}"))?
        };
        model.validate()?;
        Ok(model)
    }

    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in
            [("request_ms", self.request_ms), ("token_ms", self.token_ms), ("token_context_ms", self.token_context_ms)]
        {
            if !v.is_finite() || v < 0.0 {
                return Err(format!("cost model {name} must be a finite non-negative number, got {v}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_pays_its_prefix_once() {
        let m = CostModel { request_ms: 1.0, token_ms: 0.01, token_context_ms: 0.001 };
        let one = m.call_ms(100.0, [50.0]);
        let two = m.call_ms(100.0, [50.0, 50.0]);
        assert!((two - one - m.pair_ms(50.0, 100.0)).abs() < 1e-9);
        assert!((one - (1.0 + m.prefix_ms(100.0) + m.pair_ms(50.0, 100.0))).abs() < 1e-9);
    }

    #[test]
    fn a_run_group_pays_its_run_once() {
        let m = CostModel::default();
        let (p, run) = (50.0, 30.0);
        let alone = CostFeatures::of_call(p, 0.0, [100.0]);
        let mut one = CostFeatures::of_call(p, 0.0, []);
        one.add_run_group(p, run, [100.0]);
        assert!((m.predict(&one) - m.predict(&alone)).abs() < 1e-9, "one member: the same as alone");
        let apart = CostFeatures::of_call(p, 0.0, [100.0, 80.0, 60.0]);
        let mut grouped = CostFeatures::of_call(p, 0.0, []);
        grouped.add_run_group(p, run, [100.0, 80.0, 60.0]);
        assert!((apart.tokens - grouped.tokens - 2.0 * run).abs() < 1e-9, "the run once, not three times");
        assert!(m.predict(&grouped) < m.predict(&apart));
    }

    #[test]
    fn cached_prefix_is_not_paid() {
        let m = CostModel::default();
        let cold = m.predict(&CostFeatures::of_call(200.0, 0.0, [40.0]));
        let warm = m.predict(&CostFeatures::of_call(200.0, 200.0, [40.0]));
        assert!((cold - warm - m.prefix_ms(200.0)).abs() < 1e-9);
    }

    #[test]
    fn parses_toml_and_json_and_rejects_negatives() {
        let m = CostModel::parse("request_ms = 3.0\ntoken_ms = 0.01\n").unwrap();
        assert_eq!(m.request_ms, 3.0);
        assert_eq!(m.token_context_ms, CostModel::default().token_context_ms);
        let j = CostModel::parse(r#"{"request_ms": 1, "token_ms": 0.002, "token_context_ms": 0}"#).unwrap();
        assert_eq!(j.token_ms, 0.002);
        assert!(CostModel::parse("token_ms = -1.0\n").unwrap_err().contains("token_ms"));
        assert!(CostModel::parse("tokens_ms = 1.0\n").unwrap_err().contains("tokens_ms"));
    }
}
