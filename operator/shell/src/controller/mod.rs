//! The ResourceWatch controller: a reconcile selects the watch's pods from the cache,
//! has the core assess the status ([`decide::assess`]), gathers what a decision needs
//! (`gather`), has the core decide ([`decide::decide`]) and carries out the plan in its
//! order (`effects`: hub targets, the workload ledger, the profile's ConfigMap, the
//! status by server-side apply as `resourcewatch-operator`, evictions, Events). Its
//! inputs arrive as streams (`watches`). Only I/O lives here.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, ObjectReference, Pod};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::PostParams,
    runtime::{
        Controller, Predicate, PredicateConfig, WatchStreamExt,
        controller::Action,
        events::{Recorder, Reporter},
        predicates,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use resourcewatch_crds::{
    PROFILE_ANNOTATION, ProfileState, RemediationAction, RemediationOutcome, RemediationPolicy,
    RemediationRecord, ResourceWatch, ResourceWatchStatus,
};
use tokio::sync::watch;
use tokio_stream::wrappers::{ReceiverStream, WatchStream};

use crate::{
    Error, Result,
    decide::{self, EvictResult, LedgerChange},
    hub::{Hub, WatchKey},
    ledger::{self, Conflict, Known, Ledger, LedgerStore, Versioned, Workload},
    metrics::Metrics,
    pods::{is_ready, is_terminal, selected_pod, slim_pod},
    profile, profile_store,
    remediation::{Gate, Grants, NoEvictRight, NoGrant, PodFacts, Replicas},
    spec::{Floors, WatchSettings, selects},
    status::{EventSpec, Inputs, SelectedPod, Subject},
    status_write::apply_status,
    triggers::PodTriggers,
};

mod effects;
pub mod events;
mod gather;
mod watches;

pub use effects::evict_pod;
use effects::{apply_ledger, count_remediations, evict_and_record, publish, write_status};
use gather::{Facts, gather, known_restarts};
pub use watches::run;

/// What remediation decisions depend on besides the watch.
pub struct RemediationContext {
    /// The cluster-wide master switch: without it, `Restart` watches only report.
    pub enabled: bool,
    /// The admin's floors; a `Restart` watch below them is `Ready=False`.
    pub floors: Floors,
    /// The workloads' rails.
    pub ledgers: LedgerStore,
    /// The API server's last answers on the operator's own eviction right, by namespace.
    pub evict_rights: std::sync::Mutex<HashMap<String, EvictRight>>,
    /// The ClusterRole that grants evictions (`--evictor-cluster-role`), for the
    /// condition that says it is not bound.
    pub evictor_role: String,
}

/// When the API server answered, and what: Err says why the operator may not evict.
pub type EvictRight = (std::time::Instant, std::result::Result<(), NoEvictRight>);

/// Reconciliations running at once (see `run`).
pub const RECONCILE_CONCURRENCY: u16 = 8;

/// Everything a reconciliation needs; one per controller.
pub struct Context {
    /// Writes status and publishes Events.
    pub client: Client,
    /// Publishes Events as `resourcewatch-operator` (with this replica's name), trying
    /// again in the background those the API server did not take.
    pub events: events::Publisher,
    /// Desired node configuration and the agents' latest reports.
    pub hub: Arc<Hub>,
    pub metrics: Arc<Metrics>,
    /// Every pod in the cluster, from the controller's own pod watch (managed fields
    /// stripped).
    pub pods: Store<Pod>,
    /// The watches themselves, to forget deleted ones in the hub.
    pub watches: Store<ResourceWatch>,
    /// Every RemediationPolicy: the grants of `Restart` watches.
    pub policies: Store<RemediationPolicy>,
    /// Why the RemediationPolicy watch last failed, until it delivers again: then no
    /// grant is trusted (the store may hold a policy deleted meanwhile).
    pub policies_failing: Arc<std::sync::Mutex<Option<String>>>,
    /// The newest profile request taken in each namespace (seconds since the epoch):
    /// the namespace's rate limit, which deleting and recreating a watch must not reset
    /// (its status, where the request was also recorded, goes with it).
    pub profile_requests: std::sync::Mutex<HashMap<String, i64>>,
    /// Only the leader reconciles: a follower would fight it over status.
    pub leader: watch::Receiver<bool>,
    /// For the Eviction API only: without kube's retry on 429, which is how the API
    /// server says a PodDisruptionBudget refuses (retrying would hide the refusal).
    pub eviction_client: Client,
    /// Switch, floors, authorization and ledgers of pre-OOM remediation.
    pub remediation: RemediationContext,
    /// Each status write and Event is bounded by this, so a slow API server cannot stall
    /// reconciliation of every other watch.
    pub write_timeout: Duration,
    /// When deleted watches were last looked for: at most once a second, not in each of
    /// the hundreds of reconciles a second of a large cluster (each walked every watch).
    pub forgotten_at: std::sync::Mutex<Option<std::time::Instant>>,
    /// The pods' labels as the pod watch last saw them: what a pod's change triggers, and
    /// the index a reconcile finds its selector's pods in (crate::triggers).
    pub pod_index: Arc<std::sync::Mutex<PodTriggers>>,
}

/// One reconciliation, in a span naming its watch (`namespace/name`): every line it logs
/// joins to the watch.
pub async fn reconcile(rw: Arc<ResourceWatch>, ctx: Arc<Context>) -> Result<Action> {
    use tracing::Instrument;
    let span = tracing::info_span!(
        "reconcile",
        watch = %format!("{}/{}", rw.namespace().unwrap_or_default(), rw.name_any())
    );
    ctx.metrics
        .timed(reconcile_inner(&rw, &ctx))
        .instrument(span)
        .await
}

async fn reconcile_inner(rw: &ResourceWatch, ctx: &Context) -> Result<Action> {
    if let Some(wait) = not_now(ctx).await {
        return Ok(Action::requeue(wait));
    }
    forget_deleted(ctx);
    let ns = rw.namespace().ok_or(Error::NotNamespaced)?;
    let key = WatchKey {
        namespace: ns.clone(),
        name: rw.name_any(),
    };
    let settings = WatchSettings::from_spec(&rw.spec, &ctx.remediation.floors);
    let (selected, finished) = match &settings {
        Ok(s) => select_pods(ctx, &ns, s),
        Err(_) => Default::default(),
    };
    let pods: Vec<SelectedPod> = selected.iter().map(|p| selected_pod(p)).collect();
    let nodes: BTreeSet<String> = pods.iter().filter_map(|p| p.node.clone()).collect();
    let views = ctx.hub.view(&nodes);
    let finished: Vec<SelectedPod> = finished.iter().map(|p| selected_pod(p)).collect();
    // The nodes where only finished pods ran, read for their OOM kills alone.
    let other_nodes: BTreeSet<String> = finished
        .iter()
        .filter_map(|p| p.node.clone())
        .filter(|n| !nodes.contains(n))
        .collect();
    let other_views = ctx.hub.view(&other_nodes);
    let now_s = jiff::Timestamp::now().as_second();
    let now = jiff::Timestamp::from_second(now_s)?.to_string();
    let status_inputs = Inputs {
        generation: rw.meta().generation,
        settings: &settings,
        pods: &pods,
        finished: &finished,
        kill_nodes: &other_views,
        nodes: &views,
        old: rw.status.as_ref(),
        now: &now,
    };
    let assessed = decide::assess(&status_inputs);
    // The API calls remediation needs are made only for the pods it may concern.
    let names = assessed.candidates(&status_inputs);
    let facts = if names.is_empty() {
        Facts::default()
    } else {
        gather(ctx, rw, &ns, &selected, &names, settings.as_ref().ok()).await?
    };
    let result = arrived_profile(ctx, rw);
    let watch_id = key.to_string();
    let ledgers = facts
        .ledgers
        .iter()
        .map(|(w, v)| (w.clone(), v.ledger.clone()))
        .collect();
    let plan = decide::decide(
        &decide::Inputs {
            status: status_inputs,
            watch: &watch_id,
            namespace: &ns,
            gate: facts.gate.as_ref(),
            pods: &facts.pods,
            ledgers: &ledgers,
            profile: profile_inputs(ctx, rw, &ns, now_s, result.as_ref()),
            now: now_s,
        },
        assessed,
    );
    ctx.metrics.findings.set(&key, &plan.status);
    let run = Run {
        ctx,
        rw,
        key: &key,
        selected: &selected,
        settings: settings.as_ref().ok(),
        now_s,
        now: &now,
    };
    carry_out(&run, plan, facts.ledgers, result).await
}

/// Why this reconcile must wait: this replica does not lead, or the pod watch has not
/// listed yet (every selector would match nothing: a status written then would drop
/// every entry, and re-add them, with Events, a moment later).
async fn not_now(ctx: &Context) -> Option<Duration> {
    if !*ctx.leader.borrow() {
        return Some(Duration::from_secs(5));
    }
    tokio::time::timeout(Duration::from_millis(1), ctx.pods.wait_until_ready())
        .await
        .is_err()
        .then_some(Duration::from_millis(500))
}

/// Finished pods a reconcile looks at, at most: their OOM kills are named (a Job's pod
/// killed by its limit fails), nothing else is read of them.
const MAX_FINISHED_PODS: usize = 256;

/// The pods of `ns` the watch's selector matches, from the pod cache (through the label
/// index when the selector has an equality it can use), in one pass: the running ones,
/// and those that finished (Succeeded, Failed) or were deleted in the last ten minutes
/// (at most `MAX_FINISHED_PODS`, the deleted last).
fn select_pods(ctx: &Context, ns: &str, s: &WatchSettings) -> (Vec<Arc<Pod>>, Vec<Arc<Pod>>) {
    let (candidates, departed) = {
        let index = ctx.pod_index.lock().unwrap_or_else(|e| e.into_inner());
        (
            index.candidates(ns, &s.selector),
            index.departed.in_namespace(ns, std::time::Instant::now()),
        )
    };
    let pods: Vec<Arc<Pod>> = match candidates {
        Some(names) => names
            .iter()
            .filter_map(|n| ctx.pods.get(&ObjectRef::new(n).within(ns)))
            .collect(),
        // Borrowed, not `namespace()`: that clones a String per pod of the cluster per
        // reconcile.
        None => ctx
            .pods
            .state()
            .into_iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(ns))
            .collect(),
    };
    let (finished, running): (Vec<Arc<Pod>>, Vec<Arc<Pod>>) = pods
        .into_iter()
        .filter(|p| selects(&s.pods, p.labels()))
        .partition(|p| is_terminal(p));
    let mut finished = finished;
    // Newest first. (A deleted pod's UID is in no running pod, even where its name was
    // taken again, a StatefulSet's: kills are matched by UID.)
    finished.extend(
        departed
            .into_iter()
            .rev()
            .filter(|p| selects(&s.pods, p.labels())),
    );
    finished.truncate(MAX_FINISHED_PODS);
    (running, finished)
}

