//! `sieve-proxy [--host H] [--port 8080] [--admin-host 127.0.0.1] [--admin-port 9080]
//! [--worker URL[,admin=URL]]... [--config FILE]`. Prints
//! `sieve-proxy listening api=HOST:PORT admin=HOST:PORT [grpc=HOST:PORT]` once its ports are
//! bound (`--grpc-port` or `[grpc] port` adds the gRPC API).
//! SIGTERM/SIGINT or an authorised `POST /drain`: drain (finish in flight, refuse new) and exit,
//! within `drain.timeout_ms`; SIGHUP: reload the config file.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use sieve_proxy::{Launch, Overrides};
use sieve_server::cli::PortFlags;
use sieve_shared::WorkerEndpoint;

#[derive(Parser)]
#[command(name = "sieve-proxy", version, about = "Sieve proxy: cost-balanced fan-out of scoring calls over workers")]
struct Cli {
    #[command(flatten)]
    ports: PortFlags,
    /// A worker: its API base URL, optionally with its admin base URL,
    /// e.g. http://10.0.0.5:8081,admin=http://10.0.0.5:9081. Repeatable.
    #[arg(long = "worker", value_name = "URL[,admin=URL]")]
    workers: Vec<WorkerEndpoint>,
    /// Config file (TOML, see configs/proxy.toml); watched and hot-reloaded.
    #[arg(long)]
    config: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let overrides: Overrides = cli.ports;
    let config = match sieve_proxy::config::load(cli.config.as_deref(), &overrides) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sieve-proxy: config: {e}");
            return ExitCode::from(2);
        }
    };
    // After the config: it says the log format and where spans go. Held until exit, when the
    // spans still buffered are sent.
    let _trace = match sieve_server::cli::init_tracing_with("info", "sieve-proxy", &config.log, &config.tracing) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("sieve-proxy: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match sieve_server::cli::runtime("sieve-proxy") {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let default_deadline_ms = config.deadline.default_ms;
    rt.block_on(async move {
        let launch = Launch { config, config_path: cli.config, overrides, workers: cli.workers, admin: None };
        let proxy = match sieve_proxy::start(launch).await {
            Ok(p) => p,
            Err(e) => {
                eprintln!("sieve-proxy: {e}");
                return ExitCode::FAILURE;
            }
        };
        println!("{}", proxy.listening_line());
        // The deadline a call without one gets: a newcomer's first 504 is usually this one.
        tracing::info!(
            default_deadline_ms,
            "calls without a deadline get {default_deadline_ms} ms ([deadline] default_ms); a call may set its own with \
             deadline_ms in the body or the x-sieve-deadline-ms header"
        );
        wait_for_shutdown(&proxy).await;
        tracing::info!("draining");
        if proxy.drain_and_stop().await {
            ExitCode::SUCCESS
        } else {
            tracing::warn!("drain timed out with requests in flight");
            ExitCode::FAILURE
        }
    })
}

/// Returns on SIGTERM, SIGINT or `POST /drain`; reloads the config on SIGHUP meanwhile.
async fn wait_for_shutdown(proxy: &sieve_proxy::RunningProxy) {
    tokio::select! {
        _ = signals(proxy) => {}
        _ = proxy.state.drain.requested() => tracing::info!("POST /drain"),
    }
}

async fn signals(proxy: &sieve_proxy::RunningProxy) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int), Ok(mut hup)) =
            (signal(SignalKind::terminate()), signal(SignalKind::interrupt()), signal(SignalKind::hangup()))
        else {
            let _ = tokio::signal::ctrl_c().await;
            return;
        };
        loop {
            tokio::select! {
                _ = term.recv() => return,
                _ = int.recv() => return,
                _ = hup.recv() => match proxy.discovery.reload() {
                    Ok(n) => tracing::info!("SIGHUP: config reloaded, {n} workers"),
                    Err(e) => tracing::warn!("SIGHUP: config not reloaded: {e}"),
                },
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = proxy;
        let _ = tokio::signal::ctrl_c().await;
    }
}
