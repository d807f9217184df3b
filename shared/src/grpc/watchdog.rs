//! The gRPC port's timers: what the `[http]` header, idle and send timeouts are on an HTTP/1
//! port, for a connection of HTTP/2 calls. hyper's HTTP/2 server has none of them (its
//! keep-alive PINGs find dead peers, not live ones that hold a connection doing nothing), so
//! each would otherwise be held forever, with one of the port's `[http] max_connections`.
//!
//! - **Header** (`header_read_timeout_ms` from the accept): the connection's first 24 bytes, the
//!   HTTP/2 preface, have not all arrived: it is closed (nothing was spoken, nothing to say).
//! - **Idle** (`idle_timeout_ms` since the preface or the end of its last call): no call in
//!   progress (PINGs do not count): a graceful close (GOAWAY, which a gRPC client answers by
//!   reconnecting for its next call), then closed if it has not ended within the send timeout.
//! - **Send, on the socket** (`send_timeout_ms` without a write that progresses, as nginx's
//!   `send_timeout`): bytes are waiting for a socket that the peer does not read: the
//!   connection is closed. Not here: the socket's writer (`io.rs`) runs the HTTP ports' send
//!   timeout (`http::SendTimeout`), whose failed write ends the connection.
//! - **Send, on flow control** (`send_timeout_ms` from the answer): a call answered whose stream
//!   has not finished sending by then (the client keeps its HTTP/2 window shut) is reset; the
//!   connection, if otherwise idle, then goes at its idle timeout.
//!
//! Why one watchdog per connection and one wrapper per call, not hyper's timers: the connection
//! is the one future that sees its socket (`io.rs`) and every call (`inline.rs`'s executor gets
//! each stream, inline or spawned), so it is the one place that can tell "nothing in progress"
//! from "a call computing". A call's own progress while it sends is not visible outside h2 (h2
//! queues its DATA until the window opens; the body is not polled until then), so the send
//! timer of a call counts from its answer, not from its last byte sent: a unary answer is one
//! message, and its whole send must take less than the send timeout. A call still reading its
//! message is bounded by `body_read_timeout_ms`, one computing by its deadline.
//!
//! No timer costs anything on a call that is answered and sent in one poll (the common case):
//! the call's timer is armed only when its answer is left waiting, and the connection's is
//! re-aimed only when its deadline comes nearer (a later one is found when the timer fires).

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::task::AtomicWaker;
use tokio::time::{Instant, Sleep};

use super::io::Output;
use crate::metrics_names::grpc as names;

/// The length of the HTTP/2 client preface (`PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`).
pub(super) const PREFACE_BYTES: u64 = 24;

/// The `[http]` timers one gRPC connection runs under.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timers {
    pub(super) header: Duration,
    pub(super) idle: Duration,
    pub(super) send: Duration,
}

/// What a connection's calls tell its watchdog: how many are in progress, and since when none
/// is.
pub(super) struct ConnWatch {
    accepted: Instant,
    timers: Timers,
    /// Calls (HTTP/2 streams handed to the executor) not yet ended.
    calls: AtomicUsize,
    /// When the connection last had nothing in progress (the preface in, or its last call
    /// ended), in ms since `accepted`.
    idle_since_ms: AtomicU64,
    /// The connection's task, from the watchdog's latest poll: woken when a call on a task of
    /// its own ends, so that its idle timer is aimed anew (a call on the connection's task is
    /// followed by a poll of the connection anyway).
    conn: AtomicWaker,
}

impl ConnWatch {
    pub(super) fn new(timers: Timers) -> Arc<Self> {
        Arc::new(ConnWatch {
            accepted: Instant::now(),
            timers,
            calls: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
            conn: AtomicWaker::new(),
        })
    }

    /// A call starts; it counts until the returned tracker is dropped.
    pub(super) fn track(self: &Arc<Self>, call: Call) -> Tracked {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Tracked { call, watch: self.clone(), answered: false, send: None }
    }

    /// A call on a task of its own has ended (its tracker dropped): the connection looks at its
    /// timers again.
    pub(super) fn spawned_call_ended(&self) {
        self.conn.wake();
    }

    fn call_ended(&self) {
        if self.calls.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.idle_from_now();
        }
    }

    /// The idle time counts from now (not from before).
    fn idle_from_now(&self) {
        let ms = u64::try_from(self.accepted.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.idle_since_ms.fetch_max(ms, Ordering::SeqCst);
    }

    /// When the connection's idle timer ends, if no call is in progress.
    fn idle_deadline(&self) -> Option<Instant> {
        if self.calls.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let since = Duration::from_millis(self.idle_since_ms.load(Ordering::SeqCst));
        after(self.accepted, since.saturating_add(self.timers.idle))
    }
}

