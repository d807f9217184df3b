//! Qwen2 / Qwen2.5 dense: q/k/v projections always carry a bias, the output projection never.

use serde_json::Value;

use crate::model::config::{base_from_gguf, base_from_hf, Arch, ModelConfig};
use crate::model::GgufFile;
use crate::Result;

pub fn config_from_hf(v: &Value) -> Result<ModelConfig> {
    let mut c = base_from_hf(v, Arch::Qwen2)?;
    c.qkv_bias = true;
    Ok(c)
}

pub fn config_from_gguf(g: &GgufFile) -> Result<ModelConfig> {
    let mut c = base_from_gguf(g, Arch::Qwen2)?;
    c.qkv_bias = true;
    Ok(c)
}
