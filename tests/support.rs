//! Helpers for the end-to-end tests: locating the built binaries, starting them on loopback
//! (real processes, or proxies and simulated workers in-process), and talking HTTP to them.

pub mod abuse;
pub mod soak;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{HeaderMap, Method, Request};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;
use serde::Serialize;
use sieve_loadtest::sim::{SimConfig, SimWorker};
use sieve_proxy::{Launch, RunningProxy};
use sieve_shared::{ProxyConfig, WorkerEndpoint};

// ---------------------------------------------------------------------------------------------
// HTTP

#[derive(Clone)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
}

#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json<T: DeserializeOwned>(&self) -> T {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("status {}: {e}: {}", self.status, String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl Default for Http {
    fn default() -> Self {
        Self::new()
    }
}

impl Http {
    pub fn new() -> Self {
        let mut c = HttpConnector::new();
        c.set_nodelay(true);
        Http { client: Client::builder(TokioExecutor::new()).build(c) }
    }

    pub async fn send(&self, method: Method, url: &str, body: impl Into<Bytes>) -> Result<Reply, String> {
        let req = Request::builder()
            .method(method)
            .uri(url)
            .header("content-type", "application/json")
            .body(Full::new(body.into()))
            .map_err(|e| e.to_string())?;
        let resp = self.client.request(req).await.map_err(|e| format!("{url}: {e:?}"))?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok(Reply { status, headers, body })
    }

    pub async fn post(&self, url: &str, body: impl Into<Bytes>) -> Reply {
        self.send(Method::POST, url, body).await.unwrap_or_else(|e| panic!("POST {e}"))
    }

    pub async fn post_json<T: Serialize>(&self, url: &str, body: &T) -> Reply {
        self.post(url, serde_json::to_vec(body).expect("serializable")).await
    }

    pub async fn try_post_json<T: Serialize>(&self, url: &str, body: &T) -> Result<Reply, String> {
        self.send(Method::POST, url, serde_json::to_vec(body).expect("serializable")).await
    }

    pub async fn get(&self, url: &str) -> Reply {
        self.send(Method::GET, url, Bytes::new()).await.unwrap_or_else(|e| panic!("GET {e}"))
    }

    pub async fn put_json<T: Serialize>(&self, url: &str, body: &T) -> Reply {
        self.send(Method::PUT, url, serde_json::to_vec(body).expect("serializable"))
            .await
            .unwrap_or_else(|e| panic!("PUT {e}"))
    }
}

/// Polls `GET {admin}/ready` until 200 or `timeout`.
pub async fn wait_ready(http: &Http, admin_url: &str, timeout: Duration) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if let Ok(r) = http.send(Method::GET, &format!("{admin_url}/ready"), Bytes::new()).await {
            if r.status == 200 {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

// ---------------------------------------------------------------------------------------------
// Processes

/// A binary built by `cargo test --workspace`, in the same target directory as this test.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/<test>-<hash>  →  target/<profile>/<name>
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build the binaries first (`cargo test --workspace` does, or `cargo build -p sieve-proxy -p sieve-loadtest`)",
        path.display()
    );
    path
}

/// A child process that printed `... listening api=ADDR admin=ADDR` (shared with the load
/// tester, which starts proxies the same way). Killed when dropped.
pub use sieve_loadtest::process::{parse_listening, Proc};

/// Starts the built binary `bin_name` with `args` and waits (at most `timeout`) for its
/// listening line; panics if it does not come.
pub fn spawn(bin_name: &str, args: &[&str], timeout: Duration) -> Proc {
    Proc::start(&bin(bin_name), args, timeout).unwrap_or_else(|e| panic!("{e}"))
}

// ---------------------------------------------------------------------------------------------
// In-process clusters

/// `n` simulated workers on loopback.
pub async fn sims(n: usize, config: SimConfig) -> Vec<SimWorker> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let cfg = SimConfig { seed: i as u64, ..config.clone() };
        out.push(SimWorker::start_local(cfg).await.expect("sim worker"));
    }
    out
}

/// A proxy config for tests: free ports, fast health checks and reloads.
pub fn test_config(workers: Vec<WorkerEndpoint>) -> ProxyConfig {
    let mut c = ProxyConfig::default();
    c.server.port = 0;
    c.server.admin_port = 0;
    c.health.interval_ms = 50;
    c.discovery.reload_interval_ms = 50;
    c.deadline.default_ms = 5000;
    c.drain.timeout_ms = 10_000;
    c.workers = workers;
    c
}

/// Starts a proxy in-process and waits until `ready_workers` of its workers can take shards.
pub async fn proxy(config: ProxyConfig, ready_workers: usize) -> RunningProxy {
    proxy_with(Launch { config, ..Launch::default() }, ready_workers).await
}

pub async fn proxy_with(launch: Launch, ready_workers: usize) -> RunningProxy {
    let p = sieve_proxy::start(launch).await.expect("proxy starts");
    let end = Instant::now() + Duration::from_secs(10);
    while p.state.pool.eligible(Instant::now()).len() < ready_workers {
        assert!(Instant::now() < end, "workers did not become ready");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    p
}

// ---------------------------------------------------------------------------------------------
// Workloads

/// Product-like item texts with skewed lengths (a few long ones), deterministic in `seed`.
pub fn catalogue(n: usize, seed: u64) -> Vec<String> {
    const WORDS: &[&str] = &[
        "trail",
        "running",
        "shoe",
        "waterproof",
        "men's",
        "women's",
        "lightweight",
        "cushioned",
        "grip",
        "mesh",
        "upper",
        "size",
        "black",
        "red",
        "breathable",
        "rubber",
        "outsole",
        "carbon",
        "plate",
        "racing",
        "wide",
        "fit",
        "neutral",
        "stability",
        "road",
        "ultra",
        "marathon",
        "recycled",
        "knit",
        "heel",
    ];
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..n)
        .map(|i| {
            let r = next();
            // Mostly 8-40 words, one in eight 60-200.
            let words = if r % 8 == 0 { 60 + (r >> 8) % 140 } else { 8 + (r >> 8) % 32 };
            let mut t = format!("Item {i}:");
            for _ in 0..words {
                t.push(' ');
                t.push_str(WORDS[(next() % WORDS.len() as u64) as usize]);
            }
            t.push_str(&format!(", model {}", next() % 10_000));
            t
        })
        .collect()
}

pub fn score_body(query: &str, items: &[String], deadline_ms: Option<u64>) -> serde_json::Value {
    let mut v = serde_json::json!({ "query": query, "items": items });
    if let Some(d) = deadline_ms {
        v["deadline_ms"] = d.into();
    }
    v
}
