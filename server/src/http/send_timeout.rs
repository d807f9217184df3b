//! `[http] send_timeout_ms` on the socket: a connection whose answer's bytes make no progress
//! for that long (the client stopped reading, so its receive buffer and our send buffer are
//! full) ends with `io::ErrorKind::TimedOut`.
//!
//! Why here and so: hyper's header and idle timers run only while it waits for a head and the
//! body deadline only while a body is read; nothing bounds a write that never completes, so a
//! client that pipelines requests and never reads held its connection (and its slot of
//! `max_connections`) forever. The socket wrapper sees every write, so it can tell a stalled
//! write (the socket answers `Pending`) from one that progresses, as nginx's `send_timeout`
//! does: the time is counted between two writes that make progress, not over the whole answer,
//! so a slow but reading client is served. The error reaches hyper from its write or flush;
//! hyper then ends the connection (its future resolves with the error), which drops the handler
//! of a request in flight (the cancel path of a hang-up) and frees the connection's slot.
//!
//! A write that completes at once touches no timer: the sleep is created on the first stall of
//! a connection and only re-aimed on later stalls. (tokio's task budget can make a ready socket
//! answer Pending now and then, once a task has done a lot of IO in one poll; that counts as a
//! stall, and the next write's progress disarms it.)

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// A socket whose writes fail with `TimedOut` once they have made no progress for `timeout`.
pub(crate) struct SendTimeout<T> {
    inner: T,
    timeout: Duration,
    /// Made on the connection's first stall, re-aimed on later ones.
    sleep: Option<Pin<Box<Sleep>>>,
    /// The last write stalled and none has progressed since: `sleep` is aimed at its end.
    stalled: bool,
    /// The timeout ran out (counted once; every later write fails as well).
    timed_out: bool,
    /// The counter (label `timer="send"`) a timeout adds to: the port's protocol family
    /// (`metrics_names::http` or `::grpc`).
    metric: sieve_shared::metrics_names::Metric,
}

impl<T> SendTimeout<T> {
    /// `inner`'s writes under `timeout`, counted in `metric` when it runs out.
    pub(crate) fn new(inner: T, timeout: Duration, metric: sieve_shared::metrics_names::Metric) -> Self {
        SendTimeout { inner, timeout, sleep: None, stalled: false, timed_out: false, metric }
    }

    /// What a write-side call returned, with the timer applied: progress disarms it, a stall
    /// arms it (if not armed already) and turns into `TimedOut` once it has run out.
    fn track<R>(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<io::Result<R>>,
        progressed: impl FnOnce(&R) -> bool,
    ) -> Poll<io::Result<R>> {
        match &r {
            Poll::Ready(Ok(v)) => {
                if progressed(v) {
                    self.stalled = false;
                }
                r
            }
            Poll::Ready(Err(_)) => r,
            Poll::Pending => match self.stall(cx) {
                Poll::Ready(e) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    /// The socket cannot take bytes now. Ready with the error once the stall has lasted the
    /// timeout; otherwise the timer's wake-up is registered beside the socket's.
    fn stall(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        if self.timed_out {
            return Poll::Ready(self.error());
        }
        let fresh = !std::mem::replace(&mut self.stalled, true);
        let timeout = self.timeout;
        let mut made = false;
        let sleep = self.sleep.get_or_insert_with(|| {
            made = true;
            Box::pin(tokio::time::sleep(timeout))
        });
        if fresh && !made {
            sleep.as_mut().reset(Instant::now() + timeout);
        }
        if sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.timed_out = true;
        metrics::counter!(self.metric, "timer" => "send").increment(1);
        tracing::debug!(timeout = ?self.timeout, "send timeout: the client took no bytes of the answer; closing the connection");
        Poll::Ready(self.error())
    }

    fn error(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("send timeout: the client took no bytes of the answer for {:?} (send_timeout_ms)", self.timeout),
        )
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for SendTimeout<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for SendTimeout<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.track(cx, r, |&n| n > 0)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.track(cx, r, |&n| n > 0)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        // A flush that completes took everything written before it.
        self.track(cx, r, |_| true)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.track(cx, r, |_| true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn progress_arms_nothing_short_stalls_pass_and_a_long_one_fails_at_the_timeout() {
        let timeout = Duration::from_millis(400);
        let (a, mut peer) = tokio::io::duplex(64);
        let mut w = SendTimeout::new(a, timeout, sieve_shared::metrics_names::http::TIMEOUTS);
        // Every write taken at once (the peer keeps up): no timer made. Unconstrained, so that
        // tokio's task budget does not make a ready pipe answer Pending.
        let mut buf = [0u8; 64];
        tokio::task::unconstrained(async {
            for _ in 0..100 {
                w.write_all(&[1; 32]).await.unwrap();
                peer.read_exact(&mut buf[..32]).await.unwrap();
            }
        })
        .await;
        assert!(w.sleep.is_none(), "a write that completes at once touches no timer");

        // The peer reads 64 bytes every 40 ms: each write waits for it, far less than the
        // timeout each time, longer than the timeout in all.
        let reader = tokio::spawn(async move {
            for _ in 0..15 {
                tokio::time::sleep(Duration::from_millis(40)).await;
                peer.read_exact(&mut buf).await.unwrap();
            }
            peer
        });
        let t0 = Instant::now();
        for _ in 0..15 {
            w.write_all(&[2; 64]).await.expect("a slow but reading peer is served");
        }
        assert!(t0.elapsed() > timeout, "{:?}: not slow enough to prove anything", t0.elapsed());
        assert!(w.sleep.is_some(), "the writes did stall");
        let _peer = reader.await.unwrap();

        // The peer reads no more: the write that fills its buffer fails at the timeout.
        let t0 = Instant::now();
        let e = w.write_all(&[3; 1024]).await.unwrap_err();
        let took = t0.elapsed();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(took >= timeout && took < timeout + Duration::from_secs(3), "failed after {took:?}");
        assert_eq!(w.write(&[4]).await.unwrap_err().kind(), io::ErrorKind::TimedOut, "and stays failed");
    }
}
