//! resourcewatch installed for real (config/, images, operator Deployment, agent DaemonSet)
//! on a real node, with real workloads: Top-K of the selected pods, agent and operator
//! loss, and a leak predicted before the kernel's OOM kill. Run by `make e2e`
//! (e2e/run-cluster-tests.sh), which builds, installs and tears down.
//!
//! Each test has its own namespace and waits on conditions with deadlines.

use std::{process::Command, time::Duration};

use k8s_openapi::api::{apps::v1::DaemonSet, core::v1::Pod, events::v1::Event};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use resourcewatch_crds::{ConditionReason, ConditionStatus, ResourceWatch, ResourceWatchStatus};
use resourcewatch_e2e::harness::{self, leak_sim_pod, wait_for};

const SYSTEM: &str = "resourcewatch-system";

fn kubectl(args: &[&str]) -> (bool, String) {
    let out = Command::new(harness::kubectl())
        .args(args)
        .output()
        .expect("kubectl runs");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

async fn wait_running(client: &Client, ns: &str, names: &[&str]) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for name in names {
        wait_for(
            &format!("pod {name} Running"),
            Duration::from_secs(90),
            || {
                let pods = pods.clone();
                async move {
                    let p = pods.get(name).await?;
                    Ok(
                        (p.status.and_then(|s| s.phase).as_deref() == Some("Running"))
                            .then_some(()),
                    )
                }
            },
        )
        .await
        .expect("pod runs");
    }
}

async fn status_where(
    rws: &Api<ResourceWatch>,
    name: &str,
    what: &str,
    secs: u64,
    pred: impl Fn(&ResourceWatchStatus) -> bool,
) -> ResourceWatchStatus {
    let pred = &pred;
    let r = wait_for(what, Duration::from_secs(secs), || async move {
        let s = rws.get(name).await?.status.unwrap_or_default();
        Ok(pred(&s).then_some(s))
    })
    .await;
    match r {
        Ok(s) => s,
        Err(e) => {
            let last = rws.get(name).await.ok().and_then(|r| r.status);
            panic!("{e:#}\nlast status: {last:#?}")
        }
    }
}

async fn event_count(client: &Client, ns: &str, reason: &str) -> usize {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .iter()
                .filter(|e| e.reason.as_deref() == Some(reason))
                .count()
        })
        .unwrap_or(0)
}

fn condition(s: &ResourceWatchStatus, t: &str) -> Option<(ConditionStatus, ConditionReason)> {
    s.conditions
        .iter()
        .find(|c| c.type_ == t)
        .map(|c| (c.status, c.reason))
}

#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn the_sample_ranks_the_selected_pods_within_two_intervals() {
    let (client, ns) = harness::test_namespace("rw-e2e-top").await;
    let n = ns.name.as_str();
    leak_sim_pod(
        &client,
        n,
        "api-burn",
        "api",
        &["--pattern", "burn"],
        "64Mi",
    )
    .await;
    leak_sim_pod(
        &client,
        n,
        "api-mem",
        "api",
        &["--pattern", "flat", "--size", "300MiB"],
        "512Mi",
    )
    .await;
    leak_sim_pod(
        &client,
        n,
        "api-idle",
        "api",
        &["--pattern", "flat", "--size", "4MiB"],
        "64Mi",
    )
    .await;
    leak_sim_pod(
        &client,
        n,
        "other-burn",
        "other",
        &["--pattern", "burn", "--size", "400MiB"],
        "512Mi",
    )
    .await;
    wait_running(
        &client,
        n,
        &["api-burn", "api-mem", "api-idle", "other-burn"],
    )
    .await;

    // The sample as users apply it (selector app=api, interval 30s).
    let (ok, out) = kubectl(&[
        "apply",
        "-n",
        n,
        "-f",
        &harness::repo_root()
            .join("config/samples/resourcewatch.yaml")
            .to_string_lossy(),
    ]);
    assert!(ok, "{out}");
    let applied = std::time::Instant::now();
    let rws: Api<ResourceWatch> = Api::namespaced(client.clone(), n);
    let s = status_where(
        &rws,
        "api",
        "Top-K of the three api pods (two intervals)",
        65,
        |s| {
            s.top_cpu.first().is_some_and(|e| e.pod == "api-burn")
                && s.top_memory.first().is_some_and(|e| e.pod == "api-mem")
                && s.reporting_nodes == 1
        },
    )
    .await;
    eprintln!(
        "status filled {:.0}s after apply",
        applied.elapsed().as_secs_f64()
    );
    assert_eq!(s.matched_pods, 3);
    for e in s.top_cpu.iter().chain(&s.top_memory) {
        assert_ne!(e.pod, "other-burn", "a pod outside the selector appeared");
        assert_eq!(e.container, "main");
        assert!(!e.process.node.is_empty() && e.process.pid > 0);
    }
    assert!(
        s.top_cpu[0].process.value > 50.0,
        "the burner uses a core: {}",
        s.top_cpu[0].process.value
    );
    assert!(
        s.top_memory[0].process.value > 250.0 * 1048576.0,
        "300 MiB resident: {}",
        s.top_memory[0].process.value
    );
    assert_ne!(s.top_cpu[0].pod, "api-idle");
    assert_ne!(s.top_memory[0].pod, "api-idle");
    assert_eq!(
        condition(&s, "Ready").map(|c| c.0),
        Some(ConditionStatus::True)
    );

    let (ok, out) = kubectl(&["get", "resourcewatch", "-n", n, "-o", "wide"]);
    assert!(ok, "{out}");
    eprintln!("{out}");
    let row: Vec<&str> = out
        .lines()
        .nth(1)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert!(
        row.contains(&"3")
            && row.contains(&"api-burn")
            && row.contains(&"api-mem")
            && row.contains(&"True"),
        "{out}"
    );
    ns.delete().await;
}

/// A namespace with one pod burning CPU (`app=api`) and a watch `w` selecting it, once the
/// watch reports it from the node.
async fn burning_watch(prefix: &str) -> (Client, harness::TestNamespace, Api<ResourceWatch>) {
    let (client, ns) = harness::test_namespace(prefix).await;
    let n = ns.name.as_str();
    leak_sim_pod(
        &client,
        n,
        "api-burn",
        "api",
        &["--pattern", "burn"],
        "64Mi",
    )
    .await;
    wait_running(&client, n, &["api-burn"]).await;
    let rws = harness::watch_app(&client, n, "w", "api").await;
    status_where(&rws, "w", "a reporting watch", 60, |s| {
        !s.top_cpu.is_empty() && s.reporting_nodes == 1
    })
    .await;
    (client, ns, rws)
}

#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn losing_the_agent_degrades_and_recovers_and_an_operator_restart_repeats_no_event() {
    let (client, ns, rws) = burning_watch("rw-e2e-loss").await;
    let n = ns.name.as_str();

    // The agent pod is deleted and, while the DaemonSet is held off the node, not replaced.
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), SYSTEM);
    let hold = serde_json::json!({"spec": {"template": {"spec": {"nodeSelector": {"resourcewatch.io/e2e-hold": "true"}}}}});
    dss.patch(
        "resourcewatch-agent",
        &PatchParams::default(),
        &Patch::Merge(&hold),
    )
    .await
    .expect("hold the agent");
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM);
    for p in pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=resourcewatch-agent"))
        .await
        .expect("list")
    {
        let _ = pods.delete(&p.name_any(), &DeleteParams::default()).await;
    }
    let s = status_where(&rws, "w", "Degraded=True AgentsMissing", 90, |s| {
        condition(s, "Degraded") == Some((ConditionStatus::True, ConditionReason::AgentsMissing))
    })
    .await;
    assert!(s.nodes.iter().any(|n| !n.reporting));
    wait_for("an AgentLost Event", Duration::from_secs(15), || {
        let client = client.clone();
        async move { Ok((event_count(&client, n, "AgentLost").await == 1).then_some(())) }
    })
    .await
    .expect("AgentLost");
    let release = serde_json::json!({"spec": {"template": {"spec": {"nodeSelector": null}}}});
    dss.patch(
        "resourcewatch-agent",
        &PatchParams::default(),
        &Patch::Merge(&release),
    )
    .await
    .expect("release the agent");
    status_where(
        &rws,
        "w",
        "Degraded=False after the agent is back",
        120,
        |s| {
            condition(s, "Degraded").is_some_and(|c| c.0 == ConditionStatus::False)
                && s.reporting_nodes == 1
        },
    )
    .await;
    wait_for("an AgentRecovered Event", Duration::from_secs(15), || {
        let client = client.clone();
        async move { Ok((event_count(&client, n, "AgentRecovered").await == 1).then_some(())) }
    })
    .await
    .expect("AgentRecovered");

    // The operator pod is deleted: its replacement continues the status, repeating nothing.
    let reasons = [
        "WatchReady",
        "AgentLost",
        "AgentRecovered",
        "LeakDetected",
        "ThresholdCrossed",
    ];
    let mut before = Vec::new();
    for r in reasons {
        before.push(event_count(&client, n, r).await);
    }
    let last = rws
        .get("w")
        .await
        .expect("rw")
        .status
        .and_then(|s| s.last_update_time);
    for p in pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=resourcewatch-operator"))
        .await
        .expect("list")
    {
        pods.delete(&p.name_any(), &DeleteParams::default())
            .await
            .expect("delete operator pod");
    }
    status_where(
        &rws,
        "w",
        "a status update from the new operator",
        120,
        |s| s.last_update_time != last && s.reporting_nodes == 1 && !s.top_cpu.is_empty(),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(6)).await; // one more interval for stray Events
    let mut after = Vec::new();
    for r in reasons {
        after.push(event_count(&client, n, r).await);
    }
    assert_eq!(
        before, after,
        "Events by reason {reasons:?} changed across the operator restart"
    );
    ns.delete().await;
    // Every node's agent back before the next test: the VM node's loads its programs
    // under emulation, a minute or more after the one here.
    every_agent_available(&client).await;
}

/// Until the agent DaemonSet has an available, current pod on every node.
async fn every_agent_available(client: &Client) {
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), SYSTEM);
    wait_for(
        "an available agent on every node",
        Duration::from_secs(300),
        || {
            let dss = dss.clone();
            async move {
                let st = dss
                    .get("resourcewatch-agent")
                    .await?
                    .status
                    .unwrap_or_default();
                Ok((st.desired_number_scheduled > 0
                    && st.number_available == Some(st.desired_number_scheduled)
                    && st.updated_number_scheduled == Some(st.desired_number_scheduled))
                .then_some(()))
            }
        },
    )
    .await
    .expect("the agents");
}

#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_leak_is_listed_with_its_time_to_oom_before_the_kernel_kills_it() {
    leak_listed_before_its_oom_kill("rw-e2e-leak", harness::Placement::Host).await;
}

/// The same on the VM node (e2e/cluster/vm-node.sh): Debian's Linux 6.1 with cgroup v2
/// only, where the limit is the container's memory.max and the kill is the v2 memory
/// controller's, under QEMU's software emulation (about 17x slower than this machine).
#[tokio::test]
#[ignore = "needs the e2e cluster with its VM node: make e2e"]
async fn on_the_cgroup_v2_node_a_leak_is_listed_with_its_time_to_oom_before_the_kernel_kills_it() {
    leak_listed_before_its_oom_kill("rw-e2e-leak-v2", harness::Placement::Vm).await;
}

/// A limit set on the pod (`spec.resources`, PodLevelResources) and none on its container:
/// the pod cgroup's limit is the one the kernel kills at, so it is the one a leak's time
/// to OOM is counted against (not the node's memory).
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_pod_level_limit_is_the_limit_of_a_container_without_one() {
    pod_level_limit_is_used("rw-e2e-podlimit", harness::Placement::Host).await;
}

#[tokio::test]
#[ignore = "needs the e2e cluster with its VM node: make e2e"]
async fn on_the_cgroup_v2_node_a_pod_level_limit_is_the_limit_of_a_container_without_one() {
    pod_level_limit_is_used("rw-e2e-podlimit-v2", harness::Placement::Vm).await;
}

