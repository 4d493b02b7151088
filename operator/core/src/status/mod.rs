//! A watch's status from its selected pods and what their nodes' agents reported, and the
//! Events its transitions deserve. Pure functions: the reconciler feeds them and writes
//! the result; tests feed them fixtures.
//!
//! Transitions are computed against the status stored in the object, not against memory,
//! so a restarted operator does not repeat Events it already published.

mod figures;
#[cfg(test)]
mod tests;
mod transitions;

use std::collections::{BTreeMap, BTreeSet};

use resourcewatch_crds::{
    Condition, ConditionReason, ConditionStatus, GrowthSiteEntry, LeakEntry, MAX_FRAME_LENGTH,
    MAX_GROWTH_SITES, MAX_SITE_FRAMES, Metric, NodeEntry, ProcessFigure, ResourceWatchStatus,
    Summary, ThresholdEntry, TopEntry,
};
use resourcewatch_proto as pb;
use resourcewatch_units::format_bytes;

use crate::{
    model::{ConditionType, EventAction, EventReason},
    nodes::NodeView,
    spec::{SpecError, WatchSettings, format_duration},
};

use figures::*;
pub use transitions::announced_site;
use transitions::*;

/// Pods by UID, for the lookups of every container of every report a watch reads.
pub type ByUid<'a> = foldhash::HashMap<&'a str, &'a SelectedPod>;

/// A pod the watch's selector matched (scheduled or not).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelectedPod {
    pub uid: String,
    pub name: String,
    pub node: Option<String>,
    /// container id (no scheme) -> container name
    pub containers: BTreeMap<String, String>,
    /// The same for containers no longer running (the last instance of each restarted
    /// container, init containers that finished): what names an OOM kill's container.
    pub exited_containers: BTreeMap<String, String>,
    /// When the pod was made (seconds since the epoch): a young pod's first row in the
    /// Top-K is written at once (`decide`), not at the watch's next interval.
    pub created: Option<i64>,
}

/// An Event to publish: on the ResourceWatch, or on one of its pods when `pod` is set.
#[derive(Clone, Debug, PartialEq)]
pub struct EventSpec {
    pub warning: bool,
    pub reason: EventReason,
    pub action: EventAction,
    pub note: String,
    pub pod: Option<String>,
    /// What the Event is about, beyond the object it is on: its `related` object (or, on a
    /// pod, the container in `regarding`). The Event recorder folds Events of one reason
    /// with the same `regarding` and `related` into one series that keeps its first note,
    /// so without it a second leak, node or pod of one watch was never shown.
    pub about: Option<Subject>,
    /// The watch's field the Event is about (`regarding.fieldPath` when it is on the
    /// watch): a container crossing both thresholds gets two Events, not one series.
    pub watch_field: Option<&'static str>,
}

impl EventSpec {
    pub fn new(
        warning: bool,
        reason: EventReason,
        action: EventAction,
        note: String,
        pod: Option<String>,
    ) -> Self {
        Self {
            warning,
            reason,
            action,
            note,
            pod,
            about: None,
            watch_field: None,
        }
    }

    pub fn about(mut self, subject: Subject) -> Self {
        self.about = Some(subject);
        self
    }

    pub fn on_field(mut self, field: &'static str) -> Self {
        self.watch_field = Some(field);
        self
    }
}

/// An object an Event is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subject {
    /// A container of a pod of the watch's namespace (an empty name: the pod).
    Container {
        pod: String,
        container: String,
    },
    Node(String),
}

impl Subject {
    pub fn container(pod: &str, container: &str) -> Self {
        Self::Container {
            pod: pod.into(),
            container: container.into(),
        }
    }
}

pub struct Inputs<'a> {
    pub generation: Option<i64>,
    pub settings: &'a Result<WatchSettings, SpecError>,
    pub pods: &'a [std::sync::Arc<SelectedPod>],
    /// Pods the selector matches that have finished (Succeeded, Failed) or were deleted
    /// lately: nothing is tracked of them, but the OOM kill that ended one (reported after
    /// it was deleted, maybe) is still theirs.
    pub finished: &'a [std::sync::Arc<SelectedPod>],
    /// Nodes where only finished pods of the watch ran: read for their OOM kills alone.
    pub kill_nodes: &'a [NodeView],
    pub nodes: &'a [NodeView],
    pub old: Option<&'a ResourceWatchStatus>,
    /// RFC 3339, seconds.
    pub now: &'a str,
}

