//! The proxy's configuration: a TOML file (`configs/proxy.toml` is the documented example) in
//! which every field has a default, so an empty file is a valid config. The load-test harness
//! builds these too, to start proxies with a given strategy. Unknown keys are errors, named with
//! their section (`config_file`), so a typo never silently falls back to a default.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::config_file::{self, Removed};
use crate::http_config::{AdminConfig, HttpConfig};
use crate::{CostModel, Limits};

/// Keys the proxy no longer reads: a file that still sets one is refused with the note.
const REMOVED: &[Removed] = &[Removed {
    section: "server",
    key: "api_threads",
    note: "the API port is served by the process's runtime, like the other ports",
}];

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxyConfig {
    pub server: ServerConfig,
    /// Request limits, checked before any shard is sent (the worker's, by default).
    pub limits: Limits,
    /// The model names a request may give and the CORS origins (`[api]`).
    pub api: crate::ApiConfig,
    pub deadline: DeadlineConfig,
    pub split: SplitConfig,
    pub admission: AdmissionConfig,
    pub balance: BalanceConfig,
    pub retry: RetryConfig,
    pub hedge: HedgeConfig,
    pub breaker: BreakerConfig,
    pub health: HealthConfig,
    pub client: ClientConfig,
    /// Initial cost model (the prior the online recalibration starts from).
    pub cost: CostModel,
    pub estimator: EstimatorConfig,
    pub discovery: DiscoveryConfig,
    pub drain: DrainConfig,
    /// The pair-score cache (`[cache]`).
    pub cache: CacheConfig,
    /// The sampled request trace (`[request_trace]`).
    pub request_trace: RequestTraceConfig,
    /// Transport timeouts and the connection cap of both ports (a restart applies changes).
    pub http: HttpConfig,
    /// The gRPC API port (off unless `port` is set; a restart applies changes).
    pub grpc: crate::grpc_config::GrpcConfig,
    /// Who may use the admin routes (`POST /reload`, `POST /drain` always need the token).
    pub admin: AdminConfig,
    /// Span export over OTLP (off by default; read at start-up, a restart applies changes).
    pub tracing: crate::trace_config::TracingConfig,
    /// The log format (read at start-up).
    pub log: crate::trace_config::LogConfig,
    /// The static worker list (`[[workers]]` tables). Hot-reloaded when the file changes.
    pub workers: Vec<WorkerEndpoint>,
}

/// The longest time to live of the proxy's caches (pair scores, prefix holders): a year.
pub const MAX_TTL_MS: u64 = 365 * 24 * 3600 * 1000;

impl ProxyConfig {
    /// Parses and validates a TOML config. Reading the file is the caller's job.
    pub fn from_toml(text: &str) -> Result<Self, String> {
        let cfg: ProxyConfig = config_file::parse(text, REMOVED)?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }

