//! One worker as the proxy sees it: its addresses, its load (shards in flight and their
//! predicted cost, held until the response body is read), what it last reported, its health,
//! its breaker and its measured speed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hyper::Uri;
use serde::Serialize;
use sieve_shared::{CostModel, WorkerEndpoint, WorkerStats};

use crate::cluster::breaker::{Breaker, BreakerState};
use crate::estimate::cost_estimator::update_time_factor;
use sieve_shared::proxy_config::BreakerConfig;
use sieve_shared::sync::lock;

/// Shards a worker's time factor must rest on before its times teach the shared cost model.
const CALIBRATION_SHARDS: u64 = 5;

/// What the active health check last found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    /// Not checked yet (or no admin URL: passive detection only).
    Unknown,
    Ready,
    /// `/ready` answered 503 (loading).
    NotReady,
    /// `/ready` answered 503 or `/stats` says draining: finishing work, taking none.
    Draining,
    /// The admin port did not answer.
    Unreachable,
}

#[derive(Debug, Clone)]
pub struct Reported {
    pub at: Instant,
    pub stats: WorkerStats,
    /// Our own backlog on this worker when the report was taken: the part of the reported
    /// queue that is ours, not another proxy's.
    pub own_backlog_ms: f64,
    pub own_in_flight: u64,
}

#[derive(Debug)]
pub struct WorkerState {
    pub health: Health,
    pub health_detail: Option<String>,
    pub last_check: Option<Instant>,
    /// The worker refused a shard with 503 (draining, loading): no shards until this time or
    /// until a health check finds it ready.
    pub refused_until: Option<Instant>,
    pub breaker: Breaker,
    /// Measured compute time over the cost model's prediction (1 = the model's worker).
    pub time_factor: f64,
    /// Shards the time factor was measured on.
    pub time_samples: u64,
    pub reported: Option<Reported>,
    pub last_error: Option<String>,
    /// Each shard in flight here (by [`InFlightGuard`] id) and when it was due: sent plus our
    /// whole backlog here then, its own compute included. A worker still holding a shard past
    /// that is late by the difference, and its view says so ([`Worker::view`]).
    due: Vec<(u64, Instant)>,
    next_guard: u64,
}

#[derive(Debug, Default)]
pub struct WorkerCounters {
    pub shards: AtomicU64,
    pub items: AtomicU64,
    pub successes: AtomicU64,
    pub failures: AtomicU64,
    pub hedges: AtomicU64,
    pub retries: AtomicU64,
    /// Breaker transitions by new state (`BreakerState::index`).
    breaker_transitions: [AtomicU64; 3],
}

impl WorkerCounters {
    pub fn note_breaker(&self, to: BreakerState) {
        self.breaker_transitions[to.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub fn breaker_transitions(&self, to: BreakerState) -> u64 {
        self.breaker_transitions[to.index()].load(Ordering::Relaxed)
    }
}

#[derive(Debug)]
pub struct Worker {
    pub endpoint: WorkerEndpoint,
    pub score_uri: Uri,
    pub ready_uri: Option<Uri>,
    pub stats_uri: Option<Uri>,
    in_flight: AtomicU64,
    in_flight_cost_us: AtomicU64,
    /// Bumped when the worker may have lost its prefix cache (restart, model or template
    /// change): what the proxy learnt of the prefixes it held before is void
    /// (`crate::prefix_holders`).
    prefix_generation: AtomicU64,
    /// The digest of its URL: how `crate::prefix_holders` names it.
    prefix_key: u64,
    /// One of its answers showed a prefix-cache hit since the last generation bump: it has a
    /// prefix cache worth routing to (a worker without one never reports a cached token).
    prefix_cache_seen: AtomicBool,
    pub counters: WorkerCounters,
    state: Mutex<WorkerState>,
}

/// The load and capacity figures balancing decisions are made on, taken once per request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkerView {
    /// Predicted time until the work already sent to it is done (ours and, from its reports,
    /// other proxies'), divided by the worker's parallelism.
    pub backlog_ms: f64,
    pub in_flight: u64,
    pub time_factor: f64,
    /// Shard token limit; 0: none.
    pub max_batch_tokens: u64,
    /// The worker holds this request's shared prefix in its prefix cache, as far as the proxy
    /// knows (set per request by the plan when `[split] prefix_affinity` is on; false here).
    pub holds_prefix: bool,
}

/// Holds one shard's load on a worker; dropped when the response body has been read (or the
/// attempt was cancelled).
#[derive(Debug)]
pub struct InFlightGuard {
    worker: Arc<Worker>,
    cost_us: u64,
    id: u64,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.worker.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.worker.in_flight_cost_us.fetch_sub(self.cost_us, Ordering::Relaxed);
        let mut st = self.worker.state();
        if let Some(i) = st.due.iter().position(|&(id, _)| id == self.id) {
            st.due.swap_remove(i);
        }
    }
}

