//! The gRPC port's accept loop: hyper's HTTP/2 per connection under the `[http]` connection cap
//! and head size, the `[grpc]` stream cap and keep-alive, a read deadline on every request
//! message, and a stop that is graceful within a bound (or abrupt) — the HTTP ports' behaviour
//! (`http/serve.rs`) for HTTP/2.
//!
//! Why not tonic's `transport::Server`: it has no connection cap, a client's `grpc-timeout`
//! would end a call with CANCELLED at the very moment our deadline returns its partial answer,
//! and an abrupt stop leaves its connection tasks running. The generated `SieveServer` is a
//! plain tower service, so it runs on hyper directly. `Score` alone goes around it, to tonic's
//! unary call handling over our codec (`wire.rs`: the message read in place). Each connection's
//! calls run on the connection's own task, up to `[grpc] inline_streams`, and a wake-up during
//! that task's poll is another round of it, not a yield (`inline.rs`); its socket is read in
//! large chunks and written once per poll of that task (`io.rs`). A call's message counts
//! against the process's `[http] max_buffered_bytes` budget (the service's
//! [`ScoreService::buffer_budget`], shared with the HTTP port) frame by frame as it arrives and
//! until the call is answered; a frame that does not fit fails the call with RESOURCE_EXHAUSTED.
//! Every connection runs under the `[http]` header, idle and send timeouts (`watchdog.rs`), as
//! an HTTP/1 connection does, and the port's graceful stop goes through the same watchdog (it
//! owns the connection, so hyper-util's `GracefulShutdown`, which needs the connection itself,
//! is not used here).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::Either;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::server::conn::http2;
use hyper::service::service_fn;
use hyper::Request;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Sleep;
use tonic::codegen::Service;
use tonic::Status;

use super::api::{RawRerank, RawScore};
use super::inline::StreamExec;
use super::io::ConnIo;
use super::pb::sieve_server::SieveServer;
use super::watchdog::{self, ConnWatch, Timers, Watchdog};
use super::wire::{RawRerankCodec, RawScoreCodec};
use super::{status, GrpcApi, GrpcConfig};
use crate::http::{
    accepted_or_back_off, evict_idle, forget, stop_connections, HttpConfig, Open, SharedReservation, StopMode,
    SLOT_WAIT,
};
use crate::metrics_names::grpc as names;
use crate::service::ScoreService;
use crate::{ApiError, ErrorKind};

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
    let server =
        SieveServer::from_arc(api.clone()).max_decoding_message_size(max_message).max_encoding_message_size(usize::MAX);
    let inline_streams = usize::try_from(grpc.inline_streams).unwrap_or(usize::MAX);
    let poll_rounds = usize::try_from(grpc.poll_rounds).unwrap_or(usize::MAX);
    let body_timeout = http.body_read_timeout();
    let timers = Timers { header: http.header_read_timeout(), idle: http.idle_timeout(), send: http.send_timeout() };
    // The graceful stop, told to every connection's watchdog.
    let (stopping, stop_rx) = watch::channel(false);
    let slots = Arc::new(Semaphore::new(http.max_connections));
    // Connections at the cap waiting for a slot, at most as many as served ones.
    let waiting = Arc::new(Semaphore::new(http.max_connections));
    let mut conns = JoinSet::new();
    // Every connection's task and its calls: the idle ones are closed for one at the cap, as on
    // the HTTP ports (`http/serve.rs`).
    let mut open: Open<ConnWatch> = Open::new();
    let mut recheck = tokio::time::interval(Duration::from_millis(125));
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let wait = SLOT_WAIT.min(http.header_read_timeout());
    tokio::pin!(stop);
    let mode = loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Some(stream) = accepted_or_back_off(accepted, "gRPC accept").await else { continue };
                // At the cap the connection closes the idle ones and waits a while for a slot;
                // without one it is closed unserved (a gRPC client sees UNAVAILABLE and may
                // retry).
                let slot = slots.clone().try_acquire_owned().map_err(|_| waiting.clone().try_acquire_owned());
                if let Err(Err(_)) = slot {
                    continue;
                }
                if slot.is_err() {
                    evict_idle(&mut open, names::TIMEOUTS);
                }
                let watch = ConnWatch::new(timers);
                if slot.is_err() {
                    watch.waiting();
                }
                let _ = stream.set_nodelay(true);
                // Reads in chunks of `read_buffer_bytes`, and each poll's writes in one
                // (`io.rs`).
                let (io, out) = ConnIo::new(stream, grpc.read_buffer_bytes, grpc.write_buffer_bytes, http.send_timeout());
                let io = TokioIo::new(io);
                // How much of the preface has arrived, for the header timer (`watchdog.rs`).
                let progress = out.clone();
                let out = (grpc.write_buffer_bytes > 0).then_some(out);
                let (server, api, budget) = (server.clone(), api.clone(), budget.clone());
                let handler = service_fn(move |req: Request<Incoming>| {
                    // The message's bytes, held by the body as they come and by the call until
                    // it is answered (tonic drops the body once the message is decoded).
                    let held = SharedReservation::new(&budget);
                    let req = req.map(|b| Timed::new(b, body_timeout, held.clone()));
                    // `Score` read in place (`wire.rs`), `Rerank` decoded by `api.rs` (a bad
                    // message INVALID_ARGUMENT); unknown methods (UNIMPLEMENTED) by the
                    // generated router.
                    let path = req.uri().path();
                    if path == SCORE_PATH || path == RERANK_PATH {
                        let (api, score) = (api.clone(), path == SCORE_PATH);
                        Either::Left(async move {
                            let answer = if score {
                                let mut grpc = tonic::server::Grpc::new(RawScoreCodec)
                                    .apply_max_message_size_config(Some(max_message), Some(usize::MAX));
                                grpc.unary(RawScore(api), req).await
                            } else {
                                let mut grpc = tonic::server::Grpc::new(RawRerankCodec)
                                    .apply_max_message_size_config(Some(max_message), Some(usize::MAX));
                                grpc.unary(RawRerank(api), req).await
                            };
                            drop(held);
                            watchdog::answered();
                            Ok::<_, Infallible>(answer)
                        })
                    } else {
                        let mut s = server.clone();
                        let call = s.call(req);
                        Either::Right(async move {
                            let answer = call.await;
                            drop(held);
                            watchdog::answered();
                            answer
                        })
                    }
                });
                // Each connection its own executor: its calls run on its own task (`inline.rs`).
                let exec = StreamExec::new(inline_streams, watch.clone());
                let conn = builder(exec.clone(), &grpc, &http).serve_connection(io, handler);
                let mut stop_rx = stop_rx.clone();
                let stop = async move {
                    let _ = stop_rx.wait_for(|stop| *stop).await;
                };
                let conn = Watchdog::new(conn, watch.clone(), progress, stop);
                let conn = exec.drive(conn, out, poll_rounds);
                let (slots, served) = (slots.clone(), watch.clone());
                let task = conns.spawn(async move {
                    let slot = match slot {
                        Ok(slot) => slot,
                        Err(Ok(waiting)) => match tokio::time::timeout(wait, slots.acquire_owned()).await {
                            Ok(Ok(slot)) => {
                                drop(waiting);
                                served.served();
                                slot
                            }
                            _ => return,
                        },
                        Err(Err(_)) => return,
                    };
                    if let Err(e) = conn.await {
                        tracing::debug!("gRPC connection: {e}");
                    }
                    drop(slot);
                });
                open.insert(task.id(), (task, watch));
            }
            _ = recheck.tick(), if waiting.available_permits() < http.max_connections => {
                evict_idle(&mut open, names::TIMEOUTS);
            }
            // Reap finished tasks so the set does not grow with every client.
            Some(r) = conns.join_next_with_id(), if !conns.is_empty() => forget(&mut open, r),
            mode = &mut stop => break mode,
        }
    };
    drop(listener);
    // A graceful stop is told through the connections' watchdogs (GOAWAY, calls in progress
    // answered).
    let stop = async {
        stopping.send_replace(true);
    };
    stop_connections(mode, stop, conns, "gRPC connections").await;
}

