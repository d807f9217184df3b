//! Items of a request that begin alike, as the split sees them: a worker computes a group's
//! shared run once per call that holds two or more of its members (`[engine]
//! item_prefix_sharing`), so the split counts the run once per shard holding the group, and
//! packs each group as one unit unless it is larger than a shard's fair share.
//!
//! Groups are found on the texts (`sieve_shared::item_runs`, the grouping the simulated worker
//! charges by too), their runs' bytes turned into tokens by the proxy's estimator.

use sieve_shared::item_runs::{leading_runs, DEFAULT_MIN_RUN_TOKENS};
use sieve_shared::{CostFeatures, CostModel};

use crate::estimate::token_estimator::{features, TokenWeights};

/// The request's item groups: per group its run's tokens and its members.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ItemGroups {
    /// Per group: the estimated tokens of its shared run.
    pub run: Vec<f64>,
    /// Per group: its items (indices into the split's items), ascending, at least two.
    pub items: Vec<Vec<usize>>,
}

/// A request with no groups.
pub static NO_GROUPS: ItemGroups = ItemGroups { run: Vec::new(), items: Vec::new() };

impl ItemGroups {
    /// The groups of `texts` by their shared leading runs of at least the worker's default
    /// threshold, estimated in tokens by `weights`; a run is at most its shortest member's
    /// estimate (`item_tokens`, which a truncation cap may have cut).
    pub fn find(texts: &[&str], item_tokens: &[f64], weights: &TokenWeights) -> ItemGroups {
        // A run's text is inside an item: its tokens are the item's weights without the
        // template's constant.
        let run_tokens = |t: &str| {
            let f = features(t);
            weights.item_tokens(&f) - weights.weights[0] * f[0]
        };
        let mut g = ItemGroups::default();
        for r in leading_runs(texts, DEFAULT_MIN_RUN_TOKENS as f64, run_tokens) {
            let shortest = r.items.iter().map(|&i| item_tokens[i]).fold(f64::INFINITY, f64::min);
            g.run.push(r.tokens.min(shortest).max(0.0));
            g.items.push(r.items);
        }
        g
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Per item of `m`: its group, if any.
    pub fn group_of(&self, m: usize) -> Vec<Option<u32>> {
        let mut of = vec![None; m];
        for (g, items) in self.items.iter().enumerate() {
            for &i in items {
                if let Some(o) = of.get_mut(i) {
                    *o = Some(g as u32);
                }
            }
        }
        of
    }

    /// The cost features of a call of `items` (ascending) after a `prefix`-token prefix of
    /// which `cached` tokens are cached: a group's run once when two or more of its members
    /// are in it.
    pub fn call_features(&self, prefix: f64, cached: f64, item_tokens: &[f64], items: &[usize]) -> CostFeatures {
        if self.is_empty() {
            return CostFeatures::of_call(prefix, cached, items.iter().map(|&i| item_tokens[i]));
        }
        // Per group: its members present; only groups with two or more share their run.
        let mut in_group = vec![false; items.len()];
        let mut shared: Vec<(usize, Vec<usize>)> = Vec::new();
        for (g, members) in self.items.iter().enumerate() {
            let present: Vec<usize> = (0..items.len()).filter(|&k| members.binary_search(&items[k]).is_ok()).collect();
            if present.len() >= 2 {
                present.iter().for_each(|&k| in_group[k] = true);
                shared.push((g, present));
            }
        }
        let alone = (0..items.len()).filter(|&k| !in_group[k]).map(|k| item_tokens[items[k]]);
        let mut f = CostFeatures::of_call(prefix, cached, alone);
        for (g, present) in shared {
            f.add_run_group(prefix, self.run[g], present.iter().map(|&k| item_tokens[items[k]]));
        }
        f
    }
}

/// What the cost split packs: single items, and groups kept on one shard (a group larger than a
/// shard's fair share cut into pieces of near-equal item counts, each paying the run).
#[derive(Debug, Clone, PartialEq)]
pub struct Units {
    /// Per unit: estimated tokens computed (a group's run once).
    pub tokens: Vec<f64>,
    /// Per unit: its marginal cost on a shard after the prefix (time factor 1).
    pub cost: Vec<f64>,
    /// Per unit: its items, ascending; empty when units are the items themselves.
    pub items: Vec<Vec<usize>>,
}

impl Units {
    /// The units of `k` shards: every item alone when there are no groups (`items` empty); else
    /// each group one unit, or `⌈cost / fair share⌉` pieces where it costs more than a k-th of
    /// the request's item cost, and a piece of more than `room` tokens (a shard's token limit
    /// less the prefix) cut again so that it fits.
    pub fn of(
        groups: &ItemGroups,
        item_tokens: &[f64],
        pairs: &[f64],
        prefix: f64,
        model: &CostModel,
        k: usize,
        room: f64,
    ) -> Units {
        if groups.is_empty() {
            return Units { tokens: item_tokens.to_vec(), cost: pairs.to_vec(), items: Vec::new() };
        }
        let group_cost = |g: usize, members: &[usize]| {
            let run = groups.run[g];
            if members.len() < 2 {
                return members.iter().map(|&i| pairs[i]).sum::<f64>();
            }
            model.pair_ms(run, prefix)
                + members.iter().map(|&i| model.pair_ms((item_tokens[i] - run).max(0.0), prefix + run)).sum::<f64>()
        };
        let group_tokens = |g: usize, members: &[usize]| {
            let sum: f64 = members.iter().map(|&i| item_tokens[i]).sum();
            if members.len() < 2 {
                sum
            } else {
                sum - (members.len() - 1) as f64 * groups.run[g]
            }
        };
        let whole: Vec<f64> = groups.items.iter().enumerate().map(|(g, m)| group_cost(g, m)).collect();
        let grouped: usize = groups.items.iter().map(Vec::len).sum();
        let mut in_group = vec![false; item_tokens.len()];
        groups.items.iter().flatten().for_each(|&i| in_group[i] = true);
        let total: f64 =
            whole.iter().sum::<f64>() + (0..pairs.len()).filter(|&i| !in_group[i]).map(|i| pairs[i]).sum::<f64>();
        let fair = total / k.max(1) as f64;
        let mut u = Units {
            tokens: Vec::with_capacity(pairs.len() - grouped + groups.items.len()),
            cost: Vec::with_capacity(pairs.len() - grouped + groups.items.len()),
            items: Vec::with_capacity(pairs.len() - grouped + groups.items.len()),
        };
        for (i, _) in in_group.iter().enumerate().filter(|(_, &g)| !g) {
            u.tokens.push(item_tokens[i]);
            u.cost.push(pairs[i]);
            u.items.push(vec![i]);
        }
        for (g, members) in groups.items.iter().enumerate() {
            let pieces = if fair > 0.0 && whole[g] > fair { (whole[g] / fair).ceil() as usize } else { 1 };
            let pieces = pieces.clamp(1, members.len());
            for p in 0..pieces {
                let mut piece = &members[p * members.len() / pieces..(p + 1) * members.len() / pieces];
                while !piece.is_empty() {
                    // The longest head of the piece that fits the room (at least one member).
                    let mut take = piece.len();
                    while take > 1 && group_tokens(g, &piece[..take]) > room {
                        take -= 1;
                    }
                    u.tokens.push(group_tokens(g, &piece[..take]));
                    u.cost.push(group_cost(g, &piece[..take]));
                    u.items.push(piece[..take].to_vec());
                    piece = &piece[take..];
                }
            }
        }
        u
    }

