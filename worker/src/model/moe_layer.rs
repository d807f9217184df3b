//! Sparse MoE feed-forward layers (qwen3_moe, qwen2_moe): loading the per-expert HF tensors
//! stacked into one upload per layer, the policy that picks the grouped-GEMM variant, and what a
//! forward pass records about its MoE layers.

use std::time::Duration;

use sieve_kernels::moe::{MoeCostModel, MoeLayerHost, MoeLayerStats, MoeRouting, MoeSelect, SharedExpertHost};
use sieve_kernels::Backend;

use super::config::MoeConfig;
use super::layers::{load, load_stacked};
use super::source::WeightSource;
use crate::{Result, WorkerError};

/// One MoE layer on the backend.
pub struct MoeFfn<B: Backend> {
    pub weights: B::MoeWeights,
    pub routing: MoeRouting,
    pub num_experts: usize,
}

impl<B: Backend> MoeFfn<B> {
    /// Loads `{prefix}.gate.weight` (router), `{prefix}.experts.{e}.{gate,up,down}_proj.weight`
    /// for every expert (stacked: gate rows then up rows per expert, then the down projections),
    /// and for qwen2_moe `{prefix}.shared_expert.*` and `{prefix}.shared_expert_gate.weight`.
    pub fn load(backend: &B, src: &dyn WeightSource, hidden: usize, m: &MoeConfig, prefix: &str) -> Result<Self> {
        let (e, i) = (m.num_experts, m.expert_intermediate);
        let router = load(src, &format!("{prefix}.gate.weight"), &[e, hidden])?.data;
        let (mut gate_up, mut down) = (Vec::new(), Vec::new());
        for x in 0..e {
            let p = format!("{prefix}.experts.{x}");
            let parts = [(format!("{p}.gate_proj.weight"), i), (format!("{p}.up_proj.weight"), i)];
            let (gu, d) =
                (load_stacked(src, &parts, hidden)?, load(src, &format!("{p}.down_proj.weight"), &[hidden, i])?.data);
            if x == 0 {
                // Sized once the first expert's tensors matched the config in the file (not from
                // the config alone), and refused, not aborted, where the host cannot hold them.
                reserve(&mut gate_up, e * gu.len(), prefix)?;
                reserve(&mut down, e * d.len(), prefix)?;
            }
            gate_up.extend_from_slice(&gu);
            down.extend_from_slice(&d);
        }
        let shared = if m.shared_expert_intermediate > 0 {
            let (s, p) = (m.shared_expert_intermediate, format!("{prefix}.shared_expert"));
            let parts = [(format!("{p}.gate_proj.weight"), s), (format!("{p}.up_proj.weight"), s)];
            Some((
                load_stacked(src, &parts, hidden)?,
                load(src, &format!("{p}.down_proj.weight"), &[hidden, s])?.data,
                load(src, &format!("{prefix}.shared_expert_gate.weight"), &[1, hidden])?.data,
            ))
        } else {
            None
        };
        let host = MoeLayerHost {
            hidden,
            num_experts: e,
            expert_inter: i,
            router: &router,
            gate_up: &gate_up,
            down: &down,
            shared: shared.as_ref().map(|(gu, d, g)| SharedExpertHost {
                inter: m.shared_expert_intermediate,
                gate_up: gu,
                down: d,
                gate: g,
            }),
        };
        Ok(MoeFfn {
            weights: backend.moe_weights(&host)?,
            routing: MoeRouting { top_k: m.top_k, norm_topk_prob: m.norm_topk_prob },
            num_experts: e,
        })
    }
}

/// Reserves room for `n` floats of `prefix`'s experts, an error where the host cannot.
fn reserve(v: &mut Vec<f32>, n: usize, prefix: &str) -> Result<()> {
    v.try_reserve_exact(n).map_err(|_| {
        WorkerError::Config(format!(
            "{prefix}: its experts need {:.1} GiB of host memory to load, more than this host can allocate",
            (n * 4) as f64 / (1u64 << 30) as f64
        ))
    })
}

