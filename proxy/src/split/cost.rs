//! The cost-balanced split (the design).
//!
//! For a shard count k, the items are packed longest-first onto the k first-ranked workers,
//! each item going where it finishes earliest given what that worker already has (its backlog,
//! its speed, the shards packed so far; a worker's first shard also pays the call's fixed cost
//! and the prefix). A shard never exceeds the worker's batch-token limit: an item that does not
//! fit opens another shard on that worker. k is chosen to minimise the predicted finish of the
//! slowest worker; a smaller k wins within `tolerance` of the best.
//!
//! Choosing k by packing every k costs O(m·k²) for m items, so it is done only for small
//! requests ([`EXHAUSTIVE_STEPS`]). Larger ones choose
//! k from the fluid model of the packing: items divisible, worker j (backlog a_j, time factor
//! t_j) can start on items at b_j = a_j + t_j·(fixed cost + prefix), and the k first-ranked
//! workers finish together at the water level T(k) = (P + Σ b_j/t_j) / Σ 1/t_j over those with
//! b_j < T (P: the items' total time). Candidates are added one at a time, kept sorted by b, so
//! every T(k) together costs O(k_max²) arithmetic; the longest item bounds T from below. The
//! chosen k is then packed once, longest item first onto the worker that is free earliest (a
//! heap: O(m log k)). Its makespan stays close to the exhaustive search's (a test checks this);
//! `--bench split_decision` prints what the decision costs.
//!
//! With a load price (load-aware split, [`super::load_price`]), k minimises the makespan plus
//! what the plan's work adds to the waiting of requests that arrive behind it: Θ·V_min·X while
//! every worker is busy (X the plan's total work: every extra shard adds its fixed cost and
//! prefix to it; Θ counts requests, from the running mean of the plans' work this split
//! keeps), θ·Σ (f_j² − a_j²)/2 over the plan's workers while some worker is idle.
//!
//! Items that begin alike ([`super::ItemGroups`]): a worker computes a group's shared run once
//! per call holding two or more of its members, so the packing places a group as one unit whose
//! cost is its run once plus each member's rest, and cuts a group into pieces only where it costs
//! more than a k-th of the request (a shard's fair share): a scattered group would pay its run
//! on every shard it reaches. The load price still chooses k, on the grouped costs.
//!
//! Cache-aware routing: a candidate that holds the request's prefix in its prefix cache
//! ([`super::Candidate::holds_prefix`]) pays no prefix on its shards, so its b_j is earlier and
//! its shards cheaper; [`holders_first`] moves such a holder to the front of the ranking when it
//! could start before the first-ranked worker. Nothing else changes: the makespan and the load
//! price decide whether the saving is worth the holder's queue, with no threshold of its own.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};

use super::groups::{Units, NO_GROUPS};
use super::load_price::Price;
use super::{ranked, Candidate, Plan, Request, ShardPlan, SplitPolicy};
use crate::balancer::Policy;
use crate::cluster::worker::WorkerView;

/// Above this many packing steps (items × candidates summed over every k), k is chosen from the
/// fluid model instead of by packing every k.
pub const EXHAUSTIVE_STEPS: usize = 16_384;

/// The packing steps of choosing k by packing every k up to `k_max` for `m` items (each item
/// weighed against each of the k candidates of each pack).
pub fn exhaustive_steps(m: usize, k_max: usize) -> usize {
    m.saturating_mul(k_max * (k_max + 1) / 2)
}

/// `split.mode = "cost"`: the first `max_shards` workers of the ranking at most.
pub struct CostSplit {
    pub max_shards: usize,
    pub tolerance: f64,
    /// Price each plan's delay to others by the cluster's load ([`super::load_price`]).
    pub load_aware: bool,
    /// Keep items that begin alike together (`split.mode = "cost"`); false: every item packed
    /// alone (`"cost_ungrouped"`, the comparison's baseline).
    pub grouped: bool,
    /// W̄, the mean work of the plans made: the load price counts requests by it.
    mean_work: MeanWork,
}

impl CostSplit {
    pub fn new(max_shards: usize, tolerance: f64, load_aware: bool) -> CostSplit {
        CostSplit { max_shards, tolerance, load_aware, grouped: true, mean_work: MeanWork::default() }
    }

    /// The same split blind to item groups.
    pub fn ungrouped(self) -> CostSplit {
        CostSplit { grouped: false, ..self }
    }
}

