//! `sieve`: the operator's launcher.
//!
//! `sieve up [--workers N] [--keep-running]` starts N workers (`sieve-worker --model default`,
//! next to this binary) and a proxy on loopback, waits until all are ready, scores the demo
//! request through the proxy and prints the ranking and the timing; then exits, or with
//! `--keep-running` serves until Ctrl-C. Its processes are stopped in every case.
//!
//! `sieve score --query TEXT --items-file FILE [--target URL]` scores items against a running
//! proxy (or a worker: both speak the same API) and prints the ranking.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use sieve_proxy::client::HttpClient;
use sieve_proxy::local_cluster::{self, ClusterSpec, WorkerKind};
use sieve_proxy::ranking;
use sieve_shared::proxy_config::ClientConfig;
use sieve_shared::ScoreRequest;

#[derive(Parser)]
#[command(name = "sieve", version, about = "Sieve: LLM relevance scoring — local cluster and client")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a local cluster (proxy + workers), score the demo request, print the ranking.
    Up(UpArgs),
    /// Score items against a running proxy or worker and print the ranking.
    Score(ScoreArgs),
}

#[derive(Args)]
struct UpArgs {
    /// Worker processes to start.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Serve until Ctrl-C instead of exiting after the demo request.
    #[arg(long)]
    keep_running: bool,
    /// The workers' model: `default` (the embedded model) or a path.
    #[arg(long, default_value = "default")]
    model: String,
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Simulated workers (`sieve-loadtest sim-worker`) instead of the model: the proxy without
    /// a model, with deterministic placeholder scores.
    #[arg(long)]
    sim: bool,
    /// The request to score (default: configs/demo-request.json of the checkout).
    #[arg(long)]
    request: Option<PathBuf>,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Proxy API port (default: 8080 with --keep-running, else a free port).
    #[arg(long)]
    port: Option<u16>,
    /// Proxy admin port (default: 9080 with --keep-running, else a free port).
    #[arg(long)]
    admin_port: Option<u16>,
    /// Proxy config file (default: a 60 s default deadline, quick health checks).
    #[arg(long)]
    proxy_config: Option<PathBuf>,
    /// A config file for every worker (`sieve-worker --config`, or the sim-worker's with
    /// --sim): tracing, gRPC, limits, ... Ports stay `sieve up`'s.
    #[arg(long)]
    worker_config: Option<PathBuf>,
    /// Seconds a worker may take to start and load its model.
    #[arg(long, default_value_t = 600)]
    worker_timeout: u64,
}

#[derive(Args)]
struct ScoreArgs {
    #[arg(long)]
    query: Option<String>,
    /// JSON (`{"query", "items"}` or an array of items) or one item per line.
    #[arg(long)]
    items_file: PathBuf,
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    target: String,
    #[arg(long)]
    instruction: Option<String>,
    #[arg(long)]
    deadline_ms: Option<u64>,
    /// Print only the best N.
    #[arg(long)]
    top: Option<usize>,
}

