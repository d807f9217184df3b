//! Token buckets that bound retries and hedges, so a failing or slow cluster is not buried
//! under extra work: every shard sent earns a fraction of a retry (or of its predicted work
//! for hedges), a retry or hedge spends, and a floor rate keeps a quiet proxy able to retry.

use sieve_shared::sync::lock;
use std::sync::Mutex;
use std::time::Instant;

pub struct TokenBucket {
    inner: Mutex<Inner>,
    capacity: f64,
    refill_per_sec: f64,
}

struct Inner {
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub fn new(capacity: f64, initial: f64, refill_per_sec: f64) -> Self {
        TokenBucket {
            inner: Mutex::new(Inner { tokens: initial.min(capacity), last: Instant::now() }),
            capacity,
            refill_per_sec,
        }
    }

    fn refill(&self, inner: &mut Inner, now: Instant) {
        let dt = now.saturating_duration_since(inner.last).as_secs_f64();
        inner.tokens = (inner.tokens + dt * self.refill_per_sec).min(self.capacity);
        inner.last = now;
    }

    pub fn deposit(&self, amount: f64) {
        let mut inner = lock(&self.inner);
        self.refill(&mut inner, Instant::now());
        inner.tokens = (inner.tokens + amount.max(0.0)).min(self.capacity);
    }

    /// Takes `amount` if that much is there.
    pub fn try_withdraw(&self, amount: f64) -> bool {
        let mut inner = lock(&self.inner);
        self.refill(&mut inner, Instant::now());
        if inner.tokens >= amount {
            inner.tokens -= amount;
            true
        } else {
            false
        }
    }

    pub fn available(&self) -> f64 {
        let mut inner = lock(&self.inner);
        self.refill(&mut inner, Instant::now());
        inner.tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spends_what_was_earned() {
        let b = TokenBucket::new(10.0, 0.0, 0.0);
        assert!(!b.try_withdraw(1.0));
        for _ in 0..5 {
            b.deposit(0.2);
        }
        assert!(b.try_withdraw(1.0));
        assert!(!b.try_withdraw(0.5));
        b.deposit(100.0);
        assert!((b.available() - 10.0).abs() < 1e-9, "capped");
    }
}
