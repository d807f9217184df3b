//! `sieve-worker`: scores (query, item) pairs with a decoder LLM on one device.
//!
//! ```text
//! sieve-worker --model default|PATH [--device cpu|cuda:N] [--port 8081] [--admin-port 9081]
//!              [--no-prefix-reuse] [--no-autotune] [--config FILE]
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
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
    /// Address to bind (default 127.0.0.1).
    #[arg(long)]
    host: Option<String>,
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

async fn serve(cfg: WorkerConfig, dev: device::Device, prometheus: Option<metrics_exporter_prometheus::PrometheusHandle>) -> ExitCode {
    let app = Arc::new(AppState::new(cfg.limits.clone(), dev.to_string(), prometheus));
    let bind = |port| sieve_shared::http::bind(&cfg.server.host, port);
    let (api, admin) = match (bind(cfg.server.port).await, bind(cfg.server.admin_port).await) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("sieve-worker: binding {}: {e}", cfg.server.host);
            return ExitCode::FAILURE;
        }
    };
    // The one machine-readable line launchers wait for.
    println!("sieve-worker listening api={} admin={}", api.1, admin.1);
    let a = app.clone();
    // Both ports serve until the process exits (a drain refuses new work and waits first).
    tokio::spawn(sieve_shared::http::serve(api.0, move |req| server::api::handle(a.clone(), req), std::future::pending()));
    let a = app.clone();
    tokio::spawn(sieve_shared::http::serve(admin.0, move |req| server::admin::handle(a.clone(), req), std::future::pending()));

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

    let shutdown = shutdown_signal();
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
    drain(&app, Duration::from_millis(cfg.server.drain_timeout_ms)).await;
    ExitCode::SUCCESS
}

/// Stops taking new calls (503, /ready false) and waits for the in-flight ones.
async fn drain(app: &AppState, timeout: Duration) {
    app.state.draining.store(true, Ordering::Release);
    let t0 = Instant::now();
    tracing::info!("draining: {} calls in flight", EngineState::get(&app.state.in_flight_requests));
    while EngineState::get(&app.state.in_flight_requests) > 0 && t0.elapsed() < timeout {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Let the last responses leave the sockets.
    tokio::time::sleep(Duration::from_millis(50)).await;
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