/// A running mean of the work (ms) of the plans made, 1/[`MeanWork::WEIGHT`] of each new
/// plan: the workload's mean request over its last few dozen requests, so that a change of
/// workload shows within seconds while one large request moves it little. Lock-free: two
/// plans updating at once may drop one sample, which a mean does not feel.
#[derive(Debug, Default)]
struct MeanWork(AtomicU64);

impl MeanWork {
    const WEIGHT: f64 = 32.0;

    /// The mean so far; None before the first plan.
    fn get(&self) -> Option<f64> {
        let bits = self.0.load(Ordering::Relaxed);
        (bits != 0).then(|| f64::from_bits(bits))
    }

    fn record(&self, work_ms: f64) {
        if !(work_ms.is_finite() && work_ms > 0.0) {
            return;
        }
        let mean = self.get().map_or(work_ms, |m| m + (work_ms - m) / Self::WEIGHT);
        self.0.store(mean.to_bits(), Ordering::Relaxed);
    }
}

impl SplitPolicy for CostSplit {
    fn name(&self) -> &'static str {
        "cost"
    }

    fn plan(&self, req: &Request<'_>, views: &[WorkerView], balance: &dyn Policy) -> Plan {
        let ungrouped = Request { groups: &NO_GROUPS, ..*req };
        let req = if self.grouped { req } else { &ungrouped };
        let (mut cands, mut workers) = ranked(views, balance);
        holders_first(req, &mut cands, &mut workers);
        if !self.load_aware {
            return split_by_cost(req, &cands, self.max_shards, self.tolerance).on_workers(&workers);
        }
        // Before the first plan, this request sent whole stands for the mean.
        let mean =
            self.mean_work.get().unwrap_or_else(|| req.model.call_ms(req.prefix, req.item_tokens.iter().copied()));
        let plan = split_by_cost_priced(req, &cands, self.max_shards, self.tolerance, Price::of(views, mean));
        self.mean_work.record(work_ms(&plan));
        plan.on_workers(&workers)
    }
}

/// Moves the candidates that hold the request's prefix and could start on its items before
/// the first-ranked one to the front of the ranking (in their order): the split considers the
/// first k of the ranking, and a small request only the first. A holder that is busier than the
/// prefix saves stays where the balancing policy put it.
pub fn holders_first(req: &Request<'_>, cands: &mut Vec<Candidate>, workers: &mut Vec<usize>) {
    let Some(lead) = cands.first() else { return };
    if !cands.iter().any(|c| c.holds_prefix) {
        return;
    }
    let start = |c: &Candidate| c.available_ms + c.time_factor * req.first_shard_ms(c);
    let lead = start(lead);
    let ahead = |c: &Candidate| c.holds_prefix && start(c) < lead;
    if !cands.iter().any(ahead) {
        return;
    }
    let order: Vec<usize> =
        (0..cands.len()).filter(|&i| ahead(&cands[i])).chain((0..cands.len()).filter(|&i| !ahead(&cands[i]))).collect();
    *cands = order.iter().map(|&i| cands[i]).collect();
    *workers = order.iter().map(|&i| workers[i]).collect();
}

/// Cost-balanced split over `candidates` (in preference order).
pub fn split_by_cost(req: &Request<'_>, candidates: &[Candidate], max_shards: usize, tolerance: f64) -> Plan {
    split_by_cost_priced(req, candidates, max_shards, tolerance, Price::NONE)
}

/// As [`split_by_cost`], choosing k by the makespan plus `price` of the plan's total work
/// ([`super::load_price`]) instead of the makespan alone, so extra shards must save this
/// request more than their work adds to everyone else's waiting.
pub fn split_by_cost_priced(
    req: &Request<'_>,
    candidates: &[Candidate],
    max_shards: usize,
    tolerance: f64,
    price: Price,
) -> Plan {
    let m = req.item_tokens.len();
    let k_max = max_shards.min(candidates.len()).min(m).max(1);
    if m == 0 || candidates.is_empty() {
        return Plan { shards: Vec::new(), makespan_ms: 0.0 };
    }
    if exhaustive_steps(m, k_max) <= EXHAUSTIVE_STEPS {
        split_exhaustive(req, candidates, k_max, tolerance, price)
    } else {
        split_fluid(req, candidates, k_max, tolerance, price)
    }
}

