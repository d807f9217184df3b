//! Cache-aware routing against simulated workers with prefix caches, in-process on loopback: a
//! query sent again lands on the worker that answered it first, which serves its prefix from its
//! prefix cache (`cached_prefix_tokens`), learnt from the first answer alone. (Without the
//! routing, least-loaded breaks ties between idle workers at random: six repeats would all find
//! their holders by chance once in 4,096 runs.)

use std::sync::atomic::Ordering;

use sieve_e2e::{catalogue, proxy, score_body, sims, test_config, Http};
use sieve_loadtest::sim::{SimConfig, SimWorker};
use sieve_shared::ScoreResponse;

/// Calls each worker has answered.
fn calls(ws: &[SimWorker]) -> Vec<u64> {
    ws.iter().map(|w| w.engine().counters().completed.load(Ordering::Relaxed)).collect()
}

/// The one worker whose count grew between `before` and `after`.
fn answered_by(before: &[u64], after: &[u64]) -> usize {
    let grew: Vec<usize> = (0..before.len()).filter(|&i| after[i] > before[i]).collect();
    assert_eq!(grew.len(), 1, "one worker answers a one-shard request: {before:?} → {after:?}");
    grew[0]
}

/// A long query (a document as the query): most of a small request's compute is its prefix.
fn long_query(n: usize) -> String {
    (0..120).map(|i| format!("w{n}x{i}")).collect::<Vec<_>>().join(" ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_query_lands_on_the_worker_holding_its_prefix() {
    let http = Http::new();
    let ws = sims(4, SimConfig { prefix_cache_blocks: 1024, ..SimConfig::default() }).await;
    let mut cfg = test_config(ws.iter().map(|w| w.endpoint()).collect());
    cfg.hedge.enabled = false; // one attempt per shard: each answer is counted on one worker
    assert!(cfg.split.prefix_affinity, "on by default");
    let p = proxy(cfg, 4).await;
    let url = format!("{}/v1/score", p.api_url());
    let items = catalogue(40, 5);
    // Every worker answers a few calls first: from its second on, each shows a prefix-cache hit
    // (the template head's blocks), which tells the proxy it has a prefix cache at all.
    for n in 0..200 {
        if calls(&ws).iter().all(|&c| c >= 2) {
            break;
        }
        let r = http.post_json(&url, &score_body(&format!("warm {n}"), &items[..1], None)).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert!(calls(&ws).iter().all(|&c| c >= 2), "every worker warmed: {:?}", calls(&ws));

    let mut first_on = Vec::new();
    for q in 0..6 {
        let before = calls(&ws);
        let r: ScoreResponse = http.post_json(&url, &score_body(&long_query(q), &items[..1], None)).await.json();
        assert!(r.usage.cached_prefix_tokens < r.usage.prefix_tokens, "a new query: at most the template head held");
        first_on.push(answered_by(&before, &calls(&ws)));
    }
    for (q, &worker) in first_on.iter().enumerate() {
        // The same query, another item (no pair repeats; one item: one shard): the holder takes
        // it and computes none of the prefix.
        let before = calls(&ws);
        let body = score_body(&long_query(q), &items[1 + q..2 + q], None);
        let r: ScoreResponse = http.post_json(&url, &body).await.json();
        assert_eq!(answered_by(&before, &calls(&ws)), worker, "query {q} went back to its holder");
        assert!(r.usage.prefix_tokens > 100, "{}", r.usage.prefix_tokens);
        assert_eq!(r.usage.cached_prefix_tokens, r.usage.prefix_tokens, "query {q}: the whole prefix from the cache");
    }
    p.stop().await;
}
