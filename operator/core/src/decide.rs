//! A reconciliation's decisions, as one pure function: `decide(inputs) -> Plan`. The
//! controller gathers the inputs (the watch, its pods, what the agents reported, the
//! remediation gate and ledgers) and carries the plan out (ledger, status, evictions,
//! Events); nothing here talks to the API server, so every decision is unit-tested
//! without one.

use std::{collections::BTreeMap, time::Duration};

use resourcewatch_crds::{
    ConditionReason, ConditionStatus, LeakEntry, RemediationAction, RemediationOutcome,
    RemediationRecord, ResourceWatchStatus,
};

use crate::{
    ledger::{Intent, Ledger, Restart, Workload},
    model::{ConditionType, EventAction, EventReason},
    remediation::{self, Decision, Gate, PodFacts, RemediationReason},
    spec::WatchSettings,
    status::{self, EventSpec, Outcome, Subject},
};

pub struct Inputs<'a> {
    pub status: status::Inputs<'a>,
    /// `namespace/name` of the watch.
    pub watch: &'a str,
    /// Facts gathered for [`candidates`] only: the gate (None when there was nothing to
    /// gather), the candidate pods by UID, and their workloads' ledgers.
    pub gate: Option<&'a Gate>,
    pub pods: &'a BTreeMap<String, PodFacts>,
    pub ledgers: &'a BTreeMap<Workload, Ledger>,
    /// Seconds since the epoch.
    pub now: i64,
}

/// A change of a workload's ledger, written (with its version) before any eviction.
#[derive(Clone, Debug, PartialEq)]
pub enum LedgerChange {
    Record { workload: Workload, intent: Intent },
    Clear { workload: Workload, pod_uid: String },
}

/// An eviction to attempt once its intent is in the ledger.
#[derive(Clone, Debug, PartialEq)]
pub struct Eviction {
    pub pod: String,
    pub pod_uid: String,
    pub workload: Workload,
    pub watch: String,
    pub time_to_oom_seconds: Option<f64>,
    pub confidence: u8,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    /// Nothing new: look again after this.
    Skip(Duration),
    Now,
}

#[derive(Clone, Debug)]
pub struct Plan {
    /// Agents are reconnecting: keep the stored status, look again soon.
    pub hold: bool,
    pub status: ResourceWatchStatus,
    pub write: Write,
    pub events: Vec<EventSpec>,
    pub ledger: Vec<LedgerChange>,
    pub evictions: Vec<Eviction>,
    pub requeue: Duration,
}

/// The pods a remediation decision may concern, whose facts the controller must gather:
/// those with a fresh, triggering prediction, and those a Pending record names (to
/// finish or expire it). Empty for a watch that never restarts.
pub fn candidates(i: &status::Inputs<'_>) -> Vec<String> {
    let Ok(s) = i.settings else {
        return pending_names(i.old);
    };
    if s.action != RemediationAction::Restart {
        return pending_names(i.old);
    }
    let mut out = pending_names(i.old);
    if let Outcome::Write { fresh_leaks, .. } = status::compute(i) {
        out.extend(
            fresh_leaks
                .iter()
                .filter(|l| remediation::triggered(s, l))
                .map(|l| l.pod.clone()),
        );
    }
    out.sort();
    out.dedup();
    out
}

fn pending_names(old: Option<&ResourceWatchStatus>) -> Vec<String> {
    old.map(|o| {
        o.remediations
            .iter()
            .filter(|r| r.action == RemediationOutcome::Pending)
            .map(|r| r.pod.clone())
            .collect()
    })
    .unwrap_or_default()
}

