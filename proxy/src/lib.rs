//! The Sieve proxy: splits a scoring call into shards of near-equal predicted finish time,
//! sends each to the least-loaded worker (deadline, retries, hedges), and merges the scores
//! back in order. Stateless: any number can run side by side.
//!
//! Start one in-process with [`start`], or run `sieve-proxy`.

pub mod admin;
pub mod balancer;
pub mod client;
pub mod cluster;
pub mod config;
pub mod drain;
pub mod error;
pub mod estimate;
pub mod http_api;
pub mod local_cluster;
pub mod metrics;
pub mod pair_cache;
pub mod prefix_holders;
pub mod ranking;
pub mod request;
pub mod request_trace;
pub mod split;
pub mod state;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sieve_server::http;
use sieve_server::http::{AdminAuth, StopMode, Stopper};
use sieve_shared::{ProxyConfig, WorkerEndpoint};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use cluster::discovery::Discovery;
pub use config::Overrides;
pub use error::{ProxyError, Result};
pub use state::AppState;

/// What to start a proxy with.
#[derive(Debug, Clone, Default)]
pub struct Launch {
    /// The effective config (file + overrides already applied).
    pub config: ProxyConfig,
    /// The file it came from, watched for changes (hot reload).
    pub config_path: Option<PathBuf>,
    /// Re-applied on every reload.
    pub overrides: Overrides,
    /// `--worker` flags: workers besides the config's.
    pub workers: Vec<WorkerEndpoint>,
    /// The admin policy; `None`: loaded from the config's `[admin]` (token file or
    /// `SIEVE_ADMIN_TOKEN`).
    pub admin: Option<AdminAuth>,
}

/// A proxy serving on its two ports. Dropping it stops the servers (without draining).
pub struct RunningProxy {
    pub api_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    /// The gRPC API's address, when `[grpc] port` is set.
    pub grpc_addr: Option<SocketAddr>,
    pub state: Arc<AppState>,
    pub discovery: Arc<Discovery>,
    stop: watch::Sender<bool>,
    /// Ends the servers, gRPC included (after the drain, within what is left of its timeout).
    servers: Stopper,
    tasks: Vec<JoinHandle<()>>,
}

/// Binds its ports (API, admin, and gRPC when `[grpc] port` is set) and starts serving, health
/// checking and discovery.
pub async fn start(launch: Launch) -> Result<RunningProxy> {
    launch.config.validate().map_err(ProxyError::Config)?;
    let cfg = launch.config;
    let auth = match launch.admin {
        Some(a) => a,
        None => AdminAuth::load(&cfg.admin).map_err(ProxyError::Config)?,
    };
    let backlog = cfg.http.listen_backlog;
    let (api, api_addr) = http::bind(&cfg.server.host, cfg.server.port, backlog, false).await?;
    let (admin, admin_addr) = http::bind(&cfg.server.admin_host, cfg.server.admin_port, backlog, false).await?;
    let grpc = match cfg.grpc.port {
        Some(port) => Some(http::bind(&cfg.server.host, port, backlog, false).await?),
        None => None,
    };
    let (grpc, grpc_addr) = grpc.unzip();
    let (http_cfg, grpc_cfg) = (cfg.http.clone(), cfg.grpc.clone());
    let request_trace = request_trace::Trace::open(&cfg.request_trace).map_err(ProxyError::Config)?;
    let mut state = AppState::new(cfg, metrics::handle());
    state.request_trace = request_trace;
    let state = Arc::new(state);
    let (stop, stop_rx) = watch::channel(false);
    let discovery =
        Discovery::new(state.clone(), launch.config_path, launch.overrides, launch.workers, stop_rx.clone());

    let servers = Stopper::new();
    let mut tasks = Vec::new();
    let s = state.clone();
    tasks.push(tokio::spawn(http::serve(
        api,
        http_cfg.clone(),
        move |r| http_api::handle(s.clone(), r),
        servers.signal(),
    )));
    if let Some(listener) = grpc {
        let api = Arc::new(http_api::Api(state.clone()));
        tasks.push(tokio::spawn(sieve_server::grpc::serve(
            listener,
            api,
            grpc_cfg,
            http_cfg.clone(),
            servers.signal(),
        )));
    }
    let (s, d, auth) = (state.clone(), discovery.clone(), Arc::new(auth));
    tasks.push(tokio::spawn(http::serve(
        admin,
        http_cfg,
        move |r| admin::handle(s.clone(), d.clone(), auth.clone(), r),
        servers.signal(),
    )));
    tasks.push(tokio::spawn(cluster::health::run(state.clone(), stop_rx.clone())));
    tasks.extend(discovery.spawn_file_watch());
    let (s, mut stop_upkeep) = (state.clone(), stop_rx);
    tasks.push(tokio::spawn(async move {
        // The Prometheus recorder needs its histograms drained now and then.
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(5)) => s.metrics.run_upkeep(),
                _ = stop_upkeep.changed() => return,
            }
        }
    }));
    Ok(RunningProxy { api_addr, admin_addr, grpc_addr, state, discovery, stop, servers, tasks })
}

