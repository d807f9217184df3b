//! The gRPC API (`proto/sieve.proto`) against real servers on loopback: `Score` and `Rerank`
//! answer what the HTTP API answers (proxy and sim-worker processes), every error kind has its
//! gRPC code with the HTTP message and the rich details, the call's gRPC deadline is its request
//! deadline, and a client that cancels cancels the work.

use std::time::{Duration, Instant};

use serde_json::json;
use sieve_e2e::{catalogue, proxy, sims, spawn, test_config, wait_ready, Http, Proc};
use sieve_loadtest::sim::{SimConfig, SimWorker};
use sieve_server::grpc::pb::sieve_client::SieveClient;
use sieve_server::grpc::pb::{self, OnOverload};
use sieve_shared::{CostModel, Limits, RerankResponse, ScoreResponse};
use tonic::transport::Channel;
use tonic::Code;
use tonic_types::StatusExt;

const QUERY: &str = "waterproof trail running shoes";
const START: Duration = Duration::from_secs(20);
const CALL: Duration = Duration::from_secs(20);

type Client = SieveClient<Channel>;

async fn client(url: &str) -> Client {
    let ch = tonic::transport::Endpoint::from_shared(url.to_string()).unwrap().connect().await.unwrap();
    SieveClient::new(ch)
}

/// The `grpc=HOST:PORT` of a listening line, as a URL.
fn grpc_url(p: &Proc) -> String {
    let addr = p.line.split_whitespace().find_map(|w| w.strip_prefix("grpc=")).unwrap_or_else(|| panic!("{}", p.line));
    format!("http://{addr}")
}

fn items(texts: &[String]) -> Vec<pb::Item> {
    texts
        .iter()
        .enumerate()
        // Every third item carries an id, so ids are echoed (and "" stands for none).
        .map(|(i, t)| pb::Item { text: t.clone(), id: (i % 3 == 0).then(|| format!("id-{i}")) })
        .collect()
}

fn json_items(texts: &[String]) -> Vec<serde_json::Value> {
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| if i % 3 == 0 { json!({"id": format!("id-{i}"), "text": t}) } else { json!(t) })
        .collect()
}

fn score_req(texts: &[String]) -> pb::ScoreRequest {
    pb::ScoreRequest { query: QUERY.into(), items: items(texts), ..Default::default() }
}

async fn score(
    c: &mut Client,
    req: impl tonic::IntoRequest<pb::ScoreRequest>,
) -> Result<pb::ScoreResponse, tonic::Status> {
    tokio::time::timeout(CALL, c.score(req)).await.expect("an answer").map(tonic::Response::into_inner)
}