async fn pod_level_limit_is_used(prefix: &str, node: harness::Placement) {
    let (client, ns) = harness::test_namespace(prefix).await;
    let n = ns.name.as_str();
    let rws = harness::watch_app(&client, n, "w", "leaky").await;
    let mut spec = node.pod_spec_fields();
    spec["resources"] = serde_json::json!({"limits": {"memory": "160Mi"}});
    let pod = harness::leak_sim_pod_with(
        &client,
        n,
        "leaky",
        "leaky",
        &harness::leak_args("2MiB/s", "10"),
        "",
        spec,
    )
    .await;
    assert!(
        pod.spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .is_some(),
        "the API server dropped the pod-level resources (PodLevelResources off?)"
    );
    wait_running(&client, n, &["leaky"]).await;
    let s = status_where(&rws, "w", "the leak with a time to OOM", 100, |s| {
        s.leaks
            .iter()
            .any(|l| l.pod == "leaky" && l.time_to_oom_seconds.is_some())
    })
    .await;
    let leak = s.leaks.iter().find(|l| l.pod == "leaky").expect("leak");
    eprintln!("{leak:?}");
    assert_eq!(leak.limit_bytes, Some(160 << 20), "the pod's limit");
    let expected_node = (node == harness::Placement::Vm).then_some(harness::VM_NODE);
    match expected_node {
        Some(vm) => assert_eq!(leak.node, vm),
        None => assert_ne!(leak.node, harness::VM_NODE),
    }
    // 160 MiB at 2 MiB/s from about 20 MiB: at most ~70 s left, far below what the
    // node's free memory would give.
    let tto = leak.time_to_oom_seconds.unwrap_or(f64::MAX);
    assert!(
        tto < 120.0,
        "time to OOM {tto:.0}s: not against the pod's 160Mi"
    );
    ns.delete().await;
}

/// The VM node's network, as pods use it: a pod there and a pod on this machine reach each
/// other by pod IP (the route through the tap device), both reach the operator's Service
/// (each node's kube-proxy), and the API server reaches the VM's kubelet (exec, logs).
#[tokio::test]
#[ignore = "needs the e2e cluster with its VM node: make e2e"]
async fn on_the_cgroup_v2_node_pods_reach_the_other_nodes_pods_and_the_operators_service() {
    let (client, ns) = harness::test_namespace("rw-e2e-net").await;
    let n = ns.name.as_str();
    let args = ["--pattern", "flat", "--size", "4MiB", "--listen", "8080"];
    for (name, node) in [
        ("on-host", harness::Placement::Host),
        ("on-vm", harness::Placement::Vm),
    ] {
        harness::leak_sim_pod_on(&client, n, name, "net", &args, "64Mi", node).await;
    }
    wait_running(&client, n, &["on-host", "on-vm"]).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), n);
    let mut ip = std::collections::BTreeMap::new();
    for name in ["on-host", "on-vm"] {
        let p = pods.get(name).await.expect("pod");
        let spec = p.spec.clone().unwrap_or_default();
        let on_vm = spec.node_name.as_deref() == Some(harness::VM_NODE);
        assert_eq!(on_vm, name == "on-vm", "{name} on {:?}", spec.node_name);
        ip.insert(name, p.status.and_then(|s| s.pod_ip).expect("pod IP"));
    }
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(client.clone(), SYSTEM);
    let svc = services
        .get("resourcewatch-operator")
        .await
        .expect("the operator's Service");
    let cluster_ip = svc.spec.and_then(|s| s.cluster_ip).expect("a ClusterIP");
    let probe =
        |from: &str, to: &str| kubectl(&["exec", "-n", n, from, "--", "/leak-sim", "--probe", to]);
    for (from, to) in [("on-vm", "on-host"), ("on-host", "on-vm")] {
        let (ok, out) = probe(from, &format!("{}:8080", ip[to]));
        assert!(
            ok && out.contains(&format!("leak-sim {to}")),
            "{from} -> {to} ({}): {out}",
            ip[to]
        );
    }
    for from in ["on-vm", "on-host"] {
        let (ok, out) = probe(from, &format!("{cluster_ip}:9443"));
        assert!(
            ok,
            "{from} -> the operator's Service {cluster_ip}:9443: {out}"
        );
    }
    let (ok, out) = kubectl(&["logs", "-n", n, "on-vm"]);
    assert!(
        ok && out.contains("leak-sim pid"),
        "logs through the VM's kubelet: {out}"
    );
    ns.delete().await;
}

/// One watch selecting pods on both nodes: both agents report them, and the status ranks
/// them together, each row naming its node; on the v2 node exact tracking attributes the
/// burner's process and its CPU.
#[tokio::test]
#[ignore = "needs the e2e cluster with its VM node: make e2e"]
async fn on_the_cgroup_v2_node_a_watch_over_both_nodes_aggregates_both() {
    let (client, ns) = harness::test_namespace("rw-e2e-both").await;
    let n = ns.name.as_str();
    let pods = [
        (
            "mem-host",
            &["--pattern", "flat", "--size", "200MiB"][..],
            harness::Placement::Host,
        ),
        (
            "mem-vm",
            &["--pattern", "flat", "--size", "120MiB"][..],
            harness::Placement::Vm,
        ),
        (
            "burn-vm",
            &["--pattern", "burn"][..],
            harness::Placement::Vm,
        ),
    ];
    for (name, args, node) in pods {
        harness::leak_sim_pod_on(&client, n, name, "both", args, "320Mi", node).await;
    }
    wait_running(&client, n, &["mem-host", "mem-vm", "burn-vm"]).await;
    let rws = harness::watch_app(&client, n, "w", "both").await;
    let node_of = |s: &ResourceWatchStatus, pod: &str| {
        s.top_memory
            .iter()
            .chain(&s.top_cpu)
            .find(|e| e.pod == pod)
            .map(|e| e.process.node.clone())
    };
    let s = status_where(&rws, "w", "both nodes' pods ranked together", 120, |s| {
        s.reporting_nodes == 2
            && s.top_cpu.first().is_some_and(|e| e.pod == "burn-vm")
            && s.top_memory
                .iter()
                .any(|e| e.pod == "mem-host" && e.process.value > 180.0 * 1048576.0)
            && s.top_memory
                .iter()
                .any(|e| e.pod == "mem-vm" && e.process.value > 100.0 * 1048576.0)
    })
    .await;
    assert_eq!(s.matched_pods, 3);
    assert_eq!(node_of(&s, "mem-vm").as_deref(), Some(harness::VM_NODE));
    assert_eq!(node_of(&s, "burn-vm").as_deref(), Some(harness::VM_NODE));
    let host = node_of(&s, "mem-host").expect("mem-host ranked");
    assert_ne!(host, harness::VM_NODE);
    // The two largest by memory, in order, whichever node they are on.
    let order: Vec<&str> = s.top_memory.iter().map(|e| e.pod.as_str()).collect();
    let (h, v) = (
        order.iter().position(|p| *p == "mem-host"),
        order.iter().position(|p| *p == "mem-vm"),
    );
    assert!(h < v, "200 MiB ranked above 120 MiB: {order:?}");
    let burn = &s.top_cpu[0];
    assert_eq!(burn.container, "main");
    assert!(burn.process.pid > 0);
    // A burner on an emulated CPU still takes most of one.
    assert!(
        burn.process.value > 30.0,
        "burn-vm at {}% of a core",
        burn.process.value
    );
    ns.delete().await;
}

async fn leak_listed_before_its_oom_kill(prefix: &str, node: harness::Placement) {
    let (client, ns) = harness::test_namespace(prefix).await;
    let n = ns.name.as_str();
    let rws = harness::watch_app(&client, n, "w", "leaky").await;
    // 20 MiB, flat for 20 s, then 2 MiB/s against a 128Mi limit: OOM about 74 s after start.
    harness::leak_sim_pod_on(
        &client,
        n,
        "leaky",
        "leaky",
        &harness::leak_args("2MiB/s", "20"),
        "128Mi",
        node,
    )
    .await;
    wait_running(&client, n, &["leaky"]).await;
    let started = std::time::Instant::now();
    let s = status_where(
        &rws,
        "w",
        "the leak in status with a time to OOM",
        100,
        |s| {
            // The first row with a time to OOM is the one judged, limit included: on the
            // VM node the first rows came without the container's limit (time to OOM
            // against the node's memory) while the agent could not resolve the paths its
            // own cgroup namespace showed it.
            s.leaks
                .iter()
                .any(|l| l.pod == "leaky" && l.time_to_oom_seconds.is_some())
        },
    )
    .await;
    let on = s
        .leaks
        .iter()
        .find(|l| l.pod == "leaky")
        .map(|l| l.node.clone());
    match node {
        harness::Placement::Vm => assert_eq!(on.as_deref(), Some(harness::VM_NODE), "reported by"),
        harness::Placement::Host => {
            assert_ne!(on.as_deref(), Some(harness::VM_NODE), "reported by")
        }
    }
    let seen_at = started.elapsed();
    let first_seen_at = seen_at;
    let leak = s.leaks.iter().find(|l| l.pod == "leaky").expect("leak");
    let pods: Api<Pod> = Api::namespaced(client.clone(), n);
    let p = pods.get("leaky").await.expect("pod");
    let terminated = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref())
        .is_some();
    assert!(
        !terminated,
        "the leak was reported only after the container died"
    );
    assert_eq!(leak.container, "main");
    assert_eq!(leak.limit_bytes, Some(128 << 20), "{leak:?}");
    eprintln!("first row: {leak:?}");
    // On the emulated node the first row's rate is not settled yet: listed at once with
    // its limit (since the agent resolves its cgroup namespace's paths), it read 4.68 MiB/s
    // for a 2 MiB/s leak. Its rate and time to OOM are judged once the leak has grown for
    // 10 s there (the row this test judged before, which came that late for want of the
    // limit); on this machine, on the first row. The first row's lower bound is checked
    // against the kill either way.
    let first_low = leak.time_to_oom_lower_bound_seconds;
    let settled;
    let (leak, seen_at) = if node == harness::Placement::Vm {
        settled = status_where(&rws, "w", "the leak grown for 10 s", 60, |s| {
            s.leaks.iter().any(|l| {
                l.pod == "leaky"
                    && l.time_to_oom_seconds.is_some()
                    && l.growing_for_seconds.is_some_and(|g| g >= 10.0)
            })
        })
        .await;
        let at = started.elapsed();
        let row = settled
            .leaks
            .iter()
            .find(|l| l.pod == "leaky")
            .expect("leak");
        eprintln!("settled row: {row:?}");
        (row, at)
    } else {
        (leak, seen_at)
    };
    let rate = leak.growth_bytes_per_second / 1048576.0;
    assert!(
        (1.4..2.8).contains(&rate),
        "growth {rate:.2} MiB/s, expected about 2"
    );
    let tto = leak.time_to_oom_seconds.unwrap_or(0.0);
    eprintln!(
        "leak listed {:.0}s after start with time to OOM {tto:.0}s, confidence {}",
        seen_at.as_secs_f64(),
        leak.confidence
    );
    assert_eq!(s.summary.leaking, 1);
    assert!(s.summary.soonest_oom.is_some());
    // And the kernel does kill it, after the prediction.
    let reason = wait_for("the OOM kill", Duration::from_secs(120), || {
        let pods = pods.clone();
        async move {
            let p = pods.get("leaky").await?;
            Ok(p.status
                .and_then(|s| s.container_statuses)
                .and_then(|c| c.into_iter().next())
                .and_then(|c| c.state)
                .and_then(|s| s.terminated)
                .map(|t| t.reason.unwrap_or_default()))
        }
    })
    .await
    .expect("terminated");
    assert_eq!(reason, "OOMKilled");
    let killed_at = started.elapsed();
    let real = (killed_at - seen_at).as_secs_f64();
    eprintln!(
        "OOM-killed {:.0}s after start: warned {real:.0}s ahead (predicted {tto:.0}s, at the earliest {:?}s)",
        killed_at.as_secs_f64(),
        leak.time_to_oom_lower_bound_seconds
    );
    // The lower bound is what remediation acts on: it must not promise more time than the
    // kernel gave. The status was read up to one report interval (5 s) after the
    // prediction, and the kill is seen up to a poll later.
    let low = leak
        .time_to_oom_lower_bound_seconds
        .expect("a lower bound with the prediction");
    assert!(low > 0.0, "a lower bound of {low}s");
    assert!(low <= tto, "lower bound {low} above the point {tto}");
    // The point estimate itself, against the kill: LEAKS.md measures 0-11 % error for a
    // steady leak; half to one and a half times (plus the reading's slack) still fails an
    // estimate off by a factor, or a rate read as near zero.
    assert!(
        (real * 0.5 - 10.0..=real * 1.5 + 10.0).contains(&tto),
        "predicted {tto:.0}s to OOM, the kill came {real:.0}s after it was read"
    );
    assert!(
        low <= real + 5.0,
        "lower bound {low:.0}s, the kill came {real:.0}s after it was read"
    );
    if let Some(first_low) = first_low {
        let since_first = (killed_at - first_seen_at).as_secs_f64();
        assert!(
            first_low <= since_first + 5.0,
            "the first row's lower bound {first_low:.0}s, the kill came {since_first:.0}s after it"
        );
    }
    assert!(
        leak.growing_for_seconds.is_some(),
        "growingForSeconds is reported"
    );
    // The kill itself, seen by the node's agent in the kernel, graded in the status.
    let s = status_where(&rws, "w", "the OOM kill in status", 60, |s| {
        s.oom_kills.iter().any(|k| k.pod == "leaky")
    })
    .await;
    let k = s.oom_kills.iter().find(|k| k.pod == "leaky").expect("kill");
    eprintln!("graded kill: {k:?}");
    assert_eq!(k.container, "main", "{k:?}");
    assert_eq!(k.scope, resourcewatch_crds::OomScope::Cgroup, "{k:?}");
    assert_eq!(k.limit_bytes, Some(128 << 20), "{k:?}");
    assert!(k.predicted, "{k:?}");
    let warned = k.warned_seconds_before.expect("warned");
    // Listed at `first_seen_at` (read up to an interval late), killed at `killed_at`
    // (seen up to a poll late).
    let seen_lead = (killed_at - first_seen_at).as_secs_f64();
    assert!(
        warned >= seen_lead - 10.0,
        "first warning {warned}s before the kill; the status listed it {seen_lead:.0}s before"
    );
    assert!(k.eta_error_at_first_alert_seconds.is_some(), "{k:?}");
    assert_eq!(s.summary.oom_kills.as_deref(), Some("1 (1 predicted)"));
    harness::event_where(&client, n, "OOMKilled", 30, |m| {
        m.starts_with("leaky/main") && m.contains("predicted") && !m.contains("not predicted")
    })
    .await;
    ns.delete().await;
}

