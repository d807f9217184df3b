//! A gRPC connection's calls run on the connection's own task, as hyper's HTTP/1.1 server runs
//! its request: up to `[grpc] inline_streams` calls at once; a call beyond that gets a task of
//! its own, as hyper's HTTP/2 server gives every stream.
//!
//! Why: hyper's HTTP/2 server hands each stream to its executor, and with tokio's that is a task
//! per call. The call then hops between tasks twice (the connection task decodes the request and
//! wakes the stream's task; the stream's task hands the answer back and wakes the connection
//! task to write it), each hop a wake-up, often of another thread (a futex call and a context
//! switch), where an HTTP/1.1 call has none: one task reads, serves and writes. Here the
//! executor hyper is given queues the stream on the connection's own task instead, which polls
//! it right after the connection: the request's frames are served in the same poll that read
//! them, and the answer's frames are written in the same poll that produced them.
//!
//! Measured (`cargo bench -p sieve-e2e --bench grpc`, ARCHITECTURE.md "gRPC"): on a loaded 2-core
//! machine it takes the proxy's added latency for a gRPC call from +0.06-0.10 ms over HTTP's to
//! parity at p50; on an idle 16-core machine, where a hop is cheap, it changes nothing measurable.
//!
//! A wake-up that comes while the connection's task is being polled (hyper handing over a call,
//! h2 told by a call that its answer is ready, a call's body read releasing flow-control window)
//! is taken as one more round of the same poll, not passed to tokio: a task that wakes itself is
//! put at the back of its thread's queue as a yield, and tokio then unparks an idle thread to
//! steal it (a futex call, a context switch, and the poll moved to the other thread), about once
//! per call. At most `[grpc] poll_rounds` rounds (default 4), then the task yields to tokio as
//! before, so one busy connection cannot hold its thread; 1 yields on every such wake-up.
//!
//! The bound keeps a client that multiplexes many calls on one connection (a gRPC channel does)
//! from putting all of them on one thread: past `inline_streams` calls in progress, a new call is
//! spawned and runs on any thread, as before. A call that ends with its connection (the client
//! went away) is dropped, which cancels its work, as a reset stream does.
//!
//! The connection is polled only when something woke it (its socket, its timers, h2 telling it
//! that a call queued frames), not each time a call is: a proxy's call wakes its task once per
//! shard answer from a worker, and each such wake-up polled hyper's whole HTTP/2 connection
//! (its read, its streams' send queues, its flush) for nothing. h2 is built for streams polled
//! on other tasks than their connection (hyper's default), so every stream operation that needs
//! the connection to act wakes the connection's own waker; a call that ends is followed by a
//! poll of the connection as well.
//!
//! Every call, inline or spawned, is wrapped by its connection's watchdog (`watchdog.rs`): the
//! connection knows whether a call is in progress (its idle timer) and a call whose answer is
//! not taken is reset (the send timer).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::stream::{FuturesUnordered, StreamExt as _};
use futures_util::task::AtomicWaker;

use super::io::Output;
use super::watchdog::{ConnWatch, Tracked};

/// What the executor and the connection's task share.
#[derive(Default)]
struct Queue {
    /// Calls handed over by hyper, not yet polled by the connection's task.
    new: Vec<Tracked>,
    /// Calls on the connection's task: queued or in progress.
    inline: usize,
    /// The connection's task, woken when a call is queued from outside its poll.
    waker: Option<Waker>,
}

/// The executor given to one connection's HTTP/2 server (hyper clones it per connection, so
/// one `StreamExec` serves one connection).
#[derive(Clone)]
pub(super) struct StreamExec {
    queue: Arc<Mutex<Queue>>,
    limit: usize,
    /// The connection's calls, as its watchdog counts and times them.
    watch: Arc<ConnWatch>,
}

