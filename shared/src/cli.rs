//! What a Sieve binary sets up before anything else: logs on stderr, filtered by `RUST_LOG`
//! (else a default level), and the tokio runtime, whose failure to start is a message and an
//! exit code rather than a panic.

use std::process::ExitCode;

use tokio::runtime::Runtime;
use tracing_subscriber::EnvFilter;

/// Logs to stderr, filtered by `RUST_LOG`, else by `default_filter` (e.g. `"info"`).
pub fn init_tracing(default_filter: &str) {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| default_filter.into()))
        .init();
}

/// A multi-threaded runtime with every driver enabled; when it cannot start, says so as
/// `prog: cannot start the runtime: …` and gives the exit code to return.
pub fn runtime(prog: &str) -> Result<Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| {
        eprintln!("{prog}: cannot start the runtime: {e}");
        ExitCode::FAILURE
    })
}
