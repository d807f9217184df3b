//! One scoring request end to end: check it, estimate every item's tokens, take the eligible
//! workers and their load, plan the shards, send them concurrently, merge the answers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sieve_shared::proxy_config::SplitMode;
use sieve_shared::{ApiError, ScoreRequest, ScoreResponse};
use tokio::task::JoinSet;

use crate::admission;
use crate::dispatcher::{run_shard, RequestCtx, ShardJob};
use crate::load_price;
use crate::merger::{merge, MergeStats, ShardResult};
use crate::metrics as m;
use crate::splitter::{self, Candidate, Plan};
use crate::state::{lock, AppState};
use crate::token_estimator::features;

pub async fn score(
    state: &Arc<AppState>,
    req: ScoreRequest,
    arrival: Instant,
) -> Result<(ScoreResponse, MergeStats), ApiError> {
    let cfg = state.config();
    cfg.limits.check(&req)?;
    let budget_ms = req.deadline_ms.unwrap_or(cfg.deadline.default_ms);
    let deadline = arrival + Duration::from_millis(budget_ms);

    let weights = lock(&state.tokens).weights();
    let item_features: Vec<_> = req.items.iter().map(|i| features(i.text())).collect();
    let query_features = features(&req.query);
    let instruction_features = req.instruction.as_deref().map(features);
    let item_tokens: Vec<f64> = item_features.iter().map(|f| weights.item_tokens(f)).collect();
    let prefix_tokens = weights.prefix_tokens(&query_features, instruction_features.as_ref());

    let now = Instant::now();
    let eligible = state.pool.eligible(now);
    if eligible.is_empty() {
        return Err(ApiError::not_ready(format!("no worker is ready ({} configured)", state.pool.snapshot().len())));
    }
    let model = state.cost_model();
    let params = AppState::view_params(&cfg);
    let views: Vec<_> = eligible.iter().map(|w| w.view(now, &model, &params)).collect();
    let policy = state.policy();
    let plan_req = splitter::Request { item_tokens: &item_tokens, prefix: prefix_tokens, model: &model };
    let candidate = |i: usize| Candidate {
        available_ms: views[i].backlog_ms,
        time_factor: views[i].time_factor,
        max_batch_tokens: views[i].max_batch_tokens,
    };
    // Plans index candidates `cands`; `workers[c]` is candidate c's worker.
    let (mut plan, workers, cands): (Plan, Vec<usize>, Vec<Candidate>) = match cfg.split.mode {
        SplitMode::Cost => {
            let rank = policy.rank(&views);
            let cands: Vec<Candidate> = rank.iter().map(|&i| candidate(i)).collect();
            let price = if cfg.split.load_aware { load_price::price(&cands) } else { 0.0 };
            let plan =
                splitter::split_by_cost_priced(&plan_req, &cands, cfg.split.max_shards, cfg.split.tolerance, price);
            (plan, rank, cands)
        }
        SplitMode::Fixed => {
            let k = req.items.len().div_ceil(cfg.split.fixed_items);
            let assignment = policy.assign(&views, k);
            let cands: Vec<Candidate> = (0..views.len()).map(candidate).collect();
            let plan = splitter::split_fixed(&plan_req, &cands, cfg.split.fixed_items, &assignment);
            (plan, (0..views.len()).collect(), cands)
        }
        SplitMode::None => {
            let rank = policy.rank(&views);
            let cands: Vec<Candidate> = rank.iter().map(|&i| candidate(i)).collect();
            (splitter::split_whole(&plan_req, &cands, 0), rank, cands)
        }
    };
    // Admission: refuse (or trim) a plan the deadline would cut, before anything is queued.
    let left_ms = deadline.saturating_duration_since(now).as_secs_f64() * 1e3;
    // The fastest plan (no tolerance, no price of work), tried before refusing a late one.
    let best = || {
        (cfg.split.mode == SplitMode::Cost)
            .then(|| splitter::split_by_cost(&plan_req, &cands, cfg.split.max_shards, 0.0))
    };
    let policy_on_overload = req.on_overload.unwrap_or_default();
    let dropped = admission::admit(&cfg.admission, policy_on_overload, left_ms, &mut plan, &plan_req, &cands, best)?;

    metrics::histogram!(m::REQUEST_ITEMS).record(req.items.len() as f64);
    metrics::histogram!(m::SHARDS_PER_REQUEST).record(plan.shards.len() as f64);
    let mut jobs = Vec::with_capacity(plan.shards.len());
    for s in plan.shards {
        metrics::histogram!(m::SHARD_ITEMS).record(s.items.len() as f64);
        metrics::histogram!(m::SHARD_TOKENS).record(s.tokens);
        metrics::histogram!(m::SHARD_PREDICTED_SECONDS).record(s.finish_ms / 1e3);
        // Every shard sent earns retry and hedge allowance.
        state.retry_budget.deposit(cfg.retry.budget_ratio);
        state.hedge_budget.deposit(cfg.hedge.budget_ratio * s.compute_ms);
        let worker = eligible[workers[s.candidate]].clone();
        jobs.push(ShardJob { worker, items: s.items, compute_ms: s.compute_ms, finish_ms: s.finish_ms });
    }

    let n_items = req.items.len();
    let ids = req
        .items
        .iter()
        .any(|i| i.id().is_some())
        .then(|| req.items.iter().map(|i| i.id().map(String::from)).collect());
    let ctx = Arc::new(RequestCtx {
        state: state.clone(),
        cfg: cfg.clone(),
        query: req.query,
        instruction: req.instruction,
        items: req.items,
        item_features,
        query_features,
        instruction_features,
        item_tokens,
        prefix_tokens,
        arrival,
        deadline,
    });
    let mut set = JoinSet::new();
    let shard_items: Vec<Vec<usize>> = jobs.iter().map(|j| j.items.clone()).collect();
    for (idx, job) in jobs.into_iter().enumerate() {
        let ctx = ctx.clone();
        set.spawn(async move { (idx, run_shard(ctx, job).await) });
    }
    let mut outcomes: Vec<Option<_>> = (0..shard_items.len()).map(|_| None).collect();
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok((idx, outcome)) => outcomes[idx] = Some(outcome),
            Err(e) => return Err(ApiError::internal(format!("shard task failed: {e}"))),
        }
    }
    let mut results: Vec<ShardResult> = shard_items
        .into_iter()
        .zip(outcomes)
        .map(|(items, outcome)| ShardResult {
            items,
            outcome: outcome.unwrap_or(crate::dispatcher::ShardOutcome::Missed),
        })
        .collect();
    if !dropped.is_empty() {
        // Left out by admission: never sent, answered as missing.
        results.push(ShardResult { items: dropped, outcome: crate::dispatcher::ShardOutcome::Missed });
    }
    let (resp, stats) = merge(n_items, ids, budget_ms, results, arrival)?;
    if stats.missing > 0 {
        metrics::counter!(m::PARTIAL_RESPONSES).increment(1);
        metrics::counter!(m::MISSING_ITEMS).increment(stats.missing as u64);
    }
    Ok((resp, stats))
}
