#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test
//! Reconciliation against a tower-test API server: each scenario states the requests
//! the reconciler must make, in order, and what the server answers.

use super::fixtures::*;
use super::{
    effects::{eviction_outcome, references},
    *,
};
use crate::{
    hub::{TargetPod, WatchTargets},
    model::{EventAction, EventReason},
};
use http::{Method, Response};
use kube::client::Body;
use resourcewatch_crds::RemediationAction;
use resourcewatch_proto as pb;

/// Version-sensitive shapes on recorded objects (tests/fixtures/README.md).
mod versions {
    use super::*;

    #[test]
    fn a_pdb_refusal_reads_the_same_on_1_20_and_1_37() {
        for body in [
            include_str!("../../tests/fixtures/k8s-1.20/eviction-429.json"),
            include_str!("../../tests/fixtures/k8s-1.37/eviction-429.json"),
        ] {
            let status: kube::core::Status = serde_json::from_str(body).expect("Status");
            let outcome = eviction_outcome(Err(kube::Error::Api(Box::new(status))));
            match outcome {
                Ok(Some(EvictResult::Refused(m))) => {
                    assert!(m.contains("disruption budget"), "{m}")
                }
                other => panic!("a PDB refusal read as {other:?}"),
            }
        }
        let gone: kube::core::Status = serde_json::from_value(serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "pods \"x\" not found", "reason": "NotFound", "code": 404
        }))
        .unwrap();
        assert!(matches!(
            eviction_outcome(Err(kube::Error::Api(Box::new(gone)))),
            Ok(Some(EvictResult::Gone))
        ));
    }

    /// The eviction request as sent: POST to the pods/eviction subresource with a body
    /// that names no apiVersion or kind. The API server decodes such a body as the
    /// subresource's own kind, policy/v1beta1 Eviction on 1.20 and policy/v1 from 1.22
    /// (v1beta1 is gone from 1.25): one request for every version. A client upgrade
    /// that pinned a version in the body would fail here before it failed a cluster.
    /// The decided pod's UID goes in `deleteOptions` (the Eviction's field; kube's own
    /// `evict` writes `delete_options`, which the API server ignores).
    #[test]
    fn the_eviction_request_names_no_api_version_and_carries_the_uid() {
        let body = effects::eviction_body("app-1", "u-1");
        let req = kube::core::Request::new("/api/v1/namespaces/ns/pods")
            .create_subresource(
                "eviction",
                "app-1",
                &kube::api::PostParams::default(),
                serde_json::to_vec(&body).expect("JSON"),
            )
            .expect("a request");
        assert_eq!(req.method(), Method::POST);
        assert_eq!(
            req.uri().path(),
            "/api/v1/namespaces/ns/pods/app-1/eviction"
        );
        let body: serde_json::Value = serde_json::from_slice(req.body()).expect("JSON");
        assert_eq!(body["metadata"]["name"], "app-1");
        assert_eq!(body["deleteOptions"]["preconditions"]["uid"], "u-1");
        assert!(
            body.get("apiVersion").is_none()
                && body.get("kind").is_none()
                && body.get("delete_options").is_none(),
            "{body}"
        );
        assert!(
            effects::eviction_body("app-1", "")
                .get("deleteOptions")
                .is_none()
        );
    }

    #[test]
    fn events_k8s_io_v1_events_of_1_20_and_1_37_parse() {
        for json in [
            include_str!("../../tests/fixtures/k8s-1.20/event-kubelet.json"),
            include_str!("../../tests/fixtures/k8s-1.37/event-kubelet.json"),
        ] {
            let e: k8s_openapi::api::events::v1::Event =
                serde_json::from_str(json).expect("an events.k8s.io/v1 Event");
            assert_eq!(e.regarding.and_then(|r| r.kind).as_deref(), Some("Pod"));
            assert!(e.reason.is_some() && e.note.is_some());
        }
    }
}

/// What kube's Recorder folds Events by (its `EventKey`, less the reporter): Events
/// with equal keys become one series that keeps its first note.
fn recorder_key(
    rw: &ResourceWatch,
    pods: &[Arc<SelectedPod>],
    e: &EventSpec,
) -> (String, (ObjectReference, Option<ObjectReference>)) {
    let refs = references(rw, pods, e).expect("references");
    (format!("{}/{}", e.reason, e.action), refs)
}

