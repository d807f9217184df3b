//! A shard's attempts in flight, polled in the shard's task (the request's) rather than
//! spawned: spawning each as a task (with its join handle) cost a task and a wake-up per call.
//! A `FuturesUnordered` polls only the attempts woken; each is wrapped in `catch_unwind`, so an
//! attempt that panics is logged and dropped as a spawned one was, and the shard goes on with
//! the others. Dropping the set drops the attempts, which closes their connections: that
//! cancels them on their workers.

use std::panic::AssertUnwindSafe;

use futures_util::future::{BoxFuture, CatchUnwind, FutureExt as _};
use futures_util::stream::{FuturesUnordered, StreamExt as _};

/// The attempts (of output `T`: an `AttemptResult`) in flight.
pub struct InFlight<T> {
    attempts: FuturesUnordered<CatchUnwind<AssertUnwindSafe<BoxFuture<'static, T>>>>,
}

impl<T> Default for InFlight<T> {
    fn default() -> Self {
        InFlight { attempts: FuturesUnordered::new() }
    }
}

impl<T> InFlight<T> {
    pub fn push(&mut self, attempt: impl std::future::Future<Output = T> + Send + 'static) {
        self.attempts.push(AssertUnwindSafe(attempt.boxed()).catch_unwind());
    }

    pub fn is_empty(&self) -> bool {
        self.attempts.is_empty()
    }

    /// The next attempt to finish; `None` when none is in flight. Cancel-safe (a `select!`
    /// arm): a result is only taken out of the set when it is returned.
    pub async fn next(&mut self) -> Option<T> {
        loop {
            match self.attempts.next().await? {
                Ok(result) => return Some(result),
                // What a spawned attempt's panic did: logged, and the attempt is gone (its
                // connection closed); the shard goes on with the others or fails.
                Err(panic) => tracing::error!("shard attempt panicked: {}", super::panic_message(&panic)),
            }
        }
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
