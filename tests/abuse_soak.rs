//! The short abuse soak (issue 13): a real proxy and two real CPU workers on loopback under
//! trickled, stalled, hoarding (most of a large body, then nothing), half-sent, silent and idle
//! connections, connections that never read their answers, an overload burst and a worker killed
//! and replaced, while a steady client sends real requests with a 5 s deadline. The soak itself
//! is `sieve_e2e::soak`; `benches/abuse_soak.rs` runs a longer one and prints the same figures.
//!
//! Needs the embedded model in the asset cache (`scripts/test` fetches it first).

use sieve_e2e::soak::{self, SoakConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_and_two_workers_hold_their_targets_under_abuse() {
    let report = soak::run(SoakConfig::short()).await;
    let text = report.render();
    println!("{text}");
    // Each figure the targets name must have been measured, or the check below proves nothing.
    assert!(report.steady.sent >= 15, "{text}");
    assert!(report.burst.requests > 0, "{text}");
    assert_eq!(report.memory.len(), 4, "proxy, two workers and the replacement: {text}");
    for attack in sieve_e2e::abuse::Attack::ALL {
        for target in ["proxy", "worker 0"] {
            assert!(
                report.attacks.get(&(target, attack)).is_some_and(|a| a.connections > 0),
                "no {} connections to {target}: {text}",
                attack.name()
            );
        }
    }
    let failures = report.failures();
    assert!(failures.is_empty(), "targets missed:\n  - {}\n\n{text}", failures.join("\n  - "));
}

/// The gRPC port under its own abuse (`sieve_e2e::abuse_grpc`): a simulated worker's gRPC port,
/// with short `[http]` timers and keep-alive PINGs, gets connections that never send the
/// preface or half of it, that idle while answering PINGs, whose answer's window stays shut,
/// and that never read their socket, several of each at once. Each must be ended by its timer
/// (within a bound, and not before it), while a client's calls keep being answered, and a
/// client that pauses longer than the idle timeout between calls keeps working (its channel
/// reconnects after the GOAWAY).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_attacks_end_within_their_timers_while_calls_are_answered() {
    use sieve_e2e::abuse_grpc::{self, GrpcAttack};
    use sieve_loadtest::sim::{SimConfig, SimWorker};
    use sieve_server::grpc::pb::{self, sieve_client::SieveClient};
    use std::time::{Duration, Instant};

    /// How late past its timer an end may come (a loaded 2-core machine).
    const BOUND: Duration = Duration::from_millis(1500);
    const EACH: usize = 3;

    // The process's metrics recorder (the proxy's, as a proxy process installs it), before
    // the first timer ends anything: each end is counted.
    let metrics = sieve_proxy::metrics::handle();
    let mut cfg = SimConfig::default();
    cfg.grpc.port = Some(0);
    cfg.grpc.keepalive_interval_ms = 300;
    cfg.grpc.keepalive_timeout_ms = 1000;
    cfg.http.header_read_timeout_ms = 500;
    cfg.http.idle_timeout_ms = 1500;
    cfg.http.send_timeout_ms = 1000;
    let http = cfg.http.clone();
    let sim = SimWorker::start_local(cfg).await.expect("sim worker");
    let addr = sim.grpc_addr.expect("gRPC port");
    let url = sim.grpc_url().expect("gRPC URL");

    let mut attacks = tokio::task::JoinSet::new();
    for attack in GrpcAttack::ALL {
        for _ in 0..EACH {
            let http = http.clone();
            attacks.spawn(async move { abuse_grpc::run(attack, addr, &http, BOUND).await });
        }
    }
    let req = || pb::ScoreRequest {
        query: "waterproof trail running shoes".into(),
        items: vec![pb::Item { text: "a light shoe for wet trails".into(), id: None }],
        ..Default::default()
    };
    // Calls every 100 ms while the attacks run.
    let connect = |url: String| async move {
        let ch = tonic::transport::Endpoint::from_shared(url).expect("a URL").connect().await;
        SieveClient::new(ch.expect("a client connects"))
    };
    let mut steady = connect(url.clone()).await;
    let (mut answered, mut failed) = (0, vec![]);
    while !attacks.is_empty() {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(100)) => {
                match tokio::time::timeout(Duration::from_secs(5), steady.score(req())).await {
                    Ok(Ok(a)) => {
                        assert_eq!(a.into_inner().scores.len(), 1);
                        answered += 1;
                    }
                    other => failed.push(format!("{other:?}")),
                }
            }
            Some(outcome) = attacks.join_next() => {
                let o = outcome.expect("the attack task");
                let (name, deadline, earliest) = (o.attack.name(), o.attack.deadline(&http), o.attack.earliest(&http));
                println!("{name}: ended by the server {} after {:?} (timer {deadline:?})", o.ended_by_server, o.after);
                assert_eq!(o.error, None, "{name}");
                assert!(o.ended_by_server, "{name}: not ended within {deadline:?} + {BOUND:?}: {o:?}");
                assert!(o.after <= deadline + BOUND, "{name}: {o:?}");
                assert!(o.after + Duration::from_millis(100) >= earliest, "{name}: ended before its timer: {o:?}");
            }
        }
    }
    assert!(failed.is_empty(), "calls failed during the attacks: {failed:?}");
    assert!(answered >= 10, "calls answered during the attacks: {answered}");
    // Every attack connection ended by a timer is counted by it (the steady client's one may
    // be too, once idle).
    let page = metrics.render();
    let count = |timer: &str| {
        let series = format!("{}{{timer=\"{timer}\"}} ", sieve_shared::metrics_names::grpc::TIMEOUTS);
        page.lines().find_map(|l| l.strip_prefix(&series)).and_then(|v| v.trim().parse::<f64>().ok()).unwrap_or(0.0)
    };
    let each = EACH as f64;
    assert!(count("header") >= 2.0 * each, "silent and half-preface connections: {page}");
    // (A connection never read answers no PING either: hyper's keep-alive may end it first.)
    assert!(count("idle") >= each, "idle-pings connections: {page}");
    assert!(count("send_stream") >= each, "shut-window calls: {page}");

    // Pauses longer than the idle timeout: the connection is closed with GOAWAY in between,
    // and the channel's next call goes over a new one.
    let mut paused = connect(url).await;
    for i in 0..2 {
        if i > 0 {
            tokio::time::sleep(http.idle_timeout() + Duration::from_millis(500)).await;
        }
        let begun = Instant::now();
        let a = tokio::time::timeout(Duration::from_secs(5), paused.score(req())).await;
        assert!(matches!(&a, Ok(Ok(_))), "call {i} after a pause: {a:?}");
        println!("call {i} after a pause answered in {:?}", begun.elapsed());
    }
}
