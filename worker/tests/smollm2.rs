//! The embedded default model (SmolLM2-135M-Instruct, Q4_1 GGUF) on the CPU backend: it talks
//! sense, and a pair's score does not depend on batching, order, passes or prefix reuse.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use sieve_kernels::{Backend, CpuBackend};
use sieve_worker::assets;
use sieve_worker::engine::layout::LayoutBuilder;
use sieve_worker::engine::{
    CancellationToken, EngineConfig, EngineHandle, EngineParts, EngineState, PrefixCacheConfig, Submission,
};
use sieve_worker::model::loader::{self, LoadOptions, LoadedModel};
use sieve_worker::model::Scratch;
use sieve_worker::prompt::PromptTemplate;

fn model_path() -> std::path::PathBuf {
    let p = assets::cache_dir().join(assets::DEFAULT_MODEL);
    assert!(p.is_file(), "{} is missing: run scripts/fetch-assets (scripts/test does)", p.display());
    p
}

fn load(template: Option<PromptTemplate>, keep_lm_head: bool) -> (LoadedModel<CpuBackend>, CpuBackend) {
    let backend = CpuBackend::new(0).unwrap();
    let m =
        loader::load(&backend, &model_path(), &LoadOptions { template, keep_lm_head, ..Default::default() }).unwrap();
    (m, backend)
}

/// Greedy decoding with the KV cache: the prompt once, then one token per pass.
fn greedy(m: &LoadedModel<CpuBackend>, b: &CpuBackend, prompt: &str, steps: usize) -> String {
    let c = &m.model.config;
    let mut ids = m.tokenizer.encode(prompt).unwrap();
    let mut kv = b.kv_cache(c.n_layers, 512, c.n_kv_heads, c.head_dim).unwrap();
    let mut out = vec![];
    let mut new = ids.clone();
    let mut scratch = Scratch::new(b).unwrap();
    for _ in 0..steps {
        let slots: Vec<u32> = (0..ids.len() as u32).collect();
        let mut lb = LayoutBuilder::new();
        let row = lb.push(&new, &slots).unwrap();
        let h = m.model.forward(b, &lb.finish(), &mut kv, &[row], None, &mut scratch).unwrap();
        let logits = m.model.logits(b, h).unwrap();
        let next = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap() as u32;
        if next == 2 {
            break; // <|im_end|>
        }
        out.push(next);
        ids.push(next);
        new = vec![next];
    }
    m.tokenizer.decode(&out).unwrap()
}

#[test]
fn greedy_answer_to_the_capital_of_france_is_paris() {
    let (m, b) = load(None, true);
    let prompt = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
    let answer = greedy(&m, &b, prompt, 12);
    assert!(answer.contains("Paris"), "answer: {answer:?}");
}

fn engine(
    reuse: bool,
    block_size: usize,
    max_batch_tokens: usize,
    template: Option<PromptTemplate>,
) -> Arc<EngineHandle> {
    let (m, backend) = load(template, false);
    let cfg = EngineConfig {
        max_batch_tokens,
        max_seq_tokens: 512.min(max_batch_tokens),
        block_size,
        prefix_cache_blocks: 4096 / block_size,
        prefix_cache: PrefixCacheConfig { enabled: reuse, ..Default::default() },
        ..Default::default()
    };
    EngineHandle::start(
        EngineParts { backend, model: m.model, encoder: m.tokenizer, builder: m.builder },
        cfg,
        Arc::new(EngineState::default()),
    )
    .unwrap()
}

fn score(e: &EngineHandle, query: &str, items: &[&str]) -> (Vec<f32>, sieve_shared::Usage) {
    let rx = e
        .submit(Submission {
            query: query.into(),
            items: items.iter().map(|s| s.to_string()).collect(),
            instruction: None,
            arrived: Instant::now(),
            deadline: None,
            cancel: CancellationToken::new(),
            span: tracing::Span::none(),
            truncate: None,
        })
        .unwrap();
    let out = rx.blocking_recv().unwrap().unwrap();
    (out.scores.into_iter().map(|s| s.expect("every item scored")).collect(), out.usage)
}

const QUERY: &str = "trail running shoes";
const ITEMS: &[&str] = &[
    "Trail running shoes, waterproof, size 9",
    "Stainless steel kitchen knife set",
    "Running socks, 3 pairs",
    "Men's road running shoe with foam sole",
    "Garden hose 25 ft",
    "Hiking boots, leather, ankle support",
];

/// Reference scores: every item alone, whole prompt, no sharing.
fn alone() -> &'static Vec<f32> {
    static ALONE: OnceLock<Vec<f32>> = OnceLock::new();
    ALONE.get_or_init(|| {
        let e = engine(false, 16, 8192, None);
        let s = ITEMS.iter().map(|it| score(&e, QUERY, &[it]).0[0]).collect();
        e.shutdown();
        s
    })
}

#[test]
fn scores_are_bitwise_independent_of_batch_order_and_passes() {
    let alone = alone();
    // The model ranks the obvious match above the unrelated items.
    assert!(alone[0] > alone[1] && alone[0] > alone[4], "{alone:?}");
    let e = engine(false, 16, 8192, None);
    let (batch, _) = score(&e, QUERY, ITEMS);
    assert_eq!(&batch, alone, "one batch of 6 vs each alone");
    let rev: Vec<&str> = ITEMS.iter().rev().copied().collect();
    let (mut r, _) = score(&e, QUERY, &rev);
    r.reverse();
    assert_eq!(&r, alone, "reversed batch");
    e.shutdown();
    // Passes of at most ~2 items.
    let e = engine(false, 16, 200, None);
    assert_eq!(&score(&e, QUERY, ITEMS).0, alone, "several passes");
    e.shutdown();
}

#[test]
fn prefix_reuse_is_bitwise_equal_at_every_block_boundary() {
    let alone = alone();
    let probe = engine(true, 16, 8192, None);
    let (_, u) = score(&probe, QUERY, ITEMS);
    probe.shutdown();
    let p = u.prefix_tokens as usize;
    assert!(p > 40, "prefix {p}");
    // Block sizes that put the prefix end at bs-1, bs, bs+1, mid-block, and tiny blocks.
    for bs in [p + 1, p, p - 1, 16, 7, 1] {
        let e = engine(true, bs, 8192, None);
        let (first, u1) = score(&e, QUERY, ITEMS);
        assert_eq!(&first, alone, "in-batch reuse, block size {bs}");
        assert_eq!(u1.cached_prefix_tokens, 0);
        // The same query again: the prefix comes from the cache.
        let (second, u2) = score(&e, QUERY, &ITEMS[2..]);
        assert_eq!(u2.cached_prefix_tokens as usize, p, "cross-batch hit, block size {bs}");
        assert_eq!(&second[..], &alone[2..], "cross-batch hit, block size {bs}");
        e.shutdown();
    }
}

#[test]
fn prefix_reuse_is_exact_when_the_query_merges_with_the_item_under_bpe() {
    // No separator between query and item: "run" + "ning shoes" tokenizes as "running shoes",
    // so the shared prefix must stop before the query's last token.
    let t = PromptTemplate { body: "<Query>: {query}{item}".into(), ..PromptTemplate::chatml() };
    let items = ["ning shoes for trails", "ning socks", "ner-up medal"];
    let on = engine(true, 16, 8192, Some(t.clone()));
    let off = engine(false, 16, 8192, Some(t));
    let (a, ua) = score(&on, "fast run", &items);
    let (b, _) = score(&off, "fast run", &items);
    assert_eq!(a, b);
    assert!(ua.prefix_tokens > 0);
    on.shutdown();
    off.shutdown();
}
