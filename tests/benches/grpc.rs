//! gRPC against HTTP, measured in the same run.
//!
//!     cargo build --release -p sieve-proxy -p sieve-loadtest
//!     cargo bench -p sieve-e2e --bench grpc [-- --quick] [-- --only HTTP|tonic|hyper]
//!         [-- --calls N] [-- --rounds R] [-- --inline-streams N] [-- --grpc KEY=VALUE]...
//!         [-- --front-end]
//!
//! Part 1 (how the proxy could talk to its workers): calls of one shard (32 items) to a
//! zero-compute `sieve-loadtest sim-worker` process, one at a time and 16 at once: HTTP/1.1 with
//! JSON on pooled keep-alive connections (hyper-util's client, as `proxy/src/client.rs` uses)
//! against gRPC with protobuf on one multiplexed HTTP/2 connection, through a tonic channel and
//! through hyper's HTTP/2 client directly (tonic's generated client on it). Per call:
//! latency p50/p99, and the client process's CPU time (`getrusage`: the worker is another
//! process), body encoding and answer decoding included.
//!
//! Part 2 (the front end): the same 100-item call as gRPC `Score` (both clients) and as
//! `POST /v1/score` through a `sieve-proxy` process over four zero-compute sim-workers, one call
//! at a time, the paths interleaved call by call so all see the same machine; p50 and p99 of each.
//! The same call, with the same clients, is also made directly on one more sim-worker of the same
//! kind (interleaved with the others): via-proxy less direct is the latency the proxy adds, the
//! client's own protocol stack left out. Then the proxy process's CPU time per call of each
//! protocol, run one at a time, and the direct sim-worker's (its gRPC less HTTP is the protocol
//! stack's own cost, which a proxy pays too).
//!
//! Beside each process's CPU per call, its context switches per call (every thread's, from
//! `/proc`): a thread woken or put to sleep, which on a busy machine is latency as well as CPU.
//!
//! Part 2's calls are cut into rounds (`--rounds`, 8 by default): per round, each gRPC path less
//! HTTP at p50 and p99, end to end and in what the proxy adds, then the median and range of each
//! over the rounds and in how many rounds gRPC was no slower: a difference is only read as one
//! when it holds beyond that spread.
//!
//! The clients do the same work per call: the HTTP/1.1 client is hyper-util's pooled client (as
//! the "hyper h2 client" gRPC path is, on HTTP/2), one keep-alive connection per path, no timer
//! armed per call; every client encodes its request from an in-memory value on every call and
//! decodes the whole answer, with TCP_NODELAY.
//!
//! Every call opts out of the proxy's pair-score cache (`cache: false`): the same request
//! repeated would otherwise be answered from the cache, and no shard would reach a worker.
//!
//! A zero-compute sim-worker answers in the poll that read the call (no timer: tokio's would
//! round even a zero sleep up to its next millisecond tick, 1-2 ms per call, which every figure
//! of this bench carried before; ARCHITECTURE.md "gRPC").
//!
//! Everything runs on one machine, the load generator included: compare rows of the same run.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use sieve_e2e::{catalogue, spawn, wait_ready, Http, Proc};
use sieve_server::grpc::pb;
use sieve_server::grpc::pb::sieve_client::SieveClient;
use sieve_shared::ScoreResponse;
use tonic::transport::Channel;