pub fn decide(i: &Inputs<'_>) -> Plan {
    let (mut status, mut events, fresh_leaks) = match status::compute(&i.status) {
        Outcome::Hold => {
            return Plan {
                hold: true,
                status: i.status.old.cloned().unwrap_or_default(),
                write: Write::Skip(Duration::from_secs(2)),
                events: Vec::new(),
                ledger: Vec::new(),
                evictions: Vec::new(),
                requeue: Duration::from_secs(2),
            };
        }
        Outcome::Write {
            status,
            events,
            fresh_leaks,
        } => (*status, events, fresh_leaks),
    };
    let mut ledger = Vec::new();
    let mut evictions = Vec::new();
    if let Ok(s) = i.status.settings {
        remediate(
            i,
            s,
            &fresh_leaks,
            &mut status,
            &mut events,
            &mut ledger,
            &mut evictions,
        );
        if s.action == RemediationAction::Restart {
            status.conditions.push(remediation_condition(s, i.gate));
            status::carry_transition_times(
                &mut status.conditions,
                i.status.old.map_or(&[][..], |o| &o.conditions[..]),
                i.status.now,
            );
        }
    } else {
        expire_all_pending(
            i,
            &mut status,
            &mut events,
            &mut ledger,
            RemediationReason::IntentExpired,
            "the watch's spec is invalid",
        );
    }
    cap_records(&mut status);
    let interval = i
        .status
        .settings
        .as_ref()
        .map(|s| s.interval)
        .unwrap_or(Duration::from_secs(30));
    let urgent = !evictions.is_empty()
        || !ledger.is_empty()
        || events.iter().any(|e| e.reason.is_remediation());
    let write = when_to_write(i, &status, urgent, interval);
    let requeue = if status
        .remediations
        .iter()
        .any(|r| r.action == RemediationOutcome::Pending)
    {
        Duration::from_secs(2)
    } else {
        interval
    };
    Plan {
        hold: false,
        status,
        write,
        events,
        ledger,
        evictions,
        requeue,
    }
}

/// The `Remediation` condition of a `Restart` watch: whether it may evict now.
fn remediation_condition(s: &WatchSettings, gate: Option<&Gate>) -> resourcewatch_crds::Condition {
    let c = |st, reason: ConditionReason, msg: String| {
        status::cond(ConditionType::Remediation, st, reason, msg)
    };
    if s.dry_run {
        return c(
            ConditionStatus::False,
            ConditionReason::DryRun,
            "dryRun: decisions are reported, nothing is evicted".into(),
        );
    }
    match gate {
        // Nothing triggered, so nothing was gathered: what is known without the API.
        None => status::cond(
            ConditionType::Remediation,
            ConditionStatus::Unknown,
            ConditionReason::NotEvaluated,
            "checked when a prediction triggers".into(),
        ),
        Some(g) if !g.master_switch => c(
            ConditionStatus::False,
            ConditionReason::RemediationDisabled,
            "the operator runs without --enable-remediation".into(),
        ),
        Some(g) if !g.namespace_opted_in => c(
            ConditionStatus::False,
            ConditionReason::NamespaceNotOptedIn,
            format!(
                "a cluster admin must label this namespace {}={}",
                resourcewatch_crds::NAMESPACE_OPT_IN_LABEL,
                resourcewatch_crds::NAMESPACE_OPT_IN_VALUE
            ),
        ),
        Some(Gate { grant: Err(e), .. }) => c(
            ConditionStatus::False,
            ConditionReason::NoRemediationPolicy,
            e.clone(),
        ),
        Some(Gate {
            operator_may_evict: Err(e),
            ..
        }) => c(
            ConditionStatus::False,
            ConditionReason::NoEvictionRights,
            e.clone(),
        ),
        Some(Gate {
            grant: Ok(policies),
            ..
        }) => status::cond(
            ConditionType::Remediation,
            ConditionStatus::True,
            ConditionReason::Enabled,
            format!(
                "restarts are allowed (granted by RemediationPolicy {})",
                policies.join(", ")
            ),
        ),
    }
}

