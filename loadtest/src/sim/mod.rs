//! A simulated worker: the worker's API and admin endpoints, backed by a cost model instead of
//! a model. Start one in-process with [`SimWorker::start`], or as a process with
//! `sieve-loadtest sim-worker`.

pub mod config;
pub mod engine;
pub mod http;
pub mod prefix;
pub mod scores;
pub mod tokens;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use sieve_server::http::{bind, AdminAuth};

use sieve_shared::WorkerEndpoint;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use config::{SimConfig, SimFileConfig, SimSettings, SimSettingsUpdate, Slowdown, Stall};
pub use engine::SimEngine;
use http::Stop;

use crate::LoadtestError;

/// A running simulated worker. Dropping it kills it.
pub struct SimWorker {
    pub api_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    /// The gRPC API's address, when `config.grpc.port` is set.
    pub grpc_addr: Option<SocketAddr>,
    engine: Arc<SimEngine>,
    stop: watch::Sender<Stop>,
    tasks: Vec<JoinHandle<()>>,
}

impl SimWorker {
    /// Binds the API port (and the gRPC port when `config.grpc.port` is set) on `host` and the
    /// admin port on `config.admin_host` (0: a free port) and starts serving.
    pub async fn start(config: SimConfig, host: &str, port: u16, admin_port: u16) -> Result<SimWorker, LoadtestError> {
        config.validate().map_err(LoadtestError::Config)?;
        let auth = Arc::new(AdminAuth::load(&config.admin).map_err(LoadtestError::Config)?);
        let backlog = config.http.listen_backlog;
        let (api, api_addr) = bind(host, port, backlog, false).await?;
        let (admin, admin_addr) = bind(&config.admin_host, admin_port, backlog, false).await?;
        let grpc = match config.grpc.port {
            Some(p) => Some(bind(host, p, backlog, false).await?),
            None => None,
        };
        let (grpc, grpc_addr) = grpc.unzip();
        let (http_cfg, grpc_cfg) = (config.http.clone(), config.grpc.clone());
        let engine = Arc::new(SimEngine::new(config));
        let (stop, stop_rx) = watch::channel(Stop::Running);
        let e = engine.clone();
        let api_task = tokio::spawn(sieve_server::http::serve(
            api,
            http_cfg.clone(),
            move |r| http::api(e.clone(), r),
            http::stopped(stop_rx.clone()),
        ));
        let mut tasks = vec![api_task];
        if let Some(l) = grpc {
            let serve = sieve_server::grpc::serve(
                l,
                engine.clone(),
                grpc_cfg,
                http_cfg.clone(),
                http::stopped(stop_rx.clone()),
            );
            tasks.push(tokio::spawn(serve));
        }
        let e = engine.clone();
        let admin_task = tokio::spawn(sieve_server::http::serve(
            admin,
            http_cfg,
            move |r| http::admin(e.clone(), auth.clone(), r),
            http::stopped(stop_rx),
        ));
        tasks.push(admin_task);
        Ok(SimWorker { api_addr, admin_addr, grpc_addr, engine, stop, tasks })
    }

    /// Starts on loopback with free ports.
    pub async fn start_local(config: SimConfig) -> Result<SimWorker, LoadtestError> {
        Self::start(config, "127.0.0.1", 0, 0).await
    }

    pub fn api_url(&self) -> String {
        format!("http://{}", self.api_addr)
    }

    pub fn admin_url(&self) -> String {
        format!("http://{}", self.admin_addr)
    }

    /// How a proxy addresses this worker.
    pub fn endpoint(&self) -> WorkerEndpoint {
        WorkerEndpoint::new(self.api_url(), Some(self.admin_url()))
    }

    /// The gRPC API's URL (`http://HOST:PORT`), when it is served.
    pub fn grpc_url(&self) -> Option<String> {
        self.grpc_addr.map(|a| format!("http://{a}"))
    }

    /// The line a worker prints on start-up (`grpc=` only when the gRPC port is on).
    pub fn listening_line(&self) -> String {
        let grpc = self.grpc_addr.map(|a| format!(" grpc={a}")).unwrap_or_default();
        format!("sieve-worker listening api={} admin={}{grpc}", self.api_addr, self.admin_addr)
    }

    pub fn engine(&self) -> &Arc<SimEngine> {
        &self.engine
    }

    pub fn update(&self, u: &SimSettingsUpdate) -> Result<SimSettings, String> {
        self.engine.update(u)
    }

    /// Refuses new calls (503) and reports draining; running calls finish.
    pub fn drain(&self) {
        self.engine.drain();
    }

    /// Drops every connection and closes both ports at once, like a crash.
    pub fn kill(&self) {
        let _ = self.stop.send(Stop::Kill);
    }

    /// Drains, waits for running calls, closes the ports; within `drain_timeout_ms`.
    pub async fn shutdown(self) {
        let grace = Duration::from_millis(self.engine.config().drain_timeout_ms);
        self.shutdown_within(grace).await;
    }

    /// Drains, waits for running calls, closes the ports; within `grace` whatever the clients do.
    pub async fn shutdown_within(mut self, grace: Duration) {
        self.engine.drain();
        let _ = self.stop.send(Stop::Graceful(grace));
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
    }
}

impl Drop for SimWorker {
    fn drop(&mut self) {
        if !self.tasks.is_empty() {
            let _ = self.stop.send(Stop::Kill);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sieve_shared::http_config::AdminConfig;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    async fn put_sim(addr: SocketAddr, token: Option<&str>) -> u16 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let body = r#"{"speed": 2.0}"#;
        let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
        let req = format!(
            "PUT /sim HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n{auth}\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut out)).await.unwrap().unwrap();
        out.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
    }

    #[tokio::test]
    async fn put_sim_needs_the_admin_token() {
        let file = std::env::temp_dir().join(format!("sieve-sim-token-{}", std::process::id()));
        std::fs::write(&file, "tok\n").unwrap();
        let admin = AdminConfig { token_file: file.display().to_string(), protect_reads: false };
        let w = SimWorker::start_local(SimConfig { admin, ..SimConfig::default() }).await.unwrap();
        assert_eq!(w.admin_addr.ip().to_string(), "127.0.0.1");
        assert_eq!(put_sim(w.admin_addr, None).await, 401);
        assert_eq!(put_sim(w.admin_addr, Some("wrong")).await, 401);
        assert_eq!(w.engine().settings().speed, 1.0, "a refused update changes nothing");
        assert_eq!(put_sim(w.admin_addr, Some("tok")).await, 200);
        assert_eq!(w.engine().settings().speed, 2.0);
        let _ = std::fs::remove_file(&file);

        let open = SimWorker::start_local(SimConfig::default()).await.unwrap();
        assert_eq!(put_sim(open.admin_addr, Some("tok")).await, 403, "no token configured");
        tokio::time::timeout(Duration::from_secs(5), open.shutdown_within(Duration::from_millis(100)))
            .await
            .expect("bounded stop");
    }
}
