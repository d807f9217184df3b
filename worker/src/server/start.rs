//! Starting and stopping a worker in-process, like the proxy's `sieve_proxy::start`: both ports
//! bound and served, the model loaded on a plain thread meanwhile (the ports answer `/health`
//! 200 and `/ready` 503 until it is), and the drain. `main.rs` is this plus the command line,
//! logging, the runtime and the signals; tests and examples start workers the same way.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusHandle;
use sieve_server::grpc;
use sieve_server::http::{self, bind, AdminAuth, StopMode, Stopper};
use sieve_shared::grpc_config::GrpcConfig;
use sieve_shared::http_config::HttpConfig;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::{admin, api, AppState};
use crate::config::{ServerConfig, WorkerConfig};
use crate::{device, WorkerError};

/// Why a worker did not start. A bad configuration is the operator's to fix (exit code 2); a
/// port that cannot be bound is the machine's (exit code 1).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Config(String),
    #[error("binding {host}: {err}")]
    BindApi { host: String, err: std::io::Error },
    #[error("binding the admin port on {host}: {err}")]
    BindAdmin { host: String, err: std::io::Error },
    #[error("binding the gRPC port on {host}: {err}")]
    BindGrpc { host: String, err: std::io::Error },
}

impl StartError {
    pub fn exit_code(&self) -> u8 {
        match self {
            StartError::Config(_) => 2,
            _ => 1,
        }
    }
}

/// A worker serving on its two ports. Dropping it kills the servers; `drain_and_stop` is the
/// orderly end.
pub struct RunningWorker {
    pub api_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    /// The gRPC API's address, when `[grpc] port` is set.
    pub grpc_addr: Option<SocketAddr>,
    pub app: Arc<AppState>,
    drain_timeout: Duration,
    servers: Stopper,
    tasks: Vec<JoinHandle<()>>,
    /// The model load's outcome, while nobody has waited for it.
    loading: Option<oneshot::Receiver<Result<(), WorkerError>>>,
}

/// Starts a worker from its config: both ports bound and served, the model loaded on a thread.
/// `prometheus` renders `/metrics` (none: the route answers without figures).
pub async fn start(cfg: WorkerConfig, prometheus: Option<PrometheusHandle>) -> Result<RunningWorker, StartError> {
    let dev = cfg.model.device;
    let admin_auth = AdminAuth::load(&cfg.admin).map_err(StartError::Config)?;
    let app = Arc::new(
        AppState::new(cfg.limits.clone(), dev.to_string(), prometheus)
            .with_admin(admin_auth)
            .with_buffer_budget(cfg.http.max_buffered_bytes)
            .with_api(cfg.api.clone()),
    );
    let mut running = serve(app.clone(), &cfg.server, &cfg.http).await?;
    if cfg.grpc.port.is_some() {
        running.serve_grpc(&cfg.server.host, &cfg.grpc, &cfg.http).await?;
    }

    let (loaded_tx, loaded_rx) = oneshot::channel();
    std::thread::spawn(move || {
        let t0 = Instant::now();
        let r = device::start_engine(&cfg, dev, app.state.clone()).map(|(engine, name, template)| {
            tracing::info!("{name} ready on {dev} in {:.1} s", t0.elapsed().as_secs_f64());
            let _ = app.model_name.set(name);
            let _ = app.template_id.set(template);
            let _ = app.engine.set(engine);
        });
        if let Err(e) = &r {
            *app.state.load_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
        }
        let _ = loaded_tx.send(r);
    });
    running.loading = Some(loaded_rx);
    Ok(running)
}

/// Binds both ports and serves `app` on them; the model (set in `app.engine` or not) is the
/// caller's business. Tests start a worker around an engine of their own this way.
pub async fn serve(app: Arc<AppState>, server: &ServerConfig, http: &HttpConfig) -> Result<RunningWorker, StartError> {
    let (api_l, api_addr) = bind(&server.host, server.port, http.listen_backlog, false)
        .await
        .map_err(|err| StartError::BindApi { host: server.host.clone(), err })?;
    let (admin_l, admin_addr) = bind(&server.admin_host, server.admin_port, http.listen_backlog, false)
        .await
        .map_err(|err| StartError::BindAdmin { host: server.admin_host.clone(), err })?;
    // Both ports serve until the drain is over; then they close their connections gracefully,
    // within what is left of the drain timeout.
    let servers = Stopper::new();
    let a = app.clone();
    let api_task =
        tokio::spawn(http::serve(api_l, http.clone(), move |req| api::handle(a.clone(), req), servers.signal()));
    let a = app.clone();
    let admin_task =
        tokio::spawn(http::serve(admin_l, http.clone(), move |req| admin::handle(a.clone(), req), servers.signal()));
    Ok(RunningWorker {
        api_addr,
        admin_addr,
        grpc_addr: None,
        app,
        drain_timeout: Duration::from_millis(server.drain_timeout_ms),
        servers,
        tasks: vec![api_task, admin_task],
        loading: None,
    })
}

impl RunningWorker {
    /// Adds the gRPC API on `host` at `grpc.port` (0: a free port; none: nothing to do), served
    /// and stopped with the HTTP ports.
    pub async fn serve_grpc(&mut self, host: &str, grpc: &GrpcConfig, http: &HttpConfig) -> Result<(), StartError> {
        let Some(port) = grpc.port else { return Ok(()) };
        let (l, addr) = bind(host, port, http.listen_backlog, false)
            .await
            .map_err(|err| StartError::BindGrpc { host: host.to_string(), err })?;
        let task = grpc::serve(l, self.app.clone(), grpc.clone(), http.clone(), self.servers.signal());
        self.tasks.push(tokio::spawn(task));
        self.grpc_addr = Some(addr);
        Ok(())
    }

    /// The one machine-readable line launchers wait for (`grpc=` only when it is served).
    pub fn listening_line(&self) -> String {
        let grpc = self.grpc_addr.map(|a| format!(" grpc={a}")).unwrap_or_default();
        format!("sieve-worker listening api={} admin={}{grpc}", self.api_addr, self.admin_addr)
    }

    /// Waits until the model is loaded (at once when this worker loads none); the load's error
    /// otherwise, also shown by `/ready`.
    pub async fn loaded(&mut self) -> Result<(), WorkerError> {
        let Some(rx) = self.loading.take() else { return Ok(()) };
        rx.await.unwrap_or_else(|_| Err(WorkerError::Config("the model-loading thread ended without an answer".into())))
    }

    /// Refuses new calls (503, `/ready` false), waits for the calls in flight, then closes the
    /// connections; all within `server.drain_timeout_ms`, whatever the clients do.
    pub async fn drain_and_stop(self) {
        let deadline = Instant::now() + self.drain_timeout;
        drain(&self.app, deadline).await;
        self.servers.stop(StopMode::Graceful(Some(deadline.saturating_duration_since(Instant::now()))));
        for t in self.tasks {
            let _ = t.await;
        }
    }

    /// Drops every connection at once and ends the servers.
    pub async fn stop(self) {
        self.servers.stop(StopMode::Kill);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Stops taking new calls (503, /ready false) and waits for the in-flight ones, until `deadline`.
async fn drain(app: &AppState, deadline: Instant) {
    app.state.draining.store(true, Ordering::Release);
    let t0 = Instant::now();
    tracing::info!("draining: {} calls in flight", app.state.in_flight_requests.get());
    while app.state.in_flight_requests.get() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tracing::info!("drained in {:.2} s", t0.elapsed().as_secs_f64());
}