/// Kills are named by the container that died, also where no running container has its
/// id any more: a sidecar killed beside a main container that keeps running, and an init
/// container killed before the pod's containers could start (restartPolicy Never: that
/// pod is then Failed).
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn kills_in_a_sidecar_and_an_init_container_are_named_by_their_container() {
    let (client, ns) = harness::test_namespace("rw-e2e-oom-named").await;
    let n = ns.name.as_str();
    let rws = harness::watch_app(&client, n, "w", "named").await;
    let sim = |name: &str, args: &[&str], limit: &str| {
        serde_json::json!({
            "name": name, "image": harness::WORKLOADS_IMAGE, "imagePullPolicy": "Never",
            "command": ["/leak-sim"], "args": args,
            "resources": {"limits": {"memory": limit}, "requests": {"memory": "8Mi", "cpu": "10m"}}
        })
    };
    let flat = ["--pattern", "flat", "--size", "20MiB"];
    let burst = harness::leak_args("512MiB/s", "5");
    let pods: Api<Pod> = Api::namespaced(client.clone(), n);
    for (name, spec) in [
        (
            "with-sidecar",
            serde_json::json!({"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                "containers": [sim("main", &flat, "64Mi"), sim("sidecar", &burst, "48Mi")]}),
        ),
        (
            "with-init",
            serde_json::json!({"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                "initContainers": [sim("setup", &burst, "48Mi")],
                "containers": [sim("main", &flat, "64Mi")]}),
        ),
    ] {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"app": "named"}},
            "spec": spec,
        }))
        .expect("pod json");
        pods.create(&PostParams::default(), &p)
            .await
            .unwrap_or_else(|e| panic!("creating pod {name}: {e}"));
    }
    let s = status_where(&rws, "w", "both kills in status", 120, |s| {
        ["with-sidecar", "with-init"]
            .iter()
            .all(|pod| s.oom_kills.iter().any(|k| k.pod == *pod))
    })
    .await;
    let named: Vec<(&str, &str)> = s
        .oom_kills
        .iter()
        .map(|k| (k.pod.as_str(), k.container.as_str()))
        .collect();
    eprintln!("kills: {named:?}");
    assert!(named.contains(&("with-sidecar", "sidecar")), "{named:?}");
    assert!(named.contains(&("with-init", "setup")), "{named:?}");
    assert!(
        s.oom_kills
            .iter()
            .all(|k| k.scope == resourcewatch_crds::OomScope::Cgroup
                && k.limit_bytes == Some(48 << 20)),
        "{:?}",
        s.oom_kills
    );
    // The sidecar's neighbour keeps running (the pod's status may lag the kills).
    wait_for(
        "the main container beside the killed sidecar running",
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            async move {
                let p = pods.get("with-sidecar").await?;
                Ok(p.status
                    .and_then(|s| s.container_statuses)
                    .into_iter()
                    .flatten()
                    .any(|c| c.name == "main" && c.state.and_then(|s| s.running).is_some())
                    .then_some(()))
            }
        },
    )
    .await
    .expect("main runs");
    ns.delete().await;
}

/// A pod deleted as soon as the kubelet says its container was OOM-killed (what a Job's
/// cleanup or a user deleting what crashed does): its agent reports the kill after the pod
/// has left the API, and the kill is still named and graded in the watch's status. The
/// watch's 30 s interval has the agent report every 15 s, so the deletion comes before
/// the report in most runs (the kubelet says OOMKilled within a couple of seconds).
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn an_oom_kill_of_a_pod_deleted_right_after_is_still_in_status() {
    let (client, ns) = harness::test_namespace("rw-e2e-oom-gone").await;
    let n = ns.name.as_str();
    let spec = serde_json::json!({"selector": {"matchLabels": {"app": "gone"}}, "interval": "30s"});
    let (rws, _) = harness::create_watch(&client, n, "w", spec).await;
    leak_sim_pod(
        &client,
        n,
        "gone",
        "gone",
        &harness::leak_args("512MiB/s", "10"),
        "64Mi",
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), n);
    let killed = wait_for("the kubelet's OOMKilled", Duration::from_secs(90), || {
        let pods = pods.clone();
        async move { Ok(harness::oom_killed(&pods.get("gone").await?).then_some(())) }
    })
    .await;
    killed.expect("the pod's container OOM-killed");
    let in_status_before = rws
        .get("w")
        .await
        .ok()
        .and_then(|w| w.status)
        .is_some_and(|s| s.oom_kills.iter().any(|k| k.pod == "gone"));
    pods.delete(
        "gone",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .expect("delete the pod");
    let s = status_where(&rws, "w", "the deleted pod's kill in status", 90, |s| {
        s.oom_kills.iter().any(|k| k.pod == "gone")
    })
    .await;
    let k = s.oom_kills.iter().find(|k| k.pod == "gone").expect("kill");
    eprintln!("kill of a deleted pod (in status before the deletion: {in_status_before}): {k:?}");
    assert_eq!(k.container, "main", "{k:?}");
    assert_eq!(k.limit_bytes, Some(64 << 20), "{k:?}");
    assert!(!k.predicted, "{k:?}");
    ns.delete().await;
}

/// A container that allocates past its limit at once is OOM-killed with nothing listed
/// before: the status records the kill as not predicted (a miss), and an Event says so.
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_sudden_allocation_is_an_oom_kill_nobody_predicted() {
    let (client, ns) = harness::test_namespace("rw-e2e-oom-miss").await;
    let n = ns.name.as_str();
    let rws = harness::watch_app(&client, n, "w", "sudden").await;
    // 20 MiB for 10 s, then 512 MiB/s into 64Mi: killed within a fraction of a second.
    leak_sim_pod(
        &client,
        n,
        "sudden",
        "sudden",
        &harness::leak_args("512MiB/s", "10"),
        "64Mi",
    )
    .await;
    let s = status_where(&rws, "w", "the OOM kill in status", 90, |s| {
        s.oom_kills.iter().any(|k| k.pod == "sudden")
    })
    .await;
    let k = s
        .oom_kills
        .iter()
        .find(|k| k.pod == "sudden")
        .expect("kill");
    eprintln!("graded kill: {k:?}");
    assert_eq!(k.container, "main", "{k:?}");
    assert_eq!(k.scope, resourcewatch_crds::OomScope::Cgroup, "{k:?}");
    assert_eq!(k.limit_bytes, Some(64 << 20), "{k:?}");
    assert!(!k.predicted && k.warned_seconds_before.is_none(), "{k:?}");
    assert!(s.leaks.is_empty(), "nothing was listed: {:?}", s.leaks);
    assert_eq!(s.summary.oom_kills.as_deref(), Some("1 (0 predicted)"));
    harness::event_where(&client, n, "OOMKilled", 30, |m| {
        m.starts_with("sudden/main") && m.contains("not predicted")
    })
    .await;
    ns.delete().await;
}

/// When the node's memory runs out (the cgroup v2 node: Linux 6.1, 3 GiB), not a
/// container's limit: a pod with no limit (BestEffort, so the kernel's first victim)
/// allocates 256 MiB/s until the kernel kills it. The status records the kill with scope
/// System and no limit, told apart from a cgroup's, and an Event says so; the node stays
/// Ready and no agent restarted (they were not the victims). Last of the VM node's tests by
/// name: the others do not run on a node that just ran out of memory.
#[tokio::test]
#[ignore = "needs the e2e cluster with its VM node: make e2e"]
async fn on_the_cgroup_v2_node_when_memory_runs_out_the_system_wide_oom_kill_is_told_apart() {
    use resourcewatch_crds::OomScope;
    let (client, ns) = harness::test_namespace("rw-e2e-oom-system").await;
    let n = ns.name.as_str();
    let rws = harness::watch_app(&client, n, "w", "hog").await;
    let (restarts_before, _) = agent_restarts(&client).await;
    harness::leak_sim_pod_on(
        &client,
        n,
        "hog",
        "hog",
        &harness::leak_args("256MiB/s", "5"),
        "",
        harness::Placement::Vm,
    )
    .await;
    let s = status_where(&rws, "w", "the system-wide OOM kill in status", 300, |s| {
        s.oom_kills.iter().any(|k| k.pod == "hog")
    })
    .await;
    let k = s.oom_kills.iter().find(|k| k.pod == "hog").expect("kill");
    eprintln!("graded kill: {k:?}");
    assert_eq!(k.scope, OomScope::System, "{k:?}");
    assert_eq!(k.limit_bytes, None, "{k:?}");
    assert_eq!(k.node, harness::VM_NODE, "{k:?}");
    assert_eq!(k.container, "main", "{k:?}");
    assert!(k.memory_bytes > 1 << 30, "{k:?}");
    harness::event_where(&client, n, "OOMKilled", 30, |m| m.starts_with("hog/main")).await;
    // The node survived its OOM: Ready, its agent still reporting.
    wait_for("the VM node Ready", Duration::from_secs(60), || async {
        let node = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
            .get(harness::VM_NODE)
            .await?;
        Ok(node
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
            .then_some(()))
    })
    .await
    .expect("the VM node Ready after its OOM");
    let (restarts, agent_oom_killed) = agent_restarts(&client).await;
    assert_eq!(restarts, restarts_before, "an agent restarted");
    assert!(!agent_oom_killed, "an agent was the victim");
    ns.delete().await;
}

