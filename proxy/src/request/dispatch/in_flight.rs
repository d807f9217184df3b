//! A shard's attempts in flight, polled in the shard's task (the request's) rather than
//! spawned: a shard has one attempt at a time unless it is hedged (then a few), so they are kept
//! in a small list and each wake-up polls them all; spawning each as a task (with its join
//! handle) cost a task and a wake-up per call. Dropping the list drops the attempts, which
//! closes their connections: that cancels them on their workers.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

/// The attempts (of output `T`: an `AttemptResult`) in flight.
pub struct InFlight<T> {
    attempts: Vec<Pin<Box<dyn Future<Output = T> + Send>>>,
}

impl<T> Default for InFlight<T> {
    fn default() -> Self {
        InFlight { attempts: Vec::new() }
    }
}

impl<T> InFlight<T> {
    pub fn push(&mut self, attempt: impl Future<Output = T> + Send + 'static) {
        self.attempts.push(Box::pin(attempt));
    }

    pub fn is_empty(&self) -> bool {
        self.attempts.is_empty()
    }

    /// The next attempt to finish; `None` when none is in flight.
    pub async fn next(&mut self) -> Option<T> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        if self.attempts.is_empty() {
            return Poll::Ready(None);
        }
        let mut k = 0;
        while k < self.attempts.len() {
            let attempt = &mut self.attempts[k];
            match catch_unwind(AssertUnwindSafe(|| attempt.as_mut().poll(cx))) {
                Ok(Poll::Pending) => k += 1,
                Ok(Poll::Ready(result)) => {
                    // Order does not matter (each result names its worker and kind).
                    drop(self.attempts.swap_remove(k));
                    return Poll::Ready(Some(result));
                }
                Err(panic) => {
                    // What a spawned attempt's panic did: logged, and the attempt is gone (its
                    // connection closed); the shard goes on with the others or fails.
                    tracing::error!("shard attempt panicked: {}", super::panic_message(&panic));
                    drop(self.attempts.swap_remove(k));
                }
            }
        }
        if self.attempts.is_empty() {
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_attempt_is_dropped_and_the_others_go_on() {
        let mut set = InFlight::default();
        set.push(async {
            tokio::task::yield_now().await;
            panic!("attempt bug")
        });
        set.push(async {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            7
        });
        assert_eq!(set.next().await, Some(7));
        assert!(set.is_empty());
        assert_eq!(set.next().await, None);
        // Only a panicking one: the shard sees nothing left in flight.
        set.push(async { panic!("attempt bug") });
        assert_eq!(set.next().await, None);
    }
}
