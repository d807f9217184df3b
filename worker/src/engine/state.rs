//! Live engine figures, shared between the HTTP side, the scheduler and the runner.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use serde::Serialize;

fn add(a: &AtomicU64, v: u64) {
    a.fetch_add(v, Ordering::Relaxed);
}

#[derive(Debug, Default)]
pub struct EngineState {
    pub ready: AtomicBool,
    pub draining: AtomicBool,
    pub in_flight_requests: AtomicU64,
    pub queued_pairs: AtomicU64,
    pub queued_tokens: AtomicU64,
    pub requests_processed: AtomicU64,
    pub pairs_processed: AtomicU64,
    /// Tokens run through the model.
    pub tokens_computed: AtomicU64,
    /// Sum of full prompt lengths scored (what an engine without sharing would compute).
    pub prompt_tokens: AtomicU64,
    pub prefix_tokens_computed: AtomicU64,
    pub prefix_tokens_reused_in_batch: AtomicU64,
    pub prefix_tokens_reused_cross_batch: AtomicU64,
    pub batches: AtomicU64,
    pub forward_passes: AtomicU64,
    pub batch_failures: AtomicU64,
    pub runner_busy_ns: AtomicU64,
    /// Time the runner waited for a batch while work was queued (the pipeline's bubble).
    pub runner_idle_with_work_ns: AtomicU64,
    pub runner_idle_ns: AtomicU64,
    /// A forward pass is running (the deadline bench watches how long work goes on).
    pub pass_running: AtomicBool,
    /// Passes stopped mid-forward because no live call needed them, and their rows.
    pub passes_abandoned: AtomicU64,
    pub rows_abandoned: AtomicU64,
    /// Calls answered 504 at their deadline before the runner started them, and after.
    pub calls_expired_queued: AtomicU64,
    pub calls_expired_running: AtomicU64,
    /// Calls whose caller went away before the answer.
    pub calls_cancelled: AtomicU64,
    /// Calls answered at their deadline with some items scored (`missing` lists the rest).
    pub partial_answers: AtomicU64,
    /// Scores that came out NaN or infinite (their calls got 500).
    pub nonfinite_scores: AtomicU64,
    tokens_per_second_bits: AtomicU64,
    pub load_error: Mutex<Option<String>>,
    /// MoE layer figures (set up only for MoE models).
    pub moe: crate::moe::MoeMonitor,
}

impl EngineState {
    pub fn add(&self, field: &AtomicU64, v: u64) {
        add(field, v)
    }

    pub fn sub(&self, field: &AtomicU64, v: u64) {
        field.fetch_sub(v, Ordering::Relaxed);
    }

    pub fn get(field: &AtomicU64) -> u64 {
        field.load(Ordering::Relaxed)
    }

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
        let busy = Self::get(&self.runner_busy_ns) as f64 / 1e9;
        let idle_with_work = Self::get(&self.runner_idle_with_work_ns) as f64 / 1e9;
        PipelineSnapshot {
            batches: Self::get(&self.batches),
            forward_passes: Self::get(&self.forward_passes),
            batch_failures: Self::get(&self.batch_failures),
            runner_busy_seconds: busy,
            runner_idle_seconds: Self::get(&self.runner_idle_ns) as f64 / 1e9,
            runner_idle_with_work_seconds: idle_with_work,
            idle_fraction_under_load: if busy + idle_with_work > 0.0 {
                idle_with_work / (busy + idle_with_work)
            } else {
                0.0
            },
            prefix_tokens_computed: Self::get(&self.prefix_tokens_computed),
            prefix_tokens_reused_in_batch: Self::get(&self.prefix_tokens_reused_in_batch),
            prefix_tokens_reused_cross_batch: Self::get(&self.prefix_tokens_reused_cross_batch),
            passes_abandoned: Self::get(&self.passes_abandoned),
            rows_abandoned: Self::get(&self.rows_abandoned),
            calls_expired_queued: Self::get(&self.calls_expired_queued),
            calls_expired_running: Self::get(&self.calls_expired_running),
            calls_cancelled: Self::get(&self.calls_cancelled),
            partial_answers: Self::get(&self.partial_answers),
            nonfinite_scores: Self::get(&self.nonfinite_scores),
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
