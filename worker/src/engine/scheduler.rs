//! The scheduler stage: tokenizes queued calls, groups them into batches, matches and allocates
//! their prefix blocks, and plans the forward passes — all while the runner executes the
//! previous batch.
//!
//! A batch is one epoch of the prefix cache. It holds either several small calls (one forward
//! pass) or one call larger than a pass (several passes). Every prefix segment a batch computes
//! goes into its first pass, so a prefix block is always written before any item — of any call
//! in the batch — reads it.

use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sieve_shared::ApiError;

use super::job::{ScoreJob, TokenizedJob};
use super::prefix_cache::{Epoch, PrefixCache, PrefixLease};
use super::state::EngineState;
use crate::prompt::{PromptBuilder, TextEncoder};

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Most tokens (rows) in one forward pass.
    pub max_batch_tokens: usize,
    /// Most sequences (items + prefix segments) in one forward pass.
    pub max_seqs_per_pass: usize,
    /// Longest prompt accepted, in tokens.
    pub max_seq_tokens: usize,
    /// Compute each call's shared prefix once (off: every item computes its whole prompt).
    pub prefix_reuse: bool,
}

/// A call inside a batch, with its prefix blocks.
pub struct BatchJob {
    pub tj: TokenizedJob,
    /// Tokens of the shared prefix used for this call (0 when reuse is off or unavailable).
    pub prefix_len: usize,
    pub lease: Option<PrefixLease>,
}

impl BatchJob {
    /// Prefix positions this call itself computes (`reused..prefix_len`).
    pub fn prefix_to_compute(&self) -> std::ops::Range<usize> {
        match &self.lease {
            Some(l) => l.reused..self.prefix_len,
            None => 0..0,
        }
    }

    /// Tokens of item `i` computed in its own segment.
    pub fn own_tokens(&self, i: usize) -> &[u32] {
        &self.tj.call.prompts[i][self.prefix_len..]
    }
}

/// One forward pass: prefix segments (first pass only) and items, by index into the batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PassPlan {
    pub prefix_jobs: Vec<usize>,
    pub items: Vec<(usize, usize)>,
}

pub struct PreparedBatch {
    pub epoch: Epoch,
    pub jobs: Vec<BatchJob>,
    pub passes: Vec<PassPlan>,
    pub prepared_at: Instant,
}

pub struct Scheduler {
    pub cfg: SchedulerConfig,
    pub encoder: Arc<dyn TextEncoder>,
    pub builder: PromptBuilder,
    pub cache: Arc<Mutex<PrefixCache>>,
    pub state: Arc<EngineState>,
    next_epoch: Epoch,
    waiting: VecDeque<TokenizedJob>,
}

