//! Live figures of the MoE layers: which variant each layer call ran, real and padded rows,
//! and the MoE share of forward time. The runner records once per forward pass; `/stats` and
//! Prometheus read them.

use std::sync::Mutex;

use serde_json::json;
use sieve_shared::metrics_names::worker_moe as m;

use super::setup::MoeSetup;
use crate::model::MoePassStats;

#[derive(Debug, Default)]
pub struct MoeMonitor {
    inner: Mutex<Option<Inner>>,
}

#[derive(Debug)]
struct Inner {
    setup: MoeSetup,
    selections: Vec<u64>,
    passes: u64,
    layer_calls: u64,
    tokens: u64,
    rows: u64,
    padded_rows: u64,
    moe_seconds: f64,
    forward_seconds: f64,
    /// The variant each MoE layer ran in the last pass.
    last_pass: Vec<&'static str>,
}

impl MoeMonitor {
    /// Called once the model's MoE layers are set up (not at all for dense models).
    pub fn init(&self, setup: MoeSetup) {
        let n = setup.variants.len();
        let inner = Inner {
            setup,
            selections: vec![0; n],
            passes: 0,
            layer_calls: 0,
            tokens: 0,
            rows: 0,
            padded_rows: 0,
            moe_seconds: 0.0,
            forward_seconds: 0.0,
            last_pass: vec![],
        };
        // Every variant's and row kind's counter from the start, at zero.
        for v in &inner.setup.variants {
            metrics::counter!(m::SELECTIONS, "variant" => v.name).increment(0);
        }
        for kind in ["real", "padded"] {
            metrics::counter!(m::ROWS, "kind" => kind).increment(0);
        }
        metrics::gauge!(m::TIME_SHARE).set(0.0);
        *self.inner.lock().unwrap_or_else(|p| p.into_inner()) = Some(inner);
    }

    /// Seconds inside MoE layers and of the forward passes that ran them, since start (`None`
    /// for a dense model): counters, written at the scrape.
    pub fn seconds(&self) -> Option<(f64, f64)> {
        let guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        guard.as_ref().map(|s| (s.moe_seconds, s.forward_seconds))
    }

    /// Folds in one forward pass (its MoE records and its total time) and updates the metrics.
    pub fn record_pass(&self, pass: &MoePassStats, forward_seconds: f64) {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let Some(s) = guard.as_mut() else { return };
        s.passes += 1;
        s.last_pass.clear();
        let (mut rows, mut padded) = (0u64, 0u64);
        for l in &pass.layers {
            let Some(v) = s.setup.variants.get(l.variant as usize) else { continue };
            s.selections[l.variant as usize] += 1;
            s.last_pass.push(v.name);
            metrics::counter!(m::SELECTIONS, "variant" => v.name).increment(1);
            s.layer_calls += 1;
            s.tokens += l.tokens as u64;
            rows += l.rows;
            padded += l.padded_rows;
        }
        s.rows += rows;
        s.padded_rows += padded;
        let moe = pass.moe_time.as_secs_f64();
        s.moe_seconds += moe;
        s.forward_seconds += forward_seconds;
        metrics::counter!(m::ROWS, "kind" => "real").increment(rows);
        metrics::counter!(m::ROWS, "kind" => "padded").increment(padded);
        metrics::gauge!(m::TIME_SHARE).set(share(s.moe_seconds, s.forward_seconds));
    }

    /// The `/stats` "moe" section, or None for a dense model.
    pub fn snapshot(&self) -> Option<serde_json::Value> {
        let guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let s = guard.as_ref()?;
        let selections: serde_json::Map<String, serde_json::Value> =
            s.setup.variants.iter().zip(&s.selections).map(|(v, &n)| (v.name.to_string(), json!(n))).collect();
        let mut out = s.setup.to_json();
        if let Some(o) = out.as_object_mut() {
            o.insert("selections".into(), json!(selections));
            o.insert("passes".into(), json!(s.passes));
            o.insert("layer_calls".into(), json!(s.layer_calls));
            o.insert("tokens".into(), json!(s.tokens));
            o.insert("rows_real".into(), json!(s.rows));
            o.insert("rows_padded".into(), json!(s.padded_rows));
            o.insert(
                "padding_ratio".into(),
                json!(if s.rows > 0 { s.padded_rows as f64 / s.rows as f64 } else { 1.0 }),
            );
            o.insert("moe_seconds".into(), json!(s.moe_seconds));
            o.insert("forward_seconds".into(), json!(s.forward_seconds));
            o.insert("time_share".into(), json!(share(s.moe_seconds, s.forward_seconds)));
            o.insert("last_pass".into(), json!(s.last_pass));
        }
        Some(out)
    }
}

fn share(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        part / whole
    } else {
        0.0
    }
}