    pub fn len(&self) -> usize {
        self.cost.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cost.is_empty()
    }

    /// Appends unit `u`'s items to `out`.
    pub fn push_items(&self, u: usize, out: &mut Vec<usize>) {
        match self.items.get(u) {
            Some(items) => out.extend_from_slice(items),
            None => out.push(u),
        }
    }

    /// Whether units are the items themselves (no groups).
    pub fn are_items(&self) -> bool {
        self.items.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(run: f64, items: Vec<Vec<usize>>) -> ItemGroups {
        ItemGroups { run: vec![run; items.len()], items }
    }

    #[test]
    fn a_group_is_one_unit_with_its_run_once() {
        let model = CostModel::default();
        let tokens = vec![100.0; 10];
        let pairs: Vec<f64> = tokens.iter().map(|&n| model.pair_ms(n, 50.0)).collect();
        let g = groups(40.0, vec![vec![1, 3, 5, 7]]);
        let u = Units::of(&g, &tokens, &pairs, 50.0, &model, 2, f64::INFINITY);
        assert_eq!(u.len(), 7, "six items alone and one group");
        let unit = u.items.iter().position(|i| i.len() == 4).unwrap();
        assert_eq!(u.tokens[unit], 4.0 * 100.0 - 3.0 * 40.0, "the run counted once");
        assert!(u.cost[unit] < 4.0 * pairs[1] && u.cost[unit] > 4.0 * model.pair_ms(60.0, 90.0));
        // The features of a call holding the group agree with the unit's cost.
        let f = g.call_features(50.0, 0.0, &tokens, &[1, 3, 5, 7]);
        let call = model.predict(&f) - model.request_ms - model.prefix_ms(50.0);
        assert!((call - u.cost[unit]).abs() < 1e-9, "{call} vs {}", u.cost[unit]);
        // One member on a shard: no sharing, the item's own cost.
        let one = g.call_features(50.0, 0.0, &tokens, &[0, 1]);
        assert_eq!(one, CostFeatures::of_call(50.0, 0.0, [100.0, 100.0]));
    }

    #[test]
    fn a_group_larger_than_a_fair_share_is_cut_into_pieces() {
        let model = CostModel::default();
        let tokens = vec![100.0; 16];
        let pairs: Vec<f64> = tokens.iter().map(|&n| model.pair_ms(n, 50.0)).collect();
        let g = groups(40.0, vec![(0..12).collect()]);
        let whole = Units::of(&g, &tokens, &pairs, 50.0, &model, 1, f64::INFINITY);
        assert_eq!(whole.len(), 5, "one shard: the group whole");
        let cut = Units::of(&g, &tokens, &pairs, 50.0, &model, 4, f64::INFINITY);
        // Fair share ≈ a quarter of the items' cost; the group is ~2.6 shares: three pieces.
        let pieces: Vec<usize> = cut.items.iter().filter(|i| i.len() > 1).map(Vec::len).collect();
        assert_eq!(pieces, vec![4, 4, 4]);
        let mut all: Vec<usize> = cut.items.iter().flatten().copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..16).collect::<Vec<_>>(), "every item in one unit");
        // Each piece pays the run: more work than whole, less than apart.
        let sum = |u: &Units| u.cost.iter().sum::<f64>();
        assert!(sum(&whole) < sum(&cut) && sum(&cut) < pairs.iter().sum::<f64>());
        // A shard's token room cuts pieces further: 100 + 60 × 2 = 220 tokens fit, not four.
        let roomy = Units::of(&g, &tokens, &pairs, 50.0, &model, 1, 230.0);
        let pieces: Vec<usize> = roomy.items.iter().filter(|i| i.len() > 1).map(Vec::len).collect();
        assert_eq!(pieces, vec![3, 3, 3, 3]);
        assert!(roomy.tokens.iter().all(|&t| t <= 230.0));
    }

    #[test]
    fn groups_come_from_texts_with_runs_in_estimated_tokens() {
        let w = crate::estimate::token_estimator::TokenEstimator::new(&Default::default()).weights();
        let header = "Shoes > Running > Trail. Brand: Acme Outdoor, Store: Acme Official, Material: mesh";
        let mut texts: Vec<String> = (0..6).map(|v| format!("{header}. Variant {v} colour c{v}")).collect();
        texts.push("Bags > Leather tote, brown".into());
        texts.push("Shoes > Road racing flat".into());
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let tokens: Vec<f64> = refs.iter().map(|t| w.item_tokens(&features(t))).collect();
        let g = ItemGroups::find(&refs, &tokens, &w);
        assert_eq!(g.items, vec![(0..6).collect::<Vec<_>>()], "the six variants, not the road shoe");
        let header_tokens = w.item_tokens(&features(header)) - w.weights[0];
        assert!((g.run[0] - header_tokens).abs() < 3.0, "run {} vs header {header_tokens}", g.run[0]);
        // No shared header, no group.
        assert!(ItemGroups::find(&refs[5..], &tokens[5..], &w).is_empty());
    }
}
