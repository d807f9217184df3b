//! `sieve-loadtest`: load tests for Sieve. Subcommands: `sim-worker` (a simulated worker).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use sieve_loadtest::sim::{SimConfig, SimWorker, Slowdown};
use sieve_shared::CostModel;

#[derive(Parser)]
#[command(name = "sieve-loadtest", version, about = "Sieve load tests and simulated workers")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the worker API and admin endpoints with compute times from a cost model.
    SimWorker(SimWorkerArgs),
}

#[derive(Args)]
struct SimWorkerArgs {
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// API port; 0 picks a free port.
    #[arg(long, default_value_t = 8081)]
    port: u16,
    /// Admin port; 0 picks a free port.
    #[arg(long, default_value_t = 9081)]
    admin_port: u16,
    /// Cost model file (TOML or JSON: request_ms, token_ms, token_context_ms).
    #[arg(long)]
    cost_model: Option<PathBuf>,
    /// Throughput multiplier (2 = twice as fast).
    #[arg(long, default_value_t = 1.0)]
    speed: f64,
    /// Calls computed at once; more wait in a FIFO queue.
    #[arg(long, default_value_t = 1)]
    slots: usize,
    /// Log-normal noise on compute time (sigma of ln time).
    #[arg(long, default_value_t = 0.0)]
    jitter: f64,
    /// Fraction of calls failing with 500 part-way through compute.
    #[arg(long, default_value_t = 0.0)]
    fail_rate: f64,
    /// Slow down by FACTOR from START_S for DURATION_S: FACTOR[@START_S[+DURATION_S]]. Repeatable.
    #[arg(long)]
    slowdown: Vec<Slowdown>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Calls waiting for a slot beyond which new calls get 429 (0: unbounded).
    #[arg(long, default_value_t = 0)]
    max_queue: usize,
    #[arg(long, default_value_t = 32_768)]
    max_batch_tokens: u64,
    #[arg(long, default_value_t = 8192)]
    max_seq_tokens: u64,
    /// Model name reported in responses.
    #[arg(long, default_value = "sim")]
    model: String,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sieve-loadtest: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::SimWorker(args) => rt.block_on(sim_worker(args)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sieve-loadtest: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn sim_worker(a: SimWorkerArgs) -> anyhow::Result<()> {
    let cost = match &a.cost_model {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
            CostModel::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?
        }
        None => CostModel::default(),
    };
    let config = SimConfig {
        model: a.model,
        cost,
        speed: a.speed,
        slots: a.slots,
        jitter: a.jitter,
        fail_rate: a.fail_rate,
        slowdowns: a.slowdown,
        seed: a.seed,
        max_queue: a.max_queue,
        max_batch_tokens: a.max_batch_tokens,
        max_seq_tokens: a.max_seq_tokens,
        ..SimConfig::default()
    };
    let worker = SimWorker::start(config, &a.host, a.port, a.admin_port).await?;
    println!("{}", worker.listening_line());
    wait_for_signal().await;
    // Drain like the real worker: refuse new calls, finish running ones, then exit.
    worker.drain();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while worker.engine().counters().in_flight.load(Ordering::Relaxed) > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    worker.shutdown().await;
    Ok(())
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
