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
//! The bound keeps a client that multiplexes many calls on one connection (a gRPC channel does)
//! from putting all of them on one thread: past `inline_streams` calls in progress, a new call is
//! spawned and runs on any thread, as before. A call that ends with its connection (the client
//! went away) is dropped, which cancels its work, as a reset stream does.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use futures_util::stream::{FuturesUnordered, StreamExt as _};

use super::io::Output;

type Call = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What the executor and the connection's task share.
#[derive(Default)]
struct Queue {
    /// Calls handed over by hyper, not yet polled by the connection's task.
    new: Vec<Call>,
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
}

impl StreamExec {
    /// An executor that keeps up to `limit` calls on the connection's task (0: none, every call
    /// on its own task).
    pub(super) fn new(limit: usize) -> Self {
        StreamExec { queue: Arc::default(), limit }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panic while the lock was held left the queue whole (each step is one push or
        // drain): go on with it.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `conn` (the connection's HTTP/2 server) with its inline calls, as one future: the
    /// connection's task. With `out` (its socket's held writes, `io.rs`), what the poll wrote is
    /// sent at the end of each poll.
    pub(super) fn drive<C: Future>(self, conn: C, out: Option<Output>) -> Driven<C> {
        Driven { conn: Box::pin(conn), calls: FuturesUnordered::new(), exec: self, out }
    }
}

impl<F: Future<Output = ()> + Send + 'static> hyper::rt::Executor<F> for StreamExec {
    fn execute(&self, fut: F) {
        let mut q = self.lock();
        if q.inline < self.limit {
            q.inline += 1;
            q.new.push(Box::pin(fut));
            // Nearly always called from within the connection's own poll, which looks at the
            // queue again before it returns; the wake covers any other caller.
            if let Some(w) = q.waker.take() {
                w.wake();
            }
        } else {
            drop(q);
            tokio::spawn(fut);
        }
    }
}

/// The connection's task: its HTTP/2 server and the calls it runs inline. Ends when the
/// connection does (a graceful stop first lets every call finish: the connection waits for
/// its streams, which this keeps polling).
pub(super) struct Driven<C: Future> {
    conn: Pin<Box<C>>,
    calls: FuturesUnordered<Call>,
    exec: StreamExec,
    out: Option<Output>,
}

impl<C: Future> Future for Driven<C> {
    type Output = C::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        let this = &mut *self;
        loop {
            {
                let mut q = this.exec.lock();
                if !q.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    q.waker = Some(cx.waker().clone());
                }
                this.calls.extend(q.new.drain(..));
            }
            // The calls first: an answer they produce is written by the connection's poll below,
            // in this same poll.
            let mut finished = 0;
            while let Poll::Ready(Some(())) = this.calls.poll_next_unpin(cx) {
                finished += 1;
            }
            if finished > 0 {
                this.exec.lock().inline -= finished;
            }
            if let Poll::Ready(end) = this.conn.as_mut().poll(cx) {
                // Best effort: a connection that ended well has sent everything at its shutdown.
                if let Some(out) = &this.out {
                    out.send(cx);
                }
                return Poll::Ready(end);
            }
            // A call the connection's poll has just handed over starts now, not on a later
            // wake-up.
            if this.exec.lock().new.is_empty() {
                // Everything this poll wrote (an answer's three frames) goes out in one write.
                if let Some(out) = &this.out {
                    out.send(cx);
                }
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

    /// Calls up to the limit run on the driving task (they finish while it is polled, with no
    /// other task to run them); the one past it is spawned; the driven future ends with the
    /// connection's output.
    #[tokio::test(flavor = "current_thread")]
    async fn up_to_the_limit_inline_then_spawned() {
        let exec = StreamExec::new(2);
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
        let driven = tokio::spawn(exec.clone().drive(conn, None));
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

    /// A call still running when the connection ends is dropped with it (its work cancelled).
    #[tokio::test(flavor = "current_thread")]
    async fn a_call_ends_with_its_connection() {
        struct Flag(Arc<AtomicUsize>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let exec = StreamExec::new(4);
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
        exec.drive(conn, None).await;
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
    }
}
