//! Pre-OOM remediation: whether a leaking pod is restarted (evicted) before its predicted
//! OOM kill, and every rail that says no. Pure: the reconciler supplies the facts (the
//! watch's gate, the pod's controller, the workload's ledger) and carries out the
//! decision (ledger first, then the eviction).
//!
//! Gates, in order, each re-checked at every decision (also for an intent recorded
//! earlier): a fresh, confident prediction below `minTimeToOOM` (a lost node's last
//! report never counts); `dryRun` and the operator's master switch only report
//! (`WouldRestart`); the namespace opted in by a cluster admin; a RemediationPolicy of
//! the namespace granting the watch, and covering the pod; the operator's own right to
//! evict there (the API server's answer, not a setting); a controller that replaces the
//! pod (never a bare pod); a ledger that can be trusted. Then the rails of the workload's
//! ledger, across every watch that selects it: one pending restart, a cooldown after a
//! restart, at most `maxRestarts` per `window`; and never the last Ready pod of a
//! workload that runs more than one (its other replicas are all starting, crashing or
//! evicted: evicting it takes the service down). A refusal is a decision for that moment:
//! the next reconcile decides again. PodDisruptionBudgets are the Eviction API's to
//! enforce; a refusal is retried every [`PDB_RETRY`] while the prediction holds.

use std::time::Duration;

use resourcewatch_crds::{LeakEntry, RemediationAction, RemediationOutcome};

use crate::{
    ledger::{Intent, Ledger, LedgerProblem, Workload},
    spec::WatchSettings,
};

/// The reasons are the API's (`status.remediations[].reason`): a new rail adds its own
/// there.
pub use resourcewatch_crds::RemediationReason;

/// How many of a workload's pods serve, as its controller counts them (its status).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replicas {
    /// `spec.replicas` (a DaemonSet: the pods it should run).
    pub desired: u32,
    /// `status.readyReplicas` (a DaemonSet: `numberReady`).
    pub ready: u32,
}

/// What the reconciler knows of a pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodFacts {
    pub name: String,
    pub uid: String,
    /// The controller that replaces it (a ReplicaSet's Deployment when there is one);
    /// None for a bare pod or one whose owner would not replace it.
    pub workload: Option<Workload>,
    pub deleting: bool,
    /// The RemediationPolicy that lets this watch restart this pod, if one does.
    pub granted_by: Option<String>,
    /// Why the workload's ledger cannot be trusted (deleted after it held restarts,
    /// unreadable); None when it can.
    pub ledger_problem: Option<LedgerProblem>,
    /// The pod's own Ready condition.
    pub ready: bool,
    /// Its workload's replicas, when the workload's status says.
    pub replicas: Option<Replicas>,
}

/// What holds for the whole watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gate {
    /// The operator's `--enable-remediation`.
    pub master_switch: bool,
    /// The namespace carries the admin's opt-in label.
    pub namespace_opted_in: bool,
    /// Ok(names) of the namespace's RemediationPolicies whose watchSelector takes this
    /// watch; else why none does.
    pub grant: Result<Vec<String>, NoGrant>,
    /// Whether the API server lets the operator itself evict in this namespace (a
    /// namespace admin binds `resourcewatch-evictor` to it); else why not.
    pub operator_may_evict: Result<(), NoEvictRight>,
}

/// Why no RemediationPolicy grants a watch restarts.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NoGrant {
    #[error(
        "no RemediationPolicy in {namespace} grants this watch restarts (a namespace admin creates one; the roles aggregated to `admin` may){}",
        ignored(.invalid)
    )]
    NoPolicy {
        namespace: String,
        /// Policies ignored for an invalid selector: `name (why)`.
        invalid: Vec<String>,
    },
    /// The operator's watch of RemediationPolicies fails: its store may hold a policy
    /// deleted meanwhile.
    #[error(
        "the operator's watch of RemediationPolicies is failing ({0}): no grant is trusted until it recovers"
    )]
    PoliciesFailing(String),
    #[error("the operator has not listed RemediationPolicies yet")]
    PoliciesNotListed,
}