    /// Checks ranges the types cannot express; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        fn check(ok: bool, msg: &str) -> Result<(), String> {
            if ok {
                Ok(())
            } else {
                Err(msg.to_string())
            }
        }
        self.cost.validate()?;
        self.limits.validate()?;
        self.http.validate_with_body_limit(self.limits.max_body_bytes)?;
        self.grpc.validate()?;
        self.tracing.validate()?;
        check(self.server.max_in_flight_requests > 0, "server.max_in_flight_requests must be positive")?;
        check(self.deadline.default_ms > 0, "deadline.default_ms must be positive")?;
        if self.deadline.default_ms > self.limits.max_deadline_ms {
            return Err(format!(
                "deadline.default_ms {} must be at most limits.max_deadline_ms {} (else every request without \
                 deadline_ms is refused)",
                self.deadline.default_ms, self.limits.max_deadline_ms
            ));
        }
        // moka refuses a time to live of more than 1,000 years by panicking; a year is plenty.
        for (name, ms) in
            [("split.prefix_holders_ttl_ms", self.split.prefix_holders_ttl_ms), ("cache.ttl_ms", self.cache.ttl_ms)]
        {
            check(ms <= MAX_TTL_MS, &format!("{name} {ms} must be at most {MAX_TTL_MS} (a year)"))?;
        }
        for (name, v) in [
            ("retry.budget_ratio", self.retry.budget_ratio),
            ("retry.budget_min_per_sec", self.retry.budget_min_per_sec),
            ("hedge.budget_ratio", self.hedge.budget_ratio),
            ("hedge.min_delay_ms", self.hedge.min_delay_ms),
            ("estimator.prior_weight", self.estimator.prior_weight),
        ] {
            check(v >= 0.0 && v.is_finite(), &format!("{name} must be a finite number >= 0, got {v}"))?;
        }
        check(self.split.fixed_items > 0, "split.fixed_items must be positive")?;
        check(self.split.max_shards > 0, "split.max_shards must be positive")?;
        check(self.split.prefix_holders_ttl_ms > 0, "split.prefix_holders_ttl_ms must be positive")?;
        check(self.admission.error_window_ms > 0, "admission.error_window_ms must be positive")?;
        check(self.admission.quantile > 0.0 && self.admission.quantile < 1.0, "admission.quantile must be in (0, 1)")?;
        check(
            self.admission.margin >= 0.0 && self.admission.margin.is_finite(),
            "admission.margin must be a finite number >= 0",
        )?;
        check(
            self.admission.stall_factor == 0.0
                || (self.admission.stall_factor >= 1.0 && self.admission.stall_factor.is_finite()),
            "admission.stall_factor must be 0 (off) or a finite number >= 1",
        )?;
        check(self.split.tolerance >= 0.0 && self.split.tolerance.is_finite(), "split.tolerance must be >= 0")?;
        check(self.balance.choices >= 2, "balance.choices must be at least 2")?;
        check(
            self.balance.worker_parallelism >= 1.0 && self.balance.worker_parallelism.is_finite(),
            "balance.worker_parallelism must be >= 1",
        )?;
        check(self.retry.max_attempts >= 1, "retry.max_attempts must be at least 1")?;
        check(self.hedge.quantile > 0.0 && self.hedge.quantile < 1.0, "hedge.quantile must be in (0, 1)")?;
        check(
            self.hedge.initial_multiplier >= 1.0 && self.hedge.initial_multiplier.is_finite(),
            "hedge.initial_multiplier must be a finite number >= 1",
        )?;
        check(self.breaker.failure_threshold >= 1, "breaker.failure_threshold must be at least 1")?;
        check(self.breaker.open_ms > 0, "breaker.open_ms must be positive")?;
        check(self.breaker.max_open_ms >= self.breaker.open_ms, "breaker.max_open_ms must be >= breaker.open_ms")?;
        check(self.health.interval_ms > 0, "health.interval_ms must be positive")?;
        check(self.health.timeout_ms > 0, "health.timeout_ms must be positive")?;
        check(
            self.estimator.token_decay > 0.0 && self.estimator.token_decay <= 1.0,
            "estimator.token_decay must be in (0, 1]",
        )?;
        check(
            self.estimator.cost_decay > 0.0 && self.estimator.cost_decay <= 1.0,
            "estimator.cost_decay must be in (0, 1]",
        )?;
        check(
            self.estimator.speed_smoothing > 0.0 && self.estimator.speed_smoothing <= 1.0,
            "estimator.speed_smoothing must be in (0, 1]",
        )?;
        check(self.cache.ttl_ms > 0, "cache.ttl_ms must be positive")?;
        check((0.0..=1.0).contains(&self.request_trace.sample), "request_trace.sample must be in [0, 1]")?;
        check(self.request_trace.max_bytes >= 4096, "request_trace.max_bytes must be at least 4096")?;
        check(self.request_trace.keep >= 1, "request_trace.keep must be at least 1")?;
        check(self.discovery.reload_interval_ms > 0, "discovery.reload_interval_ms must be positive")?;
        for (i, d) in self.discovery.dns.iter().enumerate() {
            if d.name.trim().is_empty() {
                return Err(format!("discovery.dns[{i}].name is empty"));
            }
            if d.interval_ms == 0 {
                return Err(format!("discovery.dns[{i}].interval_ms must be positive"));
            }
        }
        for (i, w) in self.workers.iter().enumerate() {
            w.validate().map_err(|e| format!("workers[{i}]: {e}"))?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address of the API port.
    pub host: String,
    /// API port (`POST /v1/score`, `/v1/rerank`); 0 picks a free port.
    pub port: u16,
    /// Address of the admin port, apart from `host`: loopback unless set.
    pub admin_host: String,
    /// Admin port (`/health`, `/ready`, `/metrics`, `/workers`); 0 picks a free port.
    pub admin_port: u16,
    /// Requests in progress at once; more get 429.
    pub max_in_flight_requests: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 8080,
            admin_host: "127.0.0.1".into(),
            admin_port: 9080,
            max_in_flight_requests: 4096,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeadlineConfig {
    /// Budget of a request that carries no `deadline_ms`.
    pub default_ms: u64,
}

impl Default for DeadlineConfig {
    fn default() -> Self {
        DeadlineConfig { default_ms: 500 }
    }
}

/// How a request's items are cut into shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SplitMode {
    /// Choose the shard count and pack by predicted cost (the design); items that begin alike
    /// stay on one shard, their shared run counted once.
    Cost,
    /// `cost` blind to items that begin alike: every item packed alone (the comparison's
    /// baseline for item groups).
    CostUngrouped,
    /// Consecutive chunks of `fixed_items` items (the request-level baseline).
    Fixed,
    /// The whole request to one worker.
    None,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SplitConfig {
    pub mode: SplitMode,
    /// Items per shard in `fixed` mode.
    pub fixed_items: usize,
    /// Most shards one request is cut into.
    pub max_shards: usize,
    /// Fewer shards are preferred while their predicted makespan is within this fraction of
    /// the best (fan-out has costs the model does not see: tail risk, connections).
    pub tolerance: f64,
    /// Shard token limit used for a worker that does not report `max_batch_tokens`; 0: none.
    pub default_max_batch_tokens: u64,
    /// Cost mode: score each plan by its makespan plus what its work adds to the waiting of
    /// requests arriving behind it, priced from the workers' queues (the proxy's `load_price`
    /// module): while every worker is busy, the pool's price of its total work (every shard's
    /// fixed cost and prefix included); while one is idle, each worker's price of the work the
    /// plan queues on it. The shard count falls as the cluster fills, to one shard on the
    /// least-loaded worker, and grows back as it empties. False: minimise this request's
    /// makespan alone.
    pub load_aware: bool,
    /// Cost mode: a worker known to hold the request's shared prefix in its prefix cache (it
    /// answered a call with that prefix lately) is planned without the prefix's compute, and
    /// is moved up the ranking when that makes it start earliest; the makespan and load price
    /// trade the saving against its queue. False: every worker is planned as paying the prefix.
    pub prefix_affinity: bool,
    /// Most prefixes whose holders the proxy remembers (each holds up to 4 workers).
    pub prefix_holders_entries: u64,
    /// A worker counts as holding a prefix for this long after its last answer for it: the
    /// proxy's guess of how long the worker's LRU keeps a prefix (ms).
    pub prefix_holders_ttl_ms: u64,
}

impl Default for SplitConfig {
    fn default() -> Self {
        SplitConfig {
            mode: SplitMode::Cost,
            fixed_items: 32,
            max_shards: 64,
            tolerance: 0.02,
            default_max_batch_tokens: 0,
            load_aware: true,
            prefix_affinity: true,
            prefix_holders_entries: 100_000,
            prefix_holders_ttl_ms: 30_000,
        }
    }
}

/// Admission control: a request whose best plan is predicted to finish after its deadline is
/// answered at once (429 with `Retry-After`, or the part that fits when the request says
/// `"on_overload": "partial"`) instead of being queued to be thrown away. The prediction is
/// taken as measured: a plan of k shards counts as its makespan times the q^(1/k) quantile of
/// actual over predicted shard time (q: `quantile`), stalls left out (`stall_factor`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionConfig {
    /// Off: every request is sent and the deadline cuts what is late (the old behaviour).
    pub enabled: bool,
    /// A plan is refused only when its predicted finish exceeds the time left by more than
    /// this fraction of it (predictions are estimates; 0: refuse anything predicted late).
    pub margin: f64,
    /// How long a measured shard (actual over predicted time) counts toward the error a plan is
    /// held to; with fewer than `[hedge] min_samples` shards that recent, predictions are taken
    /// at face value. Refused requests send no shards and so teach nothing: without this an
    /// overload's late shards would refuse every request after it, for good.
    pub error_window_ms: u64,
    /// The chance q that an admitted plan finishes in time: a plan of k shards is held to the
    /// q^(1/k) quantile of actual over predicted time of shards predicted about as long. The
    /// deadline is judged at the tail (p99), so q is that tail, not hedging's p95: held to p95,
    /// one admitted plan in twenty is late by design, and in an overload that is the p99.
    pub quantile: f64,
    /// A shard that took more than this many times the median actual-over-predicted ratio of the
    /// shards measured just before it was a stall (one call held up while the others of the
    /// moment ran on time), and is left out of the error plans are held to: load does not
    /// predict a stall, so refusing requests does not avoid one (hedging is what answers it).
    /// Queueing makes every shard late at once, the median with them, so it still counts.
    /// 0: every shard counts.
    pub stall_factor: f64,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig { enabled: true, margin: 0.0, error_window_ms: 10_000, quantile: 0.99, stall_factor: 2.0 }
    }
}

