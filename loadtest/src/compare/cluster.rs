//! The comparison's cluster: N simulated workers in this process (so faults can be injected
//! directly: slow one down, kill one and restart it on the same ports) and one `sieve-proxy`
//! process per strategy, all pointing at the same workers.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use sieve_shared::{ProxyConfig, WorkerEndpoint};
use tokio::time::Instant;

use crate::client::Http;
use crate::process::Proc;
use crate::sim::{SimConfig, SimSettingsUpdate, SimWorker};

/// One simulated worker slot: its config and ports survive a kill, so it restarts in place.
struct Slot {
    config: SimConfig,
    api_port: u16,
    admin_port: u16,
    worker: Option<SimWorker>,
    /// Busy seconds of earlier incarnations (a restart starts from zero).
    busy_before: f64,
}

#[derive(Clone)]
pub struct SimCluster {
    slots: Arc<Mutex<Vec<Slot>>>,
    endpoints: Vec<WorkerEndpoint>,
    admin_urls: Vec<String>,
}

impl SimCluster {
    pub async fn start(n: usize, base: &SimConfig) -> Result<SimCluster, String> {
        let mut slots = Vec::with_capacity(n);
        for i in 0..n {
            let config = SimConfig { seed: base.seed.wrapping_add(i as u64), ..base.clone() };
            let w = SimWorker::start_local(config.clone()).await.map_err(|e| format!("sim worker {i}: {e}"))?;
            slots.push(Slot {
                config,
                api_port: w.api_addr.port(),
                admin_port: w.admin_addr.port(),
                worker: Some(w),
                busy_before: 0.0,
            });
        }
        let endpoints = slots
            .iter()
            .map(|s| s.worker.as_ref().map(SimWorker::endpoint))
            .collect::<Option<Vec<_>>>()
            .unwrap_or_default();
        let admin_urls = endpoints.iter().filter_map(|e| e.admin.clone()).collect();
        Ok(SimCluster { slots: Arc::new(Mutex::new(slots)), endpoints, admin_urls })
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn endpoints(&self) -> &[WorkerEndpoint] {
        &self.endpoints
    }

    pub fn admin_urls(&self) -> &[String] {
        &self.admin_urls
    }

    pub fn len(&self) -> usize {
        self.endpoints.len()
    }

    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// Changes the run-time settings of worker `i` (slowdown, speed, ...).
    pub fn update(&self, i: usize, u: &SimSettingsUpdate) -> Result<(), String> {
        match self.slots().get(i).and_then(|s| s.worker.as_ref()) {
            Some(w) => w.update(u).map(|_| ()),
            None => Err(format!("sim worker {i} is not running")),
        }
    }

    /// Resets every running worker's run-time settings to its start-up ones.
    pub fn reset_settings(&self) {
        for s in self.slots().iter() {
            if let Some(w) = &s.worker {
                let _ = w.update(&SimSettingsUpdate {
                    speed: Some(s.config.speed),
                    jitter: Some(s.config.jitter),
                    fail_rate: Some(s.config.fail_rate),
                    slowdown: Some(1.0),
                    stall: Some(s.config.stall),
                });
            }
        }
    }

    /// Restarts every worker's random draws (noise, failures, stalls) from `seed` (worker i
    /// from `seed + i`), a restarted worker's included: each strategy's run starts from here,
    /// so every strategy meets the same noise and stalls.
    pub fn reseed(&self, seed: u64) {
        for (i, s) in self.slots().iter_mut().enumerate() {
            s.config.seed = seed.wrapping_add(i as u64);
            if let Some(w) = &s.worker {
                w.engine().reseed(s.config.seed);
            }
        }
    }

    /// Drops worker `i`'s connections and closes its ports at once, like a crash.
    pub fn kill(&self, i: usize) {
        let mut slots = self.slots();
        if let Some(s) = slots.get_mut(i) {
            if let Some(w) = s.worker.take() {
                s.busy_before += w.engine().busy_seconds();
                w.kill();
            }
        }
    }

    /// Starts worker `i` again on its ports (retrying while the old sockets close).
    pub async fn restart(&self, i: usize) -> Result<(), String> {
        let (config, api, admin) = {
            let slots = self.slots();
            let s = slots.get(i).ok_or_else(|| format!("no sim worker {i}"))?;
            if s.worker.is_some() {
                return Ok(());
            }
            (s.config.clone(), s.api_port, s.admin_port)
        };
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            match SimWorker::start(config.clone(), "127.0.0.1", api, admin).await {
                Ok(w) => {
                    if let Some(s) = self.slots().get_mut(i) {
                        s.worker = Some(w);
                    }
                    return Ok(());
                }
                Err(e) if Instant::now() >= end => return Err(format!("restarting sim worker {i}: {e}")),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// Prefix tokens the live workers' prefix caches were asked for, and of them found held.
    pub fn prefix_tokens(&self) -> (u64, u64) {
        self.slots().iter().filter_map(|s| s.worker.as_ref()).fold((0, 0), |(l, h), w| {
            let st = w.engine().prefix_cache().stats();
            (l + st.lookup_tokens, h + st.hit_tokens)
        })
    }

    /// Slot-seconds of compute so far, all workers and incarnations.
    pub fn busy_seconds(&self) -> f64 {
        self.slots().iter().map(|s| s.busy_before + s.worker.as_ref().map_or(0.0, |w| w.engine().busy_seconds())).sum()
    }

    fn in_flight(&self) -> u64 {
        self.slots()
            .iter()
            .filter_map(|s| s.worker.as_ref())
            .map(|w| w.engine().counters().in_flight.load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    }

    /// Waits (at most `timeout`) until no worker has a call in flight.
    pub async fn wait_idle(&self, timeout: Duration) {
        let end = Instant::now() + timeout;
        while self.in_flight() > 0 && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A `sieve-proxy` process with a strategy's config.
pub struct ProxyProc {
    pub proc: Proc,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProxyCounters {
    pub shards: u64,
    pub hedges: u64,
    pub retries: u64,
    pub failures: u64,
}

impl std::ops::Sub for ProxyCounters {
    type Output = ProxyCounters;

    fn sub(self, b: ProxyCounters) -> ProxyCounters {
        ProxyCounters {
            shards: self.shards.saturating_sub(b.shards),
            hedges: self.hedges.saturating_sub(b.hedges),
            retries: self.retries.saturating_sub(b.retries),
            failures: self.failures.saturating_sub(b.failures),
        }
    }
}

#[derive(Deserialize)]
struct WorkersReport {
    workers: Vec<WorkerRow>,
    eligible: usize,
}

#[derive(Deserialize)]
struct WorkerRow {
    shards: u64,
    hedges: u64,
    retries: u64,
    failures: u64,
}

impl ProxyProc {
    /// Writes the config next to the results and starts the proxy with it. Call from the
    /// thread that stays alive for the whole run: the child dies with that thread.
    pub fn start(bin: &Path, config: &ProxyConfig, config_path: &Path) -> Result<ProxyProc, String> {
        std::fs::write(config_path, config.to_toml()).map_err(|e| format!("{}: {e}", config_path.display()))?;
        let args = ["--config".to_string(), config_path.display().to_string()];
        let proc = Proc::start(bin, &args, Duration::from_secs(30))?;
        Ok(ProxyProc { proc })
    }

    pub fn api_url(&self) -> String {
        self.proc.api_url()
    }

    pub fn admin_url(&self) -> String {
        self.proc.admin_url()
    }

    async fn report(&self, http: &Http) -> Result<WorkersReport, String> {
        http.get_json(&format!("{}/workers", self.admin_url()), Duration::from_secs(2)).await
    }

    /// Waits until `n` workers are eligible.
    pub async fn wait_workers(&self, http: &Http, n: usize, timeout: Duration) -> Result<(), String> {
        let end = Instant::now() + timeout;
        loop {
            let eligible = self.report(http).await.map(|r| r.eligible).unwrap_or(0);
            if eligible >= n {
                return Ok(());
            }
            if Instant::now() >= end {
                return Err(format!(
                    "proxy {}: only {eligible} of {n} workers eligible after {timeout:?}",
                    self.admin_url()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The proxy's admin `/workers` report and `/metrics` text, saved beside a run's report
    /// (what it learned: time factors, hedge ratio quantile, hedges denied).
    pub async fn snapshot(&self, http: &Http, dir: &Path) {
        for (path, file) in [("workers", "proxy_workers.json"), ("metrics", "proxy_metrics.txt")] {
            let url = format!("{}/{path}", self.admin_url());
            if let Ok(r) = http.send(hyper::Method::GET, &url, bytes::Bytes::new(), Duration::from_secs(2)).await {
                let _ = std::fs::write(dir.join(file), &r.body);
            }
        }
    }

    /// Shards, hedges, retries and failures summed over workers.
    pub async fn counters(&self, http: &Http) -> ProxyCounters {
        match self.report(http).await {
            Ok(r) => r.workers.iter().fold(ProxyCounters::default(), |a, w| ProxyCounters {
                shards: a.shards + w.shards,
                hedges: a.hedges + w.hedges,
                retries: a.retries + w.retries,
                failures: a.failures + w.failures,
            }),
            Err(_) => ProxyCounters::default(),
        }
    }
}