fn ignored(invalid: &[String]) -> String {
    if invalid.is_empty() {
        String::new()
    } else {
        format!("; ignored as invalid: {}", invalid.join(", "))
    }
}

/// Why the operator may not evict in a namespace (a SelfSubjectAccessReview).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NoEvictRight {
    #[error(
        "the operator may not evict pods in {namespace}: a namespace admin binds the ClusterRole {role} to its ServiceAccount there (docs/security.md, Turning remediation on)"
    )]
    NotBound { namespace: String, role: String },
    /// The API server could not be asked (its error, as it said it).
    #[error("could not check the operator's eviction right: {0}")]
    Unchecked(String),
    #[error("checking the operator's eviction right timed out")]
    TimedOut,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Not (or no longer) a case for remediation.
    Nothing,
    /// Record the intent in the workload's ledger, then evict.
    Evict(Intent),
    /// The ledger already holds this pod's intent and every gate and rail still agrees:
    /// carry it out (an operator stopped between recording and evicting).
    Resume,
    /// Record and announce, touch nothing.
    Report {
        outcome: RemediationOutcome,
        reason: RemediationReason,
        message: String,
    },
}

/// What the namespace's RemediationPolicies grant one watch: the policies whose
/// `watchSelector` takes it, each with its `podSelector`. A policy with an invalid
/// selector grants nothing (and is named, so the watch's condition says why).
#[derive(Clone, Debug, Default)]
pub struct Grants {
    pub policies: Vec<(String, resourcewatch_crds::PodSelector)>,
    pub invalid: Vec<String>,
}

impl Grants {
    pub fn of(
        policies: &[(String, resourcewatch_crds::RemediationPolicySpec)],
        watch_labels: &std::collections::BTreeMap<String, String>,
    ) -> Self {
        let mut g = Grants::default();
        for (name, spec) in policies {
            let valid = crate::spec::validate_selector(&spec.watch_selector)
                .and_then(|()| crate::spec::validate_selector(&spec.pod_selector));
            if let Err(e) = valid {
                g.invalid.push(format!("{name} ({e})"));
                continue;
            }
            let watches = crate::spec::pod_selector(&spec.watch_selector);
            if crate::spec::selects(&watches, watch_labels) {
                g.policies
                    .push((name.clone(), crate::spec::pod_selector(&spec.pod_selector)));
            }
        }
        g.policies.sort_by(|a, b| a.0.cmp(&b.0));
        g
    }

    /// The gate's view: the granting policies' names, or why there are none.
    pub fn gate(&self, ns: &str) -> Result<Vec<String>, NoGrant> {
        if !self.policies.is_empty() {
            return Ok(self.policies.iter().map(|(n, _)| n.clone()).collect());
        }
        Err(NoGrant::NoPolicy {
            namespace: ns.to_owned(),
            invalid: self.invalid.clone(),
        })
    }

    /// The first policy (by name) that covers a pod with these labels.
    pub fn covering(
        &self,
        pod_labels: &std::collections::BTreeMap<String, String>,
    ) -> Option<String> {
        self.policies
            .iter()
            .find(|(_, pods)| crate::spec::selects(pods, pod_labels))
            .map(|(n, _)| n.clone())
    }
}

/// A PDB refusal is retried this often while the pod still heads for an OOM kill.
pub const PDB_RETRY: Duration = Duration::from_secs(30);

/// The time to OOM remediation acts on: the prediction's lower bound, the earliest the
/// kill is likely (an agent older than the bound reports only the point).
pub fn acting_time_to_oom(leak: &LeakEntry) -> Option<f64> {
    let point = leak.time_to_oom_seconds?;
    Some(
        leak.time_to_oom_lower_bound_seconds
            .map_or(point, |low| low.min(point)),
    )
}