/// How workers are ranked for a request's shards (one file per policy in the proxy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Least predicted backlog first (ties: fewer in-flight requests, then random).
    LeastLoaded,
    /// Each pick: the least loaded of `choices` random workers (several proxies don't herd).
    PowerOfTwo,
    Random,
    RoundRobin,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BalanceConfig {
    pub policy: PolicyKind,
    /// Sample size of `power_of_two`.
    pub choices: usize,
    /// Shards a worker computes at full speed concurrently (1 for a compute-bound GPU).
    pub worker_parallelism: f64,
}

impl Default for BalanceConfig {
    fn default() -> Self {
        BalanceConfig { policy: PolicyKind::LeastLoaded, choices: 2, worker_parallelism: 1.0 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryConfig {
    /// Attempts per shard, the first included (1: never retry).
    pub max_attempts: u32,
    /// Retries earned per shard sent (a token bucket, so failures cannot multiply load).
    pub budget_ratio: f64,
    /// Retries always allowed per second, whatever the traffic.
    pub budget_min_per_sec: f64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig { max_attempts: 3, budget_ratio: 0.2, budget_min_per_sec: 10.0 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HedgeConfig {
    pub enabled: bool,
    /// A shard is hedged when it runs past this quantile of (actual / predicted) time.
    pub quantile: f64,
    /// Extra work allowed for hedges, as a fraction of predicted work sent.
    pub budget_ratio: f64,
    /// Never hedge earlier than this after sending.
    pub min_delay_ms: f64,
    /// Multiplier of the predicted time used until `min_samples` shards were measured.
    pub initial_multiplier: f64,
    pub min_samples: usize,
    /// A hedge goes only to a worker with at most this many calls in flight (0: idle).
    pub max_target_in_flight: u64,
}

impl Default for HedgeConfig {
    fn default() -> Self {
        HedgeConfig {
            enabled: true,
            quantile: 0.95,
            budget_ratio: 0.05,
            min_delay_ms: 5.0,
            initial_multiplier: 2.0,
            min_samples: 20,
            max_target_in_flight: 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BreakerConfig {
    /// Consecutive failures that open the breaker.
    pub failure_threshold: u32,
    /// First open period; doubled after each failed half-open probe, up to `max_open_ms`.
    pub open_ms: u64,
    pub max_open_ms: u64,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig { failure_threshold: 5, open_ms: 1000, max_open_ms: 30_000 }
    }
}

/// The proxy's pair-score cache: (model, instruction, query, item) → score, so a repeated pair
/// is answered without a worker. Entries live at most `ttl_ms`; the cache holds at most
/// `max_bytes` (each entry weighed at a fixed estimate of its key, value and bookkeeping) and
/// admits by frequency (TinyLFU), so one-off pairs do not push out the repeated ones. Emptied
/// when the workers report another model. A request opts out with `"cache": false`. A reload
/// applies `enabled`; `max_bytes` and `ttl_ms` take a restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheConfig {
    /// Answer repeated pairs from the cache (default true); false: every pair goes to a worker.
    pub enabled: bool,
    /// Most memory the entries take, in bytes (default 64 MiB); 0 holds nothing.
    pub max_bytes: u64,
    /// An entry is dropped this long after it was stored (default 600,000 ms: ten minutes).
    pub ttl_ms: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig { enabled: true, max_bytes: 64 << 20, ttl_ms: 600_000 }
    }
}

/// The sampled request trace: a JSON line per sampled score request with hashes of its texts,
/// token counts, timestamps and outcome (never any text), rotated at `max_bytes` into
/// `PATH.1` … `PATH.keep`. Read at start-up (a restart applies changes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RequestTraceConfig {
    /// The trace file (appended to); empty (the default): no trace.
    pub path: String,
    /// Fraction of requests traced, in [0, 1] (default 0.01).
    pub sample: f64,
    /// Size of one file before it is rotated, in bytes (default 64 MiB; at least 4096).
    pub max_bytes: u64,
    /// Rotated files kept (default 3): the trace takes at most (keep + 1) x max_bytes.
    pub keep: u32,
}

impl Default for RequestTraceConfig {
    fn default() -> Self {
        RequestTraceConfig { path: String::new(), sample: 0.01, max_bytes: 64 << 20, keep: 3 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthConfig {
    /// Period of `GET /ready` and `GET /stats` on every worker's admin port.
    pub interval_ms: u64,
    pub timeout_ms: u64,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig { interval_ms: 500, timeout_ms: 1000 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientConfig {
    pub connect_timeout_ms: u64,
    /// Idle keep-alive connections to workers are closed after this; keep it below the
    /// workers' `[http] idle_timeout_ms` so the proxy closes them first (no request is sent on
    /// a connection the worker is closing).
    pub pool_idle_timeout_ms: u64,
    /// Idle keep-alive connections kept per worker; a connection freed while this many wait is
    /// closed. 0: none kept.
    pub max_idle_per_worker: usize,
    /// Largest worker response accepted, in bytes.
    pub max_response_bytes: usize,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            connect_timeout_ms: 1000,
            pool_idle_timeout_ms: 45_000,
            max_idle_per_worker: 256,
            max_response_bytes: 64 << 20,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EstimatorConfig {
    /// Learn token counts and compute times from what workers report.
    pub recalibrate: bool,
    /// Per-item forgetting factor of the token estimator (0.9995: ~2,000 items of memory).
    pub token_decay: f64,
    /// Per-shard forgetting factor of the cost model (0.995: ~200 shards of memory).
    pub cost_decay: f64,
    /// Weight of the prior, in samples: how much evidence it takes to move off the defaults.
    pub prior_weight: f64,
    /// Smoothing of each worker's measured speed (weight of the newest shard).
    pub speed_smoothing: f64,
}

impl Default for EstimatorConfig {
    fn default() -> Self {
        EstimatorConfig {
            recalibrate: true,
            token_decay: 0.9995,
            cost_decay: 0.995,
            prior_weight: 5.0,
            speed_smoothing: 0.2,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// How often the config file is checked for changes (the worker list is hot-reloaded).
    pub reload_interval_ms: u64,
    /// DNS names re-resolved periodically; every address is a worker (a Kubernetes headless
    /// Service resolves to one address per ready pod).
    pub dns: Vec<DnsDiscovery>,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        DiscoveryConfig { reload_interval_ms: 1000, dns: Vec::new() }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DnsDiscovery {
    pub name: String,
    /// Worker API port on every resolved address.
    pub port: u16,
    /// Worker admin port on every resolved address (health checks and load reports).
    pub admin_port: u16,
    pub interval_ms: u64,
}

impl Default for DnsDiscovery {
    fn default() -> Self {
        DnsDiscovery { name: String::new(), port: 8081, admin_port: 9081, interval_ms: 5000 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DrainConfig {
    /// On SIGTERM: refuse new requests, wait at most this long for in-flight ones, then exit.
    pub timeout_ms: u64,
}

impl Default for DrainConfig {
    fn default() -> Self {
        DrainConfig { timeout_ms: 30_000 }
    }
}

/// One worker: its API base URL and, optionally, its admin base URL. Without an admin URL the
/// worker gets no active health checks or load reports (passive failure detection only).
///
/// Command-line form: `URL[,admin=URL]`, e.g.
/// `http://127.0.0.1:8081,admin=http://127.0.0.1:9081`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerEndpoint {
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin: Option<String>,
}

impl WorkerEndpoint {
    pub fn new(url: impl Into<String>, admin: Option<String>) -> Self {
        WorkerEndpoint { url: trim_slash(url.into()), admin: admin.map(trim_slash) }
    }

    pub fn validate(&self) -> Result<(), String> {
        check_base_url(&self.url)?;
        if let Some(a) = &self.admin {
            check_base_url(a).map_err(|e| format!("admin: {e}"))?;
        }
        Ok(())
    }
}

fn trim_slash(mut s: String) -> String {
    while s.ends_with('/') {
        s.pop();
    }
    s
}

fn check_base_url(u: &str) -> Result<(), String> {
    let rest = u.strip_prefix("http://").ok_or_else(|| format!("'{u}' is not an http:// URL"))?;
    let authority = rest.split('/').next().unwrap_or("");
    if authority.is_empty() {
        return Err(format!("'{u}' has no host"));
    }
    Ok(())
}

impl FromStr for WorkerEndpoint {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut parts = s.split(',');
        let url = parts.next().unwrap_or("").trim().to_string();
        let mut admin = None;
        for p in parts {
            match p.trim().split_once('=') {
                Some(("admin", v)) => admin = Some(v.trim().to_string()),
                _ => return Err(format!("worker '{s}': unknown option '{p}' (expected URL[,admin=URL])")),
            }
        }
        let w = WorkerEndpoint::new(url, admin);
        w.validate().map_err(|e| format!("worker '{s}': {e}"))?;
        Ok(w)
    }
}

impl fmt::Display for WorkerEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.admin {
            Some(a) => write!(f, "{},admin={a}", self.url),
            None => f.write_str(&self.url),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_file_is_the_default_config() {
        assert_eq!(ProxyConfig::from_toml("").unwrap(), ProxyConfig::default());
    }

    #[test]
    fn the_example_config_is_the_defaults_plus_one_worker() {
        let mut c = ProxyConfig::from_toml(include_str!("../../configs/proxy.toml")).unwrap();
        assert_eq!(c.workers.len(), 1);
        c.workers.clear();
        assert_eq!(c, ProxyConfig::default());
        assert_eq!(c.server.admin_host, "127.0.0.1", "admin stays on loopback unless asked");
        assert!(ProxyConfig::from_toml("[http]\nmax_connections = 0\n").unwrap_err().contains("http.max_connections"));
    }

    #[test]
    fn removed_keys_are_refused_as_removed() {
        let e = ProxyConfig::from_toml("[server]\nport = 8080\napi_threads = 4\n").unwrap_err();
        assert!(e.starts_with("`api_threads` in [server] (line 3) was removed: "), "{e}");
    }

    #[test]
    fn default_config_round_trips() {
        let c = ProxyConfig::default();
        assert_eq!(ProxyConfig::from_toml(&c.to_toml()).unwrap(), c);
    }

    #[test]
    fn typos_and_bad_ranges_are_named() {
        let e = ProxyConfig::from_toml("[hedge]\nquantil = 0.9\n").unwrap_err();
        assert!(e.starts_with("`quantil` in [hedge] (line 2) is not a known setting"), "{e}");
        let e = ProxyConfig::from_toml("[[workers]]\nurl = \"http://h:1\"\nadmn = \"http://h:2\"\n").unwrap_err();
        assert!(e.starts_with("`admn` in [workers] (line 3) is not a known setting"), "{e}");
        let e = ProxyConfig::from_toml("[hedge]\nquantile = 1.5\n").unwrap_err();
        assert!(e.contains("hedge.quantile"), "{e}");
        let e = ProxyConfig::from_toml("[admission]\nstall_factor = 0.5\n").unwrap_err();
        assert!(e.contains("admission.stall_factor"), "{e}");
        assert_eq!(ProxyConfig::from_toml("[admission]\nstall_factor = 0\n").unwrap().admission.stall_factor, 0.0);
        let e = ProxyConfig::from_toml("[[workers]]\nurl = \"localhost:1\"\n").unwrap_err();
        assert!(e.contains("workers[0]"), "{e}");
    }

    /// Values a process would panic on later (a timer past the end of time, a cache TTL moka
    /// refuses, a semaphore too large to count) are refused at load, by name.
    #[test]
    fn values_too_large_to_use_are_refused_by_name() {
        let huge = i64::MAX;
        for (text, name) in [
            (format!("[http]\nmax_connections = {huge}"), "http.max_connections"),
            (format!("[cache]\nttl_ms = {huge}"), "cache.ttl_ms"),
            (format!("[split]\nprefix_holders_ttl_ms = {huge}"), "split.prefix_holders_ttl_ms"),
            (format!("[deadline]\ndefault_ms = {huge}"), "limits.max_deadline_ms"),
            ("[hedge]\nmin_delay_ms = inf".into(), "hedge.min_delay_ms"),
            ("[hedge]\nmin_delay_ms = -1.0".into(), "hedge.min_delay_ms"),
            ("[hedge]\ninitial_multiplier = inf".into(), "hedge.initial_multiplier"),
            ("[hedge]\nbudget_ratio = inf".into(), "hedge.budget_ratio"),
            ("[retry]\nbudget_ratio = nan".into(), "retry.budget_ratio"),
            ("[retry]\nbudget_min_per_sec = inf".into(), "retry.budget_min_per_sec"),
            ("[estimator]\nprior_weight = inf".into(), "estimator.prior_weight"),
            ("[limits]\nmax_items = 0".into(), "limits.max_items"),
        ] {
            let e = ProxyConfig::from_toml(&text).unwrap_err();
            assert!(e.contains(name), "{text}: {e}");
        }
        let at_bounds = format!(
            "[http]\nmax_connections = {}\n[cache]\nttl_ms = {MAX_TTL_MS}\n[deadline]\ndefault_ms = 600000\n",
            HttpConfig::MAX_CONNECTIONS
        );
        ProxyConfig::from_toml(&at_bounds).unwrap();
    }

    #[test]
    fn worker_tables_and_strategies_parse() {
        let c = ProxyConfig::from_toml(
            "[split]\nmode = \"fixed\"\n[balance]\npolicy = \"power_of_two\"\n\
             [[workers]]\nurl = \"http://10.0.0.1:8081/\"\nadmin = \"http://10.0.0.1:9081\"\n\
             [[discovery.dns]]\nname = \"sieve-worker.sieve.svc\"\n",
        )
        .unwrap();
        assert_eq!(c.split.mode, SplitMode::Fixed);
        assert_eq!(c.balance.policy, PolicyKind::PowerOfTwo);
        assert_eq!(c.workers[0].admin.as_deref(), Some("http://10.0.0.1:9081"));
        assert_eq!(c.discovery.dns[0].admin_port, 9081);
    }

    #[test]
    fn worker_command_line_form() {
        let w: WorkerEndpoint = "http://127.0.0.1:8081/,admin=http://127.0.0.1:9081".parse().unwrap();
        assert_eq!(w.url, "http://127.0.0.1:8081");
        assert_eq!(w.admin.as_deref(), Some("http://127.0.0.1:9081"));
        assert_eq!(w.to_string().parse::<WorkerEndpoint>().unwrap(), w);
        let bare: WorkerEndpoint = "http://h:1".parse().unwrap();
        assert_eq!(bare.admin, None);
        assert!("http://h:1,adm=x".parse::<WorkerEndpoint>().unwrap_err().contains("adm=x"));
        assert!("ftp://h:1".parse::<WorkerEndpoint>().is_err());
    }
}
