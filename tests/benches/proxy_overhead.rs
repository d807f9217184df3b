//! The proxy's added latency and throughput, next to nginx, measured in the same run.
//!
//!     cargo build --release -p sieve-proxy -p sieve-loadtest -p sieve-e2e --bins --bench proxy_overhead
//!     cargo bench -p sieve-e2e --bench proxy_overhead [-- --quick] [-- --throughput-only] [-- --size 1000]
//!
//! Four `sieve-loadtest sim-worker` processes serve the worker API on loopback. The same
//! requests go (a) straight to one worker, (b) through nginx (`least_conn` upstream over the
//! four, whole request forwarded, keep-alive), (c) through `sieve-proxy` forwarding the whole
//! request (split = none, least-loaded), and (d) through `sieve-proxy` fanning each request out
//! to four shards and merging. Nginx and the proxy each run as a separate process started and
//! stopped here, with a temporary config.
//!
//! Parts 1 and 2 run twice, with 100-item and with 1,000-item requests. Part 1 (overhead):
//! workers with zero compute, one request at a time; added latency is the path's percentile
//! minus the direct path's. Part 2 (throughput): zero compute, closed loop with 32 concurrent
//! clients. Every router row of both parts gives the CPU time the router process (nginx master
//! and workers, or the proxy) spent per request over that row's run, from /proc (utime + stime,
//! the warm-up included). Part 3: workers with the default cost model (a ~100-item call is
//! ~20 ms of compute), one request at a time: the whole request on one worker (nginx) against
//! the proxy's cost-balanced split over four.
//!
//! Every proxy row is run for this tree's proxy as configured by default;
//! `SIEVE_BENCH_BASELINE_PROXY=PATH` adds the rows of another `sieve-proxy` build (say, the branch point's) to the same run, and
//! `SIEVE_BENCH_BASELINE_PROXY=base=PATH,step1=PATH2` the rows of several, labelled. The
//! proxies' pair-score cache is off (every request is the same one).
//!
//! `SIEVE_BENCH_PERF=DIR` records a call-graph profile (`perf record -g`) of every router
//! process over its throughput rows, one file per row in DIR.
//!
//! Part 1 also has a row with no router at all: the bench itself sends the four quarters of each
//! request to the four workers at once and waits for the last answer (what a fan-out costs on
//! this machine with no proxy logic). `--latency-requests N` sets part 1's requests per path
//! (300 with `--quick`, 2,000 without); `--latency-only` runs part 1 alone, 100-item requests;
//! `--interleave` sends part 1's requests to the paths in turn (request i to every path before
//! request i + 1), so that every row meets the same load from the rest of the machine; `--tail`
//! prints, under each part-1 row, where its slowest requests' time went
//! (`tail_probe.rs`: run-queue delay per process, CPU pressure, new router connections);
//! `--health-ms N` sets the proxies' health-check interval (200 ms by default). With
//! `--interleave` a router's CPU per request spans the whole interleaved run (every path's time).
//!
//! Everything runs on one machine, the load generator included, so the figures are relative:
//! compare rows of the same run. Hedging is off in the proxy (nginx does not hedge).

use std::future::Future;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use sieve_e2e::{bin, catalogue, score_body, spawn, wait_ready, Http, Proc};

mod tail_probe;
use tail_probe::{Probe, Sample};

const WORKERS: usize = 4;
/// Items per request: parts 1 and 2 run for each size; part 3 with the first.
const SIZES: [usize; 2] = [100, 1000];
/// Requests `measure` sends before measuring (connections, pools, the proxy's estimators).
const WARM_UP: usize = 50;
const QUERY: &str = "waterproof trail running shoes for women";

