//! `sieve-worker` as a process, with the embedded default model: the admin port stays on
//! loopback when the API binds 0.0.0.0, `POST /drain` needs the admin token, and a drain ends
//! within `server.drain_timeout_ms` even with a client stalled mid-body and one mid-head.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use sieve_server::child::{self, spawn_listening, KillOnDrop};
use sieve_worker::assets;

/// One exchange on a fresh connection: (status, body).
fn call(addr: &str, method: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n{auth}\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string())
}

#[test]
fn drain_needs_the_token_and_ends_within_its_timeout_despite_stalled_clients() {
    let model = assets::cache_dir().join(assets::DEFAULT_MODEL);
    assert!(model.is_file(), "{} is missing: run scripts/fetch-assets (scripts/test does)", model.display());
    let dir = std::env::temp_dir().join(format!("sieve-worker-drain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("w.toml");
    // Client timeouts far longer than the drain: only the drain's bound can end them.
    std::fs::write(
        &cfg,
        "[server]\ndrain_timeout_ms = 800\n[http]\nheader_read_timeout_ms = 60000\nbody_read_timeout_ms = 60000\n",
    )
    .unwrap();
    let l = spawn_listening(
        Command::new(env!("CARGO_BIN_EXE_sieve-worker"))
            .args([
                "--model",
                model.to_str().unwrap(),
                "--threads",
                "1",
                "--no-autotune",
                "--host",
                "0.0.0.0",
                "--port",
                "0",
                "--admin-port",
                "0",
                "--config",
            ])
            .arg(&cfg)
            .env("SIEVE_ADMIN_TOKEN", "tok"),
        libc::SIGKILL,
        Duration::from_secs(120),
    )
    .unwrap();
    let line = l.line;
    let mut child = KillOnDrop(l.child);
    let (api, admin) = (l.api.to_string(), l.admin.to_string());
    assert!(api.starts_with("0.0.0.0:"), "{line}");
    assert!(admin.starts_with("127.0.0.1:"), "the admin port stays on loopback: {line}");
    let api = api.replace("0.0.0.0", "127.0.0.1");

    let t0 = Instant::now();
    while call(&admin, "GET", "/ready", None).0 != 200 {
        assert!(t0.elapsed() < Duration::from_secs(120), "not ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (code, body) = call(&admin, "POST", "/drain", None);
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("\"type\":\"unauthorized\""), "{body}");
    assert_eq!(call(&admin, "POST", "/drain", Some("wrong")).0, 401);
    assert_eq!(call(&admin, "GET", "/ready", None).0, 200, "a refused drain changes nothing");

    let mut stalled = TcpStream::connect(&api).unwrap();
    stalled.write_all(b"POST /v1/score HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{\"query\"").unwrap();
    let mut half = TcpStream::connect(&api).unwrap();
    half.write_all(b"POST /v1/score HTTP/1.1\r\nhost: x\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(100));

    let t0 = Instant::now();
    let (code, body) = call(&admin, "POST", "/drain", Some("tok"));
    assert_eq!(code, 202, "{body}");
    let status = child::wait_exit(&mut child.0, Duration::from_secs(10))
        .expect("still running 10 s after POST /drain (drain timeout 800 ms)");
    let took = t0.elapsed();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "{status:?}");
    assert!(took < Duration::from_secs(4), "exited {took:?} after POST /drain, drain timeout 800 ms");
}
