//! A local cluster for `sieve up`: N worker processes and a proxy on loopback, started from
//! the binaries next to the running one, torn down in every case (drop, error, Ctrl-C; and,
//! on Linux, if the launcher itself is killed).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use sieve_server::child::{self, spawn_listening, Listening, SpawnError};

use crate::client::HttpClient;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("{0} not found next to this program ({1}); build it (cargo build --release -p {2})")]
    MissingBinary(String, String, &'static str),
    #[error("starting {0}: {1}")]
    Spawn(String, std::io::Error),
    #[error("{0} exited before it was listening ({1})")]
    EarlyExit(String, String),
    #[error("{0} printed no listening line within {1:?}")]
    NoListeningLine(String, Duration),
    #[error("{0} was not ready within {1:?}")]
    NotReady(String, Duration),
}

/// What kind of worker process to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerKind {
    /// `sieve-worker --model MODEL --device DEVICE`.
    Model { model: String, device: String },
    /// `sieve-loadtest sim-worker`: the API without a model.
    Simulated,
}

/// A child process that printed `<name> listening api=ADDR admin=ADDR`.
pub struct Service {
    pub name: String,
    pub api: SocketAddr,
    pub admin: SocketAddr,
    child: Child,
}

impl Service {
    pub fn api_url(&self) -> String {
        format!("http://{}", self.api)
    }

    pub fn admin_url(&self) -> String {
        format!("http://{}", self.admin)
    }

