//! What a simulated worker is: its cost model, speed, batch slots, noise and injected faults.

use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sieve_shared::grpc_config::GrpcConfig;
use sieve_shared::http_config::{AdminConfig, HttpConfig};
use sieve_shared::{CostModel, Limits};

#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// Reported in responses and `/stats`.
    pub model: String,
    /// The template identity reported in responses and `/stats` (a real worker's is a digest of
    /// its prompt template and score head): the proxy's pair cache keys on it with the model.
    pub template: String,
    /// Compute time of a call at speed 1 (prefix once per call, then every item).
    pub cost: CostModel,
    /// Throughput multiplier: 2 computes twice as fast.
    pub speed: f64,
    /// Calls computed at once; more wait in a FIFO queue (a GPU's batch slots).
    pub slots: usize,
    /// Log-normal noise on compute time: sigma of ln(time), mean kept at 1.
    pub jitter: f64,
    /// Fraction of calls that fail with 500 part-way through their compute.
    pub fail_rate: f64,
    /// Scheduled slowdowns, relative to start-up.
    pub slowdowns: Vec<Slowdown>,
    /// Rare heavy-tailed pauses added to a call's compute (GC, throttling, a noisy neighbour).
    pub stall: Stall,
    /// Seed of the noise and failure draws.
    pub seed: u64,
    /// Calls waiting for a slot beyond which new calls get 429; 0: unbounded.
    pub max_queue: usize,
    /// Reported in `/stats`; a call over it is computed as several passes (no error).
    pub max_batch_tokens: u64,
    /// Longest prompt accepted, in simulated tokens; longer items get 413.
    pub max_seq_tokens: u64,
    /// Preparation before a call queues for a slot, as a real worker tokenizes on its scheduler
    /// thread (ms of simulated time: per call, and per item): it counts in `queue_ms`, not in
    /// `compute_ms`, and holds no slot, so the proxy's cost model (fitted on compute time) does
    /// not see it, as it does not see a real worker's tokenizing and HTTP. 0 by default.
    pub prepare_ms: f64,
    pub prepare_ms_per_item: f64,
    /// Prefix-cache capacity in 16-token blocks (an LRU, [`super::prefix`]): a call whose
    /// prefix is held pays no compute for it and reports `cached_prefix_tokens`; 0: no cache
    /// (every prefix computed, the default).
    pub prefix_cache_blocks: usize,
    pub limits: Limits,
    /// The model names a request may give and the CORS origins (`[api]`, as the worker's).
    pub api: sieve_shared::ApiConfig,
    /// Transport timeouts and the connection cap of both ports (`[http]`, as the worker's).
    pub http: HttpConfig,
    /// The gRPC API port on the API's host (`[grpc]`, as the worker's; off unless `port` is set).
    pub grpc: GrpcConfig,
    /// Address of the admin port (the API's is given to [`super::SimWorker::start`]).
    pub admin_host: String,
    /// Who may use the admin routes: `PUT /sim` needs the token (`[admin]`, as the worker's).
    pub admin: AdminConfig,
    /// A graceful shutdown (SIGTERM) ends within this, whatever the clients do.
    pub drain_timeout_ms: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            model: "sim".into(),
            template: "sim-template-v1".into(),
            cost: CostModel::default(),
            speed: 1.0,
            slots: 1,
            jitter: 0.0,
            fail_rate: 0.0,
            slowdowns: Vec::new(),
            stall: Stall::default(),
            seed: 0,
            max_queue: 0,
            max_batch_tokens: 32_768,
            max_seq_tokens: 8192,
            prepare_ms: 0.0,
            prepare_ms_per_item: 0.0,
            prefix_cache_blocks: 0,
            limits: Limits::default(),
            api: sieve_shared::ApiConfig::default(),
            http: HttpConfig::default(),
            grpc: GrpcConfig::default(),
            admin_host: "127.0.0.1".into(),
            admin: AdminConfig::default(),
            drain_timeout_ms: 30_000,
        }
    }
}

/// The most calls a simulated worker computes at once (its semaphore counts far more; no GPU
/// worker runs this many).
pub const MAX_SLOTS: usize = 1 << 20;

