//! Model files, architectures and the forward pass.
//!
//! One file per architecture under `arch/` (config parsing and what is specific to it), one set of
//! shared layers (`layers.rs`), the score head (`head.rs`), and the varlen forward pass here.

pub mod arch;
mod byte_level_bpe;
pub mod config;
pub mod ggml_quants;
pub mod gguf;
pub mod head;
pub mod layers;
pub mod loader;
pub mod moe_layer;
pub mod safetensors;
pub mod source;
#[cfg(test)]
pub(crate) mod test_assets;
#[cfg(any(test, feature = "test-support"))]
pub mod testgen;
#[cfg(test)]
pub(crate) mod tests;
pub mod tokenizer;

use std::time::Instant;

use sieve_kernels::{AttnSeq, Backend, BatchLayout, MoeSelect};

pub use config::{Arch, ModelConfig, MoeConfig};
pub use gguf::GgufFile;
pub use head::{HeadKind, ScoreHead};
use layers::{load_norm, Attention, Mlp};
pub use moe_layer::{MoeFfn, MoePassStats, MoePolicy, MoeRun};
pub use safetensors::HfCheckpoint;
pub use source::{HostWeight, WeightSource};

use crate::{Result, WorkerError};

/// The feed-forward half of a decoder layer.
pub enum Ffn<B: Backend> {
    Dense(Mlp<B>),
    Moe(MoeFfn<B>),
}

impl<B: Backend> Ffn<B> {
    /// Whether the input is a GEMM operand ([`Backend::reshape_operand`]): read only by
    /// projections (the dense MLP), not by the MoE routing.
    fn input_is_operand(&self) -> bool {
        matches!(self, Ffn::Dense(_))
    }

    /// The layer's output for `x`, added to the residual stream now or by the next norm: the
    /// dense MLP writes it to `delta` for [`Backend::add_rms_norm`] and returns true (a pending
    /// add); a MoE layer adds it to `residual` itself (its unpermute reads the residual anyway)
    /// and returns false.
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        backend: &B,
        x: &B::Tensor,
        residual: &mut B::Tensor,
        delta: &mut B::Tensor,
        scratch: &mut layers::MlpScratch<B>,
        moe: &mut MoeRun<B>,
        select: MoeSelect,
    ) -> Result<bool> {
        match self {
            Ffn::Dense(mlp) => {
                mlp.forward(backend, x, delta, scratch)?;
                Ok(true)
            }
            Ffn::Moe(m) => {
                if moe.capture_inputs {
                    moe.captured.push(backend.to_host(x)?);
                }
                let t = Instant::now();
                backend.moe_ffn(x, &m.weights, m.routing, select, residual, &mut moe.log)?;
                moe.pass.moe_time += t.elapsed();
                Ok(false)
            }
        }
    }
}

pub struct DecoderLayer<B: Backend> {
    pub input_norm: B::Vector,
    pub attn: Attention<B>,
    pub post_attn_norm: B::Vector,
    pub ffn: Ffn<B>,
}

/// The intermediate tensors of a forward pass, kept between passes so that their storage is
/// reused instead of reallocated for every layer.
pub struct Scratch<B: Backend> {
    x: B::Tensor,
    /// The normed input of the next projection (a GEMM operand).
    xn: B::Tensor,
    /// The normed input of a MoE layer (f32: its routing reads it).
    xf: B::Tensor,
    qkv: B::Tensor,
    attn: B::Tensor,
    mlp: layers::MlpScratch<B>,
    last_attn: B::Tensor,
    last_x: B::Tensor,
    last_xn: B::Tensor,
    /// A projection's output waiting for the next norm to add it to the residual stream
    /// (`x`, or `last_x` in the last layer's scored rows).
    delta: B::Tensor,
    last_delta: B::Tensor,
    out: B::Tensor,
    /// The MoE log and what the last pass's MoE layers did.
    pub moe: MoeRun<B>,
}