#[test]
fn events_about_different_containers_nodes_or_thresholds_are_not_folded() {
    let rw = watch_fixture(serde_json::json!({"selector": {}}));
    let pods: Vec<Arc<SelectedPod>> = [("a", "uid-a"), ("b", "uid-b")]
        .into_iter()
        .map(|(n, u)| {
            Arc::new(selected_pod(
                &(&pod_fixture(n, u, CID_A, &[], "node-1")).into(),
            ))
        })
        .collect();
    let leak = |pod: &str, container: &str, on_pod: bool| {
        EventSpec::new(
            true,
            EventReason::LeakDetected,
            EventAction::Predict,
            format!("{pod}/{container} grows"),
            on_pod.then(|| pod.to_owned()),
        )
        .about(Subject::container(pod, container))
    };
    let crossed = |field| {
        EventSpec::new(
            true,
            EventReason::ThresholdCrossed,
            EventAction::Monitor,
            String::new(),
            None,
        )
        .about(Subject::container("a", "app"))
        .on_field(field)
    };
    let lost = |node: &str| {
        EventSpec::new(
            true,
            EventReason::AgentLost,
            EventAction::Monitor,
            String::new(),
            None,
        )
        .about(Subject::Node(node.into()))
    };
    let distinct = [
        leak("a", "app", false),
        leak("b", "app", false),
        leak("a", "sidecar", false),
        leak("a", "app", true),
        leak("a", "sidecar", true),
        leak("b", "app", true),
        crossed("spec.thresholds.cpuPercent"),
        crossed("spec.thresholds.memoryPercentOfLimit"),
        lost("node-1"),
        lost("node-2"),
    ];
    let keys: Vec<_> = distinct
        .iter()
        .map(|e| recorder_key(&rw, &pods, e))
        .collect();
    for (i, k) in keys.iter().enumerate() {
        for (j, l) in keys.iter().enumerate().skip(i + 1) {
            assert_ne!(k, l, "{:?} and {:?} fold", distinct[i], distinct[j]);
        }
    }
    // The same leak announced again is the same series.
    assert_eq!(keys[0], recorder_key(&rw, &pods, &leak("a", "app", false)));
    // On the pod: its container in `regarding`, the watch in `related`.
    let (regarding, related) = &keys[3].1;
    assert_eq!(regarding.uid.as_deref(), Some("uid-a"));
    assert_eq!(
        regarding.field_path.as_deref(),
        Some("spec.containers{app}")
    );
    assert_eq!(
        related.as_ref().and_then(|r| r.uid.as_deref()),
        Some("rw-uid")
    );
    // On the watch, about a pod gone since: named by namespace and name.
    let (regarding, related) = references(&rw, &pods, &leak("gone", "app", false)).unwrap();
    assert_eq!(regarding.uid.as_deref(), Some("rw-uid"));
    let related = related.expect("related");
    assert_eq!(
        (
            related.kind.as_deref(),
            related.namespace.as_deref(),
            related.name.as_deref()
        ),
        (Some("Pod"), Some("ns"), Some("gone"))
    );
    // On a pod that is gone: not published.
    assert!(references(&rw, &pods, &leak("gone", "app", true)).is_none());
}