/// The gRPC answer is the HTTP answer: scores (NaN exactly where `null`), ids, missing, model.
fn assert_same_scores(g: &pb::ScoreResponse, h: &ScoreResponse, what: &str) {
    let g_scores: Vec<Option<f32>> = g.scores.iter().map(|s| (!s.is_nan()).then_some(*s)).collect();
    assert_eq!(g_scores, h.scores, "{what}: scores");
    let h_ids: Vec<String> = h.ids.clone().unwrap_or_default().into_iter().map(Option::unwrap_or_default).collect();
    assert_eq!(g.ids, h_ids, "{what}: ids");
    assert_eq!(g.missing.iter().map(|&i| i as usize).collect::<Vec<_>>(), h.missing, "{what}: missing");
    assert_eq!(g.model, h.model, "{what}: model");
    assert_eq!(g.usage.as_ref().map(|u| u.pairs), Some(h.usage.pairs), "{what}: pairs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn score_and_rerank_over_grpc_answer_what_http_answers() {
    let sim_args = ["sim-worker", "--port", "0", "--admin-port", "0", "--grpc-port", "0"];
    let (a, b) = (spawn("sieve-loadtest", &sim_args, START), spawn("sieve-loadtest", &sim_args, START));
    for w in [&a, &b] {
        assert!(w.line.contains(" grpc=127.0.0.1:"), "{}", w.line);
    }
    let args = [
        "--port",
        "0",
        "--admin-port",
        "0",
        "--grpc-port",
        "0",
        "--worker",
        &a.worker_arg(),
        "--worker",
        &b.worker_arg(),
    ];
    let p = spawn("sieve-proxy", &args, START);
    assert!(
        p.line.starts_with("sieve-proxy listening api=127.0.0.1:") && p.line.contains(" grpc=127.0.0.1:"),
        "{}",
        p.line
    );
    let http = Http::new();
    assert!(wait_ready(&http, &p.admin_url(), START).await, "proxy never ready");

    let texts = catalogue(60, 7);
    let body = json!({"query": QUERY, "items": json_items(&texts)});
    for (name, proc_) in [("proxy", &p), ("sim-worker", &a)] {
        let h: ScoreResponse = http.post_json(&format!("{}/v1/score", proc_.api_url()), &body).await.json();
        let mut c = client(&grpc_url(proc_)).await;
        // The same call again: `cache: false`, so the proxy computes it rather than answering
        // from its pair cache (which the HTTP call just filled).
        let req = pb::ScoreRequest { cache: Some(false), ..score_req(&texts) };
        let r = tokio::time::timeout(CALL, c.score(req)).await.unwrap().unwrap();
        if name == "proxy" {
            let shards =
                r.metadata().get("x-sieve-shards").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u32>().ok());
            assert!(shards.is_some_and(|n| n >= 1), "the proxy's shard count as metadata: {:?}", r.metadata());
            let cached = r.get_ref().usage.as_ref().map(|u| u.cached_items);
            assert_eq!(cached, Some(0), "the opt-out reaches the proxy over gRPC");
        }
        assert_same_scores(r.get_ref(), &h, name);

        let rerank_body = json!({"query": QUERY, "documents": texts, "top_n": 5, "return_documents": true});
        let h: RerankResponse = http.post_json(&format!("{}/v1/rerank", proc_.api_url()), &rerank_body).await.json();
        let req = pb::RerankRequest {
            query: QUERY.into(),
            documents: texts.iter().map(|t| pb::Item { text: t.clone(), id: None }).collect(),
            top_n: Some(5),
            return_documents: true,
            ..Default::default()
        };
        let g = tokio::time::timeout(CALL, c.rerank(req)).await.unwrap().unwrap().into_inner();
        assert_eq!(g.results.len(), 5, "{name}: top_n");
        let g_results: Vec<(usize, f32, Option<String>)> =
            g.results.into_iter().map(|r| (r.index as usize, r.relevance_score, r.document)).collect();
        let h_results: Vec<(usize, f32, Option<String>)> =
            h.results.into_iter().map(|r| (r.index, r.relevance_score, r.document.map(|d| d.text))).collect();
        assert_eq!(g_results, h_results, "{name}: rerank results");
    }
}

/// `n` short item texts, within the small limits.
fn short(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("Item {i}: trail running shoe, waterproof, size {}", 36 + i)).collect()
}

/// A simulated worker with small limits and a gRPC port, in-process.
async fn sim_with(cost: CostModel, fail_rate: f64) -> SimWorker {
    let mut cfg = SimConfig { cost, fail_rate, limits: small_limits(), ..SimConfig::default() };
    cfg.grpc.port = Some(0);
    SimWorker::start_local(cfg).await.expect("sim worker")
}

fn small_limits() -> Limits {
    Limits { max_items: 8, max_item_chars: 200, max_body_bytes: 4096, ..Limits::default() }
}

fn slow() -> CostModel {
    CostModel { request_ms: 2000.0, token_ms: 0.0, token_context_ms: 0.0 }
}

fn fast() -> CostModel {
    CostModel { request_ms: 1.0, token_ms: 0.0, token_context_ms: 0.0 }
}