/// No blind spot at a process's start: a container leaking 8 MB/s from its first second
/// into 128Mi (OOM-killed about 16 s later) is in the watch's status before the kernel
/// kills it.
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_leak_from_the_container_start_is_reported_before_its_oom_kill() {
    let (client, ns) = harness::test_namespace("rw-e2e-startleak").await;
    let n = ns.name.as_str();
    let rws = harness::watch_app(&client, n, "w", "fast").await;
    // The watch is in place (its nodes configured) before the pod exists.
    status_where(&rws, "w", "the watch reconciled", 60, |s| {
        condition(s, "Ready").is_some_and(|(st, _)| st == ConditionStatus::True)
    })
    .await;
    leak_sim_pod(
        &client,
        n,
        "fast",
        "fast",
        &["--pattern", "leak", "--baseline", "4MiB", "--rate", "8MB/s"],
        "128Mi",
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), n);
    let terminated = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.terminated.as_ref())
            .map(|t| (t.reason.clone().unwrap_or_default(), t.finished_at.clone()))
    };
    let start = std::time::Instant::now();
    // (seconds from creation, wall clock, confidence) when the status first listed it.
    let mut reported: Option<(f64, jiff::Timestamp, u8)> = None;
    let mut killed: Option<(f64, String, Option<jiff::Timestamp>)> = None;
    while start.elapsed() < Duration::from_secs(90) && killed.is_none() {
        let s = rws.get("w").await.expect("rw").status.unwrap_or_default();
        if reported.is_none()
            && let Some(l) = s.leaks.iter().find(|l| l.pod == "fast")
        {
            reported = Some((
                start.elapsed().as_secs_f64(),
                jiff::Timestamp::now(),
                l.confidence,
            ));
        }
        let p = pods.get("fast").await.expect("pod");
        if let Some((reason, finished)) = terminated(&p) {
            killed = Some((start.elapsed().as_secs_f64(), reason, finished.map(|t| t.0)));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (killed_at, reason, finished) = killed.expect("the container was OOM-killed within 90 s");
    assert_eq!(reason, "OOMKilled");
    let (seen_at, seen_wall, confidence) = reported.unwrap_or_else(|| {
        panic!("never reported; OOM-kill seen {killed_at:.1} s after the pod was created")
    });
    // The kubelet's record of the kill (finishedAt, whole seconds, rounded down) is the
    // truth; the status poll that listed the leak must come before it. The same machine's
    // clock stamps both.
    let finished = finished.expect("a terminated container has finishedAt");
    assert!(
        seen_wall < finished,
        "listed at {seen_wall}, the container ended at {finished}"
    );
    eprintln!(
        "8 MB/s from start: reported {seen_at:.1} s after the pod was created (confidence {confidence}), OOM-killed at {killed_at:.1} s"
    );
    ns.delete().await;
}

/// Whether a named frame is `function`: C's plain name, Go's `main.f`, Rust's `crate::f`,
/// a JavaScript function from V8's perf map (`JS:*f /leak.js:6:26`, the mark says how it
/// was compiled), a Python function (`py::f:/leak.py`), a Java method (`void Leak.f()`).
fn frame_is(frame: &str, function: &str) -> bool {
    let js = frame
        .strip_prefix("JS:")
        .map(|f| f.trim_start_matches(['*', '^', '~', '+', '-']))
        // `JS:*f /burn.js:3:26`, or `JS:*f_/burn.js:3:26` in folded stacks (spaces are `_`).
        .and_then(|f| f.split(' ').next())
        .map(|f| f.split_once("_/").map_or(f, |(name, _)| name));
    // CPython's perf trampolines: `py::leak_in_python:/leak.py`.
    let py = frame.strip_prefix("py::").and_then(|f| f.split(':').next());
    // A JVM's perf map: `void Leak.leakInJava()` (`_` for the space in folded stacks).
    let java = frame
        .split_once('(')
        .filter(|_| !frame.contains("::"))
        .and_then(|(name, _)| name.rsplit_once('.'))
        .map(|(_, method)| method);
    frame == function
        || frame.ends_with(&format!("::{function}"))
        || js == Some(function)
        || py == Some(function)
        || java == Some(function)
}

/// What a leak-site test runs: a C workloads image command, or Node.js or CPython with
/// these args.
#[derive(Clone, Copy)]
enum Leaker<'a> {
    C(&'a str),
    /// The C fixture on the VM node (Linux 6.1, cgroup v2, emulated).
    CVm(&'a str),
    Node(&'a [&'a str]),
    Python(&'a [&'a str]),
    Java(&'a [&'a str]),
}

/// A stack fixture (`command` in the C workloads image) leaking 6.4 MB/s into 1Gi (about
/// 160 s to its OOM kill, enough to be named first), run as a non-root user: within 60 s
/// of the leak being listed, the status's top growth site names `function`, and an Event
/// says where it grows (LeakDetected when the site is known at once, else LeakSiteFound).
/// Returns the top site's frames, leaf first.
async fn leak_site(prefix: &str, command: &str, function: &str) -> Vec<String> {
    leak_site_of(prefix, Leaker::C(command), function).await
}

async fn leak_site_of(prefix: &str, leaker: Leaker<'_>, function: &str) -> Vec<String> {
    let (client, ns) = harness::test_namespace(prefix).await;
    let n = ns.name.as_str();
    let rws = harness::watch_app(&client, n, "w", "leaker").await;
    let command = match leaker {
        Leaker::C(command) => {
            harness::c_workload_pod(&client, n, "leaker", command, "1Gi").await;
            command.to_owned()
        }
        Leaker::CVm(command) => {
            let vm = harness::Placement::Vm;
            harness::c_workload_pod_on(&client, n, "leaker", command, "1Gi", vm).await;
            format!("{command} on {}", harness::VM_NODE)
        }
        Leaker::Node(args) => {
            harness::node_workload_pod(&client, n, "leaker", args, "1Gi").await;
            format!("node {}", args.join(" "))
        }
        Leaker::Python(args) => {
            harness::python_workload_pod(&client, n, "leaker", args, "1Gi").await;
            args.join(" ")
        }
        Leaker::Java(args) => {
            harness::java_workload_pod(&client, n, "leaker", args, "1Gi").await;
            format!("java {}", args.join(" "))
        }
    };
    let listed = status_where(&rws, "w", "the leak listed", 120, |s| {
        s.leaks.iter().any(|l| l.pod == "leaker")
    })
    .await;
    let listed_at = std::time::Instant::now();
    let conf = listed
        .leaks
        .iter()
        .find(|l| l.pod == "leaker")
        .map(|l| l.confidence);
    // The sites are named every 5 s into the capture and shown once two namings agree
    // on the top one; the program's start-up heap growth (charged to the allocator's own
    // frames, which may not be walkable) may weigh more than the leak at first; the goal
    // is the leak's site on top within 60 s.
    let s = status_where(&rws, "w", "the function in the top growth site", 60, |s| {
        s.leaks.iter().any(|l| {
            l.pod == "leaker"
                && l.growth_sites
                    .first()
                    .is_some_and(|g| g.frames.iter().any(|f| frame_is(f, function)))
        })
    })
    .await;
    let named_after = listed_at.elapsed().as_secs_f64();
    let leak = s.leaks.iter().find(|l| l.pod == "leaker").expect("leak");
    let top = leak.growth_sites[0].clone();
    if let Err(e) = wait_for(
        "a LeakDetected or LeakSiteFound Event naming the function",
        Duration::from_secs(30),
        || {
            let client = client.clone();
            async move {
                let events = Api::<Event>::namespaced(client, n)
                    .list(&ListParams::default())
                    .await?;
                Ok(events
                    .items
                    .iter()
                    .any(|e| {
                        matches!(e.reason.as_deref(), Some("LeakDetected" | "LeakSiteFound"))
                            && e.note.as_deref().is_some_and(|t| t.contains(function))
                    })
                    .then_some(()))
            }
        },
    )
    .await
    {
        // What was published instead, to tell a lost Event from one naming another site.
        let events = Api::<Event>::namespaced(client.clone(), n)
            .list(&ListParams::default())
            .await
            .map(|l| {
                l.items
                    .iter()
                    .map(|e| format!("{:?}: {:?}", e.reason, e.note))
                    .collect::<Vec<_>>()
            });
        panic!(
            "no Event names {function}: {e}; the namespace's Events: {events:#?}; top site {top:?}"
        );
    }
    eprintln!(
        "{command} leaking 6.4 MB/s: listed at confidence {conf:?}; top growth site named {named_after:.1} s later: {} ({} %)",
        top.frames.join(" < "),
        top.percent
    );
    ns.delete().await;
    top.frames
}

/// The frames after `function` in `frames` (leaf first): its callers, nearest first.
fn callers<'a>(frames: &'a [String], function: &str) -> &'a [String] {
    let at = frames
        .iter()
        .position(|f| frame_is(f, function))
        .unwrap_or_else(|| panic!("{function} not in {frames:?}"));
    &frames[at + 1..]
}

/// C with frame pointers (node-agent/tests/fixtures/stacks/leak.c, its glibc as a shared
/// library): `leak_here` is named with its callers `keep` and `grow`.
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_leaks_growth_site_names_the_leaking_function() {
    let frames = leak_site("rw-e2e-sites", "/leak-c", "leak_here").await;
    assert_eq!(
        callers(&frames, "leak_here")[..2],
        ["keep", "grow"],
        "{frames:?}"
    );
}

/// Container restarts of the agent DaemonSet's pods, and whether one was OOM-killed.
async fn agent_restarts(client: &Client) -> (i32, bool) {
    let pods = Api::<Pod>::namespaced(client.clone(), SYSTEM)
        .list(&ListParams::default().labels("app.kubernetes.io/name=resourcewatch-agent"))
        .await
        .expect("agent pods");
    assert!(!pods.items.is_empty(), "no agent pod");
    (
        pods.items.iter().map(harness::restarts).sum(),
        pods.items.iter().any(harness::oom_killed),
    )
}