struct Args {
    latency_requests: usize,
    throughput_secs: f64,
    clients: usize,
    /// `--throughput-only`: part 2 alone, 100-item requests (for profiling with
    /// `SIEVE_BENCH_PERF`).
    throughput_only: bool,
    /// `--latency-only`: part 1 alone, 100-item requests.
    latency_only: bool,
    /// `--tail`: the slowest requests of every part-1 row taken apart (`tail_probe.rs`).
    tail: bool,
    /// `--interleave`: part 1's paths in turn, request by request, rather than one after another.
    interleave: bool,
    /// `--health-ms N`: the proxies' `[health] interval_ms` (200 by default: every proxy the
    /// bench starts checks its four workers five times a second, measured or not).
    health_ms: u64,
    /// `--size N`: parts 1 and 2 with requests of N items (one of `SIZES`) alone.
    size: Option<usize>,
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    let flag = |name: &str| argv.iter().any(|a| a == name);
    let quick = flag("--quick");
    let size = argv.iter().position(|a| a == "--size").and_then(|i| argv.get(i + 1)?.parse().ok());
    let mut args = Args {
        latency_requests: if quick { 300 } else { 2000 },
        throughput_secs: if quick { 1.0 } else { 4.0 },
        clients: 32,
        throughput_only: flag("--throughput-only"),
        latency_only: flag("--latency-only"),
        tail: flag("--tail"),
        interleave: flag("--interleave"),
        health_ms: 200,
        size,
    };
    let number = |name: &str| -> Option<u64> {
        let i = argv.iter().position(|a| a == name)?;
        match argv.get(i + 1).and_then(|n| n.parse::<u64>().ok()).filter(|&n| n > 0) {
            Some(n) => Some(n),
            None => {
                eprintln!("{name} takes a number above 0");
                std::process::exit(2);
            }
        }
    };
    if let Some(n) = number("--latency-requests") {
        args.latency_requests = n as usize;
    }
    if let Some(n) = number("--health-ms") {
        args.health_ms = n;
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(run(args));
}

/// The figures of one path.
struct Figures {
    p50_ms: f64,
    p99_ms: f64,
    rps: f64,
    /// Requests answered, the warm-up excluded.
    count: usize,
    errors: usize,
}

fn percentile(sorted_us: &[u64], q: f64) -> f64 {
    if sorted_us.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted_us.len() as f64 - 1.0) * q).round() as usize;
    sorted_us[i] as f64 / 1e3
}

/// Closed loop: `clients` tasks each sending the next request when the last one answered.
async fn measure(
    http: &Http,
    url: &str,
    body: &serde_json::Value,
    clients: usize,
    count: Option<usize>,
    secs: f64,
) -> Figures {
    let body = Arc::new(serde_json::to_vec(body).expect("json"));
    // Warm-up: connections, pools, the proxy's estimators.
    for _ in 0..WARM_UP {
        let _ = http.send(hyper::Method::POST, url, body.as_ref().clone()).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let per_client = count.map(|c| c.div_ceil(clients));
    let start = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (http, url, body, stop) = (http.clone(), url.to_string(), body.clone(), stop.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut errors = 0;
                while !stop.load(Ordering::Relaxed) && per_client.is_none_or(|n| lat.len() + errors < n) {
                    let t = Instant::now();
                    match http.send(hyper::Method::POST, &url, body.as_ref().clone()).await {
                        Ok(r) if r.status == 200 => lat.push(t.elapsed().as_micros() as u64),
                        _ => errors += 1,
                    }
                }
                (lat, errors)
            })
        })
        .collect();
    if count.is_none() {
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        stop.store(true, Ordering::Relaxed);
    }
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await.expect("client task");
        all.extend(l);
        errors += e;
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.sort_unstable();
    Figures {
        p50_ms: percentile(&all, 0.5),
        p99_ms: percentile(&all, 0.99),
        rps: all.len() as f64 / elapsed,
        count: all.len() + errors,
        errors,
    }
}

/// Where part 1 sends a request: one URL with the whole body, or (the bench's own fan-out) each
/// worker with its quarter, all at once.
#[derive(Clone)]
enum Target {
    One { url: String, body: Arc<Vec<u8>> },
    FanOut(Vec<(String, Arc<Vec<u8>>)>),
}

