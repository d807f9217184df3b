//! A shard's attempts in flight, polled in the shard's task (the request's) rather than
//! spawned: a shard has one attempt at a time unless it is hedged (then a few), so they are kept
//! in a small list and each wake-up polls them all; spawning each as a task (with its join
//! handle) cost a task and a wake-up per call. Dropping the list drops the attempts, which
//! closes their connections: that cancels them on their workers.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::attempt::AttemptResult;

type Attempt = Pin<Box<dyn Future<Output = AttemptResult> + Send>>;

#[derive(Default)]
pub struct InFlight {
    attempts: Vec<Attempt>,
}

impl InFlight {
    pub fn push(&mut self, attempt: impl Future<Output = AttemptResult> + Send + 'static) {
        self.attempts.push(Box::pin(attempt));
    }

    pub fn is_empty(&self) -> bool {
        self.attempts.is_empty()
    }

    /// The next attempt to finish; `None` when none is in flight.
    pub async fn next(&mut self) -> Option<AttemptResult> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<AttemptResult>> {
        if self.attempts.is_empty() {
            return Poll::Ready(None);
        }
        for k in 0..self.attempts.len() {
            if let Poll::Ready(result) = self.attempts[k].as_mut().poll(cx) {
                // Order does not matter (each result names its worker and kind).
                drop(self.attempts.swap_remove(k));
                return Poll::Ready(Some(result));
            }
        }
        Poll::Pending
    }
}
