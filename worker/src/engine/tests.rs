//! Engine behaviour on a small random model (reference backend): scores independent of batching
//! and prefix reuse, cross-batch hits, rollback on failure, epoch isolation.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use sieve_kernels::reference::ReferenceBackend;

use super::*;
use crate::model::tests::{random_source, tiny_config};
use crate::model::{Arch, HeadSpec, Model};
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
    let backend = ReferenceBackend;
    let model = Model::load(&backend, &src, c.clone(), HeadSpec::YesNo { yes: 3, no: 4 }, false).unwrap();
    let encoder: Arc<dyn TextEncoder> = Arc::new(ModEncoder(c.vocab as u32));
    let builder = PromptBuilder::new(template(), encoder.as_ref()).unwrap();
    EngineHandle::start(EngineParts { backend, model, encoder, builder }, cfg, Arc::new(EngineState::default())).unwrap()
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

fn submit(e: &EngineHandle, query: &str, items: Vec<String>) -> oneshot::Receiver<JobResult> {
    e.submit(Submission { query: query.into(), items, instruction: None, arrived: Instant::now(), deadline: None, cancel: CancelFlag::default() })
        .unwrap()
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
        assert_eq!(score(&off, "red running shoes", vec![item.clone()]).unwrap().scores[0], a.scores[i], "item {i} alone");
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
            Err(WorkerError::Kernel(sieve_kernels::KernelError::Injected(format!("epoch {epoch}"))))
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
    assert_eq!(e.state.queued_pairs.load(Ordering::Relaxed), 0);
    assert_eq!(e.state.in_flight_requests.load(Ordering::Relaxed), 0);
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
            return Err(WorkerError::Kernel(sieve_kernels::KernelError::Injected("batch 1".into())));
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
    assert_eq!(e.prefix_snapshot().blocks_pending, pending_before, "batch 2 registers nothing over batch 1's pending keys");
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

#[test]
fn too_long_prompts_and_overload_are_refused_cleanly() {
    let e = engine(EngineConfig { max_queued_pairs: 10, ..cfg(true) });
    let err = score(&e, "q", vec!["ok".into(), "y".repeat(400)]).unwrap_err();
    assert_eq!(err.status(), 413);
    assert!(err.message.contains("items[1]") && err.message.contains("max_seq_tokens 128"), "{}", err.message);
    // A good call still works afterwards.
    assert_eq!(score(&e, "q", vec!["ok".into()]).unwrap().scores.len(), 1);
    assert_eq!(e.state.queued_pairs.load(Ordering::Relaxed), 0);
    e.shutdown();
}

#[test]
fn expired_calls_get_504_and_others_are_unaffected() {
    let e = engine(cfg(true));
    let expired = e
        .submit(Submission {
            query: "q".into(),
            items: items(3, 0),
            instruction: None,
            arrived: Instant::now() - Duration::from_secs(5),
            deadline: Some(Duration::from_millis(1)),
            cancel: CancelFlag::default(),
        })
        .unwrap();
    let ok = submit(&e, "q", items(3, 0));
    assert_eq!(expired.blocking_recv().unwrap().unwrap_err().status(), 504);
    assert_eq!(ok.blocking_recv().unwrap().unwrap().scores.len(), 3);
    assert_eq!(blocks_in_use(&e), 0);
    e.shutdown();
}
