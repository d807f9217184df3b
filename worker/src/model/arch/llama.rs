//! Llama (SmolLM2, Llama 2 and 3, Llama 3.1+ with its `llama3` RoPE scaling) and Mistral (its
//! sliding window caps the prompt length: `ModelConfig::attention_window`).

use serde_json::Value;
use sieve_kernels::RopeLayout;

use super::ArchSpec;
use crate::model::config::{base_from_gguf, base_from_hf, Arch, HfConfig, ModelConfig};
use crate::model::{GgufFile, WeightSource};
use crate::prompt::PromptTemplate;
use crate::Result;

pub const SPEC: ArchSpec = ArchSpec {
    name: "llama",
    aliases: &["mistral"],
    from_hf: config_from_hf,
    from_gguf: Some(config_from_gguf),
    default_template: PromptTemplate::chatml,
};

pub fn config_from_hf(v: &Value) -> Result<ModelConfig> {
    let mut c = base_from_hf(v, Arch::of(&SPEC))?;
    // Llama's `attention_bias` puts a bias on all four projections.
    let bias = HfConfig(v).opt_bool("attention_bias")?.unwrap_or(false);
    c.qkv_bias = bias;
    c.o_bias = bias;
    Ok(c)
}

pub fn config_from_gguf(g: &GgufFile) -> Result<ModelConfig> {
    let mut c = base_from_gguf(g, Arch::of(&SPEC))?;
    // llama.cpp permutes llama's Q/K rows at conversion so that RoPE rotates adjacent pairs.
    c.rope.layout = RopeLayout::Interleaved;
    c.qkv_bias = g.has("model.layers.0.self_attn.q_proj.bias");
    c.o_bias = g.has("model.layers.0.self_attn.o_proj.bias");
    Ok(c)
}
