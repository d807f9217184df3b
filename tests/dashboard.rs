//! The Grafana dashboard (`configs/grafana/sieve.json`) names only metrics that exist, and the
//! `/metrics` pages are what Prometheus reads right:
//!
//! - every name in a panel query is one of the metric-name constants
//!   (`sieve_shared::metrics_names`), and is on the `/metrics` of a running proxy and worker
//!   process after a few requests — the worker serves a tiny generated MoE checkpoint, so its MoE
//!   metrics are there too; counters of events a short healthy run does not have (hedges,
//!   retries, breaker transitions, config reloads, ...) are there too, at zero from the start;
//! - a panel `rate()`s only counters and histograms, and reads quantiles from histogram buckets;
//! - the proxy's, the worker's and a simulated worker's pages parse with Prometheus' own Python
//!   parser (`prometheus_client`, in the venv of `scripts/fetch-assets py`), every family with a
//!   HELP line and a type, counters ending in `_total`, histograms well formed
//!   (`tests/tools/check_exposition.py`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use sieve_e2e::{bin, spawn, wait_ready, Http, Proc};
use sieve_shared::metrics_names::{proxy as pm, worker as wm, worker_moe as moe};
use tokio::io::AsyncWriteExt;

const DASHBOARD: &str = include_str!("../configs/grafana/sieve.json");
/// The file that defines every metric name, read as text: constants cannot be listed in code.
const NAME_SOURCE: &str = include_str!("../shared/src/metrics_names.rs");
const START: Duration = Duration::from_secs(60);

/// Every panel query.
fn dashboard_exprs() -> Vec<String> {
    let d: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let mut out = vec![];
    for p in d["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap_or_else(|| panic!("a target without expr: {t}"));
            out.push(expr.to_string());
        }
    }
    out
}

/// Every `sieve_*` metric a panel query names, without the `_bucket`/`_sum`/`_count` series
/// suffixes of histograms.
fn dashboard_metrics() -> BTreeSet<String> {
    dashboard_exprs().iter().flat_map(|e| metric_names(e)).collect()
}

/// The `sieve_[a-z_]+` words inside the `rate(...)` and `increase(...)` calls of a query, as
/// written (series suffixes kept).
fn rated_series(expr: &str) -> Vec<String> {
    let mut out = vec![];
    for f in ["rate(", "increase("] {
        for (at, _) in expr.match_indices(f) {
            let arg = &expr[at + f.len()..];
            let arg = &arg[..arg.find(['[', ')']).unwrap_or(arg.len())];
            out.extend(words(arg));
        }
    }
    out
}

/// The `sieve_[a-z0-9_]+` words of a text, as written.
fn words(text: &str) -> Vec<String> {
    let mut out = vec![];
    let mut rest = text;
    while let Some(at) = rest.find("sieve_") {
        let word: String =
            rest[at..].chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_').collect();
        rest = &rest[at + word.len()..];
        out.push(word);
    }
    out
}

