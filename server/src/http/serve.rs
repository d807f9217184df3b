//! The accept loop every Sieve port runs: a connection cap, hyper's http1 per connection with
//! the head/idle timer and the send timeout, a body deadline on every request, and a stop that
//! is graceful within a bound (or abrupt).
//!
//! Why each piece is what it is:
//!
//! - Header and idle timeouts: hyper's own `header_read_timeout` on hyper-util's `TokioTimer`,
//!   through a timer that tells an idle keep-alive connection from a slow head (`timer.rs`).
//!   tower layers see requests, never a head that has not arrived, so none could do this.
//! - Send timeout: a socket wrapper that fails a write stalled for `send_timeout_ms`
//!   (`send_timeout.rs`), so a client that stops reading its answers cannot hold a connection:
//!   no hyper or tower timer covers a write that does not progress.
//! - Body timeout: a [`BodyDeadline`] in the request's extensions that `read_body` honours
//!   (`body.rs`): the whole body within the timeout, whatever its pace. tower-http's body
//!   timeout restarts at every frame, so a trickle would never end.
//! - Connection cap: a semaphore permit per connection taken at accept. A connection that finds
//!   none closes every connection idle for [`EVICT_IDLE`] (no request in progress, no head
//!   arriving) and waits up to [`SLOT_WAIT`] for a slot, so a flood of connections that send
//!   nothing cannot lock real clients out until the idle timeout; without a slot by then it
//!   gets a canned 503 JSON and is closed without hyper ever running for it. tower's
//!   concurrency limit and load shedding bound requests, not connections (and the request-level
//!   admission, 429 with the in-flight count, is the handlers' own).
//! - Body size: `read_body(req, max)` with the route's own maximum (a hot-reloadable config
//!   value on the proxy); tower-http's body limit would fix one maximum per server and change the
//!   body type handlers get.
//! - Stop: hyper-util's `GracefulShutdown`, cut off at the grace by aborting what is left.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::Request;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use sieve_shared::metrics_names::http::TIMEOUTS;
use sieve_shared::ApiError;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::body::BodyDeadline;
use super::io::ConnIo;
use super::send_timeout::SendTimeout;
use super::timer::{Activity, HeadTimer};
use super::{HttpConfig, HttpResponse, StopMode};

/// How long a connection must have been idle to be closed for one waiting at the cap: a
/// client that connects to send a request sends it at once.
pub(crate) const EVICT_IDLE: Duration = Duration::from_millis(250);
/// How long a connection at the cap waits for a slot before its 503 (at most the header
/// timeout): a full port answers quickly, one full of idle connections frees slots well within.
pub(crate) const SLOT_WAIT: Duration = Duration::from_secs(1);

/// What tells whether a connection is idle: nothing in progress, for how long (`None`: busy).
pub(super) trait Idle {
    fn idle_for(&self, now: std::time::Instant) -> Option<Duration>;
}

/// A port's open connections: each one's task, and what tells whether it is idle.
type Open<A> = HashMap<tokio::task::Id, (AbortHandle, Arc<A>)>;

/// Serves HTTP/1.1 connections with `handler` (one task per connection, keep-alive) under the
/// limits of `config` until `stop` resolves, then ends as it says. With
/// `StopMode::Graceful(Some(grace))` it returns within `grace` whatever the clients do.
pub async fn serve<F, Fut, S>(listener: TcpListener, config: HttpConfig, handler: F, stop: S)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = HttpResponse> + Send + 'static,
    S: Future<Output = StopMode>,
{
    let slots = ConnectionSlots::new(&config);
    serve_with_slots(listener, config, slots, handler, stop).await
}

/// The connection cap of one port, shareable by several accept loops on it (one per thread,
/// each with its own `SO_REUSEPORT` listener) so the cap stays the port's, not each loop's.
#[derive(Debug, Clone)]
pub struct ConnectionSlots {
    served: Arc<Semaphore>,
    /// Refused connections linger briefly (so the client reads its 503 rather than a reset);
    /// at most as many of them as served ones.
    refusals: Arc<Semaphore>,
}