/// The error's code, message and details as a client sees them.
fn expect_err(r: Result<pb::ScoreResponse, tonic::Status>, code: Code, says: &str, reason: &str, retry: bool) {
    let s = r.expect_err("an error");
    assert_eq!(s.code(), code, "{s:?}");
    assert!(s.message().contains(says), "{:?} lacks {says:?}", s.message());
    let info = s.get_details_error_info().unwrap_or_else(|| panic!("ErrorInfo in {s:?}"));
    assert_eq!((info.reason.as_str(), info.domain.as_str()), (reason, "sieve"));
    let delay = s.get_details_retry_info().and_then(|r| r.retry_delay);
    assert_eq!(delay.is_some(), retry, "RetryInfo in {s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_error_has_its_grpc_code_message_and_details() {
    let w = sim_with(fast(), 0.0).await;
    let mut proxy_cfg = test_config(vec![w.endpoint()]);
    proxy_cfg.limits = small_limits();
    proxy_cfg.grpc.port = Some(0);
    let p = proxy(proxy_cfg, 1).await;
    let texts = short(4);
    for url in [p.grpc_url().unwrap(), w.grpc_url().unwrap()] {
        let mut c = client(&url).await;
        assert!(score(&mut c, score_req(&texts)).await.is_ok(), "{url}: a good call");
        let empty = pb::ScoreRequest { query: " ".into(), ..score_req(&texts) };
        expect_err(score(&mut c, empty).await, Code::InvalidArgument, "query is empty", "invalid", false);
        let many = score_req(&short(9));
        expect_err(score(&mut c, many).await, Code::OutOfRange, "max_items 8", "too_large", false);
        let long = pb::ScoreRequest { items: vec![pb::Item { text: "x".repeat(201), id: None }], ..score_req(&texts) };
        expect_err(score(&mut c, long).await, Code::OutOfRange, "max_item_chars 200", "too_large", false);
        let policy = pb::ScoreRequest { on_overload: 7, ..score_req(&texts) };
        expect_err(score(&mut c, policy).await, Code::InvalidArgument, "on_overload 7", "invalid", false);
        let zero = pb::ScoreRequest { deadline_ms: Some(0), ..score_req(&texts) };
        expect_err(score(&mut c, zero).await, Code::InvalidArgument, "deadline_ms must be positive", "invalid", false);
        // Over max_body_bytes: refused by the codec before any of it is parsed.
        let huge = pb::ScoreRequest { query: "q".repeat(5000), ..score_req(&texts) };
        let s = score(&mut c, huge).await.expect_err("too large");
        assert_eq!(s.code(), Code::OutOfRange, "{s:?}");
        let top0 =
            pb::RerankRequest { query: QUERY.into(), documents: items(&texts), top_n: Some(0), ..Default::default() };
        let s = tokio::time::timeout(CALL, c.rerank(top0)).await.unwrap().expect_err("top_n 0");
        assert_eq!((s.code(), s.message()), (Code::InvalidArgument, "top_n must be at least 1"));
    }

    // 504: a call that cannot finish in its deadline.
    let slow_w = sim_with(slow(), 0.0).await;
    let mut c = client(&slow_w.grpc_url().unwrap()).await;
    let late = pb::ScoreRequest { deadline_ms: Some(50), ..score_req(&texts) };
    expect_err(score(&mut c, late).await, Code::DeadlineExceeded, "deadline", "deadline_exceeded", false);
    // 500: the worker fails.
    let failing = sim_with(fast(), 1.0).await;
    let mut c = client(&failing.grpc_url().unwrap()).await;
    expect_err(score(&mut c, score_req(&texts)).await, Code::Internal, "", "internal", false);
    // 503: draining, with RetryInfo.
    w.drain();
    let mut c = client(&w.grpc_url().unwrap()).await;
    expect_err(score(&mut c, score_req(&texts)).await, Code::Unavailable, "draining", "not_ready", true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_proxy_answers_resource_exhausted_with_retry_info() {
    let w = sim_with(slow(), 0.0).await;
    let mut cfg = test_config(vec![w.endpoint()]);
    cfg.server.max_in_flight_requests = 1;
    cfg.grpc.port = Some(0);
    let p = proxy(cfg, 1).await;
    let url = p.grpc_url().unwrap();
    let texts = short(2);
    let mut busy = client(&url).await;
    let req = score_req(&texts);
    let held = tokio::spawn(async move { busy.score(req).await });
    // The first call holds the one slot for its 2 s of compute.
    let end = Instant::now() + Duration::from_secs(5);
    while w.engine().counters().in_flight.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        assert!(Instant::now() < end, "the first call never reached the worker");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut c = client(&url).await;
    expect_err(score(&mut c, score_req(&texts)).await, Code::ResourceExhausted, "", "overloaded", true);
    held.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_deadline_is_the_request_deadline() {
    // A worker: its deadline is the call's grpc-timeout less the margin, so 2 s of work is
    // refused at once as unable to finish, not computed for 2 s.
    let w = sim_with(slow(), 0.0).await;
    let mut c = client(&w.grpc_url().unwrap()).await;
    let texts = short(3);
    let mut req = tonic::Request::new(score_req(&texts));
    req.set_timeout(Duration::from_millis(300));
    let t0 = Instant::now();
    expect_err(
        score(&mut c, req).await,
        Code::DeadlineExceeded,
        "cannot finish within the deadline",
        "deadline_exceeded",
        false,
    );
    assert!(t0.elapsed() < Duration::from_millis(1500), "answered in {:?}", t0.elapsed());

    // A proxy over slow workers: with `partial`, the answer comes by the gRPC deadline with the
    // unscored items in `missing` (NaN scores), long before the 5 s default deadline.
    let sims = sims(2, SimConfig { cost: slow(), ..SimConfig::default() }).await;
    let mut cfg = test_config(sims.iter().map(SimWorker::endpoint).collect());
    cfg.grpc.port = Some(0);
    let p = proxy(cfg, 2).await;
    let mut c = client(&p.grpc_url().unwrap()).await;
    let mut req =
        tonic::Request::new(pb::ScoreRequest { on_overload: OnOverload::Partial as i32, ..score_req(&texts) });
    req.set_timeout(Duration::from_millis(400));
    let t0 = Instant::now();
    let r = score(&mut c, req).await;
    let took = t0.elapsed();
    assert!(took < Duration::from_millis(1500), "answered in {took:?}, after the gRPC deadline of 400 ms");
    match r {
        Ok(r) => {
            assert_eq!(r.missing.len(), texts.len(), "nothing could finish: {r:?}");
            assert!(r.scores.iter().all(|s| s.is_nan()), "{r:?}");
        }
        Err(s) => assert!(
            matches!(s.code(), Code::DeadlineExceeded | Code::ResourceExhausted),
            "a server answer at the deadline, not a client timeout: {s:?}"
        ),
    }
}

/// A client that cancels its call (its stream reset, its connection gone) cancels the work, on a
/// worker called directly and through the proxy (the proxy drops the call, which closes its
/// shard's connection, and the worker cancels the shard).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_cancels_cancels_the_work() {
    let w = sim_with(slow(), 0.0).await;
    let mut cfg = test_config(vec![w.endpoint()]);
    cfg.grpc.port = Some(0);
    let p = proxy(cfg, 1).await;
    let counters = w.engine().counters();
    for (round, url) in [(1, w.grpc_url().unwrap()), (2, p.grpc_url().unwrap())] {
        let mut c = client(&url).await;
        let req = score_req(&short(2));
        let call = tokio::spawn(async move { c.score(req).await });
        let end = Instant::now() + Duration::from_secs(5);
        while counters.in_flight.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            assert!(Instant::now() < end, "{url}: the call never started");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Dropping the call resets its stream (the client, its channel and connection go with it).
        call.abort();
        let end = Instant::now() + Duration::from_secs(1);
        while counters.cancelled.load(std::sync::atomic::Ordering::Relaxed) < round {
            assert!(
                Instant::now() < end,
                "{url}: the 2 s compute was not cancelled within 1 s of the client going away"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(counters.completed.load(std::sync::atomic::Ordering::Relaxed), 0);
    }
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_process_answers_grpc_as_it_answers_http() {
    let args = ["--model", "default", "--port", "0", "--admin-port", "0", "--grpc-port", "0", "--no-autotune"];
    let w = spawn("sieve-worker", &args, Duration::from_secs(60));
    assert!(w.line.starts_with("sieve-worker listening api=") && w.line.contains(" grpc=127.0.0.1:"), "{}", w.line);
    let http = Http::new();
    assert!(wait_ready(&http, &w.admin_url(), Duration::from_secs(120)).await, "the worker never loaded its model");
    let texts = short(5);
    let h: ScoreResponse = http
        .post_json(&format!("{}/v1/score", w.api_url()), &json!({"query": QUERY, "items": json_items(&texts)}))
        .await
        .json();
    let mut c = client(&grpc_url(&w)).await;
    let g = score(&mut c, score_req(&texts)).await.expect("a score answer");
    // Scores depend on the pair alone (the determinism contract): equal to the bit.
    assert_same_scores(&g, &h, "worker");
    assert!(g.usage.as_ref().is_some_and(|u| u.computed_tokens > 0), "{g:?}");
    let empty = pb::ScoreRequest { query: String::new(), ..score_req(&texts) };
    expect_err(score(&mut c, empty).await, Code::InvalidArgument, "query is empty", "invalid", false);
    // `model` is checked as on HTTP: the served name is answered, another is NOT_FOUND naming it.
    let served = g.model.clone();
    let rerank = |model: &str| pb::RerankRequest {
        query: QUERY.into(),
        documents: items(&texts),
        model: Some(model.into()),
        ..Default::default()
    };
    let ok = tokio::time::timeout(CALL, c.rerank(rerank(&served))).await.unwrap();
    assert_eq!(ok.expect("the served model is answered").into_inner().results.len(), texts.len());
    let s = tokio::time::timeout(CALL, c.rerank(rerank("no-such-model"))).await.unwrap().expect_err("a wrong model");
    assert_eq!(s.code(), Code::NotFound, "{s:?}");
    assert!(s.message().contains("no-such-model") && s.message().contains(&served), "{}", s.message());
}

/// A request body fed by hand: what the test sends, when it sends it, and never an end.
struct Trickle(tokio::sync::mpsc::Receiver<bytes::Bytes>);

impl hyper::body::Body for Trickle {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>> {
        self.0.poll_recv(cx).map(|b| b.map(|b| Ok(hyper::body::Frame::data(b))))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_never_arrives_whole_ends_at_the_body_read_timeout() {
    let mut cfg = SimConfig { cost: fast(), ..SimConfig::default() };
    cfg.grpc.port = Some(0);
    cfg.http.body_read_timeout_ms = 300;
    let w = SimWorker::start_local(cfg).await.expect("sim worker");
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<Trickle>();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let req = hyper::Request::post(format!("{}/sieve.v1.Sieve/Score", w.grpc_url().unwrap()))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Trickle(rx))
        .unwrap();
    // A gRPC frame header announcing 1000 bytes, then 10 of them, then silence.
    tx.send(bytes::Bytes::from_static(&[0, 0, 0, 3, 232])).await.unwrap();
    tx.send(bytes::Bytes::from_static(b"0123456789")).await.unwrap();
    let t0 = Instant::now();
    let resp = tokio::time::timeout(Duration::from_secs(10), client.request(req)).await.expect("an answer").unwrap();
    let head = resp.headers().clone();
    let collected = tokio::time::timeout(Duration::from_secs(10), http_body_util::BodyExt::collect(resp.into_body()))
        .await
        .unwrap();
    let trailers = collected.ok().and_then(|c| c.trailers().cloned()).unwrap_or_default();
    let status =
        |name: &str| head.get(name).or_else(|| trailers.get(name)).and_then(|v| v.to_str().ok()).map(str::to_string);
    assert_eq!(status("grpc-status").as_deref(), Some("4"), "DEADLINE_EXCEEDED; head {head:?} trailers {trailers:?}");
    let message = status("grpc-message").unwrap_or_default();
    assert!(message.contains("body_read_timeout_ms"), "{message:?}");
    assert!(t0.elapsed() < Duration::from_secs(5), "ended after {:?}", t0.elapsed());
    drop(tx);
}

/// Sends `msg` as one `Score` call's message on a raw HTTP/2 client; the answer's grpc-status,
/// grpc-message and, on success, its decoded message.
async fn raw_score(url: &str, msg: &[u8]) -> (String, String, Option<pb::ScoreResponse>) {
    raw_score_messages(url, &[msg]).await
}

/// [`raw_score`] with every message of `msgs` sent in the call's body, one after the other.
async fn raw_score_messages(url: &str, msgs: &[&[u8]]) -> (String, String, Option<pb::ScoreResponse>) {
    use http_body_util::{BodyExt as _, Full};
    use prost::Message as _;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<bytes::Bytes>>();
    let mut framed = Vec::new();
    for msg in msgs {
        framed.push(0u8);
        framed.extend_from_slice(&u32::try_from(msg.len()).unwrap().to_be_bytes());
        framed.extend_from_slice(msg);
    }
    let req = hyper::Request::post(format!("{url}/sieve.v1.Sieve/Score"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(bytes::Bytes::from(framed)))
        .unwrap();
    let resp = tokio::time::timeout(CALL, client.request(req)).await.expect("an answer").unwrap();
    let head = resp.headers().clone();
    let collected = tokio::time::timeout(CALL, resp.into_body().collect()).await.unwrap().unwrap();
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let get = |name: &str| {
        head.get(name).or_else(|| trailers.get(name)).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string()
    };
    let body = collected.to_bytes();
    let answer = (body.len() > 5).then(|| pb::ScoreResponse::decode(&body[5..]).expect("a ScoreResponse"));
    // grpc-message is percent-encoded; these messages have no escapes but spaces.
    (get("grpc-status"), get("grpc-message").replace("%20", " "), answer)
}

/// A `Score` message that is not valid protobuf is INVALID_ARGUMENT saying what is wrong (which
/// field, and why), and a text with quotes and a backslash, whose neighbouring bytes in the
/// message happen to be `"` (a 34-byte text, then an unknown field of key 0x22), reaches the
/// workers as itself: the proxy answers it as it answers the same text over HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn score_messages_are_read_strictly() {
    let w = sim_with(fast(), 0.0).await;
    let mut proxy_cfg = test_config(vec![w.endpoint()]);
    proxy_cfg.grpc.port = Some(0);
    let p = proxy(proxy_cfg, 1).await;
    for url in [p.grpc_url().unwrap(), w.grpc_url().unwrap()] {
        let (code, message, _) = raw_score(&url, &[0x0a, 2, 0xff, 0xfe]).await;
        assert_eq!(code, "3", "INVALID_ARGUMENT at {url}: {message}");
        assert!(message.contains("ScoreRequest message does not decode"), "{message}");
        assert!(message.contains("query") && message.contains("UTF-8"), "{message}");
        let (code, message, _) = raw_score(&url, &[0x0a, 9, b'q']).await;
        assert_eq!(code, "3", "INVALID_ARGUMENT at {url}: {message}");
        assert!(message.contains("ScoreRequest message does not decode"), "{message}");
        assert!(message.contains("query"), "{message}");
        // A unary call with a second message is refused, not answered OK for the first alone.
        let one: &[u8] = &[0x0a, 1, b'q', 0x12, 3, 0x0a, 1, b'a'];
        assert_eq!(raw_score_messages(&url, &[one]).await.0, "0", "one message is fine");
        let (code, message, _) = raw_score_messages(&url, &[one, one]).await;
        assert_eq!(code, "3", "INVALID_ARGUMENT at {url}: {message}");
        assert!(message.contains("one message"), "{message}");
    }
    // 34 bytes with a quote and a backslash in them: the length byte before the text is 0x22,
    // and the unknown field 4 (length-delimited, key 0x22) after it.
    let text = r#"a "quoted" \ text of 34 bytes....."#;
    assert_eq!(text.len(), 34);
    let mut item = vec![0x0a, 34];
    item.extend_from_slice(text.as_bytes());
    item.extend_from_slice(&[0x22, 1, b'z']);
    let mut msg = vec![0x0a, 1, b'q', 0x12, u8::try_from(item.len()).unwrap()];
    msg.extend_from_slice(&item);
    msg.extend_from_slice(&[0x30, 0]); // cache: false
    let (code, message, answer) = raw_score(&p.grpc_url().unwrap(), &msg).await;
    assert_eq!(code, "0", "OK: {message}");
    let h: ScoreResponse = Http::new()
        .post_json(&format!("{}/v1/score", p.api_url()), &json!({"query": "q", "items": [text], "cache": false}))
        .await
        .json();
    assert_same_scores(&answer.expect("an answer"), &h, "a text next to quote bytes");
}

/// Connections that send nothing hold the gRPC port's whole connection cap: a client's call is
/// still answered (the idle ones are closed for it), where its connection used to be closed
/// unserved until the idle ones timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_at_the_cap_are_closed_for_a_client_with_a_call() {
    use tokio::io::AsyncReadExt as _;
    let mut cfg = SimConfig { cost: fast(), ..SimConfig::default() };
    cfg.grpc.port = Some(0);
    cfg.http.max_connections = 4;
    cfg.http.header_read_timeout_ms = 10_000;
    cfg.http.idle_timeout_ms = 10_000;
    let w = SimWorker::start_local(cfg).await.expect("sim worker");
    let addr = w.grpc_addr.expect("gRPC port");
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    // Idle past the 250 ms after which one is closed for a connection waiting at the cap.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut c = client(&w.grpc_url().unwrap()).await;
    let r = score(&mut c, score_req(&catalogue(3, 1))).await.expect("answered");
    assert_eq!(r.scores.len(), 3);
    for s in &mut silent {
        // The server's SETTINGS, then the close.
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut buf)).await;
        assert!(read.is_ok(), "an idle connection closed for the client");
    }
}

/// The gRPC port's stop: a graceful one lets the call in progress finish and then ends; a kill
/// ends the call in progress at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_lets_the_call_in_progress_finish_and_a_kill_does_not() {
    let medium = CostModel { request_ms: 400.0, token_ms: 0.0, token_context_ms: 0.0 };
    let w = sim_with(medium, 0.0).await;
    let mut c = client(&w.grpc_url().unwrap()).await;
    let call = tokio::spawn(async move { c.score(score_req(&short(2))).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t0 = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), w.shutdown_within(Duration::from_secs(3))).await.expect("stopped");
    assert!(t0.elapsed() < Duration::from_millis(2500), "ended after {:?}, not at its grace", t0.elapsed());
    let answer = call.await.unwrap().expect("the call in progress is answered");
    assert_eq!(answer.into_inner().scores.len(), 2);

    let w = sim_with(slow(), 0.0).await;
    let mut c = client(&w.grpc_url().unwrap()).await;
    let call = tokio::spawn(async move { c.score(score_req(&short(2))).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t0 = Instant::now();
    w.kill();
    let r = tokio::time::timeout(Duration::from_secs(1), call).await.expect("ended by the kill").unwrap();
    assert!(r.is_err(), "a killed call is not answered: {r:?}");
    assert!(t0.elapsed() < Duration::from_secs(1));
}
