//! Deterministic test checkpoints: random weights in the exact HF layout (config.json,
//! model.safetensors with HF tensor names, tokenizer files), so the model code can be checked
//! against HF transformers on models small enough for CI.
//!
//! Weights come from a small self-contained generator (splitmix64, one stream per tensor keyed by
//! the seed and the tensor's name; a normal-like value is the sum of four 16-bit uniforms), using
//! only integer and basic IEEE float arithmetic, so the bytes are identical on every platform and
//! crate version. Scales keep activations sane through the layers: linear weights have standard
//! deviation 1/sqrt(fan_in) (unit gain), norm weights are 1 ± 0.1, embeddings are scaled so that
//! logits spread over a few units, and router weights are 2/sqrt(hidden) so routing is far from
//! uniform.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::str::FromStr;

use half::{bf16, f16};
use serde_json::{json, Value};

use crate::error::{Result, WorkerError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestArch {
    Qwen3,
    Qwen2,
    Llama,
    Qwen3Moe,
    Qwen2Moe,
}

impl TestArch {
    pub fn model_type(self) -> &'static str {
        match self {
            Self::Qwen3 => "qwen3",
            Self::Qwen2 => "qwen2",
            Self::Llama => "llama",
            Self::Qwen3Moe => "qwen3_moe",
            Self::Qwen2Moe => "qwen2_moe",
        }
    }

    pub fn hf_class(self) -> &'static str {
        match self {
            Self::Qwen3 => "Qwen3ForCausalLM",
            Self::Qwen2 => "Qwen2ForCausalLM",
            Self::Llama => "LlamaForCausalLM",
            Self::Qwen3Moe => "Qwen3MoeForCausalLM",
            Self::Qwen2Moe => "Qwen2MoeForCausalLM",
        }
    }

    pub fn is_moe(self) -> bool {
        matches!(self, Self::Qwen3Moe | Self::Qwen2Moe)
    }

    /// Qwen3 normalizes q and k per head (q_norm / k_norm).
    fn has_qk_norm(self) -> bool {
        matches!(self, Self::Qwen3 | Self::Qwen3Moe)
    }

    /// Qwen2 always has q/k/v biases (no o_proj bias).
    fn has_qkv_bias(self) -> bool {
        matches!(self, Self::Qwen2 | Self::Qwen2Moe)
    }
}

impl FromStr for TestArch {
    type Err = WorkerError;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "qwen3" => Self::Qwen3,
            "qwen2" => Self::Qwen2,
            "llama" => Self::Llama,
            "qwen3_moe" => Self::Qwen3Moe,
            "qwen2_moe" => Self::Qwen2Moe,
            _ => {
                return Err(WorkerError::Config(format!(
                    "unknown arch {s:?} (qwen3, qwen2, llama, qwen3_moe, qwen2_moe)"
                )))
            }
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    Tiny,
    Bench,
    /// Qwen3-0.6B's shapes (28 layers, hidden 1024, 16/8 heads of 128, MLP 3072): the GPU
    /// benchmark's dense model. Dense architectures only.
    Qwen3_0_6b,
}

impl FromStr for Preset {
    type Err = WorkerError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "tiny" => Ok(Self::Tiny),
            "bench" => Ok(Self::Bench),
            "qwen3-0.6b" => Ok(Self::Qwen3_0_6b),
            _ => Err(WorkerError::Config(format!("unknown preset {s:?} (tiny, bench, qwen3-0.6b)"))),
        }
    }
}

/// Storage dtype of the generated weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreDType {
    F32,
    BF16,
    F16,
}

impl StoreDType {
    fn safetensors_name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::BF16 => "BF16",
            Self::F16 => "F16",
        }
    }

    /// The `torch_dtype` value transformers writes.
    fn torch_name(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::BF16 => "bfloat16",
            Self::F16 => "float16",
        }
    }

    fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::BF16 | Self::F16 => 2,
        }
    }
}

impl FromStr for StoreDType {
    type Err = WorkerError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" | "float32" => Ok(Self::F32),
            "bf16" | "bfloat16" => Ok(Self::BF16),
            "f16" | "float16" => Ok(Self::F16),
            _ => Err(WorkerError::Config(format!("unknown dtype {s:?} (f32, bf16, f16)"))),
        }
    }
}

