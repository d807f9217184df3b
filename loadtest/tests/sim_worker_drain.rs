//! `sieve-loadtest sim-worker` on SIGTERM: the whole drain, connections closed included, ends
//! within `--drain-timeout-ms` even with a client stalled mid-body and one mid-head.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_sieve-loadtest");

#[test]
fn sigterm_ends_within_the_drain_timeout_despite_stalled_clients() {
    // Body and head timeouts far longer than the drain: only the drain's bound can end them.
    let cfg = std::env::temp_dir().join(format!("sieve-sim-drain-{}.toml", std::process::id()));
    std::fs::write(&cfg, "[http]\nheader_read_timeout_ms = 60000\nbody_read_timeout_ms = 60000\n").unwrap();
    let mut child = Command::new(BIN)
        .args(["sim-worker", "--port", "0", "--admin-port", "0", "--drain-timeout-ms", "500", "--config"])
        .arg(&cfg)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let api = line.split_whitespace().find_map(|p| p.strip_prefix("api=")).unwrap().to_string();
    let mut stalled = TcpStream::connect(&api).unwrap();
    stalled.write_all(b"POST /v1/score HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{\"query\"").unwrap();
    let mut half = TcpStream::connect(&api).unwrap();
    half.write_all(b"POST /v1/score HTTP/1.1\r\nhost: x\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(100));

    let t0 = Instant::now();
    // SAFETY: signalling our own child by its pid.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) }, 0);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("still running 10 s after SIGTERM (drain timeout 500 ms)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = t0.elapsed();
    let _ = std::fs::remove_file(&cfg);
    assert!(status.success(), "{status:?}");
    assert!(took < Duration::from_secs(3), "exited {took:?} after SIGTERM, drain timeout 500 ms");
}
