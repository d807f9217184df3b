//! Types every Sieve process speaks: the scoring API on the wire, its errors and limits, the
//! cost model, configuration (the proxy's, and the `[http]`, `[admin]`, `[grpc]`, `[tracing]`
//! and `[log]` sections every server reads), and metric names. No server here: the ports that
//! speak these types are `sieve-server`'s.

pub mod api;
pub mod api_config;
pub mod config_file;
pub mod cost;
pub mod error;
pub mod grpc_config;
pub mod http_config;
pub mod item_runs;
pub mod json_cursor;
pub mod limits;
pub mod metrics_names;
pub mod pair_key;
pub mod proxy_config;
pub mod score_scan;
pub mod stats;
pub mod sync;
pub mod trace_config;
pub mod trace_record;

pub use api::*;
pub use api_config::ApiConfig;
pub use cost::{CostFeatures, CostModel};
pub use error::{ApiError, ErrorKind};
pub use limits::Limits;
pub use proxy_config::{ProxyConfig, WorkerEndpoint};
pub use stats::WorkerStats;
