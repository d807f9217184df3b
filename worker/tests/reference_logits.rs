//! Our forward pass against independent implementations: last-token logits of SmolLM2 (the Q4_1
//! GGUF) and of tiny generated qwen3 / qwen2 / llama checkpoints, as computed by HF transformers
//! in float32 (fixtures written by scripts/reference/model_logits.py, cross-checked there against
//! a float64 numpy forward).
//!
//! Tolerance: |ours − reference| ≤ 2e-4 on SmolLM2 (30 layers, logits up to ~25; measured max
//! 4.2e-5), ≤ 5e-5 on the 2-layer tiny models (measured max 1e-5). The score head's folded
//! yes − no logit is held to the same bound (×2, it is a difference of two logits).

use std::path::{Path, PathBuf};

use serde_json::Value;
use sieve_kernels::{Backend, CpuBackend};
use sieve_worker::assets;
use sieve_worker::engine::layout::LayoutBuilder;
use sieve_worker::model::loader::{self, LoadOptions, LoadedModel};
use sieve_worker::model::testgen::{self, Preset, StoreDType, TestArch, TestModelSpec};
use sieve_worker::model::Scratch;

fn fixture(name: &str) -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

fn asset(rel: &str) -> PathBuf {
    let p = assets::cache_dir().join(rel);
    assert!(p.is_file(), "{} is missing: run scripts/fetch-assets (scripts/test does)", p.display());
    p
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Last-token logits and the score head's yes−no logit for one prompt.
fn last_logits(m: &LoadedModel<CpuBackend>, b: &CpuBackend, prompt: &[u32]) -> (Vec<f32>, f32) {
    let c = &m.model.config;
    let mut kv = b.kv_cache(c.n_layers, prompt.len(), c.n_kv_heads, c.head_dim).unwrap();
    let slots: Vec<u32> = (0..prompt.len() as u32).collect();
    let mut lb = LayoutBuilder::new();
    let row = lb.push(prompt, &slots).unwrap();
    let mut scratch = Scratch::new(b).unwrap();
    let h = m.model.forward(b, &lb.finish(), &mut kv, &[row], None, &mut scratch).unwrap();
    let head = m.model.head.logits(b, h).unwrap()[0];
    (m.model.logits(b, h).unwrap(), head)
}

/// Compares the reference's top-20 and chosen ids; returns the largest error seen.
fn compare(what: &str, ours: &[f32], reference: &Value, abs: f32, rel: f32) -> f32 {
    let mut worst = 0f32;
    let mut check = |id: usize, want: f32| {
        let got = ours[id];
        let err = (got - want).abs();
        worst = worst.max(err);
        assert!(err <= abs + rel * want.abs(), "{what}: logit[{id}] = {got}, reference {want} (err {err})");
    };
    for pair in reference["top"].as_array().unwrap() {
        check(pair[0].as_u64().unwrap() as usize, pair[1].as_f64().unwrap() as f32);
    }
    for (id, v) in reference["chosen"].as_object().unwrap() {
        check(id.parse().unwrap(), v.as_f64().unwrap() as f32);
    }
    let best = (0..ours.len()).max_by(|&a, &b| ours[a].total_cmp(&ours[b])).unwrap();
    assert_eq!(best as u64, reference["top"][0][0].as_u64().unwrap(), "{what}: argmax");
    worst
}

#[test]
fn smollm2_logits_match_transformers() {
    let f = fixture("smollm2_logits.json");
    let b = CpuBackend::new(0).unwrap();
    let m = loader::load(&b, &asset(assets::DEFAULT_MODEL), &LoadOptions { keep_lm_head: true, ..Default::default() }).unwrap();
    let (yes, no) = (f["token_ids"]["yes"].as_u64().unwrap() as usize, f["token_ids"]["no"].as_u64().unwrap() as usize);
    for p in f["prompts"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let (logits, head) = last_logits(&m, &b, &ids(&p["ids"]));
        let worst = compare(name, &logits, p, 2e-4, 0.0);
        // The folded score head is the same difference, computed as one dot product.
        let want = (p["chosen"][yes.to_string()].as_f64().unwrap() - p["chosen"][no.to_string()].as_f64().unwrap()) as f32;
        assert!((head - want).abs() <= 4e-4, "{name}: score head {head} vs l_yes − l_no {want}");
        assert!((head - (logits[yes] - logits[no])).abs() <= 1e-4, "{name}: folded head vs our own logits");
        eprintln!("smollm2 {name}: max |err| {worst:.2e}");
    }
}

fn tiny_dense(arch: &str) {
    let f = fixture("testmodel_logits.json");
    let entry = f["models"].as_array().unwrap().iter().find(|m| m["arch"] == arch).unwrap();
    let g = &entry["generate"];
    let spec = TestModelSpec::preset(
        g["arch"].as_str().unwrap().parse::<TestArch>().unwrap(),
        g["preset"].as_str().unwrap().parse::<Preset>().unwrap(),
        g["seed"].as_u64().unwrap(),
        g["dtype"].as_str().unwrap().parse::<StoreDType>().unwrap(),
    );
    let dir = std::env::temp_dir().join(format!("sieve-reflogits-{arch}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    testgen::generate(&spec, &dir, &asset(assets::QWEN3_TOKENIZER)).unwrap();
    let b = CpuBackend::new(0).unwrap();
    let m = loader::load(&b, &dir, &LoadOptions { keep_lm_head: true, ..Default::default() }).unwrap();
    for p in entry["prompts"].as_array().unwrap() {
        let name = format!("{arch}/{}", p["name"].as_str().unwrap());
        let (logits, head) = last_logits(&m, &b, &ids(&p["ids"]));
        let worst = compare(&name, &logits, p, 5e-5, 0.0);
        let want = (p["chosen"]["9693"].as_f64().unwrap() - p["chosen"]["2152"].as_f64().unwrap()) as f32;
        assert!((head - want).abs() <= 1e-4, "{name}: score head {head} vs {want}");
        eprintln!("{name}: max |err| {worst:.2e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tiny_qwen3_logits_match_transformers() {
    tiny_dense("qwen3");
}

#[test]
fn tiny_qwen2_logits_match_transformers() {
    tiny_dense("qwen2");
}

#[test]
fn tiny_llama_logits_match_transformers() {
    tiny_dense("llama");
}
