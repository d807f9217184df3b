//! One file per architecture: how its config is read and what sets it apart.

pub mod llama;
pub mod qwen2;
pub mod qwen3;

use serde_json::Value;

use crate::model::config::{Arch, ModelConfig};
use crate::{Result, WorkerError};

/// Reads an HF `config.json` with the parser of its `model_type`.
pub fn config_from_hf(v: &Value) -> Result<ModelConfig> {
    let model_type = v
        .get("model_type")
        .and_then(Value::as_str)
        .ok_or_else(|| WorkerError::ModelFile("config.json: missing 'model_type'".into()))?;
    match Arch::parse(model_type)? {
        Arch::Llama => llama::config_from_hf(v),
        Arch::Qwen2 => qwen2::config_from_hf(v),
        Arch::Qwen3 => qwen3::config_from_hf(v),
        a @ (Arch::Qwen3Moe | Arch::Qwen2Moe) => Err(WorkerError::Unsupported(format!("{} is not supported yet", a.name()))),
    }
}

/// Reads a GGUF file's metadata with the parser of its `general.architecture`.
pub fn config_from_gguf(g: &crate::model::GgufFile) -> Result<ModelConfig> {
    match Arch::parse(g.architecture()?)? {
        Arch::Llama => llama::config_from_gguf(g),
        Arch::Qwen2 => qwen2::config_from_gguf(g),
        Arch::Qwen3 => qwen3::config_from_gguf(g),
        a => Err(WorkerError::Unsupported(format!("{} from GGUF", a.name()))),
    }
}
