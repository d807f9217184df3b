//! Architecture-independent hyperparameters of a decoder, parsed from an HF `config.json` or a
//! GGUF file's metadata by the architecture's own file.

use serde_json::Value;
use sieve_kernels::{QkvLayout, RopeConfig, RopeLayout, RopeScaling};

use super::arch::{self, ArchSpec};
use crate::{Result, WorkerError};

/// Most experts a MoE layer may have (the largest released models have 512 or fewer). Also
/// bounds how many per-expert names a GGUF expert tensor expands to.
pub const MAX_EXPERTS: usize = 1024;
/// Upper bounds on the sizes a config may claim, far above any released model's, so that no
/// product of them (a weight's element count, a layer's width) can overflow, and no allocation
/// sized by them (one entry per layer, per head) can be absurd before a weight is even read.
const MAX_WIDTH: usize = 1 << 20;
const MAX_HEADS: usize = 1 << 12;
const MAX_LAYERS: usize = 1 << 12;
const MAX_VOCAB: usize = 1 << 24;

/// How [`ModelConfig::validate_as`] names a value in its errors: by the config field, or by the
/// key it was read from in an HF `config.json` or a GGUF file (`<arch>.` keys).
#[derive(Debug, Clone, Copy)]
pub enum KeyStyle<'a> {
    Field,
    Hf,
    Gguf(&'a str),
}

impl KeyStyle<'_> {
    /// The name of `field` (a [`ModelConfig`] / [`MoeConfig`] field) in this style.
    fn name(self, field: &str) -> String {
        let (hf, gguf) = match field {
            "hidden" => ("hidden_size", "embedding_length"),
            "n_layers" => ("num_hidden_layers", "block_count"),
            "n_heads" => ("num_attention_heads", "attention.head_count"),
            "n_kv_heads" => ("num_key_value_heads", "attention.head_count_kv"),
            "head_dim" => ("head_dim", "attention.key_length"),
            "intermediate" => ("intermediate_size", "feed_forward_length"),
            "vocab" => ("vocab_size", "vocab_size (or the tokenizer.ggml.tokens count)"),
            "rms_eps" => ("rms_norm_eps", "attention.layer_norm_rms_epsilon"),
            "rope.theta" => ("rope_theta", "rope.freq_base"),
            "rope.scaling" => ("rope_scaling", "rope.scaling"),
            "rope.rotary_dim" => ("head_dim × partial_rotary_factor", "rope.dimension_count"),
            "max_position" => ("max_position_embeddings", "context_length"),
            "attention_window" => ("sliding_window", "attention.sliding_window"),
            "moe.num_experts" => ("num_experts", "expert_count"),
            "moe.top_k" => ("num_experts_per_tok", "expert_used_count"),
            "moe.expert_intermediate" => ("moe_intermediate_size", "expert_feed_forward_length"),
            "moe.sparse_step" => ("decoder_sparse_step", "decoder_sparse_step"),
            "moe.shared_expert_intermediate" => {
                ("shared_expert_intermediate_size", "expert_shared_feed_forward_length")
            }
            other => (other, other),
        };
        match self {
            KeyStyle::Field => field.to_string(),
            KeyStyle::Hf => hf.to_string(),
            KeyStyle::Gguf(arch) => format!("{arch}.{gguf}"),
        }
    }
}

/// A model architecture: an entry of the registry in `model/arch/mod.rs` (its name, how its
/// config is read, its default prompt template).
#[derive(Clone, Copy)]
pub struct Arch(&'static ArchSpec);

/// The built-in architectures by name, for code and tests that name one. A new architecture
/// needs none of these: its file and its registry line are enough.
#[allow(non_upper_case_globals)]
impl Arch {
    pub const Llama: Arch = Arch(&arch::llama::SPEC);
    pub const Qwen2: Arch = Arch(&arch::qwen2::SPEC);
    pub const Qwen3: Arch = Arch(&arch::qwen3::SPEC);
    pub const Qwen3Moe: Arch = Arch(&arch::qwen3_moe::SPEC);
    pub const Qwen2Moe: Arch = Arch(&arch::qwen2_moe::SPEC);
}

impl Arch {
    pub const fn of(spec: &'static ArchSpec) -> Arch {
        Arch(spec)
    }

    /// From an HF `model_type` or a GGUF `general.architecture`, looked up in the registry.
    pub fn parse(name: &str) -> Result<Arch> {
        arch::REGISTRY.iter().find(|s| s.name == name || s.aliases.contains(&name)).map(Arch).ok_or_else(|| {
            let names: Vec<&str> = arch::REGISTRY.iter().map(|s| s.name).collect();
            WorkerError::Unsupported(format!("architecture '{name}' (supported: {})", names.join(", ")))
        })
    }

    pub fn name(self) -> &'static str {
        self.0.name
    }

    pub fn spec(self) -> &'static ArchSpec {
        self.0
    }
}

