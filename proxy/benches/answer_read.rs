//! What reading a worker's score answer costs: µs per answer of 100 and 1,000 items (scores
//! as a model gives them, `usage.item_tokens`, timing), through the proxy's scanner
//! (`request::dispatch::answer::parse`) and through serde_json's derive, on the same bytes.
//! `cargo bench -p sieve-proxy --bench answer_read`.

use std::hint::black_box;

use sieve_proxy::request::dispatch::answer;
use sieve_shared::{ScoreResponse, Timing, Usage};

mod support;
use support::time;

fn main() {
    println!("{:>6}  {:>10}  {:>12}  {:>12}", "items", "bytes", "scanner µs", "serde µs");
    for items in [100usize, 1000] {
        // Scores of a sigmoid head (0..1, nine significant digits), token counts 20-80.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let scores: Vec<Option<f32>> = (0..items).map(|_| Some((next() % 1_000_000) as f32 / 1_000_003.0)).collect();
        let item_tokens: Vec<u32> = (0..items).map(|_| 20 + (next() % 60) as u32).collect();
        let r = ScoreResponse {
            scores,
            ids: None,
            missing: Vec::new(),
            usage: Usage {
                pairs: items as u32,
                prompt_tokens: u64::from(item_tokens.iter().sum::<u32>()) + 40 * items as u64,
                computed_tokens: u64::from(item_tokens.iter().sum::<u32>()) + 40,
                prefix_tokens: 40,
                cached_prefix_tokens: 0,
                cached_items: 0,
                item_tokens,
                item_shared_tokens: 0,
                truncated_items: 0,
            },
            timing: Timing { queue_ms: 0.012, compute_ms: 0.0, total_ms: 0.431 },
            model: "sim".into(),
            template: "0123456789abcdef".into(),
        };
        let body = serde_json::to_vec(&r).expect("serialise");
        let a = answer::parse(&body).expect("scanner");
        let b: ScoreResponse = serde_json::from_slice(&body).expect("serde");
        assert_eq!(a, b, "the scanner reads what serde reads");
        let n = 200_000 / items;
        let scan = time(n, || answer::parse(black_box(&body)).expect("scanner"));
        let serde = time(n, || serde_json::from_slice::<ScoreResponse>(black_box(&body)).expect("serde"));
        println!("{items:>6}  {:>10}  {scan:>12.2}  {serde:>12.2}", body.len());
    }
}
