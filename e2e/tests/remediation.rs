//! Pre-OOM remediation on the real cluster: a leaking Deployment is OOM-killed without a
//! watch (the control) and evicted before any OOM kill with `action: Restart`; stable
//! pods near their limit are never restarted; a PodDisruptionBudget blocks the eviction;
//! `dryRun` only reports; a Pending record written into status by anyone but the
//! operator's ledger evicts nothing. Every namespace here is set up as a user would: the
//! cluster admin's opt-in label, a RemediationPolicy, and the evictor role bound to the
//! installed operator (which has no eviction right anywhere else).
//! Run by `make e2e` after the cluster tests; the runner turns the operator's master
//! switch on for these.

use std::time::{Duration, Instant};

use k8s_openapi::api::{apps::v1::Deployment, core::v1::Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use resourcewatch_crds::{RemediationOutcome, ResourceWatch};
use resourcewatch_e2e::harness::{self, TestNamespace, oom_killed, restarts, wait_for};

fn container(args: &[&str], limit: &str) -> serde_json::Value {
    serde_json::json!({
        "name": "main", "image": harness::WORKLOADS_IMAGE, "imagePullPolicy": "Never",
        "command": ["/leak-sim"], "args": args,
        "resources": {"limits": {"memory": limit}, "requests": {"memory": "8Mi", "cpu": "10m"}}
    })
}

async fn deployment(client: &Client, ns: &str, name: &str, args: &[&str], limit: &str) {
    create_deployment(client, ns, name, container(args, limit)).await
}

async fn create_deployment(client: &Client, ns: &str, name: &str, container: serde_json::Value) {
    create_deployment_on(client, ns, name, container, harness::Placement::Host).await
}

async fn create_deployment_on(
    client: &Client,
    ns: &str,
    name: &str,
    container: serde_json::Value,
    node: harness::Placement,
) {
    let mut d = serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, "watched": "yes"}},
                "spec": {"terminationGracePeriodSeconds": 2, "automountServiceAccountToken": false, "containers": [container]}
            }
        }
    });
    for (k, v) in node.pod_spec_fields().as_object().into_iter().flatten() {
        d["spec"]["template"]["spec"][k] = v.clone();
    }
    let d: Deployment = serde_json::from_value(d).expect("deployment json");
    Api::<Deployment>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &d)
        .await
        .expect("create deployment");
}

async fn watch(
    client: &Client,
    ns: &str,
    selector: serde_json::Value,
    remediation: serde_json::Value,
) {
    harness::create_watch(
        client,
        ns,
        "w",
        serde_json::json!({"selector": selector, "interval": "5s", "remediation": remediation}),
    )
    .await;
}

/// A client and a fresh namespace opted in to remediation.
async fn opted_in(prefix: &str) -> (Client, TestNamespace) {
    let (client, ns) = harness::test_namespace(prefix).await;
    ns.opt_in().await.expect("opt in");
    (client, ns)
}

