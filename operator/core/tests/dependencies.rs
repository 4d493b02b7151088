//! The core decides and does not run: its dependency tree (what `cargo tree` resolves for
//! it alone, normal dependencies) holds no async runtime, gRPC, HTTP or Kubernetes client.
//! It reads the protocol's messages (`resourcewatch-proto` without its `grpc` feature) and
//! the CRDs' types (`kube` with `derive` only).

use std::process::Command;

const FORBIDDEN: &[&str] = &["tokio", "tonic", "hyper", "kube-client", "tower", "axum"];

#[test]
fn the_core_depends_on_no_runtime_transport_or_client() {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--frozen", "-e", "normal", "--prefix", "none"])
        .args(["--format", "{p}", "--manifest-path", manifest])
        .args(["-p", "resourcewatch-operator-core"])
        .output()
        .expect("cargo tree runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let crates: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(
        crates.contains(&"resourcewatch-proto") && crates.contains(&"prost"),
        "the tree was read: {text}"
    );
    let found: Vec<&&str> = crates.iter().filter(|c| FORBIDDEN.contains(c)).collect();
    assert!(found.is_empty(), "the core depends on {found:?}:\n{text}");
}
