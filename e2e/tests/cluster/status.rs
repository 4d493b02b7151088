//! The sample and the status: Top-K of the selected pods, conditions and Events when an agent is lost and recovers, an operator restart that repeats no Event.

use super::*;

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
pub(crate) async fn burning_watch(
    prefix: &str,
) -> (Client, harness::TestNamespace, Api<ResourceWatch>) {
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
pub(crate) async fn every_agent_available(client: &Client) {
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