#[allow(clippy::too_many_arguments)]
fn remediate(
    i: &Inputs<'_>,
    s: &WatchSettings,
    fresh: &[LeakEntry],
    status: &mut ResourceWatchStatus,
    events: &mut Vec<EventSpec>,
    ledger: &mut Vec<LedgerChange>,
    evictions: &mut Vec<Eviction>,
) {
    let now_str = i.status.now;
    let gate = i.gate;
    let mut handled: Vec<String> = Vec::new();
    // Decisions of this pass count for the next pod of the same workload: three leaking
    // replicas must not all be evicted at once.
    let mut books: BTreeMap<Workload, Ledger> = i.ledgers.clone();
    if s.action == RemediationAction::Restart
        && let Some(gate) = gate
    {
        for leak in fresh.iter().filter(|l| remediation::triggered(s, l)) {
            let Some(facts) = i.pods.values().find(|p| p.name == leak.pod) else {
                continue;
            };
            let book = facts.workload.as_ref().and_then(|w| books.get(w)).cloned();
            let book = book.as_ref();
            let d = remediation::decide(s, gate, leak, facts, book, i.watch, i.now);
            handled.push(facts.uid.clone());
            let record = |action, reason: RemediationReason, message: String| RemediationRecord {
                pod: facts.name.clone(),
                pod_uid: facts.uid.clone(),
                workload: facts.workload.as_ref().map(|w| w.kind_name.clone()),
                action,
                reason,
                message,
                time_to_oom_seconds: leak.time_to_oom_seconds,
                confidence: leak.confidence,
                time: now_str.to_owned(),
            };
            // An eviction decided now or resumed: a Pending record, and the request.
            let evict =
                |status: &mut ResourceWatchStatus, evictions: &mut Vec<Eviction>, w: &Workload| {
                    let pending = RemediationOutcome::Pending;
                    upsert(
                        status,
                        record(pending, RemediationReason::Decided, String::new()),
                    );
                    evictions.push(Eviction {
                        pod: facts.name.clone(),
                        pod_uid: facts.uid.clone(),
                        workload: w.clone(),
                        watch: i.watch.to_owned(),
                        time_to_oom_seconds: leak.time_to_oom_seconds,
                        confidence: leak.confidence,
                    });
                };
            match d {
                Decision::Nothing => {}
                Decision::Evict(intent) => {
                    let Some(w) = &facts.workload else { continue };
                    // A PDB refused it moments ago: give the budget time.
                    if last_record(status, &facts.uid).is_some_and(|r| {
                        r.action == RemediationOutcome::Blocked
                            && r.reason == RemediationReason::PodDisruptionBudget
                            && seconds_between(&r.time, now_str)
                                .is_some_and(|d| d < remediation::PDB_RETRY.as_secs() as i64)
                    }) {
                        continue;
                    }
                    books.entry(w.clone()).or_default().pending = Some(intent.clone());
                    ledger.push(LedgerChange::Record {
                        workload: w.clone(),
                        intent,
                    });
                    evict(status, evictions, w);
                }
                Decision::Resume => {
                    if let Some(w) = &facts.workload {
                        evict(status, evictions, w);
                    }
                }
                Decision::Report {
                    outcome,
                    reason,
                    message,
                } => {
                    // Our own intent for this pod no longer holds: void it.
                    if let Some(w) = &facts.workload
                        && book
                            .and_then(|b| b.pending.as_ref())
                            .is_some_and(|p| p.pod_uid == facts.uid)
                    {
                        ledger.push(LedgerChange::Clear {
                            workload: w.clone(),
                            pod_uid: facts.uid.clone(),
                        });
                        expire_record(status, events, &facts.uid, reason, &message, now_str);
                    }
                    let new = record(outcome, reason, message.clone());
                    if upsert(status, new) {
                        let ev = if outcome == RemediationOutcome::WouldRestart {
                            EventReason::WouldRestart
                        } else {
                            EventReason::RestartBlocked
                        };
                        both(
                            events,
                            true,
                            ev,
                            format!("{}: {message}", facts.name),
                            &facts.name,
                        );
                    }
                }
            }
        }
    }
    expire_unconfirmed(i, &handled, status, events, ledger);
}

