//! Qwen3 dense (and Qwen3-Reranker): per-head RMSNorm of q and k before RoPE, explicit head_dim,
//! optional bias on all four attention projections (`attention_bias`).

use serde_json::Value;

use crate::model::config::{base_from_gguf, base_from_hf, Arch, HfConfig, ModelConfig};
use crate::model::{GgufFile, WeightSource};
use crate::Result;

pub fn config_from_hf(v: &Value) -> Result<ModelConfig> {
    let mut c = base_from_hf(v, Arch::Qwen3)?;
    let bias = HfConfig(v).opt_bool("attention_bias")?.unwrap_or(false);
    c.qkv_bias = bias;
    c.o_bias = bias;
    c.qk_norm = true;
    Ok(c)
}

pub fn config_from_gguf(g: &GgufFile) -> Result<ModelConfig> {
    let mut c = base_from_gguf(g, Arch::Qwen3)?;
    c.qk_norm = true;
    c.qkv_bias = g.has("model.layers.0.self_attn.q_proj.bias");
    c.o_bias = g.has("model.layers.0.self_attn.o_proj.bias");
    Ok(c)
}
