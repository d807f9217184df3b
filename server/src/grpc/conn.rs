//! One gRPC connection as tonic's server gets it from our connection stream: the socket under
//! the `[http]` timers, and what its calls tell those timers. tonic's server has no idle or
//! header timer and no per-connection cap; h2's keep-alive PINGs find dead peers, not live ones
//! that hold a connection doing nothing. So the socket itself ends a connection that breaks a
//! timer: its next read fails, and hyper ends the connection (dropping its calls, as on a
//! hang-up). Each end is counted in `sieve_grpc_timeouts_total{timer}`.
//!
//! - **header** (`header_read_timeout_ms` from the accept): the 24-byte HTTP/2 preface has not
//!   all arrived.
//! - **idle** (`idle_timeout_ms` since the preface or the end of the last call): no call in
//!   progress (PINGs do not count). A gRPC client reconnects for its next call.
//! - **send** (`send_timeout_ms` without a write that progresses): the socket's writes fail
//!   (`http::SendTimeout`, as on the HTTP ports).
//! - **send_stream** (`send_timeout_ms` from an answer): a call answered whose answer has not
//!   been sent by then (its flow-control window kept shut). hyper does not poll an answer's body
//!   while the window is shut, so nothing inside the call can end it: the connection is closed.
//! - **evicted**: at the port's connection cap, a connection with no call for
//!   [`EVICT_IDLE`](crate::http::EVICT_IDLE) is closed for a new one (`server.rs`).
//!
//! The timers cost a call nothing but two short locks: the socket's read (which h2 polls
//! whenever the connection's task runs) looks at the nearest deadline and re-aims its one sleep
//! only when that deadline comes nearer (a later one is found when the sleep ends).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::task::AtomicWaker;
use sieve_shared::metrics_names::grpc::TIMEOUTS;
use sieve_shared::sync::lock;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};
use tonic::transport::server::Connected;

use crate::http::SendTimeout;

/// The length of the HTTP/2 client preface (`PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`).
const PREFACE_BYTES: usize = 24;

/// The `[http]` timers one gRPC connection runs under.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timers {
    pub(super) header: Duration,
    pub(super) idle: Duration,
    pub(super) send: Duration,
}

/// What a connection's socket and calls share: calls in progress, since when none is, which
/// answers wait to be sent, and whether the port closed it.
pub(super) struct ConnWatch {
    accepted: Instant,
    timers: Timers,
    state: Mutex<State>,
    /// The connection's task (from its latest read): woken when a call ends abnormally or the
    /// port closes the connection, so its timers are looked at again.
    task: AtomicWaker,
}

#[derive(Default)]
struct State {
    calls: usize,
    /// When the connection last had nothing in progress (`None`: waiting for a slot at the cap,
    /// never idle).
    idle_since: Option<Instant>,
    /// The whole preface has arrived.
    spoke: bool,
    /// Calls answered whose answer is still being sent: (call id, answered at).
    sending: Vec<(u64, Instant)>,
    next_id: u64,
    /// Closed by the port (evicted or stopped).
    closed: bool,
}

impl ConnWatch {
    pub(super) fn new(timers: Timers, waiting: bool) -> Arc<Self> {
        let accepted = Instant::now();
        let state = State { idle_since: (!waiting).then_some(accepted), ..State::default() };
        Arc::new(ConnWatch { accepted, timers, state: Mutex::new(state), task: AtomicWaker::new() })
    }

    /// The connection got its slot at the cap: idle from now until its first call.
    pub(super) fn served(&self) {
        lock(&self.state).idle_since = Some(Instant::now());
    }

    /// Closes the connection: its next read fails.
    pub(super) fn close(&self) {
        lock(&self.state).closed = true;
        self.task.wake();
    }

    /// A call starts; it is in progress until [`Call::end`] or the drop of the returned guard.
    pub(super) fn begin(self: &Arc<Self>) -> Call {
        let mut s = lock(&self.state);
        s.calls += 1;
        s.next_id += 1;
        Call { watch: self.clone(), id: s.next_id, ended: false }
    }

