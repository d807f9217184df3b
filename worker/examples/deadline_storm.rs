//! Deadlines under overload on one CPU worker (the embedded default model, default engine
//! config: max_batch_tokens 8192), served in-process on loopback through the real HTTP API.
//!
//! ```text
//! cargo run --release -p sieve-worker --example deadline_storm [-- --calls 64 --items 64 --deadline-ms 5000 --drop-ms 500 --threads 0]
//! ```
//! Scenario 1: `--calls` concurrent calls of `--items` items, `deadline_ms` `--deadline-ms`:
//! prints the distribution of answer times, status counts, partial answers (200 with `missing`)
//! and the worker's abandoned-work counters. Target: every answer by the deadline plus about one
//! layer's time.
//!
//! Scenario 2: the same storm without a deadline, every caller hanging up `--drop-ms` into the
//! first pass (as the proxy does with a shard past its deadline): prints how long the worker went
//! on computing after the hang-ups. Target: about one layer's time.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sieve_shared::Limits;
use sieve_worker::bench_support::item_text;
use sieve_worker::config::WorkerConfig;
use sieve_worker::engine::state::PipelineSnapshot;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A product-like item of 12–27 words (about 30–70 tokens).
fn item(seed: u64) -> String {
    item_text(seed, 12 + (seed % 16) as usize)
}

fn body(call: usize, items: usize, deadline_ms: Option<u64>) -> String {
    let its: Vec<String> = (0..items).map(|i| item(((call * 1000 + i) as u64) + 1)).collect();
    let mut b = json!({"query": format!("trail running shoes #{call}"), "items": its});
    if let Some(d) = deadline_ms {
        b["deadline_ms"] = json!(d);
    }
    b.to_string()
}

