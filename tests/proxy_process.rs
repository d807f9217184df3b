//! The `sieve-proxy` and `sieve-loadtest sim-worker` binaries as processes on loopback: the
//! command-line contract, a worker process killed mid-shard, one frozen on a cold proxy, and
//! drain on SIGTERM.

use std::time::{Duration, Instant};

use sieve_e2e::{all_closed, catalogue, printed_addresses, score_body, sieve_up_demo, spawn, wait_ready, Http, Proc};
use sieve_proxy::metrics as m;
use sieve_server::child;
use sieve_shared::ScoreResponse;

const QUERY: &str = "waterproof trail running shoes";
const START: Duration = Duration::from_secs(20);

fn sim(extra: &[&str]) -> Proc {
    let mut args = vec!["sim-worker", "--port", "0", "--admin-port", "0"];
    args.extend_from_slice(extra);
    spawn("sieve-loadtest", &args, START)
}

fn proxy(workers: &[&Proc], config: Option<&std::path::Path>) -> Proc {
    let mut args: Vec<String> = vec!["--port".into(), "0".into(), "--admin-port".into(), "0".into()];
    for w in workers {
        args.push("--worker".into());
        args.push(w.worker_arg());
    }
    if let Some(c) = config {
        args.push("--config".into());
        args.push(c.display().to_string());
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    spawn("sieve-proxy", &refs, START)
}

fn temp_config(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("sieve-e2e-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("proxy.toml");
    std::fs::write(&p, text).unwrap();
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_and_sim_worker_binaries_keep_the_command_line_contract() {
    let http = Http::new();
    let (a, b) = (sim(&[]), sim(&["--speed", "0.5", "--jitter", "0.1"]));
    for w in [&a, &b] {
        assert!(w.line.starts_with("sieve-worker listening api=127.0.0.1:"), "{}", w.line);
    }
    let p = proxy(&[&a, &b], None);
    assert!(
        p.line.starts_with("sieve-proxy listening api=127.0.0.1:") && p.line.contains(" admin=127.0.0.1:"),
        "{}",
        p.line
    );
    assert!(wait_ready(&http, &p.admin_url(), START).await, "proxy never ready");
    let body = score_body(QUERY, &catalogue(120, 1), None);
    let want: ScoreResponse = http.post_json(&format!("{}/v1/score", a.api_url()), &body).await.json();
    let r = http.post_json(&format!("{}/v1/score", p.api_url()), &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json::<ScoreResponse>().scores, want.scores);
    let workers: serde_json::Value = http.get(&format!("{}/workers", p.admin_url())).await.json();
    assert_eq!(workers["workers"].as_array().map(Vec::len), Some(2));
    let metrics = http.get(&format!("{}/metrics", p.admin_url())).await.text();
    for name in [m::REQUESTS, m::SHARD_ITEMS, m::WORKER_IN_FLIGHT, m::WORKER_BREAKER_STATE] {
        assert!(metrics.contains(name.name), "/metrics lacks {name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_process_killed_mid_shard_costs_no_request() {
    let http = Http::new();
    let a = sim(&[]);
    let mut b = sim(&["--slowdown", "200"]); // its shards take seconds
    let cfg = temp_config("kill", "[hedge]\nenabled = false\n[health]\ninterval_ms = 50\n");
    let p = proxy(&[&a, &b], Some(&cfg));
    assert!(wait_ready(&http, &p.admin_url(), START).await);
    // Both workers must be eligible, so the request is split across them.
    let end = Instant::now() + START;
    loop {
        let w: serde_json::Value = http.get(&format!("{}/workers", p.admin_url())).await.json();
        if w["eligible"] == 2 {
            break;
        }
        assert!(Instant::now() < end);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let body = score_body(QUERY, &catalogue(100, 2), None);
    let want: ScoreResponse = http.post_json(&format!("{}/v1/score", a.api_url()), &body).await.json();
    let (h, url, bd) = (http.clone(), format!("{}/v1/score", p.api_url()), body.clone());
    let call = tokio::spawn(async move { h.post_json(&url, &bd).await });
    let end = Instant::now() + START;
    loop {
        let s: serde_json::Value = http.get(&format!("{}/stats", b.admin_url())).await.json();
        if s["in_flight_requests"].as_u64() >= Some(1) {
            break;
        }
        assert!(Instant::now() < end, "the slow worker never got a shard");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    b.kill(); // SIGKILL mid-shard
    let r = call.await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let got: ScoreResponse = r.json();
    assert!(got.missing.is_empty());
    assert_eq!(got.scores, want.scores);
    std::fs::remove_dir_all(cfg.parent().unwrap()).ok();
}

/// A fresh proxy whose worker freezes (SIGSTOP) for 3 s in its first second, under
/// back-to-back clients: the shards held up on it are that worker's stall, not the cluster's
/// error, so no request is refused (429) for it. Before, the first samples (the stall among
/// them) held every plan to the stall: 56-62 of 80 requests refused as "predicted to finish in
/// 30-38 s", for 0.28 s of work. About 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_frozen_on_a_cold_proxy_gets_no_request_refused() {
    frozen_worker_on_a_cold_proxy(false).await;
}

/// Without an admin URL no health check finds the frozen worker out: only what its shards do
/// tells. The stall is charged to it (its backlog grows while it holds a shard past its due
/// time), not to the cluster: before, 530 of 578 requests were refused here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_worker_without_health_checks_is_charged_its_stall_and_nothing_is_refused() {
    frozen_worker_on_a_cold_proxy(true).await;
}

/// Three slow sim-workers behind a fresh proxy (`passive`: given without their admin URLs), one
/// frozen for 3 s, four clients back to back: no request refused, few shards sent to the frozen one.
async fn frozen_worker_on_a_cold_proxy(passive: bool) {
    let http = Http::new();
    // Slow sim-workers: a 64-item request is about 0.1-0.3 s of work.
    let ws = [sim(&["--speed", "0.2"]), sim(&["--speed", "0.2"]), sim(&["--speed", "0.2"])];
    let p = if passive {
        let args: Vec<String> = ws.iter().flat_map(|w| ["--worker".to_string(), w.api_url()]).collect();
        let mut refs = vec!["--port", "0", "--admin-port", "0"];
        refs.extend(args.iter().map(String::as_str));
        spawn("sieve-proxy", &refs, START)
    } else {
        proxy(&[&ws[0], &ws[1], &ws[2]], None)
    };
    assert!(wait_ready(&http, &p.admin_url(), START).await);
    let end = Instant::now() + START;
    while http.get(&format!("{}/workers", p.admin_url())).await.json::<serde_json::Value>()["eligible"] != 3 {
        assert!(Instant::now() < end, "the workers never became eligible");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let shards_on_frozen = || async {
        let table: serde_json::Value = http.get(&format!("{}/workers", p.admin_url())).await.json();
        let rows = table["workers"].as_array().cloned().unwrap_or_default();
        let row = rows.iter().find(|w| w["url"] == ws[2].api_url().as_str()).cloned().expect("the frozen worker's row");
        row["shards"].as_u64().unwrap()
    };
    let before = shards_on_frozen().await;
    ws[2].signal(libc::SIGSTOP);
    let frozen = ws[2].pid() as libc::pid_t;
    let thaw = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(3));
        // SAFETY: a signal to our own child process, which is alive until `ws` is dropped.
        unsafe { libc::kill(frozen, libc::SIGCONT) };
    });
    // Four clients back to back through the freeze and 1.5 s after it (when the stalled shards
    // have come back and been measured).
    let stop = Instant::now() + Duration::from_millis(4500);
    let clients: Vec<_> = (0..4u64)
        .map(|c| {
            let (http, url) = (http.clone(), format!("{}/v1/score", p.api_url()));
            tokio::spawn(async move {
                let mut codes = Vec::new();
                for i in 0.. {
                    if Instant::now() >= stop {
                        break;
                    }
                    let mut body = score_body(QUERY, &catalogue(64, c * 1000 + i), Some(2000));
                    body["cache"] = false.into();
                    let r = http.post_json(&url, &body).await;
                    codes.push((r.status, r.text()));
                }
                codes
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(2900)).await;
    let sent_while_frozen = shards_on_frozen().await - before;
    let mut codes = Vec::new();
    for c in clients {
        codes.extend(c.await.unwrap());
    }
    thaw.join().unwrap();
    let count = |s: u16| codes.iter().filter(|(c, _)| *c == s).count();
    eprintln!(
        "{} requests: {} 200, {} 429, {} 504; {sent_while_frozen} shards sent to the frozen worker while frozen",
        codes.len(),
        count(200),
        count(429),
        count(504)
    );
    // The clients' first shards, sent before it was due to answer; then none.
    assert!(sent_while_frozen <= 6, "{sent_while_frozen} shards sent to a worker frozen for 3 s");
    assert!(codes.len() >= 20, "too few requests to tell: {}", codes.len());
    let refused: Vec<&String> = codes.iter().filter(|(c, _)| *c == 429).map(|(_, t)| t).collect();
    assert!(refused.is_empty(), "{} of {} refused, e.g. {}", refused.len(), codes.len(), refused[0]);
    assert!(count(200) * 2 >= codes.len(), "most are answered: {codes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_the_proxy_without_failing_requests_in_flight() {
    let http = Http::new();
    let (a, b) = (sim(&["--speed", "0.05"]), sim(&["--speed", "0.05"]));
    let cfg =
        temp_config("drain", "[health]\ninterval_ms = 50\n[hedge]\nenabled = false\n[deadline]\ndefault_ms = 20000\n");
    let mut p = proxy(&[&a, &b], Some(&cfg));
    assert!(wait_ready(&http, &p.admin_url(), START).await);
    let n = 6;
    let calls: Vec<_> = (0..n)
        .map(|i| {
            let (h, url) = (http.clone(), format!("{}/v1/score", p.api_url()));
            let body = score_body(QUERY, &catalogue(60, 10 + i), None);
            tokio::spawn(async move { h.try_post_json(&url, &body).await })
        })
        .collect();
    let end = Instant::now() + START;
    loop {
        let w: serde_json::Value = http.get(&format!("{}/workers", p.admin_url())).await.json();
        if w["requests_in_flight"].as_u64() == Some(n) {
            break;
        }
        assert!(Instant::now() < end, "requests never all in flight: {w}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    p.terminate();
    // While draining: not ready, and new requests are refused.
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let r = http.get(&format!("{}/ready", p.admin_url())).await;
        if r.status == 503 {
            break;
        }
        assert!(Instant::now() < end, "still ready after SIGTERM");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let late = http.post_json(&format!("{}/v1/score", p.api_url()), &score_body(QUERY, &catalogue(5, 1), None)).await;
    assert_eq!(late.status, 503, "a request after SIGTERM is refused: {}", late.text());
    for c in calls {
        let r = c.await.unwrap().expect("an in-flight request survived the drain");
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.json::<ScoreResponse>().missing.is_empty());
    }
    let status = p.wait_exit(Duration::from_secs(15)).expect("the proxy exits after draining");
    assert!(status.success(), "{status:?}");
    std::fs::remove_dir_all(cfg.parent().unwrap()).ok();
}

#[test]
fn sieve_up_scores_the_demo_request_and_leaves_nothing_running() {
    let stdout = sieve_up_demo(&["up", "--sim", "--workers", "3"]);
    assert!(stdout.contains("timing:") && stdout.contains("over "), "{stdout}");
    let addrs = printed_addresses(&stdout);
    assert_eq!(addrs.len(), 8, "proxy api+admin and 3 workers' api+admin: {addrs:?}");
    assert!(all_closed(&addrs), "a process of the cluster is still listening");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sieve_up_keep_running_serves_until_interrupted_and_sieve_score_ranks() {
    use std::io::{BufRead, BufReader};
    let http = Http::new();
    let mut child = std::process::Command::new(sieve_e2e::bin("sieve"))
        .args(["up", "--sim", "--workers", "2", "--keep-running", "--port", "0", "--admin-port", "0"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut printed = String::new();
    let url = loop {
        let mut line = String::new();
        assert!(reader.read_line(&mut line).unwrap() > 0, "sieve up exited early:\n{printed}");
        printed.push_str(&line);
        if let Some(rest) = line.strip_prefix("serving on ") {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    let r = http.post_json(&format!("{url}/v1/score"), &score_body(QUERY, &catalogue(30, 3), None)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/demo-request.json");
    let out = std::process::Command::new(sieve_e2e::bin("sieve"))
        .args(["score", "--items-file", demo, "--target", &url, "--top", "5"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let rows =
        text.lines().filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()) && l.contains("sku-")).count();
    assert_eq!(rows, 5, "{text}");
    child::signal(&child, libc::SIGINT);
    let status = child::wait_exit(&mut child, Duration::from_secs(20)).expect("sieve up stops on Ctrl-C");
    assert!(status.success(), "{status:?}");
    assert!(all_closed(&printed_addresses(&printed)), "a process of the cluster is still listening");
}

/// `sieve up --worker-config FILE` gives every worker the file: a key the workers refuse stops
/// the cluster naming the worker, and a `[grpc] port` (one port cannot serve two workers)
/// becomes a free port per worker, so a cluster of two starts and scores.
#[test]
fn sieve_up_passes_its_worker_config_to_every_worker() {
    let dir = std::env::temp_dir().join(format!("sieve-up-worker-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let grpc = dir.join("grpc.toml");
    // A port taken here: were it given to the workers as is, neither could bind it.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std::fs::write(&grpc, format!("[grpc]\nport = {}\n", taken.local_addr().unwrap().port())).unwrap();
    let stdout = sieve_up_demo(&["up", "--sim", "--workers", "2", "--worker-config", grpc.to_str().unwrap()]);
    assert!(stdout.contains("timing:"), "{stdout}");

    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[api]\nno_such_key = 1\n").unwrap();
    let out = std::process::Command::new(sieve_e2e::bin("sieve"))
        .args(["up", "--sim", "--workers", "1", "--worker-config", bad.to_str().unwrap()])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a worker config the workers refuse stops sieve up: {stderr}");
    assert!(stderr.contains("worker 0"), "{stderr}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn sieve_up_refuses_a_worker_count_it_cannot_start_before_starting_any() {
    for n in ["0", "100000"] {
        let out = std::process::Command::new(sieve_e2e::bin("sieve"))
            .args(["up", "--sim", "--workers", n])
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains("--workers must be in 1..=64"), "{n}: {stderr}");
        assert!(!stderr.contains("starting"), "{n}: nothing is started: {stderr}");
    }
}
