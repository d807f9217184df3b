//! The Grafana dashboard (`configs/grafana/sieve.json`) names only metrics that exist: every
//! name in a panel query is one of the metric-name constants (`sieve_shared::metrics_names`), and is on the `/metrics` of a running proxy and worker process after
//! a few requests — the worker serves a tiny generated MoE checkpoint, so its MoE metrics are
//! there too. Counters of events a healthy short run does not have (hedges, retries, breaker
//! trips, deadline misses, admission refusals, config reloads) are exported from their first
//! event; they are listed below and checked against the constants only.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use sieve_e2e::{bin, spawn, wait_ready, Http, Proc};
use sieve_shared::metrics_names::{proxy as pm, worker as wm, worker_moe as moe};

const DASHBOARD: &str = include_str!("../configs/grafana/sieve.json");
/// The file that defines every metric name, read as text: constants cannot be listed in code.
const NAME_SOURCE: &str = include_str!("../shared/src/metrics_names.rs");
const START: Duration = Duration::from_secs(60);

/// Exported from their first event only.
const EVENT_ONLY: &[&str] = &[
    pm::HEDGES,
    pm::HEDGE_WINS,
    pm::HEDGES_DENIED,
    pm::RETRIES,
    pm::RETRIES_DENIED,
    pm::SHARD_FAILURES,
    pm::PARTIAL_RESPONSES,
    pm::MISSING_ITEMS,
    pm::ADMISSION_REJECTED,
    pm::ADMISSION_PARTIAL,
    pm::ADMISSION_DROPPED_ITEMS,
    pm::BREAKER_TRANSITIONS,
    pm::CONFIG_RELOADS,
];

/// Every `sieve_*` metric a panel query names, without the `_bucket`/`_sum`/`_count` series
/// suffixes of histograms and summaries.
fn dashboard_metrics() -> BTreeSet<String> {
    let d: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let mut out = BTreeSet::new();
    let panels = d["panels"].as_array().expect("panels");
    for p in panels {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap_or_else(|| panic!("a target without expr: {t}"));
            out.extend(metric_names(expr));
        }
    }
    out
}

/// The `sieve_[a-z_]+` words of a text, series suffixes stripped.
fn metric_names(text: &str) -> Vec<String> {
    let mut out = vec![];
    let mut rest = text;
    while let Some(at) = rest.find("sieve_") {
        let word: String =
            rest[at..].chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_').collect();
        rest = &rest[at + word.len()..];
        let base = ["_bucket", "_sum", "_count"].iter().find_map(|s| word.strip_suffix(s)).unwrap_or(&word);
        out.push(base.to_string());
    }
    out
}

/// The metric names the constants define (the quoted `"sieve_..."` strings of their file).
fn defined_metrics() -> BTreeSet<String> {
    NAME_SOURCE
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| s.starts_with("sieve_") && !s.contains(' '))
        .map(String::from)
        .collect()
}

/// The metric names on a `/metrics` page (series suffixes stripped).
fn exported(page: &str) -> BTreeSet<String> {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .flat_map(metric_names)
        .collect()
}

#[test]
fn every_dashboard_metric_is_a_defined_name() {
    let names = dashboard_metrics();
    assert!(names.len() >= 30, "the dashboard names only {} metrics", names.len());
    let defined = defined_metrics();
    // The constants the panels are about are all read from that file.
    for c in [
        pm::REQUESTS,
        pm::HEDGES,
        pm::RETRIES,
        pm::WORKER_IN_FLIGHT,
        wm::QUEUED_PAIRS,
        wm::PREFIX_HITS,
        moe::SELECTIONS,
    ] {
        assert!(defined.contains(c), "{c} not read from the name file");
        assert!(names.contains(c), "the dashboard has no panel for {c}");
    }
    let unknown: Vec<_> = names.difference(&defined).collect();
    assert!(unknown.is_empty(), "the dashboard names metrics no constant defines: {unknown:?}");
    for e in EVENT_ONLY {
        assert!(defined.contains(*e), "{e}");
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A tiny random-weight MoE checkpoint (qwen3_moe, a few MB of layers over the Qwen3 tokenizer).
fn tiny_moe_model(dir: &TempDir) -> PathBuf {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let cache = std::env::var_os("SIEVE_CACHE").map_or_else(|| repo.join(".cache"), PathBuf::from);
    let tokenizer = cache.join("tokenizers/qwen3/tokenizer.json");
    assert!(tokenizer.exists(), "{} is missing: run `scripts/fetch-assets qwen3-tokenizer`", tokenizer.display());
    let out = dir.0.join("moe");
    let status = std::process::Command::new(bin("sieve-testmodel"))
        .args(["--arch", "qwen3_moe", "--preset", "tiny", "--seed", "1", "--tokenizer"])
        .arg(&tokenizer)
        .arg("--out")
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("sieve-testmodel runs");
    assert!(status.success(), "sieve-testmodel failed: {status}");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_metric_is_exported_by_a_running_proxy_or_worker() {
    let http = Http::new();
    let dir = TempDir(std::env::temp_dir().join(format!("sieve-e2e-dashboard-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let model = tiny_moe_model(&dir);
    let model = model.to_str().unwrap();
    let worker = spawn("sieve-worker", &["--model", model, "--port", "0", "--admin-port", "0", "--no-autotune"], START);
    assert!(wait_ready(&http, &worker.admin_url(), START).await, "the worker never loaded the model");
    let proxy: Proc =
        spawn("sieve-proxy", &["--port", "0", "--admin-port", "0", "--worker", &worker.worker_arg()], START);
    assert!(wait_ready(&http, &proxy.admin_url(), START).await, "the proxy never became ready");

    let items = ["red leather shoes", "blue felt hat", "running shoes, red", "a green umbrella"];
    for q in ["red shoes", "red shoes", "a hat"] {
        let r = http.post_json(&format!("{}/v1/score", proxy.api_url()), &json!({"query": q, "items": items})).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let r =
        http.post_json(&format!("{}/v1/rerank", proxy.api_url()), &json!({"query": "hat", "documents": items})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // One refused call on the worker itself: its error counter exists from then on.
    let r = http.post_json(&format!("{}/v1/score", worker.api_url()), &json!({"query": " ", "items": items})).await;
    assert_eq!(r.status, 422, "{}", r.text());

    let mut seen = exported(&http.get(&format!("{}/metrics", proxy.admin_url())).await.text());
    seen.extend(exported(&http.get(&format!("{}/metrics", worker.admin_url())).await.text()));
    let absent: Vec<_> =
        dashboard_metrics().into_iter().filter(|n| !seen.contains(n) && !EVENT_ONLY.contains(&n.as_str())).collect();
    assert!(absent.is_empty(), "the dashboard names metrics no process exported: {absent:?}\nexported: {seen:?}");
}
