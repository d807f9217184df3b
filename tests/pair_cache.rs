//! The proxy's pair-score cache against simulated workers, in-process on loopback: a repeated
//! request is answered from the cache (nothing sent, the same scores bit for bit, `usage` says
//! so), an overlapping one sends only its new items, `"cache": false` sends everything again,
//! and workers reporting another model or template identity empty the cache.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::json;
use sieve_e2e::{catalogue, proxy, score_body, sims, test_config, Http};
use sieve_loadtest::sim::{SimConfig, SimWorker};
use sieve_proxy::RunningProxy;
use sieve_shared::{ProxyConfig, ScoreResponse};

const QUERY: &str = "lightweight waterproof trail running shoes";

/// Pairs the workers have scored.
fn pairs(ws: &[SimWorker]) -> u64 {
    ws.iter().map(|w| w.engine().counters().pairs.load(Ordering::Relaxed)).sum()
}

async fn score(http: &Http, p: &RunningProxy, body: &serde_json::Value) -> (ScoreResponse, usize) {
    let r = http.post_json(&format!("{}/v1/score", p.api_url()), body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let shards = r.header("x-sieve-shards").unwrap().parse().unwrap();
    (r.json(), shards)
}

fn bits(scores: &[Option<f32>]) -> Vec<u32> {
    scores.iter().map(|s| s.expect("every item scored").to_bits()).collect()
}

fn cached(ws: &[SimWorker]) -> ProxyConfig {
    let mut cfg = test_config(ws.iter().map(|w| w.endpoint()).collect());
    cfg.cache.enabled = true;
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeats_are_answered_from_the_cache_bit_for_bit() {
    let http = Http::new();
    let ws = sims(2, SimConfig::default()).await;
    let p = proxy(cached(&ws), 2).await;
    let items = catalogue(90, 7);
    let body = score_body(QUERY, &items[..60], None);

    let (first, shards) = score(&http, &p, &body).await;
    assert!(shards >= 1);
    assert_eq!(first.usage.cached_items, 0);
    assert_eq!(pairs(&ws), 60);

    // The same request again: nothing sent, the same scores and token counts.
    let (again, shards) = score(&http, &p, &body).await;
    assert_eq!(shards, 0, "a fully cached request sends nothing");
    assert_eq!(pairs(&ws), 60);
    assert_eq!(bits(&again.scores), bits(&first.scores), "bit for bit");
    assert_eq!(again.usage.cached_items, 60);
    assert_eq!(again.usage.pairs, 0);
    assert_eq!(again.usage.item_tokens, first.usage.item_tokens);
    // The tokens a client is told of (Cohere's input_tokens, vLLM's prompt_tokens) are an
    // uncached call's.
    assert_eq!(again.usage.prompt_tokens, first.usage.prompt_tokens, "cached items report their tokens");
    assert_eq!(again.usage.prefix_tokens, first.usage.prefix_tokens);
    assert_eq!(again.model, first.model);
    assert!(again.missing.is_empty());

    // Overlapping (paging): only the 30 new items are sent; every score is what a worker gives.
    let body = score_body(QUERY, &items[30..], None);
    let (page, _) = score(&http, &p, &body).await;
    assert_eq!(page.usage.cached_items, 30);
    assert_eq!(page.usage.pairs, 30);
    assert_eq!(pairs(&ws), 90);
    let direct: ScoreResponse = http.post_json(&format!("{}/v1/score", ws[0].api_url()), &body).await.json();
    assert_eq!(bits(&page.scores), bits(&direct.scores));
    assert_eq!(page.usage.item_tokens, direct.usage.item_tokens);
    assert_eq!(page.usage.prompt_tokens, direct.usage.prompt_tokens, "half cached, the same token count");

    // Opted out: everything is sent again, and the answer says nothing came from the cache.
    let mut opt_out = score_body(QUERY, &items[..60], None);
    opt_out["cache"] = json!(false);
    let (fresh, shards) = score(&http, &p, &opt_out).await;
    assert!(shards >= 1);
    assert_eq!(fresh.usage.cached_items, 0);
    assert_eq!(pairs(&ws), 90 + 60 + 60, "the direct call's 60, then all 60 again");
    assert_eq!(bits(&fresh.scores), bits(&first.scores));
    // A bad value is refused by name.
    let mut bad = score_body(QUERY, &items[..2], None);
    bad["cache"] = json!("no");
    let r = http.post_json(&format!("{}/v1/score", p.api_url()), &bad).await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(r.text().contains("invalid type"), "{}", r.text());

    // Another instruction is another pair.
    let mut other = score_body(QUERY, &items[..60], None);
    other["instruction"] = json!("rank by price");
    let (o, _) = score(&http, &p, &other).await;
    assert_eq!(o.usage.cached_items, 0);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_reporting_another_model_empty_the_cache() {
    another_identity_empties_the_cache(SimConfig { model: "sim-v2".into(), ..SimConfig::default() }).await;
}

/// The same model with another prompt template (or score head) scores differently: its
/// template identity is in the key, and a change empties the cache as a model change does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_reporting_another_template_empty_the_cache() {
    let new = SimConfig { template: "sim-template-v2".into(), ..SimConfig::default() };
    assert_eq!(new.model, SimConfig::default().model, "the same model");
    another_identity_empties_the_cache(new).await;
}

/// Scores cached from workers of the default identity; the worker list then holds only a
/// worker of `new`'s model and template: the cache is emptied within a health interval.
async fn another_identity_empties_the_cache(new: SimConfig) {
    let (new_model, new_template) = (new.model.clone(), new.template.clone());
    let http = Http::new();
    let old = sims(1, SimConfig::default()).await;
    let cfg = cached(&old);
    let p = proxy(cfg.clone(), 1).await;
    let body = score_body(QUERY, &catalogue(40, 3), None);
    score(&http, &p, &body).await;
    assert_eq!(score(&http, &p, &body).await.0.usage.cached_items, 40);

    // The worker list now holds only workers of another model.
    let new = sims(1, new).await;
    p.state.pool.replace(&[new[0].endpoint()], &cfg.breaker);
    p.state.health_wake.notify_one();
    let end = Instant::now() + Duration::from_secs(10);
    while p.state.pool.eligible(Instant::now()).iter().any(|w| w.url() != new[0].api_url()) {
        assert!(Instant::now() < end, "the new worker did not become the only eligible one");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Its health check reports the new model: within an interval the cache is emptied.
    let (r, shards) = loop {
        let (r, shards) = score(&http, &p, &body).await;
        if r.usage.cached_items == 0 || Instant::now() > end {
            break (r, shards);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(r.usage.cached_items, 0, "the old identity's scores are not served");
    assert!(shards >= 1);
    assert_eq!(r.model, new_model);
    let direct: ScoreResponse = http.post_json(&format!("{}/v1/score", new[0].api_url()), &body).await.json();
    assert_eq!(direct.template, new_template, "the worker reports its template identity in answers");
    assert_eq!(new[0].engine().counters().pairs.load(Ordering::Relaxed), 80, "the proxy's 40 and the direct 40");
    // And the new identity's answers are cached in their turn.
    let (again, shards) = score(&http, &p, &body).await;
    assert_eq!((again.usage.cached_items, shards), (40, 0));
    assert_eq!(again.model, new_model);
    p.stop().await;
}

/// Admission with part of a request cached: the split and admission see only the items not
/// cached, and what they leave out maps back to the caller's indices. The proxy's cost prior
/// (~10 ms a token) makes a 100-item request too slow for its deadline, so admission sends part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_answer_caches_only_what_was_scored_and_the_rest_is_sent_again() {
    let http = Http::new();
    let ws = sims(2, SimConfig::default()).await;
    let items = catalogue(100, 8);
    let want: ScoreResponse =
        http.post_json(&format!("{}/v1/score", ws[0].api_url()), &score_body(QUERY, &items, None)).await.json();
    let mut cfg = cached(&ws);
    cfg.hedge.enabled = false;
    cfg.cost = sieve_shared::CostModel { request_ms: 1.0, token_ms: 10.0, token_context_ms: 0.0 };
    let p = proxy(cfg, 2).await;
    let mut body = score_body(QUERY, &items, Some(3000));
    body["on_overload"] = json!("partial");

    let (first, _) = score(&http, &p, &body).await;
    assert!(!first.missing.is_empty() && first.missing.len() < items.len(), "{} missing", first.missing.len());
    let before = pairs(&ws);
    let (second, _) = score(&http, &p, &body).await;
    assert_eq!(second.usage.cached_items as usize, items.len() - first.missing.len(), "only scored items were stored");
    assert!(second.missing.iter().all(|i| first.missing.contains(i)), "a cached item is never missing");
    for (i, s) in second.scores.iter().enumerate() {
        let expect = if second.missing.contains(&i) { None } else { want.scores[i] };
        assert_eq!(s.map(f32::to_bits), expect.map(f32::to_bits), "item {i}");
    }
    let sent = pairs(&ws) - before;
    assert!(sent > 0 && !second.missing.is_empty(), "admission sent part of the uncached rest and left out part");
    assert_eq!(sent as usize, first.missing.len() - second.missing.len(), "only the first answer's missing were sent");
    p.stop().await;
}
