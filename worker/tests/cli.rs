//! The `sieve-worker` command line: bad flags and a missing device fail fast and clearly.

use std::process::Command;

fn worker(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sieve-worker")).args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_bad_device_or_config_is_refused_before_serving() {
    let (code, err) = worker(&["--device", "tpu", "--port", "0", "--admin-port", "0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("expected cpu or cuda:N"), "{err}");
    let dir = std::env::temp_dir().join(format!("sieve-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("w.toml");
    std::fs::write(&cfg, "[engine]\nmax_batch_tokns = 4\n").unwrap();
    let (code, err) = worker(&["--config", cfg.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("max_batch_tokns"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cuda_without_a_driver_is_a_clear_error_not_a_panic() {
    if sieve_kernels::cuda::driver_present() {
        eprintln!("NOT RUN: a CUDA driver is present on this machine; this test covers machines without one");
        return;
    }
    let (code, err) = worker(&["--device", "cuda:0", "--model", "default", "--port", "0", "--admin-port", "0"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("cuda:0") && err.contains("no CUDA driver"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
