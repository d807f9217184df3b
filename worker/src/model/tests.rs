//! Forward-pass properties on a small random model: prefix sharing and batch composition must
//! not change a sequence's result.

use sieve_kernels::reference::ReferenceBackend;
use sieve_kernels::{Backend, RopeConfig, RopeLayout};

use super::source::{MemorySource, WeightSource};
use super::*;
use crate::engine::layout::{segment_slots, LayoutBuilder};

/// xorshift64*: a tiny deterministic generator for test weights.
pub(crate) struct Rng(u64);
impl Rng {
    pub(crate) fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub(crate) fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next_f32() * scale).collect()
    }
}

pub(crate) fn tiny_config(arch: Arch) -> ModelConfig {
    ModelConfig {
        arch,
        hidden: 48,
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 12,
        intermediate: 80,
        vocab: 97,
        rms_eps: 1e-6,
        rope: RopeConfig {
            theta: 10_000.0,
            rotary_dim: 12,
            layout: RopeLayout::HalfSplit,
            scaling: Default::default(),
        },
        max_position: 512,
        attention_window: None,
        tie_embeddings: true,
        qkv_bias: arch == Arch::Qwen2,
        o_bias: false,
        qk_norm: arch == Arch::Qwen3,
        moe: None,
    }
}

pub(crate) fn random_source(c: &ModelConfig, seed: u64) -> MemorySource {
    let mut r = Rng(seed | 1);
    let mut s = MemorySource::default();
    let (h, l) = (c.hidden, c.qkv_layout());
    s.insert("model.embed_tokens.weight", r.vec(c.vocab * h, 1.0), vec![c.vocab, h]);
    s.insert("model.norm.weight", r.vec(h, 0.2).iter().map(|x| 1.0 + x).collect(), vec![h]);
    for i in 0..c.n_layers {
        let p = format!("model.layers.{i}");
        let sc = 1.0 / (h as f32).sqrt();
        for (n, rows) in [("q", l.q_dim()), ("k", l.kv_dim()), ("v", l.kv_dim())] {
            s.insert(format!("{p}.self_attn.{n}_proj.weight"), r.vec(rows * h, sc), vec![rows, h]);
            if c.qkv_bias {
                s.insert(format!("{p}.self_attn.{n}_proj.bias"), r.vec(rows, 0.1), vec![rows]);
            }
        }
        if c.qk_norm {
            for n in ["q_norm", "k_norm"] {
                s.insert(
                    format!("{p}.self_attn.{n}.weight"),
                    r.vec(l.head_dim, 0.2).iter().map(|x| 1.0 + x).collect(),
                    vec![l.head_dim],
                );
            }
        }
        s.insert(format!("{p}.self_attn.o_proj.weight"), r.vec(h * l.q_dim(), sc), vec![h, l.q_dim()]);
        for n in ["input_layernorm", "post_attention_layernorm"] {
            s.insert(format!("{p}.{n}.weight"), r.vec(h, 0.2).iter().map(|x| 1.0 + x).collect(), vec![h]);
        }
        match &c.moe {
            Some(m) if m.is_sparse_layer(i) => {
                let (e, im) = (m.num_experts, m.expert_intermediate);
                s.insert(format!("{p}.mlp.gate.weight"), r.vec(e * h, 2.0 * sc), vec![e, h]);
                for x in 0..e {
                    swiglu(&mut s, &mut r, &format!("{p}.mlp.experts.{x}"), h, im, sc);
                }
                if m.shared_expert_intermediate > 0 {
                    swiglu(&mut s, &mut r, &format!("{p}.mlp.shared_expert"), h, m.shared_expert_intermediate, sc);
                    s.insert(format!("{p}.mlp.shared_expert_gate.weight"), r.vec(h, sc), vec![1, h]);
                }
            }
            _ => swiglu(&mut s, &mut r, &format!("{p}.mlp"), h, c.intermediate, sc),
        }
    }
    s
}

