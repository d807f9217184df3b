//! Qwen2 / Qwen2.5 dense: q/k/v projections always carry a bias, the output projection never.

use serde_json::Value;

use super::ArchSpec;
use crate::model::config::{base_from_gguf, base_from_hf, Arch, ModelConfig};
use crate::model::GgufFile;
use crate::prompt::PromptTemplate;
use crate::Result;

pub const SPEC: ArchSpec = ArchSpec {
    name: "qwen2",
    aliases: &[],
    from_hf: config_from_hf,
    from_gguf: Some(config_from_gguf),
    default_template: PromptTemplate::chatml,
};

pub fn config_from_hf(v: &Value) -> Result<ModelConfig> {
    let mut c = base_from_hf(v, Arch::of(&SPEC))?;
    c.qkv_bias = true;
    Ok(c)
}

pub fn config_from_gguf(g: &GgufFile) -> Result<ModelConfig> {
    let mut c = base_from_gguf(g, Arch::of(&SPEC))?;
    c.qkv_bias = true;
    Ok(c)
}
