//! The comparison's tables, for the terminal and as Markdown.

use super::{Cell, CompareReport};

const HEADER: [&str; 11] = [
    "strategy",
    "p50 ms",
    "p99 ms",
    "p99.9 ms",
    "goodput/s",
    "errors",
    "missing",
    "hedged",
    "work ms/req",
    "extra work",
    "busy",
];

fn row(c: &Cell) -> [String; 11] {
    let s = &c.summary;
    let l = &s.latency_ms;
    let hedged = if c.proxy.shards > 0 { 100.0 * c.proxy.hedges as f64 / c.proxy.shards as f64 } else { 0.0 };
    [
        c.strategy.clone(),
        format!("{:.1}", l.p50),
        format!("{:.1}", l.p99),
        format!("{:.1}", l.p999),
        format!("{:.2}", s.goodput_qps),
        format!("{}", s.errors),
        format!("{}", s.missing_items),
        format!("{hedged:.1}%"),
        format!("{:.1}", c.work_ms_per_request),
        c.extra_work_vs_ours.map_or_else(String::new, |x| format!("{:+.1}%", 100.0 * x)),
        format!("{:.0}%", 100.0 * c.utilisation),
    ]
}

/// One line as soon as a run ends.
pub fn print_progress_row(c: &Cell) {
    let s = &c.summary;
    println!(
        "  [{} {}] {}: p50 {:.1} ms, p99 {:.1} ms, {} requests, {} errors, {} missing, {:.2} work ms/req{}",
        c.scenario,
        format_args!("{:.0}%", c.load_pct),
        c.strategy,
        s.latency_ms.p50,
        s.latency_ms.p99,
        s.requests,
        s.errors,
        s.missing_items,
        c.work_ms_per_request,
        c.prefix_hit_rate.map_or_else(String::new, |h| format!(", prefix hit {:.1}%", 100.0 * h)),
    );
}

pub fn print_table<'a>(title: &str, cells: impl Iterator<Item = &'a Cell>) {
    println!("\n{title}:");
    println!(
        "  {:<34} {:>8} {:>8} {:>9} {:>10} {:>7} {:>8} {:>7} {:>11} {:>10} {:>5}",
        HEADER[0],
        HEADER[1],
        HEADER[2],
        HEADER[3],
        HEADER[4],
        HEADER[5],
        HEADER[6],
        HEADER[7],
        HEADER[8],
        HEADER[9],
        HEADER[10]
    );
    for c in cells {
        let r = row(c);
        println!(
            "  {:<34} {:>8} {:>8} {:>9} {:>10} {:>7} {:>8} {:>7} {:>11} {:>10} {:>5}",
            r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10]
        );
    }
}

fn md_table<'a>(cells: impl Iterator<Item = &'a Cell>) -> String {
    let mut s = format!("| {} |\n|{}\n", HEADER.join(" | "), "---|".repeat(HEADER.len()));
    for c in cells {
        s.push_str(&format!("| {} |\n", row(c).join(" | ")));
    }
    s
}

pub fn markdown(r: &CompareReport) -> String {
    let mut s = format!(
        "{} simulated workers ({} slot each, speed {}, jitter {}), cost model request_ms {} token_ms {} token_context_ms {}.\n\
         Workload: items {}, item tokens {}, query tokens {}, reuse {}, deadline {:?} ms, seed {}.\n\
         Mean compute of one request sent whole: {:.2} ms. {}.\n\
         Fixed split: {} items per shard. Each load run {:.0} s, each fault run {:.0} s (first 10% up to 2 s not counted).\n\n\
         Columns: latency of answered requests; goodput = requests answered completely, correctly and within the deadline per second; \
         errors = requests without an answer; missing = items left unscored in partial answers; hedged = hedges per shard sent; \
         work = worker compute (slot-ms) per request, hedge losers and failed calls included; extra work = hedging's work over \
         that of the same strategy without hedging (4) in the same run conditions; busy = mean worker utilisation.\n",
        r.workers,
        r.slots,
        r.speed,
        r.jitter,
        r.cost_model.request_ms,
        r.cost_model.token_ms,
        r.cost_model.token_context_ms,
        r.workload.items,
        r.workload.item_tokens,
        r.workload.query_tokens,
        r.workload.reuse,
        r.workload.deadline_ms,
        r.seed,
        r.mean_request_ms,
        r.capacity_rule,
        r.fixed_items,
        r.duration_s,
        r.fault_duration_s
    );
    let mut loads: Vec<f64> = r.cells.iter().filter(|c| c.scenario == "load").map(|c| c.load_pct).collect();
    loads.dedup();
    for l in loads {
        let qps = r.capacity_qps * l / 100.0;
        s.push_str(&format!("\n**{l:.0}% of capacity ({qps:.1} requests/s)**\n\n"));
        s.push_str(&md_table(r.cells.iter().filter(|c| c.scenario == "load" && c.load_pct == l)));
    }
    let mut scenarios: Vec<&str> =
        r.cells.iter().filter(|c| c.scenario != "load").map(|c| c.scenario.as_str()).collect();
    scenarios.dedup();
    for sc in scenarios {
        let what = match sc {
            "slow" => "One worker 3x slower (from 1/4 of the run)",
            "kill" => "A worker killed at 1/3 of the run, restarted at 2/3",
            "burst" => "Burst to 150% of capacity for 10 s",
            "stall" => "Stalls: 3% of calls on every worker pause 25 ms to 1 s (Pareto, shape 1.2)",
            o => o,
        };
        s.push_str(&format!("\n**{what}, at {:.0}% load**\n\n", r.fault_load_pct));
        s.push_str(&md_table(r.cells.iter().filter(|c| c.scenario == sc)));
    }
    s
}