    /// The nearest deadline of the timers that apply now, and its label.
    fn deadline(&self) -> Result<Option<(Instant, &'static str)>, ()> {
        let s = lock(&self.state);
        if s.closed {
            return Err(());
        }
        let t = self.timers;
        let mut next: Option<(Instant, &'static str)> = None;
        let mut consider = |at: Option<Instant>, which| {
            if let Some(at) = at.filter(|at| next.is_none_or(|(n, _)| *at < n)) {
                next = Some((at, which));
            }
        };
        if !s.spoke {
            consider(self.accepted.checked_add(t.header), "header");
        } else if s.calls == 0 {
            consider(s.idle_since.and_then(|i| i.checked_add(t.idle)), "idle");
        }
        if let Some(&(_, at)) = s.sending.iter().min_by_key(|(_, at)| *at) {
            consider(at.checked_add(t.send), "send_stream");
        }
        Ok(next)
    }

    fn spoke(&self) {
        let mut s = lock(&self.state);
        s.spoke = true;
        // A client that took most of the header timeout to connect is not then idle at once.
        s.idle_since = Some(Instant::now());
    }
}

impl ConnWatch {
    /// How long no call has been in progress (since the accept or the last call's end).
    pub(super) fn idle_for(&self, now: std::time::Instant) -> Option<Duration> {
        let s = lock(&self.state);
        let since = s.idle_since.filter(|_| s.calls == 0)?;
        Some(now.saturating_duration_since(since.into_std()))
    }
}

/// A call in progress on its connection.
pub(super) struct Call {
    watch: Arc<ConnWatch>,
    id: u64,
    ended: bool,
}

impl Call {
    /// Its answer is ready: from now it must be sent within the send timeout.
    pub(super) fn answered(&self) {
        lock(&self.watch.state).sending.push((self.id, Instant::now()));
    }

    /// The call is over (its answer's last frame handed to h2, which then wakes the
    /// connection's task: no wake-up needed here).
    pub(super) fn end(&mut self) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        let mut s = lock(&self.watch.state);
        s.calls -= 1;
        s.sending.retain(|(id, _)| *id != self.id);
        if s.calls == 0 {
            s.idle_since = Some(Instant::now());
        }
    }
}

impl Drop for Call {
    /// A call dropped before its end (reset, its connection gone): the connection's timers are
    /// looked at again.
    fn drop(&mut self) {
        if !self.ended {
            self.end();
            self.watch.task.wake();
        }
    }
}

/// The connection's socket as tonic's server gets it; it holds the connection's slot.
pub(super) struct Conn {
    io: SendTimeout<TcpStream>,
    watch: Arc<ConnWatch>,
    preface: usize,
    timer: Pin<Box<Sleep>>,
    armed: Option<Instant>,
    _slot: OwnedSemaphorePermit,
}

/// What tonic puts in every request's extensions: its connection.
#[derive(Clone)]
pub(super) struct ConnInfo(pub(super) Arc<ConnWatch>);

impl Conn {
    pub(super) fn new(stream: TcpStream, watch: Arc<ConnWatch>, slot: OwnedSemaphorePermit) -> Self {
        let io = SendTimeout::new(stream, watch.timers.send, TIMEOUTS);
        let timer = Box::pin(tokio::time::sleep(Duration::ZERO));
        Conn { io, watch, preface: 0, timer, armed: None, _slot: slot }
    }

    /// An error once a timer has run out or the port closed the connection.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        self.watch.task.register(cx.waker());
        loop {
            let Ok(next) = self.watch.deadline() else {
                return Err(io::Error::new(io::ErrorKind::ConnectionAborted, "closed by the port"));
            };
            let Some((at, which)) = next else { return Ok(()) };
            if self.armed.is_none_or(|armed| at < armed) {
                self.timer.as_mut().reset(at);
                self.armed = Some(at);
            }
            if self.timer.as_mut().poll(cx).is_pending() {
                return Ok(());
            }
            self.armed = None;
            if Instant::now() >= at {
                metrics::counter!(TIMEOUTS, "timer" => which).increment(1);
                tracing::debug!("gRPC connection closed: {which} timeout");
                return Err(io::Error::new(io::ErrorKind::TimedOut, format!("{which} timeout")));
            }
        }
    }
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        ConnInfo(self.watch.clone())
    }
}

impl AsyncRead for Conn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.check(cx)?;
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if self.preface < PREFACE_BYTES && matches!(r, Poll::Ready(Ok(()))) {
            self.preface += buf.filled().len() - before;
            if self.preface >= PREFACE_BYTES {
                self.watch.spoke();
            }
        }
        r
    }
}

impl AsyncWrite for Conn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