/// One reconcile's watch and what was read for it, for carrying out its plan.
struct Run<'a> {
    ctx: &'a Context,
    rw: &'a ResourceWatch,
    key: &'a WatchKey,
    selected: &'a [Arc<Pod>],
    settings: Option<&'a WatchSettings>,
    now_s: i64,
    now: &'a str,
}

/// Carries out a plan in its order (see [`decide::Plan`]).
async fn carry_out(
    run: &Run<'_>,
    mut plan: decide::Plan,
    mut versions: BTreeMap<Workload, Versioned>,
    result: Option<resourcewatch_proto::ProfileResult>,
) -> Result<Action> {
    let (ctx, ns) = (run.ctx, run.key.namespace.as_str());
    match plan.targets.take() {
        Some(t) => ctx.hub.set_watch(run.key.clone(), t),
        None => ctx.hub.remove_watch(run.key),
    }
    if plan.hold {
        return Ok(Action::requeue(plan.requeue));
    }
    // The workload ledger first: an intent is recorded there before anything is evicted,
    // and a conflict means another watch decided for the workload meanwhile.
    for change in &plan.ledger {
        if apply_ledger(ctx, change, &mut versions).await?.is_err() {
            ctx.metrics.remediation("LedgerConflict");
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
    }
    let mut events = std::mem::take(&mut plan.events);
    match (&plan.profile.effect, plan.status.profile.as_mut(), &result) {
        (Some(profile::Effect::Store), Some(p), Some(r)) => {
            let stored = profile_store::store(&ctx.client, ctx.write_timeout, run.rw, p, r)
                .await
                .map_err(|e| resourcewatch_runtime::error_chain(&e));
            events.push(profile::stored(p, r, stored, run.now_s));
        }
        (Some(profile::Effect::Delete), _, _) => {
            profile_store::delete(&ctx.client, ctx.write_timeout, run.rw).await
        }
        _ => {}
    }
    if let decide::Write::Skip(wait) = plan.write {
        ctx.metrics.status_skipped.inc();
        return Ok(Action::requeue(wait.min(plan.requeue)));
    }
    let mut status = plan.status;
    write_status(ctx, ns, &run.key.name, &status).await?;
    status_written(run, &plan.profile, &status);
    if !plan.evictions.is_empty() {
        let before = status.remediations.clone();
        for ev in &plan.evictions {
            evict_and_record(run, ev, &mut status, &mut versions, &mut events).await?;
        }
        write_status(ctx, ns, &run.key.name, &status).await?;
        count_remediations(ctx, &before, &status.remediations);
    }
    for e in &events {
        publish(ctx, run.rw, run.selected, e).await;
    }
    Ok(Action::requeue(plan.requeue))
}

/// What follows a status write: the profile's count, its namespace's rate limit and the
/// hub's copy of its result (kept until now, so a failed write loses nothing), and the
/// remediation records' counts.
fn status_written(run: &Run<'_>, step: &profile::Step, status: &ResourceWatchStatus) {
    let ctx = run.ctx;
    let old = run.rw.status.as_ref();
    let old_profile = old.and_then(|s| s.profile.as_ref());
    if let Some(state) = profile::transition(old_profile, status.profile.as_ref()) {
        Metrics::labelled(&ctx.metrics.profiles, "state", &format!("{state:?}"), 1);
    }
    if step.taken {
        ctx.profile_requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(run.key.namespace.clone(), run.now_s);
    }
    if step.result_used
        && let Some(p) = old_profile
    {
        ctx.hub.forget_profile_result(&p.id);
    }
    let old_records = old.map_or(&[][..], |s| &s.remediations[..]);
    count_remediations(ctx, old_records, &status.remediations);
    let old_kills = old.map_or(&[][..], |s| &s.oom_kills[..]);
    ctx.metrics.oom_series(&run.key.namespace, &run.key.name);
    for k in &status.oom_kills {
        let known = old_kills
            .iter()
            .any(|o| o.time == k.time && o.node == k.node && o.pid == k.pid)
            || old_kills.last().is_some_and(|o| k.time < o.time);
        if !known {
            ctx.metrics.oom_kill(&run.key.namespace, &run.key.name, k);
        }
    }
}

/// A node's result for the watch's Pending profile request, if one has arrived (a copy:
/// the hub forgets it once a status naming its outcome is written).
fn arrived_profile(
    ctx: &Context,
    rw: &ResourceWatch,
) -> Option<resourcewatch_proto::ProfileResult> {
    let p = rw.status.as_ref()?.profile.as_ref()?;
    (p.state == ProfileState::Pending)
        .then(|| ctx.hub.profile_result_of(&p.id))
        .flatten()
}

/// The profile request and what deciding it needs: the namespace's latest request is
/// read (from every watch of the namespace) only for an annotation value not taken yet.
fn profile_inputs<'a>(
    ctx: &Context,
    rw: &'a ResourceWatch,
    ns: &str,
    now: i64,
    result: Option<&'a resourcewatch_proto::ProfileResult>,
) -> profile::Inputs<'a> {
    let old = rw.status.as_ref().and_then(|s| s.profile.as_ref());
    let annotation = rw.annotations().get(PROFILE_ANNOTATION).map(String::as_str);
    let namespace_last = annotation
        .filter(|a| profile::is_new(a, old))
        .and_then(|_| {
            let watches = ctx.watches.state();
            let in_status = profile::latest_request(
                watches
                    .iter()
                    .filter(|w| w.namespace().as_deref() == Some(ns))
                    .filter_map(|w| w.status.as_ref()?.profile.as_ref()),
            );
            let taken_here = ctx
                .profile_requests
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(ns)
                .copied();
            in_status.max(taken_here)
        });
    let uid = rw.uid().unwrap_or_default();
    profile::Inputs {
        annotation,
        namespace_last,
        id: format!("{}-{now}", uid.chars().take(8).collect::<String>()),
        result,
    }
}

