//! A scoring call as the engine sees it, from submission to reply.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use sieve_shared::{ApiError, Usage};
use tokio::sync::oneshot;

use crate::prompt::TokenizedCall;

/// Set when the caller goes away (connection closed); the engine then drops the job's work.
#[derive(Debug, Clone, Default)]
pub struct CancelFlag(Arc<AtomicBool>);

impl CancelFlag {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Cancels the job when dropped unless disarmed: held by the request handler, so a dropped
/// connection (hyper drops the handler's future) cancels the work.
pub struct CancelOnDrop(pub Option<CancelFlag>);

impl CancelOnDrop {
    pub fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f.cancel();
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct JobOutput {
    /// One score per item, input order.
    pub scores: Vec<f32>,
    pub usage: Usage,
    pub queue_ms: f64,
    pub compute_ms: f64,
}

pub type JobResult = Result<JobOutput, ApiError>;

/// One call submitted to the engine.
pub struct ScoreJob {
    pub instruction: Option<String>,
    pub query: String,
    pub items: Vec<String>,
    pub arrived: Instant,
    pub deadline: Option<Instant>,
    pub cancel: CancelFlag,
    /// Taken when the job is answered (exactly once).
    pub reply: Option<oneshot::Sender<JobResult>>,
}

impl ScoreJob {
    /// Why the job should not run any more, if so.
    pub fn dead_reason(&self, now: Instant) -> Option<ApiError> {
        if self.cancel.is_cancelled() {
            return Some(ApiError::new(sieve_shared::ErrorKind::DeadlineExceeded, "cancelled: the caller went away"));
        }
        match self.deadline {
            Some(d) if now >= d => Some(ApiError::deadline(format!(
                "deadline passed after {:.0} ms before the work could finish",
                now.duration_since(self.arrived).as_secs_f64() * 1e3
            ))),
            _ => None,
        }
    }
}

/// A job after tokenization, waiting to be batched.
pub struct TokenizedJob {
    pub job: ScoreJob,
    pub call: TokenizedCall,
    /// Pairs counted against the queue limit (released when the job leaves the engine).
    pub queued_pairs: u64,
    pub queued_tokens: u64,
}