/// Tuning that `view` needs from the config.
#[derive(Debug, Clone, Copy)]
pub struct ViewParams {
    pub health_interval: Duration,
    pub parallelism: f64,
    pub default_max_batch_tokens: u64,
}

impl Worker {
    pub fn new(endpoint: WorkerEndpoint, breaker: BreakerConfig) -> Result<Worker, String> {
        let uri = |base: &str, path: &str| -> Result<Uri, String> {
            format!("{base}{path}").parse::<Uri>().map_err(|e| format!("{base}: {e}"))
        };
        let score_uri = uri(&endpoint.url, "/v1/score")?;
        let (ready_uri, stats_uri) = match &endpoint.admin {
            Some(a) => (Some(uri(a, "/ready")?), Some(uri(a, "/stats")?)),
            None => (None, None),
        };
        let prefix_key = xxhash_rust::xxh3::xxh3_64(endpoint.url.as_bytes());
        Ok(Worker {
            endpoint,
            score_uri,
            ready_uri,
            stats_uri,
            in_flight: AtomicU64::new(0),
            in_flight_cost_us: AtomicU64::new(0),
            prefix_generation: AtomicU64::new(0),
            prefix_key,
            prefix_cache_seen: AtomicBool::new(false),
            counters: WorkerCounters::default(),
            state: Mutex::new(WorkerState {
                health: Health::Unknown,
                health_detail: None,
                last_check: None,
                refused_until: None,
                breaker: Breaker::new(breaker),
                time_factor: 1.0,
                time_samples: 0,
                reported: None,
                last_error: None,
                due: Vec::new(),
                next_guard: 0,
            }),
        })
    }

    pub fn url(&self) -> &str {
        &self.endpoint.url
    }

    pub fn state(&self) -> MutexGuard<'_, WorkerState> {
        lock(&self.state)
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn own_backlog_ms(&self) -> f64 {
        self.in_flight_cost_us.load(Ordering::Relaxed) as f64 / 1e3
    }

    /// Counts a shard as in flight on this worker with its predicted compute time.
    pub fn begin(self: &Arc<Self>, predicted_ms: f64) -> InFlightGuard {
        let cost_us = (predicted_ms.max(0.0) * 1e3) as u64;
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        let backlog_us = self.in_flight_cost_us.fetch_add(cost_us, Ordering::Relaxed) + cost_us;
        let mut st = self.state();
        let id = st.next_guard;
        st.next_guard += 1;
        st.due.push((id, Instant::now() + Duration::from_micros(backlog_us)));
        InFlightGuard { worker: self.clone(), cost_us, id }
    }

    /// How long past its due time the most overdue shard in flight here is (0 when none is).
    fn overdue_ms(st: &WorkerState, now: Instant) -> f64 {
        let due = st.due.iter().map(|&(_, due)| due).min();
        due.map_or(0.0, |due| now.saturating_duration_since(due).as_secs_f64() * 1e3)
    }

