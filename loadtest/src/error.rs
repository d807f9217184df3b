//! The load-test crate's error type.

#[derive(Debug, thiserror::Error)]
pub enum LoadtestError {
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("config: {0}")]
    Config(String),
}
