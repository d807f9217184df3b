//! Engine behaviour on a small random model (reference backend): scores independent of batching
//! and prefix reuse, cross-batch hits, rollback on failure, epoch isolation; deadlines and
//! cancellation inside the schedule; non-finite scores.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use sieve_kernels::reference::ReferenceBackend;

use super::*;
use crate::model::source::MemorySource;
use crate::model::tests::{random_source, tiny_config};
use crate::model::{Arch, HeadSpec, Model, ModelConfig};
use crate::prompt::tests::ModEncoder;
use crate::prompt::{PromptTemplate, TextEncoder};
use crate::WorkerError;

fn template() -> PromptTemplate {
    PromptTemplate {
        prefix: "<s>judge\n".into(),
        body: "Q: {query}\nD: {item}".into(),
        suffix: "<s>a".into(),
        default_instruction: String::new(),
        yes_token: "y".into(),
        no_token: "n".into(),
    }
}

fn engine(cfg: EngineConfig) -> Arc<EngineHandle> {
    let c = tiny_config(Arch::Qwen3);
    let src = random_source(&c, 11);
    engine_of(c, src, cfg)
}

fn engine_of(c: ModelConfig, src: MemorySource, cfg: EngineConfig) -> Arc<EngineHandle> {
    try_engine(c, src, cfg).unwrap()
}

fn try_engine(c: ModelConfig, src: MemorySource, cfg: EngineConfig) -> crate::Result<Arc<EngineHandle>> {
    let encoder: Arc<dyn TextEncoder> = Arc::new(ModEncoder(c.vocab as u32));
    try_engine_with(c, src, cfg, encoder)
}

fn try_engine_with(
    c: ModelConfig,
    src: MemorySource,
    cfg: EngineConfig,
    encoder: Arc<dyn TextEncoder>,
) -> crate::Result<Arc<EngineHandle>> {
    let backend = ReferenceBackend;
    let model = Model::load(&backend, &src, c.clone(), HeadSpec::YesNo { yes: 3, no: 4 }, false).unwrap();
    let builder = PromptBuilder::new(template(), encoder.as_ref()).unwrap();
    EngineHandle::start(EngineParts { backend, model, encoder, builder }, cfg, Arc::new(EngineState::default()))
}

#[test]
fn a_kv_cache_too_large_for_its_slot_ids_or_the_memory_is_a_config_error_naming_the_settings() {
    let c = tiny_config(Arch::Qwen3);
    let cases = [
        (EngineConfig { prefix_cache_blocks: 1 << 60, ..cfg(true) }, "need 1 to 4294967295"),
        (EngineConfig { max_seqs_per_pass: usize::MAX, ..cfg(true) }, "need 1 to 4294967295"),
        (EngineConfig { block_size: 1 << 40, ..cfg(true) }, "need 1 to 4294967295"),
        (EngineConfig { block_size: 0, ..cfg(true) }, "need 1 to"),
        // Slot ids fit, the memory does not (K and V x 2 layers x ~2^32 slots x 24 f32: 1.5 TiB).
        (EngineConfig { prefix_cache_blocks: (u32::MAX / 4 - 1000) as usize, ..cfg(true) }, "GiB of host memory"),
    ];
    for (bad, want) in cases {
        let e = try_engine(c.clone(), random_source(&c, 11), bad).err().expect("refused").to_string();
        assert!(e.contains(want) && e.contains("lower engine.prefix_cache_blocks"), "{e}");
        assert!(e.contains("prefix_cache_blocks") && e.contains("kv_block_size"), "{e}");
    }
}

fn cfg(reuse: bool) -> EngineConfig {
    EngineConfig {
        max_batch_tokens: 256,
        max_seq_tokens: 128,
        block_size: 4,
        prefix_cache_blocks: 64,
        prefix_cache: PrefixCacheConfig { enabled: reuse, ..Default::default() },
        ..Default::default()
    }
}

