//! The cgroup v2 node (a QEMU VM, Linux 6.1) in the cluster: its pods reach the others and the operator, and one watch aggregates both nodes.

use super::*;

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
    eprintln!("burn-vm at {}% of a core", burn.process.value);
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
