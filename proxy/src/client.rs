//! The HTTP client to workers: hyper-util's pooled client (HTTP/1 keep-alive connections per
//! worker, `TCP_NODELAY`, the `[client]` connect timeout, idle timeout and idle cap), bodies read
//! whole with a size cap. Dropping a call's future closes its connection unless the response had
//! already arrived whole: hyper closes an HTTP/1 connection whose response or body is no longer
//! wanted, which is how a hedge's loser (or a call past the deadline) is cancelled on the worker.

#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body, Frame, SizeHint};
use hyper::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use hyper::{HeaderMap, Method, Request, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use sieve_shared::proxy_config::ClientConfig;

#[derive(Clone)]
pub struct HttpClient {
    client: Client<HttpConnector, Chunks>,
    max_response_bytes: usize,
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
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_millis(cfg.pool_idle_timeout_ms))
            .pool_max_idle_per_host(cfg.max_idle_per_worker)
            .pool_timer(TokioTimer::new())
            .build(connector);
        HttpClient { client, max_response_bytes: cfg.max_response_bytes }
    }

    /// `headers` are typed names (`HeaderName::from_static` in a `const`): a name given as a
    /// string would be copied into a new allocation on every call.
    pub async fn post_json(
        &self,
        uri: &Uri,
        body: impl Into<Chunks>,
        headers: &[(HeaderName, HeaderValue)],
    ) -> Result<Reply, ClientError> {
        let mut req = Request::builder().method(Method::POST).uri(uri.clone());
        for (name, value) in headers {
            req = req.header(name, value.clone());
        }
        let req = req
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .body(body.into())
            .map_err(|e| ClientError::Request(e.to_string()))?;
        self.send(req).await
    }

    pub async fn get(&self, uri: &Uri) -> Result<Reply, ClientError> {
        let req = Request::builder()
            .method(Method::GET)
            .uri(uri.clone())
            .body(Chunks::default())
            .map_err(|e| ClientError::Request(e.to_string()))?;
        self.send(req).await
    }

    /// Sends `req` (an absolute URI) on an idle connection to its worker or a new one (hyper
    /// moves a request that an idle connection closed on before writing it to a new connection)
    /// and reads the whole answer.
    async fn send(&self, req: Request<Chunks>) -> Result<Reply, ClientError> {
        let resp = self.client.request(req).await.map_err(|e| {
            if e.is_connect() {
                ClientError::Connect(error_chain(&e))
            } else {
                ClientError::Broken(error_chain(&e))
            }
        })?;
        let (parts, body) = resp.into_parts();
        let body = Limited::new(body, self.max_response_bytes).collect().await.map_err(|e| {
            if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
                ClientError::TooLarge(self.max_response_bytes)
            } else {
                ClientError::Broken(error_chain(&*e))
            }
        })?;
        Ok(Reply { status: parts.status, headers: parts.headers, body: body.to_bytes() })
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
