//! The ResourceWatch controller: resolves each watch's pods to nodes, hands the hub what
//! the nodes must track, and writes what the agents reported into status (server-side
//! apply, field manager `resourcewatch-operator`), at most once per `interval` and only
//! when something changed, then publishes the Events of its transitions.

use std::{
    collections::BTreeSet,
    sync::Arc,
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        events::{Event as KubeEvent, EventType, Recorder, Reporter},
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use resourcewatch_crds::{ResourceWatch, ResourceWatchStatus};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;

use crate::{
    Error, FIELD_MANAGER, Result,
    hub::{Hub, TargetPod, WatchKey, WatchTargets},
    metrics::Metrics,
    spec::{WatchSettings, selects},
    status::{self, EventSpec, Inputs, Outcome, SelectedPod},
};

/// Everything a reconciliation needs; one per controller.
pub struct Context {
    /// Writes status and publishes Events.
    pub client: Client,
    /// Publishes Events as `resourcewatch-operator` (with this replica's name).
    pub reporter: Reporter,
    /// Desired node configuration and the agents' latest reports.
    pub hub: Arc<Hub>,
    pub metrics: Arc<Metrics>,
    /// Every pod in the cluster, from the controller's own pod watch (managed fields
    /// stripped).
    pub pods: Store<Pod>,
    /// The watches themselves, to forget deleted ones in the hub.
    pub watches: Store<ResourceWatch>,
    /// Only the leader reconciles: a follower would fight it over status.
    pub leader: watch::Receiver<bool>,
    /// Each status write and Event is bounded by this, so a slow API server cannot stall
    /// reconciliation of every other watch.
    pub write_timeout: Duration,
}

pub async fn reconcile(rw: Arc<ResourceWatch>, ctx: Arc<Context>) -> Result<Action> {
    let started = Instant::now();
    let result = reconcile_inner(&rw, &ctx).await;
    ctx.metrics
        .reconcile_seconds
        .observe(started.elapsed().as_secs_f64());
    ctx.metrics
        .reconciled(if result.is_ok() { "ok" } else { "error" });
    result
}

async fn reconcile_inner(rw: &ResourceWatch, ctx: &Context) -> Result<Action> {
    if !*ctx.leader.borrow() {
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    forget_deleted(ctx);
    let ns = rw.namespace().ok_or(Error::NotNamespaced)?;
    let key = WatchKey {
        namespace: ns.clone(),
        name: rw.name_any(),
    };
    let settings = WatchSettings::from_spec(&rw.spec);
    let selected: Vec<Arc<Pod>> = match &settings {
        Ok(s) => ctx
            .pods
            .state()
            .into_iter()
            .filter(|p| p.namespace().as_deref() == Some(ns.as_str()))
            .filter(|p| selects(&s.selector, p.labels()))
            .filter(|p| !is_terminal(p))
            .collect(),
        Err(_) => Vec::new(),
    };
    let pods: Vec<SelectedPod> = selected.iter().map(|p| selected_pod(p)).collect();
    match &settings {
        Ok(s) => ctx.hub.set_watch(
            key.clone(),
            WatchTargets {
                top_k: s.top_k,
                interval: s.interval,
                leaks_enabled: s.leaks_enabled,
                min_confidence: s.min_confidence,
                horizon: s.horizon,
                pods: target_pods(&ns, &pods),
            },
        ),
        Err(_) => ctx.hub.remove_watch(&key),
    }
    let nodes: BTreeSet<String> = pods.iter().filter_map(|p| p.node.clone()).collect();
    let views = ctx.hub.view(&nodes);
    let now = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())
        .map_err(|e| Error::Internal(e.to_string()))?
        .to_string();
    let old = rw.status.as_ref();
    let interval = settings
        .as_ref()
        .map(|s| s.interval)
        .unwrap_or(Duration::from_secs(30));
    let (status, events) = match status::compute(&Inputs {
        generation: rw.meta().generation,
        settings: &settings,
        pods: &pods,
        nodes: &views,
        old,
        now: &now,
    }) {
        // Agents are reconnecting: look again soon.
        Outcome::Hold => return Ok(Action::requeue(Duration::from_secs(2))),
        Outcome::Write { status, events } => (status, events),
    };
    let same_generation = old.and_then(|o| o.observed_generation) == rw.meta().generation;
    if let Some(o) = old
        && same_generation
        && status::same_content(o, &status)
    {
        ctx.metrics.status_skipped.inc();
        return Ok(Action::requeue(interval));
    }
    // At most one write per interval, unless the user changed the spec or a condition
    // changed (a lost agent should not wait 30 s to show).
    if let Some(o) = old
        && same_generation
        && o.conditions == status.conditions
        && let Some(wait) = time_until_next_write(o, interval)
    {
        ctx.metrics.status_skipped.inc();
        return Ok(Action::requeue(wait));
    }
    write_status(ctx, &ns, &key.name, &status).await?;
    for e in &events {
        publish(ctx, rw, &selected, e).await;
    }
    Ok(Action::requeue(interval))
}

pub fn error_policy(rw: Arc<ResourceWatch>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(watch = %rw.name_any(), %error, "reconcile failed");
    ctx.metrics.reconciled("error_policy");
    Action::requeue(Duration::from_secs(10))
}

fn forget_deleted(ctx: &Context) {
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
    for k in ctx.hub.watch_keys() {
        if !live.contains(&k) {
            ctx.hub.remove_watch(&k);
        }
    }
}

fn is_terminal(p: &Pod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

pub fn selected_pod(p: &Pod) -> SelectedPod {
    let containers = p
        .status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .filter_map(|c| {
            let id = c.container_id.as_deref()?;
            // "containerd://abc…", "cri-o://abc…", "docker://abc…"
            let id = id.split_once("://").map_or(id, |(_, id)| id);
            Some((id.to_owned(), c.name.clone()))
        })
        .collect();
    SelectedPod {
        uid: p.uid().unwrap_or_default(),
        name: p.name_any(),
        node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
        containers,
    }
}

fn target_pods(ns: &str, pods: &[SelectedPod]) -> Vec<TargetPod> {
    pods.iter()
        .filter_map(|p| {
            Some(TargetPod {
                uid: p.uid.clone(),
                namespace: ns.to_owned(),
                name: p.name.clone(),
                node: p.node.clone()?,
                containers: p
                    .containers
                    .iter()
                    .map(|(id, name)| (name.clone(), id.clone()))
                    .collect(),
            })
        })
        .collect()
}

fn time_until_next_write(old: &ResourceWatchStatus, interval: Duration) -> Option<Duration> {
    let last: jiff::Timestamp = old.last_update_time.as_deref()?.parse().ok()?;
    let age = jiff::Timestamp::now().duration_since(last);
    let age = Duration::try_from(age).ok()?;
    interval.checked_sub(age).filter(|d| !d.is_zero())
}

async fn write_status(
    ctx: &Context,
    ns: &str,
    name: &str,
    status: &ResourceWatchStatus,
) -> Result<()> {
    let api: Api<ResourceWatch> = Api::namespaced(ctx.client.clone(), ns);
    let patch = serde_json::json!({
        "apiVersion": "resourcewatch.io/v1alpha1",
        "kind": "ResourceWatch",
        "status": status,
    });
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    match tokio::time::timeout(
        ctx.write_timeout,
        api.patch_status(name, &pp, &Patch::Apply(&patch)),
    )
    .await
    {
        Ok(Ok(_)) => {
            ctx.metrics.status_write("ok");
            Ok(())
        }
        Ok(Err(e)) => {
            ctx.metrics.status_write("error");
            Err(Error::Kube(e))
        }
        Err(_) => {
            ctx.metrics.status_write("timeout");
            Err(Error::Timeout("status write"))
        }
    }
}

async fn publish(ctx: &Context, rw: &ResourceWatch, pods: &[Arc<Pod>], e: &EventSpec) {
    let reference: ObjectReference = match &e.pod {
        None => rw.object_ref(&()),
        Some(name) => match pods.iter().find(|p| p.name_any() == *name) {
            Some(p) => p.object_ref(&()),
            None => return,
        },
    };
    let recorder = Recorder::new(ctx.client.clone(), ctx.reporter.clone());
    let ev = KubeEvent {
        type_: if e.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: e.reason.into(),
        note: Some(e.note.chars().take(1000).collect()),
        action: e.action.into(),
        secondary: e.pod.as_ref().map(|_| rw.object_ref(&())),
    };
    match tokio::time::timeout(ctx.write_timeout, recorder.publish(&ev, &reference)).await {
        Ok(Ok(())) => ctx.metrics.event(e.reason),
        Ok(Err(err)) => {
            tracing::warn!(reason = e.reason, error = %err, "could not publish an Event")
        }
        Err(_) => tracing::warn!(reason = e.reason, "publishing an Event timed out"),
    }
}

/// Builds the controller and runs it until `shutdown`.
pub async fn run(
    client: Client,
    hub: Arc<Hub>,
    metrics: Arc<Metrics>,
    reporter: Reporter,
    leader: watch::Receiver<bool>,
    shutdown: watch::Receiver<bool>,
) {
    let watches: Api<ResourceWatch> = Api::all(client.clone());
    let (pods, pods_writer) = reflector::store();
    let pod_stream = reflector::reflector(
        pods_writer,
        watcher(Api::<Pod>::all(client.clone()), watcher::Config::default())
            .modify(|p| p.managed_fields_mut().clear()),
    )
    .default_backoff()
    .touched_objects();
    let controller = Controller::new(watches, watcher::Config::default().any_semantic());
    let rw_store = controller.store();
    let mapper_store = rw_store.clone();
    // Any change of a pod may change the watches of its namespace: labels, node, container
    // ids. Mapping to every watch of the namespace also catches pods leaving a selector.
    let controller = controller.watches_stream(pod_stream, move |pod: Pod| {
        let ns = pod.namespace();
        mapper_store
            .state()
            .into_iter()
            .filter(|w| w.namespace() == ns)
            .map(|w| ObjectRef::from_obj(&*w))
            .collect::<Vec<_>>()
    });
    let hub_changes = WatchStream::new(hub.subscribe_changes()).map(|_| ());
    let leader_changes = WatchStream::new(leader.clone()).map(|_| ());
    let ctx = Arc::new(Context {
        client,
        reporter,
        hub,
        metrics: metrics.clone(),
        pods,
        watches: rw_store,
        leader,
        write_timeout: Duration::from_secs(10),
    });
    let mut shutdown_signal = shutdown.clone();
    metrics
        .ready
        .store(true, std::sync::atomic::Ordering::SeqCst);
    controller
        .reconcile_all_on(futures::stream::select(hub_changes, leader_changes))
        .graceful_shutdown_on(async move {
            let _ = shutdown_signal.wait_for(|s| *s).await;
        })
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "controller");
            }
        })
        .await;
}