impl ConnectionSlots {
    /// `config.max_connections` slots.
    pub fn new(config: &HttpConfig) -> Self {
        ConnectionSlots {
            served: Arc::new(Semaphore::new(config.max_connections)),
            refusals: Arc::new(Semaphore::new(config.max_connections)),
        }
    }
}

/// [`serve`] with the port's connection slots given (shared with the port's other loops).
pub async fn serve_with_slots<F, Fut, S>(
    listener: TcpListener,
    config: HttpConfig,
    slots: ConnectionSlots,
    handler: F,
    stop: S,
) where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = HttpResponse> + Send + 'static,
    S: Future<Output = StopMode>,
{
    let graceful = GracefulShutdown::new();
    let ConnectionSlots { served: slots, refusals } = slots;
    // Served connections and those waiting at the cap alike: a stop drains both.
    let mut conns = JoinSet::new();
    // Cancelled at a stop: a connection still waiting for a slot is refused then.
    let stopping = CancellationToken::new();
    // Every connection's task and what its socket did: the idle ones are closed at the cap.
    let mut open: Open<Activity> = HashMap::new();
    // While connections wait for a slot, idle ones are looked at again (they age into EVICT_IDLE).
    let mut recheck = tokio::time::interval(EVICT_IDLE / 2);
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let wait = SLOT_WAIT.min(config.header_read_timeout());
    tokio::pin!(stop);
    let mode = loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Some(stream) = accepted_or_back_off(accepted, "accept").await else { continue };
                let _ = stream.set_nodelay(true);
                let activity = Arc::new(Activity::default());
                let (watcher, cfg, h, a) = (graceful.watcher(), config.clone(), handler.clone(), activity.clone());
                let task = match slots.clone().try_acquire_owned() {
                    Ok(slot) => conns.spawn(async move {
                        if let Err(e) = connection(stream, &cfg, h, a, watcher).await {
                            tracing::debug!("connection: {e}");
                        }
                        drop(slot);
                    }),
                    Err(_) => {
                        let Ok(p) = refusals.clone().try_acquire_owned() else {
                            let _ = stream.try_write(&refusal_response());
                            continue;
                        };
                        evict_idle(&mut open, TIMEOUTS);
                        let (slots, linger, stopping) = (slots.clone(), config_linger(&config), stopping.clone());
                        // Served after its wait, it is drained by a stop like any other; still
                        // waiting when the stop comes, it is refused.
                        conns.spawn(async move {
                            let got = tokio::select! {
                                got = tokio::time::timeout(wait, slots.acquire_owned()) => got.ok().and_then(Result::ok),
                                _ = stopping.cancelled() => None,
                            };
                            let Some(slot) = got else {
                                refuse(stream, linger).await;
                                return drop(p);
                            };
                            drop(p);
                            if let Err(e) = connection(stream, &cfg, h, a, watcher).await {
                                tracing::debug!("connection: {e}");
                            }
                            drop(slot);
                        })
                    }
                };
                open.insert(task.id(), (task, activity));
            }
            _ = recheck.tick(), if refusals.available_permits() < config.max_connections => evict_idle(&mut open, TIMEOUTS),
            // Reap finished tasks so the sets do not grow with every client.
            Some(r) = conns.join_next_with_id(), if !conns.is_empty() => forget(&mut open, r),
            mode = &mut stop => break mode,
        }
    };
    drop(listener);
    stopping.cancel();
    stop_connections(mode, graceful.shutdown(), conns, "connections").await;
}

/// The accepted stream, or `None` after a short back-off when accepting failed (out of file
/// descriptors and the like), so the accept loop does not spin. Shared by the HTTP and gRPC ports.
pub(crate) async fn accepted_or_back_off(
    accepted: std::io::Result<(TcpStream, std::net::SocketAddr)>,
    what: &str,
) -> Option<TcpStream> {
    match accepted {
        Ok((s, _)) => Some(s),
        Err(e) => {
            tracing::warn!("{what}: {e}");
            tokio::time::sleep(Duration::from_millis(5)).await;
            None
        }
    }
}

