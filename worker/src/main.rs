//! `sieve-worker`: scores (query, item) pairs with a decoder LLM on one device.
//!
//! ```text
//! sieve-worker --model default|PATH [--device cpu|cuda:N] [--host H] [--port 8081]
//!              [--admin-host 127.0.0.1] [--admin-port 9081]
//!              [--no-prefix-reuse] [--no-autotune] [--config FILE]
//! ```
//!
//! SIGTERM/SIGINT (or an authorised `POST /drain` on the admin port): refuse new calls, finish
//! those in flight, close the connections, exit; all within `server.drain_timeout_ms`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use sieve_shared::http::{self, bind, AdminAuth, StopMode, Stopper};
use sieve_worker::config::WorkerConfig;
use sieve_worker::engine::EngineState;
use sieve_worker::server::{self, AppState};
use sieve_worker::{device, WorkerError};

#[derive(Parser, Debug)]
#[command(name = "sieve-worker", version, about = "Sieve worker: point-wise relevance scoring with a decoder LLM")]
struct Cli {
    /// `default` (the embedded SmolLM2-135M-Instruct, fetched when missing), a .gguf file, or an
    /// HF checkpoint directory.
    #[arg(long)]
    model: Option<String>,
    /// `cpu` or `cuda:N`.
    #[arg(long)]
    device: Option<String>,
    /// Address of the scoring API (default 127.0.0.1). The admin port has its own.
    #[arg(long)]
    host: Option<String>,
    /// Address of the admin port (default 127.0.0.1, whatever --host says).
    #[arg(long)]
    admin_host: Option<String>,
    /// Scoring API port (0 picks a free one).
    #[arg(long)]
    port: Option<u16>,
    /// Admin port: /health /ready /metrics /stats (0 picks a free one).
    #[arg(long)]
    admin_port: Option<u16>,
    /// Compute every pair's whole prompt (no shared prefix, no prefix cache).
    #[arg(long)]
    no_prefix_reuse: bool,
    /// MoE models: skip the start-up measurement of the kernel variants (a cached calibration
    /// for this model and machine is still used; otherwise the backend's default costs).
    #[arg(long)]
    no_autotune: bool,
    /// Compute threads (0 = all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// A TOML config file (see configs/worker.toml); flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
}

fn config_from(cli: &Cli) -> Result<WorkerConfig, WorkerError> {
    let mut c = match &cli.config {
        Some(p) => WorkerConfig::from_file(p)?,
        None => WorkerConfig::default(),
    };
    if let Some(m) = &cli.model {
        c.model.path = m.clone();
    }
    if let Some(d) = &cli.device {
        c.model.device = d.clone();
    }
    if let Some(h) = &cli.host {
        c.server.host = h.clone();
    }
    if let Some(h) = &cli.admin_host {
        c.server.admin_host = h.clone();
    }
    if let Some(p) = cli.port {
        c.server.port = p;
    }
    if let Some(p) = cli.admin_port {
        c.server.admin_port = p;
    }
    if let Some(t) = cli.threads {
        c.model.threads = t;
    }
    if cli.no_prefix_reuse {
        c.engine.prefix_reuse = false;
    }
    if cli.no_autotune {
        c.moe.autotune = false;
    }
    c.validate()?;
    Ok(c)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cfg = match config_from(&cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sieve-worker: {e}");
            return ExitCode::from(2);
        }
    };
    // Parse the device before anything starts, so a bad --device fails fast.
    let dev = match device::Device::parse(&cfg.model.device) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("sieve-worker: {e}");
            return ExitCode::from(2);
        }
    };
    let prometheus = match metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder() {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::warn!("metrics disabled: {e}");
            None
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sieve-worker: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(serve(cfg, dev, prometheus))
}

async fn serve(
    cfg: WorkerConfig,
    dev: device::Device,
    prometheus: Option<metrics_exporter_prometheus::PrometheusHandle>,
) -> ExitCode {
    let admin_auth = match AdminAuth::load(&cfg.admin) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("sieve-worker: {e}");
            return ExitCode::from(2);
        }
    };
    let app = Arc::new(AppState::new(cfg.limits.clone(), dev.to_string(), prometheus).with_admin(admin_auth));
    let (api, admin) = match bind(&cfg.server.host, cfg.server.port).await {
        Ok(a) => match bind(&cfg.server.admin_host, cfg.server.admin_port).await {
            Ok(b) => (a, b),
            Err(e) => {
                eprintln!("sieve-worker: binding the admin port on {}: {e}", cfg.server.admin_host);
                return ExitCode::FAILURE;
            }
        },
        Err(e) => {
            eprintln!("sieve-worker: binding {}: {e}", cfg.server.host);
            return ExitCode::FAILURE;
        }
    };
    // The one machine-readable line launchers wait for.
    println!("sieve-worker listening api={} admin={}", api.1, admin.1);
    // Both ports serve until the drain is over; then they close their connections gracefully,
    // within what is left of the drain timeout.
    let stopper = Stopper::new();
    let a = app.clone();
    let api_server = tokio::spawn(http::serve(
        api.0,
        cfg.http.clone(),
        move |req| server::api::handle(a.clone(), req),
        stopper.signal(),
    ));
    let a = app.clone();
    let admin_server = tokio::spawn(http::serve(
        admin.0,
        cfg.http.clone(),
        move |req| server::admin::handle(a.clone(), req),
        stopper.signal(),
    ));

    // Load on a plain thread: the ports answer (/health 200, /ready 503) meanwhile.
    let (loaded_tx, loaded_rx) = tokio::sync::oneshot::channel();
    let a = app.clone();
    let load_cfg = cfg.clone();
    std::thread::spawn(move || {
        let t0 = Instant::now();
        let r = device::start_engine(&load_cfg, dev, a.state.clone());
        let r = r.map(|(engine, name)| {
            tracing::info!("{name} ready on {dev} in {:.1} s", t0.elapsed().as_secs_f64());
            let _ = a.model_name.set(name);
            let _ = a.engine.set(engine);
        });
        let _ = loaded_tx.send(r);
    });

    let shutdown = async {
        tokio::select! {
            _ = shutdown_signal() => tracing::info!("signal: draining"),
            _ = app.drain_requested.notified() => tracing::info!("POST /drain: draining"),
        }
    };
    tokio::pin!(shutdown);
    tokio::select! {
        loaded = loaded_rx => match loaded {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                *app.state.load_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                eprintln!("sieve-worker: {e}");
                return ExitCode::FAILURE;
            }
            Err(_) => return ExitCode::FAILURE,
        },
        _ = &mut shutdown => return ExitCode::SUCCESS,
    }
    (&mut shutdown).await;
    let deadline = Instant::now() + Duration::from_millis(cfg.server.drain_timeout_ms);
    drain(&app, deadline).await;
    // Whatever the clients do (stalled bodies, half-sent heads), the servers end by the deadline.
    stopper.stop(StopMode::Graceful(Some(deadline.saturating_duration_since(Instant::now()))));
    let _ = tokio::join!(api_server, admin_server);
    ExitCode::SUCCESS
}

/// Stops taking new calls (503, /ready false) and waits for the in-flight ones, until `deadline`.
async fn drain(app: &AppState, deadline: Instant) {
    app.state.draining.store(true, Ordering::Release);
    let t0 = Instant::now();
    tracing::info!("draining: {} calls in flight", EngineState::get(&app.state.in_flight_requests));
    while EngineState::get(&app.state.in_flight_requests) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tracing::info!("drained in {:.2} s", t0.elapsed().as_secs_f64());
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
