//! The admin port: `/health` (503 once the engine has stopped), `/ready`, `/metrics`
//! (Prometheus), `/stats` (JSON), and `POST /drain` (refuse new calls, finish those in flight,
//! exit: what SIGTERM does), which needs the admin token; the reads need it too with `[admin]
//! protect_reads`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;
use sieve_shared::metrics_names::{worker as m, worker_moe as moe_m};
use sieve_shared::{ApiError, ErrorKind, WorkerStats};

use sieve_server::http::{self, HttpResponse};

use super::AppState;

pub async fn handle(app: Arc<AppState>, req: Request<Incoming>) -> HttpResponse {
    let path = req.uri().path();
    let known = matches!(path, "/health" | "/ready" | "/stats" | "/metrics" | "/drain");
    if !known {
        return http::error(&ApiError::new(
            ErrorKind::NotFound,
            format!("no route {path} (admin: /health /ready /metrics /stats, POST /drain)"),
        ));
    }
    let expected = if path == "/drain" { Method::POST } else { Method::GET };
    if req.method() != expected {
        return http::error(&ApiError::new(ErrorKind::MethodNotAllowed, format!("{path} takes {expected}")));
    }
    if let Err(denied) = app.admin.check(&req, path == "/drain") {
        return http::error(&denied);
    }
    match path {
        "/health" => match app.engine.get().and_then(|e| e.stopped()) {
            None => http::json(StatusCode::OK, &json!({"status": "ok"})),
            Some(why) => http::json(StatusCode::SERVICE_UNAVAILABLE, &json!({"status": "failed", "reason": why})),
        },
        "/ready" => ready(&app),
        "/stats" => http::json(StatusCode::OK, &stats(&app)),
        "/metrics" => prometheus(&app),
        _ => drain(&app),
    }
}

/// Refuses new calls at once (503, /ready false) and wakes the process's shutdown, which waits
/// for the calls in flight and exits, as on SIGTERM.
fn drain(app: &AppState) -> HttpResponse {
    app.state.draining.store(true, Ordering::Release);
    app.drain_requested.notify_one();
    http::json(StatusCode::ACCEPTED, &json!({"draining": true}))
}

fn ready(app: &AppState) -> HttpResponse {
    let st = &app.state;
    let stopped = app.engine.get().and_then(|e| e.stopped());
    if st.is_ready() && app.engine.get().is_some() && stopped.is_none() {
        return http::json(StatusCode::OK, &json!({"ready": true}));
    }
    let reason = if let Some(why) = stopped {
        why
    } else if st.draining.load(Ordering::Acquire) {
        "draining".to_string()
    } else if let Some(e) = st.load_error.lock().ok().and_then(|e| e.clone()) {
        format!("model failed to load: {e}")
    } else {
        "loading".to_string()
    };
    http::json(StatusCode::SERVICE_UNAVAILABLE, &json!({"ready": false, "reason": reason}))
}

pub fn stats(app: &AppState) -> WorkerStats {
    let st = &app.state;
    let mut s = WorkerStats {
        model: app.model_name.get().cloned().unwrap_or_default(),
        template: app.template_id.get().cloned().unwrap_or_default(),
        device: app.device.clone(),
        ready: st.is_ready() && app.engine.get().is_some_and(|e| e.stopped().is_none()),
        draining: st.draining.load(Ordering::Acquire),
        in_flight_requests: st.in_flight_requests.get(),
        queued_pairs: st.queued_pairs.get(),
        queued_tokens: st.queued_tokens.get(),
        tokens_processed: st.tokens_computed.get(),
        pairs_processed: st.pairs_processed.get(),
        requests_processed: st.requests_processed.get(),
        tokens_per_second: st.tokens_per_second(),
        ..Default::default()
    };
    if let Some(engine) = app.engine.get() {
        let snap = engine.prefix_snapshot();
        let scratch = engine.cfg.scratch_blocks() as u64;
        s.max_batch_tokens = engine.cfg.max_batch_tokens as u64;
        s.max_seq_tokens = engine.cfg.max_seq_tokens as u64;
        s.kv_blocks_total = snap.blocks_total + scratch;
        // Scratch blocks are in use only while a pass runs; count them as free.
        s.kv_blocks_used = snap.blocks_in_use;
        s.kv_blocks_free = s.kv_blocks_total - s.kv_blocks_used;
        let lookups = snap.counters.lookups.max(1) as f64;
        let mut prefix = serde_json::to_value(&snap).unwrap_or_default();
        if let Some(o) = prefix.as_object_mut() {
            o.insert("hit_rate".into(), json!(snap.counters.hits as f64 / lookups));
            o.insert("enabled".into(), json!(engine.cfg.prefix_cache.enabled));
        }
        s.extra.insert("prefix_cache".into(), prefix);
        s.extra.insert(
            "engine".into(),
            json!({
                "kv_block_size": engine.cfg.block_size,
                "scratch_blocks": scratch,
                "max_seqs_per_pass": engine.cfg.max_seqs_per_pass,
                "max_queued_pairs": engine.cfg.max_queued_pairs,
            }),
        );
    }
    s.extra.insert("pipeline".into(), serde_json::to_value(st.pipeline()).unwrap_or_default());
    if let Some(moe) = st.moe.snapshot() {
        s.extra.insert("moe".into(), moe);
    }
    s
}

