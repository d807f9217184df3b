//! The abuse soak (issue 13's target): a real `sieve-proxy` in front of two real CPU
//! `sieve-worker` processes on the embedded model, all on loopback, under trickled bodies,
//! stalled, hoarded and half-sent requests, silent and idle connections, clients that never read
//! their answers, an overload burst and one worker killed (SIGKILL) and replaced, while a steady
//! client sends real requests at a fixed rate with a deadline. `run` drives one soak and returns its figures; `SoakReport::failures`
//! checks them against the targets. The e2e test (`tests/abuse_soak.rs`) runs a short soak and
//! the bench (`benches/abuse_soak.rs`) a long one; both print the same report.
//!
//! Processes are started and killed from the thread that runs `run`'s future (the test's or the
//! bench's main thread): a child gets SIGKILL when the thread that started it ends.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sieve_shared::ScoreResponse;

use crate::abuse::{self, Attack, AttackPlan, AttackSummary, BurstSummary, ConnPlan, Timeouts};
use crate::{catalogue, score_body, spawn, Http, Proc};

/// Loading the embedded model (fetching it on a fresh checkout) may take a while.
const LOAD: Duration = Duration::from_secs(600);

/// One soak's shape. Times are from the moment both workers and the proxy are ready.
#[derive(Debug, Clone)]
pub struct SoakConfig {
    /// The steady client runs from 0 to `duration`.
    pub duration: Duration,
    pub steady_rate_hz: f64,
    pub steady_deadline: Duration,
    /// Items per real request (steady and burst); short texts, so two CPU cores keep up.
    pub items: usize,
    pub attack_start: Duration,
    pub attack_window: Duration,
    /// Held open at once against the proxy's and the surviving worker's API ports.
    pub attacks: BTreeMap<Attack, usize>,
    pub trickle_every: Duration,
    pub content_length: usize,
    pub burst_start: Duration,
    pub burst_len: Duration,
    pub burst_concurrency: usize,
    pub burst_deadline: Duration,
    /// Worker 1 gets SIGKILL at this time; a new worker process replaces it in the proxy's
    /// config file (the proxy re-reads the file when it changes).
    pub kill_at: Duration,
    /// The servers' `[http]` timeouts, connection cap and request-byte budget.
    pub timeouts: Timeouts,
    pub max_connections: usize,
    /// `[http] max_buffered_bytes`: a few hoards spend its large part (the rest get 503), and
    /// RSS growth stays under its target.
    pub max_buffered_bytes: usize,
    /// How much later than its timeout a connection may be closed and still count as closed by it.
    pub close_slack: Duration,
    /// How much earlier than its timeout a close may be measured (the client's clock starts
    /// after its last write) and still count as that timeout's.
    pub early_slack: Duration,
}

impl SoakConfig {
    /// About 20 s of soak for `cargo test`.
    pub fn short() -> Self {
        SoakConfig {
            duration: Duration::from_secs(20),
            // A CPU worker on a loaded 2-core machine scores ~250 tokens/s, and a pair's prompt is
            // ~100 tokens: one 2-item call a second keeps both workers well under half busy.
            steady_rate_hz: 1.0,
            steady_deadline: Duration::from_secs(5),
            items: 2,
            attack_start: Duration::from_millis(500),
            attack_window: Duration::from_secs(13),
            attacks: BTreeMap::from([
                (Attack::Trickle, 8),
                (Attack::Stall, 16),
                (Attack::Hoard, 6),
                (Attack::HalfHeaders, 16),
                (Attack::Silent, 16),
                (Attack::Idle, 100),
                (Attack::SlowRead, 2),
            ]),
            trickle_every: Duration::from_millis(100),
            content_length: 8 << 20,
            burst_start: Duration::from_secs(3),
            burst_len: Duration::from_secs(3),
            burst_concurrency: 8,
            // Short: what cannot finish in time is refused (429) or dropped (504) quickly.
            burst_deadline: Duration::from_secs(1),
            kill_at: Duration::from_secs(8),
            timeouts: Timeouts {
                header: Duration::from_secs(1),
                body: Duration::from_secs(2),
                idle: Duration::from_secs(3),
                send: Duration::from_secs(2),
            },
            max_connections: 512,
            // Room for three of the 8 MiB hoards' buffers in its large part (28 MiB), at least
            // 8/7 of the default 16 MiB max_body_bytes.
            max_buffered_bytes: 32 << 20,
            close_slack: Duration::from_millis(1500),
            early_slack: Duration::from_millis(500),
        }
    }

