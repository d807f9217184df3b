//! A gRPC connection's socket as its HTTP/2 server sees it: the bytes written during one poll of
//! the connection's task go out in one write, at the end of that poll (`[grpc]
//! write_buffer_bytes`), and the socket is read in chunks of up to `[grpc] read_buffer_bytes`
//! (h2 alone asks for ~8 KB at a time: four reads for a 27 KB request).
//!
//! Neither buffer outlives its use: the read buffer is allocated when a read needs it and
//! dropped once h2 has taken its bytes, and a write buffer grown past [`KEEP_WRITE_BYTES`] is
//! dropped once sent, so an idle connection (of the port's `[http] max_connections`) holds at
//! most that much, not a read buffer and a large answer's write buffer each.
//!
//! Why: h2 flushes a unary answer twice. Its writer holds a DATA payload over 256 bytes aside
//! (to send it with a vectored write, uncopied) and can take no other frame until that payload
//! is written, so HEADERS + DATA go out in one `writev` and the trailers (`grpc-status`) in a
//! second one. On loopback each write also runs the receiver's side of TCP and wakes the client,
//! which then reads a half answer and sleeps until the trailers come. An HTTP/1.1 answer is one
//! write. Here a flush only accepts the bytes; the connection's task (`inline.rs`'s `Driven`)
//! writes everything accepted once its connection's poll is over, so one answer is one write.
//!
//! The bytes are never held past the poll that wrote them: the task writes them before it
//! sleeps, and waits for the socket to take them when it is full. A shutdown writes them first.
//! Past `write_buffer_bytes` buffered, a write first sends what is held (backpressure, as the
//! socket's own buffer gives). A write error is kept and returned by the connection's next read
//! or write, so the connection ends as it would have on the socket's own error.
//!
//! For the connection's header timer (`watchdog.rs`) the socket also tells how much of the
//! HTTP/2 preface has arrived. Its writes go through the HTTP ports' send timeout
//! (`http::SendTimeout`): a peer that takes no bytes for `send_timeout_ms` fails the write,
//! and the connection ends on that error.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use super::watchdog::PREFACE_BYTES;
use crate::http::SendTimeout;

/// The most a sent write buffer keeps of its capacity for the next answer; a larger one is
/// dropped (an answer's frames are a few KB: kept, no allocation per answer).
pub(super) const KEEP_WRITE_BYTES: usize = 16 * 1024;

/// The connection's socket, given to hyper.
pub(super) struct ConnIo {
    read: OwnedReadHalf,
    /// Bytes read, not yet taken by h2; `None` when there are none (no memory held).
    held: Option<BytesMut>,
    /// The most read from the socket at once; 0: every read goes to the socket as asked.
    read_cap: usize,
    /// Bytes read so far, counted up to the preface's length (then told to `out`).
    preface: u64,
    out: Output,
}

/// The write side, shared by the socket given to hyper and the connection's task.
#[derive(Clone)]
pub(super) struct Output(Arc<Mutex<Out>>);

struct Out {
    half: SendTimeout<OwnedWriteHalf>,
    /// Bytes accepted, not yet written; `buf[pos..]` is what is left to write.
    buf: Vec<u8>,
    pos: usize,
    /// Most bytes held before a write must send them first; 0: no holding (each write and
    /// flush goes to the socket as it comes).
    cap: usize,
    /// A failed write's error, for the connection's next read or write.
    error: Option<io::Error>,
    /// Bytes of the preface read (up to its length), for the header timer.
    preface: u64,
}

impl ConnIo {
    /// `stream`, read in chunks of up to `read_cap` bytes (0: as asked), its writes held until
    /// the end of the task's poll up to `cap` bytes (0: none) and failed once the socket has
    /// taken nothing for `send_timeout`, and the handle the connection's task writes them with.
    pub(super) fn new(stream: TcpStream, read_cap: usize, cap: usize, send_timeout: Duration) -> (Self, Output) {
        let (read, half) = stream.into_split();
        let half = SendTimeout::new(half, send_timeout, crate::metrics_names::grpc::TIMEOUTS);
        let out = Output(Arc::new(Mutex::new(Out { half, buf: Vec::new(), pos: 0, cap, error: None, preface: 0 })));
        (ConnIo { read, held: None, read_cap, preface: 0, out: out.clone() }, out)
    }
}

