//! The plan's effects on the API server: ledger writes, evictions with their follow-ups,
//! status writes and Events.

use super::*;

/// Evicts one pod and records the answer in its workload's ledger (versioned: on a
/// conflict, read again and retried) and in the status.
pub(super) async fn evict_and_record(
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

/// Counts each remediation record a written status added, by its reason: every decision
/// (Decided, Evicted, DryRun, Cooldown, NotAuthorized, ...) once, however many reconciles
/// repeat it.
pub(super) fn count_remediations(
    ctx: &Context,
    namespace: &str,
    old: &[RemediationRecord],
    new: &[RemediationRecord],
) {
    for r in decide::new_records(old, new) {
        ctx.metrics.remediation(namespace, r.reason.as_str());
    }
}

pub(super) async fn apply_ledger(
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
pub(super) async fn evict(ctx: &Context, ns: &str, ev: &decide::Eviction) -> Option<EvictResult> {
    evict_pod(
        ctx.eviction_client.clone(),
        ns,
        &ev.pod,
        &ev.pod_uid,
        ctx.write_timeout,
    )
    .await
}

/// Evicts pod `name` of `ns` only if it is still the pod with `uid`, the one decided on: a
/// pod replaced under the same name in between (a StatefulSet's) answers 409 Conflict and
/// is not touched, which counts as the decided pod being gone. None: a transient
/// failure, to retry.
pub async fn evict_pod(
    client: kube::Client,
    ns: &str,
    name: &str,
    uid: &str,
    timeout: std::time::Duration,
) -> Option<EvictResult> {
    let pods: Api<Pod> = Api::namespaced(client, ns);
    let body = eviction_body(name, uid);
    let pp = kube::api::PostParams::default();
    let evicted = pods.create_subresource::<_, kube::core::Status>("eviction", name, &pp, &body);
    match tokio::time::timeout(timeout, evicted).await {
        Ok(r) => eviction_outcome(r).unwrap_or_else(|e| {
            tracing::warn!(pod = %name, error = %e, "eviction failed; retrying");
            None
        }),
        Err(_) => {
            tracing::warn!(pod = %name, "eviction timed out; retrying");
            None
        }
    }
}

/// The body of an eviction of pod `name`, decided on as the pod with `uid`. Built here,
/// not by kube's `Api::evict`: kube-core 5.0.0 sends its delete options as
/// `delete_options`, a field the API server does not know and drops, so a UID
/// precondition never reached it (the e2e-api test saw the replacement pod evicted).
/// No apiVersion or kind: the API server decodes the body as the subresource's own kind
/// on every version (policy/v1beta1 on 1.20, policy/v1 from 1.22; v1beta1 is gone from
/// 1.25), so one request serves them all.
pub(super) fn eviction_body(name: &str, uid: &str) -> serde_json::Value {
    let mut body = serde_json::json!({"metadata": {"name": name}});
    if !uid.is_empty() {
        body["deleteOptions"] = serde_json::json!({"preconditions": {"uid": uid}});
    }
    body
}

/// What an eviction's answer means. The same on every version: the Eviction subresource
/// answers 201, a 429 Status (reason `TooManyRequests`, cause `DisruptionBudget`) when a
/// PodDisruptionBudget refuses, whether PDBs are policy/v1beta1 (1.20) or policy/v1
/// (1.21+), 404 for a pod already gone, and 409 Conflict when the pod of that name is
/// not the one decided on (its UID precondition failed): that pod is gone too. Anything
/// else is retried (Err).
pub(super) fn eviction_outcome(
    r: std::result::Result<kube::core::Status, kube::Error>,
) -> std::result::Result<Option<EvictResult>, kube::Error> {
    match r {
        Ok(_) => Ok(Some(EvictResult::Evicted)),
        Err(kube::Error::Api(e)) if e.code == 429 => Ok(Some(EvictResult::Refused(e.message))),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(Some(EvictResult::Gone)),
        Err(e) => Err(e),
    }
}

pub(super) async fn write_status(
    ctx: &Context,
    ns: &str,
    name: &str,
    status: &ResourceWatchStatus,
) -> Result<()> {
    apply_status::<ResourceWatch>(
        &ctx.client,
        Some(ns),
        name,
        status,
        &ctx.metrics,
        ctx.write_timeout,
    )
    .await
}

/// The objects an Event names: `regarding` (what it is on: the watch, or one of its pods)
/// and `related`. None when it is on a pod that is gone.
pub(super) fn references(
    rw: &ResourceWatch,
    pods: &[Arc<SelectedPod>],
    e: &EventSpec,
) -> Option<(ObjectReference, Option<ObjectReference>)> {
    let mut watch = rw.object_ref(&());
    // A selected pod by name and UID; a pod gone since by name.
    let pod_ref = |name: &str, uid: Option<&str>| ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: rw.namespace(),
        name: Some(name.to_owned()),
        uid: uid.map(str::to_owned),
        ..Default::default()
    };
    let subject = e.about.as_ref().map(|s| match s {
        Subject::Container { pod, container } => {
            let mut r = pod_ref(
                pod,
                pods.iter().find(|p| p.name == *pod).map(|p| p.uid.as_str()),
            );
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
            let pod = pods.iter().find(|p| p.name == *name)?;
            let mut regarding = pod_ref(&pod.name, Some(&pod.uid));
            // The container within the pod, when the Event is about one of them.
            regarding.field_path = subject
                .filter(|s| s.name.as_deref() == Some(name.as_str()))
                .and_then(|s| s.field_path);
            Some((regarding, Some(watch)))
        }
    }
}

pub(super) async fn publish(
    ctx: &Context,
    rw: &ResourceWatch,
    pods: &[Arc<SelectedPod>],
    e: &EventSpec,
) {
    let Some((regarding, related)) = references(rw, pods, e) else {
        return;
    };
    ctx.events
        .publish(events::Publication {
            warning: e.warning,
            reason: e.reason.as_str().into(),
            // events.k8s.io/v1 refuses a note over 1 kB.
            note: e.note.chars().take(1000).collect(),
            action: e.action.as_str().into(),
            regarding,
            related,
        })
        .await;
}
