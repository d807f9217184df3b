//! Per-worker circuit breaker. Closed: shards flow, consecutive failures are counted. After
//! `failure_threshold` of them it opens: no shards for `open_ms`. Then half-open: one probe
//! shard at a time (the worker must have nothing else in flight); its success closes the
//! breaker, its failure re-opens it for twice as long (up to `max_open_ms`).
//!
//! Time is passed in, so the state machine is tested without sleeping.

use std::time::{Duration, Instant};

use serde::Serialize;
use sieve_shared::proxy_config::BreakerConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerState {
    pub const ALL: [BreakerState; 3] = [BreakerState::Closed, BreakerState::Open, BreakerState::HalfOpen];

    /// Its position in [`BreakerState::ALL`].
    pub fn index(self) -> usize {
        match self {
            BreakerState::Closed => 0,
            BreakerState::Open => 1,
            BreakerState::HalfOpen => 2,
        }
    }

    pub fn as_gauge(self) -> f64 {
        match self {
            BreakerState::Closed => 0.0,
            BreakerState::HalfOpen => 1.0,
            BreakerState::Open => 2.0,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Breaker {
    cfg: BreakerConfig,
    consecutive_failures: u32,
    /// Set while open or half-open: when the open period ends.
    open_until: Option<Instant>,
    open_for: Duration,
}

impl Breaker {
    pub fn new(cfg: BreakerConfig) -> Self {
        let open_for = Duration::from_millis(cfg.open_ms);
        Breaker { cfg, consecutive_failures: 0, open_until: None, open_for }
    }

    pub fn state(&self, now: Instant) -> BreakerState {
        match self.open_until {
            None => BreakerState::Closed,
            Some(until) if now < until => BreakerState::Open,
            Some(_) => BreakerState::HalfOpen,
        }
    }

    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// Whether a shard may be sent; `idle` says the worker has nothing in flight from us
    /// (a half-open breaker lets one probe through at a time).
    pub fn allows(&self, now: Instant, idle: bool) -> bool {
        match self.state(now) {
            BreakerState::Closed => true,
            BreakerState::HalfOpen => idle,
            BreakerState::Open => false,
        }
    }

    /// Returns the new state when this changed it.
    pub fn on_success(&mut self, now: Instant) -> Option<BreakerState> {
        let before = self.state(now);
        self.consecutive_failures = 0;
        self.open_until = None;
        self.open_for = Duration::from_millis(self.cfg.open_ms);
        (before != BreakerState::Closed).then_some(BreakerState::Closed)
    }

    /// Returns the new state when this changed it.
    pub fn on_failure(&mut self, now: Instant) -> Option<BreakerState> {
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        match self.state(now) {
            BreakerState::Closed => {
                if self.consecutive_failures >= self.cfg.failure_threshold {
                    self.open_until = Some(now + self.open_for);
                    Some(BreakerState::Open)
                } else {
                    None
                }
            }
            BreakerState::HalfOpen => {
                // The probe failed: back off harder.
                self.open_for = (self.open_for * 2).min(Duration::from_millis(self.cfg.max_open_ms));
                self.open_until = Some(now + self.open_for);
                Some(BreakerState::Open)
            }
            // A shard sent before the breaker opened failed late: nothing new.
            BreakerState::Open => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_probes_and_closes() {
        let cfg = BreakerConfig { failure_threshold: 3, open_ms: 100, max_open_ms: 250 };
        let mut b = Breaker::new(cfg);
        let t0 = Instant::now();
        assert!(b.allows(t0, false));
        assert_eq!(b.on_failure(t0), None);
        assert_eq!(b.on_failure(t0), None);
        b.on_success(t0);
        assert_eq!(b.on_failure(t0), None, "a success resets the count");
        assert_eq!(b.on_failure(t0), None);
        assert_eq!(b.on_failure(t0), Some(BreakerState::Open));
        assert!(!b.allows(t0 + Duration::from_millis(99), true));

        let t1 = t0 + Duration::from_millis(100);
        assert_eq!(b.state(t1), BreakerState::HalfOpen);
        assert!(b.allows(t1, true), "one probe when idle");
        assert!(!b.allows(t1, false), "no second probe while one is in flight");
        assert_eq!(b.on_failure(t1), Some(BreakerState::Open), "a failed probe re-opens");
        assert_eq!(b.state(t1 + Duration::from_millis(199)), BreakerState::Open, "for twice as long");

        let t2 = t1 + Duration::from_millis(200);
        assert_eq!(b.state(t2), BreakerState::HalfOpen);
        assert_eq!(b.on_failure(t2), Some(BreakerState::Open));
        assert_eq!(b.state(t2 + Duration::from_millis(249)), BreakerState::Open, "capped at max_open_ms");
        let t3 = t2 + Duration::from_millis(250);
        assert_eq!(b.on_success(t3), Some(BreakerState::Closed));
        assert!(b.allows(t3, false));
        assert_eq!(b.on_failure(t3), None, "closed again with a fresh count");
    }
}