impl PartialEq for Arch {
    fn eq(&self, other: &Arch) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for Arch {}

impl std::fmt::Debug for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.name)
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
        !self.dense_layers.contains(&layer) && self.sparse_step > 0 && (layer + 1).is_multiple_of(self.sparse_step)
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
    /// Sliding-window attention's window (a token sees the last this many, itself included), when
    /// the model uses one. The worker caps prompts to it, so that within a prompt every layer's
    /// attention is the full causal one: the model's own, computed exactly.
    pub attention_window: Option<usize>,
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

    /// The longest prompt this model computes as its own implementation does, and why: its
    /// sliding attention window, or for dynamic NTK RoPE its `max_position_embeddings`, past which
    /// transformers rescales the base by the longest sequence of the batch.
    pub fn prompt_limit(&self) -> Option<(usize, &'static str)> {
        let window = self.attention_window.map(|w| (w, "the model's sliding attention window"));
        let dynamic = matches!(self.rope.scaling, RopeScaling::Dynamic { .. })
            .then_some((self.max_position, "where the model's dynamic RoPE starts to rescale by batch"));
        window.into_iter().chain(dynamic).min_by_key(|&(tokens, _)| tokens)
    }

    /// Every value the forward pass trusts, checked (errors name the config field).
    pub fn validate(&self) -> Result<()> {
        self.validate_as("model config", KeyStyle::Field)
    }

    /// [`ModelConfig::validate`] with errors that start with `origin` (the file) and name each
    /// value by the key it was read from. Model files are untrusted input: a NaN epsilon, a
    /// negative RoPE base or a zero dimension would load and then serve NaN scores (or divide by
    /// zero), so they are refused here, at load.
    pub fn validate_as(&self, origin: &str, keys: KeyStyle<'_>) -> Result<()> {
        let bad = |field: &str, value: String, why: &str| {
            Err(WorkerError::ModelFile(format!("{origin}: {} = {value}: {why}", keys.name(field))))
        };
        let sizes = [
            ("hidden", self.hidden, MAX_WIDTH),
            ("n_layers", self.n_layers, MAX_LAYERS),
            ("n_heads", self.n_heads, MAX_HEADS),
            ("n_kv_heads", self.n_kv_heads, MAX_HEADS),
            ("head_dim", self.head_dim, MAX_WIDTH),
            ("vocab", self.vocab, MAX_VOCAB),
        ];
        for (field, v, max) in sizes {
            if v == 0 || v > max {
                return bad(field, v.to_string(), &format!("must be in 1..={max}"));
            }
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(
                "n_heads",
                self.n_heads.to_string(),
                &format!("not a multiple of {} = {}", keys.name("n_kv_heads"), self.n_kv_heads),
            );
        }
        if !(self.rms_eps.is_finite() && self.rms_eps > 0.0) {
            return bad("rms_eps", self.rms_eps.to_string(), "must be finite and > 0");
        }
        if !(self.rope.theta.is_finite() && self.rope.theta > 0.0) {
            return bad("rope.theta", self.rope.theta.to_string(), "must be finite and > 0");
        }
        let positive = |v: f32| v.is_finite() && v > 0.0;
        let scaling_ok = match self.rope.scaling {
            RopeScaling::None => true,
            RopeScaling::Linear { factor } | RopeScaling::Dynamic { factor } => positive(factor),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, .. } => {
                positive(factor)
                    && positive(low_freq_factor)
                    && positive(high_freq_factor)
                    && high_freq_factor > low_freq_factor
            }
            RopeScaling::Yarn { factor, beta_fast, beta_slow, attention_factor, original_max_position, .. } => {
                original_max_position > 0
                    && positive(factor)
                    && positive(beta_fast)
                    && positive(beta_slow)
                    && positive(attention_factor)
                    && beta_fast > beta_slow
            }
        };
        if !scaling_ok {
            return bad(
                "rope.scaling",
                format!("{:?}", self.rope.scaling),
                "factors must be finite and > 0, high_freq_factor > low_freq_factor and beta_fast > beta_slow",
            );
        }
        let rd = self.rope.rotary_dim;
        if rd == 0 || rd > self.head_dim || !rd.is_multiple_of(2) {
            return bad(
                "rope.rotary_dim",
                rd.to_string(),
                &format!("must be even, > 0 and <= {} = {}", keys.name("head_dim"), self.head_dim),
            );
        }
        // YaRN's bounds divide by ln(theta): a base of 1 would make its frequencies NaN.
        if !self.rope.inv_freq().iter().all(|f| f.is_finite()) {
            return bad(
                "rope.theta",
                self.rope.theta.to_string(),
                "gives non-finite RoPE frequencies with its scaling",
            );
        }
        if self.max_position == 0 {
            return bad("max_position", "0".into(), "must be > 0");
        }
        if self.attention_window == Some(0) {
            return bad("attention_window", "0".into(), "must be > 0");
        }
        // A dense MLP runs in every layer that is not sparse: it needs a width.
        let any_dense = match &self.moe {
            None => true,
            Some(m) => (0..self.n_layers).any(|l| !m.is_sparse_layer(l)),
        };
        if any_dense && (self.intermediate == 0 || self.intermediate > MAX_WIDTH) {
            return bad("intermediate", self.intermediate.to_string(), &format!("must be in 1..={MAX_WIDTH}"));
        }
        if let Some(m) = &self.moe {
            if m.num_experts == 0 || m.num_experts > MAX_EXPERTS {
                return bad("moe.num_experts", m.num_experts.to_string(), &format!("must be in 1..={MAX_EXPERTS}"));
            }
            if m.top_k == 0 || m.top_k > m.num_experts {
                return bad(
                    "moe.top_k",
                    m.top_k.to_string(),
                    &format!("must be in 1..={} = {}", keys.name("moe.num_experts"), m.num_experts),
                );
            }
            if m.expert_intermediate == 0 || m.expert_intermediate > MAX_WIDTH {
                return bad(
                    "moe.expert_intermediate",
                    m.expert_intermediate.to_string(),
                    &format!("must be in 1..={MAX_WIDTH}"),
                );
            }
            if m.shared_expert_intermediate > MAX_WIDTH {
                return bad(
                    "moe.shared_expert_intermediate",
                    m.shared_expert_intermediate.to_string(),
                    &format!("must be at most {MAX_WIDTH}"),
                );
            }
            if m.sparse_step == 0 {
                return bad("moe.sparse_step", "0".into(), "must be > 0");
            }
        }
        Ok(())
    }
}

/// Typed reads of an HF `config.json`, with errors that name the key: the one reader of that
/// file's values (the checkpoint, the architecture files and the loader all read through it).
pub struct HfConfig<'a>(pub &'a Value);

impl<'a> HfConfig<'a> {
    /// `model_type` (e.g. "qwen3", "qwen3_moe", "llama"): which architecture file reads the rest.
    pub fn model_type(&self) -> Result<&'a str> {
        self.0
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| WorkerError::ModelFile("config.json: missing 'model_type'".into()))
    }

    pub fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?.ok_or_else(|| WorkerError::ModelFile(format!("config.json: missing '{key}'")))
    }

    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        self.opt(key, "a non-negative integer", |v| v.as_u64().map(|x| x as usize))
    }

    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        self.opt(key, "a number", Value::as_f64)
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.opt(key, "a boolean", Value::as_bool)
    }

    /// `None` when absent or null; an error naming the key and what it should be when `read`
    /// finds another type.
    fn opt<T>(&self, key: &str, what: &str, read: impl Fn(&Value) -> Option<T>) -> Result<Option<T>> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => {
                read(v).map(Some).ok_or_else(|| WorkerError::ModelFile(format!("config.json: '{key}' is not {what}")))
            }
        }
    }

    pub fn str(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(Value::as_str)
    }

    /// The sliding window, as transformers reads it: `sliding_window` when `use_sliding_window`
    /// is true (Qwen2 and Qwen3, which then need it), or when the flag is absent and the
    /// `sliding_window` is set (Mistral; null there means none).
    /// transformers v5 lists each layer's attention in `layer_types`, which then decides.
    pub fn attention_window(&self) -> Result<Option<usize>> {
        if let Some(types) = self.0.get("layer_types").filter(|v| !v.is_null()) {
            let not_list = || WorkerError::ModelFile("config.json: 'layer_types' is not a list of strings".into());
            let mut sliding = false;
            for t in types.as_array().ok_or_else(not_list)? {
                match t.as_str().ok_or_else(not_list)? {
                    "full_attention" => {}
                    "sliding_attention" => sliding = true,
                    other => {
                        return Err(WorkerError::Unsupported(format!(
                            "layer_types holds '{other}' (full_attention and sliding_attention are supported)"
                        )))
                    }
                }
            }
            return if sliding { Ok(Some(self.usize("sliding_window")?)) } else { Ok(None) };
        }
        match self.opt_bool("use_sliding_window")? {
            Some(true) => Ok(Some(self.usize("sliding_window")?)),
            Some(false) => Ok(None),
            None => self.opt_usize("sliding_window"),
        }
    }

    /// RoPE base and scaling: `rope_theta` and `rope_scaling`, or transformers v5's
    /// `rope_parameters`, read as transformers 5 reads them (`modeling_rope_utils.py`). Unscaled,
    /// `linear`, `llama3`, `yarn` and `dynamic` are supported; any other kind is refused, not
    /// ignored, and so is a malformed one.
    pub fn rope(&self, default_theta: f64) -> Result<(f64, RopeScaling)> {
        let max_position = self.opt_usize("max_position_embeddings")?;
        let bad = |key: &str, what: &str| WorkerError::ModelFile(format!("config.json: '{key}' is not {what}"));
        let mut theta = self.opt_f64("rope_theta")?;
        let mut scaling = RopeScaling::None;
        for key in ["rope_scaling", "rope_parameters"] {
            let Some(p) = self.0.get(key).filter(|v| !v.is_null()) else { continue };
            // Anything but an object (or null) is a malformed file, not "no scaling": a RoPE
            // scaling ignored would serve wrong scores without a word.
            let p = p.as_object().ok_or_else(|| bad(key, "an object (or null)"))?;
            // transformers v5 nests the parameters by layer type where they differ between
            // types; every layer here shares one RoPE, so the types' must be alike.
            let nested: Vec<_> = p.iter().filter_map(|(k, v)| Some((k, v.as_object()?))).collect();
            if !nested.is_empty() && nested.len() != p.len() {
                return Err(WorkerError::ModelFile(format!(
                    "config.json: '{key}' mixes per-layer-type entries with flat RoPE parameters"
                )));
            }
            let (this_theta, this) = match nested.split_first() {
                None => rope_parameters(key, p, max_position)?,
                Some(((first_key, first), rest)) => {
                    let one = |k: &str, v| rope_parameters(&format!("{key}.{k}"), v, max_position);
                    let first_rope = one(first_key, first)?;
                    for (k, v) in rest {
                        if one(k, v)? != first_rope {
                            return Err(WorkerError::Unsupported(format!(
                                "{key}: '{k}' and '{first_key}' layers with different RoPE (every layer shares one here)"
                            )));
                        }
                    }
                    first_rope
                }
            };
            theta = this_theta.or(theta);
            if this == RopeScaling::None {
                continue;
            }
            // transformers v5 may keep both keys alike; two different scalings contradict.
            if scaling != RopeScaling::None && this != scaling {
                return Err(WorkerError::ModelFile(format!(
                    "config.json: '{key}' ({this:?}) differs from 'rope_scaling' ({scaling:?})"
                )));
            }
            scaling = this;
        }
        Ok((theta.unwrap_or(default_theta), scaling))
    }
}