async fn pods_of(client: &Client, ns: &str, app: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

fn is_running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// The first Running pod of `app`, waited for up to a minute.
async fn running_pod(client: &Client, ns: &str, app: &str) -> Pod {
    wait_for(
        &format!("a Running {app} pod"),
        Duration::from_secs(60),
        || {
            let client = client.clone();
            async move { Ok(pods_of(&client, ns, app).await.into_iter().find(is_running)) }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}"))
}

/// 20 MiB, flat 20 s (the detector sees a baseline), then `rate` against 128Mi.
#[tokio::test]
#[ignore = "needs the e2e cluster with remediation on: make e2e"]
async fn a_leaking_deployment_is_restarted_before_its_oom_kill_and_the_control_is_killed() {
    restarted_before_its_oom_kill("rw-e2e-restart", harness::Placement::Host).await;
}

/// The same on the VM node (Linux 6.1, cgroup v2, emulated): its agent's prediction
/// against memory.max, the operator's eviction there, the v2 memory controller's kill of
/// the control.
#[tokio::test]
#[ignore = "needs the e2e cluster with its VM node and remediation on: make e2e"]
async fn on_the_cgroup_v2_node_a_leaking_deployment_is_restarted_before_its_oom_kill() {
    restarted_before_its_oom_kill("rw-e2e-restart-v2", harness::Placement::Vm).await;
}

async fn restarted_before_its_oom_kill(prefix: &str, node: harness::Placement) {
    let (client, ns) = opted_in(prefix).await;
    let n = ns.name.as_str();
    // Only `fixed` is watched; `control` leaks the same way with nobody watching.
    watch(
        &client,
        n,
        serde_json::json!({"matchLabels": {"app": "fixed"}}),
        serde_json::json!({"action": "Restart", "minTimeToOOM": "40s", "cooldown": "10m"}),
    )
    .await;
    let leak = harness::leak_args("2MiB/s", "20");
    for name in ["control", "fixed"] {
        create_deployment_on(&client, n, name, container(&leak, "128Mi"), node).await;
    }
    let start = Instant::now();
    let first = running_pod(&client, n, "fixed").await;
    let first_uid = first.uid().unwrap_or_default();

    // The control is OOM-killed. Meanwhile the watched pod must never be: the kernel kills
    // a container in place (same pod UID, restartCount + 1), so it is checked while it
    // exists, not only through its replacement.
    let killed_in_place = |pods: &[Pod]| {
        pods.iter().any(|p| {
            p.uid().as_deref() == Some(first_uid.as_str()) && (oom_killed(p) || restarts(p) > 0)
        })
    };
    let control_oom = wait_for("the control's OOM kill", Duration::from_secs(150), || {
        let client = client.clone();
        async move {
            let fixed = pods_of(&client, n, "fixed").await;
            assert!(
                !killed_in_place(&fixed),
                "the watched pod was OOM-killed before its eviction: {fixed:?}"
            );
            Ok(pods_of(&client, n, "control")
                .await
                .iter()
                .any(oom_killed)
                .then(|| start.elapsed()))
        }
    })
    .await
    .expect("control OOM-killed");
    // The watched pod was evicted before any OOM kill, and replaced.
    let rws: Api<ResourceWatch> = Api::namespaced(client.clone(), n);
    let rec = wait_for("a Restarted record", Duration::from_secs(60), || {
        let rws = rws.clone();
        let client = client.clone();
        async move {
            let fixed = pods_of(&client, n, "fixed").await;
            assert!(
                !killed_in_place(&fixed),
                "the watched pod was OOM-killed before its eviction: {fixed:?}"
            );
            let s = rws.get("w").await?.status.unwrap_or_default();
            Ok(s.remediations
                .into_iter()
                .find(|r| r.action == RemediationOutcome::Restarted))
        }
    })
    .await
    .expect("restarted");
    assert_eq!(rec.pod_uid, first_uid);
    assert_eq!(rec.workload.as_deref(), Some("Deployment/fixed"));
    let on_vm = first.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(harness::VM_NODE);
    assert_eq!(on_vm, node == harness::Placement::Vm, "placed on {node:?}");
    let replacement = wait_for(
        "the replacement pod Running",
        Duration::from_secs(60),
        || {
            let client = client.clone();
            let first_uid = first_uid.clone();
            async move {
                Ok(pods_of(&client, n, "fixed")
                    .await
                    .into_iter()
                    .find(|p| p.uid().as_deref() != Some(first_uid.as_str()) && is_running(p)))
            }
        },
    )
    .await
    .expect("replacement");
    assert!(!oom_killed(&replacement));
    harness::event_where(&client, n, "Restarted", 30, |_| true).await;
    // The first pod's restart was never blocked. The replacement leaks the same way, so a
    // RestartBlocked for *it* (cooldown 10m) is the rail working and may already exist;
    // the note names the pod.
    let first_name = first.name_any();
    let blocked: Vec<_> = harness::events(&client, n, "RestartBlocked")
        .await
        .into_iter()
        .filter(|e| {
            e.note
                .as_deref()
                .is_some_and(|m| m.starts_with(&first_name))
        })
        .collect();
    assert!(blocked.is_empty(), "{first_name} was blocked: {blocked:?}");
    // The evicted pod never reported an OOM kill: its record was written before the kernel
    // acted (the control, leaking identically, was killed at `control_oom`).
    eprintln!(
        "control OOM-killed {:.0}s after start; fixed evicted with {}s predicted to OOM (confidence {})",
        control_oom.as_secs_f64(),
        rec.time_to_oom_seconds.unwrap_or(0.0),
        rec.confidence
    );
    ns.delete().await;
}

#[tokio::test]
#[ignore = "needs the e2e cluster with remediation on: make e2e"]
async fn stable_pods_near_their_limit_are_never_restarted() {
    let (client, ns) = opted_in("rw-e2e-stable").await;
    let n = ns.name.as_str();
    watch(
        &client,
        n,
        serde_json::json!({"matchLabels": {"watched": "yes"}}),
        serde_json::json!({"action": "Restart", "minTimeToOOM": "5m"}),
    )
    .await;
    deployment(&client, n, "flat", harness::FLAT_ARGS, "128Mi").await;
    deployment(&client, n, "gc", harness::SAWTOOTH_ARGS, "128Mi").await;
    let rws: Api<ResourceWatch> = Api::namespaced(client.clone(), n);
    wait_for("both pods in status", Duration::from_secs(60), || {
        let rws = rws.clone();
        async move {
            let s = rws.get("w").await?.status.unwrap_or_default();
            Ok((s.top_memory.len() >= 2).then_some(()))
        }
    })
    .await
    .expect("reported");
    // Ninety seconds: ten sawtooth periods and more than the detector needs for a leak.
    tokio::time::sleep(Duration::from_secs(90)).await;
    let s = rws.get("w").await.expect("rw").status.unwrap_or_default();
    assert!(
        s.remediations.is_empty(),
        "stable pods were acted on: {:?}",
        s.remediations
    );
    assert!(
        s.leaks.is_empty(),
        "stable pods listed as leaking: {:?}",
        s.leaks
    );
    for app in ["flat", "gc"] {
        let pods = pods_of(&client, n, app).await;
        assert_eq!(pods.len(), 1, "{app} was replaced");
        assert!(
            !oom_killed(&pods[0]) && restarts(&pods[0]) == 0,
            "{app} was killed"
        );
    }
    ns.delete().await;
}

/// A real runtime warming up: Node.js filling a cache fast, then slower and slower (95 %
/// of 120 MB at 100 s, the corpus's `node-warmup-100s`), under request garbage, with a
/// Restart watch (minTimeToOOM 5m) in an opted-in namespace. Its first seconds look like
/// a leak and may be reported; it must never be evicted, and never be OOM-killed.
#[tokio::test]
#[ignore = "needs the e2e cluster with remediation on: make e2e"]
async fn a_node_js_warm_up_is_never_restarted() {
    let (client, ns) = opted_in("rw-e2e-warmup").await;
    let n = ns.name.as_str();
    watch(
        &client,
        n,
        serde_json::json!({"matchLabels": {"app": "warmup"}}),
        serde_json::json!({"action": "Restart", "minTimeToOOM": "5m"}),
    )
    .await;
    create_deployment(
        &client,
        n,
        "warmup",
        serde_json::json!({
            "name": "main", "image": harness::NODE_WORKLOADS_IMAGE, "imagePullPolicy": "Never",
            "command": ["/usr/bin/node", "/mem.js", "warmup", "target=120m", "secs=100"],
            "resources": {"limits": {"memory": "320Mi"}, "requests": {"memory": "8Mi", "cpu": "10m"}}
        }),
    )
    .await;
    let first = running_pod(&client, n, "warmup").await;
    // The warm-up (100 s), then a minute of steady state; the status is sampled meanwhile.
    let rws: Api<ResourceWatch> = Api::namespaced(client.clone(), n);
    let start = Instant::now();
    let (mut listed, mut max_confidence, mut reported) = (0, 0u8, false);
    while start.elapsed() < Duration::from_secs(170) {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let s = rws.get("w").await.expect("rw").status.unwrap_or_default();
        reported |= !s.top_memory.is_empty();
        if let Some(l) = s.leaks.iter().find(|l| l.pod == first.name_any()) {
            listed += 1;
            max_confidence = max_confidence.max(l.confidence);
        }
        assert!(
            s.remediations.is_empty(),
            "the warm-up was acted on at {:.0} s: {:?}",
            start.elapsed().as_secs_f64(),
            s.remediations
        );
    }
    assert!(reported, "the agent never reported the warm-up pod");
    let s = rws.get("w").await.expect("rw").status.unwrap_or_default();
    assert!(
        s.leaks.is_empty(),
        "still listed as leaking a minute after its warm-up: {:?}",
        s.leaks
    );
    let pods = pods_of(&client, n, "warmup").await;
    assert_eq!(pods.len(), 1, "the warm-up pod was replaced");
    assert_eq!(pods[0].uid(), first.uid(), "the warm-up pod was replaced");
    assert!(
        !oom_killed(&pods[0]) && restarts(&pods[0]) == 0,
        "the warm-up pod was killed in place"
    );
    eprintln!(
        "warm-up listed as leaking in {listed} of the status samples (highest confidence {max_confidence}), never restarted"
    );
    ns.delete().await;
}

#[tokio::test]
#[ignore = "needs the e2e cluster with remediation on: make e2e"]
async fn a_pdb_blocks_the_eviction_and_dry_run_only_reports() {
    let (client, ns) = opted_in("rw-e2e-rails").await;
    let n = ns.name.as_str();
    // Guarded by a PDB (minAvailable 1 over one replica), and a dry-run watch's pod.
    let pdb: serde_json::Value = serde_json::json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "guarded", "namespace": n},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}
    });
    let (ok, _, out) = harness::kubectl_apply(&pdb.to_string());
    assert!(ok, "PDB: {out}");
    watch(
        &client,
        n,
        serde_json::json!({"matchLabels": {"app": "guarded"}}),
        serde_json::json!({"action": "Restart", "minTimeToOOM": "40s"}),
    )
    .await;
    deployment(
        &client,
        n,
        "guarded",
        &harness::leak_args("2MiB/s", "20"),
        "128Mi",
    )
    .await;
    let first = wait_for("the guarded pod", Duration::from_secs(60), || {
        let client = client.clone();
        async move { Ok(pods_of(&client, n, "guarded").await.into_iter().next()) }
    })
    .await
    .expect("pod");
    let blocked = wait_for("a RestartBlocked Event", Duration::from_secs(120), || {
        let client = client.clone();
        async move {
            Ok(harness::events(&client, n, "RestartBlocked")
                .await
                .into_iter()
                .next())
        }
    })
    .await
    .expect("blocked");
    let note = blocked.note.unwrap_or_default();
    assert!(
        note.contains("disruption budget") || note.contains("refused"),
        "{note}"
    );
    let rws: Api<ResourceWatch> = Api::namespaced(client.clone(), n);
    let s = rws.get("w").await.expect("rw").status.unwrap_or_default();
    assert!(
        s.remediations
            .iter()
            .any(|r| r.action == RemediationOutcome::Blocked && r.reason == "PodDisruptionBudget"),
        "{:?}",
        s.remediations
    );
    let now = pods_of(&client, n, "guarded").await;
    assert!(
        now.iter()
            .any(|p| p.uid() == first.uid() && p.metadata.deletion_timestamp.is_none()),
        "the guarded pod was deleted"
    );
    ns.delete().await;

    let ns = TestNamespace::create(&client, "rw-e2e-dry")
        .await
        .expect("ns");
    ns.opt_in().await.expect("opt in");
    let n = ns.name.as_str();
    watch(
        &client,
        n,
        serde_json::json!({"matchLabels": {"app": "dry"}}),
        serde_json::json!({"action": "Restart", "minTimeToOOM": "40s", "dryRun": true}),
    )
    .await;
    deployment(
        &client,
        n,
        "dry",
        &harness::leak_args("2MiB/s", "20"),
        "128Mi",
    )
    .await;
    let first = wait_for("the dry pod", Duration::from_secs(60), || {
        let client = client.clone();
        async move { Ok(pods_of(&client, n, "dry").await.into_iter().next()) }
    })
    .await
    .expect("pod");
    wait_for("a WouldRestart Event", Duration::from_secs(120), || {
        let client = client.clone();
        async move { Ok((!harness::events(&client, n, "WouldRestart").await.is_empty()).then_some(())) }
    })
    .await
    .expect("WouldRestart");
    // Untouched: the kernel OOM-kills it in the end.
    wait_for(
        "the dry-run pod's OOM kill",
        Duration::from_secs(120),
        || {
            let client = client.clone();
            let uid = first.uid();
            async move {
                Ok(pods_of(&client, n, "dry")
                    .await
                    .iter()
                    .any(|p| p.uid() == uid && oom_killed(p))
                    .then_some(()))
            }
        },
    )
    .await
    .expect("OOM-killed");
    assert!(harness::events(&client, n, "Restarted").await.is_empty());
    ns.delete().await;
}