/// A SwiGLU MLP's three projections under `p` (width `im`), drawn in the order gate, up, down.
fn swiglu(s: &mut MemorySource, r: &mut Rng, p: &str, h: usize, im: usize, sc: f32) {
    s.insert(format!("{p}.gate_proj.weight"), r.vec(im * h, sc), vec![im, h]);
    s.insert(format!("{p}.up_proj.weight"), r.vec(im * h, sc), vec![im, h]);
    s.insert(format!("{p}.down_proj.weight"), r.vec(h * im, 1.0 / (im as f32).sqrt()), vec![h, im]);
}

/// A tiny MoE config: 3 layers, the middle one dense (`mlp_only_layers`), 12 experts.
pub(crate) fn tiny_moe_config(arch: Arch) -> ModelConfig {
    let base = if arch == Arch::Qwen3Moe { Arch::Qwen3 } else { Arch::Qwen2 };
    ModelConfig {
        arch,
        n_layers: 3,
        moe: Some(MoeConfig {
            num_experts: 12,
            top_k: if arch == Arch::Qwen3Moe { 4 } else { 2 },
            expert_intermediate: 40,
            norm_topk_prob: arch == Arch::Qwen3Moe,
            shared_expert_intermediate: if arch == Arch::Qwen2Moe { 56 } else { 0 },
            dense_layers: vec![1],
            sparse_step: 1,
        }),
        ..tiny_config(base)
    }
}

fn tokens(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut r = Rng(seed | 1);
    (0..n).map(|_| ((r.next_f32() + 1.0) * 0.5 * vocab as f32) as u32 % vocab as u32).collect()
}

/// Scores each prompt alone (one full sequence per pass).
fn scores_alone<B: Backend>(b: &B, m: &Model<B>, prompts: &[Vec<u32>]) -> Vec<f32> {
    let c = &m.config;
    prompts
        .iter()
        .map(|p| {
            let mut cache = b.kv_cache(c.n_layers, 1024, c.n_kv_heads, c.head_dim).unwrap();
            let slots: Vec<u32> = (0..p.len() as u32).map(|s| s + 100).collect();
            let mut lb = LayoutBuilder::new();
            let row = lb.push(p, &slots).unwrap();
            let mut scratch = Scratch::new(b).unwrap();
            let h = m.forward(b, &lb.finish(), &mut cache, &[row], None, &mut scratch).unwrap();
            m.head.logits(b, h).unwrap()[0]
        })
        .collect()
}

/// Scores prompts that share their first `prefix` tokens in one pass: the prefix once, each
/// item's own tokens attending over the prefix slots. Blocks are scattered on purpose.
fn scores_shared<B: Backend>(b: &B, m: &Model<B>, prompts: &[Vec<u32>], prefix: usize, block: usize) -> Vec<f32> {
    let c = &m.config;
    let mut cache = b.kv_cache(c.n_layers, 4096, c.n_kv_heads, c.head_dim).unwrap();
    let mut next_block = 3u32;
    let mut alloc = |n: usize| -> Vec<u32> {
        (0..n.div_ceil(block))
            .map(|_| {
                next_block += 2;
                next_block
            })
            .collect()
    };
    let pblocks = alloc(prefix);
    let pslots: Vec<u32> = segment_slots(&pblocks, block, prefix).collect();
    let mut lb = LayoutBuilder::new();
    lb.push(&prompts[0][..prefix], &pslots);
    let mut rows = vec![];
    for p in prompts {
        let own = &p[prefix..];
        let oblocks = alloc(own.len());
        let ctx: Vec<u32> = pslots.iter().copied().chain(segment_slots(&oblocks, block, own.len())).collect();
        rows.push(lb.push(own, &ctx).unwrap());
    }
    let mut scratch = Scratch::new(b).unwrap();
    let h = m.forward(b, &lb.finish(), &mut cache, &rows, None, &mut scratch).unwrap();
    m.head.logits(b, h).unwrap()
}

