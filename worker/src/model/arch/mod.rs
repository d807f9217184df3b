//! One file per architecture: how its config is read and what sets it apart. A new one is a
//! file here defining its `SPEC` plus one entry in [`REGISTRY`]; the weights load by HF tensor
//! names (`model/layers.rs`), so nothing else changes unless its graph does.

pub mod llama;
pub mod qwen2;
pub mod qwen2_moe;
pub mod qwen3;
pub mod qwen3_moe;

use serde_json::Value;

use crate::model::config::{Arch, HfConfig, KeyStyle, ModelConfig, MoeConfig};
use crate::model::GgufFile;
use crate::prompt::PromptTemplate;
use crate::{Result, WorkerError};

/// What the loader needs to know of an architecture. Each file here defines one as `SPEC`.
pub struct ArchSpec {
    /// The HF `model_type` (and the name in errors, logs and `/stats`).
    pub name: &'static str,
    /// Other names it is known by: HF `model_type`s read the same way, GGUF
    /// `general.architecture` spellings.
    pub aliases: &'static [&'static str],
    /// Reads an HF `config.json`.
    pub from_hf: fn(&Value) -> Result<ModelConfig>,
    /// Reads a GGUF file's metadata; `None`: not loadable from GGUF.
    pub from_gguf: Option<fn(&GgufFile) -> Result<ModelConfig>>,
    /// The prompt template when the config sets none.
    pub default_template: fn() -> PromptTemplate,
}

/// Every supported architecture, one line each; the order is the one errors list them in.
pub const REGISTRY: &[ArchSpec] = &[llama::SPEC, qwen2::SPEC, qwen3::SPEC, qwen3_moe::SPEC, qwen2_moe::SPEC];

/// Reads an HF `config.json` with the parser of its `model_type`.
pub fn config_from_hf(v: &Value) -> Result<ModelConfig> {
    let arch = Arch::parse(HfConfig(v).model_type()?)?;
    let c = (arch.spec().from_hf)(v)?;
    // Checked here, at load, with errors naming the config.json key.
    c.validate_as("config.json", KeyStyle::Hf)?;
    Ok(c)
}

/// Reads a GGUF file's metadata with the parser of its `general.architecture`.
pub fn config_from_gguf(g: &GgufFile) -> Result<ModelConfig> {
    let name = g.architecture()?;
    let arch = Arch::parse(name)?;
    let from_gguf =
        arch.spec().from_gguf.ok_or_else(|| WorkerError::Unsupported(format!("{} from GGUF", arch.name())))?;
    let c = from_gguf(g)?;
    // Checked here, at load, with errors naming the file and the metadata key.
    c.validate_as(&g.path().display().to_string(), KeyStyle::Gguf(name))?;
    Ok(c)
}

/// The MoE keys qwen3_moe and qwen2_moe share (HF names): `num_experts`, `num_experts_per_tok`,
/// `moe_intermediate_size`, `norm_topk_prob` (default false, as in transformers),
/// `decoder_sparse_step` (default 1), `mlp_only_layers` (default none), and with
/// `shared_expert` the `shared_expert_intermediate_size`.
pub(crate) fn moe_config_from_hf(v: &Value, shared_expert: bool) -> Result<MoeConfig> {
    let c = HfConfig(v);
    let dense_layers = match v.get("mlp_only_layers") {
        None | Some(Value::Null) => vec![],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_u64()
                    .map(|l| l as usize)
                    .ok_or_else(|| WorkerError::ModelFile("config.json: 'mlp_only_layers' holds a non-integer".into()))
            })
            .collect::<Result<_>>()?,
        Some(_) => return Err(WorkerError::ModelFile("config.json: 'mlp_only_layers' is not a list".into())),
    };
    let sparse_step = c.opt_usize("decoder_sparse_step")?.unwrap_or(1);
    if sparse_step == 0 {
        return Err(WorkerError::ModelFile("config.json: 'decoder_sparse_step' is 0".into()));
    }
    Ok(MoeConfig {
        num_experts: c.usize("num_experts")?,
        top_k: c.usize("num_experts_per_tok")?,
        expert_intermediate: c.usize("moe_intermediate_size")?,
        norm_topk_prob: c.opt_bool("norm_topk_prob")?.unwrap_or(false),
        shared_expert_intermediate: if shared_expert { c.usize("shared_expert_intermediate_size")? } else { 0 },
        dense_layers,
        sparse_step,
    })
}

