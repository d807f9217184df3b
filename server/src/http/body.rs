//! Reading a request body into ONE contiguous buffer, bounded in size and in time.
//!
//! Collecting hyper's frames (`http_body_util::Collected`) keeps every frame as its own slice of
//! hyper's read buffer, so a body trickled one byte at a time pins a whole buffer per byte.
//! Here each frame is copied into one buffer and dropped at once (a
//! `Vec`, or from 256 KiB on a mapping of its own that is unmapped on drop: `body_buf.rs`):
//! memory per request is at most its declared Content-Length (or `max`) plus a constant.
//!
//! The buffer grows with the bytes that actually arrive (doubling, never past the declared
//! length or `max`) instead of reserving the declared length up front: a client that declares
//! 16 MiB and sends nothing costs nothing, so thousands of such connections cannot claim memory
//! they never fill.
//!
//! A body that arrives as one frame of its declared length (the usual case on a warm
//! keep-alive connection: hyper's read buffer grows to `max_buf_size` and a body that fits comes
//! in with its head) is kept as that frame, a slice of hyper's read buffer, with no copy: it pins
//! that one buffer, of at most `max_buf_size`, for as long as the request holds its body.
//!
//! Bytes held count against the process's [`ByteBudget`](super::ByteBudget) when the caller
//! gives a [`Reservation`] ([`read_body_reserved`]): it grows with the buffer (the frame kept
//! whole, or the `Vec`'s capacity) as bytes arrive, so a declared length that is never sent
//! still costs nothing; a growth the budget cannot cover ends the read at once with 503. The
//! caller keeps the reservation while it holds the body (the API holds it until its answer).
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
use sieve_shared::{ApiError, ErrorKind};
use tokio::time::Instant;

use super::body_buf::BodyBuf;
use super::budget::Reservation;

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
    collect(req.into_body(), declared, max, deadline, None).await
}

/// [`read_body`] with the bytes held counted in `held` as they arrive: 503 (and the read ended)
/// when the budget cannot cover the next ones. The body's bytes stay counted until `held` is
/// dropped, on every path.
pub async fn read_body_reserved(req: Request<Incoming>, max: usize, held: &mut Reservation) -> Result<Bytes, ApiError> {
    let declared = req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    let deadline = req.extensions().get::<BodyDeadline>().copied();
    collect(req.into_body(), declared, max, deadline, Some(held)).await
}

