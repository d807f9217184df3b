//! Types both Sieve processes speak: the scoring API on the wire, its errors and limits,
//! configuration, and metric names. No I/O lives here.

pub mod api;
pub mod error;
pub mod limits;
pub mod metrics_names;
pub mod stats;

pub use api::*;
pub use error::{ApiError, ErrorKind};
pub use limits::Limits;
pub use stats::WorkerStats;