/// Pending records this pass did not confirm: the prediction no longer holds, or they
/// never were the operator's (status is writable by others; only the ledger counts).
fn expire_unconfirmed(
    i: &Inputs<'_>,
    handled: &[String],
    status: &mut ResourceWatchStatus,
    events: &mut Vec<EventSpec>,
    ledger: &mut Vec<LedgerChange>,
) {
    let now_str = i.status.now;
    let gate = i.gate;
    let stale: Vec<(String, String)> = status
        .remediations
        .iter()
        .filter(|r| r.action == RemediationOutcome::Pending && !handled.contains(&r.pod_uid))
        .map(|r| (r.pod_uid.clone(), r.pod.clone()))
        .collect();
    for (uid, name) in stale {
        let facts = i.pods.get(&uid);
        let ours = facts
            .and_then(|f| f.workload.as_ref())
            .and_then(|w| i.ledgers.get(w).map(|b| (w, b)))
            .and_then(|(w, b)| b.pending.as_ref().filter(|p| p.pod_uid == uid).map(|_| w));
        let (reason, why) = match (ours, facts) {
            (Some(w), _) => {
                ledger.push(LedgerChange::Clear {
                    workload: w.clone(),
                    pod_uid: uid.clone(),
                });
                if gate.is_some_and(|g| !g.master_switch) {
                    (
                        RemediationReason::RemediationDisabled,
                        "remediation is off in the operator".to_string(),
                    )
                } else {
                    (
                        RemediationReason::PredictionNoLongerHolds,
                        "the prediction no longer holds".to_string(),
                    )
                }
            }
            (None, Some(_)) | (None, None) => (
                RemediationReason::IntentExpired,
                format!("{name}: no intent of the operator's records it (or it expired)"),
            ),
        };
        expire_record(status, events, &uid, reason, &why, now_str);
    }
}

fn expire_all_pending(
    i: &Inputs<'_>,
    status: &mut ResourceWatchStatus,
    events: &mut Vec<EventSpec>,
    ledger: &mut Vec<LedgerChange>,
    reason: RemediationReason,
    why: &str,
) {
    let pending: Vec<String> = status
        .remediations
        .iter()
        .filter(|r| r.action == RemediationOutcome::Pending)
        .map(|r| r.pod_uid.clone())
        .collect();
    for uid in pending {
        if let Some(w) = i.pods.get(&uid).and_then(|f| f.workload.clone()) {
            ledger.push(LedgerChange::Clear {
                workload: w,
                pod_uid: uid.clone(),
            });
        }
        expire_record(status, events, &uid, reason, why, i.status.now);
    }
}

fn expire_record(
    status: &mut ResourceWatchStatus,
    events: &mut Vec<EventSpec>,
    uid: &str,
    reason: RemediationReason,
    why: &str,
    now: &str,
) {
    for r in status
        .remediations
        .iter_mut()
        .filter(|r| r.pod_uid == uid && r.action == RemediationOutcome::Pending)
    {
        r.action = RemediationOutcome::Expired;
        r.reason = reason;
        r.message = format!("the pending restart was not carried out: {why}");
        r.time = now.to_owned();
        let name = r.pod.clone();
        both(
            events,
            true,
            EventReason::RestartExpired,
            format!("{name}: {}", r.message),
            &name,
        );
    }
}

fn last_record<'a>(status: &'a ResourceWatchStatus, uid: &str) -> Option<&'a RemediationRecord> {
    status.remediations.iter().rev().find(|r| r.pod_uid == uid)
}

/// Appends a record unless the pod's latest one already says the same (outcome and
/// reason): a block repeated every reconcile is one record and one Event. Returns
/// whether it was appended.
fn upsert(status: &mut ResourceWatchStatus, r: RemediationRecord) -> bool {
    if let Some(last) = status
        .remediations
        .iter_mut()
        .rev()
        .find(|x| x.pod_uid == r.pod_uid)
        && last.action == r.action
        && last.reason == r.reason
    {
        return false;
    }
    status.remediations.push(r);
    true
}

/// The records of `new` that `old` did not hold (same pod, outcome, reason and time): what
/// one status write decided.
pub fn new_records<'a>(
    old: &'a [RemediationRecord],
    new: &'a [RemediationRecord],
) -> impl Iterator<Item = &'a RemediationRecord> + 'a {
    new.iter().filter(move |r| {
        !old.iter().any(|o| {
            o.pod_uid == r.pod_uid
                && o.action == r.action
                && o.reason == r.reason
                && o.time == r.time
        })
    })
}