fn items(n: usize, salt: usize) -> Vec<String> {
    (0..n).map(|i| format!("item {} {}", i * 7 + salt, "x".repeat((i * 5 + salt) % 23))).collect()
}

/// A call of `items` for `query`, arriving now, with no deadline, instruction or truncation.
fn submission(query: &str, items: Vec<String>) -> Submission {
    Submission {
        query: query.into(),
        items,
        instruction: None,
        arrived: Instant::now(),
        deadline: None,
        cancel: CancellationToken::new(),
        span: tracing::Span::none(),
        truncate: None,
    }
}

fn submit(e: &EngineHandle, query: &str, items: Vec<String>) -> Ticket {
    e.submit(submission(query, items)).unwrap()
}

fn submit_with(
    e: &EngineHandle,
    query: &str,
    items: Vec<String>,
    deadline: Option<Duration>,
    cancel: CancellationToken,
) -> Ticket {
    e.submit(Submission { deadline, cancel, ..submission(query, items) }).unwrap()
}

fn score(e: &EngineHandle, query: &str, items: Vec<String>) -> JobResult {
    submit(e, query, items).blocking_recv().unwrap()
}

fn blocks_in_use(e: &EngineHandle) -> u64 {
    e.prefix_snapshot().blocks_in_use - e.prefix_snapshot().blocks_committed
}

#[test]
fn scores_do_not_depend_on_reuse_batching_or_order() {
    let on = engine(cfg(true));
    let off = engine(cfg(false));
    // 40 items at ~30 tokens: several passes of at most 256 tokens.
    let it = items(40, 3);
    let a = score(&on, "red running shoes", it.clone()).unwrap();
    let b = score(&off, "red running shoes", it.clone()).unwrap();
    assert_eq!(a.scores, b.scores, "reuse on vs off");
    assert!(a.usage.computed_tokens < b.usage.computed_tokens);
    assert_eq!(a.usage.prompt_tokens, b.usage.prompt_tokens);
    // Each item alone, and the list reversed.
    for (i, item) in it.iter().enumerate().step_by(7) {
        assert_eq!(
            score(&off, "red running shoes", vec![item.clone()]).unwrap().scores[0],
            a.scores[i],
            "item {i} alone"
        );
    }
    let mut rev = it.clone();
    rev.reverse();
    let mut r = score(&on, "red running shoes", rev).unwrap().scores;
    r.reverse();
    assert_eq!(r, a.scores, "reversed order");
    on.shutdown();
    off.shutdown();
}

#[test]
fn a_repeated_query_hits_the_cache_with_identical_scores() {
    let e = engine(cfg(true));
    let first = score(&e, "blue jeans", items(5, 1)).unwrap();
    assert_eq!(first.usage.cached_prefix_tokens, 0);
    let second = score(&e, "blue jeans", items(9, 2)).unwrap();
    assert_eq!(second.usage.cached_prefix_tokens, second.usage.prefix_tokens);
    assert!(second.usage.prefix_tokens > 0);
    let same = score(&e, "blue jeans", items(5, 1)).unwrap();
    assert_eq!(same.scores, first.scores);
    assert_eq!(same.usage.computed_tokens, first.usage.computed_tokens - first.usage.prefix_tokens as u64);
    let snap = e.prefix_snapshot();
    assert_eq!(snap.counters.hits, 2);
    assert_eq!(blocks_in_use(&e), 0, "no block held after the calls");
    e.cache.lock().unwrap().check_invariants().unwrap();
    e.shutdown();
}

