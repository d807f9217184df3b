//! The runner stage: owns the backend, the model and the KV cache on one thread, executes
//! prepared batches pass by pass, and commits or rolls back each batch's prefix blocks.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use sieve_kernels::Backend;
use sieve_shared::{ApiError, Usage};

use super::job::JobOutput;
use super::layout::{segment_slots, LayoutBuilder};
use super::prefix_cache::{Epoch, PrefixCache};
use super::scheduler::{finish_job, PreparedBatch};
use super::state::EngineState;
use crate::model::{Model, Scratch};
use crate::Result;

/// Called at every layer of every pass with (epoch, pass, layer); an error fails the batch.
/// Tests use it to inject faults mid-forward.
pub type FaultHook = Arc<dyn Fn(Epoch, usize, usize) -> Result<()> + Send + Sync>;

/// Where items' own KV goes: a region of blocks reused by every pass (own KV lives only for
/// the pass that computes it), handed out in order.
#[derive(Debug, Clone, Copy)]
pub struct ScratchRegion {
    pub first_block: u32,
    pub num_blocks: usize,
}

pub struct Runner<B: Backend> {
    pub backend: B,
    pub model: Model<B>,
    pub kv: B::KvCache,
    pub scratch_tensors: Scratch<B>,
    pub block_size: usize,
    pub scratch: ScratchRegion,
    pub cache: Arc<Mutex<PrefixCache>>,
    pub state: Arc<EngineState>,
    pub fault: Option<FaultHook>,
}

/// Per-call progress inside a batch.
#[derive(Default)]
struct Progress {
    scores: Vec<f32>,
    computed_tokens: u64,
    compute_s: f64,
    started: Option<Instant>,
    alive: bool,
}

impl<B: Backend> Runner<B> {
    pub fn run(mut self, batches: Receiver<PreparedBatch>) {
        let mut idle_since = Instant::now();
        loop {
            let work_waiting = EngineState::get(&self.state.queued_pairs) > 0;
            let Ok(batch) = batches.recv() else { return };
            let idle = idle_since.elapsed().as_nanos() as u64;
            self.state.add(&self.state.runner_idle_ns, idle);
            if work_waiting {
                self.state.add(&self.state.runner_idle_with_work_ns, idle);
            }
            metrics::histogram!("sieve_worker_runner_idle_seconds").record(idle as f64 / 1e9);
            let t0 = Instant::now();
            self.execute(batch);
            self.state.add(&self.state.runner_busy_ns, t0.elapsed().as_nanos() as u64);
            idle_since = Instant::now();
        }
    }