    /// Whether a new shard may go to this worker now.
    pub fn is_eligible(&self, now: Instant) -> bool {
        let st = self.state();
        let healthy = match st.health {
            Health::Ready => true,
            // Without an admin URL there is nothing to check: passive detection only.
            Health::Unknown => self.ready_uri.is_none(),
            Health::NotReady | Health::Draining | Health::Unreachable => false,
        };
        healthy && st.refused_until.is_none_or(|t| now >= t) && st.breaker.allows(now, self.in_flight() == 0)
    }

    pub fn view(&self, now: Instant, model: &CostModel, p: &ViewParams) -> WorkerView {
        let own_backlog = self.own_backlog_ms();
        let own_in_flight = self.in_flight();
        let st = self.state();
        let tf = st.time_factor;
        let (mut backlog, mut in_flight, mut max_batch) = (own_backlog, own_in_flight, p.default_max_batch_tokens);
        if let Some(r) = &st.reported {
            if r.stats.max_batch_tokens > 0 {
                max_batch = r.stats.max_batch_tokens;
            }
            // Reports age: trust them less until the next one (two periods and they are gone).
            let horizon = 2.0 * p.health_interval.as_secs_f64();
            let weight = (1.0 - now.saturating_duration_since(r.at).as_secs_f64() / horizon).max(0.0);
            if weight > 0.0 {
                let reported_ms = (r.stats.queued_tokens as f64 * model.token_ms
                    + r.stats.in_flight_requests as f64 * model.request_ms)
                    * tf;
                backlog += (reported_ms - r.own_backlog_ms).max(0.0) * weight;
                let others = r.stats.in_flight_requests.saturating_sub(r.own_in_flight) as f64;
                in_flight += (others * weight).round() as u64;
            }
        }
        // A stall is charged to its worker: still holding a shard this late, it is taken to stay
        // busy at least as long again (a frozen worker's backlog grows while it is frozen), so
        // new shards go elsewhere and plans that would use it are predicted late, while the
        // cluster's error ([`crate::request::admission`]) leaves the stall out.
        WorkerView {
            backlog_ms: backlog / p.parallelism + Self::overdue_ms(&st, now),
            in_flight,
            time_factor: tf,
            max_batch_tokens: max_batch,
            holds_prefix: false,
        }
    }

    pub fn on_success(&self, now: Instant) -> Option<BreakerState> {
        self.counters.successes.fetch_add(1, Ordering::Relaxed);
        let mut st = self.state();
        st.refused_until = None;
        st.breaker.on_success(now)
    }

    /// A failure that says something about the worker's health (connection lost, 500).
    pub fn on_failure(&self, now: Instant, error: String) -> Option<BreakerState> {
        self.counters.failures.fetch_add(1, Ordering::Relaxed);
        let mut st = self.state();
        st.last_error = Some(error);
        st.breaker.on_failure(now)
    }

    /// The worker answered 503 (draining, loading): send nothing until `until` or until a
    /// health check finds it ready.
    pub fn on_refused(&self, until: Instant, why: String) {
        let mut st = self.state();
        st.refused_until = Some(until);
        st.last_error = Some(why);
    }

    pub fn observe_compute(&self, actual_ms: f64, predicted_ms: f64, smoothing: f64) {
        let mut st = self.state();
        st.time_factor = update_time_factor(st.time_factor, actual_ms, predicted_ms, smoothing);
        st.time_samples += 1;
    }

    /// The longest prompt it takes, in tokens (`max_seq_tokens` of its last report).
    pub fn max_seq_tokens(&self) -> Option<u64> {
        self.state().reported.as_ref().map(|r| r.stats.max_seq_tokens).filter(|&n| n > 0)
    }

    pub fn time_factor(&self) -> f64 {
        self.state().time_factor
    }

    /// The time factor once it rests on enough shards to be trusted.
    pub fn calibrated_time_factor(&self) -> Option<f64> {
        let st = self.state();
        (st.time_samples >= CALIBRATION_SHARDS).then_some(st.time_factor)
    }

    /// The digest of its URL, computed once: how the prefix holders name it.
    pub fn prefix_key(&self) -> u64 {
        self.prefix_key
    }

