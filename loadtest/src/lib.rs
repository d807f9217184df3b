//! Sieve load testing. `sim` is a simulated worker: it serves the worker's API and admin
//! endpoints with compute times from a cost model, so the proxy can be exercised (and compared
//! across strategies) at cluster scale on one machine. Usable in-process or as
//! `sieve-loadtest sim-worker`.

pub mod error;
pub mod sim;

pub use error::LoadtestError;
