//! The gRPC port: tonic's own server over a stream of connections that enforces the `[http]`
//! limits (`conn.rs`), serving the generated `Sieve` service (`Score` and `Rerank` decoded in `api.rs`).
//!
//! - Connection cap: a slot per connection, taken at the accept. A connection that finds none
//!   closes those with no call for [`EVICT_IDLE`] and waits up to [`SLOT_WAIT`] for a slot
//!   (at most `max_connections` wait at once); without one it is closed unserved (a gRPC client
//!   sees UNAVAILABLE and may retry).
//! - Timers: the socket of each connection (`conn.rs`); a call's message must arrive within
//!   `body_read_timeout_ms` (the request body, [`Timed`]).
//! - Message size: tonic's codec limit, `[limits] max_body_bytes`; the message's bytes count
//!   against the process's `[http] max_buffered_bytes` ([`ScoreService::buffer_budget`], shared
//!   with the HTTP port) frame by frame as they arrive, until the call is answered.
//! - Deadline: the call's `grpc-timeout` less `[grpc] deadline_margin_ms` is its `deadline_ms`
//!   (`api.rs`), so a partial answer comes before tonic's own timeout of the call.
//! - Stop: tonic's graceful shutdown (GOAWAY, calls in progress finish), cut off at the grace
//!   (or at once for a kill) by closing every connection's socket.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::{BoxFuture, Either};
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use sieve_shared::metrics_names::grpc as names;
use sieve_shared::sync::lock;
use sieve_shared::{ApiError, ErrorKind};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Sleep;
use tonic::body::Body;
use tonic::codegen::Service;
use tonic::Status;

use super::api::{RawRerank, RawScore};
use super::conn::{Call, Conn, ConnInfo, ConnWatch, Timers};
use super::pb::sieve_server::SieveServer;
use super::wire::{RawRerankCodec, RawScoreCodec};
use super::{status, GrpcApi, GrpcConfig};
use crate::http::{accepted_or_back_off, ByteBudget, HttpConfig, SharedReservation, StopMode, EVICT_IDLE, SLOT_WAIT};
use crate::service::ScoreService;

/// Serves the gRPC API of `svc` on `listener` until `stop` resolves, then ends as it says; with
/// `StopMode::Graceful(Some(grace))` within `grace` whatever the clients do. The largest
/// message is `svc`'s `max_body_bytes` at start (a reloaded limit applies after a restart).
pub async fn serve<S, F>(listener: TcpListener, svc: Arc<S>, grpc: GrpcConfig, http: HttpConfig, stop: F)
where
    S: ScoreService + 'static,
    F: Future<Output = StopMode>,
{
    let max_message = svc.limits().max_body_bytes;
    let budget = svc.buffer_budget().clone();
    let api = Arc::new(GrpcApi::new(svc, grpc.deadline_margin()));
    let router =
        SieveServer::from_arc(api.clone()).max_decoding_message_size(max_message).max_encoding_message_size(usize::MAX);
    let calls = Calls { api, router, budget, body_timeout: http.body_read_timeout(), max_message };
    let open: Open = Arc::new(Mutex::new(Vec::new()));
    let (conns, mut incoming) = mpsc::channel(64);
    let accept = tokio::spawn(accept(listener, http.clone(), open.clone(), conns));
    let incoming = futures_util::stream::poll_fn(move |cx| incoming.poll_recv(cx).map(|c| c.map(Ok::<_, Infallible>)));
    let (mode_tx, mut mode) = watch::channel(None);
    let signal = async move {
        mode_tx.send_replace(Some(stop.await));
    };
    let server = tonic::transport::Server::builder()
        .max_concurrent_streams(grpc.max_concurrent_streams)
        .http2_keepalive_interval(Some(grpc.keepalive_interval()))
        .http2_keepalive_timeout(Some(grpc.keepalive_timeout()))
        .http2_max_header_list_size(u32::try_from(http.max_header_bytes).unwrap_or(u32::MAX))
        .serve_with_incoming_shutdown(calls, incoming, signal);
    // A kill, or a graceful stop past its grace: every connection's socket closed.
    let cut_off = async {
        let mode = mode.wait_for(Option::is_some).await.ok().and_then(|m| *m);
        accept.abort();
        match mode {
            Some(StopMode::Graceful(None)) => std::future::pending().await,
            Some(StopMode::Graceful(Some(grace))) => {
                tokio::time::sleep(grace).await;
                tracing::warn!("gRPC connections still open after {grace:?}; closing");
            }
            Some(StopMode::Kill) | None => {}
        }
        for conn in lock(&open).iter().filter_map(Weak::upgrade) {
            conn.close();
        }
    };
    tokio::pin!(server);
    let ended = tokio::select! {
        ended = &mut server => ended,
        () = cut_off => server.await,
    };
    if let Err(e) = ended {
        tracing::warn!("gRPC server: {e}");
    }
}

