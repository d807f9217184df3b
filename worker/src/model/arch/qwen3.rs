//! Qwen3 dense (and Qwen3-Reranker): per-head RMSNorm of q and k before RoPE, explicit head_dim,
//! optional bias on all four attention projections (`attention_bias`).

use serde_json::Value;

use crate::model::config::{base_from_hf, Arch, HfConfig, ModelConfig};
use crate::Result;

pub fn config_from_hf(v: &Value) -> Result<ModelConfig> {
    let mut c = base_from_hf(v, Arch::Qwen3)?;
    let bias = HfConfig(v).opt_bool("attention_bias")?.unwrap_or(false);
    c.qkv_bias = bias;
    c.o_bias = bias;
    c.qk_norm = true;
    Ok(c)
}