/// `Score`'s gRPC path.
const SCORE_PATH: &str = "/sieve.v1.Sieve/Score";
const RERANK_PATH: &str = "/sieve.v1.Sieve/Rerank";

/// The HTTP/2 server of one connection, its calls run by `exec`.
fn builder(exec: StreamExec, grpc: &GrpcConfig, http: &HttpConfig) -> http2::Builder<StreamExec> {
    let mut b = http2::Builder::new(exec);
    b.timer(TokioTimer::new())
        .max_concurrent_streams(grpc.max_concurrent_streams)
        .keep_alive_interval(grpc.keepalive_interval())
        .keep_alive_timeout(grpc.keepalive_timeout())
        .max_header_list_size(u32::try_from(http.max_header_bytes).unwrap_or(u32::MAX));
    b
}

/// A request body that must arrive whole within the `[http]` body read timeout (a call's message
/// trickled in, or never ended, would hold its stream forever): then it fails, and the call
/// ends with DEADLINE_EXCEEDED, as an HTTP body ends with 408. Each data frame is counted in
/// `held` before it is passed on; one the budget cannot cover fails the call at once with
/// RESOURCE_EXHAUSTED (retry info included), as an HTTP body is answered 503. Every method is
/// unary: a byte past the first message fails the call with INVALID_ARGUMENT (tonic would read
/// and drop a second message, answering OK as if it had never come).
struct Timed {
    inner: Incoming,
    deadline: Pin<Box<Sleep>>,
    timeout: Duration,
    held: SharedReservation,
    framing: OneMessage,
}

impl Timed {
    fn new(inner: Incoming, timeout: Duration, held: SharedReservation) -> Self {
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

impl Body for Timed {
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
            return Poll::Ready(frame.map(|f| f.map_err(|e| Status::from_error(Box::new(e)))));
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