#[test]
fn prefix_sharing_and_batching_do_not_change_scores() {
    let b = ReferenceBackend;
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3] {
        let c = tiny_config(arch);
        let src = random_source(&c, 7);
        let m = Model::load(&b, &src, c.clone(), HeadSpec::YesNo { yes: 5, no: 9 }, false).unwrap();
        for prefix in [1usize, 3, 4, 5, 9] {
            let base = tokens(prefix as u64, prefix, c.vocab);
            let prompts: Vec<Vec<u32>> = (0..4)
                .map(|i| base.iter().copied().chain(tokens(99 + i as u64, 1 + 3 * i, c.vocab)).collect())
                .collect();
            let alone = scores_alone(&b, &m, &prompts);
            let shared = scores_shared(&b, &m, &prompts, prefix, 4);
            assert_eq!(alone, shared, "{arch:?} prefix {prefix}");
            let mut rev = prompts.clone();
            rev.reverse();
            let mut shared_rev = scores_shared(&b, &m, &rev, prefix, 4);
            shared_rev.reverse();
            assert_eq!(alone, shared_rev, "{arch:?} prefix {prefix}, reversed batch");
        }
    }
}

#[test]
fn moe_scores_do_not_depend_on_batch_prefix_sharing_or_variant() {
    use sieve_kernels::CpuBackend;
    let cpu = CpuBackend::new(2).unwrap();
    let r = ReferenceBackend;
    for arch in [Arch::Qwen3Moe, Arch::Qwen2Moe] {
        let c = tiny_moe_config(arch);
        let src = random_source(&c, 11);
        let mut m = Model::load(&cpu, &src, c.clone(), HeadSpec::YesNo { yes: 5, no: 9 }, false).unwrap();
        assert_eq!(m.moe_layers().count(), 2, "layer 1 is dense (mlp_only_layers)");
        let oracle = Model::load(&r, &src, c.clone(), HeadSpec::YesNo { yes: 5, no: 9 }, false).unwrap();
        let prefix = 5;
        let base = tokens(3, prefix, c.vocab);
        let prompts: Vec<Vec<u32>> =
            (0..6).map(|i| base.iter().copied().chain(tokens(50 + i as u64, 2 + 5 * i, c.vocab)).collect()).collect();
        let want = scores_alone(&r, &oracle, &prompts);
        let mut policies = vec![m.moe_policy().clone()];
        policies.extend((0..cpu.moe_variants().len()).map(MoePolicy::Fixed));
        let mut first: Option<Vec<f32>> = None;
        for policy in policies {
            m.set_moe_policy(&cpu, policy.clone()).unwrap();
            let alone = scores_alone(&cpu, &m, &prompts);
            let shared = scores_shared(&cpu, &m, &prompts, prefix, 4);
            let mut rev = prompts.clone();
            rev.reverse();
            let mut shared_rev = scores_shared(&cpu, &m, &rev, prefix, 4);
            shared_rev.reverse();
            assert_eq!(alone, shared, "{arch:?} {policy:?}: prefix sharing");
            assert_eq!(alone, shared_rev, "{arch:?} {policy:?}: batch order");
            match &first {
                None => first = Some(alone.clone()),
                Some(f) => assert_eq!(f, &alone, "{arch:?}: {policy:?} changes a score"),
            }
            for (a, w) in alone.iter().zip(&want) {
                assert!((a - w).abs() <= 1e-4 * w.abs().max(1.0), "{arch:?} {policy:?}: cpu {a} vs reference {w}");
            }
        }
        // The MoE record of the last pass: one entry per MoE layer.
        let mut scratch = Scratch::new(&cpu).unwrap();
        let mut cache = cpu.kv_cache(c.n_layers, 64, c.n_kv_heads, c.head_dim).unwrap();
        let mut lb = LayoutBuilder::new();
        let row = lb.push(&prompts[2], &(0..prompts[2].len() as u32).collect::<Vec<_>>()).unwrap();
        m.forward(&cpu, &lb.finish(), &mut cache, &[row], None, &mut scratch).unwrap();
        let layers = &scratch.moe.pass.layers;
        assert_eq!(layers.len(), 2);
        let k = c.moe.as_ref().unwrap().top_k as u64;
        assert_eq!(layers[0].rows, prompts[2].len() as u64 * k);
        assert_eq!(layers[1].rows, k, "the last layer runs the scored row only");
        assert!(scratch.moe.pass.moe_time > std::time::Duration::ZERO);
    }
}

