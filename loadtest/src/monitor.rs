//! Per-worker utilisation over time, from polling each worker's admin `GET /stats`.
//!
//! A simulated worker reports its busy slot-seconds (`sim.busy_seconds`, `sim.slots`), so its
//! utilisation over a poll interval is exact. A real worker reports tokens processed and its
//! recent forward throughput; busy time is estimated as tokens / throughput. A worker that
//! reports neither counts as busy while it has calls in flight. Worker admin URLs can be
//! found through a proxy's admin `GET /workers`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sieve_shared::WorkerStats;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::client::Http;

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Utilisation {
    /// Worker admin URLs, one series each.
    pub workers: Vec<String>,
    /// Sample times, seconds after the monitor started (end of each interval).
    pub t_s: Vec<f64>,
    /// `series[w][i]`: busy fraction of worker w over the interval ending at `t_s[i]`
    /// (NaN where the worker did not answer).
    pub series: Vec<Vec<f64>>,
}

impl Utilisation {
    /// Mean over workers and samples, ignoring gaps.
    pub fn mean(&self) -> f64 {
        let vals: Vec<f64> = self.series.iter().flatten().copied().filter(|v| v.is_finite()).collect();
        if vals.is_empty() {
            0.0
        } else {
            vals.iter().sum::<f64>() / vals.len() as f64
        }
    }
}

/// Reads a busy-seconds counter and a capacity (slots) from a worker's stats.
fn busy_counter(s: &WorkerStats) -> Option<(f64, f64)> {
    let sim = s.extra.get("sim")?;
    let busy = sim.get("busy_seconds")?.as_f64()?;
    let slots = sim.get("slots")?.as_f64().unwrap_or(1.0).max(1.0);
    Some((busy, slots))
}

#[derive(Clone, Copy)]
struct Prev {
    at: Instant,
    busy: Option<(f64, f64)>,
    tokens: u64,
}

fn utilisation(prev: &Prev, now: Instant, s: &WorkerStats) -> f64 {
    let dt = now.duration_since(prev.at).as_secs_f64().max(1e-6);
    if let (Some((b0, _)), Some((b1, slots))) = (prev.busy, busy_counter(s)) {
        return ((b1 - b0) / dt / slots).clamp(0.0, 1.0);
    }
    if s.tokens_per_second > 0.0 {
        let tokens = s.tokens_processed.saturating_sub(prev.tokens) as f64;
        return (tokens / s.tokens_per_second / dt).clamp(0.0, 1.0);
    }
    if s.in_flight_requests > 0 {
        1.0
    } else {
        0.0
    }
}

/// A running poller. `stop` returns what it saw.
pub struct Monitor {
    data: Arc<Mutex<Utilisation>>,
    task: JoinHandle<()>,
}

impl Monitor {
    pub fn start(http: Http, admin_urls: Vec<String>, interval: Duration) -> Monitor {
        let n = admin_urls.len();
        let data = Arc::new(Mutex::new(Utilisation {
            workers: admin_urls.clone(),
            t_s: Vec::new(),
            series: vec![Vec::new(); n],
        }));
        let d = data.clone();
        let task = tokio::spawn(async move {
            let t0 = Instant::now();
            let poll = |http: Http, url: String| async move {
                http.get_json::<WorkerStats>(&format!("{url}/stats"), Duration::from_secs(1)).await.ok()
            };
            let mut prev: Vec<Option<Prev>> = vec![None; n];
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let stats = futures_join(admin_urls.iter().map(|u| poll(http.clone(), u.clone()))).await;
                let now = Instant::now();
                let mut row = vec![f64::NAN; n];
                // The first answers only set the baseline of each worker.
                let had_baseline = prev.iter().any(Option::is_some);
                for (w, s) in stats.into_iter().enumerate() {
                    match s {
                        Some(s) => {
                            if let Some(p) = &prev[w] {
                                row[w] = utilisation(p, now, &s);
                            }
                            prev[w] = Some(Prev { at: now, busy: busy_counter(&s), tokens: s.tokens_processed });
                        }
                        // A worker that was down starts a fresh interval when it is back.
                        None => prev[w] = None,
                    }
                }
                if had_baseline {
                    if let Ok(mut d) = d.lock() {
                        d.t_s.push(now.duration_since(t0).as_secs_f64());
                        for (w, v) in row.into_iter().enumerate() {
                            d.series[w].push(v);
                        }
                    }
                }
            }
        });
        Monitor { data, task }
    }

    pub fn stop(self) -> Utilisation {
        self.task.abort();
        self.data.lock().map(|d| d.clone()).unwrap_or_default()
    }
}

/// Awaits all futures concurrently, keeping their order.
async fn futures_join<F>(futs: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<JoinHandle<F::Output>> = futs.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        match h.await {
            Ok(v) => out.push(v),
            Err(_) => return out,
        }
    }
    out
}

#[derive(Deserialize)]
struct ProxyWorkers {
    workers: Vec<ProxyWorkerRow>,
}

#[derive(Deserialize)]
struct ProxyWorkerRow {
    #[serde(default)]
    admin: Option<String>,
}

/// The admin URLs of a proxy's workers, from its admin `GET /workers`.
pub async fn workers_of_proxy(http: &Http, proxy_admin: &str) -> Result<Vec<String>, String> {
    let r: ProxyWorkers =
        http.get_json(&format!("{}/workers", proxy_admin.trim_end_matches('/')), Duration::from_secs(2)).await?;
    Ok(r.workers.into_iter().filter_map(|w| w.admin).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utilisation_from_sim_busy_seconds_and_from_tokens() {
        let t0 = Instant::now();
        let sim = |busy: f64| {
            let mut s = WorkerStats::default();
            s.extra.insert("sim".into(), serde_json::json!({"busy_seconds": busy, "slots": 2}));
            s
        };
        let p = Prev { at: t0, busy: busy_counter(&sim(1.0)), tokens: 0 };
        let u = utilisation(&p, t0 + Duration::from_secs(2), &sim(3.0));
        assert!((u - 0.5).abs() < 1e-9, "{u}");
        let real = WorkerStats { tokens_processed: 5000, tokens_per_second: 10_000.0, ..WorkerStats::default() };
        let p = Prev { at: t0, busy: None, tokens: 1000 };
        assert!((utilisation(&p, t0 + Duration::from_secs(1), &real) - 0.4).abs() < 1e-9);
    }
}
