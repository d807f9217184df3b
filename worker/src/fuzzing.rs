//! Fuzz target bodies: each is a plain function that the cargo-fuzz targets in `fuzz/` call,
//! and that `cargo test` drives over a bounded set of generated inputs (random bytes,
//! `arbitrary`-structured inputs and mutations of valid seeds: `worker/tests/fuzz.rs`), so CI
//! exercises them on stable Rust.
//!
//! The property of every target: whatever the input, no panic and no hang; a bad input is an
//! `Err` with a message; what a call allocates is bounded by the input's size (the tests count
//! it with a counting allocator; libFuzzer's `-malloc_limit_mb` does the same). A violated
//! invariant (an id outside the vocabulary, an error with the wrong HTTP status) is a panic, so
//! the fuzzer reports it.

use std::path::Path;
use std::sync::OnceLock;

use arbitrary::Unstructured;
use sieve_kernels::cpu::CpuBackend;
use sieve_server::compat::Shape;
use sieve_server::service::Route;
use sieve_shared::{ApiError, Limits};

use crate::model::gguf::test_writer::{gguf_bytes, TestTensor};
use crate::model::gguf::GgufValue;
use crate::model::safetensors::{shard_tensor_f32, shard_tensors};
use crate::model::{arch, GgufFile, HeadSpec, Model, WeightSource};
use crate::{Result, Tokenizer, WorkerError};

/// A GGUF file: parse it, read every metadata value with every typed accessor, read its model
/// config (validated), dequantize every tensor, rebuild its tokenizer and, when the config is
/// valid, load the model on the CPU backend (every weight's shape checked against the config).
/// The result is the parse and config outcome.
pub fn gguf(data: &[u8]) -> Result<()> {
    let g = GgufFile::from_bytes("fuzz.gguf", data.to_vec())?;
    for (key, _) in g.metadata() {
        let _ = g.get_u32(key);
        let _ = g.get_u64(key);
        let _ = g.get_f32(key);
        let _ = g.get_bool(key);
        let _ = g.get_str(key);
        let _ = g.get_str_array(key);
        let _ = g.get_i32_array(key);
        let _ = g.get_f32_array(key);
    }
    for name in g.names() {
        if let Ok(w) = g.get(&name) {
            assert_eq!(w.numel(), w.shape.iter().product::<usize>(), "{name}: shape vs data");
        }
    }
    for info in g.tensor_infos() {
        let _ = g.tensor_f32(&info.name);
    }
    if let Ok(tok) = Tokenizer::from_gguf(&g) {
        tokenizer(&tok, "a ab <|im_start|> b");
    }
    let config = arch::config_from_gguf(&g)?;
    // Tiny test models only: the load itself is bounded by the file (every weight is read from
    // it and its shape checked), but the CPU backend's packing is not worth fuzzing at size.
    if config.hidden <= 256 && config.vocab <= 4096 && config.n_layers <= 4 {
        let _ = Model::load(cpu(), &g, config, HeadSpec::YesNo { yes: 0, no: 1 }, false);
    }
    Ok(())
}

/// One CPU backend for every fuzz input (creating one per input would dominate the time).
fn cpu() -> &'static CpuBackend {
    static CPU: OnceLock<CpuBackend> = OnceLock::new();
    CPU.get_or_init(|| CpuBackend::new(1).expect("CPU backend"))
}

/// A safetensors file: read and check its header, convert every tensor to f32.
pub fn safetensors_header(data: &[u8]) -> Result<()> {
    let path = Path::new("fuzz.safetensors");
    let tensors = shard_tensors(path, data)?;
    for t in &tensors {
        assert!(t.start <= t.end && t.end <= data.len(), "{}: range outside the file", t.name);
        if let Ok(w) = shard_tensor_f32(path, data, t) {
            assert_eq!(w.shape, t.shape);
        }
    }
    Ok(())
}

/// An HF `config.json`: parse it and read the model config with its architecture's parser
/// (validated).
pub fn hf_config(data: &[u8]) -> Result<()> {
    let v: serde_json::Value =
        serde_json::from_slice(data).map_err(|e| WorkerError::ModelFile(format!("config.json: {e}")))?;
    arch::config_from_hf(&v)?;
    Ok(())
}

