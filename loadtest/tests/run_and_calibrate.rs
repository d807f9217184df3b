//! `sieve-loadtest run` against a sim-worker process (report, plots, utilisation from the
//! worker's admin port), and `calibrate` against an in-process sim-worker whose cost model is
//! known: the fit must recover it.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use sieve_loadtest::calibrate::{calibrate, CalibrateSpec};
use sieve_loadtest::client::Http;
use sieve_loadtest::sim::{SimConfig, SimWorker};
use sieve_shared::CostModel;

const BIN: &str = env!("CARGO_BIN_EXE_sieve-loadtest");

#[test]
fn run_writes_a_report_with_plots_and_utilisation() {
    let mut sim = Command::new(BIN)
        .args(["sim-worker", "--port", "0", "--admin-port", "0", "--speed", "20", "--slots", "2"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(sim.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let (api, admin) = sieve_loadtest::process::parse_listening(&line).unwrap();
    let out = std::env::temp_dir().join(format!("sieve-run-test-{}", std::process::id()));
    let run = Command::new(BIN)
        .args(["run", "--target", &format!("http://{api}"), "--worker-admin", &format!("http://{admin}")])
        .args([
            "--qps",
            "40",
            "--duration",
            "3",
            "--requests",
            "60",
            "--items",
            "uniform:10,40",
            "--verify-sim-scores",
            "--quiet",
        ])
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let _ = sim.kill();
    let _ = sim.wait();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(stdout.contains("latency ms: p50"), "{stdout}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
    let s = &report["summary"];
    assert_eq!(s["requests"].as_u64(), Some(60), "bounded by the request count: {s}");
    assert_eq!(s["ok"].as_u64(), Some(60), "every answer complete, scores verified: {s}");
    assert!(s["latency_ms"]["p99"].as_f64().unwrap() > 0.0);
    assert!(!report["timeline"].as_array().unwrap().is_empty());
    let util = &report["utilisation"];
    assert_eq!(util["workers"].as_array().unwrap().len(), 1);
    assert!(
        util["series"][0].as_array().unwrap().iter().any(|v| v.as_f64().unwrap_or(0.0) > 0.0),
        "the worker was seen busy: {util}"
    );
    for f in ["latency_cdf", "latency_over_time", "worker_utilisation"] {
        for ext in ["svg", "png"] {
            assert!(out.join(format!("{f}.{ext}")).is_file(), "{f}.{ext}");
        }
    }
    let _ = std::fs::remove_dir_all(&out);

    let bad = Command::new(BIN).args(["run", "--target", "http://127.0.0.1:1", "--duration", "1"]).output().unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--qps"), "names the missing flag");
    let bad = Command::new(BIN)
        .args(["run", "--target", "http://127.0.0.1:1", "--qps", "5", "--items", "normal:3"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("distribution"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calibrate_recovers_a_sim_workers_cost_model() {
    let truth = CostModel { request_ms: 4.0, token_ms: 0.01, token_context_ms: 4e-5 };
    // Fast (speed 25) so the sweep takes a moment; the worker reports its simulated compute
    // time, which the fit must turn back into the model divided by the speed.
    let sim = SimWorker::start_local(SimConfig { cost: truth, speed: 25.0, ..SimConfig::default() }).await.unwrap();
    let spec = CalibrateSpec {
        query_words: vec![4, 120],
        items_per_call: vec![1, 8, 32],
        item_words: vec![16, 200],
        repeats: 1,
        warmup_calls: 1,
        ..CalibrateSpec::default()
    };
    let c = calibrate(&Http::new(), &sim.api_url(), Some(&sim.admin_url()), &spec, |_, _| {}).await.unwrap();
    assert_eq!(c.samples.len(), 12);
    assert_eq!(c.device, "sim");
    for (got, want) in c.model.as_array().iter().zip(truth.as_array()) {
        let want = want / 25.0;
        assert!((got - want).abs() <= 1e-3 * want, "fitted {:?}, expected {truth:?} / 25", c.model);
    }
    assert!(c.r2 > 0.9999 && c.median_rel_error < 1e-3, "r2 {} err {}", c.r2, c.median_rel_error);
    let file = CostModel::parse(&c.to_toml()).unwrap();
    assert!((file.token_ms - c.model.token_ms).abs() < 1e-9);
}
