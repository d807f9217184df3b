//! The HTTP/1.1 plumbing every Sieve server uses (worker, proxy, simulated worker): the accept
//! loop with graceful or abrupt stop, JSON/text/error responses, and bounded body reading. One
//! copy, so every port answers bad input and overload the same way.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use crate::{ApiError, ErrorKind};

pub type HttpResponse = Response<Full<Bytes>>;

/// How [`serve`] ends once its stop future resolves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    /// Stop accepting, let requests in progress finish (for at most the grace, when given),
    /// close idle keep-alive connections.
    Graceful(Option<Duration>),
    /// Drop every connection at once, as a crashed process would (the simulated worker's kill).
    Kill,
}

/// Binds a listener, reporting the address actually bound (for port 0).
pub async fn bind(host: &str, port: u16) -> std::io::Result<(TcpListener, SocketAddr)> {
    let l = TcpListener::bind((host, port)).await?;
    let addr = l.local_addr()?;
    Ok((l, addr))
}

/// Serves HTTP/1.1 connections with `handler` (one task per connection, keep-alive) until `stop`
/// resolves, then ends as it says.
pub async fn serve<F, Fut, S>(listener: TcpListener, handler: F, stop: S)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = HttpResponse> + Send + 'static,
    S: Future<Output = StopMode>,
{
    let graceful = GracefulShutdown::new();
    let mut conns = JoinSet::new();
    tokio::pin!(stop);
    let mode = loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((s, _)) => s,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!("accept: {e}");
                        tokio::time::sleep(Duration::from_millis(5)).await;
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
                    if let Err(e) = conn.await {
                        tracing::debug!("connection: {e}");
                    }
                });
            }
            // Reap finished connections so the set does not grow with every client.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            mode = &mut stop => break mode,
        }
    };
    drop(listener);
    match mode {
        StopMode::Kill => conns.abort_all(),
        StopMode::Graceful(grace) => {
            let shutdown = graceful.shutdown();
            match grace {
                Some(g) => {
                    if tokio::time::timeout(g, shutdown).await.is_err() {
                        tracing::warn!("connections still open after {g:?}; closing");
                        conns.abort_all();
                    }
                }
                None => shutdown.await,
            }
        }
    }
    while conns.join_next().await.is_some() {}
}

/// `value` as a JSON body.
pub fn json<T: Serialize>(status: StatusCode, value: &T) -> HttpResponse {
    match serde_json::to_vec(value) {
        Ok(body) => body_with_type(status, Bytes::from(body), "application/json"),
        Err(e) => error(&ApiError::internal(format!("encoding the response: {e}"))),
    }
}

pub fn text(status: StatusCode, body: String, content_type: &'static str) -> HttpResponse {
    body_with_type(status, Bytes::from(body), content_type)
}

pub fn body_with_type(status: StatusCode, body: Bytes, content_type: &'static str) -> HttpResponse {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// The error's JSON body with its status; overload and not-ready say when to come back.
pub fn error(e: &ApiError) -> HttpResponse {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = body_with_type(status, Bytes::from(e.to_json()), "application/json");
    if matches!(e.kind, ErrorKind::Overloaded | ErrorKind::NotReady) {
        r.headers_mut().insert(RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

/// Reads a request body of at most `max` bytes: 413 when the declared length or the bytes
/// actually sent go over, before or while reading.
pub async fn read_body(req: Request<Incoming>, max: usize) -> Result<Bytes, ApiError> {
    let declared = req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    if let Some(len) = declared {
        if len > max as u64 {
            return Err(ApiError::too_large(format!("request body of {len} bytes > max_body_bytes {max}")));
        }
    }
    match Limited::new(req.into_body(), max).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            Err(ApiError::too_large(format!("request body > max_body_bytes {max}")))
        }
        Err(e) => Err(ApiError::malformed(format!("reading the request body: {e}"))),
    }
}
