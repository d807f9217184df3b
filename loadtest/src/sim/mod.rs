//! A simulated worker: the worker's API and admin endpoints, backed by a cost model instead of
//! a model. Start one in-process with [`SimWorker::start`], or as a process with
//! `sieve-loadtest sim-worker`.

pub mod config;
pub mod engine;
pub mod http;
pub mod scores;
pub mod tokens;

use std::net::SocketAddr;
use std::sync::Arc;

use sieve_shared::WorkerEndpoint;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use config::{SimConfig, SimSettings, SimSettingsUpdate, Slowdown};
pub use engine::SimEngine;
use http::Stop;

use crate::LoadtestError;

/// A running simulated worker. Dropping it kills it.
pub struct SimWorker {
    pub api_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    engine: Arc<SimEngine>,
    stop: watch::Sender<Stop>,
    tasks: Vec<JoinHandle<()>>,
}

impl SimWorker {
    /// Binds the API and admin ports on `host` (0: a free port) and starts serving.
    pub async fn start(config: SimConfig, host: &str, port: u16, admin_port: u16) -> Result<SimWorker, LoadtestError> {
        config.validate().map_err(LoadtestError::Config)?;
        let api = TcpListener::bind((host, port)).await?;
        let admin = TcpListener::bind((host, admin_port)).await?;
        let (api_addr, admin_addr) = (api.local_addr()?, admin.local_addr()?);
        let engine = Arc::new(SimEngine::new(config));
        let (stop, stop_rx) = watch::channel(Stop::Running);
        let e = engine.clone();
        let api_task = tokio::spawn(sieve_shared::http::serve(api, move |r| http::api(e.clone(), r), http::stopped(stop_rx.clone())));
        let e = engine.clone();
        let admin_task = tokio::spawn(sieve_shared::http::serve(admin, move |r| http::admin(e.clone(), r), http::stopped(stop_rx)));
        Ok(SimWorker { api_addr, admin_addr, engine, stop, tasks: vec![api_task, admin_task] })
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

    /// The line a worker prints on start-up.
    pub fn listening_line(&self) -> String {
        format!("sieve-worker listening api={} admin={}", self.api_addr, self.admin_addr)
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

    /// Drains, waits for running calls, closes the ports.
    pub async fn shutdown(mut self) {
        self.engine.drain();
        let _ = self.stop.send(Stop::Graceful);
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
