//! Qwen3 dense (and Qwen3-Reranker): per-head RMSNorm of q and k before RoPE, explicit head_dim,
//! optional bias on all four attention projections (`attention_bias`).

use serde_json::Value;

use super::ArchSpec;
use crate::model::config::{base_from_gguf, base_from_hf, Arch, HfConfig, ModelConfig};
use crate::model::{GgufFile, WeightSource};
use crate::prompt::PromptTemplate;
use crate::Result;

pub const SPEC: ArchSpec = ArchSpec {
    name: "qwen3",
    aliases: &[],
    from_hf: config_from_hf,
    from_gguf: Some(config_from_gguf),
    // Trained with the empty think block of the Qwen3-Reranker template.
    default_template: PromptTemplate::default,
};

pub fn config_from_hf(v: &Value) -> Result<ModelConfig> {
    attention_from_hf(v, Arch::of(&SPEC))
}

/// The config of a model with Qwen3 attention (qwen3, qwen3_moe): the shared fields, per-head
/// q/k RMSNorm, and `attention_bias` on all four projections.
pub(super) fn attention_from_hf(v: &Value, arch: Arch) -> Result<ModelConfig> {
    let mut c = base_from_hf(v, arch)?;
    let bias = HfConfig(v).opt_bool("attention_bias")?.unwrap_or(false);
    c.qkv_bias = bias;
    c.o_bias = bias;
    c.qk_norm = true;
    Ok(c)
}

pub fn config_from_gguf(g: &GgufFile) -> Result<ModelConfig> {
    Ok(attention_from_gguf(base_from_gguf(g, Arch::of(&SPEC))?, g))
}

/// [`attention_from_hf`] from a GGUF: the biases are there when their tensors are.
pub(super) fn attention_from_gguf(mut c: ModelConfig, g: &GgufFile) -> ModelConfig {
    c.qk_norm = true;
    c.qkv_bias = g.has("model.layers.0.self_attn.q_proj.bias");
    c.o_bias = g.has("model.layers.0.self_attn.o_proj.bias");
    c
}