/// One HTTP/1.1 exchange: (status, body).
async fn post(addr: std::net::SocketAddr, body: String) -> (u16, Value) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let head = format!("POST /v1/score HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", body.len());
    s.write_all(head.as_bytes()).await.expect("write");
    s.write_all(body.as_bytes()).await.expect("write");
    let mut out = vec![];
    let _ = s.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out);
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let v = text.split_once("\r\n\r\n").and_then(|(_, b)| serde_json::from_str(b).ok()).unwrap_or(Value::Null);
    (status, v)
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn deltas(a: &PipelineSnapshot, b: &PipelineSnapshot) -> String {
    format!(
        "passes {} (abandoned {}, {} rows abandoned); calls expired queued {}, expired running {}, partial {}, cancelled {}",
        b.forward_passes - a.forward_passes,
        b.passes_abandoned - a.passes_abandoned,
        b.rows_abandoned - a.rows_abandoned,
        b.calls_expired_queued - a.calls_expired_queued,
        b.calls_expired_running - a.calls_expired_running,
        b.partial_answers - a.partial_answers,
        b.calls_cancelled - a.calls_cancelled,
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |flag: &str, d: u64| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(d)
    };
    let (calls, items, deadline_ms, drop_ms) =
        (arg("--calls", 64) as usize, arg("--items", 64) as usize, arg("--deadline-ms", 5000), arg("--drop-ms", 500));
    let mut cfg = WorkerConfig::default();
    cfg.model.threads = arg("--threads", 0) as usize;
    cfg.limits = Limits { max_items: items.max(2048), ..Limits::default() };
    (cfg.server.port, cfg.server.admin_port) = (0, 0);
    let mut worker = sieve_worker::start(cfg, None).await.expect("start");
    worker.loaded().await.expect("model");
    let app = worker.app.clone();
    let engine = app.engine.get().expect("engine").clone();
    let name = app.model_name.get().cloned().unwrap_or_default();
    let addr = worker.api_addr;
    let st = app.state.clone();

    // Warm-up: one small call measures the throughput the passes are sized from.
    let (code, _) = post(addr, body(9999, 8, None)).await;
    assert_eq!(code, 200, "warm-up");
    println!(
        "model {name} ({} layers), CPU, max_batch_tokens {}; warm-up measured {:.0} tokens/s",
        engine.n_layers,
        engine.cfg.max_batch_tokens,
        st.tokens_per_second()
    );

    // Scenario 1.
    let before = st.pipeline();
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..calls)
        .map(|c| {
            let b = body(c, items, Some(deadline_ms));
            tokio::spawn(async move {
                let (code, v) = post(addr, b).await;
                let missing = v["missing"].as_array().map(|m| m.len()).unwrap_or(0);
                (t0.elapsed().as_secs_f64(), code, missing)
            })
        })
        .collect();
    let mut results = vec![];
    for t in tasks {
        results.push(t.await.expect("task"));
    }
    let mut times: Vec<f64> = results.iter().map(|r| r.0).collect();
    times.sort_by(f64::total_cmp);
    let mut by_status = std::collections::BTreeMap::new();
    for r in &results {
        *by_status.entry(r.1).or_insert(0) += 1;
    }
    let partial: Vec<&(f64, u16, usize)> = results.iter().filter(|r| r.1 == 200 && r.2 > 0).collect();
    let full = results.iter().filter(|r| r.1 == 200 && r.2 == 0).count();
    let scored_items: usize = results.iter().filter(|r| r.1 == 200).map(|r| items - r.2).sum();
    println!("\nscenario 1: {calls} concurrent calls x {items} items, deadline_ms {deadline_ms}");
    println!(
        "  answer times (s): min {:.2}  p50 {:.2}  p90 {:.2}  p99 {:.2}  max {:.2}",
        times[0],
        pct(&times, 0.5),
        pct(&times, 0.9),
        pct(&times, 0.99),
        times[times.len() - 1]
    );
    println!(
        "  status counts: {by_status:?}; complete 200: {full}; partial 200: {} ({} items scored in all)",
        partial.len(),
        scored_items
    );
    // Wait for the engine to settle before reading the counters.
    while st.in_flight_requests.get() > 0 || st.pass_running.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let settled = t0.elapsed().as_secs_f64();
    let after = st.pipeline();
    println!(
        "  worker: {}; engine idle at {settled:.2} s; throughput now {:.0} tokens/s",
        deltas(&before, &after),
        st.tokens_per_second()
    );

    // Scenario 2.
    let before = st.pipeline();
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..calls).map(|c| tokio::spawn(post(addr, body(1000 + c, items, None)))).collect();
    // Hang up `drop_ms` into the first pass, mid-layer (admitting the storm may take a while
    // on a busy machine, so the clock starts with the pass).
    while !st.pass_running.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let pass_started = t0.elapsed();
    tokio::time::sleep(Duration::from_millis(drop_ms)).await;
    let answered = tasks.iter().filter(|t| t.is_finished()).count();
    for t in &tasks {
        t.abort(); // drops the connection, as the proxy does
    }
    let dropped_at = t0.elapsed();
    while st.in_flight_requests.get() > 0 || st.pass_running.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let went_on = t0.elapsed() - dropped_at;
    let after = st.pipeline();
    let tps = st.tokens_per_second();
    println!(
        "\nscenario 2: {calls} calls x {items} items, no deadline; the first pass started at {:.0} ms, every caller hung up {drop_ms} ms into it ({answered} answered before)",
        pass_started.as_secs_f64() * 1e3
    );
    println!("  the worker went on computing for {:.0} ms after the hang-ups", went_on.as_secs_f64() * 1e3);
    println!("  worker: {}", deltas(&before, &after));
    let full_pass = engine.cfg.max_batch_tokens as f64 / tps;
    println!(
        "  for scale: a full pass of {} tokens at {tps:.0} tokens/s takes {full_pass:.2} s, one of its {} layers {:.0} ms",
        engine.cfg.max_batch_tokens,
        engine.n_layers,
        full_pass / engine.n_layers as f64 * 1e3
    );
    engine.shutdown();
    worker.stop().await;
}
