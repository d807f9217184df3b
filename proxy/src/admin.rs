//! The admin port: `/health` (the process is up), `/ready` (not draining and at least one
//! worker can take shards), `/metrics` (Prometheus), `/workers` (a JSON table of every
//! worker's state, also as `/stats`), `/config` (the effective config), `POST /reload`
//! (re-read the file) and `POST /drain` (refuse new requests, finish those in flight, exit: what
//! SIGTERM does). The two POSTs need the admin token; the reads need it too with
//! `[admin] protect_reads`.

use std::sync::Arc;
use std::time::Instant;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde::Serialize;
use sieve_server::http::AdminAuth;
use sieve_shared::{ApiError, CostModel, ErrorKind};

use crate::cluster::breaker::BreakerState;
use crate::cluster::discovery::Discovery;
use crate::cluster::worker::WorkerRow;
use crate::metrics as m;
use crate::state::AppState;
use sieve_server::http::{error, json, text, HttpResponse};
use sieve_shared::sync::lock;

#[derive(Serialize)]
struct WorkersReport {
    workers: Vec<WorkerRow>,
    eligible: usize,
    cost_model: CostModel,
    cost_model_samples: f64,
    token_weights: Vec<f64>,
    prefix_bias: [f64; 2],
    hedge_ratio_quantile: Option<f64>,
    hedge_budget_ms: f64,
    retry_budget: f64,
    requests_in_flight: usize,
    draining: bool,
}

pub async fn handle(
    state: Arc<AppState>,
    discovery: Arc<Discovery>,
    auth: Arc<AdminAuth>,
    req: Request<Incoming>,
) -> HttpResponse {
    let path = req.uri().path().to_string();
    const ROUTES: [&str; 8] = ["/health", "/ready", "/metrics", "/workers", "/stats", "/config", "/reload", "/drain"];
    if ROUTES.contains(&path.as_str()) {
        let changes_state = *req.method() != Method::GET;
        if let Err(e) = auth.check(&req, changes_state) {
            return error(&e);
        }
    }
    match (req.method(), path.as_str()) {
        (&Method::GET, "/health") => json(StatusCode::OK, &serde_json::json!({"status": "ok"})),
        (&Method::GET, "/ready") => ready(&state),
        (&Method::GET, "/metrics") => {
            // The process's own series (their gauges set by the refresh), then the workers'.
            let per_worker = refresh_gauges(&state);
            let mut body = state.metrics.render();
            body.push_str(&per_worker);
            text(StatusCode::OK, body, "text/plain; version=0.0.4")
        }
        // `/stats` is the same report, under the name the worker's admin port uses.
        (&Method::GET, "/workers" | "/stats") => json(StatusCode::OK, &workers_report(&state)),
        (&Method::GET, "/config") => json(StatusCode::OK, &*state.config()),
        (&Method::POST, "/reload") => match discovery.reload() {
            Ok(n) => json(StatusCode::OK, &serde_json::json!({"reloaded": true, "workers": n})),
            Err(e) => error(&ApiError::invalid(e)),
        },
        (&Method::POST, "/drain") => {
            state.drain.request();
            json(StatusCode::ACCEPTED, &serde_json::json!({"draining": true}))
        }
        (_, "/health" | "/ready" | "/metrics" | "/workers" | "/stats" | "/config" | "/reload" | "/drain") => {
            error(&ApiError::new(ErrorKind::MethodNotAllowed, format!("method not allowed on {path}")))
        }
        _ => error(&ApiError::new(ErrorKind::NotFound, format!("no route {path}"))),
    }
}

fn ready(state: &AppState) -> HttpResponse {
    if state.drain.is_draining() {
        return error(&ApiError::not_ready("draining"));
    }
    let eligible = state.pool.eligible(Instant::now()).len();
    if eligible == 0 {
        return error(&ApiError::not_ready(format!("no worker is ready ({} configured)", state.pool.snapshot().len())));
    }
    json(StatusCode::OK, &serde_json::json!({"ready": true, "workers_ready": eligible}))
}

