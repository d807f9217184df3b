//! The MoE oracle: a plain per-token loop in f64 — route the token, run each of its experts,
//! sum the weighted outputs in rank order. No permutation, no grouping, no variants.

use super::{check, silu};
use crate::backend::Result;
use crate::host::HostTensor;
use crate::moe::{check_routing, histogram_stats, BackendVariant, MoeLayerHost, MoeLayerStats, MoeRouting};
use crate::moe_variants;

/// A MoE layer kept as plain row-major arrays (the layout of [`MoeLayerHost`]).
#[derive(Debug, Clone)]
pub struct PlainMoe {
    pub hidden: usize,
    pub num_experts: usize,
    pub inter: usize,
    pub router: Vec<f32>,
    pub gate_up: Vec<f32>,
    pub down: Vec<f32>,
    pub shared: Option<PlainShared>,
}

#[derive(Debug, Clone)]
pub struct PlainShared {
    pub inter: usize,
    pub gate_up: Vec<f32>,
    pub down: Vec<f32>,
    pub gate: Vec<f32>,
}

impl PlainMoe {
    pub fn new(w: &MoeLayerHost) -> Result<Self> {
        w.validate()?;
        Ok(PlainMoe {
            hidden: w.hidden,
            num_experts: w.num_experts,
            inter: w.expert_inter,
            router: w.router.to_vec(),
            gate_up: w.gate_up.to_vec(),
            down: w.down.to_vec(),
            shared: w.shared.map(|s| PlainShared {
                inter: s.inter,
                gate_up: s.gate_up.to_vec(),
                down: s.down.to_vec(),
                gate: s.gate.to_vec(),
            }),
        })
    }
}

moe_variants! {
    /// The reference backend's only variant.
    pub enum ReferenceMoeVariant for "reference" {
        /// The oracle's loop: one token, one expert at a time.
        PerToken => "per_token", tile_rows: 1, padded: false, "plain per-token loop in f64 (the oracle)",
    }
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

/// `down(silu(gate(x)) * up(x))` in f64; `gate_up` is `[2·inter, hidden]`, `down` `[hidden, inter]`.
fn swiglu(x: &[f32], gate_up: &[f32], down: &[f32], inter: usize) -> Vec<f64> {
    let h = x.len();
    let act: Vec<f64> = (0..inter)
        .map(|c| silu(dot(x, &gate_up[c * h..(c + 1) * h])) * dot(x, &gate_up[(inter + c) * h..(inter + c + 1) * h]))
        .collect();
    (0..h).map(|o| down[o * inter..(o + 1) * inter].iter().zip(&act).map(|(&w, a)| w as f64 * a).sum()).collect()
}

/// The top-k experts of one row (probability descending, lower id first among equals) and their
/// weights, in f64.
pub fn route(x: &[f32], m: &PlainMoe, routing: MoeRouting) -> Vec<(usize, f64)> {
    let h = m.hidden;
    let logits: Vec<f64> = (0..m.num_experts).map(|e| dot(x, &m.router[e * h..(e + 1) * h])).collect();
    let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let exps: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
    let total: f64 = exps.iter().sum();
    let mut order: Vec<usize> = (0..m.num_experts).collect();
    order.sort_by(|&a, &b| exps[b].total_cmp(&exps[a]).then(a.cmp(&b)));
    order.truncate(routing.top_k);
    let denom = if routing.norm_topk_prob { order.iter().map(|&e| exps[e]).sum() } else { total };
    order.into_iter().map(|e| (e, exps[e] / denom)).collect()
}

pub fn moe_ffn(x: &HostTensor, m: &PlainMoe, routing: MoeRouting, acc: &mut HostTensor) -> Result<MoeLayerStats> {
    check(x.cols == m.hidden && acc.cols == m.hidden && acc.rows == x.rows, || {
        format!("moe_ffn: x [{}, {}], acc [{}, {}], hidden {}", x.rows, x.cols, acc.rows, acc.cols, m.hidden)
    })?;
    check_routing(routing, m.num_experts)?;
    let (h, i) = (m.hidden, m.inter);
    let mut hist = vec![0u32; m.num_experts];
    for t in 0..x.rows {
        let xt = x.row(t);
        let mut out = vec![0f64; h];
        for (e, w) in route(xt, m, routing) {
            hist[e] += 1;
            let y = swiglu(xt, &m.gate_up[e * 2 * i * h..(e + 1) * 2 * i * h], &m.down[e * h * i..(e + 1) * h * i], i);
            for (o, yv) in out.iter_mut().zip(y) {
                *o += w * yv;
            }
        }
        if let Some(s) = &m.shared {
            let g = 1.0 / (1.0 + (-dot(xt, &s.gate)).exp());
            for (o, yv) in out.iter_mut().zip(swiglu(xt, &s.gate_up, &s.down, s.inter)) {
                *o += g * yv;
            }
        }
        for (a, o) in acc.row_mut(t).iter_mut().zip(out) {
            *a = (*a as f64 + o) as f32;
        }
    }
    let (rows, padded_rows, active_experts, max_expert_rows) =
        histogram_stats(&hist, &ReferenceMoeVariant::PerToken.describe());
    let variant = ReferenceMoeVariant::PerToken.index() as u32;
    Ok(MoeLayerStats { variant, tokens: x.rows as u32, rows, padded_rows, active_experts, max_expert_rows })
}

/// Expert `e`'s SwiGLU of one row (calibration timing).
pub fn swiglu_expert(x: &[f32], m: &PlainMoe, e: usize, h: usize, i: usize) -> Vec<f64> {
    swiglu(x, &m.gate_up[e * 2 * i * h..(e + 1) * 2 * i * h], &m.down[e * h * i..(e + 1) * h * i], i)
}