impl RunningProxy {
    pub fn api_url(&self) -> String {
        format!("http://{}", self.api_addr)
    }

    pub fn admin_url(&self) -> String {
        format!("http://{}", self.admin_addr)
    }

    /// The gRPC API's URL (`http://HOST:PORT`), when it is served.
    pub fn grpc_url(&self) -> Option<String> {
        self.grpc_addr.map(|a| format!("http://{a}"))
    }

    /// The line `sieve-proxy` prints on start-up (`grpc=` only when the gRPC port is on).
    pub fn listening_line(&self) -> String {
        let grpc = self.grpc_addr.map(|a| format!(" grpc={a}")).unwrap_or_default();
        format!("sieve-proxy listening api={} admin={}{grpc}", self.api_addr, self.admin_addr)
    }

    /// Graceful drain: refuse new requests (503), wait for those in flight, then close the
    /// connections; all of it within `drain.timeout_ms`, whatever the clients do. True when no
    /// request was cut off.
    pub async fn drain_and_stop(mut self) -> bool {
        let timeout = Duration::from_millis(self.state.config().drain.timeout_ms);
        let deadline = tokio::time::Instant::now() + timeout;
        let idle = self.state.drain.drain(timeout).await;
        self.servers.stop(StopMode::Graceful(Some(deadline.saturating_duration_since(tokio::time::Instant::now()))));
        let _ = self.stop.send(true);
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
        idle
    }

    /// Stops at once.
    pub async fn stop(mut self) {
        self.servers.stop(StopMode::Kill);
        let _ = self.stop.send(true);
        for t in self.tasks.drain(..) {
            t.abort();
            let _ = t.await;
        }
    }
}

impl Drop for RunningProxy {
    fn drop(&mut self) {
        self.servers.stop(StopMode::Kill);
        let _ = self.stop.send(true);
        for t in &self.tasks {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;

    use super::*;

    #[tokio::test]
    async fn drain_and_stop_ends_within_the_drain_timeout_despite_stalled_clients() {
        let mut config = ProxyConfig::default();
        config.server.port = 0;
        config.server.admin_port = 0;
        config.drain.timeout_ms = 300;
        // Far longer than the drain: only the drain's bound can end these clients.
        config.http.body_read_timeout_ms = 60_000;
        config.http.header_read_timeout_ms = 60_000;
        let proxy = start(Launch { config, admin: Some(AdminAuth::default()), ..Launch::default() }).await.unwrap();
        let mut stalled = TcpStream::connect(proxy.api_addr).await.unwrap();
        stalled.write_all(b"POST /v1/score HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{").await.unwrap();
        let mut half = TcpStream::connect(proxy.admin_addr).await.unwrap();
        half.write_all(b"GET /ready HTTP/1.1\r\n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let t0 = Instant::now();
        tokio::time::timeout(Duration::from_secs(10), proxy.drain_and_stop()).await.expect("drain_and_stop returned");
        let took = t0.elapsed();
        assert!(took < Duration::from_millis(1500), "took {took:?}, drain timeout 300 ms");
    }
}