impl<B: Backend> Scratch<B> {
    pub fn new(backend: &B) -> Result<Self> {
        let t = || backend.zeros(0, 0);
        Ok(Scratch {
            x: t()?,
            xn: t()?,
            xf: t()?,
            qkv: t()?,
            attn: t()?,
            mlp: layers::MlpScratch { gate_up: t()?, act: t()? },
            last_attn: t()?,
            last_x: t()?,
            last_xn: t()?,
            delta: t()?,
            last_delta: t()?,
            out: t()?,
            moe: MoeRun::new(backend)?,
        })
    }
}

/// What the score head reads: which tokens' ids mean yes/no, or a classifier.
#[derive(Debug, Clone, PartialEq)]
pub enum HeadSpec {
    YesNo { yes: u32, no: u32 },
    Classifier,
}

/// Called at the start of every layer of a forward pass; an error aborts the pass. Tests use it
/// to inject faults mid-forward (after some KV has been written).
pub type LayerHook<'a> = &'a (dyn Fn(usize) -> Result<()> + Sync);

pub struct Model<B: Backend> {
    pub config: ModelConfig,
    embed: B::Embedding,
    layers: Vec<DecoderLayer<B>>,
    final_norm: B::Vector,
    pub head: ScoreHead<B>,
    /// Untied LM head, kept only when full logits are wanted (tests, generation).
    lm_head: Option<B::Weight>,
    /// How MoE layers choose their grouped-GEMM variant (unused by dense models).
    moe_policy: MoePolicy,
}

impl<B: Backend> Model<B> {
    /// Loads every weight through `backend`. `keep_lm_head` keeps an untied LM head for
    /// [`Model::logits`]; serving needs only the folded score head.
    pub fn load(
        backend: &B,
        src: &dyn WeightSource,
        config: ModelConfig,
        head: HeadSpec,
        keep_lm_head: bool,
    ) -> Result<Self> {
        config.validate()?;
        let h = config.hidden;
        let embed_w = layers::load(src, "model.embed_tokens.weight", &[config.vocab, h])?;
        let embed = backend.embedding(&embed_w.data, config.vocab, h)?;
        drop(embed_w);
        let mut decoder = Vec::with_capacity(config.n_layers);
        for i in 0..config.n_layers {
            let p = format!("model.layers.{i}");
            let ffn = match &config.moe {
                Some(m) if m.is_sparse_layer(i) => Ffn::Moe(MoeFfn::load(backend, src, h, m, &format!("{p}.mlp"))?),
                _ => Ffn::Dense(Mlp::load(backend, src, h, config.intermediate, &format!("{p}.mlp"))?),
            };
            decoder.push(DecoderLayer {
                input_norm: load_norm(backend, src, &format!("{p}.input_layernorm.weight"), h)?,
                attn: Attention::load(backend, src, &config, &format!("{p}.self_attn"))?,
                post_attn_norm: load_norm(backend, src, &format!("{p}.post_attention_layernorm.weight"), h)?,
                ffn,
            });
        }
        let final_norm = load_norm(backend, src, "model.norm.weight", h)?;
        let tied = config.tie_embeddings || !src.has("lm_head.weight");
        let lm_name = if tied { "model.embed_tokens.weight" } else { "lm_head.weight" };
        let head = match head {
            HeadSpec::YesNo { yes, no } => ScoreHead::yes_no(backend, src, lm_name, yes, no, h)?,
            HeadSpec::Classifier => ScoreHead::classifier(backend, src, h)?,
        };
        let lm_head = if keep_lm_head && !tied {
            let w = layers::load(src, "lm_head.weight", &[config.vocab, h])?;
            Some(backend.linear_weight(&w.data, config.vocab, h)?)
        } else {
            None
        };
        let moe_policy = match &config.moe {
            Some(m) => MoePolicy::Auto(backend.moe_default_cost(h, m.expert_intermediate)),
            None => MoePolicy::Fixed(0),
        };
        Ok(Model { config, embed, layers: decoder, final_norm, head, lm_head, moe_policy })
    }

    /// The MoE layers, in order.
    pub fn moe_layers(&self) -> impl Iterator<Item = &MoeFfn<B>> {
        self.layers.iter().filter_map(|l| match &l.ffn {
            Ffn::Moe(m) => Some(m),
            Ffn::Dense(_) => None,
        })
    }

    pub fn moe_policy(&self) -> &MoePolicy {
        &self.moe_policy
    }

