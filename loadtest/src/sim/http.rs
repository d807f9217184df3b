//! The simulated worker's two HTTP servers: the scoring API and the admin port, with the same
//! routes, bodies and status codes as the real worker.

use std::sync::atomic::Ordering;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use std::sync::Arc;
use std::time::Duration;

use sieve_server::http::{self, read_body, AdminAuth, ByteBudget, HttpResponse, StopMode};
use sieve_server::service::{self, Call, ScoreService, Scored};
use sieve_shared::{ApiError, ErrorKind, Limits, ScoreRequest};
use tokio::sync::watch;

use super::config::SimSettingsUpdate;
use super::engine::{SharedEngine, SimEngine};

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

/// `POST /v1/score`, `POST /v1/rerank`: the shared API over the simulated engine.
pub async fn api(engine: SharedEngine, req: Request<Incoming>) -> HttpResponse {
    service::handle(engine.as_ref(), req).await
}

impl ScoreService for SimEngine {
    // The engine's queue bound does the overload refusal (429), inside `score`.
    type Admission<'a> = ();

    fn span_name(&self) -> &'static str {
        "sim-worker"
    }

    fn limits(&self) -> Limits {
        self.config().limits.clone()
    }

    fn buffer_budget(&self) -> &ByteBudget {
        SimEngine::buffer_budget(self)
    }

    fn api_config(&self) -> sieve_shared::ApiConfig {
        self.config().api.clone()
    }

    fn served_models(&self) -> Vec<String> {
        vec![self.config().model.clone()]
    }

    fn admit(&self) -> Result<(), ApiError> {
        if self.is_ready() {
            return Ok(());
        }
        let c = self.counters();
        c.requests.fetch_add(1, Ordering::Relaxed);
        c.rejected.fetch_add(1, Ordering::Relaxed);
        Err(ApiError::not_ready(if self.is_draining() { "sim worker is draining" } else { "sim worker is not ready" }))
    }

    async fn score(&self, req: ScoreRequest<'_>, call: Call) -> Result<Scored, ApiError> {
        SimEngine::score(self, req, call.arrival).await.map(Scored::from)
    }
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
