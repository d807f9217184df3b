//! The worker's error type. Request-facing failures are `ApiError`s (they carry their HTTP
//! status); everything else (loading, engine faults) maps to an `ApiError` at the boundary.

use sieve_kernels::KernelError;
use sieve_shared::ApiError;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// A model file is unreadable or inconsistent (bad magic, truncated, missing tensor).
    #[error("model file: {0}")]
    ModelFile(String),
    /// A well-formed model this worker cannot run (architecture, tensor type, head layout).
    #[error("unsupported model: {0}")]
    Unsupported(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("config: {0}")]
    Config(String),
    #[error("asset: {0}")]
    Asset(String),
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Api(#[from] ApiError),
}

pub type Result<T> = std::result::Result<T, WorkerError>;

impl From<WorkerError> for ApiError {
    fn from(e: WorkerError) -> Self {
        match e {
            WorkerError::Api(a) => a,
            other => ApiError::internal(other.to_string()),
        }
    }
}
