//! Cutting a request's items into shards: one policy per file behind [`SplitPolicy`], chosen
//! once from the config by [`build`] (like `balancer::build`).
//!
//! `cost` (the design) chooses the shard count and packs items by predicted cost so the shards
//! finish together; `fixed` (the request-level baseline) cuts consecutive chunks of a fixed item
//! count; `whole` sends everything to one worker. Every policy returns the same [`Plan`], with
//! each shard's predicted compute and finish time, which the dispatcher uses for hedging.

mod cost;
mod fixed;
pub mod groups;
pub mod load_price;
mod whole;

use std::sync::Arc;

use sieve_shared::proxy_config::{SplitConfig, SplitMode};
use sieve_shared::CostModel;

pub use cost::{
    exhaustive_steps, split_by_cost, split_by_cost_priced, split_exhaustive, work_ms, CostSplit, EXHAUSTIVE_STEPS,
};
pub use fixed::{split_fixed, FixedSplit};
pub use groups::{ItemGroups, NO_GROUPS};
pub use whole::{split_whole, WholeSplit};

use crate::balancer::Policy;
use crate::cluster::worker::WorkerView;

/// How a request's items are cut into shards and placed on workers.
pub trait SplitPolicy: Send + Sync {
    fn name(&self) -> &'static str;

    /// Plans the request over the eligible workers `views` describes, ranked or assigned by
    /// the balancing policy. A shard's `candidate` is an index into `views`.
    fn plan(&self, req: &Request<'_>, views: &[WorkerView], balance: &dyn Policy) -> Plan;
}

/// The policy `cfg.mode` names, with its parameters.
pub fn build(cfg: &SplitConfig) -> Arc<dyn SplitPolicy> {
    match cfg.mode {
        SplitMode::Cost => Arc::new(CostSplit::new(cfg.max_shards, cfg.tolerance, cfg.load_aware)),
        SplitMode::CostUngrouped => Arc::new(CostSplit::new(cfg.max_shards, cfg.tolerance, cfg.load_aware).ungrouped()),
        SplitMode::Fixed => Arc::new(FixedSplit { items: cfg.fixed_items }),
        SplitMode::None => Arc::new(WholeSplit),
    }
}

/// A worker as a split sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// Predicted time until the worker can start on new work.
    pub available_ms: f64,
    /// Measured time per unit of predicted cost.
    pub time_factor: f64,
    /// Shard token limit (prefix + items); 0: none.
    pub max_batch_tokens: u64,
    /// Holds the request's shared prefix in its prefix cache: its shards do not pay the
    /// prefix's compute ([`crate::prefix_holders`]).
    pub holds_prefix: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ShardPlan {
    /// Index into the candidates given to the split function; from a [`SplitPolicy`], an index
    /// into its `views`.
    pub candidate: usize,
    /// Indices of the request's items, ascending.
    pub items: Vec<usize>,
    /// Estimated tokens computed: prefix + items, the shared run of a group's members on the
    /// shard once.
    pub tokens: f64,
    /// Predicted compute time on its worker.
    pub compute_ms: f64,
    /// Predicted time from now until it is done (backlog, earlier shards on the same worker,
    /// its own compute).
    pub finish_ms: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub shards: Vec<ShardPlan>,
    /// Predicted finish of the slowest shard.
    pub makespan_ms: f64,
}

/// Inputs common to every policy.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// Estimated own-segment tokens per item.
    pub item_tokens: &'a [f64],
    /// Estimated shared-prefix tokens.
    pub prefix: f64,
    pub model: &'a CostModel,
    /// Items that begin alike: a shard pays a group's run once ([`NO_GROUPS`]: none).
    pub groups: &'a ItemGroups,
}

impl Request<'_> {
    /// The fixed cost of a shard on `c` before its items: the call's, and the prefix's unless
    /// `c` holds it.
    fn first_shard_ms(&self, c: &Candidate) -> f64 {
        if c.holds_prefix {
            self.model.request_ms
        } else {
            self.model.request_ms + self.model.prefix_ms(self.prefix)
        }
    }

    /// Predicted compute of a shard of `items` (ascending) on `c` (time factor 1).
    pub(crate) fn shard_ms(&self, c: &Candidate, items: &[usize]) -> f64 {
        let cached = if c.holds_prefix { self.prefix } else { 0.0 };
        self.model.predict(&self.groups.call_features(self.prefix, cached, self.item_tokens, items))
    }

    /// Estimated tokens a shard of `items` (ascending) computes, the prefix included.
    pub(crate) fn shard_tokens(&self, items: &[usize]) -> f64 {
        let f = self.groups.call_features(self.prefix, 0.0, self.item_tokens, items);
        f.tokens
    }
}