    /// The prefix-cache generation: bumped whenever the worker may have lost its prefix cache.
    pub fn prefix_generation(&self) -> u64 {
        self.prefix_generation.load(Ordering::Relaxed)
    }

    /// Voids what the proxy learnt of the prefixes this worker holds, and whether it has a
    /// prefix cache at all.
    pub fn forget_prefixes(&self) {
        self.prefix_generation.fetch_add(1, Ordering::Relaxed);
        self.prefix_cache_seen.store(false, Ordering::Relaxed);
    }

    /// One of its answers came (partly) from its prefix cache.
    pub fn note_prefix_hit(&self) {
        self.prefix_cache_seen.store(true, Ordering::Relaxed);
    }

    /// Whether its answers have shown a prefix cache (since the last [`Self::forget_prefixes`]).
    pub fn has_prefix_cache(&self) -> bool {
        self.prefix_cache_seen.load(Ordering::Relaxed)
    }

    /// Records a health check: the `/ready` verdict and, when it answered, `/stats`. A worker
    /// that came back (from unreachable or loading), or reports another model or template, or
    /// fewer requests processed than before (a restart between two checks) has lost its
    /// prefix cache: what the proxy learnt of it is forgotten.
    pub fn record_health(&self, now: Instant, health: Health, detail: Option<String>, stats: Option<WorkerStats>) {
        let own_backlog_ms = self.own_backlog_ms();
        let own_in_flight = self.in_flight();
        let mut st = self.state();
        let came_back = health == Health::Ready && matches!(st.health, Health::Unreachable | Health::NotReady);
        let restarted = match (&st.reported, &stats) {
            (Some(before), Some(now)) => {
                now.requests_processed < before.stats.requests_processed
                    || now.model != before.stats.model
                    || now.template != before.stats.template
            }
            _ => false,
        };
        if came_back || restarted {
            self.forget_prefixes();
        }
        st.health = health;
        st.health_detail = detail;
        st.last_check = Some(now);
        if health == Health::Ready {
            st.refused_until = None;
        }
        if let Some(stats) = stats {
            st.reported = Some(Reported { at: now, stats, own_backlog_ms, own_in_flight });
        }
    }

    pub fn breaker_state(&self, now: Instant) -> BreakerState {
        self.state().breaker.state(now)
    }