/// Renders Prometheus text. Live gauges are refreshed from the engine state first.
fn prometheus(app: &AppState) -> HttpResponse {
    let Some(handle) = &app.prometheus else {
        return http::error(&ApiError::not_ready("metrics are not enabled in this process"));
    };
    let s = stats(app);
    metrics::gauge!(m::IN_FLIGHT).set(s.in_flight_requests as f64);
    metrics::gauge!(m::QUEUED_PAIRS).set(s.queued_pairs as f64);
    metrics::gauge!(m::KV_BLOCKS_USED).set(s.kv_blocks_used as f64);
    metrics::gauge!(m::KV_BLOCKS_FREE).set(s.kv_blocks_free as f64);
    metrics::gauge!(m::READY).set(if s.ready { 1.0 } else { 0.0 });
    metrics::counter!(m::BUFFER_REFUSALS).absolute(app.buffer_budget.refusals());
    metrics::gauge!(m::BUFFERED_BYTES).set(app.buffer_budget.held() as f64);
    if let Some(engine) = app.engine.get() {
        let p = engine.prefix_snapshot();
        metrics::gauge!(m::PREFIX_BLOCKS_PENDING).set(p.blocks_pending as f64);
        metrics::gauge!(m::PREFIX_BLOCKS_COMMITTED).set(p.blocks_committed as f64);
        metrics::gauge!(m::PREFIX_BLOCKS_FREE).set(p.blocks_free as f64);
        metrics::counter!(m::PREFIX_LOOKUPS).absolute(p.counters.lookups);
        metrics::counter!(m::PREFIX_HITS).absolute(p.counters.hits);
        metrics::counter!(m::PREFIX_ROLLBACKS).absolute(p.counters.rollbacks);
        metrics::counter!(m::PREFIX_EVICTED_BLOCKS).absolute(p.counters.evicted_blocks);
    }
    let pl = app.state.pipeline();
    metrics::counter!(m::PREFIX_TOKENS_COMPUTED).absolute(pl.prefix_tokens_computed);
    metrics::counter!(m::PREFIX_TOKENS_REUSED, "scope" => "in_batch").absolute(pl.prefix_tokens_reused_in_batch);
    metrics::counter!(m::PREFIX_TOKENS_REUSED, "scope" => "cross_batch").absolute(pl.prefix_tokens_reused_cross_batch);
    metrics::counter!(m::BATCH_FAILURES).absolute(pl.batch_failures);
    let mut text = handle.render();
    // Counters of seconds, running f64 totals: written here (the facade's counters are integers).
    let mut seconds = vec![
        (m::RUNNER_BUSY_SECONDS, pl.runner_busy_seconds),
        (m::RUNNER_IDLE_WITH_WORK_SECONDS, pl.runner_idle_with_work_seconds),
    ];
    if let Some((moe_seconds, forward_seconds)) = app.state.moe.seconds() {
        seconds.push((moe_m::SECONDS, moe_seconds));
        seconds.push((moe_m::FORWARD_SECONDS, forward_seconds));
    }
    sieve_shared::metrics_names::write_values(&mut text, &seconds);
    let mut r = Response::new(Full::new(Bytes::from(text)));
    r.headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"));
    r
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::time::Duration;

    use sieve_server::http::{bind, serve, AdminAuth};
    use sieve_shared::http_config::HttpConfig;
    use sieve_shared::Limits;

    use super::*;

    /// The admin port alone, in-process, with `auth`.
    fn admin_port(auth: AdminAuth) -> (SocketAddr, Arc<AppState>, tokio::runtime::Runtime) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let app = Arc::new(AppState::new(Limits::default(), "cpu".into(), None).with_admin(auth));
        let a = app.clone();
        let addr = rt.block_on(async move {
            let (l, addr) = bind("127.0.0.1", 0, 1024, false).await.unwrap();
            tokio::spawn(serve(l, HttpConfig::default(), move |r| handle(a.clone(), r), std::future::pending()));
            addr
        });
        (addr, app, rt)
    }

    fn call(addr: SocketAddr, method: &str, path: &str, token: Option<&str>) -> (u16, serde_json::Value) {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
        write!(s, "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n{auth}\r\n")
            .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        let status = out.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        (status, serde_json::from_str(body).unwrap_or(serde_json::Value::Null))
    }

    #[test]
    fn drain_needs_the_token_and_reads_stay_open() {
        let (addr, app, _rt) = admin_port(AdminAuth::with_token(Some("tok"), false));
        assert_eq!(call(addr, "GET", "/health", None).0, 200);
        assert_eq!(call(addr, "GET", "/stats", None).0, 200, "the proxy's health checker reads without a token");
        let (code, body) = call(addr, "POST", "/drain", None);
        assert_eq!((code, body["error"]["type"].as_str()), (401, Some("unauthorized")), "{body}");
        assert_eq!(call(addr, "POST", "/drain", Some("wrong")).0, 401);
        assert!(!app.state.draining.load(Ordering::Acquire), "refused requests change nothing");
        assert_eq!(call(addr, "GET", "/drain", Some("tok")).0, 405);
        let (code, body) = call(addr, "POST", "/drain", Some("tok"));
        assert_eq!((code, body["draining"].as_bool()), (202, Some(true)), "{body}");
        assert!(app.state.draining.load(Ordering::Acquire));
        let (code, body) = call(addr, "GET", "/ready", None);
        assert_eq!((code, body["reason"].as_str()), (503, Some("draining")), "{body}");
    }

    #[test]
    fn without_a_token_drain_is_403_and_protected_reads_need_it() {
        let (addr, _app, _rt) = admin_port(AdminAuth::default());
        let (code, body) = call(addr, "POST", "/drain", Some("anything"));
        assert_eq!((code, body["error"]["type"].as_str()), (403, Some("forbidden")), "{body}");
        let (addr, _app, _rt) = admin_port(AdminAuth::with_token(Some("tok"), true));
        assert_eq!(call(addr, "GET", "/stats", None).0, 401);
        assert_eq!(call(addr, "GET", "/stats", Some("tok")).0, 200);
    }
}
