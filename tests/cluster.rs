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

/// 64 items of 64 words each: more than a one-thread CPU worker scores in a few seconds.
fn long_items() -> Vec<String> {
    const WORDS: [&str; 12] = [
        "trail",
        "running",
        "shoe",
        "waterproof",
        "grip",
        "mesh",
        "upper",
        "black",
        "rubber",
        "carbon",
        "knit",
        "heel",
    ];
    (0..64).map(|i| (0..64).fold(format!("Item {i}:"), |t, w| t + " " + WORDS[(i * 7 + w * 5) % WORDS.len()])).collect()
}

/// How many items an answer scored, after checking it lists every other one as missing.
fn scored(r: &ScoreResponse) -> usize {
    let unscored: Vec<usize> = (0..r.scores.len()).filter(|&i| r.scores[i].is_none()).collect();
    assert_eq!(r.missing, unscored, "missing lists exactly the items without a score");
    r.scores.len() - unscored.len()
}

/// A call that cannot finish in time gets, through the proxy, a partial answer (200 with the
/// scored items and `missing`) as from the worker directly, over HTTP and over gRPC (its
/// `grpc-timeout` as the deadline): the proxy sends the worker its time left less what the
/// answer needs to come back (`estimate::answer_margin`), so the worker's partial answer is not
/// cut off by the proxy's own timer. Each deadline in `deadlines_ms` costs three times its
/// length (direct, HTTP, gRPC) on one worker.
async fn partial_answers_through_the_proxy(deadlines_ms: &[u64]) {
    use sieve_shared::grpc::pb;
    let http = Http::new();
    let w = worker();
    assert!(sieve_e2e::wait_ready(&http, &w.admin_url(), LOAD).await, "worker {} never ready", w.api);
    let items = long_items();
    let body =
        |deadline_ms: u64| serde_json::json!({"query": "trail shoes", "items": items, "deadline_ms": deadline_ms});
    // A first, small call: the worker measures its speed and sizes its passes from then on.
    let warm_body = serde_json::json!({"query": "trail shoes", "items": items[..4], "deadline_ms": 60_000});
    let warm = http.post_json(&format!("{}/v1/score", w.api_url()), &warm_body).await;
    assert_eq!(warm.status, 200, "{}", warm.text());

    let mut cfg = test_config(vec![WorkerEndpoint::new(w.api_url(), Some(w.admin_url()))]);
    cfg.hedge.enabled = false;
    cfg.grpc.port = Some(0);
    let p = proxy(cfg, 1).await;
    let grpc_url = format!("http://{}", p.grpc_addr.expect("gRPC port"));
    let channel = tonic::transport::Endpoint::from_shared(grpc_url).unwrap().connect().await.unwrap();
    let mut grpc = pb::sieve_client::SieveClient::new(channel);
    for &d in deadlines_ms {
        let direct = http.post_json(&format!("{}/v1/score", w.api_url()), &body(d)).await;
        assert_eq!(direct.status, 200, "direct, {d} ms: {}", direct.text());
        let direct = scored(&direct.json());
        assert!(direct < items.len(), "{d} ms is not enough for a partial answer: {direct} scored");

        let r = http.post_json(&format!("{}/v1/score", p.api_url()), &body(d)).await;
        assert_eq!(r.status, 200, "through the proxy, {d} ms: {}", r.text());
        let via_http = scored(&r.json());

        let texts = items.iter().map(|t| pb::Item { text: t.clone(), id: None }).collect();
        let mut req =
            tonic::Request::new(pb::ScoreRequest { query: "trail shoes".into(), items: texts, ..Default::default() });
        req.set_timeout(Duration::from_millis(d));
        let g = grpc.score(req).await.unwrap_or_else(|s| panic!("gRPC, {d} ms: {s:?}")).into_inner();
        let via_grpc = g.scores.iter().filter(|s| !s.is_nan()).count();
        assert_eq!(g.missing.len() + via_grpc, items.len(), "gRPC, {d} ms: missing lists the rest");

        eprintln!("deadline {d} ms: scored {direct} directly, {via_http} through the proxy, {via_grpc} over gRPC");
        for (what, n) in [("HTTP", via_http), ("gRPC", via_grpc)] {
            assert!(n * 5 >= direct * 4, "{what}, {d} ms: {n} scored through the proxy, {direct} directly");
        }
    }
    p.stop().await;
}

/// The default suite's case: 3 s (about 10 s in all, on one worker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_answer_survives_the_proxy() {
    partial_answers_through_the_proxy(&[3000]).await;
}

/// The other deadlines, 5 and 10 s (45 s): `cargo test -p sieve-e2e --test cluster -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "45 s: run with --ignored"]
async fn a_partial_answer_survives_the_proxy_at_longer_deadlines() {
    partial_answers_through_the_proxy(&[5000, 10_000]).await;
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