impl SimConfig {
    pub fn validate(&self) -> Result<(), String> {
        self.cost.validate()?;
        if !(self.speed.is_finite() && self.speed > 0.0) {
            return Err(format!("speed must be positive, got {}", self.speed));
        }
        if !(1..=MAX_SLOTS).contains(&self.slots) {
            return Err(format!("slots must be in 1..={MAX_SLOTS}, got {}", self.slots));
        }
        if !(self.jitter.is_finite() && self.jitter >= 0.0) {
            return Err(format!("jitter must be >= 0, got {}", self.jitter));
        }
        for (name, v) in [("prepare-ms", self.prepare_ms), ("prepare-ms-per-item", self.prepare_ms_per_item)] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{name} must be >= 0, got {v}"));
            }
        }
        if !(0.0..=1.0).contains(&self.fail_rate) {
            return Err(format!("fail-rate must be in [0, 1], got {}", self.fail_rate));
        }
        self.stall.validate()?;
        self.limits.validate()?;
        self.grpc.validate()?;
        self.http.validate()
    }
}

/// The sim-worker's optional config file (`sieve-loadtest sim-worker --config FILE`): the
/// transport and admin sections, with the worker's names and defaults. Every key is optional.
///
/// ```toml
/// [api]
/// model_aliases = []     # other names a request's `model` may give for "sim"
///
/// [http]
/// header_read_timeout_ms = 10000
/// body_read_timeout_ms = 10000
/// idle_timeout_ms = 60000
/// max_connections = 4096
/// max_header_bytes = 65536
///
/// [grpc]
/// port = 50052           # absent = no gRPC port
///
/// [admin]
/// token_file = ""        # "" = read env SIEVE_ADMIN_TOKEN; PUT /sim needs the token
/// protect_reads = false
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimFileConfig {
    pub api: sieve_shared::ApiConfig,
    pub http: HttpConfig,
    pub grpc: GrpcConfig,
    pub admin: AdminConfig,
    /// Span export over OTLP, as the worker's (off by default).
    pub tracing: sieve_shared::trace_config::TracingConfig,
    /// The log format, as the worker's.
    pub log: sieve_shared::trace_config::LogConfig,
}

impl SimFileConfig {
    pub fn parse(text: &str) -> Result<Self, String> {
        let c: SimFileConfig = sieve_shared::config_file::parse(text, &[])?;
        c.http.validate()?;
        c.grpc.validate()?;
        c.tracing.validate()?;
        Ok(c)
    }
}

/// Compute time multiplied by `factor` from `start` after start-up, for `duration` (or for
/// ever). Command-line form: `FACTOR[@START_S[+DURATION_S]]`, e.g. `3`, `3@10`, `3@10+5`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slowdown {
    pub factor: f64,
    pub start: Duration,
    pub duration: Option<Duration>,
}

impl Slowdown {
    pub fn factor_at(&self, since_start: Duration) -> f64 {
        let active = since_start >= self.start && self.duration.is_none_or(|d| since_start < self.start + d);
        if active {
            self.factor
        } else {
            1.0
        }
    }
}

impl FromStr for Slowdown {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |what: &str| format!("slowdown '{s}': {what} (expected FACTOR[@START_S[+DURATION_S]])");
        let (factor, when) = match s.split_once('@') {
            Some((f, w)) => (f, Some(w)),
            None => (s, None),
        };
        let factor: f64 = factor.trim().parse().map_err(|_| bad("bad factor"))?;
        if !(factor.is_finite() && factor > 0.0) {
            return Err(bad("factor must be positive"));
        }
        let secs = |t: &str| -> Result<Duration, String> {
            let v: f64 = t.trim().parse().map_err(|_| bad("bad time"))?;
            if !(v.is_finite() && v >= 0.0) {
                return Err(bad("times must be >= 0"));
            }
            Ok(Duration::from_secs_f64(v))
        };
        let (start, duration) = match when {
            None => (Duration::ZERO, None),
            Some(w) => match w.split_once('+') {
                Some((st, d)) => (secs(st)?, Some(secs(d)?)),
                None => (secs(w)?, None),
            },
        };
        Ok(Slowdown { factor, start, duration })
    }
}

/// A stall: with probability `rate` per call, the call's compute is held up by a pause drawn
/// from a Pareto distribution (minimum `min_ms`, shape `alpha`: the smaller, the heavier the
/// tail; alpha <= 1 has no finite mean), capped at `max_ms`. Pauses are in simulated time (the
/// worker's `speed` stretches them as it stretches compute). Drawn from the worker's seeded
/// generator, so a seed gives the same stalls; `rate` 0 draws nothing (other draws unchanged).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Stall {
    pub rate: f64,
    pub min_ms: f64,
    pub alpha: f64,
    pub max_ms: f64,
}

