//! What the proxy spends per request besides CPU time: heap allocations (count and bytes),
//! context switches, and (with `--strace`) system calls, counted on the proxy's own threads.
//!
//!     cargo bench -p sieve-e2e --bench proxy_costs [-- --requests N --clients C --items N --strace]
//!     cargo bench -p sieve-e2e --bench proxy_costs -- --url URL --pid PID   (another router)
//!
//! Four zero-compute simulated workers and the load generator run on one runtime whose threads
//! are not counted; the proxy runs in-process on a runtime of its own (as `sieve-proxy` does:
//! one multi-thread runtime, a thread per core), whose threads are. A counting global allocator
//! counts every allocation (and reallocation: a buffer grown is a copy) made on a counted
//! thread; context switches are the difference of the proxy threads' `voluntary_ctxt_switches`
//! and `nonvoluntary_ctxt_switches` (`/proc/self/task/TID/status`) over the measured requests;
//! `--strace` attaches `strace -c` to those threads over the same requests and prints its table.
//! The last column is each counted thread's share of their CPU time over the requests: how
//! evenly the runtime spread the work. Rows: the proxy forwarding whole requests (split = none)
//! and splitting each in four (fixed chunks).
//!
//! `--sites N` samples every Nth allocation's stack and prints the most frequent call sites
//! under each row (slow: for finding them, not for the counts).
//!
//! `--url URL --pid PID`: the same requests to a router running elsewhere (nginx, a proxy
//! process) against this bench's workers, printed first (`--pid` is the router's process, or
//! `@FILE` its pid file; its threads and its children's are counted for context switches and
//! traced with `--strace`); the
//! allocation column is then empty. The workers' addresses are printed so the router can be
//! pointed at them; the bench waits for `--url` to answer.
//!
//! Counts, not times: they do not depend on the machine's load, so one run is enough.

use std::alloc::{GlobalAlloc, Layout, System};
use std::backtrace::Backtrace;
use std::cell::Cell;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sieve_e2e::{catalogue, score_body, sims, test_config, Http};
use sieve_loadtest::sim::SimConfig;
use sieve_shared::proxy_config::SplitMode;
use sieve_shared::CostModel;

/// Counts allocations made on threads not marked [`NOT_COUNTED`].
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Set on the load generator's and the workers' threads (and the main thread), and while a
    /// sampled allocation's stack is taken.
    static NOT_COUNTED: Cell<bool> = const { Cell::new(false) };
}

/// `--sites N`: every Nth counted allocation's stack is kept (while measuring), to print
/// where the allocations come from.
static SAMPLE_EVERY: AtomicU64 = AtomicU64::new(0);
static SAMPLES: Mutex<Vec<Backtrace>> = Mutex::new(Vec::new());

fn count(size: usize) {
    // `try_with`: a thread being torn down has no locals; its frees and allocations are not
    // the proxy's requests.
    if NOT_COUNTED.try_with(|n| !n.get()).unwrap_or(false) {
        let n = ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(size as u64, Ordering::Relaxed);
        let every = SAMPLE_EVERY.load(Ordering::Relaxed);
        if every > 0 && n.is_multiple_of(every) {
            NOT_COUNTED.with(|c| c.set(true));
            let bt = Backtrace::force_capture();
            if let Ok(mut s) = SAMPLES.lock() {
                s.push(bt);
            }
            NOT_COUNTED.with(|c| c.set(false));
        }
    }
}

