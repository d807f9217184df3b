//! How well a model ranks a tiny hand-labelled product set (`tests/data/product_relevance.json`:
//! 16 queries, 6 items each, labels 2 / 1 / 0), against plain word overlap and a random order.
//!
//! ```text
//! cargo build -p sieve-worker && cargo run -p sieve-e2e --example relevance [-- --model DIR]
//! ```
//! Starts a `sieve-worker` process on `--model` (default: `default`, the embedded SmolLM2-135M,
//! a chat model, not a reranker), scores every query's items through `/v1/score`, and prints
//! NDCG@3 (gain 2^label - 1) and pairwise accuracy (the share of differently-labelled pairs put
//! in the right order; a tie counts half) for the model, word overlap and a random order.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::Deserialize;
use serde_json::json;
use sieve_e2e::{spawn, wait_ready, Http};
use sieve_shared::ScoreResponse;

const SET: &str = include_str!("../data/product_relevance.json");
const K: usize = 3;

#[derive(Deserialize)]
struct Set {
    queries: Vec<Query>,
}

#[derive(Deserialize)]
struct Query {
    query: String,
    items: Vec<(String, u8)>,
}

fn words(s: &str) -> BTreeSet<String> {
    s.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_lowercase).collect()
}

/// Share of the query's words the item contains.
fn overlap(query: &str, item: &str) -> f64 {
    let q = words(query);
    let i = words(item);
    q.intersection(&i).count() as f64 / q.len().max(1) as f64
}

/// NDCG@K of `order` (item indices, best first) under `labels`.
fn ndcg(order: &[usize], labels: &[u8]) -> f64 {
    let dcg = |ls: &mut dyn Iterator<Item = u8>| -> f64 {
        ls.take(K).enumerate().map(|(r, l)| (2f64.powi(i32::from(l)) - 1.0) / (r as f64 + 2.0).log2()).sum()
    };
    let mut ideal = labels.to_vec();
    ideal.sort_unstable_by(|a, b| b.cmp(a));
    dcg(&mut order.iter().map(|&i| labels[i])) / dcg(&mut ideal.into_iter())
}

/// The items best first by `scores` (ties: input order).
fn ranked(scores: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    order
}

/// (right, pairs): differently-labelled pairs in the right order, a tie counting half.
fn pairwise(scores: &[f64], labels: &[u8]) -> (f64, usize) {
    let (mut right, mut pairs) = (0.0, 0);
    for i in 0..labels.len() {
        for j in 0..labels.len() {
            if labels[i] > labels[j] {
                pairs += 1;
                right += match scores[i].total_cmp(&scores[j]) {
                    std::cmp::Ordering::Greater => 1.0,
                    std::cmp::Ordering::Equal => 0.5,
                    std::cmp::Ordering::Less => 0.0,
                };
            }
        }
    }
    (right, pairs)
}

/// Expected NDCG@K of a random order (the mean over seeded shuffles).
fn random_ndcg(labels: &[u8]) -> f64 {
    const ROUNDS: usize = 2000;
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut sum = 0.0;
    for _ in 0..ROUNDS {
        let mut order: Vec<usize> = (0..labels.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, (next() % (i as u64 + 1)) as usize);
        }
        sum += ndcg(&order, labels);
    }
    sum / ROUNDS as f64
}

#[derive(Default)]
struct Tally {
    ndcg: f64,
    right: f64,
    pairs: usize,
}

impl Tally {
    fn add(&mut self, scores: &[f64], labels: &[u8]) {
        self.ndcg += ndcg(&ranked(scores), labels);
        let (r, p) = pairwise(scores, labels);
        self.right += r;
        self.pairs += p;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let model =
        args.iter().position(|a| a == "--model").and_then(|i| args.get(i + 1)).map_or("default", String::as_str);
    let set: Set = serde_json::from_str(SET).expect("the labelled set is valid JSON");

    let http = Http::new();
    let start = Duration::from_secs(600);
    let worker = spawn("sieve-worker", &["--model", model, "--port", "0", "--admin-port", "0", "--no-autotune"], start);
    assert!(wait_ready(&http, &worker.admin_url(), start).await, "the worker never loaded {model}");

    let (mut by_model, mut by_overlap) = (Tally::default(), Tally::default());
    let mut random = 0.0;
    let mut model_name = String::new();
    for q in &set.queries {
        let texts: Vec<&str> = q.items.iter().map(|(t, _)| t.as_str()).collect();
        let labels: Vec<u8> = q.items.iter().map(|(_, l)| *l).collect();
        let r =
            http.post_json(&format!("{}/v1/score", worker.api_url()), &json!({"query": q.query, "items": texts})).await;
        assert_eq!(r.status, 200, "{}: {}", q.query, r.text());
        let resp: ScoreResponse = r.json();
        model_name = resp.model.clone();
        let scores: Vec<f64> = resp.scores.iter().map(|s| f64::from(s.expect("a complete answer"))).collect();
        by_model.add(&scores, &labels);
        by_overlap.add(&texts.iter().map(|t| overlap(&q.query, t)).collect::<Vec<_>>(), &labels);
        random += random_ndcg(&labels);
    }
    let n = set.queries.len() as f64;
    let items: usize = set.queries.iter().map(|q| q.items.len()).sum();
    println!("{} queries, {items} labelled items (tests/data/product_relevance.json)", set.queries.len());
    println!("{:<40} {:>8} {:>19}", "ranker", format!("NDCG@{K}"), "pairwise accuracy");
    for (name, t) in [(format!("model {model_name}"), &by_model), ("word overlap".to_string(), &by_overlap)] {
        println!("{name:<40} {:>8.3} {:>19.3}", t.ndcg / n, t.right / t.pairs as f64);
    }
    println!("{:<40} {:>8.3} {:>19.3}", "random order (expected)", random / n, 0.5);
}
