//! The rails of a restart: the last ready replica is kept, two watches of one workload evict once per cooldown, a pending intent expires.

use super::*;

/// Marks a pod Ready, as kubelet would once its readiness probe passes.
pub(crate) async fn make_ready(client: &Client, ns: &str, pod: &str) {
    let body = serde_json::json!({"status": {"conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": jiff::Timestamp::now().to_string()}
    ]}});
    Api::<Pod>::namespaced(client.clone(), ns)
        .patch_status(pod, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .unwrap_or_else(|e| panic!("pod {pod} Ready: {e}"));
}

/// Waits until the Deployment's controller counts `n` Ready replicas.
pub(crate) async fn deployment_ready(client: &Client, ns: &str, name: &str, n: i32) {
    let deploys: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(client.clone(), ns);
    wait_for(
        "the Deployment's readyReplicas",
        Duration::from_secs(60),
        || {
            let deploys = deploys.clone();
            async move {
                let d = deploys.get(name).await?;
                let ready = d.status.and_then(|s| s.ready_replicas).unwrap_or(0);
                Ok((ready == n).then_some(()))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
}

/// Three replicas, one Ready (the others starting or crashing): that one leaks, and is
/// not evicted (`LastReadyReplica`) until a second replica is Ready.
#[tokio::test]
#[ignore = "needs a cluster: make e2e-api"]
async fn the_last_ready_replica_of_a_workload_is_not_evicted() {
    let env = Env::new("rw-trust-ready", true, true).await;
    let (node, token) = env.node("n").await;
    let pods = harness::fake_deployment(&env.client, env.n(), "app", 3, &labels("app"), &node)
        .await
        .expect("deployment");
    let names: Vec<String> = pods.iter().map(|(p, _)| p.name_any()).collect();
    let serving = names[0].clone();
    make_ready(&env.client, env.n(), &serving).await;
    deployment_ready(&env.client, env.n(), "app", 1).await;
    env.watch(
        &env.client,
        "w",
        serde_json::json!({"matchLabels": {"app": "app"}}),
    )
    .await
    .expect("watch");
    let leaker = serving.clone();
    let agent = env.agent(
        &node,
        &token,
        Arc::new(move |pod| {
            if pod == leaker {
                leaking()
            } else {
                PodPlan {
                    leak: None,
                    ..leaking()
                }
            }
        }),
    );
    let record = wait_for(
        "a LastReadyReplica record",
        Duration::from_secs(40),
        || async {
            let s = env.status("w").await;
            Ok(s.remediations
                .into_iter()
                .find(|r| r.reason == "LastReadyReplica"))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.op.log_text()));
    assert_eq!(record.pod, serving);
    assert_eq!(record.action, RemediationOutcome::Blocked);
    assert!(
        record.message.contains("1 of 3 Ready"),
        "{}",
        record.message
    );
    assert!(env.evicted().await.is_empty());
    // A second replica serves: the leaking one may go (at once: the Deployment counts two
    // Ready for a moment only, until the eviction).
    make_ready(&env.client, env.n(), &names[1]).await;
    let evicted = env
        .wait_evicted("the eviction once another replica is Ready")
        .await;
    assert_eq!(evicted, [serving]);
    agent.stop().await;
    env.end().await;
}

#[tokio::test]
#[ignore = "needs a cluster: make e2e-api"]
async fn two_watches_of_one_deployment_evict_once_per_cooldown() {
    let env = Env::new("rw-trust-two", true, true).await;
    let (node, token) = env.node("n").await;
    let mut l = labels("app");
    l.insert("tier".into(), "web".into());
    harness::fake_deployment(&env.client, env.n(), "app", 3, &l, &node)
        .await
        .expect("deployment");
    env.watch(
        &env.client,
        "by-app",
        serde_json::json!({"matchLabels": {"app": "app"}}),
    )
    .await
    .expect("watch 1");
    env.watch(
        &env.client,
        "by-tier",
        serde_json::json!({"matchLabels": {"tier": "web"}}),
    )
    .await
    .expect("watch 2");
    let agent = env.agent(&node, &token, Arc::new(|_| leaking()));
    env.wait_evicted("a first eviction").await;
    // An absence: the cooldown (10m) must hold for both watches.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let evicted = env.evicted().await;
    assert_eq!(evicted.len(), 1, "{evicted:?}");
    let blocked: Vec<RemediationReason> = [env.status("by-app").await, env.status("by-tier").await]
        .into_iter()
        .flat_map(|s| s.remediations)
        .filter(|r| r.action == RemediationOutcome::Blocked)
        .map(|r| r.reason)
        .collect();
    assert!(
        blocked
            .iter()
            .any(|r| *r == "Cooldown" || *r == "RestartInProgress"),
        "the other replicas are held by the workload's rails: {blocked:?}"
    );
    agent.stop().await;
    env.end().await;
}

#[tokio::test]
#[ignore = "needs a cluster: make e2e-api"]
async fn a_pending_intent_expires_when_the_switch_is_off_and_status_alone_evicts_nothing() {
    // The operator runs without --enable-remediation.
    let env = Env::new("rw-trust-pending", true, false).await;
    let (node, token) = env.node("n").await;
    let leaky = harness::fake_deployment(&env.client, env.n(), "leaky", 1, &labels("leaky"), &node)
        .await
        .expect("deployment");
    let calm = harness::fake_deployment(&env.client, env.n(), "calm", 1, &labels("calm"), &node)
        .await
        .expect("deployment");
    let (p, _) = &leaky[0];
    let (q, _) = &calm[0];
    env.watch(&env.client, "w", serde_json::json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["leaky", "calm"]}]}))
        .await
        .expect("watch");
    // What an operator that died between recording and evicting leaves: the ledger's
    // intent for P (in the operator's namespace) and a Pending record in status. And a
    // Pending record for Q that only someone with status access wrote.
    let now = jiff::Timestamp::now().as_second();
    let workload = resourcewatch_operator::ledger::Workload {
        namespace: env.n().into(),
        kind_name: "Deployment/leaky".into(),
    };
    let ledger = serde_json::json!({"restarts": [], "pending": {
        "pod": p.name_any(), "podUid": p.uid(), "at": now, "expires": now + 600, "by": format!("{}/w", env.n())}});
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": workload.record_name()},
        "data": {"ledger.json": ledger.to_string()}
    }))
    .expect("cm");
    Api::<ConfigMap>::namespaced(env.client.clone(), env.n())
        .create(&PostParams::default(), &cm)
        .await
        .expect("ledger");
    let time = jiff::Timestamp::from_second(now).expect("now").to_string();
    let record = |pod: &Pod, workload: &str| {
        serde_json::json!({"pod": pod.name_any(), "podUID": pod.uid(), "workload": workload,
            "action": "Pending", "reason": "Decided", "timeToOOMSeconds": 20.0, "confidence": 95, "time": time})
    };
    Api::<ResourceWatch>::namespaced(env.client.clone(), env.n())
        .patch_status(
            "w",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"remediations": [
                record(p, "Deployment/leaky"), record(q, "Deployment/calm")]}})),
        )
        .await
        .expect("status intents");
    let pn = p.name_any();
    let agent = env.agent(
        &node,
        &token,
        Arc::new(move |name| if name == pn { leaking() } else { flat() }),
    );
    let s = wait_for("both intents expired", Duration::from_secs(40), || async {
        let s = env.status("w").await;
        Ok((s.remediations.len() >= 2
            && s.remediations
                .iter()
                .all(|r| r.action != RemediationOutcome::Pending))
        .then_some(s))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.op.log_text()));
    let of = |pod: &Pod| {
        s.remediations
            .iter()
            .find(|r| Some(r.pod_uid.clone()) == pod.uid())
            .cloned()
            .expect("a record")
    };
    let rp = of(p);
    assert_eq!(rp.action, RemediationOutcome::Expired, "{rp:?}");
    assert_eq!(rp.reason, "RemediationDisabled", "{rp:?}");
    let rq = of(q);
    assert_eq!(rq.action, RemediationOutcome::Expired, "{rq:?}");
    assert_eq!(rq.reason, "IntentExpired", "{rq:?}");
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        env.evicted().await.is_empty(),
        "evicted with the switch off"
    );
    let cm = Api::<ConfigMap>::namespaced(env.client.clone(), env.n())
        .get(&workload.record_name())
        .await
        .expect("ledger");
    let l: serde_json::Value =
        serde_json::from_str(&cm.data.unwrap_or_default()["ledger.json"]).expect("json");
    assert!(
        l.get("pending").is_none(),
        "the ledger's intent was cleared: {l}"
    );
    agent.stop().await;
    env.end().await;
}
