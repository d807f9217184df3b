//! The simulated worker's two HTTP servers: the scoring API and the admin port, with the same
//! routes, bodies and status codes as the real worker.

use std::convert::Infallible;
use std::future::Future;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use serde::Serialize;
use sieve_shared::api::headers;
use sieve_shared::{ApiError, ErrorKind, RerankRequest, RerankResponse, ScoreRequest};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::config::SimSettingsUpdate;
use super::engine::SharedEngine;

/// How the servers should stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    Running,
    /// Stop accepting, let running calls finish, close idle connections.
    Graceful,
    /// Drop every connection at once, as a crashed process would.
    Kill,
}

pub type HttpResponse = Response<Full<Bytes>>;

/// Accepts connections until told to stop; one task per connection, HTTP/1.1 keep-alive.
pub async fn serve<F, Fut>(listener: TcpListener, handler: F, mut stop: watch::Receiver<Stop>)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = HttpResponse> + Send + 'static,
{
    let graceful = GracefulShutdown::new();
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((s, _)) => s,
                    Err(e) => {
                        tracing::warn!("accept: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let h = handler.clone();
                let svc = service_fn(move |req| {
                    let h = h.clone();
                    async move { Ok::<_, Infallible>(h(req).await) }
                });
                let conn = graceful.watch(http1::Builder::new().serve_connection(TokioIo::new(stream), svc));
                conns.spawn(async move {
                    let _ = conn.await;
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() != Stop::Running {
                    break;
                }
            }
        }
    }
    drop(listener);
    if *stop.borrow() == Stop::Kill {
        conns.abort_all();
    } else {
        graceful.shutdown().await;
    }
    while conns.join_next().await.is_some() {}
}

pub fn json_response<T: Serialize>(status: StatusCode, value: &T) -> HttpResponse {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

pub fn error_response(e: &ApiError) -> HttpResponse {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = Response::new(Full::new(Bytes::from(e.to_json())));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn text_response(status: StatusCode, text: String) -> HttpResponse {
    let mut r = Response::new(Full::new(Bytes::from(text)));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
    r
}

async fn read_body(req: Request<Incoming>, max: usize) -> Result<Bytes, ApiError> {
    if let Some(len) = req.headers().get(hyper::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<usize>().ok()) {
        if len > max {
            return Err(ApiError::too_large(format!("body of {len} bytes > max_body_bytes {max}")));
        }
    }
    match Limited::new(req.into_body(), max).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            Err(ApiError::too_large(format!("body > max_body_bytes {max}")))
        }
        Err(e) => Err(ApiError::malformed(format!("reading body: {e}"))),
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
            return error_response(&ApiError::new(ErrorKind::MethodNotAllowed, "use POST"));
        }
        (_, path) => return error_response(&ApiError::new(ErrorKind::NotFound, format!("no route {path}"))),
    };
    let header_deadline =
        req.headers().get(headers::DEADLINE_MS).and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    let body = match read_body(req, engine.config().limits.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => return error_response(&e),
    };
    match route {
        Route::Score => {
            let mut r: ScoreRequest = match ApiError::parse_json(&body) {
                Ok(r) => r,
                Err(e) => return error_response(&e),
            };
            r.deadline_ms = r.deadline_ms.or(header_deadline);
            match engine.score(r, arrival).await {
                Ok(resp) => with_timing_headers(json_response(StatusCode::OK, &resp), &resp.timing),
                Err(e) => error_response(&e),
            }
        }
        Route::Rerank => {
            let r: RerankRequest = match ApiError::parse_json(&body) {
                Ok(r) => r,
                Err(e) => return error_response(&e),
            };
            let mut s = r.to_score_request();
            s.deadline_ms = s.deadline_ms.or(header_deadline);
            match engine.score(s, arrival).await {
                Ok(resp) => {
                    let timing = resp.timing;
                    with_timing_headers(json_response(StatusCode::OK, &RerankResponse::from_scores(&r, resp)), &timing)
                }
                Err(e) => error_response(&e),
            }
        }
    }
}

enum Route {
    Score,
    Rerank,
}

/// `GET /health`, `/ready`, `/metrics`, `/stats`, `/sim`; `PUT /sim` changes the settings.
pub async fn admin(engine: SharedEngine, req: Request<Incoming>) -> HttpResponse {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/health") => json_response(StatusCode::OK, &serde_json::json!({"status": "ok"})),
        (&Method::GET, "/ready") => {
            if engine.is_ready() {
                json_response(StatusCode::OK, &serde_json::json!({"ready": true}))
            } else {
                let why = if engine.is_draining() { "draining" } else { "not ready" };
                error_response(&ApiError::not_ready(why))
            }
        }
        (&Method::GET, "/metrics") => text_response(StatusCode::OK, engine.metrics_text()),
        (&Method::GET, "/stats") => json_response(StatusCode::OK, &engine.stats()),
        (&Method::GET, "/sim") => json_response(StatusCode::OK, &engine.settings()),
        (&Method::PUT, "/sim") => {
            let body = match read_body(req, 1 << 16).await {
                Ok(b) => b,
                Err(e) => return error_response(&e),
            };
            let update: SimSettingsUpdate = match ApiError::parse_json(&body) {
                Ok(u) => u,
                Err(e) => return error_response(&e),
            };
            match engine.update(&update) {
                Ok(s) => json_response(StatusCode::OK, &s),
                Err(m) => error_response(&ApiError::invalid(m)),
            }
        }
        (_, "/health" | "/ready" | "/metrics" | "/stats" | "/sim") => {
            error_response(&ApiError::new(ErrorKind::MethodNotAllowed, "method not allowed"))
        }
        (_, path) => error_response(&ApiError::new(ErrorKind::NotFound, format!("no route {path}"))),
    }
}
