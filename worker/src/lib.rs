//! The Sieve worker: prompt building, tokenization, scheduling, the KV block manager and the
//! model graphs, served over HTTP.

pub mod assets;
#[cfg(feature = "test-support")]
pub mod bench_support;
pub mod config;
pub mod device;
pub mod engine;
pub mod error;
#[cfg(feature = "test-support")]
pub mod fuzzing;
pub mod metrics;
pub mod model;
pub mod moe;
pub mod prompt;
pub mod server;
pub mod tokenize_pool;

pub use error::{Result, WorkerError};
pub use model::tokenizer::Tokenizer;
pub use server::start::{start, RunningWorker, StartError};