/// The sampled stacks by their first frames of interest (the allocator's, std's and this
/// bench's frames skipped), most frequent first.
fn print_sites() {
    let samples = std::mem::take(&mut *SAMPLES.lock().expect("samples"));
    if samples.is_empty() {
        return;
    }
    let mut sites: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for bt in &samples {
        // Frames as (function, file:line); the standard library's and this bench's skipped.
        let text = bt.to_string();
        let mut frames: Vec<(String, String)> = Vec::new();
        for line in text.lines().map(str::trim) {
            if let Some(at) = line.strip_prefix("at ") {
                if let Some(last) = frames.last_mut() {
                    last.1 = at.to_string();
                }
            } else if let Some((_, f)) = line.split_once(": ") {
                frames.push((f.to_string(), String::new()));
            }
        }
        let ours = |at: &str| !at.is_empty() && !at.starts_with("/rustc/") && !at.contains("proxy_costs.rs");
        let short = |at: &str| {
            let at = at.rsplit_once(":").map_or(at, |(a, _)| a);
            let parts: Vec<&str> = at.rsplit('/').take(3).collect();
            parts.into_iter().rev().collect::<Vec<_>>().join("/")
        };
        let frames: Vec<String> =
            frames.iter().filter(|(_, at)| ours(at)).take(3).map(|(f, at)| format!("{f} ({})", short(at))).collect();
        *sites.entry(frames.join("  <-  ")).or_default() += 1;
    }
    let mut sites: Vec<_> = sites.into_iter().collect();
    sites.sort_by_key(|s| std::cmp::Reverse(s.1));
    println!("    allocation sites ({} samples):", samples.len());
    for (site, n) in sites.iter().take(40) {
        println!("    {:>5.1}%  {site}", 100.0 * *n as f64 / samples.len() as f64);
    }
}

// SAFETY: every call is forwarded to the system allocator unchanged; the counters are atomics
// and the thread-local is a const-initialised `Cell` (no allocation, no lazy initialisation).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The name of the proxy's runtime threads here (`comm` is cut at 15 bytes).
const PROXY_RUNTIME: &str = "proxy-rt";

struct Args {
    requests: usize,
    clients: usize,
    items: usize,
    strace: bool,
    /// `--sites N`: sample every Nth allocation's stack.
    sites: u64,
    url: Option<String>,
    /// `--pid PID`, or `--pid @FILE`: the pid read from FILE once `--url` answers (nginx's
    /// pid file).
    pid: Option<String>,
}

fn args() -> Args {
    let argv: Vec<String> = std::env::args().collect();
    let value = |flag: &str| argv.iter().position(|a| a == flag).and_then(|i| argv.get(i + 1)).cloned();
    let num = |flag: &str, default: usize| value(flag).and_then(|v| v.parse().ok()).unwrap_or(default);
    Args {
        requests: num("--requests", 4000),
        clients: num("--clients", 32),
        items: num("--items", 100),
        strace: argv.iter().any(|a| a == "--strace"),
        sites: value("--sites").and_then(|v| v.parse().ok()).unwrap_or(0),
        url: value("--url"),
        pid: value("--pid"),
    }
}