/// Mixture-of-experts shape.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeShape {
    pub num_experts: usize,
    pub top_k: usize,
    pub moe_intermediate_size: usize,
    /// qwen2_moe only: the always-on shared expert's width.
    pub shared_expert_intermediate_size: Option<usize>,
    pub norm_topk_prob: bool,
    pub decoder_sparse_step: usize,
    /// Layers with a dense MLP (`intermediate_size`) instead of experts.
    pub mlp_only_layers: Vec<usize>,
}

/// Everything that determines a generated checkpoint, besides the tokenizer.
#[derive(Debug, Clone, PartialEq)]
pub struct TestModelSpec {
    pub arch: TestArch,
    pub seed: u64,
    pub dtype: StoreDType,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    /// Dense MLP width (also MoE models' dense layers, if any).
    pub intermediate_size: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub attention_bias: bool,
    /// `None`: the tokenizer's size (largest id + 1).
    pub vocab_size: Option<usize>,
    pub moe: Option<MoeShape>,
}

impl TestModelSpec {
    /// The named preset for an architecture.
    ///
    /// tiny dense: 2 layers, 4 heads / 2 kv heads, head_dim 32 (qwen3: hidden 96, so
    /// heads·head_dim ≠ hidden; qwen2/llama: hidden 128). tiny MoE: 4 layers, hidden 256,
    /// 32 experts of width 128 (qwen3_moe top-8 with head_dim 32 × 4 heads ≠ hidden; qwen2_moe
    /// top-4 plus a shared expert). bench: hidden 1024, 4 layers (MoE: 128 experts of width 512,
    /// top-8; qwen2_moe 64 experts top-4 plus a 2048-wide shared expert).
    pub fn preset(arch: TestArch, preset: Preset, seed: u64, dtype: StoreDType) -> Self {
        let qwen = arch != TestArch::Llama;
        let mut spec = Self {
            arch,
            seed,
            dtype,
            hidden_size: 128,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 32,
            intermediate_size: 256,
            rms_norm_eps: if qwen { 1e-6 } else { 1e-5 },
            rope_theta: if qwen { 1_000_000.0 } else { 100_000.0 },
            max_position_embeddings: 4096,
            tie_word_embeddings: arch != TestArch::Qwen2,
            attention_bias: false,
            vocab_size: None,
            moe: None,
        };
        match (arch, preset) {
            (TestArch::Qwen3, Preset::Tiny) => {
                spec.hidden_size = 96;
                spec.intermediate_size = 192;
            }
            (TestArch::Qwen2 | TestArch::Llama, Preset::Tiny) => {}
            (TestArch::Qwen3Moe, Preset::Tiny) => {
                spec.hidden_size = 256;
                spec.num_hidden_layers = 4;
                spec.intermediate_size = 512;
                spec.moe = Some(MoeShape {
                    num_experts: 32,
                    top_k: 8,
                    moe_intermediate_size: 128,
                    shared_expert_intermediate_size: None,
                    norm_topk_prob: true,
                    decoder_sparse_step: 1,
                    mlp_only_layers: vec![],
                });
            }
            (TestArch::Qwen2Moe, Preset::Tiny) => {
                spec.hidden_size = 256;
                spec.num_hidden_layers = 4;
                spec.num_attention_heads = 8;
                spec.num_key_value_heads = 4;
                spec.intermediate_size = 512;
                spec.moe = Some(MoeShape {
                    num_experts: 32,
                    top_k: 4,
                    moe_intermediate_size: 128,
                    shared_expert_intermediate_size: Some(256),
                    norm_topk_prob: false,
                    decoder_sparse_step: 1,
                    mlp_only_layers: vec![],
                });
            }
            (_, Preset::Qwen3_0_6b) => {
                spec.hidden_size = 1024;
                spec.num_hidden_layers = 28;
                spec.num_attention_heads = 16;
                spec.num_key_value_heads = 8;
                spec.head_dim = 128;
                spec.intermediate_size = 3072;
                spec.max_position_embeddings = 32768;
            }
            (_, Preset::Bench) => {
                spec.hidden_size = 1024;
                spec.num_hidden_layers = 4;
                spec.num_attention_heads = 16;
                spec.num_key_value_heads = 4;
                spec.head_dim = 64;
                spec.intermediate_size = 3072;
                spec.max_position_embeddings = 32768;
                spec.moe = match arch {
                    TestArch::Qwen3Moe => Some(MoeShape {
                        num_experts: 128,
                        top_k: 8,
                        moe_intermediate_size: 512,
                        shared_expert_intermediate_size: None,
                        norm_topk_prob: true,
                        decoder_sparse_step: 1,
                        mlp_only_layers: vec![],
                    }),
                    TestArch::Qwen2Moe => Some(MoeShape {
                        num_experts: 64,
                        top_k: 4,
                        moe_intermediate_size: 512,
                        shared_expert_intermediate_size: Some(2048),
                        norm_topk_prob: false,
                        decoder_sparse_step: 1,
                        mlp_only_layers: vec![],
                    }),
                    _ => None,
                };
            }
        }
        // qwen2 has no head_dim in its config: heads × head_dim must equal hidden there.
        if matches!(arch, TestArch::Qwen2 | TestArch::Qwen2Moe) {
            spec.head_dim = spec.hidden_size / spec.num_attention_heads;
        }
        spec
    }

