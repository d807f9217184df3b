//! What the split decision costs: µs per request of 1,000 items (heavy-tailed lengths), for
//! the plain cost split and the load-aware one (load price θ from the workers' queues), on 16
//! and 64 workers with half of them busy; beside it, the exhaustive search (every k packed)
//! that requests this large used before, and the two plans' predicted makespans. Then the same
//! by request size (20 to 1,000 items, load-aware): which way k is chosen (every k packed, for
//! requests small enough, or the fluid model) and what the decision costs.
//! `cargo bench -p sieve-proxy --bench split_decision`.

use std::hint::black_box;
use std::time::Instant;

use sieve_proxy::cluster::worker::WorkerView;
use sieve_proxy::split::load_price::Price;
use sieve_proxy::split::{
    exhaustive_steps, heavy_tailed_tokens, split_by_cost_priced, split_exhaustive, Candidate, Plan, EXHAUSTIVE_STEPS,
};
use sieve_proxy::split::{Request, NO_GROUPS};
use sieve_shared::CostModel;

/// Mean µs per call of `f` over `n` calls after a warm-up, and the last plan.
fn time(n: usize, f: impl Fn() -> Plan) -> (f64, Plan) {
    for _ in 0..n / 10 {
        black_box(f());
    }
    let start = Instant::now();
    let mut plan = f();
    for _ in 1..n {
        plan = black_box(f());
    }
    (start.elapsed().as_secs_f64() * 1e6 / n as f64, plan)
}

fn main() {
    let model = CostModel::default();
    let tokens = heavy_tailed_tokens(1000, 1);
    let req = Request { item_tokens: &tokens, prefix: 60.0, model: &model, groups: &NO_GROUPS };
    // W̄ for the load price: requests of this one's work sent whole.
    let mean_request_ms = model.call_ms(req.prefix, tokens.iter().copied());
    println!("split decision, 1,000 items per request (mean of 500 runs after 50 warm-up runs)");
    println!(
        "{:>8} {:>11} {:>9} {:>7} {:>11} {:>12} {:>15} {:>15}",
        "workers", "split", "θ (1/ms)", "shards", "µs/request", "exhaustive µs", "makespan ms", "exhaustive ms"
    );
    for workers in [16usize, 64] {
        let views = views(workers);
        let cands: Vec<Candidate> = views.iter().map(Candidate::from).collect();
        for load_aware in [false, true] {
            let price = |v: &[WorkerView]| if load_aware { Price::of(v, mean_request_ms) } else { Price::NONE };
            let (us, plan) = time(500, || {
                split_by_cost_priced(black_box(&req), black_box(&cands), 64, 0.02, price(black_box(&views)))
            });
            let k_max = workers.min(64);
            let (old_us, old) = time(50, || {
                split_exhaustive(black_box(&req), black_box(&cands), k_max, 0.02, price(black_box(&views)))
            });
            let name = if load_aware { "load-aware" } else { "cost" };
            println!(
                "{workers:>8} {name:>11} {:>9.4} {:>7} {us:>11.1} {old_us:>12.1} {:>15.1} {:>15.1}",
                price(&views).theta,
                plan.shards.len(),
                plan.makespan_ms,
                old.makespan_ms
            );
        }
    }
    by_size();
}

/// `workers` workers, half of them busy with two shards of ~20 ms.
fn views(workers: usize) -> Vec<WorkerView> {
    (0..workers)
        .map(|i| WorkerView {
            backlog_ms: if i % 2 == 1 { 40.0 + i as f64 } else { 0.0 },
            in_flight: if i % 2 == 1 { 2 } else { 0 },
            time_factor: 1.0 + (i % 3) as f64 * 0.1,
            max_batch_tokens: 0,
            // A few workers hold the prefix (cache-aware routing's case).
            holds_prefix: i % 5 == 2,
        })
        .collect()
}

/// The load-aware decision by request size: a small request packs every k (up to
/// `EXHAUSTIVE_STEPS` packing steps), a larger one takes the fluid model's k.
fn by_size() {
    let model = CostModel::default();
    println!("\nby request size, load-aware (mean of 500 runs after 50 warm-up runs; exhaustive up to {EXHAUSTIVE_STEPS} steps)");
    println!("{:>8} {:>7} {:>11} {:>7} {:>11}", "workers", "items", "k chosen by", "steps", "µs/request");
    for workers in [16usize, 64] {
        let views = views(workers);
        let cands: Vec<Candidate> = views.iter().map(Candidate::from).collect();
        for items in [20usize, 50, 100, 120, 200, 500, 1000] {
            let tokens = heavy_tailed_tokens(items, 1);
            let req = Request { item_tokens: &tokens, prefix: 60.0, model: &model, groups: &NO_GROUPS };
            let price = Price::of(&views, model.call_ms(req.prefix, tokens.iter().copied()));
            let (us, _) = time(500, || split_by_cost_priced(black_box(&req), black_box(&cands), 64, 0.02, price));
            let steps = exhaustive_steps(items, workers.min(64));
            let way = if steps <= EXHAUSTIVE_STEPS { "every k" } else { "fluid" };
            println!("{workers:>8} {items:>7} {way:>11} {steps:>7} {us:>11.1}");
        }
    }
}