/// Item indices, longest first (ties by index: the same order every time). A three-pass radix
/// sort (8 bits a pass) on the top 24 bits of each length's order key (sign, exponent, 12 bits
/// of mantissa): lengths within 0.03% of each other count as equal, which longest-first
/// packing does not feel, and the sort costs O(m) instead of a comparison sort's O(m log m)
/// (the largest single cost of the decision before).
fn longest_first(tokens: &[f64]) -> Vec<usize> {
    const BITS: u32 = 8;
    const DIGITS: usize = 1 << BITS;
    let keys: Vec<u32> = tokens.iter().map(|&n| ((!order_key(n)) >> (64 - 3 * BITS)) as u32).collect();
    let mut order: Vec<usize> = (0..tokens.len()).collect();
    let mut next = vec![0usize; tokens.len()];
    for shift in [0, BITS, 2 * BITS] {
        let digit = |i: usize| ((keys[i] >> shift) as usize) & (DIGITS - 1);
        let mut at = [0u32; DIGITS + 1];
        for &i in &order {
            at[digit(i) + 1] += 1;
        }
        for d in 0..DIGITS {
            at[d + 1] += at[d];
        }
        for &i in &order {
            let d = digit(i);
            next[at[d] as usize] = i;
            at[d] += 1;
        }
        std::mem::swap(&mut order, &mut next);
    }
    order
}

