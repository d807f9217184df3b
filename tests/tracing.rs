//! Distributed tracing end to end: a `sieve-proxy` process and two `sieve-loadtest sim-worker`
//! processes export their spans over OTLP/HTTP to a receiver this test runs, which decodes them
//! with `opentelemetry-proto`, and one split request's spans form one tree a trace backend links:
//! the proxy's request span (SERVER: the root, or the child of the client's `traceparent`, sent
//! as an HTTP header or as gRPC call metadata), its plan and shard-attempt spans (CLIENT), each
//! worker's request span (SERVER) under an attempt, and the worker's queue and compute spans
//! under that. Attributes carry OpenTelemetry's HTTP and RPC semantic-convention names with
//! their types (a status code is an integer), and a refused call's spans have status ERROR.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use prost::Message;
use sieve_e2e::{catalogue, score_body, spawn, wait_ready, Http, Proc};

const START: Duration = Duration::from_secs(20);

/// One received span, flattened.
#[derive(Debug, Clone)]
struct Got {
    service: String,
    name: String,
    trace: Vec<u8>,
    id: Vec<u8>,
    parent: Vec<u8>,
    kind: SpanKind,
    status: StatusCode,
    attrs: HashMap<String, Value>,
}

impl Got {
    fn int(&self, key: &str) -> Option<i64> {
        match self.attrs.get(key) {
            Some(Value::IntValue(v)) => Some(*v),
            _ => None,
        }
    }

    fn str(&self, key: &str) -> Option<&str> {
        match self.attrs.get(key) {
            Some(Value::StringValue(v)) => Some(v),
            _ => None,
        }
    }
}

type Received = Arc<Mutex<Vec<Got>>>;

/// An OTLP/HTTP trace receiver on loopback: decodes every `POST /v1/traces` into `Got`s.
async fn receiver() -> (SocketAddr, Received) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let got: Received = Arc::default();
    let store = got.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let store = store.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let store = store.clone();
                    async move {
                        let path_ok = req.uri().path() == "/v1/traces";
                        let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                        let status = match ExportTraceServiceRequest::decode(body) {
                            Ok(r) if path_ok => {
                                store.lock().unwrap().extend(flatten(r));
                                200
                            }
                            _ => 400,
                        };
                        let reply = ExportTraceServiceResponse::default().encode_to_vec();
                        Response::builder()
                            .status(status)
                            .header("content-type", "application/x-protobuf")
                            .body(Full::new(Bytes::from(reply)))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
            });
        }
    });
    (addr, got)
}

fn flatten(r: ExportTraceServiceRequest) -> Vec<Got> {
    let mut out = Vec::new();
    for rs in r.resource_spans {
        let service = rs
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => Some(s.clone()),
                _ => None,
            })
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                let status = s.status.as_ref().map_or(StatusCode::Unset, |st| st.code());
                let attrs = s
                    .attributes
                    .iter()
                    .filter_map(|kv| Some((kv.key.clone(), kv.value.as_ref()?.value.clone()?)))
                    .collect();
                out.push(Got {
                    service: service.clone(),
                    kind: s.kind(),
                    name: s.name,
                    trace: s.trace_id,
                    id: s.span_id,
                    parent: s.parent_span_id,
                    status,
                    attrs,
                });
            }
        }
    }
    out
}

fn config_file(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("sieve-e2e-{}-tracing", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// `POST {api}/v1/score` with an optional `traceparent`; the status and the shard count.
async fn score(api: SocketAddr, body: &serde_json::Value, traceparent: Option<&str>) -> (u16, String) {
    let stream = tokio::net::TcpStream::connect(api).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let mut req = Request::post("/v1/score").header("host", api.to_string()).header("content-type", "application/json");
    if let Some(tp) = traceparent {
        req = req.header("traceparent", tp);
    }
    let req = req.body(Full::new(Bytes::from(serde_json::to_vec(body).unwrap()))).unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), send.send_request(req)).await.unwrap().unwrap();
    let shards = resp.headers().get("x-sieve-shards").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    (resp.status().as_u16(), shards)
}