#[test]
fn a_failed_batch_rolls_back_and_leaks_nothing() {
    let fail_epochs = Arc::new(Mutex::new(vec![1u64]));
    let fe = fail_epochs.clone();
    let hook: FaultHook = Arc::new(move |epoch, _pass, layer| {
        if layer == 1 && fe.lock().unwrap().contains(&epoch) {
            Err(WorkerError::Kernel(KernelError::Injected(format!("epoch {epoch}"))))
        } else {
            Ok(())
        }
    });
    let e = engine(EngineConfig { fault: Some(hook), ..cfg(true) });
    let baseline = e.prefix_snapshot();
    let err = score(&e, "green hat", items(6, 4)).unwrap_err();
    assert_eq!(err.status(), 500);
    assert!(err.message.contains("injected"), "{}", err.message);
    let after = e.prefix_snapshot();
    assert_eq!((after.blocks_free, after.blocks_pending, after.blocks_committed), (baseline.blocks_free, 0, 0));
    assert_eq!(after.counters.rollbacks, 1);
    // The same query again: computes its prefix afresh (nothing was cached) and matches a fresh worker.
    let again = score(&e, "green hat", items(6, 4)).unwrap();
    assert_eq!(again.usage.cached_prefix_tokens, 0);
    let fresh = engine(cfg(true));
    assert_eq!(again.scores, score(&fresh, "green hat", items(6, 4)).unwrap().scores);
    assert_eq!(e.state.queued_pairs.get(), 0);
    assert_eq!(e.state.in_flight_requests.get(), 0);
    e.cache.lock().unwrap().check_invariants().unwrap();
    e.shutdown();
    fresh.shutdown();
}

#[test]
fn concurrent_batches_never_read_each_others_pending_prefix() {
    // Batch 1 stalls inside its forward pass until batch 2 (same query) has been prepared,
    // then fails. Batch 2 must have computed its own prefix, and score like a fresh worker.
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    let stalled = Arc::new(AtomicU64::new(0));
    let st = stalled.clone();
    let hook: FaultHook = Arc::new(move |epoch, _pass, layer| {
        if epoch == 1 && layer == 1 {
            st.store(1, Ordering::SeqCst);
            let _ = release_rx.lock().unwrap().recv_timeout(Duration::from_secs(20));
            return Err(WorkerError::Kernel(KernelError::Injected("batch 1".into())));
        }
        Ok(())
    });
    let e = engine(EngineConfig { fault: Some(hook), max_batch_tokens: 128, ..cfg(true) });
    let first = submit(&e, "yellow scarf", items(4, 5));
    while stalled.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(Duration::from_millis(2));
    }
    let pending_before = e.prefix_snapshot().blocks_pending;
    let second = submit(&e, "yellow scarf", items(4, 5));
    // Wait until the scheduler has taken blocks for batch 2 (its prefix is private: no new
    // pending entries, but more blocks in use).
    let t0 = Instant::now();
    while e.prefix_snapshot().blocks_in_use <= pending_before && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(
        e.prefix_snapshot().blocks_pending,
        pending_before,
        "batch 2 registers nothing over batch 1's pending keys"
    );
    release_tx.send(()).unwrap();
    assert_eq!(first.blocking_recv().unwrap().unwrap_err().status(), 500);
    let s2 = second.blocking_recv().unwrap().unwrap();
    assert_eq!(s2.usage.cached_prefix_tokens, 0);
    let fresh = engine(cfg(true));
    assert_eq!(s2.scores, score(&fresh, "yellow scarf", items(4, 5)).unwrap().scores);
    assert_eq!(blocks_in_use(&e), 0);
    e.cache.lock().unwrap().check_invariants().unwrap();
    e.shutdown();
    fresh.shutdown();
}

fn score_cut(e: &EngineHandle, query: &str, items: Vec<String>, max_tokens: usize, left: bool) -> JobResult {
    e.submit(Submission { truncate: Some(crate::prompt::Truncate { max_tokens, left }), ..submission(query, items) })
        .unwrap()
        .blocking_recv()
        .unwrap()
}

