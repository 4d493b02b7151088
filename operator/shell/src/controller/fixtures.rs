//! Fixtures of the reconcile tests: a watch and pods as the API server returns them, a
//! Context over a tower-test API server, the requests a reconcile must make, and a hub
//! with one node's report in it.

use http::{Method, Request, Response};
use k8s_openapi::api::core::v1::{ContainerStatus, PodSpec, PodStatus};
use kube::{client::Body, runtime::watcher::Event as WatchEvent};
use resourcewatch_crds::ResourceWatchSpec;
use resourcewatch_proto as pb;

use super::*;
use crate::hub::{TargetPod, WatchTargets};

pub(super) type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

pub(super) const UID_A: &str = "3f1b2a6e-5c4d-4e8f-9a0b-1c2d3e4f5a6b";
pub(super) const CID_A: &str = "9c2bd5b1a0f3c7e2d4b6a8f0e1c3d5b7a9f1e3c5d7b9a1f3e5c7d9b1a3f5e7c9";

pub(super) fn watch_fixture(spec: serde_json::Value) -> ResourceWatch {
    let spec: ResourceWatchSpec = serde_json::from_value(spec).expect("spec");
    let mut rw = ResourceWatch::new("w", spec);
    rw.metadata.namespace = Some("ns".into());
    rw.metadata.generation = Some(1);
    rw.metadata.uid = Some("rw-uid".into());
    rw
}

pub(super) fn pod_fixture(
    name: &str,
    uid: &str,
    cid: &str,
    labels: &[(&str, &str)],
    node: &str,
) -> Pod {
    Pod {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(uid.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            container_statuses: Some(vec![ContainerStatus {
                name: "app".into(),
                container_id: Some(format!("containerd://{cid}")),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

pub(super) fn context(
    pods: Vec<Pod>,
    watches: Vec<ResourceWatch>,
    hub: Arc<Hub>,
) -> (Arc<Context>, Handle) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(svc, "default");
    let eviction_client_for_tests = client.clone();
    let (pod_store, mut pod_writer) = reflector::store();
    pod_writer.apply_watcher_event(&WatchEvent::Init);
    for p in pods {
        pod_writer.apply_watcher_event(&WatchEvent::InitApply(CachedPod::from(&p)));
    }
    pod_writer.apply_watcher_event(&WatchEvent::InitDone);
    let (rw_store, mut rw_writer) = reflector::store();
    rw_writer.apply_watcher_event(&WatchEvent::Init);
    for w in watches {
        rw_writer.apply_watcher_event(&WatchEvent::InitApply(w));
    }
    rw_writer.apply_watcher_event(&WatchEvent::InitDone);
    let metrics = Arc::new(Metrics::default());
    // The retrier is not run: an Event that fails is given up at once.
    let (events, _retrier) = events::Publisher::new(
        Recorder::new(
            client.clone(),
            Reporter {
                controller: crate::FIELD_MANAGER.into(),
                instance: None,
            },
        ),
        Duration::from_secs(5),
        metrics.clone(),
    );
    let ctx = Context {
        events,
        client,
        hub,
        metrics: metrics.clone(),
        pods: pod_store,
        watches: rw_store,
        policies: reflector::store().0,
        policies_failing: Default::default(),
        profile_requests: Default::default(),
        leader: watch::channel(true).1,
        write_timeout: Duration::from_secs(5),
        forgotten_at: Default::default(),
        pod_index: Default::default(),
        eviction_client: eviction_client_for_tests.clone(),
        // No scenario stores a profile: nothing is sent.
        otlp: crate::otlp::Exporter::new(
            eviction_client_for_tests.clone(),
            "rw-system",
            metrics.clone(),
        ),
        remediation: RemediationContext {
            enabled: false,
            floors: Floors::default(),
            ledgers: LedgerStore::new(
                eviction_client_for_tests,
                "rw-system",
                Duration::from_secs(1),
            ),
            evict_rights: Default::default(),
            evictor_role: "resourcewatch-evictor".into(),
        },
    };
    (Arc::new(ctx), handle)
}

pub(super) async fn body_json(req: Request<Body>) -> serde_json::Value {
    let bytes = req.into_body().collect_bytes().await.expect("body");
    serde_json::from_slice(&bytes).expect("json body")
}

/// Expects a server-side-apply status patch; answers with the object; returns the
/// status sent.
pub(super) async fn expect_status_apply(
    handle: &mut Handle,
    rw: &ResourceWatch,
) -> serde_json::Value {
    let (req, send) = handle.next_request().await.expect("a status write");
    assert_eq!(req.method(), Method::PATCH);
    let uri = req.uri().to_string();
    assert!(
        uri.starts_with("/apis/resourcewatch.io/v1alpha1/namespaces/ns/resourcewatches/w/status?"),
        "{uri}"
    );
    assert!(
        uri.contains("fieldManager=resourcewatch-operator") && uri.contains("force=true"),
        "{uri}"
    );
    assert_eq!(
        req.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/apply-patch+yaml")
    );
    let body = body_json(req).await;
    assert_eq!(body["kind"], "ResourceWatch");
    let mut answer = rw.clone();
    answer.status = serde_json::from_value(body["status"].clone()).ok();
    send.send_response(
        Response::builder()
            .body(Body::from(serde_json::to_vec(&answer).expect("json")))
            .expect("response"),
    );
    body["status"].clone()
}

/// Expects an Event creation; returns (reason, regarding kind, note).
pub(super) async fn expect_event(handle: &mut Handle) -> (String, String, String) {
    let (req, send) = handle.next_request().await.expect("an Event");
    assert_eq!(req.method(), Method::POST);
    assert_eq!(
        req.uri().path(),
        "/apis/events.k8s.io/v1/namespaces/ns/events"
    );
    let body = body_json(req).await;
    let out = (
        body["reason"].as_str().unwrap_or_default().to_owned(),
        body["regarding"]["kind"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        body["note"].as_str().unwrap_or_default().to_owned(),
    );
    send.send_response(
        Response::builder()
            .body(Body::from(serde_json::to_vec(&body).expect("json")))
            .expect("response"),
    );
    out
}

pub(super) fn reporting_hub(node: &str, report: pb::Report) -> Arc<Hub> {
    let hub = Arc::new(Hub::new(Default::default()));
    // The node was asked to track pod A (a report may speak only for its targets).
    hub.set_watch(
        WatchKey {
            namespace: "ns".into(),
            name: "earlier".into(),
        },
        WatchTargets {
            top_k: 3,
            interval: Duration::from_secs(30),
            leaks_enabled: true,
            min_confidence: 60,
            horizon: Duration::from_secs(7200),
            remediates: false,
            pods: vec![TargetPod {
                uid: UID_A.into(),
                namespace: "ns".into(),
                name: "api-1".into(),
                node: node.into(),
                containers: vec![("app".into(), CID_A.into())],
            }],
            profile: None,
        },
    );
    let s = hub
        .connect(&pb::Hello {
            node_name: node.into(),
            protocol_version: pb::PROTOCOL_VERSION,
            min_protocol_version: pb::MIN_PROTOCOL_VERSION,
            ..Default::default()
        })
        .expect("connect");
    hub.report(node, s.id, report).expect("report");
    std::mem::forget(s); // keep the session open for the test's lifetime
    hub
}
