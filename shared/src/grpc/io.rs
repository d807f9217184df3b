//! A gRPC connection's socket as its HTTP/2 server sees it: the bytes written during one poll of
//! the connection's task go out in one write, at the end of that poll (`[grpc]
//! write_buffer_bytes`). Reads are buffered by the caller (`server.rs`: `[grpc]
//! read_buffer_bytes`).
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

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// The connection's socket, given to hyper.
pub(super) struct ConnIo {
    read: OwnedReadHalf,
    out: Output,
}

/// The write side, shared by the socket given to hyper and the connection's task.
#[derive(Clone)]
pub(super) struct Output(Arc<Mutex<Out>>);

struct Out {
    half: OwnedWriteHalf,
    /// Bytes accepted, not yet written; `buf[pos..]` is what is left to write.
    buf: Vec<u8>,
    pos: usize,
    /// Most bytes held before a write must send them first; 0: no holding (each write and
    /// flush goes to the socket as it comes).
    cap: usize,
    /// A failed write's error, for the connection's next read or write.
    error: Option<io::Error>,
}

impl ConnIo {
    /// `stream`, its writes held until the end of the task's poll up to `cap` bytes (0: none),
    /// and the handle the connection's task writes them with.
    pub(super) fn new(stream: TcpStream, cap: usize) -> (Self, Output) {
        let (read, half) = stream.into_split();
        let out = Output(Arc::new(Mutex::new(Out { half, buf: Vec::new(), pos: 0, cap, error: None })));
        (ConnIo { read, out: out.clone() }, out)
    }
}

impl Output {
    fn lock(&self) -> MutexGuard<'_, Out> {
        // Each step under the lock leaves `Out` whole (a panic in one leaves a buffer to send).
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes what is held, called by the connection's task at the end of its poll: `Pending`
    /// when the socket is full (the task is woken when it takes more). An error is kept for the
    /// connection, and the task is woken so that the connection sees it.
    pub(super) fn send(&self, cx: &mut Context<'_>) {
        let mut out = self.lock();
        if let Poll::Ready(Err(e)) = out.poll_send(cx) {
            out.error = Some(e);
            cx.waker().wake_by_ref();
        }
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
        self.buf.clear();
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

impl AsyncRead for ConnIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.out.lock().take_error()?;
        Pin::new(&mut self.read).poll_read(cx, buf)
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
        let (mut io, out) = ConnIo::new(server, 1 << 16);
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
        let (mut io, out) = ConnIo::new(server, 4);
        io.write_all(b"abcd").await.unwrap();
        io.write_all(b"ef").await.unwrap();
        assert_eq!(out.lock().buf, b"ef", "the first four bytes were sent to make room");
        let mut got = [0u8; 4];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"abcd");

        let (server, mut client) = pair().await;
        let (mut io, out) = ConnIo::new(server, 0);
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
        let (mut io, out) = ConnIo::new(server, 1 << 16);
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
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let mut b = [0u8; 1];
        assert!(io.read(&mut b).await.is_err(), "the write's error, not an end of stream");
    }
}
