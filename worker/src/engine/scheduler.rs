//! The scheduler stage: tokenizes queued calls, groups them into batches, and matches and
//! allocates their prefix blocks — all while the runner executes the previous batch (the runner
//! plans each batch's passes just before running them, when it knows the time left).
//!
//! A batch is one epoch of the prefix cache. It holds either several small calls (one forward
//! pass) or one call larger than a pass (several passes). Every prefix segment a batch computes
//! goes into its first pass, so a prefix block is always written before any item — of any call
//! in the batch — reads it.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use sieve_shared::metrics_names::worker as m;
use sieve_shared::ApiError;

use super::item_groups::item_groups;
use super::job::{ScoreJob, TokenizedJob};
use super::prefix_cache::{Epoch, PrefixCache, PrefixLease};
use super::state::EngineState;
use crate::prompt::{PromptBuilder, TextEncoder};
use crate::WorkerError;

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
    /// Items of a call sharing a leading run of at least this many tokens after the prefix
    /// compute it once (`None`: off; needs `prefix_reuse`).
    pub item_sharing_min_tokens: Option<usize>,
}

/// What the scheduler thread receives.
pub enum Msg {
    Job(ScoreJob),
    /// The runner took the prepared batch: the next one may be prepared.
    RunnerFree,
    /// Finish what is queued, then stop.
    Stop,
}

/// Items of a call that share `run_len` tokens after the prefix, and the blocks of that run.
pub struct GroupRun {
    pub items: Vec<usize>,
    pub run_len: usize,
    pub lease: PrefixLease,
}

/// A call inside a batch, with its prefix blocks.
pub struct BatchJob {
    pub tj: TokenizedJob,
    /// Tokens of the shared prefix used for this call (0 when reuse is off or unavailable).
    pub prefix_len: usize,
    pub lease: Option<PrefixLease>,
    /// Groups of items sharing a run after the prefix (empty without a prefix lease).
    pub groups: Vec<GroupRun>,
    /// Per item, the index of its group in `groups`.
    pub group_of: Vec<Option<usize>>,
}

impl BatchJob {
    fn new(tj: TokenizedJob, prefix_len: usize, lease: Option<PrefixLease>) -> Self {
        let n = tj.call.prompts.len();
        BatchJob { tj, prefix_len, lease, groups: vec![], group_of: vec![None; n] }
    }

    /// Tokens of item `i` before its own segment: the prefix and its group's run.
    pub fn shared_len(&self, i: usize) -> usize {
        self.prefix_len + self.group_of[i].map_or(0, |g| self.groups[g].run_len)
    }

    /// The tokens of group `g`'s run (positions `prefix_len .. prefix_len + run_len`).
    pub fn run_tokens(&self, g: usize) -> &[u32] {
        let run = &self.groups[g];
        &self.tj.call.prompts[run.items[0]][self.prefix_len..self.prefix_len + run.run_len]
    }

    /// Positions of group `g`'s run this call computes (the rest was matched), run-relative.
    pub fn run_to_compute(&self, g: usize) -> std::ops::Range<usize> {
        self.groups[g].lease.reused..self.groups[g].run_len
    }

    /// Rows the first pass computes for this call: its prefix and its groups' runs.
    pub fn shared_rows(&self) -> usize {
        self.prefix_to_compute().len() + (0..self.groups.len()).map(|g| self.run_to_compute(g).len()).sum::<usize>()
    }

    /// Prefix positions this call itself computes (`reused..prefix_len`).
    pub fn prefix_to_compute(&self) -> std::ops::Range<usize> {
        match &self.lease {
            Some(l) => l.reused..self.prefix_len,
            None => 0..0,
        }
    }

    /// Tokens of item `i` computed in its own segment.
    pub fn own_tokens(&self, i: usize) -> &[u32] {
        &self.tj.call.prompts[i][self.shared_len(i)..]
    }

    /// Every lease of the call: its prefix's, then its groups' runs'.
    pub fn leases(&self) -> impl Iterator<Item = &PrefixLease> {
        self.lease.iter().chain(self.groups.iter().map(|g| &g.lease))
    }
}

/// One forward pass: prefix segments (first pass only) and items, by index into the batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PassPlan {
    pub prefix_jobs: Vec<usize>,
    pub items: Vec<(usize, usize)>,
}

