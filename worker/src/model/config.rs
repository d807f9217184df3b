//! Architecture-independent hyperparameters of a decoder, parsed from an HF `config.json` or a
//! GGUF file's metadata by the architecture's own file.

use serde_json::Value;
use sieve_kernels::{QkvLayout, RopeConfig, RopeLayout};

use crate::{Result, WorkerError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Qwen3Moe,
    Qwen2Moe,
}

impl Arch {
    /// From an HF `model_type` or a GGUF `general.architecture`.
    pub fn parse(name: &str) -> Result<Arch> {
        Ok(match name {
            "llama" | "mistral" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "qwen3_moe" | "qwen3moe" => Arch::Qwen3Moe,
            "qwen2_moe" | "qwen2moe" => Arch::Qwen2Moe,
            other => {
                return Err(WorkerError::Unsupported(format!(
                    "architecture '{other}' (supported: llama, qwen2, qwen3, qwen3_moe, qwen2_moe)"
                )))
            }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3_moe",
            Arch::Qwen2Moe => "qwen2_moe",
        }
    }
}

/// Mixture-of-experts hyperparameters (qwen3_moe, qwen2_moe).
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub top_k: usize,
    pub expert_intermediate: usize,
    /// Renormalise the top-k routing weights to sum to 1.
    pub norm_topk_prob: bool,
    /// qwen2_moe: an always-on shared expert of this width with a sigmoid gate (0 = none).
    pub shared_expert_intermediate: usize,
    /// Layers that use a dense MLP instead of experts.
    pub dense_layers: Vec<usize>,
    /// Every `sparse_step`-th layer is sparse (HF `decoder_sparse_step`).
    pub sparse_step: usize,
}

impl MoeConfig {
    pub fn is_sparse_layer(&self, layer: usize) -> bool {
        !self.dense_layers.contains(&layer) && self.sparse_step > 0 && (layer + 1) % self.sparse_step == 0
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub hidden: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Dense MLP width (for MoE models: the width of dense layers, if any).
    pub intermediate: usize,
    pub vocab: usize,
    pub rms_eps: f32,
    pub rope: RopeConfig,
    /// Longest sequence the model was trained for.
    pub max_position: usize,
    pub tie_embeddings: bool,
    /// Bias on the q/k/v projections (qwen2 always; others when `attention_bias`).
    pub qkv_bias: bool,
    /// Bias on the output projection (llama `attention_bias`).
    pub o_bias: bool,
    /// Per-head RMSNorm of q and k before RoPE (qwen3).
    pub qk_norm: bool,
    pub moe: Option<MoeConfig>,
}

impl ModelConfig {
    pub fn qkv_layout(&self) -> QkvLayout {
        QkvLayout { n_heads: self.n_heads, n_kv_heads: self.n_kv_heads, head_dim: self.head_dim }
    }

    /// Consistency checks every architecture shares.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(WorkerError::Unsupported(m));
        if self.hidden == 0 || self.n_layers == 0 || self.n_heads == 0 || self.head_dim == 0 || self.vocab == 0 {
            return bad(format!("degenerate config: {self:?}"));
        }
        if self.n_kv_heads == 0 || self.n_heads % self.n_kv_heads != 0 {
            return bad(format!("{} attention heads not a multiple of {} kv heads", self.n_heads, self.n_kv_heads));
        }
        if self.rope.rotary_dim > self.head_dim || self.rope.rotary_dim % 2 != 0 {
            return bad(format!("rotary dim {} vs head_dim {}", self.rope.rotary_dim, self.head_dim));
        }
        if let Some(m) = &self.moe {
            if m.top_k == 0 || m.top_k > m.num_experts {
                return bad(format!("MoE top-k {} of {} experts", m.top_k, m.num_experts));
            }
        }
        Ok(())
    }
}

/// Typed reads of an HF `config.json`, with errors that name the key.
pub struct HfConfig<'a>(pub &'a Value);

