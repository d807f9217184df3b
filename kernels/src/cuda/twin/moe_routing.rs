//! Twin of kernels/cuda/moe_routing.cu (`moe_topk_softmax`), lane by lane.

use super::warp::{warp_max, warp_sum};
use crate::cuda::sources::consts::ROUTE_MAX_EXPERTS;

const PER_LANE: usize = ROUTE_MAX_EXPERTS as usize / 32;

/// One warp per token: ids and weights of the top-k experts, `tokens * top_k` each.
pub fn moe_topk_softmax(
    logits: &[f32],
    ids: &mut [u32],
    weights: &mut [f32],
    tokens: usize,
    n_experts: usize,
    top_k: usize,
    renormalize: bool,
) {
    for t in 0..tokens {
        let row = &logits[t * n_experts..(t + 1) * n_experts];
        // v[lane][i] is expert lane + 32 i.
        let mut v = [[f32::NEG_INFINITY; PER_LANE]; 32];
        let mut local_max = [f32::NEG_INFINITY; 32];
        for lane in 0..32 {
            for i in 0..PER_LANE {
                let e = lane + 32 * i;
                v[lane][i] = if e < n_experts { row[e] } else { f32::NEG_INFINITY };
                local_max[lane] = local_max[lane].max(v[lane][i]);
            }
        }
        let mx = warp_max(local_max);
        let mut local_sum = [0f32; 32];
        for lane in 0..32 {
            for i in 0..PER_LANE {
                let e = lane + 32 * i;
                v[lane][i] = if e < n_experts { (v[lane][i] - mx).exp() } else { 0.0 };
                local_sum[lane] += v[lane][i];
            }
        }
        let inv_sum = 1.0f32 / warp_sum(local_sum);
        for lane_v in v.iter_mut() {
            for x in lane_v.iter_mut() {
                *x *= inv_sum;
            }
        }
        let mut used = [0u32; 32];
        let mut picked_sum = 0f32;
        let mut picks = Vec::with_capacity(top_k);
        for _ in 0..top_k {
            let mut best = [(-1.0f32, u32::MAX); 32];
            for lane in 0..32 {
                for i in 0..PER_LANE {
                    let e = (lane + 32 * i) as u32;
                    if (e as usize) < n_experts && (used[lane] >> i) & 1 == 0 && v[lane][i] > best[lane].0 {
                        best[lane] = (v[lane][i], e);
                    }
                }
            }
            for o in [16, 8, 4, 2, 1] {
                let prev = best;
                for lane in 0..32 {
                    let (ob, oe) = prev[lane ^ o];
                    let (b, e) = prev[lane];
                    if ob > b || (ob == b && oe < e) {
                        best[lane] = (ob, oe);
                    }
                }
            }
            let (b, e) = best[0];
            used[(e & 31) as usize] |= 1 << (e >> 5);
            picked_sum += b;
            picks.push((e, b));
        }
        for (j, &(e, b)) in picks.iter().enumerate() {
            ids[t * top_k + j] = e;
            weights[t * top_k + j] = if renormalize { b / picked_sum } else { b };
        }
    }
}