/// A batch ready for the runner, which plans its passes when it starts it (the time left to
/// each call's deadline is known only then).
pub struct PreparedBatch {
    pub epoch: Epoch,
    pub jobs: Vec<BatchJob>,
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

impl Scheduler {
    pub fn new(
        cfg: SchedulerConfig,
        encoder: Arc<dyn TextEncoder>,
        builder: PromptBuilder,
        cache: Arc<Mutex<PrefixCache>>,
        state: Arc<EngineState>,
    ) -> Self {
        Scheduler { cfg, encoder, builder, cache, state, next_epoch: 1, waiting: VecDeque::new() }
    }

    /// Runs until told to stop (or every sender is gone) and the queue is empty.
    ///
    /// One batch is prepared ahead, and only when the runner has taken the previous one: the
    /// scheduler never blocks on the runner, so it keeps admitting calls and drops those that
    /// die while queued (waking at the earliest queued deadline to do so) however long the
    /// running batch takes.
    pub fn run(mut self, inbox: Receiver<Msg>, runner: SyncSender<PreparedBatch>) {
        let mut runner_free = true;
        let mut stopping = false;
        loop {
            let can_prepare = runner_free && !self.waiting.is_empty();
            let first = if can_prepare {
                inbox.try_recv().map_err(|e| matches!(e, TryRecvError::Disconnected))
            } else {
                match self.earliest_deadline() {
                    Some(d) => inbox
                        .recv_timeout(d.saturating_duration_since(Instant::now()))
                        .map_err(|e| matches!(e, RecvTimeoutError::Disconnected)),
                    None => inbox.recv().map_err(|_| true),
                }
            };
            let mut next = Some(first);
            // Tokens admitted this round: once a free runner has a full batch's worth, it gets
            // it now, not after the whole burst behind it is tokenized.
            let mut admitted = 0usize;
            while let Some(m) = next.take() {
                match m {
                    Ok(Msg::Job(job)) => admitted += self.admit(job),
                    Ok(Msg::RunnerFree) => runner_free = true,
                    Ok(Msg::Stop) => stopping = true,
                    Err(disconnected) => {
                        if disconnected {
                            // Nobody can send any more (not even the runner): it is gone.
                            self.fail_waiting("the runner has stopped");
                            return;
                        }
                    }
                }
                if runner_free && admitted >= self.cfg.max_batch_tokens {
                    break;
                }
                if let Ok(m) = inbox.try_recv() {
                    next = Some(Ok(m));
                }
            }
            self.drop_dead(Instant::now());
            if runner_free && !self.waiting.is_empty() {
                if let Some(batch) = self.next_batch() {
                    // Never blocks: the channel holds one batch and the runner has taken the last.
                    if let Err(e) = runner.send(batch) {
                        for job in e.0.jobs {
                            job.tj.job.answer(&self.state, Err(ApiError::internal("the runner has stopped")));
                        }
                        self.fail_waiting("the runner has stopped");
                        return;
                    }
                    runner_free = false;
                }
            }
            if stopping && self.waiting.is_empty() {
                return;
            }
        }
    }

    fn earliest_deadline(&self) -> Option<Instant> {
        self.waiting.iter().filter_map(|tj| tj.job.deadline).min()
    }

    /// Answers and removes queued calls that died (expired, cancelled, answered by their ticket).
    fn drop_dead(&mut self, now: Instant) {
        let state = self.state.clone();
        self.waiting.retain(|tj| match tj.job.dead_reason(now) {
            Some(dead) => {
                tj.job.answer_dead(&state, dead, "queued");
                false
            }
            None => true,
        });
    }

    fn fail_waiting(&mut self, why: &str) {
        for tj in self.waiting.drain(..) {
            tj.job.answer(&self.state, Err(ApiError::internal(why)));
        }
    }

