//! Agents: skew between releases, and a node that may speak only for itself (its token bound to its pod on that node).

use super::*;

/// The skew policy (docs/operations.md, Upgrades and version skew), with the operator's real binary
/// and API server: an agent one release older (offering the versions this release
/// speaks) and one a release newer (offering this version and the next)
/// are both served, their pods reported in the watch's status; an agent that speaks only
/// a newer version is refused with FAILED_PRECONDITION naming both ranges, and counted.
#[tokio::test]
#[ignore = "needs a cluster: make e2e-api"]
async fn agents_a_release_older_and_newer_are_served_and_a_stranger_is_refused() {
    let env = Env::new("rw-trust-skew", true, false).await;
    let mut agents = Vec::new();
    for (name, offered) in [
        ("older", (pb::MIN_PROTOCOL_VERSION, pb::PROTOCOL_VERSION)),
        ("newer", (pb::PROTOCOL_VERSION, pb::PROTOCOL_VERSION + 1)),
    ] {
        let (node, token) = env.node(name).await;
        harness::fake_deployment(&env.client, env.n(), name, 1, &labels(name), &node)
            .await
            .expect("deployment");
        env.watch(
            &env.client,
            name,
            serde_json::json!({"matchLabels": {"app": name}}),
        )
        .await
        .expect("watch");
        agents.push(env.agent_offering(&node, &token, Arc::new(|_| flat()), offered));
    }
    for (name, agent) in ["older", "newer"].iter().zip(&agents) {
        wait_for(
            &format!("the {name} agent's pod reported"),
            Duration::from_secs(40),
            || async {
                let st = env.status(name).await;
                Ok((st.reporting_nodes == 1
                    && st.top_memory.iter().any(|e| e.pod.starts_with(name)))
                .then_some(()))
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", env.op.log_text()));
        assert_eq!(
            agent
                .stats
                .protocol
                .load(std::sync::atomic::Ordering::Relaxed),
            u64::from(pb::PROTOCOL_VERSION),
            "{name}: the version the operator chose"
        );
    }

    // Two releases ahead: nothing in common.
    let (node, token) = env.node("ahead").await;
    let (_t, resp) = raw_session(
        &env,
        &node,
        &token,
        Msg::Hello(pb::Hello {
            node_name: node.clone(),
            min_protocol_version: pb::PROTOCOL_VERSION + 1,
            protocol_version: pb::PROTOCOL_VERSION + 2,
            ..Default::default()
        }),
    )
    .await;
    let s = resp.expect_err("refused");
    assert_eq!(s.code(), tonic::Code::FailedPrecondition, "{s}");
    assert!(
        s.message().contains("upgrade the older"),
        "the refusal says what to do: {s}"
    );
    let refused = env
        .op
        .metric("resourcewatch_operator_protocol_errors_total")
        .unwrap_or(0.0);
    assert!(refused >= 1.0, "counted: {refused}");
    for a in agents {
        a.stop().await;
    }
}

#[tokio::test]
#[ignore = "needs a cluster: make e2e-api"]
async fn a_node_can_speak_only_for_itself() {
    let env = Env::new("rw-trust-node", true, true).await;
    let (node_a, token_a) = env.node("a").await;
    let (node_b, token_b) = env.node("b").await;
    let pods = harness::fake_deployment(
        &env.client,
        env.n(),
        "victim",
        1,
        &labels("victim"),
        &node_b,
    )
    .await
    .expect("deployment");
    let (victim, victim_cid) = pods[0].clone();
    env.watch(
        &env.client,
        "w",
        serde_json::json!({"matchLabels": {"app": "victim"}}),
    )
    .await
    .expect("watch");
    let real = env.agent(&node_b, &token_b, Arc::new(|_| flat()));
    wait_for("the victim reported", Duration::from_secs(40), || async {
        Ok((!env.status("w").await.top_memory.is_empty()).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.op.log_text()));

    // Node A's token claiming node B: refused before any message is read, whether the
    // claim is in the metadata or only in the Hello.
    let (_t, resp) = raw_session(&env, &node_b, &token_a, hello(&node_b)).await;
    let s = resp.expect_err("refused");
    assert_eq!(s.code(), tonic::Code::PermissionDenied, "{s}");
    let (_t, resp) = raw_session(&env, &node_a, &token_a, hello(&node_b)).await;
    assert_eq!(
        resp.err().map(|s| s.code()),
        Some(tonic::Code::PermissionDenied)
    );
    // A valid token of another ServiceAccount's, or none that the API server knows.
    let (_t, resp) = raw_session(&env, &node_b, "not-a-token", hello(&node_b)).await;
    assert_eq!(
        resp.err().map(|s| s.code()),
        Some(tonic::Code::Unauthenticated)
    );

    // Node A, legitimately itself, reports an imminent leak for B's pod.
    let (tx, resp) = raw_session(&env, &node_a, &token_a, hello(&node_a)).await;
    let mut rx = resp.expect("A's own stream");
    let _ = tokio::time::timeout(Duration::from_secs(5), rx.message()).await;
    let forged = pb::Report {
        leaks: vec![pb::Leak {
            pod_uid: victim.uid().unwrap_or_default(),
            container_id: victim_cid.clone(),
            confidence: 100,
            growth_bytes_per_second: 5e6,
            r2: 0.99,
            limit_bytes: 128 * MIB,
            time_to_oom_seconds: Some(5.0),
            ..Default::default()
        }],
        ..Default::default()
    };
    for _ in 0..5 {
        tx.send(pb::AgentMessage {
            msg: Some(Msg::Report(forged.clone())),
        })
        .await
        .expect("send");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    wait_for(
        "the forged entries counted as dropped",
        Duration::from_secs(10),
        || async {
            Ok((env
                .op
                .metric("resourcewatch_operator_report_entries_dropped_total")
                .unwrap_or(0.0)
                >= 1.0)
                .then_some(()))
        },
    )
    .await
    .expect("dropped");
    // An absence: nothing may follow within three intervals.
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert!(
        env.evicted().await.is_empty(),
        "a forged report evicted a pod"
    );
    let s = env.status("w").await;
    assert!(
        s.leaks.is_empty(),
        "a forged leak reached status: {:?}",
        s.leaks
    );
    assert!(s.remediations.is_empty(), "{:?}", s.remediations);
    // The real agent's stream was never replaced.
    assert_eq!(
        real.stats
            .sessions
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(
        real.stats.errors.load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    real.stop().await;
    env.end().await;
}
