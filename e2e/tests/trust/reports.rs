//! Reports an agent may not make the operator hold: oversized or malformed, bounded in memory and kept out of status.

use super::*;

#[tokio::test]
#[ignore = "needs a cluster: make e2e-api"]
async fn oversized_and_malformed_reports_cost_bounded_memory_and_reach_nothing() {
    let mut env = Env::new("rw-trust-bounds", true, true).await;
    let (node, token) = env.node("n").await;
    let pods = harness::fake_deployment(&env.client, env.n(), "app", 1, &labels("app"), &node)
        .await
        .expect("deployment");
    let (pod, cid) = pods[0].clone();
    let rws: Api<ResourceWatch> = Api::namespaced(env.client.clone(), env.n());
    let rw: ResourceWatch = serde_json::from_value(serde_json::json!({
        "apiVersion": "resourcewatch.io/v1alpha1", "kind": "ResourceWatch",
        "metadata": {"name": "w"}, "spec": {"selector": {"matchLabels": {"app": "app"}}, "interval": "5s"}
    }))
    .expect("rw");
    rws.create(&PostParams::default(), &rw)
        .await
        .expect("watch");
    let (tx, resp) = raw_session(&env, &node, &token, hello(&node)).await;
    let mut rx = resp.expect("session");
    let _ = tokio::time::timeout(Duration::from_secs(5), rx.message()).await;
    let uid = pod.uid().unwrap_or_default();
    // Duplicates, NaN, out-of-range confidence, a pod this node does not run, and a
    // megabyte of empty entries (tiny on the wire, large once decoded).
    let leak = |pid, c, tto: f64| pb::Leak {
        pod_uid: uid.clone(),
        container_id: cid.clone(),
        pid,
        confidence: c,
        growth_bytes_per_second: 1e6,
        time_to_oom_seconds: Some(tto),
        limit_bytes: 128 * MIB,
        ..Default::default()
    };
    let mut bad = pb::Report {
        containers: vec![pb::ContainerReport::default(); 400_000],
        leaks: vec![leak(1, 500, 30.0), leak(2, 90, f64::NAN), leak(3, 90, -5.0)],
        ..Default::default()
    };
    bad.leaks.push(pb::Leak {
        pod_uid: "someone-else".into(),
        ..leak(4, 99, 5.0)
    });
    use prost::Message;
    assert!(
        bad.encoded_len() < pb::MAX_MESSAGE_BYTES,
        "{}",
        bad.encoded_len()
    );
    for _ in 0..5 {
        tx.send(pb::AgentMessage {
            msg: Some(Msg::Report(bad.clone())),
        })
        .await
        .expect("send");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    wait_for(
        "the entries counted as dropped",
        Duration::from_secs(20),
        || async {
            Ok((env
                .op
                .metric("resourcewatch_operator_report_entries_dropped_total")
                .unwrap_or(0.0)
                >= 400_000.0)
                .then_some(()))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.op.log_text()));
    let (_, _, peak) = env.op.usage().expect("usage");
    assert!(peak < 256 * MIB, "peak RSS {} MiB", peak / MIB);
    // A message over the limit ends that stream and nothing else.
    let huge = pb::Report {
        containers: vec![pb::ContainerReport::default(); 2_200_000],
        ..Default::default()
    };
    assert!(huge.encoded_len() > 4 * (1 << 20));
    let _ = tx
        .send(pb::AgentMessage {
            msg: Some(Msg::Report(huge)),
        })
        .await;
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match rx.message().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("the stream ends");
    assert!(end.is_err(), "ended with a status: {end:?}");
    let (_, _, peak) = env.op.usage().expect("usage");
    assert!(peak < 256 * MIB, "peak RSS {} MiB", peak / MIB);
    eprintln!(
        "operator peak RSS after 5 x 1 MiB malformed reports and a 4 MiB one: {} MiB",
        peak / MIB
    );
    let s = env.status("w").await;
    assert!(s.leaks.is_empty(), "{:?}", s.leaks);
    assert!(env.op.exited().is_none(), "the operator died");
    env.end().await;
}
