//! Stage 1, plan, in its steps: estimate every item's tokens; take the eligible workers and
//! their load (the views, built once); split: find the items that begin alike and cut the shards
//! with the configured split policy; admit: refuse or trim a plan the deadline would cut. Then
//! each shard's retry and hedge allowance is paid into the budgets.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use sieve_shared::proxy_config::SplitMode;
use sieve_shared::sync::lock;
use sieve_shared::{ApiError, CostModel, ProxyConfig, ScoreRequest};

use super::dispatch::shard_body::ShardWire;
use super::shard::{Eligible, ShardJob};
use super::{admission, RequestCtx};
use crate::balancer::Policy;
use crate::cluster::worker::Worker;
use crate::estimate::token_estimator::{features, Features};
use crate::metrics as m;
use crate::split::{self, ItemGroups, SplitPolicy};
use crate::state::AppState;
use sieve_shared::pair_key::digest_of_prefix;

/// A request refused as late whose prompt no worker would take anyway is too large: a 429
/// would say "retry later", and no retry can help (a request admitted gets the worker's own
/// 413). Estimates err (a cold token estimator by 1.7x was seen), so only a prompt estimated at
/// over 1.5 times every worker's `max_seq_tokens` counts.
fn too_long(workers: &[Arc<Worker>], item_tokens: &[f64], prefix_tokens: f64) -> Option<ApiError> {
    let limit = workers.iter().filter_map(|w| w.max_seq_tokens()).max()?;
    let i = item_tokens.iter().position(|&t| prefix_tokens + t > 1.5 * limit as f64)?;
    Some(ApiError::too_large(format!(
        "items[{i}] makes a prompt of about {:.0} tokens (query + item + template, estimated); \
         the workers take at most max_seq_tokens {limit}: shorten the item or the query, or send \
         max_item_tokens to cut items to fit",
        prefix_tokens + item_tokens[i]
    )))
}

/// What the plan stage hands to dispatch.
pub struct Planned {
    pub ctx: Arc<RequestCtx>,
    pub jobs: Vec<ShardJob>,
    /// Items admission control left out (`on_overload: partial`): never sent, answered missing.
    pub dropped: Vec<usize>,
}

/// Step 1's estimates: every item's and the prefix's tokens, and the text features they came
/// from (kept for the estimator's lessons).
struct Estimates {
    item_features: Vec<Features>,
    query_features: Features,
    instruction_features: Option<Features>,
    item_tokens: Vec<f64>,
    prefix_tokens: f64,
}

/// Step 1, estimate: tokens of every item (an item the workers will cut costs its cap at most)
/// and of the shared prefix.
fn estimate(state: &AppState, cfg: &ProxyConfig, req: &ScoreRequest<'_>) -> Estimates {
    let weights = lock(&state.tokens).weights();
    let item_features: Vec<_> = req.items.iter().map(|i| features(i.text())).collect();
    let query_features = features(&req.query);
    let instruction_features = req.instruction.as_deref().map(features);
    let cap = req.max_item_tokens.map_or(f64::INFINITY, |n| f64::from(n.min(cfg.limits.max_item_tokens)));
    let item_tokens: Vec<f64> = item_features.iter().map(|f| weights.item_tokens(f).min(cap)).collect();
    let prefix_tokens = weights.prefix_tokens(&query_features, instruction_features.as_ref());
    Estimates { item_features, query_features, instruction_features, item_tokens, prefix_tokens }
}

/// Step 2, eligible: the workers that can take shards now and their views, those that answered
/// this prefix lately marked as holding it (cache-aware routing). Returns the prefix's digest.
fn eligible(
    state: &AppState,
    cfg: &ProxyConfig,
    req: &ScoreRequest<'_>,
    now: Instant,
    model: &CostModel,
) -> Result<(Eligible, u128), ApiError> {
    let mut eligible = Eligible::at(state, cfg, now, model, &[]);
    if eligible.workers.is_empty() {
        return Err(ApiError::not_ready(format!("no worker is ready ({} configured)", state.pool.snapshot().len())));
    }
    let prefix_digest = digest_of_prefix(req.instruction.as_deref(), &req.query);
    if cfg.split.prefix_affinity {
        state.prefix_holders.mark(prefix_digest, &eligible.workers, &mut eligible.views, now);
    }
    Ok((eligible, prefix_digest))
}

/// What the split sees: the items to send as 0..k (their tokens, and the groups among them
/// that begin alike).
struct SplitItems {
    tokens: Vec<f64>,
    groups: ItemGroups,
}

/// Step 3's input: the items to send (`todo`, else all), and, unless the split is blind to
/// them, the groups among them whose texts share a leading run.
fn split_items(
    state: &AppState,
    cfg: &ProxyConfig,
    req: &ScoreRequest<'_>,
    todo: Option<&[usize]>,
    item_tokens: &[f64],
) -> SplitItems {
    let tokens: Vec<f64> = match todo {
        Some(t) => t.iter().map(|&i| item_tokens[i]).collect(),
        None => item_tokens.to_vec(),
    };
    let groups = if cfg.split.mode == SplitMode::CostUngrouped || tokens.len() < 2 {
        ItemGroups::default()
    } else {
        let texts: Vec<&str> = match todo {
            Some(t) => t.iter().map(|&i| req.items[i].text()).collect(),
            None => req.items.iter().map(|i| i.text()).collect(),
        };
        ItemGroups::find(&texts, &tokens, &lock(&state.tokens).weights())
    };
    SplitItems { tokens, groups }
}

