//! `kubectl resourcewatch` (kubectl-plugin/) against the real API server: the tables of a
//! watch's status, `explain`, and `profile` end to end. No operator runs here: the test
//! writes the status and plays the operator's part of a profile (the annotation answered
//! in status.profile, the ConfigMap), so what is tested is the plugin's own work: reading
//! what the API server holds, asking, waiting, and writing the files.

use std::{path::PathBuf, process::Command, time::Duration};

use k8s_openapi::{ByteString, api::core::v1::ConfigMap};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use resourcewatch_crds::{PROFILE_ANNOTATION, ResourceWatch};
use resourcewatch_e2e::harness::{self, TestNamespace, wait_for};

/// The plugin built beside this test (`cargo build -p kubectl-resourcewatch`).
fn plugin() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let bin = dir.join("kubectl-resourcewatch");
    assert!(
        bin.exists(),
        "{} missing: cargo build -p kubectl-resourcewatch (e2e/run-api-tests.sh does)",
        bin.display()
    );
    bin
}

/// Whether the plugin succeeded, and what it printed (stdout, then stderr).
fn outcome(out: &std::process::Output) -> (bool, String) {
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn run(ns: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(plugin())
        .args(["-n", ns])
        .args(args)
        .output()
        .expect("run the plugin");
    outcome(&out)
}

/// `kubectl resourcewatch profile POD --duration D --output-dir DIR`, started (it waits for an answer).
fn start_profile(
    ns: &str,
    pod: &str,
    duration: &str,
    dir: &std::path::Path,
) -> std::process::Child {
    Command::new(plugin())
        .args([
            "-n",
            ns,
            "profile",
            pod,
            "--duration",
            duration,
            "--timeout",
            "60s",
            "--output-dir",
        ])
        .arg(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn profile")
}

/// The profile request the plugin wrote on the watch.
async fn request_on(watches: &Api<ResourceWatch>, watch: &str) -> String {
    wait_for(
        "the profile annotation",
        Duration::from_secs(30),
        || async {
            let w = watches.get(watch).await?;
            Ok(w.metadata
                .annotations
                .unwrap_or_default()
                .get(PROFILE_ANNOTATION)
                .cloned())
        },
    )
    .await
    .expect("the plugin asks")
}

/// Waits for the started plugin to exit: (success, stdout + stderr).
async fn finish(child: std::process::Child) -> (bool, String) {
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("join")
        .expect("the plugin exits");
    outcome(&out)
}

async fn pod(client: &kube::Client, ns: &str, name: &str, app: &str) {
    let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"containers": [{"name": "app", "image": "localhost/none:0"}]}
    }))
    .expect("pod");
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &p)
        .await
        .expect("create pod");
}

