//! What reading a score request costs the proxy before it plans: µs per request of 100 and 1,000
//! product-text items (~270 bytes each), for the parse in place (the request's scanner,
//! `ScoreRequest::parse`, against serde_json's derive as `ApiError::parse_json` runs it, on
//! the same bytes), the limits check, and the token features of every item (what the plan
//! computes per request). `cargo bench -p sieve-proxy --bench request_read`.
//!
//! Then the same request as a gRPC `Score` message: decoded by prost and converted, as the gRPC
//! port reads it (`sieve_server::grpc::read_score_request`, against the JSON scanner above), and each protocol's shard bodies built from what
//! was read (`ShardWire`: the JSON body's texts spliced, the message's texts encoded) and cut
//! into four shards of consecutive items, as the proxy sends them. What the proxy adds to a gRPC
//! call beyond an HTTP one is the second less the first: the read is paid by a worker answering
//! the same call directly too (the gRPC bench's "added" takes it out).

use std::hint::black_box;

use bytes::Bytes;
use prost::Message as _;
use sieve_proxy::estimate::token_estimator::features;
use sieve_proxy::request::dispatch::shard_body::ShardWire;
use sieve_server::grpc::{pb, read_score_request};
use sieve_shared::{ApiError, Limits, ScoreRequest};

mod support;
use support::time;

/// Product texts like the proxy-overhead bench's: mostly 8-40 words, one in eight 60-200.
fn catalogue(n: usize) -> Vec<String> {
    const WORDS: &[&str] = &[
        "trail",
        "running",
        "shoe",
        "waterproof",
        "men's",
        "women's",
        "lightweight",
        "cushioned",
        "grip",
        "mesh",
        "upper",
        "size",
        "black",
        "red",
        "breathable",
        "rubber",
        "outsole",
        "carbon",
        "plate",
        "racing",
    ];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..n)
        .map(|i| {
            let r = next();
            let words = if r % 8 == 0 { 60 + (r >> 8) % 140 } else { 8 + (r >> 8) % 32 };
            let mut t = format!("Item {i}:");
            for _ in 0..words {
                t.push(' ');
                t.push_str(WORDS[(next() % WORDS.len() as u64) as usize]);
            }
            t.push_str(&format!(", model {}", next() % 10_000));
            t
        })
        .collect()
}

fn main() {
    println!(
        "{:>6}  {:>8}  {:>11}  {:>9}  {:>9}  {:>11}  {:>9}",
        "items", "bytes", "scanner µs", "serde µs", "limits µs", "features µs", "feat GB/s"
    );
    for items in [100usize, 1000] {
        let texts = catalogue(items);
        let body = serde_json::to_vec(&serde_json::json!({
            "query": "waterproof trail running shoes for men",
            "items": texts,
            "deadline_ms": 10_000,
        }))
        .expect("serialise");
        let scanned = ScoreRequest::parse(&body).expect("scanner");
        let serde: ScoreRequest = ApiError::parse_json(&body).expect("serde");
        assert_eq!(scanned, serde, "the scanner reads what serde reads");
        assert!(sieve_shared::score_scan::scan(&body).is_some(), "the scanner reads it itself");
        let n = 200_000 / items;
        let scan = time(n, || ScoreRequest::parse(black_box(&body)).expect("scanner"));
        let serde = time(n, || ApiError::parse_json::<ScoreRequest>(black_box(&body)).expect("serde"));
        let limits = Limits::default();
        let check = time(n, || limits.check_as(black_box(&scanned), "items").expect("valid"));
        let feats = time(n, || scanned.items.iter().map(|i| features(black_box(i.text()))[5]).sum::<f64>());
        let text_bytes: usize = texts.iter().map(String::len).sum();
        let gbs = text_bytes as f64 / feats / 1e3;
        println!("{items:>6}  {:>8}  {scan:>11.2}  {serde:>9.2}  {check:>9.2}  {feats:>11.2}  {gbs:>9.2}", body.len());
    }
    println!(
        "\n{:>6}  {:>8}  {:>11}  {:>9}  {:>14}  {:>14}",
        "items", "bytes", "scanner µs", "proto µs", "JSON shards µs", "gRPC shards µs"
    );
    for items in [100usize, 1000] {
        let texts = catalogue(items);
        let query = "waterproof trail running shoes for men";
        let body = Bytes::from(
            serde_json::to_vec(&serde_json::json!({"query": query, "items": texts, "deadline_ms": 10_000}))
                .expect("serialise"),
        );
        let msg = pb::ScoreRequest {
            query: query.into(),
            items: texts.iter().map(|t| pb::Item { text: t.clone(), id: None }).collect(),
            deadline_ms: Some(10_000),
            ..Default::default()
        }
        .encode_to_vec();
        let json_req = ScoreRequest::parse(&body).expect("scanner");
        let grpc_req = read_score_request(&msg).expect("proto");
        assert_eq!(json_req, grpc_req, "both protocols carry the same request");
        // Four shards of consecutive items, as a 100-item call over four workers is cut.
        let cuts: Vec<Vec<usize>> = (0..4).map(|k| (k * items / 4..(k + 1) * items / 4).collect()).collect();
        let shards = |wire: &ShardWire| cuts.iter().map(|c| wire.shard(c, 500).len()).sum::<usize>();
        for (name, req, from) in [("JSON", &json_req, body.clone()), ("gRPC", &grpc_req, Bytes::new())] {
            let got: Vec<u8> =
                cuts.iter().flat_map(|c| ShardWire::new(from.clone(), req).shard(c, 500).concat()).collect();
            let want: Vec<u8> =
                cuts.iter().flat_map(|c| ShardWire::new(body.clone(), &json_req).shard(c, 500).concat()).collect();
            assert_eq!(got, want, "{name}: the same shard bodies from either protocol");
        }
        let n = 200_000 / items;
        let scan = time(n, || ScoreRequest::parse(black_box(&body)).expect("scanner"));
        let proto = time(n, || read_score_request(black_box(&msg)).expect("proto"));
        let json_wire = time(n, || shards(&ShardWire::new(body.clone(), black_box(&json_req))));
        let grpc_wire = time(n, || shards(&ShardWire::new(Bytes::new(), black_box(&grpc_req))));
        println!("{items:>6}  {:>8}  {scan:>11.2}  {proto:>9.2}  {json_wire:>14.2}  {grpc_wire:>14.2}", msg.len());
    }
}