fn main() {
    NOT_COUNTED.with(|n| n.set(true));
    let args = args();
    let load = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("load")
        .on_thread_start(|| NOT_COUNTED.with(|n| n.set(true)))
        .enable_all()
        .build()
        .expect("runtime");
    let zero = SimConfig {
        cost: CostModel { request_ms: 0.0, token_ms: 0.0, token_context_ms: 0.0 },
        slots: 64,
        ..SimConfig::default()
    };
    let workers = load.block_on(sims(4, zero));
    let http = Http::new();
    let body = Arc::new(
        serde_json::to_vec(&score_body(
            "waterproof trail running shoes for women",
            &catalogue(args.items, 42),
            Some(10_000),
        ))
        .expect("json"),
    );
    println!(
        "Per request, {} items, {} requests, {} clients (the warm-up of 200 excluded):",
        args.items, args.requests, args.clients
    );
    println!("  {:<34} {:>8} {:>10} {:>8} {:>8}  CPU by thread", "path", "allocs", "bytes", "vol cs", "invol cs");

    if let Some(url) = &args.url {
        for w in &workers {
            println!("  worker: {}", w.api_url());
        }
        let pid = args.pid.as_deref().expect("--url needs --pid");
        load.block_on(async {
            while http.send(hyper::Method::POST, url, body.as_ref().clone()).await.map(|r| r.status) != Ok(200) {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        let pid: u32 = match pid.strip_prefix('@') {
            Some(file) => std::fs::read_to_string(file).expect("pid file").trim().parse().expect("a pid"),
            None => pid.parse().expect("--pid PID"),
        };
        // The process and its children (nginx's worker processes), every thread of each.
        let tids = move || {
            let mut all = tasks_of(pid, |_| true);
            for child in children_of(pid) {
                all.extend(tasks_of(child, |_| true));
            }
            all
        };
        let r = load.block_on(measure(&http, url, &body, &args, tids, false));
        print_row(&format!("router pid {pid}"), &r, args.requests);
    }

    for (what, split) in [("whole request", None), ("4 shards", Some(args.items.div_ceil(4)))] {
        let mut cfg = test_config(workers.iter().map(|w| w.endpoint()).collect());
        cfg.health.interval_ms = 500;
        cfg.discovery.reload_interval_ms = 60_000;
        cfg.hedge.enabled = false;
        cfg.deadline.default_ms = 10_000;
        match split {
            None => cfg.split.mode = SplitMode::None,
            Some(n) => {
                cfg.split.mode = SplitMode::Fixed;
                cfg.split.fixed_items = n;
            }
        }
        // The proxy's own runtime, as `sieve-proxy` builds it (a thread per core).
        let rt = tokio::runtime::Builder::new_multi_thread()
            .thread_name(PROXY_RUNTIME)
            .enable_all()
            .build()
            .expect("proxy runtime");
        let proxy = rt.block_on(sieve_e2e::proxy(cfg, workers.len()));
        let url = format!("{}/v1/score", proxy.api_url());
        let tids = || tasks_of(std::process::id(), |comm| comm == PROXY_RUNTIME);
        let r = load.block_on(measure(&http, &url, &body, &args, tids, true));
        print_row(&format!("sieve-proxy ({what})"), &r, args.requests);
        print_sites();
        rt.block_on(async { drop(proxy) });
        rt.shutdown_timeout(Duration::from_secs(5));
    }
}

/// What one path cost over the measured requests.
struct Costs {
    allocs: u64,
    bytes: u64,
    voluntary: u64,
    involuntary: u64,
    errors: usize,
    /// Each counted thread's share of their CPU time over the requests (how evenly the work
    /// spread), largest first.
    shares: Vec<f64>,
}

async fn measure(
    http: &Http,
    url: &str,
    body: &Arc<Vec<u8>>,
    args: &Args,
    tids: impl Fn() -> Vec<(u32, u32)>,
    allocs: bool,
) -> Costs {
    // Warm-up: connections, pools, estimators, the allocator's arenas.
    run_load(http, url, body, args.clients, 200).await;
    let threads = tids();
    assert!(!threads.is_empty(), "no router threads found");
    let strace = args.strace.then(|| Strace::start(&threads));
    let cs0 = switches(&threads);
    let cpu0: Vec<u64> = threads.iter().map(|&t| cpu_ticks(t)).collect();
    let (a0, b0) = (ALLOCS.load(Ordering::Relaxed), BYTES.load(Ordering::Relaxed));
    SAMPLE_EVERY.store(if allocs { args.sites } else { 0 }, Ordering::Relaxed);
    let errors = run_load(http, url, body, args.clients, args.requests).await;
    SAMPLE_EVERY.store(0, Ordering::Relaxed);
    let (a1, b1) = (ALLOCS.load(Ordering::Relaxed), BYTES.load(Ordering::Relaxed));
    let cs1 = switches(&threads);
    let used: Vec<u64> = threads.iter().zip(&cpu0).map(|(&t, &c0)| cpu_ticks(t).saturating_sub(c0)).collect();
    let total = used.iter().sum::<u64>().max(1) as f64;
    let mut shares: Vec<f64> = used.iter().map(|&u| u as f64 / total).collect();
    shares.sort_by(|a, b| b.total_cmp(a));
    drop(strace);
    Costs {
        allocs: if allocs { a1 - a0 } else { 0 },
        bytes: if allocs { b1 - b0 } else { 0 },
        voluntary: cs1.0.saturating_sub(cs0.0),
        involuntary: cs1.1.saturating_sub(cs0.1),
        errors,
        shares,
    }
}

fn print_row(name: &str, c: &Costs, n: usize) {
    let per = |v: u64| v as f64 / n as f64;
    let err = if c.errors > 0 { format!("  ({} errors)", c.errors) } else { String::new() };
    let (allocs, bytes) = if c.allocs == 0 {
        ("—".to_string(), "—".to_string())
    } else {
        (format!("{:.1}", per(c.allocs)), format!("{:.0}", per(c.bytes)))
    };
    let shares: Vec<String> = c.shares.iter().take(4).map(|s| format!("{:.0}%", s * 100.0)).collect();
    println!(
        "  {name:<34} {allocs:>8} {bytes:>10} {:>8.2} {:>8.2}  {}{err}",
        per(c.voluntary),
        per(c.involuntary),
        shares.join("/")
    );
}

/// `n` requests from `clients` concurrent loops; returns how many did not answer 200.
async fn run_load(http: &Http, url: &str, body: &Arc<Vec<u8>>, clients: usize, n: usize) -> usize {
    let next = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (http, url, body, next) = (http.clone(), url.to_string(), body.clone(), next.clone());
            tokio::spawn(async move {
                let mut errors = 0;
                while next.fetch_add(1, Ordering::Relaxed) < n as u64 {
                    match http.send(hyper::Method::POST, &url, body.as_ref().clone()).await {
                        Ok(r) if r.status == 200 => {}
                        _ => errors += 1,
                    }
                }
                errors
            })
        })
        .collect();
    let mut errors = 0;
    for t in tasks {
        errors += t.await.unwrap_or(1);
    }
    errors
}

/// The threads (process id, thread id) of process `pid` whose name passes `keep`.
fn tasks_of(pid: u32, keep: impl Fn(&str) -> bool) -> Vec<(u32, u32)> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    dir.filter_map(|e| {
        let tid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).ok()?;
        keep(comm.trim()).then_some((pid, tid))
    })
    .collect()
}

