//! Generates the Rust types of the agent protocol from the .proto in this crate, and its
//! tonic client and server when the `grpc` feature is on (protoc comes from Debian's
//! protobuf-compiler; `make deps` installs it).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/resourcewatch/v1alpha1/agent.proto";
    println!("cargo:rerun-if-changed={proto}");
    let grpc = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    tonic_prost_build::configure()
        .build_client(grpc)
        .build_server(grpc)
        .compile_protos(&[proto], &["proto"])?;
    Ok(())
}
