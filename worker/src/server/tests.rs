//! Every bad-input case over real HTTP on loopback, against a small random model; none of them
//! disturbs a good call running at the same time.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use sieve_kernels::reference::ReferenceBackend;
use sieve_shared::http_config::HttpConfig;
use sieve_shared::Limits;

use super::*;
use crate::config::ServerConfig;
use crate::engine::{EngineConfig, EngineHandle, EngineParts, FaultHook};
use crate::model::tests::{random_source, tiny_config};
use crate::model::{Arch, HeadSpec, Model};
use crate::prompt::tests::ModEncoder;
use crate::prompt::{PromptBuilder, PromptTemplate, TextEncoder};

struct Server {
    api: SocketAddr,
    admin: SocketAddr,
    app: Arc<AppState>,
    /// Keeps both ports serving.
    _running: start::RunningWorker,
    _rt: tokio::runtime::Runtime,
}

fn limits() -> Limits {
    Limits { max_items: 8, max_item_chars: 200, max_body_bytes: 4096, ..Limits::default() }
}

/// Starts both ports in-process; `engine` false leaves the model "loading".
fn server(engine: bool, cfg: EngineConfig) -> Server {
    server_of(engine, tiny_config(Arch::Qwen2), cfg)
}

fn server_of(engine: bool, c: crate::model::ModelConfig, cfg: EngineConfig) -> Server {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let app = Arc::new(AppState::new(limits(), "cpu".into(), None));
    if engine {
        let backend = ReferenceBackend;
        let model =
            Model::load(&backend, &random_source(&c, 5), c.clone(), HeadSpec::YesNo { yes: 3, no: 4 }, false).unwrap();
        let encoder: Arc<dyn TextEncoder> = Arc::new(ModEncoder(c.vocab as u32));
        let t = PromptTemplate { prefix: "<s>sys\n".into(), suffix: "<s>".into(), ..PromptTemplate::default() };
        let builder = PromptBuilder::new(t, encoder.as_ref()).unwrap();
        let e = EngineHandle::start(EngineParts { backend, model, encoder, builder }, cfg, app.state.clone()).unwrap();
        let _ = app.engine.set(e);
        let _ = app.model_name.set("tiny".into());
    }
    let server = ServerConfig { port: 0, admin_port: 0, ..ServerConfig::default() };
    let running = rt.block_on(start::serve(app.clone(), &server, &HttpConfig::default())).unwrap();
    Server { api: running.api_addr, admin: running.admin_addr, app, _running: running, _rt: rt }
}

fn engine_cfg() -> EngineConfig {
    EngineConfig {
        max_batch_tokens: 512,
        max_seq_tokens: 160,
        block_size: 4,
        prefix_cache_blocks: 64,
        ..Default::default()
    }
}

/// One HTTP/1.1 exchange on a fresh connection: (status, body).
fn http(addr: SocketAddr, method: &str, path: &str, body: &[u8], extra_headers: &str) -> (u16, Value) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n{extra_headers}\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    let _ = s.write_all(body);
    let mut out = vec![];
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn post(addr: SocketAddr, path: &str, v: &Value) -> (u16, Value) {
    http(addr, "POST", path, v.to_string().as_bytes(), "Content-Type: application/json\r\n")
}

fn message(v: &Value) -> String {
    v["error"]["message"].as_str().unwrap_or_default().to_string()
}

fn good() -> Value {
    json!({"query": "red shoes", "items": ["red leather shoes", {"id": "b", "text": "blue hat"}, "running shoes, red"]})
}