const QUERY: &str = "waterproof trail running shoes for women";
const SHARD_ITEMS: usize = 32;
const REQUEST_ITEMS: usize = 100;
const WORKERS: usize = 4;
const START: Duration = Duration::from_secs(30);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    // `--only WORD`: Part 2 alone, with only the paths whose name holds WORD (`HTTP`, `tonic`,
    // `hyper`), and the proxy's pid printed: a profiler attached to the proxy sees one path.
    let only = args.iter().position(|a| a == "--only").and_then(|i| args.get(i + 1)).cloned();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(|v| v.parse::<usize>().unwrap_or_else(|_| panic!("{name} {v}: not a whole number")).max(1))
    };
    // `--calls N`: calls per row (default 4,000; 400 with `--quick`); `--rounds R`: Part 2's
    // calls cut into R rounds, each round's percentiles printed (default 8).
    let calls = arg("--calls").unwrap_or(if quick { 400 } else { 4000 });
    let rounds = arg("--rounds").unwrap_or(8).min(calls);
    // `--grpc KEY=VALUE` (repeatable): a `[grpc]` key for every process, e.g.
    // `--grpc max_concurrent_streams=16`, to compare with a key's default in one build.
    let grpc_keys: Vec<String> = args
        .iter()
        .enumerate()
        .filter(|(_, a)| *a == "--grpc")
        .map(|(i, _)| args.get(i + 1).cloned().expect("--grpc KEY=VALUE"))
        .collect();
    if !grpc_keys.is_empty() {
        write_grpc_config(&grpc_keys);
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    // `--front-end`: Part 2 alone.
    let skip_transport = args.iter().any(|a| a == "--front-end");
    rt.block_on(run(calls, rounds, only, skip_transport));
}

/// A zero-compute simulated worker process with a gRPC port.
fn zero_sim() -> Proc {
    let mut args =
        vec!["sim-worker", "--port", "0", "--admin-port", "0", "--grpc-port", "0", "--cost-model", ZERO_COST.as_str()];
    if let Some(c) = GRPC_CONFIG.get() {
        args.extend(["--config", c.as_str()]);
    }
    spawn("sieve-loadtest", &args, START)
}

/// With `--grpc KEY=VALUE`: a config file of those `[grpc]` keys that every process of the run
/// is started with (to compare with the default in one build).
static GRPC_CONFIG: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn write_grpc_config(keys: &[String]) {
    let p = std::env::temp_dir().join(format!("sieve-grpc-bench-config-{}.toml", std::process::id()));
    let mut toml = String::from("[grpc]\n");
    for kv in keys {
        let (k, v) = kv.split_once('=').unwrap_or_else(|| panic!("--grpc {kv}: not KEY=VALUE"));
        toml.push_str(&format!("{} = {}\n", k.trim(), v.trim()));
    }
    std::fs::write(&p, &toml).expect("config file");
    println!("every process with {}", toml.replace('\n', " ").trim());
    let _ = GRPC_CONFIG.set(p.display().to_string());
}

static ZERO_COST: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let p = std::env::temp_dir().join(format!("sieve-grpc-bench-cost-{}.json", std::process::id()));
    std::fs::write(&p, r#"{"request_ms": 0.0, "token_ms": 0.0, "token_context_ms": 0.0}"#).expect("cost file");
    p.display().to_string()
});

fn grpc_url(p: &Proc) -> String {
    let addr = p.line.split_whitespace().find_map(|w| w.strip_prefix("grpc=")).expect("a grpc= address");
    format!("http://{addr}")
}

async fn channel(url: &str) -> SieveClient<Channel> {
    let ch = tonic::transport::Endpoint::from_shared(url.to_string()).expect("url").connect().await.expect("connect");
    SieveClient::new(ch)
}

/// User plus system CPU time of this process.
fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into the struct we pass and nothing else.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// User plus system CPU time of another process (Linux `/proc`), in seconds.
fn process_cpu(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the parenthesised command name: state ppid ... utime (14th field) stime (15th).
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(f64::NAN);
    // SAFETY: sysconf reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(11) + ticks(12)) / hz
}