impl Output {
    fn lock(&self) -> MutexGuard<'_, Out> {
        // Each step under the lock leaves `Out` whole (a panic in one leaves a buffer to send).
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes what is held, called by the connection's task at the end of its poll: `Pending`
    /// when the socket is full (the task is woken when it takes more, or when its send timeout
    /// runs out). An error is kept for the connection, and the task is woken so that the
    /// connection sees it.
    pub(super) fn send(&self, cx: &mut Context<'_>) {
        let mut out = self.lock();
        if let Poll::Ready(Err(e)) = out.poll_send(cx) {
            out.error = Some(e);
            cx.waker().wake_by_ref();
        }
    }

    /// How much of the preface has arrived (up to its length).
    pub(super) fn preface(&self) -> u64 {
        self.lock().preface
    }
}

impl Out {
    /// Writes `buf[pos..]` to the socket.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.pos < self.buf.len() {
            let n = std::task::ready!(Pin::new(&mut self.half).poll_write(cx, &self.buf[self.pos..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.pos += n;
        }
        if self.buf.capacity() > KEEP_WRITE_BYTES {
            self.buf = Vec::new();
        } else {
            self.buf.clear();
        }
        self.pos = 0;
        Poll::Ready(Ok(()))
    }

    fn take_error(&mut self) -> io::Result<()> {
        match self.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Room to hold more: what is held sent first when it has reached the cap.
    fn poll_room(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.take_error()?;
        if self.buf.len() >= self.cap {
            std::task::ready!(self.poll_send(cx))?;
        }
        Poll::Ready(Ok(()))
    }
}

impl ConnIo {
    /// `n` more bytes read: counted toward the preface until it is whole (one lock per read
    /// until then, none after).
    fn count_preface(&mut self, n: usize) {
        if self.preface < PREFACE_BYTES && n > 0 {
            self.preface = self.preface.saturating_add(u64::try_from(n).unwrap_or(u64::MAX)).min(PREFACE_BYTES);
            self.out.lock().preface = self.preface;
        }
    }
}

impl AsyncRead for ConnIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.out.lock().take_error()?;
        let this = &mut *self;
        if this.held.is_none() {
            if this.read_cap == 0 || buf.remaining() >= this.read_cap {
                let before = buf.filled().len();
                std::task::ready!(Pin::new(&mut this.read).poll_read(cx, buf))?;
                this.count_preface(buf.filled().len() - before);
                return Poll::Ready(Ok(()));
            }
            let mut fresh = BytesMut::with_capacity(this.read_cap);
            if std::task::ready!(tokio_util::io::poll_read_buf(Pin::new(&mut this.read), cx, &mut fresh))? == 0 {
                return Poll::Ready(Ok(())); // end of stream: nothing read
            }
            this.count_preface(fresh.len());
            this.held = Some(fresh);
        }
        if let Some(held) = &mut this.held {
            let n = held.len().min(buf.remaining());
            buf.put_slice(&held[..n]);
            held.advance(n);
            if held.is_empty() {
                this.held = None;
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for ConnIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let mut out = self.out.lock();
        if out.cap == 0 {
            out.take_error()?;
            return Pin::new(&mut out.half).poll_write(cx, data);
        }
        std::task::ready!(out.poll_room(cx))?;
        out.buf.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let mut out = self.out.lock();
        if out.cap == 0 {
            out.take_error()?;
            return Pin::new(&mut out.half).poll_write_vectored(cx, bufs);
        }
        std::task::ready!(out.poll_room(cx))?;
        let mut n = 0;
        for b in bufs {
            out.buf.extend_from_slice(b);
            n += b.len();
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        // h2 then hands large DATA payloads over as they are (one copy here, none in h2).
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut out = self.out.lock();
        if out.cap == 0 {
            out.take_error()?;
            return Pin::new(&mut out.half).poll_flush(cx);
        }
        // Accepted: the connection's task writes it before it sleeps (`Output::send`).
        Poll::Ready(out.take_error())
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut out = self.out.lock();
        out.take_error()?;
        std::task::ready!(out.poll_send(cx))?;
        Pin::new(&mut out.half).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        (l.accept().await.unwrap().0, c)
    }

    /// Flushed writes stay held until the task sends them, then arrive in order as one write;
    /// a shutdown sends what is held before the end of the stream.
    #[tokio::test]
    async fn held_until_sent_then_in_order() {
        let (server, mut client) = pair().await;
        let (mut io, out) = ConnIo::new(server, 1 << 16, 1 << 16, Duration::from_secs(3600));
        io.write_all(b"head ").await.unwrap();
        let n = io.write_vectored(&[IoSlice::new(b"data "), IoSlice::new(b"more ")]).await.unwrap();
        assert_eq!(n, 10, "every slice taken whole");
        io.flush().await.unwrap();
        assert_eq!(out.lock().buf, b"head data more ", "held, not yet written");
        std::future::poll_fn(|cx| {
            out.send(cx);
            Poll::Ready(())
        })
        .await;
        assert!(out.lock().buf.is_empty(), "sent");
        io.write_all(b"trailers").await.unwrap();
        io.shutdown().await.unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"head data more trailers");
    }

    /// Past the cap a write sends what is held first; with cap 0 every write goes straight out.
    #[tokio::test]
    async fn the_cap_sends_first_and_zero_holds_nothing() {
        let (server, mut client) = pair().await;
        let (mut io, out) = ConnIo::new(server, 1 << 16, 4, Duration::from_secs(3600));
        io.write_all(b"abcd").await.unwrap();
        io.write_all(b"ef").await.unwrap();
        assert_eq!(out.lock().buf, b"ef", "the first four bytes were sent to make room");
        let mut got = [0u8; 4];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"abcd");

        let (server, mut client) = pair().await;
        let (mut io, out) = ConnIo::new(server, 1 << 16, 0, Duration::from_secs(3600));
        io.write_all(b"xyz").await.unwrap();
        assert!(out.lock().buf.is_empty());
        let mut got = [0u8; 3];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"xyz");
    }