pub enum Outcome {
    /// Agents are still reconnecting after an operator start: keep the stored status
    /// rather than publish a half picture (and Events for what merely looks new).
    Hold,
    Write {
        status: Box<ResourceWatchStatus>,
        events: Vec<EventSpec>,
        /// The leaks of nodes reporting now. `status.leaks` also keeps a lost node's
        /// last entries (for people); only these may drive a remediation.
        fresh_leaks: Vec<LeakEntry>,
    },
}

pub fn compute(i: &Inputs<'_>) -> Outcome {
    let settings = match i.settings {
        Ok(s) => s,
        Err(e) => return invalid(i, e),
    };
    let pending = i.nodes.iter().any(|n| !n.reporting && !n.missing);
    let old_is_current = i
        .old
        .is_some_and(|o| o.observed_generation.is_some() && o.observed_generation == i.generation);
    if pending && old_is_current {
        return Outcome::Hold;
    }
    let mut f = Figures::default();
    let by_uid: ByUid<'_> = i.pods.iter().map(|p| (p.uid.as_str(), &**p)).collect();
    for n in i.nodes {
        if let Some(report) = &n.last_report {
            f.add_report(settings, &n.name, report, &by_uid);
        }
    }
    let fresh_leaks: Vec<LeakEntry> = f.leaks.values().map(|(_, l)| l.clone()).collect();
    if let Some(old) = i.old {
        f.keep_stale(i, old);
    }
    let (ranked, mut truncated) = f.rank(settings);
    let nodes = node_entries(i, &mut truncated);
    let (ready, degraded) = conditions(i, pending);
    let with_finished: ByUid<'_> = i
        .pods
        .iter()
        .chain(i.finished)
        .map(|p| (p.uid.as_str(), &**p))
        .collect();
    let oom_kills = crate::oom::merge(
        settings.min_confidence,
        i.old.map_or(&[][..], |o| &o.oom_kills[..]),
        i.nodes.iter().chain(i.kill_nodes).flat_map(|n| {
            n.last_report
                .iter()
                .flat_map(|r| r.oom_kills.iter())
                .map(|k| (n.name.as_str(), k))
        }),
        &with_finished,
    );
    let mut summary = summary(&ranked);
    summary.oom_kills = crate::oom::summary(&oom_kills);
    let mut status = ResourceWatchStatus {
        observed_generation: i.generation,
        conditions: vec![ready, degraded],
        matched_pods: i.pods.len() as u32,
        expected_nodes: i.nodes.len() as u32,
        reporting_nodes: i.nodes.iter().filter(|n| n.reporting).count() as u32,
        summary,
        oom_kills,
        top_cpu: ranked.top_cpu,
        top_memory: ranked.top_memory,
        leaks: ranked.leaks,
        exceeding: ranked.exceeding,
        nodes,
        remediations: i
            .old
            .map(|o| o.remediations.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|mut r| {
                // The stored log is not ours alone (status is writable): keep it bounded
                // (a reason is one of the schema's, or Unknown).
                crate::validate::truncate(&mut r.message, resourcewatch_crds::MAX_MESSAGE);
                r
            })
            .collect(),
        last_update_time: Some(i.now.to_owned()),
        truncated: (truncated != resourcewatch_crds::Truncated::default()).then_some(truncated),
        // The profile's own step decides it (crate::profile); carried as it was.
        profile: i.old.and_then(|o| o.profile.clone()),
    };
    carry_transition_times(&mut status.conditions, old_conditions(i.old), i.now);
    let events = if pending {
        Vec::new()
    } else {
        let rejecting: BTreeSet<&str> = i
            .nodes
            .iter()
            .filter(|n| n.nack.is_some())
            .map(|n| n.name.as_str())
            .collect();
        transitions(i.old, &status, settings, &rejecting)
    };
    Outcome::Write {
        status: Box::new(status),
        events,
        fresh_leaks,
    }
}

