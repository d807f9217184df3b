//! The simulated engine: validates a call like the worker, waits for a batch slot (FIFO),
//! "computes" for the cost model's time (scaled by speed, slowdowns and jitter), honours the
//! deadline like the worker (work that cannot finish in time is dropped with 504), injects
//! failures part-way through compute, and answers with deterministic scores. Items of a call
//! that begin alike compute their shared run once, as the worker's item prefix sharing does
//! (the same grouping rule as the proxy's split, `sieve_shared::item_runs`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, StandardNormal};
use sieve_server::http::ByteBudget;
use sieve_shared::item_runs::{leading_runs, ItemRun, DEFAULT_MIN_RUN_TOKENS};
use sieve_shared::metrics_names::sim as names;
use sieve_shared::{ApiError, CostFeatures, ScoreRequest, ScoreResponse, Timing, Usage, WorkerStats};
use tokio::sync::Semaphore;
// Tokio's clock, so tests can run with time paused.
use tokio::time::Instant;

use super::config::{SimConfig, SimSettings, SimSettingsUpdate};
use super::prefix::{PrefixBlocks, PrefixCache};
use super::{scores, tokens};

pub struct SimEngine {
    config: SimConfig,
    settings: Mutex<SimSettings>,
    slots: Semaphore,
    rng: Mutex<StdRng>,
    started: Instant,
    ready: AtomicBool,
    draining: AtomicBool,
    counters: Counters,
    prefix_cache: PrefixCache,
    /// Request bytes held in memory (`[http] max_buffered_bytes`), its API and gRPC ports.
    buffer_budget: ByteBudget,
}

/// Live and cumulative counts, read by `/stats`, `/metrics` and tests.
#[derive(Default)]
pub struct Counters {
    pub in_flight: AtomicU64,
    pub waiting: AtomicU64,
    pub queued_pairs: AtomicU64,
    pub queued_tokens: AtomicU64,
    pub requests: AtomicU64,
    pub completed: AtomicU64,
    pub pairs: AtomicU64,
    pub tokens: AtomicU64,
    pub failures_injected: AtomicU64,
    pub deadline_drops: AtomicU64,
    pub rejected: AtomicU64,
    pub cancelled: AtomicU64,
    /// Calls held up by a stall (see [`super::config::Stall`]).
    pub stalls: AtomicU64,
    /// Slot time of finished computes (completed, failed, dropped or cancelled), in µs.
    pub busy_us: AtomicU64,
    /// Computes running now, and the sum of their start times (µs after start-up): with
    /// `busy_us` they give the busy time up to any instant (utilisation sampling).
    pub computing: AtomicU64,
    pub computing_since_us: AtomicU64,
}

/// Accounts a compute's slot time however it ends, cancellation (the client went away)
/// included: a hedge's loser costs the worker what it ran.
struct Computing<'a> {
    c: &'a Counters,
    started: Instant,
    start_us: u64,
}

impl Drop for Computing<'_> {
    fn drop(&mut self) {
        let now_us = self.started.elapsed().as_micros() as u64;
        self.c.computing.fetch_sub(1, Ordering::Relaxed);
        self.c.computing_since_us.fetch_sub(self.start_us, Ordering::Relaxed);
        self.c.busy_us.fetch_add(now_us.saturating_sub(self.start_us), Ordering::Relaxed);
    }
}

/// Undoes the in-flight accounting of a call however it ends (response, error or cancellation
/// when the client goes away).
struct InFlight<'a> {
    c: &'a Counters,
    pairs: u64,
    tokens: u64,
    finished: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.c.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.c.queued_pairs.fetch_sub(self.pairs, Ordering::Relaxed);
        self.c.queued_tokens.fetch_sub(self.tokens, Ordering::Relaxed);
        if !self.finished {
            self.c.cancelled.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The call's items that begin alike, by the worker's default threshold, their runs counted by
/// the simulated tokenizer.
fn item_runs(req: &ScoreRequest) -> Vec<ItemRun> {
    if req.items.len() < 2 {
        return Vec::new();
    }
    let texts: Vec<&str> = req.items.iter().map(|i| i.text()).collect();
    leading_runs(&texts, DEFAULT_MIN_RUN_TOKENS as f64, |t| f64::from(tokens::count_tokens(t)))
}

struct Waiting<'a>(&'a AtomicU64);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl SimEngine {
    /// The process's budget of request bytes in memory.
    pub fn buffer_budget(&self) -> &ByteBudget {
        &self.buffer_budget
    }