pub fn workers_report(state: &AppState) -> impl Serialize {
    let now = Instant::now();
    let cfg = state.config();
    let model = state.cost_model();
    let params = AppState::view_params(&cfg);
    let workers: Vec<WorkerRow> = state.pool.snapshot().iter().map(|w| w.describe(now, &model, &params)).collect();
    let tokens = lock(&state.tokens).weights();
    WorkersReport {
        eligible: workers.iter().filter(|w| w.eligible).count(),
        workers,
        cost_model: model,
        cost_model_samples: lock(&state.cost).samples(),
        token_weights: tokens.weights.to_vec(),
        prefix_bias: tokens.prefix_bias,
        hedge_ratio_quantile: state.ratios.quantile(cfg.hedge.min_samples),
        hedge_budget_ms: state.hedge_budget.available(),
        retry_budget: state.retry_budget.available(),
        requests_in_flight: state.drain.in_flight(),
        draining: state.drain.is_draining(),
    }
}

/// Gauges are computed when scraped rather than on every shard. Sets the process-wide ones and
/// returns the per-worker series, rendered apart from the process's recorder
/// ([`m::render_per_worker`]: only the workers now in the pool).
fn refresh_gauges(state: &AppState) -> String {
    let now = Instant::now();
    let cfg = state.config();
    let model = state.cost_model();
    let params = AppState::view_params(&cfg);
    let workers = state.pool.snapshot();
    let mut eligible = 0;
    let per_worker = m::render_per_worker(|| {
        for w in workers.iter() {
            let url = w.url().to_string();
            let view = w.view(now, &model, &params);
            let ok = w.is_eligible(now);
            eligible += usize::from(ok);
            metrics::gauge!(m::WORKER_IN_FLIGHT, "worker" => url.clone()).set(w.in_flight() as f64);
            metrics::gauge!(m::WORKER_BACKLOG_SECONDS, "worker" => url.clone()).set(view.backlog_ms / 1e3);
            metrics::gauge!(m::WORKER_BREAKER_STATE, "worker" => url.clone()).set(w.breaker_state(now).as_gauge());
            metrics::gauge!(m::WORKER_READY, "worker" => url.clone()).set(if ok { 1.0 } else { 0.0 });
            metrics::gauge!(m::WORKER_TIME_FACTOR, "worker" => url.clone()).set(view.time_factor);
            // Every state's count, 0 included, as the process's own counters are from the start.
            for state in BreakerState::ALL {
                let n = w.counters.breaker_transitions(state);
                metrics::counter!(m::BREAKER_TRANSITIONS, "worker" => url.clone(), "state" => state.name()).absolute(n);
            }
        }
    });
    metrics::gauge!(m::WORKERS_ELIGIBLE).set(eligible as f64);
    metrics::counter!(m::BUFFER_REFUSALS).absolute(state.buffer_budget.refusals());
    metrics::gauge!(m::BUFFERED_BYTES).set(state.buffer_budget.held() as f64);
    per_worker
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::time::Duration;

    use sieve_shared::metrics_names::Metric;
    use sieve_shared::{ProxyConfig, WorkerEndpoint};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;
    use crate::Launch;

    async fn call(addr: SocketAddr, method: &str, path: &str, token: Option<&str>) -> (u16, serde_json::Value) {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
        let head =
            format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n{auth}\r\n");
        s.write_all(head.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await.unwrap().unwrap();
        let out = String::from_utf8(out).unwrap();
        let status = out.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        (status, serde_json::from_str(body).unwrap_or(serde_json::Value::Null))
    }

    #[tokio::test]
    async fn the_admin_port_stays_on_loopback_and_its_posts_need_the_token() {
        let text = "[server]\nhost = \"0.0.0.0\"\nport = 0\nadmin_port = 0\n";
        let path = std::env::temp_dir().join(format!("sieve-admin-test-{}.toml", std::process::id()));
        std::fs::write(&path, text).unwrap();
        let config = ProxyConfig::from_toml(text).unwrap();
        let launch = Launch {
            config,
            config_path: Some(path.clone()),
            admin: Some(AdminAuth::with_token(Some("tok"), false)),
            ..Launch::default()
        };
        let proxy = crate::start(launch).await.unwrap();
        assert!(proxy.api_addr.ip().is_unspecified(), "the API binds what host says");
        assert_eq!(proxy.admin_addr.ip().to_string(), "127.0.0.1", "the admin port does not follow host");
        let admin = proxy.admin_addr;

        assert_eq!(call(admin, "GET", "/health", None).await.0, 200);
        assert_eq!(call(admin, "GET", "/workers", None).await.0, 200, "reads are open by default");
        let (code, body) = call(admin, "POST", "/reload", None).await;
        assert_eq!((code, body["error"]["type"].as_str()), (401, Some("unauthorized")), "{body}");
        assert_eq!(call(admin, "POST", "/reload", Some("nope")).await.0, 401);
        let (code, body) = call(admin, "POST", "/reload", Some("tok")).await;
        assert_eq!((code, body["reloaded"].as_bool()), (200, Some(true)), "{body}");

        assert_eq!(call(admin, "POST", "/drain", None).await.0, 401);
        assert!(!proxy.state.drain.is_draining());
        let (code, body) = call(admin, "POST", "/drain", Some("tok")).await;
        assert_eq!((code, body["draining"].as_bool()), (202, Some(true)), "{body}");
        assert!(proxy.state.drain.is_draining());
        tokio::time::timeout(Duration::from_secs(5), proxy.state.drain.requested()).await.expect("main is woken");
        assert_eq!(call(admin, "GET", "/ready", None).await.0, 503);
        assert!(tokio::time::timeout(Duration::from_secs(10), proxy.drain_and_stop()).await.expect("bounded"));
        let _ = std::fs::remove_file(&path);
    }

    async fn scrape(addr: SocketAddr) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await.unwrap().unwrap();
        String::from_utf8(out).unwrap()
    }

    /// The lines of `text` naming `metric` with the label `worker="url"`.
    fn series<'a>(text: &'a str, metric: Metric, url: &str) -> Vec<&'a str> {
        let label = format!("worker=\"{url}\"");
        text.lines().filter(|l| l.starts_with(metric.name) && l.contains(&label)).collect()
    }

    #[tokio::test]
    async fn a_worker_removed_from_the_pool_leaves_the_scrape() {
        let mut config = ProxyConfig::default();
        config.server.port = 0;
        config.server.admin_port = 0;
        // Ports nothing listens on: health checks fail, which changes nothing here.
        let (a, b) = ("http://127.0.0.1:9", "http://127.0.0.1:11");
        config.workers = vec![WorkerEndpoint::new(a, None), WorkerEndpoint::new(b, None)];
        let proxy = crate::start(Launch { config, ..Launch::default() }).await.unwrap();
        let pool = &proxy.state.pool;
        let gone = pool.snapshot().iter().find(|w| w.url() == b).unwrap().clone();
        gone.counters.note_breaker(BreakerState::Open);
        gone.counters.note_breaker(BreakerState::Open);

        let text = scrape(proxy.admin_addr).await;
        for url in [a, b] {
            for metric in [m::WORKER_IN_FLIGHT, m::WORKER_READY, m::WORKER_BACKLOG_SECONDS, m::WORKER_TIME_FACTOR] {
                assert_eq!(series(&text, metric, url).len(), 1, "{metric} of {url} in:\n{text}");
            }
        }
        let opened = format!("{}{{worker=\"{b}\",state=\"open\"}} 2", m::BREAKER_TRANSITIONS);
        assert!(series(&text, m::BREAKER_TRANSITIONS, b).contains(&opened.as_str()), "{text}");
        // No transition yet: every state's series, at 0 (a dashboard panel reads 0, not "No data").
        let none = series(&text, m::BREAKER_TRANSITIONS, a);
        assert_eq!(none.len(), BreakerState::ALL.len(), "{text}");
        assert!(none.iter().all(|l| l.ends_with("} 0")), "{text}");
        assert!(text.contains(&format!("# HELP {}", m::WORKER_READY)), "{text}");

        // Discovery (or a reload) drops worker b: none of its series is reported any more.
        pool.replace(&[WorkerEndpoint::new(a, None)], &proxy.state.config().breaker);
        let text = scrape(proxy.admin_addr).await;
        assert!(!text.contains(b), "a removed worker is still reported:\n{text}");
        assert_eq!(series(&text, m::WORKER_READY, a).len(), 1, "{text}");
        assert!(text.contains(m::WORKERS_ELIGIBLE.name), "the process's own series stay: {text}");
        proxy.stop().await;
    }

    #[tokio::test]
    async fn with_no_token_configured_the_posts_are_403() {
        let mut config = ProxyConfig::default();
        config.server.port = 0;
        config.server.admin_port = 0;
        let proxy =
            crate::start(Launch { config, admin: Some(AdminAuth::default()), ..Launch::default() }).await.unwrap();
        let (code, body) = call(proxy.admin_addr, "POST", "/reload", Some("tok")).await;
        assert_eq!((code, body["error"]["type"].as_str()), (403, Some("forbidden")), "{body}");
        assert!(body["error"]["message"].as_str().unwrap().contains("admin token not configured"));
        proxy.stop().await;
    }
}