    /// Sets how the MoE layers choose their variant, checked against the backend's variants.
    pub fn set_moe_policy(&mut self, backend: &B, policy: MoePolicy) -> Result<()> {
        let variants = backend.moe_variants();
        match &policy {
            MoePolicy::Fixed(v) if *v >= variants.len() => {
                return Err(WorkerError::Config(format!("moe variant {v} of {}", variants.len())))
            }
            MoePolicy::Fixed(_) => {}
            MoePolicy::Auto(m) => m.validate(&variants)?,
        }
        self.moe_policy = policy;
        Ok(())
    }

    /// Runs the decoder over a varlen batch and returns the final-normed hidden states of
    /// `out_rows` (in that order, in `scratch.out`). K/V of every row is written to `cache` at its
    /// slot. Intermediate tensors live in `scratch` and are reused from pass to pass.
    ///
    /// When every out row is the last query row of its sequence (scoring), the last layer's
    /// attention, output projection and MLP run for those rows only.
    ///
    /// What the MoE layers did (variant, rows, time) is in `scratch.moe.pass` afterwards.
    pub fn forward<'s>(
        &self,
        backend: &B,
        layout: &BatchLayout,
        cache: &mut B::KvCache,
        out_rows: &[u32],
        hook: Option<LayerHook>,
        scratch: &'s mut Scratch<B>,
    ) -> Result<&'s B::Tensor> {
        scratch.moe.pass.moe_time = std::time::Duration::ZERO;
        scratch.moe.captured.clear();
        let result = self.forward_layers(backend, layout, cache, out_rows, hook, scratch);
        if self.config.moe.is_some() {
            // The one read-back of the MoE log per pass (drained after a failed pass too).
            scratch.moe.pass.layers = backend.read_moe_log(&mut scratch.moe.log)?;
        }
        result?;
        Ok(&scratch.out)
    }

    fn forward_layers(
        &self,
        backend: &B,
        layout: &BatchLayout,
        cache: &mut B::KvCache,
        out_rows: &[u32],
        hook: Option<LayerHook>,
        scratch: &mut Scratch<B>,
    ) -> Result<()> {
        let rows = layout.num_rows();
        let h = self.config.hidden;
        let batch = backend.prepare_batch(layout, cache)?;
        let last_only = last_rows_layout(layout, out_rows);
        let last_batch = match &last_only {
            Some(l) => Some(backend.prepare_batch(l, cache)?),
            None => None,
        };
        let ql = self.config.qkv_layout();
        let eps = self.config.rms_eps;
        let Scratch { x, xn, xf, qkv, attn, mlp, last_attn, last_x, last_xn, delta, last_delta, out, moe } = scratch;
        let select = self.moe_policy.select();
        backend.reshape_scratch(x, rows, h)?;
        backend.embed(&self.embed, &batch, x)?;
        backend.reshape_operand(xn, rows, h)?;
        backend.reshape_scratch(qkv, rows, ql.qkv_dim())?;
        // Read only by the O projection (and gathered for it): an operand.
        backend.reshape_operand(attn, rows, ql.q_dim())?;
        backend.reshape_scratch(delta, rows, h)?;
        // Whether `delta` holds a projection's output not yet added to `x`: the next norm adds it.
        let mut pending = false;
        let n_layers = self.layers.len();
        for (i, layer) in self.layers.iter().enumerate() {
            if let Some(hook) = hook {
                hook(i)?;
            }
            let a = &layer.attn;
            norm(backend, x, pending.then_some(&*delta), &layer.input_norm, eps, xn)?;
            let norms = (a.q_norm.as_ref(), a.k_norm.as_ref());
            let rope = self.config.rope;
            backend.matmul(xn, &a.qkv, a.qkv_bias.as_ref(), qkv)?;
            backend.qk_norm_rope_write_kv(qkv, ql, norms.0, norms.1, eps, rope, cache, i, &batch)?;
            if let (true, Some(lb)) = (i + 1 == n_layers, &last_batch) {
                // Only the scored rows matter after the last layer: attend, project and run
                // the MLP for them alone.
                backend.attention(qkv, ql, cache, i, lb, attn)?;
                let n = out_rows.len();
                backend.reshape_operand(last_attn, n, ql.q_dim())?;
                backend.gather_rows(attn, out_rows, last_attn)?;
                backend.reshape_scratch(last_x, n, h)?;
                backend.gather_rows(x, out_rows, last_x)?;
                backend.reshape_scratch(last_delta, n, h)?;
                backend.matmul(last_attn, &a.o, None, last_delta)?;
                backend.reshape_scratch(out, n, h)?;
                let ffn_in = if layer.ffn.input_is_operand() {
                    backend.reshape_operand(last_xn, n, h)?;
                    &mut *last_xn
                } else {
                    &mut *out
                };
                backend.add_rms_norm(last_x, last_delta, &layer.post_attn_norm, eps, ffn_in)?;
                let pending = layer.ffn.forward(backend, ffn_in, last_x, last_delta, mlp, moe, select)?;
                norm(backend, last_x, pending.then_some(&*last_delta), &self.final_norm, eps, out)?;
                return Ok(());
            }
            backend.attention(qkv, ql, cache, i, &batch, attn)?;
            backend.matmul(attn, &a.o, None, delta)?;
            let ffn_in = if layer.ffn.input_is_operand() {
                &mut *xn
            } else {
                backend.reshape_scratch(xf, rows, h)?;
                &mut *xf
            };
            backend.add_rms_norm(x, delta, &layer.post_attn_norm, eps, ffn_in)?;
            pending = layer.ffn.forward(backend, ffn_in, x, delta, mlp, moe, select)?;
        }
        // Every row's last add and the final norm, on the scored rows alone: row by row the same
        // ops as the last layer's scored-rows path above.
        let n = out_rows.len();
        backend.reshape_scratch(last_x, n, h)?;
        backend.gather_rows(x, out_rows, last_x)?;
        if pending {
            backend.reshape_scratch(last_delta, n, h)?;
            backend.gather_rows(delta, out_rows, last_delta)?;
        }
        backend.reshape_scratch(out, n, h)?;
        norm(backend, last_x, pending.then_some(&*last_delta), &self.final_norm, eps, out)?;
        Ok(())
    }

    /// Full-vocabulary logits of final-normed hidden rows (tests and generation only).
    pub fn logits(&self, backend: &B, hidden: &B::Tensor) -> Result<Vec<f32>> {
        let (rows, _) = backend.shape(hidden);
        let mut out = backend.zeros(rows, self.config.vocab)?;
        match &self.lm_head {
            Some(w) => backend.matmul(hidden, w, None, &mut out)?,
            None if self.config.tie_embeddings => backend.lm_logits(hidden, &self.embed, &mut out)?,
            None => return Err(WorkerError::Config("logits need the LM head: load with keep_lm_head".into())),
        }
        Ok(backend.to_host(&out)?)
    }
}