/// A tenant attacking the agent through what it reads (hostile.c): crafted ELF
/// files mapped executable (a sparse file whose .eh_frame declares 1 GiB, a compressed
/// section declaring 1 TiB, a truncated header), a mapped file truncated under its mapping
/// and another replaced by a FIFO, a fake JVM with a slow attach socket, a perf map of 3
/// million lines, and a chroot where the path of its library is an absolute symlink to a
/// file of the node (planted here, with a function name found nowhere else). While it
/// leaks and burns CPU in that library: its leak is listed and its stacks captured, a CPU
/// profile of it succeeds, a well-behaved leak in another namespace keeps being listed
/// and its site named, the agent never restarts and is never OOM-killed, and the node
/// file's function name appears in no status, Event or ConfigMap.
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_hostile_workload_neither_crashes_nor_blinds_the_agent_nor_reads_node_files() {
    let secret_fn = format!("rw_node_secret_{}", std::process::id());
    let dir = format!("/var/tmp/rw-hostile-{}", std::process::id());
    std::fs::create_dir_all(&dir).expect("secret dir");
    let built = Command::new("cc")
        .args(["-O2", "-fno-omit-frame-pointer", "-shared", "-fPIC"])
        .arg(format!("-DTENANT_FN={secret_fn}"))
        .arg("-o")
        .arg(format!("{dir}/secret.so"))
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../node-agent/tests/fixtures/hostile/libtenant.c"
        ))
        .status()
        .expect("cc");
    assert!(built.success(), "building the node's secret file");
    let (client, ns) = harness::test_namespace("rw-e2e-hostile").await;
    let n = ns.name.clone();
    harness::bind_to_operator(&n, "resourcewatch-profiler", SYSTEM)
        .expect("bind the profiler role");
    let (restarts_before, _) = agent_restarts(&client).await;
    let rws = harness::watch_app(&client, &n, "w", "hostile").await;
    harness::hostile_pod(
        &client,
        &n,
        "hostile",
        &format!("/proc/1/root{dir}/secret.so"),
    )
    .await;
    wait_running(&client, &n, &["hostile"]).await;
    // A well-behaved leak elsewhere, started with the attack.
    let (_, other) = harness::test_namespace("rw-e2e-bystander").await;
    let o = other.name.clone();
    let rws2 = harness::watch_app(&client, &o, "w", "leaker").await;
    harness::c_workload_pod(&client, &o, "leaker", "/leak-c", "1Gi").await;
    let s = status_where(
        &rws,
        "w",
        "the hostile pod's leak with its stacks captured",
        180,
        |s| {
            s.leaks
                .iter()
                .any(|l| l.pod == "hostile" && !l.growth_sites.is_empty())
        },
    )
    .await;
    let sites = &s
        .leaks
        .iter()
        .find(|l| l.pod == "hostile")
        .expect("leak")
        .growth_sites;
    eprintln!(
        "hostile growth sites: {:?}",
        sites.iter().map(|g| &g.frames).collect::<Vec<_>>()
    );
    annotate(&rws, "pod=hostile,duration=5s").await;
    let p = profile_done(&rws, "the hostile pod's profile done", 120).await;
    eprintln!(
        "hostile profile: {} samples, hottest {:?}",
        p.samples, p.hottest
    );
    status_where(
        &rws2,
        "w",
        "the bystander's leak site named during the attack",
        180,
        |s| {
            s.leaks.iter().any(|l| {
                l.pod == "leaker"
                    && l.growth_sites
                        .first()
                        .is_some_and(|g| g.frames.iter().any(|f| frame_is(f, "leak_here")))
            })
        },
    )
    .await;
    let (restarts, oom) = agent_restarts(&client).await;
    assert_eq!(
        restarts, restarts_before,
        "the agent restarted during the attack"
    );
    assert!(!oom, "the agent was OOM-killed");
    // Nothing read from the node's file reached anything a tenant can read.
    let mut seen = String::new();
    for (api, ns) in [(&rws, &n), (&rws2, &o)] {
        let w = api.get("w").await.expect("watch");
        seen.push_str(&serde_json::to_string(&w.status).unwrap_or_default());
        let events = Api::<Event>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .expect("events");
        seen.push_str(&serde_json::to_string(&events.items).unwrap_or_default());
        let cms = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .expect("configmaps");
        seen.push_str(&serde_json::to_string(&cms.items).unwrap_or_default());
    }
    assert!(
        seen.contains("libtenant"),
        "the tenant's own library is in what was read"
    );
    assert!(
        !seen.contains(&secret_fn),
        "a function of the node's file reached a tenant: {secret_fn}"
    );
    ns.delete().await;
    other.delete().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Go (frame pointers on amd64, a static binary): `main.leakHere` with its callers.
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_go_leaks_growth_site_names_the_leaking_function_and_its_callers() {
    let frames = leak_site("rw-e2e-sites-go", "/leak-go", "main.leakHere").await;
    let up = callers(&frames, "main.leakHere");
    assert_eq!(up[..2], ["main.grow", "main.keep"], "{frames:?}");
}

/// Rust's release default, no frame pointers (a static binary): `leak_here` is named with
/// its callers, walked with the binary's .eh_frame.
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_rust_leaks_growth_site_without_frame_pointers_names_the_function_and_its_callers() {
    let frames = leak_site("rw-e2e-sites-rs", "/leak-rs", "leak_here").await;
    let up = callers(&frames, "leak_here");
    assert!(
        up.len() >= 2 && frame_is(&up[0], "grow") && frame_is(&up[1], "keep"),
        "{frames:?}"
    );
}

/// C built as distributions build it (-O2, no frame pointers; glibc shared): `leak_here`
/// with its callers `keep` and `grow`, walked with .eh_frame.
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_c_leaks_growth_site_without_frame_pointers_names_the_function_and_its_callers() {
    let frames = leak_site("rw-e2e-sites-c-nofp", "/leak-c-nofp", "leak_here").await;
    assert_eq!(
        callers(&frames, "leak_here")[..2],
        ["keep", "grow"],
        "{frames:?}"
    );
}

/// The same on the VM node: rss_stat, the allocation site capture and .eh_frame
/// unwinding on Linux 6.1 with cgroup v2.
#[tokio::test]
#[ignore = "needs the e2e cluster with its VM node: make e2e"]
async fn on_the_cgroup_v2_node_a_c_leaks_growth_site_names_the_function_and_its_callers() {
    let leaker = Leaker::CVm("/leak-c-nofp");
    let frames = leak_site_of("rw-e2e-sites-c-v2", leaker, "leak_here").await;
    assert_eq!(
        callers(&frames, "leak_here")[..2],
        ["keep", "grow"],
        "{frames:?}"
    );
}

/// Debian's CPython 3.11, no flag (node-agent/tests/fixtures/stacks/leak.py), as a
/// non-root user: the Python function that keeps the bytes is named from the interpreter's
/// frames, which the agent's kernel side reads at each sample, under its Python caller.
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_python_leaks_growth_site_names_the_python_function() {
    let args = ["/usr/bin/python3.11", "-S", "/leak.py"];
    let frames = leak_site_of("rw-e2e-sites-py", Leaker::Python(&args), "leak_in_python").await;
    let up = callers(&frames, "leak_in_python");
    assert!(
        up.iter().any(|f| frame_is(f, "grow_python")),
        "grow_python is not among leak_in_python's callers: {frames:?}"
    );
}

/// OpenJDK 17 (node-agent/tests/fixtures/stacks/Leak.java) with `-XX:+PreserveFramePointer`
/// and no JDK tool run, as a non-root user with /tmp an emptyDir: the agent samples the
/// heap's allocations and asks the JVM for its perf map, so the Java method that makes what
/// is kept is the top site, under its Java caller (the collector's copying left out).
/// `leakInJava` is kept from being inlined (an inlined method is named after its caller).
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_java_leaks_growth_site_names_the_java_method() {
    let args = [
        "-XX:+PreserveFramePointer",
        "-XX:CompileCommand=quiet",
        "-XX:CompileCommand=dontinline,Leak::leakInJava",
        "-Xmx900m",
        "-cp",
        "/",
        "Leak",
    ];
    let frames = leak_site_of("rw-e2e-sites-java", Leaker::Java(&args), "leakInJava").await;
    let up = callers(&frames, "leakInJava");
    assert!(
        up.iter().any(|f| frame_is(f, "growJava")),
        "growJava is not among leakInJava's callers: {frames:?}"
    );
}

/// Node.js with `--perf-basic-prof` (node-agent/tests/fixtures/stacks/leak.js, Buffers kept
/// by `leakInJavaScript`), as a non-root user with /tmp an emptyDir: the JavaScript function
/// is named from the perf map the runtime writes inside its container, with its caller.
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_node_leaks_growth_site_names_the_javascript_function() {
    let args = [
        "--perf-basic-prof",
        "--interpreted-frames-native-stack",
        "/leak.js",
    ];
    let frames = leak_site_of("rw-e2e-sites-node", Leaker::Node(&args), "leakInJavaScript").await;
    let up = callers(&frames, "leakInJavaScript");
    assert!(
        up.iter().any(|f| frame_is(f, "growJs")),
        "growJs is not among leakInJavaScript's callers: {frames:?}"
    );
}

/// CPU of a host process over `window`, from /proc (utime + stime), percent of one core.
/// A process's CPU time (user + system) so far, in seconds, from /proc.
fn proc_cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime");
    ticks as f64 / 100.0 // USER_HZ on Linux
}

#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn the_node_view_lists_every_namespaces_pods_and_the_hosts_processes() {
    use resourcewatch_crds::{ClusterResourceWatch, ProcessOwner};
    let (client, ns) = harness::test_namespace("rw-e2e-nodes").await;
    let n = ns.name.as_str();
    leak_sim_pod(&client, n, "nv-burn", "nv", &["--pattern", "burn"], "64Mi").await;
    leak_sim_pod(
        &client,
        n,
        "nv-mem",
        "nv",
        &["--pattern", "flat", "--size", "300MiB"],
        "512Mi",
    )
    .await;
    wait_running(&client, n, &["nv-burn", "nv-mem"]).await;
    // A process of the host itself, outside Kubernetes: `yes` under its own name.
    let dir = std::env::temp_dir().join(format!("rw-e2e-host-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let burner = dir.join("rwhostburn");
    std::fs::copy("/usr/bin/yes", &burner).expect("copy yes");
    /// Killed however the test ends: a burner left behind would slow every later test.
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let host = Killed(
        std::process::Command::new(&burner)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("host burner"),
    );
    let host_pid = host.0.id();

    every_agent_available(&client).await;
    let view = |name: &str, spec: serde_json::Value| {
        serde_json::json!({
            "apiVersion": "resourcewatch.io/v1alpha1", "kind": "ClusterResourceWatch",
            "metadata": {"name": name}, "spec": spec
        })
        .to_string()
    };
    let (ok, _, err) =
        harness::kubectl_apply(&view("e2e-all", serde_json::json!({"interval": "5s"})));
    assert!(ok, "{err}");
    let (ok, _, err) = harness::kubectl_apply(&view(
        "e2e-none",
        serde_json::json!({"nodeSelector": {"matchLabels": {"rw-e2e": "no-such-node"}}}),
    ));
    assert!(ok, "{err}");
    let applied = std::time::Instant::now();
    let views: Api<ClusterResourceWatch> = Api::all(client.clone());
    // Every node of the cluster (this machine and, when it runs, the cgroup v2 VM node)
    // reports its node-wide tops to the view that selects them all.
    let node_count = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("list nodes")
        .items
        .len() as u32;
    let status = |name: &'static str| {
        let views = views.clone();
        async move { Ok::<_, kube::Error>(views.get(name).await?.status.unwrap_or_default()) }
    };
    let s = wait_for(
        "the node view with the host burner and the pods",
        Duration::from_secs(90),
        || async {
            let s = status("e2e-all").await?;
            let host_seen = s.top_cpu.iter().any(|p| p.process.pid == host_pid);
            let pod_seen = s.top_cpu.iter().any(|p| p.pod == "nv-burn");
            // Its 300 MiB all resident (it touches them after it starts).
            let mem_seen = s
                .top_memory
                .iter()
                .any(|p| p.pod == "nv-mem" && p.process.value > 250.0 * 1048576.0);
            Ok((host_seen && pod_seen && mem_seen && s.reporting_nodes == node_count).then_some(s))
        },
    )
    .await;
    let s = match s {
        Ok(s) => s,
        Err(e) => panic!("{e:#}\nlast: {:#?}", status("e2e-all").await.ok()),
    };
    eprintln!(
        "node view filled {:.0}s after apply",
        applied.elapsed().as_secs_f64()
    );
    assert_eq!(s.selected_nodes, node_count);
    let host_row = s
        .top_cpu
        .iter()
        .find(|p| p.process.pid == host_pid)
        .expect("host burner");
    assert_eq!(host_row.owner, ProcessOwner::Host);
    assert_eq!(host_row.process.command, "rwhostburn");
    assert!(host_row.pod.is_empty() && host_row.namespace.is_empty());
    let pod_row = s
        .top_cpu
        .iter()
        .find(|p| p.pod == "nv-burn")
        .expect("pod burner");
    assert_eq!(
        (
            pod_row.owner,
            pod_row.namespace.as_str(),
            pod_row.container.as_str()
        ),
        (ProcessOwner::Pod, n, "main")
    );
    let mem_row = s
        .top_memory
        .iter()
        .find(|p| p.pod == "nv-mem")
        .expect("pod memory");
    assert!(
        mem_row.process.value > 250.0 * 1048576.0,
        "300 MiB resident: {}",
        mem_row.process.value
    );
    assert!(s.summary.top_host_memory.is_some(), "{:?}", s.summary);
    assert!(
        s.nodes.len() as u32 == node_count
            && s.nodes.iter().all(|n| n.reporting && n.top_cpu.is_some()),
        "{:?}",
        s.nodes
    );
    // Sketch against /proc for the same process. A value is the process's CPU over the
    // agent's last report interval, which the test cannot align with a /proc window, and
    // the burner's share of two loaded cores moves by tens of points from one interval to
    // the next (CI read 33 % in the view against 59 % in /proc over the next 6 s). So the
    // view's values over 30 s of updates are averaged and compared with /proc over the
    // same 30 s. (The first report after the view was applied may cover an interval of
    // the node's earlier 30 s cadence in which the burner ran only its last second: the
    // updates are taken from two intervals of the view's cadence on.)
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (cpu0, t0) = (proc_cpu_seconds(host_pid), std::time::Instant::now());
    let mut values = Vec::new();
    let mut last_update = None;
    while t0.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let s = status("e2e-all").await.expect("status");
        if s.last_update_time == last_update {
            continue;
        }
        last_update = s.last_update_time.clone();
        let host_row = s
            .top_cpu
            .iter()
            .find(|p| p.process.pid == host_pid)
            .unwrap_or_else(|| panic!("the host burner left the view: {:?}", s.top_cpu));
        values.push(host_row.process.value);
    }
    let proc = (proc_cpu_seconds(host_pid) - cpu0) / t0.elapsed().as_secs_f64() * 100.0;
    let mean = values.iter().sum::<f64>() / values.len().max(1) as f64;
    eprintln!(
        "host burner over 30 s: node view {mean:.1}% (mean of {} updates: {values:?}), /proc {proc:.1}%",
        values.len()
    );
    assert!(
        values.len() >= 4,
        "the view was updated {} times in 30 s",
        values.len()
    );
    assert!(
        (mean - proc).abs() <= 20.0,
        "node view {mean:.1}% (mean of {values:?}) against /proc {proc:.1}%"
    );
    let none = status("e2e-none").await.expect("status");
    assert_eq!(
        (none.selected_nodes, none.top_cpu.len()),
        (0, 0),
        "{none:?}"
    );

    // Who may read it: nobody without the viewer ClusterRole, a bound user may, and it
    // grants nothing else.
    let who = "--as=rw-e2e-viewer";
    let (ok, out) = kubectl(&["get", "clusterresourcewatches", who]);
    assert!(!ok && out.contains("forbidden"), "{out}");
    let (ok, out) = kubectl(&[
        "create",
        "clusterrolebinding",
        "rw-e2e-viewer",
        "--clusterrole=resourcewatch-node-viewer",
        "--user=rw-e2e-viewer",
    ]);
    assert!(ok, "{out}");
    let allowed = wait_for(
        "the binding to take effect",
        Duration::from_secs(20),
        || async {
            let (ok, out) = kubectl(&["get", "crw", "-o", "wide", who]);
            Ok(ok.then_some(out))
        },
    )
    .await
    .expect("a bound viewer reads the node view");
    eprintln!("{allowed}");
    // The view's own row with its top process (which one is on top depends on what else
    // runs: with the VM node, this machine's busiest process is its QEMU).
    assert!(
        allowed
            .lines()
            .any(|l| l.starts_with("e2e-all") && l.contains('%')),
        "{allowed}"
    );
    let (ok, out) = kubectl(&["get", "resourcewatches", "-A", who]);
    assert!(!ok && out.contains("forbidden"), "{out}");
    let _ = kubectl(&["delete", "clusterrolebinding", "rw-e2e-viewer"]);

    // Without host processes: only pods remain.
    let (ok, _, err) = harness::kubectl_apply(&view(
        "e2e-all",
        serde_json::json!({"interval": "5s", "includeHostProcesses": false}),
    ));
    assert!(ok, "{err}");
    wait_for(
        "host processes to leave the view",
        Duration::from_secs(30),
        || async {
            let s = status("e2e-all").await?;
            Ok(
                (!s.top_cpu.is_empty() && s.top_cpu.iter().all(|p| p.owner == ProcessOwner::Pod))
                    .then_some(()),
            )
        },
    )
    .await
    .expect("only pods");
    drop(host);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = kubectl(&["delete", "clusterresourcewatch", "e2e-all", "e2e-none"]);
    ns.delete().await;
}

