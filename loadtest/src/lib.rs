//! Sieve load testing: production-like load against any deployment, simulated workers, and
//! the strategy comparison.
//!
//! - [`workload`] and [`dist`]: what requests look like, generated deterministically.
//! - [`arrivals`]: open-loop Poisson arrival times (with bursts).
//! - [`run`]: driving load at a target; [`summary`]: HDR percentiles, goodput, timeline;
//!   [`monitor`]: per-worker utilisation; [`report`]: the JSON report; [`plot`]: SVG and PNG.
//! - [`sim`]: a simulated worker (the worker's API with compute times from a cost model),
//!   in-process or as `sieve-loadtest sim-worker`.
//! - [`calibrate`]: fits a cost model to a real worker, for sim-workers to load.
//! - [`compare`]: sim cluster + one proxy per strategy, the same seeded load for each.
//! - [`plan`]: the trace-replay capacity planner (pair-cache and prefix-cache hit rates, the
//!   workers for a p99 target) and the texts `run` replays a trace with.

pub mod arrivals;
pub mod calibrate;
pub mod client;
pub mod compare;
pub mod dist;
pub mod error;
pub mod monitor;
pub mod plan;
pub mod plot;
pub mod process;
pub mod report;
pub mod run;
pub mod sim;
pub mod summary;
pub mod text_bitmap;
pub mod trace;
pub mod workload;

pub use error::LoadtestError;
