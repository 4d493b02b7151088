//! Operator failover: a standby takes over a frozen leader within the Lease, and the agent follows.

use super::*;

/// The processes of a pod's containers on this node (its sandbox's pause excluded), found
/// by the pod's UID in their cgroup paths (cgroupfs or systemd driver, v1 or v2).
pub(crate) fn pod_pids(uid: &str) -> Vec<i32> {
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
pub(crate) struct Stopped(Vec<i32>);

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
pub(crate) async fn replica_metric(pod: &Pod, name: &str, token: &str, ca: &str) -> Option<f64> {
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

pub(crate) async fn operator_pods(client: &Client) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), SYSTEM)
        .list(&ListParams::default().labels("app.kubernetes.io/name=resourcewatch-operator"))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

/// The pods the operator Service's one EndpointSlice names (its endpoints' targetRefs),
/// each with its address, which must be that pod's own.
pub(crate) async fn published_leader(client: &Client, pods: &[Pod]) -> Vec<String> {
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

pub(crate) async fn lease(client: &Client) -> k8s_openapi::api::coordination::v1::LeaseSpec {
    Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), SYSTEM)
        .get("resourcewatch-operator")
        .await
        .ok()
        .and_then(|l| l.spec)
        .unwrap_or_default()
}

pub(crate) async fn lease_holder(client: &Client) -> String {
    lease(client).await.holder_identity.unwrap_or_default()
}

/// From `t0` until a replica other than `not` holds the Lease, is the only endpoint of
/// the Service, has the node's agent connected, and the watch has a status written after that
/// with the node reporting. Returns that replica and the seconds after `t0` at which it
/// took the Lease, had the agent, and its status was seen.
pub(crate) async fn followed(
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
