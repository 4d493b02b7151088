//! The ResourceWatch controller: resolves each watch's pods to nodes, hands the hub what
//! the nodes must track, gathers what a decision needs, and carries out the plan of
//! [`decide::decide`]: the workload ledger, the status (server-side apply, field manager
//! `resourcewatch-operator`), evictions, Events. Only I/O lives here.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, ObjectReference, Pod};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{EvictParams, PostParams},
    runtime::{
        Controller, Predicate, PredicateConfig, WatchStreamExt,
        controller::Action,
        events::{Event as KubeEvent, EventType, Recorder, Reporter},
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
    /// Publishes Events as `resourcewatch-operator` (with this replica's name).
    pub recorder: Recorder,
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
    let selected = match &settings {
        Ok(s) => select_pods(ctx, &ns, s),
        Err(_) => Vec::new(),
    };
    let pods: Vec<SelectedPod> = selected.iter().map(|p| selected_pod(p)).collect();
    let nodes: BTreeSet<String> = pods.iter().filter_map(|p| p.node.clone()).collect();
    let views = ctx.hub.view(&nodes);
    let now_s = jiff::Timestamp::now().as_second();
    let now = jiff::Timestamp::from_second(now_s)?.to_string();
    let status_inputs = Inputs {
        generation: rw.meta().generation,
        settings: &settings,
        pods: &pods,
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

/// The running pods of `ns` the watch's selector matches, from the pod cache (through the
/// label index when the selector has an equality it can use).
fn select_pods(ctx: &Context, ns: &str, s: &WatchSettings) -> Vec<Arc<Pod>> {
    let candidates = ctx
        .pod_index
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .candidates(ns, &s.selector);
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
    pods.into_iter()
        .filter(|p| selects(&s.pods, p.labels()))
        .filter(|p| !is_terminal(p))
        .collect()
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
            let stored = profile_store::store(&ctx.client, ctx.write_timeout, run.rw, p, r).await;
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
}

/// Evicts one pod and records the answer in its workload's ledger (versioned: on a
/// conflict, read again and retried) and in the status.
async fn evict_and_record(
    run: &Run<'_>,
    ev: &decide::Eviction,
    status: &mut ResourceWatchStatus,
    versions: &mut BTreeMap<Workload, Versioned>,
    events: &mut Vec<EventSpec>,
) -> Result<()> {
    let ctx = run.ctx;
    let Some(result) = evict(ctx, &run.key.namespace, ev).await else {
        return Ok(()); // a transient failure: the intent stays, the next reconcile retries
    };
    for _ in 0..3 {
        let entry = versions.entry(ev.workload.clone()).or_default();
        let mut book = entry.ledger.clone();
        let mut trial = status.clone();
        let more = decide::after_eviction(ev, &result, run.now_s, run.now, &mut trial, &mut book);
        match ctx
            .remediation
            .ledgers
            .write(&ev.workload, &book, entry.resource_version.as_deref())
            .await?
        {
            Ok(rv) => {
                *entry = Versioned {
                    ledger: book,
                    resource_version: Some(rv),
                    problem: None,
                };
                *status = trial;
                events.extend(more);
                return Ok(());
            }
            Err(Conflict) => {
                let known = known_restarts(run.rw, &ev.workload, run.settings, run.now_s);
                *entry = ctx.remediation.ledgers.read(&ev.workload, known).await?;
                if entry.problem.is_some() {
                    return Ok(());
                }
            }
        }
    }
    Ok(())
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

/// Counts each remediation record a written status added, by its reason: every decision
/// (Decided, Evicted, DryRun, Cooldown, NotAuthorized, ...) once, however many reconciles
/// repeat it.
fn count_remediations(ctx: &Context, old: &[RemediationRecord], new: &[RemediationRecord]) {
    for r in decide::new_records(old, new) {
        ctx.metrics.remediation(r.reason.as_str());
    }
}

/// What a remediation decision needs from the API server.
#[derive(Default)]
struct Facts {
    gate: Option<Gate>,
    pods: BTreeMap<String, PodFacts>,
    ledgers: BTreeMap<Workload, Versioned>,
}

async fn gather(
    ctx: &Context,
    rw: &ResourceWatch,
    ns: &str,
    selected: &[Arc<Pod>],
    names: &[String],
    settings: Option<&WatchSettings>,
) -> Result<Facts> {
    let mut facts = Facts::default();
    let restart = settings.is_some_and(|s| s.action == RemediationAction::Restart);
    let grants = if restart {
        Grants::of(&policies_in(ctx, ns), rw.labels())
    } else {
        Grants::default()
    };
    let now = jiff::Timestamp::now().as_second();
    for name in names {
        let Some(pod) = selected.iter().find(|p| p.name_any() == *name) else {
            continue;
        };
        let (workload, replicas) = workload_of(ctx, pod).await.unzip();
        let mut f = PodFacts {
            name: pod.name_any(),
            uid: pod.uid().unwrap_or_default(),
            workload: workload.map(|kind_name| Workload {
                namespace: ns.to_owned(),
                kind_name,
            }),
            deleting: pod.metadata.deletion_timestamp.is_some(),
            granted_by: grants.covering(pod.labels()),
            ledger_problem: None,
            ready: is_ready(pod),
            replicas: replicas.flatten(),
        };
        if let Some(w) = &f.workload {
            if !facts.ledgers.contains_key(w) {
                let known = known_restarts(rw, w, settings, now);
                facts
                    .ledgers
                    .insert(w.clone(), ctx.remediation.ledgers.read(w, known).await?);
            }
            f.ledger_problem = facts.ledgers.get(w).and_then(|v| v.problem.clone());
        }
        facts.pods.insert(f.uid.clone(), f);
    }
    if restart {
        facts.gate = Some(gate(ctx, rw, ns, &grants).await?);
    }
    Ok(facts)
}

/// The gate of a `Restart` watch: the master switch, the namespace's opt-in, the grant of
/// a RemediationPolicy, and (asked of the API server only when it can matter: it is the
/// last gate) the operator's own eviction right in the namespace.
async fn gate(ctx: &Context, rw: &ResourceWatch, ns: &str, grants: &Grants) -> Result<Gate> {
    let master_switch = ctx.remediation.enabled;
    let namespace_opted_in = namespace_opted_in(ctx, ns).await?;
    let grant = match policies_unknown(ctx) {
        Some(why) => Err(why),
        None => grants.gate(ns),
    }
    .map_err(|why| {
        if rw
            .annotations()
            .contains_key(resourcewatch_crds::LEGACY_AUTHORIZATION_ANNOTATION)
        {
            NoGrant::LegacyAnnotation(Box::new(why))
        } else {
            why
        }
    });
    let operator_may_evict = if master_switch && namespace_opted_in && grant.is_ok() {
        operator_may_evict(ctx, ns).await
    } else {
        Ok(())
    };
    Ok(Gate {
        master_switch,
        namespace_opted_in,
        grant,
        operator_may_evict,
    })
}

/// Why the policies cannot be trusted now: not listed yet, or their watch failing.
fn policies_unknown(ctx: &Context) -> Option<NoGrant> {
    if let Some(e) = ctx
        .policies_failing
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
    {
        return Some(NoGrant::PoliciesFailing(e.clone()));
    }
    // Not listed yet: an empty store would grant nothing anyway, but say why.
    let listed = futures::FutureExt::now_or_never(ctx.policies.wait_until_ready());
    match listed {
        Some(Ok(())) => None,
        _ => Some(NoGrant::PoliciesNotListed),
    }
}

/// The namespace's RemediationPolicies, from the controller's own watch of them.
fn policies_in(
    ctx: &Context,
    ns: &str,
) -> Vec<(String, resourcewatch_crds::RemediationPolicySpec)> {
    ctx.policies
        .state()
        .iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(ns))
        .map(|p| (p.name_any(), p.spec.clone()))
        .collect()
}

/// The newest restart of `w` this watch's status records, for a ledger found missing.
fn known_restarts(
    rw: &ResourceWatch,
    w: &Workload,
    settings: Option<&WatchSettings>,
    now: i64,
) -> Known {
    let last_restart_in_status = rw
        .status
        .iter()
        .flat_map(|s| s.remediations.iter())
        .filter(|r| r.action == RemediationOutcome::Restarted)
        .filter(|r| r.workload.as_deref() == Some(w.kind_name.as_str()))
        .filter_map(|r| r.time.parse::<jiff::Timestamp>().ok())
        .map(|t| t.as_second())
        .max();
    Known {
        last_restart_in_status,
        counts_for: settings.map_or(ledger::KEEP_SECONDS, |s| {
            s.window.max(s.cooldown).as_secs() as i64
        }),
        now,
    }
}

/// How long the API server's answer on the operator's own eviction right is reused.
const EVICT_RIGHT_TTL: Duration = Duration::from_secs(10);

/// Whether the API server lets this operator evict pods in `ns` (a
/// SelfSubjectAccessReview): the ClusterRole it runs with has no eviction right; a
/// namespace admin grants it per namespace by binding the evictor ClusterRole.
async fn operator_may_evict(ctx: &Context, ns: &str) -> std::result::Result<(), NoEvictRight> {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    };
    if let Some((at, answer)) = ctx
        .remediation
        .evict_rights
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(ns)
        && at.elapsed() < EVICT_RIGHT_TTL
    {
        return answer.clone();
    }
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(ns.to_owned()),
                verb: Some("create".into()),
                group: Some(String::new()),
                resource: Some("pods".into()),
                subresource: Some("eviction".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(ctx.client.clone());
    let answer = match tokio::time::timeout(
        ctx.write_timeout,
        api.create(&PostParams::default(), &review),
    )
    .await
    {
        Ok(Ok(r)) if r.status.as_ref().is_some_and(|s| s.allowed) => Ok(()),
        Ok(Ok(_)) => Err(NoEvictRight::NotBound {
            namespace: ns.to_owned(),
            role: ctx.remediation.evictor_role.clone(),
        }),
        // Not cached: the next reconcile asks again.
        Ok(Err(e)) => return Err(NoEvictRight::Unchecked(e.to_string())),
        Err(_) => return Err(NoEvictRight::TimedOut),
    };
    ctx.remediation
        .evict_rights
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(ns.to_owned(), (std::time::Instant::now(), answer.clone()));
    answer
}

async fn namespace_opted_in(ctx: &Context, ns: &str) -> Result<bool> {
    let api: Api<Namespace> = Api::all(ctx.client.clone());
    let got = tokio::time::timeout(ctx.write_timeout, api.get_opt(ns))
        .await
        .map_err(|_| Error::Timeout("namespace read"))??;
    Ok(got.is_some_and(|n| {
        n.labels()
            .get(resourcewatch_crds::NAMESPACE_OPT_IN_LABEL)
            .map(String::as_str)
            == Some(resourcewatch_crds::NAMESPACE_OPT_IN_VALUE)
    }))
}

async fn apply_ledger(
    ctx: &Context,
    change: &LedgerChange,
    versions: &mut BTreeMap<Workload, Versioned>,
) -> Result<std::result::Result<(), Conflict>> {
    let w = match change {
        LedgerChange::Record { workload, .. } | LedgerChange::Clear { workload, .. } => workload,
    };
    let entry = versions.entry(w.clone()).or_default();
    if entry.problem.is_some() {
        // Never written over: an unreadable record is an admin's to repair, and a
        // missing one must stay missing until its restarts have aged out.
        return Ok(Ok(()));
    }
    let mut book: Ledger = entry.ledger.clone();
    match change {
        LedgerChange::Record { intent, .. } => book.pending = Some(intent.clone()),
        LedgerChange::Clear { pod_uid, .. } => {
            if book.pending.as_ref().is_some_and(|p| p.pod_uid == *pod_uid) {
                book.pending = None;
            }
        }
    }
    match ctx
        .remediation
        .ledgers
        .write(w, &book, entry.resource_version.as_deref())
        .await?
    {
        Ok(rv) => {
            *entry = Versioned {
                ledger: book,
                resource_version: Some(rv),
                problem: None,
            };
            Ok(Ok(()))
        }
        Err(c) => Ok(Err(c)),
    }
}

/// Evicts through the Eviction API (PodDisruptionBudgets hold; the pod's own termination
/// grace period applies). None: a transient failure, to retry.
async fn evict(ctx: &Context, ns: &str, ev: &decide::Eviction) -> Option<EvictResult> {
    let pods: Api<Pod> = Api::namespaced(ctx.eviction_client.clone(), ns);
    match tokio::time::timeout(
        ctx.write_timeout,
        pods.evict(&ev.pod, &EvictParams::default()),
    )
    .await
    {
        Ok(r) => eviction_outcome(r).unwrap_or_else(|e| {
            tracing::warn!(pod = %ev.pod, error = %e, "eviction failed; retrying");
            None
        }),
        Err(_) => {
            tracing::warn!(pod = %ev.pod, "eviction timed out; retrying");
            None
        }
    }
}

/// What an eviction's answer means. The same on every version: the Eviction subresource
/// answers 201, a 429 Status (reason `TooManyRequests`, cause `DisruptionBudget`) when a
/// PodDisruptionBudget refuses, whether PDBs are policy/v1beta1 (1.20) or policy/v1
/// (1.21+), and 404 for a pod already gone. Anything else is retried (Err).
fn eviction_outcome(
    r: std::result::Result<kube::core::Status, kube::Error>,
) -> std::result::Result<Option<EvictResult>, kube::Error> {
    match r {
        Ok(_) => Ok(Some(EvictResult::Evicted)),
        Err(kube::Error::Api(e)) if e.code == 429 => Ok(Some(EvictResult::Refused(e.message))),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(Some(EvictResult::Gone)),
        Err(e) => Err(e),
    }
}

/// The controller that would replace `pod`, as `Kind/name`, with its replicas as its
/// status counts them: a ReplicaSet's Deployment, a StatefulSet, a DaemonSet, a ReplicaSet
/// or ReplicationController; None for bare pods and Jobs. Looked up in the API for every
/// kind: a pod's ownerReferences are written by whoever creates the pod, so one naming a
/// StatefulSet that does not exist (or another object of that name) must not make a bare
/// pod evictable. The owner must exist with the UID the reference names.
async fn workload_of(ctx: &Context, pod: &Pod) -> Option<(String, Option<Replicas>)> {
    use k8s_openapi::api::{
        apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet},
        core::v1::ReplicationController,
    };
    let owner = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))?;
    let ns = pod.namespace()?;
    let replicas = |desired: Option<i32>, ready: Option<i32>| {
        let count = |n: Option<i32>| u32::try_from(n.unwrap_or(0)).unwrap_or(0);
        Some(Replicas {
            desired: count(desired),
            ready: count(ready),
        })
    };
    match owner.kind.as_str() {
        "ReplicaSet" => {
            let rs = verified_owner::<ReplicaSet>(ctx, &ns, owner).await?;
            // A Deployment's ReplicaSet: the Deployment is the workload, when it exists.
            if let Some(d) = rs
                .owner_references()
                .iter()
                .find(|o| o.controller == Some(true) && o.kind == "Deployment")
                && let Some(deployment) = verified_owner::<Deployment>(ctx, &ns, d).await
            {
                let status = deployment.status.unwrap_or_default();
                let desired = deployment.spec.and_then(|s| s.replicas);
                return Some((
                    format!("Deployment/{}", d.name),
                    replicas(desired, status.ready_replicas),
                ));
            }
            let ready = rs.status.and_then(|s| s.ready_replicas);
            let desired = rs.spec.and_then(|s| s.replicas);
            Some((
                format!("ReplicaSet/{}", owner.name),
                replicas(desired, ready),
            ))
        }
        "StatefulSet" => verified_owner::<StatefulSet>(ctx, &ns, owner)
            .await
            .map(|s| {
                let ready = s.status.and_then(|s| s.ready_replicas);
                let desired = s.spec.and_then(|s| s.replicas);
                (
                    format!("StatefulSet/{}", owner.name),
                    replicas(desired, ready),
                )
            }),
        "DaemonSet" => verified_owner::<DaemonSet>(ctx, &ns, owner).await.map(|d| {
            let status = d.status.unwrap_or_default();
            let counts = replicas(
                Some(status.desired_number_scheduled),
                status.number_ready.into(),
            );
            (format!("DaemonSet/{}", owner.name), counts)
        }),
        "ReplicationController" => verified_owner::<ReplicationController>(ctx, &ns, owner)
            .await
            .map(|r| {
                let ready = r.status.and_then(|s| s.ready_replicas);
                let desired = r.spec.and_then(|s| s.replicas);
                (
                    format!("ReplicationController/{}", owner.name),
                    replicas(desired, ready),
                )
            }),
        _ => None,
    }
}

