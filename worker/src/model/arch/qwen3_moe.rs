//! Qwen3-MoE (Qwen3-30B-A3B and its family): Qwen3 attention (per-head q/k RMSNorm, explicit
//! head_dim) with sparse MoE feed-forward layers: softmax top-k routing, optionally renormalised
//! (`norm_topk_prob`), no shared expert.

use serde_json::Value;

use super::ArchSpec;
use crate::model::config::{Arch, ModelConfig};
use crate::prompt::PromptTemplate;
use crate::Result;

pub const SPEC: ArchSpec = ArchSpec {
    name: "qwen3_moe",
    aliases: &["qwen3moe"],
    from_hf: config_from_hf,
    from_gguf: None,
    // Trained with the empty think block of the Qwen3-Reranker template.
    default_template: PromptTemplate::default,
};

pub fn config_from_hf(v: &Value) -> Result<ModelConfig> {
    let mut c = super::qwen3::attention_from_hf(v, Arch::of(&SPEC))?;
    c.moe = Some(super::moe_config_from_hf(v, false)?);
    Ok(c)
}