#[test]
fn moe_policies_are_checked_against_the_backend() {
    use sieve_kernels::CpuBackend;
    let cpu = CpuBackend::new(1).unwrap();
    let c = tiny_moe_config(Arch::Qwen3Moe);
    let mut m = Model::load(&cpu, &random_source(&c, 3), c, HeadSpec::YesNo { yes: 5, no: 9 }, false).unwrap();
    assert!(m.set_moe_policy(&cpu, MoePolicy::Fixed(99)).is_err());
    let rule = sieve_kernels::MoeCostModel::padding_ratio_rule("bm128", "bm64", 1.5);
    assert!(m.set_moe_policy(&cpu, MoePolicy::Auto(rule)).unwrap_err().to_string().contains("bm128"));
    assert!(MoePolicy::fixed_by_name(&cpu, "padded64").is_ok());
    assert!(MoePolicy::fixed_by_name(&cpu, "tile99").unwrap_err().to_string().contains("grouped"));
}

#[test]
fn a_two_label_classifier_head_folds_like_yes_no() {
    // score.weight = [W[no], W[yes]] must give exactly the yes/no head's logit.
    let b = ReferenceBackend;
    let c = tiny_config(Arch::Qwen3);
    let mut src = random_source(&c, 3);
    let emb = src.get("model.embed_tokens.weight").unwrap();
    let (yes, no) = (5usize, 9usize);
    let h = c.hidden;
    let mut w = emb.data[no * h..(no + 1) * h].to_vec();
    w.extend_from_slice(&emb.data[yes * h..(yes + 1) * h]);
    src.insert("score.weight", w, vec![2, h]);
    let yn = Model::load(&b, &src, c.clone(), HeadSpec::YesNo { yes: yes as u32, no: no as u32 }, false).unwrap();
    let cls = Model::load(&b, &src, c.clone(), HeadSpec::Classifier, false).unwrap();
    assert_eq!(cls.head.kind, HeadKind::Classifier { labels: 2 });
    let prompts = vec![tokens(1, 7, c.vocab), tokens(2, 3, c.vocab)];
    assert_eq!(scores_alone(&b, &yn, &prompts), scores_alone(&b, &cls, &prompts));
    // One label is used as is; three are refused with a clear error.
    src.insert("score.weight", vec![0.5; h], vec![1, h]);
    assert!(Model::load(&b, &src, c.clone(), HeadSpec::Classifier, false).is_ok());
    src.insert("score.weight", vec![0.5; 3 * h], vec![3, h]);
    let err = Model::load(&b, &src, c, HeadSpec::Classifier, false).err().unwrap();
    assert!(err.to_string().contains("3 labels"), "{err}");
}