pub fn error_policy(rw: Arc<ResourceWatch>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(
        watch = %format!("{}/{}", rw.namespace().unwrap_or_default(), rw.name_any()),
        error = %resourcewatch_runtime::error_chain(error),
        "reconcile failed"
    );
    ctx.metrics.reconciled("error_policy");
    Action::requeue(Duration::from_secs(10))
}

fn forget_deleted(ctx: &Context) {
    {
        let mut at = ctx.forgotten_at.lock().unwrap_or_else(|e| e.into_inner());
        if at.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return;
        }
        *at = Some(std::time::Instant::now());
    }
    let live: BTreeSet<WatchKey> = ctx
        .watches
        .state()
        .iter()
        .map(|w| WatchKey {
            namespace: w.namespace().unwrap_or_default(),
            name: w.name_any(),
        })
        .collect();
    ctx.metrics.watches.set(live.len() as i64);
    ctx.metrics.findings.retain(|k| live.contains(k));
    for k in ctx.hub.watch_keys() {
        if !live.contains(&k) {
            ctx.hub.remove_watch(&k);
        }
    }
}

/// What the controller is given besides its inputs.
pub struct Settings {
    pub reporter: Reporter,
    /// See [`Context::eviction_client`].
    pub eviction_client: Client,
    /// See [`Context::remediation`].
    pub remediation: RemediationContext,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    //! Reconciliation against a tower-test API server: each scenario states the requests
    //! the reconciler must make, in order, and what the server answers.