impl Default for Stall {
    fn default() -> Self {
        Stall { rate: 0.0, min_ms: 50.0, alpha: 1.5, max_ms: 2000.0 }
    }
}

impl Stall {
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.rate) {
            return Err(format!("stall rate must be in [0, 1], got {}", self.rate));
        }
        if !(self.min_ms.is_finite() && self.min_ms >= 0.0) {
            return Err(format!("stall min_ms must be >= 0, got {}", self.min_ms));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(format!("stall alpha must be positive, got {}", self.alpha));
        }
        if !(self.max_ms.is_finite() && self.max_ms >= self.min_ms) {
            return Err(format!("stall max_ms must be >= min_ms ({}), got {}", self.min_ms, self.max_ms));
        }
        Ok(())
    }

    /// The pause of one call, in simulated ms (0: no stall).
    pub fn draw<R: rand::Rng + ?Sized>(&self, rng: &mut R) -> f64 {
        if self.rate <= 0.0 || rng.random::<f64>() >= self.rate {
            return 0.0;
        }
        // Inverse CDF of the Pareto: u in (0, 1] gives min_ms * u^(-1/alpha) >= min_ms.
        let u = 1.0 - rng.random::<f64>();
        (self.min_ms * u.powf(-1.0 / self.alpha)).min(self.max_ms)
    }
}

/// The settings that can be changed while running (`PUT /sim` on the admin port).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SimSettings {
    pub speed: f64,
    pub jitter: f64,
    pub fail_rate: f64,
    /// Extra compute-time multiplier on top of the scheduled slowdowns.
    pub slowdown: f64,
    #[serde(default)]
    pub stall: Stall,
}

/// A partial update of [`SimSettings`]; absent fields are left alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimSettingsUpdate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_rate: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slowdown: Option<f64>,
    /// The whole stall model (`{"rate": .., "min_ms": .., "alpha": .., "max_ms": ..}`; absent
    /// keys take [`Stall`]'s defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall: Option<Stall>,
}

