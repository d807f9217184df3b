//! Admission and graceful drain. Every API request is counted in flight from admission to
//! response; once draining (SIGTERM, or `POST /drain` on the admin port), new requests are
//! refused with 503 and shutdown waits for the count to reach zero.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use sieve_shared::ApiError;
use tokio::sync::Notify;

#[derive(Default)]
pub struct Drain {
    draining: AtomicBool,
    in_flight: AtomicUsize,
    idle: Notify,
    /// `POST /drain`: wakes whoever runs the process's shutdown (`sieve-proxy`'s main).
    requested: Notify,
}

/// One admitted request; dropping it ends the request.
pub struct Admitted<'a> {
    drain: &'a Drain,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        if self.drain.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.drain.idle.notify_waiters();
        }
    }
}

impl Drain {
    /// Admits a request unless draining (503) or `max_in_flight` are already running (429).
    pub fn admit(&self, max_in_flight: usize) -> Result<Admitted<'_>, ApiError> {
        // Count first, then check: a drain that starts between the two still waits for us.
        let before = self.in_flight.fetch_add(1, Ordering::SeqCst);
        let admitted = Admitted { drain: self };
        if self.draining.load(Ordering::SeqCst) {
            return Err(ApiError::not_ready("the proxy is draining"));
        }
        if before >= max_in_flight {
            return Err(ApiError::overloaded(format!(
                "{before} requests in flight, max_in_flight_requests is {max_in_flight}"
            )));
        }
        Ok(admitted)
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    pub fn start(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Starts draining now and asks the process to shut down as on SIGTERM.
    pub fn request(&self) {
        self.start();
        self.requested.notify_one();
    }

    /// Resolves once [`Drain::request`] was called (before or after this call).
    pub async fn requested(&self) {
        self.requested.notified().await;
    }

    /// Starts draining and waits until no request is in flight, or `timeout`. True if idle.
    pub async fn drain(&self, timeout: Duration) -> bool {
        self.start();
        let wait = async {
            loop {
                let notified = self.idle.notified();
                if self.in_flight() == 0 {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(timeout, wait).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn refuses_when_draining_or_full_and_waits_for_in_flight() {
        let d = Drain::default();
        let a = d.admit(1).unwrap();
        assert_eq!(d.admit(1).err().map(|e| e.status()), Some(429));
        d.start();
        assert_eq!(d.admit(10).err().map(|e| e.status()), Some(503));
        assert!(!d.drain(Duration::from_millis(20)).await, "one request still in flight");
        let (done, _) = tokio::join!(d.drain(Duration::from_secs(5)), async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(a);
        });
        assert!(done);
    }

    #[tokio::test]
    async fn a_drain_request_refuses_new_requests_and_wakes_the_waiter() {
        let d = Drain::default();
        d.request();
        assert_eq!(d.admit(10).err().map(|e| e.status()), Some(503));
        tokio::time::timeout(Duration::from_secs(5), d.requested()).await.expect("the request is remembered");
    }
}
