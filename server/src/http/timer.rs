//! hyper's header-read timer, made to tell a slow head from an idle keep-alive connection.
//!
//! hyper (1.x) arms its `header_read_timeout` whenever it starts waiting for a request head,
//! including while a keep-alive connection merely waits for its next request. With hyper-util's
//! `TokioTimer` as is, an idle connection would therefore be closed at the header timeout, and
//! `idle_timeout_ms` could never be longer. This timer is `TokioTimer` with a per-connection
//! view of what the socket did: the sleep hyper arms for a head ends
//!
//! - `header_read_timeout` after the head's first byte arrived (a head trickled or half sent),
//! - `header_read_timeout` after the accept on a new connection that sent nothing yet,
//! - `idle_timeout` after the previous response on a keep-alive connection that sent nothing.
//!
//! hyper then closes the connection as it does at any header timeout. No request is in
//! progress in any of these cases: while a handler runs hyper waits on it, not on a head.

use super::serve::Idle;
use sieve_shared::sync::lock;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::rt::{Sleep, Timer};
use hyper_util::rt::TokioTimer;

/// What one connection's socket and service did, as far as the timers need to know.
#[derive(Debug, Default)]
pub(crate) struct Activity {
    state: Mutex<State>,
    /// The last write waited for the client to read (an atomic: set at every write).
    writing: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    /// A request was dispatched and its handler has not returned yet.
    in_request: bool,
    /// When the connection last had nothing in progress: its accept or its last answer.
    idle_since: Option<Instant>,
    /// Requests dispatched on this connection.
    served: u64,
    /// When the first byte of the next head arrived (none yet: the connection is idle).
    head_started: Option<Instant>,
}

impl Activity {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// The connection is served from now (until then it is not idle: it waits for a slot).
    pub(crate) fn accepted(&self) {
        self.state().idle_since = Some(Instant::now());
    }

    /// A write to the socket waits for the client (`true`), or went through.
    pub(crate) fn set_writing(&self, waits: bool) {
        self.writing.store(waits, Ordering::Relaxed);
    }

    /// The socket gave bytes. Outside a request they are the next head's.
    pub(crate) fn on_read(&self) {
        let mut s = self.state();
        if !s.in_request && s.head_started.is_none() {
            s.head_started = Some(Instant::now());
        }
    }

    /// A head was parsed and handed to the service; the guard marks the handler running.
    pub(crate) fn begin_request(self: &Arc<Self>) -> RequestGuard {
        let mut s = self.state();
        s.in_request = true;
        s.served += 1;
        s.head_started = None;
        RequestGuard(self.clone())
    }

    /// When a head wait armed at `armed` must end.
    fn head_deadline(&self, armed: Instant, header: Duration, idle: Duration) -> Instant {
        let s = self.state();
        match s.head_started {
            // Bytes that came before hyper started waiting (pipelined) count from the wait.
            Some(t) => t.max(armed) + header,
            None if s.served == 0 => armed + header,
            None => armed + idle,
        }
    }
}

impl Idle for Activity {
    /// How long the connection has had no request in progress, no head arriving and no answer
    /// waiting for the client; `None` while it has one.
    fn idle_for(&self, now: Instant) -> Option<Duration> {
        if self.writing.load(Ordering::Relaxed) {
            return None;
        }
        let s = self.state();
        match (s.in_request, s.head_started, s.idle_since) {
            (false, None, Some(t)) => Some(now.saturating_duration_since(t)),
            _ => None,
        }
    }
}

/// Held while a handler runs.
pub(crate) struct RequestGuard(Arc<Activity>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let mut s = self.0.state();
        s.in_request = false;
        s.idle_since = Some(Instant::now());
    }
}

/// The timer given to hyper's http1 builder for one connection (see the module doc).
#[derive(Clone)]
pub(crate) struct HeadTimer {
    pub(crate) activity: Arc<Activity>,
    pub(crate) header: Duration,
    pub(crate) idle: Duration,
}

impl Timer for HeadTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Sleep>> {
        self.sleep_until(Instant::now() + duration)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Sleep>> {
        // hyper asks for `now + header_read_timeout`: the wait started now.
        let armed = deadline.checked_sub(self.header).unwrap_or_else(Instant::now);
        let target = self.activity.head_deadline(armed, self.header, self.idle);
        Box::pin(HeadSleep { inner: TokioTimer::new().sleep_until(target), target, armed, timer: self.clone() })
    }
}

/// hyper's head-wait sleep: re-aims itself whenever hyper polls it (after every read).
struct HeadSleep {
    inner: Pin<Box<dyn Sleep>>,
    target: Instant,
    armed: Instant,
    timer: HeadTimer,
}

impl Future for HeadSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let t = &this.timer;
        let target = t.activity.head_deadline(this.armed, t.header, t.idle);
        if target != this.target {
            this.target = target;
            TokioTimer::new().reset(&mut this.inner, target);
        }
        this.inner.as_mut().poll(cx)
    }
}

impl Sleep for HeadSleep {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_wait_ends_by_what_the_connection_did() {
        let a = Arc::new(Activity::default());
        let (h, i) = (Duration::from_secs(10), Duration::from_secs(60));
        let t0 = Instant::now();
        assert_eq!(a.head_deadline(t0, h, i), t0 + h, "new connection, nothing sent: the header timeout");
        let g = a.begin_request();
        a.on_read();
        assert_eq!(a.head_deadline(t0, h, i), t0 + i, "body bytes during a request are not a head");
        drop(g);
        assert_eq!(a.head_deadline(t0, h, i), t0 + i, "after a response, nothing sent: the idle timeout");
        a.on_read();
        let d = a.head_deadline(t0, h, i);
        assert!(
            d >= t0 + h && d < t0 + h + Duration::from_secs(5),
            "a head started: the header timeout from its first byte"
        );
        assert_eq!(a.idle_for(Instant::now()), None, "a head arriving is not idle");
        let a = Arc::new(Activity::default());
        assert_eq!(a.idle_for(Instant::now()), None, "waiting for a slot: not idle");
        a.accepted();
        assert!(a.idle_for(Instant::now()).is_some(), "accepted, nothing sent: idle");
        let g = a.begin_request();
        assert_eq!(a.idle_for(Instant::now()), None, "a request in progress is not idle");
        drop(g);
        let later = Instant::now() + Duration::from_secs(1);
        assert!(a.idle_for(later) >= Some(Duration::from_secs(1)), "answered: idle since the answer");
        a.set_writing(true);
        assert_eq!(a.idle_for(later), None, "an answer that waits for the client to read it");
    }
}