    /// A failed write (the peer gone) is the connection's error: its next read returns it
    /// rather than the end of the stream.
    #[tokio::test]
    async fn a_write_error_reaches_the_next_read() {
        let (server, client) = pair().await;
        let (mut io, out) = ConnIo::new(server, 1 << 16, 1 << 16, Duration::from_secs(3600));
        drop(client);
        // The first write after the peer closed is taken (and answered with a reset); a later
        // one fails.
        for _ in 0..50 {
            io.write_all(b"frame").await.unwrap_or(());
            std::future::poll_fn(|cx| {
                out.send(cx);
                Poll::Ready(())
            })
            .await;
            if out.lock().error.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut b = [0u8; 1];
        assert!(io.read(&mut b).await.is_err(), "the write's error, not an end of stream");
    }

    /// Reads come in chunks of the read cap whatever h2 asks for, arrive whole and in order, and
    /// the buffer is given back once they are taken (an idle connection holds none); a large
    /// answer's write buffer is not kept either.
    #[tokio::test]
    async fn buffers_are_held_only_while_in_use() {
        let (server, mut client) = pair().await;
        let (mut io, out) = ConnIo::new(server, 1 << 16, 1 << 16, Duration::from_secs(3600));
        let sent: Vec<u8> = (0..27_000u32).map(|i| (i % 251) as u8).collect();
        client.write_all(&sent).await.unwrap();
        let mut got = Vec::new();
        let mut chunk = [0u8; 8 * 1024];
        while got.len() < sent.len() {
            let n = io.read(&mut chunk).await.unwrap();
            assert!(n > 0, "no end of stream before the bytes sent");
            got.extend_from_slice(&chunk[..n]);
            if got.len() < sent.len() {
                assert!(io.held.is_some(), "the rest of the first read is held");
            }
        }
        assert_eq!(got, sent);
        assert!(io.held.is_none(), "all taken: nothing held");

        io.write_all(&vec![7u8; 40 * 1024]).await.unwrap();
        std::future::poll_fn(|cx| {
            out.send(cx);
            Poll::Ready(())
        })
        .await;
        assert_eq!(out.lock().buf.capacity(), 0, "a large answer's buffer is dropped once sent");
        io.write_all(b"small").await.unwrap();
        std::future::poll_fn(|cx| {
            out.send(cx);
            Poll::Ready(())
        })
        .await;
        assert!(out.lock().buf.capacity() > 0, "a small one's is kept for the next answer");
        let mut rest = vec![0u8; 40 * 1024 + 5];
        client.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest[40 * 1024..], b"small");
        drop((io, out));
        let mut end = Vec::new();
        client.read_to_end(&mut end).await.unwrap();
        assert!(end.is_empty());
    }
}
