//! One HTTP/1 connection to a worker, driven by the task that calls on it. hyper's low-level
//! client connection (`hyper::client::conn::http1`) is a request sender and a `Connection`
//! future that does the socket's reading and writing; instead of running that future as a task
//! of its own (what hyper's pooled client does, one more task and wake-up per call), a call
//! polls it together with its own response and body. The connection is then owned by the call:
//! dropping the call's future closes the socket, which is how the worker learns that a call was
//! given up (a hedge's loser, a call past its deadline).

use std::future::Future;
use std::pin::{pin, Pin};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::client::conn::http1::{Builder, Connection, SendRequest};
use hyper::header::HeaderValue;
use hyper::{Request, Response, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower_service::Service;

use super::{error_chain, Chunks, ClientError};

pub struct Conn {
    tx: SendRequest<Chunks>,
    conn: Connection<TokioIo<TcpStream>, Chunks>,
    /// Set once the connection future has ended (the socket is closed): it is not polled again.
    ended: bool,
    /// The `host` header of its requests (the worker's authority, as hyper's client writes it).
    pub host: HeaderValue,
    /// When it last finished a call (for the pool's idle timeout).
    pub idle_since: Instant,
}

/// How a call on a connection failed.
pub enum CallError {
    /// The connection closed before the request was written: it can go on another connection
    /// (the worker saw nothing).
    NotSent(Box<Request<Chunks>>, String),
    Failed(ClientError),
}

impl Conn {
    /// Connects to `uri`'s authority (the connector's timeout and `TCP_NODELAY`) and sets the
    /// connection up. Every failure here is [`ClientError::Connect`]: nothing was sent.
    pub async fn open(connector: &HttpConnector, builder: &Builder, uri: &Uri) -> Result<Conn, ClientError> {
        let io = connector.clone().call(uri.clone()).await.map_err(|e| ClientError::Connect(error_chain(&e)))?;
        let (tx, conn) = builder.handshake(io).await.map_err(|e| ClientError::Connect(error_chain(&e)))?;
        Ok(Conn { tx, conn, ended: false, host: host_header(uri)?, idle_since: Instant::now() })
    }

    /// Whether an idle connection can take a request: the worker has not closed it (a pending
    /// end of stream is read now, without waiting) and it is ready for another request.
    pub fn is_usable(&mut self) -> bool {
        if self.ended {
            return false;
        }
        let mut cx = Context::from_waker(Waker::noop());
        if Pin::new(&mut self.conn).poll(&mut cx).is_ready() {
            self.ended = true;
            return false;
        }
        self.tx.is_ready()
    }

    /// Sends `req` and reads the whole response (at most `max_body` bytes), driving the
    /// connection meanwhile. `Ok` carries whether the connection may take another request: the
    /// response was complete and the connection is still open and ready (keep-alive).
    pub async fn call(&mut self, req: Request<Chunks>, max_body: usize) -> Result<(Response<Bytes>, bool), CallError> {
        let sending = self.tx.try_send_request(req);
        let resp = match self.drive(sending).await {
            Some(Ok(resp)) => resp,
            Some(Err(mut e)) => {
                let msg = error_chain(e.error());
                return Err(match e.take_message() {
                    Some(req) => CallError::NotSent(Box::new(req), msg),
                    None => CallError::Failed(ClientError::Broken(msg)),
                });
            }
            None => return Err(CallError::Failed(ClientError::Broken("connection closed".into()))),
        };
        let (parts, body) = resp.into_parts();
        let body = match self.drive(Limited::new(body, max_body).collect()).await {
            Some(Ok(body)) => body.to_bytes(),
            Some(Err(e)) => {
                return Err(CallError::Failed(if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
                    ClientError::TooLarge(max_body)
                } else {
                    ClientError::Broken(e.to_string())
                }))
            }
            None => return Err(CallError::Failed(ClientError::Broken("connection closed mid-body".into()))),
        };
        // The body's end was read by the connection future, which by then has taken the
        // connection back to idle and asked for the next request, unless the worker said
        // `connection: close` (or the connection failed): one poll tells. It is made without
        // this task's waker, so that nothing the idle connection sees wakes this task.
        let reusable = self.is_usable();
        self.idle_since = Instant::now();
        Ok((Response::from_parts(parts, body), reusable))
    }

    /// Polls `fut` and the connection together until `fut` is done; `None` when the connection
    /// ended and `fut` could not finish without it.
    async fn drive<F: Future>(&mut self, fut: F) -> Option<F::Output> {
        let mut fut = pin!(fut);
        std::future::poll_fn(|cx| {
            if !self.ended && Pin::new(&mut self.conn).poll(cx).is_ready() {
                // Closed or failed: hyper has handed its error to the waiting response or
                // body, which is polled once more to read it.
                self.ended = true;
            }
            match fut.as_mut().poll(cx) {
                Poll::Ready(out) => Poll::Ready(Some(out)),
                Poll::Pending if self.ended => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            }
        })
        .await
    }
}

/// The `host` header hyper's pooled client writes: the host, and the port unless it is the
/// scheme's default.
fn host_header(uri: &Uri) -> Result<HeaderValue, ClientError> {
    let host = uri.host().ok_or_else(|| ClientError::Request(format!("no host in {uri}")))?;
    let default_port = match uri.scheme_str() {
        Some("https") => 443,
        _ => 80,
    };
    let value = match uri.port_u16() {
        Some(port) if port != default_port => HeaderValue::from_str(&format!("{host}:{port}")),
        _ => HeaderValue::from_str(host),
    };
    value.map_err(|e| ClientError::Request(format!("host of {uri}: {e}")))
}
