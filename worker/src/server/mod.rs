//! HTTP: the scoring API port and the admin port, on hyper.

pub mod admin;
pub mod api;
#[cfg(test)]
mod tests;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use metrics_exporter_prometheus::PrometheusHandle;
use sieve_shared::{ApiError, Limits};
use tokio::net::TcpListener;

use crate::engine::{EngineHandle, EngineState};

/// What both ports' handlers read.
pub struct AppState {
    /// Set once the model is loaded.
    pub engine: OnceLock<Arc<EngineHandle>>,
    pub state: Arc<EngineState>,
    pub limits: Limits,
    pub model_name: OnceLock<String>,
    pub device: String,
    pub prometheus: Option<PrometheusHandle>,
}

impl AppState {
    pub fn new(limits: Limits, device: String, prometheus: Option<PrometheusHandle>) -> Self {
        AppState {
            engine: OnceLock::new(),
            state: Arc::new(EngineState::default()),
            limits,
            model_name: OnceLock::new(),
            device,
            prometheus,
        }
    }
}

pub type HttpResponse = Response<Full<Bytes>>;

pub fn json_response(status: StatusCode, body: String) -> HttpResponse {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    r
}

pub fn error_response(e: &ApiError) -> HttpResponse {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(status, e.to_json())
}

/// Reads a request body, refusing more than `max` bytes (413) before or while reading.
pub async fn read_body(req: Request<Incoming>, max: usize) -> Result<Bytes, ApiError> {
    let too_large = || ApiError::too_large(format!("request body over max_body_bytes {max}"));
    if let Some(len) = req.headers().get(hyper::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok()) {
        if len > max as u64 {
            return Err(too_large());
        }
    }
    match Limited::new(req.into_body(), max).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => Err(too_large()),
        Err(e) => Err(ApiError::malformed(format!("reading the request body: {e}"))),
    }
}

/// Binds a listener, reporting the address actually bound (for port 0).
pub async fn bind(host: &str, port: u16) -> std::io::Result<(TcpListener, SocketAddr)> {
    let l = TcpListener::bind((host, port)).await?;
    let addr = l.local_addr()?;
    Ok((l, addr))
}

/// Serves HTTP/1.1 connections with `handler` until the process ends.
pub async fn serve<F, Fut>(listener: TcpListener, handler: F)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = HttpResponse> + Send + 'static,
{
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let h = handler.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let h = h.clone();
                async move { Ok::<_, Infallible>(h(req).await) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new().keep_alive(true).serve_connection(TokioIo::new(stream), svc).await {
                tracing::debug!("connection ended: {e}");
            }
        });
    }
}
