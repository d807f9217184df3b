//! Llama (SmolLM2, Llama 2/3 without rope scaling, Mistral without sliding window).

use serde_json::Value;

use crate::model::config::{base_from_hf, Arch, HfConfig, ModelConfig};
use crate::Result;

pub fn config_from_hf(v: &Value) -> Result<ModelConfig> {
    let mut c = base_from_hf(v, Arch::Llama)?;
    // Llama's `attention_bias` puts a bias on all four projections.
    let bias = HfConfig(v).opt_bool("attention_bias")?.unwrap_or(false);
    c.qkv_bias = bias;
    c.o_bias = bias;
    Ok(c)
}
