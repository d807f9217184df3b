//! Model files, architectures and the forward pass.

pub mod ggml_quants;
pub mod gguf;
pub mod safetensors;
pub mod source;
pub mod testgen;
#[cfg(test)]
pub(crate) mod test_assets;

pub use gguf::GgufFile;
pub use safetensors::HfCheckpoint;
pub use source::{HostWeight, WeightSource};