    /// Tokenizes a call and queues it, or answers it at once if it cannot run. Returns the
    /// tokens queued.
    fn admit(&mut self, job: ScoreJob) -> usize {
        if job.dead_reason(Instant::now()).is_some() {
            // Answered or abandoned before it was even tokenized: drop_dead answers it.
            self.waiting.push_back(TokenizedJob { job, call: Default::default(), tokens: 0 });
            return 0;
        }
        let started = Instant::now();
        // A panic in the tokenizer fails this call alone: the scheduler thread serves every call.
        let result = catch_unwind(AssertUnwindSafe(|| {
            let items: Vec<&str> = job.items.iter().map(String::as_str).collect();
            let (enc, ins) = (self.encoder.as_ref(), job.instruction.as_deref());
            match job.truncate {
                None => self.builder.tokenize_call(enc, ins, &job.query, &items),
                Some(t) => self.builder.tokenize_truncated(enc, ins, &job.query, &items, t, self.cfg.max_seq_tokens),
            }
        }))
        .unwrap_or_else(|panic| Err(WorkerError::Tokenizer(format!("panicked: {}", super::panic_message(&*panic)))));
        metrics::histogram!(m::TOKENIZE_SECONDS).record(started.elapsed().as_secs_f64());
        let call = match result {
            Ok(c) => c,
            Err(e) => {
                job.answer(&self.state, Err(ApiError::internal(format!("tokenization failed: {e}"))));
                return 0;
            }
        };
        let queued_tokens =
            call.prefix_len as u64 + call.prompts.iter().map(|p| (p.len() - call.prefix_len) as u64).sum::<u64>();
        if !job.slot.add_tokens(&self.state, queued_tokens) {
            return 0; // answered meanwhile (its ticket gave up)
        }
        if let Some((i, p)) = call.prompts.iter().enumerate().find(|(_, p)| p.len() > self.cfg.max_seq_tokens) {
            let fix = if job.truncate.is_some() {
                "even with the item cut: shorten the query or the instruction"
            } else {
                "shorten the item or the query, or send max_item_tokens to cut items to fit"
            };
            let msg = format!(
                "items[{i}] makes a prompt of {} tokens (query + item + template), more than this worker's \
                 max_seq_tokens {} (the model's context, attention window or dynamic RoPE's context, at most \
                 4096 unless [model] max_seq_tokens says): {fix}",
                p.len(),
                self.cfg.max_seq_tokens
            );
            job.answer(&self.state, Err(ApiError::too_large(msg)));
            return 0;
        }
        self.waiting.push_back(TokenizedJob { job, call, tokens: queued_tokens });
        queued_tokens as usize
    }

