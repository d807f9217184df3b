//! One budget per process for the request bytes it holds in memory (`[http] max_buffered_bytes`):
//! HTTP bodies and gRPC messages, while they arrive and until their request is answered.
//!
//! Every other limit is per request (`max_body_bytes`) or per connection, so without this what a
//! process may buffer is their product (4096 connections × 16 MiB): a few clients that each send
//! most of a large body and stall would drive it out of memory long before any timeout applies.
//!
//! Why an atomic counter and not tokio's `Semaphore`: a body grows its reservation frame by
//! frame, and a reservation is only ever tried, never waited for (a request waiting for budget
//! inside a read would be a slot held for ever). A compare-and-swap on one counter does exactly
//! that, with no waiter queue, no permit count cap (`Semaphore::MAX_PERMITS`) and no lock; a
//! [`Reservation`] gives its bytes back when dropped, so every path (answered, failed,
//! cancelled, the connection dropped) releases.
//!
//! The last eighth of the budget is kept for small requests (at most [`SMALL_REQUEST_BYTES`]):
//! clients that fill the budget with large bodies they never finish make the next large body
//! wait out the body read timeout (503, retry later) but cannot refuse ordinary requests.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use sieve_shared::http_config::large_limit_of;
use sieve_shared::{ApiError, ErrorKind};

use super::body_buf::MapPool;

/// The byte budget of one process, shared (cheap clones) by its API ports.
#[derive(Debug, Clone)]
pub struct ByteBudget(Arc<Inner>);

/// A request of at most this many bytes may use the whole budget; a larger one only what
/// leaves the last eighth free ([`ByteBudget::large_limit`]).
pub const SMALL_REQUEST_BYTES: usize = 64 << 10;

#[derive(Debug)]
struct Inner {
    limit: usize,
    held: AtomicUsize,
    refusals: AtomicU64,
    /// Large body buffers done with, kept for the next ones (`body_buf.rs`): the one memory
    /// besides the budget, at most [`ByteBudget::pool_bytes_of`] the limit.
    pool: Arc<MapPool>,
}

impl ByteBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Self {
        let pool = Arc::new(MapPool::new(Self::pool_bytes_of(limit)));
        ByteBudget(Arc::new(Inner { limit, held: AtomicUsize::new(0), refusals: AtomicU64::new(0), pool }))
    }

    /// What the pool of large body buffers may keep for a budget of `limit`: a sixteenth of
    /// it, at most 32 MiB (the default 1 GiB budget: 32 MiB; the abuse soak's 32 MiB: 2 MiB).
    pub fn pool_bytes_of(limit: usize) -> usize {
        (limit / 16).min(32 << 20)
    }

    /// The pool the large bodies read against this budget take their mappings from.
    pub(crate) fn map_pool(&self) -> Arc<MapPool> {
        self.0.pool.clone()
    }

    /// An empty reservation on this budget, to grow as bytes arrive.
    pub fn reservation(&self) -> Reservation {
        Reservation { budget: self.clone(), bytes: 0 }
    }

    /// The budget in bytes.
    pub fn limit(&self) -> usize {
        self.0.limit
    }

    /// Bytes reserved now.
    pub fn held(&self) -> usize {
        self.0.held.load(Ordering::Relaxed)
    }

    /// Reservations refused so far (the `*_buffer_refusals_total` metrics).
    pub fn refusals(&self) -> u64 {
        self.0.refusals.load(Ordering::Relaxed)
    }

    /// Takes `n` more bytes for a request that then holds `total` if they fit (in the whole
    /// budget for a small request, else in its large part); counts a refusal when they do not.
    fn try_take(&self, n: usize, total: usize) -> bool {
        let limit = if total <= SMALL_REQUEST_BYTES { self.0.limit } else { large_limit_of(self.0.limit) };
        let fits =
            self.0.held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| h.checked_add(n).filter(|&t| t <= limit));
        if fits.is_err() {
            self.0.refusals.fetch_add(1, Ordering::Relaxed);
        }
        fits.is_ok()
    }

    fn give_back(&self, n: usize) {
        self.0.held.fetch_sub(n, Ordering::AcqRel);
    }

    /// The error of a refused reservation of `wanted` more bytes for a request that would then
    /// hold `total`: what is held and what it may use, naming the key. `kind` is the caller's:
    /// 503 on HTTP, RESOURCE_EXHAUSTED on gRPC.
    pub fn refusal(&self, kind: ErrorKind, wanted: usize, total: usize) -> ApiError {
        let limit = self.0.limit;
        let part = if total <= SMALL_REQUEST_BYTES {
            String::new()
        } else {
            format!(", of which requests over {SMALL_REQUEST_BYTES} bytes may use {}", large_limit_of(limit))
        };
        ApiError::new(
            kind,
            format!(
                "the server holds {} bytes of request data of its {limit} (http.max_buffered_bytes{part}); \
                 {wanted} more bytes for this request do not fit; retry later",
                self.held(),
            ),
        )
    }
}

/// Bytes of one request held against a [`ByteBudget`]; released when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: ByteBudget,
    bytes: usize,
}

impl Reservation {
    /// Bytes reserved.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Grows the reservation to cover at least `total` bytes; `false` (and unchanged) when the
    /// budget has not the difference left. Never waits.
    pub fn grow_to(&mut self, total: usize) -> bool {
        if total <= self.bytes {
            return true;
        }
        let more = total - self.bytes;
        if !self.budget.try_take(more, total) {
            return false;
        }
        self.bytes = total;
        true
    }

