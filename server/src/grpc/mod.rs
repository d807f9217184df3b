//! The scoring API over gRPC (`proto/sieve.proto`, package `sieve.v1`): the same calls with the
//! HTTP API's semantics, served by the proxy, the worker and the simulated worker on their own
//! `[grpc] port`. One implementation over [`ScoreService`](crate::service::ScoreService), as
//! [`service::handle`](crate::service::handle) is for HTTP, so every process answers a gRPC call
//! as it answers the same JSON.
//!
//! - `api.rs`: the `Sieve` service (admission, limits, deadline, scoring, metrics);
//! - `convert.rs`: messages to and from the JSON API's types;
//! - `wire.rs`: the codec that hands a call its message's bytes (decoded in `api.rs`);
//! - `deadline.rs`: the `grpc-timeout` header as the request's deadline;
//! - `status.rs`: API errors as gRPC status codes with rich details;
//! - `server.rs`: tonic's server over our connection stream (the `[http]` connection cap), the
//!   calls' message budget, read timeout and one-message check;
//! - `conn.rs`: a connection's socket under the `[http]` header, idle and send timeouts.
//!
//! `[grpc]` is `sieve_shared::grpc_config`.

mod api;
mod conn;
mod convert;
mod deadline;
mod server;
mod status;
mod wire;

pub use api::GrpcApi;
pub use deadline::parse_grpc_timeout;
pub use server::serve;
pub(crate) use sieve_shared::grpc_config::GrpcConfig;
pub use status::{to_status, GRPC_ERROR_DOMAIN};

/// `Score`'s message as the gRPC port reads it (prost's decode, then `convert.rs`): public so
/// the proxy's `request_read` bench can put its cost beside the JSON read of the same request.
pub fn read_score_request(msg: &[u8]) -> Result<sieve_shared::ScoreRequest<'static>, sieve_shared::ApiError> {
    wire::decode(msg, "ScoreRequest").and_then(convert::score_request)
}

/// The messages and the service generated from `proto/sieve.proto` (by `server/build.rs`):
/// `pb::sieve_server::SieveServer` serves, `pb::sieve_client::SieveClient` calls.
#[allow(unused_qualifications, clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    tonic::include_proto!("sieve.v1");
}