    /// About 2 minutes of soak with more of everything, for the bench.
    pub fn long() -> Self {
        SoakConfig {
            duration: Duration::from_secs(100),
            attack_start: Duration::from_secs(1),
            attack_window: Duration::from_secs(90),
            attacks: BTreeMap::from([
                (Attack::Trickle, 32),
                (Attack::Stall, 64),
                (Attack::Hoard, 16),
                (Attack::HalfHeaders, 64),
                (Attack::Silent, 64),
                (Attack::Idle, 400),
                (Attack::SlowRead, 8),
            ]),
            burst_start: Duration::from_secs(10),
            burst_len: Duration::from_secs(10),
            burst_concurrency: 16,
            kill_at: Duration::from_secs(45),
            max_connections: 1024,
            ..Self::short()
        }
    }

    /// Scales the attack connections down so the soak's own descriptors (two targets' attack
    /// connections, plus headroom for the clients) fit in this process's open-file limit.
    fn fit_fd_limit(&mut self) -> Option<String> {
        let limit = fd_limit();
        let want = 2 * self.attacks.values().sum::<usize>() + self.burst_concurrency + 256;
        if want <= limit {
            return None;
        }
        let scale =
            (limit.saturating_sub(self.burst_concurrency + 256)) as f64 / (want - self.burst_concurrency - 256) as f64;
        for n in self.attacks.values_mut() {
            *n = ((*n as f64 * scale) as usize).max(1);
        }
        Some(format!("open-file limit {limit}: attack connections scaled by {scale:.2}"))
    }
}

fn fd_limit() -> usize {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return 1024;
    }
    usize::try_from(r.rlim_cur).unwrap_or(usize::MAX)
}

// ---------------------------------------------------------------------------------------------
// Configs and processes

fn http_section(c: &SoakConfig) -> String {
    format!(
        "[http]\nheader_read_timeout_ms = {}\nbody_read_timeout_ms = {}\nidle_timeout_ms = {}\nsend_timeout_ms = {}\nmax_connections = {}\nmax_buffered_bytes = {}\n",
        c.timeouts.header.as_millis(),
        c.timeouts.body.as_millis(),
        c.timeouts.idle.as_millis(),
        c.timeouts.send.as_millis(),
        c.max_connections,
        c.max_buffered_bytes
    )
}

fn worker_toml(c: &SoakConfig) -> String {
    // Smaller passes than the default keep a CPU pass short (~2 s at 250 tokens/s), so new
    // calls are not held behind a long one.
    format!("[engine]\nmax_batch_tokens = 512\n\n{}", http_section(c))
}

fn proxy_toml(c: &SoakConfig, workers: &[&Proc]) -> String {
    let mut t = format!(
        "[deadline]\ndefault_ms = {}\n\n[health]\ninterval_ms = 100\ntimeout_ms = 1000\n\n[discovery]\nreload_interval_ms = 100\n\n[client]\npool_idle_timeout_ms = {}\n\n{}",
        c.steady_deadline.as_millis(),
        // Below the workers' idle timeout, as configs/proxy.toml asks: the proxy closes an idle
        // worker connection before the worker does, so it never reuses one being closed.
        c.timeouts.idle.saturating_sub(Duration::from_secs(1)).max(Duration::from_millis(100)).as_millis(),
        http_section(c)
    );
    for w in workers {
        let _ = write!(t, "\n[[workers]]\nurl = \"{}\"\nadmin = \"{}\"\n", w.api_url(), w.admin_url());
    }
    t
}

/// Replaces `path` at once (write a sibling, rename), so the proxy never reads half a file.
fn write_atomic(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write config");
    std::fs::rename(&tmp, path).expect("rename config");
}

struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let d = std::env::temp_dir().join(format!("sieve-soak-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("temp dir");
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn start_worker(config: &Path) -> Proc {
    let cfg = config.display().to_string();
    spawn(
        "sieve-worker",
        &["--model", "default", "--port", "0", "--admin-port", "0", "--threads", "1", "--config", &cfg],
        LOAD,
    )
}

/// Polls `url` until it answers 200, at most `timeout`.
async fn until_ready(http: &Http, admin_url: &str, timeout: Duration) -> bool {
    crate::wait_ready(http, admin_url, timeout).await
}

// ---------------------------------------------------------------------------------------------
// Memory

/// VmRSS and VmHWM of `pid` in KiB; None once it is gone (or a zombie, which has no VmRSS).
pub fn memory_kib(pid: u32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// One process's memory over the soak.
#[derive(Debug, Clone)]
pub struct ProcMemory {
    pub name: String,
    pub pid: u32,
    pub start_kib: u64,
    pub peak_kib: u64,
    pub end_kib: u64,
    /// The kernel's high-water mark at the end (includes the model load, before `start`).
    pub hwm_kib: u64,
    /// Still running at the end (false for the worker killed on purpose).
    pub alive_at_end: bool,
    pub killed_on_purpose: bool,
}

impl ProcMemory {
    fn new(name: &str, pid: u32) -> Self {
        let (rss, hwm) = memory_kib(pid).unwrap_or_default();
        ProcMemory {
            name: name.into(),
            pid,
            start_kib: rss,
            peak_kib: rss,
            end_kib: rss,
            hwm_kib: hwm,
            alive_at_end: true,
            killed_on_purpose: false,
        }
    }

    fn sample(&mut self) -> bool {
        match memory_kib(self.pid) {
            Some((rss, hwm)) => {
                self.peak_kib = self.peak_kib.max(rss);
                self.end_kib = rss;
                self.hwm_kib = hwm;
                true
            }
            None => false,
        }
    }

    /// Peak RSS over the soak minus RSS at its start, MiB.
    pub fn growth_mib(&self) -> f64 {
        self.peak_kib.saturating_sub(self.start_kib) as f64 / 1024.0
    }
}

// ---------------------------------------------------------------------------------------------
// The steady client and the probes

#[derive(Debug, Clone)]
struct SteadyCall {
    /// When it was sent, from the soak's start.
    at: Duration,
    status: Option<u16>,
    latency: Duration,
    partial: bool,
    /// The start of an error answer's body, to say why in the report.
    error: Option<String>,
}

/// The steady client's figures. A request is answered when it got 200 with no `missing` item
/// within its deadline (measured by the client, from send to the last body byte); a partial
/// answer (200 with `missing`) does not count.
#[derive(Debug, Clone, Default)]
pub struct SteadySummary {
    pub sent: usize,
    pub answered: usize,
    pub partial: usize,
    /// By status code; "timeout" is no answer within the deadline + 2 s, "error" a transport error.
    pub outcomes: BTreeMap<String, usize>,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// The requests not answered: (sent at s, outcome, latency ms).
    pub misses: Vec<(f64, String, f64)>,
}

impl SteadySummary {
    pub fn answered_fraction(&self) -> f64 {
        if self.sent == 0 {
            0.0
        } else {
            self.answered as f64 / self.sent as f64
        }
    }

    fn from_calls(calls: &[SteadyCall], deadline: Duration) -> Self {
        let mut s = SteadySummary { sent: calls.len(), ..Default::default() };
        let mut ms: Vec<f64> = Vec::with_capacity(calls.len());
        for c in calls {
            let key = c.status.map_or_else(
                || if c.latency > deadline { "timeout".into() } else { "error".into() },
                |v| v.to_string(),
            );
            *s.outcomes.entry(key.clone()).or_default() += 1;
            s.partial += usize::from(c.partial);
            if c.status == Some(200) && !c.partial && c.latency <= deadline {
                s.answered += 1;
            } else {
                let what = match (&c.error, c.partial) {
                    (_, true) => "partial".to_string(),
                    (Some(e), false) => format!("{key} {e}"),
                    (None, false) => key.clone(),
                };
                s.misses.push((c.at.as_secs_f64(), what, c.latency.as_secs_f64() * 1e3));
            }
            ms.push(c.latency.as_secs_f64() * 1e3);
        }
        ms.sort_by(f64::total_cmp);
        let q = |p: f64| if ms.is_empty() { 0.0 } else { ms[((ms.len() - 1) as f64 * p).round() as usize] };
        (s.p50_ms, s.p99_ms, s.max_ms) = (q(0.5), q(0.99), q(1.0));
        s
    }
}

async fn steady(http: Http, url: String, cfg: SoakConfig, t0: Instant) -> Vec<SteadyCall> {
    let stop = t0 + cfg.duration;
    let every = Duration::from_secs_f64(1.0 / cfg.steady_rate_hz);
    let mut tick = tokio::time::interval(every);
    // Open loop: a slow answer does not delay the next request.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let calls = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let mut seq = 0u64;
    loop {
        tick.tick().await;
        if Instant::now() >= stop {
            break;
        }
        seq += 1;
        let body = score_body(QUERY, &short_items(cfg.items, 1000 + seq), Some(cfg.steady_deadline.as_millis() as u64));
        let (http, url, calls) = (http.clone(), url.clone(), calls.clone());
        let limit = cfg.steady_deadline + Duration::from_secs(2);
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let at = sent - t0;
            let r = tokio::time::timeout(limit, http.try_post_json(&url, &body)).await;
            let latency = sent.elapsed();
            let call = match r {
                Ok(Ok(r)) => {
                    let partial = r.status == 200
                        && serde_json::from_slice::<ScoreResponse>(&r.body).map_or(true, |b| !b.missing.is_empty());
                    let error = (r.status != 200).then(|| String::from_utf8_lossy(&r.body).chars().take(200).collect());
                    SteadyCall { at, status: Some(r.status), latency, partial, error }
                }
                _ => SteadyCall { at, status: None, latency, partial: false, error: None },
            };
            calls.lock().unwrap().push(call);
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let all = std::mem::take(&mut *calls.lock().unwrap());
    all
}

const QUERY: &str = "waterproof trail running shoes";

/// Short product texts (at most ~100 characters), deterministic in `seed`.
pub fn short_items(n: usize, seed: u64) -> Vec<String> {
    catalogue(n, seed)
        .into_iter()
        .map(|mut t| {
            if let Some((cut, _)) = t.char_indices().nth(100) {
                t.truncate(cut);
            }
            t
        })
        .collect()
}

/// What the admin ports said during the soak.
#[derive(Debug, Clone, Default)]
pub struct ReadySummary {
    pub proxy_probes: usize,
    pub proxy_ready: usize,
    pub proxy_not_ready: usize,
    pub proxy_errors: usize,
    pub proxy_max_probe_ms: f64,
    pub worker0_probes: usize,
    pub worker0_ready: usize,
    /// From the kill to the proxy counting one eligible worker.
    pub dead_noticed_after_s: Option<f64>,
    /// From the replacement's listening line to the proxy counting it eligible.
    pub replacement_eligible_after_s: Option<f64>,
    /// From the replacement's listening line to its own /ready 200 (model load).
    pub replacement_loaded_after_s: Option<f64>,
    /// Shards the replacement served by the end.
    pub replacement_shards: u64,
}

#[derive(Default)]
struct Probes {
    proxy: Vec<(Option<u16>, Duration)>,
    worker0: Vec<Option<u16>>,
    /// (time, eligible workers, eligible URLs)
    eligible: Vec<(Instant, usize, Vec<String>)>,
}

async fn probe(http: &Http, url: &str) -> (Option<u16>, Duration) {
    let t0 = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(1), http.send(hyper::Method::GET, url, bytes::Bytes::new())).await;
    (r.ok().and_then(Result::ok).map(|r| r.status), t0.elapsed())
}

async fn probe_loop(
    http: Http,
    proxy_admin: String,
    worker0_admin: String,
    stop: Arc<AtomicBool>,
    out: Arc<Mutex<Probes>>,
) {
    while !stop.load(Ordering::Acquire) {
        let p = probe(&http, &format!("{proxy_admin}/ready")).await;
        let w = probe(&http, &format!("{worker0_admin}/ready")).await.0;
        let eligible = match tokio::time::timeout(
            Duration::from_secs(1),
            http.send(hyper::Method::GET, &format!("{proxy_admin}/workers"), bytes::Bytes::new()),
        )
        .await
        {
            Ok(Ok(r)) if r.status == 200 => {
                let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
                let urls: Vec<String> = v["workers"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter(|w| w["eligible"] == true)
                            .filter_map(|w| w["url"].as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default();
                Some((Instant::now(), urls.len(), urls))
            }
            _ => None,
        };
        {
            let mut o = out.lock().unwrap();
            o.proxy.push(p);
            o.worker0.push(w);
            if let Some(e) = eligible {
                o.eligible.push(e);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn memory_loop(procs: Arc<Mutex<Vec<ProcMemory>>>, stop: Arc<AtomicBool>, died: Arc<Mutex<Vec<String>>>) {
    while !stop.load(Ordering::Acquire) {
        for p in procs.lock().unwrap().iter_mut() {
            if p.alive_at_end && !p.sample() {
                p.alive_at_end = false;
                if !p.killed_on_purpose {
                    died.lock().unwrap().push(format!("{} (pid {})", p.name, p.pid));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The soak

/// Everything one soak measured.
#[derive(Debug, Clone)]
pub struct SoakReport {
    pub config: SoakConfig,
    pub notes: Vec<String>,
    pub steady: SteadySummary,
    pub burst: BurstSummary,
    pub attacks: BTreeMap<(&'static str, Attack), AttackSummary>,
    pub memory: Vec<ProcMemory>,
    pub ready: ReadySummary,
    /// Processes that died without being killed on purpose.
    pub died: Vec<String>,
    /// `sieve_http_timeouts_total{timer="send"}` at the end, by target (None: not on its page).
    pub send_timeouts: BTreeMap<&'static str, Option<f64>>,
    pub wall: Duration,
}

/// Runs one soak. Panics only when the cluster cannot be started.
pub async fn run(mut cfg: SoakConfig) -> SoakReport {
    let wall = Instant::now();
    let mut notes: Vec<String> = cfg.fit_fd_limit().into_iter().collect();
    let http = Http::new();
    let dir = TempDir::new();
    let worker_cfg = dir.0.join("worker.toml");
    std::fs::write(&worker_cfg, worker_toml(&cfg)).expect("worker config");
    let w0 = start_worker(&worker_cfg);
    let mut w1 = start_worker(&worker_cfg);
    for w in [&w0, &w1] {
        assert!(until_ready(&http, &w.admin_url(), LOAD).await, "worker {} never ready", w.api);
    }
    let proxy_cfg = dir.0.join("proxy.toml");
    write_atomic(&proxy_cfg, &proxy_toml(&cfg, &[&w0, &w1]));
    let pc = proxy_cfg.display().to_string();
    let proxy = spawn("sieve-proxy", &["--port", "0", "--admin-port", "0", "--config", &pc], Duration::from_secs(20));
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let r = http.get(&format!("{}/workers", proxy.admin_url())).await;
        if r.json::<serde_json::Value>()["eligible"] == 2 {
            break;
        }
        assert!(Instant::now() < end, "the proxy never saw both workers ready: {}", r.text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Warm up each path once, so the baselines include what every first call allocates.
    let score = format!("{}/v1/score", proxy.api_url());
    let warm = score_body(QUERY, &short_items(cfg.items, 1), Some(60_000));
    for url in [score.clone(), format!("{}/v1/score", w0.api_url()), format!("{}/v1/score", w1.api_url())] {
        let r = http.post_json(&url, &warm).await;
        assert_eq!(r.status, 200, "warm-up call to {url}: {}", r.text());
    }

    let t0 = Instant::now();
    let memory = Arc::new(Mutex::new(vec![
        ProcMemory::new("proxy", proxy.pid()),
        ProcMemory::new("worker 0", w0.pid()),
        ProcMemory::new("worker 1", w1.pid()),
    ]));
    let died = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let probes = Arc::new(Mutex::new(Probes::default()));
    let mem_task = tokio::spawn(memory_loop(memory.clone(), stop.clone(), died.clone()));
    let probe_task =
        tokio::spawn(probe_loop(http.clone(), proxy.admin_url(), w0.admin_url(), stop.clone(), probes.clone()));
    let steady_task = tokio::spawn(steady(http.clone(), score.clone(), cfg.clone(), t0));

    // Attacks go to the proxy and to the worker that stays up (the killed one's connections
    // would end with the process, not by a timeout).
    let plan = AttackPlan {
        per_target: cfg.attacks.clone(),
        conn: Some(ConnPlan {
            content_length: cfg.content_length,
            trickle_every: cfg.trickle_every,
            give_up: cfg.timeouts.header.max(cfg.timeouts.body).max(cfg.timeouts.idle).max(cfg.timeouts.send)
                + cfg.close_slack
                + Duration::from_secs(2),
        }),
    };
    let targets: Vec<(&'static str, SocketAddr)> = vec![("proxy", proxy.api), ("worker 0", w0.api)];
    let (attack_start, window) = (cfg.attack_start, cfg.attack_window);
    let attack_task = tokio::spawn(async move {
        tokio::time::sleep_until((t0 + attack_start).into()).await;
        abuse::run(&targets, &plan, window).await
    });
    let burst_task = {
        let (http, url, c) = (http.clone(), score.clone(), cfg.clone());
        tokio::spawn(async move {
            tokio::time::sleep_until((t0 + c.burst_start).into()).await;
            let body = score_body(QUERY, &short_items(c.items, 7), Some(c.burst_deadline.as_millis() as u64));
            abuse::burst(
                &http,
                &url,
                &body,
                c.burst_concurrency,
                c.burst_len,
                c.burst_deadline + Duration::from_secs(2),
            )
            .await
        })
    };

    // The kill and the replacement run here, on the thread that started the workers.
    tokio::time::sleep_until((t0 + cfg.kill_at).into()).await;
    memory.lock().unwrap()[2].killed_on_purpose = true;
    let killed_at = Instant::now();
    w1.kill();
    let w1b = start_worker(&worker_cfg);
    let listening_at = Instant::now();
    write_atomic(&proxy_cfg, &proxy_toml(&cfg, &[&w0, &w1b]));
    let loaded = until_ready(&http, &w1b.admin_url(), LOAD).await;
    let loaded_after = listening_at.elapsed();
    if loaded {
        // Its baseline after the same warm-up call as the others' (a first call allocates the
        // pass's scratch and touches the mapped weights); without it the growth counted that.
        let r = http.post_json(&format!("{}/v1/score", w1b.api_url()), &warm).await;
        if r.status != 200 {
            notes.push(format!("the replacement's warm-up call: {} {}", r.status, r.text()));
        }
        memory.lock().unwrap().push(ProcMemory::new("worker 1 (replacement)", w1b.pid()));
    } else {
        notes.push("the replacement worker never became ready".into());
    }

    let steady_calls = steady_task.await.expect("steady client");
    let burst = burst_task.await.expect("burst");
    let outcomes = attack_task.await.expect("attacks");
    // Let what the attacks left behind be returned before the end figures.
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Release);
    let _ = probe_task.await;
    let _ = mem_task.await;

    let mut memory = std::mem::take(&mut *memory.lock().unwrap());
    let mut died = std::mem::take(&mut *died.lock().unwrap());
    // A process that exited counts as dead even if its pid was not sampled at the right moment.
    let mut check_exit = |name: &str, proc_: &mut Proc| {
        if let Some(status) = proc_.wait_exit(Duration::from_millis(5)) {
            if !died.iter().any(|d| d.starts_with(name)) {
                died.push(format!("{name} (pid {}, {status})", proc_.pid()));
            }
            for m in memory.iter_mut().filter(|m| m.pid == proc_.pid()) {
                m.alive_at_end = false;
            }
        }
    };
    let (mut proxy, mut w0, mut w1b) = (proxy, w0, w1b);
    check_exit("proxy", &mut proxy);
    check_exit("worker 0", &mut w0);
    check_exit("worker 1 (replacement)", &mut w1b);

    let probes = std::mem::take(&mut *probes.lock().unwrap());
    let mut ready = ReadySummary {
        proxy_probes: probes.proxy.len(),
        proxy_ready: probes.proxy.iter().filter(|p| p.0 == Some(200)).count(),
        proxy_not_ready: probes.proxy.iter().filter(|p| p.0.is_some_and(|s| s != 200)).count(),
        proxy_errors: probes.proxy.iter().filter(|p| p.0.is_none()).count(),
        proxy_max_probe_ms: probes.proxy.iter().map(|p| p.1.as_secs_f64() * 1e3).fold(0.0, f64::max),
        worker0_probes: probes.worker0.len(),
        worker0_ready: probes.worker0.iter().filter(|s| **s == Some(200)).count(),
        replacement_loaded_after_s: loaded.then_some(loaded_after.as_secs_f64()),
        ..Default::default()
    };
    ready.dead_noticed_after_s = probes
        .eligible
        .iter()
        .find(|(t, n, _)| *t >= killed_at && *n < 2)
        .map(|(t, _, _)| (*t - killed_at).as_secs_f64());
    let new_url = w1b.api_url();
    ready.replacement_eligible_after_s = probes
        .eligible
        .iter()
        .find(|(t, _, urls)| *t >= listening_at && urls.contains(&new_url))
        .map(|(t, _, _)| (*t - listening_at).as_secs_f64());
    if let Ok(r) = http.send(hyper::Method::GET, &format!("{}/workers", proxy.admin_url()), bytes::Bytes::new()).await {
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
        ready.replacement_shards = v["workers"]
            .as_array()
            .and_then(|a| a.iter().find(|w| w["url"] == new_url.as_str()))
            .and_then(|w| w["shards"].as_u64())
            .unwrap_or(0);
    }
    let mut send_timeouts = BTreeMap::new();
    let name = format!("{}{{timer=\"send\"}}", sieve_shared::metrics_names::http::TIMEOUTS);
    for (target, url) in [("proxy", proxy.admin_url()), ("worker 0", w0.admin_url())] {
        let page = http.send(hyper::Method::GET, &format!("{url}/metrics"), bytes::Bytes::new()).await;
        let value = page.ok().and_then(|r| {
            String::from_utf8_lossy(&r.body)
                .lines()
                .find_map(|l| l.strip_prefix(name.as_str())?.strip_prefix(' ')?.trim().parse().ok())
        });
        send_timeouts.insert(target, value);
    }

    SoakReport {
        steady: SteadySummary::from_calls(&steady_calls, cfg.steady_deadline),
        burst,
        attacks: abuse::summarise(&outcomes, &cfg.timeouts, cfg.close_slack, cfg.early_slack),
        memory,
        ready,
        died,
        send_timeouts,
        notes,
        wall: wall.elapsed(),
        config: cfg,
    }
}

// ---------------------------------------------------------------------------------------------
// Targets and the printed report

/// Issue 13's soak targets.
pub const MIN_ANSWERED: f64 = 0.99;
pub const MAX_GROWTH_MIB: f64 = 64.0;

impl SoakReport {
    /// Every target this soak missed, in words with its figure; empty when all are met.
    pub fn failures(&self) -> Vec<String> {
        let mut f = Vec::new();
        let s = &self.steady;
        if s.answered_fraction() < MIN_ANSWERED {
            f.push(format!(
                "steady client: {}/{} ({:.1}%) answered 200 in full within {:?}, target >= {:.0}% (outcomes {:?}, partial {})",
                s.answered,
                s.sent,
                100.0 * s.answered_fraction(),
                self.config.steady_deadline,
                100.0 * MIN_ANSWERED,
                s.outcomes,
                s.partial
            ));
        }
        for m in &self.memory {
            if m.growth_mib() >= MAX_GROWTH_MIB {
                f.push(format!(
                    "{}: RSS grew {:.1} MiB (start {:.1}, peak {:.1}, end {:.1} MiB), target < {MAX_GROWTH_MIB} MiB",
                    m.name,
                    m.growth_mib(),
                    m.start_kib as f64 / 1024.0,
                    m.peak_kib as f64 / 1024.0,
                    m.end_kib as f64 / 1024.0
                ));
            }
        }
        for d in &self.died {
            f.push(format!("died: {d}"));
        }
        for ((target, attack), a) in &self.attacks {
            if a.late > 0 {
                f.push(format!(
                    "{target} {}: {} of {} connections not closed by the server within its timeout ({:?}) + {:?} (closed by server {}, after s min/median/max {:?})",
                    attack.name(),
                    a.late,
                    a.connections - a.connect_failed,
                    attack.deadline(&self.config.timeouts),
                    self.config.close_slack,
                    a.closed_by_server,
                    a.closed_after_s
                ));
            }
            if a.early > 0 {
                f.push(format!(
                    "{target} {}: {} connections closed by the server more than {:?} before their timeout ({:?}; after s min/median/max {:?})",
                    attack.name(),
                    a.early,
                    self.config.early_slack,
                    attack.earliest(&self.config.timeouts),
                    a.closed_after_s
                ));
            }
            if a.connect_failed > 0 {
                f.push(format!("{target} {}: {} connections could not connect", attack.name(), a.connect_failed));
            }
        }
        // Every slow reader the server closed was closed by its send timeout, and counted.
        for (target, counted) in &self.send_timeouts {
            let closed = self.attacks.get(&(*target, Attack::SlowRead)).map_or(0, |a| a.closed_by_server);
            if counted.unwrap_or(0.0) < closed as f64 {
                f.push(format!("{target}: sieve_http_timeouts_total{{timer=\"send\"}} {counted:?} below the {closed} slow readers it closed"));
            }
        }
        let r = &self.ready;
        if r.proxy_ready != r.proxy_probes || r.proxy_probes == 0 {
            f.push(format!(
                "proxy /ready was not 200 throughout although a worker was always up: {} probes, {} ready, {} not ready, {} errors (max {:.0} ms)",
                r.proxy_probes, r.proxy_ready, r.proxy_not_ready, r.proxy_errors, r.proxy_max_probe_ms
            ));
        }
        if r.worker0_ready != r.worker0_probes {
            f.push(format!("worker 0 /ready was not 200 throughout: {}/{} probes", r.worker0_ready, r.worker0_probes));
        }
        if r.dead_noticed_after_s.is_none() {
            f.push("the proxy never stopped counting the killed worker as eligible".into());
        }
        if r.replacement_eligible_after_s.is_none() {
            f.push("the proxy never counted the replacement worker as eligible".into());
        }
        f
    }

    /// The figures, as the bench prints them.
    pub fn render(&self) -> String {
        let c = &self.config;
        let mut o = String::new();
        let _ = writeln!(o, "abuse soak: {:.1} s wall, soak {:?}", self.wall.as_secs_f64(), c.duration);
        let _ = writeln!(
            o,
            "  servers: [http] header {:?}, body {:?}, idle {:?}, send {:?}, max_connections {}, max_buffered_bytes {} MiB",
            c.timeouts.header,
            c.timeouts.body,
            c.timeouts.idle,
            c.timeouts.send,
            c.max_connections,
            c.max_buffered_bytes >> 20
        );
        for n in &self.notes {
            let _ = writeln!(o, "  note: {n}");
        }
        let s = &self.steady;
        let _ = writeln!(
            o,
            "steady client: {:.1}/s, {} items, deadline {:?}: {}/{} answered ({:.2}%), partial {}, outcomes {:?}, latency p50 {:.0} ms p99 {:.0} ms max {:.0} ms",
            c.steady_rate_hz,
            c.items,
            c.steady_deadline,
            s.answered,
            s.sent,
            100.0 * s.answered_fraction(),
            s.partial,
            s.outcomes,
            s.p50_ms,
            s.p99_ms,
            s.max_ms
        );
        if !s.misses.is_empty() {
            let m: Vec<String> =
                s.misses.iter().map(|(at, what, ms)| format!("{what} at {at:.1} s ({ms:.0} ms)")).collect();
            let _ = writeln!(o, "  not answered: {}", m.join(", "));
        }
        let b = &self.burst;
        let _ = writeln!(
            o,
            "burst: {} clients for {:?} from {:?}: {} requests, statuses {:?}, errors/timeouts {}",
            c.burst_concurrency, c.burst_len, c.burst_start, b.requests, b.statuses, b.errors
        );
        let _ = writeln!(
            o,
            "attacks ({:?} from {:?}, held open at once per target: {}):",
            c.attack_window,
            c.attack_start,
            c.attacks.iter().map(|(a, n)| format!("{} {n}", a.name())).collect::<Vec<_>>().join(", ")
        );
        let _ = writeln!(
            o,
            "  {:<9} {:<13} {:>6} {:>7} {:>5} {:>5} {:>7}  closed after s (min/med/max)  timeout  statuses",
            "target", "attack", "conns", "closed", "late", "early", "nocon"
        );
        for ((target, attack), a) in &self.attacks {
            let after =
                a.closed_after_s.map_or_else(|| "-".to_string(), |(lo, mid, hi)| format!("{lo:.2}/{mid:.2}/{hi:.2}"));
            let _ = writeln!(
                o,
                "  {:<9} {:<13} {:>6} {:>7} {:>5} {:>5} {:>7}  {:<28}  {:>6.1}s  {:?}",
                target,
                attack.name(),
                a.connections,
                a.closed_by_server,
                a.late,
                a.early,
                a.connect_failed,
                after,
                attack.deadline(&c.timeouts).as_secs_f64(),
                a.statuses
            );
        }
        let _ = writeln!(o, "memory (RSS MiB; growth = peak - start):");
        for m in &self.memory {
            let _ = writeln!(
                o,
                "  {:<24} start {:>7.1} peak {:>7.1} end {:>7.1} growth {:>6.1}  VmHWM {:>7.1}  {}",
                m.name,
                m.start_kib as f64 / 1024.0,
                m.peak_kib as f64 / 1024.0,
                m.end_kib as f64 / 1024.0,
                m.growth_mib(),
                m.hwm_kib as f64 / 1024.0,
                if m.killed_on_purpose {
                    "killed on purpose"
                } else if m.alive_at_end {
                    "alive"
                } else {
                    "DIED"
                }
            );
        }
        let r = &self.ready;
        let _ = writeln!(
            o,
            "ready: proxy /ready {}/{} probes 200 ({} not ready, {} errors, slowest {:.0} ms); worker 0 /ready {}/{}",
            r.proxy_ready,
            r.proxy_probes,
            r.proxy_not_ready,
            r.proxy_errors,
            r.proxy_max_probe_ms,
            r.worker0_ready,
            r.worker0_probes
        );
        let f = |v: Option<f64>| v.map_or_else(|| "never".to_string(), |s| format!("{s:.2} s"));
        let _ = writeln!(
            o,
            "kill at {:.1} s: the proxy dropped the killed worker after {}; the replacement loaded in {}, eligible after {}, served {} shards",
            c.kill_at.as_secs_f64(),
            f(r.dead_noticed_after_s),
            f(r.replacement_loaded_after_s),
            f(r.replacement_eligible_after_s),
            r.replacement_shards
        );
        let _ = writeln!(
            o,
            "send timeouts counted: {}",
            self.send_timeouts
                .iter()
                .map(|(t, v)| format!("{t} {}", v.map_or_else(|| "-".to_string(), |v| format!("{v:.0}"))))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let _ = writeln!(o, "died: {}", if self.died.is_empty() { "none".to_string() } else { self.died.join(", ") });
        let failures = self.failures();
        if failures.is_empty() {
            let _ = writeln!(o, "targets: all met");
        } else {
            let _ = writeln!(o, "targets missed:");
            for x in failures {
                let _ = writeln!(o, "  - {x}");
            }
        }
        o
    }
}