    pub fn new(config: SimConfig) -> Self {
        let settings = SimSettings {
            speed: config.speed,
            jitter: config.jitter,
            fail_rate: config.fail_rate,
            slowdown: 1.0,
            stall: config.stall,
        };
        SimEngine {
            slots: Semaphore::new(config.slots),
            rng: Mutex::new(StdRng::seed_from_u64(config.seed)),
            settings: Mutex::new(settings),
            started: Instant::now(),
            ready: AtomicBool::new(true),
            draining: AtomicBool::new(false),
            counters: Counters::default(),
            prefix_cache: PrefixCache::new(config.prefix_cache_blocks),
            buffer_budget: ByteBudget::new(config.http.max_buffered_bytes),
            config,
        }
    }

    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    pub fn settings(&self) -> SimSettings {
        *self.settings.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn update(&self, u: &SimSettingsUpdate) -> Result<SimSettings, String> {
        let mut s = self.settings.lock().unwrap_or_else(|p| p.into_inner());
        *s = s.apply(u)?;
        Ok(*s)
    }

    /// Restarts the random draws (noise, failures, stalls) from `seed` and empties the prefix
    /// cache: the comparison reseeds every worker before each strategy's run, so each strategy
    /// meets the same sequence and starts with cold prefix caches.
    pub fn reseed(&self, seed: u64) {
        *self.rng.lock().unwrap_or_else(|p| p.into_inner()) = StdRng::seed_from_u64(seed);
        self.prefix_cache.clear();
    }

    pub fn prefix_cache(&self) -> &PrefixCache {
        &self.prefix_cache
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// Stops taking calls (503, `/ready` 503, `draining` in `/stats`); running ones finish.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst) && !self.is_draining()
    }

    /// Compute time of a call at the worker's normal speed: what it expects, and what it
    /// checks deadlines against. Slowdowns (scheduled or set) are not part of it: a throttled
    /// worker does not know it is throttled.
    pub fn nominal_compute_ms(&self, prefix: u32, items: &[u32]) -> f64 {
        self.nominal_compute_ms_cached(prefix, 0, items)
    }

    /// As [`Self::nominal_compute_ms`] when `cached` of the prefix tokens come from the prefix
    /// cache (not computed).
    pub fn nominal_compute_ms_cached(&self, prefix: u32, cached: u32, items: &[u32]) -> f64 {
        self.nominal_compute_ms_shared(prefix, cached, items, &[])
    }

    /// As [`Self::nominal_compute_ms_cached`] when the `runs` of items share leading runs:
    /// each run is computed once, each member's rest after it.
    pub fn nominal_compute_ms_shared(&self, prefix: u32, cached: u32, items: &[u32], runs: &[ItemRun]) -> f64 {
        let passes = self.passes(prefix, items);
        let mut in_run = vec![false; items.len()];
        runs.iter().flat_map(|r| &r.items).for_each(|&i| in_run[i] = true);
        let alone = (0..items.len()).filter(|&i| !in_run[i]).map(|i| f64::from(items[i]));
        let mut features = CostFeatures::of_call(f64::from(prefix), f64::from(cached), alone);
        for r in runs {
            features.add_run_group(f64::from(prefix), r.tokens, r.items.iter().map(|&i| f64::from(items[i])));
        }
        let one_pass = self.config.cost.predict(&features);
        // A call over the batch limit runs as several passes, each paying the fixed cost.
        (one_pass + (passes - 1) as f64 * self.config.cost.request_ms) / self.settings().speed
    }

    /// The current slowdown: scheduled ones times the one set at run time.
    pub fn slowdown(&self) -> f64 {
        let since = self.started.elapsed();
        self.config.slowdowns.iter().map(|d| d.factor_at(since)).product::<f64>() * self.settings().slowdown
    }

    fn passes(&self, prefix: u32, items: &[u32]) -> u64 {
        let total: u64 = u64::from(prefix) + items.iter().map(|&n| u64::from(n)).sum::<u64>();
        if self.config.max_batch_tokens == 0 {
            1
        } else {
            total.div_ceil(self.config.max_batch_tokens).max(1)
        }
    }

    /// Scores a call. `arrival` is when its request arrived (queue time counts from there).
    pub async fn score(&self, req: ScoreRequest<'_>, arrival: Instant) -> Result<ScoreResponse, ApiError> {
        let c = &self.counters;
        c.requests.fetch_add(1, Ordering::Relaxed);
        if !self.ready.load(Ordering::SeqCst) {
            c.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(ApiError::not_ready("sim worker is not ready"));
        }
        if self.is_draining() {
            c.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(ApiError::not_ready("sim worker is draining"));
        }
        self.config.limits.check(&req)?;
        let instruction = req.instruction.as_deref();
        let prefix = tokens::prefix_tokens(&req.query, instruction);
        let item_tokens: Vec<u32> = req.items.iter().map(|i| tokens::item_tokens(i.text())).collect();
        for (i, n) in item_tokens.iter().enumerate() {
            let len = u64::from(prefix + n);
            if len > self.config.max_seq_tokens {
                return Err(ApiError::too_large(format!(
                    "items[{i}] too long: prompt of {len} tokens > max_seq_tokens {}",
                    self.config.max_seq_tokens
                )));
            }
        }
        let deadline = req.deadline_ms.map(|ms| arrival + Duration::from_millis(ms));
        let pairs = item_tokens.len() as u64;
        let total_tokens = u64::from(prefix) + item_tokens.iter().map(|&n| u64::from(n)).sum::<u64>();

        if self.config.max_queue > 0 && c.waiting.load(Ordering::Relaxed) >= self.config.max_queue as u64 {
            c.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(ApiError::overloaded(format!("queue full: {} calls waiting", self.config.max_queue)));
        }
        c.in_flight.fetch_add(1, Ordering::Relaxed);
        c.queued_pairs.fetch_add(pairs, Ordering::Relaxed);
        c.queued_tokens.fetch_add(total_tokens, Ordering::Relaxed);
        let mut in_flight = InFlight { c, pairs, tokens: total_tokens, finished: false };

        let prepare_ms = self.config.prepare_ms + self.config.prepare_ms_per_item * pairs as f64;
        if prepare_ms > 0.0 {
            let ready = Instant::now() + Duration::from_secs_f64(prepare_ms / self.settings().speed / 1e3);
            match deadline {
                Some(d) if d < ready => {
                    tokio::time::sleep_until(d).await;
                    in_flight.finished = true;
                    c.deadline_drops.fetch_add(1, Ordering::Relaxed);
                    return Err(ApiError::deadline(format!(
                        "deadline passed while preparing; {}",
                        sieve_shared::RAISE_DEADLINE
                    )));
                }
                _ => tokio::time::sleep_until(ready).await,
            }
        }
        c.waiting.fetch_add(1, Ordering::Relaxed);
        let waiting = Waiting(&c.waiting);
        // The simulated queue and compute as spans under the request's (tracing on only).
        let queue_span = sieve_server::span!("queue", items = pairs as i64);
        let permit = match deadline {
            Some(d) => match tokio::time::timeout_at(d, self.slots.acquire()).await {
                Ok(p) => p,
                Err(_) => {
                    in_flight.finished = true;
                    c.deadline_drops.fetch_add(1, Ordering::Relaxed);
                    return Err(ApiError::deadline(format!(
                        "deadline passed while queued; {}",
                        sieve_shared::RAISE_DEADLINE
                    )));
                }
            },
            None => self.slots.acquire().await,
        }
        .map_err(|_| ApiError::internal("sim worker is shutting down"))?;
        drop(waiting);
        drop(queue_span);
        let _compute_span = sieve_server::span!("compute", items = pairs as i64, tokens = total_tokens as i64);
        let start = Instant::now();
        let start_us = (start - self.started).as_micros() as u64;
        c.computing.fetch_add(1, Ordering::Relaxed);
        c.computing_since_us.fetch_add(start_us, Ordering::Relaxed);
        let computing = Computing { c, started: self.started, start_us };
        let queue_ms = (start - arrival).as_secs_f64() * 1e3;

        let settings = self.settings();
        let (noise, fail_at, stall_ms) = {
            let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
            let z: f64 = StandardNormal.sample(&mut *rng);
            let noise = (settings.jitter * z - settings.jitter * settings.jitter / 2.0).exp();
            let fail = rng.random::<f64>() < settings.fail_rate;
            let fail_at = fail.then(|| rng.random::<f64>());
            (noise, fail_at, settings.stall.draw(&mut *rng))
        };
        if stall_ms > 0.0 {
            c.stalls.fetch_add(1, Ordering::Relaxed);
        }
        // The prefix blocks this worker holds are not computed again (looked up as the call
        // starts computing, committed when it succeeds, as the worker's batches do).
        let blocks = (self.config.prefix_cache_blocks > 0).then(|| PrefixBlocks::of(&req.query, instruction));
        let cached_prefix = blocks.as_ref().map_or(0, |b| self.prefix_cache.lookup(b)).min(prefix);
        let runs = item_runs(&req);
        let nominal_ms = self.nominal_compute_ms_shared(prefix, cached_prefix, &item_tokens, &runs);
        // A stall holds the slot like compute does (the worker is paused, not idle).
        let compute = Duration::from_secs_f64((nominal_ms * self.slowdown() * noise + stall_ms / settings.speed) / 1e3);
        if let Some(d) = deadline {
            if start + Duration::from_secs_f64(nominal_ms / 1e3) > d {
                in_flight.finished = true;
                c.deadline_drops.fetch_add(1, Ordering::Relaxed);
                return Err(ApiError::deadline(format!(
                    "cannot finish within the deadline: {nominal_ms:.1} ms of compute, {:.1} ms left; {}",
                    d.saturating_duration_since(start).as_secs_f64() * 1e3,
                    sieve_shared::RAISE_DEADLINE
                )));
            }
        }
        if let Some(fraction) = fail_at {
            tokio::time::sleep(compute.mul_f64(fraction)).await;
            drop(permit);
            in_flight.finished = true;
            c.failures_injected.fetch_add(1, Ordering::Relaxed);
            return Err(ApiError::internal("injected failure"));
        }
        // Like the worker between forward passes: work still running at the deadline is dropped.
        let end = start + compute;
        match deadline {
            Some(d) if d < end => {
                tokio::time::sleep_until(d).await;
                drop(permit);
                in_flight.finished = true;
                c.deadline_drops.fetch_add(1, Ordering::Relaxed);
                return Err(ApiError::deadline(format!(
                    "deadline passed during compute; {}",
                    sieve_shared::RAISE_DEADLINE
                )));
            }
            // No compute (a zero cost model): answered now. Tokio's timer rounds a deadline up
            // to its next millisecond tick, so even a sleep until now would hold the answer 1-2
            // ms, and a zero-compute worker's latency would be its timer's, not its own.
            _ if compute.is_zero() => {}
            _ => tokio::time::sleep_until(end).await,
        }
        drop(computing);
        drop(permit);
        if let Some(b) = &blocks {
            self.prefix_cache.commit(b);
        }
        // Every member but one computes the run as the worker reports it: item tokens shared.
        let item_shared_tokens: u64 = runs.iter().map(|r| (r.items.len() as u64 - 1) * r.tokens as u64).sum();
        let computed_tokens = total_tokens - u64::from(cached_prefix) - item_shared_tokens;
        c.completed.fetch_add(1, Ordering::Relaxed);
        c.pairs.fetch_add(pairs, Ordering::Relaxed);
        c.tokens.fetch_add(computed_tokens, Ordering::Relaxed);
        in_flight.finished = true;

        let scores = req.items.iter().map(|i| Some(scores::score(instruction, &req.query, i.text()))).collect();
        let ids = req
            .items
            .iter()
            .any(|i| i.id().is_some())
            .then(|| req.items.iter().map(|i| i.id().map(String::from)).collect());
        Ok(ScoreResponse {
            scores,
            ids,
            missing: Vec::new(),
            usage: Usage {
                pairs: pairs as u32,
                prompt_tokens: item_tokens.iter().map(|&n| u64::from(prefix + n)).sum(),
                computed_tokens,
                prefix_tokens: prefix,
                cached_prefix_tokens: cached_prefix,
                cached_items: 0,
                item_tokens,
                item_shared_tokens,
                truncated_items: 0,
            },
            timing: Timing {
                queue_ms,
                compute_ms: compute.as_secs_f64() * 1e3,
                total_ms: arrival.elapsed().as_secs_f64() * 1e3,
            },
            model: self.config.model.clone(),
            template: self.config.template.clone(),
        })
    }

    /// Slot-seconds of compute so far, running computes included up to now.
    pub fn busy_seconds(&self) -> f64 {
        let c = &self.counters;
        let now_us = self.started.elapsed().as_micros() as u64;
        let running = c.computing.load(Ordering::Relaxed);
        let since = c.computing_since_us.load(Ordering::Relaxed);
        let busy = c.busy_us.load(Ordering::Relaxed) + (running * now_us).saturating_sub(since);
        busy as f64 / 1e6
    }

    pub fn stats(&self) -> WorkerStats {
        let c = &self.counters;
        let s = self.settings();
        let mut extra = serde_json::Map::new();
        extra.insert(
            "sim".into(),
            serde_json::json!({
                "slots": self.config.slots,
                "waiting": c.waiting.load(Ordering::Relaxed),
                "speed": s.speed,
                "slowdown": s.slowdown,
                "fail_rate": s.fail_rate,
                "failures_injected": c.failures_injected.load(Ordering::Relaxed),
                "deadline_drops": c.deadline_drops.load(Ordering::Relaxed),
                "rejected": c.rejected.load(Ordering::Relaxed),
                "cancelled": c.cancelled.load(Ordering::Relaxed),
                "stalls": c.stalls.load(Ordering::Relaxed),
                "busy_seconds": self.busy_seconds(),
            }),
        );
        extra.insert("prefix_cache".into(), serde_json::to_value(self.prefix_cache.stats()).unwrap_or_default());
        WorkerStats {
            model: self.config.model.clone(),
            template: self.config.template.clone(),
            device: "sim".into(),
            ready: self.is_ready(),
            draining: self.is_draining(),
            in_flight_requests: c.in_flight.load(Ordering::Relaxed),
            queued_pairs: c.queued_pairs.load(Ordering::Relaxed),
            queued_tokens: c.queued_tokens.load(Ordering::Relaxed),
            max_batch_tokens: self.config.max_batch_tokens,
            max_seq_tokens: self.config.max_seq_tokens,
            tokens_processed: c.tokens.load(Ordering::Relaxed),
            pairs_processed: c.pairs.load(Ordering::Relaxed),
            requests_processed: c.completed.load(Ordering::Relaxed),
            tokens_per_second: if self.config.cost.token_ms > 0.0 {
                1e3 * s.speed / self.config.cost.token_ms
            } else {
                0.0
            },
            extra,
            ..WorkerStats::default()
        }
    }

    /// Prometheus text exposition of the counters, each family with its HELP and TYPE lines.
    pub fn metrics_text(&self) -> String {
        let c = &self.counters;
        let v = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        let mut out = String::new();
        sieve_shared::metrics_names::write_values(
            &mut out,
            &[
                (names::REQUESTS, v(&c.requests)),
                (names::COMPLETED, v(&c.completed)),
                (names::PAIRS, v(&c.pairs)),
                (names::TOKENS, v(&c.tokens)),
                (names::FAILURES_INJECTED, v(&c.failures_injected)),
                (names::DEADLINE_DROPS, v(&c.deadline_drops)),
                (names::CANCELLED, v(&c.cancelled)),
                (names::IN_FLIGHT, v(&c.in_flight)),
                (names::QUEUED_TOKENS, v(&c.queued_tokens)),
            ],
        );
        out
    }
}

/// Shared handle type used by the servers.
pub type SharedEngine = Arc<SimEngine>;

#[cfg(test)]
mod tests {
    use super::*;
    use sieve_shared::{CostModel, Item};