/// Every node of the watch's pods, with what it has to say about this watch's containers
/// (a node's health speaks for every watch on it).
fn node_entries(i: &Inputs<'_>, truncated: &mut resourcewatch_crds::Truncated) -> Vec<NodeEntry> {
    let my_containers: BTreeSet<&str> = i
        .pods
        .iter()
        .flat_map(|p| p.containers.keys().map(String::as_str))
        .collect();
    let mut entries: Vec<NodeEntry> = i
        .nodes
        .iter()
        .map(|n| {
            let mut message = node_message(n, &my_containers);
            crate::validate::truncate(&mut message, resourcewatch_crds::MAX_MESSAGE);
            NodeEntry {
                name: n.name.clone(),
                reporting: !n.missing,
                config_version: n.acked_version,
                message,
            }
        })
        .collect();
    // Nodes with something to say first, so a cap never hides a problem behind healthy ones.
    entries.sort_by_key(|n| (n.reporting, n.message.is_empty()));
    truncated.nodes = entries
        .len()
        .saturating_sub(resourcewatch_crds::MAX_STATUS_NODES) as u32;
    entries.truncate(resourcewatch_crds::MAX_STATUS_NODES);
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    entries
}

/// `Ready` and `Degraded`.
fn conditions(i: &Inputs<'_>, pending: bool) -> (Condition, Condition) {
    let expected = i.nodes.len();
    let reporting = i.nodes.iter().filter(|n| n.reporting).count();
    let unscheduled = i.pods.iter().filter(|p| p.node.is_none()).count();
    let ready = if pending {
        cond(
            ConditionType::Ready,
            ConditionStatus::Unknown,
            ConditionReason::WaitingForAgents,
            "waiting for the agents of the selected pods' nodes to report".into(),
        )
    } else if i.pods.is_empty() {
        cond(
            ConditionType::Ready,
            ConditionStatus::True,
            ConditionReason::NoPodsSelected,
            "the selector matches no pod in this namespace".into(),
        )
    } else {
        cond(
            ConditionType::Ready,
            ConditionStatus::True,
            ConditionReason::Watching,
            format!(
                "{} pods selected ({} not scheduled yet), {reporting}/{expected} nodes reporting",
                i.pods.len(),
                unscheduled
            ),
        )
    };
    (ready, degraded(i))
}

fn degraded(i: &Inputs<'_>) -> Condition {
    let missing: Vec<&str> = i
        .nodes
        .iter()
        .filter(|n| n.missing)
        .map(|n| n.name.as_str())
        .collect();
    let nacked: Vec<String> = i
        .nodes
        .iter()
        .filter_map(|n| n.nack.as_ref().map(|(_, r)| format!("{}: {r}", n.name)))
        .collect();
    if !missing.is_empty() {
        cond(
            ConditionType::Degraded,
            ConditionStatus::True,
            ConditionReason::AgentsMissing,
            format!(
                "no report from the agent of node(s) {}",
                list_some(&missing)
            ),
        )
    } else if !nacked.is_empty() {
        let n: Vec<&str> = nacked.iter().map(String::as_str).collect();
        cond(
            ConditionType::Degraded,
            ConditionStatus::True,
            ConditionReason::ConfigRejected,
            list_some(&n),
        )
    } else {
        cond(
            ConditionType::Degraded,
            ConditionStatus::False,
            ConditionReason::AllAgentsReporting,
            String::new(),
        )
    }
}

