//! Model files, architectures and the forward pass.