fn cap_records(status: &mut ResourceWatchStatus) {
    // Oldest first; pending ones are never dropped.
    while status.remediations.len() > resourcewatch_crds::MAX_STATUS_REMEDIATIONS {
        let Some(i) = status
            .remediations
            .iter()
            .position(|r| r.action != RemediationOutcome::Pending)
        else {
            break;
        };
        status.remediations.remove(i);
    }
}

fn both(events: &mut Vec<EventSpec>, warning: bool, reason: EventReason, note: String, pod: &str) {
    for on in [None, Some(pod.to_owned())] {
        events.push(
            EventSpec::new(warning, reason, EventAction::Remediate, note.clone(), on)
                .about(Subject::container(pod, "")),
        );
    }
}

fn seconds_between(from: &str, to: &str) -> Option<i64> {
    let a: jiff::Timestamp = from.parse().ok()?;
    let b: jiff::Timestamp = to.parse().ok()?;
    Some(b.as_second() - a.as_second())
}

/// Whether to write the status now: at most once per interval, unless the user changed
/// the spec, a condition changed (a lost agent should not wait 30 s to show) or a
/// remediation was decided.
fn when_to_write(
    i: &Inputs<'_>,
    new: &ResourceWatchStatus,
    urgent: bool,
    interval: Duration,
) -> Write {
    let Some(old) = i.status.old else {
        return Write::Now;
    };
    let same_generation = old.observed_generation == i.status.generation;
    if urgent || !same_generation {
        return Write::Now;
    }
    if status::same_content(old, new) {
        return Write::Skip(interval);
    }
    // A transition (status or reason) is written at once; a message that only counts
    // (pods selected, nodes reporting) waits for the interval like the figures: with pods
    // churning, every pod created or deleted rewrote each status selecting it.
    let transitions = |s: &ResourceWatchStatus| -> Vec<(String, ConditionStatus, ConditionReason)> {
        s.conditions
            .iter()
            .map(|c| (c.type_.clone(), c.status, c.reason))
            .collect()
    };
    if transitions(old) != transitions(new) {
        return Write::Now;
    }
    let since = old
        .last_update_time
        .as_deref()
        .and_then(|t| seconds_between(t, i.status.now));
    match since {
        Some(age) if age >= 0 && (age as u64) < interval.as_secs() => {
            Write::Skip(interval - Duration::from_secs(age as u64))
        }
        _ => Write::Now,
    }
}

/// What the Eviction API answered.
#[derive(Clone, Debug, PartialEq)]
pub enum EvictResult {
    Evicted,
    /// 429: a PodDisruptionBudget refuses it now.
    Refused(String),
    /// 404: the pod is already gone.
    Gone,
}