/// `idle_since_ms` of a connection waiting for a slot at the cap: not idle, never closed for another.
const WAITING: u64 = u64::MAX;

impl ConnWatch {
    /// The connection waits for a slot (until [`Self::served`]).
    pub(super) fn waiting(&self) {
        self.idle_since_ms.store(WAITING, Ordering::SeqCst);
    }

    /// The connection got its slot: idle from now until its first call.
    pub(super) fn served(&self) {
        let ms = u64::try_from(self.accepted.elapsed().as_millis()).unwrap_or(WAITING - 1);
        self.idle_since_ms.store(ms, Ordering::SeqCst);
    }
}

impl crate::http::Idle for ConnWatch {
    /// How long no call has been in progress (since the accept, or its last call ended).
    fn idle_for(&self, now: std::time::Instant) -> Option<Duration> {
        let since_ms = self.idle_since_ms.load(Ordering::SeqCst);
        if self.calls.load(Ordering::SeqCst) > 0 || since_ms == WAITING {
            return None;
        }
        Some(now.saturating_duration_since(self.accepted.into_std() + Duration::from_millis(since_ms)))
    }
}

/// One call's future, as hyper hands it to the executor.
pub(super) type Call = Pin<Box<dyn Future<Output = ()> + Send>>;

thread_local! {
    /// Set by [`answered`] while a [`Tracked`] call is polled: the call produced its answer.
    static ANSWERED: Cell<bool> = const { Cell::new(false) };
}

/// Called by the call's handler when its answer is ready (before it is sent): from then on
/// the call must finish sending within the send timeout. It runs within the poll of the
/// call's [`Tracked`] (hyper polls the handler inside the stream's future), which takes the
/// mark.
pub(super) fn answered() {
    ANSWERED.with(|a| a.set(true));
}

/// A call on its connection: counted in progress until dropped, and ended (its stream reset)
/// when its answer has waited the send timeout to be sent.
pub(super) struct Tracked {
    call: Call,
    watch: Arc<ConnWatch>,
    answered: bool,
    /// Armed when the answer is ready and the call did not end in the same poll.
    send: Option<Pin<Box<Sleep>>>,
}

impl Future for Tracked {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        // Saved and put back, so a call polled inside another's poll marks only itself.
        let outer = ANSWERED.with(|a| a.replace(false));
        let polled = this.call.as_mut().poll(cx);
        let answered_now = ANSWERED.with(|a| a.replace(outer));
        if polled.is_ready() {
            return Poll::Ready(());
        }
        this.answered |= answered_now;
        if this.answered {
            let send = this.watch.timers.send;
            let timer = this.send.get_or_insert_with(|| Box::pin(tokio::time::sleep(send)));
            if timer.as_mut().poll(cx).is_ready() {
                // Dropping the stream's future resets the stream (h2 sends RST_STREAM CANCEL)
                // and gives back what it held.
                metrics::counter!(names::TIMEOUTS, "timer" => "send_stream").increment(1);
                tracing::debug!("gRPC call reset: its answer was not taken within {send:?} (send_timeout_ms)");
                return Poll::Ready(());
            }
        }
        Poll::Pending
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.watch.call_ended();
    }
}

/// A connection that can be asked to close gracefully (GOAWAY, its calls finish).
pub(super) trait Graceful {
    fn graceful_shutdown(self: Pin<&mut Self>);
}

impl<I, B, S, E> Graceful for hyper::server::conn::http2::Connection<I, S, E>
where
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + 'static,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, B>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        hyper::server::conn::http2::Connection::graceful_shutdown(self);
    }
}

/// `d` after `at`; `None` (never) past what a clock can hold (a config's huge timeout).
fn after(at: Instant, d: Duration) -> Option<Instant> {
    at.checked_add(d)
}

/// Which timer a deadline is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timer {
    Header,
    Idle,
    /// The bound on a graceful close the idle timer started.
    Closing,
}

/// A connection under its timers, and the port's stop (graceful: GOAWAY, calls finish).
pub(super) struct Watchdog<C> {
    conn: Pin<Box<C>>,
    watch: Arc<ConnWatch>,
    out: Output,
    stop: Pin<Box<dyn Future<Output = ()> + Send>>,
    stopping: bool,
    /// The whole preface has arrived (the header timer is over, the idle one runs from then).
    spoke: bool,
    /// The idle timer closed the connection gracefully...
    idle_closed: bool,
    /// ...and it must be gone by then.
    closing: Option<Instant>,
    timer: Pin<Box<Sleep>>,
    armed: Option<Instant>,
}

