//! Cutting a request's items into shards.
//!
//! Cost mode: for a shard count k, the items are packed longest-first onto the k first-ranked
//! workers, each item going where it finishes earliest given what that worker already has
//! (its backlog, its speed, the shards packed so far; a worker's first shard also pays the
//! call's fixed cost and the prefix). A shard never exceeds the worker's batch-token limit: an
//! item that does not fit opens another shard on that worker. k is chosen to minimise the
//! predicted finish of the slowest worker; a smaller k wins within `tolerance` of the best.
//!
//! With a price of work (load-aware split, [`crate::load_price`]), k minimises the makespan
//! plus the price times the plan's total work instead: as the cluster fills, the fixed costs
//! of extra shards weigh more and k falls toward one shard on the least-loaded worker.
//!
//! Fixed mode (the request-level baseline) cuts consecutive chunks of a fixed item count;
//! whole mode sends everything to one worker. All modes return the same [`Plan`], with each
//! shard's predicted compute and finish time, which the dispatcher uses for hedging.

use sieve_shared::CostModel;

/// A worker as the splitter sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// Predicted time until the worker can start on new work.
    pub available_ms: f64,
    /// Measured time per unit of predicted cost.
    pub time_factor: f64,
    /// Shard token limit (prefix + items); 0: none.
    pub max_batch_tokens: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ShardPlan {
    /// Index into the candidates given to the splitter.
    pub candidate: usize,
    /// Indices of the request's items, ascending.
    pub items: Vec<usize>,
    /// Estimated tokens: prefix + items.
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

/// Inputs common to every mode.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// Estimated own-segment tokens per item.
    pub item_tokens: &'a [f64],
    /// Estimated shared-prefix tokens.
    pub prefix: f64,
    pub model: &'a CostModel,
}

impl Request<'_> {
    fn first_shard_ms(&self) -> f64 {
        self.model.request_ms + self.model.prefix_ms(self.prefix)
    }
}

/// Cost-balanced split over `candidates` (in preference order).
pub fn split_by_cost(req: &Request<'_>, candidates: &[Candidate], max_shards: usize, tolerance: f64) -> Plan {
    split_by_cost_priced(req, candidates, max_shards, tolerance, 0.0)
}

/// As [`split_by_cost`], choosing k by `makespan + price x total work` instead of the makespan
/// alone: `price` is what each ms of work costs other requests' queueing
/// ([`crate::load_price`]), so extra shards must save this request more than they cost the rest.
pub fn split_by_cost_priced(
    req: &Request<'_>,
    candidates: &[Candidate],
    max_shards: usize,
    tolerance: f64,
    price: f64,
) -> Plan {
    let m = req.item_tokens.len();
    let k_max = max_shards.min(candidates.len()).min(m).max(1);
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&a, &b| req.item_tokens[b].total_cmp(&req.item_tokens[a]).then(a.cmp(&b)));
    let pairs: Vec<f64> = req.item_tokens.iter().map(|&n| req.model.pair_ms(n, req.prefix)).collect();

    let mut packer = Packer::new(req, &pairs, candidates);
    // (k, makespan) for every k tried.
    let mut evaluated: Vec<(usize, f64)> = Vec::new();
    let mut eval = |k: usize, evaluated: &mut Vec<(usize, f64)>| -> f64 {
        if let Some(&(_, ms)) = evaluated.iter().find(|e| e.0 == k) {
            return ms;
        }
        let makespan = packer.pack(&order, k, false);
        let ms = if price > 0.0 { makespan + price * packer.work() } else { makespan };
        evaluated.push((k, ms));
        ms
    };
    if k_max <= 24 {
        for k in 1..=k_max {
            eval(k, &mut evaluated);
        }
    } else {
        // Coarse geometric scan, then every k around the best coarse point: the makespan is
        // close to unimodal in k (more workers: less work each, more fixed costs, busier ones).
        let mut coarse = vec![1usize];
        while let Some(&last) = coarse.last() {
            let next = ((last as f64 * 1.5).ceil() as usize).max(last + 1);
            if next >= k_max {
                break;
            }
            coarse.push(next);
        }
        coarse.push(k_max);
        let spans: Vec<f64> = coarse.iter().map(|&k| eval(k, &mut evaluated)).collect();
        let best = (0..coarse.len()).min_by(|&a, &b| spans[a].total_cmp(&spans[b])).unwrap_or(0);
        let lo = if best == 0 { 1 } else { coarse[best - 1] };
        let hi = coarse.get(best + 1).copied().unwrap_or(k_max);
        for k in lo..=hi {
            eval(k, &mut evaluated);
        }
    }
    let best = evaluated.iter().map(|e| e.1).fold(f64::INFINITY, f64::min);
    let k = evaluated.iter().filter(|e| e.1 <= best * (1.0 + tolerance)).map(|e| e.0).min().unwrap_or(1);
    packer.pack(&order, k, true);
    packer.into_plan()
}