impl SimSettings {
    pub fn apply(&self, u: &SimSettingsUpdate) -> Result<SimSettings, String> {
        let next = SimSettings {
            speed: u.speed.unwrap_or(self.speed),
            jitter: u.jitter.unwrap_or(self.jitter),
            fail_rate: u.fail_rate.unwrap_or(self.fail_rate),
            slowdown: u.slowdown.unwrap_or(self.slowdown),
            stall: u.stall.unwrap_or(self.stall),
        };
        next.stall.validate()?;
        if !(next.speed.is_finite() && next.speed > 0.0) {
            return Err(format!("speed must be positive, got {}", next.speed));
        }
        if !(next.jitter.is_finite() && next.jitter >= 0.0) {
            return Err(format!("jitter must be >= 0, got {}", next.jitter));
        }
        if !(0.0..=1.0).contains(&next.fail_rate) {
            return Err(format!("fail_rate must be in [0, 1], got {}", next.fail_rate));
        }
        if !(next.slowdown.is_finite() && next.slowdown > 0.0) {
            return Err(format!("slowdown must be positive, got {}", next.slowdown));
        }
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slowdown_forms() {
        let s: Slowdown = "3".parse().unwrap();
        assert_eq!(s.factor_at(Duration::from_secs(1000)), 3.0);
        let s: Slowdown = "2.5@10".parse().unwrap();
        assert_eq!(s.factor_at(Duration::from_secs(9)), 1.0);
        assert_eq!(s.factor_at(Duration::from_secs(10)), 2.5);
        let s: Slowdown = "4@1+0.5".parse().unwrap();
        assert_eq!(s.factor_at(Duration::from_millis(1200)), 4.0);
        assert_eq!(s.factor_at(Duration::from_millis(1600)), 1.0);
        assert!("x".parse::<Slowdown>().unwrap_err().contains("FACTOR"));
        assert!("0".parse::<Slowdown>().is_err());
        assert!("2@-1".parse::<Slowdown>().is_err());
    }

    #[test]
    fn the_file_config_has_the_workers_sections_and_defaults() {
        assert_eq!(SimFileConfig::parse("").unwrap(), SimFileConfig::default());
        let c = SimFileConfig::parse("[http]\nidle_timeout_ms = 5\n[admin]\nprotect_reads = true\n").unwrap();
        assert_eq!((c.http.idle_timeout_ms, c.admin.protect_reads), (5, true));
        assert!(SimFileConfig::parse("[http]\nmax_connections = 0\n").unwrap_err().contains("max_connections"));
        assert!(SimFileConfig::parse("[server]\nport = 1\n").is_err());
        SimConfig::default().validate().unwrap();
        for slots in [0, MAX_SLOTS + 1] {
            let e = SimConfig { slots, ..SimConfig::default() }.validate().unwrap_err();
            assert!(e.starts_with("slots must be in 1..="), "{e}");
        }
        let e = SimConfig { limits: Limits { max_items: 0, ..Limits::default() }, ..SimConfig::default() };
        assert!(e.validate().unwrap_err().contains("limits.max_items"));
    }

    #[test]
    fn settings_updates_are_checked() {
        let s = SimSettings { speed: 1.0, jitter: 0.0, fail_rate: 0.0, slowdown: 1.0, stall: Stall::default() };
        let n = s.apply(&SimSettingsUpdate { fail_rate: Some(0.5), ..Default::default() }).unwrap();
        assert_eq!(n.fail_rate, 0.5);
        assert_eq!(n.speed, 1.0);
        assert!(s.apply(&SimSettingsUpdate { speed: Some(0.0), ..Default::default() }).is_err());
        let stall = Stall { rate: 0.1, ..Stall::default() };
        assert_eq!(s.apply(&SimSettingsUpdate { stall: Some(stall), ..Default::default() }).unwrap().stall, stall);
        for bad in [
            Stall { rate: 1.5, ..stall },
            Stall { alpha: 0.0, ..stall },
            Stall { min_ms: -1.0, ..stall },
            Stall { max_ms: 10.0, ..stall },
        ] {
            let e = s.apply(&SimSettingsUpdate { stall: Some(bad), ..Default::default() }).unwrap_err();
            assert!(e.contains("stall"), "{e}");
        }
        let u: SimSettingsUpdate = serde_json::from_str(r#"{"stall": {"rate": 0.2}}"#).unwrap();
        assert_eq!(u.stall, Some(Stall { rate: 0.2, ..Stall::default() }));
    }

    #[test]
    fn stalls_are_pareto_capped_and_seeded() {
        use rand::rngs::StdRng;
        use rand::SeedableRng;
        let st = Stall { rate: 0.25, min_ms: 10.0, alpha: 1.5, max_ms: 1000.0 };
        let draws = |seed: u64| {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..40_000).map(|_| st.draw(&mut rng)).collect::<Vec<f64>>()
        };
        let d = draws(3);
        assert_eq!(d, draws(3), "the same seed, the same stalls");
        assert_ne!(d, draws(4));
        let stalls: Vec<f64> = d.iter().copied().filter(|&x| x > 0.0).collect();
        let rate = stalls.len() as f64 / d.len() as f64;
        assert!((rate - 0.25).abs() < 0.01, "stall rate {rate}");
        assert!(stalls.iter().all(|&x| (10.0..=1000.0).contains(&x)));
        // Pareto tail: P(X > x) = (min / x)^alpha, below the cap.
        for x in [20.0, 50.0, 200.0] {
            let p = stalls.iter().filter(|&&v| v > x).count() as f64 / stalls.len() as f64;
            let want = (10.0f64 / x).powf(1.5);
            assert!((p - want).abs() < 0.01 + 0.1 * want, "P(X > {x}) = {p}, Pareto {want}");
        }
        let capped = stalls.iter().filter(|&&v| v == 1000.0).count() as f64 / stalls.len() as f64;
        assert!((capped - 0.01f64.powf(1.5)).abs() < 0.002, "the cap holds the tail: {capped}");
        // Rate 0 draws nothing, so the rest of a worker's random stream is unchanged.
        let mut a = StdRng::seed_from_u64(1);
        let mut b = StdRng::seed_from_u64(1);
        assert_eq!(Stall::default().draw(&mut a), 0.0);
        assert_eq!(rand::Rng::random::<u64>(&mut a), rand::Rng::random::<u64>(&mut b));
    }
}
