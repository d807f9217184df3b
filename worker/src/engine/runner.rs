//! The runner stage: owns the backend, the model and the KV cache on one thread, executes
//! prepared batches pass by pass, and commits or rolls back each batch's prefix blocks.
//!
//! Deadlines and cancellation are checked at every layer: a call found dead is answered there
//! (with the items scored in earlier passes, if any), and a pass that no live call needs any
//! more is abandoned mid-forward. A batch that stops early rolls its pending prefix blocks back,
//! exactly like a failed one, so no half-written block is ever matched.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use sieve_kernels::{Backend, BatchLayout};
use sieve_shared::metrics_names::worker as m;
use sieve_shared::{ApiError, Usage};

use super::job::{count_expired, Dead, JobOutput, JobResult};
use super::layout::{segment_slots, LayoutBuilder};
use super::prefix_cache::{Epoch, PrefixCache};
use super::scheduler::{plan_passes, BatchJob, Msg, PassBudget, PlanJob, PreparedBatch};
use super::state::EngineState;
use crate::model::{Model, Scratch};
use crate::{Result, WorkerError};

/// Called at every layer of every pass with (epoch, pass, layer); an error fails the batch.
/// Tests use it to inject faults mid-forward (or to make layers slow).
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
    pub budget: PassBudget,
    /// Told each time a batch is taken, so that the scheduler prepares the next.
    pub scheduler: Sender<Msg>,
}