/// Part 1: one request at a time, `count` per target after the warm-up (as `measure` with one
/// client), the targets in turn (with several: request i to every target before request i + 1,
/// so that every row meets the same load from the rest of the machine); with a probe, each
/// answered request's figures too. One result per target.
async fn one_at_a_time(
    http: &Http,
    targets: &[Target],
    count: usize,
    probes: &[Option<Probe>],
) -> Vec<(Figures, Vec<Sample>)> {
    let (http, targets, probes) = (http.clone(), targets.to_vec(), probes.to_vec());
    tokio::spawn(async move {
        for target in &targets {
            for _ in 0..WARM_UP {
                let _ = send(&http, target, false).await;
            }
        }
        let n = targets.len();
        let mut lat: Vec<Vec<u64>> = vec![Vec::with_capacity(count); n];
        let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); n];
        let mut errors = vec![0; n];
        let start = Instant::now();
        for _ in 0..count {
            for (k, target) in targets.iter().enumerate() {
                let probe = probes.get(k).and_then(Option::as_ref);
                let before = probe.map(Probe::snapshot);
                let t = Instant::now();
                let answer = send(&http, target, probe.is_some()).await;
                let us = t.elapsed().as_micros() as u64;
                match answer {
                    Some(served_ms) => {
                        lat[k].push(us);
                        if let (Some(p), Some(b)) = (probe, &before) {
                            let at_s = (t - start).as_secs_f64();
                            samples[k].push(p.sample(b, &p.snapshot(), at_s, us, served_ms));
                        }
                    }
                    None => errors[k] += 1,
                }
            }
        }
        let elapsed = start.elapsed().as_secs_f64();
        lat.into_iter()
            .zip(errors)
            .zip(samples)
            .map(|((mut lat, errors), samples)| {
                lat.sort_unstable();
                let f = Figures {
                    p50_ms: percentile(&lat, 0.5),
                    p99_ms: percentile(&lat, 0.99),
                    rps: lat.len() as f64 / elapsed,
                    count: lat.len() + errors,
                    errors,
                };
                (f, samples)
            })
            .collect()
    })
    .await
    .expect("client task")
}

