//! A scoring call as the engine sees it, from submission to reply.
//!
//! A call is answered exactly once, by whichever of three places gets there first: the
//! scheduler (refused, expired or cancelled while queued), the runner (scored, partially scored,
//! failed, or dead mid-pass), or the caller's [`Ticket`] (its deadline passed, or the caller went
//! away, while the call was still waiting for the runner). The [`CallSlot`] they share holds the
//! reply and the call's queue accounting, released with that one answer.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use sieve_shared::metrics_names::worker as m;
use sieve_shared::{ApiError, Usage};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::state::EngineState;
use crate::prompt::TokenizedCall;

#[derive(Debug, Clone, PartialEq)]
pub struct JobOutput {
    /// One score per item, input order; `None` exactly at the indices in `missing`.
    pub scores: Vec<Option<f32>>,
    /// Items the deadline left unscored (a partial answer); empty when every item was scored.
    pub missing: Vec<usize>,
    pub usage: Usage,
    pub queue_ms: f64,
    pub compute_ms: f64,
}

pub type JobResult = Result<JobOutput, ApiError>;

/// The reply side of a call and the queue accounting it holds until answered.
#[derive(Debug)]
pub struct CallSlot {
    inner: Mutex<SlotInner>,
}

#[derive(Debug)]
struct SlotInner {
    reply: Option<oneshot::Sender<JobResult>>,
    /// The runner has started the batch holding the call. From then on only the runner answers
    /// a live call (it may hold partial scores); it checks the deadline between layers.
    running: bool,
    pairs: u64,
    tokens: u64,
}

impl CallSlot {
    fn new(reply: oneshot::Sender<JobResult>, pairs: u64) -> Self {
        CallSlot { inner: Mutex::new(SlotInner { reply: Some(reply), running: false, pairs, tokens: 0 }) }
    }

    fn lock(&self) -> MutexGuard<'_, SlotInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Answers the call unless it was answered already; releases its accounting. Whether this
    /// was the answer.
    pub fn answer(&self, state: &EngineState, result: JobResult) -> bool {
        Self::answer_locked(&mut self.lock(), state, result)
    }

    fn answer_locked(inner: &mut SlotInner, state: &EngineState, result: JobResult) -> bool {
        let Some(reply) = inner.reply.take() else { return false };
        state.queued_pairs.sub(inner.pairs);
        state.queued_tokens.sub(inner.tokens);
        state.in_flight_requests.sub(1);
        let _ = reply.send(result);
        true
    }

    /// Answers the call only if the runner has not started it.
    pub fn answer_if_queued(&self, state: &EngineState, result: JobResult) -> bool {
        let mut inner = self.lock();
        !inner.running && Self::answer_locked(&mut inner, state, result)
    }

    /// The runner takes the call over; false when it was answered already (skip it).
    pub fn start_running(&self) -> bool {
        let mut inner = self.lock();
        inner.running = inner.reply.is_some();
        inner.running
    }

    pub fn is_answered(&self) -> bool {
        self.lock().reply.is_none()
    }

    /// Counts the call's tokens against the queue (once tokenized); false when it was answered
    /// already, so that nothing is counted that no answer will release.
    pub fn add_tokens(&self, state: &EngineState, tokens: u64) -> bool {
        let mut inner = self.lock();
        if inner.reply.is_none() {
            return false;
        }
        inner.tokens += tokens;
        state.queued_tokens.add(tokens);
        true
    }
}

/// Why a call should not run any more.
#[derive(Debug, Clone, PartialEq)]
pub enum Dead {
    /// Answered already (by its ticket at the deadline, or on the caller's departure).
    Answered,
    /// The caller went away.
    Cancelled,
    /// The deadline passed; the error to answer if nothing was scored.
    Expired(ApiError),
}

/// One call submitted to the engine.
pub struct ScoreJob {
    pub instruction: Option<String>,
    pub query: String,
    pub items: Vec<String>,
    pub arrived: Instant,
    pub deadline: Option<Instant>,
    /// Cancelled when the caller goes away (the HTTP handler holds its drop guard).
    pub cancel: CancellationToken,
    pub slot: Arc<CallSlot>,
    /// The call's spans when it is traced (`None`, nothing allocated, when tracing is off).
    pub trace: Option<Box<CallSpans>>,
    pub truncate: Option<crate::prompt::Truncate>,
    /// For [`Drop`]: a job dropped unanswered (a panic on a thread that held it) answers 500 at
    /// once instead of leaving its caller waiting for the deadline.
    pub state: Arc<EngineState>,
}

impl Drop for ScoreJob {
    fn drop(&mut self) {
        self.slot.answer(&self.state, Err(dropped()));
    }
}

/// A traced call's spans, carried to the runner thread (which has no span context of its own).
pub struct CallSpans {
    /// The call's request span: its queue and forward-pass spans are children of it.
    pub span: tracing::Span,
    /// Open from submission until the runner takes the call's batch: the queue wait.
    pub queue: Mutex<tracing::Span>,
}

