//! The scoring API: `POST /v1/score` and `POST /v1/rerank`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{Method, Request, StatusCode};
use sieve_shared::api::headers;
use sieve_shared::metrics_names::worker as m;
use sieve_shared::{ApiError, ErrorKind, RerankRequest, RerankResponse, ScoreRequest, ScoreResponse, Timing};

use sieve_shared::http::{self, read_body, HttpResponse};

use super::AppState;
use crate::engine::{CancellationToken, Submission};

pub async fn handle(app: Arc<AppState>, req: Request<Incoming>) -> HttpResponse {
    let arrived = Instant::now();
    let route = match req.uri().path() {
        "/v1/score" => "score",
        "/v1/rerank" => "rerank",
        _ => {
            return http::error(&ApiError::new(ErrorKind::NotFound, format!("no route {} (try POST /v1/score or /v1/rerank)", req.uri().path())))
        }
    };
    if req.method() != Method::POST {
        return http::error(&ApiError::new(ErrorKind::MethodNotAllowed, format!("{} needs POST", req.uri().path())));
    }
    let result = match route {
        "score" => score(&app, req, arrived).await,
        _ => rerank(&app, req, arrived).await,
    };
    let secs = arrived.elapsed().as_secs_f64();
    let response = match result {
        Ok(r) => r,
        Err(e) => {
            metrics::counter!(m::REQUEST_ERRORS, "route" => route, "status" => e.status().to_string()).increment(1);
            if e.kind == ErrorKind::Internal {
                tracing::error!(route, "{}", e.message);
            }
            http::error(&e)
        }
    };
    metrics::counter!(m::REQUESTS, "route" => route, "status" => response.status().as_u16().to_string()).increment(1);
    metrics::histogram!(m::REQUEST_SECONDS, "route" => route).record(secs);
    response
}

async fn score(app: &AppState, req: Request<Incoming>, arrived: Instant) -> Result<HttpResponse, ApiError> {
    let body = read_body(req, app.limits.max_body_bytes).await?;
    let r: ScoreRequest = ApiError::parse_json(&body)?;
    let resp = run(app, &r, arrived).await?;
    let timing = resp.timing;
    Ok(with_timing(http::json(StatusCode::OK, &resp), timing))
}

async fn rerank(app: &AppState, req: Request<Incoming>, arrived: Instant) -> Result<HttpResponse, ApiError> {
    let body = read_body(req, app.limits.max_body_bytes).await?;
    let r: RerankRequest = ApiError::parse_json(&body)?;
    if r.top_n == Some(0) {
        return Err(ApiError::invalid("top_n must be at least 1"));
    }
    let resp = run(app, &r.to_score_request(), arrived).await?;
    let timing = resp.timing;
    let out = RerankResponse::from_scores(&r, resp);
    Ok(with_timing(http::json(StatusCode::OK, &out), timing))
}

fn with_timing(mut r: HttpResponse, t: Timing) -> HttpResponse {
    for (name, v) in [(headers::QUEUE_MS, t.queue_ms), (headers::COMPUTE_MS, t.compute_ms), (headers::TOTAL_MS, t.total_ms)] {
        if let Ok(h) = HeaderValue::from_str(&format!("{v:.3}")) {
            r.headers_mut().insert(name, h);
        }
    }
    r
}

/// Validates, queues and awaits one scoring call.
async fn run(app: &AppState, r: &ScoreRequest, arrived: Instant) -> Result<ScoreResponse, ApiError> {
    app.limits.check(r)?;
    if app.state.draining.load(Ordering::Acquire) {
        return Err(ApiError::not_ready("draining: not accepting new work"));
    }
    let engine = app.engine.get().ok_or_else(|| {
        let why = app.state.load_error.lock().ok().and_then(|e| e.clone());
        ApiError::not_ready(match why {
            Some(e) => format!("the model failed to load: {e}"),
            None => "not ready: the model is loading".to_string(),
        })
    })?;
    let cancel = CancellationToken::new();
    // Dropped with this future when the caller goes away (hyper drops the handler's future when
    // the connection closes, even while it waits here): the engine then drops the call's work,
    // mid-pass at the next layer.
    let _cancel_on_drop = cancel.clone().drop_guard();
    let ticket = engine.submit(Submission {
        query: r.query.clone(),
        items: r.items.iter().map(|i| i.text().to_string()).collect(),
        instruction: r.instruction.clone(),
        arrived,
        deadline: r.deadline_ms.map(Duration::from_millis),
        cancel,
    })?;
    // 504 at the deadline if the call has not started; partial scores (with `missing`) if it
    // was running.
    let out = ticket.wait().await?;
    let ids = r.items.iter().any(|i| i.id().is_some()).then(|| r.items.iter().map(|i| i.id().map(str::to_string)).collect());
    metrics::counter!(m::PAIRS).increment(out.usage.pairs as u64);
    metrics::counter!(m::TOKENS_COMPUTED).increment(out.usage.computed_tokens);
    metrics::counter!(m::PROMPT_TOKENS).increment(out.usage.prompt_tokens);
    metrics::histogram!(m::QUEUE_SECONDS).record(out.queue_ms / 1e3);
    Ok(ScoreResponse {
        scores: out.scores,
        ids,
        missing: out.missing,
        usage: out.usage,
        timing: Timing { queue_ms: out.queue_ms, compute_ms: out.compute_ms, total_ms: arrived.elapsed().as_secs_f64() * 1e3 },
        model: app.model_name.get().cloned().unwrap_or_default(),
    })
}
