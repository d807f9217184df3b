//! The scoring API: `POST /v1/score` and `POST /v1/rerank`, the worker's shapes exactly, with
//! the timing breakdown also in `x-sieve-*-ms` headers.

use std::sync::Arc;
use std::time::Instant;

use hyper::body::Incoming;
use hyper::header::{CONNECTION, HeaderValue};
use hyper::{Method, Request, StatusCode};
use sieve_shared::api::headers;
use sieve_shared::{ApiError, ErrorKind, RerankRequest, RerankResponse, ScoreRequest, Timing};

use crate::fanout;
use crate::http::{error, json, read_body};
use crate::merger::MergeStats;
use crate::metrics as m;
use crate::server::HttpResponse;
use crate::state::AppState;

#[derive(Clone, Copy)]
enum Route {
    Score,
    Rerank,
}

impl Route {
    fn name(self) -> &'static str {
        match self {
            Route::Score => "score",
            Route::Rerank => "rerank",
        }
    }
}

pub async fn handle(state: Arc<AppState>, req: Request<Incoming>) -> HttpResponse {
    let arrival = Instant::now();
    let route = match (req.method(), req.uri().path()) {
        (&Method::POST, "/v1/score") => Route::Score,
        (&Method::POST, "/v1/rerank") => Route::Rerank,
        (_, "/v1/score" | "/v1/rerank") => {
            return error(&ApiError::new(ErrorKind::MethodNotAllowed, format!("{} needs POST", req.uri().path())));
        }
        (_, path) => {
            return error(&ApiError::new(ErrorKind::NotFound, format!("no route {path}; try POST /v1/score")));
        }
    };
    let resp = match serve(&state, route, req, arrival).await {
        Ok(r) => r,
        Err(e) => {
            if e.kind == ErrorKind::Internal {
                tracing::warn!("{} request failed: {}", route.name(), e.message);
            }
            let mut r = error(&e);
            if e.kind == ErrorKind::TooLarge {
                // The rest of an oversized body was not read: this connection cannot carry
                // another request.
                r.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
            }
            r
        }
    };
    metrics::counter!(m::REQUESTS, "route" => route.name(), "code" => resp.status().as_str().to_string()).increment(1);
    metrics::histogram!(m::REQUEST_SECONDS, "route" => route.name()).record(arrival.elapsed().as_secs_f64());
    resp
}

async fn serve(state: &Arc<AppState>, route: Route, req: Request<Incoming>, arrival: Instant) -> Result<HttpResponse, ApiError> {
    let cfg = state.config();
    // Admission first: a draining or saturated proxy does no work for the request. Its body is
    // still read (bounded), so the connection stays usable for the client's next request.
    let admitted = state.drain.admit(cfg.server.max_in_flight_requests);
    let body = read_body(req, cfg.limits.max_body_bytes).await;
    let _admitted = admitted?;
    let body = body?;
    match route {
        Route::Score => {
            let r: ScoreRequest = ApiError::parse_json(&body)?;
            let (resp, stats) = fanout::score(state, r, arrival).await?;
            Ok(with_headers(json(StatusCode::OK, &resp), &resp.timing, &stats))
        }
        Route::Rerank => {
            let r: RerankRequest = ApiError::parse_json(&body)?;
            let (resp, stats) = fanout::score(state, r.to_score_request(), arrival).await?;
            let timing = resp.timing;
            Ok(with_headers(json(StatusCode::OK, &RerankResponse::from_scores(&r, resp)), &timing, &stats))
        }
    }
}

fn with_headers(mut r: HttpResponse, t: &Timing, stats: &MergeStats) -> HttpResponse {
    let h = r.headers_mut();
    for (name, v) in [(headers::QUEUE_MS, t.queue_ms), (headers::COMPUTE_MS, t.compute_ms), (headers::TOTAL_MS, t.total_ms)] {
        if let Ok(hv) = HeaderValue::from_str(&format!("{v:.3}")) {
            h.insert(name, hv);
        }
    }
    h.insert("x-sieve-shards", HeaderValue::from(stats.shards));
    if stats.missing > 0 {
        h.insert("x-sieve-missing", HeaderValue::from(stats.missing));
    }
    r
}
