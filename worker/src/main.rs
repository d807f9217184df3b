//! `sieve-worker`: scores (query, item) pairs with a decoder LLM on one device.
//!
//! ```text
//! sieve-worker --model default|PATH [--device cpu|cuda:N] [--host H] [--port 8081]
//!              [--admin-host 127.0.0.1] [--admin-port 9081] [--grpc-port 50051]
//!              [--no-prefix-reuse] [--no-autotune] [--config FILE]
//! ```
//!
//! SIGTERM/SIGINT (or an authorised `POST /drain` on the admin port): refuse new calls, finish
//! those in flight, close the connections, exit; all within `server.drain_timeout_ms`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use sieve_server::cli::{PortFlags, PortTargets};
use sieve_worker::config::WorkerConfig;
use sieve_worker::WorkerError;

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
    #[command(flatten)]
    ports: PortFlags,
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
        c.model.device = d.parse().map_err(|e| WorkerError::Config(format!("--device: {e}")))?;
    }
    cli.ports.apply(PortTargets {
        host: &mut c.server.host,
        port: &mut c.server.port,
        admin_host: &mut c.server.admin_host,
        admin_port: &mut c.server.admin_port,
        grpc_port: &mut c.grpc.port,
    });
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
    let cfg = match config_from(&cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sieve-worker: {e}");
            return ExitCode::from(2);
        }
    };
    // After the config: it says the log format and where spans go. Held until exit, when the
    // spans still buffered are sent.
    let _trace = match sieve_server::cli::init_tracing_with("info", "sieve-worker", &cfg.log, &cfg.tracing) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("sieve-worker: {e}");
            return ExitCode::from(2);
        }
    };
    let prometheus = match sieve_worker::metrics::install() {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::warn!("metrics disabled: {e}");
            None
        }
    };
    // Two runtime threads: the model runs on its own compute pool; the runtime only moves bytes.
    let rt = match sieve_server::cli::runtime_with_threads("sieve-worker", 2) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    rt.block_on(serve(cfg, prometheus))
}

/// Starts the worker, then waits for the model and for a signal (or `POST /drain`) to drain.
async fn serve(cfg: WorkerConfig, prometheus: Option<metrics_exporter_prometheus::PrometheusHandle>) -> ExitCode {
    let mut worker = match sieve_worker::start(cfg, prometheus).await {
        Ok(w) => w,
        Err(e) => {
            eprintln!("sieve-worker: {e}");
            return ExitCode::from(e.exit_code());
        }
    };
    // The one machine-readable line launchers wait for.
    println!("{}", worker.listening_line());
    let app = worker.app.clone();
    let shutdown = async {
        tokio::select! {
            _ = sieve_server::cli::shutdown_signal() => tracing::info!("signal: draining"),
            _ = app.drain_requested.notified() => tracing::info!("POST /drain: draining"),
        }
    };
    tokio::pin!(shutdown);
    tokio::select! {
        loaded = worker.loaded() => if let Err(e) = loaded {
            eprintln!("sieve-worker: {e}");
            return ExitCode::FAILURE;
        },
        _ = &mut shutdown => return ExitCode::SUCCESS,
    }
    (&mut shutdown).await;
    worker.drain_and_stop().await;
    ExitCode::SUCCESS
}