/// The consequences of an eviction's answer: the pod's record, the workload's ledger
/// (the intent is done; an eviction counts as a restart), the Events.
pub fn after_eviction(
    ev: &Eviction,
    result: &EvictResult,
    now: i64,
    now_str: &str,
    status: &mut ResourceWatchStatus,
    book: &mut Ledger,
) -> Vec<EventSpec> {
    let (outcome, reason, event, note) = match result {
        EvictResult::Evicted => (
            RemediationOutcome::Restarted,
            RemediationReason::Evicted,
            Some((false, EventReason::Restarted)),
            format!(
                "{}: evicted {}s before its predicted OOM kill (confidence {}); {} replaces it",
                ev.pod,
                ev.time_to_oom_seconds.unwrap_or(0.0).round(),
                ev.confidence,
                ev.workload.kind_name
            ),
        ),
        EvictResult::Refused(msg) => (
            RemediationOutcome::Blocked,
            RemediationReason::PodDisruptionBudget,
            Some((true, EventReason::RestartBlocked)),
            format!("{}: the eviction was refused: {msg}", ev.pod),
        ),
        EvictResult::Gone => (
            RemediationOutcome::Restarted,
            RemediationReason::Gone,
            None,
            format!("{}: already gone", ev.pod),
        ),
    };
    if book
        .pending
        .as_ref()
        .is_some_and(|p| p.pod_uid == ev.pod_uid)
    {
        book.pending = None;
    }
    if *result == EvictResult::Evicted {
        book.restarts.push(Restart {
            pod: ev.pod.clone(),
            pod_uid: ev.pod_uid.clone(),
            at: now,
            by: ev.watch.clone(),
        });
    }
    book.prune(now);
    if let Some(r) = status
        .remediations
        .iter_mut()
        .rev()
        .find(|r| r.pod_uid == ev.pod_uid && r.action == RemediationOutcome::Pending)
    {
        r.action = outcome;
        r.reason = reason;
        r.message = note.clone();
        r.time = now_str.to_owned();
    }
    let mut events = Vec::new();
    if let Some((warning, reason)) = event {
        both(&mut events, warning, reason, note, &ev.pod);
    }
    events
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    //! Decisions from inputs alone: no API server, no mock.
    use super::*;
    use crate::{nodes::NodeView, spec::Floors, status::SelectedPod};
    use resourcewatch_crds::ResourceWatchSpec;
    use resourcewatch_proto as pb;

    const NOW: i64 = 1_800_000_000;
    const NOW_STR: &str = "2027-01-15T08:00:00Z";

    fn settings() -> Result<WatchSettings, crate::spec::SpecError> {
        let spec: ResourceWatchSpec = serde_json::from_value(serde_json::json!({
            "remediation": {"action": "Restart", "minTimeToOOM": "60s", "cooldown": "10m", "window": "1h", "maxRestarts": 2}
        }))
        .unwrap();
        WatchSettings::from_spec(&spec, &Floors::default())
    }

    fn pod(i: u32) -> SelectedPod {
        SelectedPod {
            uid: format!("uid-{i}"),
            name: format!("app-{i}"),
            node: Some("n1".into()),
            containers: [(format!("cid-{i}"), "app".to_string())].into(),
        }
    }

    fn facts(i: u32) -> (String, PodFacts) {
        (
            format!("uid-{i}"),
            PodFacts {
                name: format!("app-{i}"),
                uid: format!("uid-{i}"),
                workload: Some(workload()),
                deleting: false,
                granted_by: Some("restarts".into()),
                ready: true,
                ..Default::default()
            },
        )
    }

    fn workload() -> Workload {
        Workload {
            namespace: "ns".into(),
            kind_name: "Deployment/app".into(),
        }
    }

    /// A reporting node whose agent sees `leaking` pods heading for OOM in 20 s.
    fn node(leaking: &[u32], reporting: bool) -> NodeView {
        NodeView {
            name: "n1".into(),
            connected: reporting,
            reporting,
            missing: !reporting,
            last_report: reporting.then(|| {
                std::sync::Arc::new(pb::Report {
                    leaks: leaking
                        .iter()
                        .map(|i| pb::Leak {
                            pod_uid: format!("uid-{i}"),
                            container_id: format!("cid-{i}"),
                            confidence: 95,
                            growth_bytes_per_second: 2e6,
                            time_to_oom_seconds: Some(20.0),
                            growing_seconds: 60.0,
                            limit_bytes: 128 << 20,
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
            }),
            ..Default::default()
        }
    }

    fn open_gate() -> Gate {
        Gate {
            master_switch: true,
            namespace_opted_in: true,
            grant: Ok(vec!["restarts".into()]),
            operator_may_evict: Ok(()),
        }
    }

    /// Pod 1 leaking on a reporting node, remediation allowed, no ledger yet.
    fn first_decision() -> Plan {
        plan(
            &[node(&[1], true)],
            None,
            Some(&open_gate()),
            &BTreeMap::new(),
        )
    }

    fn plan(
        nodes: &[NodeView],
        old: Option<&ResourceWatchStatus>,
        gate: Option<&Gate>,
        ledgers: &BTreeMap<Workload, Ledger>,
    ) -> Plan {
        let s = settings();
        let pods = [pod(1), pod(2), pod(3)];
        let facts: BTreeMap<String, PodFacts> = (1..=3).map(facts).collect();
        decide(&Inputs {
            status: status::Inputs {
                generation: Some(1),
                settings: &s,
                pods: &pods,
                nodes,
                old,
                now: NOW_STR,
            },
            watch: "ns/w",
            gate,
            pods: &facts,
            ledgers,
            now: NOW,
        })
    }

    #[test]
    fn a_condition_message_that_only_counts_waits_for_the_interval() {
        let first = plan(
            &[node(&[], true)],
            None,
            Some(&open_gate()),
            &BTreeMap::new(),
        );
        assert_eq!(first.write, Write::Now, "no status yet");
        let mut old = first.status.clone();
        old.last_update_time = Some(NOW_STR.into());
        let (s, pods, nodes) = (settings(), [pod(1), pod(2), pod(3)], [node(&[], true)]);
        let i = Inputs {
            status: status::Inputs {
                generation: Some(1),
                settings: &s,
                pods: &pods,
                nodes: &nodes,
                old: Some(&old),
                now: NOW_STR,
            },
            watch: "ns/w",
            gate: None,
            pods: &BTreeMap::new(),
            ledgers: &BTreeMap::new(),
            now: NOW,
        };
        let interval = Duration::from_secs(30);
        // One pod more: the figures and the Ready message change, no transition.
        let mut new = old.clone();
        new.matched_pods += 1;
        new.conditions[0].message = "4 pods selected".into();
        assert_eq!(
            when_to_write(&i, &new, false, interval),
            Write::Skip(interval)
        );
        // A transition is written at once.
        new.conditions[0].reason = ConditionReason::AgentsMissing;
        assert_eq!(when_to_write(&i, &new, false, interval), Write::Now);
    }

    #[test]
    fn three_leaking_replicas_give_one_eviction_and_two_blocks() {
        let p = plan(
            &[node(&[1, 2, 3], true)],
            None,
            Some(&open_gate()),
            &BTreeMap::new(),
        );
        assert_eq!(p.evictions.len(), 1, "{:?}", p.evictions);
        assert_eq!(p.ledger.len(), 1);
        assert!(
            matches!(&p.ledger[0], LedgerChange::Record { intent, .. } if intent.expires == NOW + 20)
        );
        let blocked: Vec<&str> = p
            .status
            .remediations
            .iter()
            .filter(|r| r.action == RemediationOutcome::Blocked)
            .map(|r| r.reason.as_str())
            .collect();
        assert_eq!(blocked, ["RestartInProgress", "RestartInProgress"]);
        assert_eq!(p.write, Write::Now);
        let cond = status::find(&p.status.conditions, ConditionType::Remediation).unwrap();
        assert_eq!(
            (cond.status, cond.reason.as_str()),
            (ConditionStatus::True, "Enabled")
        );
    }

    #[test]
    fn a_decision_is_new_once_however_many_reconciles_repeat_it() {
        let first = first_decision();
        let counted: Vec<&str> = new_records(&[], &first.status.remediations)
            .map(|r| r.reason.as_str())
            .collect();
        assert_eq!(counted, ["Decided"]);
        // The next reconcile, before the eviction: the same record, nothing new.
        let again = plan(
            &[node(&[1], true)],
            Some(&first.status),
            Some(&open_gate()),
            &BTreeMap::new(),
        );
        assert_eq!(
            new_records(&first.status.remediations, &again.status.remediations).count(),
            0
        );
        // The same pod and reason at another time is another decision.
        let mut later = first.status.remediations.clone();
        later[0].time = "2030-01-01T00:10:00Z".into();
        assert_eq!(new_records(&first.status.remediations, &later).count(), 1);
    }

    #[test]
    fn a_lost_nodes_last_leaks_are_shown_but_never_acted_on() {
        let first = first_decision();
        let mut old = first.status.clone();
        old.remediations.clear();
        let p = plan(
            &[node(&[], false)],
            Some(&old),
            Some(&open_gate()),
            &BTreeMap::new(),
        );
        assert_eq!(p.status.leaks.len(), 1, "kept for people");
        assert!(p.evictions.is_empty() && p.ledger.is_empty());
    }

    #[test]
    fn a_pending_record_in_status_alone_expires_and_evicts_nothing() {
        let forged = ResourceWatchStatus {
            observed_generation: Some(1),
            remediations: vec![RemediationRecord {
                pod: "app-2".into(),
                pod_uid: "uid-2".into(),
                workload: Some("Deployment/app".into()),
                action: RemediationOutcome::Pending,
                reason: RemediationReason::Decided,
                message: String::new(),
                time_to_oom_seconds: Some(5.0),
                confidence: 100,
                time: NOW_STR.into(),
            }],
            ..Default::default()
        };
        assert_eq!(
            candidates(&status::Inputs {
                generation: Some(1),
                settings: &settings(),
                pods: &[pod(2)],
                nodes: &[node(&[], true)],
                old: Some(&forged),
                now: NOW_STR,
            }),
            ["app-2"],
            "its facts are gathered"
        );
        let p = plan(
            &[node(&[], true)],
            Some(&forged),
            Some(&open_gate()),
            &BTreeMap::new(),
        );
        assert!(p.evictions.is_empty());
        let r = &p.status.remediations[0];
        assert_eq!(
            (r.action, r.reason.as_str()),
            (RemediationOutcome::Expired, "IntentExpired")
        );
        assert!(
            p.events
                .iter()
                .any(|e| e.reason == EventReason::RestartExpired)
        );
    }

    #[test]
    fn an_intent_in_the_ledger_is_resumed_only_if_everything_still_holds() {
        let ledger: BTreeMap<Workload, Ledger> = [(
            workload(),
            Ledger {
                pending: Some(Intent {
                    pod: "app-1".into(),
                    pod_uid: "uid-1".into(),
                    at: NOW - 5,
                    expires: NOW + 15,
                    by: "ns/w".into(),
                }),
                ..Default::default()
            },
        )]
        .into();
        let p = plan(&[node(&[1], true)], None, Some(&open_gate()), &ledger);
        assert_eq!(p.evictions.len(), 1, "resumed");
        assert!(p.ledger.is_empty(), "already recorded");
        // The switch is off now: the intent is voided, with the reason.
        let off = Gate {
            master_switch: false,
            ..open_gate()
        };
        let p = plan(&[node(&[1], true)], None, Some(&off), &ledger);
        assert!(p.evictions.is_empty());
        assert_eq!(
            p.ledger,
            [LedgerChange::Clear {
                workload: workload(),
                pod_uid: "uid-1".into()
            }]
        );
        // The prediction no longer holds.
        let mut old = plan(&[node(&[1], true)], None, Some(&open_gate()), &ledger).status;
        old.observed_generation = Some(1);
        let p = plan(&[node(&[], true)], Some(&old), Some(&open_gate()), &ledger);
        assert!(p.evictions.is_empty());
        let r = last_record(&p.status, "uid-1").unwrap();
        assert_eq!(
            (r.action, r.reason.as_str()),
            (RemediationOutcome::Expired, "PredictionNoLongerHolds")
        );
    }

    #[test]
    fn an_eviction_becomes_a_restart_in_the_ledger() {
        let mut status = first_decision().status;
        let ev = Eviction {
            pod: "app-1".into(),
            pod_uid: "uid-1".into(),
            workload: workload(),
            watch: "ns/w".into(),
            time_to_oom_seconds: Some(20.0),
            confidence: 95,
        };
        let mut book = Ledger {
            pending: Some(Intent {
                pod_uid: "uid-1".into(),
                expires: NOW + 20,
                ..Default::default()
            }),
            ..Default::default()
        };
        let events = after_eviction(
            &ev,
            &EvictResult::Evicted,
            NOW,
            NOW_STR,
            &mut status,
            &mut book,
        );
        assert!(book.pending.is_none());
        assert_eq!(book.restarts.len(), 1);
        assert_eq!(status.remediations[0].action, RemediationOutcome::Restarted);
        assert_eq!(
            events
                .iter()
                .filter(|e| e.reason == EventReason::Restarted)
                .count(),
            2
        );
        // A PDB refusal frees the workload without counting a restart.
        let mut book = Ledger {
            pending: Some(Intent {
                pod_uid: "uid-1".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut status = first_decision().status;
        after_eviction(
            &ev,
            &EvictResult::Refused("budget".into()),
            NOW,
            NOW_STR,
            &mut status,
            &mut book,
        );
        assert!(book.pending.is_none() && book.restarts.is_empty());
        assert_eq!(status.remediations[0].reason, "PodDisruptionBudget");
    }
}