    use super::{
        effects::{eviction_outcome, references},
        *,
    };
    use crate::{
        hub::{TargetPod, WatchTargets},
        model::{EventAction, EventReason},
    };
    use http::{Method, Request, Response};
    use k8s_openapi::api::core::v1::{ContainerStatus, PodSpec, PodStatus};
    use kube::{client::Body, runtime::watcher::Event as WatchEvent};
    use resourcewatch_crds::{RemediationAction, ResourceWatchSpec};
    use resourcewatch_proto as pb;

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    /// Version-sensitive shapes on recorded objects (tests/fixtures/README.md).
    mod versions {
        use super::*;

        fn pod(json: &str) -> Pod {
            serde_json::from_str(json).expect("a Pod")
        }

        fn names(p: &Pod) -> Vec<String> {
            let mut n: Vec<String> = selected_pod(p).containers.into_values().collect();
            n.sort();
            n
        }

        #[test]
        fn a_slimmed_pod_reads_the_same_and_sheds_the_rest() {
            for json in [
                include_str!("../../tests/fixtures/k8s-1.20/pod-running.json"),
                include_str!("../../tests/fixtures/k8s-1.20/pod-init-running.json"),
                include_str!("../../tests/fixtures/k8s-1.37/pod-running.json"),
                include_str!("../../tests/fixtures/k8s-1.37/pod-init-running.json"),
                include_str!("../../tests/fixtures/k8s-1.37/pod-sidecar.json"),
            ] {
                let full = pod(json);
                let mut slim = full.clone();
                slim_pod(&mut slim);
                assert_eq!(selected_pod(&slim), selected_pod(&full));
                assert_eq!(is_terminal(&slim), is_terminal(&full));
                assert_eq!(slim.labels(), full.labels());
                assert_eq!(slim.owner_references(), full.owner_references());
                assert_eq!(
                    slim.metadata.deletion_timestamp,
                    full.metadata.deletion_timestamp
                );
                assert_eq!(is_ready(&slim), is_ready(&full));
                // What is shed: the spec but the node, conditions but Ready's status,
                // images, annotations.
                let spec = slim.spec.as_ref().unwrap();
                assert_eq!(spec.node_name, full.spec.as_ref().unwrap().node_name);
                assert!(spec.containers.is_empty() && spec.volumes.is_none());
                let status = slim.status.as_ref().unwrap();
                assert!(status.pod_ip.is_none());
                assert!(
                    status
                        .conditions
                        .iter()
                        .flatten()
                        .all(|c| c.type_ == "Ready"
                            && c.message.is_none()
                            && c.last_transition_time.is_none())
                );
                assert!(
                    status
                        .container_statuses
                        .iter()
                        .flatten()
                        .all(|c| c.image.is_empty())
                );
                assert!(slim.metadata.annotations.is_none());
                let size = |p: &Pod| serde_json::to_vec(p).map(|v| v.len()).unwrap_or(0);
                assert!(
                    size(&slim) < size(&full) * 2 / 3,
                    "{} of {}",
                    size(&slim),
                    size(&full)
                );
            }
        }