    /// Whether layer `layer` uses experts (transformers' rule for qwen2_moe / qwen3_moe).
    pub fn is_sparse_layer(&self, layer: usize) -> bool {
        match &self.moe {
            None => false,
            Some(m) => {
                !m.mlp_only_layers.contains(&layer)
                    && m.num_experts > 0
                    && (layer + 1).is_multiple_of(m.decoder_sparse_step.max(1))
            }
        }
    }

    fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(WorkerError::Config(format!("test model spec: {msg}")));
        if self.num_attention_heads == 0
            || self.num_key_value_heads == 0
            || !self.num_attention_heads.is_multiple_of(self.num_key_value_heads)
        {
            return bad(format!(
                "{} heads is not a multiple of {} kv heads",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!("head_dim {} must be even (RoPE)", self.head_dim));
        }
        if matches!(self.arch, TestArch::Qwen2 | TestArch::Qwen2Moe)
            && self.head_dim * self.num_attention_heads != self.hidden_size
        {
            return bad("qwen2 needs heads × head_dim = hidden".into());
        }
        match (&self.moe, self.arch.is_moe()) {
            (Some(m), true) if m.top_k == 0 || m.top_k > m.num_experts => {
                bad(format!("top_k {} of {} experts", m.top_k, m.num_experts))
            }
            (Some(m), true) if (self.arch == TestArch::Qwen2Moe) != m.shared_expert_intermediate_size.is_some() => {
                bad("a shared expert is qwen2_moe's, and qwen2_moe has one".into())
            }
            (Some(_), true) | (None, false) => Ok(()),
            _ => bad(format!("{} and the MoE shape disagree", self.arch.model_type())),
        }
    }

