//! Generates the Rust types and tonic client/server of the agent protocol from the .proto
//! in this crate (protoc comes from Debian's protobuf-compiler; `make deps` installs it).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/resourcewatch/v1alpha1/agent.proto";
    println!("cargo:rerun-if-changed={proto}");
    tonic_prost_build::configure().compile_protos(&[proto], &["proto"])?;
    Ok(())
}
