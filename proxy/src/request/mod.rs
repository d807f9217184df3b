//! One scoring request end to end (already validated by the API handler): [`score`] runs four
//! stages:
//!
//! 1. [`plan`]: estimate every item's tokens, take the eligible workers and their load, cut
//!    the shards with the split policy, pay the retry and hedge budgets;
//! 2. [`dispatch`]: send the shards concurrently, each with its attempts, retries and hedges
//!    under the deadline;
//! 3. [`merge`]: put the answers back in the caller's order;
//! 4. [`feedback`]: what each answer teaches the estimators and the worker's breaker, recorded
//!    by the dispatcher as answers arrive.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use sieve_shared::{ApiError, ProxyConfig, ScoreRequestRef, ScoreResponse};

use crate::estimate::token_estimator::Features;
use crate::metrics as m;
use crate::state::AppState;

pub mod admission;
pub mod dispatch;
pub mod feedback;
pub mod merge;
pub mod plan;

use dispatch::shard_body::ShardWire;
use merge::MergeStats;

/// What every shard of one request shares.
pub struct RequestCtx {
    pub state: Arc<AppState>,
    pub cfg: Arc<ProxyConfig>,
    /// What every shard body is spliced from.
    pub wire: ShardWire,
    pub item_features: Vec<Features>,
    pub query_features: Features,
    pub instruction_features: Option<Features>,
    /// Estimated own-segment tokens per item.
    pub item_tokens: Vec<f64>,
    pub prefix_tokens: f64,
    pub arrival: Instant,
    pub deadline: Instant,
    /// The request's span: every shard attempt's span is its child (`Span::none()` when
    /// tracing is off).
    pub span: tracing::Span,
}

/// Scores `req`, whose borrowed strings (if any) point into `body` (the request as it arrived;
/// empty for a request built from owned strings).
pub async fn score(
    state: &Arc<AppState>,
    body: Bytes,
    req: ScoreRequestRef<'_>,
    arrival: Instant,
) -> Result<(ScoreResponse, MergeStats), ApiError> {
    // `req` was validated against these limits by the API handler (`sieve_shared::service`).
    let cfg = state.config();
    let budget_ms = req.deadline_ms.unwrap_or(cfg.deadline.default_ms);
    let deadline = arrival + Duration::from_millis(budget_ms);
    let n_items = req.items.len();
    let ids = req
        .items
        .iter()
        .any(|i| i.id().is_some())
        .then(|| req.items.iter().map(|i| i.id().map(String::from)).collect());

    let plan::Planned { ctx, jobs, dropped } = plan::plan(state, cfg, body, &req, arrival, deadline)?;
    drop(req);
    let mut results = dispatch::run(ctx, jobs).await?;
    if !dropped.is_empty() {
        // Left out by admission: never sent, answered as missing.
        results.push(merge::ShardResult { items: dropped, outcome: dispatch::ShardOutcome::Missed });
    }
    let (resp, stats) = merge::merge(n_items, ids, budget_ms, results, arrival)?;
    if stats.missing > 0 {
        metrics::counter!(m::PARTIAL_RESPONSES).increment(1);
        metrics::counter!(m::MISSING_ITEMS).increment(stats.missing as u64);
    }
    Ok((resp, stats))
}
