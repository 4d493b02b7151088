//! What a remediation decision needs from the API server, read only for the pods it may
//! concern: each pod's workload (through its verified owners) and that workload's
//! ledger, and the watch's gate (the namespace's opt-in, the RemediationPolicies' grant,
//! the operator's own eviction right).

use super::*;

/// What a remediation decision needs from the API server.
#[derive(Default)]
pub(super) struct Facts {
    pub(super) gate: Option<Gate>,
    pub(super) pods: BTreeMap<String, PodFacts>,
    pub(super) ledgers: BTreeMap<Workload, Versioned>,
}

pub(super) async fn gather(
    ctx: &Context,
    rw: &ResourceWatch,
    ns: &str,
    selected: &[Arc<SelectedPod>],
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
        // The pod as the cache holds it now, if it is still the one selected (a pod
        // made again under its name since is another pod).
        let Some(pod) = selected.iter().find(|p| p.name == *name).and_then(|s| {
            ctx.pods
                .get(&ObjectRef::new(name).within(ns))
                .filter(|p| p.metadata.uid.as_deref() == Some(s.uid.as_str()))
        }) else {
            continue;
        };
        let (workload, replicas) = workload_of(ctx, &pod).await.unzip();
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
            ready: is_ready(&pod),
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
        facts.gate = Some(gate(ctx, ns, &grants).await?);
    }
    Ok(facts)
}

/// The gate of a `Restart` watch: the master switch, the namespace's opt-in, the grant of
/// a RemediationPolicy, and (asked of the API server only when it can matter: it is the
/// last gate) the operator's own eviction right in the namespace.
pub(super) async fn gate(ctx: &Context, ns: &str, grants: &Grants) -> Result<Gate> {
    let master_switch = ctx.remediation.enabled;
    let namespace_opted_in = namespace_opted_in(ctx, ns).await?;
    let grant = match policies_unknown(ctx) {
        Some(why) => Err(why),
        None => grants.gate(ns),
    };
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
pub(super) fn policies_unknown(ctx: &Context) -> Option<NoGrant> {
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
pub(super) fn policies_in(
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
pub(super) fn known_restarts(
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
pub(super) const EVICT_RIGHT_TTL: Duration = Duration::from_secs(10);

/// Whether the API server lets this operator evict pods in `ns` (a
/// SelfSubjectAccessReview): the ClusterRole it runs with has no eviction right; a
/// namespace admin grants it per namespace by binding the evictor ClusterRole.
pub(super) async fn operator_may_evict(
    ctx: &Context,
    ns: &str,
) -> std::result::Result<(), NoEvictRight> {
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

pub(super) async fn namespace_opted_in(ctx: &Context, ns: &str) -> Result<bool> {
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

/// The controller that would replace `pod`, as `Kind/name`, with its replicas as its
/// status counts them: a ReplicaSet's Deployment, a StatefulSet, a DaemonSet, a ReplicaSet
/// or ReplicationController; None for bare pods and Jobs. Looked up in the API for every
/// kind: a pod's ownerReferences are written by whoever creates the pod, so one naming a
/// StatefulSet that does not exist (or another object of that name) must not make a bare
/// pod evictable. The owner must exist with the UID the reference names.
pub(super) async fn workload_of(
    ctx: &Context,
    pod: &CachedPod,
) -> Option<(String, Option<Replicas>)> {
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
pub(super) async fn verified_owner<K>(
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