/// Every connection the port accepted that may still be open.
type Open = Arc<Mutex<Vec<Weak<ConnWatch>>>>;

/// Accepts connections under the cap and hands them to tonic's server through `conns`, until
/// the server stops taking them.
async fn accept(listener: TcpListener, http: HttpConfig, open: Open, conns: mpsc::Sender<Conn>) {
    let timers = Timers { header: http.header_read_timeout(), idle: http.idle_timeout(), send: http.send_timeout() };
    let slots = Arc::new(Semaphore::new(http.max_connections));
    // Connections at the cap waiting for a slot, at most as many as served ones.
    let waiting = Arc::new(Semaphore::new(http.max_connections));
    let mut waits = JoinSet::new();
    let mut recheck = tokio::time::interval(EVICT_IDLE / 2);
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let wait = SLOT_WAIT.min(http.header_read_timeout());
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Some(stream) = accepted_or_back_off(accepted, "gRPC accept").await else { continue };
                let _ = stream.set_nodelay(true);
                let slot = slots.clone().try_acquire_owned();
                let queued = slot.is_err().then(|| waiting.clone().try_acquire_owned());
                if let Some(Err(_)) = queued {
                    continue;
                }
                let watch = ConnWatch::new(timers, queued.is_some());
                {
                    let mut open = lock(&open);
                    open.retain(|c| c.strong_count() > 0);
                    open.push(Arc::downgrade(&watch));
                }
                match slot {
                    Ok(slot) => {
                        if conns.send(Conn::new(stream, watch, slot)).await.is_err() {
                            break;
                        }
                    }
                    Err(_) => {
                        evict_idle(&open);
                        let (slots, conns) = (slots.clone(), conns.clone());
                        waits.spawn(async move {
                            let Ok(Ok(slot)) = tokio::time::timeout(wait, slots.acquire_owned()).await else { return };
                            drop(queued);
                            watch.served();
                            let _ = conns.send(Conn::new(stream, watch, slot)).await;
                        });
                    }
                }
            }
            _ = recheck.tick(), if waiting.available_permits() < http.max_connections => evict_idle(&open),
            Some(_) = waits.join_next(), if !waits.is_empty() => {}
            () = conns.closed() => break,
        }
    }
}

/// Closes the connections with no call for [`EVICT_IDLE`] or more, for connections waiting at
/// the cap; each counted as `timer="evicted"`.
fn evict_idle(open: &Open) {
    let now = std::time::Instant::now();
    lock(open).retain(|c| {
        let Some(c) = c.upgrade() else { return false };
        let idle = c.idle_for(now).is_some_and(|d| d >= EVICT_IDLE);
        if idle {
            c.close();
            metrics::counter!(names::TIMEOUTS, "timer" => "evicted").increment(1);
        }
        !idle
    });
}

/// `Score`'s gRPC path.
const SCORE_PATH: &str = "/sieve.v1.Sieve/Score";
const RERANK_PATH: &str = "/sieve.v1.Sieve/Rerank";

/// Every call of the port: `Score` and `Rerank` decoded by `api.rs` (a bad message
/// INVALID_ARGUMENT), unknown methods (UNIMPLEMENTED) by the generated router; each counted on its connection until its answer
/// is sent.
struct Calls<S> {
    api: Arc<GrpcApi<S>>,
    router: SieveServer<GrpcApi<S>>,
    budget: ByteBudget,
    body_timeout: Duration,
    max_message: usize,
}

impl<S> Clone for Calls<S> {
    fn clone(&self) -> Self {
        Calls {
            api: self.api.clone(),
            router: self.router.clone(),
            budget: self.budget.clone(),
            body_timeout: self.body_timeout,
            max_message: self.max_message,
        }
    }
}

impl<S: ScoreService + 'static> Service<hyper::Request<Body>> for Calls<S> {
    type Response = hyper::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<hyper::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: hyper::Request<Body>) -> Self::Future {
        let call = req.extensions().get::<ConnInfo>().map(|c| c.0.begin());
        // The message's bytes, held by the body as they come and by the call until it is
        // answered (tonic drops the body once the message is decoded).
        let held = SharedReservation::new(&self.budget);
        let req = req.map(|b| Body::new(Timed::new(b, self.body_timeout, held.clone())));
        let path = req.uri().path();
        let answer = if path == SCORE_PATH || path == RERANK_PATH {
            let (api, max, score) = (self.api.clone(), self.max_message, path == SCORE_PATH);
            Either::Left(async move {
                Ok(if score {
                    let mut grpc = tonic::server::Grpc::new(RawScoreCodec::default())
                        .apply_max_message_size_config(Some(max), Some(usize::MAX));
                    grpc.unary(RawScore(api), req).await
                } else {
                    let mut grpc = tonic::server::Grpc::new(RawRerankCodec::default())
                        .apply_max_message_size_config(Some(max), Some(usize::MAX));
                    grpc.unary(RawRerank(api), req).await
                })
            })
        } else {
            Either::Right(self.router.call(req))
        };
        Box::pin(async move {
            let answer = answer.await?;
            drop(held);
            let Some(mut call) = call else { return Ok(answer) };
            if answer.body().is_end_stream() {
                call.end();
                return Ok(answer);
            }
            call.answered();
            Ok(answer.map(|body| Body::new(Sending { body, call })))
        })
    }
}

