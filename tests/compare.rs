//! `sieve-loadtest compare` end to end, small: 4 simulated workers, one proxy process per
//! strategy, one load level and the kill-and-restart fault, a few seconds each. Checks that
//! every strategy ran, that every answer carried the right scores in the right order, that a
//! generous deadline leaves no request unanswered (even with a worker killed mid-run: retries
//! cover it), and that the tables, JSON and plots are written.

use std::process::Command;

use sieve_e2e::bin;

#[test]
fn a_short_comparison_runs_end_to_end() {
    let out = std::env::temp_dir().join(format!("sieve-compare-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let run = Command::new(bin("sieve-loadtest"))
        .args(["compare", "--workers", "4", "--speed", "1", "--loads", "50", "--duration", "2", "--warmup", "1"])
        .args([
            "--scenarios",
            "kill",
            "--fault-duration",
            "3",
            "--deadline-ms",
            "5000",
            "--items",
            "uniform:20,60",
            "--quiet",
        ])
        .arg("--out")
        .arg(&out)
        .arg("--proxy-bin")
        .arg(bin("sieve-proxy"))
        .env("RUST_LOG", "error")
        .output()
        .expect("runs sieve-loadtest");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    for name in [
        "1 whole request, random worker",
        "2 fixed split, random",
        "3 fixed split, least-loaded",
        "4 cost split, least-loaded (ours)",
        "5 ours + hedging",
        "6 whole request, least-loaded",
    ] {
        assert_eq!(stdout.matches(name).count(), 4, "{name}: a progress line and a table row per run\n{stdout}");
    }
    assert!(stdout.contains("capacity = workers x slots x speed"), "{stdout}");

    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("compare.json")).unwrap()).unwrap();
    let cells = report["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 12, "6 strategies x (one load + one fault)");
    for c in cells {
        let s = &c["summary"];
        let what = format!("{} {}", c["strategy_key"], c["scenario"]);
        assert!(s["requests"].as_u64().unwrap() > 0, "{what}: sent nothing");
        assert_eq!(s["errors"].as_u64(), Some(0), "{what}: {}", s["errors_by_kind"]);
        assert_eq!(s["missing_items"].as_u64(), Some(0), "{what}");
        assert_eq!(s["ok"], s["requests"], "{what}: every answer complete and correct");
        assert!(c["proxy"]["shards"].as_u64().unwrap() >= c["sent"].as_u64().unwrap(), "{what}");
    }
    // The fixed split cuts 20-60 items into shards of mean/workers = 10: several per request.
    let fixed = cells.iter().find(|c| c["strategy_key"] == "fixed-least").unwrap();
    assert!(fixed["proxy"]["shards"].as_u64().unwrap() >= 2 * fixed["sent"].as_u64().unwrap());
    let whole = cells.iter().find(|c| c["strategy_key"] == "whole-random" && c["scenario"] == "load").unwrap();
    assert_eq!(whole["proxy"]["shards"], whole["sent"], "one shard per request (warm-up included on both sides)");

    for f in ["compare.md", "cdf_load50.svg", "cdf_load50.png", "cdf_kill.png", "p99_vs_load.svg", "p99_vs_load.png"] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    for f in ["report.json", "latency_cdf.png", "latency_over_time.svg", "worker_utilisation.png"] {
        assert!(out.join("kill").join("ours").join(f).is_file(), "kill/ours/{f} missing");
    }
    let _ = std::fs::remove_dir_all(&out);
}