/// Consecutive chunks of `chunk` items; shard j goes to candidate `assignment[j]`.
pub fn split_fixed(req: &Request<'_>, candidates: &[Candidate], chunk: usize, assignment: &[usize]) -> Plan {
    let m = req.item_tokens.len();
    let chunk = chunk.max(1);
    let groups: Vec<(usize, Vec<usize>)> = (0..m.div_ceil(chunk))
        .map(|j| (assignment.get(j).copied().unwrap_or(0), (j * chunk..((j + 1) * chunk).min(m)).collect()))
        .collect();
    plan_from_groups(req, candidates, groups)
}

/// Everything to one candidate.
pub fn split_whole(req: &Request<'_>, candidates: &[Candidate], candidate: usize) -> Plan {
    plan_from_groups(req, candidates, vec![(candidate, (0..req.item_tokens.len()).collect())])
}

fn plan_from_groups(req: &Request<'_>, candidates: &[Candidate], groups: Vec<(usize, Vec<usize>)>) -> Plan {
    let mut finish: Vec<f64> = candidates.iter().map(|c| c.available_ms).collect();
    let mut shards = Vec::with_capacity(groups.len());
    for (c, items) in groups {
        let Some(cand) = candidates.get(c) else { continue };
        let tokens = req.prefix + items.iter().map(|&i| req.item_tokens[i]).sum::<f64>();
        let compute_ms = cand.time_factor * req.model.call_ms(req.prefix, items.iter().map(|&i| req.item_tokens[i]));
        finish[c] += compute_ms;
        shards.push(ShardPlan { candidate: c, items, tokens, compute_ms, finish_ms: finish[c] });
    }
    let makespan_ms = shards.iter().map(|s| s.finish_ms).fold(0.0, f64::max);
    Plan { shards, makespan_ms }
}

/// Longest-processing-time packing onto the first k candidates, reusing its buffers across k.
struct Packer<'a> {
    req: &'a Request<'a>,
    pairs: &'a [f64],
    candidates: &'a [Candidate],
    finish: Vec<f64>,
    /// Per candidate: the shard still open for more items.
    open: Vec<Option<usize>>,
    shard_candidate: Vec<usize>,
    shard_tokens: Vec<f64>,
    shard_compute: Vec<f64>,
    /// Only filled on the final pack.
    shard_items: Vec<Vec<usize>>,
}

impl<'a> Packer<'a> {
    fn new(req: &'a Request<'a>, pairs: &'a [f64], candidates: &'a [Candidate]) -> Self {
        Packer {
            req,
            pairs,
            candidates,
            finish: Vec::new(),
            open: Vec::new(),
            shard_candidate: Vec::new(),
            shard_tokens: Vec::new(),
            shard_compute: Vec::new(),
            shard_items: Vec::new(),
        }
    }

    /// Packs onto k candidates; returns the makespan. `keep_items` records the assignment.
    fn pack(&mut self, order: &[usize], k: usize, keep_items: bool) -> f64 {
        let first = self.req.first_shard_ms();
        self.finish.clear();
        self.finish.extend(self.candidates[..k].iter().map(|c| c.available_ms));
        self.open.clear();
        self.open.resize(k, None);
        self.shard_candidate.clear();
        self.shard_tokens.clear();
        self.shard_compute.clear();
        self.shard_items.clear();
        for &i in order {
            let n = self.req.item_tokens[i];
            let pair = self.pairs[i];
            let mut best = (f64::INFINITY, 0usize, false);
            for j in 0..k {
                let c = &self.candidates[j];
                let fits = self.open[j]
                    .is_some_and(|s| c.max_batch_tokens == 0 || self.shard_tokens[s] + n <= c.max_batch_tokens as f64);
                let delta = c.time_factor * if fits { pair } else { first + pair };
                let f = self.finish[j] + delta;
                if f < best.0 {
                    best = (f, j, fits);
                }
            }
            let (f, j, fits) = best;
            let s = match (fits, self.open[j]) {
                (true, Some(s)) => s,
                _ => {
                    let s = self.shard_candidate.len();
                    self.shard_candidate.push(j);
                    self.shard_tokens.push(self.req.prefix);
                    self.shard_compute.push(self.candidates[j].time_factor * first);
                    if keep_items {
                        self.shard_items.push(Vec::new());
                    }
                    self.open[j] = Some(s);
                    s
                }
            };
            self.shard_tokens[s] += n;
            self.shard_compute[s] += self.candidates[j].time_factor * pair;
            self.finish[j] = f;
            if keep_items {
                self.shard_items[s].push(i);
            }
        }
        self.shard_candidate.iter().map(|&j| self.finish[j]).fold(0.0, f64::max)
    }

