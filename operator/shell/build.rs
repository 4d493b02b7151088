//! Generates the OTLP profiles client (`proto/`, vendored from the OpenTelemetry protocol;
//! protoc comes from Debian's protobuf-compiler, which `make deps` installs).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let service =
        "proto/opentelemetry/proto/collector/profiles/v1development/profiles_service.proto";
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure()
        // The server only for the exporter's tests (a collector that fails, then answers).
        .build_server(true)
        .build_client(true)
        .compile_protos(&[service], &["proto"])?;
    Ok(())
}
