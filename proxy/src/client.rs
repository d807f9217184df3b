//! The HTTP client to workers: HTTP/1 keep-alive connections reused across shards, bodies read
//! whole with a size cap. Each call drives its own connection in the calling task
//! ([`conn`]: no connection task, no channel between the two) and hands it back to a pool of
//! idle connections ([`pool`]) once its response is complete. Dropping a call's future closes
//! its connection, which is how a hedge's loser (or a call past the deadline) is cancelled on
//! the worker.

mod conn;
mod pool;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use hyper::header::{HeaderName, HeaderValue, CONTENT_TYPE, HOST};
use hyper::{HeaderMap, Method, Request, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use sieve_shared::proxy_config::ClientConfig;

use self::conn::{CallError, Conn};
use self::pool::Pool;

#[derive(Clone)]
pub struct HttpClient {
    pool: Arc<Pool>,
    connector: HttpConnector,
    http1: hyper::client::conn::http1::Builder,
    max_response_bytes: usize,
    max_idle_per_worker: usize,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// No connection could be made: nothing was sent.
    #[error("connect: {0}")]
    Connect(String),
    /// The connection failed after the request was (maybe) sent: the worker died mid-call.
    #[error("connection lost: {0}")]
    Broken(String),
    #[error("response larger than {0} bytes")]
    TooLarge(usize),
    #[error("bad request: {0}")]
    Request(String),
}

#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl HttpClient {
    pub fn new(cfg: &ClientConfig) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_millis(cfg.connect_timeout_ms)));
        HttpClient {
            pool: Pool::new(Duration::from_millis(cfg.pool_idle_timeout_ms), cfg.max_idle_per_worker),
            connector,
            http1: hyper::client::conn::http1::Builder::new(),
            max_response_bytes: cfg.max_response_bytes,
            max_idle_per_worker: cfg.max_idle_per_worker,
        }
    }

    /// `headers` are typed names (`HeaderName::from_static` in a `const`): a name given as a
    /// string would be copied into a new allocation on every call.
    pub async fn post_json(
        &self,
        uri: &Uri,
        body: impl Into<Chunks>,
        headers: &[(HeaderName, HeaderValue)],
    ) -> Result<Reply, ClientError> {
        let mut req = Request::builder().method(Method::POST).uri(origin_form(uri));
        for (name, value) in headers {
            req = req.header(name, value.clone());
        }
        let req = req
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .body(body.into())
            .map_err(|e| ClientError::Request(e.to_string()))?;
        self.send(uri, req).await
    }

    pub async fn get(&self, uri: &Uri) -> Result<Reply, ClientError> {
        let req = Request::builder()
            .method(Method::GET)
            .uri(origin_form(uri))
            .body(Chunks::default())
            .map_err(|e| ClientError::Request(e.to_string()))?;
        self.send(uri, req).await
    }

    /// Sends `req` (its URI the path of `uri`) on an idle connection to `uri`'s worker or a new
    /// one. A request that an idle connection closed on before writing it goes on a new
    /// connection (as hyper's pooled client does); a connection that cannot be made is
    /// [`ClientError::Connect`].
    async fn send(&self, uri: &Uri, mut req: Request<Chunks>) -> Result<Reply, ClientError> {
        let key = uri.authority().ok_or_else(|| ClientError::Request(format!("no host in {uri}")))?;
        let mut reused = self.pool.take(key);
        loop {
            let fresh = reused.is_none();
            let mut conn = match reused.take() {
                Some(conn) => conn,
                None => Conn::open(&self.connector, &self.http1, uri).await?,
            };
            req.headers_mut().insert(HOST, conn.host.clone());
            match conn.call(req, self.max_response_bytes).await {
                Ok((resp, keep_alive)) => {
                    if keep_alive && self.max_idle_per_worker > 0 {
                        self.pool.put(key, conn);
                    }
                    let (parts, body) = resp.into_parts();
                    return Ok(Reply { status: parts.status, headers: parts.headers, body });
                }
                Err(CallError::NotSent(back, _)) if !fresh => req = *back,
                Err(CallError::NotSent(_, msg)) => return Err(ClientError::Broken(msg)),
                Err(CallError::Failed(e)) => return Err(e),
            }
        }
    }
}

/// The request line's target: the path and query alone (the worker is named by `host`).
fn origin_form(uri: &Uri) -> Uri {
    match uri.path_and_query() {
        Some(pq) => Uri::from(pq.clone()),
        None => Uri::from_static("/"),
    }
}

/// A request body sent as the chunks it is made of, with its exact length (so a
/// `content-length`): hyper queues them for one vectored write, so a shard's items can go out as
/// a slice of the caller's body without being copied into a buffer of their own.
#[derive(Debug, Default)]
pub struct Chunks {
    chunks: VecDeque<Bytes>,
    remaining: u64,
}

impl From<Vec<Bytes>> for Chunks {
    fn from(mut chunks: Vec<Bytes>) -> Self {
        let remaining = chunks.iter().map(|c| c.len() as u64).sum();
        chunks.retain(|c| !c.is_empty());
        // In place: the vector's buffer becomes the queue's (no second allocation per call).
        Chunks { chunks: VecDeque::from(chunks), remaining }
    }
}

impl From<Bytes> for Chunks {
    fn from(body: Bytes) -> Self {
        Chunks::from(vec![body])
    }
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        Poll::Ready(this.chunks.pop_front().map(|c| {
            this.remaining -= c.len() as u64;
            Ok(Frame::data(c))
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}
