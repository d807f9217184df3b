//! Our forward pass against independent implementations: last-token logits of SmolLM2 (the Q4_1
//! GGUF) and of tiny generated qwen3 / qwen2 / llama checkpoints, as computed by HF transformers
//! in float32 (fixtures written by scripts/reference/model_logits.py, cross-checked there against
//! a float64 numpy forward).
//!
//! Tolerance: |ours − reference| ≤ 2e-4 on SmolLM2 (30 layers, logits up to ~25; measured max
//! 4.2e-5), ≤ 5e-5 on the 2-layer tiny models (measured max 1e-5), and on the 4-layer tiny
//! MoE models (qwen3_moe bf16 top-8 of 32, qwen2_moe f32 top-4 of 32 + shared expert; measured
//! max 1.3e-5). The score head's folded
//! yes − no logit is held to the same bound (×2, it is a difference of two logits).
//!
//! The MoE models are run with every grouped-GEMM variant of the CPU backend: the logits must be
//! bitwise identical whichever variant runs (and match transformers, whose routing the fixture's
//! near-tie gaps show a float32 router cannot flip).

use std::path::{Path, PathBuf};

use serde_json::Value;
use sieve_kernels::{Backend, CpuBackend};
use sieve_worker::assets;
use sieve_worker::engine::layout::LayoutBuilder;
use sieve_worker::model::loader::{self, LoadOptions, LoadedModel};
use sieve_worker::model::testgen::{self, Preset, StoreDType, TestArch, TestModelSpec};
use sieve_worker::model::{MoePolicy, Scratch};

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
    let m = loader::load(&b, &asset(assets::DEFAULT_MODEL), &LoadOptions { keep_lm_head: true, ..Default::default() })
        .unwrap();
    let (yes, no) = (f["token_ids"]["yes"].as_u64().unwrap() as usize, f["token_ids"]["no"].as_u64().unwrap() as usize);
    for p in f["prompts"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let (logits, head) = last_logits(&m, &b, &ids(&p["ids"]));
        let worst = compare(name, &logits, p, 2e-4, 0.0);
        // The folded score head is the same difference, computed as one dot product.
        let want =
            (p["chosen"][yes.to_string()].as_f64().unwrap() - p["chosen"][no.to_string()].as_f64().unwrap()) as f32;
        assert!((head - want).abs() <= 4e-4, "{name}: score head {head} vs l_yes − l_no {want}");
        assert!((head - (logits[yes] - logits[no])).abs() <= 1e-4, "{name}: folded head vs our own logits");
        eprintln!("smollm2 {name}: max |err| {worst:.2e}");
    }
}

fn tiny_dense(arch: &str) {
    tiny_model(arch, 5e-5);
}

/// Generates the fixture's checkpoint for `arch`, checks every prompt's logits against
/// transformers within `tol`; for MoE models, under every fixed variant and the auto policy,
/// requiring bitwise equal logits. Returns the largest error seen.
fn tiny_model(arch: &str, tol: f32) -> f32 {
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
    let mut m = loader::load(&b, &dir, &LoadOptions { keep_lm_head: true, ..Default::default() }).unwrap();
    let is_moe = m.model.config.moe.is_some();
    assert_eq!(is_moe, arch.ends_with("_moe"));
    let mut policies = vec![("default", m.model.moe_policy().clone())];
    if is_moe {
        for (i, v) in b.moe_variants().iter().enumerate() {
            policies.push((v.name, MoePolicy::Fixed(i)));
        }
    }
    let mut worst = 0f32;
    for p in entry["prompts"].as_array().unwrap() {
        let name = format!("{arch}/{}", p["name"].as_str().unwrap());
        let mut first: Option<(Vec<f32>, f32)> = None;
        for (policy_name, policy) in &policies {
            m.model.set_moe_policy(&b, policy.clone()).unwrap();
            let (logits, head) = last_logits(&m, &b, &ids(&p["ids"]));
            let err = compare(&format!("{name} [{policy_name}]"), &logits, p, tol, 0.0);
            worst = worst.max(err);
            let want = (p["chosen"]["9693"].as_f64().unwrap() - p["chosen"]["2152"].as_f64().unwrap()) as f32;
            assert!((head - want).abs() <= 2.0 * tol, "{name} [{policy_name}]: score head {head} vs {want}");
            match &first {
                None => first = Some((logits, head)),
                Some((l0, h0)) => {
                    assert!(
                        l0.iter().zip(&logits).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{name}: logits under {policy_name} differ from {}",
                        policies[0].0
                    );
                    assert_eq!(h0.to_bits(), head.to_bits(), "{name}: score head under {policy_name}");
                }
            }
        }
        eprintln!("{name}: max |err| {worst:.2e} ({} policies)", policies.len());
    }
    let _ = std::fs::remove_dir_all(&dir);
    worst
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

#[test]
fn tiny_qwen3_moe_logits_match_transformers_under_every_variant() {
    tiny_model("qwen3_moe", 5e-5);
}

#[test]
fn tiny_qwen2_moe_logits_match_transformers_under_every_variant() {
    tiny_model("qwen2_moe", 5e-5);
}