impl From<&WorkerView> for Candidate {
    fn from(v: &WorkerView) -> Self {
        Candidate {
            available_ms: v.backlog_ms,
            time_factor: v.time_factor,
            max_batch_tokens: v.max_batch_tokens,
            holds_prefix: v.holds_prefix,
        }
    }
}

impl Plan {
    /// The same plan with each shard's candidate index replaced by `workers[candidate]`.
    fn on_workers(mut self, workers: &[usize]) -> Plan {
        for s in &mut self.shards {
            s.candidate = workers[s.candidate];
        }
        self
    }
}

/// The candidates in the balancing policy's order, and the worker index of each.
fn ranked(views: &[WorkerView], balance: &dyn Policy) -> (Vec<Candidate>, Vec<usize>) {
    let rank = balance.rank(views);
    (rank.iter().map(|&i| Candidate::from(&views[i])).collect(), rank)
}

/// Shards from given groups of items, each on its candidate, in order.
pub(crate) fn plan_from_groups(req: &Request<'_>, candidates: &[Candidate], groups: Vec<(usize, Vec<usize>)>) -> Plan {
    let mut finish: Vec<f64> = candidates.iter().map(|c| c.available_ms).collect();
    let mut shards = Vec::with_capacity(groups.len());
    for (c, items) in groups {
        let Some(cand) = candidates.get(c) else { continue };
        let tokens = req.shard_tokens(&items);
        let compute_ms = cand.time_factor * req.shard_ms(cand, &items);
        finish[c] += compute_ms;
        shards.push(ShardPlan { candidate: c, items, tokens, compute_ms, finish_ms: finish[c] });
    }
    let makespan_ms = shards.iter().map(|s| s.finish_ms).fold(0.0, f64::max);
    Plan { shards, makespan_ms }
}

