//! Types both Sieve processes speak: the scoring API on the wire, its errors and limits,
//! configuration, and metric names; and the one HTTP/1.1 server plumbing (`http`) every Sieve
//! port runs on, so they all answer bad input the same way.

pub mod api;
pub mod api_config;
pub mod body_encoding;
pub mod child;
pub mod cli;
pub mod compat;
pub mod config_file;
pub mod cost;
pub mod error;
pub mod grpc;
pub mod http;
pub mod item_runs;
pub mod json_cursor;
pub mod limits;
pub mod metrics_names;
pub mod pair_key;
pub mod proxy_config;
pub mod score_scan;
pub mod service;
pub mod stats;
pub mod sync;
pub mod trace;
pub mod trace_record;

pub use api::*;
pub use api_config::ApiConfig;
pub use cost::{CostFeatures, CostModel};
pub use error::{ApiError, ErrorKind};
pub use limits::Limits;
pub use proxy_config::{ProxyConfig, WorkerEndpoint};
pub use stats::WorkerStats;
