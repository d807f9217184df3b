//! The `sieve-proxy` command line: flags, config errors, the listening line.
//! (Being an integration test also makes `cargo test` build the binaries the end-to-end
//! tests start.)

use std::process::Command;
use std::time::Duration;

use sieve_server::child::{spawn_listening, KillOnDrop};

const PROXY: &str = env!("CARGO_BIN_EXE_sieve-proxy");

#[test]
fn help_lists_the_contract_flags() {
    let out = Command::new(PROXY).arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in ["--host", "--port", "--admin-port", "--worker", "--config"] {
        assert!(text.contains(flag), "--help lacks {flag}:\n{text}");
    }
}

#[test]
fn a_bad_config_or_worker_is_refused_with_its_name() {
    let dir = std::env::temp_dir().join(format!("sieve-proxy-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("bad.toml");
    std::fs::write(&cfg, "[hedge]\nquantile = 2.0\n").unwrap();
    let out = Command::new(PROXY).arg("--config").arg(&cfg).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("hedge.quantile"));
    let out = Command::new(PROXY).args(["--worker", "localhost:8081"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("localhost:8081"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn prints_the_listening_line_and_serves_its_admin_port() {
    let l = spawn_listening(
        Command::new(PROXY).args(["--port", "0", "--admin-port", "0"]),
        libc::SIGKILL,
        Duration::from_secs(30),
    )
    .unwrap();
    drop(KillOnDrop(l.child));
    let parts: Vec<&str> = l.line.split_whitespace().collect();
    assert_eq!(parts.len(), 4, "{}", l.line);
    assert_eq!(&parts[..2], &["sieve-proxy", "listening"]);
    assert!(l.api.port() != 0 && l.admin.port() != 0 && l.api != l.admin);
}
