//! One table of public-API cases, run against the three servers of the API: a proxy (in-process,
//! over two simulated workers), a simulated worker directly, and a real `sieve-worker` process
//! with the embedded model. Every case gets the same status from all three, every error the
//! same JSON body (Sieve's; TEI's on its `/rerank` route); and a request whose body has not
//! arrived holds no proxy admission slot.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sieve_e2e::{sims, spawn, test_config, wait_ready, Http, Proc};
use sieve_loadtest::sim::{SimConfig, SimWorker};
use sieve_shared::{ApiConfig, ErrorKind, Limits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Small limits, the same on every server, so the limit cases are cheap to send.
fn limits() -> Limits {
    Limits { max_items: 8, max_item_chars: 200, max_body_bytes: 4096, ..Limits::default() }
}

/// The model names the cases send besides the served one, aliases on every server (`[api]`).
const ALIASES: [&str; 3] = ["rerank-v3.5", "m", "any"];

fn api() -> ApiConfig {
    ApiConfig { model_aliases: ALIASES.map(String::from).to_vec(), ..ApiConfig::default() }
}

const START: Duration = Duration::from_secs(60);
const EXCHANGE: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// A raw HTTP/1.1 exchange: any method, headers and body bytes, one request per connection.

struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Value,
    raw_body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

async fn exchange(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
    let run = async {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n", body.len());
        for (n, v) in headers {
            head.push_str(&format!("{n}: {v}\r\n"));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes()).await.unwrap();
        // A server may answer (413) and close before reading all of it.
        let _ = s.write_all(body).await;
        let mut out = vec![];
        let _ = s.read_to_end(&mut out).await;
        out
    };
    let out =
        tokio::time::timeout(EXCHANGE, run).await.unwrap_or_else(|_| panic!("{method} {path} to {addr}: no answer"));
    parse_answer(&out)
}

/// An oversized body on a keep-alive connection: the answer must close the connection (the
/// rest of the body was never read), or the read below waits for a close that never comes.
async fn oversized_on_keep_alive(addr: SocketAddr) -> Answer {
    let run = async {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let body = vec![b' '; 5000];
        let head = format!("POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n", body.len());
        s.write_all(head.as_bytes()).await.unwrap();
        let _ = s.write_all(&body).await;
        let mut out = vec![];
        let _ = s.read_to_end(&mut out).await;
        out
    };
    let out = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .unwrap_or_else(|_| panic!("{addr}: the connection stayed open after 413"));
    parse_answer(&out)
}

fn parse_answer(out: &[u8]) -> Answer {
    let text = String::from_utf8_lossy(out);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("not an HTTP answer: {text:?}"));
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|c| c.parse().ok()).unwrap_or(0);
    let headers =
        lines.filter_map(|l| l.split_once(':')).map(|(n, v)| (n.trim().to_string(), v.trim().to_string())).collect();
    Answer { status, headers, body: serde_json::from_str(body).unwrap_or(Value::Null), raw_body: body.to_string() }
}

// ---------------------------------------------------------------------------------------------
// The three servers.