/// YaRN's attention scale for `factor` (transformers' `get_mscale`; llama.cpp's the same):
/// `0.1 · m · ln(factor) + 1`, 1 for a factor up to 1. In f64, so that a config.json and a GGUF
/// of one model give the same bits.
fn yarn_mscale(factor: f64, m: f64) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * m * factor.ln() + 1.0
    }
}

/// One flat RoPE parameter object of a `config.json` (`rope_scaling`, `rope_parameters`, or one
/// layer type's entry of a nested `rope_parameters`, named `key` in errors): its base, if it
/// gives one, and its scaling, read as transformers 5's `modeling_rope_utils.py` reads them.
fn rope_parameters(
    key: &str,
    p: &serde_json::Map<String, Value>,
    max_position: Option<usize>,
) -> Result<(Option<f64>, RopeScaling)> {
    let bad = |key: String, what: &str| WorkerError::ModelFile(format!("config.json: '{key}' is not {what}"));
    let kind = match p.get("rope_type").or_else(|| p.get("type")) {
        None | Some(Value::Null) => "default",
        Some(v) => v.as_str().ok_or_else(|| bad(format!("{key}.rope_type"), "a string"))?,
    };
    let num = |name: &str, default: Option<f64>| -> Result<f64> {
        match p.get(name) {
            None | Some(Value::Null) => default.ok_or_else(|| {
                WorkerError::ModelFile(format!("config.json: '{key}.{name}' is missing (rope_type '{kind}')"))
            }),
            Some(v) => v.as_f64().ok_or_else(|| bad(format!("{key}.{name}"), "a number")),
        }
    };
    let theta = match p.get("rope_theta").filter(|v| !v.is_null()) {
        Some(t) => Some(t.as_f64().ok_or_else(|| bad(format!("{key}.rope_theta"), "a number"))?),
        None => None,
    };
    // The pretraining context: transformers' `standardize_rope_params` defaults it to
    // `max_position_embeddings`.
    let original_max_position = || -> Result<u32> {
        let name = "original_max_position_embeddings";
        let v = num(name, max_position.map(|m| m as f64)).map_err(|_| {
            WorkerError::ModelFile(format!(
                "config.json: '{key}.{name}' is missing, and so is 'max_position_embeddings' (rope_type '{kind}')"
            ))
        })?;
        if !(v >= 1.0 && v <= u32::MAX as f64 && v.fract() == 0.0) {
            return Err(bad(format!("{key}.{name}"), "a positive integer"));
        }
        Ok(v as u32)
    };
    let scaling = match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: num("factor", None)? as f32 },
        "llama3" => RopeScaling::Llama3 {
            factor: num("factor", None)? as f32,
            low_freq_factor: num("low_freq_factor", None)? as f32,
            high_freq_factor: num("high_freq_factor", None)? as f32,
            original_max_position: original_max_position()?,
        },
        "yarn" => {
            let factor = num("factor", None)?;
            // `_compute_yarn_parameters`: the attention factor given, else from `mscale`
            // over `mscale_all_dim` when both are set (non-zero), else from the factor.
            let mscale = |m| yarn_mscale(factor, m);
            let attention_factor = match (p.get("attention_factor"), num("mscale", Some(0.0))?) {
                (Some(v), _) if !v.is_null() => num("attention_factor", None)?,
                (_, m) => match num("mscale_all_dim", Some(0.0))? {
                    all if m != 0.0 && all != 0.0 => mscale(m) / mscale(all),
                    _ => mscale(1.0),
                },
            };
            // transformers reads the betas with `or`: 0 takes the default too.
            let beta =
                |name: &str, default: f64| num(name, Some(default)).map(|b| if b == 0.0 { default } else { b } as f32);
            let truncate = match p.get("truncate") {
                None => true,
                Some(v) => v.as_bool().ok_or_else(|| bad(format!("{key}.truncate"), "a boolean"))?,
            };
            RopeScaling::Yarn {
                factor: factor as f32,
                original_max_position: original_max_position()?,
                beta_fast: beta("beta_fast", 32.0)?,
                beta_slow: beta("beta_slow", 1.0)?,
                truncate,
                attention_factor: attention_factor as f32,
            }
        }
        "dynamic" => RopeScaling::Dynamic { factor: num("factor", None)? as f32 },
        other => {
            return Err(WorkerError::Unsupported(format!(
                "{key}.rope_type '{other}' (RoPE: unscaled, 'linear', 'llama3', 'yarn' and 'dynamic' are supported)"
            )))
        }
    };
    Ok((theta, scaling))
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
    let (theta, scaling) = c.rope(10_000.0)?;
    if c.opt_bool("mlp_bias")?.unwrap_or(false) {
        return Err(WorkerError::Unsupported("mlp_bias = true".into()));
    }
    // The MLP is SwiGLU: another activation would load and serve another model's scores.
    match c.0.get("hidden_act") {
        None | Some(Value::Null) => {}
        Some(v) => match v.as_str() {
            Some("silu" | "swish") => {}
            Some(other) => {
                return Err(WorkerError::Unsupported(format!("hidden_act '{other}' (the MLP is SwiGLU: silu only)")))
            }
            None => return Err(WorkerError::ModelFile("config.json: 'hidden_act' is not a string".into())),
        },
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
        rope: RopeConfig { theta: theta as f32, rotary_dim, layout: RopeLayout::HalfSplit, scaling },
        max_position: c.opt_usize("max_position_embeddings")?.unwrap_or(4096),
        attention_window: c.attention_window()?,
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
    let theta = g.get_f32(&key("rope.freq_base")?)?.unwrap_or(10_000.0);
    let rotary_dim = opt("rope.dimension_count")?.unwrap_or(head_dim);
    let max_position = opt("context_length")?.unwrap_or(4096);
    let scaling = rope_scaling_in_gguf(g, theta, rotary_dim, max_position)?;
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
            theta,
            rotary_dim,
            // llama.cpp runs qwen2/qwen3 with NeoX (half-split) rotary; llama's Q/K were
            // permuted at conversion for adjacent pairs. Architecture files set it.
            layout: RopeLayout::HalfSplit,
            scaling,
        },
        max_position,
        attention_window: opt("attention.sliding_window")?,
        tie_embeddings: !super::WeightSource::has(g, "lm_head.weight"),
        qkv_bias: false,
        o_bias: false,
        qk_norm: false,
        moe: None,
    })
}

