//! The ports every Sieve process serves, and the runtime of its binaries: the one HTTP/1.1
//! server plumbing (`http`), so every port answers bad input the same way; the one
//! implementation of the public API (`service`, with other servers' request shapes in `compat`
//! and compressed bodies in `body_encoding`); the gRPC front end (`grpc`); tracing (`trace`);
//! logging, the runtime and signals (`cli`); and child processes (`child`). The types they speak
//! are `sieve-shared`'s.

pub mod body_encoding;
pub mod child;
pub mod cli;
pub mod compat;
pub mod grpc;
pub mod http;
pub mod service;
pub mod trace;