struct Servers {
    targets: Vec<(&'static str, SocketAddr)>,
    _sims: Vec<SimWorker>,
    _proxy: sieve_proxy::RunningProxy,
    _worker: Proc,
    _dir: TempDir,
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn sim_config() -> SimConfig {
    SimConfig { limits: limits(), api: api(), ..SimConfig::default() }
}

async fn servers() -> Servers {
    let http = Http::new();
    let dir = TempDir(std::env::temp_dir().join(format!("sieve-e2e-api-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let cfg = dir.0.join("worker.toml");
    let l = limits();
    let toml = format!(
        "[limits]\nmax_items = {}\nmax_item_chars = {}\nmax_body_bytes = {}\n[api]\nmodel_aliases = {:?}\n",
        l.max_items, l.max_item_chars, l.max_body_bytes, ALIASES
    );
    std::fs::write(&cfg, toml).unwrap();
    // The model loads while the in-process servers start.
    let worker = spawn(
        "sieve-worker",
        &["--model", "default", "--port", "0", "--admin-port", "0", "--no-autotune", "--config", cfg.to_str().unwrap()],
        START,
    );
    let direct = SimWorker::start_local(sim_config()).await.expect("sim worker");
    let behind = sims(2, sim_config()).await;
    let mut pc = test_config(behind.iter().map(SimWorker::endpoint).collect());
    pc.limits = limits();
    pc.api = api();
    let proxy = sieve_e2e::proxy(pc, 2).await;
    assert!(wait_ready(&http, &worker.admin_url(), START).await, "the worker never loaded its model");
    let targets = vec![("proxy", proxy.api_addr), ("sim-worker", direct.api_addr), ("worker", worker.api)];
    let mut all = behind;
    all.push(direct);
    Servers { targets, _sims: all, _proxy: proxy, _worker: worker, _dir: dir }
}

// ---------------------------------------------------------------------------------------------
// The table.

struct Case {
    what: &'static str,
    method: &'static str,
    path: &'static str,
    headers: Vec<(&'static str, &'static str)>,
    body: Vec<u8>,
    status: u16,
    /// Errors: a piece of the message. Successes: unused.
    says: &'static str,
}

fn case(what: &'static str, path: &'static str, body: impl Into<Vec<u8>>, status: u16, says: &'static str) -> Case {
    Case { what, method: "POST", path, headers: vec![], body: body.into(), status, says }
}

fn items() -> Value {
    json!(["red leather shoes", {"id": "b", "text": "blue felt hat"}, "running shoes, red", "a green umbrella"])
}

fn error_cases() -> Vec<Case> {
    let j = |v: Value| v.to_string().into_bytes();
    let mut cases = vec![
        case("malformed JSON", "/v1/score", b"{\"query\": \"x\", ".to_vec(), 400, "malformed JSON"),
        case("not JSON at all", "/v1/rerank", b"query=x".to_vec(), 400, "malformed JSON"),
        case("wrong field type", "/v1/score", j(json!({"query": 7, "items": ["a"]})), 422, "invalid type"),
        case(
            "wrong field type (rerank)",
            "/v1/rerank",
            j(json!({"query": "x", "documents": ["a"], "top_n": "2"})),
            422,
            "invalid type",
        ),
        case("missing items", "/v1/score", j(json!({"query": "x"})), 422, "missing field `items`"),
        case(
            "unknown top-level field",
            "/v1/score",
            j(json!({"query": "x", "items": ["a"], "itmes": 1})),
            422,
            "unknown field `itmes`",
        ),
        case(
            "unknown top-level field (rerank)",
            "/v1/rerank",
            j(json!({"query": "x", "documents": ["a"], "topn": 1})),
            422,
            "unknown field `topn`",
        ),
        case(
            "unknown field inside an item",
            "/v1/score",
            j(json!({"query": "x", "items": ["a", {"text": "b", "idd": 1}]})),
            422,
            "unknown field `idd`",
        ),
        case(
            "an object document without text",
            "/v1/rerank",
            j(json!({"query": "x", "documents": [{"txt": "b"}]})),
            422,
            "documents[0] has no field `text`",
        ),
        case("an item that is a number", "/v1/score", j(json!({"query": "x", "items": [3]})), 422, "expected an item"),
        case("empty query", "/v1/score", j(json!({"query": "  ", "items": ["a"]})), 422, "query is empty"),
        case("no items", "/v1/score", j(json!({"query": "x", "items": []})), 422, "items is empty"),
        case("no documents", "/v1/rerank", j(json!({"query": "x", "documents": []})), 422, "documents is empty"),
        case("empty item", "/v1/score", j(json!({"query": "x", "items": ["a", " "]})), 422, "items[1] is empty"),
        case("too many items", "/v1/score", j(json!({"query": "x", "items": vec!["a"; 9]})), 413, "max_items 8"),
        case(
            "too many documents",
            "/v1/rerank",
            j(json!({"query": "x", "documents": vec!["a"; 9]})),
            413,
            "too many documents: 9 > max_items 8",
        ),
        case(
            "item too long",
            "/v1/score",
            j(json!({"query": "x", "items": ["a", "b".repeat(201)]})),
            413,
            "items[1] too long: 201 characters > max_item_chars 200",
        ),
        case(
            "top_n 0",
            "/v1/rerank",
            j(json!({"query": "x", "documents": ["a", "b"], "top_n": 0})),
            422,
            "top_n must be at least 1",
        ),
        case(
            "deadline_ms 0",
            "/v1/score",
            j(json!({"query": "x", "items": ["a"], "deadline_ms": 0})),
            422,
            "deadline_ms must be positive",
        ),
        case(
            "deadline_ms over the limit",
            "/v1/rerank",
            j(json!({"query": "x", "documents": ["a"], "deadline_ms": 600_001})),
            422,
            "max_deadline_ms 600000",
        ),
        case(
            "on_overload not reject or partial",
            "/v1/score",
            j(json!({"query": "x", "items": ["a"], "on_overload": "drop"})),
            422,
            "unknown variant `drop`, expected `reject` or `partial`",
        ),
        case("body over max_body_bytes", "/v1/score", vec![b' '; 5000], 413, "max_body_bytes 4096"),
        Case { method: "GET", ..case("GET on /v1/score", "/v1/score", Vec::new(), 405, "/v1/score needs POST") },
        Case { method: "PUT", ..case("PUT on /v1/rerank", "/v1/rerank", Vec::new(), 405, "/v1/rerank needs POST") },
        case("unknown route", "/v1/scores", j(json!({"query": "x", "items": ["a"]})), 404, "no route /v1/scores"),
        // The drop-in shapes (server/src/compat): the same limits and errors, their own field names.
        case(
            "TEI raw_scores",
            "/rerank",
            j(json!({"query": "x", "texts": ["a"], "raw_scores": true})),
            422,
            "raw_scores: true is not supported",
        ),
        case(
            "max_item_tokens 0",
            "/v1/score",
            j(json!({"query": "x", "items": ["a"], "max_item_tokens": 0})),
            422,
            "max_item_tokens must be at least 1",
        ),
        case(
            "TEI texts and documents",
            "/rerank",
            j(json!({"query": "x", "texts": ["a"], "documents": ["a"]})),
            422,
            "unknown field `documents`",
        ),
        case("TEI malformed JSON", "/rerank", b"{\"query\": ".to_vec(), 400, "malformed JSON"),
        case(
            "vLLM rerank on /rerank: top_n 0",
            "/rerank",
            j(json!({"model": "m", "query": "x", "documents": ["a"], "top_n": 0})),
            422,
            "top_n must be at least 1",
        ),
        Case {
            headers: vec![("content-encoding", "br")],
            ..case("a body in brotli", "/v1/score", j(json!({"query": "x", "items": ["a"]})), 415, "gzip or zstd")
        },
        Case {
            headers: vec![("content-encoding", "gzip")],
            ..case("a gzip body that is not gzip", "/v1/score", b"plain".to_vec(), 400, "not valid gzip")
        },
        Case {
            headers: vec![("content-encoding", "gzip")],
            ..case(
                "a gzip body over max_body_bytes decoded",
                "/v1/rerank",
                gzip(&json!({"query": "x", "documents": ["a".repeat(5000)]}).to_string().into_bytes()),
                413,
                "decodes (gzip) to more than max_body_bytes 4096",
            )
        },
        case(
            "TEI too many texts",
            "/rerank",
            j(json!({"query": "x", "texts": vec!["a"; 9]})),
            413,
            "too many texts: 9 > max_items 8",
        ),
        case("TEI empty query", "/rerank", j(json!({"query": "", "texts": ["a"]})), 422, "query is empty"),
        case(
            "vLLM score: two queries",
            "/score",
            j(json!({"text_1": ["x", "y"], "text_2": ["a", "b"]})),
            422,
            "text_1[1] differs from text_1[0]",
        ),
        case(
            "vLLM score: text too long",
            "/score",
            j(json!({"text_1": "x", "text_2": ["a", "b".repeat(201)]})),
            413,
            "text_2[1] too long: 201 characters > max_item_chars 200",
        ),
        case(
            "vLLM score: truncation 0",
            "/score",
            j(json!({"text_1": "x", "text_2": "a", "truncate_prompt_tokens": 0})),
            422,
            "give at least 1, or -1 for the server's limit",
        ),
        case(
            "Cohere v1 max_chunks_per_doc",
            "/v1/rerank",
            j(json!({"query": "x", "documents": ["a"], "max_chunks_per_doc": 10})),
            422,
            "max_chunks_per_doc is not supported",
        ),
        case(
            "Cohere v2 max_tokens_per_doc 0",
            "/v2/rerank",
            j(json!({"model": "m", "query": "x", "documents": ["a"], "max_tokens_per_doc": 0})),
            422,
            "max_tokens_per_doc and truncate_prompt_tokens must be at least 1",
        ),
        case(
            "rank_fields naming a field a document lacks",
            "/v1/rerank",
            j(json!({"query": "x", "documents": [{"text": "a"}], "rank_fields": ["title"]})),
            422,
            "documents[0] has no field `title`, which rank_fields names",
        ),
        Case { method: "GET", ..case("GET on /rerank", "/rerank", Vec::new(), 405, "/rerank needs POST") },
        Case { method: "GET", ..case("GET on /score", "/score", Vec::new(), 405, "/score needs POST") },
    ];
    // The deadline header counts when the body has none.
    let body = j(json!({"query": "x", "items": ["a"]}));
    cases.push(Case {
        headers: vec![("x-sieve-deadline-ms", "0")],
        ..case("deadline header 0", "/v1/score", body.clone(), 422, "deadline_ms must be positive")
    });
    cases.push(Case {
        headers: vec![("x-sieve-deadline-ms", "700000")],
        ..case("deadline header over the limit", "/v1/score", body.clone(), 422, "max_deadline_ms 600000")
    });
    cases.push(Case {
        headers: vec![("x-sieve-deadline-ms", "soon")],
        ..case("deadline header not a number", "/v1/score", body, 422, "x-sieve-deadline-ms header \"soon\"")
    });
    cases
}

fn scores(v: &Value) -> Vec<f64> {
    v["scores"]
        .as_array()
        .unwrap_or_else(|| panic!("no scores: {v}"))
        .iter()
        .map(|s| s.as_f64().unwrap_or_else(|| panic!("null score: {v}")))
        .collect()
}

/// Scores from one server match across calls to 1e-4 (the real model's batch composition may
/// move the last bits).
fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-4 * (1.0 + a.abs().max(b.abs()))
}

/// The successful cases, checked against one server: scores in input order with ids, rerank
/// sorted, truncated and with documents, the deadline header accepted, `on_overload` accepted.
async fn check_successes(name: &str, addr: SocketAddr) {
    let query = "red shoes";
    let fwd = json!({"query": query, "items": items()});
    let a = exchange(addr, "POST", "/v1/score", &[], fwd.to_string().as_bytes()).await;
    assert_eq!(a.status, 200, "{name}: score: {}", a.raw_body);
    let s = scores(&a.body);
    assert_eq!(s.len(), 4, "{name}: {}", a.body);
    assert!(s.iter().all(|x| x.is_finite()), "{name}: {}", a.body);
    assert_eq!(a.body["ids"], json!([null, "b", null, null]), "{name}");
    assert!(a.body.get("missing").is_none(), "{name}: {}", a.body);
    for h in ["x-sieve-queue-ms", "x-sieve-compute-ms", "x-sieve-total-ms"] {
        let v: f64 = a.header(h).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name}: no {h} header"));
        assert!(v >= 0.0, "{name}: {h} {v}");
    }

    // In input order: the same items reversed give the same scores reversed.
    let mut rev_items = items().as_array().unwrap().clone();
    rev_items.reverse();
    let rev =
        exchange(addr, "POST", "/v1/score", &[], json!({"query": query, "items": rev_items}).to_string().as_bytes())
            .await;
    assert_eq!(rev.status, 200, "{name}: {}", rev.raw_body);
    let r: Vec<f64> = scores(&rev.body).into_iter().rev().collect();
    assert!(s.iter().zip(&r).all(|(a, b)| close(*a, *b)), "{name}: forward {s:?}, reversed back {r:?}");
    assert_eq!(rev.body["ids"], json!([null, null, "b", null]), "{name}");

    // Rerank: every document, best first, each with its score.
    let rr =
        exchange(addr, "POST", "/v1/rerank", &[], json!({"query": query, "documents": items()}).to_string().as_bytes())
            .await;
    assert_eq!(rr.status, 200, "{name}: rerank: {}", rr.raw_body);
    let results = rr.body["results"].as_array().unwrap_or_else(|| panic!("{name}: {}", rr.body)).clone();
    let mut indices: Vec<usize> = results.iter().map(|x| x["index"].as_u64().unwrap() as usize).collect();
    let rel: Vec<f64> = results.iter().map(|x| x["relevance_score"].as_f64().unwrap()).collect();
    assert!(rel.windows(2).all(|w| w[0] >= w[1]), "{name}: not sorted: {rel:?}");
    for (i, x) in indices.iter().zip(&rel) {
        assert!(close(s[*i], *x), "{name}: document {i} scored {x} by rerank, {} by score", s[*i]);
    }
    // Documents come back unless return_documents is false (vLLM's results always carry them).
    for x in &results {
        let i = x["index"].as_u64().unwrap() as usize;
        let want = items()[i].get("text").cloned().unwrap_or_else(|| items()[i].clone());
        assert_eq!(x["document"]["text"], want, "{name}: {x}");
    }
    // An object document's id is echoed.
    assert!(results.iter().any(|x| x["id"] == "b" && x["index"] == 1), "{name}: {}", rr.body);
    let body = json!({"query": query, "documents": items(), "return_documents": false});
    let none = exchange(addr, "POST", "/v1/rerank", &[], body.to_string().as_bytes()).await;
    assert_eq!(none.status, 200, "{name}: {}", none.raw_body);
    assert!(none.body["results"].as_array().unwrap().iter().all(|x| x.get("document").is_none()), "{name}");
    assert!(rr.header("x-sieve-total-ms").is_some(), "{name}: rerank timing header");
    let best_two = indices[..2].to_vec();
    indices.sort_unstable();
    assert_eq!(indices, vec![0, 1, 2, 3], "{name}");

    // top_n truncates, return_documents echoes the texts.
    let body = json!({"query": query, "documents": items(), "top_n": 2, "return_documents": true});
    let top = exchange(addr, "POST", "/v1/rerank", &[], body.to_string().as_bytes()).await;
    assert_eq!(top.status, 200, "{name}: {}", top.raw_body);
    let results = top.body["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "{name}: {}", top.body);
    let texts = ["red leather shoes", "blue felt hat", "running shoes, red", "a green umbrella"];
    for (x, want) in results.iter().zip(&best_two) {
        assert_eq!(x["index"].as_u64(), Some(*want as u64), "{name}: {}", top.body);
        assert_eq!(x["document"]["text"], json!(texts[*want]), "{name}");
    }

    check_drop_in_shapes(name, addr, &s).await;
    check_truncation(name, addr, &s).await;

    // A deadline from the header when the body has none; the body's wins over the header's.
    let one = json!({"query": query, "items": ["red leather shoes"]}).to_string();
    let d = exchange(addr, "POST", "/v1/score", &[("x-sieve-deadline-ms", "60000")], one.as_bytes()).await;
    assert_eq!(d.status, 200, "{name}: {}", d.raw_body);
    let both = json!({"query": query, "items": ["red leather shoes"], "deadline_ms": 60000}).to_string();
    let d = exchange(addr, "POST", "/v1/score", &[("x-sieve-deadline-ms", "0")], both.as_bytes()).await;
    assert_eq!(d.status, 200, "{name}: the body's deadline_ms wins: {}", d.raw_body);

    // Either overload policy is accepted (a worker ignores it; the proxy uses it only when the
    // deadline cannot be met, which a one-item request with a minute is not).
    for policy in ["reject", "partial"] {
        let body = json!({"query": query, "documents": ["red leather shoes"], "on_overload": policy}).to_string();
        let d = exchange(addr, "POST", "/v1/rerank", &[], body.as_bytes()).await;
        assert_eq!(d.status, 200, "{name}: on_overload {policy}: {}", d.raw_body);
    }
}

/// The drop-in routes give the scores `/v1/score` gave (`s`, in input order), in their shapes.
async fn check_drop_in_shapes(name: &str, addr: SocketAddr, s: &[f64]) {
    let texts = ["red leather shoes", "blue felt hat", "running shoes, red", "a green umbrella"];
    let query = "red shoes";

    // TEI: an array best first, each with its index and score, texts when asked.
    let body = json!({"query": query, "texts": texts, "return_text": true, "truncate": false});
    let tei = exchange(addr, "POST", "/rerank", &[], body.to_string().as_bytes()).await;
    assert_eq!(tei.status, 200, "{name}: TEI: {}", tei.raw_body);
    let ranks = tei.body.as_array().unwrap_or_else(|| panic!("{name}: TEI answer not an array: {}", tei.body));
    assert_eq!(ranks.len(), 4, "{name}: {}", tei.body);
    let tei_scores: Vec<f64> = ranks.iter().map(|r| r["score"].as_f64().unwrap()).collect();
    assert!(tei_scores.windows(2).all(|w| w[0] >= w[1]), "{name}: TEI not sorted: {tei_scores:?}");
    for r in ranks {
        let i = r["index"].as_u64().unwrap() as usize;
        assert!(close(s[i], r["score"].as_f64().unwrap()), "{name}: TEI text {i}: {r} vs {}", s[i]);
        assert_eq!(r["text"], json!(texts[i]), "{name}");
    }
    assert!(tei.header("x-sieve-total-ms").is_some(), "{name}: TEI timing header");

    // vLLM score: data in input order, on /score and (as vLLM serves it) on /v1/score.
    let body = json!({"model": "any", "text_1": query, "text_2": texts});
    let v1 = exchange(addr, "POST", "/v1/score", &[], body.to_string().as_bytes()).await;
    assert_eq!(v1.status, 200, "{name}: vLLM score on /v1/score: {}", v1.raw_body);
    assert_eq!(v1.body["object"], "list", "{name}: {}", v1.body);
    let v = exchange(addr, "POST", "/score", &[], body.to_string().as_bytes()).await;
    assert_eq!(v.body["data"], v1.body["data"], "{name}: /score and /v1/score");
    assert_eq!(v.status, 200, "{name}: vLLM score: {}", v.raw_body);
    assert_eq!(v.body["object"], "list", "{name}: {}", v.body);
    let data = v.body["data"].as_array().unwrap_or_else(|| panic!("{name}: {}", v.body));
    assert_eq!(data.len(), 4, "{name}: {}", v.body);
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["index"].as_u64(), Some(i as u64), "{name}: {}", v.body);
        assert_eq!(d["object"], "score", "{name}");
        assert!(close(s[i], d["score"].as_f64().unwrap()), "{name}: vLLM text {i}: {d} vs {}", s[i]);
    }
    assert!(v.body["usage"]["total_tokens"].as_u64().is_some(), "{name}: {}", v.body);

    // Cohere v2's route answers as /v1/rerank does, with the fields the clients read.
    let body = json!({"model": "rerank-v3.5", "query": query, "documents": texts, "top_n": 3});
    let c = exchange(addr, "POST", "/v2/rerank", &[], body.to_string().as_bytes()).await;
    assert_eq!(c.status, 200, "{name}: /v2/rerank: {}", c.raw_body);
    let results = c.body["results"].as_array().unwrap_or_else(|| panic!("{name}: {}", c.body));
    assert_eq!(results.len(), 3, "{name}: {}", c.body);
    for r in results {
        let i = r["index"].as_u64().unwrap() as usize;
        assert!(close(s[i], r["relevance_score"].as_f64().unwrap()), "{name}: /v2/rerank {i}: {r}");
    }
    assert!(c.body["id"].as_str().is_some_and(|id| !id.is_empty()), "{name}: {}", c.body);
    assert!(c.body["usage"]["total_tokens"].as_u64().is_some(), "{name}: {}", c.body);
    // /v2/rerank is Cohere's v2 API: it says so (it said "1" before issue 32).
    assert_eq!(c.body["meta"]["api_version"]["version"], "2", "{name}: {}", c.body);
    let c1 = exchange(addr, "POST", "/v1/rerank", &[], body.to_string().as_bytes()).await;
    assert_eq!(c1.body["meta"]["api_version"]["version"], "1", "{name}: {}", c1.body);

    // vLLM's rerank body on TEI's path: answered as /v1/rerank, each result with its document.
    let body = json!({"model": "m", "query": query, "documents": texts, "top_n": 2});
    let v = exchange(addr, "POST", "/rerank", &[], body.to_string().as_bytes()).await;
    assert_eq!(v.status, 200, "{name}: vLLM /rerank: {}", v.raw_body);
    let results = v.body["results"].as_array().unwrap_or_else(|| panic!("{name}: {}", v.body));
    assert_eq!(results.len(), 2, "{name}: {}", v.body);
    for r in results {
        let i = r["index"].as_u64().unwrap() as usize;
        assert!(close(s[i], r["relevance_score"].as_f64().unwrap()), "{name}: vLLM /rerank {i}: {r}");
        assert_eq!(r["document"]["text"], texts[i], "{name}: {r}");
    }

    // A model that is neither served nor an alias: 404 naming the served one, on every route,
    // in the route's own error shape.
    for (path, body) in [
        ("/v1/score", json!({"model": "gpt-4", "query": query, "items": texts})),
        ("/v1/rerank", json!({"model": "gpt-4", "query": query, "documents": texts})),
        ("/score", json!({"model": "gpt-4", "text_1": query, "text_2": texts})),
    ] {
        let a = exchange(addr, "POST", path, &[], body.to_string().as_bytes()).await;
        assert_eq!(a.status, 404, "{name}: {path}: {}", a.raw_body);
        let msg = a.body["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("model `gpt-4` not found: this server serves `"), "{name}: {path}: {msg}");
    }
    let body = json!({"model": "gpt-4", "query": query, "texts": texts});
    let a = exchange(addr, "POST", "/rerank", &[], body.to_string().as_bytes()).await;
    assert_eq!((a.status, &a.body["error_type"]), (404, &json!("Validation")), "{name}: {}", a.raw_body);
    assert!(a.body["error"].as_str().is_some_and(|m| m.contains("not found")), "{name}: {}", a.raw_body);
    // Every route takes the served model's aliases (TEI's too).
    let body = json!({"model": "rerank-v3.5", "query": query, "items": texts});
    let a = exchange(addr, "POST", "/v1/score", &[], body.to_string().as_bytes()).await;
    assert_eq!(a.status, 200, "{name}: {}", a.raw_body);

    // Compressed bodies are read: the same scores as the plain body.
    let plain = json!({"query": query, "items": texts}).to_string().into_bytes();
    for (encoding, body) in [("gzip", gzip(&plain)), ("zstd", zstd::encode_all(&plain[..], 3).unwrap())] {
        let a = exchange(addr, "POST", "/v1/score", &[("content-encoding", encoding)], &body).await;
        assert_eq!(a.status, 200, "{name}: {encoding}: {}", a.raw_body);
        let got = scores(&a.body);
        assert!(got.iter().zip(s).all(|(a, b)| close(*a, *b)), "{name}: {encoding}: {got:?} vs {s:?}");
    }
}

fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// Every shape's truncation option is served: a cap the items are under changes no score; a
/// cut is counted in `usage.truncated_items` (by the real worker: the simulated ones cut nothing).
async fn check_truncation(name: &str, addr: SocketAddr, s: &[f64]) {
    let texts = ["red leather shoes", "blue felt hat", "running shoes, red", "a green umbrella"];
    let query = "red shoes";
    let calls = [
        ("/v1/score", json!({"query": query, "items": texts, "max_item_tokens": 100, "truncation_direction": "left"})),
        ("/rerank", json!({"query": query, "texts": texts, "truncate": true, "truncation_direction": "Right"})),
        ("/score", json!({"text_1": query, "text_2": texts, "truncate_prompt_tokens": 100})),
        ("/v2/rerank", json!({"model": "m", "query": query, "documents": texts, "max_tokens_per_doc": 4096})),
        ("/v1/rerank", json!({"query": query, "documents": texts, "truncate_prompt_tokens": -1})),
    ];
    for (path, body) in calls {
        let a = exchange(addr, "POST", path, &[], body.to_string().as_bytes()).await;
        assert_eq!(a.status, 200, "{name}: {path} with truncation: {}", a.raw_body);
        let got: Vec<(usize, f64)> = match path {
            "/v1/score" => scores(&a.body).into_iter().enumerate().collect(),
            "/rerank" => a
                .body
                .as_array()
                .unwrap()
                .iter()
                .map(|r| (r["index"].as_u64().unwrap() as usize, r["score"].as_f64().unwrap()))
                .collect(),
            "/score" => a.body["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| (d["index"].as_u64().unwrap() as usize, d["score"].as_f64().unwrap()))
                .collect(),
            _ => a.body["results"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| (r["index"].as_u64().unwrap() as usize, r["relevance_score"].as_f64().unwrap()))
                .collect(),
        };
        assert_eq!(got.len(), 4, "{name}: {path}: {}", a.body);
        assert!(got.iter().all(|&(i, x)| close(s[i], x)), "{name}: {path}: {got:?} vs {s:?}");
        assert!(a.body["usage"].get("truncated_items").is_none(), "{name}: {path}: nothing was cut: {}", a.body);
    }
    if name == "worker" {
        let body = json!({"query": query, "items": ["red leather shoes with a long description of their soles", "hat"], "max_item_tokens": 3});
        let a = exchange(addr, "POST", "/v1/score", &[], body.to_string().as_bytes()).await;
        assert_eq!(a.status, 200, "{name}: {}", a.raw_body);
        assert_eq!(a.body["usage"]["truncated_items"], 1, "{name}: {}", a.body);
        // Each count includes the template's suffix; "hat" is a token or two.
        let t = |i: usize| a.body["usage"]["item_tokens"][i].as_u64().unwrap();
        assert!(t(0) <= t(1) + 3, "{name}: cut to 3 tokens: {}", a.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_worker_and_sim_worker_answer_every_case_alike() {
    let t0 = Instant::now();
    let s = servers().await;
    eprintln!("servers up in {:.1} s", t0.elapsed().as_secs_f64());
    for c in error_cases() {
        let mut first: Option<(&str, Value)> = None;
        for &(name, addr) in &s.targets {
            let a = exchange(addr, c.method, c.path, &c.headers, &c.body).await;
            assert_eq!(a.status, c.status, "{name}: {}: {}", c.what, a.raw_body);
            let tei = c.path == "/rerank" && !c.what.starts_with("vLLM");
            let msg = if tei {
                // TEI's shape: {"error": "...", "error_type": "..."}.
                assert_eq!(a.body["error_type"], "Validation", "{name}: {}: {}", c.what, a.raw_body);
                a.body["error"].as_str().unwrap_or_default()
            } else {
                let e = &a.body["error"];
                assert_eq!(e["code"].as_u64(), Some(u64::from(c.status)), "{name}: {}: {}", c.what, a.raw_body);
                let kind = ErrorKind::from_status(c.status).unwrap();
                assert_eq!(e["type"], serde_json::to_value(kind).unwrap(), "{name}: {}: {}", c.what, a.raw_body);
                e["message"].as_str().unwrap_or_default()
            };
            assert!(msg.contains(c.says), "{name}: {}: {msg:?} lacks {:?}", c.what, c.says);
            assert_eq!(a.header("content-type"), Some("application/json"), "{name}: {}", c.what);
            if c.status == 405 {
                assert_eq!(a.header("allow"), Some("POST"), "{name}: {}", c.what);
            }
            match &first {
                None => first = Some((name, a.body)),
                Some((n0, b0)) => assert_eq!(&a.body, b0, "{}: {name} and {n0} answer differently", c.what),
            }
        }
    }
    for &(name, addr) in &s.targets {
        let a = oversized_on_keep_alive(addr).await;
        assert_eq!(a.status, 413, "{name}: {}", a.raw_body);
        assert_eq!(a.header("connection"), Some("close"), "{name}");
    }
    for &(name, addr) in &s.targets {
        check_successes(name, addr).await;
    }
    // The proxy over simulated workers scores exactly as one simulated worker does.
    let body = json!({"query": "red shoes", "items": items()}).to_string();
    let via_proxy = exchange(s.targets[0].1, "POST", "/v1/score", &[], body.as_bytes()).await;
    let direct = exchange(s.targets[1].1, "POST", "/v1/score", &[], body.as_bytes()).await;
    assert_eq!(via_proxy.body["scores"], direct.body["scores"]);
    assert!(via_proxy.header("x-sieve-shards").is_some_and(|n| n.parse::<u32>().is_ok_and(|n| n >= 1)));
    eprintln!("all cases in {:.1} s", t0.elapsed().as_secs_f64());
}

/// Issue 13 point 2: a request counts in flight only once its body is read, so clients that
/// send headers and stall hold no admission slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_holds_no_proxy_admission_slot() {
    let workers = sims(1, SimConfig::default()).await;
    let mut cfg = test_config(workers.iter().map(SimWorker::endpoint).collect());
    cfg.server.max_in_flight_requests = 1;
    let p = sieve_e2e::proxy(cfg, 1).await;
    let body = json!({"query": "red shoes", "items": ["red leather shoes", "a green umbrella"]}).to_string();

    // Headers and the first bytes of the body, then nothing.
    let mut stalled = TcpStream::connect(p.api_addr).await.unwrap();
    let head =
        format!("POST /v1/score HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n", body.len());
    stalled.write_all(head.as_bytes()).await.unwrap();
    stalled.write_all(&body.as_bytes()[..5]).await.unwrap();
    // Give the proxy time to take the head and start reading the body.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(p.state.drain.in_flight(), 0, "a request without its body is counted in flight");

    let full = exchange(p.api_addr, "POST", "/v1/score", &[], body.as_bytes()).await;
    assert_eq!(full.status, 200, "a full request behind a stalled one: {}", full.raw_body);

    // The stalled request was alive all along: finished, it is answered too.
    stalled.write_all(&body.as_bytes()[5..]).await.unwrap();
    let mut out = vec![];
    tokio::time::timeout(EXCHANGE, stalled.read_to_end(&mut out))
        .await
        .expect("the stalled request is answered")
        .unwrap();
    let a = parse_answer(&out);
    assert_eq!(a.status, 200, "{}", a.raw_body);
    assert_eq!(a.body["scores"], full.body["scores"]);
    assert_eq!(p.state.drain.in_flight(), 0);
}

/// `[api] cors_allow_origins`: off by default (no CORS headers, a preflight is 405); on, an
/// allowed origin's preflight is answered and its calls carry the CORS headers, another
/// origin's do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_is_off_by_default_and_answers_the_origins_configured() {
    let origin = "https://shop.example";
    let plain = SimWorker::start_local(SimConfig::default()).await.expect("sim worker");
    let api = ApiConfig { cors_allow_origins: vec![origin.into()], ..ApiConfig::default() };
    let cors = SimWorker::start_local(SimConfig { api, ..SimConfig::default() }).await.expect("sim worker");
    let preflight = [
        ("origin", origin),
        ("access-control-request-method", "POST"),
        ("access-control-request-headers", "content-type,x-sieve-deadline-ms"),
    ];
    let body = json!({"query": "red shoes", "items": ["red leather shoes"]}).to_string();

    let a = exchange(plain.api_addr, "OPTIONS", "/v1/score", &preflight, b"").await;
    assert_eq!(a.status, 405, "{}", a.raw_body);
    let a = exchange(plain.api_addr, "POST", "/v1/score", &[("origin", origin)], body.as_bytes()).await;
    assert_eq!(a.status, 200, "{}", a.raw_body);
    assert_eq!(a.header("access-control-allow-origin"), None, "no CORS unless configured");

    let a = exchange(cors.api_addr, "OPTIONS", "/v1/score", &preflight, b"").await;
    assert_eq!(a.status, 200, "{}", a.raw_body);
    assert_eq!(a.header("access-control-allow-origin"), Some(origin));
    assert!(a.header("access-control-allow-methods").is_some_and(|m| m.contains("POST")), "{:?}", a.headers);
    assert!(
        a.header("access-control-allow-headers").is_some_and(|h| h.contains("x-sieve-deadline-ms")),
        "{:?}",
        a.headers
    );
    let a = exchange(cors.api_addr, "POST", "/v1/score", &[("origin", origin)], body.as_bytes()).await;
    assert_eq!(a.status, 200, "{}", a.raw_body);
    assert_eq!(a.header("access-control-allow-origin"), Some(origin));
    assert!(
        a.header("access-control-expose-headers").is_some_and(|h| h.contains("x-sieve-total-ms")),
        "{:?}",
        a.headers
    );
    let a = exchange(cors.api_addr, "POST", "/v1/score", &[("origin", "https://evil.example")], body.as_bytes()).await;
    assert_eq!(a.header("access-control-allow-origin"), None, "an origin not listed");
}