/// The body's bytes in one buffer: its only frame when it came as one frame of its declared
/// length, else a `Vec` whose capacity never exceeds `declared` (or `max`) by more than a
/// constant; counted in `held` when given. Generic so tests can feed it frames of any size.
pub async fn collect<B>(
    body: B,
    declared: Option<u64>,
    max: usize,
    deadline: Option<BodyDeadline>,
    mut held: Option<&mut Reservation>,
) -> Result<Bytes, ApiError>
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
    // Large bodies' mappings are the budget's process-wide pool's (`body_buf.rs`).
    let pool = held.as_deref().map(|r| r.budget().map_pool());
    // What the buffer is about to hold, counted before it is taken; 503 when it does not fit.
    let mut reserve = move |total: usize| match held.as_deref_mut() {
        Some(r) => {
            if r.grow_to(total) {
                Ok(())
            } else {
                Err(r.budget().refusal(ErrorKind::NotReady, total.saturating_sub(r.bytes()), total))
            }
        }
        None => Ok(()),
    };
    let read = async {
        let mut body = std::pin::pin!(body);
        // A `Vec` while small, a mapping of its own once large (`body_buf.rs`).
        let mut buf = BodyBuf::new(declared, pool);
        // The first frame when it is the whole declared body: kept as is unless more comes.
        let mut whole: Option<Bytes> = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| ApiError::malformed(format!("reading the request body: {e}")))?;
            let Ok(data) = frame.into_data() else { continue };
            if buf.is_empty() && whole.is_none() && declared == Some(data.len() as u64) && data.len() <= max {
                reserve(data.len())?;
                whole = Some(data);
                continue;
            }
            // More than the declared body after all: back to one owned buffer.
            let data = match whole.take() {
                Some(first) => [first, data].concat().into(),
                None => data,
            };
            let need = buf.len() + data.len();
            if need > max {
                return Err(ApiError::too_large(format!("request body > max_body_bytes {max}")));
            }
            if need > buf.capacity() {
                // Double, as a Vec would, but never past what the body may hold.
                let target = need.max(buf.capacity() * 2).max(INITIAL_CAPACITY.min(limit)).min(limit.max(need));
                buf.grow_to(target, &mut reserve, |e| {
                    ApiError::not_ready(format!("no memory for a request body of {target} bytes: {e}"))
                })?;
            }
            buf.extend_from_slice(&data);
        }
        Ok(whole.unwrap_or_else(|| buf.into_bytes()))
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
        let v = Vec::from(collect(Frames::trickle(n, 1, false), Some(n as u64), 1 << 24, None, None).await.unwrap());
        assert_eq!(v.len(), n);
        assert_eq!(v.capacity(), n, "declared length: the buffer never exceeds it");
        let v = Vec::from(collect(Frames::trickle(n, 1, false), None, 1 << 24, None, None).await.unwrap());
        assert_eq!(v.len(), n);
        assert!(v.capacity() <= 2 * n + INITIAL_CAPACITY, "chunked: capacity {} for {n} bytes", v.capacity());
        // Large frames: still one buffer, capacity = length.
        let v = Vec::from(
            collect(Frames::trickle(1 << 20, 65_536, false), Some(1 << 20), 1 << 24, None, None).await.unwrap(),
        );
        assert_eq!((v.len(), v.capacity()), (1 << 20, 1 << 20));
        assert!(v.iter().take(65_536).all(|&b| b == 0) && v[65_536] == 1, "frames kept in order");
    }

    #[tokio::test]
    async fn a_declared_length_reserves_nothing_before_bytes_come() {
        // A client declaring 16 MiB and sending 10 bytes holds a small buffer, not 16 MiB.
        let v = Vec::from(collect(Frames::trickle(10, 10, false), Some(16 << 20), 16 << 20, None, None).await.unwrap());
        assert!(v.capacity() <= INITIAL_CAPACITY, "{}", v.capacity());
    }

    #[tokio::test]
    async fn a_body_in_one_frame_is_that_frame_uncopied() {
        let frame = Bytes::from(vec![7u8; 30_000]);
        let one = Frames { frames: VecDeque::from([frame.clone()]), stall: false };
        let v = collect(one, Some(30_000), 1 << 20, None, None).await.unwrap();
        assert_eq!(v.as_ptr(), frame.as_ptr(), "the frame itself, not a copy");
        assert_eq!(v, frame);
        // A frame of the declared length followed by more (a lying Content-Length): every
        // byte, in order, and still bounded by the maximum.
        let two =
            Frames { frames: VecDeque::from([Bytes::from_static(b"abc"), Bytes::from_static(b"de")]), stall: false };
        assert_eq!(collect(two, Some(3), 100, None, None).await.unwrap(), Bytes::from_static(b"abcde"));
        let two =
            Frames { frames: VecDeque::from([Bytes::from_static(b"abc"), Bytes::from_static(b"de")]), stall: false };
        assert_eq!(collect(two, Some(3), 4, None, None).await.unwrap_err().status(), 413);
        // Undeclared (chunked): copied into a buffer as before.
        let one = Frames { frames: VecDeque::from([frame.clone()]), stall: false };
        let v = collect(one, None, 1 << 20, None, None).await.unwrap();
        assert_ne!(v.as_ptr(), frame.as_ptr());
        assert_eq!(v, frame);
    }

    #[tokio::test]
    async fn over_the_limit_is_413_declared_or_sent() {
        let e = collect(Frames::trickle(10, 10, false), Some(1000), 100, None, None).await.unwrap_err();
        assert_eq!(e.status(), 413);
        assert!(e.message.contains("1000 bytes"), "{}", e.message);
        let e = collect(Frames::trickle(1000, 7, false), None, 100, None, None).await.unwrap_err();
        assert_eq!(e.status(), 413);
    }

    #[tokio::test]
    async fn a_body_that_never_ends_is_408_at_its_deadline() {
        let t0 = Instant::now();
        let deadline = BodyDeadline(t0 + Duration::from_millis(100));
        let e = collect(Frames::trickle(3, 1, true), Some(100), 1000, Some(deadline), None).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::RequestTimeout);
        assert!(t0.elapsed() >= Duration::from_millis(100));
        assert!(t0.elapsed() < Duration::from_secs(5), "ended at the deadline, not later");
    }

    #[tokio::test]
    async fn the_reservation_follows_the_buffer_and_is_kept_by_the_caller() {
        use crate::http::ByteBudget;
        let budget = ByteBudget::new(1 << 20);
        // One whole frame of the declared length: exactly its bytes.
        let mut held = budget.reservation();
        let one = Frames { frames: VecDeque::from([Bytes::from(vec![1u8; 30_000])]), stall: false };
        collect(one, Some(30_000), 1 << 20, None, Some(&mut held)).await.unwrap();
        assert_eq!((held.bytes(), budget.held()), (30_000, 30_000), "held after the read, until dropped");
        drop(held);
        assert_eq!(budget.held(), 0);
        // Trickled: the buffer's capacity, grown as bytes come, never the declared length.
        let mut held = budget.reservation();
        let v = collect(Frames::trickle(40_000, 1000, false), Some(500_000), 1 << 20, None, Some(&mut held)).await;
        let v = v.unwrap();
        // (Declared large, it was a mapping from the start: its capacity is what is held.)
        assert!(held.bytes() >= v.len(), "{} < {}", held.bytes(), v.len());
        assert!(held.bytes() < 100_000, "{}", held.bytes());
        drop(held);
        // A declared body that sends nothing and stalls costs nothing while it waits.
        let mut held = budget.reservation();
        let deadline = BodyDeadline(Instant::now() + Duration::from_millis(20));
        let e = collect(Frames::trickle(0, 1, true), Some(1 << 20), 1 << 20, Some(deadline), Some(&mut held)).await;
        assert_eq!(e.unwrap_err().kind, ErrorKind::RequestTimeout);
        assert_eq!(budget.held(), 0);
    }

    #[tokio::test]
    async fn over_the_budget_is_503_at_once_and_releases_on_every_path() {
        use crate::http::ByteBudget;
        let budget = ByteBudget::new(100_000);
        // Another request holds most of it.
        let mut other = budget.reservation();
        assert!(other.grow_to(80_000));
        let mut held = budget.reservation();
        let e = collect(Frames::trickle(50_000, 5000, true), Some(50_000), 1 << 20, None, Some(&mut held))
            .await
            .unwrap_err();
        assert_eq!(e.status(), 503);
        assert!(e.message.contains("max_buffered_bytes"), "{}", e.message);
        assert!(held.bytes() <= 20_000, "never past the budget: {}", held.bytes());
        drop(held);
        assert_eq!(budget.held(), 80_000, "the failed read released its bytes");
        assert_eq!(budget.refusals(), 1);
        // A read cancelled midway (its future dropped) releases too, once the caller's
        // reservation goes.
        drop(other);
        let mut held = budget.reservation();
        let read = collect(Frames::trickle(30_000, 10_000, true), Some(60_000), 1 << 20, None, Some(&mut held));
        assert!(tokio::time::timeout(Duration::from_millis(20), read).await.is_err(), "stalled");
        assert!(budget.held() >= 30_000, "the bytes that came are counted: {}", budget.held());
        drop(held);
        assert_eq!(budget.held(), 0);
    }
}
