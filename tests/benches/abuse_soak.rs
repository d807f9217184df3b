//! The long abuse soak: `cargo bench -p sieve-e2e --bench abuse_soak` (build the binaries first:
//! `cargo build --release -p sieve-proxy -p sieve-worker`). A real proxy and two real CPU
//! workers on loopback under trickled, stalled, half-sent, silent, idle and never-read
//! connections, an overload burst and a worker killed and replaced, while a steady client sends
//! real requests; prints the steady client's answered fraction and latency, status counts, each
//! process's RSS, how the attack connections ended against the configured timeouts, and which of
//! issue 13's targets were missed. `SIEVE_SOAK_SECS` sets the steady client's duration (default
//! 90 s; the other phases scale with it).

use std::time::Duration;

use sieve_e2e::soak::{self, SoakConfig};

fn main() {
    let mut cfg = SoakConfig::long();
    if let Some(secs) = std::env::var("SIEVE_SOAK_SECS").ok().and_then(|v| v.parse::<f64>().ok()).filter(|s| *s >= 10.0)
    {
        let k = secs / cfg.duration.as_secs_f64();
        for d in [&mut cfg.duration, &mut cfg.attack_window, &mut cfg.burst_start, &mut cfg.burst_len, &mut cfg.kill_at]
        {
            *d = Duration::from_secs_f64(d.as_secs_f64() * k);
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    // `run` starts and kills the processes on this (the main) thread, which lives to the end.
    let report = rt.block_on(soak::run(cfg));
    print!("{}", report.render());
}