/// A GGUF's RoPE scaling, as llama.cpp stores it: `<arch>.rope.scaling.type` (`linear` with
/// `<arch>.rope.scaling.factor`) or the older `<arch>.rope.scale_linear`; Llama 3.1's as the
/// `rope_freqs.weight` tensor, a divisor per rotated pair (all ones: none), which is taken when it
/// is the `llama3` curve of Llama 3.1 to 3.3 (low 1, high 4, original context 8,192, the factor its
/// largest divisor); `yarn` as llama.cpp's converters write it for Qwen and Llama (the factor and
/// `rope.scaling.original_context_length`, by default `context_length`; the betas by default 32
/// and 1), which llama.cpp runs as transformers does. Anything else is refused, not ignored
/// (ignored, it would serve another model's scores without a word).
fn rope_scaling_in_gguf(
    g: &super::GgufFile,
    theta: f32,
    rotary_dim: usize,
    max_position: usize,
) -> Result<RopeScaling> {
    let unsupported = |what: String| {
        Err(WorkerError::Unsupported(format!(
            "{}: {what} (RoPE: unscaled, linear, Llama 3.1's and YaRN are supported)",
            g.path().display()
        )))
    };
    let mut scaling = RopeScaling::None;
    if g.tensor_info("rope_freqs.weight").is_some() {
        let divisors = g.tensor_f32("rope_freqs.weight")?.data;
        if divisors.iter().any(|&f| f != 1.0) {
            // One per rotated pair (checked first: the frequencies below are as many).
            if divisors.len() != rotary_dim / 2 {
                return unsupported(format!(
                    "tensor rope_freqs.weight: {} divisors for {} rotated pairs",
                    divisors.len(),
                    rotary_dim / 2
                ));
            }
            let factor = divisors.iter().copied().fold(f32::MIN, f32::max);
            let llama3 = RopeScaling::Llama3 {
                factor,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position: 8192,
            };
            let plain = RopeConfig { theta, rotary_dim, layout: RopeLayout::HalfSplit, scaling: RopeScaling::None };
            let want: Vec<f64> = plain
                .inv_freq()
                .iter()
                .zip(RopeConfig { scaling: llama3, ..plain }.inv_freq())
                .map(|(p, s)| p / s)
                .collect();
            if !divisors.iter().zip(&want).all(|(&d, &w)| (d as f64 - w).abs() <= 1e-5 * w) {
                return unsupported("tensor rope_freqs.weight: not Llama 3.1's RoPE scaling".into());
            }
            scaling = llama3;
        }
    }
    let kind_key = g.arch_key("rope.scaling.type")?;
    let factor_key = g.arch_key("rope.scaling.factor")?;
    let typed = match g.get_str(&kind_key)? {
        None | Some("none") => None,
        Some(kind @ ("linear" | "yarn")) => {
            let Some(factor) = g.get_f32(&factor_key)? else {
                return unsupported(format!("{kind_key} = {kind} without {factor_key}"));
            };
            Some(match kind {
                "linear" => RopeScaling::Linear { factor },
                _ => yarn_in_gguf(g, factor, max_position)?,
            })
        }
        Some(kind) => return unsupported(format!("{kind_key} = {kind}")),
    };
    let linear_key = g.arch_key("rope.scale_linear")?;
    let old_linear = g.get_f32(&linear_key)?.filter(|&f| f != 1.0).map(|factor| RopeScaling::Linear { factor });
    for (this, key) in typed.map(|s| (s, &kind_key)).into_iter().chain(old_linear.map(|s| (s, &linear_key))) {
        // Two scalings in one file contradict each other: neither is taken over the other.
        if scaling != RopeScaling::None {
            return unsupported(format!("{key} beside another RoPE scaling ({scaling:?})"));
        }
        scaling = this;
    }
    Ok(scaling)
}