/// Answers a job (once; later calls do nothing) and releases its queue accounting.
pub fn finish_job(state: &EngineState, tj: &mut TokenizedJob, result: super::job::JobResult) {
    if let Some(reply) = tj.job.reply.take() {
        state.sub(&state.queued_pairs, tj.queued_pairs);
        state.sub(&state.queued_tokens, tj.queued_tokens);
        state.sub(&state.in_flight_requests, 1);
        let _ = reply.send(result);
    }
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, encoder: Arc<dyn TextEncoder>, builder: PromptBuilder, cache: Arc<Mutex<PrefixCache>>, state: Arc<EngineState>) -> Self {
        Scheduler { cfg, encoder, builder, cache, state, next_epoch: 1, waiting: VecDeque::new() }
    }

    /// Runs until the submission channel closes, then lets the runner drain.
    pub fn run(mut self, jobs: Receiver<ScoreJob>, runner: SyncSender<PreparedBatch>) {
        loop {
            // Block for work only when nothing is waiting.
            if self.waiting.is_empty() {
                match jobs.recv() {
                    Ok(job) => self.admit(job),
                    Err(_) => return,
                }
            }
            // Take everything else that has arrived.
            loop {
                match jobs.recv_timeout(Duration::ZERO) {
                    Ok(job) => self.admit(job),
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            if let Some(batch) = self.next_batch() {
                // Blocks while the runner is busy and already has a batch queued: that bound
                // keeps exactly one batch prepared ahead.
                if let Err(e) = runner.send(batch) {
                    for mut job in e.0.jobs {
                        finish_job(&self.state, &mut job.tj, Err(ApiError::internal("the runner has stopped")));
                    }
                    return;
                }
            }
        }
    }

    /// Tokenizes a call and queues it, or answers it at once if it cannot run.
    fn admit(&mut self, job: ScoreJob) {
        let pairs = job.items.len() as u64;
        let result = {
            let items: Vec<&str> = job.items.iter().map(String::as_str).collect();
            self.builder.tokenize_call(self.encoder.as_ref(), job.instruction.as_deref(), &job.query, &items)
        };
        let call = match result {
            Ok(c) => c,
            Err(e) => {
                let mut tj = TokenizedJob { job, call: Default::default(), queued_pairs: pairs, queued_tokens: 0 };
                return finish_job(&self.state, &mut tj, Err(ApiError::internal(format!("tokenization failed: {e}"))));
            }
        };
        let queued_tokens = call.prefix_len as u64 + call.prompts.iter().map(|p| (p.len() - call.prefix_len) as u64).sum::<u64>();
        self.state.add(&self.state.queued_tokens, queued_tokens);
        let mut tj = TokenizedJob { job, call, queued_pairs: pairs, queued_tokens };
        if let Some((i, p)) = tj.call.prompts.iter().enumerate().find(|(_, p)| p.len() > self.cfg.max_seq_tokens) {
            let msg = format!(
                "items[{i}] makes a prompt of {} tokens (query + item + template); the limit is max_seq_tokens {}",
                p.len(),
                self.cfg.max_seq_tokens
            );
            return finish_job(&self.state, &mut tj, Err(ApiError::too_large(msg)));
        }
        self.waiting.push_back(tj);
    }

    /// Groups waiting calls into the next batch and plans it.
    fn next_batch(&mut self) -> Option<PreparedBatch> {
        let now = Instant::now();
        let mut jobs: Vec<BatchJob> = vec![];
        let mut tokens = 0usize;
        let epoch = self.next_epoch;
        while let Some(tj) = self.waiting.front() {
            if let Some(err) = tj.job.dead_reason(now) {
                let mut tj = self.waiting.pop_front()?;
                finish_job(&self.state, &mut tj, Err(err));
                continue;
            }
            let t = tj.queued_tokens as usize;
            if !jobs.is_empty() && tokens + t > self.cfg.max_batch_tokens {
                break;
            }
            let tj = self.waiting.pop_front()?;
            tokens += t;
            jobs.push(self.with_prefix(epoch, tj));
        }
        if jobs.is_empty() {
            return None;
        }
        self.next_epoch += 1;
        let passes = plan_passes(&jobs, self.cfg.max_batch_tokens, self.cfg.max_seqs_per_pass);
        Some(PreparedBatch { epoch, jobs, passes, prepared_at: now })
    }

    /// Takes prefix blocks for a call. Without room in the prefix region (everything in use by
    /// running batches), the call runs without sharing rather than waiting.
    fn with_prefix(&mut self, epoch: Epoch, tj: TokenizedJob) -> BatchJob {
        let p = tj.call.prefix_len;
        if !self.cfg.prefix_reuse || p == 0 {
            return BatchJob { tj, prefix_len: 0, lease: None };
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        match cache.acquire(epoch, tj.call.prefix()) {
            Ok(lease) => BatchJob { tj, prefix_len: p, lease: Some(lease) },
            Err(e) => {
                tracing::warn!("{e}; scoring this call without prefix sharing");
                BatchJob { tj, prefix_len: 0, lease: None }
            }
        }
    }
}

/// Splits a batch into forward passes of at most `max_tokens` rows and `max_seqs` sequences.
/// All prefix segments go first into the first pass; items follow in call order and are never
/// split across passes.
pub fn plan_passes(jobs: &[BatchJob], max_tokens: usize, max_seqs: usize) -> Vec<PassPlan> {
    let mut passes = vec![];
    let mut cur = PassPlan::default();
    let (mut rows, mut seqs) = (0usize, 0usize);
    for (j, job) in jobs.iter().enumerate() {
        let r = job.prefix_to_compute();
        if !r.is_empty() {
            cur.prefix_jobs.push(j);
            rows += r.len();
            seqs += 1;
        }
    }
    for (j, job) in jobs.iter().enumerate() {
        for i in 0..job.tj.call.prompts.len() {
            let n = job.own_tokens(i).len();
            if !cur.items.is_empty() && (rows + n > max_tokens || seqs + 1 > max_seqs) {
                passes.push(std::mem::take(&mut cur));
                rows = 0;
                seqs = 0;
            }
            cur.items.push((j, i));
            rows += n;
            seqs += 1;
        }
    }
    if !cur.items.is_empty() || !cur.prefix_jobs.is_empty() {
        passes.push(cur);
    }
    passes
}