#[test]
fn a_truncated_item_scores_the_same_alone_in_a_batch_and_sent_already_cut() {
    let e = engine(cfg(false));
    let long = "long item with many words ".repeat(3);
    // ModEncoder: one token per byte, a space joined to the letter after it.
    let starts = crate::prompt::tests::ByteEncoder.token_starts(&long).unwrap();
    for left in [false, true] {
        let alone = score_cut(&e, "q", vec![long.clone()], 12, left).unwrap();
        assert_eq!(alone.usage.truncated_items, 1);
        let mut batch = items(9, 4);
        batch.insert(5, long.clone());
        let in_batch = score_cut(&e, "q", batch, 12, left).unwrap();
        assert_eq!(in_batch.scores[5], alone.scores[0], "left {left}: in a batch");
        let cut = if left { &long[starts[starts.len() - 12]..] } else { &long[..starts[12]] };
        let pre = score(&e, "q", vec![cut.to_string()]).unwrap();
        assert_eq!(pre.scores[0], alone.scores[0], "left {left}: sent already cut");
        assert_eq!(pre.usage.truncated_items, 0);
    }
    // Short items are not cut: the same scores as without truncation.
    let plain = score(&e, "q", items(5, 1)).unwrap();
    let capped = score_cut(&e, "q", items(5, 1), 100, false).unwrap();
    assert_eq!((plain.scores, capped.usage.truncated_items), (capped.scores, 0));
    // Over the context with truncation asked for: cut to fit, not refused.
    let over = score_cut(&e, "q", vec!["ok".into(), "y ".repeat(300)], 10_000, false).unwrap();
    assert_eq!(over.usage.truncated_items, 1);
    assert!(over.scores.iter().all(Option::is_some));
    // A query too long for any item: cut to nothing, the call is still refused with a 413 (from
    // either end), and the engine serves the next call.
    for left in [false, true] {
        let err = score_cut(&e, &"q ".repeat(150), vec!["an item".into()], 10, left).unwrap_err();
        assert_eq!(err.status(), 413, "left {left}: {}", err.message);
    }
    assert_eq!(score(&e, "q", vec!["ok".into()]).unwrap().scores.len(), 1);
    e.shutdown();
}

/// [`ModEncoder`] that panics on a text holding "💥".
struct PanickingEncoder(ModEncoder);
impl TextEncoder for PanickingEncoder {
    fn encode_special(&self, t: &str) -> crate::Result<Vec<u32>> {
        self.0.encode_special(t)
    }
    fn encode_plain(&self, t: &str) -> crate::Result<Vec<u32>> {
        assert!(!t.contains('💥'), "a tokenizer bug");
        self.0.encode_plain(t)
    }
    fn token_starts(&self, t: &str) -> crate::Result<Vec<usize>> {
        self.0.token_starts(t)
    }
}

#[test]
fn a_tokenizer_panic_fails_its_call_alone() {
    let c = tiny_config(Arch::Qwen3);
    let encoder = Arc::new(PanickingEncoder(ModEncoder(c.vocab as u32)));
    let e = try_engine_with(c.clone(), random_source(&c, 11), cfg(true), encoder).unwrap();
    let err = score(&e, "q", vec!["ok".into(), "boom 💥".into()]).unwrap_err();
    assert_eq!(err.status(), 500);
    assert!(err.message.contains("panicked") && err.message.contains("a tokenizer bug"), "{}", err.message);
    assert_eq!(score(&e, "q", vec!["ok".into()]).unwrap().scores.len(), 1);
    assert_eq!(e.state.queued_pairs.get(), 0);
    e.shutdown();
}

#[test]
fn a_call_dropped_unanswered_is_answered_at_once() {
    // As when a thread holding it panics: its caller gets a 500 now, not a 504 at the deadline.
    let state = Arc::new(EngineState::default());
    state.in_flight_requests.add(1);
    let (ticket, slot) = Ticket::new(state.clone(), 1, Instant::now(), None);
    let probe = slot.clone();
    drop(ScoreJob {
        instruction: None,
        query: "q".into(),
        items: vec!["ok".into()],
        arrived: Instant::now(),
        deadline: None,
        cancel: CancellationToken::new(),
        slot,
        trace: None,
        truncate: None,
        state: state.clone(),
    });
    assert!(probe.is_answered(), "left for the deadline");
    let err = ticket.blocking_recv().unwrap().unwrap_err();
    assert_eq!(err.status(), 500);
    assert!(err.message.contains("dropped"), "{}", err.message);
    assert_eq!(state.in_flight_requests.get(), 0);
}