impl ScoreJob {
    /// Ends the queue-wait span: the runner has taken the call.
    pub fn end_queue_wait(&self) {
        if let Some(t) = &self.trace {
            let mut q = t.queue.lock().unwrap_or_else(|e| e.into_inner());
            drop(std::mem::replace(&mut *q, tracing::Span::none()));
        }
    }

    /// Why the job should not run any more, if so.
    pub fn dead_reason(&self, now: Instant) -> Option<Dead> {
        if self.slot.is_answered() {
            return Some(Dead::Answered);
        }
        if self.cancel.is_cancelled() {
            return Some(Dead::Cancelled);
        }
        match self.deadline {
            Some(d) if now >= d => Some(Dead::Expired(deadline_error(self.arrived, now))),
            _ => None,
        }
    }

    pub fn answer(&self, state: &EngineState, result: JobResult) -> bool {
        self.slot.answer(state, result)
    }

    /// Answers a dead job that has nothing scored, counting why; `stage` is `queued` or `running`.
    pub fn answer_dead(&self, state: &EngineState, dead: Dead, stage: &'static str) {
        match dead {
            Dead::Answered => {}
            Dead::Cancelled => {
                if self.answer(state, Err(cancelled_error())) {
                    count_cancelled(state, stage);
                }
            }
            Dead::Expired(e) => {
                if self.answer(state, Err(e)) {
                    count_expired(state, stage);
                }
            }
        }
    }
}

pub fn deadline_error(arrived: Instant, now: Instant) -> ApiError {
    ApiError::deadline(format!(
        "deadline passed after {:.0} ms before any item could be scored; {}",
        now.saturating_duration_since(arrived).as_secs_f64() * 1e3,
        sieve_shared::RAISE_DEADLINE
    ))
}

pub fn cancelled_error() -> ApiError {
    ApiError::new(sieve_shared::ErrorKind::DeadlineExceeded, "cancelled: the caller went away")
}

pub fn count_expired(state: &EngineState, stage: &'static str) {
    let field = if stage == "queued" { &state.calls_expired_queued } else { &state.calls_expired_running };
    field.add(1);
    metrics::counter!(m::CALLS_EXPIRED, "stage" => stage).increment(1);
}

pub fn count_cancelled(state: &EngineState, stage: &'static str) {
    state.calls_cancelled.add(1);
    metrics::counter!(m::CALLS_CANCELLED, "stage" => stage).increment(1);
}

/// A job after tokenization, waiting to be batched.
pub struct TokenizedJob {
    pub job: ScoreJob,
    pub call: TokenizedCall,
    /// Rows the call computes (its prefix once, every item's own segment).
    pub tokens: u64,
}

/// The caller's side of a submitted call.
///
/// [`Ticket::wait`] answers a call still waiting for the runner with 504 the moment its deadline
/// passes, however long the batch ahead of it runs (a running call is answered by the runner
/// within about one layer's time, with its partial scores if it has any). Dropping an unanswered
/// ticket (the caller went away) drops a call that has not started at once, releasing its place
/// in the queue; the runner stops a started one at its next layer through the cancellation token.
pub struct Ticket {
    rx: oneshot::Receiver<JobResult>,
    slot: Arc<CallSlot>,
    state: Arc<EngineState>,
    arrived: Instant,
    deadline: Option<Instant>,
}

impl Ticket {
    pub(super) fn new(
        state: Arc<EngineState>,
        pairs: u64,
        arrived: Instant,
        deadline: Option<Instant>,
    ) -> (Self, Arc<CallSlot>) {
        let (tx, rx) = oneshot::channel();
        let slot = Arc::new(CallSlot::new(tx, pairs));
        (Ticket { rx, slot: slot.clone(), state, arrived, deadline }, slot)
    }

    /// The call's answer, or 504 at its deadline if it has not started by then.
    pub async fn wait(mut self) -> JobResult {
        if let Some(d) = self.deadline {
            tokio::select! {
                r = &mut self.rx => return r.unwrap_or_else(|_| Err(dropped())),
                _ = tokio::time::sleep_until(d.into()) => {}
            }
            if self.slot.answer_if_queued(&self.state, Err(deadline_error(self.arrived, Instant::now()))) {
                count_expired(&self.state, "queued");
            }
        }
        (&mut self.rx).await.unwrap_or_else(|_| Err(dropped()))
    }

    /// The answer, blocking the thread (outside async code: tests, benches). Deadlines are
    /// still enforced by the engine, though a call waiting behind a batch is answered only when
    /// the runner reaches it.
    pub fn blocking_recv(mut self) -> Result<JobResult, oneshot::error::RecvError> {
        let rx = std::mem::replace(&mut self.rx, oneshot::channel().1);
        rx.blocking_recv()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // Unanswered and not started: nobody is waiting any more, so free its place now.
        if self.slot.answer_if_queued(&self.state, Err(cancelled_error())) {
            count_cancelled(&self.state, "queued");
        }
    }
}

fn dropped() -> ApiError {
    ApiError::internal("the engine dropped the call")
}