/// `rope.scaling.type = yarn` with its `factor`: llama.cpp runs it with the ramp between the pairs
/// that turn `yarn_beta_fast` and `yarn_beta_slow` times over the original context (bounds
/// rounded out) and cos/sin scaled by `1 + 0.1 ln(factor)` times `rope.scaling.attn_factor`
/// (its `llama-context.cpp` and ggml's `rope_yarn`): transformers' YaRN. Its other YaRN keys (the
/// log multiplier, a context-side attention factor, an extrapolation mix other than 1) change that
/// in ways of llama.cpp's own and are refused unless neutral.
fn yarn_in_gguf(g: &super::GgufFile, factor: f32, max_position: usize) -> Result<RopeScaling> {
    let key = |s: &str| g.arch_key(s);
    let refused = |what: String| {
        WorkerError::Unsupported(format!("{}: {what} (YaRN: as llama.cpp converts Qwen and Llama)", g.path().display()))
    };
    if factor.is_nan() || factor < 1.0 {
        return Err(refused(format!("{} = {factor}: YaRN's factor is at least 1", key("rope.scaling.factor")?)));
    }
    for (name, neutral) in [
        ("rope.scaling.yarn_attn_factor", 1.0),
        ("rope.scaling.yarn_log_multiplier", 0.0),
        ("rope.scaling.yarn_ext_factor", 1.0),
    ] {
        let name = key(name)?;
        if let Some(v) = g.get_f32(&name)?.filter(|&v| v != neutral) {
            return Err(refused(format!("{name} = {v}")));
        }
    }
    let original_max_position = match g.get_u32(&key("rope.scaling.original_context_length")?)? {
        Some(n) => n,
        None => u32::try_from(max_position).map_err(|_| refused(format!("context_length {max_position}")))?,
    };
    let f32_or = |name: &str, default: f32| -> Result<f32> { Ok(g.get_f32(&key(name)?)?.unwrap_or(default)) };
    Ok(RopeScaling::Yarn {
        factor,
        original_max_position,
        beta_fast: f32_or("rope.scaling.yarn_beta_fast", 32.0)?,
        beta_slow: f32_or("rope.scaling.yarn_beta_slow", 1.0)?,
        truncate: true,
        attention_factor: (yarn_mscale(factor as f64, 1.0) * f32_or("rope.scaling.attn_factor", 1.0)? as f64) as f32,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::model::arch::{config_from_gguf, config_from_hf};
    use crate::model::config::MoeConfig;
    use crate::model::gguf::test_writer::{f32_tensor, gguf_bytes, TestTensor};
    use crate::model::gguf::GgufValue;
    use crate::model::GgufFile;
    use sieve_kernels::{RopeConfig, RopeLayout, RopeScaling};

    /// A llama GGUF's metadata (no tensors: the config needs none) with `set` applied
    /// (a value replaces the key's, a new key is added).
    fn llama_gguf(set: &[(&str, GgufValue)]) -> GgufFile {
        llama_gguf_with(set, &[])
    }

    fn llama_gguf_with(set: &[(&str, GgufValue)], tensors: &[TestTensor]) -> GgufFile {
        gguf_of("llama", set, tensors)
    }

    /// A small model's metadata for `arch` (`<arch>.` keys), with `set` applied.
    fn gguf_of(arch: &str, set: &[(&str, GgufValue)], tensors: &[TestTensor]) -> GgufFile {
        let base = [
            ("embedding_length", GgufValue::U32(64)),
            ("block_count", GgufValue::U32(2)),
            ("attention.head_count", GgufValue::U32(4)),
            ("attention.head_count_kv", GgufValue::U32(2)),
            ("feed_forward_length", GgufValue::U32(128)),
            ("context_length", GgufValue::U32(2048)),
            ("rope.dimension_count", GgufValue::U32(16)),
            ("rope.freq_base", GgufValue::F32(10000.0)),
            ("attention.layer_norm_rms_epsilon", GgufValue::F32(1e-5)),
            ("vocab_size", GgufValue::U32(100)),
        ];
        let mut kvs: Vec<(String, GgufValue)> = vec![("general.architecture".into(), GgufValue::Str(arch.into()))];
        kvs.extend(base.into_iter().map(|(k, v)| (format!("{arch}.{k}"), v)));
        for (k, v) in set {
            match kvs.iter_mut().find(|(key, _)| key == k) {
                Some(kv) => kv.1 = v.clone(),
                None => kvs.push((k.to_string(), v.clone())),
            }
        }
        let kvs: Vec<(&str, GgufValue)> = kvs.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        GgufFile::from_bytes("m.gguf", gguf_bytes(&kvs, tensors)).unwrap()
    }

    /// Qwen MoE GGUFs as llama.cpp runs them: every layer sparse, the top-k weights renormalised
    /// for qwen3moe and not for qwen2moe (with its shared expert, by default as wide as
    /// `feed_forward_length`), the expert width by default `feed_forward_length /
    /// expert_used_count`; keys that would change the routing are refused.
    #[test]
    fn qwen_moe_ggufs_are_read_as_llama_cpp_runs_them() {
        let experts = [("qwen3moe.expert_count", GgufValue::U32(8)), ("qwen3moe.expert_used_count", GgufValue::U32(2))];
        let read = |set: &[(&str, GgufValue)]| {
            config_from_gguf(&gguf_of("qwen3moe", &[&experts[..], set].concat(), &[])).map_err(|e| e.to_string())
        };
        let c = read(&[]).unwrap();
        assert_eq!(c.arch.name(), "qwen3_moe");
        assert!(c.qk_norm);
        let want = MoeConfig {
            num_experts: 8,
            top_k: 2,
            expert_intermediate: 64,
            norm_topk_prob: true,
            shared_expert_intermediate: 0,
            dense_layers: vec![],
            sparse_step: 1,
        };
        assert_eq!(c.moe.as_ref(), Some(&want));
        let width = read(&[("qwen3moe.expert_feed_forward_length", GgufValue::U32(32))]).unwrap();
        assert_eq!(width.moe.map(|m| m.expert_intermediate), Some(32));
        for (set, what) in [
            (("qwen3moe.expert_weights_scale", GgufValue::F32(2.5)), "qwen3moe.expert_weights_scale = 2.5"),
            (("qwen3moe.expert_gating_func", GgufValue::U32(2)), "qwen3moe.expert_gating_func = 2"),
            (("qwen3moe.leading_dense_block_count", GgufValue::U32(1)), "qwen3moe.leading_dense_block_count = 1"),
            (("qwen3moe.expert_used_count", GgufValue::U32(9)), "expert_used_count = 9"),
        ] {
            let msg = read(&[set]).unwrap_err();
            assert!(msg.contains(what), "{msg}");
        }
        let msg = config_from_gguf(&gguf_of("qwen3moe", &[], &[])).unwrap_err().to_string();
        assert!(msg.contains("qwen3moe.expert_count"), "{msg}");
        assert!(read(&[("qwen3moe.expert_weights_scale", GgufValue::F32(1.0))]).is_ok());
        let qwen2 = |set: &[(&str, GgufValue)]| {
            let experts =
                [("qwen2moe.expert_count", GgufValue::U32(8)), ("qwen2moe.expert_used_count", GgufValue::U32(2))];
            config_from_gguf(&gguf_of("qwen2moe", &[&experts[..], set].concat(), &[])).unwrap()
        };
        let c = qwen2(&[]);
        assert!(c.qkv_bias && !c.qk_norm);
        let shared = MoeConfig { norm_topk_prob: false, shared_expert_intermediate: 128, ..want };
        assert_eq!(c.moe, Some(shared));
        let width = qwen2(&[("qwen2moe.expert_shared_feed_forward_length", GgufValue::U32(48))]);
        assert_eq!(width.moe.map(|m| m.shared_expert_intermediate), Some(48));
    }

    #[test]
    fn gguf_config_values_the_forward_pass_trusts_are_validated() {
        let c = config_from_gguf(&llama_gguf(&[])).unwrap();
        assert_eq!((c.hidden, c.head_dim, c.rope.rotary_dim, c.max_position), (64, 16, 16, 2048));
        // Each: the key set, the value, what the error must say (file, key, value).
        let cases: Vec<(&str, GgufValue, &str)> = vec![
            (
                "llama.attention.layer_norm_rms_epsilon",
                GgufValue::F32(f32::NAN),
                "llama.attention.layer_norm_rms_epsilon = NaN: must be finite and > 0",
            ),
            (
                "llama.attention.layer_norm_rms_epsilon",
                GgufValue::F32(0.0),
                "layer_norm_rms_epsilon = 0: must be finite and > 0",
            ),
            ("llama.attention.layer_norm_rms_epsilon", GgufValue::F32(-1e-6), "layer_norm_rms_epsilon = -0.000001"),
            ("llama.attention.layer_norm_rms_epsilon", GgufValue::F32(f32::INFINITY), "layer_norm_rms_epsilon = inf"),
            ("llama.rope.freq_base", GgufValue::F32(-10000.0), "llama.rope.freq_base = -10000: must be finite and > 0"),
            ("llama.rope.freq_base", GgufValue::F32(0.0), "llama.rope.freq_base = 0"),
            ("llama.rope.freq_base", GgufValue::F32(f32::NAN), "llama.rope.freq_base = NaN"),
            ("llama.context_length", GgufValue::U32(0), "llama.context_length = 0: must be > 0"),
            (
                "llama.rope.dimension_count",
                GgufValue::U32(0),
                "llama.rope.dimension_count = 0: must be even, > 0 and <= llama.attention.key_length = 16",
            ),
            ("llama.rope.dimension_count", GgufValue::U32(32), "llama.rope.dimension_count = 32"),
            ("llama.rope.dimension_count", GgufValue::U32(7), "llama.rope.dimension_count = 7"),
            ("llama.embedding_length", GgufValue::U32(0), "llama.embedding_length = 0: must be in 1..="),
            ("llama.embedding_length", GgufValue::U32(u32::MAX), "llama.embedding_length = 4294967295"),
            ("llama.block_count", GgufValue::U32(0), "llama.block_count = 0"),
            ("llama.block_count", GgufValue::U32(1 << 28), "llama.block_count = 268435456: must be in 1..=4096"),
            ("llama.attention.head_count", GgufValue::U32(0), "llama.attention.head_count = 0"),
            ("llama.attention.head_count_kv", GgufValue::U32(0), "llama.attention.head_count_kv = 0"),
            (
                "llama.attention.head_count_kv",
                GgufValue::U32(3),
                "llama.attention.head_count = 4: not a multiple of llama.attention.head_count_kv = 3",
            ),
            ("llama.attention.key_length", GgufValue::U32(0), "llama.attention.key_length = 0"),
            ("llama.feed_forward_length", GgufValue::U32(0), "llama.feed_forward_length = 0"),
            ("llama.vocab_size", GgufValue::U32(0), "llama.vocab_size (or the tokenizer.ggml.tokens count) = 0"),
        ];
        for (key, value, want) in cases {
            let err = config_from_gguf(&llama_gguf(&[(key, value.clone())])).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains("m.gguf") && msg.contains(want), "{key} = {value:?}: {msg}");
        }
        // RoPE scaling: llama.cpp's linear keys and Llama 3.1's divisors are read, anything else
        // is refused, never ignored.
        let scaling = |set: &[(&str, GgufValue)], tensors: &[TestTensor]| {
            config_from_gguf(&llama_gguf_with(set, tensors)).map(|c| c.rope.scaling).map_err(|e| e.to_string())
        };
        let linear4 = Ok(RopeScaling::Linear { factor: 4.0 });
        let kind = |k: &str| ("llama.rope.scaling.type", GgufValue::Str(k.into()));
        assert_eq!(scaling(&[kind("linear"), ("llama.rope.scaling.factor", GgufValue::F32(4.0))], &[]), linear4);
        assert_eq!(scaling(&[("llama.rope.scale_linear", GgufValue::F32(4.0))], &[]), linear4);
        assert_eq!(
            scaling(&[kind("none"), ("llama.rope.scale_linear", GgufValue::F32(1.0))], &[]),
            Ok(RopeScaling::None)
        );
        let factor = ("llama.rope.scaling.factor", GgufValue::F32(4.0));
        let both = [kind("linear"), factor.clone(), ("llama.rope.scale_linear", GgufValue::F32(2.0))];
        let msg = scaling(&both, &[]).unwrap_err();
        assert!(msg.contains("llama.rope.scale_linear beside another RoPE scaling"), "{msg}");
        // YaRN as llama.cpp's converters write it for Qwen: the same scaling as the config.json
        // it came from; the original context by default the model's; llama.cpp's own YaRN keys
        // refused unless neutral.
        let yarn = [kind("yarn"), factor.clone(), ("llama.rope.scaling.original_context_length", GgufValue::U32(16))];
        let hf_yarn = {
            let mut v = qwen3_moe();
            v["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16});
            config_from_hf(&v).unwrap().rope.scaling
        };
        assert_eq!(scaling(&yarn, &[]), Ok(hf_yarn));
        let betas = [
            kind("yarn"),
            factor.clone(),
            ("llama.rope.scaling.yarn_beta_fast", GgufValue::F32(16.0)),
            ("llama.rope.scaling.yarn_beta_slow", GgufValue::F32(2.0)),
            ("llama.rope.scaling.yarn_ext_factor", GgufValue::F32(1.0)),
            ("llama.rope.scaling.attn_factor", GgufValue::F32(2.0)),
        ];
        let got = scaling(&betas, &[]);
        let RopeScaling::Yarn { attention_factor: from_factor, .. } = hf_yarn else { panic!("{hf_yarn:?}") };
        let want = |s: &RopeScaling| {
            matches!(s, RopeScaling::Yarn { original_max_position: 2048, beta_fast: 16.0, beta_slow: 2.0, attention_factor, .. }
                if (attention_factor / from_factor - 2.0).abs() < 1e-6)
        };
        assert!(got.as_ref().is_ok_and(want), "{got:?}");
        for (extra, what) in [
            (("llama.rope.scaling.yarn_log_multiplier", GgufValue::F32(0.1)), "yarn_log_multiplier = 0.1"),
            (("llama.rope.scaling.yarn_ext_factor", GgufValue::F32(0.5)), "yarn_ext_factor = 0.5"),
            (("llama.rope.scaling.factor", GgufValue::F32(0.5)), "YaRN's factor is at least 1"),
        ] {
            let mut set = yarn.to_vec();
            set.push(extra);
            let msg = scaling(&set, &[]).unwrap_err();
            assert!(msg.contains(what), "{msg}");
        }
        for (set, want) in [
            (vec![kind("yarn")], "llama.rope.scaling.type = yarn without llama.rope.scaling.factor"),
            (vec![kind("longrope")], "llama.rope.scaling.type = longrope"),
            (vec![kind("linear")], "llama.rope.scaling.type = linear without llama.rope.scaling.factor"),
            (vec![("llama.rope.scale_linear", GgufValue::F32(0.0))], "llama.rope.scaling = Linear { factor: 0.0 }"),
        ] {
            let msg = scaling(&set, &[]).unwrap_err();
            assert!(msg.contains("m.gguf") && msg.contains(want), "{msg}");
        }
        // Llama 3.1's divisors for this config (theta 10,000, 16 rotated dims: pairs 0-5 kept,
        // 6 blended, 7 divided by 8), as llama.cpp's converter writes them; others refused.
        let llama3 = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position: 8192,
        };
        let plain =
            RopeConfig { theta: 10_000.0, rotary_dim: 16, layout: RopeLayout::HalfSplit, scaling: RopeScaling::None };
        let divisors: Vec<f32> = plain
            .inv_freq()
            .iter()
            .zip(RopeConfig { scaling: llama3, ..plain }.inv_freq())
            .map(|(p, s)| (p / s) as f32)
            .collect();
        assert!(
            divisors[..6].iter().all(|&d| d == 1.0) && divisors[6] > 1.0 && divisors[6] < 8.0 && divisors[7] == 8.0
        );
        let freqs = |d: &[f32]| [f32_tensor("rope_freqs.weight", &[d.len() as u64], d)];
        assert_eq!(scaling(&[], &freqs(&divisors)), Ok(llama3));
        assert_eq!(scaling(&[], &freqs(&[1.0; 8])), Ok(RopeScaling::None));
        let msg = scaling(&[], &freqs(&[1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 4.0, 8.0])).unwrap_err();
        assert!(msg.contains("rope_freqs.weight: not Llama 3.1's RoPE scaling"), "{msg}");
        let msg = scaling(&yarn, &freqs(&divisors)).unwrap_err();
        assert!(msg.contains("llama.rope.scaling.type beside another RoPE scaling (Llama3"), "{msg}");
        let msg = scaling(&[], &freqs(&divisors[..7])).unwrap_err();
        assert!(msg.contains("rope_freqs.weight: 7 divisors for 8 rotated pairs"), "{msg}");
        // A rotary size no tensor could match is refused before anything is sized by it.
        let msg =
            scaling(&[("llama.rope.dimension_count", GgufValue::U32(u32::MAX - 1))], &freqs(&divisors)).unwrap_err();
        assert!(msg.contains("8 divisors for 2147483647 rotated pairs"), "{msg}");
        // A missing rope dimension defaults to the head dim; heads larger than hidden give a
        // zero default head dim, refused.
        let err = config_from_gguf(&llama_gguf(&[
            ("llama.attention.head_count", GgufValue::U32(128)),
            ("llama.attention.head_count_kv", GgufValue::U32(128)),
        ]));
        assert!(err.unwrap_err().to_string().contains("key_length = 0"));
    }

    fn qwen3_moe() -> Value {
        json!({
            "model_type": "qwen3_moe", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "num_hidden_layers": 4, "vocab_size": 100, "intermediate_size": 96,
            "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 4096
        })
    }

    #[test]
    fn hf_config_values_are_validated_naming_the_key() {
        config_from_hf(&qwen3_moe()).unwrap();
        let cases: Vec<(&str, Value, &str)> = vec![
            ("rms_norm_eps", json!(0), "rms_norm_eps = 0: must be finite and > 0"),
            ("rms_norm_eps", json!(-1e-6), "rms_norm_eps = -0.000001"),
            // Below f32's range: 0 once converted.
            ("rms_norm_eps", json!(1e-60), "rms_norm_eps = 0"),
            ("rope_theta", json!(-1), "rope_theta = -1: must be finite and > 0"),
            ("rope_theta", json!(1e300), "rope_theta = inf"),
            ("max_position_embeddings", json!(0), "max_position_embeddings = 0: must be > 0"),
            ("head_dim", json!(0), "head_dim = 0"),
            ("head_dim", json!(1u64 << 40), "head_dim = 1099511627776: must be in 1..=1048576"),
            ("hidden_size", json!(0), "hidden_size = 0"),
            ("num_attention_heads", json!(0), "num_attention_heads = 0"),
            ("num_key_value_heads", json!(3), "num_attention_heads = 4: not a multiple of num_key_value_heads = 3"),
            ("num_hidden_layers", json!(0), "num_hidden_layers = 0"),
            ("num_hidden_layers", json!(100000), "num_hidden_layers = 100000: must be in 1..=4096"),
            ("vocab_size", json!(0), "vocab_size = 0"),
            ("partial_rotary_factor", json!(0.0), "head_dim × partial_rotary_factor = 0"),
            ("partial_rotary_factor", json!(-0.5), "head_dim × partial_rotary_factor = 0"),
            ("num_experts", json!(0), "num_experts = 0: must be in 1..=1024"),
            ("num_experts", json!(100000), "num_experts = 100000"),
            ("num_experts_per_tok", json!(0), "num_experts_per_tok = 0: must be in 1..=num_experts = 8"),
            ("num_experts_per_tok", json!(9), "num_experts_per_tok = 9"),
            ("moe_intermediate_size", json!(0), "moe_intermediate_size = 0"),
        ];
        for (key, value, want) in cases {
            let mut v = qwen3_moe();
            v[key] = value.clone();
            let msg = config_from_hf(&v).unwrap_err().to_string();
            assert!(msg.contains("config.json") && msg.contains(want), "{key} = {value}: {msg}");
        }
        // RoPE parameters: a scaled RoPE is refused, and so is a malformed one (never read as
        // unscaled); transformers v5's place for the base is read.
        let rope_cases: Vec<(&str, Value, &str)> = vec![
            ("rope_scaling", json!("linear"), "config.json: 'rope_scaling' is not an object (or null)"),
            ("rope_scaling", json!({"rope_type": 7}), "config.json: 'rope_scaling.rope_type' is not a string"),
            ("rope_scaling", json!({"type": "longrope", "factor": 2.0}), "rope_scaling.rope_type 'longrope'"),
            ("rope_parameters", json!({"rope_type": "yarn"}), "'rope_parameters.factor' is missing (rope_type 'yarn')"),
            ("rope_scaling", json!({"rope_type": "dynamic"}), "'rope_scaling.factor' is missing (rope_type 'dynamic')"),
            (
                "rope_scaling",
                json!({"rope_type": "yarn", "factor": 4, "beta_fast": 1, "beta_slow": 32}),
                "beta_fast > beta_slow",
            ),
            (
                "rope_scaling",
                json!({"rope_type": "yarn", "factor": 4, "truncate": "yes"}),
                "'rope_scaling.truncate' is not a boolean",
            ),
            (
                "rope_scaling",
                json!({"rope_type": "llama3", "factor": 8}),
                "'rope_scaling.low_freq_factor' is missing (rope_type 'llama3')",
            ),
            ("rope_parameters", json!({"rope_theta": "x"}), "'rope_parameters.rope_theta' is not a number"),
            ("rope_scaling", json!({"rope_type": "linear"}), "'rope_scaling.factor' is missing (rope_type 'linear')"),
            ("rope_scaling", json!({"rope_type": "linear", "factor": 0}), "rope_scaling = Linear { factor: 0.0 }"),
            (
                "rope_scaling",
                json!({"rope_type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 4}),
                "high_freq_factor > low_freq_factor",
            ),
            (
                "rope_scaling",
                json!({"rope_type": "yarn", "factor": 8, "original_max_position_embeddings": 0.5}),
                "'rope_scaling.original_max_position_embeddings' is not a positive integer",
            ),
        ];
        for (key, value, want) in rope_cases {
            let mut v = qwen3_moe();
            v[key] = value.clone();
            let msg = config_from_hf(&v).unwrap_err().to_string();
            assert!(msg.contains(want), "{key} = {value}: {msg}");
        }
        let mut v = qwen3_moe();
        v["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 5e5});
        v["rope_scaling"] = json!({});
        assert_eq!(config_from_hf(&v).unwrap().rope.theta, 5e5);
        // Supported scalings, as Llama 3.1's config.json and a linear one say them (the original
        // context left out: transformers takes max_position_embeddings).
        v["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        let llama3 = |original_max_position| RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position,
        };
        assert_eq!(config_from_hf(&v).unwrap().rope.scaling, llama3(8192));
        v["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0});
        assert_eq!(config_from_hf(&v).unwrap().rope.scaling, llama3(4096));
        // YaRN as Qwen3's model card says it, then with every optional field (the betas' 0 is
        // transformers' default, its `or`); the attention factors are the ones transformers
        // computes (`yarn_frequencies_and_attention_factor_are_transformers_ones`).
        v["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768});
        let qwen3_yarn = RopeScaling::Yarn {
            factor: 4.0,
            original_max_position: 32768,
            beta_fast: 32.0,
            beta_slow: 1.0,
            truncate: true,
            attention_factor: 1.138_629_436_111_989_f64 as f32,
        };
        assert_eq!(config_from_hf(&v).unwrap().rope.scaling, qwen3_yarn);
        v["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0, "beta_fast": 0, "beta_slow": 2,
            "truncate": false, "mscale": 2, "mscale_all_dim": 1});
        let set = RopeScaling::Yarn {
            factor: 4.0,
            original_max_position: 4096,
            beta_fast: 32.0,
            beta_slow: 2.0,
            truncate: false,
            attention_factor: 1.121_751_143_713_058_f64 as f32,
        };
        assert_eq!(config_from_hf(&v).unwrap().rope.scaling, set);
        v["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.5});
        let given = config_from_hf(&v).unwrap().rope.scaling;
        assert!(matches!(given, RopeScaling::Yarn { attention_factor: 1.5, .. }), "{given:?}");
        // Dynamic NTK: unscaled, prompts capped to max_position_embeddings.
        v["rope_scaling"] = json!({"rope_type": "dynamic", "factor": 2.0});
        let dynamic = config_from_hf(&v).unwrap();
        assert_eq!(dynamic.rope.scaling, RopeScaling::Dynamic { factor: 2.0 });
        assert_eq!(dynamic.prompt_limit().map(|l| l.0), Some(4096));
        // transformers v5's rope_parameters nested by layer type: alike, read once; different
        // (a RoPE per layer type, which every layer here shares) or mixed with flat keys, refused.
        let nested = |full: Value, sliding: Value| {
            let mut v = qwen3_moe();
            v["rope_parameters"] = json!({"full_attention": full, "sliding_attention": sliding});
            config_from_hf(&v).map(|c| (c.rope.theta, c.rope.scaling)).map_err(|e| e.to_string())
        };
        let yarn =
            json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "rope_theta": 5e5});
        assert_eq!(nested(yarn.clone(), yarn.clone()), Ok((5e5, qwen3_yarn)));
        let msg = nested(yarn.clone(), json!({"rope_type": "default", "rope_theta": 1e4})).unwrap_err();
        assert!(
            msg.contains("rope_parameters: 'sliding_attention' and 'full_attention' layers with different RoPE"),
            "{msg}"
        );
        let mut mixed = qwen3_moe();
        mixed["rope_parameters"] = json!({"full_attention": yarn, "rope_type": "default"});
        let msg = config_from_hf(&mixed).unwrap_err().to_string();
        assert!(msg.contains("'rope_parameters' mixes per-layer-type entries with flat RoPE parameters"), "{msg}");
        v["rope_scaling"] = json!({"type": "linear", "factor": 2.0});
        assert_eq!(config_from_hf(&v).unwrap().rope.scaling, RopeScaling::Linear { factor: 2.0 });
        v["rope_parameters"] = json!({"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5});
        assert_eq!(config_from_hf(&v).unwrap().rope.scaling, RopeScaling::Linear { factor: 2.0 });
        v["rope_parameters"] = json!({"rope_type": "linear", "factor": 3.0});
        let msg = config_from_hf(&v).unwrap_err().to_string();
        assert!(msg.contains("'rope_parameters' (Linear { factor: 3.0 }) differs from 'rope_scaling'"), "{msg}");
        // Sliding-window attention, as transformers reads it: Qwen's flag and window, Mistral's
        // window alone (null: none); a window of 0 is refused.
        let window = |set: &[(&str, Value)]| {
            let mut v = qwen3_moe();
            for (k, x) in set {
                v[*k] = x.clone();
            }
            config_from_hf(&v).map(|c| c.attention_window).map_err(|e| e.to_string())
        };
        assert_eq!(window(&[("use_sliding_window", json!(true)), ("sliding_window", json!(2048))]), Ok(Some(2048)));
        assert_eq!(window(&[("use_sliding_window", json!(false)), ("sliding_window", json!(2048))]), Ok(None));
        assert_eq!(window(&[]), Ok(None));
        let mistral = [("model_type", json!("mistral")), ("intermediate_size", json!(96))];
        assert_eq!(window(&[mistral[0].clone(), mistral[1].clone(), ("sliding_window", json!(4096))]), Ok(Some(4096)));
        assert_eq!(window(&[mistral[0].clone(), mistral[1].clone(), ("sliding_window", json!(null))]), Ok(None));
        let zero = window(&[("use_sliding_window", json!(true)), ("sliding_window", json!(0))]).unwrap_err();
        assert!(zero.contains("sliding_window = 0: must be > 0"), "{zero}");
        let missing = window(&[("use_sliding_window", json!(true))]).unwrap_err();
        assert!(missing.contains("missing 'sliding_window'"), "{missing}");
        // transformers v5's per-layer list decides when present.
        let types = |t: Value| window(&[("layer_types", t), ("sliding_window", json!(512))]);
        assert_eq!(
            types(json!(["full_attention", "sliding_attention", "full_attention", "full_attention"])),
            Ok(Some(512))
        );
        assert_eq!(types(json!(vec!["full_attention"; 4])), Ok(None));
        assert!(types(json!(vec!["chunked_attention"; 4]))
            .unwrap_err()
            .contains("layer_types holds 'chunked_attention'"));
        assert!(types(json!("full_attention")).unwrap_err().contains("'layer_types' is not a list of strings"));
        // The MLP's activation: SiLU (or its other name) only.
        for (act, ok) in [(json!("silu"), true), (json!("swish"), true), (json!("gelu"), false), (json!(3), false)] {
            let mut v = qwen3_moe();
            v["hidden_act"] = act.clone();
            assert_eq!(config_from_hf(&v).is_ok(), ok, "hidden_act {act}");
        }
        // A MoE model whose every layer is sparse needs no dense width; one with a dense layer does.
        let mut v = qwen3_moe();
        v["intermediate_size"] = json!(0);
        config_from_hf(&v).unwrap();
        v["mlp_only_layers"] = json!([1]);
        let msg = config_from_hf(&v).unwrap_err().to_string();
        assert!(msg.contains("intermediate_size = 0"), "{msg}");
    }

    /// Each field of a `yarn` and a `dynamic` scaling at edge values (zero, negative, tiny, huge,
    /// a wrong type, null): refused with an error, or read into finite frequencies and attention
    /// factor, never a panic or a NaN served.
    #[test]
    fn rope_scaling_fields_at_edge_values_are_refused_or_finite() {
        let edges = [
            json!(0),
            json!(-1),
            json!(1e-300),
            json!(0.5),
            json!(1e300),
            json!(u64::MAX),
            json!("4"),
            json!(null),
            json!(true),
            json!([]),
        ];
        let yarn = json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
            "beta_fast": 32, "beta_slow": 1, "truncate": true, "mscale": 1.0, "mscale_all_dim": 0.5,
            "attention_factor": 1.2});
        let dynamic = json!({"rope_type": "dynamic", "factor": 2.0});
        let mut accepted = 0;
        for seed in [yarn, dynamic] {
            let keys: Vec<String> = seed.as_object().unwrap().keys().cloned().collect();
            for key in keys {
                for edge in &edges {
                    let mut v = qwen3_moe();
                    v["rope_scaling"] = seed.clone();
                    v["rope_scaling"][&key] = edge.clone();
                    for theta in [json!(1.0000001), json!(1e6)] {
                        v["rope_theta"] = theta;
                        let Ok(c) = config_from_hf(&v) else { continue };
                        accepted += 1;
                        let (f, a) = (c.rope.inv_freq(), c.rope.attention_scaling());
                        assert!(f.iter().all(|f| f.is_finite()) && a.is_finite() && a > 0.0, "{key} = {edge}: {c:?}");
                    }
                }
            }
        }
        assert!(accepted > 20, "only {accepted} accepted");
    }
}
