//! The routing rule every backend follows: top-k of the router's softmax, in a fixed order.

use super::MoeRouting;
use crate::error::{KernelError, Result};

/// Checks a routing against a layer's expert count.
pub fn check_routing(routing: MoeRouting, num_experts: usize) -> Result<()> {
    if routing.top_k == 0 || routing.top_k > num_experts {
        return Err(KernelError::Shape(format!("moe: top-{} of {num_experts} experts", routing.top_k)));
    }
    Ok(())
}

/// The routing rule, for one row of router logits (f32, as HF computes it): the `top_k` experts
/// by probability, descending (equal probabilities: the lower expert id first), and their
/// weights — `softmax(logits)[e]`, or, with `norm_topk_prob`, those renormalised over the top-k.
/// Every sum runs in a fixed order (experts ascending; then the top-k in rank order), so the
/// result depends on the row alone.
///
/// `ids` and `weights` have `top_k` entries. `exp` is the backend's exponential.
// `!(a > b)` is deliberate: a NaN logit must never win a top-k slot.
#[allow(clippy::neg_cmp_op_on_partial_ord)]
pub fn route_row(logits: &[f32], routing: MoeRouting, exp: impl Fn(f32) -> f32, ids: &mut [u32], weights: &mut [f32]) {
    let k = routing.top_k;
    debug_assert!(ids.len() == k && weights.len() == k && k <= logits.len());
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // Top-k of exp(l − max) by insertion into a sorted list: strict comparisons keep the lower id
    // first among equals, since ids are visited ascending.
    let mut filled = 0usize;
    let mut total = 0f32;
    for (e, &l) in logits.iter().enumerate() {
        let p = exp(l - max);
        total += p;
        if filled == k && !(p > weights[k - 1]) {
            continue;
        }
        // Write at the first free entry, or over the evicted last one, then bubble up.
        let mut at = if filled < k { filled } else { k - 1 };
        while at > 0 && p > weights[at - 1] {
            weights[at] = weights[at - 1];
            ids[at] = ids[at - 1];
            at -= 1;
        }
        weights[at] = p;
        ids[at] = e as u32;
        if filled < k {
            filled += 1;
        }
    }
    let denom = if routing.norm_topk_prob { weights.iter().sum::<f32>() } else { total };
    for w in weights.iter_mut() {
        *w /= denom;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_picks_the_top_k_in_order_and_normalises() {
        let logits = [0.5f32, 2.0, -1.0, 2.0, 1.0, 3.0];
        let (mut ids, mut w) = ([0u32; 3], [0f32; 3]);
        route_row(&logits, MoeRouting { top_k: 3, norm_topk_prob: false }, f32::exp, &mut ids, &mut w);
        // 3.0, then the tie 2.0 at ids 1 and 3: the lower id first.
        assert_eq!(ids, [5, 1, 3]);
        let z: f32 = logits.iter().map(|l| (l - 3.0).exp()).sum();
        for (j, &e) in ids.iter().enumerate() {
            assert!((w[j] - (logits[e as usize] - 3.0).exp() / z).abs() < 1e-6);
        }
        route_row(&logits, MoeRouting { top_k: 3, norm_topk_prob: true }, f32::exp, &mut ids, &mut w);
        assert_eq!(ids, [5, 1, 3]);
        assert!((w.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(w[0] > w[1] && w[1] == w[2]);
        // k = all experts, k = 1
        let (mut ids, mut w) = ([0u32; 6], [0f32; 6]);
        route_row(&logits, MoeRouting { top_k: 6, norm_topk_prob: false }, f32::exp, &mut ids, &mut w);
        assert_eq!(ids, [5, 1, 3, 4, 0, 2]);
        let (mut ids, mut w) = ([0u32; 1], [0f32; 1]);
        route_row(&logits, MoeRouting { top_k: 1, norm_topk_prob: true }, f32::exp, &mut ids, &mut w);
        assert_eq!((ids, w), ([5], [1.0]));
    }
}