#[tokio::test]
#[ignore = "needs the e2e cluster with remediation on: make e2e"]
async fn a_pending_record_written_into_status_is_never_carried_out() {
    let (client, ns) = opted_in("rw-e2e-forged").await;
    let n = ns.name.as_str();
    // A flat pod that never triggers by itself. Whoever may write the watch's status
    // leaves a Pending intent for it while the operator restarts: only the workload's
    // ledger (in the operator's namespace) counts, so it must expire, not evict.
    deployment(
        &client,
        n,
        "victim",
        &["--pattern", "flat", "--size", "8MiB"],
        "128Mi",
    )
    .await;
    watch(
        &client,
        n,
        serde_json::json!({"matchLabels": {"app": "victim"}}),
        serde_json::json!({"action": "Restart", "minTimeToOOM": "40s"}),
    )
    .await;
    let pod = running_pod(&client, n, "victim").await;
    let rws: Api<ResourceWatch> = Api::namespaced(client.clone(), n);
    wait_for("a first status", Duration::from_secs(60), || {
        let rws = rws.clone();
        async move {
            Ok(rws
                .get("w")
                .await?
                .status
                .filter(|s| s.matched_pods == 1)
                .map(|_| ()))
        }
    })
    .await
    .expect("status");
    let sys: Api<Pod> = Api::namespaced(client.clone(), "resourcewatch-system");
    for p in sys
        .list(&ListParams::default().labels("app.kubernetes.io/name=resourcewatch-operator"))
        .await
        .expect("list")
    {
        let _ = sys.delete(&p.name_any(), &Default::default()).await;
    }
    let intent = serde_json::json!({"status": {"remediations": [{
        "pod": pod.name_any(), "podUID": pod.uid(), "workload": "Deployment/victim",
        "action": "Pending", "reason": "Decided", "timeToOOMSeconds": 30.0, "confidence": 90,
        "time": jiff_now()
    }]}});
    rws.patch_status("w", &PatchParams::default(), &Patch::Merge(&intent))
        .await
        .expect("intent");
    let expired = wait_for(
        "the forged intent expired",
        Duration::from_secs(120),
        || {
            let rws = rws.clone();
            async move {
                let s = rws.get("w").await?.status.unwrap_or_default();
                Ok(s.remediations
                    .into_iter()
                    .find(|r| r.action == RemediationOutcome::Expired))
            }
        },
    )
    .await
    .expect("expired");
    assert_eq!(expired.reason, "IntentExpired", "{expired:?}");
    // An absence check, so a window: an eviction would follow within a few reconciles.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let pods = pods_of(&client, n, "victim").await;
    assert!(
        pods.iter()
            .any(|p| p.uid() == pod.uid() && p.metadata.deletion_timestamp.is_none()),
        "the victim was evicted on a record nobody decided"
    );
    assert!(harness::events(&client, n, "Restarted").await.is_empty());
    ns.delete().await;
}

fn jiff_now() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}
