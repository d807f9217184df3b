//! `sieve-loadtest calibrate`: measures a real worker over a sweep of batch shapes (prefix
//! length × items per call × item length), one call at a time so nothing queues or batches
//! together, and fits the cost model that sim-workers load
//! (`ms = request_ms + token_ms·tokens + token_context_ms·token_context`, see
//! `sieve_shared::cost`) to the compute times the worker reports.
//!
//! Every call starts its query with a fresh word, so no call's prefix is in the worker's
//! prefix cache; the features are computed from the token counts the worker reports (cached
//! prefix tokens included, should any be), not from our own guesses.

use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use sieve_shared::{CostFeatures, CostModel, ScoreResponse, WorkerStats};

use crate::client::Http;

#[derive(Debug, Clone)]
pub struct CalibrateSpec {
    /// Words in the query (the prefix adds the template).
    pub query_words: Vec<u32>,
    pub items_per_call: Vec<u32>,
    pub item_words: Vec<u32>,
    /// Calls per shape.
    pub repeats: u32,
    /// Calls before measuring (model load, caches, allocator).
    pub warmup_calls: u32,
    pub timeout: Duration,
}

impl Default for CalibrateSpec {
    fn default() -> Self {
        CalibrateSpec {
            query_words: vec![4, 64, 256],
            items_per_call: vec![1, 4, 16, 64],
            item_words: vec![16, 64, 256],
            repeats: 2,
            warmup_calls: 3,
            timeout: Duration::from_secs(120),
        }
    }
}

/// One measured call.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub prefix_tokens: u32,
    pub cached_prefix_tokens: u32,
    pub items: u32,
    pub item_tokens: u64,
    pub compute_ms: f64,
    pub predicted_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    pub worker: String,
    pub model_name: String,
    pub device: String,
    pub model: CostModel,
    /// Fraction of the variance of compute times the model explains.
    pub r2: f64,
    /// Median |predicted − measured| / measured.
    pub median_rel_error: f64,
    pub samples: Vec<Sample>,
}

impl Calibration {
    /// The cost-model file: TOML that `sim-worker --cost-model` and the proxy's `[cost]` read.
    pub fn to_toml(&self) -> String {
        format!(
            "# Cost model of {} ({} on {}), fitted by `sieve-loadtest calibrate` to {} calls\n\
             # (R² {:.4}, median relative error {:.1}%).\n\
             # ms = request_ms + token_ms * tokens + token_context_ms * token_context\n\
             request_ms = {:.6}\ntoken_ms = {:.9}\ntoken_context_ms = {:.12}\n",
            self.worker,
            self.model_name,
            self.device,
            self.samples.len(),
            self.r2,
            100.0 * self.median_rel_error,
            self.model.request_ms,
            self.model.token_ms,
            self.model.token_context_ms
        )
    }
}

const WORDS: &[&str] =
    &["red", "shoe", "trail", "run", "light", "mesh", "grip", "size", "blue", "road", "soft", "foam", "knit", "fast"];

