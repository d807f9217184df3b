//! Helpers for the end-to-end tests: locating the built binaries, starting them on loopback
//! (real processes, or proxies and simulated workers in-process), and talking HTTP to them.

pub mod abuse;
pub mod abuse_grpc;
pub mod soak;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::{HeaderMap, Method};
use serde::de::DeserializeOwned;
use serde::Serialize;
use sieve_loadtest::client;
use sieve_loadtest::sim::{SimConfig, SimWorker};
use sieve_proxy::{Launch, RunningProxy};
use sieve_shared::{ProxyConfig, WorkerEndpoint};

// ---------------------------------------------------------------------------------------------
// HTTP

/// The tests' HTTP client: the load tester's ([`sieve_loadtest::client::Http`], one keep-alive
/// pool), with calls that panic with the URL on a transport error (a test's failure) and a
/// bound on every call, so a server that never answers fails the test instead of hanging it.
#[derive(Clone, Default)]
pub struct Http(client::Http);

/// Every call's bound: far above any answer a test waits for (its own deadlines are seconds).
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// An answer, with the tests' accessors (`json` panics with the status and body).
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl From<client::Reply> for Reply {
    fn from(r: client::Reply) -> Self {
        Reply { status: r.status, headers: r.headers, body: r.body }
    }
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

impl Http {
    pub fn new() -> Self {
        Self::default()
    }

    pub async fn send(&self, method: Method, url: &str, body: impl Into<Bytes>) -> Result<Reply, String> {
        self.0.send(method, url, body.into(), CALL_TIMEOUT).await.map(Reply::from).map_err(|e| format!("{url}: {e}"))
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
        "{} is missing: build the binaries first (`cargo test --workspace` does, or `cargo build -p sieve-proxy -p sieve-loadtest`; `sieve-testmodel`: `cargo build -p sieve-worker --features test-support`)",
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

/// Runs `sieve ARGS` (an `up` that scores the demo request) to its end from the repo root, with
/// quiet logs; asserts that it succeeded and ranked the demo's 20 items (`sku-1001`..`sku-1020`),
/// and returns what it printed.
pub fn sieve_up_demo(args: &[&str]) -> String {
    let out = std::process::Command::new(bin("sieve"))
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    for i in 1001..=1020 {
        assert!(stdout.contains(&format!("sku-{i}")), "sku-{i} not ranked:\n{stdout}");
    }
    stdout
}

/// The addresses `sieve up` printed (proxy and workers, API and admin).
pub fn printed_addresses(out: &str) -> Vec<SocketAddr> {
    out.split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(|w| w.strip_prefix("http://")?.parse().ok())
        .collect()
}

/// Whether nothing listens at any of `addrs` any more.
pub fn all_closed(addrs: &[SocketAddr]) -> bool {
    addrs.iter().all(|a| std::net::TcpStream::connect_timeout(a, Duration::from_millis(200)).is_err())
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
    // Off: the routing, retry and hedge tests send one request again and again and count what
    // the workers get. The pair-score cache's own tests switch it on.
    c.cache.enabled = false;
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