#[test]
fn an_engine_whose_thread_ended_says_so_and_refuses_calls() {
    let e = engine(cfg(true));
    assert_eq!(e.stopped(), None);
    assert_eq!(score(&e, "q", vec!["ok".into()]).unwrap().scores.len(), 1);
    // The scheduler ends while the handle still takes calls (as after a panic there).
    e.tx.lock().unwrap().as_ref().unwrap().send(Msg::Stop).unwrap();
    wait_for("the scheduler to end", || e.stopped().is_some());
    let why = e.stopped().unwrap();
    assert!(why.contains("sieve-scheduler") && why.contains("restart the worker"), "{why}");
    let refused = e.submit(submission("q", vec!["ok".into()]));
    assert_eq!(refused.err().map(|e| e.status()), Some(503));
    // Shut down on purpose: not a failure.
    e.shutdown();
    assert_eq!(e.stopped(), None);
}

#[test]
fn too_long_prompts_and_overload_are_refused_cleanly() {
    let e = engine(EngineConfig { max_queued_pairs: 10, ..cfg(true) });
    let err = score(&e, "q", vec!["ok".into(), "y".repeat(400)]).unwrap_err();
    assert_eq!(err.status(), 413);
    assert!(err.message.contains("items[1]") && err.message.contains("max_seq_tokens 128"), "{}", err.message);
    // A good call still works afterwards.
    assert_eq!(score(&e, "q", vec!["ok".into()]).unwrap().scores.len(), 1);
    assert_eq!(e.state.queued_pairs.get(), 0);
    e.shutdown();
}

#[test]
fn expired_calls_get_504_and_others_are_unaffected() {
    let e = engine(cfg(true));
    let expired = e
        .submit(Submission {
            arrived: Instant::now() - Duration::from_secs(5),
            deadline: Some(Duration::from_millis(1)),
            ..submission("q", items(3, 0))
        })
        .unwrap();
    let ok = submit(&e, "q", items(3, 0));
    assert_eq!(expired.blocking_recv().unwrap().unwrap_err().status(), 504);
    assert_eq!(ok.blocking_recv().unwrap().unwrap().scores.len(), 3);
    assert_eq!(blocks_in_use(&e), 0);
    e.shutdown();
}

/// Waits (bounded) for a condition another thread makes true.
fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(20), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap()
}

/// A gate the fault hook can hold a layer on until the test opens it (bounded at 20 s).
#[derive(Clone, Default)]
struct Gate(Arc<(Mutex<bool>, std::sync::Condvar)>);

impl Gate {
    fn wait(&self) {
        let (m, c) = &*self.0;
        let g = m.lock().unwrap();
        let _ = c.wait_timeout_while(g, Duration::from_secs(20), |open| !*open).unwrap();
    }
    fn open(&self) {
        let (m, c) = &*self.0;
        *m.lock().unwrap() = true;
        c.notify_all();
    }
}

#[test]
fn a_call_expiring_behind_a_long_batch_is_answered_at_its_deadline() {
    // Batch 1 holds the runner at its first layer until the test opens the gate, which it does
    // only once the second call has been answered: a 504 that waited for the batch would hang.
    let gate = Gate::default();
    let g = gate.clone();
    let reached = Arc::new(AtomicUsize::new(0));
    let r = reached.clone();
    let hook: FaultHook = Arc::new(move |epoch, _, layer| {
        if epoch == 1 && layer == 0 {
            r.store(1, Ordering::SeqCst);
            g.wait();
        }
        Ok(())
    });
    let e = engine(EngineConfig { fault: Some(hook), ..cfg(true) });
    let long = submit(&e, "long", items(4, 1));
    wait_for("batch 1 to start", || reached.load(Ordering::SeqCst) == 1);
    let late = submit_with(&e, "late", items(3, 2), Some(Duration::from_millis(100)), CancellationToken::new());
    let answer = rt().block_on(async { tokio::time::timeout(Duration::from_secs(10), late.wait()).await });
    let err = answer.expect("answered while the batch still runs").unwrap_err();
    assert_eq!(err.status(), 504, "{}", err.message);
    // Its place in the queue is free at once; only the long call is still counted.
    assert_eq!(e.state.queued_pairs.get(), 4);
    assert_eq!(e.state.in_flight_requests.get(), 1);
    assert_eq!(e.state.calls_expired_queued.get(), 1);
    gate.open();
    assert_eq!(long.blocking_recv().unwrap().unwrap().scores.len(), 4);
    wait_for("the engine to empty", || e.state.in_flight_requests.get() == 0);
    assert_eq!(e.state.queued_tokens.get(), 0);
    assert_eq!(e.state.pairs_processed.get(), 4, "the expired call was never computed");
    e.shutdown();
}

