//! The cost-balanced split (the design).
//!
//! For a shard count k, the items are packed longest-first onto the k first-ranked workers,
//! each item going where it finishes earliest given what that worker already has (its backlog,
//! its speed, the shards packed so far; a worker's first shard also pays the call's fixed cost
//! and the prefix). A shard never exceeds the worker's batch-token limit: an item that does not
//! fit opens another shard on that worker. k is chosen to minimise the predicted finish of the
//! slowest worker; a smaller k wins within `tolerance` of the best.
//!
//! With a price of work (load-aware split, [`super::load_price`]), k minimises the makespan
//! plus the price times the plan's total work instead: as the cluster fills, the fixed costs
//! of extra shards weigh more and k falls toward one shard on the least-loaded worker.

use super::{ranked, Candidate, Plan, Request, ShardPlan, SplitPolicy};
use crate::balancer::Policy;
use crate::cluster::worker::WorkerView;

/// `split.mode = "cost"`: the first `max_shards` workers of the ranking at most.
pub struct CostSplit {
    pub max_shards: usize,
    pub tolerance: f64,
    /// Price each plan's total work by the cluster's load ([`super::load_price`]).
    pub load_aware: bool,
}

impl SplitPolicy for CostSplit {
    fn name(&self) -> &'static str {
        "cost"
    }

    fn plan(&self, req: &Request<'_>, views: &[WorkerView], balance: &dyn Policy) -> Plan {
        let (cands, workers) = ranked(views, balance);
        let price = if self.load_aware { super::load_price::price(&cands) } else { 0.0 };
        split_by_cost_priced(req, &cands, self.max_shards, self.tolerance, price).on_workers(&workers)
    }
}

/// Cost-balanced split over `candidates` (in preference order).
pub fn split_by_cost(req: &Request<'_>, candidates: &[Candidate], max_shards: usize, tolerance: f64) -> Plan {
    split_by_cost_priced(req, candidates, max_shards, tolerance, 0.0)
}

/// As [`split_by_cost`], choosing k by `makespan + price x total work` instead of the makespan
/// alone: `price` is what each ms of work costs other requests' queueing
/// ([`super::load_price`]), so extra shards must save this request more than they cost the rest.
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
