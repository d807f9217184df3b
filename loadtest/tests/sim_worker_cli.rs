//! The `sieve-loadtest sim-worker` command line. (Being an integration test also makes
//! `cargo test` build the binary the end-to-end tests start.)

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use sieve_server::child::{spawn_listening, KillOnDrop};

const BIN: &str = env!("CARGO_BIN_EXE_sieve-loadtest");

#[test]
fn serves_the_worker_api_and_prints_the_workers_listening_line() {
    let l = spawn_listening(
        Command::new(BIN).args(["sim-worker", "--port", "0", "--admin-port", "0", "--speed", "4", "--slots", "2"]),
        libc::SIGKILL,
        Duration::from_secs(30),
    )
    .unwrap();
    let (line, api, child) = (l.line, l.api, KillOnDrop(l.child));
    assert!(line.starts_with("sieve-worker listening api=127.0.0.1:"), "{line}");
    let body = r#"{"query":"red shoes","items":["red running shoe","blue hat"]}"#;
    let mut s = TcpStream::connect(api).unwrap();
    write!(s, "POST /v1/score HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    drop(child);
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.contains("\"scores\":[") && resp.contains("\"item_tokens\":["), "{resp}");
}

#[test]
fn bad_flags_are_refused() {
    let out = Command::new(BIN).args(["sim-worker", "--slowdown", "fast"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("FACTOR"));
    let out = Command::new(BIN)
        .args(["sim-worker", "--port", "0", "--admin-port", "0", "--fail-rate", "2"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("fail-rate"));
}
