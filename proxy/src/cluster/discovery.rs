//! Where the worker list comes from, and keeping it current without dropping requests.
//!
//! Three sources, unioned: `--worker` flags, the config file's `[[workers]]` (the file is
//! polled and re-read when it changes, or on SIGHUP / `POST /reload`), and DNS names
//! re-resolved periodically (every address of a Kubernetes headless Service is a worker, its
//! admin port from the config). The union replaces the pool atomically (see `pool`).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use sieve_shared::proxy_config::DnsDiscovery;
use sieve_shared::sync::lock;
use sieve_shared::WorkerEndpoint;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::cluster::ClusterHost;
use crate::config::{self, Overrides};
use crate::metrics as m;

#[derive(Default)]
struct Sources {
    cli: Vec<WorkerEndpoint>,
    file: Vec<WorkerEndpoint>,
    /// Per `discovery.dns` entry, what it last resolved to.
    dns: Vec<Vec<WorkerEndpoint>>,
}

pub struct Discovery {
    host: Arc<dyn ClusterHost>,
    config_path: Option<PathBuf>,
    overrides: Overrides,
    sources: Mutex<Sources>,
    dns_entries: Mutex<Vec<DnsDiscovery>>,
    dns_tasks: Mutex<Vec<JoinHandle<()>>>,
    file_stamp: Mutex<Option<(SystemTime, u64)>>,
    stop: watch::Receiver<bool>,
}

impl Discovery {
    pub fn new(
        host: Arc<dyn ClusterHost>,
        config_path: Option<PathBuf>,
        overrides: Overrides,
        cli_workers: Vec<WorkerEndpoint>,
        stop: watch::Receiver<bool>,
    ) -> Arc<Self> {
        let cfg = host.config();
        let d = Arc::new(Discovery {
            config_path,
            overrides,
            sources: Mutex::new(Sources { cli: cli_workers, file: cfg.workers.clone(), dns: Vec::new() }),
            dns_entries: Mutex::new(Vec::new()),
            dns_tasks: Mutex::new(Vec::new()),
            file_stamp: Mutex::new(None),
            stop,
            host,
        });
        *lock(&d.file_stamp) = d.stamp();
        d.apply();
        d.restart_dns(&cfg.discovery.dns);
        d
    }

