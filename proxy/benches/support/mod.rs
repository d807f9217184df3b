//! What the proxy's micro-benches share (each bench includes it with `mod support;`).

use std::hint::black_box;
use std::time::Instant;

/// Mean µs per call of `f` over `n` calls after a warm-up.
pub fn time<T>(n: usize, f: impl Fn() -> T) -> f64 {
    for _ in 0..n / 10 {
        black_box(f());
    }
    let start = Instant::now();
    for _ in 0..n {
        black_box(f());
    }
    start.elapsed().as_secs_f64() * 1e6 / n as f64
}