#[test]
fn moe_model_on_the_cuda_pipeline_twin_matches_the_cpu_backend() {
    // The GPU MoE path (router projection, device-side tile selection by the padding-ratio rule,
    // permutation, grouped bf16 GEMMs, un-permute into the residual) as `TwinBackend` runs it:
    // the same launches `CudaBackend::moe_ffn` makes, on the kernels' CPU twins.
    use sieve_kernels::cuda::twin::TwinBackend;
    use sieve_kernels::CpuBackend;
    // `scores_alone` gives the logit l_yes − l_no; bf16 weights (and bf16 expert activations)
    // move it by at most 0.05 + 2% of its size here.
    let tol = |w: f32| 0.05 + 0.02 * w.abs();
    let (cpu, twin) = (CpuBackend::new(2).unwrap(), TwinBackend::tiled());
    let c = tiny_moe_config(Arch::Qwen3Moe);
    let src = random_source(&c, 11);
    let head = HeadSpec::YesNo { yes: 5, no: 9 };
    let on_cpu = Model::load(&cpu, &src, c.clone(), head.clone(), false).unwrap();
    let mut on_twin = Model::load(&twin, &src, c.clone(), head.clone(), false).unwrap();
    assert!(matches!(on_twin.moe_policy(), MoePolicy::Auto(m) if m.padding_threshold("bm128", "bm64") == Some(1.5)));
    let prompts: Vec<Vec<u32>> = (0..5).map(|i| tokens(70 + i as u64, 3 + 7 * i, c.vocab)).collect();
    let want = scores_alone(&cpu, &on_cpu, &prompts);
    assert!(want.iter().any(|&s| (s - want[0]).abs() > 0.5), "logits do not vary: {want:?}");
    // The wgmma engine (gemm_wgmma.cu, moe_gemm_wgmma.cu) through the same model code: in the
    // twin, the mma.sync engine's bits at every policy.
    let wgmma = TwinBackend { gemm: sieve_kernels::cuda::GemmEngine::Wgmma, ..Default::default() };
    let mut on_wgmma = Model::load(&wgmma, &src, c.clone(), head.clone(), false).unwrap();
    for policy in [on_twin.moe_policy().clone(), MoePolicy::Fixed(0), MoePolicy::Fixed(1)] {
        on_twin.set_moe_policy(&twin, policy.clone()).unwrap();
        let got = scores_alone(&twin, &on_twin, &prompts);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= tol(*w), "{policy:?}: twin {g} vs cpu {w}");
        }
        on_wgmma.set_moe_policy(&wgmma, policy.clone()).unwrap();
        let on_wg = scores_alone(&wgmma, &on_wgmma, &prompts);
        let bits = |v: &[f32]| v.iter().map(|s| s.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&on_wg), bits(&got), "{policy:?}: wgmma engine vs tiled");
    }
    // The record: at a handful of rows per expert the rule picks BLOCK_M 64 (index 1).
    let mut scratch = Scratch::new(&twin).unwrap();
    let mut cache = twin.kv_cache(c.n_layers, 64, c.n_kv_heads, c.head_dim).unwrap();
    on_twin.set_moe_policy(&twin, MoePolicy::Auto(twin.moe_default_cost(c.hidden, 40))).unwrap();
    let mut lb = LayoutBuilder::new();
    let row = lb.push(&prompts[4], &(0..prompts[4].len() as u32).collect::<Vec<_>>()).unwrap();
    on_twin.forward(&twin, &lb.finish(), &mut cache, &[row], None, &mut scratch).unwrap();
    let first = scratch.moe.pass.layers[0];
    assert_eq!(first.rows, prompts[4].len() as u64 * 4);
    assert_eq!(first.variant, 1, "{first:?}");
    assert!(first.padded_rows >= first.rows && first.active_experts > 0 && first.max_expert_rows > 0);
    // A calibrated per-expert table cannot run on the device selector: refused with the reason.
    let table = sieve_kernels::MoeCostModel {
        variants: vec![sieve_kernels::VariantCost {
            variant: "bm64".into(),
            per_call: 0.0,
            per_expert: vec![1.0],
            per_row: 0.0,
            per_padded_row: 0.0,
        }],
        origin: "test".into(),
        tie_margin: 0.0,
    };
    on_twin.set_moe_policy(&twin, MoePolicy::Auto(table)).unwrap();
    let mut lb = LayoutBuilder::new();
    let row = lb.push(&prompts[0], &(0..prompts[0].len() as u32).collect::<Vec<_>>()).unwrap();
    let err = on_twin.forward(&twin, &lb.finish(), &mut cache, &[row], None, &mut scratch).err().unwrap();
    assert!(err.to_string().contains("padding-ratio rule"), "{err}");
    // qwen2_moe (a shared expert with a sigmoid gate, no renormalisation) on the GPU pipeline:
    // the CPU backend's scores, and the same bits with a shared prefix and in a batch.
    let c2 = tiny_moe_config(Arch::Qwen2Moe);
    let src2 = random_source(&c2, 3);
    let on_cpu = Model::load(&cpu, &src2, c2.clone(), head.clone(), false).unwrap();
    let on_twin = Model::load(&twin, &src2, c2.clone(), head, false).unwrap();
    let base = tokens(5, 6, c2.vocab);
    let prompts: Vec<Vec<u32>> =
        (0..5).map(|i| base.iter().copied().chain(tokens(90 + i as u64, 2 + 4 * i, c2.vocab)).collect()).collect();
    let want = scores_alone(&cpu, &on_cpu, &prompts);
    assert!(want.iter().any(|&s| (s - want[0]).abs() > 0.5), "qwen2_moe logits do not vary: {want:?}");
    let got = scores_alone(&twin, &on_twin, &prompts);
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= tol(*w), "qwen2_moe: twin {g} vs cpu {w}");
    }
    assert_eq!(scores_shared(&twin, &on_twin, &prompts, 6, 3), got, "qwen2_moe on the twin: batch and shared prefix");
}