    /// A row of the admin `/workers` table.
    pub fn describe(&self, now: Instant, model: &CostModel, p: &ViewParams) -> WorkerRow {
        let view = self.view(now, model, p);
        let eligible = self.is_eligible(now);
        let st = self.state();
        WorkerRow {
            url: self.endpoint.url.clone(),
            admin: self.endpoint.admin.clone(),
            eligible,
            health: st.health,
            health_detail: st.health_detail.clone(),
            last_check_ms_ago: st.last_check.map(|t| now.saturating_duration_since(t).as_secs_f64() * 1e3),
            breaker: st.breaker.state(now),
            consecutive_failures: st.breaker.consecutive_failures(),
            in_flight_shards: self.in_flight(),
            in_flight_predicted_ms: self.own_backlog_ms(),
            backlog_ms: view.backlog_ms,
            time_factor: st.time_factor,
            max_batch_tokens: view.max_batch_tokens,
            reported: st.reported.as_ref().map(|r| r.stats.clone()),
            shards: self.counters.shards.load(Ordering::Relaxed),
            items: self.counters.items.load(Ordering::Relaxed),
            successes: self.counters.successes.load(Ordering::Relaxed),
            failures: self.counters.failures.load(Ordering::Relaxed),
            hedges: self.counters.hedges.load(Ordering::Relaxed),
            retries: self.counters.retries.load(Ordering::Relaxed),
            last_error: st.last_error.clone(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct WorkerRow {
    pub url: String,
    pub admin: Option<String>,
    pub eligible: bool,
    pub health: Health,
    pub health_detail: Option<String>,
    pub last_check_ms_ago: Option<f64>,
    pub breaker: BreakerState,
    pub consecutive_failures: u32,
    pub in_flight_shards: u64,
    pub in_flight_predicted_ms: f64,
    pub backlog_ms: f64,
    pub time_factor: f64,
    pub max_batch_tokens: u64,
    pub reported: Option<WorkerStats>,
    pub shards: u64,
    pub items: u64,
    pub successes: u64,
    pub failures: u64,
    pub hedges: u64,
    pub retries: u64,
    pub last_error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> ViewParams {
        ViewParams { health_interval: Duration::from_millis(500), parallelism: 1.0, default_max_batch_tokens: 0 }
    }

    #[test]
    fn load_is_held_until_the_guard_drops_and_blends_reports() {
        let w = Arc::new(
            Worker::new(
                WorkerEndpoint::new("http://127.0.0.1:1", Some("http://127.0.0.1:2".into())),
                BreakerConfig::default(),
            )
            .unwrap(),
        );
        let model = CostModel { request_ms: 1.0, token_ms: 0.01, token_context_ms: 0.0 };
        let now = Instant::now();
        assert!(!w.is_eligible(now), "not ready until checked");
        w.record_health(now, Health::Ready, None, None);
        assert!(w.is_eligible(now));
        let g = w.begin(40.0);
        assert_eq!(w.view(now, &model, &params()).backlog_ms, 40.0);
        // Another proxy has 1,000 tokens queued there besides our 40 ms.
        let stats = WorkerStats { queued_tokens: 1000, in_flight_requests: 2, ..WorkerStats::default() };
        w.record_health(now, Health::Ready, None, Some(stats));
        let v = w.view(now, &model, &params());
        // reported: 1000 × 0.01 + 2 × 1 = 12 ms < our 40 ms: nothing extra.
        assert_eq!(v.backlog_ms, 40.0);
        drop(g);
        let stats = WorkerStats { queued_tokens: 10_000, in_flight_requests: 3, ..WorkerStats::default() };
        w.record_health(now, Health::Ready, None, Some(stats));
        let v = w.view(now, &model, &params());
        assert!((v.backlog_ms - 103.0).abs() < 1e-9, "{v:?}");
        assert_eq!(v.in_flight, 3);
        // Half a period later the report counts three quarters.
        let later = now + Duration::from_millis(250);
        assert!((w.view(later, &model, &params()).backlog_ms - 103.0 * 0.75).abs() < 1e-9);
        w.on_refused(now + Duration::from_secs(1), "draining".into());
        assert!(!w.is_eligible(now));
        w.record_health(now, Health::Ready, None, None);
        assert!(w.is_eligible(now), "a ready health check clears a refusal");
    }

    #[test]
    fn a_shard_held_past_its_due_time_charges_its_worker() {
        let w =
            Arc::new(Worker::new(WorkerEndpoint::new("http://127.0.0.1:1", None), BreakerConfig::default()).unwrap());
        let model = CostModel { request_ms: 1.0, token_ms: 0.01, token_context_ms: 0.0 };
        let first = w.begin(40.0);
        let second = w.begin(60.0);
        let now = Instant::now();
        // On time: the backlog is the predicted work.
        assert!((w.view(now, &model, &params()).backlog_ms - 100.0).abs() < 1.0);
        // Queued behind the first, the second is due at 100 ms, the first at 40: at 340 ms the
        // worker is 300 ms late, and that is added to its backlog.
        let late = now + Duration::from_millis(340);
        let v = w.view(late, &model, &params());
        assert!((v.backlog_ms - 400.0).abs() < 2.0, "{v:?}");
        drop(first);
        // The second was due at 100 ms: 240 ms late, on 60 ms of backlog.
        let v = w.view(late, &model, &params());
        assert!((v.backlog_ms - 300.0).abs() < 2.0, "{v:?}");
        drop(second);
        assert_eq!(w.view(late, &model, &params()).backlog_ms, 0.0, "answered: nothing is charged");
    }
}