    /// Groups waiting calls into the next batch (`drop_dead` has just run).
    fn next_batch(&mut self) -> Option<PreparedBatch> {
        let now = Instant::now();
        let mut jobs: Vec<BatchJob> = vec![];
        let mut tokens = 0usize;
        let epoch = self.next_epoch;
        while let Some(tj) = self.waiting.front() {
            let t = tj.tokens as usize;
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
        Some(PreparedBatch { epoch, jobs, prepared_at: now })
    }

    /// Takes prefix blocks for a call, then blocks for the runs its items share. Without room
    /// in the prefix region (everything in use by running batches), the call (or the group)
    /// runs without sharing rather than waiting.
    fn with_prefix(&mut self, epoch: Epoch, tj: TokenizedJob) -> BatchJob {
        let p = tj.call.prefix_len;
        if !self.cfg.prefix_reuse || p == 0 {
            return BatchJob::new(tj, 0, None);
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let lease = match cache.acquire(epoch, tj.call.prefix()) {
            Ok(lease) => lease,
            Err(e) => {
                tracing::warn!("{e}; scoring this call without prefix sharing");
                return BatchJob::new(tj, 0, None);
            }
        };
        let groups = match self.cfg.item_sharing_min_tokens {
            Some(min) => item_groups(&tj.call.prompts, p, min),
            None => vec![],
        };
        let mut job = BatchJob::new(tj, p, Some(lease));
        for g in groups {
            let run = &job.tj.call.prompts[g.items[0]][p..p + g.run_len];
            let Some(parent) = job.lease.as_ref() else { break };
            match cache.acquire_child(epoch, parent, run) {
                Ok(lease) => {
                    for &i in &g.items {
                        job.group_of[i] = Some(job.groups.len());
                    }
                    job.groups.push(GroupRun { items: g.items, run_len: g.run_len, lease });
                }
                Err(e) => tracing::warn!("{e}; these items are scored without sharing their run"),
            }
        }
        job
    }
}

/// How big a pass may be.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PassBudget {
    pub max_tokens: usize,
    pub max_seqs: usize,
    /// Throughput assumed until one is measured, tokens/s.
    pub prior_tokens_per_second: f64,
    /// Share of the time left to a deadline that a pass is planned to take.
    pub deadline_fraction: f64,
}

/// What the planner needs of one call: rows of its prefix segment (computed in the first pass),
/// rows of each item still to score (items `first_item..`), its deadline.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanJob {
    pub prefix_rows: usize,
    pub first_item: usize,
    pub item_rows: Vec<usize>,
    pub deadline: Option<Instant>,
}

/// Splits the rest of a batch into forward passes of at most `max_tokens` rows and `max_seqs`
/// sequences. Prefix segments all go into the first pass; items follow in call order and are
/// never split across passes. The runner plans again before every pass, from the time and
/// throughput of that moment, and runs the first pass of the plan.
///
/// Deadline-sized: a pass is also kept short enough that, at `tokens_per_second` and starting
/// when the passes before it are predicted to end, it ends within `deadline_fraction` of the
/// time left to the tightest deadline of the calls with rows in it, so the items it holds are
/// scored (and answered) before that deadline. Where no time is left, or less than one item
/// needs, passes hold one item: whatever is still scored comes soonest, and the answer at the
/// deadline waits at most one layer of a one-item pass. A pass always holds at least one item.
/// Scores do not depend on how items are grouped into passes.
pub fn plan_passes(jobs: &[PlanJob], budget: &PassBudget, tokens_per_second: f64, now: Instant) -> Vec<PassPlan> {
    let tps = if tokens_per_second > 0.0 { tokens_per_second } else { budget.prior_tokens_per_second };
    // Rows a pass starting `start_s` seconds from now may hold to meet `deadline` (1: one item).
    let cap = |deadline: Option<Instant>, start_s: f64| -> usize {
        let Some(d) = deadline else { return budget.max_tokens };
        let left = d.saturating_duration_since(now).as_secs_f64() - start_s;
        (tps * left * budget.deadline_fraction).floor().clamp(1.0, budget.max_tokens as f64) as usize
    };
    let tighter = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let mut passes = vec![];
    let mut cur = PassPlan::default();
    let (mut rows, mut seqs) = (0usize, 0usize);
    let mut start_s = 0.0f64;
    let mut tightest: Option<Instant> = None;
    for (j, job) in jobs.iter().enumerate() {
        if job.prefix_rows > 0 {
            cur.prefix_jobs.push(j);
            rows += job.prefix_rows;
            seqs += 1;
            tightest = tighter(tightest, job.deadline);
        }
    }
    for (j, job) in jobs.iter().enumerate() {
        for (k, &n) in job.item_rows.iter().enumerate() {
            let with = tighter(tightest, job.deadline);
            if !cur.items.is_empty() && (rows + n > cap(with, start_s) || seqs + 1 > budget.max_seqs) {
                passes.push(std::mem::take(&mut cur));
                start_s += rows as f64 / tps;
                rows = 0;
                seqs = 0;
                tightest = job.deadline;
            } else {
                tightest = with;
            }
            cur.items.push((j, job.first_item + k));
            rows += n;
            seqs += 1;
        }
    }
    if !cur.items.is_empty() || !cur.prefix_jobs.is_empty() {
        passes.push(cur);
    }
    passes
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn budget() -> PassBudget {
        PassBudget { max_tokens: 8192, max_seqs: 512, prior_tokens_per_second: 1000.0, deadline_fraction: 0.8 }
    }

    fn job(prefix: usize, items: usize, rows: usize, deadline: Option<Instant>) -> PlanJob {
        PlanJob { prefix_rows: prefix, first_item: 0, item_rows: vec![rows; items], deadline }
    }

    fn sizes(jobs: &[PlanJob], passes: &[PassPlan]) -> Vec<usize> {
        passes
            .iter()
            .map(|p| {
                p.prefix_jobs.iter().map(|&j| jobs[j].prefix_rows).sum::<usize>()
                    + p.items.iter().map(|&(j, i)| jobs[j].item_rows[i]).sum::<usize>()
            })
            .collect()
    }

    fn every_item_once(jobs: &[PlanJob], passes: &[PassPlan]) {
        let mut seen: Vec<(usize, usize)> = passes.iter().flat_map(|p| p.items.iter().copied()).collect();
        seen.sort_unstable();
        let want: Vec<(usize, usize)> =
            jobs.iter().enumerate().flat_map(|(j, jb)| (0..jb.item_rows.len()).map(move |i| (j, i))).collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn no_deadline_fills_passes_to_the_limit() {
        let now = Instant::now();
        let jobs = [job(100, 64, 40, None)];
        let passes = plan_passes(&jobs, &budget(), 300.0, now);
        every_item_once(&jobs, &passes);
        assert_eq!(sizes(&jobs, &passes), vec![100 + 40 * 64]);
    }

    #[test]
    fn a_tight_deadline_makes_passes_that_fit_it() {
        let now = Instant::now();
        // 300 tokens/s, 5 s left, 80%: the first pass holds at most 1200 rows.
        let jobs = [job(100, 64, 40, Some(now + Duration::from_secs(5)))];
        let passes = plan_passes(&jobs, &budget(), 300.0, now);
        every_item_once(&jobs, &passes);
        let s = sizes(&jobs, &passes);
        // 1180 rows; the next pass starts at 1180/300 = 3.93 s: 1.07 s left, 80% of it is 256
        // rows: 6 items; then 0.27 s left: 64 rows, one item; from then on less than an item
        // fits: one item per pass.
        assert_eq!(s[..3], [100 + 40 * 27, 40 * 6, 40], "{s:?}");
        assert_eq!(s[3..], vec![40; 64 - 27 - 6 - 1], "{s:?}");
        // The measured throughput decides: 10x faster, one pass.
        assert_eq!(plan_passes(&jobs, &budget(), 3000.0, now).len(), 1);
        // Before any measurement, the prior (1000/s): 4000 rows fit.
        assert_eq!(sizes(&jobs, &plan_passes(&jobs, &budget(), 0.0, now)), vec![100 + 40 * 64]);
    }

    #[test]
    fn never_below_one_item_and_the_tightest_call_in_the_pass_decides() {
        let now = Instant::now();
        // 50 ms at 300/s is 12 rows: less than one item, and a pass holds one item anyway.
        let tight = [job(0, 3, 40, Some(now + Duration::from_millis(50)))];
        let passes = plan_passes(&tight, &budget(), 300.0, now);
        assert_eq!(sizes(&tight, &passes), vec![40; 3], "one item per pass");
        // Planning the rest of a call (items 2.. of 3): indices are the call's.
        let rest = [PlanJob { first_item: 2, ..job(0, 1, 40, None) }];
        assert_eq!(plan_passes(&rest, &budget(), 300.0, now)[0].items, vec![(0, 2)]);
        let medium = [job(0, 10, 40, Some(now + Duration::from_millis(520)))];
        // 0.52 s x 300 x 0.8 = 124 rows: 3 items.
        assert_eq!(sizes(&medium, &plan_passes(&medium, &budget(), 300.0, now))[0], 120);
        // A relaxed call batched with a tight one shares the tight one's passes while they overlap.
        let mixed = [job(0, 2, 40, Some(now + Duration::from_millis(310))), job(0, 40, 40, None)];
        let passes = plan_passes(&mixed, &budget(), 300.0, now);
        every_item_once(&mixed, &passes);
        let s = sizes(&mixed, &passes);
        // 0.31 s x 240 = 74 rows: one item; then 40/300 = 0.133 s gone, 0.177 x 240 = 42: one
        // more; then the relaxed call alone fills a full pass.
        assert_eq!(s, vec![40, 40, 40 * 40], "{s:?}");
    }

    #[test]
    fn sequence_limit_still_applies() {
        let now = Instant::now();
        let jobs = [job(10, 10, 5, None)];
        let b = PassBudget { max_seqs: 4, ..budget() };
        let passes = plan_passes(&jobs, &b, 300.0, now);
        every_item_once(&jobs, &passes);
        assert_eq!(passes[0].items.len(), 3, "the prefix segment is a sequence too");
        assert!(passes[1..].iter().all(|p| p.items.len() <= 4));
    }
}