    fn execute(&mut self, mut batch: PreparedBatch) {
        let epoch = batch.epoch;
        self.state.add(&self.state.batches, 1);
        let mut progress: Vec<Progress> = batch
            .jobs
            .iter()
            .map(|j| Progress { scores: vec![f32::NAN; j.tj.call.prompts.len()], alive: true, ..Default::default() })
            .collect();
        let prefix_slots: Vec<Vec<u32>> = batch
            .jobs
            .iter()
            .map(|j| match &j.lease {
                Some(l) => segment_slots(&l.blocks, self.block_size, j.prefix_len).collect(),
                None => vec![],
            })
            .collect();

        let mut failure: Option<ApiError> = None;
        for (pi, pass) in batch.passes.iter().enumerate() {
            let now = Instant::now();
            for (j, job) in batch.jobs.iter_mut().enumerate() {
                if progress[j].alive {
                    if let Some(err) = job.tj.job.dead_reason(now) {
                        progress[j].alive = false;
                        finish_job(&self.state, &mut job.tj, Err(err));
                    }
                }
            }
            if !progress.iter().any(|p| p.alive) {
                failure = Some(ApiError::deadline("every call of the batch was cancelled or expired"));
                break;
            }
            let mut lb = LayoutBuilder::new();
            if pi == 0 {
                // Prefix segments run even for a call that just died: another call of the batch
                // may be matched to its pending blocks.
                for &j in &pass.prefix_jobs {
                    let job = &batch.jobs[j];
                    let r = job.prefix_to_compute();
                    lb.push(&job.tj.call.prompts[0][r], &prefix_slots[j]);
                }
            }
            let mut next_block = self.scratch.first_block;
            let mut out_rows = vec![];
            let mut targets = vec![];
            for &(j, i) in &pass.items {
                if !progress[j].alive {
                    continue;
                }
                let own = batch.jobs[j].own_tokens(i);
                let n_blocks = own.len().div_ceil(self.block_size);
                let blocks: Vec<u32> = (next_block..next_block + n_blocks as u32).collect();
                next_block += n_blocks as u32;
                debug_assert!((next_block - self.scratch.first_block) as usize <= self.scratch.num_blocks);
                let ctx: Vec<u32> = prefix_slots[j].iter().copied().chain(segment_slots(&blocks, self.block_size, own.len())).collect();
                if let Some(row) = lb.push(own, &ctx) {
                    out_rows.push(row);
                    targets.push((j, i));
                }
            }
            let rows = lb.num_rows();
            if rows == 0 {
                continue;
            }
            let layout = lb.finish();
            let t = Instant::now();
            for &(j, _) in &targets {
                progress[j].started.get_or_insert(t);
            }
            let fault = self.fault.clone();
            let hook = move |layer: usize| match &fault {
                Some(f) => f(epoch, pi, layer),
                None => Ok(()),
            };
            let result = catch_unwind(AssertUnwindSafe(|| -> Result<Vec<f32>> {
                let hidden = self.model.forward(&self.backend, &layout, &mut self.kv, &out_rows, Some(&hook), &mut self.scratch_tensors)?;
                self.model.head.scores(&self.backend, hidden)
            }));
            let scores = match result {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    failure = Some(ApiError::internal(format!("forward pass failed: {e}")));
                    break;
                }
                Err(panic) => {
                    let msg = panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned());
                    failure = Some(ApiError::internal(format!("forward pass panicked: {}", msg.unwrap_or_default())));
                    break;
                }
            };
            let secs = t.elapsed().as_secs_f64();
            if self.model.config.moe.is_some() {
                self.state.moe.record_pass(&self.scratch_tensors.moe.pass, secs);
            }
            self.state.add(&self.state.forward_passes, 1);
            self.state.add(&self.state.tokens_computed, rows as u64);
            self.state.observe_pass(rows as u64, secs);
            metrics::histogram!(sieve_shared::metrics_names::worker::FORWARD_SECONDS).record(secs);
            metrics::histogram!(sieve_shared::metrics_names::worker::BATCH_TOKENS).record(rows as f64);
            if pi == 0 {
                let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
                for job in &batch.jobs {
                    if let Some(l) = &job.lease {
                        cache.mark_written(l);
                    }
                }
                for &j in &pass.prefix_jobs {
                    progress[j].computed_tokens += batch.jobs[j].prefix_to_compute().len() as u64;
                }
            }
            let mut in_pass = vec![false; progress.len()];
            for (&(j, i), s) in targets.iter().zip(scores) {
                progress[j].scores[i] = s;
                progress[j].computed_tokens += batch.jobs[j].own_tokens(i).len() as u64;
                in_pass[j] = true;
            }
            for (j, p) in progress.iter_mut().enumerate() {
                if in_pass[j] {
                    p.compute_s += secs;
                }
            }
        }

        {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if failure.is_some() {
                cache.rollback(epoch);
            } else {
                cache.commit(epoch);
            }
            for job in &batch.jobs {
                if let Some(l) = &job.lease {
                    cache.release(l);
                }
            }
        }
        if let Some(err) = failure {
            if err.kind != sieve_shared::ErrorKind::DeadlineExceeded {
                self.state.add(&self.state.batch_failures, 1);
                tracing::error!(epoch, "batch failed: {}", err.message);
            }
            for job in batch.jobs.iter_mut() {
                finish_job(&self.state, &mut job.tj, Err(err.clone()));
            }
            return;
        }
        for (job, p) in batch.jobs.iter_mut().zip(progress) {
            if !p.alive {
                continue;
            }
            let call = &job.tj.call;
            let m = call.prompts.len() as u64;
            let prefix = call.prefix_len as u64;
            let (reused, reused_committed) = job.lease.as_ref().map(|l| (l.reused as u64, l.reused_committed as u64)).unwrap_or((0, 0));
            // Prefix demand is P per pair: computed once (less what was matched), the rest reused.
            let computed_prefix = if job.lease.is_some() { prefix - reused } else { prefix * m };
            let cross = reused_committed * m;
            self.state.add(&self.state.prefix_tokens_computed, computed_prefix);
            self.state.add(&self.state.prefix_tokens_reused_cross_batch, cross);
            self.state.add(&self.state.prefix_tokens_reused_in_batch, (prefix * m).saturating_sub(computed_prefix + cross));
            self.state.add(&self.state.pairs_processed, m);
            self.state.add(&self.state.requests_processed, 1);
            self.state.add(&self.state.prompt_tokens, call.prompt_tokens());
            let usage = Usage {
                pairs: m as u32,
                prompt_tokens: call.prompt_tokens(),
                computed_tokens: p.computed_tokens,
                prefix_tokens: call.prefix_len as u32,
                cached_prefix_tokens: reused_committed as u32,
                item_tokens: call.prompts.iter().map(|q| (q.len() - call.prefix_len) as u32).collect(),
            };
            let arrived = job.tj.job.arrived;
            let queue_ms = p.started.map(|s| s.duration_since(arrived).as_secs_f64() * 1e3).unwrap_or(0.0);
            let out = JobOutput { scores: p.scores, usage, queue_ms, compute_ms: p.compute_s * 1e3 };
            finish_job(&self.state, &mut job.tj, Ok(out));
        }
    }
}
