//! `sieve-loadtest sim-worker` on SIGTERM: the whole drain, connections closed included, ends
//! within `--drain-timeout-ms` even with a client stalled mid-body and one mid-head.

use std::io::Write;
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use sieve_server::child::{self, spawn_listening, KillOnDrop};

const BIN: &str = env!("CARGO_BIN_EXE_sieve-loadtest");

#[test]
fn sigterm_ends_within_the_drain_timeout_despite_stalled_clients() {
    // Body and head timeouts far longer than the drain: only the drain's bound can end them.
    let cfg = std::env::temp_dir().join(format!("sieve-sim-drain-{}.toml", std::process::id()));
    std::fs::write(&cfg, "[http]\nheader_read_timeout_ms = 60000\nbody_read_timeout_ms = 60000\n").unwrap();
    let l = spawn_listening(
        Command::new(BIN)
            .args(["sim-worker", "--port", "0", "--admin-port", "0", "--drain-timeout-ms", "500", "--config"])
            .arg(&cfg),
        libc::SIGKILL,
        Duration::from_secs(30),
    )
    .unwrap();
    let api = l.api;
    let mut child = KillOnDrop(l.child);
    let mut stalled = TcpStream::connect(api).unwrap();
    stalled.write_all(b"POST /v1/score HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{\"query\"").unwrap();
    let mut half = TcpStream::connect(api).unwrap();
    half.write_all(b"POST /v1/score HTTP/1.1\r\nhost: x\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(100));

    let t0 = Instant::now();
    child::signal(&child.0, libc::SIGTERM);
    let status = child::wait_exit(&mut child.0, Duration::from_secs(10))
        .expect("still running 10 s after SIGTERM (drain timeout 500 ms)");
    let took = t0.elapsed();
    let _ = std::fs::remove_file(&cfg);
    assert!(status.success(), "{status:?}");
    assert!(took < Duration::from_secs(3), "exited {took:?} after SIGTERM, drain timeout 500 ms");
}