/// Heavy-tailed item lengths between 30 and 600 tokens (a Pareto-like tail), deterministic for
/// a seed: the workload the split's tests and its decision bench plan.
pub fn heavy_tailed_tokens(m: usize, seed: u64) -> Vec<f64> {
    let mut x = seed;
    (0..m)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            (30.0 / u.powf(1.0 / 1.2)).min(600.0)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle(n: usize) -> Vec<Candidate> {
        vec![Candidate { available_ms: 0.0, time_factor: 1.0, max_batch_tokens: 0, holds_prefix: false }; n]
    }

    fn skewed(m: usize, seed: u64) -> Vec<f64> {
        heavy_tailed_tokens(m, seed)
    }

    fn check_partition(plan: &Plan, m: usize) {
        let mut seen: Vec<usize> = plan.shards.iter().flat_map(|s| s.items.iter().copied()).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..m).collect::<Vec<_>>(), "every item exactly once");
    }

    fn spread(plan: &Plan) -> f64 {
        let max = plan.shards.iter().map(|s| s.finish_ms).fold(0.0, f64::max);
        let min = plan.shards.iter().map(|s| s.finish_ms).fold(f64::INFINITY, f64::min);
        max / min
    }

    #[test]
    fn balanced_packing_on_skewed_lengths() {
        let model = CostModel::default();
        for (m, workers, seed) in [(200, 8, 1), (200, 16, 2), (1000, 16, 3), (60, 4, 4), (500, 32, 5)] {
            let tokens = skewed(m, seed);
            let max_item = tokens.iter().copied().fold(0.0, f64::max);
            assert!(max_item > 10.0 * tokens.iter().copied().fold(f64::INFINITY, f64::min), "lengths are skewed");
            let req = Request { item_tokens: &tokens, prefix: 60.0, model: &model, groups: &NO_GROUPS };
            let plan = split_by_cost(&req, &idle(workers), 64, 0.02);
            check_partition(&plan, m);
            assert!(plan.shards.len() >= 2, "m={m}: a large request is split");
            let s = spread(&plan);
            assert!(s <= 1.10, "m={m} workers={workers}: max/min predicted shard time {s:.3}");
            // The naive alternative, equal item counts, is far worse on the same items.
            let k = plan.shards.len();
            let fixed = split_fixed(&req, &idle(k), m.div_ceil(k), &(0..k).collect::<Vec<_>>());
            assert!(spread(&fixed) > s, "m={m}: fixed split spread {:.3} vs {s:.3}", spread(&fixed));
        }
    }

    #[test]
    fn busy_and_slow_workers_get_less_and_finish_together() {
        let model = CostModel::default();
        let tokens = skewed(400, 7);
        let req = Request { item_tokens: &tokens, prefix: 60.0, model: &model, groups: &NO_GROUPS };
        let mut cands = idle(4);
        cands[1].available_ms = 20.0; // already has 20 ms of work
        cands[2].time_factor = 3.0; // three times slower
        let plan = split_by_cost(&req, &cands, 64, 0.0);
        check_partition(&plan, 400);
        let items_on = |c: usize| plan.shards.iter().filter(|s| s.candidate == c).map(|s| s.items.len()).sum::<usize>();
        assert!(
            items_on(1) < items_on(0) && items_on(2) < items_on(1),
            "{} {} {}",
            items_on(0),
            items_on(1),
            items_on(2)
        );
        assert!(spread(&plan) <= 1.10, "finish times {:.3}", spread(&plan));
    }

    #[test]
    fn fan_out_stops_where_fixed_costs_dominate() {
        let model = CostModel { request_ms: 10.0, token_ms: 0.005, token_context_ms: 0.0 };
        let tokens = vec![10.0; 4];
        let req = Request { item_tokens: &tokens, prefix: 50.0, model: &model, groups: &NO_GROUPS };
        let plan = split_by_cost(&req, &idle(8), 64, 0.02);
        assert_eq!(plan.shards.len(), 1, "four tiny items are not worth a second call");
        // Without the tolerance the model's 1.5% gain buys a call per item.
        assert_eq!(split_by_cost(&req, &idle(8), 64, 0.0).shards.len(), 4);
        let tokens = vec![400.0; 400];
        let req = Request { item_tokens: &tokens, prefix: 50.0, model: &model, groups: &NO_GROUPS };
        assert_eq!(split_by_cost(&req, &idle(8), 64, 0.02).shards.len(), 8);
        assert_eq!(split_by_cost(&req, &idle(8), 3, 0.02).shards.len(), 3, "max_shards caps the fan-out");
    }

    #[test]
    fn shards_respect_the_batch_token_limit() {
        let model = CostModel::default();
        let tokens = skewed(300, 9);
        let req = Request { item_tokens: &tokens, prefix: 60.0, model: &model, groups: &NO_GROUPS };
        let limit = 4000u64;
        let cands =
            vec![Candidate { available_ms: 0.0, time_factor: 1.0, max_batch_tokens: limit, holds_prefix: false }; 2];
        let plan = split_by_cost(&req, &cands, 64, 0.02);
        check_partition(&plan, 300);
        let total: f64 = tokens.iter().sum();
        assert!(plan.shards.len() as f64 >= total / limit as f64, "enough shards for the limit");
        for s in &plan.shards {
            assert!(s.tokens <= limit as f64, "shard of {} tokens", s.tokens);
        }
    }

    #[test]
    fn many_workers_use_the_coarse_search() {
        let model = CostModel::default();
        let tokens = skewed(1000, 11);
        let req = Request { item_tokens: &tokens, prefix: 60.0, model: &model, groups: &NO_GROUPS };
        let plan = split_by_cost(&req, &idle(64), 64, 0.02);
        check_partition(&plan, 1000);
        // Compare with an exhaustive search over k.
        let mut best = f64::INFINITY;
        for k in 1..=64 {
            let p = split_by_cost(&req, &idle(k), k, 0.0);
            best = best.min(p.makespan_ms);
        }
        assert!(plan.makespan_ms <= best * 1.03, "{} vs exhaustive {best}", plan.makespan_ms);
    }

    #[test]
    fn the_fluid_choice_plans_as_well_as_packing_every_k() {
        // Large requests choose k from the fluid model and pack once; small ones pack every k.
        // On random clusters the one must not plan worse than the other.
        let model = CostModel::default();
        let mut x = 42u64;
        let mut next = || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        for case in 0..40u64 {
            let m = [300, 600, 1000, 1000][case as usize % 4];
            let workers = [16, 24, 48][case as usize % 3];
            let tokens = skewed(m, 100 + case);
            let cands: Vec<Candidate> = (0..workers)
                .map(|_| Candidate {
                    available_ms: if next() < 0.5 { 0.0 } else { next() * 60.0 },
                    time_factor: 0.7 + next() * 0.8,
                    max_batch_tokens: if case % 5 == 0 { 20_000 } else { 0 },
                    holds_prefix: next() < 0.2,
                })
                .collect();
            let req =
                Request { item_tokens: &tokens, prefix: 20.0 + next() * 100.0, model: &model, groups: &NO_GROUPS };
            let k_max = workers.min(m);
            assert!(exhaustive_steps(m, k_max) > EXHAUSTIVE_STEPS, "case {case} takes the fluid path");
            let fluid = split_by_cost(&req, &cands, 64, 0.02);
            check_partition(&fluid, m);
            let exhaustive = split_exhaustive(&req, &cands, k_max, 0.02, load_price::Price::NONE);
            let ratio = fluid.makespan_ms / exhaustive.makespan_ms;
            assert!(
                ratio <= 1.02,
                "case {case}: makespan {} vs {} packing every k",
                fluid.makespan_ms,
                exhaustive.makespan_ms
            );
        }
    }

    #[test]
    fn fixed_and_whole_modes() {
        let model = CostModel::default();
        let tokens = vec![100.0; 10];
        let req = Request { item_tokens: &tokens, prefix: 50.0, model: &model, groups: &NO_GROUPS };
        let plan = split_fixed(&req, &idle(2), 4, &[1, 0, 1]);
        assert_eq!(plan.shards.iter().map(|s| s.items.len()).collect::<Vec<_>>(), vec![4, 4, 2]);
        assert_eq!(plan.shards[2].candidate, 1);
        assert!(
            (plan.shards[2].finish_ms - plan.shards[0].compute_ms - plan.shards[2].compute_ms).abs() < 1e-9,
            "serial on one worker"
        );
        let whole = split_whole(&req, &idle(2), 1);
        assert_eq!(whole.shards.len(), 1);
        assert_eq!(whole.shards[0].items.len(), 10);
    }

    #[test]
    fn policies_come_from_the_config_and_plan_onto_worker_indices() {
        use crate::balancer::LeastLoaded;
        let view = |backlog_ms| WorkerView {
            backlog_ms,
            in_flight: 0,
            time_factor: 1.0,
            max_batch_tokens: 0,
            holds_prefix: false,
        };
        // Distinct loads: least loaded ranks workers 2, 0, 1 every time.
        let views = [view(10.0), view(30.0), view(0.0)];
        let ranking = [2usize, 0, 1];
        let model = CostModel::default();
        let tokens = skewed(200, 13);
        let req = Request { item_tokens: &tokens, prefix: 60.0, model: &model, groups: &NO_GROUPS };

        let cfg = SplitConfig::default();
        let cost = build(&cfg);
        assert_eq!(cost.name(), "cost");
        let plan = cost.plan(&req, &views, &LeastLoaded);
        let cands: Vec<Candidate> = ranking.iter().map(|&i| Candidate::from(&views[i])).collect();
        let direct = split_by_cost(&req, &cands, cfg.max_shards, cfg.tolerance);
        assert_eq!(plan.shards.len(), direct.shards.len());
        for (s, d) in plan.shards.iter().zip(&direct.shards) {
            assert_eq!(s.candidate, ranking[d.candidate], "a shard's candidate is its worker's index");
            assert_eq!((&s.items, s.finish_ms.to_bits()), (&d.items, d.finish_ms.to_bits()));
        }

        let whole = build(&SplitConfig { mode: SplitMode::None, ..cfg.clone() });
        assert_eq!(whole.name(), "none");
        let plan = whole.plan(&req, &views, &LeastLoaded);
        assert_eq!(plan.shards.iter().map(|s| s.candidate).collect::<Vec<_>>(), vec![2], "all on the least loaded");

        let fixed = build(&SplitConfig { mode: SplitMode::Fixed, fixed_items: 64, ..cfg });
        assert_eq!(fixed.name(), "fixed");
        let plan = fixed.plan(&req, &views, &LeastLoaded);
        // 200 items in chunks of 64, assigned down the ranking and round again.
        assert_eq!(plan.shards.iter().map(|s| s.candidate).collect::<Vec<_>>(), vec![2, 0, 1, 2]);
        assert_eq!(plan.shards.iter().map(|s| s.items.len()).collect::<Vec<_>>(), vec![64, 64, 64, 8]);
    }

    #[test]
    fn a_prefix_holder_is_preferred_when_idle_and_not_when_busy() {
        use crate::balancer::LeastLoaded;
        // A long shared prefix (a document as the query), a few short items: the prefix is most
        // of a shard's compute.
        let model = CostModel { request_ms: 2.0, token_ms: 0.005, token_context_ms: 5e-6 };
        let tokens = vec![40.0; 4];
        let req = Request { item_tokens: &tokens, prefix: 1500.0, model: &model, groups: &NO_GROUPS };
        let view = |backlog_ms, holds_prefix| WorkerView {
            backlog_ms,
            in_flight: u64::from(backlog_ms > 0.0),
            time_factor: 1.0,
            max_batch_tokens: 0,
            holds_prefix,
        };
        let split = build(&SplitConfig::default());
        let on = |plan: &Plan| plan.shards.iter().map(|s| s.candidate).collect::<Vec<_>>();
        // All idle; worker 3 holds the prefix and is ranked last by least-loaded (ties by index):
        // the whole request goes to it, predicted without the prefix's compute.
        let idle = [view(0.0, false), view(0.0, false), view(0.0, false), view(0.0, true)];
        let warm = split.plan(&req, &idle, &LeastLoaded);
        assert_eq!(on(&warm), vec![3], "the idle holder takes it all");
        let cold = model.call_ms(req.prefix, tokens.iter().copied());
        assert!((warm.shards[0].compute_ms - (cold - model.prefix_ms(req.prefix))).abs() < 1e-9);
        // Without the holding every shard pays the prefix, and the request finishes later
        // however it is cut.
        let plain = [view(0.0, false); 4];
        let plan = split.plan(&req, &plain, &LeastLoaded);
        assert!(plan.shards.iter().all(|s| s.compute_ms >= model.prefix_ms(req.prefix)), "{plan:?}");
        assert!(plan.makespan_ms > 2.0 * warm.makespan_ms, "{} vs {}", plan.makespan_ms, warm.makespan_ms);
        // The holder queued behind more work than the prefix saves: another worker takes it.
        let busy = [view(0.0, false), view(0.0, false), view(0.0, false), view(40.0, true)];
        let plan = split.plan(&req, &busy, &LeastLoaded);
        assert!(!on(&plan).contains(&3), "the busy holder is passed over: {plan:?}");
        // Queued behind less than the prefix saves: still worth waiting for.
        let saves = model.prefix_ms(req.prefix);
        let short = [view(0.0, false), view(0.0, false), view(0.0, false), view(saves / 2.0, true)];
        assert_eq!(on(&split.plan(&req, &short, &LeastLoaded)), vec![3]);
    }

    /// A catalogue request: `m` items of 100 tokens in groups of 8 sharing a 40-token run.
    fn catalogue(m: usize) -> (Vec<f64>, ItemGroups) {
        let tokens = (0..m).map(|i| 80.0 + (i * 37 % 41) as f64).collect();
        let items: Vec<Vec<usize>> = (0..m / 8).map(|g| (g * 8..g * 8 + 8).collect()).collect();
        (tokens, ItemGroups { run: vec![40.0; items.len()], items })
    }

    /// Per group: the shards holding its members.
    fn spans(plan: &Plan, groups: &ItemGroups) -> Vec<usize> {
        groups
            .items
            .iter()
            .map(|members| plan.shards.iter().filter(|s| members.iter().any(|i| s.items.contains(i))).count())
            .collect()
    }

    #[test]
    fn groups_stay_on_one_shard_and_pay_their_run_once() {
        let model = CostModel::default();
        // 200 items (the exhaustive path on 8 workers) and 800 (the fluid one on 16).
        for (m, workers) in [(200, 8), (800, 16)] {
            let (tokens, groups) = catalogue(m);
            let grouped = Request { item_tokens: &tokens, prefix: 60.0, model: &model, groups: &groups };
            let blind = Request { groups: &NO_GROUPS, ..grouped };
            let plan = split_by_cost(&grouped, &idle(workers), 64, 0.02);
            check_partition(&plan, m);
            assert!(plan.shards.len() >= 2, "still split");
            assert!(
                spans(&plan, &groups).iter().all(|&n| n == 1),
                "m={m}: a group scattered: {:?}",
                spans(&plan, &groups)
            );
            // Each shard is predicted at its real cost: a group's run once, not per member.
            for s in &plan.shards {
                let exact = grouped.shard_ms(&idle(1)[0], &s.items);
                assert!((s.compute_ms - exact).abs() < 1e-9 * exact, "{} vs {exact}", s.compute_ms);
                assert!((s.tokens - grouped.shard_tokens(&s.items)).abs() < 1e-9 * s.tokens);
                assert!(s.tokens < 60.0 + s.items.iter().map(|&i| tokens[i]).sum::<f64>(), "the run counted once");
            }
            // Today's split scatters the groups, and its plan costs more once the workers share
            // what its shards happen to hold.
            let today = split_by_cost(&blind, &idle(workers), 64, 0.02);
            assert!(spans(&today, &groups).iter().any(|&n| n > 1), "m={m}: the blind split keeps every group");
            let real: Vec<(usize, Vec<usize>)> = today.shards.iter().map(|s| (s.candidate, s.items.clone())).collect();
            let today_real = plan_from_groups(&grouped, &idle(workers), real);
            assert!(work_ms(&plan) < work_ms(&today_real), "{} vs {}", work_ms(&plan), work_ms(&today_real));
            assert!(
                plan.makespan_ms <= today_real.makespan_ms * 1.02,
                "{} vs {}",
                plan.makespan_ms,
                today_real.makespan_ms
            );
        }
    }

    #[test]
    fn a_group_larger_than_a_fair_share_is_cut() {
        let model = CostModel::default();
        let tokens = vec![100.0; 120];
        // One family of 96 items and 24 items alone, on 8 idle workers.
        let groups = ItemGroups { run: vec![40.0], items: vec![(0..96).collect()] };
        let req = Request { item_tokens: &tokens, prefix: 60.0, model: &model, groups: &groups };
        let plan = split_by_cost(&req, &idle(8), 64, 0.02);
        check_partition(&plan, 120);
        let n = spans(&plan, &groups)[0];
        assert!(n >= 4, "the family is cut across shards: {n}");
        assert!(spread(&plan) <= 1.15, "and the shards still finish together: {:.3}", spread(&plan));
        // Whole, it would be one shard's work several times over.
        let whole = split_whole(&req, &idle(1), 0);
        assert!(plan.makespan_ms < whole.makespan_ms / 3.0);
    }

    #[test]
    fn the_fixed_and_whole_splits_predict_a_groups_run_once() {
        let model = CostModel::default();
        let (tokens, groups) = catalogue(64);
        let req = Request { item_tokens: &tokens, prefix: 60.0, model: &model, groups: &groups };
        let blind = Request { groups: &NO_GROUPS, ..req };
        let (a, b) = (split_whole(&req, &idle(1), 0), split_whole(&blind, &idle(1), 0));
        let saved = 8.0 * 7.0 * 40.0;
        assert!(
            (b.shards[0].tokens - a.shards[0].tokens - saved).abs() < 1e-6,
            "{} {}",
            a.shards[0].tokens,
            b.shards[0].tokens
        );
        assert!(a.makespan_ms < b.makespan_ms);
    }

    mod properties {
        //! Invariants of every plan, over generated requests: every item in exactly one
        //! shard, no empty shard, shard limits (token limit, max_shards, fixed chunk size)
        //! respected, candidates in range, figures consistent, and the same plan every time.
        use super::*;
        use proptest::prelude::*;

        fn candidates() -> impl Strategy<Value = Vec<Candidate>> {
            prop::collection::vec(
                (0.0..200.0f64, 0.2..5.0f64, prop_oneof![Just(0u64), 200..20_000u64], any::<bool>()).prop_map(
                    |(available_ms, time_factor, max_batch_tokens, holds_prefix)| Candidate {
                        available_ms,
                        time_factor,
                        max_batch_tokens,
                        holds_prefix,
                    },
                ),
                1..12,
            )
        }

        /// Item token estimates: mostly short, some long, a few zero-length.
        fn items() -> impl Strategy<Value = Vec<f64>> {
            prop::collection::vec(prop_oneof![4 => 1.0..300.0f64, 1 => 300.0..3000.0f64, 1 => Just(0.0)], 1..300)
        }

        fn model() -> impl Strategy<Value = CostModel> {
            (0.0..20.0f64, 0.0001..0.05f64, 0.0..0.0001f64).prop_map(|(request_ms, token_ms, token_context_ms)| {
                CostModel { request_ms, token_ms, token_context_ms }
            })
        }

        /// Groups among `m` items: each item labelled 0 (alone) or a group 1..=4, each group
        /// with a run of its own (at most its shortest member).
        fn groups_of(labels: &[u8], runs: &[f64], tokens: &[f64]) -> ItemGroups {
            let mut g = ItemGroups::default();
            for label in 1..=4u8 {
                let items: Vec<usize> = (0..tokens.len()).filter(|&i| labels.get(i) == Some(&label)).collect();
                if items.len() >= 2 {
                    let shortest = items.iter().map(|&i| tokens[i]).fold(f64::INFINITY, f64::min);
                    g.run.push(runs[usize::from(label) - 1].min(shortest));
                    g.items.push(items);
                }
            }
            g
        }

        /// What holds for a plan of any mode.
        fn check_plan(plan: &Plan, req: &Request<'_>, n_candidates: usize) -> Result<(), TestCaseError> {
            let m = req.item_tokens.len();
            let mut seen = vec![0u32; m];
            for s in &plan.shards {
                prop_assert!(!s.items.is_empty(), "an empty shard");
                prop_assert!(s.candidate < n_candidates, "candidate {} of {n_candidates}", s.candidate);
                prop_assert!(s.items.windows(2).all(|w| w[0] < w[1]), "items not ascending: {:?}", s.items);
                for &i in &s.items {
                    prop_assert!(i < m, "item {i} of {m}");
                    seen[i] += 1;
                }
                // Tokens: at most every item's own (a group's run once where its members are
                // together), at least what the shard computes (two pieces of a group on one
                // shard are each counted with the run).
                let all = req.prefix + s.items.iter().map(|&i| req.item_tokens[i]).sum::<f64>();
                let computed = req.shard_tokens(&s.items);
                let eps = 1e-6 * all.max(1.0);
                prop_assert!(
                    s.tokens <= all + eps && s.tokens >= computed - eps,
                    "shard tokens {} vs {computed}..{all}",
                    s.tokens
                );
                if req.groups.is_empty() {
                    prop_assert!((s.tokens - all).abs() <= eps, "shard tokens {} vs {all}", s.tokens);
                }
                prop_assert!(s.compute_ms >= 0.0 && s.finish_ms >= s.compute_ms - 1e-9, "{s:?}");
            }
            prop_assert!(seen.iter().all(|&n| n == 1), "items not covered exactly once: {seen:?}");
            let makespan = plan.shards.iter().map(|s| s.finish_ms).fold(0.0, f64::max);
            prop_assert!((plan.makespan_ms - makespan).abs() <= 1e-9 * makespan.max(1.0));
            Ok(())
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

            #[test]
            fn cost_split_partitions_within_limits(
                item_tokens in items(),
                prefix in 0.0..500.0f64,
                model in model(),
                cands in candidates(),
                max_shards in 0usize..20,
                tolerance in 0.0..0.1f64,
                labels in prop::collection::vec(prop_oneof![2 => Just(0u8), 3 => 1..=4u8], 0..300),
                runs in prop::collection::vec(1.0..200.0f64, 4),
            ) {
                let groups = groups_of(&labels, &runs, &item_tokens);
                let req = Request { item_tokens: &item_tokens, prefix, model: &model, groups: &groups };
                let plan = split_by_cost(&req, &cands, max_shards, tolerance);
                check_plan(&plan, &req, cands.len())?;
                // A group reaches more shards only where it is larger than a shard's fair share
                // (a k-th of the items' cost, groups whole, k at most the workers it may use).
                let k_max = max_shards.max(1).min(cands.len()).min(item_tokens.len());
                let pairs: Vec<f64> = item_tokens.iter().map(|&n| model.pair_ms(n, prefix)).collect();
                let whole = groups::Units::of(&groups, &item_tokens, &pairs, prefix, &model, 1, f64::INFINITY);
                let total: f64 = whole.cost.iter().sum();
                let limited = cands.iter().any(|c| c.max_batch_tokens > 0);
                for (g, members) in groups.items.iter().enumerate().filter(|_| !limited) {
                    let cost = whole.cost[whole.items.iter().position(|u| u == members).unwrap()];
                    let allowed = if total > 0.0 { (cost * k_max as f64 / total + 1e-9).ceil().max(1.0) } else { 1.0 };
                    let reached = plan.shards.iter().filter(|s| members.iter().any(|i| s.items.contains(i))).count();
                    // A piece is never cut (a token limit opens another shard for a whole unit).
                    prop_assert!(
                        reached as f64 <= allowed,
                        "group {g} of {} items on {reached} shards, {allowed} allowed", members.len()
                    );
                }
                // Workers used: at most max_shards (at least one is always used).
                let mut used: Vec<usize> = plan.shards.iter().map(|s| s.candidate).collect();
                used.sort_unstable();
                used.dedup();
                prop_assert!(used.len() <= max_shards.max(1), "{} workers for max_shards {max_shards}", used.len());
                // A worker with a token limit gets several shards rather than one too large;
                // only an item that alone exceeds the limit may be a shard over it.
                for s in &plan.shards {
                    let limit = cands[s.candidate].max_batch_tokens;
                    if limit > 0 && s.items.len() > 1 {
                        prop_assert!(s.tokens <= limit as f64 + 1e-6, "shard of {} tokens over the limit {limit}", s.tokens);
                    }
                }
                // Without token limits a worker gets one shard, so shards <= max_shards too.
                if cands.iter().all(|c| c.max_batch_tokens == 0) {
                    prop_assert!(plan.shards.len() <= max_shards.max(1));
                }
                prop_assert_eq!(&split_by_cost(&req, &cands, max_shards, tolerance), &plan, "deterministic");
            }

            #[test]
            fn fixed_split_cuts_consecutive_chunks(
                item_tokens in items(),
                prefix in 0.0..500.0f64,
                model in model(),
                cands in candidates(),
                chunk in 0usize..50,
                picks in prop::collection::vec(any::<prop::sample::Index>(), 0..40),
            ) {
                let req = Request { item_tokens: &item_tokens, prefix, model: &model, groups: &NO_GROUPS };
                let assignment: Vec<usize> = picks.iter().map(|p| p.index(cands.len())).collect();
                let plan = split_fixed(&req, &cands, chunk, &assignment);
                check_plan(&plan, &req, cands.len())?;
                let chunk = chunk.max(1);
                prop_assert_eq!(plan.shards.len(), item_tokens.len().div_ceil(chunk));
                for (j, s) in plan.shards.iter().enumerate() {
                    prop_assert_eq!(s.items[0], j * chunk, "consecutive chunks");
                    prop_assert!(s.items.len() <= chunk, "{} items in a chunk of {chunk}", s.items.len());
                    prop_assert_eq!(s.candidate, assignment.get(j).copied().unwrap_or(0));
                }
                prop_assert_eq!(&split_fixed(&req, &cands, chunk, &assignment), &plan, "deterministic");
            }

            #[test]
            fn whole_split_is_one_shard(item_tokens in items(), model in model(), cands in candidates(), pick in any::<prop::sample::Index>()) {
                let req = Request { item_tokens: &item_tokens, prefix: 10.0, model: &model, groups: &NO_GROUPS };
                let c = pick.index(cands.len());
                let plan = split_whole(&req, &cands, c);
                check_plan(&plan, &req, cands.len())?;
                prop_assert_eq!(plan.shards.len(), 1);
                prop_assert_eq!(plan.shards[0].candidate, c);
            }
        }
    }
}