    fn req(items: &[&str], deadline_ms: Option<u64>) -> ScoreRequest<'static> {
        let items = items.iter().map(|&s| Item::from(s.to_string())).collect();
        ScoreRequest { deadline_ms, ..ScoreRequest::new("trail running shoes", items) }
    }

    fn engine(cfg: SimConfig) -> SimEngine {
        SimEngine::new(cfg)
    }

    #[tokio::test(start_paused = true)]
    async fn compute_time_follows_the_cost_model() {
        let cost = CostModel { request_ms: 5.0, token_ms: 0.5, token_context_ms: 0.0 };
        let e = engine(SimConfig { cost, ..SimConfig::default() });
        let t0 = Instant::now();
        let r = e.score(req(&["a b c", "d"], None), t0).await.unwrap();
        let expect = 5.0 + 0.5 * r.usage.computed_tokens as f64;
        let took = t0.elapsed().as_secs_f64() * 1e3;
        assert!((took - expect).abs() < 1.0, "took {took} ms, cost model says {expect} ms");
        assert_eq!(r.usage.item_tokens, vec![tokens::item_tokens("a b c"), tokens::item_tokens("d")]);
        assert_eq!(
            r.usage.computed_tokens,
            u64::from(r.usage.prefix_tokens) + r.usage.item_tokens.iter().map(|&n| u64::from(n)).sum::<u64>()
        );
        assert_eq!(r.scores[1], Some(scores::score(None, "trail running shoes", "d")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_prefix_is_not_computed_again() {
        let cost = CostModel { request_ms: 5.0, token_ms: 0.5, token_context_ms: 0.0 };
        let e = engine(SimConfig { cost, prefix_cache_blocks: 64, ..SimConfig::default() });
        let t0 = Instant::now();
        let cold = e.score(req(&["a b c"], None), t0).await.unwrap();
        assert_eq!(cold.usage.cached_prefix_tokens, 0, "nothing held yet");
        let t1 = Instant::now();
        let warm = e.score(req(&["d e"], None), t1).await.unwrap();
        let p = warm.usage.prefix_tokens;
        assert_eq!(warm.usage.cached_prefix_tokens, p, "the same query: the whole prefix held");
        assert_eq!(warm.usage.computed_tokens, u64::from(warm.usage.item_tokens[0]), "only the item computed");
        let took = t1.elapsed().as_secs_f64() * 1e3;
        let expect = 5.0 + 0.5 * f64::from(warm.usage.item_tokens[0]);
        assert!((took - expect).abs() < 1.0, "took {took} ms, expected {expect} ms without the prefix");
        // Another query shares the template head's full blocks only.
        let other = ScoreRequest { query: "wool socks".into(), ..req(&["x"], None) };
        let r = e.score(other, Instant::now()).await.unwrap();
        assert_eq!(r.usage.cached_prefix_tokens, 32);
        assert_eq!(e.stats().extra["prefix_cache"]["blocks"], 4);
        // Without a cache (the default) every prefix is computed.
        let plain = engine(SimConfig { cost, ..SimConfig::default() });
        plain.score(req(&["a"], None), Instant::now()).await.unwrap();
        assert_eq!(plain.score(req(&["a"], None), Instant::now()).await.unwrap().usage.cached_prefix_tokens, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn one_slot_serialises_calls() {
        let cost = CostModel { request_ms: 100.0, token_ms: 0.0, token_context_ms: 0.0 };
        let e = Arc::new(engine(SimConfig { cost, slots: 1, ..SimConfig::default() }));
        let t0 = Instant::now();
        let (a, b) = tokio::join!(e.score(req(&["x"], None), t0), e.score(req(&["y"], None), t0));
        let (a, b) = (a.unwrap(), b.unwrap());
        let later = a.timing.queue_ms.max(b.timing.queue_ms);
        assert!((later - 100.0).abs() < 1.0, "second call should queue 100 ms, queued {later}");
        assert!((t0.elapsed().as_secs_f64() * 1e3 - 200.0).abs() < 1.0);
    }

    #[tokio::test(start_paused = true)]
    async fn work_that_cannot_finish_in_time_is_dropped() {
        let cost = CostModel { request_ms: 100.0, token_ms: 0.0, token_context_ms: 0.0 };
        let e = engine(SimConfig { cost, ..SimConfig::default() });
        let t0 = Instant::now();
        let err = e.score(req(&["x"], Some(50)), t0).await.unwrap_err();
        assert_eq!(err.status(), 504);
        assert!(err.message.contains("x-sieve-deadline-ms"), "says how to raise it: {}", err.message);
        assert!(t0.elapsed() < Duration::from_millis(1), "dropped at once, not after computing");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slowed_worker_accepts_work_and_drops_it_at_the_deadline() {
        let cost = CostModel { request_ms: 10.0, token_ms: 0.0, token_context_ms: 0.0 };
        let e = engine(SimConfig { cost, ..SimConfig::default() });
        e.update(&SimSettingsUpdate { slowdown: Some(100.0), ..Default::default() }).unwrap();
        let t0 = Instant::now();
        let err = e.score(req(&["x"], Some(50)), t0).await.unwrap_err();
        assert_eq!(err.status(), 504);
        assert!(err.message.contains("during compute"), "{}", err.message);
        assert_eq!(t0.elapsed(), Duration::from_millis(50));
    }

    #[tokio::test(start_paused = true)]
    async fn failures_speed_and_limits() {
        let e = engine(SimConfig { fail_rate: 1.0, ..SimConfig::default() });
        assert_eq!(e.score(req(&["x"], None), Instant::now()).await.unwrap_err().status(), 500);
        e.update(&SimSettingsUpdate { fail_rate: Some(0.0), ..Default::default() }).unwrap();
        assert!(e.score(req(&["x"], None), Instant::now()).await.is_ok());
        assert_eq!(e.score(req(&[], None), Instant::now()).await.unwrap_err().status(), 422);
        let long = "word ".repeat(20_000);
        let small = engine(SimConfig { max_seq_tokens: 100, ..SimConfig::default() });
        let err = small.score(req(&["ok", &long], None), Instant::now()).await.unwrap_err();
        assert_eq!(err.status(), 413);
        assert!(err.message.contains("items[1]"), "{}", err.message);
        let slow = engine(SimConfig::default());
        let fast_ms = slow.nominal_compute_ms(100, &[100, 100]);
        slow.update(&SimSettingsUpdate { speed: Some(0.5), slowdown: Some(3.0), ..Default::default() }).unwrap();
        assert!((slow.nominal_compute_ms(100, &[100, 100]) - 2.0 * fast_ms).abs() < 1e-9);
        assert_eq!(slow.slowdown(), 3.0);
        slow.drain();
        assert_eq!(slow.score(req(&["x"], None), Instant::now()).await.unwrap_err().status(), 503);
        assert!(slow.stats().draining);
    }

    #[tokio::test(start_paused = true)]
    async fn items_that_begin_alike_compute_their_run_once() {
        let cost = CostModel { request_ms: 1.0, token_ms: 0.1, token_context_ms: 1e-4 };
        let e = engine(SimConfig { cost, ..SimConfig::default() });
        let header = "shoes run trail brand acme store acme shop mesh upper"; // ten tokens
        let grouped: Vec<String> = (0..4).map(|v| format!("{header} {v} colour c{v} size s{v}")).collect();
        let apart: Vec<String> = (0..4).map(|v| format!("x{v} {header} {v} colour c{v} size s{v}")).collect();
        let call = |items: &[String]| req(&items.iter().map(String::as_str).collect::<Vec<_>>(), None);
        let a = e.score(call(&grouped), Instant::now()).await.unwrap();
        let b = e.score(call(&apart), Instant::now()).await.unwrap();
        // The header (10 tokens) computed once, not four times; the scores are the texts' own.
        assert_eq!(a.usage.item_shared_tokens, 3 * 10);
        assert_eq!(b.usage.item_shared_tokens, 0);
        assert_eq!(a.usage.computed_tokens + 30 + 4, b.usage.computed_tokens, "b's items are a token longer");
        assert!(a.timing.compute_ms < b.timing.compute_ms - 30.0 * 0.1 * 0.9, "{:?} {:?}", a.timing, b.timing);
        // One member alone: no sharing.
        let one = e.score(call(&grouped[..1]), Instant::now()).await.unwrap();
        assert_eq!(one.usage.item_shared_tokens, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn latency_follows_the_cost_model_over_shapes_speeds_and_slowdowns() {
        let cost = CostModel { request_ms: 3.0, token_ms: 0.02, token_context_ms: 1e-4 };
        for (speed, slowdown) in [(1.0, 1.0), (0.5, 1.0), (4.0, 3.0)] {
            let e = engine(SimConfig { cost, speed, ..SimConfig::default() });
            e.update(&SimSettingsUpdate { slowdown: Some(slowdown), ..Default::default() }).unwrap();
            for (words, n) in [(1usize, 1usize), (30, 5), (200, 40)] {
                // Items that do not begin alike (no shared run to compute once).
                let texts: Vec<String> = (0..n).map(|k| format!("{k}{}", " word".repeat(words))).collect();
                let items: Vec<&str> = texts.iter().map(String::as_str).collect();
                let t0 = Instant::now();
                let r = e.score(req(&items, None), t0).await.unwrap();
                let p = f64::from(r.usage.prefix_tokens);
                let expect = cost.call_ms(p, r.usage.item_tokens.iter().map(|&t| f64::from(t))) * slowdown / speed;
                let took = t0.elapsed().as_secs_f64() * 1e3;
                assert!(
                    (r.timing.compute_ms - expect).abs() < 1e-6 * expect,
                    "reported {} vs model {expect}",
                    r.timing.compute_ms
                );
                // The (paused) timer wheel rounds sleeps up to the next millisecond.
                assert!(
                    took >= expect - 1e-6 && took <= expect + 1.0,
                    "took {took} ms, model {expect} ms (speed {speed}, slowdown {slowdown})"
                );
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn preparation_is_queue_time_the_cost_model_never_sees() {
        let cost = CostModel { request_ms: 10.0, token_ms: 0.0, token_context_ms: 0.0 };
        // 4 ms per call + 2 per item, at speed 2: (4 + 3 * 2) / 2 = 5 ms before the slot.
        let e =
            engine(SimConfig { cost, speed: 2.0, prepare_ms: 4.0, prepare_ms_per_item: 2.0, ..SimConfig::default() });
        let t0 = Instant::now();
        let r = e.score(req(&["a", "b", "c"], None), t0).await.unwrap();
        assert!((r.timing.compute_ms - 5.0).abs() < 1e-6, "compute {}", r.timing.compute_ms);
        assert!((r.timing.queue_ms - 5.0).abs() < 1.0, "queue {}", r.timing.queue_ms);
        assert!(t0.elapsed() >= Duration::from_millis(10), "{:?}", t0.elapsed());
        // Preparing past the deadline is a 504 at the deadline, no slot taken.
        let t1 = Instant::now();
        let err = e.score(req(&["a", "b", "c"], Some(3)), t1).await.unwrap_err();
        assert_eq!(err.status(), 504);
        assert!(err.message.contains("preparing"), "{}", err.message);
        assert_eq!(t1.elapsed(), Duration::from_millis(3));
        assert!(SimConfig { prepare_ms: -1.0, ..SimConfig::default() }.validate().is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_call_is_slower_by_its_stall() {
        use crate::sim::Stall;
        let cost = CostModel { request_ms: 10.0, token_ms: 0.0, token_context_ms: 0.0 };
        // Every call stalls; min = max pins the pause at 100 ms (at speed 2: 50 ms of wall time).
        let stall = Stall { rate: 1.0, min_ms: 100.0, alpha: 1.5, max_ms: 100.0 };
        let e = engine(SimConfig { cost, speed: 2.0, stall, ..SimConfig::default() });
        let r = e.score(req(&["x"], None), Instant::now()).await.unwrap();
        assert!((r.timing.compute_ms - 55.0).abs() < 0.5, "5 ms of compute + 50 ms stalled: {}", r.timing.compute_ms);
        assert_eq!(e.counters().stalls.load(Ordering::Relaxed), 1);
        // Switched off at run time: back to the cost model alone.
        e.update(&SimSettingsUpdate { stall: Some(Stall::default()), ..Default::default() }).unwrap();
        let r = e.score(req(&["x"], None), Instant::now()).await.unwrap();
        assert!((r.timing.compute_ms - 5.0).abs() < 0.5, "{}", r.timing.compute_ms);
        assert_eq!(e.counters().stalls.load(Ordering::Relaxed), 1);
        // A rare stall: the same seed stalls the same calls.
        let times = |seed: u64| async move {
            let stall = Stall { rate: 0.1, min_ms: 50.0, alpha: 1.2, max_ms: 5000.0 };
            let e = engine(SimConfig { cost, stall, seed, ..SimConfig::default() });
            let mut t = Vec::new();
            for _ in 0..200 {
                t.push(e.score(req(&["x"], None), Instant::now()).await.unwrap().timing.compute_ms.round());
            }
            t
        };
        let a = times(5).await;
        assert_eq!(a, times(5).await);
        let slow = a.iter().filter(|&&t| t >= 60.0).count();
        assert!((8..=35).contains(&slow), "{slow} of 200 calls stalled at rate 0.1");
    }

    #[tokio::test(start_paused = true)]
    async fn reseeding_replays_the_same_noise_and_stalls() {
        use crate::sim::Stall;
        let cost = CostModel { request_ms: 10.0, token_ms: 0.0, token_context_ms: 0.0 };
        let stall = Stall { rate: 0.2, min_ms: 50.0, alpha: 1.2, max_ms: 5000.0 };
        let e = engine(SimConfig { cost, jitter: 0.3, stall, seed: 1, ..SimConfig::default() });
        let run = || async {
            let mut t = Vec::new();
            for _ in 0..50 {
                t.push(e.score(req(&["x"], None), Instant::now()).await.unwrap().timing.compute_ms);
            }
            t
        };
        e.reseed(7);
        let a = run().await;
        let b = run().await;
        assert_ne!(a, b, "the draws go on without a reseed");
        e.reseed(7);
        assert_eq!(a, run().await, "a reseed replays them");
    }

    #[tokio::test(start_paused = true)]
    async fn jitter_keeps_the_mean_and_has_the_configured_spread() {
        let cost = CostModel { request_ms: 10.0, token_ms: 0.0, token_context_ms: 0.0 };
        let e = engine(SimConfig { cost, jitter: 0.3, seed: 9, ..SimConfig::default() });
        let mut logs = Vec::new();
        for _ in 0..4000 {
            let r = e.score(req(&["x"], None), Instant::now()).await.unwrap();
            logs.push((r.timing.compute_ms / 10.0).ln());
        }
        let n = logs.len() as f64;
        let mean_ratio = logs.iter().map(|l| l.exp()).sum::<f64>() / n;
        let mean_log = logs.iter().sum::<f64>() / n;
        let sd = (logs.iter().map(|l| (l - mean_log).powi(2)).sum::<f64>() / n).sqrt();
        assert!((mean_ratio - 1.0).abs() < 0.02, "mean compute / model {mean_ratio}");
        assert!((sd - 0.3).abs() < 0.015, "sigma of ln time {sd}");
    }

    #[tokio::test(start_paused = true)]
    async fn slots_compute_concurrently_and_busy_time_counts_cancelled_work() {
        let cost = CostModel { request_ms: 100.0, token_ms: 0.0, token_context_ms: 0.0 };
        let e = Arc::new(engine(SimConfig { cost, slots: 2, ..SimConfig::default() }));
        let t0 = Instant::now();
        let calls: Vec<_> = (0..4)
            .map(|_| {
                let e = e.clone();
                tokio::spawn(async move { e.score(req(&["x"], None), t0).await })
            })
            .collect();
        for c in calls {
            c.await.unwrap().unwrap();
        }
        assert_eq!(t0.elapsed(), Duration::from_millis(200), "two at a time");
        assert!((e.busy_seconds() - 0.4).abs() < 1e-6);
        // A call abandoned half-way (its client went away) still cost the worker 50 ms.
        let e2 = e.clone();
        let call = tokio::spawn(async move { e2.score(req(&["x"], None), Instant::now()).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!((e.busy_seconds() - 0.45).abs() < 1e-3, "running work counts: {}", e.busy_seconds());
        call.abort();
        let _ = call.await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!((e.busy_seconds() - 0.45).abs() < 1e-3, "{}", e.busy_seconds());
        assert_eq!(e.counters().cancelled.load(Ordering::Relaxed), 1);
    }
}
