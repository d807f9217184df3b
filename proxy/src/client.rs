//! The HTTP client to workers: hyper's pooled client, keep-alive connections reused across
//! shards, bodies read whole with a size cap. Dropping a call's future closes its connection,
//! which is how a hedge's loser (or a call past the deadline) is cancelled on the worker.
//!
//! A thread that runs a runtime of its own (the API's per-thread runtimes, `api_threads.rs`)
//! calls [`use_own_pool_on_this_thread`]: its calls then go through a pool of that thread's
//! own, so a worker connection is only ever driven by the thread whose requests use it (no
//! wake-up crosses threads).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body, Frame, SizeHint};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{HeaderMap, Method, Request, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use sieve_shared::proxy_config::ClientConfig;

type Pool = Client<HttpConnector, Chunks>;

#[derive(Clone)]
pub struct HttpClient {
    client: Pool,
    max_response_bytes: usize,
    /// What a thread's own pool is built from.
    cfg: ClientConfig,
    /// Tells this client's per-thread pools from another's (tests run several proxies in one
    /// process).
    id: u64,
}

thread_local! {
    /// Whether this thread's calls use pools of its own ([`use_own_pool_on_this_thread`]).
    static OWN_POOL: Cell<bool> = const { Cell::new(false) };
    /// This thread's own pools, one per client (by id) that has called from it.
    static POOLS: RefCell<Vec<(u64, Pool)>> = const { RefCell::new(Vec::new()) };
}

/// From now on, calls made on this thread (by any [`HttpClient`]) go through connection pools of
/// this thread's own, whose connections are driven by this thread's runtime. For a thread that
/// runs a current-thread runtime for as long as it lives.
pub fn use_own_pool_on_this_thread() {
    OWN_POOL.with(|o| o.set(true));
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
        static IDS: AtomicU64 = AtomicU64::new(0);
        HttpClient {
            client: pool(cfg),
            max_response_bytes: cfg.max_response_bytes,
            cfg: cfg.clone(),
            id: IDS.fetch_add(1, Ordering::Relaxed),
        }
    }

    pub async fn post_json(
        &self,
        uri: &Uri,
        body: impl Into<Chunks>,
        headers: &[(&'static str, HeaderValue)],
    ) -> Result<Reply, ClientError> {
        let mut req = Request::builder().method(Method::POST).uri(uri.clone());
        for (name, value) in headers {
            req = req.header(*name, value.clone());
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

    async fn send(&self, req: Request<Chunks>) -> Result<Reply, ClientError> {
        let sending = if OWN_POOL.with(Cell::get) {
            POOLS.with(|pools| {
                let mut pools = pools.borrow_mut();
                let k = match pools.iter().position(|(id, _)| *id == self.id) {
                    Some(k) => k,
                    None => {
                        pools.push((self.id, pool(&self.cfg)));
                        pools.len() - 1
                    }
                };
                pools[k].1.request(req)
            })
        } else {
            self.client.request(req)
        };
        let resp = sending.await.map_err(|e| {
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
                ClientError::Broken(e.to_string())
            }
        })?;
        Ok(Reply { status: parts.status, headers: parts.headers, body: body.to_bytes() })
    }
}

/// hyper's pooled keep-alive client as the config says; its connection tasks run on the runtime
/// of the call that opened them.
fn pool(cfg: &ClientConfig) -> Pool {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_millis(cfg.connect_timeout_ms)));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_millis(cfg.pool_idle_timeout_ms))
        .pool_timer(TokioTimer::new())
        .build(connector)
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
    fn from(chunks: Vec<Bytes>) -> Self {
        let remaining = chunks.iter().map(|c| c.len() as u64).sum();
        Chunks { chunks: chunks.into_iter().filter(|c| !c.is_empty()).collect(), remaining }
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
