//! The MoE layer on the twin kernels, in the order the GPU pipeline launches them:
//! route → count → offsets and tile schedules → select → scatter → gate/up grouped GEMM (both
//! variants launched, one runs) → SiLU·up to bf16 (in the gate/up GEMM's epilogue on the fused
//! engine) → down grouped GEMM → weighted un-permute.

use super::elementwise::silu_mul_bf16;
use super::moe_gemm::{max_tiles, moe_gemm, moe_gemm_swiglu, moe_gemm_wgmma, moe_gemm_wgmma_swiglu, GroupedGemmArgs};
use super::moe_permute::{
    moe_chunk_counts, moe_offsets, moe_scatter, moe_select_tile, moe_unpermute, n_chunks, Offsets, SharedTerm,
};
use super::moe_routing::moe_topk_softmax;
use super::warp::to_bf16_vec;
use crate::backend::{KernelError, Result};
use crate::cuda::moe::{check_moe, MoeDims, MoeRouting, TileChoice, TilePolicy};
use crate::cuda::GemmEngine;

type GroupedGemm = fn(usize, GroupedGemmArgs<'_>, usize, &mut [f32]);
type GroupedSwiglu = fn(usize, GroupedGemmArgs<'_>, usize, &mut [u16]);

/// Expert weights as the device holds them (bf16, nn.Linear layout):
/// gate_up [n_experts, 2·inter, hidden] (gate rows then up rows), down [n_experts, hidden, inter].
#[derive(Debug, Clone)]
pub struct TwinMoeWeights {
    pub dims: MoeDims,
    pub gate_up: Vec<u16>,
    pub down: Vec<u16>,
}

impl TwinMoeWeights {
    pub fn new(dims: MoeDims, gate_up: &[f32], down: &[f32]) -> Result<Self> {
        let MoeDims { hidden, inter, n_experts } = dims;
        if gate_up.len() != n_experts * 2 * inter * hidden || down.len() != n_experts * hidden * inter {
            return Err(KernelError::Shape(format!(
                "MoE weights: gate_up {} and down {} values for {n_experts} experts of [{}, {hidden}] / [{hidden}, {inter}]",
                gate_up.len(),
                down.len(),
                2 * inter
            )));
        }
        Ok(TwinMoeWeights { dims, gate_up: to_bf16_vec(gate_up), down: to_bf16_vec(down) })
    }
}

/// out[t] = Σ_j w[t, j] · down_e(silu(gate_e(x[t])) · up_e(x[t])) over the token's top-k experts.
/// `x` is [tokens, hidden], `router_logits` [tokens, n_experts].
pub fn moe_forward(
    x: &[f32],
    router_logits: &[f32],
    w: &TwinMoeWeights,
    routing: MoeRouting,
    policy: TilePolicy,
) -> Result<(Vec<f32>, TileChoice)> {
    moe_forward_with_counts(x, router_logits, w, routing, policy, GemmEngine::TiledUnfused, None)
        .map(|(out, choice, _)| (out, choice))
}

/// [`moe_forward`] on `engine`'s kernels, also returning the token-per-expert histogram the
/// selector saw: on a fused engine the gate/up GEMM stores the activation itself
/// (`moe_gemm_swiglu_*`), the same bits; on the wgmma engine the grouped GEMMs are
/// moe_gemm_wgmma.cu's. With `shared`, the un-permute adds the shared expert's gated output.
pub fn moe_forward_with_counts(
    x: &[f32],
    router_logits: &[f32],
    w: &TwinMoeWeights,
    routing: MoeRouting,
    policy: TilePolicy,
    engine: GemmEngine,
    shared: Option<SharedTerm<'_>>,
) -> Result<(Vec<f32>, TileChoice, Vec<u32>)> {
    let MoeDims { hidden, inter, n_experts } = w.dims;
    let swiglu_fused = engine.swiglu_fused_for(hidden, inter);
    let wgmma = engine == GemmEngine::Wgmma;
    let (plain, swiglu): (GroupedGemm, GroupedSwiglu) =
        if wgmma { (moe_gemm_wgmma, moe_gemm_wgmma_swiglu) } else { (moe_gemm, moe_gemm_swiglu) };
    check_moe(w.dims, routing)?;
    let tokens = x.len() / hidden;
    if x.len() != tokens * hidden || router_logits.len() != tokens * n_experts {
        return Err(KernelError::Shape(format!(
            "MoE: {} activations and {} router logits for hidden {hidden}, {n_experts} experts",
            x.len(),
            router_logits.len()
        )));
    }
    let k = routing.top_k;
    let n_assign = tokens * k;
    if n_assign == 0 {
        return Ok((Vec::new(), TileChoice::default(), vec![0; n_experts]));
    }
    let mut ids = vec![0u32; n_assign];
    let mut weights = vec![0f32; n_assign];
    moe_topk_softmax(router_logits, &mut ids, &mut weights, tokens, n_experts, k, routing.renormalize);

    let chunk_counts = moe_chunk_counts(&ids, n_experts);
    let off = moe_offsets(&chunk_counts, n_chunks(n_assign), n_experts);
    let (threshold, force) = policy.kernel_args();
    let choice = moe_select_tile(&off.counts, threshold, force);
    let (dest, xp) = moe_scatter(x, &ids, &off, k, hidden, n_experts);

    let launches = |a, wts, n, kdim| grouped_launches(&off, choice.block_m, n_experts, a, wts, (n, kdim));
    let mut act = vec![0u16; n_assign * inter];
    if swiglu_fused {
        for (bm, args, grid_x) in launches(&xp, &w.gate_up, 2 * inter, hidden) {
            swiglu(bm, args, grid_x, &mut act);
        }
    } else {
        let mut gate_up = vec![0f32; n_assign * 2 * inter];
        for (bm, args, grid_x) in launches(&xp, &w.gate_up, 2 * inter, hidden) {
            plain(bm, args, grid_x, &mut gate_up);
        }
        silu_mul_bf16(&gate_up, &mut act, inter);
    }
    // The down projection stores bf16 (moe_gemm*_bf16_*): its f32 outputs rounded once.
    let mut y = vec![0f32; n_assign * hidden];
    for (bm, args, grid_x) in launches(&act, &w.down, hidden, inter) {
        plain(bm, args, grid_x, &mut y);
    }
    let mut out = vec![0f32; tokens * hidden];
    moe_unpermute(&to_bf16_vec(&y), &dest, &weights, shared, &mut out, k, hidden, false);
    Ok((out, choice, off.counts))
}

/// Both variants' launches of one grouped GEMM over `a` [rows, k] and `wts` [n_experts, n, k],
/// with their grids (the one the selector did not choose returns at once).
fn grouped_launches<'a>(
    off: &'a Offsets,
    choice: u32,
    n_experts: usize,
    a: &'a [u16],
    wts: &'a [u16],
    (n, k): (usize, usize),
) -> [(usize, GroupedGemmArgs<'a>, usize); 2] {
    let n_assign = a.len() / k;
    [64usize, 128].map(|bm| {
        let tiles = if bm == 64 { &off.tiles64 } else { &off.tiles128 };
        let args = GroupedGemmArgs {
            a,
            w: wts,
            counts: &off.counts,
            offsets: &off.offsets,
            tiles,
            n_tiles: off.n_tiles,
            choice,
            n,
            k,
        };
        (bm, args, max_tiles(n_assign, n_experts, bm))
    })
}

/// One MoE layer for the twin's `Backend::moe_ffn`: the router as a bf16 projection, the experts.
#[derive(Debug, Clone)]
pub struct TwinMoeLayer {
    pub router: super::backend::TwinMatrix,
    pub experts: TwinMoeWeights,
    pub shared: Option<crate::cuda::moe::SharedExpert<super::backend::TwinMatrix>>,
}
