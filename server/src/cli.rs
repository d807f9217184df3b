//! What every Sieve binary (`sieve-proxy`, `sieve`, `sieve-worker`, `sieve-loadtest`) sets up
//! before anything else, and how it waits to stop: logs on stderr (text or JSON), filtered by
//! `RUST_LOG` (else a default level), and span export when the config asks for it
//! ([`crate::trace`]); the tokio runtime, whose failure to start is a message and an exit code
//! rather than a panic; and the wait for SIGTERM or SIGINT.

use std::io::IsTerminal;
use std::process::ExitCode;

use sieve_shared::trace_config::{LogConfig, LogFormat, TracingConfig};
use tokio::runtime::Runtime;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{filter::LevelFilter, EnvFilter, Layer};

use crate::trace::{self, TraceGuard};

/// Logs to stderr as text, filtered by `RUST_LOG`, else by `default_filter` (e.g. `"info"`);
/// no span export. For the binaries without a config file of their own.
pub fn init_tracing(default_filter: &str) {
    // With tracing off the guard holds no exporter: dropping it stops nothing.
    let _ = init_tracing_with(default_filter, "sieve", &LogConfig::default(), &TracingConfig::default());
}

/// Logs to stderr (text, colours only on a terminal so a log file or a launcher's pipe gets
/// plain text; or one JSON object a line), filtered by `RUST_LOG`, else by `default_filter`;
/// and, when `tracing.otlp_endpoint` is set, spans exported over OTLP as `service` (unless
/// `tracing.service_name` names it). Keep the guard until exit: dropping it flushes the spans.
pub fn init_tracing_with(
    default_filter: &str,
    service: &str,
    log: &LogConfig,
    tracing: &TracingConfig,
) -> Result<TraceGuard, String> {
    let filter = || EnvFilter::try_from_default_env().unwrap_or_else(|_| default_filter.into());
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    // The level filter is the log's own, so `RUST_LOG=warn` quiets the log, not the spans.
    let fmt = match log.format {
        LogFormat::Text => fmt.with_ansi(std::io::stderr().is_terminal()).with_filter(filter()).boxed(),
        LogFormat::Json => fmt.json().with_ansi(false).with_filter(filter()).boxed(),
    };
    let provider = trace::provider(tracing, service)?;
    let otel = provider.as_ref().map(|p| trace::layer(p).with_filter(LevelFilter::INFO));
    tracing_subscriber::registry()
        .with(fmt)
        .with(otel)
        .try_init()
        .map_err(|e| format!("cannot install the log subscriber: {e}"))?;
    Ok(trace::started(provider))
}

/// A multi-threaded runtime with every driver enabled and a thread per core; when it cannot
/// start, says so as `prog: cannot start the runtime: …` and gives the exit code to return.
pub fn runtime(prog: &str) -> Result<Runtime, ExitCode> {
    build(prog, tokio::runtime::Builder::new_multi_thread().enable_all())
}

/// [`runtime`] with `threads` runtime threads: for a binary whose heavy work runs on a pool of
/// its own (the worker's compute threads), so the runtime only moves bytes.
pub fn runtime_with_threads(prog: &str, threads: usize) -> Result<Runtime, ExitCode> {
    build(prog, tokio::runtime::Builder::new_multi_thread().worker_threads(threads.max(1)).enable_all())
}

fn build(prog: &str, builder: &mut tokio::runtime::Builder) -> Result<Runtime, ExitCode> {
    builder.build().map_err(|e| {
        eprintln!("{prog}: cannot start the runtime: {e}");
        ExitCode::FAILURE
    })
}

/// Returns on the first SIGTERM or SIGINT (Ctrl-C); where the signal handlers cannot be set
/// up (or off Unix), on Ctrl-C alone.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
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

/// The listening flags every server binary takes (`sieve-proxy`, `sieve-worker`), defined once.
/// Each is optional: unset, the config file's value (or its default) stands.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PortFlags {
    /// Address of the API port.
    #[arg(long)]
    pub host: Option<String>,
    /// Address of the admin port (default 127.0.0.1, whatever --host says).
    #[arg(long)]
    pub admin_host: Option<String>,
    /// API port (0: a free port). Default: the config's.
    #[arg(long)]
    pub port: Option<u16>,
    /// Admin port: /health /ready /metrics /stats (0: a free port). Default: the config's.
    #[arg(long)]
    pub admin_port: Option<u16>,
    /// gRPC API port (0: a free port). Default: the config's `[grpc] port`, off when unset.
    #[arg(long)]
    pub grpc_port: Option<u16>,
}

/// Where [`PortFlags`] land in a config: its `[server]` addresses and ports and `[grpc] port`
/// (the proxy's and the worker's config types differ, these fields do not).
pub struct PortTargets<'a> {
    pub host: &'a mut String,
    pub port: &'a mut u16,
    pub admin_host: &'a mut String,
    pub admin_port: &'a mut u16,
    pub grpc_port: &'a mut Option<u16>,
}

impl PortFlags {
    /// Overrides each target whose flag was given.
    pub fn apply(&self, t: PortTargets<'_>) {
        if let Some(h) = &self.host {
            t.host.clone_from(h);
        }
        if let Some(p) = self.port {
            *t.port = p;
        }
        if let Some(h) = &self.admin_host {
            t.admin_host.clone_from(h);
        }
        if let Some(p) = self.admin_port {
            *t.admin_port = p;
        }
        if let Some(p) = self.grpc_port {
            *t.grpc_port = Some(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtimes_start_with_the_threads_asked_for() {
        let rt = runtime_with_threads("test", 2).unwrap();
        assert_eq!(rt.metrics().num_workers(), 2);
        let rt = runtime_with_threads("test", 0).unwrap();
        assert_eq!(rt.metrics().num_workers(), 1, "zero threads is one, not a panic");
        assert!(runtime("test").unwrap().metrics().num_workers() >= 1);
    }

    #[cfg(unix)]
    #[test]
    fn sigterm_ends_the_wait() {
        use std::time::Duration;
        use tokio::signal::unix::{signal, SignalKind};
        let rt = runtime_with_threads("test", 1).unwrap();
        rt.block_on(async {
            // A listener of our own first: from then on SIGTERM is tokio's for this process, so
            // a signal sent before the wait is listening is missed (and sent again), never fatal.
            let _ours = signal(SignalKind::terminate()).unwrap();
            let mut wait = tokio::spawn(shutdown_signal());
            for _ in 0..50 {
                // SAFETY: a signal to this process, whose SIGTERM handler tokio installed above.
                unsafe { libc::raise(libc::SIGTERM) };
                if let Ok(r) = tokio::time::timeout(Duration::from_millis(200), &mut wait).await {
                    return r.unwrap();
                }
            }
            panic!("SIGTERM did not end the wait");
        });
    }

    #[test]
    fn a_port_flag_overrides_only_what_was_given() {
        let (mut host, mut port, mut admin_host, mut admin_port, mut grpc) =
            ("0.0.0.0".to_string(), 8080u16, "127.0.0.1".to_string(), 9080u16, None);
        let flags = PortFlags { port: Some(0), grpc_port: Some(50051), ..PortFlags::default() };
        flags.apply(PortTargets {
            host: &mut host,
            port: &mut port,
            admin_host: &mut admin_host,
            admin_port: &mut admin_port,
            grpc_port: &mut grpc,
        });
        assert_eq!(
            (host.as_str(), port, admin_host.as_str(), admin_port, grpc),
            ("0.0.0.0", 0, "127.0.0.1", 9080, Some(50051))
        );
    }
}