#[tokio::test]
async fn a_reporting_watch_gets_its_status_and_a_ready_event() {
    let rw =
        watch_fixture(serde_json::json!({"selector": {"matchLabels": {"app": "api"}}, "topK": 3}));
    let report = pb::Report {
        containers: vec![pb::ContainerReport {
            pod_uid: UID_A.into(),
            container_id: CID_A.into(),
            cpu_percent: 97.0,
            processes: vec![pb::Process {
                pid: 42,
                command: "burn".into(),
                cpu_percent: 97.0,
                rss_bytes: 10 << 20,
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let hub = reporting_hub("node-1", report);
    let pods = vec![
        pod_fixture("api-1", UID_A, CID_A, &[("app", "api")], "node-1"),
        pod_fixture(
            "other",
            "00000000-0000-0000-0000-000000000001",
            "x",
            &[("app", "db")],
            "node-1",
        ),
    ];
    let (ctx, mut handle) = context(pods, vec![rw.clone()], hub.clone());
    let server = tokio::spawn(async move {
        let status = expect_status_apply(&mut handle, &rw).await;
        let event = expect_event(&mut handle).await;
        (status, event)
    });
    let action = reconcile(
        Arc::new(watch_fixture(
            serde_json::json!({"selector": {"matchLabels": {"app": "api"}}, "topK": 3}),
        )),
        ctx.clone(),
    )
    .await
    .expect("reconcile");
    assert_eq!(action, Action::requeue(Duration::from_secs(30)));
    let (status, (reason, kind, _)) = tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("server scenario ends")
        .expect("scenario");
    assert_eq!(
        status["matchedPods"], 1,
        "pod 'other' is not selected: {status}"
    );
    assert_eq!(status["topCPU"][0]["pod"], "api-1");
    assert_eq!(status["topCPU"][0]["container"], "app");
    assert_eq!(status["summary"]["topCPU"], "api-1 (97%)");
    assert_eq!(status["conditions"][0]["type"], "Ready");
    assert_eq!(status["conditions"][0]["status"], "True");
    assert_eq!(status["observedGeneration"], 1);
    assert_eq!(
        (reason.as_str(), kind.as_str()),
        ("WatchReady", "ResourceWatch")
    );
    // The hub now holds the node's targets.
    let cfg = hub.config("node-1").expect("node configured");
    assert_eq!(cfg.targets.len(), 1);
    assert_eq!(cfg.targets[0].containers[0].container_id, CID_A);
    assert_eq!(cfg.top_k, 3);
}

#[tokio::test]
async fn an_unchanged_status_is_not_written_again() {
    let hub = reporting_hub("node-1", pb::Report::default());
    let mut rw = watch_fixture(serde_json::json!({}));
    let pods = vec![pod_fixture("api-1", UID_A, CID_A, &[], "node-1")];
    // First pass computes the status; store it in the object as the API would.
    let (ctx, mut handle) = context(pods.clone(), vec![rw.clone()], hub.clone());
    let rw2 = rw.clone();
    let server = tokio::spawn(async move {
        let s = expect_status_apply(&mut handle, &rw2).await;
        let _ = expect_event(&mut handle).await;
        s
    });
    reconcile(Arc::new(rw.clone()), ctx).await.expect("first");
    let status = server.await.expect("scenario");
    rw.status = Some(serde_json::from_value(status).expect("status"));
    // Second pass: nothing changed, so no request at all (the mock would hang otherwise).
    let (ctx, mut handle) = context(pods, vec![rw.clone()], hub);
    let action = reconcile(Arc::new(rw), ctx.clone()).await.expect("second");
    assert_eq!(action, Action::requeue(Duration::from_secs(30)));
    assert!(
        matches!(
            tokio::time::timeout(Duration::from_millis(100), handle.next_request()).await,
            Err(_) | Ok(None)
        ),
        "no request expected"
    );
}

#[tokio::test]
async fn an_interval_below_the_floor_is_ready_false_with_one_event_and_no_targets() {
    let rw =
        watch_fixture(serde_json::json!({"interval": "1s", "remediation": {"action": "Restart"}}));
    assert_eq!(rw.spec.remediation.action, RemediationAction::Restart);
    let hub = Arc::new(Hub::new(Default::default()));
    let pods = vec![pod_fixture("api-1", UID_A, CID_A, &[], "node-1")];
    let (ctx, mut handle) = context(pods, vec![rw.clone()], hub.clone());
    let rw2 = rw.clone();
    let server = tokio::spawn(async move {
        let s = expect_status_apply(&mut handle, &rw2).await;
        let e = expect_event(&mut handle).await;
        (s, e)
    });
    reconcile(Arc::new(rw), ctx).await.expect("reconcile");
    let (status, (reason, _, note)) = server.await.expect("scenario");
    assert_eq!(status["conditions"][0]["status"], "False");
    assert_eq!(status["conditions"][0]["reason"], "InvalidSpec");
    assert!(
        status["conditions"][0]["message"]
            .as_str()
            .unwrap_or("")
            .contains("5s minimum")
    );
    assert_eq!(reason, "InvalidSpec");
    assert!(note.contains("5s minimum"), "{note}");
    assert!(
        hub.config("node-1").is_none(),
        "an invalid watch targets nothing"
    );
}

#[tokio::test]
async fn a_failed_status_write_is_an_error_and_publishes_nothing() {
    let hub = reporting_hub("node-1", pb::Report::default());
    let rw = watch_fixture(serde_json::json!({}));
    let pods = vec![pod_fixture("api-1", UID_A, CID_A, &[], "node-1")];
    let (ctx, mut handle) = context(pods, vec![rw.clone()], hub);
    let server = tokio::spawn(async move {
        let (_, send) = handle.next_request().await.expect("a status write");
        send.send_response(
            Response::builder()
                .status(409)
                .body(Body::from(
                    serde_json::to_vec(&serde_json::json!({
                        "kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "message": "conflict", "reason": "Conflict", "code": 409
                    }))
                    .expect("json"),
                ))
                .expect("response"),
        );
        // No Event may follow a failed write (None: the client is gone, nothing came).
        matches!(
            tokio::time::timeout(Duration::from_millis(200), handle.next_request()).await,
            Err(_) | Ok(None)
        )
    });
    let r = reconcile(Arc::new(rw), ctx).await;
    assert!(matches!(r, Err(Error::Kube(_))), "{r:?}");
    assert!(
        server.await.expect("scenario"),
        "an Event was published after a failed write"
    );
}

#[tokio::test]
async fn deleted_watches_are_forgotten_by_the_hub() {
    let hub = reporting_hub("node-1", pb::Report::default());
    hub.set_watch(
        WatchKey {
            namespace: "ns".into(),
            name: "gone".into(),
        },
        WatchTargets {
            top_k: 5,
            interval: Duration::from_secs(10),
            leaks_enabled: false,
            min_confidence: 60,
            horizon: Duration::from_secs(60),
            remediates: false,
            pods: vec![TargetPod {
                uid: "u".into(),
                namespace: "ns".into(),
                name: "p".into(),
                node: "node-2".into(),
                containers: vec![],
            }],
            profile: None,
        },
    );
    assert!(hub.config("node-2").is_some());
    let rw = watch_fixture(serde_json::json!({"selector": {"matchLabels": {"none": "x"}}}));
    let (ctx, mut handle) = context(vec![], vec![rw.clone()], hub.clone());
    let rw2 = rw.clone();
    let server = tokio::spawn(async move {
        let _ = expect_status_apply(&mut handle, &rw2).await;
        let _ = expect_event(&mut handle).await;
    });
    reconcile(Arc::new(rw), ctx).await.expect("reconcile");
    server.await.expect("scenario");
    assert!(
        hub.config("node-2").is_none(),
        "the deleted watch's node was dropped"
    );
    assert_eq!(hub.watch_keys().len(), 1);
}