impl<C, E> Watchdog<C>
where
    C: Future<Output = Result<(), E>> + Graceful,
{
    /// `conn` watched with `watch` (its calls) and `out` (its socket's writes); `stop` resolves
    /// when the port stops gracefully.
    pub(super) fn new(
        conn: C,
        watch: Arc<ConnWatch>,
        out: Output,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        Watchdog {
            conn: Box::pin(conn),
            watch,
            out,
            stop: Box::pin(stop),
            stopping: false,
            spoke: false,
            idle_closed: false,
            closing: None,
            // Aimed at its first deadline before it is polled.
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
            armed: None,
        }
    }

    /// The nearest deadline of the timers that apply now (noting first whether the preface is
    /// in: the header timer then gives way to the idle one).
    fn deadline(&mut self) -> Option<(Instant, Timer)> {
        let t = self.watch.timers;
        if !self.spoke && self.out.preface() >= PREFACE_BYTES {
            // A client that took most of the header timeout to connect is not then idle at once.
            self.spoke = true;
            self.watch.idle_from_now();
        }
        let mut next: Option<(Instant, Timer)> = None;
        let mut consider = |at: Instant, which: Timer| {
            if next.is_none_or(|(n, _)| at < n) {
                next = Some((at, which));
            }
        };
        if self.idle_closed {
            if let Some(at) = self.closing {
                consider(at, Timer::Closing);
            }
        } else if !self.spoke {
            if let Some(at) = after(self.watch.accepted, t.header) {
                consider(at, Timer::Header);
            }
        } else if !self.stopping {
            if let Some(at) = self.watch.idle_deadline() {
                consider(at, Timer::Idle);
            }
        }
        next
    }
}

