//! The kernels' one error type, apart from the `Backend` trait so that the MoE types
//! (`crate::moe`), which the trait's signatures use, can return it without importing the trait.

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("shape mismatch: {0}")]
    Shape(String),
    #[error("device error: {0}")]
    Device(String),
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Raised by a test fault hook to exercise failure paths.
    #[error("injected fault: {0}")]
    Injected(String),
}

pub type Result<T> = std::result::Result<T, KernelError>;