/// `out = rms_norm(x)`, adding a pending projection output to `x` first (fused in the norm).
fn norm<B: Backend>(
    backend: &B,
    x: &mut B::Tensor,
    pending: Option<&B::Tensor>,
    w: &B::Vector,
    eps: f32,
    out: &mut B::Tensor,
) -> Result<()> {
    match pending {
        Some(delta) => backend.add_rms_norm(x, delta, w, eps, out)?,
        None => backend.rms_norm(x, w, eps, out)?,
    }
    Ok(())
}

/// The layout of the last layer when only each sequence's final row is wanted: every sequence
/// keeps its context but queries only its last position (sequences without an out row query
/// nothing). `None` when some out row is not the last row of its sequence.
fn last_rows_layout(layout: &BatchLayout, out_rows: &[u32]) -> Option<BatchLayout> {
    let by_last_row: std::collections::HashMap<u32, &AttnSeq> =
        layout.seqs.iter().filter(|s| s.q_len > 0).map(|s| (s.q_row + s.q_len - 1, s)).collect();
    let mut seqs = Vec::with_capacity(out_rows.len());
    for r in out_rows {
        let s = by_last_row.get(r)?;
        seqs.push(AttnSeq { q_row: *r, q_len: 1, ..**s });
    }
    Some(BatchLayout { seqs, ..layout.clone() })
}