/// An answer on its way: its call ends with its last frame.
struct Sending {
    body: Body,
    call: Call,
}

impl HttpBody for Sending {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let frame = std::task::ready!(Pin::new(&mut self.body).poll_frame(cx));
        if !matches!(&frame, Some(Ok(f)) if f.is_data()) {
            self.call.end();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A request body that must arrive whole within the `[http]` body read timeout (a call's message
/// trickled in, or never ended, would hold its stream forever): then it fails, and the call
/// ends with DEADLINE_EXCEEDED, as an HTTP body ends with 408. Each data frame is counted in
/// `held` before it is passed on; one the budget cannot cover fails the call at once with
/// RESOURCE_EXHAUSTED (retry info included), as an HTTP body is answered 503. Every method is
/// unary: a byte past the first message fails the call with INVALID_ARGUMENT (tonic would read
/// and drop a second message, answering OK as if it had never come).
struct Timed {
    inner: Body,
    deadline: Pin<Box<Sleep>>,
    timeout: Duration,
    held: SharedReservation,
    framing: OneMessage,
}

impl Timed {
    fn new(inner: Body, timeout: Duration, held: SharedReservation) -> Self {
        let deadline = Box::pin(tokio::time::sleep(timeout));
        Timed { inner, deadline, timeout, held, framing: OneMessage::default() }
    }
}

/// Where a call's one message ends, from its gRPC length prefix (a flag byte and 4 bytes of
/// big-endian length), however the body's frames cut it.
#[derive(Default)]
struct OneMessage {
    seen: u64,
    prefix: [u8; 5],
    end: Option<u64>,
}

impl OneMessage {
    /// Takes the body's next bytes; false once they go past the first message.
    fn take(&mut self, data: &[u8]) -> bool {
        for (k, &b) in data.iter().take(5usize.saturating_sub(self.seen as usize)).enumerate() {
            self.prefix[self.seen as usize + k] = b;
        }
        self.seen += data.len() as u64;
        if self.end.is_none() && self.seen >= 5 {
            let len = u32::from_be_bytes([self.prefix[1], self.prefix[2], self.prefix[3], self.prefix[4]]);
            self.end = Some(5 + u64::from(len));
        }
        self.end.is_none_or(|end| self.seen <= end)
    }
}

impl HttpBody for Timed {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            if let Some(Ok(f)) = &frame {
                if !this.framing.take(f.data_ref().map_or(&[], |d| &d[..])) {
                    let e = ApiError::malformed("a unary call carries one message; a second one came");
                    return Poll::Ready(Some(Err(status::to_status(&e))));
                }
                let n = f.data_ref().map_or(0, Bytes::len);
                if !this.held.grow_by(n) {
                    let total = this.held.bytes().saturating_add(n);
                    let e = this.held.budget().refusal(ErrorKind::Overloaded, n, total);
                    return Poll::Ready(Some(Err(status::to_status(&e))));
                }
            }
            return Poll::Ready(frame);
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            let e = ApiError::new(
                ErrorKind::RequestTimeout,
                format!(
                    "the request message did not arrive within {} ms (body_read_timeout_ms)",
                    this.timeout.as_millis()
                ),
            );
            return Poll::Ready(Some(Err(status::to_status(&e))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::OneMessage;

    #[test]
    fn a_byte_past_the_first_message_is_refused_however_the_frames_cut_it() {
        // A message of 3 bytes: its 5-byte prefix cut across frames, then its body.
        let mut m = OneMessage::default();
        assert!(m.take(&[0, 0]) && m.take(&[0, 0, 3]) && m.take(&[7, 7]) && m.take(&[7]));
        assert!(m.take(&[]), "an empty frame is nothing");
        assert!(!m.take(&[0]), "a second message's first byte");
        // Two messages in one frame.
        let mut m = OneMessage::default();
        assert!(!m.take(&[0, 0, 0, 0, 1, 9, 0, 0, 0, 0, 0]));
        // One empty message, whole.
        assert!(OneMessage::default().take(&[0, 0, 0, 0, 0]));
    }
}