/// Every k packed and scored (a coarse geometric scan first above 24 candidates): the choice for
/// small requests, public for the test and the bench that hold the fluid choice against it.
pub fn split_exhaustive(
    req: &Request<'_>,
    candidates: &[Candidate],
    k_max: usize,
    tolerance: f64,
    price: Price,
) -> Plan {
    let pairs: Vec<f64> = req.item_tokens.iter().map(|&n| req.model.pair_ms(n, req.prefix)).collect();
    // What is packed for k shards, longest first: the items themselves when nothing is grouped
    // (the same for every k), else groups as units, cut where larger than a k-th.
    let units_for = |k: usize| {
        let units =
            Units::of(req.groups, req.item_tokens, &pairs, req.prefix, req.model, k, room(req, &candidates[..k]));
        let order = longest_first(&units.tokens);
        (units, order)
    };
    let same_units = req.groups.is_empty().then(|| units_for(1));

    let mut packer = Packer::new(req, candidates);
    // (k, score) for every k tried.
    let mut evaluated: Vec<(usize, f64)> = Vec::new();
    let mut eval = |k: usize, evaluated: &mut Vec<(usize, f64)>| -> f64 {
        if let Some(&(_, ms)) = evaluated.iter().find(|e| e.0 == k) {
            return ms;
        }
        let own;
        let (units, order) = match &same_units {
            Some(u) => u,
            None => {
                own = units_for(k);
                &own
            }
        };
        let makespan = packer.pack(units, order, k, false);
        let ms = if price.is_none() {
            makespan
        } else {
            // Σ (f² − a²)/2 over the k packed workers (0 for one left empty; a worker with no
            // finite backlog takes no shard).
            let spread: f64 = packer
                .finish
                .iter()
                .zip(candidates)
                .map(|(f, c)| (f * f - c.available_ms.powi(2)) / 2.0)
                .filter(|v| v.is_finite())
                .sum();
            makespan + price.of_plan(packer.shard_compute.iter().sum(), spread)
        };
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
    let (units, order) = match same_units {
        Some(u) => u,
        None => units_for(k),
    };
    packer.pack(&units, &order, k, true);
    packer.into_plan(&units)
}

/// A plan's total work X: every shard's compute, its fixed cost and prefix included (what
/// [`super::load_price`] prices).
pub fn work_ms(plan: &Plan) -> f64 {
    plan.shards.iter().map(|s| s.compute_ms).sum()
}

/// k from the fluid model, then one heap packing of it (see the module doc).
fn split_fluid(req: &Request<'_>, candidates: &[Candidate], k_max: usize, tolerance: f64, price: Price) -> Plan {
    let pairs: Vec<f64> = req.item_tokens.iter().map(|&n| req.model.pair_ms(n, req.prefix)).collect();
    // The items' total time: a group's run once (groups whole; cutting one adds little).
    let total: f64 = if req.groups.is_empty() {
        pairs.iter().sum()
    } else {
        Units::of(req.groups, req.item_tokens, &pairs, req.prefix, req.model, 1, f64::INFINITY).cost.iter().sum()
    };
    let longest = pairs.iter().copied().fold(0.0, f64::max);
    let start = |c: &Candidate| c.available_ms + c.time_factor * req.first_shard_ms(c);

    // Candidates 0..k sorted by when they could start on items; scores per k.
    let mut by_start: Vec<(f64, usize)> = Vec::with_capacity(k_max);
    let mut scores: Vec<f64> = Vec::with_capacity(k_max);
    let mut bound = f64::INFINITY;
    for (k, c) in candidates[..k_max].iter().enumerate() {
        let b = start(c);
        let at = by_start.partition_point(|e| e.0 <= b);
        by_start.insert(at, (b, k));
        bound = bound.min(b + c.time_factor * longest);
        let (level, used) = water_level(&by_start, candidates, total);
        let makespan = level.max(bound);
        let score = if price.is_none() {
            makespan
        } else {
            // Each worker used computes from its backlog up to the level.
            let work: f64 = by_start[..used].iter().map(|&(_, j)| level - candidates[j].available_ms).sum();
            let spread: f64 =
                by_start[..used].iter().map(|&(_, j)| (level * level - candidates[j].available_ms.powi(2)) / 2.0).sum();
            makespan + price.of_plan(work, spread)
        };
        scores.push(score);
    }
    let best = scores.iter().copied().fold(f64::INFINITY, f64::min);
    let k = scores.iter().position(|&s| s <= best * (1.0 + tolerance)).map_or(1, |i| i + 1);
    by_start.clear();
    by_start.extend(candidates[..k].iter().enumerate().map(|(j, c)| (start(c), j)));
    by_start.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (_, used) = water_level(&by_start, candidates, total);
    let slots = &by_start[..used.max(1)];
    let packed: Vec<Candidate> = slots.iter().map(|&(_, j)| candidates[j]).collect();
    let units = Units::of(req.groups, req.item_tokens, &pairs, req.prefix, req.model, slots.len(), room(req, &packed));
    pack_earliest(req, &units, candidates, slots)
}

/// The most tokens a group's piece may have on `candidates`: the smallest shard token limit
/// less the prefix (unbounded without limits), so that a piece fits a shard of its own.
fn room(req: &Request<'_>, candidates: &[Candidate]) -> f64 {
    candidates
        .iter()
        .filter(|c| c.max_batch_tokens > 0)
        .map(|c| c.max_batch_tokens as f64 - req.prefix)
        .fold(f64::INFINITY, f64::min)
}

/// The fluid finish T of `total` item time over the candidates `by_start` (sorted by start b):
/// the prefix with b < T shares it so that all finish at T. Returns T and that prefix's length.
fn water_level(by_start: &[(f64, usize)], candidates: &[Candidate], total: f64) -> (f64, usize) {
    let (mut speed, mut weighted, mut level, mut used) = (0.0, 0.0, f64::INFINITY, 0);
    for &(b, j) in by_start {
        if b >= level {
            break;
        }
        let inv = 1.0 / candidates[j].time_factor.max(f64::MIN_POSITIVE);
        speed += inv;
        weighted += b * inv;
        level = (total + weighted) / speed;
        used += 1;
    }
    (level, used)
}

/// `x`'s place in `f64::total_cmp`'s order as an unsigned integer: heap and sort keys that
/// compare as integers.
fn order_key(x: f64) -> u64 {
    let b = x.to_bits() as i64;
    (b ^ ((((b >> 63) as u64) >> 1) as i64)) as u64 ^ (1 << 63)
}

/// Longest unit first onto the worker of `slots` (one shard each, opened up front) that is free
/// earliest; a unit past a worker's token limit opens another shard there. Empty shards are
/// left out of the plan.
fn pack_earliest(req: &Request<'_>, units: &Units, candidates: &[Candidate], slots: &[(f64, usize)]) -> Plan {
    // Shards in the order they were opened: candidate, tokens, compute, item count.
    let mut shards: Vec<(usize, f64, f64, usize)> = slots
        .iter()
        .map(|&(_, j)| (j, req.prefix, candidates[j].time_factor * req.first_shard_ms(&candidates[j]), 0))
        .collect();
    // Per slot: its open shard. Per unit: its shard.
    let mut open: Vec<usize> = (0..slots.len()).collect();
    let mut shard_of = vec![0u32; units.len()];
    // Per slot: when it is free; the heap holds (its order key, slot), earliest first.
    let mut finish: Vec<f64> = slots.iter().map(|&(b, _)| b).collect();
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> =
        finish.iter().enumerate().map(|(slot, &f)| Reverse((order_key(f), slot))).collect();
    for i in longest_first(&units.tokens) {
        // The earliest-free slot takes the unit; its entry is updated in place (one sift).
        let Some(mut top) = heap.peek_mut() else { break };
        let slot = top.0 .1;
        let c = &candidates[slots[slot].1];
        let n = units.tokens[i];
        let s = &shards[open[slot]];
        if c.max_batch_tokens > 0 && s.3 > 0 && s.1 + n > c.max_batch_tokens as f64 {
            let first = c.time_factor * req.first_shard_ms(c);
            open[slot] = shards.len();
            shards.push((slots[slot].1, req.prefix, first, 0));
            finish[slot] += first;
        }
        let s = &mut shards[open[slot]];
        let delta = c.time_factor * units.cost[i];
        s.1 += n;
        s.2 += delta;
        s.3 += 1;
        shard_of[i] = open[slot] as u32;
        finish[slot] += delta;
        top.0 .0 = order_key(finish[slot]);
    }
    // Items into their shards in unit order: each shard's list comes out ascending when the
    // units are the items, and is sorted when they are not.
    let mut items: Vec<Vec<usize>> = shards.iter().map(|s| Vec::with_capacity(s.3)).collect();
    for (u, &s) in shard_of.iter().enumerate() {
        units.push_items(u, &mut items[s as usize]);
    }
    if !units.are_items() {
        items.iter_mut().for_each(|i| i.sort_unstable());
    }
    let mut worker_finish: Vec<f64> = candidates.iter().map(|c| c.available_ms).collect();
    let mut plan = Vec::with_capacity(shards.len());
    for ((c, tokens, compute_ms, count), items) in shards.into_iter().zip(items) {
        if count == 0 {
            continue;
        }
        worker_finish[c] += compute_ms;
        plan.push(ShardPlan { candidate: c, items, tokens, compute_ms, finish_ms: worker_finish[c] });
    }
    let makespan_ms = plan.iter().map(|s| s.finish_ms).fold(0.0, f64::max);
    Plan { shards: plan, makespan_ms }
}

/// Longest-processing-time packing of units onto the first k candidates, reusing its buffers
/// across k.
struct Packer<'a> {
    req: &'a Request<'a>,
    candidates: &'a [Candidate],
    /// Per candidate of the current pack: a new shard's fixed cost there.
    first: Vec<f64>,
    finish: Vec<f64>,
    /// Per candidate: the shard still open for more items.
    open: Vec<Option<usize>>,
    shard_candidate: Vec<usize>,
    shard_tokens: Vec<f64>,
    shard_compute: Vec<f64>,
    /// Only filled on the final pack: units, then (into_plan) their items.
    shard_items: Vec<Vec<usize>>,
}