/// A request body as the API parses it on every route (Sieve's score and rerank, and the drop-in
/// shapes of `sieve_server::compat`), each checked against the default [`Limits`]. Every error is
/// a client error with the status the API documents (400 malformed, 413 too large, 422 invalid).
pub fn request_json(data: &[u8]) -> std::result::Result<(), ApiError> {
    let limits = Limits::default();
    let results: Vec<_> = Route::ALL
        .into_iter()
        .map(|route| Shape::parse(route, data).and_then(|(req, shape)| limits.check_as(&req, shape.items_field())))
        .collect();
    for e in results.iter().filter_map(|r| r.as_ref().err()) {
        assert!(matches!(e.status(), 400 | 413 | 422), "status {} for {e:?}", e.status());
        assert!(!e.message.is_empty(), "an error without a message");
    }
    results.into_iter().reduce(|a, b| a.or(b)).unwrap_or(Ok(()))
}

/// Caller text through the worker's tokenizer wrapper: ids inside the vocabulary, the same ids
/// every time and as the `tokenizers` crate alone gives (the fast path), and decoding what was
/// encoded works.
pub fn tokenizer(tok: &Tokenizer, text: &str) {
    let Ok(ids) = tok.encode_plain(text) else { return };
    assert!(ids.iter().all(|&id| (id as usize) < tok.vocab_size()), "an id outside the vocabulary");
    assert_eq!(tok.encode_plain(text).ok().as_ref(), Some(&ids), "encoding is deterministic");
    assert_eq!(tok.encode_by_crate(text, true).ok().as_ref(), Some(&ids), "the crate's own ids");
    tok.decode(&ids).expect("decoding encoded ids");
    if let Ok(special) = tok.encode(text) {
        assert!(special.iter().all(|&id| (id as usize) < tok.vocab_size()));
        assert_eq!(tok.encode_by_crate(text, false).ok(), Some(special), "the crate's own ids, specials matched");
    }
}

/// The tokenizer the tokenizer target runs: the real Qwen3 tokenizer from the asset cache
/// (`SIEVE_CACHE`), else the one rebuilt from the SmolLM2 GGUF; an error naming both when
/// neither is there (`scripts/fetch-assets` fetches them).
pub fn fuzz_tokenizer() -> Result<Tokenizer> {
    let cache = crate::assets::cache_dir();
    let qwen3 = cache.join(crate::assets::QWEN3_TOKENIZER);
    if qwen3.is_file() {
        return Tokenizer::from_file(&qwen3);
    }
    let smollm2 = cache.join(crate::assets::DEFAULT_MODEL);
    if smollm2.is_file() {
        return Tokenizer::from_gguf(&GgufFile::open(&smollm2)?);
    }
    Err(WorkerError::Asset(format!(
        "neither {} nor {} exists: run scripts/fetch-assets",
        qwen3.display(),
        smollm2.display()
    )))
}

/// Valid inputs to start mutating from.
pub mod seeds {
    use super::*;