/// Context switches of another process so far, every thread's (Linux `/proc`): each is a
/// thread put to sleep or woken, the scheduler's share of a call.
fn process_switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .flat_map(|status| {
            status
                .lines()
                .filter(|l| l.starts_with("voluntary_ctxt_switches") || l.starts_with("nonvoluntary_ctxt_switches"))
                .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

/// A gRPC client straight on hyper's pooled HTTP/2 client: no tonic channel (whose tower
/// buffer adds a task hop and CPU per call), to tell the protocol's cost from that client stack's.
type LeanClient = SieveClient<Client<HttpConnector, tonic::body::Body>>;

/// The HTTP/1.1 client: hyper-util's pooled keep-alive client with TCP_NODELAY, the same stack
/// as [`LeanClient`] and with no more per call (no timer armed, the body collected whole).
type HttpClient = Client<HttpConnector, Full<Bytes>>;

#[derive(Clone)]
enum Path {
    Http { client: HttpClient, url: hyper::Uri, body: serde_json::Value },
    Grpc { client: SieveClient<Channel>, req: pb::ScoreRequest },
    Lean { client: LeanClient, req: pb::ScoreRequest },
}

impl Path {
    fn http(url: String, items: &[String]) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Path::Http {
            client: Client::builder(TokioExecutor::new()).build(connector),
            url: url.parse().expect("uri"),
            body: serde_json::json!({"query": QUERY, "items": items, "cache": false}),
        }
    }

    async fn grpc(url: &str, items: &[String]) -> Self {
        let items = items.iter().map(|t| pb::Item { text: t.clone(), id: None }).collect();
        Path::Grpc {
            client: channel(url).await,
            req: pb::ScoreRequest { query: QUERY.into(), items, cache: Some(false), ..Default::default() },
        }
    }

    async fn lean(url: &str, items: &[String]) -> Self {
        let Path::Grpc { req, .. } = Self::grpc(url, items).await else { unreachable!("a gRPC path") };
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).http2_only(true).build(connector);
        Path::Lean { client: SieveClient::with_origin(client, url.parse().expect("uri")), req }
    }

    /// One call, the request encoded and the answer decoded as a client must; its latency.
    async fn call(&mut self, n: usize) -> Duration {
        let t0 = Instant::now();
        match self {
            Path::Http { client, url, body } => {
                let bytes = Bytes::from(serde_json::to_vec(body).expect("json"));
                let req = hyper::Request::post(url.clone())
                    .header(hyper::header::CONTENT_TYPE, "application/json")
                    .body(Full::new(bytes))
                    .expect("request");
                let r = client.request(req).await.expect("http call");
                let status = r.status();
                let body = r.into_body().collect().await.expect("http answer").to_bytes();
                assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
                let s: ScoreResponse = serde_json::from_slice(&body).expect("a score answer");
                assert_eq!(s.scores.len(), n);
            }
            Path::Grpc { client, req } => {
                let r = client.score(req.clone()).await.expect("grpc call").into_inner();
                assert_eq!(r.scores.len(), n);
            }
            Path::Lean { client, req } => {
                let r = client.score(req.clone()).await.expect("grpc call").into_inner();
                assert_eq!(r.scores.len(), n);
            }
        }
        t0.elapsed()
    }
}

struct Row {
    p50: f64,
    p99: f64,
    calls_per_s: f64,
    cpu_us_per_call: f64,
}

/// `calls` calls over `concurrency` clients of `path` (each its own clone: its own HTTP pool, or
/// the same gRPC channel, multiplexed).
async fn measure(path: &Path, n: usize, calls: usize, concurrency: usize) -> Row {
    // Warm-up: connections open, caches warm.
    let mut warm = path.clone();
    for _ in 0..50 {
        warm.call(n).await;
    }
    let (cpu0, t0) = (cpu_time(), Instant::now());
    let per = calls / concurrency;
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let mut p = path.clone();
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(per);
                for _ in 0..per {
                    lat.push(p.call(n).await);
                }
                lat
            })
        })
        .collect();
    let mut lat = Vec::with_capacity(calls);
    for t in tasks {
        lat.extend(t.await.expect("client task"));
    }
    let (wall, cpu) = (t0.elapsed(), cpu_time() - cpu0);
    lat.sort_unstable();
    Row {
        p50: pct(&lat, 0.5),
        p99: pct(&lat, 0.99),
        calls_per_s: lat.len() as f64 / wall.as_secs_f64(),
        cpu_us_per_call: cpu.as_secs_f64() * 1e6 / lat.len() as f64,
    }
}