/// The MoE keys of a GGUF (`<arch>.expert_count`, `expert_used_count`,
/// `expert_feed_forward_length`, by default llama.cpp's `feed_forward_length / expert_used_count`;
/// with `shared_expert`, `expert_shared_feed_forward_length`, by default `feed_forward_length`),
/// every layer sparse, as llama.cpp's qwen3moe and qwen2moe graphs run them; keys that would
/// change their routing (a weight scale, a gating function other than softmax, leading dense
/// layers) are refused unless neutral.
pub(crate) fn moe_config_from_gguf(
    g: &GgufFile,
    norm_topk_prob: bool,
    shared_expert: bool,
    dense_width: usize,
) -> Result<MoeConfig> {
    let key = |s: &str| g.arch_key(s);
    let num_experts = g.require_u32(&key("expert_count")?)? as usize;
    let top_k = g.require_u32(&key("expert_used_count")?)? as usize;
    let expert_intermediate = match g.get_u32(&key("expert_feed_forward_length")?)? {
        Some(n) => n as usize,
        None => dense_width / top_k.max(1),
    };
    let refused = |k: String, v: String| {
        Err(WorkerError::Unsupported(format!(
            "{}: {k} = {v} (the MoE routing llama.cpp's Qwen MoE graphs run)",
            g.path().display()
        )))
    };
    let scale = key("expert_weights_scale")?;
    if let Some(s) = g.get_f32(&scale)?.filter(|&s| s != 0.0 && s != 1.0) {
        return refused(scale, s.to_string());
    }
    // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX.
    let gating = key("expert_gating_func")?;
    if let Some(f) = g.get_u32(&gating)?.filter(|&f| f != 1) {
        return refused(gating, f.to_string());
    }
    let dense = key("leading_dense_block_count")?;
    if let Some(n) = g.get_u32(&dense)?.filter(|&n| n != 0) {
        return refused(dense, n.to_string());
    }
    let shared_expert_intermediate = match shared_expert {
        false => 0,
        true => g.get_u32(&key("expert_shared_feed_forward_length")?)?.map_or(dense_width, |n| n as usize),
    };
    Ok(MoeConfig {
        num_experts,
        top_k,
        expert_intermediate,
        norm_topk_prob,
        shared_expert_intermediate,
        dense_layers: vec![],
        sparse_step: 1,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn qwen3_moe() -> Value {
        json!({
            "model_type": "qwen3_moe", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "num_hidden_layers": 4, "vocab_size": 100, "intermediate_size": 96,
            "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": true,
            "decoder_sparse_step": 2, "mlp_only_layers": [3]
        })
    }

    #[test]
    fn moe_configs_read_the_hf_keys() {
        let c = config_from_hf(&qwen3_moe()).unwrap();
        let m = c.moe.as_ref().unwrap();
        assert_eq!(
            (m.num_experts, m.top_k, m.expert_intermediate, m.norm_topk_prob, m.shared_expert_intermediate),
            (8, 2, 32, true, 0)
        );
        assert!(c.qk_norm && !c.qkv_bias);
        // decoder_sparse_step 2: layers 1 and 3 are sparse, but 3 is in mlp_only_layers.
        assert_eq!((0..4).filter(|&l| m.is_sparse_layer(l)).collect::<Vec<_>>(), vec![1]);

        let mut v = qwen3_moe();
        v["model_type"] = json!("qwen2_moe");
        v["shared_expert_intermediate_size"] = json!(48);
        v.as_object_mut().unwrap().remove("norm_topk_prob");
        let c = config_from_hf(&v).unwrap();
        let m = c.moe.as_ref().unwrap();
        assert_eq!((m.shared_expert_intermediate, m.norm_topk_prob), (48, false));
        assert!(c.qkv_bias && !c.qk_norm);
    }

    #[test]
    fn bad_moe_configs_are_clear_errors() {
        let cases: [(&str, Value, &str); 5] = [
            ("num_experts", json!(null), "num_experts"),
            ("mlp_only_layers", json!("3"), "mlp_only_layers"),
            ("decoder_sparse_step", json!(0), "decoder_sparse_step"),
            ("use_sliding_window", json!(true), "missing 'sliding_window'"),
            ("num_experts_per_tok", json!(-1), "num_experts_per_tok"),
        ];
        for (key, value, msg) in cases {
            let mut v = qwen3_moe();
            v[key] = value;
            let err = config_from_hf(&v).unwrap_err().to_string();
            assert!(err.contains(msg), "{key}: {err}");
        }
        let mut v = qwen3_moe();
        v["model_type"] = json!("qwen2_moe");
        assert!(config_from_hf(&v).unwrap_err().to_string().contains("shared_expert_intermediate_size"));
        let mut v = qwen3_moe();
        v["num_experts_per_tok"] = json!(9);
        let err = config_from_hf(&v).unwrap_err().to_string();
        assert!(err.contains("num_experts_per_tok = 9") && err.contains("num_experts = 8"), "{err}");
    }

    #[test]
    fn every_test_model_preset_passes_validation() {
        use crate::model::testgen::{Preset, StoreDType, TestArch, TestModelSpec};
        for arch in [TestArch::Qwen3, TestArch::Qwen2, TestArch::Llama, TestArch::Qwen3Moe, TestArch::Qwen2Moe] {
            for preset in [Preset::Tiny, Preset::Bench] {
                let spec = TestModelSpec::preset(arch, preset, 1, StoreDType::F32);
                let c = config_from_hf(&spec.config_json(1000));
                assert!(c.is_ok(), "{arch:?} {preset:?}: {}", c.unwrap_err());
            }
        }
    }
}