/// Which grouped-GEMM variant the MoE layers run.
#[derive(Debug, Clone, PartialEq)]
pub enum MoePolicy {
    /// Always this variant (index into the backend's variants).
    Fixed(usize),
    /// The cheapest by the cost model, per layer and pass, from the live histogram.
    Auto(MoeCostModel),
}

impl MoePolicy {
    pub fn select(&self) -> MoeSelect<'_> {
        match self {
            MoePolicy::Fixed(v) => MoeSelect::Fixed(*v),
            MoePolicy::Auto(m) => MoeSelect::Auto(m),
        }
    }

    /// A fixed policy by variant name, or a clear error listing the names.
    pub fn fixed_by_name<B: Backend>(backend: &B, name: &str) -> Result<Self> {
        let variants = backend.moe_variants();
        match variants.iter().position(|v| v.name == name) {
            Some(i) => Ok(MoePolicy::Fixed(i)),
            None => {
                let names: Vec<&str> = variants.iter().map(|v| v.name).collect();
                Err(WorkerError::Config(format!(
                    "moe variant '{name}' is not one of this backend's: {names:?} (or 'auto')"
                )))
            }
        }
    }
}

/// What the last forward pass's MoE layers did, read back once per pass.
#[derive(Debug, Clone, Default)]
pub struct MoePassStats {
    /// One record per MoE layer call, in call order.
    pub layers: Vec<MoeLayerStats>,
    /// Wall time inside `moe_ffn` calls (host-side; on an asynchronous device this is launch time).
    pub moe_time: Duration,
}

/// The MoE part of a forward pass's reusable state: the backend's log and the pass's figures.
pub struct MoeRun<B: Backend> {
    pub log: B::MoeLog,
    pub pass: MoePassStats,
    /// When set, each MoE layer's input (`[rows, hidden]`, host copy) is kept in `captured`, in
    /// call order — real activations for benchmarks and calibration. Off when serving.
    pub capture_inputs: bool,
    pub captured: Vec<Vec<f32>>,
}

impl<B: Backend> MoeRun<B> {
    pub fn new(backend: &B) -> Result<Self> {
        Ok(MoeRun {
            log: backend.moe_log()?,
            pass: MoePassStats::default(),
            capture_inputs: false,
            captured: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use sieve_kernels::reference::ReferenceBackend;

    use super::MoeFfn;
    use crate::model::config::MoeConfig;
    use crate::model::source::MemorySource;

    /// A config claiming experts far wider than the file's (within the config's own bounds) is
    /// the first expert's shape error, not an allocation sized by the claim (before: 8 TiB asked
    /// for at once, and the process aborted).
    #[test]
    fn experts_wider_in_the_config_than_in_the_file_are_a_shape_error() {
        let (e, i, hidden) = (1024, 8, 1024);
        let mut src = MemorySource::default();
        src.insert("m.gate.weight", vec![0.0; e * hidden], vec![e, hidden]);
        for (proj, shape) in [("gate_proj", [i, hidden]), ("up_proj", [i, hidden]), ("down_proj", [hidden, i])] {
            src.insert(format!("m.experts.0.{proj}.weight"), vec![0.1; i * hidden], shape.to_vec());
        }
        let config = MoeConfig {
            num_experts: e,
            top_k: 2,
            expert_intermediate: 1 << 20,
            norm_topk_prob: true,
            shared_expert_intermediate: 0,
            dense_layers: vec![],
            sparse_step: 1,
        };
        let msg = MoeFfn::load(&ReferenceBackend, &src, hidden, &config, "m").err().expect("refused").to_string();
        assert!(
            msg.contains("tensor m.experts.0.gate_proj.weight: shape [8, 1024], expected [1048576, 1024]"),
            "{msg}"
        );
    }
}
