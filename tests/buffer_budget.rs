//! One budget for the request bytes a process holds in memory (`[http] max_buffered_bytes`),
//! against real servers on loopback: clients that send most of a large body and stall fill it,
//! and then a further large body is answered 503 at once (naming the limit, with
//! `Retry-After`) while small requests still pass; the process's RSS stays under the budget
//! plus a constant; once the clients go away every byte is given back and large bodies are
//! read again. The HTTP and gRPC ports of one process share the budget (gRPC answers
//! RESOURCE_EXHAUSTED with retry info).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use sieve_e2e::abuse::status_of;
use sieve_e2e::soak::memory_kib;
use sieve_e2e::{catalogue, score_body, spawn, wait_ready, Http, Proc};
use sieve_loadtest::sim::{SimConfig, SimWorker};
use sieve_proxy::metrics as m;
use sieve_server::grpc::pb::{self, sieve_client::SieveClient};
use sieve_shared::http_config::HttpConfig;
use sieve_shared::Limits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::Code;
use tonic_types::StatusExt;

const START: Duration = Duration::from_secs(20);
const QUERY: &str = "waterproof trail running shoes";
const MIB: usize = 1 << 20;

/// A connection that sent the head of a `content_length` body and `sent` bytes of it, then
/// stopped; and what the server answered meanwhile.
struct Hoarder {
    stream: TcpStream,
    answer: Vec<u8>,
}

async fn start_hoard(addr: SocketAddr, content_length: usize, sent: usize) -> Hoarder {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let head = format!("POST /v1/score HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {content_length}\r\n\r\n");
    stream.write_all(head.as_bytes()).await.expect("head");
    let body = vec![b' '; sent];
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let (mut rd, mut wr) = stream.split();
    // The server may answer (and close) before the body is all sent: read while writing.
    let done = tokio::time::timeout(Duration::from_secs(20), async {
        tokio::select! {
            _ = wr.write_all(&body) => {}
            r = rd.read(&mut buf) => if let Ok(n) = r {
                answer.extend_from_slice(&buf[..n]);
            },
        }
    })
    .await;
    assert!(done.is_ok(), "the body could not be sent in 20 s");
    Hoarder { stream, answer }
}