/// A profile of the fixture `command` (a CPU burner in the C workloads image, run as a
/// non-root user) asked for on the watch for 5 s: it succeeds, its five hottest
/// functions and its ConfigMap. The watch `w` selects the pod `burner`.
async fn profiled(
    prefix: &str,
    command: &str,
) -> (
    Client,
    harness::TestNamespace,
    Api<ResourceWatch>,
    resourcewatch_crds::ProfileStatus,
    k8s_openapi::api::core::v1::ConfigMap,
) {
    profiled_of(prefix, Leaker::C(command)).await
}

/// [`profiled`] for any program a leak-site test runs.
async fn profiled_of(
    prefix: &str,
    program: Leaker<'_>,
) -> (
    Client,
    harness::TestNamespace,
    Api<ResourceWatch>,
    resourcewatch_crds::ProfileStatus,
    k8s_openapi::api::core::v1::ConfigMap,
) {
    let (client, ns) = harness::test_namespace(prefix).await;
    let n = ns.name.clone();
    // The operator may write ConfigMaps only where a namespace admin let it.
    harness::bind_to_operator(&n, "resourcewatch-profiler", "resourcewatch-system")
        .expect("bind the profiler role");
    let rws = harness::watch_app(&client, &n, "w", "burner").await;
    let command = match program {
        Leaker::C(command) => {
            harness::c_workload_pod(&client, &n, "burner", command, "64Mi").await;
            command.to_owned()
        }
        Leaker::CVm(command) => {
            let vm = harness::Placement::Vm;
            harness::c_workload_pod_on(&client, &n, "burner", command, "64Mi", vm).await;
            format!("{command} on {}", harness::VM_NODE)
        }
        Leaker::Node(args) => {
            harness::node_workload_pod(&client, &n, "burner", args, "256Mi").await;
            format!("node {}", args.join(" "))
        }
        Leaker::Python(args) => {
            harness::python_workload_pod(&client, &n, "burner", args, "64Mi").await;
            args.join(" ")
        }
        Leaker::Java(args) => {
            harness::java_workload_pod(&client, &n, "burner", args, "256Mi").await;
            format!("java {}", args.join(" "))
        }
    };
    wait_running(&client, &n, &["burner"]).await;
    status_where(&rws, "w", "the burner in topCPU", 60, |s| {
        s.top_cpu.iter().any(|e| e.pod == "burner")
    })
    .await;
    let asked = std::time::Instant::now();
    annotate(&rws, "pod=burner,duration=5s").await;
    let p = profile_done(&rws, "the profile done", 90).await;
    // 5 s at 99 Hz of a process on a CPU all the time: about 500 samples. On the VM node
    // the burner shares two emulated CPUs with that node's kubelet and agent.
    let least = if matches!(program, Leaker::CVm(_)) {
        150
    } else {
        300
    };
    assert!((least..=600).contains(&p.samples), "{} samples", p.samples);
    let cm = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), &n)
        .get(p.config_map.as_deref().expect("a ConfigMap"))
        .await
        .expect("the profile's ConfigMap");
    eprintln!(
        "profile of {command}: {} samples, hottest {:?}, Succeeded {:.1} s after the annotation",
        p.samples,
        p.hottest,
        asked.elapsed().as_secs_f64()
    );
    (client, ns, rws, p, cm)
}

/// The profile of watch `w` once it is no longer pending; it must have succeeded.
async fn profile_done(
    rws: &Api<ResourceWatch>,
    what: &str,
    secs: u64,
) -> resourcewatch_crds::ProfileStatus {
    use resourcewatch_crds::ProfileState;
    let s = status_where(rws, "w", what, secs, |s| {
        s.profile
            .as_ref()
            .is_some_and(|p| p.state != ProfileState::Pending)
    })
    .await;
    let p = s.profile.expect("profile");
    assert_eq!(p.state, ProfileState::Succeeded, "{p:?}");
    p
}

async fn annotate(rws: &Api<ResourceWatch>, value: &str) {
    let patch = serde_json::json!({"metadata": {"annotations": {
        resourcewatch_crds::PROFILE_ANNOTATION: value}}});
    rws.patch("w", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("annotate");
}

fn folded(cm: &k8s_openapi::api::core::v1::ConfigMap) -> String {
    cm.data
        .as_ref()
        .and_then(|d| d.get("profile.folded").cloned())
        .unwrap_or_default()
}

/// A CPU profile asked for on the watch (`resourcewatch.io/profile`): a C program burning
/// a core in `burn_here`, reached through `outer` and `middle` (frame pointers), run as a
/// non-root user, profiled for 5 s at 99 Hz. The status says Succeeded with `burn_here`
/// the hottest function, the ConfigMap holds folded stacks naming the call path, an SVG
/// flame graph and gzipped pprof, and an Event says where it is. The same annotation value
/// is not taken twice; a new one within the namespace's minute is refused, with an Event.
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_profile_asked_for_on_the_watch_names_the_hot_function() {
    use resourcewatch_crds::ProfileState;
    let (client, ns, rws, p, cm) = profiled("rw-e2e-profile", "/burn-c").await;
    let n = ns.name.as_str();
    assert_eq!(p.hottest[0].function, "burn_here", "{:?}", p.hottest);
    assert!(p.hottest[0].percent >= 80.0, "{:?}", p.hottest);
    let folded = folded(&cm);
    assert!(
        folded
            .lines()
            .any(|l| l.contains("main;outer;middle;burn_here")),
        "{folded}"
    );
    let data = cm.data.unwrap_or_default();
    assert!(
        data["profile.svg"].contains("burn_here"),
        "an SVG naming it"
    );
    let pprof = &cm.binary_data.unwrap_or_default()["profile.pb.gz"];
    assert_eq!(pprof.0[..2], [0x1f, 0x8b], "gzipped pprof");
    harness::event_where(&client, n, "ProfileSucceeded", 30, |t| {
        t.contains("burn_here")
    })
    .await;
    // The value stays on the watch: it is not taken again.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let again = rws.get("w").await.expect("rw").status.unwrap_or_default();
    assert_eq!(again.profile.map(|x| x.id), Some(p.id));
    // A new value within the namespace's minute: refused, and said so.
    annotate(&rws, "pod=burner,duration=5s,request=2").await;
    let s = status_where(&rws, "w", "the second request refused", 30, |s| {
        s.profile
            .as_ref()
            .is_some_and(|p| p.state == ProfileState::Refused)
    })
    .await;
    assert!(
        s.profile
            .expect("profile")
            .message
            .contains("one profile per namespace")
    );
    wait_for("a ProfileRefused Event", Duration::from_secs(30), || {
        let client = client.clone();
        async move {
            Ok((!harness::events(&client, n, "ProfileRefused")
                .await
                .is_empty())
            .then_some(()))
        }
    })
    .await
    .expect("ProfileRefused");
    // Deleting and recreating the watch does not reset the namespace's minute.
    rws.delete("w", &Default::default()).await.expect("delete");
    wait_for("the watch gone", Duration::from_secs(30), || {
        let rws = rws.clone();
        async move { Ok(rws.get_opt("w").await?.is_none().then_some(())) }
    })
    .await
    .expect("gone");
    let rws = harness::watch_app(&client, n, "w", "burner").await;
    annotate(&rws, "pod=burner,duration=5s,request=3").await;
    let s = status_where(
        &rws,
        "w",
        "the recreated watch's request refused",
        30,
        |s| {
            s.profile
                .as_ref()
                .is_some_and(|p| p.state != ProfileState::Pending)
        },
    )
    .await;
    let p = s.profile.expect("profile");
    assert_eq!(p.state, ProfileState::Refused, "{p:?}");
    assert!(p.message.contains("one profile per namespace"), "{p:?}");
    ns.delete().await;
}

/// A profile's result never replaces an object the watch does not own: with a ConfigMap
/// `w-profile` already there (someone else's), the profile fails saying so and the
/// ConfigMap is untouched.
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_profile_never_overwrites_a_configmap_it_does_not_own() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use resourcewatch_crds::ProfileState;
    let (client, ns) = harness::test_namespace("rw-e2e-profile-owner").await;
    let n = ns.name.clone();
    harness::bind_to_operator(&n, "resourcewatch-profiler", "resourcewatch-system")
        .expect("bind the profiler role");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &n);
    let theirs: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "w-profile"}, "data": {"settings": "keep me"}
    }))
    .expect("cm");
    cms.create(&PostParams::default(), &theirs)
        .await
        .expect("someone else's ConfigMap");
    let rws = harness::watch_app(&client, &n, "w", "burner").await;
    harness::c_workload_pod(&client, &n, "burner", "/burn-c", "64Mi").await;
    wait_running(&client, &n, &["burner"]).await;
    status_where(&rws, "w", "the burner in topCPU", 60, |s| {
        s.top_cpu.iter().any(|e| e.pod == "burner")
    })
    .await;
    annotate(&rws, "pod=burner,duration=2s").await;
    let s = status_where(&rws, "w", "the profile done", 90, |s| {
        s.profile
            .as_ref()
            .is_some_and(|p| p.state != ProfileState::Pending)
    })
    .await;
    let p = s.profile.expect("profile");
    assert_eq!(p.state, ProfileState::Failed, "{p:?}");
    assert!(p.message.contains("does not own"), "{p:?}");
    let after = cms.get("w-profile").await.expect("still there");
    assert_eq!(
        after
            .data
            .unwrap_or_default()
            .get("settings")
            .map(String::as_str),
        Some("keep me")
    );
    assert!(
        after
            .metadata
            .owner_references
            .unwrap_or_default()
            .is_empty()
    );
    ns.delete().await;
}

