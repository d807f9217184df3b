//! The simulated worker's two HTTP servers: the scoring API and the admin port, with the same
//! routes, bodies and status codes as the real worker.

use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{Method, Request, StatusCode};
use sieve_shared::api::headers;
use std::sync::Arc;
use std::time::Duration;

use sieve_shared::http::{self, read_body, AdminAuth, HttpResponse, StopMode};
use sieve_shared::{ApiError, ErrorKind, RerankRequest, RerankResponse, ScoreRequest};
use tokio::sync::watch;
use tokio::time::Instant;

use super::config::SimSettingsUpdate;
use super::engine::SharedEngine;

/// How the servers should stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    Running,
    /// Stop accepting, let running calls finish (for at most this long), close idle connections.
    Graceful(Duration),
    /// Drop every connection at once, as a crashed process would.
    Kill,
}

/// Resolves when `stop` leaves `Running` (or its sender is gone): how the servers end.
pub async fn stopped(mut stop: watch::Receiver<Stop>) -> StopMode {
    let _ = stop.wait_for(|s| *s != Stop::Running).await;
    match *stop.borrow() {
        Stop::Graceful(grace) => StopMode::Graceful(Some(grace)),
        _ => StopMode::Kill,
    }
}

fn with_timing_headers(mut r: HttpResponse, t: &sieve_shared::Timing) -> HttpResponse {
    for (name, v) in [(headers::QUEUE_MS, t.queue_ms), (headers::COMPUTE_MS, t.compute_ms), (headers::TOTAL_MS, t.total_ms)] {
        if let Ok(hv) = HeaderValue::from_str(&format!("{v:.3}")) {
            r.headers_mut().insert(name, hv);
        }
    }
    r
}

/// `POST /v1/score`, `POST /v1/rerank`.
pub async fn api(engine: SharedEngine, req: Request<Incoming>) -> HttpResponse {
    let arrival = Instant::now();
    let route = match (req.method(), req.uri().path()) {
        (&Method::POST, "/v1/score") => Route::Score,
        (&Method::POST, "/v1/rerank") => Route::Rerank,
        (_, "/v1/score" | "/v1/rerank") => {
            return http::error(&ApiError::new(ErrorKind::MethodNotAllowed, "use POST"));
        }
        (_, path) => return http::error(&ApiError::new(ErrorKind::NotFound, format!("no route {path}"))),
    };
    let header_deadline =
        req.headers().get(headers::DEADLINE_MS).and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    let body = match read_body(req, engine.config().limits.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => return http::error(&e),
    };
    match route {
        Route::Score => {
            let mut r: ScoreRequest = match ApiError::parse_json(&body) {
                Ok(r) => r,
                Err(e) => return http::error(&e),
            };
            r.deadline_ms = r.deadline_ms.or(header_deadline);
            match engine.score(r, arrival).await {
                Ok(resp) => with_timing_headers(http::json(StatusCode::OK, &resp), &resp.timing),
                Err(e) => http::error(&e),
            }
        }
        Route::Rerank => {
            let r: RerankRequest = match ApiError::parse_json(&body) {
                Ok(r) => r,
                Err(e) => return http::error(&e),
            };
            let mut s = r.to_score_request();
            s.deadline_ms = s.deadline_ms.or(header_deadline);
            match engine.score(s, arrival).await {
                Ok(resp) => {
                    let timing = resp.timing;
                    with_timing_headers(http::json(StatusCode::OK, &RerankResponse::from_scores(&r, resp)), &timing)
                }
                Err(e) => http::error(&e),
            }
        }
    }
}

enum Route {
    Score,
    Rerank,
}

/// `GET /health`, `/ready`, `/metrics`, `/stats`, `/sim`; `PUT /sim` changes the settings and
/// needs the admin token (the reads too with `protect_reads`).
pub async fn admin(engine: SharedEngine, auth: Arc<AdminAuth>, req: Request<Incoming>) -> HttpResponse {
    if matches!(req.uri().path(), "/health" | "/ready" | "/metrics" | "/stats" | "/sim") {
        if let Err(e) = auth.check(&req, req.method() != Method::GET) {
            return http::error(&e);
        }
    }
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/health") => http::json(StatusCode::OK, &serde_json::json!({"status": "ok"})),
        (&Method::GET, "/ready") => {
            if engine.is_ready() {
                http::json(StatusCode::OK, &serde_json::json!({"ready": true}))
            } else {
                let why = if engine.is_draining() { "draining" } else { "not ready" };
                http::error(&ApiError::not_ready(why))
            }
        }
        (&Method::GET, "/metrics") => http::text(StatusCode::OK, engine.metrics_text(), "text/plain; version=0.0.4"),
        (&Method::GET, "/stats") => http::json(StatusCode::OK, &engine.stats()),
        (&Method::GET, "/sim") => http::json(StatusCode::OK, &engine.settings()),
        (&Method::PUT, "/sim") => {
            let body = match read_body(req, 1 << 16).await {
                Ok(b) => b,
                Err(e) => return http::error(&e),
            };
            let update: SimSettingsUpdate = match ApiError::parse_json(&body) {
                Ok(u) => u,
                Err(e) => return http::error(&e),
            };
            match engine.update(&update) {
                Ok(s) => http::json(StatusCode::OK, &s),
                Err(m) => http::error(&ApiError::invalid(m)),
            }
        }
        (_, "/health" | "/ready" | "/metrics" | "/stats" | "/sim") => {
            http::error(&ApiError::new(ErrorKind::MethodNotAllowed, "method not allowed"))
        }
        (_, path) => http::error(&ApiError::new(ErrorKind::NotFound, format!("no route {path}"))),
    }
}
