//! A reconciliation's decisions, as pure functions: [`assess`] computes the watch's status
//! once from what the agents reported, and `decide(inputs, assessment) -> Plan` returns
//! every effect in the order the controller carries them out. The controller gathers the
//! inputs (the watch, its pods, the remediation gate and ledgers, the profile request and
//! result) and only performs the plan; nothing here talks to the API server, so every
//! decision is unit-tested without one.

use std::{collections::BTreeMap, time::Duration};

use resourcewatch_crds::{
    ConditionReason, ConditionStatus, LeakEntry, ProfileStatus, RemediationAction,
    RemediationOutcome, RemediationRecord, ResourceWatchStatus,
};

use crate::{
    ledger::{Intent, Ledger, Restart, Workload},
    model::{ConditionType, EventAction, EventReason},
    nodes::{TargetPod, WatchTargets},
    profile,
    remediation::{self, Decision, Gate, PodFacts, RemediationReason},
    spec::WatchSettings,
    status::{self, EventSpec, Outcome, SelectedPod, Subject},
};

pub struct Inputs<'a> {
    pub status: status::Inputs<'a>,
    /// `namespace/name` of the watch.
    pub watch: &'a str,
    pub namespace: &'a str,
    /// Facts gathered for [`Assessment::candidates`] only: the gate (None when there was
    /// nothing to gather), the candidate pods by UID, and their workloads' ledgers.
    pub gate: Option<&'a Gate>,
    pub pods: &'a BTreeMap<String, PodFacts>,
    pub ledgers: &'a BTreeMap<Workload, Ledger>,
    pub profile: profile::Inputs<'a>,
    /// Seconds since the epoch.
    pub now: i64,
}

/// The watch's status as its pods and agents make it, before remediation and profiles:
/// computed once per reconcile, first to name the pods whose facts must be gathered,
/// then as the base of the [`Plan`].
pub struct Assessment(Outcome);

/// Computes the status for this reconcile (see [`Assessment`]).
pub fn assess(i: &status::Inputs<'_>) -> Assessment {
    Assessment(status::compute(i))
}