#[tokio::test]
#[ignore = "needs a cluster: make e2e-api"]
async fn the_plugin_reads_statuses_and_fetches_a_profile() {
    let client = harness::client().await.expect("a cluster (KUBECONFIG)");
    harness::install_crd(&client).await.expect("CRD");
    let ns = TestNamespace::create(&client, "rw-plugin")
        .await
        .expect("namespace");
    let n = ns.name.as_str();
    pod(&client, n, "api-1", "api").await;
    pod(&client, n, "web-1", "web").await;
    let (rws, _) = harness::create_watch(
        &client,
        n,
        "api",
        serde_json::json!({"selector": {"matchLabels": {"app": "api"}}}),
    )
    .await;
    harness::create_watch(
        &client,
        n,
        "web",
        serde_json::json!({"selector": {"matchLabels": {"app": "web"}}}),
    )
    .await;
    let status = serde_json::json!({"status": {
        "matchedPods": 1, "expectedNodes": 1, "reportingNodes": 0,
        "conditions": [{"type": "Degraded", "status": "True", "reason": "AgentsMissing",
                        "message": "1 of 1 nodes not reporting", "lastTransitionTime": "2026-11-26T10:00:00Z"}],
        "topCPU": [{"pod": "api-1", "container": "app", "node": "n1", "pid": 4242,
                    "command": "java", "value": 97.5}],
        "nodes": [{"name": "n1", "reporting": false}],
        "leaks": [{"pod": "api-1", "container": "app", "node": "n1",
                   "growthBytesPerSecond": 2097152.0, "confidence": 91,
                   "timeToOOMSeconds": 125.0, "timeToOOMLowerBoundSeconds": 100.0,
                   "limitBytes": 268435456,
                   "growthSites": [{"frames": ["grow_cache", "handle"], "bytes": 4096, "percent": 97.0}]}],
        "oomKills": [{"pod": "api-1", "container": "app", "node": "n1", "time": "2026-11-26T10:05:00.000Z",
                      "pid": 4243, "command": "java", "scope": "Cgroup", "limitBytes": 268435456,
                      "memoryBytes": 268000000, "predicted": true, "warnedSecondsBefore": 121.0,
                      "etaErrorAtFirstAlertSeconds": 4.0, "lowerBoundHeld": true}]
    }});
    rws.patch_status("api", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("status");

    let (ok, out) = run(n, &["top", "api"]);
    assert!(ok, "{out}");
    for cell in ["api-1", "4242", "java", "97.5%"] {
        assert!(out.contains(cell), "top: {cell} in\n{out}");
    }
    let (ok, out) = run(n, &["leaks"]);
    assert!(ok, "{out}");
    for cell in [
        "api-1",
        "2Mi/s",
        "91",
        "2m5s",
        "1m40s",
        "256Mi",
        "grow_cache",
    ] {
        assert!(out.contains(cell), "leaks: {cell} in\n{out}");
    }
    // The growth sites as a memory profile, read by Go's own pprof.
    let dir = std::env::temp_dir().join(format!("rw-plugin-growth-{}", std::process::id()));
    let dir_arg = dir.display().to_string();
    let (ok, out) = run(n, &["leaks", "--output-dir", &dir_arg]);
    assert!(ok, "{out}");
    let file = dir.join(format!("{n}_api-1_app.growth.pb.gz"));
    assert!(out.contains(&file.display().to_string()), "{out}");
    let pprof = Command::new("/usr/local/go/bin/go")
        .args(["tool", "pprof", "-top", "-sample_index=resident_growth"])
        .arg(&file)
        .output()
        .expect("go tool pprof runs");
    let top = String::from_utf8_lossy(&pprof.stdout);
    assert!(
        pprof.status.success() && top.contains("grow_cache") && top.contains("4kB"),
        "{top}{}",
        String::from_utf8_lossy(&pprof.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
    // kubectl's conventions: the kills, as a table, headless, as JSON, by label, through
    // an explicit kubeconfig and context, and the completion script.
    let (ok, out) = run(n, &["kills"]);
    assert!(ok, "{out}");
    for cell in ["api-1", "Cgroup", "yes", "2m1s", "+4s"] {
        assert!(out.contains(cell), "kills: {cell} in\n{out}");
    }
    let (ok, out) = run(n, &["kills", "--no-headers", "-o", "wide"]);
    assert!(
        ok && !out.contains("WATCH") && out.contains("256Mi"),
        "{out}"
    );
    let (ok, out) = run(n, &["kills", "-o", "json"]);
    assert!(ok, "{out}");
    let list: serde_json::Value = serde_json::from_str(&out).expect("kills -o json is JSON");
    assert_eq!(list["items"][0]["pid"], 4243, "{out}");
    assert_eq!(list["items"][0]["resourcewatch"], "api", "{out}");
    let (ok, out) = run(n, &["top", "-l", "nobody=here"]);
    assert!(!ok && out.contains("matching nobody=here"), "{out}");
    let kubeconfig = std::env::var("KUBECONFIG").expect("KUBECONFIG");
    let contexts = Command::new(harness::kubectl())
        .args(["config", "current-context"])
        .output()
        .expect("kubectl");
    let context = String::from_utf8_lossy(&contexts.stdout).trim().to_owned();
    let (ok, out) = run(
        n,
        &[
            "top",
            "api",
            "--kubeconfig",
            &kubeconfig,
            "--context",
            &context,
        ],
    );
    assert!(ok && out.contains("4242"), "{out}");
    let (ok, out) = run(n, &["top", "--context", "no-such-context"]);
    assert!(!ok && out.contains("context"), "{out}");
    let (ok, out) = run(n, &["completion", "bash"]);
    assert!(
        ok && out.contains("kubectl-resourcewatch") && out.contains("kills"),
        "{out}"
    );
    let (ok, out) = run(n, &["explain", "api"]);
    assert!(ok, "{out}");
    assert!(out.contains("Degraded=True (AgentsMissing)"), "{out}");
    assert!(out.contains("node n1: NOT reporting"), "{out}");
    let (ok, out) = run(n, &["explain", "nope"]);
    assert!(
        !ok && out.contains("nope"),
        "a missing watch is an error: {out}"
    );

    // profile: the plugin finds the watch selecting the pod, asks, waits, writes files.
    let dir = std::env::temp_dir().join(format!("rw-plugin-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let child = start_profile(n, "api-1", "2s", &dir);
    let asked = request_on(&rws, "api").await;
    assert!(
        asked.starts_with("pod=api-1,duration=2s,request="),
        "{asked}"
    );
    // As the operator: the ConfigMap, then the status answering that value.
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "api-profile", "annotations": {"resourcewatch.io/profile-id": "p1"}},
        "data": {"profile.folded": "main;handle;grow_cache 97\nmain 3\n", "profile.svg": "<svg/>"}
    }))
    .expect("cm");
    let mut cm = cm;
    cm.binary_data = Some(
        [(
            "profile.pb.gz".to_string(),
            ByteString(vec![0x1f, 0x8b, 8, 0]),
        )]
        .into(),
    );
    Api::<ConfigMap>::namespaced(client.clone(), n)
        .create(&PostParams::default(), &cm)
        .await
        .expect("configmap");
    let answer = serde_json::json!({"status": {"profile": {
        "id": "p1", "request": asked, "pod": "api-1", "node": "n1", "state": "Succeeded",
        "message": "100 samples", "durationSeconds": 2, "frequencyHz": 99,
        "requestedAt": "2026-11-26T10:00:00Z", "configMap": "api-profile", "samples": 100,
        "hottest": [{"function": "grow_cache", "percent": 97.0}]
    }}});
    rws.patch_status("api", &PatchParams::default(), &Patch::Merge(&answer))
        .await
        .expect("answer");
    let (ok, text) = finish(child).await;
    assert!(ok, "{text}");
    assert!(text.contains("grow_cache 97.0%"), "{text}");
    assert_eq!(
        std::fs::read_to_string(dir.join("profile.folded")).expect("folded"),
        "main;handle;grow_cache 97\nmain 3\n"
    );
    assert_eq!(
        std::fs::read(dir.join("profile.pb.gz")).expect("pprof"),
        [0x1f, 0x8b, 8, 0]
    );
    assert!(dir.join("profile.svg").exists());

    // A refusal is an error with the operator's words.
    let dir2 = dir.join("refused");
    let child = start_profile(n, "web-1", "1s", &dir2);
    let webs: Api<ResourceWatch> = Api::namespaced(client.clone(), n);
    let asked = request_on(&webs, "web").await;
    let refused = serde_json::json!({"status": {"profile": {
        "id": "p2", "request": asked, "pod": "web-1", "state": "Refused",
        "message": "one profile per namespace per minute", "durationSeconds": 1, "frequencyHz": 99,
        "requestedAt": "2026-11-26T10:00:00Z", "samples": 0
    }}});
    webs.patch_status("web", &PatchParams::default(), &Patch::Merge(&refused))
        .await
        .expect("refuse");
    let (ok, text) = finish(child).await;
    assert!(!ok, "a refused profile fails: {text}");
    assert!(
        text.contains("Refused") && text.contains("per minute"),
        "{text}"
    );
    assert!(!dir2.exists(), "nothing written for a refusal");
    let _ = std::fs::remove_dir_all(&dir);
    drop(ns);
}