/// The spans of `trace` once every expected one has arrived (or what came within 10 s).
async fn spans_of(got: &Received, trace: &[u8], expect: impl Fn(&[Got]) -> bool) -> Vec<Got> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let spans: Vec<Got> = got.lock().unwrap().iter().filter(|s| s.trace == trace).cloned().collect();
        if expect(&spans) || Instant::now() > until {
            return spans;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn count(spans: &[Got], service: &str, name: &str) -> usize {
    spans.iter().filter(|s| s.service == service && s.name == name).count()
}

/// Everything a complete two-shard trace holds.
fn complete(spans: &[Got]) -> bool {
    count(spans, "sieve-proxy", "proxy") == 1
        && count(spans, "sieve-proxy", "shard_attempt") >= 2
        && count(spans, "sieve-sim-worker", "sim-worker") >= 2
        && count(spans, "sieve-sim-worker", "compute") >= 2
}

/// Checks the tree of one request's spans; `client_parent` is the span id the client sent.
fn check_tree(spans: &[Got], client_parent: &[u8]) {
    check_links(spans);
    let names: Vec<_> = spans.iter().map(|s| format!("{}/{}", s.service, s.name)).collect();
    assert!(complete(spans), "incomplete trace: {names:?}");
    let by_id: HashMap<&[u8], &Got> = spans.iter().map(|s| (s.id.as_slice(), s)).collect();
    let parent_of = |s: &Got| by_id.get(s.parent.as_slice()).copied();
    let root = spans.iter().find(|s| s.name == "proxy").unwrap();
    assert_eq!(root.parent, client_parent, "the proxy's request span's parent");
    for s in spans {
        let p = parent_of(s);
        match (s.service.as_str(), s.name.as_str()) {
            ("sieve-proxy", "proxy") => {}
            ("sieve-proxy", "plan" | "shard_attempt") => {
                assert_eq!(p.map(|p| p.id.as_slice()), Some(root.id.as_slice()), "{} under the request", s.name)
            }
            ("sieve-sim-worker", "sim-worker") => {
                assert_eq!(p.map(|p| p.name.as_str()), Some("shard_attempt"), "a worker's request under an attempt")
            }
            ("sieve-sim-worker", "queue" | "compute") => {
                assert_eq!(p.map(|p| p.name.as_str()), Some("sim-worker"), "{} under the worker's request", s.name)
            }
            other => panic!("unexpected span {other:?} in {names:?}"),
        }
    }
    assert_eq!(count(spans, "sieve-proxy", "plan"), 1, "{names:?}");
    // Each attempt reached its own worker: as many worker request spans under distinct attempts.
    let attempts_reached: HashSet<&[u8]> =
        spans.iter().filter(|s| s.name == "sim-worker").map(|s| s.parent.as_slice()).collect();
    assert!(attempts_reached.len() >= 2, "{names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_split_request_is_one_trace_from_proxy_to_workers() {
    let (otlp, got) = receiver().await;
    let tracing = format!("[tracing]\notlp_endpoint = \"http://{otlp}/v1/traces\"\nexport_interval_ms = 100\n");
    let sim_cfg = config_file("sim.toml", &tracing);
    let sim_cfg = sim_cfg.to_str().unwrap();
    let sim =
        || spawn("sieve-loadtest", &["sim-worker", "--port", "0", "--admin-port", "0", "--config", sim_cfg], START);
    let (a, b) = (sim(), sim());
    // Fixed shards of 10: a request of 20 items is cut in two, one per worker. The pair cache is
    // off: the second request repeats the first and must be computed again to be traced again.
    let proxy_cfg = config_file(
        "proxy.toml",
        &format!("{tracing}\n[split]\nmode = \"fixed\"\nfixed_items = 10\n\n[cache]\nenabled = false\n"),
    );
    let mut args: Vec<String> = ["--port", "0", "--admin-port", "0", "--grpc-port", "0"].map(String::from).to_vec();
    for w in [&a, &b] {
        args.extend(["--worker".to_string(), w.worker_arg()]);
    }
    args.extend(["--config".to_string(), proxy_cfg.display().to_string()]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let p: Proc = spawn("sieve-proxy", &refs, START);
    assert!(wait_ready(&Http::new(), &p.admin_url(), START).await, "proxy never ready");
    let api: SocketAddr = p.api_url().trim_start_matches("http://").parse().unwrap();
    let body = score_body("waterproof trail running shoes", &catalogue(20, 1), None);

    // No traceparent: the proxy starts the trace.
    let (status, shards) = score(api, &body, None).await;
    assert_eq!((status, shards.as_str()), (200, "2"));
    let root_trace = {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let root = got.lock().unwrap().iter().find(|s| s.name == "proxy" && s.parent.is_empty()).cloned();
            match root {
                Some(r) => break r.trace,
                None if Instant::now() > until => panic!("no root span from the proxy arrived"),
                None => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    };
    let spans = spans_of(&got, &root_trace, complete).await;
    check_tree(&spans, &[]);
    let root = spans.iter().find(|s| s.name == "proxy").unwrap();
    assert_eq!(root.str("http.request.method"), Some("POST"), "{root:?}");
    assert_eq!(root.str("http.route"), Some("/v1/score"), "{root:?}");
    assert_eq!(root.int("http.response.status_code"), Some(200), "{root:?}");
    assert_eq!(root.status, StatusCode::Unset, "{root:?}");

    // The client's traceparent: the same trace id, the proxy's span its child.
    let (trace_hex, parent_hex) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let (status, shards) = score(api, &body, Some(&format!("00-{trace_hex}-{parent_hex}-01"))).await;
    assert_eq!((status, shards.as_str()), (200, "2"));
    let spans = spans_of(&got, &hex(trace_hex), complete).await;
    check_tree(&spans, &hex(parent_hex));

    // The same request as a gRPC `Score` call, its traceparent in the call's metadata: the
    // proxy's request span is the caller's child, and the same tree hangs under it.
    let (grpc_trace, grpc_parent) = ("5cf92f3577b34da6a3ce929d0e0e4737", "11f067aa0ba902b8");
    let n = grpc_score(&p, &body, &format!("00-{grpc_trace}-{grpc_parent}-01")).await;
    assert_eq!(n, 20, "every item scored over gRPC");
    let spans = spans_of(&got, &hex(grpc_trace), complete).await;
    check_tree(&spans, &hex(grpc_parent));
    let root = spans.iter().find(|s| s.name == "proxy").unwrap();
    assert_eq!(root.str("rpc.system"), Some("grpc"), "{root:?}");
    assert_eq!(root.str("rpc.service"), Some("sieve.v1.Sieve"), "{root:?}");
    assert_eq!(root.str("rpc.method"), Some("Score"), "{root:?}");
    assert_eq!(root.int("rpc.grpc.status_code"), Some(0), "{root:?}");

    // Refused calls: the proxy's SERVER span has status ERROR, with the code as an integer.
    let (bad_trace, bad_grpc_trace) = ("6cf92f3577b34da6a3ce929d0e0e4738", "7cf92f3577b34da6a3ce929d0e0e4739");
    let bad = score_body(" ", &catalogue(2, 1), None);
    let (status, _) = score(api, &bad, Some(&format!("00-{bad_trace}-{parent_hex}-01"))).await;
    assert_eq!(status, 422);
    let n = grpc_score(&p, &bad, &format!("00-{bad_grpc_trace}-{grpc_parent}-01")).await;
    assert_eq!(n, 0, "the empty query refused over gRPC");
    let failed = |s: &[Got]| s.iter().any(|s| s.name == "proxy");
    let spans = spans_of(&got, &hex(bad_trace), failed).await;
    let root = spans.iter().find(|s| s.name == "proxy").expect("the refused request's span");
    assert_eq!((root.kind, root.status), (SpanKind::Server, StatusCode::Error), "{root:?}");
    assert_eq!(root.int("http.response.status_code"), Some(422), "{root:?}");
    assert_eq!(root.str("error.type"), Some("422"), "{root:?}");
    let spans = spans_of(&got, &hex(bad_grpc_trace), failed).await;
    let root = spans.iter().find(|s| s.name == "proxy").expect("the refused gRPC call's span");
    assert_eq!((root.kind, root.status), (SpanKind::Server, StatusCode::Error), "{root:?}");
    assert_eq!(root.int("rpc.grpc.status_code"), Some(3), "INVALID_ARGUMENT: {root:?}");

    // Every span received belongs to one of the three requests' traces: none was orphaned into
    // a trace of its own (a worker that ignored the traceparent would start one).
    let traces: HashSet<Vec<u8>> = got.lock().unwrap().iter().map(|s| s.trace.clone()).collect();
    let want = [root_trace, hex(trace_hex), hex(grpc_trace), hex(bad_trace), hex(bad_grpc_trace)];
    assert_eq!(traces, HashSet::from(want));
}

/// A gRPC `Score` call to `p`'s gRPC port of the JSON `body`'s query and items, with
/// `traceparent` as call metadata; how many scores came back (0 for a refused call).
async fn grpc_score(p: &Proc, body: &serde_json::Value, traceparent: &str) -> usize {
    use sieve_server::grpc::pb;
    let addr = p.line.split_whitespace().find_map(|w| w.strip_prefix("grpc=")).expect("a grpc= address");
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    let mut client = pb::sieve_client::SieveClient::new(ch);
    let items =
        body["items"].as_array().unwrap().iter().map(|t| pb::Item { text: t.as_str().unwrap().into(), id: None });
    let msg = pb::ScoreRequest {
        query: body["query"].as_str().unwrap().into(),
        items: items.collect(),
        ..Default::default()
    };
    let mut req = tonic::Request::new(msg);
    req.metadata_mut().insert("traceparent", traceparent.parse().unwrap());
    let call = tokio::time::timeout(Duration::from_secs(10), client.score(req)).await.expect("an answer in time");
    // A refused call: no scores.
    call.map_or(0, |r| r.into_inner().scores.len())
}

/// SERVER → CLIENT → SERVER: the proxy's request span is a SERVER span, each shard attempt a
/// CLIENT span under it with the worker's address and the answer's status as integers, and each
/// worker's request span a SERVER span under an attempt; numbers are typed as numbers.
fn check_links(spans: &[Got]) {
    let names: Vec<_> = spans.iter().map(|s| format!("{}/{}:{:?}", s.service, s.name, s.kind)).collect();
    for s in spans {
        let want = match s.name.as_str() {
            "proxy" | "sim-worker" | "worker" => SpanKind::Server,
            "shard_attempt" => SpanKind::Client,
            _ => SpanKind::Internal,
        };
        assert_eq!(s.kind, want, "{} in {names:?}", s.name);
        for key in ["items", "shards", "pass", "rows", "tokens", "server.port", "http.response.status_code"] {
            if let Some(v) = s.attrs.get(key) {
                assert!(matches!(v, Value::IntValue(_)), "{}'s {key} is {v:?}, not an integer", s.name);
            }
        }
    }
    for a in spans.iter().filter(|s| s.name == "shard_attempt") {
        assert_eq!(a.str("http.request.method"), Some("POST"), "{a:?}");
        assert_eq!(a.str("server.address"), Some("127.0.0.1"), "{a:?}");
        assert!(a.int("server.port").is_some_and(|p| p > 0), "{a:?}");
        assert_eq!(a.int("http.response.status_code"), Some(200), "{a:?}");
        assert_eq!(a.status, StatusCode::Unset, "{a:?}");
    }
    for w in spans.iter().filter(|s| s.name == "sim-worker") {
        assert_eq!(w.str("http.route"), Some("/v1/score"), "{w:?}");
        assert_eq!(w.int("http.response.status_code"), Some(200), "{w:?}");
    }
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// A real `sieve-worker` (the embedded model) called with a `traceparent`: its request span is
/// the caller's child, and the engine's spans (the queue wait on the scheduler side, each
/// forward pass opened by the runner thread) are children of that request span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_s_queue_and_forward_pass_spans_are_children_of_its_request() {
    let (otlp, got) = receiver().await;
    let cfg = config_file(
        "worker.toml",
        &format!("[tracing]\notlp_endpoint = \"http://{otlp}/v1/traces\"\nexport_interval_ms = 100\n"),
    );
    let args = ["--model", "default", "--port", "0", "--admin-port", "0", "--no-autotune", "--threads", "1"];
    let mut args: Vec<&str> = args.to_vec();
    args.extend(["--config", cfg.to_str().unwrap()]);
    let w: Proc = spawn("sieve-worker", &args, Duration::from_secs(60));
    assert!(wait_ready(&Http::new(), &w.admin_url(), Duration::from_secs(60)).await, "the worker never loaded");
    let api: SocketAddr = w.api_url().trim_start_matches("http://").parse().unwrap();
    let (trace_hex, parent_hex) = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331");
    let body = score_body("trail shoes", &catalogue(3, 2), None);
    let (status, _) = score(api, &body, Some(&format!("00-{trace_hex}-{parent_hex}-01"))).await;
    assert_eq!(status, 200);
    let done = |s: &[Got]| {
        count(s, "sieve-worker", "worker") == 1
            && count(s, "sieve-worker", "queue") == 1
            && count(s, "sieve-worker", "forward_pass") >= 1
    };
    let spans = spans_of(&got, &hex(trace_hex), done).await;
    let names: Vec<_> = spans.iter().map(|s| format!("{}/{}", s.service, s.name)).collect();
    assert!(done(&spans), "incomplete trace: {names:?}");
    let request = spans.iter().find(|s| s.name == "worker").unwrap();
    assert_eq!(request.parent, hex(parent_hex), "the worker's request span is the caller's child");
    check_links(&spans);
    assert_eq!(request.int("http.response.status_code"), Some(200), "{request:?}");
    for s in spans.iter().filter(|s| s.name != "worker") {
        assert!(matches!(s.name.as_str(), "queue" | "forward_pass"), "unexpected span {names:?}");
        assert_eq!(s.parent, request.id, "{} under the request span", s.name);
    }
}

/// `[log] format = "json"`: the log is one JSON object a line (the proxy's first line says it
/// added its worker).
#[test]
fn the_json_log_format_writes_one_object_a_line() {
    use std::io::BufRead as _;
    use std::process::{Command, Stdio};
    let cfg = config_file("json-log.toml", "[log]\nformat = \"json\"\n");
    let mut child = Command::new(sieve_e2e::bin("sieve-proxy"))
        .args(["--port", "0", "--admin-port", "0", "--worker", "http://127.0.0.1:1", "--config"])
        .arg(&cfg)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stderr).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(Duration::from_secs(10)).unwrap_or_default();
    let _ = child.kill();
    let _ = child.wait();
    let v: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line:?}"));
    assert_eq!(v["level"], "INFO", "{line}");
    assert_eq!(v["fields"]["message"], "worker added", "{line}");
    assert_eq!(v["fields"]["worker"], "http://127.0.0.1:1", "{line}");
}