async fn run(calls: usize, rounds: usize, only: Option<String>, skip_transport: bool) {
    let http = Http::new();
    println!("gRPC vs HTTP, {calls} calls per row (one machine: compare rows of this run)\n");
    if only.is_none() && !skip_transport {
        transport(&http, calls).await;
    }
    front_end(&http, calls, rounds, only.as_deref()).await;
    let _ = std::fs::remove_file(ZERO_COST.as_str());
    if let Some(c) = GRPC_CONFIG.get() {
        let _ = std::fs::remove_file(c);
    }
}

/// Part 1: how the proxy could talk to its workers.
async fn transport(http: &Http, calls: usize) {
    println!("Part 1: proxy -> worker transport, {SHARD_ITEMS}-item shard to a zero-compute sim-worker process");
    println!(
        "{:<28} {:>5} {:>9} {:>9} {:>10} {:>14}",
        "path", "conc", "p50 ms", "p99 ms", "calls/s", "client CPU/call"
    );
    let w = zero_sim();
    assert!(wait_ready(http, &w.admin_url(), START).await, "sim-worker not ready");
    let items = catalogue(SHARD_ITEMS, 11);
    let h = Path::http(format!("{}/v1/score", w.api_url()), &items);
    let g = Path::grpc(&grpc_url(&w), &items).await;
    let l = Path::lean(&grpc_url(&w), &items).await;
    for concurrency in [1, 16] {
        for (name, path) in [("HTTP/1.1 JSON, pooled", &h), ("gRPC, tonic channel", &g), ("gRPC, hyper h2 client", &l)]
        {
            let r = measure(path, SHARD_ITEMS, calls, concurrency).await;
            println!(
                "{name:<28} {concurrency:>5} {:>9.3} {:>9.3} {:>10.0} {:>12.1} us",
                r.p50, r.p99, r.calls_per_s, r.cpu_us_per_call
            );
        }
    }
    drop(w);
}

