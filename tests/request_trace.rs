//! The sampled request trace through a running proxy: every request traced at `sample = 1`,
//! one JSON line each with hashes and token counts, never the texts.

use std::time::{Duration, Instant};

use sieve_e2e::{catalogue, proxy, score_body, sims, test_config, Http};
use sieve_loadtest::sim::SimConfig;
use sieve_proxy::request_trace::Record;
use sieve_shared::ScoreResponse;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traced_requests_are_lines_of_hashes_and_counts() {
    let dir = std::env::temp_dir().join(format!("sieve-e2e-trace-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("trace.jsonl");
    let http = Http::new();
    let ws = sims(1, SimConfig::default()).await;
    let mut cfg = test_config(ws.iter().map(|w| w.endpoint()).collect());
    cfg.cache.enabled = true;
    cfg.request_trace.path = path.display().to_string();
    cfg.request_trace.sample = 1.0;
    let p = proxy(cfg, 1).await;

    let items: Vec<String> = catalogue(20, 5).into_iter().map(|t| format!("confidential {t}")).collect();
    let body = score_body("confidential query", &items, Some(4000));
    let url = format!("{}/v1/score", p.api_url());
    let first: ScoreResponse = http.post_json(&url, &body).await.json();
    let _again: ScoreResponse = http.post_json(&url, &body).await.json();

    let end = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.lines().count() >= 2 || Instant::now() > end {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(!text.contains("confidential"), "no text in the trace: {text}");
    let lines: Vec<Record> = text.lines().map(|l| serde_json::from_str(l).expect("a record")).collect();
    assert_eq!(lines.len(), 2);
    for r in &lines {
        assert_eq!(r.items.len(), 20);
        assert_eq!(r.status, 200);
        assert_eq!(r.deadline_ms, Some(4000));
        assert_eq!(r.item_tokens, first.usage.item_tokens, "the workers' token counts");
        assert!(r.latency_ms > 0.0 && r.t_ms > 1_600_000_000_000);
    }
    assert_eq!(lines[0].items, lines[1].items, "the same texts, the same hashes");
    assert_eq!((lines[0].cached_items, lines[1].cached_items), (0, 20));
    p.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