    /// The budget it draws on.
    pub fn budget(&self) -> &ByteBudget {
        &self.budget
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.budget.give_back(self.bytes);
        }
    }
}

/// A [`Reservation`] shared by a gRPC call's message stream (which grows it frame by frame)
/// and the call itself (which holds it until its answer): tonic drops the request body once the
/// message is decoded, but the message lives on until the call ends. Released when the last
/// holder drops it.
#[derive(Debug, Clone)]
pub struct SharedReservation(Arc<SharedInner>);

#[derive(Debug)]
struct SharedInner {
    budget: ByteBudget,
    bytes: AtomicUsize,
}

impl SharedReservation {
    pub fn new(budget: &ByteBudget) -> Self {
        SharedReservation(Arc::new(SharedInner { budget: budget.clone(), bytes: AtomicUsize::new(0) }))
    }

    /// Reserves `n` more bytes; `false` (and unchanged) when they do not fit. Never waits.
    pub fn grow_by(&self, n: usize) -> bool {
        if n == 0 {
            return true;
        }
        // One writer (the call's message stream): the total is this holder's own.
        let total = self.bytes().saturating_add(n);
        if !self.0.budget.try_take(n, total) {
            return false;
        }
        self.0.bytes.fetch_add(n, Ordering::AcqRel);
        true
    }

    pub fn bytes(&self) -> usize {
        self.0.bytes.load(Ordering::Acquire)
    }

    pub fn budget(&self) -> &ByteBudget {
        &self.0.budget
    }
}

impl Drop for SharedInner {
    fn drop(&mut self) {
        let n = *self.bytes.get_mut();
        if n > 0 {
            self.budget.give_back(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_grows_and_releases_on_drop() {
        let b = ByteBudget::new(1000);
        let mut r = b.reservation();
        assert_eq!(b.held(), 0, "an empty reservation holds nothing");
        assert!(r.grow_to(300));
        assert!(r.grow_to(200), "smaller than held: nothing to do");
        assert_eq!((r.bytes(), b.held()), (300, 300));
        assert!(r.grow_to(700));
        assert_eq!((r.bytes(), b.held()), (700, 700));
        drop(r);
        assert_eq!(b.held(), 0);
        assert_eq!(b.refusals(), 0);
    }

    #[test]
    fn over_the_budget_is_refused_unchanged_and_counted() {
        let b = ByteBudget::new(1000);
        let mut first = b.reservation();
        assert!(first.grow_to(800));
        let mut second = b.reservation();
        assert!(!second.grow_to(201), "800 + 201 > 1000");
        assert_eq!((second.bytes(), b.held(), b.refusals()), (0, 800, 1));
        assert!(second.grow_to(200), "exactly the rest fits");
        assert!(!first.grow_to(801));
        assert_eq!((first.bytes(), b.held(), b.refusals()), (800, 1000, 2));
        drop(first);
        assert!(second.grow_to(1000), "freed bytes are usable again");
        assert!(!b.reservation().grow_to(usize::MAX), "no overflow");
        let e = b.refusal(ErrorKind::NotReady, 5, 5);
        assert_eq!(e.status(), 503);
        assert!(e.message.contains("max_buffered_bytes") && e.message.contains("1000"), "{}", e.message);
        let e = ByteBudget::new(8 << 20).refusal(ErrorKind::Overloaded, 1 << 20, 2 << 20);
        assert!(e.message.contains(&format!("may use {}", 7 << 20)), "the large part named: {}", e.message);
    }

    #[test]
    fn a_shared_reservation_releases_when_its_last_holder_drops() {
        let b = ByteBudget::new(100);
        let call = SharedReservation::new(&b);
        let body = call.clone();
        assert!(body.grow_by(60));
        assert!(!body.grow_by(41));
        assert!(body.grow_by(40));
        assert_eq!((call.bytes(), b.held()), (100, 100));
        drop(body);
        assert_eq!(b.held(), 100, "the call still holds its message");
        drop(call);
        assert_eq!(b.held(), 0);
    }

    #[test]
    fn large_requests_leave_the_last_eighth_to_small_ones() {
        let mib = 1 << 20;
        let b = ByteBudget::new(8 * mib);
        assert_eq!(large_limit_of(8 * mib), 7 * mib);
        let mut large = b.reservation();
        assert!(large.grow_to(7 * mib));
        assert!(!b.reservation().grow_to(SMALL_REQUEST_BYTES + 1), "another large one: refused");
        let mut small = b.reservation();
        assert!(small.grow_to(SMALL_REQUEST_BYTES), "a small one still fits");
        assert!(!small.grow_to(SMALL_REQUEST_BYTES + 1), "until it grows past small");
        drop(large);
        assert!(small.grow_to(SMALL_REQUEST_BYTES + 1));
        assert_eq!(b.refusals(), 2);
    }

    #[test]
    fn concurrent_reservations_never_exceed_the_budget() {
        let b = ByteBudget::new(10_000);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || {
                    for _ in 0..2000 {
                        let mut r = b.reservation();
                        if r.grow_to(3000) {
                            assert!(b.held() <= 10_000);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(b.held(), 0);
    }
}