fn main() -> ExitCode {
    sieve_server::cli::init_tracing("warn");
    let cli = Cli::parse();
    let rt = match sieve_server::cli::runtime("sieve") {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let result = rt.block_on(async move {
        match cli.command {
            Cmd::Up(a) => up(a).await,
            Cmd::Score(a) => score(a).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sieve: {e}");
            ExitCode::FAILURE
        }
    }
}

fn client() -> HttpClient {
    HttpClient::new(&ClientConfig { connect_timeout_ms: 2000, ..ClientConfig::default() })
}

/// configs/demo-request.json of the working directory or of the checkout this binary was
/// built in (target/<profile>/sieve → the checkout root).
fn default_request() -> Result<PathBuf, String> {
    let rel = Path::new("configs").join("demo-request.json");
    let mut candidates = vec![rel.clone()];
    if let Ok(exe) = std::env::current_exe() {
        candidates.extend(exe.ancestors().skip(1).take(4).map(|d| d.join(&rel)));
    }
    candidates
        .into_iter()
        .find(|p| p.exists())
        .ok_or_else(|| "configs/demo-request.json not found; pass --request FILE".into())
}

fn read_request(path: &Path) -> Result<ScoreRequest<'static>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let (query, items) = ranking::parse_items_file(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let query = query.ok_or_else(|| format!("{}: no query", path.display()))?;
    Ok(ScoreRequest::new(query, items).into_owned())
}

/// The most workers a local cluster starts.
const MAX_LOCAL_WORKERS: usize = 64;

async fn up(a: UpArgs) -> Result<(), String> {
    if !(1..=MAX_LOCAL_WORKERS).contains(&a.workers) {
        return Err(format!(
            "--workers must be in 1..={MAX_LOCAL_WORKERS}: each is a process on this machine with its own copy of the model"
        ));
    }
    let request_path = match &a.request {
        Some(p) => p.clone(),
        None => default_request()?,
    };
    let mut request = read_request(&request_path)?;
    // A CPU worker on the embedded model is slow: give the demo call time.
    request.deadline_ms = Some(120_000);
    let kind = if a.sim {
        WorkerKind::Simulated
    } else {
        WorkerKind::Model { model: a.model.clone(), device: a.device.clone() }
    };
    let default_port = |p: u16| if a.keep_running { p } else { 0 };
    let spec = ClusterSpec {
        workers: a.workers,
        kind: kind.clone(),
        host: a.host.clone(),
        proxy_port: a.port.unwrap_or(default_port(8080)),
        proxy_admin_port: a.admin_port.unwrap_or(default_port(9080)),
        proxy_config: a.proxy_config.clone(),
        worker_config: a.worker_config.clone(),
        worker_timeout: Duration::from_secs(a.worker_timeout),
    };
    let client = client();
    let what = match &kind {
        WorkerKind::Model { model, device } => format!("model {model} on {device}"),
        WorkerKind::Simulated => "simulated".into(),
    };
    eprintln!("sieve: starting {} worker{} ({what}) and the proxy…", a.workers, if a.workers == 1 { "" } else { "s" });
    // Started and stopped under a Ctrl-C guard: an interrupt at any point tears down what runs.
    let work = async {
        let mut cluster = local_cluster::start(&spec, &client).await.map_err(|e| e.to_string())?;
        let proxy_url = cluster.proxy.as_ref().map(|p| p.api_url()).unwrap_or_default();
        let admin_url = cluster.proxy.as_ref().map(|p| p.admin_url()).unwrap_or_default();
        println!("cluster: proxy {proxy_url} (admin {admin_url})");
        for w in &cluster.workers {
            println!("  {}: {} (admin {})", w.name, w.api_url(), w.admin_url());
        }
        let scored = ranking::score(&client, &proxy_url, &request).await?;
        println!();
        print!("{}", ranking::render(&request, &scored, None));
        if a.keep_running {
            println!("\nserving on {proxy_url} — POST /v1/score, /v1/rerank; Ctrl-C to stop");
            sieve_server::cli::shutdown_signal().await;
        }
        cluster.shutdown();
        Ok::<(), String>(())
    };
    tokio::select! {
        r = work => r,
        _ = sieve_server::cli::shutdown_signal() => {
            eprintln!("sieve: stopping");
            Ok(())
        }
    }
}

async fn score(a: ScoreArgs) -> Result<(), String> {
    let text = std::fs::read_to_string(&a.items_file).map_err(|e| format!("{}: {e}", a.items_file.display()))?;
    let (file_query, items) = ranking::parse_items_file(&text)?;
    let query = a.query.or(file_query).ok_or("--query is required (the items file has none)")?;
    let request = ScoreRequest {
        instruction: a.instruction.map(Into::into),
        deadline_ms: a.deadline_ms,
        ..ScoreRequest::new(query, items)
    };
    let scored = ranking::score(&client(), &a.target, &request).await?;
    print!("{}", ranking::render(&request, &scored, a.top));
    Ok(())
}