        #[test]
        fn containers_of_running_and_initialising_pods() {
            for (running, init) in [
                (
                    include_str!("../../tests/fixtures/k8s-1.20/pod-running.json"),
                    include_str!("../../tests/fixtures/k8s-1.20/pod-init-running.json"),
                ),
                (
                    include_str!("../../tests/fixtures/k8s-1.37/pod-running.json"),
                    include_str!("../../tests/fixtures/k8s-1.37/pod-init-running.json"),
                ),
            ] {
                let running = pod(running);
                assert_eq!(names(&running), ["app"]);
                let id = selected_pod(&running)
                    .containers
                    .into_keys()
                    .next()
                    .unwrap();
                assert_eq!(id.len(), 64, "the runtime prefix is cut: {id}");
                // Pending with its init container running: that one is tracked meanwhile.
                assert_eq!(names(&pod(init)), ["init"]);
            }
        }

        #[test]
        fn restartable_sidecars_are_tracked() {
            // Recorded on 1.37.2: the sidecar (an init container with restartPolicy
            // Always) runs beside the app; the completed migration is not tracked.
            let p = pod(include_str!(
                "../../tests/fixtures/k8s-1.37/pod-sidecar.json"
            ));
            assert_eq!(names(&p), ["app", "log-shipper"]);
            let sidecar = p.spec.as_ref().unwrap().init_containers.as_ref().unwrap()[1].clone();
            assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"));
            let done = &p
                .status
                .as_ref()
                .unwrap()
                .init_container_statuses
                .as_ref()
                .unwrap()[0];
            assert!(
                done.state
                    .as_ref()
                    .and_then(|s| s.terminated.as_ref())
                    .is_some_and(|t| t.exit_code == 0),
                "the migration completed: {done:?}"
            );
        }

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
        pods: &[Arc<Pod>],
        e: &EventSpec,
    ) -> (String, (ObjectReference, Option<ObjectReference>)) {
        let refs = references(rw, pods, e).expect("references");
        (format!("{}/{}", e.reason, e.action), refs)
    }

