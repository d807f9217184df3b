//! How much of a request's remaining time a shard's answer needs after the worker's own
//! deadline: the worker times the deadline it is sent from when the call arrives, answers
//! partially at the first layer boundary past it, and the answer then has to come back and be
//! merged. A worker sent the proxy's whole remaining time answers just after the proxy's own
//! timer has dropped the call, so its partial answer never reached the client.
//!
//! The margin is learnt from measured answers: each answer's lag is how far past the deadline
//! it was sent the worker answered, by its own clock (`total_ms`; 0 when in time), plus the
//! time outside the worker's clock (the transfers: the call's send until its read, less
//! `total_ms`), the latter counted up to [`TRANSFER_CAP_MS`]: past it the call waited to be read
//! by a worker that was stalled (a frozen worker's clock starts when it reads the call), which
//! no margin covers, and counting it gave every worker a quarter less time. The margin is twice the largest recent lag (a maximum that decays by a
//! few percent per answer, so one slow answer is forgotten after a few dozen), never under
//! [`FLOOR_MS`]. An attempt still out at the proxy's deadline is watched a little longer
//! (`dispatch::LATE_WATCH`), so a margin too short learns the real lag from the late answer
//! (a worker that stalled teaches nothing: doubling the margin for every miss made one frozen
//! worker cut every other worker's deadline by a quarter).

use std::sync::atomic::{AtomicU64, Ordering};

/// The least margin: a CPU worker's layer at the end of a pass plus the answer's transfer.
pub const FLOOR_MS: f64 = 25.0;
/// Most of an answer's time outside its worker's clock that counts as transfer.
pub const TRANSFER_CAP_MS: f64 = 50.0;
/// A lag's weight left after each later answer.
const DECAY: f64 = 0.97;
/// Most of the remaining time the margin may take: the worker keeps at least the rest.
const MAX_SHARE: f64 = 0.25;

#[derive(Default)]
pub struct AnswerMargin {
    /// The decaying maximum lag in ms, as `f64` bits.
    lag_ms: AtomicU64,
}

impl AnswerMargin {
    /// An answer read `elapsed_ms` after its call was sent with `deadline_ms`, the worker
    /// having held it `worker_ms`.
    pub fn record(&self, elapsed_ms: f64, worker_ms: f64, deadline_ms: f64) {
        let lag = (worker_ms - deadline_ms).max(0.0) + (elapsed_ms - worker_ms).clamp(0.0, TRANSFER_CAP_MS);
        if lag.is_finite() {
            self.push(lag);
        }
    }

    fn push(&self, lag_ms: f64) {
        let lag_ms = lag_ms.clamp(0.0, 60_000.0);
        let _ = self.lag_ms.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
            Some(f64::max(lag_ms, DECAY * f64::from_bits(bits)).to_bits())
        });
    }

    /// The margin to keep from `left_ms` for the answer: twice the recent largest lag, at least
    /// [`FLOOR_MS`], at most a quarter of the time left.
    pub fn margin_ms(&self, left_ms: f64) -> f64 {
        let lag = f64::from_bits(self.lag_ms.load(Ordering::Relaxed));
        (2.0 * lag).max(FLOOR_MS).min(MAX_SHARE * left_ms.max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_margin_follows_the_largest_recent_lag_above_a_floor() {
        let m = AnswerMargin::default();
        assert_eq!(m.margin_ms(10_000.0), FLOOR_MS, "nothing measured: the floor");
        assert_eq!(m.margin_ms(40.0), 10.0, "never more than a quarter of the time left");
        // Complete answers 1-3 ms after the worker's own time: the floor still rules.
        m.record(103.0, 101.0, 3000.0);
        assert_eq!(m.margin_ms(10_000.0), FLOOR_MS);
        // A partial answer 80 ms past the deadline sent (its worker held it 3,070 ms).
        m.record(3080.0, 3070.0, 3000.0);
        assert_eq!(m.margin_ms(10_000.0), 160.0);
        // A frozen worker: the call waited 2 s unread, then was answered in 50 ms. Only the
        // transfer cap counts (the decayed 80 ms still rules).
        m.record(2050.0, 50.0, 3000.0);
        assert!(m.margin_ms(10_000.0) < 160.0);
        // Forgotten over later, quick answers.
        for _ in 0..100 {
            m.record(5.0, 4.0, 3000.0);
        }
        assert_eq!(m.margin_ms(10_000.0), FLOOR_MS);
        m.record(f64::NAN, 1.0, 1.0);
        assert_eq!(m.margin_ms(10_000.0), FLOOR_MS);
    }
}
