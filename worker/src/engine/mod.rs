//! The serving engine: a three-stage pipeline.
//!
//! ```text
//! HTTP handlers ──submit──▶ scheduler thread ──PreparedBatch (1 ahead)──▶ runner thread
//!   (validate, admit)        tokenize, batch, match            forward passes, score,
//!                            and allocate prefix blocks         commit/rollback, reply
//! ```
//! While the runner executes batch N the scheduler prepares batch N+1, and the replies of batch
//! N−1 are serialised by the HTTP side; the runner's idle time between batches is measured.
//!
//! Deadlines hold inside this schedule: the runner sizes each pass to the tightest deadline of
//! the calls in it (from the measured throughput), checks between layers whether anyone still
//! wants the running pass (deadline passed, or the caller went away: a [`CancellationToken`]),
//! and answers a call at its deadline with the items scored so far (`missing` lists the rest).
//! A call still waiting is answered 504 by its [`Ticket`] the moment its deadline passes.

pub mod blocks;
pub mod item_groups;
pub mod job;
pub mod layout;
pub mod prefix_cache;
pub mod runner;
pub mod scheduler;
pub mod state;
#[cfg(test)]
mod tests;

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sieve_kernels::{Backend, KernelError};
use sieve_shared::ApiError;
pub use tokio_util::sync::CancellationToken;

use crate::config::DEFAULT_ITEM_SHARING_MIN_TOKENS;
use crate::model::Model;
use crate::prompt::{PromptBuilder, TextEncoder};
pub use job::{CallSlot, CallSpans, JobOutput, JobResult, ScoreJob, Ticket};
pub use prefix_cache::{PrefixCache, PrefixCacheConfig, PrefixCacheSnapshot};
pub use runner::FaultHook;
use runner::{Runner, ScratchRegion};
use scheduler::{Msg, PassBudget, Scheduler, SchedulerConfig};
pub use state::EngineState;

#[derive(Clone)]
pub struct EngineConfig {
    pub max_batch_tokens: usize,
    pub max_seqs_per_pass: usize,
    pub max_seq_tokens: usize,
    /// Pairs accepted but not yet scored, beyond which calls get 429.
    pub max_queued_pairs: usize,
    /// Calls in the engine at once, beyond which calls get 429.
    pub max_in_flight_requests: usize,
    pub block_size: usize,
    /// Blocks of the prefix region (shared prefixes, in-batch and cached).
    pub prefix_cache_blocks: usize,
    pub prefix_cache: PrefixCacheConfig,
    /// Throughput assumed for sizing passes until the first pass is measured, tokens/s.
    pub prior_tokens_per_second: f64,
    /// Share of a call's remaining time that the pass holding it is planned to take (the rest is
    /// margin for the estimate's error), in (0, 1].
    pub deadline_pass_fraction: f64,
    /// Threads that tokenize a call's items (0 = all cores, 1 = the scheduler thread alone).
    pub tokenize_threads: usize,
    /// Items of a call that share a leading run of at least this many tokens after the query
    /// prefix compute it once (`None`: off). Needs prefix reuse.
    pub item_sharing_min_tokens: Option<usize>,
    pub fault: Option<FaultHook>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_batch_tokens: 8192,
            max_seqs_per_pass: 512,
            max_seq_tokens: 2048,
            max_queued_pairs: 16_384,
            max_in_flight_requests: 512,
            block_size: 16,
            prefix_cache_blocks: 1024,
            prefix_cache: PrefixCacheConfig::default(),
            prior_tokens_per_second: 1000.0,
            deadline_pass_fraction: 0.8,
            tokenize_threads: 0,
            item_sharing_min_tokens: Some(DEFAULT_ITEM_SHARING_MIN_TOKENS),
            fault: None,
        }
    }
}

impl EngineConfig {
    /// Blocks of the scratch region: enough for any pass the scheduler plans.
    pub fn scratch_blocks(&self) -> usize {
        self.max_batch_tokens.div_ceil(self.block_size.max(1)).saturating_add(self.max_seqs_per_pass)
    }

    /// KV slots of the prefix and scratch regions; a config error naming the settings when there
    /// are none or more than the slot ids (`u32`) can name.
    pub fn total_slots(&self) -> crate::Result<usize> {
        let slots = self
            .prefix_cache_blocks
            .checked_add(self.scratch_blocks())
            .and_then(|b| b.checked_mul(self.block_size))
            .filter(|&s| s > 0 && s <= u32::MAX as usize);
        slots.ok_or_else(|| {
            let wanted = (self.prefix_cache_blocks as u128 + self.scratch_blocks() as u128) * self.block_size as u128;
            crate::WorkerError::Config(format!(
                "engine: {wanted} KV slots {}: need 1 to {}; {}",
                self.slots_formula(),
                u32::MAX,
                Self::SLOTS_HINT
            ))
        })
    }

