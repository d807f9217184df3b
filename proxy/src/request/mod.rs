//! One scoring request end to end (already validated by the API handler): [`score`] runs four
//! stages:
//!
//! 0. [`cache`]: items whose pair was answered before are answered from the pair-score cache
//!    (a request with nothing else left sends nothing);
//! 1. [`plan`]: estimate every item's tokens, take the eligible workers and their load, cut
//!    the shards with the split policy, pay the retry and hedge budgets;
//! 2. [`dispatch`]: send the shards concurrently, each with its attempts, retries and hedges
//!    under the deadline;
//! 3. [`merge`]: put the answers back in the caller's order;
//! 4. [`feedback`]: what each answer teaches the estimators and the worker's breaker, recorded
//!    by the dispatcher as answers arrive; the answered scores are stored in the cache.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use sieve_shared::{ApiError, ProxyConfig, ScoreRequest, ScoreResponse};

use crate::estimate::token_estimator::Features;
use crate::metrics as m;
use crate::request_trace;
use crate::state::AppState;

pub mod admission;
pub mod dispatch;
pub mod feedback;
pub mod merge;
pub mod plan;
pub mod shard;

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
    /// The digest of (instruction, query): the key of the prefix in `prefix_holders`.
    pub prefix_digest: u128,
    pub arrival: Instant,
    pub deadline: Instant,
    /// The request's span: every shard attempt's span is its child (`Span::none()` when
    /// tracing is off).
    pub span: tracing::Span,
}

/// Scores `req`, whose borrowed strings (if any) point into `body` (the request as it arrived;
/// empty for a request built from owned strings). A sampled request is recorded in the trace.
pub async fn score(
    state: &Arc<AppState>,
    body: Bytes,
    req: ScoreRequest<'_>,
    arrival: Instant,
) -> Result<(ScoreResponse, MergeStats), ApiError> {
    let traced = state.request_trace.sampled().then(|| request_trace::Pending::new(&req, arrival));
    let r = score_untraced(state, body, req, arrival).await;
    if let Some(t) = traced {
        state.request_trace.send(t.finish(r.as_ref().map(|(resp, _)| resp)));
    }
    r
}

async fn score_untraced(
    state: &Arc<AppState>,
    body: Bytes,
    req: ScoreRequest<'_>,
    arrival: Instant,
) -> Result<(ScoreResponse, MergeStats), ApiError> {
    // `req` was validated against these limits by the API handler (`sieve_server::service`).
    let cfg = state.config();
    let budget_ms = req.deadline_ms.unwrap_or(cfg.deadline.default_ms);
    let deadline = arrival + Duration::from_millis(budget_ms);
    let n_items = req.items.len();
    let ids = req
        .items
        .iter()
        .any(|i| i.id().is_some())
        .then(|| req.items.iter().map(|i| i.id().map(String::from)).collect());

    // The cache: pairs answered before are not sent again (unless the caller opted out). Its
    // key has no truncation, so a call that may cut items neither reads nor fills it.
    let use_cache = cfg.cache.enabled && req.cache != Some(false) && req.max_item_tokens.is_none();
    let lookup = use_cache.then(|| state.pair_cache.lookup(&req));
    let mut results = Vec::new();
    let todo = lookup.as_ref().map(|l| l.todo.as_slice());
    if todo.is_none_or(|t| !t.is_empty()) {
        let plan::Planned { ctx, jobs, dropped } = plan::plan(state, cfg, body, &req, todo, arrival, deadline)?;
        drop(req);
        results = dispatch::run(ctx, jobs).await?;
        if let Some(l) = &lookup {
            let answers = results.iter().filter_map(|r| match &r.outcome {
                shard::ShardOutcome::Done(d) => Some((&r.items[..], &d.response)),
                _ => None,
            });
            state.pair_cache.store(l, answers);
        }
        if !dropped.is_empty() {
            // Left out by admission: never sent, answered as missing.
            results.push(shard::ShardResult { items: dropped, outcome: shard::ShardOutcome::Missed });
        }
    }
    let (resp, stats) = merge::merge(n_items, ids, budget_ms, results, arrival, lookup.as_ref())?;
    if stats.missing > 0 {
        metrics::counter!(m::PARTIAL_RESPONSES).increment(1);
        metrics::counter!(m::MISSING_ITEMS).increment(stats.missing as u64);
    }
    Ok((resp, stats))
}