impl<'a> Packer<'a> {
    fn new(req: &'a Request<'a>, candidates: &'a [Candidate]) -> Self {
        Packer {
            req,
            candidates,
            first: Vec::new(),
            finish: Vec::new(),
            open: Vec::new(),
            shard_candidate: Vec::new(),
            shard_tokens: Vec::new(),
            shard_compute: Vec::new(),
            shard_items: Vec::new(),
        }
    }

    /// Packs `units` (in `order`) onto k candidates; returns the makespan. `keep_items` records
    /// the assignment.
    fn pack(&mut self, units: &Units, order: &[usize], k: usize, keep_items: bool) -> f64 {
        // Per candidate: a shard's fixed cost there (the prefix is free on a holder).
        self.first.clear();
        self.first.extend(self.candidates[..k].iter().map(|c| self.req.first_shard_ms(c)));
        self.finish.clear();
        self.finish.extend(self.candidates[..k].iter().map(|c| c.available_ms));
        self.open.clear();
        self.open.resize(k, None);
        self.shard_candidate.clear();
        self.shard_tokens.clear();
        self.shard_compute.clear();
        self.shard_items.clear();
        for &i in order {
            let n = units.tokens[i];
            let pair = units.cost[i];
            let mut best = (f64::INFINITY, 0usize, false);
            for j in 0..k {
                let c = &self.candidates[j];
                let fits = self.open[j]
                    .is_some_and(|s| c.max_batch_tokens == 0 || self.shard_tokens[s] + n <= c.max_batch_tokens as f64);
                let delta = c.time_factor * if fits { pair } else { self.first[j] + pair };
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
                    self.shard_compute.push(self.candidates[j].time_factor * self.first[j]);
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

    fn into_plan(self, units: &Units) -> Plan {
        let mut worker_finish: Vec<f64> = self.candidates.iter().map(|c| c.available_ms).collect();
        let mut shards = Vec::with_capacity(self.shard_candidate.len());
        for (s, packed) in self.shard_items.into_iter().enumerate() {
            let c = self.shard_candidate[s];
            let mut items = if units.are_items() {
                packed
            } else {
                let mut items = Vec::with_capacity(packed.len());
                packed.iter().for_each(|&u| units.push_items(u, &mut items));
                items
            };
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
