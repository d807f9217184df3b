//! The proxy against simulated workers, in-process on loopback: merging, least-loaded choice,
//! retries, hedges, deadlines, the breaker, hot reload and drain, and every bad-input code.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sieve_e2e::{catalogue, proxy, proxy_with, score_body, sims, test_config, Http};
use sieve_loadtest::sim::{tokens, SimConfig, SimSettingsUpdate, SimWorker};
use sieve_proxy::cluster::breaker::BreakerState;
use sieve_proxy::cluster::worker::Health;
use sieve_proxy::{Launch, RunningProxy};
use sieve_shared::proxy_config::{PolicyKind, SplitMode};
use sieve_shared::{ProxyConfig, RerankResponse, ScoreResponse, WorkerEndpoint};

const QUERY: &str = "lightweight waterproof trail running shoes";

fn endpoints(ws: &[SimWorker]) -> Vec<WorkerEndpoint> {
    ws.iter().map(|w| w.endpoint()).collect()
}

fn requests(w: &SimWorker) -> u64 {
    w.engine().counters().requests.load(Ordering::Relaxed)
}

fn slow_down(w: &SimWorker, factor: f64) {
    w.update(&SimSettingsUpdate { slowdown: Some(factor), ..Default::default() }).unwrap();
}

async fn direct(http: &Http, w: &SimWorker, body: &serde_json::Value) -> ScoreResponse {
    let r = http.post_json(&format!("{}/v1/score", w.api_url()), body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

async fn through(http: &Http, p: &RunningProxy, body: &serde_json::Value) -> sieve_e2e::Reply {
    http.post_json(&format!("{}/v1/score", p.api_url()), body).await
}

fn worker_by_url(p: &RunningProxy, url: &str) -> Arc<sieve_proxy::cluster::worker::Worker> {
    p.state.pool.snapshot().iter().find(|w| w.url() == url).cloned().expect("worker in pool")
}

fn no_hedge(mut c: ProxyConfig) -> ProxyConfig {
    c.hedge.enabled = false;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scores_merge_back_in_order_for_any_split() {
    let http = Http::new();
    let ws = sims(3, SimConfig::default()).await;
    let items = catalogue(150, 1);
    let mut body = score_body(QUERY, &items, None);
    body["items"][3] = json!({"id": "sku-3", "text": items[3]});
    let want = direct(&http, &ws[0], &body).await;

    let modes: [(SplitMode, PolicyKind, usize); 5] = [
        (SplitMode::Cost, PolicyKind::LeastLoaded, 0),
        (SplitMode::Cost, PolicyKind::PowerOfTwo, 0),
        (SplitMode::Fixed, PolicyKind::Random, 7),
        (SplitMode::Fixed, PolicyKind::RoundRobin, 64),
        (SplitMode::None, PolicyKind::LeastLoaded, 0),
    ];
    for (mode, policy, chunk) in modes {
        let mut cfg = test_config(endpoints(&ws));
        cfg.split.mode = mode;
        cfg.balance.policy = policy;
        cfg.split.fixed_items = chunk.max(1);
        let p = proxy(cfg, 3).await;
        let r = through(&http, &p, &body).await;
        assert_eq!(r.status, 200, "{mode:?}: {}", r.text());
        let got: ScoreResponse = r.json();
        assert_eq!(got.scores, want.scores, "{mode:?}/{policy:?}: scores in input order");
        assert!(got.missing.is_empty());
        assert_eq!(got.ids.as_ref().and_then(|ids| ids[3].clone()).as_deref(), Some("sku-3"));
        assert_eq!(got.usage.item_tokens, want.usage.item_tokens);
        assert_eq!(got.usage.pairs, 150);
        let shards: usize = r.header("x-sieve-shards").unwrap().parse().unwrap();
        match mode {
            SplitMode::Cost | SplitMode::CostUngrouped => assert!(shards >= 2, "cost split fans out: {shards}"),
            SplitMode::Fixed => assert_eq!(shards, 150usize.div_ceil(chunk)),
            SplitMode::None => assert_eq!(shards, 1),
        }
        for h in ["x-sieve-queue-ms", "x-sieve-compute-ms", "x-sieve-total-ms"] {
            assert!(r.header(h).is_some_and(|v| v.parse::<f64>().is_ok()), "{h}");
        }
        // Rerank through the proxy equals rerank on a worker.
        let rr = json!({"query": QUERY, "documents": &items[..40], "top_n": 5, "return_documents": true});
        let a: RerankResponse = http.post_json(&format!("{}/v1/rerank", p.api_url()), &rr).await.json();
        let b: RerankResponse = http.post_json(&format!("{}/v1/rerank", ws[1].api_url()), &rr).await.json();
        assert_eq!(a.results, b.results);
        p.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_go_to_the_least_loaded_workers() {
    let http = Http::new();
    // Slow workers, so that a big direct call keeps two of them busy for seconds.
    let ws = sims(4, SimConfig { speed: 0.05, ..SimConfig::default() }).await;
    let p = proxy(no_hedge(test_config(endpoints(&ws))), 4).await;
    let big = score_body(QUERY, &catalogue(400, 2), None);
    let mut busy = Vec::new();
    for w in &ws[..2] {
        let (http, url, big) = (http.clone(), format!("{}/v1/score", w.api_url()), big.clone());
        busy.push(tokio::spawn(async move { http.post_json(&url, &big).await.status }));
    }
    // Wait until the proxy has seen their queues in a load report.
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let model = p.state.cost_model();
        let params = sieve_proxy::AppState::view_params(&p.state.config());
        let loaded = ws[..2]
            .iter()
            .all(|w| worker_by_url(&p, &w.api_url()).view(Instant::now(), &model, &params).backlog_ms > 10.0);
        if loaded {
            break;
        }
        assert!(Instant::now() < end, "the proxy never saw the workers' queues");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let body = score_body(QUERY, &catalogue(30, 3), None);
    let r = through(&http, &p, &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!((requests(&ws[0]), requests(&ws[1])), (1, 1), "busy workers got no shard");
    assert!(requests(&ws[2]) + requests(&ws[3]) >= 1);
    for b in busy {
        b.abort();
    }
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_is_retried_elsewhere_when_its_worker_dies_mid_shard() {
    let http = Http::new();
    let ws = sims(2, SimConfig::default()).await;
    let p = proxy(no_hedge(test_config(endpoints(&ws))), 2).await;
    let body = score_body(QUERY, &catalogue(100, 4), None);
    let want = direct(&http, &ws[0], &body).await;
    slow_down(&ws[1], 100.0); // its shard will take about a second
    let (http2, url, b2) = (http.clone(), format!("{}/v1/score", p.api_url()), body.clone());
    let call = tokio::spawn(async move { http2.post_json(&url, &b2).await });
    // Kill the worker while its shard is being computed.
    let end = Instant::now() + Duration::from_secs(5);
    while ws[1].engine().counters().in_flight.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < end, "the slow worker never got its shard");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    ws[1].kill();
    let r = call.await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let got: ScoreResponse = r.json();
    assert!(got.missing.is_empty(), "complete despite the death");
    assert_eq!(got.scores, want.scores);
    let survivor = worker_by_url(&p, &ws[0].api_url());
    assert!(survivor.counters.retries.load(Ordering::Relaxed) >= 1, "the shard was retried on the survivor");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_shard_is_hedged_and_the_loser_cancelled() {
    let http = Http::new();
    let ws = sims(2, SimConfig::default()).await;
    let mut cfg = test_config(endpoints(&ws));
    cfg.hedge.budget_ratio = 1.0;
    let p = proxy(cfg, 2).await;
    let body = score_body(QUERY, &catalogue(100, 5), None);
    let want = direct(&http, &ws[0], &body).await;
    // Warm up: the proxy learns what shard times look like (and earns hedge budget).
    for _ in 0..30 {
        assert_eq!(through(&http, &p, &body).await.status, 200);
    }
    assert!(p.state.ratios.samples() >= 20);
    let hedges = |p: &RunningProxy| {
        p.state.pool.snapshot().iter().map(|w| w.counters.hedges.load(Ordering::Relaxed)).sum::<u64>()
    };
    let hedges_before = hedges(&p);
    slow_down(&ws[1], 200.0); // about two seconds instead of ten milliseconds
    let r = through(&http, &p, &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let got: ScoreResponse = r.json();
    assert!(got.missing.is_empty());
    assert_eq!(got.scores, want.scores);
    assert!(hedges(&p) > hedges_before, "the lagging shard was hedged");
    // The slow worker's copy was cancelled (its connection closed), not left to run.
    let end = Instant::now() + Duration::from_secs(3);
    while ws[1].engine().counters().cancelled.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < end, "the hedge's loser was not cancelled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedge_denied_for_want_of_an_idle_worker_is_tried_again() {
    let http = Http::new();
    let ws = sims(3, SimConfig::default()).await;
    let mut cfg = test_config(endpoints(&ws));
    cfg.hedge.budget_ratio = 1.0;
    // One shard per worker.
    cfg.split.mode = SplitMode::Fixed;
    cfg.split.fixed_items = 34;
    let p = proxy(cfg, 3).await;
    let body = score_body(QUERY, &catalogue(100, 8), None);
    for _ in 0..30 {
        assert_eq!(through(&http, &p, &body).await.status, 200);
    }
    let hedges = |p: &RunningProxy| {
        p.state.pool.snapshot().iter().map(|w| w.counters.hedges.load(Ordering::Relaxed)).sum::<u64>()
    };
    let before = hedges(&p);
    // Two shards lag at once; the one idle worker can take one copy at a time (hedges go only
    // to idle workers), so the second must be tried again once the first copy is done.
    slow_down(&ws[1], 200.0);
    slow_down(&ws[2], 200.0);
    let r = through(&http, &p, &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json::<ScoreResponse>().missing.is_empty());
    assert!(hedges(&p) - before >= 2, "both lagging shards were hedged: {}", hedges(&p) - before);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_gives_a_partial_answer_with_missing_indices() {
    let http = Http::new();
    let ws = sims(2, SimConfig::default()).await;
    // Half the items on each worker, whatever the stats the direct call below leaves behind
    // (a worker briefly reported busy): round robin gives two shards two workers.
    let mut cfg = no_hedge(test_config(endpoints(&ws)));
    cfg.split.mode = SplitMode::Fixed;
    cfg.split.fixed_items = 50;
    cfg.balance.policy = PolicyKind::RoundRobin;
    // No retry: the slow worker drops its shard at the deadline it was given, a little before
    // the proxy's own, and a retry on the fast worker could still fit in what is left.
    cfg.retry.max_attempts = 1;
    let p = proxy(cfg, 2).await;
    let items = catalogue(100, 6);
    let want = direct(&http, &ws[0], &score_body(QUERY, &items, None)).await;
    slow_down(&ws[1], 500.0);
    let r = through(&http, &p, &score_body(QUERY, &items, Some(300))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let got: ScoreResponse = r.json();
    let slow = ws[1].engine().stats();
    assert!(!got.missing.is_empty(), "the slow worker's items are missing; it reports {:?}", slow.extra.get("sim"));
    assert!(got.missing.len() < items.len(), "the fast worker's items are not");
    let listed = got.missing.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    assert_eq!(r.header("x-sieve-missing"), Some(listed.as_str()), "the header lists the missing indices");
    for (i, s) in got.scores.iter().enumerate() {
        if got.missing.contains(&i) {
            assert_eq!(*s, None, "item {i} is listed missing and has no score");
        } else {
            assert_eq!(*s, want.scores[i], "item {i}");
        }
    }
    // Nothing in time at all: 504, not an empty answer.
    slow_down(&ws[0], 500.0);
    let r = through(&http, &p, &score_body(QUERY, &items, Some(200))).await;
    assert_eq!(r.status, 504, "{}", r.text());
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_opens_probes_half_open_and_closes() {
    let http = Http::new();
    let ws = sims(2, SimConfig::default()).await;
    let mut cfg = no_hedge(test_config(endpoints(&ws)));
    cfg.breaker.failure_threshold = 3;
    cfg.breaker.open_ms = 300;
    let p = proxy(cfg, 2).await;
    let sick = worker_by_url(&p, &ws[1].api_url());
    let body = score_body(QUERY, &catalogue(80, 7), None);
    ws[1].update(&SimSettingsUpdate { fail_rate: Some(1.0), ..Default::default() }).unwrap();
    // Each request loses its shard on the sick worker and retries it on the healthy one.
    for _ in 0..3 {
        let r = through(&http, &p, &body).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.json::<ScoreResponse>().missing.is_empty());
    }
    assert_eq!(sick.breaker_state(Instant::now()), BreakerState::Open);
    let seen = requests(&ws[1]);
    assert_eq!(through(&http, &p, &body).await.status, 200);
    assert_eq!(requests(&ws[1]), seen, "an open breaker lets nothing through");
    // Recovered; after the open period one probe is let through, and its success closes it.
    ws[1].update(&SimSettingsUpdate { fail_rate: Some(0.0), ..Default::default() }).unwrap();
    let end = Instant::now() + Duration::from_secs(3);
    while sick.breaker_state(Instant::now()) != BreakerState::HalfOpen {
        assert!(Instant::now() < end, "never half-open");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(through(&http, &p, &body).await.status, 200);
    assert!(requests(&ws[1]) > seen, "the half-open breaker sent a probe");
    assert_eq!(sick.breaker_state(Instant::now()), BreakerState::Closed);
    p.stop().await;
}

/// Requests in a loop from `clients` tasks until stopped; counts the ones that were not a
/// complete 200.
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<Vec<String>>>,
}

impl Load {
    fn start(http: &Http, url: String, clients: usize, items: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let tasks = (0..clients)
            .map(|c| {
                let (http, url, stop, ok) = (http.clone(), url.clone(), stop.clone(), ok.clone());
                let body = score_body(QUERY, &catalogue(items, 100 + c as u64), None);
                tokio::spawn(async move {
                    let mut failures = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        match http.try_post_json(&url, &body).await {
                            Ok(r) if r.status == 200 && r.json::<ScoreResponse>().missing.is_empty() => {
                                ok.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(r) => failures.push(format!("{}: {}", r.status, r.text())),
                            Err(e) => failures.push(e),
                        }
                    }
                    failures
                })
            })
            .collect();
        Load { stop, ok, tasks }
    }

    async fn finish(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let mut failures = Vec::new();
        for t in self.tasks {
            failures.extend(t.await.unwrap());
        }
        (self.ok.load(Ordering::Relaxed), failures)
    }
}

fn write_config(path: &std::path::Path, cfg: &ProxyConfig) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, cfg.to_toml()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_reload_of_the_worker_list_under_load_fails_nothing() {
    let http = Http::new();
    let ws = sims(4, SimConfig { speed: 0.25, ..SimConfig::default() }).await;
    let dir = std::env::temp_dir().join(format!("sieve-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("proxy.toml");
    let base = test_config(vec![]);
    let with = |idx: &[usize]| ProxyConfig { workers: idx.iter().map(|&i| ws[i].endpoint()).collect(), ..base.clone() };
    write_config(&path, &with(&[0, 1]));
    let launch = Launch { config: with(&[0, 1]), config_path: Some(path.clone()), ..Launch::default() };
    let p = proxy_with(launch, 2).await;
    let load = Load::start(&http, format!("{}/v1/score", p.api_url()), 4, 40);
    for set in [&[1, 2][..], &[2, 3], &[3, 0], &[0, 1, 2, 3]] {
        tokio::time::sleep(Duration::from_millis(300)).await;
        write_config(&path, &with(set));
        let end = Instant::now() + Duration::from_secs(5);
        let want: Vec<String> = set.iter().map(|&i| ws[i].api_url()).collect();
        loop {
            let now: Vec<String> = p.state.pool.snapshot().iter().map(|w| w.url().to_string()).collect();
            if now == want {
                break;
            }
            assert!(Instant::now() < end, "reload to {want:?} not applied: {now:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (ok, failures) = load.finish().await;
    assert!(failures.is_empty(), "{} failed requests, first: {:?}", failures.len(), failures.first());
    assert!(ok >= 20, "only {ok} requests completed");
    for w in &ws {
        assert!(requests(w) > 0, "{} never got a shard", w.api_url());
    }
    p.stop().await;
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_worker_gets_no_new_shards_and_nothing_fails() {
    let http = Http::new();
    let mut ws = sims(3, SimConfig { speed: 0.25, ..SimConfig::default() }).await;
    let p = proxy(test_config(endpoints(&ws)), 3).await;
    let load = Load::start(&http, format!("{}/v1/score", p.api_url()), 3, 40);
    tokio::time::sleep(Duration::from_millis(300)).await;
    ws[1].drain();
    let draining = worker_by_url(&p, &ws[1].api_url());
    let end = Instant::now() + Duration::from_secs(3);
    while draining.state().health != Health::Draining {
        assert!(Instant::now() < end, "the proxy never saw the drain");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let seen = requests(&ws[1]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(requests(&ws[1]), seen, "no shard goes to a draining worker");
    // It finishes and goes away; still nothing fails.
    let gone = ws.remove(1);
    gone.shutdown().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (ok, failures) = load.finish().await;
    assert!(failures.is_empty(), "{} failed requests, first: {:?}", failures.len(), failures.first());
    assert!(ok >= 10, "only {ok} requests completed");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_the_workers_codes_before_any_shard_is_sent() {
    let http = Http::new();
    let ws = sims(2, SimConfig { max_seq_tokens: 200, ..SimConfig::default() }).await;
    let mut cfg = test_config(endpoints(&ws));
    cfg.limits.max_items = 50;
    cfg.limits.max_body_bytes = 20_000;
    cfg.limits.max_item_chars = 5000;
    let p = proxy(cfg, 2).await;
    let url = format!("{}/v1/score", p.api_url());
    let items = catalogue(10, 8);
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        ("syntax", b"{\"query\": ".to_vec(), 400, "malformed"),
        ("empty query", serde_json::to_vec(&json!({"query": " ", "items": ["a"]})).unwrap(), 422, "query"),
        ("no items", serde_json::to_vec(&json!({"query": "q", "items": []})).unwrap(), 422, "items"),
        ("empty item", serde_json::to_vec(&json!({"query": "q", "items": ["a", ""]})).unwrap(), 422, "items[1]"),
        ("wrong type", serde_json::to_vec(&json!({"query": 3, "items": ["a"]})).unwrap(), 422, "invalid"),
        (
            "unknown field",
            serde_json::to_vec(&json!({"query": "q", "items": ["a"], "itmes": 1})).unwrap(),
            422,
            "itmes",
        ),
        (
            "zero deadline",
            serde_json::to_vec(&json!({"query": "q", "items": ["a"], "deadline_ms": 0})).unwrap(),
            422,
            "deadline_ms",
        ),
        (
            "too many items",
            serde_json::to_vec(&json!({"query": "q", "items": vec!["a"; 51]})).unwrap(),
            413,
            "max_items 50",
        ),
        (
            "long item",
            serde_json::to_vec(&json!({"query": "q", "items": ["x".repeat(5001)]})).unwrap(),
            413,
            "items[0]",
        ),
        (
            "big body",
            serde_json::to_vec(&json!({"query": "q", "items": vec!["y".repeat(1000); 30]})).unwrap(),
            413,
            "max_body_bytes",
        ),
    ];
    for (name, body, status, needle) in cases {
        let r = http.post(&url, body).await;
        assert_eq!(r.status, status, "{name}: {}", r.text());
        let e: serde_json::Value = r.json();
        assert_eq!(e["error"]["code"], status, "{name}");
        let msg = e["error"]["message"].as_str().unwrap_or("");
        assert!(msg.contains(needle) || e["error"]["type"] == needle, "{name}: {msg}");
    }
    assert_eq!(requests(&ws[0]) + requests(&ws[1]), 0, "no shard was sent for bad input");
    assert_eq!(http.get(&format!("{}/nope", p.api_url())).await.status, 404);
    assert_eq!(http.get(&url).await.status, 405);
    // A token-level limit is the worker's; its index is mapped back to the caller's.
    let mut items_long = items.clone();
    items_long[7] = "word ".repeat(300);
    let r = through(&http, &p, &score_body(QUERY, &items_long, None)).await;
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(r.text().contains("items[7]"), "{}", r.text());
    // A prompt too long ever to fit is 413 whatever the deadline, never a 429 "retry later"
    // from admission (which called it late when the deadline was short).
    items_long[7] = "word ".repeat(2000);
    for deadline_ms in [None, Some(5), Some(60_000)] {
        let r = through(&http, &p, &score_body(QUERY, &items_long, deadline_ms)).await;
        assert_eq!(r.status, 413, "deadline {deadline_ms:?}: {}", r.text());
        assert!(r.text().contains("items[7]"), "{}", r.text());
    }
    p.stop().await;

    // 429: more requests at once than allowed.
    let slow = sims(1, SimConfig { speed: 0.02, ..SimConfig::default() }).await;
    let mut cfg = test_config(endpoints(&slow));
    cfg.server.max_in_flight_requests = 1;
    let p = proxy(cfg, 1).await;
    let body = score_body(QUERY, &items, None);
    let (h2, u2, b2) = (http.clone(), format!("{}/v1/score", p.api_url()), body.clone());
    let first = tokio::spawn(async move { h2.post_json(&u2, &b2).await.status });
    let end = Instant::now() + Duration::from_secs(3);
    while p.state.drain.in_flight() == 0 {
        assert!(Instant::now() < end);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let r = through(&http, &p, &body).await;
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(first.await.unwrap(), 200);
    p.stop().await;

    // 503: no worker ready; /ready says so too.
    let p =
        proxy(test_config(vec![WorkerEndpoint::new("http://127.0.0.1:1", Some("http://127.0.0.1:1".into()))]), 0).await;
    let r = through(&http, &p, &body).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(http.get(&format!("{}/ready", p.admin_url())).await.status, 503);
    assert_eq!(http.get(&format!("{}/health", p.admin_url())).await.status, 200);
    p.stop().await;
}

/// Connections that send nothing hold the proxy's whole connection cap: real clients are still
/// served (the idle connections are closed for them), where they used to get 503 until the
/// idle ones timed out (up to 10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_connections_cannot_lock_real_clients_out() {
    let http = Http::new();
    let ws = sims(1, SimConfig::default()).await;
    let mut cfg = test_config(endpoints(&ws));
    cfg.http.max_connections = 200;
    cfg.http.header_read_timeout_ms = 10_000;
    cfg.http.idle_timeout_ms = 10_000;
    let p = proxy(cfg, 1).await;
    // 300 silent connections at once: 200 take the cap, the rest wait for a slot.
    let t0 = Instant::now();
    let mut connects = tokio::task::JoinSet::new();
    for _ in 0..300 {
        connects.spawn(tokio::net::TcpStream::connect(p.api_addr));
    }
    let flood: Vec<_> = connects.join_all().await.into_iter().filter_map(Result::ok).collect();
    eprintln!("{} idle connections opened in {:?}", flood.len(), t0.elapsed());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let body = score_body(QUERY, &catalogue(8, 3), None);
    let mut codes = Vec::new();
    for _ in 0..100 {
        codes.push(http.try_post_json(&format!("{}/v1/score", p.api_url()), &body).await.map(|r| r.status));
    }
    let ok = codes.iter().filter(|c| **c == Ok(200)).count();
    eprintln!("{ok} of {} real requests answered 200 ({:?} in all)", codes.len(), t0.elapsed());
    assert!(ok >= 99, "{codes:?}");
    drop(flood);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn estimates_recalibrate_to_what_workers_report() {
    let http = Http::new();
    let ws = sims(2, SimConfig::default()).await;
    // The second worker is three times slower than the first.
    ws[1].update(&SimSettingsUpdate { speed: Some(1.0 / 3.0), ..Default::default() }).unwrap();
    let p = proxy(no_hedge(test_config(endpoints(&ws))), 2).await;
    let probe = catalogue(300, 99);
    let token_error = |p: &RunningProxy| {
        let w = sieve_shared::sync::lock(&p.state.tokens).weights();
        let (mut err, mut total) = (0.0, 0.0);
        for t in &probe {
            let truth = f64::from(tokens::item_tokens(t));
            err += (w.item_tokens(&sieve_proxy::estimate::token_estimator::features(t)) - truth).abs();
            total += truth;
        }
        err / total
    };
    let before = token_error(&p);
    for seed in 0..40 {
        let r = through(&http, &p, &score_body(QUERY, &catalogue(60, 200 + seed), None)).await;
        assert_eq!(r.status, 200);
    }
    let after = token_error(&p);
    assert!(after < 0.05 && after < before / 2.0, "token estimate error {before:.3} → {after:.3}");
    let tf = |w: &SimWorker| worker_by_url(&p, &w.api_url()).time_factor();
    let ratio = tf(&ws[1]) / tf(&ws[0]);
    assert!((ratio - 3.0).abs() < 0.6, "measured speed ratio {ratio:.2}, true 3");
    // The shared model converges on the simulated law (per-token cost within 20%).
    let truth = SimConfig::default().cost;
    let m = p.state.cost_model();
    assert!((m.token_ms - truth.token_ms).abs() / truth.token_ms < 0.2, "{m:?} vs {truth:?}");
    p.stop().await;
}

/// A proxy whose cost prior predicts ~10 ms per token: a 100-item request cannot finish in 3 s
/// on two workers, though the sim-workers themselves are fast.
fn pessimistic(ws: &[SimWorker]) -> ProxyConfig {
    let mut cfg = no_hedge(test_config(endpoints(ws)));
    cfg.cost = sieve_shared::CostModel { request_ms: 1.0, token_ms: 10.0, token_context_ms: 0.0 };
    cfg
}

fn metric(name: &str) -> f64 {
    let text = sieve_proxy::metrics::handle().render();
    text.lines().find_map(|l| l.strip_prefix(name)?.trim().parse().ok()).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_refuses_at_once_or_answers_the_part_that_fits() {
    let http = Http::new();
    let ws = sims(2, SimConfig::default()).await;
    let items = catalogue(100, 8);
    let want = direct(&http, &ws[0], &score_body(QUERY, &items, None)).await;
    let sent_before: u64 = ws.iter().map(requests).sum();
    let p = proxy(pessimistic(&ws), 2).await;

    // Reject (the default): 429 with Retry-After, long before the deadline, nothing sent.
    let rejected = metric("sieve_proxy_admission_rejected_total");
    let start = Instant::now();
    let r = through(&http, &p, &score_body(QUERY, &items, Some(3000))).await;
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(start.elapsed() < Duration::from_millis(1500), "answered at once, not at the deadline");
    assert!(r.text().contains("deadline cannot be met"), "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    let rr = json!({"query": QUERY, "documents": &items, "deadline_ms": 3000, "on_overload": "reject"});
    assert_eq!(http.post_json(&format!("{}/v1/rerank", p.api_url()), &rr).await.status, 429);
    assert_eq!(ws.iter().map(requests).sum::<u64>(), sent_before, "no shard was queued");
    assert!(metric("sieve_proxy_admission_rejected_total") >= rejected + 2.0);

    // Partial: 200 with what fits, the rest listed missing and never sent.
    let partial = metric("sieve_proxy_admission_partial_total");
    let pairs_before: u64 = ws.iter().map(|w| w.engine().counters().pairs.load(Ordering::Relaxed)).sum();
    let mut body = score_body(QUERY, &items, Some(3000));
    body["on_overload"] = json!("partial");
    let r = through(&http, &p, &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let got: ScoreResponse = r.json();
    assert!(!got.missing.is_empty() && got.missing.len() < items.len(), "{} missing", got.missing.len());
    let listed = got.missing.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    assert_eq!(r.header("x-sieve-missing"), Some(listed.as_str()), "the header lists the missing indices");
    for (i, s) in got.scores.iter().enumerate() {
        let expect = if got.missing.contains(&i) { None } else { want.scores[i] };
        assert_eq!(*s, expect, "item {i}");
    }
    let pairs: u64 = ws.iter().map(|w| w.engine().counters().pairs.load(Ordering::Relaxed)).sum();
    assert_eq!(pairs - pairs_before, (items.len() - got.missing.len()) as u64, "the missing items were never sent");
    assert!(metric("sieve_proxy_admission_partial_total") > partial);
    p.stop().await;

    // Switched off: the old behaviour, everything sent (and, the workers being fast, answered).
    let mut cfg = pessimistic(&ws);
    cfg.admission.enabled = false;
    let p = proxy(cfg, 2).await;
    let r = through(&http, &p, &score_body(QUERY, &items, Some(3000))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let got: ScoreResponse = r.json();
    assert!(got.missing.is_empty());
    assert_eq!(got.scores, want.scores);
    let pairs_after: u64 = ws.iter().map(|w| w.engine().counters().pairs.load(Ordering::Relaxed)).sum();
    assert_eq!(pairs_after - pairs, items.len() as u64, "every item sent");
    p.stop().await;
}

/// A client that hangs up on the proxy while its shards are computing leaves no work behind:
/// the proxy drops the request, which closes its shards' connections, and each worker cancels
/// its shard (nobody waits for it) instead of computing it to the end or to the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_on_the_proxy_cancels_its_shards_on_the_workers() {
    use tokio::io::AsyncWriteExt as _;
    let ws = sims(2, SimConfig::default()).await;
    let mut cfg = no_hedge(test_config(endpoints(&ws)));
    cfg.split.mode = SplitMode::Fixed;
    cfg.split.fixed_items = 50;
    let p = proxy(cfg, 2).await;
    let started = |i: usize| ws[i].engine().counters().in_flight.load(Ordering::Relaxed) > 0;
    let cancelled = |i: usize| ws[i].engine().counters().cancelled.load(Ordering::Relaxed);
    let completed = |i: usize| ws[i].engine().counters().completed.load(Ordering::Relaxed);
    let body = serde_json::to_vec(&score_body(QUERY, &catalogue(100, 9), Some(10_000))).unwrap();
    let head = format!(
        "POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    // About four seconds of compute per shard, well inside the request's 10 s deadline.
    for w in &ws {
        slow_down(w, 400.0);
    }
    let mut s = tokio::net::TcpStream::connect(p.api_addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(&body).await.unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while !(started(0) && started(1)) {
        assert!(Instant::now() < end, "the shards never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(s);
    let gone = Instant::now();
    while cancelled(0) == 0 || cancelled(1) == 0 {
        assert!(gone.elapsed() < Duration::from_secs(1), "the shards of a client gone were not cancelled within 1 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!((completed(0), completed(1)), (0, 0), "nothing computed to the end");
    while p.state.pool.snapshot().iter().any(|w| w.in_flight() > 0) {
        assert!(gone.elapsed() < Duration::from_secs(2), "the proxy still counts the shards in flight");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    p.stop().await;
}