#[test]
fn a_pass_whose_calls_are_all_cancelled_stops_mid_pass_and_rolls_back() {
    // 6 layers; layer 1 of the first batch waits until the test has cancelled the call.
    let c = ModelConfig { n_layers: 6, ..tiny_config(Arch::Qwen3) };
    let src = random_source(&c, 11);
    let gate = Gate::default();
    let g = gate.clone();
    let deepest = Arc::new(AtomicUsize::new(0));
    let d = deepest.clone();
    let hook: FaultHook = Arc::new(move |epoch, _, layer| {
        if epoch == 1 {
            d.fetch_max(layer, Ordering::SeqCst);
            if layer == 1 {
                g.wait();
            }
        }
        Ok(())
    });
    let e = engine_of(c.clone(), src.clone(), EngineConfig { fault: Some(hook), ..cfg(true) });
    let baseline = e.prefix_snapshot();
    let cancel = CancellationToken::new();
    let call = submit_with(&e, "purple boots", items(5, 3), None, cancel.clone());
    wait_for("layer 1", || deepest.load(Ordering::SeqCst) == 1);
    assert!(e.prefix_snapshot().blocks_pending > 0, "the batch holds pending prefix blocks");
    cancel.cancel();
    gate.open();
    let err = call.blocking_recv().unwrap().unwrap_err();
    assert!(err.message.contains("cancelled"), "{}", err.message);
    // The answer comes from inside the pass; the batch's rollback follows.
    wait_for("the batch to end", || e.prefix_snapshot().counters.rollbacks == 1);
    // The check that follows the hook at layer 1 stopped the pass: layers 1..=5 never ran.
    assert_eq!(deepest.load(Ordering::SeqCst), 1, "the pass stopped at the layer it was in, not at the last (5)");
    let p = e.state.pipeline();
    assert_eq!((p.passes_abandoned, p.calls_cancelled, p.forward_passes), (1, 1, 0));
    assert!(p.rows_abandoned > 0);
    let after = e.prefix_snapshot();
    assert_eq!(
        (after.blocks_free, after.blocks_pending, after.blocks_committed),
        (baseline.blocks_free, 0, 0),
        "rolled back"
    );
    assert_eq!(after.counters.rollbacks, 1);
    e.cache.lock().unwrap().check_invariants().unwrap();
    // The same call again computes its prefix afresh and scores like a fresh engine.
    let again = score(&e, "purple boots", items(5, 3)).unwrap();
    assert_eq!(again.usage.cached_prefix_tokens, 0);
    let fresh = engine_of(c, src, cfg(true));
    assert_eq!(again.scores, score(&fresh, "purple boots", items(5, 3)).unwrap().scores);
    e.shutdown();
    fresh.shutdown();
}