impl Assessment {
    /// The pods a remediation decision may concern, whose facts the controller must
    /// gather: those with a fresh, triggering prediction, and those a Pending record
    /// names (to finish or expire it). Only Pending ones for a watch that never restarts.
    pub fn candidates(&self, i: &status::Inputs<'_>) -> Vec<String> {
        let mut out = pending_names(i.old);
        if let (Ok(s), Outcome::Write { fresh_leaks, .. }) = (i.settings, &self.0)
            && s.action == RemediationAction::Restart
        {
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

/// A reconcile's effects, carried out in this order: the hub's targets; then, unless
/// `hold`, the ledger changes (an intent is recorded before anything is evicted; a
/// conflict ends the reconcile), the profile's ConfigMap effect (with its follow-up,
/// [`profile::stored`]), the status (unless `write` says skip), each eviction with its
/// follow-up ([`after_eviction`]) and the status again, the Events, and the requeue.
#[derive(Clone, Debug)]
pub struct Plan {
    /// What the nodes must track for this watch; None: forget it (invalid spec).
    pub targets: Option<WatchTargets>,
    /// Agents are reconnecting: keep the stored status, look again soon.
    pub hold: bool,
    pub ledger: Vec<LedgerChange>,
    pub profile: profile::Step,
    pub status: ResourceWatchStatus,
    pub write: Write,
    pub evictions: Vec<Eviction>,
    /// Every Event but the profile's (in `profile.events`, with its store's follow-up).
    pub events: Vec<EventSpec>,
    pub requeue: Duration,
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

/// The plan being drafted from the assessment: the status, Events, ledger changes and
/// evictions remediation adds.
struct Draft {
    status: ResourceWatchStatus,
    events: Vec<EventSpec>,
    ledger: Vec<LedgerChange>,
    evictions: Vec<Eviction>,
}

pub fn decide(i: &Inputs<'_>, assessed: Assessment) -> Plan {
    let (status, events, fresh_leaks) = match assessed.0 {
        Outcome::Hold => return hold(i),
        Outcome::Write {
            status,
            events,
            fresh_leaks,
        } => (*status, events, fresh_leaks),
    };
    let mut d = Draft {
        status,
        events,
        ledger: Vec::new(),
        evictions: Vec::new(),
    };
    if let Ok(s) = i.status.settings {
        remediate(i, s, &fresh_leaks, &mut d);
        if s.action == RemediationAction::Restart {
            d.status.conditions.push(remediation_condition(s, i.gate));
            status::carry_transition_times(
                &mut d.status.conditions,
                i.status.old.map_or(&[][..], |o| &o.conditions[..]),
                i.status.now,
            );
        }
    } else {
        expire_all_pending(
            i,
            &mut d,
            RemediationReason::IntentExpired,
            "the watch's spec is invalid",
        );
    }
    cap_records(&mut d.status);
    let old_profile = i.status.old.and_then(|o| o.profile.as_ref());
    let mut profile = profile::step(old_profile, &i.profile, i.status.pods, i.now);
    d.status.profile = profile.status.clone();
    d.events.append(&mut profile.events);
    let interval = i
        .status
        .settings
        .as_ref()
        .map(|s| s.interval)
        .unwrap_or(Duration::from_secs(30));
    let urgent = !d.evictions.is_empty()
        || !d.ledger.is_empty()
        || i.status.old.map_or(&[][..], |o| &o.oom_kills[..]) != &d.status.oom_kills[..]
        || d.events.iter().any(|e| e.reason.is_remediation())
        || d.status.profile.as_ref() != old_profile
        || profile.effect.is_some();
    let write = when_to_write(i, &d.status, urgent, interval);
    let mut requeue = if d
        .status
        .remediations
        .iter()
        .any(|r| r.action == RemediationOutcome::Pending)
    {
        Duration::from_secs(2)
    } else {
        interval
    };
    if let Some(at) = d
        .status
        .profile
        .as_ref()
        .and_then(|p| profile::next_check(p, i.now))
    {
        requeue = requeue.min(at);
    }
    Plan {
        targets: targets(i, d.status.profile.as_ref()),
        hold: false,
        ledger: d.ledger,
        profile,
        status: d.status,
        write,
        evictions: d.evictions,
        events: d.events,
        requeue,
    }
}

/// Agents are reconnecting after an operator start: the stored status stays, nothing
/// is decided, the watch is looked at again soon.
fn hold(i: &Inputs<'_>) -> Plan {
    let profile = i.status.old.and_then(|o| o.profile.clone());
    Plan {
        targets: targets(i, profile.as_ref()),
        hold: true,
        ledger: Vec::new(),
        profile: profile::Step {
            status: profile,
            ..Default::default()
        },
        status: i.status.old.cloned().unwrap_or_default(),
        write: Write::Skip(Duration::from_secs(2)),
        evictions: Vec::new(),
        events: Vec::new(),
        requeue: Duration::from_secs(2),
    }
}

/// What the watch asks of its pods' nodes: a request taken in this reconcile goes out
/// with it (its deadline runs from now).
fn targets(i: &Inputs<'_>, profile: Option<&ProfileStatus>) -> Option<WatchTargets> {
    let s = i.status.settings.as_ref().ok()?;
    Some(WatchTargets {
        top_k: s.top_k,
        interval: s.interval,
        leaks_enabled: s.leaks_enabled,
        min_confidence: s.min_confidence,
        horizon: s.horizon,
        remediates: s.action == RemediationAction::Restart,
        pods: target_pods(i.namespace, i.status.pods),
        profile: profile.and_then(|p| profile::order(p, i.namespace, i.status.pods)),
    })
}

/// The selected pods that are scheduled, as the nodes see them.
fn target_pods(ns: &str, pods: &[std::sync::Arc<SelectedPod>]) -> Vec<TargetPod> {
    pods.iter().filter_map(|p| target_pod(ns, p)).collect()
}

/// A selected pod of namespace `ns` as the nodes see it; `None` until it is scheduled.
/// The pod triggers use it too, to move one pod's target at once (crate's shell,
/// `Hub::update_pod`): both must agree on what a target is.
pub fn target_pod(ns: &str, p: &SelectedPod) -> Option<TargetPod> {
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
            e.to_string(),
        ),
        Some(Gate {
            operator_may_evict: Err(e),
            ..
        }) => c(
            ConditionStatus::False,
            ConditionReason::NoEvictionRights,
            e.to_string(),
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

fn remediate(i: &Inputs<'_>, s: &WatchSettings, fresh: &[LeakEntry], d: &mut Draft) {
    let mut handled: Vec<String> = Vec::new();
    // Decisions of this pass count for the next pod of the same workload: three leaking
    // replicas must not all be evicted at once.
    let mut books: BTreeMap<Workload, Ledger> = i.ledgers.clone();
    if s.action == RemediationAction::Restart
        && let Some(gate) = i.gate
    {
        for leak in fresh.iter().filter(|l| remediation::triggered(s, l)) {
            let Some(facts) = i.pods.values().find(|p| p.name == leak.pod) else {
                continue;
            };
            handled.push(facts.uid.clone());
            let book = facts.workload.as_ref().and_then(|w| books.get(w)).cloned();
            match remediation::decide(s, gate, leak, facts, book.as_ref(), i.watch, i.now) {
                Decision::Nothing => {}
                Decision::Evict(intent) => {
                    let Some(w) = &facts.workload else { continue };
                    if pdb_refused_lately(&d.status, &facts.uid, i.status.now) {
                        continue;
                    }
                    books.entry(w.clone()).or_default().pending = Some(intent.clone());
                    d.ledger.push(LedgerChange::Record {
                        workload: w.clone(),
                        intent,
                    });
                    evict(i, leak, facts, w, d);
                }
                Decision::Resume => {
                    if let Some(w) = &facts.workload {
                        evict(i, leak, facts, w, d);
                    }
                }
                Decision::Report {
                    outcome,
                    reason,
                    message,
                } => report(i, leak, facts, book.as_ref(), (outcome, reason, message), d),
            }
        }
    }
    expire_unconfirmed(i, &handled, d);
}

/// The pod's record of a decision about `leak`.
fn record(
    i: &Inputs<'_>,
    leak: &LeakEntry,
    facts: &PodFacts,
    action: RemediationOutcome,
    reason: RemediationReason,
    message: String,
) -> RemediationRecord {
    RemediationRecord {
        pod: facts.name.clone(),
        pod_uid: facts.uid.clone(),
        workload: facts.workload.as_ref().map(|w| w.kind_name.clone()),
        action,
        reason,
        message,
        time_to_oom_seconds: leak.time_to_oom_seconds,
        confidence: leak.confidence,
        time: i.status.now.to_owned(),
    }
}

/// A PodDisruptionBudget refused this pod's eviction moments ago: give the budget time.
fn pdb_refused_lately(status: &ResourceWatchStatus, uid: &str, now: &str) -> bool {
    last_record(status, uid).is_some_and(|r| {
        r.action == RemediationOutcome::Blocked
            && r.reason == RemediationReason::PodDisruptionBudget
            && seconds_between(&r.time, now)
                .is_some_and(|d| d < remediation::PDB_RETRY.as_secs() as i64)
    })
}

/// An eviction decided now or resumed: a Pending record, and the request.
fn evict(i: &Inputs<'_>, leak: &LeakEntry, facts: &PodFacts, w: &Workload, d: &mut Draft) {
    let pending = record(
        i,
        leak,
        facts,
        RemediationOutcome::Pending,
        RemediationReason::Decided,
        String::new(),
    );
    upsert(&mut d.status, pending);
    d.evictions.push(Eviction {
        pod: facts.name.clone(),
        pod_uid: facts.uid.clone(),
        workload: w.clone(),
        watch: i.watch.to_owned(),
        time_to_oom_seconds: leak.time_to_oom_seconds,
        confidence: leak.confidence,
    });
}

/// A decision not to evict (blocked, or what a dry run would do): recorded and told once
/// while it stays the same; an intent of ours for the pod no longer holds and is voided.
fn report(
    i: &Inputs<'_>,
    leak: &LeakEntry,
    facts: &PodFacts,
    book: Option<&Ledger>,
    (outcome, reason, message): (RemediationOutcome, RemediationReason, String),
    d: &mut Draft,
) {
    if let Some(w) = &facts.workload
        && book
            .and_then(|b| b.pending.as_ref())
            .is_some_and(|p| p.pod_uid == facts.uid)
    {
        d.ledger.push(LedgerChange::Clear {
            workload: w.clone(),
            pod_uid: facts.uid.clone(),
        });
        expire_record(d, &facts.uid, reason, &message, i.status.now);
    }
    let new = record(i, leak, facts, outcome, reason, message.clone());
    if upsert(&mut d.status, new) {
        let ev = if outcome == RemediationOutcome::WouldRestart {
            EventReason::WouldRestart
        } else {
            EventReason::RestartBlocked
        };
        both(
            &mut d.events,
            true,
            ev,
            format!("{}: {message}", facts.name),
            &facts.name,
        );
    }
}

/// Pending records this pass did not confirm: the prediction no longer holds, or they
/// never were the operator's (status is writable by others; only the ledger counts).
fn expire_unconfirmed(i: &Inputs<'_>, handled: &[String], d: &mut Draft) {
    let stale: Vec<(String, String)> = d
        .status
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
        let (reason, why) = match ours {
            Some(w) => {
                d.ledger.push(LedgerChange::Clear {
                    workload: w.clone(),
                    pod_uid: uid.clone(),
                });
                if i.gate.is_some_and(|g| !g.master_switch) {
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
            None => (
                RemediationReason::IntentExpired,
                format!("{name}: no intent of the operator's records it (or it expired)"),
            ),
        };
        expire_record(d, &uid, reason, &why, i.status.now);
    }
}

fn expire_all_pending(i: &Inputs<'_>, d: &mut Draft, reason: RemediationReason, why: &str) {
    let pending: Vec<String> = d
        .status
        .remediations
        .iter()
        .filter(|r| r.action == RemediationOutcome::Pending)
        .map(|r| r.pod_uid.clone())
        .collect();
    for uid in pending {
        if let Some(w) = i.pods.get(&uid).and_then(|f| f.workload.clone()) {
            d.ledger.push(LedgerChange::Clear {
                workload: w,
                pod_uid: uid.clone(),
            });
        }
        expire_record(d, &uid, reason, why, i.status.now);
    }
}

fn expire_record(d: &mut Draft, uid: &str, reason: RemediationReason, why: &str, now: &str) {
    for r in d
        .status
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
            &mut d.events,
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
    if young_pod_first_row(i, old, new) {
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

/// A pod is young for `YOUNG_POD_SECS` after it was made: long enough to be scheduled,
/// start and be reported (an image already on the node), short of a pod that has run for
/// a while and only moved into the Top-K, whose row waits for the interval like every
/// figure.
const YOUNG_POD_SECS: i64 = 120;

/// Whether the Top-K shows a young pod that the written status shows in no row: a new
/// pod's first figures are written at once (its node's first report of it reconciles the
/// watch, crate's shell: `Hub::report`), not up to an interval later. Once per pod: the
/// next status has its row.
fn young_pod_first_row(
    i: &Inputs<'_>,
    old: &ResourceWatchStatus,
    new: &ResourceWatchStatus,
) -> bool {
    let Ok(now) = i.status.now.parse::<jiff::Timestamp>() else {
        return false;
    };
    fn rows(s: &ResourceWatchStatus) -> Vec<&str> {
        s.top_cpu
            .iter()
            .chain(&s.top_memory)
            .map(|e| e.pod.as_str())
            .collect()
    }
    let shown = rows(old);
    let first: Vec<&str> = rows(new)
        .into_iter()
        .filter(|p| !shown.contains(p))
        .collect();
    !first.is_empty()
        && i.status.pods.iter().any(|p| {
            p.created
                .is_some_and(|c| now.as_second().saturating_sub(c) < YOUNG_POD_SECS)
                && first.contains(&p.name.as_str())
        })
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
    use std::sync::Arc;

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
            exited_containers: Default::default(),
            created: None,
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
        plan_with(nodes, old, gate, ledgers, no_profile())
    }

    fn plan_with(
        nodes: &[NodeView],
        old: Option<&ResourceWatchStatus>,
        gate: Option<&Gate>,
        ledgers: &BTreeMap<Workload, Ledger>,
        profile: profile::Inputs<'_>,
    ) -> Plan {
        let s = settings();
        let pods = [pod(1), pod(2), pod(3)].map(Arc::new);
        let facts: BTreeMap<String, PodFacts> = (1..=3).map(facts).collect();
        let status = status::Inputs {
            generation: Some(1),
            settings: &s,
            pods: &pods,
            finished: &[],
            kill_nodes: &[],
            nodes,
            old,
            now: NOW_STR,
        };
        let assessed = assess(&status);
        decide(
            &Inputs {
                status,
                watch: "ns/w",
                namespace: "ns",
                gate,
                pods: &facts,
                ledgers,
                profile,
                now: NOW,
            },
            assessed,
        )
    }

    #[test]
    fn a_profile_request_is_taken_sent_stored_and_finished_by_plans() {
        let ask = profile::Inputs {
            annotation: Some("pod=app-1,duration=10s"),
            ..no_profile()
        };
        let taken = plan_with(&[node(&[], true)], None, None, &BTreeMap::new(), ask);
        let p = taken.status.profile.clone().unwrap();
        assert_eq!(p.state, resourcewatch_crds::ProfileState::Pending);
        assert!(taken.profile.taken && taken.profile.effect.is_none());
        let order = taken.targets.as_ref().and_then(|t| t.profile.clone());
        assert_eq!(
            order.map(|o| o.node),
            Some("n1".into()),
            "sent with this plan"
        );
        assert_eq!(taken.write, Write::Now);
        assert!(
            taken.requeue <= Duration::from_secs(10 + 60 + 1),
            "{:?}",
            taken.requeue
        );

        // The node's result: stored first, then finished by the follow-up.
        let result = pb::ProfileResult {
            id: p.id.clone(),
            samples: 990,
            duration_seconds: 10.0,
            hottest: vec![pb::HotFunction {
                name: "spin".into(),
                samples: 900,
            }],
            svg: "<svg/>".into(),
            ..Default::default()
        };
        let arrived = profile::Inputs {
            annotation: Some("pod=app-1,duration=10s"),
            result: Some(&result),
            ..no_profile()
        };
        let mut done = plan_with(
            &[node(&[], true)],
            Some(&taken.status),
            None,
            &BTreeMap::new(),
            arrived,
        );
        assert_eq!(done.profile.effect, Some(profile::Effect::Store));
        assert!(
            done.profile.result_used && !done.profile.taken,
            "taken once"
        );
        assert_eq!(done.write, Write::Now, "a stored result is written at once");
        let stored = done.status.profile.as_mut().unwrap();
        let ev = profile::stored(stored, &result, Ok::<_, String>("w-profile".into()), NOW);
        assert_eq!(stored.state, resourcewatch_crds::ProfileState::Succeeded);
        assert_eq!(ev.reason, EventReason::ProfileSucceeded);
        assert!(
            ev.note.contains("spin") && ev.note.contains("w-profile"),
            "{}",
            ev.note
        );

        // A node that could not profile: failed in the plan, nothing to store.
        let failed = pb::ProfileResult {
            error: "no such cgroup".into(),
            ..result.clone()
        };
        let refused = plan_with(
            &[node(&[], true)],
            Some(&taken.status),
            None,
            &BTreeMap::new(),
            profile::Inputs {
                result: Some(&failed),
                ..no_profile()
            },
        );
        assert_eq!(refused.profile.effect, None);
        let state = refused.status.profile.as_ref().map(|p| p.state);
        assert_eq!(state, Some(resourcewatch_crds::ProfileState::Failed));
        assert!(
            refused
                .events
                .iter()
                .any(|e| e.reason == EventReason::ProfileFailed)
        );
    }

    fn no_profile() -> profile::Inputs<'static> {
        profile::Inputs {
            annotation: None,
            namespace_last: None,
            id: "p-1".into(),
            result: None,
        }
    }

    /// What `when_to_write` reads, at NOW, for a watch whose last written status is `old`.
    fn write_inputs<'a>(
        s: &'a Result<WatchSettings, crate::spec::SpecError>,
        pods: &'a [Arc<SelectedPod>],
        nodes: &'a [NodeView],
        old: &'a ResourceWatchStatus,
    ) -> Inputs<'a> {
        Inputs {
            status: status::Inputs {
                generation: Some(1),
                settings: s,
                pods,
                finished: &[],
                kill_nodes: &[],
                nodes,
                old: Some(old),
                now: NOW_STR,
            },
            watch: "ns/w",
            namespace: "ns",
            gate: None,
            pods: const { &BTreeMap::new() },
            ledgers: const { &BTreeMap::new() },
            profile: no_profile(),
            now: NOW,
        }
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
        let (s, pods, nodes) = (
            settings(),
            [pod(1), pod(2), pod(3)].map(Arc::new),
            [node(&[], true)],
        );
        let i = write_inputs(&s, &pods, &nodes, &old);
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
    fn a_young_pods_first_row_is_written_at_once_an_old_pods_waits() {
        let first = plan(
            &[node(&[], true)],
            None,
            Some(&open_gate()),
            &BTreeMap::new(),
        );
        let mut old = first.status.clone();
        old.last_update_time = Some(NOW_STR.into());
        let made = |i: u32, created: Option<i64>| Arc::new(SelectedPod { created, ..pod(i) });
        let (s, nodes) = (settings(), [node(&[], true)]);
        let pods = [
            made(1, Some(NOW - 10)),
            made(2, Some(NOW - 600)),
            made(3, None),
            made(4, Some(NOW - 5)),
        ];
        let row = |i: u32| resourcewatch_crds::TopEntry {
            pod: format!("app-{i}"),
            container: "app".into(),
            process: resourcewatch_crds::ProcessFigure {
                node: "n1".into(),
                pid: i,
                command: "app".into(),
                value: 50.0,
            },
        };
        old.top_cpu = vec![row(4)];
        let i = write_inputs(&s, &pods, &nodes, &old);
        let interval = Duration::from_secs(30);
        let with = |cpu: Vec<u32>, memory: Vec<u32>| {
            let mut new = old.clone();
            new.top_cpu = cpu.into_iter().map(row).collect();
            new.top_memory = memory.into_iter().map(row).collect();
            when_to_write(&i, &new, false, interval)
        };
        // Made 10 s ago, in no written row: now, from either list.
        assert_eq!(with(vec![4, 1], vec![]), Write::Now);
        assert_eq!(with(vec![4], vec![1]), Write::Now);
        // Made 10 minutes ago, or when is not known: the interval.
        assert_eq!(with(vec![4, 2], vec![]), Write::Skip(interval));
        assert_eq!(with(vec![4, 3], vec![]), Write::Skip(interval));
        // Young, but its row was written already (a changed figure waits).
        assert_eq!(with(vec![4], vec![4]), Write::Skip(interval));
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
        let (s, pods, nodes) = (settings(), [Arc::new(pod(2))], [node(&[], true)]);
        let i = status::Inputs {
            generation: Some(1),
            settings: &s,
            pods: &pods,
            finished: &[],
            kill_nodes: &[],
            nodes: &nodes,
            old: Some(&forged),
            now: NOW_STR,
        };
        assert_eq!(
            assess(&i).candidates(&i),
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
