//! Which cluster the e2e tests may touch (`e2e/target-cluster.sh`, `harness::client`):
//! an exported KUBECONFIG is ignored, another cluster is an explicit opt-in, and a context
//! named like production is refused. Runs without a cluster.

use std::process::Command;

use resourcewatch_e2e::harness::{context_names, looks_like_production};

const NAMES: &[(&str, bool)] = &[
    ("prod", true),
    ("eu-prod-1 eu-prod-1 admin https://10.0.0.1:6443", true),
    ("gke_acme_prd_cluster", true),
    (
        "kind-dev kind-dev kind-dev https://api.live.example.com",
        true,
    ),
    ("PRODUCTION", true),
    ("arn:aws:eks:us-east-1:1:cluster/Production", true),
    (
        "kind-kind kind-kind kind-kind https://127.0.0.1:39999",
        false,
    ),
    ("default kubernetes admin https://10.0.0.1:6443", false),
    ("product-team-dev", false),
    ("liveness-lab", false),
    ("staging reproducer prdx", false),
    ("", false),
];

fn shell(script: &str, env: &[(&str, &str)]) -> (bool, String, String) {
    let root = resourcewatch_e2e::harness::repo_root();
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(format!("source e2e/target-cluster.sh\n{script}"))
        .current_dir(root)
        .env_remove("KUBECONFIG")
        .env_remove("RW_E2E_KUBECONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("bash");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn shell_and_rust_agree_on_production_names() {
    for (names, prod) in NAMES {
        assert_eq!(looks_like_production(names), *prod, "rust: {names:?}");
        let (ok, _, _) = shell(&format!("rw_looks_like_production '{names}'"), &[]);
        assert_eq!(ok, *prod, "shell: {names:?}");
    }
}

#[test]
fn an_exported_kubeconfig_is_ignored() {
    let (ok, out, err) = shell(
        "rw_target_cluster && echo \"external=$RW_E2E_EXTERNAL kubeconfig=${KUBECONFIG-unset}\"",
        &[("KUBECONFIG", "/home/someone/.kube/config")],
    );
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "external=0 kubeconfig=unset");
    assert!(
        err.contains("ignoring KUBECONFIG=/home/someone/.kube/config"),
        "{err}"
    );
}

#[test]
fn an_unreadable_opt_in_fails() {
    let (ok, _, err) = shell(
        "rw_target_cluster",
        &[("RW_E2E_KUBECONFIG", "/nonexistent/kubeconfig")],
    );
    assert!(!ok);
    assert!(err.contains("not a readable file"), "{err}");
}

#[test]
fn context_names_come_from_the_current_context() {
    let config: kube::config::Kubeconfig = serde_saphyr::from_str(
        r#"
apiVersion: v1
kind: Config
current-context: ops
contexts:
- name: dev
  context: {cluster: dev-cluster, user: dev}
- name: ops
  context: {cluster: eu-prd-3, user: sre}
clusters:
- name: dev-cluster
  cluster: {server: "https://127.0.0.1:6443"}
- name: eu-prd-3
  cluster: {server: "https://10.1.2.3:443"}
users: []
"#,
    )
    .expect("kubeconfig");
    let names = context_names(&config);
    assert_eq!(names, "ops eu-prd-3 sre https://10.1.2.3:443");
    assert!(looks_like_production(&names));
}