fn words(n: u32, salt: u64) -> String {
    let mut s = String::with_capacity(n as usize * 6);
    let mut x = salt.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for i in 0..n {
        if i > 0 {
            s.push(' ');
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push_str(WORDS[(x % WORDS.len() as u64) as usize]);
    }
    s
}

/// Calls the worker over the sweep and fits the model. `admin` (optional) is asked for the
/// worker's batch-token limit, model and device.
pub async fn calibrate(
    http: &Http,
    worker: &str,
    admin: Option<&str>,
    spec: &CalibrateSpec,
    mut progress: impl FnMut(usize, usize),
) -> Result<Calibration, String> {
    let worker = worker.trim_end_matches('/').to_string();
    let stats: Option<WorkerStats> = match admin {
        Some(a) => Some(http.get_json(&format!("{}/stats", a.trim_end_matches('/')), Duration::from_secs(5)).await?),
        None => None,
    };
    let max_batch = stats.as_ref().map_or(0, |s| s.max_batch_tokens);
    let max_seq = stats.as_ref().map_or(0, |s| s.max_seq_tokens);
    let mut shapes = Vec::new();
    for &q in &spec.query_words {
        for &m in &spec.items_per_call {
            for &n in &spec.item_words {
                // Rough token count (a word is about a token); leave room for the template.
                let tokens = u64::from(q) + u64::from(m) * u64::from(n + 16) + 64;
                let seq = u64::from(q + n) + 80;
                if (max_batch > 0 && tokens > max_batch) || (max_seq > 0 && seq > max_seq) {
                    continue;
                }
                for _ in 0..spec.repeats {
                    shapes.push((q, m, n));
                }
            }
        }
    }
    if shapes.is_empty() {
        return Err("no shape of the sweep fits the worker's limits".into());
    }
    let url = format!("{worker}/v1/score");
    let total = shapes.len() + spec.warmup_calls as usize;
    let mut samples = Vec::with_capacity(shapes.len());
    let mut features = Vec::with_capacity(shapes.len());
    let warm = std::iter::repeat_n((8u32, 8u32, 32u32), spec.warmup_calls as usize);
    for (call, (q, m, n)) in warm.chain(shapes.iter().copied()).enumerate() {
        // A fresh first word: no prefix-cache hit.
        let query = format!("calib{call} {}", words(q, call as u64));
        let items: Vec<String> = (0..m).map(|i| words(n, (call as u64) << 20 | u64::from(i))).collect();
        let body = serde_json::json!({ "query": query, "items": items });
        let r = http
            .post(&url, Bytes::from(body.to_string()), spec.timeout)
            .await
            .map_err(|e| format!("POST {url}: {e}"))?;
        if r.status != 200 {
            return Err(format!("POST {url}: status {}: {}", r.status, String::from_utf8_lossy(&r.body)));
        }
        let resp: ScoreResponse =
            serde_json::from_slice(&r.body).map_err(|e| format!("POST {url}: unreadable response: {e}"))?;
        progress(call + 1, total);
        if call < spec.warmup_calls as usize {
            continue;
        }
        let u = &resp.usage;
        let f = CostFeatures::of_call(
            f64::from(u.prefix_tokens),
            f64::from(u.cached_prefix_tokens),
            u.item_tokens.iter().map(|&t| f64::from(t)),
        );
        features.push(f);
        samples.push(Sample {
            prefix_tokens: u.prefix_tokens,
            cached_prefix_tokens: u.cached_prefix_tokens,
            items: m,
            item_tokens: u.item_tokens.iter().map(|&t| u64::from(t)).sum(),
            compute_ms: resp.timing.compute_ms,
            predicted_ms: 0.0,
        });
    }
    let ys: Vec<f64> = samples.iter().map(|s| s.compute_ms).collect();
    let model = fit(&features, &ys).ok_or("the compute times do not determine a cost model (all zero?)")?;
    for (s, f) in samples.iter_mut().zip(&features) {
        s.predicted_ms = model.predict(f);
    }
    let mean = ys.iter().sum::<f64>() / ys.len() as f64;
    let ss_tot: f64 = ys.iter().map(|y| (y - mean).powi(2)).sum();
    let ss_res: f64 = samples.iter().map(|s| (s.compute_ms - s.predicted_ms).powi(2)).sum();
    let mut rel: Vec<f64> = samples
        .iter()
        .filter(|s| s.compute_ms > 0.0)
        .map(|s| ((s.predicted_ms - s.compute_ms) / s.compute_ms).abs())
        .collect();
    rel.sort_by(f64::total_cmp);
    Ok(Calibration {
        worker,
        model_name: stats.as_ref().map(|s| s.model.clone()).unwrap_or_default(),
        device: stats.as_ref().map(|s| s.device.clone()).unwrap_or_default(),
        model,
        r2: if ss_tot > 0.0 { 1.0 - ss_res / ss_tot } else { 1.0 },
        median_rel_error: rel.get(rel.len() / 2).copied().unwrap_or(0.0),
        samples,
    })
}

/// Non-negative least squares on the three cost terms, weighted by 1/y (relative error, so
/// small calls count as much as large ones): the best of the non-negative solutions over
/// every subset of terms.
pub fn fit(features: &[CostFeatures], ys: &[f64]) -> Option<CostModel> {
    let rows: Vec<([f64; 3], f64)> = features
        .iter()
        .zip(ys)
        .filter(|(_, y)| **y > 0.0 && y.is_finite())
        .map(|(f, y)| {
            let w = 1.0 / y;
            let a = f.as_array();
            ([a[0] * w, a[1] * w, a[2] * w], 1.0)
        })
        .collect();
    if rows.is_empty() {
        return None;
    }
    let mut best: Option<([f64; 3], f64)> = None;
    for mask in 1u8..8 {
        let idx: Vec<usize> = (0..3).filter(|i| mask & (1 << i) != 0).collect();
        let Some(coef) = solve_subset(&rows, &idx) else { continue };
        if coef.iter().any(|&c| c < 0.0) {
            continue;
        }
        let mut w = [0.0; 3];
        for (k, &i) in idx.iter().enumerate() {
            w[i] = coef[k];
        }
        let res: f64 = rows.iter().map(|(x, y)| (x[0] * w[0] + x[1] * w[1] + x[2] * w[2] - y).powi(2)).sum();
        if best.is_none_or(|b| res < b.1 - 1e-15) {
            best = Some((w, res));
        }
    }
    best.map(|(w, _)| CostModel::from_array(w))
}

/// Least squares on the columns `idx` (normal equations, Gaussian elimination with column
/// scaling; the systems are at most 3×3).
fn solve_subset(rows: &[([f64; 3], f64)], idx: &[usize]) -> Option<Vec<f64>> {
    let k = idx.len();
    let scale: Vec<f64> =
        idx.iter().map(|&i| rows.iter().map(|r| r.0[i].abs()).fold(0.0, f64::max).max(1e-300)).collect();
    let mut a = vec![vec![0.0; k + 1]; k];
    for (x, y) in rows {
        for r in 0..k {
            let xr = x[idx[r]] / scale[r];
            for c in 0..k {
                a[r][c] += xr * x[idx[c]] / scale[c];
            }
            a[r][k] += xr * y;
        }
    }
    for col in 0..k {
        let piv = (col..k).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[piv][col].abs() < 1e-12 {
            return None;
        }
        a.swap(col, piv);
        let pivot_row = a[col].clone();
        for (r, row) in a.iter_mut().enumerate() {
            if r != col {
                let f = row[col] / pivot_row[col];
                for (x, p) in row[col..].iter_mut().zip(&pivot_row[col..]) {
                    *x -= f * p;
                }
            }
        }
    }
    Some((0..k).map(|r| a[r][k] / a[r][r] / scale[r]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_a_known_model_from_exact_and_noisy_times() {
        let truth = CostModel { request_ms: 3.0, token_ms: 0.004, token_context_ms: 2e-6 };
        let mut fs = Vec::new();
        for p in [40.0, 100.0, 300.0] {
            for m in [1, 4, 16, 64] {
                for n in [20.0, 80.0, 260.0] {
                    fs.push(CostFeatures::of_call(p, 0.0, std::iter::repeat_n(n, m)));
                }
            }
        }
        let ys: Vec<f64> = fs.iter().map(|f| truth.predict(f)).collect();
        let m = fit(&fs, &ys).unwrap();
        for (a, b) in m.as_array().iter().zip(truth.as_array()) {
            assert!((a - b).abs() <= 1e-6 * b.abs().max(1e-9), "{m:?}");
        }
        // ±5% deterministic noise: still within 10% on each term.
        let noisy: Vec<f64> = ys.iter().enumerate().map(|(i, y)| y * if i % 2 == 0 { 1.05 } else { 0.95 }).collect();
        let m = fit(&fs, &noisy).unwrap();
        for (a, b) in m.as_array().iter().zip(truth.as_array()) {
            assert!((a - b).abs() <= 0.1 * b, "{m:?}");
        }
        // A model without attention cost: the fit does not invent a negative one.
        let flat = CostModel { request_ms: 1.0, token_ms: 0.01, token_context_ms: 0.0 };
        let ys: Vec<f64> = fs.iter().map(|f| flat.predict(f) * 0.98).collect();
        let m = fit(&fs, &ys).unwrap();
        assert!(m.token_context_ms >= 0.0 && m.request_ms >= 0.0);
    }

    #[test]
    fn cost_model_file_round_trips() {
        let c = Calibration {
            worker: "http://w".into(),
            model_name: "m".into(),
            device: "cpu".into(),
            model: CostModel { request_ms: 1.5, token_ms: 0.0123, token_context_ms: 3.4e-7 },
            r2: 0.99,
            median_rel_error: 0.02,
            samples: Vec::new(),
        };
        let back = CostModel::parse(&c.to_toml()).unwrap();
        assert!((back.token_ms - 0.0123).abs() < 1e-12 && (back.token_context_ms - 3.4e-7).abs() < 1e-15);
    }
}