#[test]
fn bad_input_gets_the_right_code_and_never_disturbs_a_good_call() {
    let s = server(true, engine_cfg());
    let (code, alone) = post(s.api, "/v1/score", &good());
    assert_eq!(code, 200, "{alone}");
    assert_eq!(alone["scores"].as_array().unwrap().len(), 3);
    assert_eq!(alone["ids"], json!([null, "b", null]));

    // A good call in flight while every bad one is thrown at the server.
    let api = s.api;
    let concurrent = std::thread::spawn(move || post(api, "/v1/score", &good()));
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        ("malformed JSON", b"{\"query\": \"x\", ".to_vec(), 400, "malformed JSON"),
        ("not JSON at all", b"query=x".to_vec(), 400, "malformed JSON"),
        ("wrong field type", br#"{"query": 7, "items": ["a"]}"#.to_vec(), 422, "invalid request"),
        ("missing items", br#"{"query": "x"}"#.to_vec(), 422, "items"),
        ("unknown field", br#"{"query": "x", "items": ["a"], "itmes": 1}"#.to_vec(), 422, "itmes"),
        ("empty query", br#"{"query": "  ", "items": ["a"]}"#.to_vec(), 422, "query is empty"),
        ("zero items", br#"{"query": "x", "items": []}"#.to_vec(), 422, "items is empty"),
        ("empty item", br#"{"query": "x", "items": ["a", ""]}"#.to_vec(), 422, "items[1] is empty"),
        ("too many items", json!({"query": "x", "items": vec!["a"; 9]}).to_string().into_bytes(), 413, "max_items 8"),
        (
            "item over the char limit",
            json!({"query": "x", "items": ["a".repeat(201)]}).to_string().into_bytes(),
            413,
            "max_item_chars 200",
        ),
        (
            "item over the context",
            json!({"query": "x", "items": ["ab ".repeat(60)]}).to_string().into_bytes(),
            413,
            "max_seq_tokens 160",
        ),
        ("body over the limit", vec![b' '; 5000], 413, "max_body_bytes 4096"),
        ("zero deadline", br#"{"query": "x", "items": ["a"], "deadline_ms": 0}"#.to_vec(), 422, "deadline_ms"),
    ];
    for (what, body, want, msg) in &cases {
        let (code, v) = http(s.api, "POST", "/v1/score", body, "");
        assert_eq!(code, *want, "{what}: {v}");
        assert!(message(&v).contains(msg), "{what}: message {:?} lacks {msg:?}", message(&v));
        assert_eq!(v["error"]["code"], json!(want), "{what}");
    }
    let (code, v) = post(s.api, "/v1/rerank", &json!({"query": "x", "documents": ["a"], "top_n": 0}));
    assert_eq!((code, message(&v).contains("top_n")), (422, true));
    assert_eq!(http(s.api, "GET", "/v1/score", b"", "").0, 405);
    assert_eq!(http(s.api, "POST", "/v2/score", b"{}", "").0, 404);

    let (code, during) = concurrent.join().unwrap();
    assert_eq!(code, 200);
    assert_eq!(during["scores"], alone["scores"], "the good call is unaffected");
    assert_eq!(s.app.state.in_flight_requests.get(), 0);
}

#[test]
fn rerank_sorts_and_matches_score() {
    let s = server(true, engine_cfg());
    let (_, scores) = post(s.api, "/v1/score", &good());
    let (code, r) = post(
        s.api,
        "/v1/rerank",
        &json!({"query": "red shoes", "documents": good()["items"], "top_n": 2, "return_documents": true}),
    );
    assert_eq!(code, 200, "{r}");
    let res = r["results"].as_array().unwrap();
    assert_eq!(res.len(), 2);
    let s0: Vec<f64> = scores["scores"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    let best = (0..3).max_by(|&a, &b| s0[a].total_cmp(&s0[b])).unwrap();
    assert_eq!(res[0]["index"], json!(best));
    assert_eq!(res[0]["relevance_score"].as_f64().unwrap(), s0[best]);
    assert!(res[0]["document"]["text"].is_string());
}

#[test]
fn overload_is_429_and_the_queued_work_still_completes() {
    // The first call holds the runner for a while; the queue holds at most 4 pairs.
    let slow: FaultHook = Arc::new(|epoch, _, layer| {
        if epoch == 1 && layer == 0 {
            std::thread::sleep(Duration::from_millis(400));
        }
        Ok(())
    });
    let s = server(true, EngineConfig { max_queued_pairs: 4, fault: Some(slow), ..engine_cfg() });
    let api = s.api;
    let first =
        std::thread::spawn(move || post(api, "/v1/score", &json!({"query": "q", "items": ["a", "b", "c", "d"]})));
    std::thread::sleep(Duration::from_millis(100));
    let (code, v) = post(s.api, "/v1/score", &json!({"query": "q", "items": ["e"]}));
    assert_eq!(code, 429, "{v}");
    assert!(message(&v).contains("max_queued_pairs 4"), "{v}");
    assert_eq!(first.join().unwrap().0, 200);
    assert_eq!(post(s.api, "/v1/score", &json!({"query": "q", "items": ["e"]})).0, 200);
}

#[test]
fn deadline_is_504_and_a_gone_client_cancels_its_work() {
    let gate = Arc::new(AtomicBool::new(true));
    let g = gate.clone();
    let slow: FaultHook = Arc::new(move |_, _, layer| {
        if layer == 0 && g.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(300));
        }
        Ok(())
    });
    let s = server(true, EngineConfig { fault: Some(slow), ..engine_cfg() });
    // A call whose deadline passes while it waits behind a slow one: 504, never computed.
    let api = s.api;
    let slow_call = std::thread::spawn(move || post(api, "/v1/score", &json!({"query": "q", "items": ["a"]})));
    std::thread::sleep(Duration::from_millis(50));
    let (code, v) = post(s.api, "/v1/score", &json!({"query": "q", "items": ["a"], "deadline_ms": 100}));
    assert_eq!(code, 504, "{v}");
    assert!(message(&v).contains("deadline"), "{v}");
    assert_eq!(slow_call.join().unwrap().0, 200);
    // Queue a call behind a slow one, then hang up: its work is dropped, never computed.
    let first = std::thread::spawn(move || post(api, "/v1/score", &json!({"query": "q", "items": ["a", "b"]})));
    std::thread::sleep(Duration::from_millis(50));
    let before = s.app.state.pairs_processed.get();
    {
        let mut c = TcpStream::connect(s.api).unwrap();
        let body = json!({"query": "zzz", "items": vec!["x"; 5]}).to_string();
        write!(c, "POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    } // dropped: the connection closes while the call waits
    assert_eq!(first.join().unwrap().0, 200);
    gate.store(false, Ordering::SeqCst);
    let t0 = std::time::Instant::now();
    while s.app.state.in_flight_requests.get() > 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let after = s.app.state.pairs_processed.get();
    assert_eq!(after - before, 2, "only the first call's pairs were scored");
}

#[test]
fn admin_reports_loading_then_ready_and_stats() {
    let loading = server(false, engine_cfg());
    assert_eq!(http(loading.admin, "GET", "/health", b"", "").0, 200);
    let (code, v) = http(loading.admin, "GET", "/ready", b"", "");
    assert_eq!((code, v["reason"].as_str()), (503, Some("loading")));
    let (code, v) = post(loading.api, "/v1/score", &good());
    assert_eq!(code, 503, "{v}");

    let s = server(true, engine_cfg());
    assert_eq!(http(s.admin, "GET", "/ready", b"", "").0, 200);
    assert_eq!(post(s.api, "/v1/score", &good()).0, 200);
    let (code, st) = http(s.admin, "GET", "/stats", b"", "");
    assert_eq!(code, 200);
    let stats: sieve_shared::WorkerStats = serde_json::from_value(st.clone()).unwrap();
    assert!(stats.ready);
    assert_eq!((stats.in_flight_requests, stats.queued_pairs, stats.pairs_processed), (0, 0, 3));
    assert!(stats.tokens_processed > 0 && stats.kv_blocks_total > 0 && stats.kv_blocks_free > 0);
    assert_eq!(st["prefix_cache"]["lookups"], json!(1));
    assert!(st["pipeline"]["prefix_tokens_reused_in_batch"].as_u64().unwrap() > 0);
    s.app.state.draining.store(true, Ordering::SeqCst);
    assert_eq!(http(s.admin, "GET", "/ready", b"", "").1["reason"], json!("draining"));
    assert_eq!(post(s.api, "/v1/score", &good()).0, 503);
}

#[test]
fn stats_show_the_moe_section_of_a_moe_model() {
    use crate::config::MoeSection;
    use crate::model::tests::tiny_moe_config;
    use sieve_kernels::CpuBackend;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let app = Arc::new(AppState::new(limits(), "cpu".into(), None));
    let c = tiny_moe_config(Arch::Qwen2Moe);
    let backend = CpuBackend::new(2).unwrap();
    let mut model =
        Model::load(&backend, &random_source(&c, 5), c.clone(), HeadSpec::YesNo { yes: 3, no: 4 }, false).unwrap();
    let dir = crate::model::test_assets::TempDir::new("moe-stats");
    let moe_cfg = MoeSection { policy: crate::config::MoePolicyKind::PaddingRatio, ..Default::default() };
    let setup = crate::moe::setup::configure(&backend, &mut model, "tiny-moe", &moe_cfg, dir.path()).unwrap().unwrap();
    app.state.moe.init(setup);
    let encoder: Arc<dyn TextEncoder> = Arc::new(ModEncoder(c.vocab as u32));
    let t = PromptTemplate { prefix: "<s>sys\n".into(), suffix: "<s>".into(), ..PromptTemplate::default() };
    let builder = PromptBuilder::new(t, encoder.as_ref()).unwrap();
    let e =
        EngineHandle::start(EngineParts { backend, model, encoder, builder }, engine_cfg(), app.state.clone()).unwrap();
    let _ = app.engine.set(e);
    let server = ServerConfig { port: 0, admin_port: 0, ..ServerConfig::default() };
    let running = rt.block_on(start::serve(app.clone(), &server, &HttpConfig::default())).unwrap();
    let s = Server { api: running.api_addr, admin: running.admin_addr, app, _running: running, _rt: rt };
    let (_, before) = http(s.admin, "GET", "/stats", b"", "");
    assert_eq!(before["moe"]["policy"], "padding_ratio");
    assert_eq!(before["moe"]["passes"], 0);
    assert_eq!(before["moe"]["thresholds"][0]["variant"], "padded64");
    // Score through the engine directly (the API port is not needed here).
    let engine = s.app.engine.get().unwrap().clone();
    let rx = engine
        .submit(crate::engine::Submission {
            query: "red shoes".into(),
            items: vec!["red leather shoes".into(), "blue hat".into()],
            instruction: None,
            arrived: std::time::Instant::now(),
            deadline: None,
            cancel: Default::default(),
            span: tracing::Span::none(),
            truncate: None,
        })
        .unwrap();
    rx.blocking_recv().unwrap().unwrap();
    let (code, st) = http(s.admin, "GET", "/stats", b"", "");
    assert_eq!(code, 200);
    let moe = &st["moe"];
    let passes = moe["passes"].as_u64().unwrap();
    assert!(passes >= 1, "{moe}");
    // 2 MoE layers per pass; every call ran one of the two padded variants.
    assert_eq!(moe["layer_calls"].as_u64().unwrap(), 2 * passes);
    let sel = moe["selections"].as_object().unwrap();
    assert_eq!(sel["padded64"].as_u64().unwrap() + sel["padded128"].as_u64().unwrap(), 2 * passes, "{moe}");
    assert!(moe["rows_padded"].as_u64().unwrap() > moe["rows_real"].as_u64().unwrap());
    assert!(moe["time_share"].as_f64().unwrap() > 0.0 && moe["time_share"].as_f64().unwrap() < 1.0);
    assert_eq!(moe["last_pass"].as_array().unwrap().len(), 2);
    engine.shutdown();
}

#[test]
fn a_client_that_hangs_up_mid_pass_stops_the_pass_at_the_next_layer() {
    // hyper notices the closed connection while the handler waits (it reads for EOF), drops the
    // handler's future, and with it the drop guard that cancels the call's token.
    let c = crate::model::ModelConfig { n_layers: 8, ..tiny_config(Arch::Qwen2) };
    let deepest = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let d = deepest.clone();
    let slow: FaultHook = Arc::new(move |epoch, _, layer| {
        if epoch == 1 {
            d.fetch_max(layer + 1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(150));
        }
        Ok(())
    });
    let s = server_of(true, c, EngineConfig { fault: Some(slow), ..engine_cfg() });
    {
        let mut conn = TcpStream::connect(s.api).unwrap();
        let body = json!({"query": "q", "items": ["a", "b", "c"]}).to_string();
        write!(conn, "POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        let t0 = std::time::Instant::now();
        while deepest.load(Ordering::SeqCst) < 2 {
            assert!(t0.elapsed() < Duration::from_secs(10), "the pass never started");
            std::thread::sleep(Duration::from_millis(2));
        }
    } // hang up during layer 1 (of 8)
    let st = &s.app.state;
    let t0 = std::time::Instant::now();
    while st.in_flight_requests.get() > 0 || st.pass_running.load(Ordering::SeqCst) {
        assert!(t0.elapsed() < Duration::from_secs(10), "the work went on");
        std::thread::sleep(Duration::from_millis(5));
    }
    let p = st.pipeline();
    assert_eq!((p.passes_abandoned, p.calls_cancelled, p.forward_passes), (1, 1, 0));
    let reached = deepest.load(Ordering::SeqCst);
    assert!(reached <= 4, "stopped within about a layer of the hang-up, not at layer 8: reached layer {reached}");
    // The next call is served normally.
    let (code, v) = post(s.api, "/v1/score", &json!({"query": "q", "items": ["a"]}));
    assert_eq!(code, 200, "{v}");
}

#[test]
fn a_call_cut_off_by_its_deadline_mid_way_answers_200_with_missing() {
    // The call spans several passes; its second pass waits past the deadline at its first layer.
    let slow: FaultHook = Arc::new(|epoch, pass, layer| {
        if epoch == 1 && pass == 1 && layer == 0 {
            std::thread::sleep(Duration::from_millis(400));
        }
        Ok(())
    });
    let s = server(true, EngineConfig { fault: Some(slow), ..engine_cfg() });
    let items: Vec<String> = (0..8).map(|i| format!("item {i} {}", "long text ".repeat(5))).collect();
    let (code, v) = post(s.api, "/v1/score", &json!({"query": "q", "items": items, "deadline_ms": 300}));
    assert_eq!(code, 200, "{v}");
    let missing: Vec<usize> = serde_json::from_value(v["missing"].clone()).unwrap();
    let scores = v["scores"].as_array().unwrap();
    assert_eq!(scores.len(), 8);
    assert!(!missing.is_empty() && missing.len() < 8, "{v}");
    for (i, sc) in scores.iter().enumerate() {
        assert_eq!(sc.is_null(), missing.contains(&i), "item {i}: null exactly where missing: {v}");
    }
    assert_eq!(v["usage"]["pairs"], json!(8 - missing.len()));
}
