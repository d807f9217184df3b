//! Qwen3-MoE (Qwen3-30B-A3B and its family): Qwen3 attention (per-head q/k RMSNorm, explicit
//! head_dim) with sparse MoE feed-forward layers: softmax top-k routing, optionally renormalised
//! (`norm_topk_prob`), no shared expert.

use serde_json::Value;

use crate::model::config::{base_from_hf, Arch, HfConfig, ModelConfig};
use crate::Result;

pub fn config_from_hf(v: &Value) -> Result<ModelConfig> {
    let mut c = base_from_hf(v, Arch::Qwen3Moe)?;
    let bias = HfConfig(v).opt_bool("attention_bias")?.unwrap_or(false);
    c.qkv_bias = bias;
    c.o_bias = bias;
    c.qk_norm = true;
    c.moe = Some(super::moe_config_from_hf(v, false)?);
    Ok(c)
}