/// Restart when the earliest likely OOM kill is within `minTimeToOOM`, and the growth has
/// lasted at least as long as the time it has left. The second half is what keeps a
/// warm-up (a JVM expanding its heap, a cache filling) from being evicted: in its first
/// seconds it is indistinguishable from a leak, but it slows down, so its predicted time
/// to OOM grows faster than its age and the condition never holds. A leak at a steady
/// rate meets it halfway to its OOM kill. A report without the duration (an agent from
/// before it existed) is never acted on.
pub fn triggered(s: &WatchSettings, leak: &LeakEntry) -> bool {
    let Some(tto) = acting_time_to_oom(leak) else {
        return false;
    };
    s.action == RemediationAction::Restart
        && leak.confidence >= s.min_confidence
        && tto <= s.min_time_to_oom.as_secs_f64()
        && leak.growing_for_seconds.is_some_and(|g| g >= tto)
}

fn report(outcome: RemediationOutcome, reason: RemediationReason, message: String) -> Decision {
    Decision::Report {
        outcome,
        reason,
        message,
    }
}

fn ledger_reason(problem: &LedgerProblem) -> RemediationReason {
    match problem {
        LedgerProblem::Lost(_) => RemediationReason::LedgerLost,
        LedgerProblem::Unreadable(_) => RemediationReason::LedgerUnreadable,
        LedgerProblem::Contended(_) => RemediationReason::LedgerConflict,
    }
}

/// The gates: whether this watch may restart this pod at all (its settings, the operator,
/// the namespace's admin, its policies, the API server's answer, a controller, a ledger
/// to trust). Ok: the workload that replaces it.
fn gates<'a>(
    s: &WatchSettings,
    gate: &Gate,
    pod: &'a PodFacts,
    why: &str,
) -> Result<&'a Workload, Decision> {
    use RemediationOutcome::{Blocked, WouldRestart};
    if s.dry_run {
        return Err(report(
            WouldRestart,
            RemediationReason::DryRun,
            format!("would restart: {why} (dryRun)"),
        ));
    }
    if !gate.master_switch {
        return Err(report(
            WouldRestart,
            RemediationReason::RemediationDisabled,
            format!(
                "would restart: {why}, but remediation is off in the operator (--enable-remediation)"
            ),
        ));
    }
    if !gate.namespace_opted_in {
        return Err(report(
            Blocked,
            RemediationReason::NamespaceNotOptedIn,
            format!(
                "not restarted: {why}, but this namespace is not opted in (a cluster admin labels it {}={})",
                resourcewatch_crds::NAMESPACE_OPT_IN_LABEL,
                resourcewatch_crds::NAMESPACE_OPT_IN_VALUE
            ),
        ));
    }
    if let Err(e) = &gate.grant {
        return Err(report(
            Blocked,
            RemediationReason::NoRemediationPolicy,
            format!("not restarted: {why}, but {e}"),
        ));
    }
    if pod.granted_by.is_none() {
        return Err(report(
            Blocked,
            RemediationReason::NotAuthorized,
            format!(
                "not restarted: {why}, but no RemediationPolicy of this namespace covers pod {} (their podSelector)",
                pod.name
            ),
        ));
    }
    if let Err(e) = &gate.operator_may_evict {
        return Err(report(
            Blocked,
            RemediationReason::NoEvictionRights,
            format!("not restarted: {why}, but {e}"),
        ));
    }
    let Some(workload) = &pod.workload else {
        return Err(report(
            Blocked,
            RemediationReason::NoController,
            format!("not restarted: {why}, but no controller would replace this pod"),
        ));
    };
    if let Some(problem) = &pod.ledger_problem {
        return Err(report(
            Blocked,
            ledger_reason(problem),
            format!("not restarted: {why}, but {}", problem.message()),
        ));
    }
    Ok(workload)
}

