//! Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2 attention (q/k/v biases, `qkv_bias`) with
//! sparse MoE feed-forward layers: softmax top-k routing (by default not renormalised) plus an
//! always-on shared expert scaled by a sigmoid gate. From a GGUF (`qwen2moe`) as llama.cpp runs
//! it: every layer sparse, the top-k weights not renormalised.

use serde_json::Value;

use super::ArchSpec;
use crate::model::config::{base_from_gguf, base_from_hf, Arch, HfConfig, ModelConfig};
use crate::model::GgufFile;
use crate::prompt::PromptTemplate;
use crate::{Result, WorkerError};

pub const SPEC: ArchSpec = ArchSpec {
    name: "qwen2_moe",
    aliases: &["qwen2moe"],
    from_hf: config_from_hf,
    from_gguf: Some(config_from_gguf),
    default_template: PromptTemplate::chatml,
};

pub fn config_from_hf(v: &Value) -> Result<ModelConfig> {
    let mut c = base_from_hf(v, Arch::of(&SPEC))?;
    c.qkv_bias = HfConfig(v).opt_bool("qkv_bias")?.unwrap_or(true);
    let moe = super::moe_config_from_hf(v, true)?;
    if moe.shared_expert_intermediate == 0 {
        return Err(WorkerError::ModelFile("config.json: qwen2_moe needs shared_expert_intermediate_size > 0".into()));
    }
    c.moe = Some(moe);
    Ok(c)
}

pub fn config_from_gguf(g: &GgufFile) -> Result<ModelConfig> {
    let mut c = base_from_gguf(g, Arch::of(&SPEC))?;
    c.qkv_bias = true;
    let moe = super::moe_config_from_gguf(g, false, true, c.intermediate)?;
    if moe.shared_expert_intermediate == 0 {
        return Err(WorkerError::ModelFile(format!(
            "{}: qwen2moe needs a shared expert width > 0",
            g.path().display()
        )));
    }
    c.moe = Some(moe);
    Ok(c)
}