impl StreamExec {
    /// An executor that keeps up to `limit` calls on the connection's task (0: none, every call
    /// on its own task), each tracked by `watch`.
    pub(super) fn new(limit: usize, watch: Arc<ConnWatch>) -> Self {
        StreamExec { queue: Arc::default(), limit, watch }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panic while the lock was held left the queue whole (each step is one push or
        // drain): go on with it.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `conn` (the connection's HTTP/2 server) with its inline calls, as one future: the
    /// connection's task. With `out` (its socket's held writes, `io.rs`), what the poll wrote is
    /// sent at the end of each poll.
    /// At most `rounds` rounds a poll (at least 1): see [`Wakes`].
    pub(super) fn drive<C: Future>(self, conn: C, out: Option<Output>, rounds: usize) -> Driven<C> {
        let wake = Arc::new(Wakes { conn: AtomicBool::new(true), ..Wakes::default() });
        let waker = Waker::from(wake.clone());
        let conn_waker = Waker::from(Arc::new(ConnWakes(wake.clone())));
        let rounds = rounds.max(1);
        Driven {
            conn: Box::pin(conn),
            calls: FuturesUnordered::new(),
            exec: self,
            out,
            wake,
            waker,
            conn_waker,
            rounds,
        }
    }
}

impl<F: Future<Output = ()> + Send + 'static> hyper::rt::Executor<F> for StreamExec {
    fn execute(&self, fut: F) {
        let call = self.watch.track(Box::pin(fut));
        let mut q = self.lock();
        if q.inline < self.limit {
            q.inline += 1;
            q.new.push(call);
            // Nearly always called from within the connection's own poll, which looks at the
            // queue again before it returns; the wake covers any other caller.
            if let Some(w) = q.waker.take() {
                w.wake();
            }
        } else {
            drop(q);
            let watch = self.watch.clone();
            tokio::spawn(async move {
                call.await;
                watch.spawned_call_ended();
            });
        }
    }
}

/// The connection's task: its HTTP/2 server and the calls it runs inline. Ends when the
/// connection does (a graceful stop first lets every call finish: the connection waits for
/// its streams, which this keeps polling).
pub(super) struct Driven<C: Future> {
    conn: Pin<Box<C>>,
    calls: FuturesUnordered<Tracked>,
    exec: StreamExec,
    out: Option<Output>,
    /// The waker the calls are polled with ([`Wakes`]), and its state.
    wake: Arc<Wakes>,
    waker: Waker,
    /// The waker the connection is polled with: marks `wake.conn`, then wakes as `waker` does.
    conn_waker: Waker,
    /// The most rounds one poll takes for wake-ups that came during it; past that the task
    /// yields to tokio (which polls it again after other tasks).
    rounds: usize,
}

/// What the connection and its calls wake: during the task's poll, a mark that the poll takes
/// one more round; at any other time (a socket ready, a timer, a call from another thread), the
/// task itself.
#[derive(Default)]
struct Wakes {
    /// The task's poll is running its rounds.
    polling: AtomicBool,
    /// A wake-up came since the round began.
    again: AtomicBool,
    /// The connection was woken (by its socket, a timer, h2 on a call's behalf) since its last
    /// poll began: the next round polls it. Set at the start, so the first poll does.
    conn: AtomicBool,
    /// The task's own waker, from its latest poll.
    task: AtomicWaker,
}

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Mark first, then look: if the poll is still running it sees the mark after its round
        // (it clears `polling` before it reads `again`); if not, the task is woken (at worst
        // once more than needed, never lost).
        self.again.store(true, Ordering::SeqCst);
        if !self.polling.load(Ordering::SeqCst) {
            self.task.wake();
        }
    }
}

/// The connection's waker: a mark that the connection itself has something to do, then the
/// task's wake-up as every other ([`Wakes`]).
struct ConnWakes(Arc<Wakes>);

impl Wake for ConnWakes {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.conn.store(true, Ordering::SeqCst);
        self.0.wake_by_ref();
    }
}

impl<C: Future> Future for Driven<C> {
    type Output = C::Output;

    fn poll(mut self: Pin<&mut Self>, outer: &mut Context<'_>) -> Poll<C::Output> {
        let this = &mut *self;
        this.wake.task.register(outer.waker());
        let (waker, conn_waker) = (this.waker.clone(), this.conn_waker.clone());
        let cx = &mut Context::from_waker(&waker);
        let conn_cx = &mut Context::from_waker(&conn_waker);
        let mut rounds = 0;
        let end = loop {
            this.wake.polling.store(true, Ordering::SeqCst);
            let end = this.round(cx, conn_cx);
            this.wake.polling.store(false, Ordering::SeqCst);
            rounds += 1;
            if end.is_ready() || !this.wake.again.swap(false, Ordering::SeqCst) {
                break end;
            }
            if rounds == this.rounds {
                // Still woken after the last round: tokio polls the task again after the others.
                outer.waker().wake_by_ref();
                break Poll::Pending;
            }
        };
        // Everything the rounds wrote (an answer's three frames) goes out in one write; on a
        // connection that ended, best effort (one that ended well sent everything at its
        // shutdown).
        if let Some(out) = &this.out {
            // The socket's wake-ups and errors are the connection's business.
            out.send(conn_cx);
        }
        end
    }
}