/// The rails of the workload, across every watch that selects it: one pending restart,
/// `cooldown`, `maxRestarts` per `window`, its last Ready replica. Ok: whether this pod's
/// own recorded intent is being carried out (rather than a new one recorded).
fn rails(
    s: &WatchSettings,
    pod: &PodFacts,
    workload: &Workload,
    ledger: &Ledger,
    why: &str,
    now: i64,
) -> Result<bool, Decision> {
    use RemediationOutcome::Blocked;
    let resume = match ledger.live_pending(now) {
        Some(p) if p.pod_uid == pod.uid => true,
        Some(p) => {
            return Err(report(
                Blocked,
                RemediationReason::RestartInProgress,
                format!(
                    "not restarted: {why}, but pod {} of {} is being restarted",
                    p.pod, workload.kind_name
                ),
            ));
        }
        None => false,
    };
    if let Some(last) = ledger.restarts.iter().map(|r| r.at).max()
        && now - last < s.cooldown.as_secs() as i64
    {
        return Err(report(
            Blocked,
            RemediationReason::Cooldown,
            format!(
                "not restarted: {why}, but {} was restarted {}s ago (cooldown {}s)",
                workload.kind_name,
                now - last,
                s.cooldown.as_secs()
            ),
        ));
    }
    let in_window = ledger
        .restarts
        .iter()
        .filter(|r| now - r.at < s.window.as_secs() as i64)
        .count();
    if in_window >= s.max_restarts as usize {
        return Err(report(
            Blocked,
            RemediationReason::MaxRestarts,
            format!(
                "not restarted: {why}, but {} had {in_window} restarts in the last {}s (maxRestarts {})",
                workload.kind_name,
                s.window.as_secs(),
                s.max_restarts
            ),
        ));
    }
    if let Some(r) = pod.replicas
        && r.desired > 1
        && pod.ready
        && r.ready <= 1
    {
        return Err(report(
            Blocked,
            RemediationReason::LastReadyReplica,
            format!(
                "not restarted: {why}, but it is the only Ready pod of {} ({} of {} Ready): evicting it would leave none serving",
                workload.kind_name, r.ready, r.desired
            ),
        ));
    }
    Ok(resume)
}

