//! The admin port: `/health` (the process is up), `/ready` (not draining and at least one
//! worker can take shards), `/metrics` (Prometheus), `/workers` (a JSON table of every
//! worker's state, also as `/stats`), `/config` (the effective config) and `POST /reload`
//! (re-read the file).

use std::sync::Arc;
use std::time::Instant;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde::Serialize;
use sieve_shared::{ApiError, CostModel, ErrorKind};

use crate::discovery::Discovery;
use crate::http::{error, json, text};
use crate::metrics as m;
use crate::server::HttpResponse;
use crate::state::{AppState, lock};
use crate::worker::WorkerRow;

#[derive(Serialize)]
struct WorkersReport {
    workers: Vec<WorkerRow>,
    eligible: usize,
    cost_model: CostModel,
    cost_model_samples: f64,
    token_weights: Vec<f64>,
    prefix_bias: [f64; 2],
    hedge_ratio_quantile: Option<f64>,
    hedge_budget_ms: f64,
    retry_budget: f64,
    requests_in_flight: usize,
    draining: bool,
}

pub async fn handle(state: Arc<AppState>, discovery: Arc<Discovery>, req: Request<Incoming>) -> HttpResponse {
    let path = req.uri().path().to_string();
    match (req.method(), path.as_str()) {
        (&Method::GET, "/health") => json(StatusCode::OK, &serde_json::json!({"status": "ok"})),
        (&Method::GET, "/ready") => ready(&state),
        (&Method::GET, "/metrics") => {
            refresh_worker_gauges(&state);
            text(StatusCode::OK, state.metrics.render(), "text/plain; version=0.0.4")
        }
        // `/stats` is the same report, under the name the worker's admin port uses.
        (&Method::GET, "/workers" | "/stats") => json(StatusCode::OK, &workers_report(&state)),
        (&Method::GET, "/config") => json(StatusCode::OK, &*state.config()),
        (&Method::POST, "/reload") => match discovery.reload() {
            Ok(n) => json(StatusCode::OK, &serde_json::json!({"reloaded": true, "workers": n})),
            Err(e) => error(&ApiError::invalid(e)),
        },
        (_, "/health" | "/ready" | "/metrics" | "/workers" | "/stats" | "/config" | "/reload") => {
            error(&ApiError::new(ErrorKind::MethodNotAllowed, format!("method not allowed on {path}")))
        }
        _ => error(&ApiError::new(ErrorKind::NotFound, format!("no route {path}"))),
    }
}

fn ready(state: &AppState) -> HttpResponse {
    if state.drain.is_draining() {
        return error(&ApiError::not_ready("draining"));
    }
    let eligible = state.pool.eligible(Instant::now()).len();
    if eligible == 0 {
        return error(&ApiError::not_ready(format!(
            "no worker is ready ({} configured)",
            state.pool.snapshot().len()
        )));
    }
    json(StatusCode::OK, &serde_json::json!({"ready": true, "workers_ready": eligible}))
}

pub fn workers_report(state: &AppState) -> impl Serialize {
    let now = Instant::now();
    let cfg = state.config();
    let model = state.cost_model();
    let params = AppState::view_params(&cfg);
    let workers: Vec<WorkerRow> = state.pool.snapshot().iter().map(|w| w.describe(now, &model, &params)).collect();
    let tokens = lock(&state.tokens).weights();
    WorkersReport {
        eligible: workers.iter().filter(|w| w.eligible).count(),
        workers,
        cost_model: model,
        cost_model_samples: lock(&state.cost).samples(),
        token_weights: tokens.weights.to_vec(),
        prefix_bias: tokens.prefix_bias,
        hedge_ratio_quantile: state.ratios.quantile(cfg.hedge.min_samples),
        hedge_budget_ms: state.hedge_budget.available(),
        retry_budget: state.retry_budget.available(),
        requests_in_flight: state.drain.in_flight(),
        draining: state.drain.is_draining(),
    }
}

/// Per-worker gauges are computed when scraped rather than on every shard.
fn refresh_worker_gauges(state: &AppState) {
    let now = Instant::now();
    let cfg = state.config();
    let model = state.cost_model();
    let params = AppState::view_params(&cfg);
    let mut eligible = 0;
    for w in state.pool.snapshot().iter() {
        let url = w.url().to_string();
        let view = w.view(now, &model, &params);
        let ok = w.is_eligible(now);
        eligible += usize::from(ok);
        metrics::gauge!(m::WORKER_IN_FLIGHT, "worker" => url.clone()).set(w.in_flight() as f64);
        metrics::gauge!(m::WORKER_BACKLOG_SECONDS, "worker" => url.clone()).set(view.backlog_ms / 1e3);
        metrics::gauge!(m::WORKER_BREAKER_STATE, "worker" => url.clone()).set(w.breaker_state(now).as_gauge());
        metrics::gauge!(m::WORKER_READY, "worker" => url.clone()).set(if ok { 1.0 } else { 0.0 });
        metrics::gauge!(m::WORKER_TIME_FACTOR, "worker" => url).set(view.time_factor);
    }
    metrics::gauge!(m::WORKERS_ELIGIBLE).set(eligible as f64);
}
