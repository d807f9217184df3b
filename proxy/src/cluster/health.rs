//! Active health checks: every `health.interval_ms`, each worker's admin `GET /ready` (can it
//! take work?) and `GET /stats` (its queue, limits and whether it is draining). Runs at once
//! when workers are added, so a new worker takes shards as soon as it is ready. The model and
//! template identity a worker reports keep the pair-score cache to them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sieve_shared::{ApiError, WorkerStats};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::client::HttpClient;
use crate::cluster::worker::{Health, Worker};
use crate::cluster::ClusterHost;
use crate::metrics as m;

pub async fn run(host: Arc<dyn ClusterHost>, mut stop: watch::Receiver<bool>) {
    loop {
        let cfg = host.config();
        let timeout = Duration::from_millis(cfg.health.timeout_ms);
        let mut checks = JoinSet::new();
        for w in host.pool().snapshot().iter() {
            if w.ready_uri.is_some() {
                let (client, w, host) = (host.client().clone(), w.clone(), host.clone());
                checks.spawn(async move {
                    // The model a worker reports: another one than before empties the
                    // pair-score cache before any request is answered from it.
                    if let Some((model, template)) = check(&client, &w, timeout).await {
                        host.observe_model(&model, &template);
                    }
                });
            }
        }
        while checks.join_next().await.is_some() {}
        metrics::gauge!(m::WORKERS_ELIGIBLE).set(host.pool().eligible(Instant::now()).len() as f64);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(cfg.health.interval_ms)) => {}
            _ = host.health_wake().notified() => {}
            _ = stop.changed() => return,
        }
    }
}

/// Checks `w` and records what it found; returns the model and template identity the worker
/// reports, if it answered `/stats`.
pub async fn check(client: &HttpClient, w: &Worker, timeout: Duration) -> Option<(String, String)> {
    let (Some(ready_uri), Some(stats_uri)) = (&w.ready_uri, &w.stats_uri) else { return None };
    let (mut health, detail) = match tokio::time::timeout(timeout, client.get(ready_uri)).await {
        Err(_) => (Health::Unreachable, Some(format!("/ready did not answer in {timeout:?}"))),
        Ok(Err(e)) => (Health::Unreachable, Some(e.to_string())),
        Ok(Ok(r)) if r.status.is_success() => (Health::Ready, None),
        Ok(Ok(r)) => {
            let e = ApiError::from_response(r.status.as_u16(), &r.body);
            let health = if e.message.contains("draining") { Health::Draining } else { Health::NotReady };
            (health, Some(format!("/ready {}: {}", r.status.as_u16(), e.message)))
        }
    };
    let stats = if health == Health::Unreachable {
        None
    } else {
        match tokio::time::timeout(timeout, client.get(stats_uri)).await {
            Ok(Ok(r)) if r.status.is_success() => serde_json::from_slice::<WorkerStats>(&r.body).ok(),
            _ => None,
        }
    };
    if stats.as_ref().is_some_and(|s| s.draining) {
        health = Health::Draining;
    }
    let before = w.state().health;
    if before != health {
        tracing::info!(worker = w.url(), ?before, now = ?health, detail = detail.as_deref().unwrap_or(""), "worker health");
    }
    let model = stats.as_ref().map(|s| (s.model.clone(), s.template.clone()));
    w.record_health(Instant::now(), health, detail, stats);
    model
}