/// The object an ownerReference names, if it exists with that UID (and API group).
async fn verified_owner<K>(
    ctx: &Context,
    ns: &str,
    owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
) -> Option<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    if owner.api_version != K::api_version(&K::DynamicType::default()) {
        return None;
    }
    let api: Api<K> = Api::namespaced(ctx.client.clone(), ns);
    let got = tokio::time::timeout(ctx.write_timeout, api.get_opt(&owner.name))
        .await
        .ok()?
        .ok()??;
    (got.meta().uid.as_deref() == Some(owner.uid.as_str())).then_some(got)
}

pub fn error_policy(rw: Arc<ResourceWatch>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(
        watch = %format!("{}/{}", rw.namespace().unwrap_or_default(), rw.name_any()),
        %error,
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

async fn write_status(
    ctx: &Context,
    ns: &str,
    name: &str,
    status: &ResourceWatchStatus,
) -> Result<()> {
    let api: Api<ResourceWatch> = Api::namespaced(ctx.client.clone(), ns);
    apply_status(&api, name, status, &ctx.metrics, ctx.write_timeout).await
}

/// The objects an Event names: `regarding` (what it is on: the watch, or one of its pods)
/// and `related`. None when it is on a pod that is gone.
fn references(
    rw: &ResourceWatch,
    pods: &[Arc<Pod>],
    e: &EventSpec,
) -> Option<(ObjectReference, Option<ObjectReference>)> {
    let mut watch = rw.object_ref(&());
    let subject = e.about.as_ref().map(|s| match s {
        Subject::Container { pod, container } => {
            let mut r = pods
                .iter()
                .find(|p| p.name_any() == *pod)
                .map(|p| p.object_ref(&()))
                .unwrap_or_else(|| ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    namespace: rw.namespace(),
                    name: Some(pod.clone()),
                    ..Default::default()
                });
            // How the kubelet names a container in its own Events.
            if !container.is_empty() {
                r.field_path = Some(format!("spec.containers{{{container}}}"));
            }
            r
        }
        Subject::Node(name) => ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(name.clone()),
            ..Default::default()
        },
    });
    match &e.pod {
        None => {
            watch.field_path = e.watch_field.map(Into::into);
            Some((watch, subject))
        }
        Some(name) => {
            let pod = pods.iter().find(|p| p.name_any() == *name)?;
            let mut regarding = pod.object_ref(&());
            // The container within the pod, when the Event is about one of them.
            regarding.field_path = subject
                .filter(|s| s.name.as_deref() == Some(name.as_str()))
                .and_then(|s| s.field_path);
            Some((regarding, Some(watch)))
        }
    }
}

