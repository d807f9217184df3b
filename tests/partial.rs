//! Partial answers through the proxy (issue 31): a call that cannot finish in time gets, through
//! the proxy, 200 with the scored items and `missing`, as from the worker directly, over HTTP and
//! gRPC. Its own test binary: CPU workers of other tests running at the same time on a small
//! machine would make the worker's pass sizing, and so what it scores by a deadline, a lottery.
//!
//! Needs the embedded model in the asset cache (`scripts/test` fetches it first).

use std::time::Duration;

use sieve_e2e::{proxy, spawn, test_config, Http, Proc};
use sieve_shared::{ScoreResponse, WorkerEndpoint};

/// Loading the model (and, on a fresh checkout, fetching it) may take a while.
const LOAD: Duration = Duration::from_secs(600);

fn worker() -> Proc {
    spawn("sieve-worker", &["--model", "default", "--port", "0", "--admin-port", "0", "--threads", "1"], LOAD)
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
    use sieve_server::grpc::pb;
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
    // The client's own grpc-timeout timer runs on the same loaded machine: leave its answer room
    // to arrive (the 5 ms default lost that race once in four runs here).
    cfg.grpc.deadline_margin_ms = 100;
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

/// The default suite's case: 5 s (about 17 s in all, on one worker): at 3 s a one-thread CPU
/// worker on a loaded 2-core machine scores about 9 items, too few for an 80% share to be more
/// than one item's luck.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_answer_survives_the_proxy() {
    partial_answers_through_the_proxy(&[5000]).await;
}

/// The other deadlines, 3 and 10 s (40 s): `cargo test -p sieve-e2e --test partial -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "40 s: run with --ignored"]
async fn a_partial_answer_survives_the_proxy_at_longer_deadlines() {
    partial_answers_through_the_proxy(&[3000, 10_000]).await;
}