    /// Deterministic bytes (an LCG): tensor data for the seed files.
    fn noise(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (x >> 56) as u8
            })
            .collect()
    }

    fn f32_noise(name: &str, dims: &[u64], seed: u64) -> TestTensor {
        let n: u64 = dims.iter().product();
        // Small values: an f32 from the top bits of noise, scaled into [-0.5, 0.5).
        let data =
            noise(n as usize, seed).into_iter().flat_map(|b| ((b as f32 - 128.0) / 256.0).to_le_bytes()).collect();
        TestTensor { name: name.into(), dims: dims.to_vec(), type_id: 0, data }
    }

    /// A complete one-layer llama GGUF (hidden 32, 4 heads of 8, 2 kv heads, vocab 6) with a
    /// byte-level BPE tokenizer, F32, F16 and Q8_0 tensors: small enough to mutate thousands
    /// of times a second, complete enough that parse, config, tokenizer and load all succeed.
    pub fn gguf() -> Vec<u8> {
        gguf_with(&[])
    }

    /// [`gguf`] with the metadata values of `set` in place of the seed's (or added).
    pub fn gguf_with(set: &[(&str, GgufValue)]) -> Vec<u8> {
        let tokens = ["a", "b", "ab", "Ġ", "<|im_start|>", "Ġab"];
        let mut kvs = vec![
            ("general.architecture", GgufValue::Str("llama".into())),
            ("llama.embedding_length", GgufValue::U32(32)),
            ("llama.block_count", GgufValue::U32(1)),
            ("llama.attention.head_count", GgufValue::U32(4)),
            ("llama.attention.head_count_kv", GgufValue::U32(2)),
            ("llama.feed_forward_length", GgufValue::U32(32)),
            ("llama.context_length", GgufValue::U32(128)),
            ("llama.rope.dimension_count", GgufValue::U32(8)),
            ("llama.rope.freq_base", GgufValue::F32(10000.0)),
            ("llama.attention.layer_norm_rms_epsilon", GgufValue::F32(1e-5)),
            ("tokenizer.ggml.model", GgufValue::Str("gpt2".into())),
            ("tokenizer.ggml.pre", GgufValue::Str("gpt2".into())),
            ("tokenizer.ggml.tokens", GgufValue::Array(tokens.iter().map(|t| GgufValue::Str(t.to_string())).collect())),
            (
                "tokenizer.ggml.merges",
                GgufValue::Array(vec![GgufValue::Str("a b".into()), GgufValue::Str("Ġ ab".into())]),
            ),
            (
                "tokenizer.ggml.token_type",
                GgufValue::Array([1, 1, 1, 1, 3, 1].iter().map(|&t| GgufValue::I32(t)).collect()),
            ),
        ];
        for (k, v) in set {
            match kvs.iter_mut().find(|(key, _)| key == k) {
                Some(kv) => kv.1 = v.clone(),
                None => kvs.push((k, v.clone())),
            }
        }
        // Q8_0: 32-element blocks of an f16 scale (0.01) and 32 signed bytes.
        let q8_0 = |name: &str, dims: &[u64], seed: u64| {
            let blocks = (dims.iter().product::<u64>() / 32) as usize;
            let mut data = Vec::with_capacity(blocks * 34);
            for (b, q) in noise(blocks * 32, seed).chunks(32).enumerate() {
                data.extend(half::f16::from_f32(0.01 + b as f32 * 1e-4).to_le_bytes());
                data.extend(q);
            }
            TestTensor { name: name.into(), dims: dims.to_vec(), type_id: 8, data }
        };
        let f16 = |name: &str, dims: &[u64], seed: u64| {
            let mut t = f32_noise(name, dims, seed);
            t.data = t
                .data
                .chunks(4)
                .flat_map(|c| half::f16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]])).to_le_bytes())
                .collect();
            t.type_id = 1;
            t
        };
        let tensors = [
            f32_noise("token_embd.weight", &[32, 6], 1),
            f32_noise("output_norm.weight", &[32], 2),
            f32_noise("blk.0.attn_norm.weight", &[32], 3),
            f32_noise("blk.0.attn_q.weight", &[32, 32], 4),
            f32_noise("blk.0.attn_k.weight", &[32, 16], 5),
            f32_noise("blk.0.attn_v.weight", &[32, 16], 6),
            f16("blk.0.attn_output.weight", &[32, 32], 7),
            f32_noise("blk.0.ffn_norm.weight", &[32], 8),
            q8_0("blk.0.ffn_gate.weight", &[32, 32], 9),
            q8_0("blk.0.ffn_up.weight", &[32, 32], 10),
            q8_0("blk.0.ffn_down.weight", &[32, 32], 11),
        ];
        gguf_bytes(&kvs, &tensors)
    }

    /// A safetensors file with F32, BF16, F16 and I64 tensors (written by the `safetensors`
    /// crate itself, so it is the reference layout).
    pub fn safetensors() -> Vec<u8> {
        use safetensors::tensor::TensorView;
        use safetensors::Dtype;
        let f32s = noise(16 * 4, 1);
        let halves = noise(8 * 2, 2);
        let ints = noise(2 * 8, 3);
        let views = vec![
            ("model.embed_tokens.weight".to_string(), TensorView::new(Dtype::F32, vec![4, 4], &f32s).expect("view")),
            ("model.norm.weight".to_string(), TensorView::new(Dtype::BF16, vec![8], &halves).expect("view")),
            ("lm_head.weight".to_string(), TensorView::new(Dtype::F16, vec![2, 4], &halves).expect("view")),
            ("position_ids".to_string(), TensorView::new(Dtype::I64, vec![2], &ints).expect("view")),
        ];
        safetensors::serialize(views, None).expect("serialize")
    }

    /// A valid config.json of each architecture family.
    pub fn hf_configs() -> Vec<Vec<u8>> {
        let dense = r#"{"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2, "vocab_size": 100,
            "intermediate_size": 96, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "max_position_embeddings": 4096, "tie_word_embeddings": true}"#;
        let moe = r#"{"model_type": "qwen2_moe", "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_hidden_layers": 4, "vocab_size": 100,
            "intermediate_size": 96, "num_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48,
            "decoder_sparse_step": 2, "mlp_only_layers": [3], "partial_rotary_factor": 0.5,
            "rope_scaling": {"rope_type": "default", "rope_theta": 10000.0}}"#;
        let llama = r#"{"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4,
            "num_hidden_layers": 1, "vocab_size": 10, "intermediate_size": 64,
            "attention_bias": true, "rope_theta": 10000}"#;
        let llama31 = r#"{"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4,
            "num_hidden_layers": 1, "vocab_size": 10, "intermediate_size": 64, "hidden_act": "silu",
            "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}"#;
        let windowed = r#"{"model_type": "mistral", "hidden_size": 32, "num_attention_heads": 4,
            "num_hidden_layers": 2, "vocab_size": 10, "intermediate_size": 64, "sliding_window": 64,
            "layer_types": ["full_attention", "sliding_attention"],
            "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}"#;
        let yarn = r#"{"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16,
            "num_hidden_layers": 1, "vocab_size": 10, "intermediate_size": 64, "max_position_embeddings": 131072,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
            "beta_fast": 32, "beta_slow": 1, "truncate": true, "mscale": 1.0, "mscale_all_dim": 0.5}}"#;
        let dynamic = r#"{"model_type": "qwen2", "hidden_size": 32, "num_attention_heads": 4,
            "num_hidden_layers": 1, "vocab_size": 10, "intermediate_size": 64, "max_position_embeddings": 2048,
            "rope_scaling": {"type": "dynamic", "factor": 2.0}}"#;
        let nested = r#"{"model_type": "qwen2", "hidden_size": 32, "num_attention_heads": 4,
            "num_hidden_layers": 2, "vocab_size": 10, "intermediate_size": 64,
            "layer_types": ["full_attention", "full_attention"],
            "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}}"#;
        vec![dense, moe, llama, llama31, windowed, yarn, dynamic, nested].into_iter().map(Vec::from).collect()
    }

    /// Valid request bodies of every route: score, rerank, TEI rerank, vLLM score.
    pub fn request_json() -> Vec<Vec<u8>> {
        [
            r#"{"query": "what is rust", "items": ["a systems language", "a fungus"]}"#,
            r#"{"query": "q", "items": [{"text": "t", "id": "x1"}, "plain"], "instruction": "Judge", "deadline_ms": 500}"#,
            r#"{"query": "q", "documents": ["d1", {"text": "d2"}], "top_n": 1, "return_documents": true, "model": "m"}"#,
            r#"{"query": "\u00e9t\u00e9 \ud83d\ude00", "items": ["\n\tx", "x"], "deadline_ms": 1}"#,
            r#"{"query": "q", "texts": ["a", "b"], "return_text": true, "truncate": false, "truncation_direction": "Left"}"#,
            r#"{"model": "m", "text_1": ["q", "q"], "text_2": ["a", "b"]}"#,
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect()
    }

    /// Ordinary and odd text for the tokenizer: empty, whitespace runs, control characters,
    /// mixed scripts, emoji with joiners, combining marks, special-token lookalikes, long runs.
    pub fn texts() -> Vec<String> {
        let mut v: Vec<String> = [
            "",
            "what is the capital of France?",
            "   \t\n\r\n  ",
            "\u{0}\u{1}\u{7f}\u{1b}[31mred\u{1b}[0m",
            "日本語のテキスト and English, русский текст, العربية, हिन्दी",
            "👩‍👩‍👧‍👦 🏳️‍🌈 e\u{301}\u{302}\u{303}",
            "<|im_start|>system\n<|im_end|><think>\n\n</think>",
            "\u{feff}\u{200b}\u{2028}\u{2029}\u{fffd}",
            "'s 't 're 've 'm 'll 'd 'S 'T",
            "1234567890 3.14159 0x7fffffff",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.push("a".repeat(20_000));
        v.push("ab ".repeat(5_000));
        v.push("\u{10ffff}".repeat(2_000));
        v
    }
}

/// A small deterministic mutator in the spirit of libFuzzer's: bit flips, interesting values
/// (0, 1, powers of two, all ones, lengths of the input) written over bytes and over 4- and
/// 8-byte little-endian fields, truncation, erased / duplicated / inserted ranges.
pub struct Mutator(u64);

impl Mutator {
    pub fn new(seed: u64) -> Self {
        Mutator(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    /// xorshift64*.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform-ish in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    fn interesting(&mut self, len: usize) -> u64 {
        const VALUES: [u64; 14] = [
            0,
            1,
            2,
            0x7f,
            0xff,
            0xffff,
            0x7fff_ffff,
            0xffff_ffff,
            1 << 28,
            1 << 32,
            1 << 40,
            i64::MAX as u64,
            u64::MAX,
            u64::MAX - 1,
        ];
        match self.below(VALUES.len() + 2) {
            i if i < VALUES.len() => VALUES[i],
            i if i == VALUES.len() => len as u64,
            _ => self.below(len.max(1) + 8) as u64,
        }
    }

    /// One to four mutations of `seed`.
    pub fn mutate(&mut self, seed: &[u8]) -> Vec<u8> {
        let mut d = seed.to_vec();
        for _ in 0..1 + self.below(4) {
            let len = d.len();
            match self.below(9) {
                0 if len > 0 => {
                    let i = self.below(len);
                    d[i] ^= 1 << self.below(8);
                }
                1 if len > 0 => {
                    let i = self.below(len);
                    d[i] = self.interesting(len) as u8;
                }
                2 if len >= 4 => {
                    let i = self.below(len - 3);
                    let v = self.interesting(len) as u32;
                    d[i..i + 4].copy_from_slice(&v.to_le_bytes());
                }
                3 if len >= 8 => {
                    let i = self.below(len - 7);
                    let v = self.interesting(len);
                    d[i..i + 8].copy_from_slice(&v.to_le_bytes());
                }
                4 => d.truncate(self.below(len + 1)),
                5 if len > 0 => {
                    let i = self.below(len);
                    let n = self.below((len - i).min(64) + 1);
                    d.drain(i..i + n);
                }
                6 if len > 0 => {
                    let i = self.below(len);
                    let n = self.below((len - i).min(64) + 1);
                    let chunk = d[i..i + n].to_vec();
                    let at = self.below(len + 1);
                    d.splice(at..at, chunk);
                }
                7 => {
                    let at = self.below(len + 1);
                    let n = self.below(16) + 1;
                    let ins = self.bytes(n);
                    d.splice(at..at, ins);
                }
                _ if len > 0 => {
                    // A byte of the input copied elsewhere (keeps the input's own vocabulary:
                    // quotes, braces, digits in JSON; type ids and lengths in binary headers).
                    let (from, to) = (self.below(len), self.below(len));
                    d[to] = d[from];
                }
                _ => d.push(self.next_u64() as u8),
            }
        }
        d
    }
}

/// A structured GGUF from `arbitrary` input: the header fields stay well-formed while the
/// values vary, so the fuzzer reaches the config, tensor and tokenizer code rather than
/// stopping at the magic. Keys and tensor names are mostly the ones the readers look for.
pub fn arbitrary_gguf(u: &mut Unstructured<'_>) -> arbitrary::Result<Vec<u8>> {
    const ARCHS: [&str; 6] = ["llama", "qwen2", "qwen3", "qwen3moe", "qwen2moe", "gpt9"];
    const SUFFIXES: [&str; 23] = [
        "embedding_length",
        "block_count",
        "attention.head_count",
        "attention.head_count_kv",
        "attention.key_length",
        "feed_forward_length",
        "context_length",
        "rope.dimension_count",
        "rope.freq_base",
        "attention.layer_norm_rms_epsilon",
        "vocab_size",
        "expert_count",
        "expert_used_count",
        "expert_feed_forward_length",
        "expert_shared_feed_forward_length",
        "expert_weights_scale",
        "rope.scaling.type",
        "rope.scaling.factor",
        "rope.scaling.original_context_length",
        "rope.scaling.yarn_beta_fast",
        "rope.scaling.attn_factor",
        "rope.scale_linear",
        "attention.sliding_window",
    ];
    const TENSORS: [&str; 11] = [
        "token_embd.weight",
        "output.weight",
        "output_norm.weight",
        "blk.0.attn_q.weight",
        "blk.0.ffn_up_exps.weight",
        "blk.0.attn_q.bias",
        "blk.1.ffn_gate_exps.weight",
        "blk.0.ffn_gate_inp.weight",
        "blk.0.ffn_down_exps.weight",
        "blk.0.ffn_gate_inp_shexp.weight",
        "x",
    ];
    let arch = *u.choose(&ARCHS)?;
    let mut kvs: Vec<(String, GgufValue)> = vec![("general.architecture".into(), GgufValue::Str(arch.into()))];
    for _ in 0..u.int_in_range(0..=12)? {
        let key = if u.ratio(7, 8)? { format!("{arch}.{}", u.choose(&SUFFIXES)?) } else { u.arbitrary::<String>()? };
        let value = match u.int_in_range(0..=9)? {
            0 => GgufValue::U32(u.arbitrary()?),
            1 => GgufValue::U32(u.int_in_range(0..=64)?),
            2 => GgufValue::F32(u.arbitrary()?),
            3 => GgufValue::F32(*u.choose(&[f32::NAN, f32::INFINITY, -1.0, 0.0, 1e-6, 1e4])?),
            4 => GgufValue::U64(u.arbitrary()?),
            5 => GgufValue::I32(u.arbitrary()?),
            6 if u.arbitrary()? => GgufValue::Str(u.choose(&["yarn", "linear", "none", "longrope"])?.to_string()),
            6 => GgufValue::Str(u.arbitrary()?),
            7 => GgufValue::Bool(u.arbitrary()?),
            8 => GgufValue::F64(u.arbitrary()?),
            _ => GgufValue::Array(
                (0..u.int_in_range(0..=8)?)
                    .map(|_| u.arbitrary().map(GgufValue::U8))
                    .collect::<arbitrary::Result<_>>()?,
            ),
        };
        kvs.push((key, value));
    }
    let mut tensors = Vec::new();
    for _ in 0..u.int_in_range(0..=4)? {
        let name = if u.ratio(7, 8)? { u.choose(&TENSORS)?.to_string() } else { u.arbitrary()? };
        let n_dims = u.int_in_range(1..=3)?;
        let dims: Vec<u64> = (0..n_dims)
            .map(|_| if u.ratio(1, 16)? { u.arbitrary() } else { u.int_in_range(0..=40) })
            .collect::<arbitrary::Result<_>>()?;
        let type_id = *u.choose(&[0u32, 1, 8, 12, 14, 30, 99])?;
        // Data of the right size when it is small, else a few random bytes.
        let n = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d)).unwrap_or(u64::MAX);
        let len = if n <= 4096 && u.ratio(3, 4)? { n as usize * 4 } else { u.int_in_range(0..=64)? };
        let data = u.bytes(len.min(u.len()))?.to_vec();
        tensors.push(TestTensor { name, dims, type_id, data });
    }
    let kv_refs: Vec<(&str, GgufValue)> = kvs.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    Ok(gguf_bytes(&kv_refs, &tensors))
}