    const SLOTS_HINT: &str =
        "lower engine.prefix_cache_blocks, engine.max_batch_tokens, engine.max_seqs_per_pass or engine.kv_block_size";

    fn slots_formula(&self) -> String {
        format!(
            "= (prefix_cache_blocks {} + scratch blocks {} [max_batch_tokens {} / kv_block_size + \
             max_seqs_per_pass {}]) x kv_block_size {}",
            self.prefix_cache_blocks,
            self.scratch_blocks(),
            self.max_batch_tokens,
            self.max_seqs_per_pass,
            self.block_size
        )
    }

    fn pass_budget(&self) -> PassBudget {
        PassBudget {
            max_tokens: self.max_batch_tokens,
            max_seqs: self.max_seqs_per_pass,
            prior_tokens_per_second: self.prior_tokens_per_second,
            deadline_fraction: self.deadline_pass_fraction,
        }
    }
}

/// What the engine is built from: a loaded model on its backend, and the prompt side.
pub struct EngineParts<B: Backend> {
    pub backend: B,
    pub model: Model<B>,
    pub encoder: Arc<dyn TextEncoder>,
    pub builder: PromptBuilder,
}

/// The HTTP side's handle on a running engine.
pub struct EngineHandle {
    tx: Mutex<Option<mpsc::Sender<Msg>>>,
    pub state: Arc<EngineState>,
    pub cache: Arc<Mutex<PrefixCache>>,
    pub cfg: EngineConfig,
    /// Decoder layers of the model (cancellation is checked at each).
    pub n_layers: usize,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

/// A scoring call as submitted.
pub struct Submission {
    pub query: String,
    pub items: Vec<String>,
    pub instruction: Option<String>,
    pub arrived: Instant,
    pub deadline: Option<Duration>,
    /// Cancelled when the caller goes away; the engine then drops the call's work, at the next
    /// layer if it is running.
    pub cancel: CancellationToken,
    /// The call's span (its request's), parent of its queue and forward-pass spans;
    /// `Span::none()` when tracing is off or the call is not traced.
    pub span: tracing::Span,
    /// Cut items as the caller asked (capped by the server's limit); `None`: cut nothing.
    pub truncate: Option<crate::prompt::Truncate>,
}

impl EngineHandle {
    /// Starts the scheduler and runner threads. The KV cache is allocated here.
    pub fn start<B: Backend>(
        parts: EngineParts<B>,
        cfg: EngineConfig,
        state: Arc<EngineState>,
    ) -> crate::Result<Arc<Self>> {
        let fraction_ok = cfg.deadline_pass_fraction > 0.0 && cfg.deadline_pass_fraction <= 1.0;
        if !fraction_ok || cfg.prior_tokens_per_second.is_nan() || cfg.prior_tokens_per_second <= 0.0 {
            return Err(crate::WorkerError::Config(format!(
                "deadline_pass_fraction {} must be in (0, 1] and prior_tokens_per_second {} > 0",
                cfg.deadline_pass_fraction, cfg.prior_tokens_per_second
            )));
        }
        if cfg.max_seq_tokens > cfg.max_batch_tokens {
            return Err(crate::WorkerError::Config(format!(
                "max_seq_tokens {} > max_batch_tokens {}: a prompt must fit one forward pass",
                cfg.max_seq_tokens, cfg.max_batch_tokens
            )));
        }
        let c = &parts.model.config;
        let n_layers = c.n_layers;
        let kv =
            parts.backend.kv_cache(c.n_layers, cfg.total_slots()?, c.n_kv_heads, c.head_dim).map_err(|e| match e {
                KernelError::OutOfMemory(m) => crate::WorkerError::Config(format!(
                    "engine: no room for the KV cache of the slots {}: {m}; {}",
                    cfg.slots_formula(),
                    EngineConfig::SLOTS_HINT
                )),
                e => e.into(),
            })?;
        let cache = Arc::new(Mutex::new(PrefixCache::new(
            0,
            cfg.prefix_cache_blocks,
            cfg.block_size,
            cfg.prefix_cache.clone(),
        )));
        let (job_tx, job_rx) = mpsc::channel::<Msg>();
        let (batch_tx, batch_rx) = mpsc::sync_channel(1);
        let scheduler = Scheduler::new(
            SchedulerConfig {
                max_batch_tokens: cfg.max_batch_tokens,
                max_seqs_per_pass: cfg.max_seqs_per_pass,
                max_seq_tokens: cfg.max_seq_tokens,
                prefix_reuse: cfg.prefix_cache.enabled,
                item_sharing_min_tokens: cfg.item_sharing_min_tokens,
            },
            crate::tokenize_pool::PooledEncoder::wrap(parts.encoder, cfg.tokenize_threads)?,
            parts.builder,
            cache.clone(),
            state.clone(),
        );
        let scratch_tensors = crate::model::Scratch::new(&parts.backend)?;
        let runner = Runner {
            scratch_tensors,
            backend: parts.backend,
            model: parts.model,
            kv,
            block_size: cfg.block_size,
            scratch: ScratchRegion { first_block: cfg.prefix_cache_blocks as u32, num_blocks: cfg.scratch_blocks() },
            cache: cache.clone(),
            state: state.clone(),
            fault: cfg.fault.clone(),
            budget: cfg.pass_budget(),
            scheduler: job_tx.clone(),
        };
        let t1 = std::thread::Builder::new()
            .name("sieve-scheduler".into())
            .spawn(move || scheduler.run(job_rx, batch_tx))?;
        let t2 = std::thread::Builder::new().name("sieve-runner".into()).spawn(move || runner.run(batch_rx))?;
        state.ready.store(true, std::sync::atomic::Ordering::Release);
        Ok(Arc::new(EngineHandle {
            tx: Mutex::new(Some(job_tx)),
            state,
            cache,
            cfg,
            n_layers,
            threads: Mutex::new(vec![t1, t2]),
        }))
    }

