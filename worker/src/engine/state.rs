//! Live engine figures, shared between the HTTP side, the scheduler and the runner.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use serde::Serialize;

/// One monotonic count (or a gauge that goes up and down) read by `/stats` and the tests.
/// Relaxed ordering: each figure is independent, nothing is published through it.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn add(&self, v: u64) {
        self.0.fetch_add(v, Ordering::Relaxed);
    }

    pub fn sub(&self, v: u64) {
        self.0.fetch_sub(v, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[derive(Debug, Default)]
pub struct EngineState {
    pub ready: AtomicBool,
    pub draining: AtomicBool,
    pub in_flight_requests: Counter,
    pub queued_pairs: Counter,
    pub queued_tokens: Counter,
    pub requests_processed: Counter,
    pub pairs_processed: Counter,
    /// Tokens run through the model.
    pub tokens_computed: Counter,
    /// Sum of full prompt lengths scored (what an engine without sharing would compute).
    pub prompt_tokens: Counter,
    pub prefix_tokens_computed: Counter,
    pub prefix_tokens_reused_in_batch: Counter,
    pub prefix_tokens_reused_cross_batch: Counter,
    pub batches: Counter,
    pub forward_passes: Counter,
    pub batch_failures: Counter,
    pub runner_busy_ns: Counter,
    /// Time the runner waited for a batch while work was queued (the pipeline's bubble).
    pub runner_idle_with_work_ns: Counter,
    pub runner_idle_ns: Counter,
    /// A forward pass is running (the deadline bench watches how long work goes on).
    pub pass_running: AtomicBool,
    /// Passes stopped mid-forward because no live call needed them, and their rows.
    pub passes_abandoned: Counter,
    pub rows_abandoned: Counter,
    /// Calls answered 504 at their deadline before the runner started them, and after.
    pub calls_expired_queued: Counter,
    pub calls_expired_running: Counter,
    /// Calls whose caller went away before the answer.
    pub calls_cancelled: Counter,
    /// Calls answered at their deadline with some items scored (`missing` lists the rest).
    pub partial_answers: Counter,
    /// Scores that came out NaN or infinite (their calls got 500).
    pub nonfinite_scores: Counter,
    tokens_per_second_bits: AtomicU64,
    pub load_error: Mutex<Option<String>>,
    /// MoE layer figures (set up only for MoE models).
    pub moe: crate::moe::MoeMonitor,
}

impl EngineState {
    pub fn tokens_per_second(&self) -> f64 {
        f64::from_bits(self.tokens_per_second_bits.load(Ordering::Relaxed))
    }

    /// Folds one forward pass into the throughput estimate (EWMA, weight by pass size).
    pub fn observe_pass(&self, tokens: u64, seconds: f64) {
        if seconds <= 0.0 || tokens == 0 {
            return;
        }
        let rate = tokens as f64 / seconds;
        let old = self.tokens_per_second();
        let new = if old == 0.0 { rate } else { 0.8 * old + 0.2 * rate };
        self.tokens_per_second_bits.store(new.to_bits(), Ordering::Relaxed);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && !self.draining.load(Ordering::Acquire)
    }

    pub fn pipeline(&self) -> PipelineSnapshot {
        let busy = self.runner_busy_ns.get() as f64 / 1e9;
        let idle_with_work = self.runner_idle_with_work_ns.get() as f64 / 1e9;
        PipelineSnapshot {
            batches: self.batches.get(),
            forward_passes: self.forward_passes.get(),
            batch_failures: self.batch_failures.get(),
            runner_busy_seconds: busy,
            runner_idle_seconds: self.runner_idle_ns.get() as f64 / 1e9,
            runner_idle_with_work_seconds: idle_with_work,
            idle_fraction_under_load: if busy + idle_with_work > 0.0 {
                idle_with_work / (busy + idle_with_work)
            } else {
                0.0
            },
            prefix_tokens_computed: self.prefix_tokens_computed.get(),
            prefix_tokens_reused_in_batch: self.prefix_tokens_reused_in_batch.get(),
            prefix_tokens_reused_cross_batch: self.prefix_tokens_reused_cross_batch.get(),
            passes_abandoned: self.passes_abandoned.get(),
            rows_abandoned: self.rows_abandoned.get(),
            calls_expired_queued: self.calls_expired_queued.get(),
            calls_expired_running: self.calls_expired_running.get(),
            calls_cancelled: self.calls_cancelled.get(),
            partial_answers: self.partial_answers.get(),
            nonfinite_scores: self.nonfinite_scores.get(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PipelineSnapshot {
    pub batches: u64,
    pub forward_passes: u64,
    pub batch_failures: u64,
    pub runner_busy_seconds: f64,
    pub runner_idle_seconds: f64,
    pub runner_idle_with_work_seconds: f64,
    /// Idle time between batches while work was queued, as a fraction of busy + that idle time.
    pub idle_fraction_under_load: f64,
    pub prefix_tokens_computed: u64,
    pub prefix_tokens_reused_in_batch: u64,
    pub prefix_tokens_reused_cross_batch: u64,
    pub passes_abandoned: u64,
    pub rows_abandoned: u64,
    pub calls_expired_queued: u64,
    pub calls_expired_running: u64,
    pub calls_cancelled: u64,
    pub partial_answers: u64,
    pub nonfinite_scores: u64,
}
