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
    pods::{CachedPod, is_ready, is_terminal, selected_pod, slim_pod},
    profile, profile_store,
    remediation::{Gate, Grants, NoEvictRight, NoGrant, PodFacts, Replicas},
    spec::{Floors, WatchSettings, selects},
    status::{EventSpec, Inputs, SelectedPod, Subject},
    status_write::apply_status,
    triggers::{PodTriggers, Selection},
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
    pub pods: Store<CachedPod>,
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
    /// Sends each stored CPU profile to the cluster's OTLP collector, when one is named.
    pub otlp: crate::otlp::Exporter,
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
    let (pods, finished) = match &settings {
        Ok(s) => select_pods(ctx, &ns, s),
        Err(_) => Default::default(),
    };
    let nodes: BTreeSet<String> = pods.iter().filter_map(|p| p.node.clone()).collect();
    let views = ctx.hub.view(&nodes);
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
        gather(ctx, rw, &ns, &pods, &names, settings.as_ref().ok()).await?
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
        selected: &pods,
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

/// The pods of `ns` the watch's selector matches, from the pod index (crate::triggers:
/// through its labels when the selector has an equality it can use): the running ones,
/// and those that finished (Succeeded, Failed) or were deleted in the last ten minutes
/// (at most `MAX_FINISHED_PODS`, the deleted last).
fn select_pods(
    ctx: &Context,
    ns: &str,
    s: &WatchSettings,
) -> (Vec<Arc<SelectedPod>>, Vec<Arc<SelectedPod>>) {
    let (selection, departed) = {
        let index = ctx.pod_index.lock().unwrap_or_else(|e| e.into_inner());
        (
            index.select(ns, &s.selector, &s.pods),
            index.departed.in_namespace(ns, std::time::Instant::now()),
        )
    };
    // Before the index's first list is done (the cache may be ready a moment earlier):
    // the cache itself, every pod of the namespace tested.
    let Selection {
        running,
        mut finished,
    } = selection.unwrap_or_else(|| {
        let (finished, running): (Vec<Arc<CachedPod>>, Vec<Arc<CachedPod>>) = ctx
            .pods
            .state()
            .into_iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(ns))
            .filter(|p| selects(&s.pods, p.labels()))
            .partition(|p| is_terminal(p));
        let made = |v: Vec<Arc<CachedPod>>| v.iter().map(|p| Arc::new(selected_pod(p))).collect();
        Selection {
            running: made(running),
            finished: made(finished),
        }
    });
    // Newest first. (A deleted pod's UID is in no running pod, even where its name was
    // taken again, a StatefulSet's: kills are matched by UID.)
    finished.extend(
        departed
            .into_iter()
            .rev()
            .filter(|p| selects(&s.pods, p.labels()))
            .map(|p| Arc::new(selected_pod(&p))),
    );
    finished.truncate(MAX_FINISHED_PODS);
    (running, finished)
}

/// One reconcile's watch and what was read for it, for carrying out its plan.
struct Run<'a> {
    ctx: &'a Context,
    rw: &'a ResourceWatch,
    key: &'a WatchKey,
    selected: &'a [Arc<SelectedPod>],
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
            ctx.metrics.remediation(ns, "LedgerConflict");
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
    }
    let mut events = std::mem::take(&mut plan.events);
    match (&plan.profile.effect, plan.status.profile.as_mut(), &result) {
        (Some(profile::Effect::Store), Some(p), Some(r)) => {
            let stored = profile_store::store(&ctx.client, ctx.write_timeout, run.rw, p, r)
                .await
                .map_err(|e| resourcewatch_runtime::error_chain(&e));
            if stored.is_ok() && r.error.is_empty() && !r.pprof.is_empty() {
                ctx.otlp.send(
                    crate::otlp::Source::Pprof(r.pprof.clone()),
                    crate::otlp::PodRef {
                        namespace: ns.to_owned(),
                        pod: p.pod.clone(),
                        node: p.node.clone(),
                    },
                );
            }
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
        count_remediations(ctx, ns, &before, &status.remediations);
    }
    for e in &events {
        publish(ctx, run.rw, run.selected, e).await;
    }
    send_growth_sites(ctx, ns, &status, &events);
    Ok(Action::requeue(plan.requeue))
}

/// The growth sites of each leak whose site an Event just announced, sent as a memory
/// profile to the cluster's OTLP collector (when one is named): once per announcement.
fn send_growth_sites(ctx: &Context, ns: &str, status: &ResourceWatchStatus, events: &[EventSpec]) {
    let announced: std::collections::BTreeSet<(&str, &str)> = events
        .iter()
        .filter(|e| {
            e.pod.is_none()
                && matches!(
                    e.reason,
                    crate::model::EventReason::LeakDetected
                        | crate::model::EventReason::LeakSiteFound
                )
        })
        .filter_map(|e| match &e.about {
            Some(Subject::Container { pod, container }) => Some((pod.as_str(), container.as_str())),
            _ => None,
        })
        .collect();
    for l in &status.leaks {
        if !announced.contains(&(l.pod.as_str(), l.container.as_str()))
            || crate::status::announced_site(l).is_none()
        {
            continue;
        }
        let tags = [resourcewatch_proto::pprof::Tag::Text(
            "container",
            l.container.clone(),
        )];
        let profile = resourcewatch_proto::pprof::growth(
            l.growth_sites
                .iter()
                .map(|s| (s.frames.as_slice(), s.bytes)),
            &tags,
            Duration::ZERO,
        );
        ctx.otlp.send(
            crate::otlp::Source::Profile(profile),
            crate::otlp::PodRef {
                namespace: ns.to_owned(),
                pod: l.pod.clone(),
                node: l.node.clone(),
            },
        );
    }
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
    count_remediations(ctx, &run.key.namespace, old_records, &status.remediations);
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
    ctx.metrics.retain_oom_series(|namespace, name| {
        live.contains(&WatchKey {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    });
    for k in ctx.hub.watch_keys() {
        if !live.contains(&k) {
            ctx.hub.remove_watch(&k);
        }
    }
}

/// What the controller is given besides its inputs.
pub struct Settings {
    pub reporter: Reporter,
    /// See [`Context::otlp`].
    pub otlp: crate::otlp::Exporter,
    /// See [`Context::eviction_client`].
    pub eviction_client: Client,
    /// See [`Context::remediation`].
    pub remediation: RemediationContext,
}

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod tests;
