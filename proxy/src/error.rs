//! The proxy's error type. Request-facing failures are `ApiError`s (they carry their HTTP
//! status); start-up and configuration failures are the other variants.

use sieve_shared::ApiError;

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("config: {0}")]
    Config(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Api(#[from] ApiError),
}

pub type Result<T> = std::result::Result<T, ProxyError>;