/// The `sieve_[a-z_]+` words of a text, series suffixes stripped.
fn metric_names(text: &str) -> Vec<String> {
    words(text)
        .into_iter()
        .map(|w| ["_bucket", "_sum", "_count"].iter().find_map(|s| w.strip_suffix(s)).unwrap_or(&w).to_string())
        .collect()
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
        assert!(defined.contains(c.name), "{c} not read from the name file");
        assert!(names.contains(c.name), "the dashboard has no panel for {c}");
    }
    let unknown: Vec<_> = names.difference(&defined).collect();
    assert!(unknown.is_empty(), "the dashboard names metrics no constant defines: {unknown:?}");
    // Quantiles come from histogram buckets, summed over instances: never a summary's own.
    for e in dashboard_exprs() {
        assert!(!e.contains("quantile=\""), "a summary's quantile read: {e}");
        if e.contains("histogram_quantile(") {
            assert!(e.contains("_bucket{") && e.contains("by (") && e.contains("le)"), "{e}");
        }
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
        .stdout(Stdio::null())
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

    let sim = spawn("sieve-loadtest", &["sim-worker", "--port", "0", "--admin-port", "0"], START);
    assert!(wait_ready(&http, &sim.admin_url(), START).await, "the sim-worker never became ready");
    let r = http.post_json(&format!("{}/v1/score", sim.api_url()), &json!({"query": "q", "items": items})).await;
    assert_eq!(r.status, 200, "{}", r.text());

    let page = |p: &Proc| {
        let url = format!("{}/metrics", p.admin_url());
        let http = &http;
        async move { http.get(&url).await.text() }
    };
    let pages = BTreeMap::from([
        ("proxy", page(&proxy).await),
        ("worker", page(&worker).await),
        ("sim-worker", page(&sim).await),
    ]);
    let mut seen = exported(&pages["proxy"]);
    seen.extend(exported(&pages["worker"]));
    let absent: Vec<_> = dashboard_metrics().into_iter().filter(|n| !seen.contains(n)).collect();
    assert!(absent.is_empty(), "the dashboard names metrics no process exported: {absent:?}\nexported: {seen:?}");

    // What a panel rates is a counter or a histogram's series, by the processes' own TYPE lines.
    let types: BTreeMap<String, String> = pages
        .values()
        .flat_map(|p| p.lines().filter_map(|l| l.strip_prefix("# TYPE ")))
        .filter_map(|l| l.split_once(' ').map(|(n, t)| (n.to_string(), t.to_string())))
        .collect();
    for e in dashboard_exprs() {
        for w in rated_series(&e) {
            let base = metric_names(&w).remove(0);
            let ok = match types.get(&base).map(String::as_str) {
                Some("counter") => w == base,
                Some("histogram") => w != base,
                _ => false,
            };
            assert!(ok, "{e} rates {w}, of type {:?}", types.get(&base));
        }
    }
    // The protocol label, apart from the route; counters of events not yet seen at zero.
    let has = |page: &str, line: &str| page.lines().any(|l| l == line);
    let proxy_page = &pages["proxy"];
    for line in [
        format!("{}{{protocol=\"grpc\",route=\"score\",code=\"200\"}} 0", pm::REQUESTS),
        format!("{} 0", pm::HEDGES),
        format!("{} 0", pm::HEDGE_WINS),
        format!("{} 0", pm::RETRIES),
        format!("{}{{outcome=\"ok\"}} 0", pm::CONFIG_RELOADS),
        format!("{}{{worker=\"{}\",state=\"open\"}} 0", pm::BREAKER_TRANSITIONS, worker.api_url()),
    ] {
        assert!(has(proxy_page, &line), "no `{line}` on the proxy's page:\n{proxy_page}");
    }
    let served = format!("{}{{protocol=\"http\",route=\"score\",code=\"200\"}} 3", pm::REQUESTS);
    assert!(has(proxy_page, &served), "no `{served}`:\n{proxy_page}");
    let worker_page = &pages["worker"];
    for line in [
        format!("# TYPE {} histogram", wm::REQUEST_SECONDS),
        format!("# TYPE {} counter", wm::RUNNER_BUSY_SECONDS),
        format!("{}{{protocol=\"grpc\",route=\"score\",status=\"504\"}} 0", wm::REQUEST_ERRORS),
    ] {
        assert!(has(worker_page, &line), "no `{line}` on the worker's page:\n{worker_page}");
    }

    let report = check_exposition(&pages).await;
    for (process, r) in report.as_object().expect("a report per page") {
        let families = r["families"].as_u64().unwrap_or(0);
        assert!(families >= 5, "{process}: {families} families parsed:\n{}", pages[process.as_str()]);
        let problems = r["problems"].as_array().unwrap();
        assert!(problems.is_empty(), "{process}'s /metrics: {problems:#?}\n{}", pages[process.as_str()]);
    }
    assert_eq!(report.as_object().unwrap().len(), 3, "{report}");

    // The checker itself finds what the pages had before: no HELP, a gauge named like a
    // counter, a summary, a histogram whose +Inf bucket is not its count.
    let bad = concat!(
        "# TYPE sieve_x_seconds_total gauge\nsieve_x_seconds_total 1\n",
        "# HELP sieve_s S\n# TYPE sieve_s summary\nsieve_s{quantile=\"0.5\"} 1\nsieve_s_sum 1\nsieve_s_count 1\n",
        "# HELP sieve_h H\n# TYPE sieve_h histogram\nsieve_h_bucket{le=\"1\"} 2\nsieve_h_bucket{le=\"+Inf\"} 1\n",
        "sieve_h_sum 1\nsieve_h_count 2\n",
    );
    let report = check_exposition(&BTreeMap::from([("bad", bad.to_string())])).await;
    let problems = report["bad"]["problems"].to_string();
    for p in ["no HELP", "a gauge named like a counter", "a summary", "not cumulative", "!= _count"] {
        assert!(problems.contains(p), "the checker missed `{p}`: {problems}");
    }
}

/// The venv's Python (`scripts/fetch-assets py`), or a failure naming the command that makes it.
fn venv_python() -> PathBuf {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let cache = std::env::var_os("SIEVE_CACHE").map_or_else(|| repo.join(".cache"), PathBuf::from);
    let python = cache.join("py").join("bin").join("python");
    assert!(python.exists(), "{} is missing: the venv is made by `scripts/fetch-assets py`", python.display());
    python
}

/// Runs `tests/tools/check_exposition.py` (Prometheus' Python parser) over the pages.
async fn check_exposition(pages: &BTreeMap<&str, String>) -> Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tools/check_exposition.py");
    let mut child = tokio::process::Command::new(venv_python())
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the venv's python starts");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(serde_json::to_string(pages).unwrap().as_bytes()).await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output()).await.expect("in time").unwrap();
    assert!(out.status.success(), "check_exposition.py failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("a JSON report")
}