/// Per-call progress inside a batch.
struct Progress {
    scores: Vec<Option<f32>>,
    computed_tokens: u64,
    compute_s: f64,
    started: Option<Instant>,
    /// Still wanted and not answered.
    alive: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Answers every live call found dead at `now`: with its scored items if it has any (a partial
/// answer), else 504. Returns whether any call in `owners` is still alive.
fn reap(state: &EngineState, jobs: &[BatchJob], progress: &mut [Progress], now: Instant, owners: &[usize]) -> bool {
    for (j, job) in jobs.iter().enumerate() {
        let p = &mut progress[j];
        if !p.alive {
            continue;
        }
        let Some(dead) = job.tj.job.dead_reason(now) else { continue };
        p.alive = false;
        match dead {
            // Past its deadline with items scored: those are answered (`missing` lists the rest).
            Dead::Expired(_) if p.scores.iter().any(Option::is_some) => {
                let result = output(state, job, p);
                let partial = matches!(&result, Ok(o) if !o.missing.is_empty());
                if job.tj.job.answer(state, result) && partial {
                    count_expired(state, "running");
                    state.partial_answers.add(1);
                    metrics::counter!(m::PARTIAL_ANSWERS).increment(1);
                }
            }
            dead => job.tj.job.answer_dead(state, dead, "running"),
        }
    }
    owners.iter().any(|&j| progress[j].alive)
}

/// A call's answer from its progress: the scores it has (`missing` lists the others), or a 500
/// naming the items whose score is not a finite number.
/// Run tokens the call's scored items did not compute themselves: per group, the run once per
/// scored member, less what the call computed of it.
fn item_shared_tokens(job: &BatchJob, p: &Progress) -> u64 {
    (0..job.groups.len())
        .map(|g| {
            let scored = job.groups[g].items.iter().filter(|&&i| p.scores[i].is_some()).count();
            (job.groups[g].run_len * scored).saturating_sub(job.run_to_compute(g).len()) as u64
        })
        .sum()
}

fn output(state: &EngineState, job: &BatchJob, p: &Progress) -> JobResult {
    let bad: Vec<usize> =
        p.scores.iter().enumerate().filter(|(_, s)| matches!(s, Some(v) if !v.is_finite())).map(|(i, _)| i).collect();
    if !bad.is_empty() {
        state.nonfinite_scores.add(bad.len() as u64);
        metrics::counter!(m::NONFINITE_SCORES).increment(bad.len() as u64);
        let named: Vec<String> = bad.iter().take(8).map(|i| format!("items[{i}]")).collect();
        let more = if bad.len() > 8 { format!(" and {} more", bad.len() - 8) } else { String::new() };
        let msg = format!(
            "the model produced a non-finite score for {}{more}: the model or its configuration is broken",
            named.join(", ")
        );
        tracing::error!("{msg}");
        return Err(ApiError::internal(msg));
    }
    let call = &job.tj.call;
    let missing: Vec<usize> = p.scores.iter().enumerate().filter(|(_, s)| s.is_none()).map(|(i, _)| i).collect();
    let scored = (call.prompts.len() - missing.len()) as u64;
    let prefix = call.prefix_len as u64;
    let (reused, reused_committed) =
        job.lease.as_ref().map(|l| (l.reused as u64, l.reused_committed as u64)).unwrap_or((0, 0));
    // Prefix demand is P per pair: computed once (less what was matched), the rest reused.
    let computed_prefix = if job.lease.is_some() { prefix - reused } else { prefix * scored };
    let cross = reused_committed * scored;
    let prompt_tokens: u64 =
        call.prompts.iter().zip(&p.scores).filter(|(_, s)| s.is_some()).map(|(q, _)| q.len() as u64).sum();
    state.prefix_tokens_computed.add(computed_prefix);
    state.prefix_tokens_reused_cross_batch.add(cross);
    state.prefix_tokens_reused_in_batch.add((prefix * scored).saturating_sub(computed_prefix + cross));
    state.pairs_processed.add(scored);
    state.requests_processed.add(1);
    state.prompt_tokens.add(prompt_tokens);
    let usage = Usage {
        pairs: scored as u32,
        prompt_tokens,
        computed_tokens: p.computed_tokens,
        prefix_tokens: call.prefix_len as u32,
        cached_prefix_tokens: reused_committed as u32,
        cached_items: 0,
        item_tokens: call.prompts.iter().map(|q| (q.len() - call.prefix_len) as u32).collect(),
        item_shared_tokens: item_shared_tokens(job, p),
        truncated_items: call.truncated,
    };
    let arrived = job.tj.job.arrived;
    let queue_ms = p.started.map(|s| s.duration_since(arrived).as_secs_f64() * 1e3).unwrap_or(0.0);
    Ok(JobOutput { scores: p.scores.clone(), missing, usage, queue_ms, compute_ms: p.compute_s * 1e3 })
}

impl<B: Backend> Runner<B> {
    pub fn run(mut self, batches: Receiver<PreparedBatch>) {
        let mut idle_since = Instant::now();
        loop {
            let work_waiting = self.state.queued_pairs.get() > 0;
            let Ok(batch) = batches.recv() else { return };
            let _ = self.scheduler.send(Msg::RunnerFree);
            let idle = idle_since.elapsed().as_nanos() as u64;
            self.state.runner_idle_ns.add(idle);
            if work_waiting {
                self.state.runner_idle_with_work_ns.add(idle);
            }
            metrics::histogram!(m::RUNNER_IDLE_SECONDS).record(idle as f64 / 1e9);
            let t0 = Instant::now();
            self.execute(batch);
            self.state.runner_busy_ns.add(t0.elapsed().as_nanos() as u64);
            idle_since = Instant::now();
        }
    }

    /// One batch: its passes one after another (each planned, run and settled), then the batch
    /// settled (its prefix blocks committed or rolled back) and every call still waiting
    /// answered.
    fn execute(&mut self, batch: PreparedBatch) {
        self.state.batches.add(1);
        let mut run = BatchRun::new(&batch, self.block_size);
        let end = self.run_passes(&mut run);
        self.settle_batch(&run, &end);
        self.reply(run, end);
    }

    /// Runs the batch's passes until every item is scored, no live call wants the rest, or a
    /// pass fails.
    fn run_passes(&mut self, run: &mut BatchRun<'_>) -> BatchEnd {
        let mut next_pass = 0usize;
        loop {
            let pi = next_pass;
            next_pass += 1;
            let pass = match self.plan(run, pi) {
                Planned::Pass(p) => p,
                Planned::Empty => continue,
                Planned::Done => return BatchEnd::Done,
                Planned::NobodyWaits => return BatchEnd::Stopped,
            };
            match self.forward(run, &pass) {
                Ran::Scores { scores, secs } => self.settle_pass(run, &pass, scores, secs),
                Ran::Abandoned => {
                    self.state.passes_abandoned.add(1);
                    self.state.rows_abandoned.add(pass.rows as u64);
                    metrics::counter!(m::PASSES_ABANDONED).increment(1);
                    metrics::counter!(m::ROWS_ABANDONED).increment(pass.rows as u64);
                    if pi == 0 || !lock(&run.progress).iter().any(|p| p.alive) {
                        return BatchEnd::Stopped;
                    }
                }
                Ran::Failed(e) => return BatchEnd::Failed(e),
            }
        }
    }

    /// Plan: answers calls found dead, sizes the next pass from this moment's time and
    /// throughput, and lays out its rows (prefix segments, then the items of live calls, each
    /// item's own KV in the scratch region).
    fn plan(&self, run: &mut BatchRun<'_>, pi: usize) -> Planned {
        let jobs = run.jobs;
        let now = Instant::now();
        let planned = {
            let mut prog = lock(&run.progress);
            if !reap(&self.state, jobs, &mut prog, now, &run.everyone) {
                return Planned::NobodyWaits;
            }
            // Planned now, from this moment's time and throughput; the first pass of the
            // plan runs. Prefix segments go in the first pass even for a call that died:
            // another call of the batch may be matched to its pending blocks.
            let plan: Vec<PlanJob> = jobs
                .iter()
                .enumerate()
                .map(|(j, job)| PlanJob {
                    prefix_rows: if pi == 0 { job.shared_rows() } else { 0 },
                    first_item: run.next_item[j],
                    item_rows: if prog[j].alive {
                        (run.next_item[j]..job.tj.call.prompts.len()).map(|i| job.own_tokens(i).len()).collect()
                    } else {
                        vec![]
                    },
                    deadline: job.tj.job.deadline,
                })
                .collect();
            match plan_passes(&plan, &self.budget, self.state.tokens_per_second(), now).into_iter().next() {
                Some(p) => p,
                None => return Planned::Done,
            }
        };
        for &(j, i) in &planned.items {
            run.next_item[j] = run.next_item[j].max(i + 1);
        }
        let mut lb = LayoutBuilder::new();
        if pi == 0 {
            for &j in &planned.prefix_jobs {
                let job = &jobs[j];
                let r = job.prefix_to_compute();
                lb.push(&job.tj.call.prompts[0][r], &run.prefix_slots[j]);
                for g in 0..job.groups.len() {
                    let r = job.run_to_compute(g);
                    let ctx = &run.group_slots[j][g];
                    lb.push(&job.run_tokens(g)[r], &ctx[..job.prefix_len + job.groups[g].run_len]);
                }
            }
        }
        let mut next_block = self.scratch.first_block;
        let mut out_rows = vec![];
        let mut targets = vec![];
        {
            let prog = lock(&run.progress);
            for &(j, i) in &planned.items {
                if !prog[j].alive {
                    continue;
                }
                let own = jobs[j].own_tokens(i);
                let n_blocks = own.len().div_ceil(self.block_size);
                let blocks: Vec<u32> = (next_block..next_block + n_blocks as u32).collect();
                next_block += n_blocks as u32;
                debug_assert!((next_block - self.scratch.first_block) as usize <= self.scratch.num_blocks);
                let shared = match jobs[j].group_of[i] {
                    Some(g) => &run.group_slots[j][g],
                    None => &run.prefix_slots[j],
                };
                let ctx: Vec<u32> =
                    shared.iter().copied().chain(segment_slots(&blocks, self.block_size, own.len())).collect();
                if let Some(row) = lb.push(own, &ctx) {
                    out_rows.push(row);
                    targets.push((j, i));
                }
            }
        }
        let rows = lb.num_rows();
        if rows == 0 {
            return Planned::Empty;
        }
        // Whom the pass works for: the first pass computes prefix blocks any call of the
        // batch may read, so it is needed while any call lives.
        let owners: Vec<usize> = if pi == 0 {
            run.everyone.clone()
        } else {
            let mut o: Vec<usize> = targets.iter().map(|&(j, _)| j).collect();
            o.dedup();
            o
        };
        Planned::Pass(Box::new(Pass {
            index: pi,
            layout: lb.finish(),
            out_rows,
            targets,
            owners,
            prefix_jobs: planned.prefix_jobs,
            rows,
        }))
    }

    /// Run: the forward pass and the score head, a panic caught as a failure; at every layer the
    /// fault hook (tests) runs and dead calls are answered, and the pass is abandoned once none
    /// of its owners lives.
    fn forward(&mut self, run: &BatchRun<'_>, pass: &Pass) -> Ran {
        let t = Instant::now();
        {
            let mut prog = lock(&run.progress);
            for &(j, _) in &pass.targets {
                prog[j].started.get_or_insert(t);
            }
        }
        // One span per call in the pass, each under its call's span (carried in the job: this
        // thread has no span context of its own). No allocation when tracing is off.
        let _pass_spans: Vec<tracing::Span> = if sieve_server::trace::enabled() {
            let traced = pass.owners.iter().filter_map(|&j| run.jobs[j].tj.job.trace.as_deref());
            traced
                .map(|t| sieve_server::span!(parent: &t.span, "forward_pass", pass = pass.index as i64, rows = pass.rows as i64))
                .collect()
        } else {
            Vec::new()
        };
        let (state, epoch, pi) = (&self.state, run.epoch, pass.index);
        let fault = self.fault.clone();
        let abandoned = AtomicBool::new(false);
        let hook = |layer: usize| -> Result<()> {
            if let Some(f) = &fault {
                f(epoch, pi, layer)?;
            }
            if !reap(state, run.jobs, &mut lock(&run.progress), Instant::now(), &pass.owners) {
                abandoned.store(true, Ordering::Relaxed);
                return Err(WorkerError::Api(ApiError::deadline(format!("pass abandoned at layer {layer}"))));
            }
            Ok(())
        };
        state.pass_running.store(true, Ordering::Relaxed);
        let result = catch_unwind(AssertUnwindSafe(|| -> Result<Vec<f32>> {
            let hidden = self.model.forward(
                &self.backend,
                &pass.layout,
                &mut self.kv,
                &pass.out_rows,
                Some(&hook),
                &mut self.scratch_tensors,
            )?;
            self.model.head.scores(&self.backend, hidden)
        }));
        state.pass_running.store(false, Ordering::Relaxed);
        let secs = t.elapsed().as_secs_f64();
        if abandoned.load(Ordering::Relaxed) {
            return Ran::Abandoned;
        }
        match result {
            Ok(Ok(scores)) => Ran::Scores { scores, secs },
            Ok(Err(e)) => Ran::Failed(ApiError::internal(format!("forward pass failed: {e}"))),
            Err(panic) => {
                Ran::Failed(ApiError::internal(format!("forward pass panicked: {}", super::panic_message(&*panic))))
            }
        }
    }

    /// Settle a pass: MoE and throughput figures, the first pass's prefix blocks marked
    /// written, the scores and computed tokens credited to their calls.
    fn settle_pass(&self, run: &BatchRun<'_>, pass: &Pass, scores: Vec<f32>, secs: f64) {
        let (state, jobs) = (&self.state, run.jobs);
        if self.model.config.moe.is_some() {
            state.moe.record_pass(&self.scratch_tensors.moe.pass, secs);
        }
        state.forward_passes.add(1);
        state.tokens_computed.add(pass.rows as u64);
        state.observe_pass(pass.rows as u64, secs);
        metrics::histogram!(m::FORWARD_SECONDS).record(secs);
        metrics::histogram!(m::BATCH_TOKENS).record(pass.rows as f64);
        let mut prog = lock(&run.progress);
        if pass.index == 0 {
            let mut cache = lock(&self.cache);
            for l in jobs.iter().flat_map(BatchJob::leases) {
                cache.mark_written(l);
            }
            for &j in &pass.prefix_jobs {
                prog[j].computed_tokens += jobs[j].shared_rows() as u64;
            }
        }
        let mut in_pass = vec![false; prog.len()];
        for (&(j, i), s) in pass.targets.iter().zip(scores) {
            prog[j].scores[i] = Some(s);
            prog[j].computed_tokens += jobs[j].own_tokens(i).len() as u64;
            in_pass[j] = true;
        }
        for (j, p) in prog.iter_mut().enumerate() {
            if in_pass[j] {
                p.compute_s += secs;
            }
        }
    }

    /// Settle the batch: its pending prefix blocks committed when every pass ran and every
    /// score is finite, else rolled back; the batch's leases released.
    fn settle_batch(&self, run: &BatchRun<'_>, end: &BatchEnd) {
        // A non-finite score may come from the prefix's KV: never keep it for later calls.
        let nonfinite =
            lock(&run.progress).iter().any(|p| p.scores.iter().any(|s| matches!(s, Some(v) if !v.is_finite())));
        let mut cache = lock(&self.cache);
        if !matches!(end, BatchEnd::Done) || nonfinite {
            cache.rollback(run.epoch);
        } else {
            cache.commit(run.epoch);
        }
        for l in run.jobs.iter().flat_map(BatchJob::leases) {
            cache.release(l);
        }
    }

    /// Reply: a failed batch answers every call with its error; otherwise calls that died after
    /// the last check are answered as dead (partial where scored), and the others with their
    /// scores and usage.
    fn reply(&self, run: BatchRun<'_>, end: BatchEnd) {
        let state = &self.state;
        let jobs = run.jobs;
        if let BatchEnd::Failed(err) = end {
            state.batch_failures.add(1);
            tracing::error!(epoch = run.epoch, "batch failed: {}", err.message);
            for job in jobs {
                job.tj.job.answer(state, Err(err.clone()));
            }
            return;
        }
        let mut prog = run.progress.into_inner().unwrap_or_else(|e| e.into_inner());
        reap(state, jobs, &mut prog, Instant::now(), &[]);
        for (job, p) in jobs.iter().zip(&prog) {
            if p.alive {
                job.tj.job.answer(state, output(state, job, p));
            }
        }
    }
}

/// One batch on the runner: its calls, their progress, and where each call's prefix KV lives.
struct BatchRun<'a> {
    epoch: Epoch,
    jobs: &'a [BatchJob],
    /// Shared with the layer hook, which answers calls found dead mid-forward.
    progress: Mutex<Vec<Progress>>,
    prefix_slots: Vec<Vec<u32>>,
    /// Per call, per group: the slots of its prefix then its run.
    group_slots: Vec<Vec<Vec<u32>>>,
    /// Every call's index: the owners of a first pass, and the calls checked between passes.
    everyone: Vec<usize>,
    /// Per call, the first item not yet given a pass.
    next_item: Vec<usize>,
}

impl<'a> BatchRun<'a> {
    fn new(batch: &'a PreparedBatch, block_size: usize) -> Self {
        let jobs = &batch.jobs;
        let progress = jobs
            .iter()
            .map(|j| Progress {
                scores: vec![None; j.tj.call.prompts.len()],
                computed_tokens: 0,
                compute_s: 0.0,
                started: None,
                // Answered while it waited for the runner (its ticket at the deadline): skip.
                alive: {
                    j.tj.job.end_queue_wait();
                    j.tj.job.slot.start_running()
                },
            })
            .collect();
        let prefix_slots = jobs
            .iter()
            .map(|j| match &j.lease {
                Some(l) => segment_slots(&l.blocks, block_size, j.prefix_len).collect(),
                None => vec![],
            })
            .collect();
        let group_slots = jobs
            .iter()
            .zip(&prefix_slots)
            .map(|(j, pre): (&BatchJob, &Vec<u32>)| {
                j.groups
                    .iter()
                    .map(|g| pre.iter().copied().chain(segment_slots(&g.lease.blocks, block_size, g.run_len)).collect())
                    .collect()
            })
            .collect();
        BatchRun {
            epoch: batch.epoch,
            jobs,
            progress: Mutex::new(progress),
            prefix_slots,
            group_slots,
            everyone: (0..jobs.len()).collect(),
            next_item: vec![0; jobs.len()],
        }
    }
}

/// One planned pass: its rows and, per output row, the (call, item) it scores.
struct Pass {
    index: usize,
    layout: BatchLayout,
    out_rows: Vec<u32>,
    targets: Vec<(usize, usize)>,
    /// The calls the pass works for: it is abandoned once none of them lives.
    owners: Vec<usize>,
    /// Calls whose prefix segment this (first) pass computes.
    prefix_jobs: Vec<usize>,
    rows: usize,
}

enum Planned {
    Pass(Box<Pass>),
    /// Nothing to compute in this pass (its items' calls died): plan the next.
    Empty,
    /// Every item has had its pass.
    Done,
    /// No live call is left.
    NobodyWaits,
}

enum Ran {
    Scores {
        scores: Vec<f32>,
        secs: f64,
    },
    /// Stopped between layers: none of the pass's owners lives.
    Abandoned,
    Failed(ApiError),
}

/// How a batch ended: every pass ran, it stopped early (nobody wanted the rest), or it failed.
enum BatchEnd {
    Done,
    Stopped,
    Failed(ApiError),
}