/// Go (frame pointers): the profile's hottest function is `main.burnHere`, and its folded
/// stacks hold the whole call path.
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_go_profile_names_the_hot_function_and_its_callers() {
    let (_client, ns, _rws, p, cm) = profiled("rw-e2e-profile-go", "/burn-go").await;
    assert_eq!(p.hottest[0].function, "main.burnHere", "{:?}", p.hottest);
    assert!(p.hottest[0].percent >= 80.0, "{:?}", p.hottest);
    let folded = folded(&cm);
    assert!(
        folded
            .lines()
            .any(|l| l.contains("main.outer;main.middle;main.burnHere")),
        "{folded}"
    );
    ns.delete().await;
}

/// Samples of folded stacks (`a;b;c N` lines) whose frames include, in this order, frames
/// that are each of `path` (`frame_is`).
fn folded_samples_through(folded: &str, path: &[&str]) -> (u64, u64) {
    let (mut with, mut all) = (0, 0);
    for line in folded.lines() {
        let Some((stack, n)) = line.rsplit_once(' ') else {
            continue;
        };
        let n: u64 = n.parse().unwrap_or(0);
        all += n;
        let mut frames = stack.split(';');
        if path.iter().all(|p| frames.any(|f| frame_is(f, p))) {
            with += n;
        }
    }
    (with, all)
}

/// Rust without frame pointers: the hottest function is `burn_here`, and its stacks are
/// walked with .eh_frame through `middle` and `outer` to `main`.
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_rust_profile_without_frame_pointers_names_the_hot_function_and_its_callers() {
    let (_client, ns, _rws, p, cm) = profiled("rw-e2e-profile-rs", "/burn-rs").await;
    assert!(
        frame_is(&p.hottest[0].function, "burn_here"),
        "{:?}",
        p.hottest
    );
    assert!(p.hottest[0].percent >= 80.0, "{:?}", p.hottest);
    let (with, all) =
        folded_samples_through(&folded(&cm), &["main", "outer", "middle", "burn_here"]);
    assert!(with * 10 >= all * 8, "{with} of {all}: {}", folded(&cm));
    ns.delete().await;
}

/// C at -O2 without frame pointers: `burn_here` under `middle`, `outer` and `main`.
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_c_profile_without_frame_pointers_names_the_hot_function_and_its_callers() {
    let (_client, ns, _rws, p, cm) = profiled("rw-e2e-profile-c-nofp", "/burn-c-nofp").await;
    c_profile_names_burn_here(ns, p, cm).await;
}

/// The same on the VM node: its agent's perf events and .eh_frame unwinding on Linux 6.1.
#[tokio::test]
#[ignore = "needs the e2e cluster with its VM node: make e2e"]
async fn on_the_cgroup_v2_node_a_c_profile_names_the_hot_function_and_its_callers() {
    let (_client, ns, _rws, p, cm) =
        profiled_of("rw-e2e-profile-c-v2", Leaker::CVm("/burn-c-nofp")).await;
    c_profile_names_burn_here(ns, p, cm).await;
}

async fn c_profile_names_burn_here(
    ns: harness::TestNamespace,
    p: resourcewatch_crds::ProfileStatus,
    cm: k8s_openapi::api::core::v1::ConfigMap,
) {
    assert_eq!(p.hottest[0].function, "burn_here", "{:?}", p.hottest);
    assert!(p.hottest[0].percent >= 80.0, "{:?}", p.hottest);
    let folded = folded(&cm);
    assert!(
        folded
            .lines()
            .any(|l| l.contains("main;outer;middle;burn_here")),
        "{folded}"
    );
    ns.delete().await;
}

/// CPython 3.12+ with `-X perf` (its perf map, in the pod's /tmp) and Debian's 3.11 with
/// no flag (its frames, read by the kernel): the Python function burning the CPU is on
/// >= 80 % of the samples, under its Python caller (the leaf is the interpreter's C code:
/// "self" time stays honest).
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_python_profile_names_the_python_function_and_its_caller() {
    // Two namespaces: one profile per namespace per minute.
    for (prefix, argv) in [
        (
            "rw-e2e-profile-py",
            &["/usr/local/bin/python3", "-S", "-X", "perf", "/burn.py"][..],
        ),
        (
            "rw-e2e-profile-py311",
            &["/usr/bin/python3.11", "-S", "/burn.py"][..],
        ),
    ] {
        python_profile_names_burn_in_python(prefix, argv).await;
    }
}

async fn python_profile_names_burn_in_python(prefix: &str, args: &[&str]) {
    let (_client, ns, _rws, _p, cm) = profiled_of(prefix, Leaker::Python(args)).await;
    let folded = folded(&cm);
    let (with, all) = folded_samples_through(&folded, &["outer_python", "burn_in_python"]);
    assert!(with * 10 >= all * 8, "{with} of {all}: {folded}");
    ns.delete().await;
}

/// Node.js with `--perf-basic-prof` (node-agent/tests/fixtures/stacks/burn.js): the
/// JavaScript function burning the CPU is on >= 80 % of the samples, under its caller,
/// named from the perf map V8 writes in the pod's /tmp.
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_node_profile_names_the_javascript_function_and_its_caller() {
    let args = [
        "--perf-basic-prof",
        "--interpreted-frames-native-stack",
        "/burn.js",
    ];
    let (_client, ns, _rws, _p, cm) = profiled_of("rw-e2e-profile-node", Leaker::Node(&args)).await;
    let folded = folded(&cm);
    let (with, all) = folded_samples_through(&folded, &["outerJs", "burnInJavaScript"]);
    assert!(with * 10 >= all * 8, "{with} of {all}: {folded}");
    ns.delete().await;
}

/// OpenJDK 17 with `-XX:+PreserveFramePointer` and no JDK tool run: the agent asks the
/// JVM for its perf map, and the Java method burning the CPU is on >= 80 % of the samples,
/// under its Java caller.
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_java_profile_names_the_java_method_and_its_caller() {
    let args = [
        "-XX:+PreserveFramePointer",
        "-XX:CompileCommand=quiet",
        "-XX:CompileCommand=dontinline,Burn::burnInJava",
        "-cp",
        "/",
        "Burn",
    ];
    let (_client, ns, _rws, _p, cm) = profiled_of("rw-e2e-profile-java", Leaker::Java(&args)).await;
    let folded = folded(&cm);
    let (with, all) = folded_samples_through(&folded, &["outerJava", "burnInJava"]);
    assert!(with * 10 >= all * 8, "{with} of {all}: {folded}");
    ns.delete().await;
}

/// The processes of a pod's containers on this node (its sandbox's pause excluded), found
/// by the pod's UID in their cgroup paths (cgroupfs or systemd driver, v1 or v2).
fn pod_pids(uid: &str) -> Vec<i32> {
    let (dashed, underscored) = (uid.to_owned(), uid.replace('-', "_"));
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc") {
        let Some(pid) = entry
            .ok()
            .and_then(|e| e.file_name().to_str()?.parse::<i32>().ok())
        else {
            continue;
        };
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if (cgroup.contains(&dashed) || cgroup.contains(&underscored)) && comm.trim() != "pause" {
            pids.push(pid);
        }
    }
    pids
}

/// Processes stopped with SIGSTOP (a frozen or partitioned replica: its sockets stay open,
/// nothing answers), continued when dropped, so a failed assertion leaves no operator
/// stopped for the tests after it.
struct Stopped(Vec<i32>);

impl Stopped {
    fn new(pids: Vec<i32>) -> Self {
        for &p in &pids {
            // SAFETY: kill(2) with a pid read from /proc and a valid signal number.
            assert_eq!(unsafe { libc::kill(p, libc::SIGSTOP) }, 0, "SIGSTOP {p}");
        }
        Self(pids)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        for &p in &self.0 {
            // SAFETY: as above; a pid gone since is harmless (ESRCH).
            unsafe { libc::kill(p, libc::SIGCONT) };
        }
    }
}

/// The operator's own metric `name` on one replica, read from its pod address directly
/// (not through the Service, which only reaches the leader), as Prometheus would: HTTPS
/// against the operator's CA, with a token allowed to get /metrics.
async fn replica_metric(pod: &Pod, name: &str, token: &str, ca: &str) -> Option<f64> {
    let ip = pod.status.as_ref()?.pod_ip.clone()?;
    let addr = format!("{ip}:8080").parse().ok()?;
    let (code, body) = tokio::time::timeout(
        Duration::from_secs(5),
        harness::https_get(addr, "resourcewatch-operator", ca, Some(token), "/metrics"),
    )
    .await
    .ok()?
    .ok()?;
    (code == 200).then_some(())?;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

async fn operator_pods(client: &Client) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), SYSTEM)
        .list(&ListParams::default().labels("app.kubernetes.io/name=resourcewatch-operator"))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

/// The pods the operator Service's one EndpointSlice names (its endpoints' targetRefs),
/// each with its address, which must be that pod's own.
async fn published_leader(client: &Client, pods: &[Pod]) -> Vec<String> {
    let slice =
        Api::<k8s_openapi::api::discovery::v1::EndpointSlice>::namespaced(client.clone(), SYSTEM)
            .get_opt("resourcewatch-operator")
            .await
            .ok()
            .flatten();
    slice
        .map(|s| s.endpoints)
        .unwrap_or_default()
        .iter()
        .map(|e| {
            let name = e
                .target_ref
                .as_ref()
                .and_then(|r| r.name.clone())
                .unwrap_or_default();
            let ip = pods
                .iter()
                .find(|p| p.name_any() == name)
                .and_then(|p| p.status.as_ref()?.pod_ip.clone());
            // An address that is not the named pod's would send agents elsewhere.
            if ip.is_some_and(|ip| e.addresses == [ip]) {
                name
            } else {
                format!("{name} (address {:?} is not its pod's)", e.addresses)
            }
        })
        .collect()
}

async fn lease(client: &Client) -> k8s_openapi::api::coordination::v1::LeaseSpec {
    Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), SYSTEM)
        .get("resourcewatch-operator")
        .await
        .ok()
        .and_then(|l| l.spec)
        .unwrap_or_default()
}

async fn lease_holder(client: &Client) -> String {
    lease(client).await.holder_identity.unwrap_or_default()
}

