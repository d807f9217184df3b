//! Qwen3-MoE (Qwen3-30B-A3B and its family): Qwen3 attention (per-head q/k RMSNorm, explicit
//! head_dim) with sparse MoE feed-forward layers: softmax top-k routing, optionally renormalised
//! (`norm_topk_prob`), no shared expert. From a GGUF (`qwen3moe`) as llama.cpp runs it: every
//! layer sparse, the top-k weights always renormalised.

use serde_json::Value;

use super::ArchSpec;
use crate::model::config::{base_from_gguf, Arch, ModelConfig};
use crate::model::GgufFile;
use crate::prompt::PromptTemplate;
use crate::Result;

pub const SPEC: ArchSpec = ArchSpec {
    name: "qwen3_moe",
    aliases: &["qwen3moe"],
    from_hf: config_from_hf,
    from_gguf: Some(config_from_gguf),
    // Trained with the empty think block of the Qwen3-Reranker template.
    default_template: PromptTemplate::default,
};

pub fn config_from_hf(v: &Value) -> Result<ModelConfig> {
    let mut c = super::qwen3::attention_from_hf(v, Arch::of(&SPEC))?;
    c.moe = Some(super::moe_config_from_hf(v, false)?);
    Ok(c)
}

pub fn config_from_gguf(g: &GgufFile) -> Result<ModelConfig> {
    let mut c = super::qwen3::attention_from_gguf(base_from_gguf(g, Arch::of(&SPEC))?, g);
    // llama.cpp's qwen3moe graph renormalises the top-k weights whatever the source config said.
    c.moe = Some(super::moe_config_from_gguf(g, true, false, c.intermediate)?);
    Ok(c)
}