impl<C, E> Future for Watchdog<C>
where
    C: Future<Output = Result<(), E>> + Graceful,
{
    type Output = Result<(), E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), E>> {
        let this = &mut *self;
        this.watch.conn.register(cx.waker());
        loop {
            if !this.stopping && this.stop.as_mut().poll(cx).is_ready() {
                this.stopping = true;
                this.conn.as_mut().graceful_shutdown();
            }
            if let Poll::Ready(end) = this.conn.as_mut().poll(cx) {
                return Poll::Ready(end);
            }
            let Some((at, which)) = this.deadline() else { return Poll::Pending };
            // Re-aimed only when the deadline comes nearer: a deadline that moved later (the
            // idle timer after every call) is looked at again when the timer fires, so that a
            // busy connection costs a timer reset per idle period, not one per call.
            if this.armed.is_none_or(|armed| at < armed) {
                this.timer.as_mut().reset(at);
                this.armed = Some(at);
            }
            if this.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if Instant::now() < at {
                this.armed = None;
                continue;
            }
            let label = match which {
                Timer::Header => "header",
                Timer::Idle => "idle",
                Timer::Closing => {
                    tracing::debug!("gRPC connection: still open after its idle GOAWAY; closed");
                    return Poll::Ready(Ok(()));
                }
            };
            metrics::counter!(names::TIMEOUTS, "timer" => label).increment(1);
            tracing::debug!("gRPC connection: {label} timeout");
            if which != Timer::Idle {
                // Dropping the connection closes its socket (and drops its calls).
                return Poll::Ready(Ok(()));
            }
            // GOAWAY: the client opens a new connection for its next call; bounded by the send
            // timeout (a GOAWAY the peer does not read is a stalled write anyway).
            this.idle_closed = true;
            this.closing = after(Instant::now(), this.watch.timers.send);
            this.conn.as_mut().graceful_shutdown();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::inline::StreamExec;
    use crate::grpc::io::ConnIo;
    use bytes::Bytes;
    use http_body_util::Full;
    use hyper::server::conn::http2;
    use hyper::service::service_fn;
    use hyper_util::rt::{TokioIo, TokioTimer};
    use std::convert::Infallible;
    use std::time::Instant as StdInstant;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::task::JoinHandle;

    const TIMERS: Timers = Timers {
        header: Duration::from_millis(300),
        idle: Duration::from_millis(600),
        send: Duration::from_millis(400),
    };
    /// How late past its timer a connection may end (a loaded 2-core machine).
    const SLACK: Duration = Duration::from_millis(1500);

    /// One connection accepted and served as the gRPC port serves it (its socket, executor,
    /// watchdog), every call answered `answer_bytes` bytes; the task ends with how long the
    /// connection lived after its accept.
    async fn serve_one(answer_bytes: usize) -> (std::net::SocketAddr, JoinHandle<Duration>) {
        serve_one_with(answer_bytes, 4, Duration::ZERO, std::future::pending()).await
    }

    /// [`serve_one`] with `inline` calls on the connection's task (0: each on its own), each
    /// answered after `delay`, and the port's graceful stop when `stop` resolves.
    async fn serve_one_with(
        answer_bytes: usize,
        inline: usize,
        delay: Duration,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> (std::net::SocketAddr, JoinHandle<Duration>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (stream, _) = l.accept().await.unwrap();
            let start = StdInstant::now();
            let (io, out) = ConnIo::new(stream, 64 * 1024, 64 * 1024, TIMERS.send);
            let watch = ConnWatch::new(TIMERS);
            let exec = StreamExec::new(inline, watch.clone());
            let answer = Bytes::from(vec![7u8; answer_bytes]);
            let svc = service_fn(move |_req| {
                let answer = answer.clone();
                async move {
                    tokio::time::sleep(delay).await;
                    answered();
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(answer)))
                }
            });
            let mut b = http2::Builder::new(exec.clone());
            b.timer(TokioTimer::new());
            let conn = b.serve_connection(TokioIo::new(io), svc);
            let conn = Watchdog::new(conn, watch, out.clone(), stop);
            let _ = exec.drive(conn, Some(out), 4).await;
            start.elapsed()
        });
        (addr, task)
    }

    fn assert_within(lived: Duration, timer: Duration, what: &str) {
        assert!(lived + Duration::from_millis(50) >= timer, "{what}: ended after {lived:?}, before its {timer:?}");
        assert!(lived < timer + SLACK, "{what}: still open {lived:?} after the accept ({timer:?} timer)");
    }

    /// The client's side of an HTTP/2 connection, its frames (PINGs, GOAWAY) answered by a task.
    async fn h2_client(
        addr: std::net::SocketAddr,
        window: u32,
    ) -> (h2::client::SendRequest<Bytes>, h2::PingPong, JoinHandle<StdInstant>) {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (send, mut conn) = h2::client::Builder::new()
            .initial_window_size(window)
            .initial_connection_window_size(window.max(65_535))
            .handshake::<_, Bytes>(tcp)
            .await
            .unwrap();
        let ping = conn.ping_pong().expect("the ping handle");
        let task = tokio::spawn(async move {
            let _ = conn.await;
            StdInstant::now()
        });
        (send, ping, task)
    }

    fn request() -> hyper::Request<()> {
        hyper::Request::post("http://localhost/sieve.v1.Sieve/Score").body(()).unwrap()
    }

    /// Nothing sent, or a preface cut short: closed at the header timeout.
    #[tokio::test]
    async fn no_preface_is_closed_at_the_header_timeout() {
        for sent in [&b""[..], &b"PRI * HTTP/2.0\r\n"[..]] {
            let (addr, server) = serve_one(10).await;
            let mut c = TcpStream::connect(addr).await.unwrap();
            c.write_all(sent).await.unwrap();
            let lived = server.await.unwrap();
            assert_within(lived, TIMERS.header, "no preface");
            // The server's SETTINGS (sent at the accept), then the end of the stream.
            let mut rest = Vec::new();
            let end = tokio::time::timeout(SLACK, c.read_to_end(&mut rest)).await.expect("closed");
            assert!(end.is_ok(), "{end:?}");
            assert_eq!(rest.get(3), Some(&4), "only the server's SETTINGS frame: {rest:?}");
        }
    }

    /// A connection that only answers PINGs (and sends its own) is closed at the idle timeout
    /// counted from its last call, with a GOAWAY the client sees as the end of its connection.
    #[tokio::test]
    async fn pings_do_not_keep_an_idle_connection() {
        let (addr, server) = serve_one(10).await;
        let (send, mut ping, client) = h2_client(addr, 65_535).await;
        let begun = StdInstant::now();
        let pinger = tokio::spawn(async move {
            while ping.ping(h2::Ping::opaque()).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        // One call a little after the start: the idle time counts from its end.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut send = send.ready().await.unwrap();
        let (answer, _) = send.send_request(request(), true).unwrap();
        let mut body = answer.await.unwrap().into_body();
        while let Some(d) = body.data().await {
            let d = d.unwrap();
            body.flow_control().release_capacity(d.len()).unwrap();
        }
        let call_end = begun.elapsed();
        let lived = server.await.unwrap();
        assert_within(lived.saturating_sub(call_end), TIMERS.idle, "idle after a call");
        let ended = tokio::time::timeout(SLACK, client).await.expect("the client saw the end").unwrap();
        assert!(ended.duration_since(begun) < call_end + TIMERS.idle + SLACK);
        assert!(send.ready().await.is_err(), "no new call on a connection gone away");
        pinger.abort();
    }

    /// An answer the client never opens its window for: its stream is reset at the send
    /// timeout (a call on the connection's task or on its own); the connection then goes at its
    /// idle timeout.
    #[tokio::test]
    async fn an_answer_never_taken_is_reset_at_the_send_timeout() {
        for inline in [4, 0] {
            answer_never_taken(inline).await;
        }
    }

    async fn answer_never_taken(inline: usize) {
        let (addr, server) = serve_one_with(1000, inline, Duration::ZERO, std::future::pending()).await;
        let (send, _ping, _client) = h2_client(addr, 0).await;
        let mut send = send.ready().await.unwrap();
        let (answer, _) = send.send_request(request(), true).unwrap();
        let answered = StdInstant::now();
        let mut body = answer.await.expect("the answer's head is not flow-controlled").into_body();
        let data = tokio::time::timeout(TIMERS.send + SLACK, body.data()).await.expect("the stream ended");
        let waited = answered.elapsed();
        let e = data.expect("no data, an end").expect_err("a reset, not data");
        assert_eq!(e.reason(), Some(h2::Reason::CANCEL), "{e}");
        assert_within(waited, TIMERS.send, "a shut window");
        let lived = server.await.unwrap();
        assert!(lived < TIMERS.send + TIMERS.idle + SLACK, "the idle connection went: {lived:?}");
    }

    /// A client that stops reading its socket while a large answer is sent: the connection is
    /// closed at the send timeout after the socket stopped taking bytes.
    #[tokio::test]
    async fn a_socket_never_read_is_closed_at_the_send_timeout() {
        let (addr, server) = serve_one(64 << 20).await;
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (send, mut conn) = h2::client::Builder::new()
            .initial_window_size(i32::MAX as u32)
            .initial_connection_window_size(i32::MAX as u32)
            .handshake::<_, Bytes>(tcp)
            .await
            .unwrap();
        let mut send = send.ready().await.unwrap();
        let (answer, _) = send.send_request(request(), true).unwrap();
        // The connection is polled until the answer's head is in, then never again: its socket
        // is held open and not read.
        let head = tokio::select! {
            head = answer => head.unwrap(),
            _ = &mut conn => panic!("the connection ended before the answer"),
        };
        let begun = StdInstant::now();
        let lived = tokio::time::timeout(TIMERS.send + SLACK * 2, server).await.expect("closed").unwrap();
        assert!(begun.elapsed() + Duration::from_millis(50) >= TIMERS.send, "closed before the send timeout");
        assert!(lived < TIMERS.send + SLACK * 2, "{lived:?}");
        drop((head, conn));
    }

    /// The port's graceful stop: GOAWAY, the call in progress still answered, then the
    /// connection ends (long before any of its timers).
    #[tokio::test]
    async fn a_graceful_stop_lets_the_call_in_progress_finish() {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let stopped = async move {
            let _ = stopped.await;
        };
        let (addr, server) = serve_one_with(10, 4, Duration::from_millis(300), stopped).await;
        let (send, _ping, client) = h2_client(addr, 65_535).await;
        let mut send = send.ready().await.unwrap();
        let (answer, _) = send.send_request(request(), true).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop.send(()).unwrap();
        let mut body = answer.await.expect("the call in progress is answered").into_body();
        let mut got = 0;
        while let Some(d) = body.data().await {
            got += d.expect("the whole answer").len();
        }
        assert_eq!(got, 10);
        let lived = server.await.unwrap();
        // The answer came at 300 ms; the idle timer would end the connection 600 ms later.
        assert!(lived < Duration::from_millis(300) + TIMERS.idle / 2, "ended by the stop, not a timer: {lived:?}");
        tokio::time::timeout(SLACK, client).await.expect("the client saw the end").unwrap();
    }

    /// A client slow to send its preface (within the header timeout) gets the whole idle time
    /// from the preface, not from the accept.
    #[tokio::test]
    async fn the_idle_time_counts_from_the_preface() {
        let (addr, server) = serve_one(10).await;
        let tcp = TcpStream::connect(addr).await.unwrap();
        let late = Duration::from_millis(250);
        tokio::time::sleep(late).await;
        let (_send, conn) = h2::client::handshake(tcp).await.unwrap();
        let client = tokio::spawn(conn);
        let lived = server.await.unwrap();
        assert_within(lived.saturating_sub(late), TIMERS.idle, "idle from the preface");
        let _ = client.await;
    }
}