#[test]
fn a_deadline_mid_call_gives_a_partial_answer_listing_exactly_the_unscored_items() {
    // Small passes (128 tokens: a few items each); the second pass of the first batch waits
    // at its first layer until the call's deadline has passed.
    let gate = Gate::default();
    let g = gate.clone();
    let hook: FaultHook = Arc::new(move |epoch, pass, layer| {
        if epoch == 1 && pass == 1 && layer == 0 {
            g.wait();
        }
        Ok(())
    });
    let e = engine(EngineConfig { fault: Some(hook), max_batch_tokens: 128, ..cfg(true) });
    let it = items(12, 7);
    let call = submit_with(&e, "orange socks", it.clone(), Some(Duration::from_millis(300)), CancellationToken::new());
    std::thread::sleep(Duration::from_millis(350));
    gate.open();
    let out = call.blocking_recv().unwrap().unwrap();
    let k = out.scores.iter().position(Option::is_none).expect("some items unscored");
    assert!(k > 0, "the first pass's items are scored");
    assert_eq!(out.missing, (k..12).collect::<Vec<_>>(), "missing lists exactly the unscored items");
    assert!(out.scores[k..].iter().all(Option::is_none) && out.scores[..k].iter().all(Option::is_some));
    assert_eq!(out.usage.pairs as usize, k);
    // The scored ones are the scores the whole call gets without a deadline.
    let fresh = engine(EngineConfig { max_batch_tokens: 128, ..cfg(true) });
    let full = score(&fresh, "orange socks", it).unwrap();
    assert_eq!(out.scores[..k], full.scores[..k]);
    let p = e.state.pipeline();
    assert_eq!((p.partial_answers, p.calls_expired_running, p.passes_abandoned), (1, 1, 1));
    // Answered from inside the abandoned pass; the batch's rollback follows.
    wait_for("the batch to end", || e.prefix_snapshot().counters.rollbacks == 1);
    assert_eq!(e.prefix_snapshot().blocks_pending, 0);
    e.cache.lock().unwrap().check_invariants().unwrap();
    e.shutdown();
    fresh.shutdown();
}

#[test]
fn a_non_finite_score_is_a_500_naming_the_items_and_nothing_is_cached() {
    // One token's embedding is NaN: every item containing it scores NaN, the others do not.
    let c = tiny_config(Arch::Qwen3);
    let mut src = random_source(&c, 11);
    let bad = ModEncoder(c.vocab as u32).encode_plain("~").unwrap()[0] as usize;
    let clean = ["teal cap", "red shoes", "blue hat", "q", "judge", "Q: D: y n <s>a"];
    for t in clean {
        assert!(!ModEncoder(c.vocab as u32).encode_plain(t).unwrap().contains(&(bad as u32)), "{t}");
    }
    let w = src.tensors.get_mut("model.embed_tokens.weight").unwrap();
    w.data[bad * c.hidden..(bad + 1) * c.hidden].fill(f32::NAN);
    let e = engine_of(c, src, cfg(true));
    let err = score(&e, "teal cap", vec!["red shoes".into(), "bad ~ item".into(), "blue hat".into(), "~~".into()])
        .unwrap_err();
    assert_eq!(err.status(), 500);
    assert!(err.message.contains("items[1], items[3]") && !err.message.contains("items[0]"), "{}", err.message);
    assert_eq!(e.state.nonfinite_scores.get(), 2);
    let snap = e.prefix_snapshot();
    assert_eq!((snap.blocks_pending, snap.blocks_committed, snap.counters.rollbacks), (0, 0, 1));
    // Finite scores still come back as numbers.
    let ok = score(&e, "teal cap", vec!["red shoes".into(), "blue hat".into()]).unwrap();
    assert!(ok.scores.iter().all(|s| s.is_some_and(f32::is_finite)) && ok.missing.is_empty());
    e.shutdown();
}

#[test]
fn dropping_the_handle_ends_the_engine_threads() {
    let e = engine(cfg(true));
    let ok = submit(&e, "q", items(2, 0));
    let state = e.state.clone();
    drop(e);
    // Queued work still finishes; then the scheduler and runner end, dropping their state.
    assert_eq!(ok.blocking_recv().unwrap().unwrap().scores.len(), 2);
    wait_for("the threads to end", || Arc::strong_count(&state) == 1);
}