    /// Asks it to drain and exit (SIGTERM), waits up to `grace`, then kills it.
    fn stop(&mut self, grace: Duration) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        child::signal(&self.child, libc::SIGTERM);
        if child::wait_exit(&mut self.child, grace).is_some() {
            return;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The running cluster. Dropping it stops the proxy, then the workers.
pub struct LocalCluster {
    pub workers: Vec<Service>,
    pub proxy: Option<Service>,
    /// Files written for the cluster (the generated proxy config), removed at shutdown.
    temp_files: Vec<PathBuf>,
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl LocalCluster {
    /// Stops everything: the proxy first (it drains), then the workers. Idempotent.
    pub fn shutdown(&mut self) {
        if let Some(mut p) = self.proxy.take() {
            p.stop(Duration::from_secs(10));
        }
        for mut w in self.workers.drain(..) {
            w.stop(Duration::from_secs(10));
        }
        for f in self.temp_files.drain(..) {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// A sibling binary of the running program.
pub fn sibling(name: &str, package: &'static str) -> Result<PathBuf, ClusterError> {
    let exe = std::env::current_exe().map_err(|e| ClusterError::Spawn(name.into(), e))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let path = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if path.exists() {
        Ok(path)
    } else {
        Err(ClusterError::MissingBinary(name.into(), dir.display().to_string(), package))
    }
}

/// Starts a process and waits for its listening line.
pub fn spawn_service(name: &str, program: &Path, args: &[String], timeout: Duration) -> Result<Service, ClusterError> {
    // SIGTERM: a worker whose launcher died drains instead of vanishing mid-call. A child's
    // `RUST_LOG` defaults to `warn`: the launcher's output is the ranking.
    let Listening { child, api, admin, .. } = spawn_listening(Command::new(program).args(args), libc::SIGTERM, timeout)
        .map_err(|e| match e {
            SpawnError::Spawn(e) => ClusterError::Spawn(name.into(), e),
            SpawnError::EarlyExit(status) => ClusterError::EarlyExit(name.into(), status),
            SpawnError::NoListeningLine(t) => ClusterError::NoListeningLine(name.into(), t),
        })?;
    Ok(Service { name: name.into(), api, admin, child })
}

/// Polls `GET {admin}/ready` until 200.
pub async fn wait_ready(
    client: &HttpClient,
    name: &str,
    admin_url: &str,
    timeout: Duration,
) -> Result<(), ClusterError> {
    let uri: hyper::Uri =
        format!("{admin_url}/ready").parse().map_err(|_| ClusterError::NotReady(name.into(), timeout))?;
    let end = Instant::now() + timeout;
    loop {
        if let Ok(r) = client.get(&uri).await {
            if r.status.is_success() {
                return Ok(());
            }
        }
        if Instant::now() >= end {
            return Err(ClusterError::NotReady(name.into(), timeout));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether a worker config file turns the gRPC port on (`[grpc] port`). A file that cannot be
/// read or parsed is an error naming it (the workers would refuse it the same way, later).
fn grpc_port_in(path: &Path) -> Result<bool, ClusterError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ClusterError::Spawn(format!("--worker-config {}", path.display()), e))?;
    let table: toml::Table = toml::from_str(&text).map_err(|e| {
        ClusterError::Spawn(
            format!("--worker-config {}", path.display()),
            std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()),
        )
    })?;
    Ok(table.get("grpc").and_then(|g| g.get("port")).is_some())
}

/// The proxy config of a local cluster when none is given.
const LOCAL_PROXY_CONFIG: &str = "[deadline]\ndefault_ms = 60000\n\n[health]\ninterval_ms = 250\n";

/// Options of `sieve up`.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    pub workers: usize,
    pub kind: WorkerKind,
    pub host: String,
    pub proxy_port: u16,
    pub proxy_admin_port: u16,
    pub proxy_config: Option<PathBuf>,
    /// Every worker's config file (`sieve up --worker-config`), given to each as `--config`;
    /// the ports are `sieve up`'s (a `[grpc] port` in it becomes a free port per worker).
    pub worker_config: Option<PathBuf>,
    /// How long a worker may take to print its listening line and to become ready (model
    /// download and load included).
    pub worker_timeout: Duration,
}

/// Starts the workers, then the proxy; returns once the proxy sees every worker ready.
pub async fn start(spec: &ClusterSpec, client: &HttpClient) -> Result<LocalCluster, ClusterError> {
    let mut cluster = LocalCluster { workers: Vec::new(), proxy: None, temp_files: Vec::new() };
    let (program, base_args): (PathBuf, Vec<String>) = match &spec.kind {
        WorkerKind::Model { model, device } => {
            let mut args = vec!["--model".into(), model.clone(), "--device".into(), device.clone()];
            if device == "cpu" {
                // CPU workers on one machine share its cores rather than each taking them all.
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                args.extend(["--threads".into(), (cores / spec.workers).max(1).to_string()]);
            }
            (sibling("sieve-worker", "sieve-worker")?, args)
        }
        WorkerKind::Simulated => (sibling("sieve-loadtest", "sieve-loadtest")?, vec!["sim-worker".into()]),
    };
    let mut base_args = base_args;
    if let Some(path) = &spec.worker_config {
        base_args.extend(["--config".into(), path.display().to_string()]);
        if grpc_port_in(path)? {
            // One port for every worker cannot be: each takes a free one (its listening line).
            base_args.extend(["--grpc-port".into(), "0".into()]);
        }
    }
    for i in 0..spec.workers {
        let mut args = base_args.clone();
        args.extend([
            "--host".into(),
            spec.host.clone(),
            "--port".into(),
            "0".into(),
            "--admin-port".into(),
            "0".into(),
        ]);
        let w = spawn_service(&format!("worker {i}"), &program, &args, spec.worker_timeout)?;
        cluster.workers.push(w);
    }
    for w in &cluster.workers {
        wait_ready(client, &w.name, &w.admin_url(), spec.worker_timeout).await?;
    }
    let mut args: Vec<String> = vec![
        "--host".into(),
        spec.host.clone(),
        "--port".into(),
        spec.proxy_port.to_string(),
        "--admin-port".into(),
        spec.proxy_admin_port.to_string(),
    ];
    let config = match &spec.proxy_config {
        Some(c) => c.clone(),
        None => {
            // A local cluster may run on CPU workers: give calls without a deadline a budget
            // they can meet there, and notice worker state quickly.
            let path = std::env::temp_dir().join(format!("sieve-up-{}.toml", std::process::id()));
            std::fs::write(&path, LOCAL_PROXY_CONFIG).map_err(|e| ClusterError::Spawn("proxy config".into(), e))?;
            cluster.temp_files.push(path.clone());
            path
        }
    };
    args.extend(["--config".into(), config.display().to_string()]);
    for w in &cluster.workers {
        args.extend(["--worker".into(), format!("{},admin={}", w.api_url(), w.admin_url())]);
    }
    let proxy = spawn_service("proxy", &sibling("sieve-proxy", "sieve-proxy")?, &args, Duration::from_secs(30))?;
    let proxy_admin = proxy.admin_url();
    cluster.proxy = Some(proxy);
    wait_all_workers(client, &proxy_admin, spec.workers, Duration::from_secs(30)).await?;
    Ok(cluster)
}

/// Waits until the proxy reports `n` eligible workers.
async fn wait_all_workers(
    client: &HttpClient,
    admin_url: &str,
    n: usize,
    timeout: Duration,
) -> Result<(), ClusterError> {
    let uri: hyper::Uri =
        format!("{admin_url}/workers").parse().map_err(|_| ClusterError::NotReady("proxy".into(), timeout))?;
    let end = Instant::now() + timeout;
    loop {
        if let Ok(r) = client.get(&uri).await {
            let eligible =
                serde_json::from_slice::<serde_json::Value>(&r.body).ok().and_then(|v| v["eligible"].as_u64());
            if eligible.is_some_and(|e| e as usize >= n) {
                return Ok(());
            }
        }
        if Instant::now() >= end {
            return Err(ClusterError::NotReady("proxy".into(), timeout));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