/// One request of part 1: `Some` when answered 200, with (if `served`) the time the answering
/// server says it spent, ms (its `timing.total_ms`; the fan-out: the slowest worker's).
async fn send(http: &Http, target: &Target, served: bool) -> Option<f64> {
    let served_ms = |body: &[u8]| {
        let v: Option<serde_json::Value> = served.then(|| serde_json::from_slice(body).ok()).flatten();
        v.and_then(|v| v["timing"]["total_ms"].as_f64()).unwrap_or(f64::NAN)
    };
    match target {
        Target::One { url, body } => {
            let r =
                http.send(hyper::Method::POST, url, body.as_ref().clone()).await.ok().filter(|r| r.status == 200)?;
            Some(served_ms(&r.body))
        }
        Target::FanOut(shards) => {
            type Call<'a> = Pin<Box<dyn Future<Output = Result<sieve_e2e::Reply, String>> + Send + 'a>>;
            let calls: Vec<Call<'_>> = shards
                .iter()
                .map(|(url, body)| Box::pin(http.send(hyper::Method::POST, url, body.as_ref().clone())) as Call<'_>)
                .collect();
            let mut slowest = if served { 0.0 } else { f64::NAN };
            for r in join_all(calls).await {
                let r = r.ok().filter(|r| r.status == 200)?;
                slowest = f64::max(slowest, served_ms(&r.body));
            }
            Some(slowest)
        }
    }
}

/// Polls every future in the one task until all are done (the fan-out's calls, sent at once).
async fn join_all<F: Future + Unpin>(mut futs: Vec<F>) -> Vec<F::Output> {
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futs.iter_mut().zip(out.iter_mut()).filter(|(_, o)| o.is_none()) {
            match Pin::new(f).poll(cx) {
                Poll::Ready(v) => *o = Some(v),
                Poll::Pending => pending = true,
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(|o| o.expect("every call finished")).collect()
}

/// CPU time (user + system) used so far by `pid` and its direct children, in seconds (Linux).
/// CPU time, user and system apart (seconds, or µs per request once divided).
#[derive(Clone, Copy)]
struct Cpu {
    user: f64,
    sys: f64,
}

impl Cpu {
    /// What was spent from `before` to `self`, per request served, in µs.
    fn per_request_since(self, before: Cpu, served: usize) -> Cpu {
        let per = |a: f64, b: f64| (a - b) * 1e6 / served as f64;
        Cpu { user: per(self.user, before.user), sys: per(self.sys, before.sys) }
    }
}

/// A process's parent and CPU time, from `/proc/PID/stat`.
fn proc_stat(pid: u32) -> Option<(u32, Cpu)> {
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name: state ppid ... utime(14) stime(15).
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ppid = f.get(1)?.parse().ok()?;
    let user = f.get(11)?.parse::<f64>().ok()? / ticks;
    let sys = f.get(12)?.parse::<f64>().ok()? / ticks;
    Some((ppid, Cpu { user, sys }))
}

/// The processes whose parent is `pid`, with their CPU time.
fn children(pid: u32) -> Vec<(u32, Cpu)> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|n| proc_stat(n).filter(|(ppid, _)| *ppid == pid).map(|(_, cpu)| (n, cpu)))
        .collect()
}

/// The CPU time of `pid` and its children (nginx's workers), from /proc.
fn cpu_seconds(pid: u32) -> Option<Cpu> {
    let mut total = proc_stat(pid)?.1;
    for (_, cpu) in children(pid) {
        total.user += cpu.user;
        total.sys += cpu.sys;
    }
    Some(total)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// nginx with a temporary prefix and config; stopped (SIGQUIT, then SIGKILL) when dropped.
struct Nginx {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Nginx {
    fn start(upstreams: &[String]) -> Option<Nginx> {
        let exe = ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"]
            .into_iter()
            .find(|p| Path::new(p).exists())?;
        let dir = std::env::temp_dir().join(format!("sieve-bench-nginx-{}", std::process::id()));
        for sub in ["", "body", "proxy", "fastcgi", "uwsgi", "scgi", "logs"] {
            std::fs::create_dir_all(dir.join(sub)).ok()?;
        }
        // Workers may run as an unprivileged user: let them write the temp dirs.
        let _ = Command::new("chmod").args(["-R", "0777"]).arg(&dir).status();
        let port = free_port();
        let servers: String = upstreams.iter().map(|u| format!("    server {u};\n")).collect();
        let d = dir.display();
        let conf = format!(
            "worker_processes 2;\ndaemon off;\nmaster_process on;\npid {d}/nginx.pid;\nerror_log {d}/logs/error.log warn;\n\
             events {{ worker_connections 4096; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
             \x20 client_max_body_size 64m;\n  client_body_buffer_size 1m;\n  proxy_buffer_size 64k;\n  proxy_buffers 32 64k;\n  keepalive_requests 100000;\n\
             \x20 upstream sims {{\n    least_conn;\n{servers}    keepalive 128;\n  }}\n\
             \x20 server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      proxy_pass http://sims;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n    }}\n  }}\n}}\n"
        );
        std::fs::write(dir.join("nginx.conf"), conf).ok()?;
        let child = Command::new(exe)
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .ok()?;
        let end = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(Nginx { child, port, dir })
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGQUIT);
        }
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A `sieve-proxy` build the bench runs: this tree's, or another's given by path.
#[derive(Clone)]
struct ProxyBuild {
    /// How its rows are named ("" for this tree's default config).
    label: String,
    exe: PathBuf,
}

/// The builds `SIEVE_BENCH_BASELINE_PROXY` names: comma-separated, each `PATH` (rows labelled
/// "baseline") or `LABEL=PATH` (several builds compared in one run).
fn baselines(list: &str) -> Vec<ProxyBuild> {
    list.split(',')
        .filter(|e| !e.trim().is_empty())
        .map(|entry| {
            let (label, exe) = entry.split_once('=').unwrap_or(("baseline", entry));
            ProxyBuild { label: label.trim().into(), exe: exe.trim().into() }
        })
        .collect()
}

fn start_proxy(build: &ProxyBuild, workers: &[Proc], config: &str, name: &str) -> (Proc, PathBuf) {
    let path = std::env::temp_dir().join(format!("sieve-bench-{}-{name}.toml", std::process::id()));
    std::fs::write(&path, config).expect("proxy config");
    let mut args = vec![
        "--port".to_string(),
        "0".into(),
        "--admin-port".into(),
        "0".into(),
        "--config".into(),
        path.display().to_string(),
    ];
    for w in workers {
        args.push("--worker".into());
        args.push(w.worker_arg());
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let proc = Proc::start(&build.exe, &refs, Duration::from_secs(20)).unwrap_or_else(|e| panic!("{e}"));
    (proc, path)
}

/// Total µs per request, then user + system.
fn cpu_cell(cpu_us: Option<Cpu>) -> String {
    cpu_us.map_or("       —".to_string(), |c| format!("{:>8.0} ({:.0} + {:.0})", c.user + c.sys, c.user, c.sys))
}

fn row(name: &str, f: &Figures, base: Option<&Figures>, cpu_us: Option<Cpu>) {
    let added = |v: f64, b: f64| format!("{:+8.3}", v - b);
    let (a50, a99) = match base {
        Some(b) => (added(f.p50_ms, b.p50_ms), added(f.p99_ms, b.p99_ms)),
        None => ("       —".into(), "       —".into()),
    };
    let err = if f.errors > 0 { format!("  ({} errors)", f.errors) } else { String::new() };
    println!("  {name:<34} {:>8.3} {:>8.3}   {a50}  {a99}  {}{err}", f.p50_ms, f.p99_ms, cpu_cell(cpu_us));
}

/// With `SIEVE_BENCH_PERF=DIR`, a call-graph profile of a router process over one throughput
/// row (`perf record -g -p PID`, DIR/<row>-<size>.data), stopped when dropped; nothing without.
struct Perf(Child);

impl Perf {
    fn start(pid: u32, row: &str, size: usize) -> Option<Perf> {
        let dir = PathBuf::from(std::env::var_os("SIEVE_BENCH_PERF")?);
        let _ = std::fs::create_dir_all(&dir);
        let slug: String =
            row.trim().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect::<String>();
        let out = dir.join(format!("{slug}-{size}.data"));
        // nginx serves from its master's children: profile those too.
        let pids: Vec<String> =
            std::iter::once(pid).chain(children(pid).into_iter().map(|(p, _)| p)).map(|p| p.to_string()).collect();
        let child = Command::new("perf")
            .args(["record", "-g", "-F", "999", "-p", &pids.join(","), "-o"])
            .arg(&out)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        // perf needs a moment to attach before the row's requests start.
        std::thread::sleep(Duration::from_millis(300));
        Some(Perf(child))
    }
}

impl Drop for Perf {
    fn drop(&mut self) {
        // SAFETY: signalling our own child; SIGINT makes perf write its file and exit.
        unsafe {
            libc::kill(self.0.id() as libc::pid_t, libc::SIGINT);
        }
        let _ = self.0.wait();
    }
}

/// `measure`, with the CPU time the router process spent per request over the run (µs).
async fn measure_with_cpu(
    http: &Http,
    url: &str,
    body: &serde_json::Value,
    clients: usize,
    count: Option<usize>,
    secs: f64,
    router: Option<u32>,
) -> (Figures, Option<Cpu>) {
    let before = router.and_then(cpu_seconds);
    let f = measure(http, url, body, clients, count, secs).await;
    let after = router.and_then(cpu_seconds);
    let cpu_us = before.zip(after).map(|(b, a)| a.per_request_since(b, f.count + WARM_UP));
    (f, cpu_us)
}

fn trow(name: &str, f: &Figures, cpu_us: Option<Cpu>) {
    let err = if f.errors > 0 { format!("  ({} errors)", f.errors) } else { String::new() };
    println!("  {name:<34} {:>9.0} {:>8.3} {:>8.3}  {}{err}", f.rps, f.p50_ms, f.p99_ms, cpu_cell(cpu_us));
}

async fn run(args: Args) {
    let http = Http::new();
    let items = catalogue(SIZES[0], 42);

    let zero_cost = std::env::temp_dir().join(format!("sieve-bench-{}-zero.toml", std::process::id()));
    std::fs::write(&zero_cost, "request_ms = 0.0\ntoken_ms = 0.0\ntoken_context_ms = 0.0\n").expect("cost file");
    let zero = zero_cost.display().to_string();
    let sims_zero: Vec<Proc> = (0..WORKERS)
        .map(|_| {
            spawn(
                "sieve-loadtest",
                &["sim-worker", "--port", "0", "--admin-port", "0", "--slots", "64", "--cost-model", &zero],
                Duration::from_secs(20),
            )
        })
        .collect();
    let sims_cost: Vec<Proc> = (0..WORKERS)
        .map(|_| spawn("sieve-loadtest", &["sim-worker", "--port", "0", "--admin-port", "0"], Duration::from_secs(20)))
        .collect();

    // The pair-score cache off: every request is the same, and the bench measures forwarding.
    let base_cfg = format!(
        "[hedge]\nenabled = false\n[health]\ninterval_ms = {}\n[deadline]\ndefault_ms = 10000\n[cache]\nenabled = false\n",
        args.health_ms
    );
    let whole_cfg = format!("{base_cfg}[split]\nmode = \"none\"\n");
    let cost_cfg = base_cfg.clone();

    // The proxy as configured by default and, with SIEVE_BENCH_BASELINE_PROXY=PATH, another
    // build of the proxy (say, the branch point's) for a before/after in one run.
    let mut builds = vec![ProxyBuild { label: String::new(), exe: bin("sieve-proxy") }];
    if let Ok(list) = std::env::var("SIEVE_BENCH_BASELINE_PROXY") {
        builds.extend(baselines(&list));
    }
    // Per build: the whole-request proxy, then four shards of every request size (one proxy per
    // size, fixed chunks of a quarter).
    let mut configs = Vec::new();
    let proxies: Vec<(Proc, Vec<Proc>)> = builds
        .iter()
        .enumerate()
        .map(|(b, build)| {
            let (whole, p) = start_proxy(build, &sims_zero, &whole_cfg, &format!("whole{b}"));
            configs.push(p);
            let four = SIZES
                .iter()
                .map(|n| {
                    let cfg = format!("{base_cfg}[split]\nmode = \"fixed\"\nfixed_items = {}\n", n / WORKERS);
                    let (proc, p) = start_proxy(build, &sims_zero, &cfg, &format!("four{n}-{b}"));
                    configs.push(p);
                    proc
                })
                .collect();
            (whole, four)
        })
        .collect();
    let (proxy_cost, p3) = start_proxy(&builds[0], &sims_cost, &cost_cfg, "cost");
    configs.push(p3);
    for p in proxies.iter().flat_map(|(w, f)| std::iter::once(w).chain(f)).chain([&proxy_cost]) {
        assert!(wait_ready(&http, &p.admin_url(), Duration::from_secs(20)).await, "proxy not ready");
    }
    // Every worker must be eligible before measuring.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let nginx_zero = Nginx::start(&sims_zero.iter().map(|s| s.api.to_string()).collect::<Vec<_>>());
    let nginx_cost = Nginx::start(&sims_cost.iter().map(|s| s.api.to_string()).collect::<Vec<_>>());
    if nginx_zero.is_none() {
        println!("nginx not found or failed to start (Debian: apt-get install nginx); its rows are skipped");
    }

    println!("Sieve proxy overhead: {WORKERS} sim workers, loopback.");
    println!("One machine runs the load generator, nginx, the proxy and the workers: compare rows, not runs.");

    let sizes = match args.size {
        Some(n) => vec![n],
        None if args.throughput_only || args.latency_only => vec![SIZES[0]],
        None => SIZES.to_vec(),
    };
    for (k, size) in SIZES.iter().enumerate().filter(|(_, s)| sizes.contains(s)) {
        let body = score_body(QUERY, &catalogue(*size, 42), Some(10_000));
        let bytes = serde_json::to_vec(&body).map(|b| b.len()).unwrap_or(0);
        // (name, url, the router process whose CPU time is counted)
        let paths_zero: Vec<(String, String, Option<u32>)> = {
            let mut v =
                vec![("direct to one worker".to_string(), format!("{}/v1/score", sims_zero[0].api_url()), None)];
            if let Some(n) = &nginx_zero {
                v.push((
                    "nginx least_conn (whole request)".to_string(),
                    format!("http://127.0.0.1:{}/v1/score", n.port),
                    Some(n.child.id()),
                ));
            }
            for (build, (whole, four)) in builds.iter().zip(&proxies) {
                let name = |what: &str| match build.label.as_str() {
                    "" => format!("sieve-proxy ({what})"),
                    l => format!("  {l} ({what})"),
                };
                v.push((name("whole request"), format!("{}/v1/score", whole.api_url()), Some(whole.pid())));
                v.push((name("4 shards, merged"), format!("{}/v1/score", four[k].api_url()), Some(four[k].pid())));
            }
            v
        };

        println!("\n== {size}-item requests ({:.1} KB) ==", bytes as f64 / 1024.0);
        println!(
            "1. Added latency, zero-compute workers, one request at a time ({} requests per path), ms:",
            args.latency_requests
        );
        println!(
            "  {:<34} {:>8} {:>8}   {:>8}  {:>8}  {:>8}",
            "path", "p50", "p99", "+p50", "+p99", "router CPU µs/req"
        );
        let body_bytes = Arc::new(serde_json::to_vec(&body).expect("json"));
        let mut latency_paths: Vec<(String, Target, Option<u32>)> = paths_zero
            .iter()
            .map(|(name, url, router)| {
                (name.clone(), Target::One { url: url.clone(), body: body_bytes.clone() }, *router)
            })
            .collect();
        // The bench's own fan-out, right after the direct row: a quarter of the items to each worker.
        let items_k = catalogue(*size, 42);
        let shards = sims_zero
            .iter()
            .zip(items_k.chunks(size.div_ceil(WORKERS)))
            .map(|(w, part)| {
                let b = serde_json::to_vec(&score_body(QUERY, part, Some(10_000))).expect("json");
                (format!("{}/v1/score", w.api_url()), Arc::new(b))
            })
            .collect();
        latency_paths.insert(1, ("bench's own 4-way fan-out".to_string(), Target::FanOut(shards), None));
        let worker_pids: Vec<u32> = sims_zero.iter().map(Proc::pid).collect();
        // Each path on its own (its requests back to back), or with `--interleave` all in turn.
        let groups: Vec<Vec<usize>> = if args.throughput_only {
            Vec::new()
        } else if args.interleave {
            vec![(0..latency_paths.len()).collect()]
        } else {
            (0..latency_paths.len()).map(|i| vec![i]).collect()
        };
        let mut base = None;
        for group in groups {
            let targets: Vec<Target> = group.iter().map(|&i| latency_paths[i].1.clone()).collect();
            let routers: Vec<Option<u32>> = group.iter().map(|&i| latency_paths[i].2).collect();
            let probes: Vec<Option<Probe>> =
                routers.iter().map(|r| args.tail.then(|| Probe::new(*r, &worker_pids))).collect();
            let before: Vec<Option<Cpu>> = routers.iter().map(|r| r.and_then(cpu_seconds)).collect();
            let results = one_at_a_time(&http, &targets, args.latency_requests, &probes).await;
            for (j, (f, samples)) in results.into_iter().enumerate() {
                let after = routers[j].and_then(cpu_seconds);
                let cpu = before[j].zip(after).map(|(b, a)| a.per_request_since(b, f.count + WARM_UP));
                row(&latency_paths[group[j]].0, &f, base.as_ref(), cpu);
                if let Some(p) = &probes[j] {
                    p.report(&samples);
                }
                if base.is_none() {
                    base = Some(f);
                }
            }
        }
        if args.latency_only {
            continue;
        }

        println!(
            "2. Throughput, zero-compute workers, {} concurrent clients, {:.0} s per path:",
            args.clients, args.throughput_secs
        );
        println!(
            "  {:<34} {:>9} {:>8} {:>8}  {:>8}",
            "path", "req/s", "p50 ms", "p99 ms", "router CPU µs/req (user + sys)"
        );
        for (name, url, router) in &paths_zero {
            let perf = router.and_then(|pid| Perf::start(pid, name, *size));
            let (f, cpu) = measure_with_cpu(&http, url, &body, args.clients, None, args.throughput_secs, *router).await;
            drop(perf);
            trow(name, &f, cpu);
        }
    }

    'part3: {
        if args.throughput_only || args.latency_only {
            break 'part3;
        }
        let body = score_body(QUERY, &items, Some(10_000));
        println!(
        "\n3. Workers with the default cost model (this request: ~{:.0} ms of compute on one worker), one at a time, ms:",
        sieve_shared::CostModel::default().call_ms(
            f64::from(sieve_loadtest::sim::tokens::prefix_tokens(QUERY, None)),
            items.iter().map(|t| f64::from(sieve_loadtest::sim::tokens::item_tokens(t)))
        )
    );
        println!("  {:<34} {:>8} {:>8}  {:>8}", "path", "p50", "p99", "router CPU µs/req (user + sys)");
        let n = (args.latency_requests / 4).max(100);
        let mut paths_cost: Vec<(&str, String, u32)> = Vec::new();
        if let Some(ng) = &nginx_cost {
            paths_cost.push((
                "nginx least_conn (whole request)",
                format!("http://127.0.0.1:{}/v1/score", ng.port),
                ng.child.id(),
            ));
        }
        paths_cost.push((
            "sieve-proxy (cost-balanced split)",
            format!("{}/v1/score", proxy_cost.api_url()),
            proxy_cost.pid(),
        ));
        for (name, url, router) in &paths_cost {
            let (f, cpu) = measure_with_cpu(&http, url, &body, 1, Some(n), 0.0, Some(*router)).await;
            let err = if f.errors > 0 { format!("  ({} errors)", f.errors) } else { String::new() };
            println!("  {name:<34} {:>8.3} {:>8.3}  {}{err}", f.p50_ms, f.p99_ms, cpu_cell(cpu));
        }
    }

    drop(nginx_zero);
    drop(nginx_cost);
    for p in configs.into_iter().chain([zero_cost]) {
        let _ = std::fs::remove_file(p);
    }
}