impl<C: Future> Driven<C> {
    /// One round: the new calls started, the calls woken polled with `cx` (the task's
    /// [`Wakes`]), and the connection, if it was woken or a call ended, with `conn_cx`.
    fn round(&mut self, cx: &mut Context<'_>, conn_cx: &mut Context<'_>) -> Poll<C::Output> {
        let this = self;
        loop {
            {
                let mut q = this.exec.lock();
                if !q.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    q.waker = Some(cx.waker().clone());
                }
                this.calls.extend(q.new.drain(..));
            }
            // Every call and the connection are polled below: a wake-up before this point (as
            // hyper's hand-over of a call just drained) needs no further round.
            this.wake.again.store(false, Ordering::SeqCst);
            // The calls first: an answer they produce is written by the connection's poll below,
            // in this same poll.
            let mut finished = 0;
            while let Poll::Ready(Some(())) = this.calls.poll_next_unpin(cx) {
                finished += 1;
            }
            if finished > 0 {
                this.exec.lock().inline -= finished;
            }
            // Cleared before the poll: a wake-up during it is another round's.
            if this.wake.conn.swap(false, Ordering::SeqCst) || finished > 0 {
                if let Poll::Ready(end) = this.conn.as_mut().poll(conn_cx) {
                    return Poll::Ready(end);
                }
            }
            // A call the connection's poll has just handed over starts now, not on a later
            // wake-up.
            if this.exec.lock().new.is_empty() {
                return Poll::Pending;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Executor as _;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::oneshot;

    /// An executor keeping `limit` calls inline, its timers too long to matter here.
    fn exec(limit: usize) -> StreamExec {
        let long = std::time::Duration::from_secs(3600);
        StreamExec::new(limit, ConnWatch::new(super::super::watchdog::Timers { header: long, idle: long, send: long }))
    }

    /// Calls up to the limit run on the driving task (they finish while it is polled, with no
    /// other task to run them); the one past it is spawned; the driven future ends with the
    /// connection's output.
    #[tokio::test(flavor = "current_thread")]
    async fn up_to_the_limit_inline_then_spawned() {
        let exec = exec(2);
        let ran = Arc::new(AtomicUsize::new(0));
        let (release, gate) = oneshot::channel::<()>();
        let (done_tx, done_rx) = oneshot::channel::<()>();
        let conn = {
            let (exec, ran) = (exec.clone(), ran.clone());
            async move {
                let gate = Arc::new(tokio::sync::Mutex::new(Some(gate)));
                for _ in 0..3 {
                    let (ran, gate) = (ran.clone(), gate.clone());
                    exec.execute(async move {
                        // The first call to run takes the gate (the lock is let go before
                        // it waits).
                        let taken = gate.lock().await.take();
                        if let Some(g) = taken {
                            let _ = g.await;
                        }
                        ran.fetch_add(1, Ordering::SeqCst);
                    });
                }
                assert_eq!(exec.lock().inline, 2, "two calls queued inline");
                let _ = done_rx.await;
                "closed"
            }
        };
        let driven = tokio::spawn(exec.clone().drive(conn, None, 4));
        // Let the driven task and the spawned call run: one of the calls waits on the gate.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(ran.load(Ordering::SeqCst), 2, "two calls ran, one waits on the gate");
        release.send(()).unwrap();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(ran.load(Ordering::SeqCst), 3);
        assert_eq!(exec.lock().inline, 0, "finished inline calls are counted out");
        done_tx.send(()).unwrap();
        assert_eq!(driven.await.unwrap(), "closed");
    }

    /// A wake-up during the task's poll is one more round of that poll, not a wake of the task;
    /// one that keeps coming yields to the runtime after the last round; one from outside the
    /// poll wakes the task.
    #[test]
    fn wakes_during_the_poll_are_rounds_of_it() {
        /// A connection that wakes itself on its first `wakes` polls, and keeps its waker.
        struct SelfWaking {
            polls: Arc<AtomicUsize>,
            wakes: usize,
            waker: Arc<Mutex<Option<Waker>>>,
        }
        impl Future for SelfWaking {
            type Output = ();
            fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
                *self.waker.lock().unwrap() = Some(cx.waker().clone());
                if self.polls.fetch_add(1, Ordering::SeqCst) < self.wakes {
                    cx.waker().wake_by_ref();
                }
                Poll::Pending
            }
        }
        struct Count(AtomicUsize);
        impl Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let task = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(task.clone());
        let cx = &mut Context::from_waker(&waker);
        let (polls, kept) = (Arc::new(AtomicUsize::new(0)), Arc::new(Mutex::new(None)));
        let conn = SelfWaking { polls: polls.clone(), wakes: 2, waker: kept.clone() };
        let mut driven = exec(0).drive(conn, None, 4);
        assert!(Pin::new(&mut driven).poll(cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 3, "two wake-ups, two more rounds");
        assert_eq!(task.0.load(Ordering::SeqCst), 0, "the task itself was not woken");
        // From outside a poll (a socket, a timer, another thread): the task is woken.
        kept.lock().unwrap().take().expect("the connection's waker").wake();
        assert_eq!(task.0.load(Ordering::SeqCst), 1);

        let polls = Arc::new(AtomicUsize::new(0));
        let conn = SelfWaking { polls: polls.clone(), wakes: usize::MAX, waker: kept };
        let mut driven = exec(0).drive(conn, None, 4);
        assert!(Pin::new(&mut driven).poll(cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 4, "at most 4 rounds");
        assert_eq!(task.0.load(Ordering::SeqCst), 2, "then the task yields (woken to run again)");

        // One round: every wake-up during the poll is a yield (hyper's own tasks' way).
        let polls = Arc::new(AtomicUsize::new(0));
        let conn = SelfWaking { polls: polls.clone(), wakes: 1, waker: Arc::default() };
        let mut driven = exec(0).drive(conn, None, 1);
        assert!(Pin::new(&mut driven).poll(cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 1);
        assert_eq!(task.0.load(Ordering::SeqCst), 3);
    }

    /// A call's wake-up (a proxy's shard answer) polls that call, not the connection; the
    /// connection's own wake-up polls it; a call that ends is followed by a poll of the
    /// connection (its answer's frames to write).
    #[test]
    fn the_connection_is_polled_when_it_was_woken_or_a_call_ended() {
        /// Pending for ever; counts its polls and keeps its waker.
        struct Counted {
            polls: Arc<AtomicUsize>,
            waker: Arc<Mutex<Option<Waker>>>,
        }
        impl Future for Counted {
            type Output = ();
            fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
                self.polls.fetch_add(1, Ordering::SeqCst);
                *self.waker.lock().unwrap() = Some(cx.waker().clone());
                Poll::Pending
            }
        }
        let noop = Waker::noop();
        let cx = &mut Context::from_waker(noop);
        let (conn_polls, conn_waker) = (Arc::new(AtomicUsize::new(0)), Arc::new(Mutex::new(None)));
        let (call_polls, call_waker) = (Arc::new(AtomicUsize::new(0)), Arc::new(Mutex::new(None)));
        let done = Arc::new(AtomicBool::new(false));
        let exec = exec(4);
        {
            let (polls, waker, done) = (call_polls.clone(), call_waker.clone(), done.clone());
            exec.execute(std::future::poll_fn(move |cx| {
                polls.fetch_add(1, Ordering::SeqCst);
                *waker.lock().unwrap() = Some(cx.waker().clone());
                if done.load(Ordering::SeqCst) {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            }));
        }
        let conn = Counted { polls: conn_polls.clone(), waker: conn_waker.clone() };
        let mut driven = exec.drive(conn, None, 4);
        let polls = |d: &mut Driven<Counted>, cx: &mut Context<'_>| {
            assert!(Pin::new(d).poll(cx).is_pending());
            (call_polls.load(Ordering::SeqCst), conn_polls.load(Ordering::SeqCst))
        };
        assert_eq!(polls(&mut driven, cx), (1, 1), "the first poll starts the call and polls the connection");
        call_waker.lock().unwrap().take().unwrap().wake();
        assert_eq!(polls(&mut driven, cx), (2, 1), "the call's wake-up: the call alone");
        conn_waker.lock().unwrap().take().unwrap().wake();
        assert_eq!(polls(&mut driven, cx), (2, 2), "the connection's wake-up: the connection alone");
        done.store(true, Ordering::SeqCst);
        call_waker.lock().unwrap().take().unwrap().wake();
        assert_eq!(polls(&mut driven, cx), (3, 3), "the call ended: then the connection");
        assert_eq!(exec_inline(&driven), 0);
    }

    fn exec_inline<C: Future>(d: &Driven<C>) -> usize {
        d.exec.lock().inline
    }

    /// A call still running when the connection ends is dropped with it (its work cancelled).
    #[tokio::test(flavor = "current_thread")]
    async fn a_call_ends_with_its_connection() {
        struct Flag(Arc<AtomicUsize>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let exec = exec(4);
        let dropped = Arc::new(AtomicUsize::new(0));
        let conn = {
            let (exec, dropped) = (exec.clone(), dropped.clone());
            async move {
                let flag = Flag(dropped);
                exec.execute(async move {
                    let _flag = flag;
                    std::future::pending::<()>().await;
                });
                tokio::task::yield_now().await;
            }
        };
        exec.drive(conn, None, 4).await;
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
    }
}