/// Items in groups that open alike (category path, brand block), as a catalogue search returns.
fn catalogue(n: usize, group: usize, salt: usize) -> Vec<String> {
    let headers = ["Shoes > Running > Trail", "Kitchen > Knives > Chef", "Garden > Watering > Hoses"];
    (0..n)
        .map(|i| {
            let g = i / group;
            format!("{} | brand {} | size {} colour {}", headers[g % 3], g * 3 + salt, i % 13, i * 7 % 11)
        })
        .collect()
}

#[test]
fn item_groups_compute_their_runs_once_with_identical_scores() {
    let on = engine(cfg(true));
    let no_sharing = engine(EngineConfig { item_sharing_min_tokens: None, ..cfg(true) });
    let off = engine(cfg(false));
    let it = catalogue(24, 6, 1); // several passes of at most 256 tokens
    let a = score(&on, "trail shoes", it.clone()).unwrap();
    let b = score(&no_sharing, "trail shoes", it.clone()).unwrap();
    let c = score(&off, "trail shoes", it.clone()).unwrap();
    assert_eq!(a.scores, b.scores, "item sharing on vs off");
    assert_eq!(a.scores, c.scores, "item sharing vs no reuse at all");
    assert!(a.usage.item_shared_tokens > 0, "{:?}", a.usage);
    assert_eq!(b.usage.item_shared_tokens, 0);
    assert_eq!(a.usage.computed_tokens + a.usage.item_shared_tokens, b.usage.computed_tokens);
    assert_eq!(a.usage.prompt_tokens, b.usage.prompt_tokens);
    // Any order, and each item alone (where it has no group).
    let mut order: Vec<usize> = (0..it.len()).collect();
    order.reverse();
    order.swap(3, 17);
    let shuffled = score(&on, "trail shoes", order.iter().map(|&i| it[i].clone()).collect()).unwrap();
    for (k, &i) in order.iter().enumerate() {
        assert_eq!(shuffled.scores[k], a.scores[i], "item {i} shuffled");
    }
    for i in (0..it.len()).step_by(5) {
        let alone = score(&on, "trail shoes", vec![it[i].clone()]).unwrap();
        assert_eq!(alone.scores[0], a.scores[i], "item {i} alone");
        assert_eq!(alone.usage.item_shared_tokens, 0);
    }
    // The same call again: its runs come from the cache as well.
    let again = score(&on, "trail shoes", it.clone()).unwrap();
    assert_eq!(again.scores, a.scores);
    assert!(again.usage.computed_tokens < a.usage.computed_tokens - u64::from(a.usage.prefix_tokens));
    assert_eq!(blocks_in_use(&on), 0, "no block held after the calls");
    on.cache.lock().unwrap().check_invariants().unwrap();
    for e in [on, no_sharing, off] {
        e.shutdown();
    }
}

#[test]
fn a_failed_batch_rolls_back_its_item_runs_and_leaks_nothing() {
    let hook: FaultHook = Arc::new(move |epoch, _pass, layer| {
        if layer == 1 && epoch == 1 {
            Err(WorkerError::Kernel(KernelError::Injected("runs".into())))
        } else {
            Ok(())
        }
    });
    let e = engine(EngineConfig { fault: Some(hook), ..cfg(true) });
    let baseline = e.prefix_snapshot();
    assert_eq!(score(&e, "chef knife", catalogue(12, 4, 2)).unwrap_err().status(), 500);
    let after = e.prefix_snapshot();
    assert_eq!((after.blocks_free, after.blocks_pending, after.blocks_committed), (baseline.blocks_free, 0, 0));
    let again = score(&e, "chef knife", catalogue(12, 4, 2)).unwrap();
    assert!(again.usage.item_shared_tokens > 0);
    assert_eq!(again.usage.cached_prefix_tokens, 0, "nothing of the failed batch was kept");
    let fresh = engine(cfg(true));
    assert_eq!(again.scores, score(&fresh, "chef knife", catalogue(12, 4, 2)).unwrap().scores);
    e.cache.lock().unwrap().check_invariants().unwrap();
    e.shutdown();
    fresh.shutdown();
}
