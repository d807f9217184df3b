//! Generates the gRPC API's messages and service (`server/src/grpc/`) from `proto/sieve.proto`
//! with protox, a protobuf compiler in Rust, so building needs no `protoc` on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "../proto/sieve.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["../proto"])?;
    tonic_prost_build::configure()
        // Clients and servers run on our own hyper connections (server/src/grpc/server.rs) or a
        // caller's channel: no generated `connect` tied to tonic's transport.
        .build_transport(false)
        .compile_fds(fds)?;
    Ok(())
}