    /// config.json as transformers writes it for the architecture (hub-style keys:
    /// `rope_theta`, `torch_dtype`, `num_experts`).
    pub fn config_json(&self, vocab_size: usize) -> Value {
        let layers = self.num_hidden_layers;
        let mut c = json!({
            "architectures": [self.arch.hf_class()],
            "model_type": self.arch.model_type(),
            "attention_dropout": 0.0,
            "bos_token_id": 151643,
            "eos_token_id": 151645,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "initializer_range": 0.02,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": layers,
            "num_key_value_heads": self.num_key_value_heads,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_scaling": null,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": self.dtype.torch_name(),
            "use_cache": true,
            "vocab_size": vocab_size,
        });
        let obj = c.as_object_mut().expect("json object");
        match self.arch {
            TestArch::Llama => {
                obj.insert("head_dim".into(), json!(self.head_dim));
                obj.insert("attention_bias".into(), json!(self.attention_bias));
                obj.insert("mlp_bias".into(), json!(false));
                obj.insert("pretraining_tp".into(), json!(1));
            }
            TestArch::Qwen3 | TestArch::Qwen3Moe => {
                obj.insert("head_dim".into(), json!(self.head_dim));
                obj.insert("attention_bias".into(), json!(self.attention_bias));
            }
            TestArch::Qwen2 | TestArch::Qwen2Moe => {}
        }
        if self.arch != TestArch::Llama {
            obj.insert("sliding_window".into(), Value::Null);
            obj.insert("use_sliding_window".into(), json!(false));
            obj.insert("max_window_layers".into(), json!(layers));
        }
        if let Some(m) = &self.moe {
            obj.insert("num_experts".into(), json!(m.num_experts));
            obj.insert("num_experts_per_tok".into(), json!(m.top_k));
            obj.insert("moe_intermediate_size".into(), json!(m.moe_intermediate_size));
            obj.insert("norm_topk_prob".into(), json!(m.norm_topk_prob));
            obj.insert("decoder_sparse_step".into(), json!(m.decoder_sparse_step));
            obj.insert("mlp_only_layers".into(), json!(m.mlp_only_layers));
            obj.insert("output_router_logits".into(), json!(false));
            obj.insert("router_aux_loss_coef".into(), json!(0.001));
            if let Some(s) = m.shared_expert_intermediate_size {
                obj.insert("shared_expert_intermediate_size".into(), json!(s));
            }
        }
        c
    }

    /// Every tensor of the checkpoint: HF name, shape, and how to draw its values.
    fn tensors(&self, vocab: usize) -> Vec<TensorPlan> {
        let h = self.hidden_size;
        let q_dim = self.num_attention_heads * self.head_dim;
        let kv_dim = self.num_key_value_heads * self.head_dim;
        let linear = |name: String, out: usize, inp: usize| TensorPlan {
            name,
            shape: vec![out, inp],
            init: Init::Normal { mean: 0.0, std: 1.0 / (inp as f64).sqrt() },
        };
        let norm =
            |name: String, n: usize| TensorPlan { name, shape: vec![n], init: Init::Normal { mean: 1.0, std: 0.1 } };
        let bias =
            |name: String, n: usize| TensorPlan { name, shape: vec![n], init: Init::Normal { mean: 0.0, std: 0.2 } };
        // Logits are normed_hidden · E[v]: std 3/sqrt(h) makes them spread over a few units.
        let embedding_std = 3.0 / (h as f64).sqrt();
        let mut t = vec![TensorPlan {
            name: "model.embed_tokens.weight".into(),
            shape: vec![vocab, h],
            init: Init::Normal { mean: 0.0, std: embedding_std },
        }];
        for l in 0..self.num_hidden_layers {
            let p = format!("model.layers.{l}");
            t.push(norm(format!("{p}.input_layernorm.weight"), h));
            t.push(linear(format!("{p}.self_attn.q_proj.weight"), q_dim, h));
            t.push(linear(format!("{p}.self_attn.k_proj.weight"), kv_dim, h));
            t.push(linear(format!("{p}.self_attn.v_proj.weight"), kv_dim, h));
            t.push(linear(format!("{p}.self_attn.o_proj.weight"), h, q_dim));
            if self.arch.has_qkv_bias() || self.attention_bias {
                t.push(bias(format!("{p}.self_attn.q_proj.bias"), q_dim));
                t.push(bias(format!("{p}.self_attn.k_proj.bias"), kv_dim));
                t.push(bias(format!("{p}.self_attn.v_proj.bias"), kv_dim));
            }
            if self.attention_bias {
                t.push(bias(format!("{p}.self_attn.o_proj.bias"), h));
            }
            if self.arch.has_qk_norm() {
                t.push(norm(format!("{p}.self_attn.q_norm.weight"), self.head_dim));
                t.push(norm(format!("{p}.self_attn.k_norm.weight"), self.head_dim));
            }
            t.push(norm(format!("{p}.post_attention_layernorm.weight"), h));
            match &self.moe {
                Some(m) if self.is_sparse_layer(l) => {
                    let mi = m.moe_intermediate_size;
                    t.push(TensorPlan {
                        name: format!("{p}.mlp.gate.weight"),
                        shape: vec![m.num_experts, h],
                        init: Init::Normal { mean: 0.0, std: 2.0 / (h as f64).sqrt() },
                    });
                    for e in 0..m.num_experts {
                        t.push(linear(format!("{p}.mlp.experts.{e}.gate_proj.weight"), mi, h));
                        t.push(linear(format!("{p}.mlp.experts.{e}.up_proj.weight"), mi, h));
                        t.push(linear(format!("{p}.mlp.experts.{e}.down_proj.weight"), h, mi));
                    }
                    if let Some(si) = m.shared_expert_intermediate_size {
                        t.push(linear(format!("{p}.mlp.shared_expert.gate_proj.weight"), si, h));
                        t.push(linear(format!("{p}.mlp.shared_expert.up_proj.weight"), si, h));
                        t.push(linear(format!("{p}.mlp.shared_expert.down_proj.weight"), h, si));
                        t.push(linear(format!("{p}.mlp.shared_expert_gate.weight"), 1, h));
                    }
                }
                _ => {
                    let i = self.intermediate_size;
                    t.push(linear(format!("{p}.mlp.gate_proj.weight"), i, h));
                    t.push(linear(format!("{p}.mlp.up_proj.weight"), i, h));
                    t.push(linear(format!("{p}.mlp.down_proj.weight"), h, i));
                }
            }
        }
        t.push(norm("model.norm.weight".into(), h));
        if !self.tie_word_embeddings {
            t.push(TensorPlan {
                name: "lm_head.weight".into(),
                shape: vec![vocab, h],
                init: Init::Normal { mean: 0.0, std: embedding_std },
            });
        }
        t.sort_by(|a, b| a.name.cmp(&b.name));
        t
    }
}