/// What `kubectl get resourcewatch` shows.
fn summary(r: &Ranked) -> Summary {
    let soonest = r
        .leaks
        .iter()
        .filter_map(|l| Some((l, l.time_to_oom_seconds?)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    Summary {
        top_cpu: r
            .top_cpu
            .first()
            .map(|e| format!("{} ({}%)", e.pod, e.process.value.round())),
        top_memory: r
            .top_memory
            .first()
            .map(|e| format!("{} ({})", e.pod, format_bytes(e.process.value as u64))),
        leaking: r.leaks.len() as u32,
        soonest_oom: soonest
            .map(|(_, s)| format_duration(std::time::Duration::from_secs_f64(s.max(0.0)))),
        soonest_oom_pod: soonest.map(|(l, _)| format!("{}/{}", l.pod, l.container)),
        // Set by compute from the kills.
        oom_kills: None,
    }
}

/// At most ten names, then how many more: a message stays readable with 1,000 nodes.
fn list_some(names: &[&str]) -> String {
    const SHOWN: usize = 10;
    let mut s = names
        .iter()
        .take(SHOWN)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        s.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    s
}

fn invalid(i: &Inputs<'_>, e: &SpecError) -> Outcome {
    let mut status = i.old.cloned().unwrap_or_default();
    status.observed_generation = i.generation;
    status.conditions = vec![
        cond(
            ConditionType::Ready,
            ConditionStatus::False,
            ConditionReason::InvalidSpec,
            e.to_string(),
        ),
        cond(
            ConditionType::Degraded,
            ConditionStatus::False,
            ConditionReason::InvalidSpec,
            String::new(),
        ),
    ];
    status.top_cpu.clear();
    status.top_memory.clear();
    status.leaks.clear();
    status.exceeding.clear();
    status.nodes.clear();
    status.truncated = None;
    status.summary = Summary::default();
    status.last_update_time = Some(i.now.to_owned());
    carry_transition_times(&mut status.conditions, old_conditions(i.old), i.now);
    let was = i
        .old
        .and_then(|o| find(&o.conditions, ConditionType::Ready));
    let events = if was
        .is_some_and(|c| c.reason == ConditionReason::InvalidSpec && c.message == e.to_string())
    {
        Vec::new()
    } else {
        vec![ev(
            true,
            EventReason::InvalidSpec,
            EventAction::Validate,
            e.to_string(),
            None,
        )]
    };
    Outcome::Write {
        status: Box::new(status),
        events,
        fresh_leaks: Vec::new(),
    }
}

fn node_message(n: &NodeView, mine: &BTreeSet<&str>) -> String {
    if let Some((v, r)) = &n.nack {
        return format!("configuration rejected (version {v}): {r}");
    }
    if n.missing {
        return if n.connected {
            "connected but not reporting".into()
        } else {
            "agent not connected".into()
        };
    }
    if let Some(caps) = &n.capabilities
        && !caps.missing.is_empty()
    {
        return format!("kernel: {}", caps.missing.join("; "));
    }
    if let Some(r) = &n.last_report
        && let Some(h) = &r.health
    {
        let missing: Vec<&str> = h
            .unresolved_containers
            .iter()
            .map(String::as_str)
            .filter(|c| mine.contains(c))
            .collect();
        if !missing.is_empty() {
            return format!("containers not found on the node: {}", missing.join(", "));
        }
    }
    String::new()
}

fn ev(
    warning: bool,
    reason: EventReason,
    action: EventAction,
    note: String,
    pod: Option<String>,
) -> EventSpec {
    EventSpec::new(warning, reason, action, note, pod)
}

pub fn cond(
    type_: ConditionType,
    status: ConditionStatus,
    reason: ConditionReason,
    mut message: String,
) -> Condition {
    crate::validate::truncate(&mut message, resourcewatch_crds::MAX_MESSAGE);
    Condition {
        type_: type_.as_str().into(),
        status,
        reason,
        message,
        last_transition_time: String::new(),
        observed_generation: None,
    }
}

pub fn find(conds: &[Condition], type_: ConditionType) -> Option<&Condition> {
    conds.iter().find(|c| c.type_ == type_.as_str())
}

/// A condition keeps its transition time while its status does not change.
pub fn carry_transition_times(conds: &mut [Condition], old: &[Condition], now: &str) {
    for c in conds {
        let prev = old.iter().find(|p| p.type_ == c.type_);
        c.last_transition_time = match prev {
            Some(p) if p.status == c.status => p.last_transition_time.clone(),
            _ => now.to_owned(),
        };
    }
}

fn old_conditions(old: Option<&ResourceWatchStatus>) -> &[Condition] {
    old.map_or(&[][..], |o| &o.conditions[..])
}

/// Equal apart from the update time: no need to write. Field by field, not two clones
/// compared (each reconcile asks; the clones were 1.6 % of the operator's CPU at the CI
/// scale); the destructuring names every field, so a field added later must be placed here.
pub fn same_content(a: &ResourceWatchStatus, b: &ResourceWatchStatus) -> bool {
    let ResourceWatchStatus {
        observed_generation,
        conditions,
        matched_pods,
        expected_nodes,
        reporting_nodes,
        top_cpu,
        top_memory,
        leaks,
        exceeding,
        nodes,
        remediations,
        oom_kills,
        summary,
        truncated,
        profile,
        last_update_time: _,
    } = a;
    *observed_generation == b.observed_generation
        && *matched_pods == b.matched_pods
        && *expected_nodes == b.expected_nodes
        && *reporting_nodes == b.reporting_nodes
        && *conditions == b.conditions
        && *summary == b.summary
        && *truncated == b.truncated
        && *profile == b.profile
        && *top_cpu == b.top_cpu
        && *top_memory == b.top_memory
        && *leaks == b.leaks
        && *exceeding == b.exceeding
        && *nodes == b.nodes
        && *remediations == b.remediations
        && *oom_kills == b.oom_kills
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}
