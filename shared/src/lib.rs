//! Types both Sieve processes speak: the scoring API on the wire, its errors and limits,
//! configuration, and metric names. No I/O lives here.

pub mod api;
pub mod cost;
pub mod error;
pub mod limits;
pub mod metrics_names;
pub mod proxy_config;
pub mod stats;

pub use api::*;
pub use cost::{CostFeatures, CostModel};
pub use error::{ApiError, ErrorKind};
pub use limits::Limits;
pub use proxy_config::{ProxyConfig, WorkerEndpoint};
pub use stats::WorkerStats;