async fn publish(ctx: &Context, rw: &ResourceWatch, pods: &[Arc<Pod>], e: &EventSpec) {
    let Some((reference, related)) = references(rw, pods, e) else {
        return;
    };
    let ev = KubeEvent {
        type_: if e.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: e.reason.as_str().into(),
        note: Some(e.note.chars().take(1000).collect()),
        action: e.action.as_str().into(),
        secondary: related,
    };
    match tokio::time::timeout(ctx.write_timeout, ctx.recorder.publish(&ev, &reference)).await {
        Ok(Ok(())) => ctx.metrics.event(e.reason.as_str()),
        Ok(Err(err)) => {
            tracing::warn!(reason = %e.reason, error = %err, "could not publish an Event")
        }
        Err(_) => tracing::warn!(reason = %e.reason, "publishing an Event timed out"),
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

/// The controller over the watch of ResourceWatches (into `store`). A watch is reconciled
/// when its spec (generation), annotations (profile request) or labels (a
/// RemediationPolicy's watchSelector) change, not on its status: each of the operator's
/// own status writes came back as a reconcile that found nothing to do (70 a second at
/// 500 watches).
fn controller(
    client: &Client,
    writer: reflector::store::Writer<ResourceWatch>,
    store: Store<ResourceWatch>,
) -> Controller<ResourceWatch> {
    let watches: Api<ResourceWatch> = Api::all(client.clone());
    let changes = watcher(watches, watcher::Config::default().any_semantic())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .predicate_filter(
            predicates::generation
                .combine(predicates::annotations)
                .combine(predicates::labels),
            PredicateConfig::default(),
        );
    // At most RECONCILE_CONCURRENCY at once: each holds a view of every pod and of its
    // nodes' reports, so hundreds of watches triggered together (a burst of pod changes)
    // multiplied the operator's memory; waiting requests for one watch merge meanwhile.
    Controller::for_stream(changes, store).with_config(
        kube::runtime::controller::Config::default().concurrency(RECONCILE_CONCURRENCY),
    )
}

/// The pod watch, into the controller's pod cache: each change yields the watches it
/// concerns.
fn pod_triggers(
    client: &Client,
    writer: reflector::store::Writer<Pod>,
    watches: Store<ResourceWatch>,
    index: Arc<std::sync::Mutex<PodTriggers>>,
) -> impl futures::Stream<Item = ObjectRef<ResourceWatch>> + use<> {
    reflector::reflector(
        writer,
        watcher(Api::<Pod>::all(client.clone()), watcher::Config::default()).modify(slim_pod),
    )
    .default_backoff()
    .flat_map(move |event| {
        let refs = match event {
            Ok(event) => index
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .on_event(&event, &watches.state()),
            Err(e) => {
                tracing::warn!(error = %e, "pod watch");
                Vec::new()
            }
        };
        futures::stream::iter(refs)
    })
}

/// The RemediationPolicy watch, into its store: a policy's change (or removal) reaches
/// every watch of its namespace at once (a revoked grant must stop evictions without
/// waiting for the next report). `failing` holds why the watch fails, until it delivers.
fn policy_triggers(
    client: &Client,
    writer: reflector::store::Writer<RemediationPolicy>,
    watches: Store<ResourceWatch>,
    failing: Arc<std::sync::Mutex<Option<String>>>,
) -> impl futures::Stream<Item = ObjectRef<ResourceWatch>> + use<> {
    reflector::reflector(
        writer,
        watcher(
            Api::<RemediationPolicy>::all(client.clone()),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .flat_map(move |event| {
        // While the watch fails (an object it cannot read, the API server gone), the store
        // may hold a policy deleted meanwhile: no grant is trusted until it recovers.
        let mut failing = failing.lock().unwrap_or_else(|e| e.into_inner());
        let ns: Vec<String> = match &event {
            Ok(watcher::Event::Apply(p) | watcher::Event::Delete(p)) => {
                *failing = None;
                p.metadata.namespace.iter().cloned().collect()
            }
            Ok(watcher::Event::InitDone) => {
                *failing = None;
                Vec::new()
            }
            Ok(_) => Vec::new(),
            Err(e) => {
                tracing::warn!(error = %e, "RemediationPolicy watch");
                *failing = Some(e.to_string());
                Vec::new()
            }
        };
        let refs: Vec<ObjectRef<ResourceWatch>> = watches
            .state()
            .iter()
            .filter(|w| {
                w.metadata
                    .namespace
                    .as_ref()
                    .is_some_and(|n| ns.contains(n))
            })
            .map(|w| ObjectRef::from_obj(w.as_ref()))
            .collect();
        futures::stream::iter(refs)
    })
}

/// Builds the controller and runs it until `shutdown`.
pub async fn run(
    client: Client,
    hub: Arc<Hub>,
    metrics: Arc<Metrics>,
    leader: watch::Receiver<bool>,
    shutdown: watch::Receiver<bool>,
    settings: Settings,
) {
    let (pods, pods_writer) = reflector::store();
    let (rw_store, rw_writer) = reflector::store();
    let controller = controller(&client, rw_writer, rw_store.clone());
    // A pod's change reaches only the watches that select it now or did before it
    // (crate::triggers), not every watch of its namespace.
    let pod_index = Arc::new(std::sync::Mutex::new(PodTriggers::default()));
    let pod_triggers = pod_triggers(&client, pods_writer, rw_store.clone(), pod_index.clone());
    let (policies, policies_writer) = reflector::store();
    let policies_failing: Arc<std::sync::Mutex<Option<String>>> = Default::default();
    let policy_triggers = policy_triggers(
        &client,
        policies_writer,
        rw_store.clone(),
        policies_failing.clone(),
    );
    let hub_changes = WatchStream::new(hub.subscribe_changes()).map(|_| ());
    let reconcile_triggers = match hub.take_reconcile_triggers() {
        Some(rx) => ReceiverStream::new(rx)
            .map(|k| ObjectRef::new(&k.name).within(&k.namespace))
            .boxed(),
        None => futures::stream::empty().boxed(),
    };
    let leader_changes = WatchStream::new(leader.clone()).map(|_| ());
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), settings.reporter),
        client,
        hub,
        metrics: metrics.clone(),
        pods,
        watches: rw_store,
        policies,
        policies_failing,
        profile_requests: Default::default(),
        leader,
        write_timeout: Duration::from_secs(10),
        forgotten_at: Default::default(),
        pod_index,
        eviction_client: settings.eviction_client,
        remediation: settings.remediation,
    });
    let node_view = crate::nodeview::run(
        ctx.client.clone(),
        ctx.hub.clone(),
        ctx.pods.clone(),
        metrics.clone(),
        ctx.leader.clone(),
        shutdown.clone(),
    );
    let mut shutdown_signal = shutdown.clone();
    metrics
        .ready
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let watches = controller
        .reconcile_all_on(futures::stream::select(hub_changes, leader_changes))
        .reconcile_on(futures::stream::select(
            reconcile_triggers,
            futures::stream::select(pod_triggers, policy_triggers),
        ))
        .graceful_shutdown_on(async move {
            let _ = shutdown_signal.wait_for(|s| *s).await;
        })
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "controller");
            }
        });
    tokio::join!(watches, node_view);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    //! Reconciliation against a tower-test API server: each scenario states the requests
    //! the reconciler must make, in order, and what the server answers.

    use super::*;
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
                include_str!("../tests/fixtures/k8s-1.20/pod-running.json"),
                include_str!("../tests/fixtures/k8s-1.20/pod-init-running.json"),
                include_str!("../tests/fixtures/k8s-1.37/pod-running.json"),
                include_str!("../tests/fixtures/k8s-1.37/pod-init-running.json"),
                include_str!("../tests/fixtures/k8s-1.37/pod-sidecar.json"),
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
                    include_str!("../tests/fixtures/k8s-1.20/pod-running.json"),
                    include_str!("../tests/fixtures/k8s-1.20/pod-init-running.json"),
                ),
                (
                    include_str!("../tests/fixtures/k8s-1.37/pod-running.json"),
                    include_str!("../tests/fixtures/k8s-1.37/pod-init-running.json"),
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
            let p = pod(include_str!("../tests/fixtures/k8s-1.37/pod-sidecar.json"));
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
                include_str!("../tests/fixtures/k8s-1.20/eviction-429.json"),
                include_str!("../tests/fixtures/k8s-1.37/eviction-429.json"),
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
        #[test]
        fn the_eviction_request_names_no_api_version() {
            let req = kube::core::Request::new("/api/v1/namespaces/ns/pods")
                .evict("app-1", &EvictParams::default())
                .expect("a request");
            assert_eq!(req.method(), Method::POST);
            assert_eq!(
                req.uri().path(),
                "/api/v1/namespaces/ns/pods/app-1/eviction"
            );
            let body: serde_json::Value = serde_json::from_slice(req.body()).expect("JSON");
            assert_eq!(body["metadata"]["name"], "app-1");
            assert!(
                body.get("apiVersion").is_none() && body.get("kind").is_none(),
                "{body}"
            );
        }

        #[test]
        fn events_k8s_io_v1_events_of_1_20_and_1_37_parse() {
            for json in [
                include_str!("../tests/fixtures/k8s-1.20/event-kubelet.json"),
                include_str!("../tests/fixtures/k8s-1.37/event-kubelet.json"),
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
        let ctx = Context {
            recorder: Recorder::new(
                client.clone(),
                Reporter {
                    controller: crate::FIELD_MANAGER.into(),
                    instance: None,
                },
            ),
            client,
            hub,
            metrics: Arc::new(Metrics::default()),
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