    #[test]
    fn events_about_different_containers_nodes_or_thresholds_are_not_folded() {
        let rw = watch_fixture(serde_json::json!({"selector": {}}));
        let pods: Vec<Arc<Pod>> = [("a", "uid-a"), ("b", "uid-b")]
            .into_iter()
            .map(|(n, u)| Arc::new(pod_fixture(n, u, CID_A, &[], "node-1")))
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

    const UID_A: &str = "3f1b2a6e-5c4d-4e8f-9a0b-1c2d3e4f5a6b";
    const CID_A: &str = "9c2bd5b1a0f3c7e2d4b6a8f0e1c3d5b7a9f1e3c5d7b9a1f3e5c7d9b1a3f5e7c9";

    fn watch_fixture(spec: serde_json::Value) -> ResourceWatch {
        let spec: ResourceWatchSpec = serde_json::from_value(spec).expect("spec");
        let mut rw = ResourceWatch::new("w", spec);
        rw.metadata.namespace = Some("ns".into());
        rw.metadata.generation = Some(1);
        rw.metadata.uid = Some("rw-uid".into());
        rw
    }

    fn pod_fixture(name: &str, uid: &str, cid: &str, labels: &[(&str, &str)], node: &str) -> Pod {
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

    fn context(
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
            pod_writer.apply_watcher_event(&WatchEvent::InitApply(p));
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
            metrics,
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

    async fn body_json(req: Request<Body>) -> serde_json::Value {
        let bytes = req.into_body().collect_bytes().await.expect("body");
        serde_json::from_slice(&bytes).expect("json body")
    }

    /// Expects a server-side-apply status patch; answers with the object; returns the
    /// status sent.
    async fn expect_status_apply(handle: &mut Handle, rw: &ResourceWatch) -> serde_json::Value {
        let (req, send) = handle.next_request().await.expect("a status write");
        assert_eq!(req.method(), Method::PATCH);
        let uri = req.uri().to_string();
        assert!(
            uri.starts_with(
                "/apis/resourcewatch.io/v1alpha1/namespaces/ns/resourcewatches/w/status?"
            ),
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
    async fn expect_event(handle: &mut Handle) -> (String, String, String) {
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

    fn reporting_hub(node: &str, report: pb::Report) -> Arc<Hub> {
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

    #[tokio::test]
    async fn a_reporting_watch_gets_its_status_and_a_ready_event() {
        let rw = watch_fixture(
            serde_json::json!({"selector": {"matchLabels": {"app": "api"}}, "topK": 3}),
        );
        let report = pb::Report {
            containers: vec![pb::ContainerReport {
                pod_uid: UID_A.into(),
                container_id: CID_A.into(),
                cpu_percent: 97.0,
                processes: vec![crate::status::process(42, "burn", 97.0, 10 << 20)],
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
        let rw = watch_fixture(
            serde_json::json!({"interval": "1s", "remediation": {"action": "Restart"}}),
        );
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
}
