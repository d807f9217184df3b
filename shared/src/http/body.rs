//! Reading a request body into ONE contiguous buffer, bounded in size and in time.
//!
//! Collecting hyper's frames (`http_body_util::Collected`) keeps every frame as its own slice of
//! hyper's read buffer, so a body trickled one byte at a time pins a whole buffer per byte
//! (~3.5 KB each, measured). Here each frame is copied into one `Vec` and dropped at once:
//! memory per request is at most its declared Content-Length (or `max`) plus a constant.
//!
//! The buffer grows with the bytes that actually arrive (doubling, never past the declared
//! length or `max`) instead of reserving the declared length up front: a client that declares
//! 16 MiB and sends nothing costs nothing, so thousands of such connections cannot claim memory
//! they never fill.
//!
//! The whole body must arrive before the [`BodyDeadline`] that `serve` puts into every request's
//! extensions (`[http] body_read_timeout_ms` after its head): a Content-Length larger than what
//! is sent, or a chunked body that never ends, is answered 408 then, not held for ever. (A
//! tower-http `RequestBodyTimeoutLayer` would not do: its timeout restarts at every frame, so a
//! byte every few seconds keeps it alive for ever; and it would change the body type handlers
//! receive.)

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Incoming};
use hyper::header::CONTENT_LENGTH;
use hyper::Request;
use tokio::time::Instant;

use crate::{ApiError, ErrorKind};

/// When the body of a request must have arrived in full; `serve` inserts it into every
/// request's extensions when the head is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyDeadline(pub Instant);

/// The first allocation for a body of unknown or large size; it doubles from there as bytes come.
const INITIAL_CAPACITY: usize = 16 << 10;

/// Reads a request body of at most `max` bytes: 413 when the declared length or the bytes
/// actually sent go over, 408 when it is not all in by the request's [`BodyDeadline`].
pub async fn read_body(req: Request<Incoming>, max: usize) -> Result<Bytes, ApiError> {
    let declared = req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    let deadline = req.extensions().get::<BodyDeadline>().copied();
    collect(req.into_body(), declared, max, deadline).await.map(Bytes::from)
}

/// The body's bytes in one `Vec` whose capacity never exceeds `declared` (or `max`) by more
/// than a constant. Generic so tests can feed it frames of any size.
pub async fn collect<B>(
    body: B,
    declared: Option<u64>,
    max: usize,
    deadline: Option<BodyDeadline>,
) -> Result<Vec<u8>, ApiError>
where
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    if let Some(len) = declared {
        if len > max as u64 {
            return Err(ApiError::too_large(format!("request body of {len} bytes > max_body_bytes {max}")));
        }
    }
    // Never more than the body may hold: the declared length, else the maximum.
    let limit = declared.map_or(max, |l| l as usize);
    let read = async {
        let mut body = std::pin::pin!(body);
        let mut buf: Vec<u8> = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| ApiError::malformed(format!("reading the request body: {e}")))?;
            let Ok(data) = frame.into_data() else { continue };
            let need = buf.len() + data.len();
            if need > max {
                return Err(ApiError::too_large(format!("request body > max_body_bytes {max}")));
            }
            if need > buf.capacity() {
                // Double, as a Vec would, but never past what the body may hold.
                let target = need.max(buf.capacity() * 2).max(INITIAL_CAPACITY.min(limit)).min(limit.max(need));
                buf.reserve_exact(target - buf.len());
            }
            buf.extend_from_slice(&data);
        }
        Ok(buf)
    };
    match deadline {
        None => read.await,
        Some(BodyDeadline(at)) => match tokio::time::timeout_at(at, read).await {
            Ok(r) => r,
            Err(_) => Err(ApiError::new(
                ErrorKind::RequestTimeout,
                "the request body did not arrive within body_read_timeout_ms",
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::convert::Infallible;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use hyper::body::Frame;

    use super::*;

    /// A body that yields the given frames, then ends (or, `stall`, never ends).
    struct Frames {
        frames: VecDeque<Bytes>,
        stall: bool,
    }

    impl Frames {
        fn trickle(bytes: usize, per_frame: usize, stall: bool) -> Self {
            let frames = (0..bytes.div_ceil(per_frame))
                .map(|i| Bytes::from(vec![i as u8; per_frame.min(bytes - i * per_frame)]))
                .collect();
            Frames { frames, stall }
        }
    }

    impl Body for Frames {
        type Data = Bytes;
        type Error = Infallible;
        fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            match self.frames.pop_front() {
                Some(b) => Poll::Ready(Some(Ok(Frame::data(b)))),
                None if self.stall => Poll::Pending,
                None => Poll::Ready(None),
            }
        }
    }

    #[tokio::test]
    async fn a_trickled_body_is_one_buffer_no_larger_than_its_length() {
        // 40 KB one byte per frame (the trickle), declared and chunked.
        let n = 40_000;
        let v = collect(Frames::trickle(n, 1, false), Some(n as u64), 1 << 24, None).await.unwrap();
        assert_eq!(v.len(), n);
        assert_eq!(v.capacity(), n, "declared length: the buffer never exceeds it");
        let v = collect(Frames::trickle(n, 1, false), None, 1 << 24, None).await.unwrap();
        assert_eq!(v.len(), n);
        assert!(v.capacity() <= 2 * n + INITIAL_CAPACITY, "chunked: capacity {} for {n} bytes", v.capacity());
        // Large frames: still one buffer, capacity = length.
        let v = collect(Frames::trickle(1 << 20, 65_536, false), Some(1 << 20), 1 << 24, None).await.unwrap();
        assert_eq!((v.len(), v.capacity()), (1 << 20, 1 << 20));
        assert!(v.iter().take(65_536).all(|&b| b == 0) && v[65_536] == 1, "frames kept in order");
    }

    #[tokio::test]
    async fn a_declared_length_reserves_nothing_before_bytes_come() {
        // A client declaring 16 MiB and sending 10 bytes holds a small buffer, not 16 MiB.
        let v = collect(Frames::trickle(10, 10, false), Some(16 << 20), 16 << 20, None).await.unwrap();
        assert!(v.capacity() <= INITIAL_CAPACITY, "{}", v.capacity());
    }

    #[tokio::test]
    async fn over_the_limit_is_413_declared_or_sent() {
        let e = collect(Frames::trickle(10, 10, false), Some(1000), 100, None).await.unwrap_err();
        assert_eq!(e.status(), 413);
        assert!(e.message.contains("1000 bytes"), "{}", e.message);
        let e = collect(Frames::trickle(1000, 7, false), None, 100, None).await.unwrap_err();
        assert_eq!(e.status(), 413);
    }

    #[tokio::test]
    async fn a_body_that_never_ends_is_408_at_its_deadline() {
        let t0 = Instant::now();
        let deadline = BodyDeadline(t0 + Duration::from_millis(100));
        let e = collect(Frames::trickle(3, 1, true), Some(100), 1000, Some(deadline)).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::RequestTimeout);
        assert!(t0.elapsed() >= Duration::from_millis(100));
        assert!(t0.elapsed() < Duration::from_secs(5), "ended at the deadline, not later");
    }
}
