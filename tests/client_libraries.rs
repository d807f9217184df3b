//! Real client libraries against a real `sieve-proxy` process over two simulated-worker
//! processes, each returning the order and scores `/v1/rerank` gives:
//!
//! - the cohere Python SDK's `rerank` (v1 and v2 clients, `POST /v1/rerank`, `/v2/rerank`), and a
//!   refusal reaching it as a 422 with Sieve's message;
//! - LlamaIndex's text-embeddings-inference postprocessor (`POST /rerank`, TEI's shape) and its
//!   Jina postprocessor (`POST /v1/rerank`, Jina's shape).
//!
//! The libraries live in the venv `scripts/fetch-assets py` creates under the cache folder
//! (`$SIEVE_CACHE/py`, pinned in `scripts/py-requirements.txt`); without it these tests fail and
//! say so. vLLM's shapes have no client library of their own; `api_cases.rs` checks their JSON.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use sieve_e2e::{spawn, wait_ready, Http, Proc};
use tokio::io::AsyncWriteExt;

const START: Duration = Duration::from_secs(20);
/// The SDK's two calls and a refused one, on loopback: seconds; the bound only stops a hang.
const CLIENT_RUN: Duration = Duration::from_secs(120);

/// The venv's Python, or a failure naming the command that creates it.
fn venv_python() -> PathBuf {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let cache = std::env::var_os("SIEVE_CACHE").map_or_else(|| repo.join(".cache"), PathBuf::from);
    let python = cache.join("py").join("bin").join("python");
    assert!(
        python.exists(),
        "{} is missing: the client-library venv is made by `scripts/fetch-assets py` (`scripts/test` runs it)",
        python.display()
    );
    python
}

/// Runs `tests/clients/{script}` with `input` on stdin; its stdout as JSON.
async fn run_client(script: &str, input: &Value) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients").join(script);
    let mut cmd = tokio::process::Command::new(venv_python());
    cmd.arg(&path).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    // Loopback only: no proxy from the environment between the SDK and the server.
    for v in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"] {
        cmd.env_remove(v);
    }
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("starting {}: {e}", path.display()));
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.to_string().as_bytes()).await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(CLIENT_RUN, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{script} did not finish in {CLIENT_RUN:?}"))
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{script} failed ({}): {stderr}", out.status);
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{script} printed no JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

fn sim() -> Proc {
    spawn("sieve-loadtest", &["sim-worker", "--port", "0", "--admin-port", "0"], START)
}

/// `(index, relevance_score)` of each result, in order.
fn ranking(results: &Value) -> Vec<(u64, f64)> {
    results
        .as_array()
        .unwrap_or_else(|| panic!("no results: {results}"))
        .iter()
        .map(|r| (r["index"].as_u64().unwrap(), r["relevance_score"].as_f64().unwrap()))
        .collect()
}

/// A proxy process over two simulated-worker processes (dropped: all three killed).
struct Cluster {
    proxy: Proc,
    _workers: [Proc; 2],
}

async fn cluster(http: &Http) -> Cluster {
    let (a, b) = (sim(), sim());
    let proxy = spawn(
        "sieve-proxy",
        &["--port", "0", "--admin-port", "0", "--worker", &a.worker_arg(), "--worker", &b.worker_arg()],
        START,
    );
    assert!(wait_ready(http, &proxy.admin_url(), START).await, "proxy never ready");
    Cluster { proxy, _workers: [a, b] }
}

const QUERY: &str = "waterproof trail running shoes";
const DOCUMENTS: [&str; 8] = [
    "trail running shoes, waterproof, men's",
    "leather office shoes",
    "waterproof hiking boots",
    "cotton t-shirt",
    "running socks, 3 pack",
    "road running shoes, breathable mesh",
    "rain jacket, waterproof",
    "trail running shoes for women",
];
const TOP_N: usize = 5;

/// What `/v1/rerank` answers for the query, its documents and `TOP_N`: `(index, score)`.
async fn sieve_ranking(http: &Http, c: &Cluster) -> Vec<(u64, f64)> {
    let body = json!({"query": QUERY, "documents": DOCUMENTS, "top_n": TOP_N, "return_documents": true});
    let direct = http.post_json(&format!("{}/v1/rerank", c.proxy.api_url()), &body).await;
    assert_eq!(direct.status, 200, "{}", direct.text());
    let want = ranking(&direct.json::<Value>()["results"]);
    assert_eq!(want.len(), TOP_N);
    want
}

/// The clients' input: the proxy's URL, the query, the documents, `TOP_N`.
fn client_input(c: &Cluster) -> Value {
    json!({"base_url": c.proxy.api_url(), "query": QUERY, "documents": DOCUMENTS, "top_n": TOP_N})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cohere_sdk_reranks_through_the_proxy_as_v1_rerank_does() {
    venv_python(); // first: a missing venv fails before anything starts
    let http = Http::new();
    let c = cluster(&http).await;
    let want = sieve_ranking(&http, &c).await;
    let got = run_client("cohere_rerank.py", &client_input(&c)).await;
    for client in ["v1", "v2", "v1_objects"] {
        // Scores go f32 → JSON → Python float → JSON unchanged: equal, not merely close.
        assert_eq!(ranking(&got[client]["results"]), want, "cohere {client} client: {got}");
        assert!(got[client]["id"].as_str().is_some_and(|id| id.starts_with("rerank-")), "{got}");
    }
    for r in got["v1"]["results"].as_array().unwrap() {
        let i = r["index"].as_u64().unwrap() as usize;
        assert_eq!(r["text"], json!(DOCUMENTS[i]), "v1 return_documents: {r}");
    }
    assert!(got["v2"]["results"].as_array().unwrap().iter().all(|r| r["text"].is_null()), "{got}");

    let refused = &got["refused"];
    assert_eq!(refused["status"], 422, "max_chunks_per_doc: {got}");
    let msg = refused["body"]["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("max_chunks_per_doc is not supported"), "{msg:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llamaindex_s_tei_and_jina_rerankers_rank_through_the_proxy_as_v1_rerank_does() {
    venv_python();
    let http = Http::new();
    let c = cluster(&http).await;
    let want = sieve_ranking(&http, &c).await;
    let got = run_client("llamaindex_rerank.py", &client_input(&c)).await;
    for client in ["tei", "jina"] {
        let ranked: Vec<(u64, f64)> = got[client]
            .as_array()
            .unwrap_or_else(|| panic!("{client}: {got}"))
            .iter()
            .map(|r| (r["index"].as_u64().unwrap(), r["score"].as_f64().unwrap()))
            .collect();
        assert_eq!(ranked, want, "LlamaIndex {client} postprocessor: {got}");
    }
}