/// Ends a port's connections as `mode` says: at once, or gracefully (`stop` tells every
/// connection to finish: requests in progress finish, no new ones start; HTTP/2 connections get
/// GOAWAY) cut off at the grace by aborting what is left; returns once every connection task
/// has ended (`stop`: hyper-util's graceful shutdown).
async fn stop_connections(mode: StopMode, stop: impl Future<Output = ()>, mut conns: JoinSet<()>, what: &str) {
    if let StopMode::Graceful(grace) = mode {
        let all_ended = async {
            stop.await;
            while conns.join_next().await.is_some() {}
        };
        match grace {
            Some(g) => {
                if tokio::time::timeout(g, all_ended).await.is_err() {
                    tracing::warn!("{what} still open after {g:?}; closing");
                }
            }
            None => all_ended.await,
        }
    }
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}

/// Closes the connections idle for [`EVICT_IDLE`] or more (their tasks aborted: the socket
/// closed, the slot freed), for the connections waiting at the cap; each counted in `metric`
/// as `timer="evicted"`.
fn evict_idle<A: Idle>(open: &mut Open<A>, metric: sieve_shared::metrics_names::Metric) {
    let now = std::time::Instant::now();
    open.retain(|_, (task, conn)| {
        let idle = conn.idle_for(now).is_some_and(|d| d >= EVICT_IDLE);
        if idle {
            task.abort();
            metrics::counter!(metric, "timer" => "evicted").increment(1);
        }
        !idle
    });
}

/// A connection's task ended: it is no longer open.
fn forget<A>(open: &mut Open<A>, ended: Result<(tokio::task::Id, ()), tokio::task::JoinError>) {
    open.remove(&ended.map_or_else(|e| e.id(), |(id, ())| id));
}

/// One connection: hyper's http1 with the head/idle timer, on the activity-reporting socket;
/// every request gets its body deadline when its head is in. Its activity is idle from now.
fn connection<F, Fut>(
    stream: TcpStream,
    config: &HttpConfig,
    handler: F,
    activity: Arc<Activity>,
    graceful: Watcher,
) -> impl Future<Output = hyper::Result<()>> + Send + 'static
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = HttpResponse> + Send + 'static,
{
    activity.accepted();
    let body_timeout = config.body_read_timeout();
    let a = activity.clone();
    let svc = service_fn(move |mut req: Request<Incoming>| {
        let guard = a.begin_request();
        req.extensions_mut().insert(BodyDeadline(Instant::now() + body_timeout));
        let h = handler.clone();
        async move {
            let r = h(req).await;
            drop(guard);
            Ok::<_, Infallible>(r)
        }
    });
    let timer =
        HeadTimer { activity: activity.clone(), header: config.header_read_timeout(), idle: config.idle_timeout() };
    // The send timeout sits on the socket itself, under every write (ours included).
    let io = TokioIo::new(ConnIo::new(SendTimeout::new(stream, config.send_timeout(), TIMEOUTS), activity));
    let mut b = http1::Builder::new();
    b.timer(timer)
        .header_read_timeout(config.header_read_timeout())
        .max_buf_size(config.max_header_bytes.max(HttpConfig::MIN_HEADER_BYTES));
    graceful.watch(b.serve_connection(io, svc))
}

/// How long a refused connection is given to take its 503: as long as any client is given
/// to send a head.
fn config_linger(c: &HttpConfig) -> Duration {
    c.header_read_timeout()
}

fn refusal_response() -> Vec<u8> {
    let body = ApiError::not_ready("too many open connections (max_connections); retry later").to_json();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Answers 503 and closes: the response, then our side shut, then whatever the client sends is
/// read and dropped until it closes too (so the close is not a reset that could destroy the 503
/// before it is read), for at most `linger`.
async fn refuse(mut stream: TcpStream, linger: Duration) {
    let _ = tokio::time::timeout(linger, async {
        stream.write_all(&refusal_response()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    })
    .await;
}