/// Step 4, admit: refuse (or trim) a plan the deadline would cut, before anything is queued.
/// Returns the items left out (`on_overload: partial`), as indices of the split's items.
#[allow(clippy::too_many_arguments)]
fn admit(
    state: &AppState,
    cfg: &ProxyConfig,
    req: &ScoreRequest<'_>,
    plan: &mut split::Plan,
    split_req: &split::Request<'_>,
    eligible: &Eligible,
    balance: &dyn Policy,
    now: Instant,
    deadline: Instant,
) -> Result<Vec<usize>, ApiError> {
    // The plan's shards index the views, so the candidates are the views in the same order.
    let cands: Vec<split::Candidate> = eligible.views.iter().map(split::Candidate::from).collect();
    // What the workers get: the time left less what their answers need to come back.
    let left_ms = deadline.saturating_duration_since(now).as_secs_f64() * 1e3;
    let left_ms = left_ms - state.answer_margin.margin_ms(left_ms);
    // Before refusing a late plan: the plan of fewest shards (least work) that is in time,
    // else the fastest (no tolerance, no price of work).
    let cost_mode = matches!(cfg.split.mode, SplitMode::Cost | SplitMode::CostUngrouped);
    let best = |fits: &dyn Fn(&split::Plan) -> bool| {
        cost_mode.then(|| {
            admission::fewest_shards_within(fits, cfg.split.max_shards, |cap| {
                let fastest = split::CostSplit::new(cap, 0.0, false);
                fastest.plan(split_req, &eligible.views, balance)
            })
        })
    };
    let on_overload = req.on_overload.unwrap_or_default();
    // How late predictions run, as measured lately on shards of about the plan's length, stalls
    // left out: the admission quantile q for one shard, q^(1/k) for each of k (all k in time
    // with chance q); face value until measured.
    let late_ratio = |k: usize, makespan_ms: f64| {
        admission::late_ratio(&state.ratios, &cfg.admission, cfg.hedge.min_samples, k, makespan_ms)
    };
    admission::admit(&cfg.admission, on_overload, left_ms, late_ratio, plan, split_req, &cands, best)
}

/// The request's shared context and its shards, the budgets paid. `todo`: the caller's indices
/// of the items to send, ascending (the others were answered from the cache); none: all.
pub fn plan(
    state: &Arc<AppState>,
    cfg: Arc<ProxyConfig>,
    body: Bytes,
    req: &ScoreRequest<'_>,
    todo: Option<&[usize]>,
    arrival: Instant,
    deadline: Instant,
) -> Result<Planned, ApiError> {
    // The request's span (the API handler's, current here): the plan's span and, later, every
    // shard attempt's are its children. Both `Span::none()` when tracing is off.
    let request_span = if sieve_server::trace::enabled() { tracing::Span::current() } else { tracing::Span::none() };
    let plan_span = sieve_server::span!(parent: &request_span, "plan", items = req.items.len() as i64, shards = tracing::field::Empty);
    let _in_plan = plan_span.enter();
    let est = estimate(state, &cfg, req);

    let now = Instant::now();
    let model = state.cost_model();
    let (eligible, prefix_digest) = eligible(state, &cfg, req, now, &model)?;
    // The split sees only the items to send, as 0..k; `caller` maps its indices back.
    let caller = |k: usize| todo.map_or(k, |t| t[k]);
    let items = split_items(state, &cfg, req, todo, &est.item_tokens);
    let split_req =
        split::Request { item_tokens: &items.tokens, prefix: est.prefix_tokens, model: &model, groups: &items.groups };
    let balance = state.policy();
    let mut plan = state.split().plan(&split_req, &eligible.views, balance.as_ref());
    let mut dropped = admit(state, &cfg, req, &mut plan, &split_req, &eligible, balance.as_ref(), now, deadline)
        .map_err(|e| too_long(&eligible.workers, &est.item_tokens, est.prefix_tokens).unwrap_or(e))?;
    if todo.is_some() {
        dropped.iter_mut().for_each(|k| *k = caller(*k));
    }

    metrics::histogram!(m::REQUEST_ITEMS).record(req.items.len() as f64);
    metrics::histogram!(m::SHARDS_PER_REQUEST).record(plan.shards.len() as f64);
    let mut jobs = Vec::with_capacity(plan.shards.len());
    for mut s in plan.shards {
        if todo.is_some() {
            s.items.iter_mut().for_each(|k| *k = caller(*k));
        }
        metrics::histogram!(m::SHARD_ITEMS).record(s.items.len() as f64);
        metrics::histogram!(m::SHARD_TOKENS).record(s.tokens);
        metrics::histogram!(m::SHARD_PREDICTED_SECONDS).record(s.finish_ms / 1e3);
        // Every shard sent earns retry and hedge allowance.
        state.retry_budget.deposit(cfg.retry.budget_ratio);
        state.hedge_budget.deposit(cfg.hedge.budget_ratio * s.compute_ms);
        let worker = eligible.workers[s.candidate].clone();
        jobs.push(ShardJob { worker, items: s.items, compute_ms: s.compute_ms, finish_ms: s.finish_ms });
    }

    plan_span.record("shards", jobs.len() as i64);
    let ctx = Arc::new(RequestCtx {
        state: state.clone(),
        cfg,
        wire: ShardWire::new(body, req),
        item_features: est.item_features,
        query_features: est.query_features,
        instruction_features: est.instruction_features,
        item_tokens: est.item_tokens,
        prefix_tokens: est.prefix_tokens,
        prefix_digest,
        arrival,
        deadline,
        span: request_span,
    });
    Ok(Planned { ctx, jobs, dropped })
}
