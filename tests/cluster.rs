//! The real thing: `sieve-worker` processes on the embedded model behind the proxy.
//! Scores through the proxy equal scores from a worker called directly, in order, for any
//! split; and `sieve up` runs the demo end to end and leaves nothing running.
//!
//! Needs the embedded model in the asset cache (`scripts/test` fetches it first). CPU workers
//! on the embedded model are slow on a small machine, so the calls here are small.

use std::time::Duration;

use sieve_e2e::{proxy, spawn, test_config, Http, Proc};
use sieve_shared::proxy_config::{PolicyKind, SplitMode};
use sieve_shared::{ScoreResponse, WorkerEndpoint};

/// Loading the model (and, on a fresh checkout, fetching it) may take a while.
const LOAD: Duration = Duration::from_secs(600);

fn worker() -> Proc {
    spawn("sieve-worker", &["--model", "default", "--port", "0", "--admin-port", "0", "--threads", "1"], LOAD)
}

/// Five short products from the demo request, with its query.
fn small_demo() -> serde_json::Value {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/demo-request.json")).unwrap();
    let mut demo: serde_json::Value = serde_json::from_str(&text).unwrap();
    let keep = ["sku-1016", "sku-1010", "sku-1017", "sku-1005", "sku-1008"];
    let items: Vec<serde_json::Value> = demo["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| keep.contains(&i["id"].as_str().unwrap_or("")))
        .cloned()
        .collect();
    assert_eq!(items.len(), keep.len());
    demo["items"] = items.into();
    demo["deadline_ms"] = 300_000.into();
    demo
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scores_through_the_proxy_equal_a_worker_called_directly_for_any_split() {
    let http = Http::new();
    let workers = [worker(), worker()];
    for w in &workers {
        assert!(sieve_e2e::wait_ready(&http, &w.admin_url(), LOAD).await, "worker {} never ready", w.api);
    }
    let body = small_demo();
    let direct = |w: &Proc| {
        let (http, url, body) = (http.clone(), format!("{}/v1/score", w.api_url()), body.clone());
        async move {
            let r = http.post_json(&url, &body).await;
            assert_eq!(r.status, 200, "{}", r.text());
            r.json::<ScoreResponse>()
        }
    };
    let want = direct(&workers[0]).await;
    assert_eq!(want.scores.len(), 5);
    assert!(want.scores.iter().all(|s| s.is_some_and(|s| (0.0..=1.0).contains(&s))));
    // Another worker process gives the same answer, under the same template identity (a
    // digest of its prompt template and score head: the proxy's pair cache keys on it).
    let other = direct(&workers[1]).await;
    assert_eq!(other.scores, want.scores);
    assert_eq!(want.template.len(), 16, "template identity {:?}", want.template);
    assert_eq!(other.template, want.template);

    let endpoints: Vec<WorkerEndpoint> =
        workers.iter().map(|w| WorkerEndpoint::new(w.api_url(), Some(w.admin_url()))).collect();
    // Whole, one item per shard, uneven shards, round-robin shards, and the cost-balanced split.
    for (mode, chunk, policy, shards) in [
        (SplitMode::None, 1, PolicyKind::LeastLoaded, Some(1)),
        (SplitMode::Fixed, 1, PolicyKind::LeastLoaded, Some(5)),
        (SplitMode::Fixed, 3, PolicyKind::RoundRobin, Some(2)),
        (SplitMode::Cost, 1, PolicyKind::LeastLoaded, None),
    ] {
        let mut cfg = test_config(endpoints.clone());
        cfg.split.mode = mode;
        cfg.split.fixed_items = chunk;
        cfg.balance.policy = policy;
        cfg.hedge.enabled = false;
        let p = proxy(cfg, 2).await;
        let r = http.post_json(&format!("{}/v1/score", p.api_url()), &body).await;
        assert_eq!(r.status, 200, "{mode:?}/{chunk}: {}", r.text());
        if let Some(n) = shards {
            assert_eq!(r.header("x-sieve-shards"), Some(n.to_string().as_str()), "{mode:?}/{chunk}");
        }
        let got: ScoreResponse = r.json();
        assert_eq!(got.scores, want.scores, "{mode:?}/{chunk}: the same scores, in the same order");
        assert_eq!(got.usage.item_tokens, want.usage.item_tokens);
        assert_eq!(got.ids, want.ids);
        assert!(got.missing.is_empty());
        p.stop().await;
    }
}

#[test]
fn sieve_up_runs_the_demo_on_the_embedded_model_and_leaves_nothing_running() {
    let stdout = sieve_e2e::sieve_up_demo(&["up", "--workers", "2"]);
    assert!(stdout.contains("model SmolLM2"), "{stdout}");
    let ranked: Vec<f32> = stdout
        .lines()
        .filter(|l| l.contains("sku-"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect();
    assert_eq!(ranked.len(), 20);
    assert!(ranked.windows(2).all(|w| w[0] >= w[1]), "best first: {ranked:?}");
    let addrs = sieve_e2e::printed_addresses(&stdout);
    assert_eq!(addrs.len(), 6, "{stdout}");
    assert!(sieve_e2e::all_closed(&addrs), "a process of the cluster is still listening");
}