#[derive(Debug, Clone, Copy)]
enum Init {
    Normal { mean: f64, std: f64 },
}

struct TensorPlan {
    name: String,
    shape: Vec<usize>,
    init: Init,
}

impl TensorPlan {
    fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// What [`generate`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratedModel {
    pub vocab_size: usize,
    pub n_params: usize,
    pub n_tensors: usize,
    pub safetensors_bytes: u64,
}

/// Writes a checkpoint for `spec` into `out_dir` (created if needed): config.json,
/// model.safetensors, tokenizer.json (copied from `tokenizer_json`) and tokenizer_config.json
/// (copied from beside it, or a minimal one).
pub fn generate(spec: &TestModelSpec, out_dir: &Path, tokenizer_json: &Path) -> Result<GeneratedModel> {
    spec.validate()?;
    let tokenizer = crate::model::tokenizer::Tokenizer::from_file(tokenizer_json)?;
    let vocab = spec.vocab_size.unwrap_or_else(|| tokenizer.vocab_size());
    if vocab < tokenizer.vocab_size() {
        return Err(WorkerError::Config(format!(
            "vocab_size {vocab} is smaller than the tokenizer's {}",
            tokenizer.vocab_size()
        )));
    }
    std::fs::create_dir_all(out_dir)?;

    let config = spec.config_json(vocab);
    let config_text =
        serde_json::to_string_pretty(&config).map_err(|e| WorkerError::Config(format!("config.json: {e}")))?;
    std::fs::write(out_dir.join("config.json"), config_text + "\n")?;

    std::fs::copy(tokenizer_json, out_dir.join("tokenizer.json"))?;
    let tokenizer_config = tokenizer_json.with_file_name("tokenizer_config.json");
    if tokenizer_config.is_file() {
        std::fs::copy(&tokenizer_config, out_dir.join("tokenizer_config.json"))?;
    } else {
        let minimal = json!({"add_bos_token": false, "model_max_length": spec.max_position_embeddings});
        std::fs::write(out_dir.join("tokenizer_config.json"), format!("{minimal:#}\n"))?;
    }

    let plans = spec.tensors(vocab);
    let bytes = write_safetensors(&out_dir.join("model.safetensors"), &plans, spec)?;
    Ok(GeneratedModel {
        vocab_size: vocab,
        n_params: plans.iter().map(TensorPlan::numel).sum(),
        n_tensors: plans.len(),
        safetensors_bytes: bytes,
    })
}