impl HfConfig<'_> {
    pub fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?.ok_or_else(|| WorkerError::ModelFile(format!("config.json: missing '{key}'")))
    }

    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .map(|x| Some(x as usize))
                .ok_or_else(|| WorkerError::ModelFile(format!("config.json: '{key}' is not a non-negative integer"))),
        }
    }

    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| WorkerError::ModelFile(format!("config.json: '{key}' is not a number"))),
        }
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| WorkerError::ModelFile(format!("config.json: '{key}' is not a boolean"))),
        }
    }

    pub fn str(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(Value::as_str)
    }

    /// RoPE base: `rope_theta`, or transformers v5's `rope_parameters.rope_theta`. Only the
    /// plain (unscaled) rotary embedding is supported; a scaled one is refused, not ignored.
    pub fn rope_theta(&self, default: f64) -> Result<f64> {
        for key in ["rope_scaling", "rope_parameters"] {
            if let Some(p) = self.0.get(key).filter(|v| !v.is_null()) {
                let kind = p.get("rope_type").or_else(|| p.get("type")).and_then(Value::as_str).unwrap_or("default");
                if kind != "default" {
                    return Err(WorkerError::Unsupported(format!("{key}.rope_type '{kind}' (only unscaled RoPE is supported)")));
                }
                if let Some(t) = p.get("rope_theta").and_then(Value::as_f64) {
                    return Ok(t);
                }
            }
        }
        Ok(self.opt_f64("rope_theta")?.unwrap_or(default))
    }
}

/// The fields every supported decoder shares, from an HF `config.json`. Architecture files
/// start from this and set what is specific to them (biases, q/k norm, MoE).
pub fn base_from_hf(v: &Value, arch: Arch) -> Result<ModelConfig> {
    let c = HfConfig(v);
    let hidden = c.usize("hidden_size")?;
    let n_heads = c.usize("num_attention_heads")?;
    let head_dim = c.opt_usize("head_dim")?.unwrap_or(hidden / n_heads.max(1));
    let partial = c.opt_f64("partial_rotary_factor")?.unwrap_or(1.0);
    let rotary_dim = ((head_dim as f64 * partial) as usize) & !1;
    if c.opt_bool("mlp_bias")?.unwrap_or(false) {
        return Err(WorkerError::Unsupported("mlp_bias = true".into()));
    }
    Ok(ModelConfig {
        arch,
        hidden,
        n_layers: c.usize("num_hidden_layers")?,
        n_heads,
        n_kv_heads: c.opt_usize("num_key_value_heads")?.unwrap_or(n_heads),
        head_dim,
        intermediate: c.opt_usize("intermediate_size")?.unwrap_or(0),
        vocab: c.usize("vocab_size")?,
        rms_eps: c.opt_f64("rms_norm_eps")?.unwrap_or(1e-6) as f32,
        rope: RopeConfig { theta: c.rope_theta(10_000.0)? as f32, rotary_dim, layout: RopeLayout::HalfSplit },
        max_position: c.opt_usize("max_position_embeddings")?.unwrap_or(4096),
        tie_embeddings: c.opt_bool("tie_word_embeddings")?.unwrap_or(false),
        qkv_bias: false,
        o_bias: false,
        qk_norm: false,
        moe: None,
    })
}

/// The shared fields from a GGUF file's metadata (`<arch>.*` keys, llama.cpp naming).
pub fn base_from_gguf(g: &super::GgufFile, arch: Arch) -> Result<ModelConfig> {
    let key = |s: &str| g.arch_key(s);
    let req = |s: &str| -> Result<usize> { Ok(g.require_u32(&key(s)?)? as usize) };
    let opt = |s: &str| -> Result<Option<usize>> { Ok(g.get_u32(&key(s)?)?.map(|v| v as usize)) };
    let hidden = req("embedding_length")?;
    let n_heads = req("attention.head_count")?;
    let head_dim = opt("attention.key_length")?.unwrap_or(hidden / n_heads.max(1));
    let vocab = match opt("vocab_size")? {
        Some(v) => v,
        None => g.get_str_array("tokenizer.ggml.tokens")?.map(|t| t.len()).unwrap_or(0),
    };
    Ok(ModelConfig {
        arch,
        hidden,
        n_layers: req("block_count")?,
        n_heads,
        n_kv_heads: opt("attention.head_count_kv")?.unwrap_or(n_heads),
        head_dim,
        intermediate: opt("feed_forward_length")?.unwrap_or(0),
        vocab,
        rms_eps: g.get_f32(&key("attention.layer_norm_rms_epsilon")?)?.unwrap_or(1e-6),
        rope: RopeConfig {
            theta: g.get_f32(&key("rope.freq_base")?)?.unwrap_or(10_000.0),
            rotary_dim: opt("rope.dimension_count")?.unwrap_or(head_dim),
            // llama.cpp runs qwen2/qwen3 with NeoX (half-split) rotary; llama's Q/K were
            // permuted at conversion for adjacent pairs. Architecture files set it.
            layout: RopeLayout::HalfSplit,
        },
        max_position: opt("context_length")?.unwrap_or(4096),
        tie_embeddings: !super::WeightSource::has(g, "lm_head.weight"),
        qkv_bias: false,
        o_bias: false,
        qk_norm: false,
        moe: None,
    })
}