    /// Starts watching the config file (when there is one).
    pub fn spawn_file_watch(self: &Arc<Self>) -> Option<JoinHandle<()>> {
        self.config_path.as_ref()?;
        let d = self.clone();
        Some(tokio::spawn(async move {
            let mut stop = d.stop.clone();
            loop {
                let interval = Duration::from_millis(d.host.config().discovery.reload_interval_ms);
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = stop.changed() => return,
                }
                let stamp = d.stamp();
                if stamp != *lock(&d.file_stamp) {
                    match d.reload() {
                        Ok(n) => tracing::info!("config changed: reloaded, {n} workers"),
                        Err(e) => tracing::warn!("config changed but not applied: {e}"),
                    }
                }
            }
        }))
    }

    fn stamp(&self) -> Option<(SystemTime, u64)> {
        let meta = std::fs::metadata(self.config_path.as_ref()?).ok()?;
        Some((meta.modified().ok()?, meta.len()))
    }

    /// Re-reads the config file and applies it: worker list, DNS names and the tuning that
    /// can change while running. An invalid file changes nothing. Returns the worker count.
    pub fn reload(self: &Arc<Self>) -> Result<usize, String> {
        let Some(path) = &self.config_path else {
            return Err("no config file to reload (started without --config)".into());
        };
        *lock(&self.file_stamp) = self.stamp();
        let cfg = match config::load(Some(path), &self.overrides) {
            Ok(c) => c,
            Err(e) => {
                metrics::counter!(m::CONFIG_RELOADS, "outcome" => "error").increment(1);
                return Err(e);
            }
        };
        let dns = cfg.discovery.dns.clone();
        lock(&self.sources).file = cfg.workers.clone();
        self.host.set_config(cfg);
        if *lock(&self.dns_entries) != dns {
            self.restart_dns(&dns);
        }
        self.apply();
        metrics::counter!(m::CONFIG_RELOADS, "outcome" => "ok").increment(1);
        Ok(self.host.pool().snapshot().len())
    }

    /// Replaces the pool with the union of all sources.
    fn apply(&self) {
        let union: Vec<WorkerEndpoint> = {
            let s = lock(&self.sources);
            s.cli.iter().chain(s.file.iter()).chain(s.dns.iter().flatten()).cloned().collect()
        };
        let cfg = self.host.config();
        let change = self.host.pool().replace(&union, &cfg.breaker);
        for w in &change.added {
            tracing::info!(worker = %w.endpoint, "worker added");
        }
        for w in &change.removed {
            tracing::info!(worker = %w.endpoint, in_flight = w.in_flight(), "worker removed");
        }
        if !change.added.is_empty() {
            self.host.health_wake().notify_one();
        }
    }

    fn restart_dns(self: &Arc<Self>, entries: &[DnsDiscovery]) {
        let mut tasks = lock(&self.dns_tasks);
        for t in tasks.drain(..) {
            t.abort();
        }
        *lock(&self.dns_entries) = entries.to_vec();
        lock(&self.sources).dns = vec![Vec::new(); entries.len()];
        for (idx, entry) in entries.iter().cloned().enumerate() {
            let d = self.clone();
            tasks.push(tokio::spawn(async move { d.run_dns(idx, entry).await }));
        }
    }

    /// Re-resolves one name every `interval_ms`. A failed lookup keeps the previous list: a
    /// DNS hiccup must not empty the cluster.
    async fn run_dns(self: Arc<Self>, idx: usize, entry: DnsDiscovery) {
        let mut stop = self.stop.clone();
        loop {
            match resolve(&entry).await {
                Ok(list) => {
                    let changed = {
                        let mut s = lock(&self.sources);
                        match s.dns.get_mut(idx) {
                            Some(slot) if *slot != list => {
                                *slot = list;
                                true
                            }
                            _ => false,
                        }
                    };
                    if changed {
                        self.apply();
                    }
                }
                Err(e) => tracing::warn!(name = entry.name, "DNS discovery: {e}; keeping the previous list"),
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(entry.interval_ms)) => {}
                _ = stop.changed() => return,
            }
        }
    }
}

/// Resolves `name:port` once into worker endpoints (deduplicated, sorted).
pub async fn resolve(entry: &DnsDiscovery) -> std::io::Result<Vec<WorkerEndpoint>> {
    let addrs = tokio::net::lookup_host((entry.name.as_str(), entry.port)).await?;
    let ips: BTreeSet<IpAddr> = addrs.map(|a| a.ip()).collect();
    Ok(ips
        .into_iter()
        .map(|ip| {
            let host = match ip {
                IpAddr::V4(v4) => v4.to_string(),
                IpAddr::V6(v6) => format!("[{v6}]"),
            };
            WorkerEndpoint::new(
                format!("http://{host}:{}", entry.port),
                Some(format!("http://{host}:{}", entry.admin_port)),
            )
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn resolves_a_name_into_workers_with_the_admin_port() {
        let entry = DnsDiscovery { name: "localhost".into(), port: 8081, admin_port: 9081, interval_ms: 1000 };
        let list = resolve(&entry).await.unwrap();
        let v4 = list.iter().find(|w| w.url == "http://127.0.0.1:8081").expect("localhost resolves to 127.0.0.1");
        assert_eq!(v4.admin.as_deref(), Some("http://127.0.0.1:9081"));
        let bad = DnsDiscovery { name: "no-such-host.invalid".into(), ..entry };
        assert!(resolve(&bad).await.is_err());
    }
}