/// Streams the tensors into a safetensors file (header, then data in header order), so even the
/// bench preset never holds more than a chunk in memory.
fn write_safetensors(path: &Path, plans: &[TensorPlan], spec: &TestModelSpec) -> Result<u64> {
    let elem = spec.dtype.size();
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut offset = 0usize;
    for p in plans {
        let len = p.numel() * elem;
        header.insert(
            p.name.clone(),
            json!({"dtype": spec.dtype.safetensors_name(), "shape": p.shape, "data_offsets": [offset, offset + len]}),
        );
        offset += len;
    }
    let mut header_bytes = serde_json::to_vec(&Value::Object(header))
        .map_err(|e| WorkerError::Config(format!("safetensors header: {e}")))?;
    // Pad the header with spaces so the data starts 8-byte aligned (as the reference writer does).
    header_bytes.resize((header_bytes.len() + 8).div_ceil(8) * 8 - 8, b' ');

    let file =
        File::create(path).map_err(|e| WorkerError::Config(format!("{}: cannot create: {e}", path.display())))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    w.write_all(&(header_bytes.len() as u64).to_le_bytes())?;
    w.write_all(&header_bytes)?;
    const CHUNK: usize = 1 << 16;
    let mut buf = Vec::with_capacity(CHUNK * 4);
    for p in plans {
        let mut rng = SplitMix64::new(spec.seed ^ fnv1a64(p.name.as_bytes()));
        let Init::Normal { mean, std } = p.init;
        let mut left = p.numel();
        while left > 0 {
            let n = left.min(CHUNK);
            buf.clear();
            for _ in 0..n {
                let v = (mean + std * rng.normal_like()) as f32;
                match spec.dtype {
                    StoreDType::F32 => buf.extend_from_slice(&v.to_le_bytes()),
                    StoreDType::BF16 => buf.extend_from_slice(&bf16::from_f32(v).to_le_bytes()),
                    StoreDType::F16 => buf.extend_from_slice(&f16::from_f32(v).to_le_bytes()),
                }
            }
            w.write_all(&buf)?;
            left -= n;
        }
    }
    w.flush()?;
    Ok(8 + header_bytes.len() as u64 + offset as u64)
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

/// splitmix64 (Steele, Lea, Flood 2014): tiny, fast, and fixed forever.
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Mean 0, variance 1, bounded by ±√12 ≈ 3.46: the sum of four 16-bit uniforms (Irwin–Hall),
    /// computed without transcendental functions so it is bit-identical everywhere.
    fn normal_like(&mut self) -> f64 {
        let x = self.next_u64();
        let s = (x & 0xffff) + ((x >> 16) & 0xffff) + ((x >> 32) & 0xffff) + (x >> 48);
        // Each 16-bit uniform has mean 32767.5 and variance (65536² − 1) / 12.
        const MEAN: f64 = 4.0 * 32767.5;
        const INV_STD: f64 = 1.0 / 37_837.227_237_206_48; // 1 / sqrt(4 · (65536² − 1) / 12)
        (s as f64 - MEAN) * INV_STD
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::safetensors::HfCheckpoint;
    use crate::model::source::WeightSource;
    use crate::model::test_assets::{asset, TempDir, QWEN3_TOKENIZER};

    #[test]
    fn normal_like_has_unit_variance() {
        let mut rng = SplitMix64::new(7);
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|_| rng.normal_like()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.01, "variance {var}");
        assert!(xs.iter().all(|x| x.abs() <= 3.47));
    }

    #[test]
    fn splitmix64_reference_values() {
        // The published test vector for seed 1234567 (as on Rosetta Code's Splitmix64 task).
        let mut rng = SplitMix64::new(1234567);
        assert_eq!(rng.next_u64(), 6457827717110365317);
        assert_eq!(rng.next_u64(), 3203168211198807973);
    }

    #[test]
    fn same_seed_same_bytes_other_seed_other_weights() {
        let tok = asset(QWEN3_TOKENIZER);
        let spec = TestModelSpec::preset(TestArch::Llama, Preset::Tiny, 42, StoreDType::BF16);
        let (a, b, c) = (TempDir::new("testgen"), TempDir::new("testgen"), TempDir::new("testgen"));
        generate(&spec, a.path(), &tok).unwrap();
        generate(&spec, b.path(), &tok).unwrap();
        for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
            let (x, y) = (std::fs::read(a.path().join(f)).unwrap(), std::fs::read(b.path().join(f)).unwrap());
            assert!(x == y, "{f} differs between two runs with the same seed");
        }
        generate(&TestModelSpec { seed: 43, ..spec }, c.path(), &tok).unwrap();
        let name = "model.layers.1.mlp.down_proj.weight";
        let w42 = HfCheckpoint::open(a.path()).unwrap().get(name).unwrap();
        let w43 = HfCheckpoint::open(c.path()).unwrap().get(name).unwrap();
        assert_eq!(w42.shape, w43.shape);
        assert_ne!(w42.data, w43.data);
    }

    #[test]
    fn moe_checkpoint_has_per_expert_hf_names_and_loads_back() {
        let tok = asset(QWEN3_TOKENIZER);
        let spec = TestModelSpec::preset(TestArch::Qwen2Moe, Preset::Tiny, 42, StoreDType::BF16);
        let a = TempDir::new("testgen");
        let info = generate(&spec, a.path(), &tok).unwrap();
        assert_eq!(info.vocab_size, 151669);

        let ck = HfCheckpoint::open(a.path()).unwrap();
        assert_eq!(ck.model_type().unwrap(), "qwen2_moe");
        assert_eq!(ck.architectures(), vec!["Qwen2MoeForCausalLM".to_string()]);
        let c = crate::model::config::HfConfig(ck.config());
        assert_eq!(c.usize("num_experts").unwrap(), 32);
        assert_eq!(c.usize("num_experts_per_tok").unwrap(), 4);
        assert_eq!(c.usize("shared_expert_intermediate_size").unwrap(), 256);
        assert_eq!(c.opt_bool("norm_topk_prob").unwrap(), Some(false));
        assert_eq!(ck.names().len(), info.n_tensors);
        // Per-expert HF names, router, shared expert and its gate.
        let e = ck.get("model.layers.3.mlp.experts.31.down_proj.weight").unwrap();
        assert_eq!(e.shape, vec![256, 128]);
        assert_eq!(ck.get("model.layers.0.mlp.gate.weight").unwrap().shape, vec![32, 256]);
        assert_eq!(ck.get("model.layers.0.mlp.shared_expert_gate.weight").unwrap().shape, vec![1, 256]);
        assert!(ck.has("model.layers.0.mlp.shared_expert.up_proj.weight"));
        assert!(ck.has("model.layers.0.self_attn.q_proj.bias"));
        assert!(!ck.has("model.layers.0.self_attn.q_norm.weight"));
        assert!(!ck.has("model.layers.0.mlp.gate_proj.weight"));
        assert!(!ck.has("model.layers.0.mlp.experts.32.up_proj.weight"));
        // Weights are on the intended scale: std ≈ 1/sqrt(fan_in), norms ≈ 1.
        let q = ck.get("model.layers.1.self_attn.q_proj.weight").unwrap();
        let rms = (q.data.iter().map(|x| x * x).sum::<f32>() / q.numel() as f32).sqrt();
        assert!((rms * 16.0 - 1.0).abs() < 0.05, "q_proj rms {rms}");
        let norm = ck.get("model.norm.weight").unwrap();
        assert!(norm.data.iter().all(|&x| (0.6..1.4).contains(&x)));
        assert!(ck.tokenizer_json_path().is_some() && ck.tokenizer_config_path().is_some());
    }

    #[test]
    fn dense_presets_have_the_hf_tensor_layout() {
        let tok = asset(QWEN3_TOKENIZER);
        let dir = TempDir::new("testgen");
        let spec = TestModelSpec::preset(TestArch::Qwen3, Preset::Tiny, 1, StoreDType::F16);
        generate(&spec, dir.path(), &tok).unwrap();
        let ck = HfCheckpoint::open(dir.path()).unwrap();
        let cfg = ck.config();
        assert_eq!(cfg["head_dim"], 32);
        assert_eq!(cfg["hidden_size"], 96);
        assert_eq!(cfg["tie_word_embeddings"], true);
        assert_eq!(cfg["torch_dtype"], "float16");
        assert_eq!(cfg["attention_bias"], false);
        assert_eq!(ck.get("model.layers.0.self_attn.q_proj.weight").unwrap().shape, vec![128, 96]);
        assert_eq!(ck.get("model.layers.0.self_attn.o_proj.weight").unwrap().shape, vec![96, 128]);
        assert_eq!(ck.get("model.layers.1.self_attn.k_norm.weight").unwrap().shape, vec![32]);
        assert_eq!(ck.get("model.embed_tokens.weight").unwrap().shape, vec![151669, 96]);
        assert!(!ck.has("lm_head.weight"));
        assert!(!ck.has("model.layers.0.self_attn.q_proj.bias"));
        let expected = 1 + 1 + 2 * 11;
        assert_eq!(ck.names().len(), expected, "{:?}", ck.names());
    }

    #[test]
    fn regenerates_the_checkpoints_the_logits_fixture_was_computed_on() {
        // testmodel_logits.json holds transformers' logits for checkpoints this generator made;
        // if the generator's output changed, those logits would no longer apply.
        let tok = asset(QWEN3_TOKENIZER);
        let fx = crate::model::test_assets::fixture_json("testmodel_logits.json");
        for model in fx["models"].as_array().unwrap() {
            let g = &model["generate"];
            let spec = TestModelSpec::preset(
                g["arch"].as_str().unwrap().parse().unwrap(),
                g["preset"].as_str().unwrap().parse().unwrap(),
                g["seed"].as_u64().unwrap(),
                g["dtype"].as_str().unwrap().parse().unwrap(),
            );
            let dir = TempDir::new("testgen");
            generate(&spec, dir.path(), &tok).unwrap();
            let ck = HfCheckpoint::open(dir.path()).unwrap();
            for (key, want) in model["config"].as_object().unwrap() {
                assert_eq!(&ck.config()[key], want, "{} config {key}", model["arch"]);
            }
            for probe in model["weight_probes"].as_array().unwrap() {
                let name = probe["name"].as_str().unwrap();
                let w = ck.get(name).unwrap();
                for pair in probe["values_at"].as_array().unwrap() {
                    let i = pair[0].as_u64().unwrap() as usize;
                    // f32 values written as JSON doubles (serde_json's parse may be 1 ulp off in f64).
                    assert_eq!(w.data[i], pair[1].as_f64().unwrap() as f32, "{} {name}[{i}]", model["arch"]);
                }
                let sum: f64 = w.data.iter().map(|&x| x as f64).sum();
                let want = probe["sum"].as_f64().unwrap();
                assert!((sum - want).abs() <= 1e-9 * w.numel() as f64, "{} {name} sum {sum} vs {want}", model["arch"]);
            }
        }
    }

    #[test]
    fn spec_validation_rejects_inconsistent_shapes() {
        let tok = asset(QWEN3_TOKENIZER);
        let dir = TempDir::new("testgen");
        let mut spec = TestModelSpec::preset(TestArch::Llama, Preset::Tiny, 1, StoreDType::F32);
        spec.num_key_value_heads = 3;
        assert!(generate(&spec, dir.path(), &tok).is_err());
        let mut spec = TestModelSpec::preset(TestArch::Qwen3Moe, Preset::Tiny, 1, StoreDType::F32);
        spec.moe.as_mut().unwrap().top_k = 33;
        assert!(generate(&spec, dir.path(), &tok).is_err());
        let mut spec = TestModelSpec::preset(TestArch::Qwen3, Preset::Tiny, 1, StoreDType::F32);
        spec.vocab_size = Some(1000);
        assert!(generate(&spec, dir.path(), &tok).is_err());
        assert!("qwen4".parse::<TestArch>().is_err());
    }
}