    /// Queues a call, or refuses it at once when the engine is over its limits.
    pub fn submit(&self, s: Submission) -> Result<Ticket, ApiError> {
        let st = &self.state;
        if st.draining.load(std::sync::atomic::Ordering::Acquire) {
            return Err(ApiError::not_ready("draining: not accepting new work"));
        }
        let pairs = s.items.len() as u64;
        let queued = st.queued_pairs.get();
        if queued > 0 && queued + pairs > self.cfg.max_queued_pairs as u64 {
            return Err(ApiError::overloaded(format!(
                "overloaded: {queued} pairs queued, {pairs} more would pass max_queued_pairs {}",
                self.cfg.max_queued_pairs
            )));
        }
        if st.in_flight_requests.get() >= self.cfg.max_in_flight_requests as u64 {
            return Err(ApiError::overloaded(format!(
                "overloaded: max_in_flight_requests {} reached",
                self.cfg.max_in_flight_requests
            )));
        }
        let deadline = s.deadline.map(|d| s.arrived + d);
        let (ticket, slot) = Ticket::new(st.clone(), pairs, s.arrived, deadline);
        // Opened before the job is built (it takes the items); no span, no box, when off.
        let trace = (!s.span.is_none()).then(|| {
            let queue = sieve_server::span!(parent: &s.span, "queue", items = s.items.len() as i64);
            Box::new(CallSpans { queue: Mutex::new(queue), span: s.span })
        });
        let job = ScoreJob {
            instruction: s.instruction,
            query: s.query,
            items: s.items,
            arrived: s.arrived,
            deadline,
            cancel: s.cancel,
            slot,
            trace,
            truncate: s.truncate,
            state: self.state.clone(),
        };
        st.queued_pairs.add(pairs);
        st.in_flight_requests.add(1);
        let refused = match self.tx.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            Some(tx) => tx.send(Msg::Job(job)).err().map(|e| e.0),
            None => Some(Msg::Job(job)),
        };
        if let Some(Msg::Job(job)) = refused {
            job.answer(st, Err(ApiError::not_ready("the engine has stopped")));
            return Err(ApiError::not_ready("the engine has stopped"));
        }
        Ok(ticket)
    }

    pub fn prefix_snapshot(&self) -> PrefixCacheSnapshot {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).snapshot()
    }

    /// Why the engine can no longer serve, if one of its threads has ended while it was not
    /// shut down (a panic outside the parts that catch theirs): the worker is then not ready
    /// and not healthy, so that it is taken out of rotation and restarted.
    pub fn stopped(&self) -> Option<String> {
        if self.tx.lock().unwrap_or_else(|e| e.into_inner()).is_none() {
            return None; // shut down on purpose
        }
        let threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        let ended = threads.iter().find(|t| t.is_finished())?;
        Some(format!("the engine's {} thread has stopped: restart the worker", ended.thread().name().unwrap_or("?")))
    }

    /// Stops accepting work, lets queued work finish, and joins the threads.
    pub fn shutdown(&self) {
        // The runner holds a sender too (to say when it takes a batch): stop explicitly.
        if let Some(tx) = self.tx.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = tx.send(Msg::Stop);
        }
        for t in self.threads.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for EngineHandle {
    /// A handle dropped without [`EngineHandle::shutdown`] still ends its threads (after the
    /// queued work): the runner's sender alone would keep the scheduler waiting forever.
    fn drop(&mut self) {
        if let Some(tx) = self.tx.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = tx.send(Msg::Stop);
        }
    }
}

/// The message a caught panic carries (a `&str` or a `String` payload), empty otherwise.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}
