//! What the split decision costs: µs per request of 1,000 items (heavy-tailed lengths), for
//! the plain cost split and the load-aware one (price of work from the candidates' backlog),
//! on 16 and 64 workers with half of them busy. `cargo bench -p sieve-proxy --bench split_decision`.

use std::hint::black_box;
use std::time::Instant;

use sieve_proxy::split::load_price;
use sieve_proxy::split::{heavy_tailed_tokens, split_by_cost_priced, Candidate, Request};
use sieve_shared::CostModel;

fn main() {
    let model = CostModel::default();
    let tokens = heavy_tailed_tokens(1000, 1);
    let req = Request { item_tokens: &tokens, prefix: 60.0, model: &model };
    println!("split decision, 1,000 items per request (mean of the runs after one warm-up run)");
    println!("{:>8} {:>12} {:>8} {:>8} {:>12}", "workers", "split", "price", "shards", "µs/request");
    for workers in [16usize, 64] {
        let cands: Vec<Candidate> = (0..workers)
            .map(|i| Candidate {
                available_ms: if i % 2 == 1 { 20.0 + i as f64 } else { 0.0 },
                time_factor: 1.0 + (i % 3) as f64 * 0.1,
                max_batch_tokens: 0,
            })
            .collect();
        for load_aware in [false, true] {
            let run = |n: usize| {
                let start = Instant::now();
                let mut shards = 0;
                for _ in 0..n {
                    let price = if load_aware { load_price::price(black_box(&cands)) } else { 0.0 };
                    let plan = split_by_cost_priced(black_box(&req), black_box(&cands), 64, 0.02, price);
                    shards = plan.shards.len();
                }
                (start.elapsed().as_secs_f64() * 1e6 / n as f64, shards)
            };
            run(50);
            let (us, shards) = run(500);
            let price = if load_aware { load_price::price(&cands) } else { 0.0 };
            let name = if load_aware { "load-aware" } else { "cost" };
            println!("{workers:>8} {name:>12} {price:>8.2} {shards:>8} {us:>12.1}");
        }
    }
}
