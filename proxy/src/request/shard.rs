//! The types a request's stages hand each other about its shards: the plan's [`ShardJob`]s and
//! the [`Eligible`] workers they were cut for, and what dispatch gives merge ([`ShardResult`]).
//! Here rather than in any one stage, so that the stages import this file and not each other.

use std::sync::Arc;
use std::time::Instant;

use sieve_shared::{ApiError, CostModel, ProxyConfig, ScoreResponse};

use crate::cluster::worker::{Worker, WorkerView};
use crate::state::AppState;

/// A shard as planned: where it goes first and what it is predicted to take.
pub struct ShardJob {
    pub worker: Arc<Worker>,
    pub items: Vec<usize>,
    pub compute_ms: f64,
    pub finish_ms: f64,
}

/// The eligible workers at one instant and how loaded each is, in the pool's order: what the
/// split and every later retry or hedge decision rank.
pub struct Eligible {
    pub workers: Vec<Arc<Worker>>,
    pub views: Vec<WorkerView>,
}

impl Eligible {
    /// The workers that can take shards at `now`, less those in `exclude`.
    pub fn at(state: &AppState, cfg: &ProxyConfig, now: Instant, model: &CostModel, exclude: &[Arc<Worker>]) -> Self {
        let params = AppState::view_params(cfg);
        let mut workers: Vec<Arc<Worker>> = state.pool.eligible(now);
        // In place: no second vector per request.
        workers.retain(|w| !exclude.iter().any(|x| Arc::ptr_eq(x, w)));
        let views = workers.iter().map(|w| w.view(now, model, &params)).collect();
        Eligible { workers, views }
    }
}

pub struct ShardResult {
    /// The caller's indices of the shard's items, in the order they were sent.
    pub items: Vec<usize>,
    pub outcome: ShardOutcome,
}

/// How a shard ended.
pub enum ShardOutcome {
    Done(ShardDone),
    /// Every attempt failed (or one failed in a way another worker would repeat).
    Failed(ApiError),
    /// The deadline passed first.
    Missed,
}

pub struct ShardDone {
    pub response: ScoreResponse,
    /// When the winning attempt was sent, after the request's arrival.
    pub sent_after_ms: f64,
    pub hedged: bool,
    pub retries: u32,
}