    /// Total predicted compute of the last pack (every shard's fixed cost included).
    fn work(&self) -> f64 {
        self.shard_compute.iter().sum()
    }

    fn into_plan(self) -> Plan {
        let mut worker_finish: Vec<f64> = self.candidates.iter().map(|c| c.available_ms).collect();
        let mut shards = Vec::with_capacity(self.shard_candidate.len());
        for (s, mut items) in self.shard_items.into_iter().enumerate() {
            let c = self.shard_candidate[s];
            items.sort_unstable();
            worker_finish[c] += self.shard_compute[s];
            shards.push(ShardPlan {
                candidate: c,
                items,
                tokens: self.shard_tokens[s],
                compute_ms: self.shard_compute[s],
                finish_ms: worker_finish[c],
            });
        }
        let makespan_ms = shards.iter().map(|s| s.finish_ms).fold(0.0, f64::max);
        Plan { shards, makespan_ms }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle(n: usize) -> Vec<Candidate> {
        vec![Candidate { available_ms: 0.0, time_factor: 1.0, max_batch_tokens: 0 }; n]
    }

    /// Heavy-tailed item lengths between 30 and 600 tokens (a Pareto-like tail), deterministic.
    fn skewed(m: usize, seed: u64) -> Vec<f64> {
        let mut x = seed;
        (0..m)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let u = ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
                (30.0 / u.powf(1.0 / 1.2)).min(600.0)
            })
            .collect()
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
            let req = Request { item_tokens: &tokens, prefix: 60.0, model: &model };
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
        let req = Request { item_tokens: &tokens, prefix: 60.0, model: &model };
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
        let req = Request { item_tokens: &tokens, prefix: 50.0, model: &model };
        let plan = split_by_cost(&req, &idle(8), 64, 0.02);
        assert_eq!(plan.shards.len(), 1, "four tiny items are not worth a second call");
        // Without the tolerance the model's 1.5% gain buys a call per item.
        assert_eq!(split_by_cost(&req, &idle(8), 64, 0.0).shards.len(), 4);
        let tokens = vec![400.0; 400];
        let req = Request { item_tokens: &tokens, prefix: 50.0, model: &model };
        assert_eq!(split_by_cost(&req, &idle(8), 64, 0.02).shards.len(), 8);
        assert_eq!(split_by_cost(&req, &idle(8), 3, 0.02).shards.len(), 3, "max_shards caps the fan-out");
    }

    #[test]
    fn shards_respect_the_batch_token_limit() {
        let model = CostModel::default();
        let tokens = skewed(300, 9);
        let req = Request { item_tokens: &tokens, prefix: 60.0, model: &model };
        let limit = 4000u64;
        let cands = vec![Candidate { available_ms: 0.0, time_factor: 1.0, max_batch_tokens: limit }; 2];
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
        let req = Request { item_tokens: &tokens, prefix: 60.0, model: &model };
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
    fn fixed_and_whole_modes() {
        let model = CostModel::default();
        let tokens = vec![100.0; 10];
        let req = Request { item_tokens: &tokens, prefix: 50.0, model: &model };
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

    mod properties {
        //! Invariants of every plan, over generated requests: every item in exactly one
        //! shard, no empty shard, shard limits (token limit, max_shards, fixed chunk size)
        //! respected, candidates in range, figures consistent, and the same plan every time.
        use super::*;
        use proptest::prelude::*;

        fn candidates() -> impl Strategy<Value = Vec<Candidate>> {
            prop::collection::vec(
                (0.0..200.0f64, 0.2..5.0f64, prop_oneof![Just(0u64), 200..20_000u64]).prop_map(
                    |(available_ms, time_factor, max_batch_tokens)| Candidate {
                        available_ms,
                        time_factor,
                        max_batch_tokens,
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
                let tokens = req.prefix + s.items.iter().map(|&i| req.item_tokens[i]).sum::<f64>();
                prop_assert!(
                    (s.tokens - tokens).abs() <= 1e-6 * tokens.max(1.0),
                    "shard tokens {} vs {tokens}",
                    s.tokens
                );
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
            ) {
                let req = Request { item_tokens: &item_tokens, prefix, model: &model };
                let plan = split_by_cost(&req, &cands, max_shards, tolerance);
                check_plan(&plan, &req, cands.len())?;
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
                let req = Request { item_tokens: &item_tokens, prefix, model: &model };
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
                let req = Request { item_tokens: &item_tokens, prefix: 10.0, model: &model };
                let c = pick.index(cands.len());
                let plan = split_whole(&req, &cands, c);
                check_plan(&plan, &req, cands.len())?;
                prop_assert_eq!(plan.shards.len(), 1);
                prop_assert_eq!(plan.shards[0].candidate, c);
            }
        }
    }
}