/// From `t0` until a replica other than `not` holds the Lease, is the only endpoint of
/// the Service, has the node's agent connected, and the watch has a status written after that
/// with the node reporting. Returns that replica and the seconds after `t0` at which it
/// took the Lease, had the agent, and its status was seen.
async fn followed(
    client: &Client,
    rws: &Api<ResourceWatch>,
    not: &str,
    t0: std::time::Instant,
    scraper: (&str, &str),
) -> (String, f64, f64, f64) {
    let (mut lease, mut agent): (Option<(String, f64)>, Option<f64>) = (None, None);
    let (token, ca) = scraper;
    let before = rws
        .get("w")
        .await
        .ok()
        .and_then(|r| r.status?.last_update_time);
    let deadline = Duration::from_secs(90);
    loop {
        assert!(
            t0.elapsed() < deadline,
            "after {deadline:?}: Lease taken at {lease:?} s, agent connected at {agent:?} s"
        );
        if lease.is_none() {
            let holder = lease_holder(client).await;
            if !holder.is_empty() && holder != not {
                lease = Some((holder, t0.elapsed().as_secs_f64()));
            }
        }
        let pods = operator_pods(client).await;
        if let Some((pod, _)) = &lease
            && agent.is_none()
            && published_leader(client, &pods).await == std::slice::from_ref(pod)
        {
            let connected = match pods.iter().find(|p| p.name_any() == *pod) {
                Some(p) => {
                    replica_metric(p, "resourcewatch_operator_agents_connected", token, ca).await
                }
                None => None,
            };
            if connected.is_some_and(|c| c >= 1.0) {
                agent = Some(t0.elapsed().as_secs_f64());
            }
        }
        if let (Some((pod, l)), Some(a)) = (&lease, agent) {
            let s = rws.get("w").await.ok().and_then(|r| r.status);
            if s.as_ref().is_some_and(|s| {
                s.last_update_time != before && s.reporting_nodes == 1 && !s.top_cpu.is_empty()
            }) {
                return (pod.clone(), *l, a, t0.elapsed().as_secs_f64());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_standby_takes_over_a_frozen_leader_within_the_lease_and_the_agent_follows() {
    let (client, ns, rws) = burning_watch("rw-e2e-failover").await;
    let deploys: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), SYSTEM);
    let scale = |replicas: i32| {
        let deploys = deploys.clone();
        async move {
            let body = serde_json::json!({"spec": {"replicas": replicas}});
            deploys
                .patch(
                    "resourcewatch-operator",
                    &PatchParams::default(),
                    &Patch::Merge(&body),
                )
                .await
                .unwrap_or_else(|e| panic!("{replicas} operator replica(s): {e}"));
        }
    };
    scale(2).await;
    let ready = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    let (leader, standby) = wait_for(
        "two Ready replicas, the Service's endpoint the leader's",
        Duration::from_secs(120),
        || {
            let client = client.clone();
            async move {
                let pods = operator_pods(&client).await;
                let holder = lease_holder(&client).await;
                let ok = pods.len() == 2
                    && pods.iter().all(ready)
                    && published_leader(&client, &pods).await == [holder.clone()];
                let standby = pods.iter().map(|p| p.name_any()).find(|p| *p != holder);
                Ok(ok
                    .then(|| pods.into_iter().find(|p| p.name_any() == holder))
                    .flatten()
                    .zip(standby))
            }
        },
    )
    .await
    .expect("a leader and a standby");
    let uid = leader.metadata.uid.clone().expect("uid");
    let pids = pod_pids(&uid);
    assert!(
        !pids.is_empty(),
        "no process of the leader {} found in /proc",
        leader.name_any()
    );

    let token = harness::token_with_role(
        &client,
        SYSTEM,
        "e2e-scraper",
        Some("resourcewatch-metrics-reader"),
    )
    .await
    .expect("a token for /metrics");
    let ca = harness::ca_bundle(&client).await;
    // The leader stops answering, its sockets open: no reset reaches the agent.
    let t0 = std::time::Instant::now();
    let stopped = Stopped::new(pids);
    // The frozen leader's last renewal (one already sent lands within a moment).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let frozen = lease(&client).await;
    let (taker, lease_s, agent, status) =
        followed(&client, &rws, &leader.name_any(), t0, (&token, &ca)).await;
    assert_eq!(taker, standby, "the standby took the Lease");
    let taken = lease(&client).await;
    // Both times are written by the API server's clients on this one machine.
    let after_renewal = match (&frozen.renew_time, &taken.acquire_time) {
        (Some(r), Some(a)) => a.0.duration_since(r.0).as_secs_f64(),
        _ => panic!("no renewTime {frozen:?} or acquireTime {taken:?}"),
    };
    let duration = f64::from(frozen.lease_duration_seconds.unwrap_or(15));
    eprintln!(
        "frozen leader: Lease taken by the standby at {lease_s:.1} s ({after_renewal:.1} s after \
         its last renewal, Lease {duration} s), agent connected to it at {agent:.1} s, its first \
         status at {status:.1} s "
    );
    assert!(
        after_renewal <= duration + 1.0,
        "the standby took the {duration} s Lease {after_renewal:.1} s after its last renewal"
    );
    // The old leader continues: it must step down, not take the Lease or the endpoint back.
    drop(stopped);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let pods = operator_pods(&client).await;
    assert_eq!(
        published_leader(&client, &pods).await,
        std::slice::from_ref(&standby),
        "after the old leader continued"
    );
    assert_eq!(lease_holder(&client).await, standby);

    // A graceful handover: the new leader's pod is deleted; it releases the Lease.
    let t1 = std::time::Instant::now();
    Api::<Pod>::namespaced(client.clone(), SYSTEM)
        .delete(&standby, &DeleteParams::default())
        .await
        .expect("delete the leader's pod");
    // The other replica, or the one the Deployment makes in place of the deleted one.
    let (_, lease2, agent2, status2) = followed(&client, &rws, &standby, t1, (&token, &ca)).await;
    eprintln!(
        "deleted leader: Lease taken at {lease2:.1} s, agent connected at {agent2:.1} s, \
         first status at {status2:.1} s "
    );
    assert!(
        lease2 <= 5.0,
        "a released Lease taken {lease2:.1} s after the delete"
    );
    assert!(
        agent - lease_s <= 10.0 && agent2 - lease2 <= 10.0,
        "agents reached the new leader {:.1} s / {:.1} s after it took the Lease",
        agent - lease_s,
        agent2 - lease2
    );
    scale(1).await;
    wait_for("one operator replica", Duration::from_secs(120), || {
        let client = client.clone();
        async move { Ok((operator_pods(&client).await.len() == 1).then_some(())) }
    })
    .await
    .expect("one replica");
    ns.delete().await;
}

/// The collector a test runs, killed when dropped.
struct Collector(std::process::Child);

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A CPU profile sent on to the cluster's OTLP collector, named by the Secret
/// `resourcewatch-otlp` in the operator's namespace (read at each export: no restart). An
/// OpenTelemetry Collector built from its Go modules (`e2e/otel/collector.sh`) runs on
/// this machine with the profiles feature gate and prints what it receives (its debug
/// exporter, detailed): the profile arrives with its pod's namespace, name and node as
/// resource attributes, its container and PID on the samples, the hot function and the
/// program's file with its GNU build ID in the dictionary. Then a leak in the same
/// namespace: once its growth site is announced, its sites arrive as a memory profile
/// (`resident_growth`) with the leaking pod's labels and the site's functions.
#[tokio::test]
#[ignore = "needs the e2e cluster with resourcewatch installed: make e2e"]
async fn a_profile_is_sent_to_the_clusters_otlp_collector_with_its_pods_labels() {
    use k8s_openapi::api::core::v1::Secret;
    let bin = std::env::var("RW_OTELCOL").expect(
        "RW_OTELCOL: the collector e2e/otel/collector.sh build makes (run-cluster-tests.sh sets it)",
    );
    let client = harness::client().await.expect("cluster");
    // The operator reaches this machine at the address of the node it runs on.
    let operator = Api::<Pod>::namespaced(client.clone(), SYSTEM)
        .list(&ListParams::default().labels("app.kubernetes.io/name=resourcewatch-operator"))
        .await
        .expect("operator pods");
    let host_ip = operator
        .items
        .iter()
        .find_map(|p| p.status.as_ref()?.host_ip.clone())
        .expect("the operator's node address");
    let port = std::net::TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let dir = tempfile_dir("rw-e2e-otelcol");
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "receivers:\n  otlp:\n    protocols:\n      grpc:\n        endpoint: 0.0.0.0:{port}\n\
             exporters:\n  debug:\n    verbosity: detailed\n\
             service:\n  telemetry:\n    metrics:\n      level: none\n  pipelines:\n    profiles:\n      \
             receivers: [otlp]\n      exporters: [debug]\n"
        ),
    )
    .expect("collector config");
    let out = dir.join("received.log");
    let log = std::fs::File::create(&out).expect("collector log");
    let _collector = Collector(
        Command::new(&bin)
            .arg(format!("--config=file:{}", config.display()))
            .arg("--feature-gates=service.profilesSupport")
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("the collector starts"),
    );
    let read = || std::fs::read_to_string(&out).unwrap_or_default();
    wait_for("the collector ready", Duration::from_secs(30), || async {
        Ok(read().contains("Everything is ready").then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", read()));
    let secrets: Api<Secret> = Api::namespaced(client.clone(), SYSTEM);
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "resourcewatch-otlp"},
        "stringData": {
            "endpoint": format!("http://{host_ip}:{port}"),
            "headers": "x-scope-orgid: e2e",
        }
    }))
    .expect("secret");
    let _ = secrets
        .delete("resourcewatch-otlp", &DeleteParams::default())
        .await;
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("create the Secret");
    let (_client, ns, _rws, p, _cm) = profiled("rw-e2e-otlp", "/burn-c").await;
    let n = ns.name.clone();
    let wanted = [
        format!("k8s.namespace.name: Str({n})"),
        "k8s.pod.name: Str(burner)".to_owned(),
        format!("k8s.node.name: Str({})", p.node),
        "k8s.container.name: Str(main)".to_owned(),
        "process.pid: Int(".to_owned(),
        "burn_here".to_owned(),
        "/burn-c".to_owned(),
        "process.executable.build_id.gnu".to_owned(),
    ];
    let arrived = |what: &'static str, wanted: Vec<String>| async move {
        let got = wait_for(what, Duration::from_secs(30), || async {
            let text = read();
            Ok(wanted
                .iter()
                .all(|w| text.contains(w.as_str()))
                .then_some(()))
        })
        .await;
        if let Err(e) = got {
            let text = read();
            let missing: Vec<_> = wanted
                .iter()
                .filter(|w| !text.contains(w.as_str()))
                .collect();
            panic!("{e:#}; missing {missing:?} from what the collector printed:\n{text}");
        }
    };
    arrived("the CPU profile at the collector", wanted.to_vec()).await;
    eprintln!(
        "profile {} of {n}/burner received by the collector over OTLP",
        p.id
    );
    // A leak's growth sites, once a site is announced: a memory profile of the bytes each
    // stack added.
    let leaks = harness::watch_app(&client, &n, "wl", "leaker").await;
    harness::c_workload_pod(&client, &n, "leaker", "/leak-c", "1Gi").await;
    // Announced once its top site names a function (status::announced_site).
    let named = |l: &resourcewatch_crds::LeakEntry| -> Vec<String> {
        l.growth_sites
            .first()
            .map(|g| {
                g.frames
                    .iter()
                    .filter(|f| !f.starts_with('['))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    };
    let s = status_where(&leaks, "wl", "the leak's growth site named", 180, |s| {
        s.leaks
            .iter()
            .any(|l| l.pod == "leaker" && !named(l).is_empty())
    })
    .await;
    let leak = s.leaks.iter().find(|l| l.pod == "leaker").expect("leak");
    arrived(
        "the growth sites at the collector",
        vec![
            "k8s.pod.name: Str(leaker)".to_owned(),
            "resident_growth".to_owned(),
        ],
    )
    .await;
    // The sites sent are those of the announcement, a reconcile or two before this
    // status: one of the top site's functions is among them.
    let functions = named(leak);
    let text = read();
    assert!(
        functions.iter().any(|f| text.contains(f.as_str())),
        "none of {functions:?} in what the collector printed:\n{text}"
    );
    eprintln!(
        "growth sites of {n}/leaker received by the collector over OTLP (top: {:?})",
        leak.growth_sites[0].frames
    );
    let _ = secrets
        .delete("resourcewatch-otlp", &DeleteParams::default())
        .await;
    ns.delete().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh directory under the system's temporary one.
fn tempfile_dir(prefix: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}