/// Part 2: the client's call through the proxy, as HTTP and as gRPC (`only`: the protocols whose
/// name holds it), and the same call made directly on one sim-worker of the kind the proxy uses:
/// the difference is what the proxy adds, the client's own protocol stack left out. The calls
/// are cut into `rounds` rounds, and each round's gRPC less HTTP is printed, so the spread of
/// the difference is seen beside the difference.
async fn front_end(http: &Http, calls: usize, rounds: usize, only: Option<&str>) {
    println!("\nPart 2: client -> proxy, a {REQUEST_ITEMS}-item call through sieve-proxy over {WORKERS} zero-compute sim-workers, interleaved");
    let sims: Vec<Proc> = (0..WORKERS).map(|_| zero_sim()).collect();
    let mut args: Vec<String> = ["--port", "0", "--admin-port", "0", "--grpc-port", "0"].map(String::from).to_vec();
    if let Some(c) = GRPC_CONFIG.get() {
        args.extend(["--config".to_string(), c.clone()]);
    }
    for s in &sims {
        args.extend(["--worker".to_string(), s.worker_arg()]);
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let p = spawn("sieve-proxy", &refs, START);
    // The direct target: one more sim-worker of the same kind, outside the proxy's pool (its
    // calls do not touch the proxy's view of its workers).
    let d = zero_sim();
    assert!(wait_ready(http, &p.admin_url(), START).await, "proxy not ready");
    assert!(wait_ready(http, &d.admin_url(), START).await, "direct sim-worker not ready");
    let items = catalogue(REQUEST_ITEMS, 12);
    // Each protocol as (name, via the proxy, directly on the sim-worker): the same request.
    let mut protocols: Vec<(&str, Path, Path)> = vec![
        (
            "POST /v1/score (HTTP/1.1)",
            Path::http(format!("{}/v1/score", p.api_url()), &items),
            Path::http(format!("{}/v1/score", d.api_url()), &items),
        ),
        ("gRPC Score, tonic channel", Path::grpc(&grpc_url(&p), &items).await, Path::grpc(&grpc_url(&d), &items).await),
        (
            "gRPC Score, hyper h2 client",
            Path::lean(&grpc_url(&p), &items).await,
            Path::lean(&grpc_url(&d), &items).await,
        ),
    ];
    if let Some(word) = only {
        protocols.retain(|(name, ..)| name.contains(word));
        assert!(!protocols.is_empty(), "--only {word}: no path's name holds it");
        println!("the proxy's pid: {}", p.pid());
    }
    // Every path, proxied and direct, in one list: path 2k is protocol k via the proxy, 2k+1 the
    // same protocol direct.
    let mut paths: Vec<Path> = protocols.iter().flat_map(|(_, via, direct)| [via.clone(), direct.clone()]).collect();
    for _ in 0..100 {
        for p in paths.iter_mut() {
            p.call(REQUEST_ITEMS).await;
        }
    }
    // Latencies in call order, per path.
    let mut lat: Vec<Vec<Duration>> = paths.iter().map(|_| Vec::with_capacity(calls)).collect();
    for i in 0..calls {
        // Rotate which goes first, so none always follows another and machine noise hits every
        // path alike.
        for k in 0..paths.len() {
            let j = (i + k) % paths.len();
            lat[j].push(paths[j].call(REQUEST_ITEMS).await);
        }
    }
    // Percentiles of every path over its calls in `range`, as `q[path] = (p50, p99)`.
    let quantiles = |range: std::ops::Range<usize>| -> Vec<(f64, f64)> {
        lat.iter()
            .map(|l| {
                let mut v = l[range.clone()].to_vec();
                v.sort_unstable();
                (pct(&v, 0.5), pct(&v, 0.99))
            })
            .collect()
    };
    let all = quantiles(0..calls);
    println!("{:<30} {:>9} {:>9} {:>14}", "path (via the proxy)", "p50 ms", "p99 ms", "vs HTTP p50/p99");
    for (k, (name, ..)) in protocols.iter().enumerate() {
        let (v, h) = (all[2 * k], all[0]);
        println!("{name:<30} {:>9.3} {:>9.3} {:>+7.3} {:>+7.3}", v.0, v.1, v.0 - h.0, v.1 - h.1);
    }
    if protocols.len() > 1 {
        rounds_table(&protocols, &quantiles, calls, rounds);
    }
    // The server's side alone: the proxy process's CPU per call, each protocol run on its own.
    // SAFETY: sysconf reads a constant.
    let tick_us = 1e6 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    // The direct sim-worker's too: its gRPC less HTTP is the protocol stack's own cost, which
    // the proxy pays as well; the proxy's beyond that is its own.
    // With each, the process's context switches per call (all its threads).
    let mut cpu_us = Vec::with_capacity(protocols.len());
    let mut direct_cpu_us = Vec::with_capacity(protocols.len());
    for (_, via, direct) in protocols.iter_mut() {
        for (path, pid, out) in [(via, p.pid(), &mut cpu_us), (direct, d.pid(), &mut direct_cpu_us)] {
            let (cpu0, switches0) = (process_cpu(pid), process_switches(pid));
            for _ in 0..calls {
                path.call(REQUEST_ITEMS).await;
            }
            let switches = (process_switches(pid) - switches0) as f64 / calls as f64;
            out.push(((process_cpu(pid) - cpu0) * 1e6 / calls as f64, switches));
        }
    }
    // What the proxy adds: the same call and client, via the proxy less direct on one
    // sim-worker (a difference of percentiles of the same run; the direct call's worker scores
    // all items where the proxy's four score a shard each).
    println!(
        "\nWhat the proxy adds, all {calls} calls (same call, same client, direct on one sim-worker; proxy CPU clock ticks: +-{:.0} us per call)",
        tick_us / calls as f64
    );
    println!(
        "{:<30} {:>15} {:>15} {:>17} {:>15} {:>15} {:>17}",
        "protocol",
        "direct p50/p99",
        "proxy p50/p99",
        "added p50/p99",
        "proxy CPU/call",
        "direct CPU/call",
        "switches proxy/direct"
    );
    for (k, (name, ..)) in protocols.iter().enumerate() {
        let (v, d) = (all[2 * k], all[2 * k + 1]);
        println!(
            "{name:<30} {:>7.3} {:>7.3} {:>7.3} {:>7.3} {:>+8.3} {:>+8.3} {:>12.1} us {:>12.1} us {:>8.1} {:>8.1}",
            d.0,
            d.1,
            v.0,
            v.1,
            v.0 - d.0,
            v.1 - d.1,
            cpu_us[k].0,
            direct_cpu_us[k].0,
            cpu_us[k].1,
            direct_cpu_us[k].1
        );
    }
}

/// Per round, each gRPC protocol less HTTP (protocol 0): end to end (via the proxy) and in what
/// the proxy adds (via less direct), at p50 and p99; then each column's median and range over
/// the rounds, and in how many rounds gRPC was no slower.
fn rounds_table(
    protocols: &[(&str, Path, Path)],
    quantiles: &dyn Fn(std::ops::Range<usize>) -> Vec<(f64, f64)>,
    calls: usize,
    rounds: usize,
) {
    let per = calls / rounds;
    println!(
        "\ngRPC less HTTP per round ({rounds} rounds of {per} calls per path; ms; e2e: via the proxy, added: via less direct)"
    );
    print!("{:<6}", "round");
    for (name, ..) in &protocols[1..] {
        let short = name.rsplit(", ").next().unwrap_or(name);
        print!(" | {short:^39}");
    }
    println!();
    print!("{:<6}", "");
    for _ in &protocols[1..] {
        print!(" | {:>9} {:>9} {:>9} {:>9}", "e2e p50", "e2e p99", "add p50", "add p99");
    }
    println!();
    // diffs[k][r] = (e2e p50, e2e p99, added p50, added p99) of protocol k+1 in round r.
    let mut diffs: Vec<Vec<[f64; 4]>> = vec![Vec::with_capacity(rounds); protocols.len() - 1];
    for r in 0..rounds {
        let q = quantiles(r * per..(r + 1) * per);
        print!("{r:<6}");
        for (k, d) in diffs.iter_mut().enumerate() {
            let (v, dv, h, dh) = (q[2 * (k + 1)], q[2 * (k + 1) + 1], q[0], q[1]);
            let row = [v.0 - h.0, v.1 - h.1, (v.0 - dv.0) - (h.0 - dh.0), (v.1 - dv.1) - (h.1 - dh.1)];
            print!(" | {:>+9.3} {:>+9.3} {:>+9.3} {:>+9.3}", row[0], row[1], row[2], row[3]);
            d.push(row);
        }
        println!();
    }
    for (label, pick) in [("median", 0.5), ("min", 0.0), ("max", 1.0)] {
        print!("{label:<6}");
        for d in &diffs {
            print!(" |");
            for c in 0..4 {
                let mut col: Vec<f64> = d.iter().map(|row| row[c]).collect();
                col.sort_by(f64::total_cmp);
                print!(" {:>+9.3}", col[((col.len() - 1) as f64 * pick).round() as usize]);
            }
        }
        println!();
    }
    print!("{:<6}", "<= 0");
    for d in &diffs {
        print!(" |");
        for c in 0..4 {
            print!(" {:>9}", format!("{}/{}", d.iter().filter(|row| row[c] <= 0.0).count(), d.len()));
        }
    }
    println!("   (rounds where gRPC was no slower than HTTP)");
}
