//! The socket as hyper sees it: reads are reported to the connection's [`Activity`] (for the
//! head and idle timers), and the error responses hyper writes on its own become the project's
//! JSON errors.
//!
//! hyper answers a request head it cannot parse (bad request line or header: 400; head over
//! the buffer or too many headers: 431; target too long: 414) by itself, with an empty body,
//! before any service sees a request, and offers no hook to change that answer. What it writes
//! is recognisable: a bare status head (`connection: close`, `content-length: 0`, `date`) with one of those
//! three codes, always the last thing hyper writes on the connection, and never something our
//! handlers produce (every error of ours carries a JSON body). When such a head is written,
//! this wrapper writes the JSON error with the same status instead (and `connection: close`,
//! which hyper does anyway after a parse error). Anything before it in the same write (a
//! pipelined earlier response) goes out unchanged first.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::timer::Activity;
use crate::{ApiError, ErrorKind};

pub(crate) struct ConnIo<T> {
    inner: T,
    activity: Arc<Activity>,
    /// For the 431 message.
    max_header_bytes: usize,
    /// A replacement response still to be written, and how much of it was.
    pending: Option<(Vec<u8>, usize)>,
}

impl<T> ConnIo<T> {
    pub(crate) fn new(inner: T, activity: Arc<Activity>, max_header_bytes: usize) -> Self {
        ConnIo { inner, activity, max_header_bytes, pending: None }
    }
}

impl<T: AsyncWrite + Unpin> ConnIo<T> {
    fn write_inner(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        ready!(self.poll_pending(cx))?;
        match hyper_error_head(buf) {
            Some((0, status)) => self.replace(cx, status, buf.len()),
            Some((start, _)) => Pin::new(&mut self.inner).poll_write(cx, &buf[..start]),
            None => Pin::new(&mut self.inner).poll_write(cx, buf),
        }
    }

    fn write_vectored_inner(&mut self, cx: &mut Context<'_>, bufs: &[IoSlice<'_>]) -> Poll<io::Result<usize>> {
        ready!(self.poll_pending(cx))?;
        // hyper encodes a head into one buffer, so its error head is the end of the last slice.
        let Some(last) = bufs.iter().rposition(|b| !b.is_empty()) else {
            return Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        };
        match hyper_error_head(&bufs[last]) {
            None => Pin::new(&mut self.inner).poll_write_vectored(cx, bufs),
            Some((0, status)) if bufs[..last].iter().all(|b| b.is_empty()) => {
                self.replace(cx, status, bufs[last].len())
            }
            Some((start, _)) => {
                // Write what comes before it; hyper calls again with the head alone.
                let mut before: Vec<IoSlice<'_>> = bufs[..last].to_vec();
                before.push(IoSlice::new(&bufs[last][..start]));
                Pin::new(&mut self.inner).poll_write_vectored(cx, &before)
            }
        }
    }

    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((buf, at)) = &mut self.pending {
            if *at == buf.len() {
                self.pending = None;
                break;
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &buf[*at..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *at += n;
        }
        Poll::Ready(Ok(()))
    }

    /// Takes hyper's own error head (all of `len` bytes) and queues the JSON one instead.
    fn replace(&mut self, cx: &mut Context<'_>, status: u16, len: usize) -> Poll<io::Result<usize>> {
        self.pending = Some((json_error_response(status, self.max_header_bytes), 0));
        // Start at once: hyper ends the connection right after flushing this head.
        if let Poll::Ready(Err(e)) = self.poll_pending(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(len))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ConnIo<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.on_read();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ConnIo<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = self.write_inner(cx, buf);
        // A write that waits for the client: the connection is not idle (`Activity::idle_for`).
        self.activity.set_writing(r.is_pending());
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = self.write_vectored_inner(cx, bufs);
        self.activity.set_writing(r.is_pending());
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Where in `buf` a response head hyper generated for a parse error starts (it always ends
/// `buf`), and its status.
fn hyper_error_head(buf: &[u8]) -> Option<(usize, u16)> {
    if !buf.ends_with(b"\r\n\r\n") {
        return None;
    }
    // The head is ~80 bytes; look no further back than that could be.
    let from = buf.len().saturating_sub(256);
    let start = from + buf[from..].windows(9).rposition(|w| w == b"HTTP/1.1 ")?;
    let mut headers = [httparse::EMPTY_HEADER; 4];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(&buf[start..]) {
        Ok(httparse::Status::Complete(n)) if start + n == buf.len() => {}
        _ => return None,
    }
    let status = resp.code.filter(|c| matches!(c, 400 | 414 | 431))?;
    let mut has_length = false;
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") && h.value == b"0" {
            has_length = true;
        } else if !(h.name.eq_ignore_ascii_case("date")
            || h.name.eq_ignore_ascii_case("connection") && h.value.eq_ignore_ascii_case(b"close"))
        {
            return None;
        }
    }
    has_length.then_some((start, status))
}

fn json_error_response(status: u16, max_header_bytes: usize) -> Vec<u8> {
    let e = match status {
        431 => ApiError::new(
            ErrorKind::HeadersTooLarge,
            format!("request head too large: over max_header_bytes ({max_header_bytes} bytes) or over 100 headers"),
        ),
        414 => ApiError::new(ErrorKind::UriTooLong, "request target too long"),
        _ => ApiError::malformed("malformed request head: the request line or a header is not valid HTTP/1.1"),
    };
    let body = e.to_json();
    let reason = hyper::StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()).unwrap_or("Error");
    format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_only_hypers_bare_error_heads() {
        // As hyper 1.x writes it.
        let head = b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\ndate: Tue, 24 Nov 2026 04:37:44 GMT\r\n\r\n";
        assert_eq!(hyper_error_head(head), Some((0, 400)));
        let mut glued = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}".to_vec();
        let at = glued.len();
        glued.extend_from_slice(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n");
        assert_eq!(hyper_error_head(&glued), Some((at, 431)));
        // Our own errors carry a body, other statuses and other headers are not hyper's.
        assert_eq!(
            hyper_error_head(
                b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n"
            ),
            None
        );
        assert_eq!(hyper_error_head(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"), None);
        assert_eq!(
            hyper_error_head(b"HTTP/1.1 400 Bad Request\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n"),
            None
        );
        assert_eq!(hyper_error_head(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\n\r\n"), None);
        assert_eq!(hyper_error_head(b"{\"a\": 1}"), None);
        let r = String::from_utf8(json_error_response(431, 65536)).unwrap();
        assert!(r.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"), "{r}");
        assert!(r.ends_with(r#""code":431,"message":"request head too large: over max_header_bytes (65536 bytes) or over 100 headers"}}"#), "{r}");
    }
}