impl Hoarder {
    /// Reads the rest of the server's answer until it closes the connection (at most `wait`).
    async fn answer(mut self, wait: Duration) -> String {
        let end = Instant::now() + wait;
        let mut buf = [0u8; 4096];
        loop {
            match tokio::time::timeout_at(end.into(), self.stream.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => self.answer.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
        String::from_utf8_lossy(&self.answer).into_owned()
    }
}

/// The value of the unlabelled series `name` on a `/metrics` page.
fn metric(page: &str, name: &str) -> Option<f64> {
    page.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Polls `value` until `ok` holds (at most 20 s); the last value seen.
async fn until<F, Fut>(mut value: F, ok: impl Fn(f64) -> bool) -> f64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = f64>,
{
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let v = value().await;
        if ok(v) || Instant::now() > end {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn proxy_with_budget(worker: &Proc) -> Proc {
    let dir = std::env::temp_dir().join(format!("sieve-e2e-{}-budget", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("proxy.toml");
    // 16 MiB: large bodies share 14 MiB of it (three 4 MiB buffers), small ones the rest. A
    // long body timeout, so the stalled bodies stay for the whole test.
    let text = format!(
        "[http]\nmax_buffered_bytes = {}\nbody_read_timeout_ms = 60000\n\n[limits]\nmax_body_bytes = {}\n",
        16 * MIB,
        4 * MIB
    );
    std::fs::write(&cfg, text).unwrap();
    let cfg = cfg.display().to_string();
    let w = worker.worker_arg();
    spawn("sieve-proxy", &["--port", "0", "--admin-port", "0", "--worker", &w, "--config", &cfg], START)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_hoarding_large_bodies_cannot_grow_the_proxy_past_its_budget() {
    let http = Http::new();
    let sim = spawn("sieve-loadtest", &["sim-worker", "--port", "0", "--admin-port", "0"], START);
    let proxy = proxy_with_budget(&sim);
    assert!(wait_ready(&http, &proxy.admin_url(), START).await, "proxy never ready");
    let (score_url, metrics_url) = (format!("{}/v1/score", proxy.api_url()), format!("{}/metrics", proxy.admin_url()));
    let small = score_body(QUERY, &catalogue(4, 1), None);
    assert_eq!(http.post_json(&score_url, &small).await.status, 200);
    let (h, mu) = (&http, &metrics_url);
    let buffered = move || async move { metric(&h.get(mu).await.text(), m::BUFFERED_BYTES.name).unwrap_or(-1.0) };
    let (rss_start, _) = memory_kib(proxy.pid()).expect("proxy RSS");

    // Three bodies of 4 MiB, 3.5 MiB of each sent, held one after the other: 10.5-12 of 14 MiB
    // (a body's buffer doubles from its first frame's size up to the declared length, so the
    // frames' sizes decide where between the bytes sent and that length it stops).
    let mut held = Vec::new();
    let mut total = 0.0;
    for i in 1..=3 {
        held.push(start_hoard(proxy.api, 4 * MIB, 7 * MIB / 2).await);
        let b = until(buffered, |b| b >= total + (7 * MIB / 2) as f64).await;
        assert!((3.5 * MIB as f64..=(4 * MIB) as f64).contains(&(b - total)), "hoard {i}: {} held", b - total);
        total = b;
    }
    // Nine more at once: none fits (each grows to 3.5 MiB or more, past the 2-3.5 MiB that the
    // three leave), so all are refused and closed
    // well before the 60 s body timeout (the 503 may be lost to the reset of a close with the
    // rest of the body unread; the one below is read whole).
    let t0 = Instant::now();
    let more: Vec<_> = (0..9).map(|_| tokio::spawn(start_hoard(proxy.api, 4 * MIB, 7 * MIB / 2))).collect();
    for h in more {
        let answer = h.await.unwrap().answer(Duration::from_secs(20)).await;
        assert!(matches!(status_of(answer.as_bytes()), Some(503) | None), "{answer}");
    }
    assert!(t0.elapsed() < Duration::from_secs(20), "refused at once, not at the body timeout");
    assert_eq!(buffered().await, total, "the refused bodies gave their bytes back");
    // A further large body: 503 as soon as its buffer would pass the budget (at 2 MiB of its
    // 3 MiB; it sends no more, so the answer is read whole), the message naming the limit.
    let t0 = Instant::now();
    let answer = start_hoard(proxy.api, 3 * MIB, 2 * MIB + 1).await.answer(Duration::from_secs(20)).await;
    assert!(t0.elapsed() < Duration::from_secs(20), "refused at once, not at the body timeout");
    assert_eq!(status_of(answer.as_bytes()), Some(503), "{answer}");
    let lower = answer.to_ascii_lowercase();
    assert!(lower.contains("retry-after: 1") && lower.contains("connection: close"), "{answer}");
    assert!(answer.contains("max_buffered_bytes"), "the message names the limit: {answer}");
    // Small requests still pass: the last eighth is theirs.
    let r = http.post_json(&score_url, &small).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // RSS: at most the budget (16 MiB) over the start, plus a constant; without the budget the
    // twelve bodies would be 48 MiB.
    let (rss, _) = memory_kib(proxy.pid()).expect("proxy RSS");
    let growth_mib = (rss.saturating_sub(rss_start)) as f64 / 1024.0;
    println!("proxy RSS grew {growth_mib:.1} MiB with 12 MiB held");
    assert!(growth_mib < 16.0 + 12.0, "proxy RSS grew {growth_mib:.1} MiB (from {} KiB)", rss_start);

    // The hoarders go away: every byte comes back, and a large body is read again (all
    // whitespace: 400, the budget no longer in the way).
    drop(held);
    assert_eq!(until(buffered, |b| b == 0.0).await, 0.0, "bytes left held after the clients closed");
    let r = http.post(&score_url, vec![b' '; 3 * MIB]).await;
    assert_eq!(r.status, 400, "{}", r.text());
    let r = http.post_json(&score_url, &small).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let page = http.get(&metrics_url).await.text();
    assert!(metric(&page, m::BUFFER_REFUSALS.name).is_some_and(|n| n >= 10.0), "refusals counted: {page}");
    assert_eq!(metric(&page, m::BUFFERED_BYTES.name), Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_and_grpc_ports_of_a_process_share_one_budget() {
    // Fast, so the large call's 120 items are scored in moments.
    let mut cfg = SimConfig { speed: 100.0, ..SimConfig::default() };
    cfg.grpc.port = Some(0);
    // 1 MiB: large requests share 896 KiB of it.
    cfg.http = HttpConfig { max_buffered_bytes: MIB, body_read_timeout_ms: 60_000, ..HttpConfig::default() };
    cfg.limits = Limits { max_body_bytes: 768 << 10, ..Limits::default() };
    let sim = SimWorker::start_local(cfg).await.expect("sim worker");
    let budget = sim.engine().buffer_budget().clone();
    let b = &budget;
    let held_now = move || async move { b.held() as f64 };
    let url = sim.grpc_url().expect("gRPC port");
    let ch = tonic::transport::Endpoint::from_shared(url).unwrap().connect().await.unwrap();
    let mut client = SieveClient::new(ch);
    let large = pb::ScoreRequest {
        query: QUERY.into(),
        items: (0..120).map(|i| pb::Item { text: format!("{i} {}", "x".repeat(4000)), id: None }).collect(),
        ..Default::default()
    };
    let small = pb::ScoreRequest {
        query: QUERY.into(),
        items: vec![pb::Item { text: "trail shoe".into(), id: None }],
        ..Default::default()
    };
    let call = Duration::from_secs(20);

    // An HTTP body holds 672-768 KiB (its buffer doubles from its first frame's size, up to the
    // declared length, so the frames' sizes decide where it stops): a gRPC message of ~480 KB
    // does not fit in the at most 224 KiB that large requests have left.
    let hoarder = start_hoard(sim.api_addr, 768 << 10, 672 << 10).await;
    let held = until(held_now, |b| b >= (672 << 10) as f64).await;
    assert!(((672 << 10) as f64..=(768 << 10) as f64).contains(&held), "held {held}");
    let e = tokio::time::timeout(call, client.score(large.clone())).await.unwrap().unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("max_buffered_bytes"), "{}", e.message());
    assert_eq!(
        e.get_details_retry_info().and_then(|r| r.retry_delay),
        Some(Duration::from_secs(1)),
        "retry info, as HTTP's Retry-After"
    );
    assert!(budget.refusals() >= 1);
    // The refused call gave its bytes back; a small call still passes.
    assert_eq!(until(held_now, |b| b <= held).await, held);
    let ok = tokio::time::timeout(call, client.score(small.clone())).await.unwrap();
    assert_eq!(ok.expect("a small call fits").into_inner().scores.len(), 1);

    // The HTTP client goes away: the large call fits now, and nothing stays held after it.
    drop(hoarder);
    assert_eq!(until(held_now, |b| b == 0.0).await, 0.0);
    let ok = tokio::time::timeout(call, client.score(large)).await.unwrap();
    assert_eq!(ok.expect("fits once the budget is free").into_inner().scores.len(), 120);
    assert_eq!(until(held_now, |b| b == 0.0).await, 0.0, "released after the answer");
}