/// The processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| {
        let p: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        let (_, rest) = stat.rsplit_once(')')?;
        let ppid: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
        (ppid == pid).then_some(p)
    })
    .collect()
}

/// Voluntary and involuntary context switches of these threads so far.
fn switches(tids: &[(u32, u32)]) -> (u64, u64) {
    let mut total = (0, 0);
    for (pid, tid) in tids {
        // Under the process's `task/`: `/proc/TID/...` of a thread can be the whole process's.
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")) else { continue };
        for line in status.lines() {
            let field = |name: &str| line.strip_prefix(name).and_then(|v| v.trim().parse::<u64>().ok());
            if let Some(v) = field("voluntary_ctxt_switches:") {
                total.0 += v;
            } else if let Some(v) = field("nonvoluntary_ctxt_switches:") {
                total.1 += v;
            }
        }
    }
    total
}

/// CPU time (user + system, clock ticks) a thread (process id, thread id) has used.
fn cpu_ticks((pid, tid): (u32, u32)) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")) else { return 0 };
    // After the command name (in parentheses, which may hold spaces): utime and stime are the
    // 12th and 13th fields.
    let Some((_, rest)) = stat.rsplit_once(')') else { return 0 };
    let f: Vec<&str> = rest.split_whitespace().collect();
    f.get(11).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0)
}

/// `strace -c` attached to some threads, its table printed when dropped.
struct Strace(Child);

impl Strace {
    fn start(tids: &[(u32, u32)]) -> Strace {
        let mut cmd = Command::new("strace");
        cmd.arg("-c");
        for (_, t) in tids {
            cmd.arg("-p").arg(t.to_string());
        }
        let child = cmd.stdout(Stdio::null()).stderr(Stdio::inherit()).spawn().expect("strace");
        // strace needs a moment to attach.
        std::thread::sleep(Duration::from_millis(500));
        Strace(child)
    }
}

impl Drop for Strace {
    fn drop(&mut self) {
        // SAFETY: signalling our own child; SIGINT makes strace detach and print its table.
        unsafe {
            libc::kill(self.0.id() as libc::pid_t, libc::SIGINT);
        }
        let _ = self.0.wait();
    }
}
