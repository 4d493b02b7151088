//! Leaks and OOM kills: a leak listed with its time to OOM before the kernel kills it, limits (the container's, the pod's), kills graded (predicted or not, in a sidecar or an init container, of a pod deleted right after, system-wide).

use super::*;

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

pub(crate) async fn pod_level_limit_is_used(prefix: &str, node: harness::Placement) {
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

pub(crate) async fn leak_listed_before_its_oom_kill(prefix: &str, node: harness::Placement) {
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
/// System and the node's memory as its limit, told apart from a cgroup's, and an Event
/// says so (whether it was predicted depends on the emulated node's speed); the node stays
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
    // The limit it ran into is the node's memory (the VM's MemTotal, under its 3 GiB).
    assert!(
        k.limit_bytes.is_some_and(|l| l > 2 << 30 && l <= 3 << 30),
        "{k:?}"
    );
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