/// `now` and ledger times are seconds since the epoch; `watch` is `namespace/name`.
pub fn decide(
    s: &WatchSettings,
    gate: &Gate,
    leak: &LeakEntry,
    pod: &PodFacts,
    ledger: Option<&Ledger>,
    watch: &str,
    now: i64,
) -> Decision {
    if !triggered(s, leak) || pod.deleting {
        return Decision::Nothing;
    }
    let tto = acting_time_to_oom(leak).unwrap_or(0.0);
    let why = format!(
        "predicted OOM kill in {tto:.0}s at the earliest (below minTimeToOOM {}s) at confidence {}",
        s.min_time_to_oom.as_secs(),
        leak.confidence
    );
    let workload = match gates(s, gate, pod, &why) {
        Ok(w) => w,
        Err(refused) => return refused,
    };
    let resume = match rails(
        s,
        pod,
        workload,
        ledger.unwrap_or(&Ledger::default()),
        &why,
        now,
    ) {
        Ok(resume) => resume,
        Err(refused) => return refused,
    };
    if resume {
        return Decision::Resume;
    }
    Decision::Evict(Intent {
        pod: pod.name.clone(),
        pod_uid: pod.uid.clone(),
        at: now,
        // The OOM kill would have happened by then: an older intent means nothing.
        expires: now + (tto.ceil() as i64).max(10),
        by: watch.to_owned(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::ledger::Restart;
    use resourcewatch_crds::ResourceWatchSpec;

    fn settings(json: serde_json::Value) -> WatchSettings {
        let spec: ResourceWatchSpec = serde_json::from_value(json).unwrap();
        WatchSettings::from_spec(&spec, &crate::spec::Floors::none()).unwrap()
    }

    fn restart(extra: serde_json::Value) -> WatchSettings {
        let mut r = serde_json::json!({"action": "Restart", "minTimeToOOM": "60s", "cooldown": "10m", "maxRestarts": 2, "window": "1h"});
        if let (Some(r), Some(e)) = (r.as_object_mut(), extra.as_object()) {
            r.extend(e.clone());
        }
        settings(serde_json::json!({"remediation": r}))
    }

    fn leak(tto: Option<f64>, confidence: u8) -> LeakEntry {
        LeakEntry {
            pod: "api-1".into(),
            container: "main".into(),
            node: "n".into(),
            growth_bytes_per_second: 2e6,
            confidence,
            time_to_oom_seconds: tto,
            time_to_oom_lower_bound_seconds: None,
            growing_for_seconds: Some(600.0),
            limit_bytes: Some(128 << 20),
            growth_sites: vec![],
        }
    }

    fn workload() -> Workload {
        Workload {
            namespace: "ns".into(),
            kind_name: "Deployment/api".into(),
        }
    }

    fn pod(bare: bool) -> PodFacts {
        PodFacts {
            name: "api-1".into(),
            uid: "uid-1".into(),
            workload: (!bare).then(workload),
            deleting: false,
            granted_by: Some("restarts".into()),
            ledger_problem: None,
            ready: true,
            replicas: None,
        }
    }

    fn open() -> Gate {
        Gate {
            master_switch: true,
            namespace_opted_in: true,
            grant: Ok(vec!["restarts".into()]),
            operator_may_evict: Ok(()),
        }
    }

    fn reason(d: &Decision) -> Option<(RemediationOutcome, RemediationReason)> {
        match d {
            Decision::Report {
                outcome, reason, ..
            } => Some((*outcome, *reason)),
            _ => None,
        }
    }

    fn restarted(at: i64) -> Restart {
        Restart {
            pod: "p".into(),
            pod_uid: format!("uid-{at}"),
            at,
            by: "ns/w".into(),
        }
    }

    #[test]
    fn remediation_acts_on_the_lower_bound_of_the_time_to_oom() {
        let s = restart(serde_json::json!({}));
        let mut l = leak(Some(120.0), 90);
        assert!(!triggered(&s, &l), "point 120 s, minTimeToOOM 60 s");
        l.time_to_oom_lower_bound_seconds = Some(50.0);
        assert!(triggered(&s, &l), "the earliest likely kill is within 60 s");
        // A bound above the point (a confused agent) is not trusted over the point.
        l.time_to_oom_lower_bound_seconds = Some(500.0);
        assert_eq!(acting_time_to_oom(&l), Some(120.0));
        // A growth younger than the time it has left: maybe a warm-up, wait.
        l.time_to_oom_lower_bound_seconds = Some(50.0);
        l.growing_for_seconds = Some(30.0);
        assert!(!triggered(&s, &l));
        l.growing_for_seconds = Some(50.0);
        assert!(triggered(&s, &l));
        l.growing_for_seconds = None;
        assert!(!triggered(&s, &l), "an older agent's report");
        l.growing_for_seconds = Some(50.0);
        // No point, no action, whatever the bound.
        l.time_to_oom_seconds = None;
        assert!(!triggered(&s, &l));
    }

    #[test]
    fn only_a_confident_prediction_below_the_threshold_triggers() {
        let s = restart(serde_json::json!({}));
        let d = decide(
            &s,
            &open(),
            &leak(Some(30.0), 90),
            &pod(false),
            None,
            "ns/w",
            1000,
        );
        assert_eq!(
            d,
            Decision::Evict(Intent {
                pod: "api-1".into(),
                pod_uid: "uid-1".into(),
                at: 1000,
                expires: 1030,
                by: "ns/w".into()
            })
        );
        for (tto, conf) in [(Some(300.0), 90), (Some(30.0), 40), (None, 90)] {
            assert_eq!(
                decide(&s, &open(), &leak(tto, conf), &pod(false), None, "ns/w", 0),
                Decision::Nothing
            );
        }
        let alert = settings(
            serde_json::json!({"remediation": {"action": "Alert", "minTimeToOOM": "60s"}}),
        );
        assert_eq!(
            decide(
                &alert,
                &open(),
                &leak(Some(30.0), 90),
                &pod(false),
                None,
                "ns/w",
                0
            ),
            Decision::Nothing
        );
    }

    #[test]
    fn every_gate_says_why_it_refuses() {
        let s = restart(serde_json::json!({}));
        let l = leak(Some(30.0), 90);
        let p = pod(false);
        let dry = restart(serde_json::json!({"dryRun": true}));
        assert_eq!(
            reason(&decide(&dry, &open(), &l, &p, None, "w", 0)),
            Some((RemediationOutcome::WouldRestart, RemediationReason::DryRun))
        );
        let off = Gate {
            master_switch: false,
            ..open()
        };
        assert_eq!(
            reason(&decide(&s, &off, &l, &p, None, "w", 0)),
            Some((
                RemediationOutcome::WouldRestart,
                RemediationReason::RemediationDisabled
            ))
        );
        let closed = Gate {
            namespace_opted_in: false,
            ..open()
        };
        assert_eq!(
            reason(&decide(&s, &closed, &l, &p, None, "w", 0)),
            Some((
                RemediationOutcome::Blocked,
                RemediationReason::NamespaceNotOptedIn
            ))
        );
        let ungranted = Gate {
            grant: Err(NoGrant::PoliciesNotListed),
            ..open()
        };
        let d = decide(&s, &ungranted, &l, &p, None, "w", 0);
        assert_eq!(
            reason(&d),
            Some((
                RemediationOutcome::Blocked,
                RemediationReason::NoRemediationPolicy
            ))
        );
        assert!(
            matches!(d, Decision::Report { message, .. } if message.contains("not listed RemediationPolicies yet"))
        );
        let uncovered = PodFacts {
            granted_by: None,
            ..pod(false)
        };
        assert_eq!(
            reason(&decide(&s, &open(), &l, &uncovered, None, "w", 0)),
            Some((
                RemediationOutcome::Blocked,
                RemediationReason::NotAuthorized
            ))
        );
        let powerless = Gate {
            operator_may_evict: Err(NoEvictRight::TimedOut),
            ..open()
        };
        assert_eq!(
            reason(&decide(&s, &powerless, &l, &p, None, "w", 0)),
            Some((
                RemediationOutcome::Blocked,
                RemediationReason::NoEvictionRights
            ))
        );
        let lost = PodFacts {
            ledger_problem: Some(crate::ledger::LedgerProblem::Lost("gone".into())),
            ..pod(false)
        };
        assert_eq!(
            reason(&decide(&s, &open(), &l, &lost, None, "w", 0)),
            Some((RemediationOutcome::Blocked, RemediationReason::LedgerLost))
        );
        let garbled = PodFacts {
            ledger_problem: Some(crate::ledger::LedgerProblem::Unreadable("?".into())),
            ..pod(false)
        };
        assert_eq!(
            reason(&decide(&s, &open(), &l, &garbled, None, "w", 0)),
            Some((
                RemediationOutcome::Blocked,
                RemediationReason::LedgerUnreadable
            ))
        );
        assert_eq!(
            reason(&decide(&s, &open(), &l, &pod(true), None, "w", 0)),
            Some((RemediationOutcome::Blocked, RemediationReason::NoController))
        );
    }

    #[test]
    fn policies_grant_by_watch_labels_and_cover_by_pod_labels() {
        use std::collections::BTreeMap;
        let spec = |json: serde_json::Value| -> resourcewatch_crds::RemediationPolicySpec {
            serde_json::from_value(json).unwrap()
        };
        let labels = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let policies = vec![
            (
                "b-web".to_string(),
                spec(serde_json::json!({"podSelector": {"matchLabels": {"tier": "web"}}})),
            ),
            (
                "a-team".to_string(),
                spec(serde_json::json!({"watchSelector": {"matchLabels": {"team": "a"}}})),
            ),
            (
                "bad".to_string(),
                spec(
                    serde_json::json!({"podSelector": {"matchExpressions": [{"key": "x", "operator": "In"}]}}),
                ),
            ),
        ];
        let g = Grants::of(&policies, &labels(&[]));
        assert_eq!(g.gate("ns"), Ok(vec!["b-web".to_string()]));
        assert_eq!(
            g.covering(&labels(&[("tier", "web")])).as_deref(),
            Some("b-web")
        );
        assert_eq!(g.covering(&labels(&[("tier", "db")])), None);
        let g = Grants::of(&policies, &labels(&[("team", "a")]));
        assert_eq!(
            g.gate("ns"),
            Ok(vec!["a-team".to_string(), "b-web".to_string()])
        );
        assert_eq!(
            g.covering(&labels(&[("tier", "db")])).as_deref(),
            Some("a-team")
        );
        let none = Grants::of(&policies[2..], &labels(&[]));
        let why = none.gate("ns").unwrap_err().to_string();
        assert!(
            why.contains("no RemediationPolicy in ns") && why.contains("bad ("),
            "{why}"
        );
        assert!(Grants::of(&[], &labels(&[])).gate("ns").is_err());
    }

    #[test]
    fn the_last_ready_pod_of_a_replicated_workload_is_kept() {
        let s = restart(serde_json::json!({}));
        let l = leak(Some(30.0), 90);
        let with = |desired, ready, pod_ready| {
            let mut p = pod(false);
            p.ready = pod_ready;
            p.replicas = Some(Replicas { desired, ready });
            decide(&s, &open(), &l, &p, None, "ns/w", 5)
        };
        // Three replicas, two of them starting or crashing: this one serves alone.
        assert_eq!(
            reason(&with(3, 1, true)),
            Some((
                RemediationOutcome::Blocked,
                RemediationReason::LastReadyReplica
            ))
        );
        let Decision::Report { message, .. } = with(3, 1, true) else {
            unreachable!()
        };
        assert!(message.contains("1 of 3 Ready"), "{message}");
        // Another replica serves; a pod that is not Ready serves nobody; a workload of
        // one replica promised no availability (a PodDisruptionBudget can still say no);
        // a workload whose status says nothing is not guessed at.
        assert!(matches!(with(3, 2, true), Decision::Evict(_)));
        assert!(matches!(with(3, 1, false), Decision::Evict(_)));
        assert!(matches!(with(1, 1, true), Decision::Evict(_)));
        let mut p = pod(false);
        p.replicas = None;
        assert!(matches!(
            decide(&s, &open(), &l, &p, None, "ns/w", 5),
            Decision::Evict(_)
        ));
    }

    #[test]
    fn the_workload_ledger_holds_the_rails_for_every_watch() {
        let s = restart(serde_json::json!({}));
        let l = leak(Some(30.0), 90);
        let p = pod(false);
        let other_pending = Ledger {
            pending: Some(Intent {
                pod: "api-0".into(),
                pod_uid: "uid-0".into(),
                at: 0,
                expires: 60,
                by: "ns/other-watch".into(),
            }),
            ..Default::default()
        };
        assert_eq!(
            reason(&decide(
                &s,
                &open(),
                &l,
                &p,
                Some(&other_pending),
                "ns/w",
                5
            )),
            Some((
                RemediationOutcome::Blocked,
                RemediationReason::RestartInProgress
            ))
        );
        // An expired intent is no intent.
        assert!(matches!(
            decide(&s, &open(), &l, &p, Some(&other_pending), "ns/w", 61),
            Decision::Evict(_)
        ));
        // This pod's own intent, still holding: carried out (by whichever watch sees it).
        let mine = Ledger {
            pending: Some(Intent {
                pod_uid: "uid-1".into(),
                expires: 60,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            decide(&s, &open(), &l, &p, Some(&mine), "ns/w2", 5),
            Decision::Resume
        );
        let recent = Ledger {
            restarts: vec![restarted(0)],
            ..Default::default()
        };
        assert_eq!(
            reason(&decide(&s, &open(), &l, &p, Some(&recent), "ns/w", 300)),
            Some((RemediationOutcome::Blocked, RemediationReason::Cooldown))
        );
        assert!(matches!(
            decide(&s, &open(), &l, &p, Some(&recent), "ns/w", 700),
            Decision::Evict(_)
        ));
        let two = Ledger {
            restarts: vec![restarted(0), restarted(1000)],
            ..Default::default()
        };
        assert_eq!(
            reason(&decide(&s, &open(), &l, &p, Some(&two), "ns/w", 2000)),
            Some((RemediationOutcome::Blocked, RemediationReason::MaxRestarts))
        );
        assert!(
            matches!(
                decide(&s, &open(), &l, &p, Some(&two), "ns/w", 3700),
                Decision::Evict(_)
            ),
            "the window slid"
        );
    }
}
