//! A watch's status from its selected pods and what their nodes' agents reported, and the
//! Events its transitions deserve. Pure functions: the reconciler feeds them and writes
//! the result; tests feed them fixtures.
//!
//! Transitions are computed against the status stored in the object, not against memory,
//! so a restarted operator does not repeat Events it already published.

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
    pub pods: &'a [SelectedPod],
    /// Pods the selector matches that have finished (Succeeded, Failed) or were deleted
    /// lately: nothing is tracked of them, but the OOM kill that ended one (reported after
    /// it was deleted, maybe) is still theirs.
    pub finished: &'a [SelectedPod],
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
    let by_uid: BTreeMap<&str, &SelectedPod> = i.pods.iter().map(|p| (p.uid.as_str(), p)).collect();
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
    let with_finished: BTreeMap<&str, &SelectedPod> = i
        .pods
        .iter()
        .chain(i.finished)
        .map(|p| (p.uid.as_str(), p))
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

/// The figures of the watch's containers, gathered from its nodes' reports.
#[derive(Default)]
struct Figures {
    top_cpu: Vec<TopEntry>,
    top_memory: Vec<TopEntry>,
    exceeding: Vec<ThresholdEntry>,
    /// One per (pod, container), and whether it is the container-level series.
    leaks: BTreeMap<(String, String), (bool, LeakEntry)>,
}

/// The figures as the status shows them: sorted, cut to K and to the status's bounds.
struct Ranked {
    top_cpu: Vec<TopEntry>,
    top_memory: Vec<TopEntry>,
    leaks: Vec<LeakEntry>,
    exceeding: Vec<ThresholdEntry>,
}

impl Figures {
    fn add_report(
        &mut self,
        settings: &WatchSettings,
        node: &str,
        report: &pb::Report,
        by_uid: &BTreeMap<&str, &SelectedPod>,
    ) {
        let container_of =
            |pod: &SelectedPod, id: &str| pod.containers.get(id).cloned().unwrap_or_default();
        for c in &report.containers {
            let Some(pod) = by_uid.get(c.pod_uid.as_str()) else {
                continue;
            };
            let container = container_of(pod, &c.container_id);
            for p in &c.processes {
                let entry = |value| TopEntry {
                    pod: pod.name.clone(),
                    container: container.clone(),
                    process: ProcessFigure {
                        node: node.to_owned(),
                        pid: p.pid,
                        command: p.command.clone(),
                        value,
                    },
                };
                self.top_cpu.push(entry(round2(p.cpu_percent)));
                self.top_memory.push(entry(p.rss_bytes as f64));
            }
            self.exceeding
                .extend(thresholds_crossed(settings, c, &pod.name, &container));
        }
        if !settings.leaks_enabled {
            return;
        }
        for l in &report.leaks {
            let Some(pod) = by_uid.get(l.pod_uid.as_str()) else {
                continue;
            };
            if l.confidence < settings.min_confidence as u32
                || l.growing_seconds < settings.min_growing.as_secs_f64()
            {
                continue;
            }
            let entry = leak_entry(
                settings,
                node,
                l,
                &pod.name,
                container_of(pod, &l.container_id),
            );
            // One entry per container: the container-level series (pid 0) wins, else the
            // most confident process.
            let k = (entry.pod.clone(), entry.container.clone());
            let container_level = l.pid == 0;
            let replace = match self.leaks.get(&k) {
                None => true,
                Some((true, _)) => false,
                Some((false, _)) if container_level => true,
                Some((false, have)) => have.confidence < entry.confidence,
            };
            if replace {
                self.leaks.insert(k, (container_level, entry));
            }
        }
    }

    /// A node that stopped reporting keeps its last known entries (the Degraded condition
    /// says they are stale): dropping them would turn every agent restart into a
    /// LeakDetected / ThresholdCrossed the moment it reports again. They are never acted
    /// on (only fresh leaks are).
    fn keep_stale(&mut self, i: &Inputs<'_>, old: &ResourceWatchStatus) {
        let stale: BTreeSet<&str> = i
            .nodes
            .iter()
            .filter(|n| !n.reporting)
            .map(|n| n.name.as_str())
            .collect();
        let live_pods: BTreeMap<&str, Option<&str>> = i
            .pods
            .iter()
            .map(|p| (p.name.as_str(), p.node.as_deref()))
            .collect();
        let keep = |pod: &str, node: &str| {
            stale.contains(node) && live_pods.get(pod).is_some_and(|n| *n == Some(node))
        };
        let kept = |entries: &[TopEntry]| -> Vec<TopEntry> {
            entries
                .iter()
                .filter(|e| keep(&e.pod, &e.process.node))
                .cloned()
                .collect()
        };
        self.top_cpu.extend(kept(&old.top_cpu));
        self.top_memory.extend(kept(&old.top_memory));
        for l in old.leaks.iter().filter(|l| keep(&l.pod, &l.node)) {
            self.leaks
                .entry((l.pod.clone(), l.container.clone()))
                .or_insert((true, l.clone()));
        }
        let on_stale_node = |pod: &str| {
            live_pods
                .get(pod)
                .copied()
                .flatten()
                .is_some_and(|n| stale.contains(n))
        };
        self.exceeding.extend(
            old.exceeding
                .iter()
                .filter(|e| on_stale_node(&e.pod))
                .cloned(),
        );
    }

    fn rank(self, settings: &WatchSettings) -> (Ranked, resourcewatch_crds::Truncated) {
        let k = settings.top_k as usize;
        let top = |mut v: Vec<TopEntry>, on: bool| {
            v.sort_by(|a, b| {
                b.process
                    .value
                    .total_cmp(&a.process.value)
                    .then(a.process.pid.cmp(&b.process.pid))
            });
            v.truncate(if on { k } else { 0 });
            v
        };
        let mut leaks: Vec<LeakEntry> = self.leaks.into_values().map(|(_, l)| l).collect();
        leaks.sort_by(|a, b| {
            let ka = a.time_to_oom_seconds.unwrap_or(f64::MAX);
            let kb = b.time_to_oom_seconds.unwrap_or(f64::MAX);
            ka.total_cmp(&kb).then(b.confidence.cmp(&a.confidence))
        });
        let mut exceeding = self.exceeding;
        exceeding.sort_by(|a, b| b.value.total_cmp(&a.value));
        let mut truncated = resourcewatch_crds::Truncated::default();
        let cap = |n: usize, max: usize| n.saturating_sub(max) as u32;
        truncated.leaks = cap(leaks.len(), resourcewatch_crds::MAX_STATUS_LEAKS);
        leaks.truncate(resourcewatch_crds::MAX_STATUS_LEAKS);
        truncated.exceeding = cap(exceeding.len(), resourcewatch_crds::MAX_STATUS_EXCEEDING);
        exceeding.truncate(resourcewatch_crds::MAX_STATUS_EXCEEDING);
        let ranked = Ranked {
            top_cpu: top(self.top_cpu, settings.cpu),
            top_memory: top(self.top_memory, settings.memory),
            leaks,
            exceeding,
        };
        (ranked, truncated)
    }
}

/// The thresholds a container's figures cross.
fn thresholds_crossed(
    settings: &WatchSettings,
    c: &pb::ContainerReport,
    pod: &str,
    container: &str,
) -> Vec<ThresholdEntry> {
    let entry = |metric, value: f64, threshold| ThresholdEntry {
        pod: pod.to_owned(),
        container: container.to_owned(),
        metric,
        value: round2(value),
        threshold,
    };
    let mut out = Vec::new();
    if let Some(t) = settings.cpu_threshold.filter(|t| c.cpu_percent > *t) {
        out.push(entry(Metric::Cpu, c.cpu_percent, t));
    }
    if c.memory_limit_bytes > 0 {
        let pct = c.memory_bytes as f64 * 100.0 / c.memory_limit_bytes as f64;
        if let Some(t) = settings.memory_threshold.filter(|t| pct > *t) {
            out.push(entry(Metric::Memory, pct, t));
        }
    }
    out
}

/// A node's leak as the status shows it: a time to OOM only within the watch's horizon,
/// its lower bound never above it.
fn leak_entry(
    settings: &WatchSettings,
    node: &str,
    l: &pb::Leak,
    pod: &str,
    container: String,
) -> LeakEntry {
    let tto = l
        .time_to_oom_seconds
        .filter(|s| *s <= settings.horizon.as_secs_f64());
    LeakEntry {
        pod: pod.to_owned(),
        container,
        node: node.to_owned(),
        growth_bytes_per_second: l.growth_bytes_per_second.round(),
        confidence: l.confidence.min(100) as u8,
        time_to_oom_seconds: tto.map(|s| s.round()),
        time_to_oom_lower_bound_seconds: tto.map(|point| {
            l.time_to_oom_low_seconds
                .unwrap_or(point)
                .min(point)
                .floor()
        }),
        growing_for_seconds: Some(l.growing_seconds.floor()),
        limit_bytes: (l.limit_bytes > 0).then_some(l.limit_bytes),
        growth_sites: growth_sites(&l.growth_sites),
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

/// The Events the change from `old` to `new` deserves. `rejecting`: the nodes whose
/// agents refused their configuration.
fn transitions(
    old: Option<&ResourceWatchStatus>,
    new: &ResourceWatchStatus,
    settings: &WatchSettings,
    rejecting: &BTreeSet<&str>,
) -> Vec<EventSpec> {
    let mut out = Vec::new();
    became_ready(old, new, &mut out);
    node_transitions(old, new, rejecting, &mut out);
    leak_transitions(old, new, settings, &mut out);
    threshold_transitions(old, new, &mut out);
    oom_kill_transitions(old, new, &mut out);
    out
}

/// One `OOMKilled` Event per kill the stored status did not hold yet.
fn oom_kill_transitions(
    old: Option<&ResourceWatchStatus>,
    new: &ResourceWatchStatus,
    out: &mut Vec<EventSpec>,
) {
    let known: BTreeSet<(&str, &str, u32)> = old
        .map(|o| {
            o.oom_kills
                .iter()
                .map(|k| (k.time.as_str(), k.node.as_str(), k.pid))
                .collect()
        })
        .unwrap_or_default();
    // Only kills newer than every stored one: a stored list cut to its bound must not
    // announce again the older kills an agent still repeats.
    let newest_known = old
        .and_then(|o| o.oom_kills.last())
        .map(|k| k.time.as_str());
    for k in &new.oom_kills {
        if known.contains(&(k.time.as_str(), k.node.as_str(), k.pid))
            || newest_known.is_some_and(|t| k.time.as_str() < t)
        {
            continue;
        }
        out.push(
            ev(
                true,
                EventReason::OOMKilled,
                EventAction::Monitor,
                crate::oom::note(k),
                None,
            )
            .about(Subject::container(&k.pod, &k.container)),
        );
    }
}

fn became_ready(
    old: Option<&ResourceWatchStatus>,
    new: &ResourceWatchStatus,
    out: &mut Vec<EventSpec>,
) {
    let was_ready = old
        .and_then(|o| find(&o.conditions, ConditionType::Ready))
        .is_some_and(|c| c.status == ConditionStatus::True);
    if let Some(r) = find(&new.conditions, ConditionType::Ready)
        && r.status == ConditionStatus::True
        && !was_ready
    {
        out.push(ev(
            false,
            EventReason::WatchReady,
            EventAction::Reconcile,
            r.message.clone(),
            None,
        ));
    }
}

/// Agents lost and recovered, and configurations refused (once per message).
fn node_transitions(
    old: Option<&ResourceWatchStatus>,
    new: &ResourceWatchStatus,
    rejecting: &BTreeSet<&str>,
    out: &mut Vec<EventSpec>,
) {
    let old_nodes: BTreeMap<&str, bool> = old
        .map(|o| {
            o.nodes
                .iter()
                .map(|n| (n.name.as_str(), n.reporting))
                .collect()
        })
        .unwrap_or_default();
    for n in &new.nodes {
        match (old_nodes.get(n.name.as_str()), n.reporting) {
            (Some(true) | None, false) => out.push(ev(
                true,
                EventReason::AgentLost,
                EventAction::Monitor,
                format!("the agent on node {} stopped reporting: its pods' figures are missing from this status", n.name),
                None,
            ).about(Subject::Node(n.name.clone()))),
            (Some(false), true) => out.push(ev(
                false,
                EventReason::AgentRecovered,
                EventAction::Monitor,
                format!("the agent on node {} reports again", n.name),
                None,
            ).about(Subject::Node(n.name.clone()))),
            _ => {}
        }
        let old_msg = old
            .and_then(|o| o.nodes.iter().find(|m| m.name == n.name))
            .map(|m| m.message.as_str())
            .unwrap_or("");
        if rejecting.contains(n.name.as_str()) && n.message != old_msg {
            out.push(
                ev(
                    true,
                    EventReason::ConfigRejected,
                    EventAction::Configure,
                    format!("node {}: {}", n.name, n.message),
                    None,
                )
                .about(Subject::Node(n.name.clone())),
            );
        }
    }
}

/// A new leak (on the watch, and on its pod when the watch may act on it), and its
/// growth site once it is found.
fn leak_transitions(
    old: Option<&ResourceWatchStatus>,
    new: &ResourceWatchStatus,
    settings: &WatchSettings,
    out: &mut Vec<EventSpec>,
) {
    // Old leaks, and whether their growth site was announced then.
    let old_leaks: BTreeMap<(&str, &str), bool> = old
        .map(|o| {
            o.leaks
                .iter()
                .map(|l| {
                    (
                        (l.pod.as_str(), l.container.as_str()),
                        announced_site(l).is_some(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    for l in &new.leaks {
        let who = format!(
            "{}/{}",
            l.pod,
            if l.container.is_empty() {
                "?"
            } else {
                &l.container
            }
        );
        let site = announced_site(l);
        match old_leaks.get(&(l.pod.as_str(), l.container.as_str())) {
            // Already announced; the site came later (it is captured once the leak is
            // found): say where it grows, once. Its own reason: the Event recorder merges
            // Events of one reason about one object into a series that keeps the first
            // note, so a second LeakDetected would never show the site.
            Some(false) if site.is_some() => {
                out.push(
                    ev(
                        true,
                        EventReason::LeakSiteFound,
                        EventAction::Predict,
                        format!("{who} grows at {}", site.unwrap_or_default()),
                        None,
                    )
                    .about(Subject::container(&l.pod, &l.container)),
                );
                continue;
            }
            Some(_) => continue,
            None => {}
        }
        let note = leak_note(&who, l, site.as_deref());
        out.push(
            ev(
                true,
                EventReason::LeakDetected,
                EventAction::Predict,
                note.clone(),
                None,
            )
            .about(Subject::container(&l.pod, &l.container)),
        );
        if settings.action != resourcewatch_crds::RemediationAction::None {
            out.push(
                ev(
                    true,
                    EventReason::LeakDetected,
                    EventAction::Predict,
                    note,
                    Some(l.pod.clone()),
                )
                .about(Subject::container(&l.pod, &l.container)),
            );
        }
    }
}

/// A new leak as its Event says it.
fn leak_note(who: &str, l: &LeakEntry, site: Option<&str>) -> String {
    format!(
        "{who} grows {}/s (confidence {}){}{}{}",
        format_bytes(l.growth_bytes_per_second.max(0.0) as u64),
        l.confidence,
        l.time_to_oom_seconds
            .map(|s| format!(
                ", predicted OOM kill in {}",
                format_duration(std::time::Duration::from_secs_f64(s.max(0.0)))
            ))
            .unwrap_or_default(),
        l.limit_bytes
            .map(|b| format!(" (limit {})", format_bytes(b)))
            .unwrap_or_default(),
        site.map(|s| format!(", at {s}")).unwrap_or_default(),
    )
}

/// A threshold newly crossed, per container and metric.
fn threshold_transitions(
    old: Option<&ResourceWatchStatus>,
    new: &ResourceWatchStatus,
    out: &mut Vec<EventSpec>,
) {
    let old_ex: BTreeSet<(&str, &str, Metric)> = old
        .map(|o| {
            o.exceeding
                .iter()
                .map(|e| (e.pod.as_str(), e.container.as_str(), e.metric))
                .collect()
        })
        .unwrap_or_default();
    for e in &new.exceeding {
        if old_ex.contains(&(e.pod.as_str(), e.container.as_str(), e.metric)) {
            continue;
        }
        let (what, field) = match e.metric {
            Metric::Cpu => (
                format!("CPU {}% of a core, above {}%", e.value, e.threshold),
                "spec.thresholds.cpuPercent",
            ),
            Metric::Memory => (
                format!("memory {}% of its limit, above {}%", e.value, e.threshold),
                "spec.thresholds.memoryPercentOfLimit",
            ),
        };
        out.push(
            ev(
                true,
                EventReason::ThresholdCrossed,
                EventAction::Monitor,
                format!("{}/{}: {what}", e.pod, e.container),
                None,
            )
            .about(Subject::container(&e.pod, &e.container))
            .on_field(field),
        );
    }
}

/// The top growth site worth an Event: one that names a function. A top site of only
/// `[libc.so.6]` / `[unknown]` frames (a program's start-up heap growth in glibc's
/// unwalkable code, named first while the capture is young) says nothing a user can act
/// on, and the Event recorder keeps a series' first note: announcing it would hide the
/// leak's real site when it takes the top a few seconds later.
fn announced_site(l: &LeakEntry) -> Option<String> {
    l.growth_sites
        .first()
        .filter(|g| g.frames.iter().any(|f| !f.starts_with('[')))
        .map(site_note)
}

/// Frames of a growth site an Event shows: enough to pass the allocator's own frames
/// (`sysmalloc < _int_malloc < __libc_malloc`, a memset) and reach the code that grows.
const NOTE_FRAMES: usize = 6;

/// A growth site as an Event says it: its first frames, leaf first, and its share.
fn site_note(site: &GrowthSiteEntry) -> String {
    let mut frames: Vec<&str> = site
        .frames
        .iter()
        .take(NOTE_FRAMES)
        .map(String::as_str)
        .collect();
    if site.frames.len() > NOTE_FRAMES {
        frames.push("...");
    }
    format!(
        "{} ({:.0}% of its growth)",
        frames.join(" < "),
        site.percent
    )
}

/// The agent's growth sites, held to the status's bounds (an agent is not trusted to
/// keep them): empty names dropped, long ones cut on a character boundary.
fn growth_sites(sites: &[pb::GrowthSite]) -> Vec<GrowthSiteEntry> {
    sites
        .iter()
        .take(MAX_GROWTH_SITES as usize)
        .filter_map(|g| {
            let frames: Vec<String> = g
                .frames
                .iter()
                .filter(|f| !f.is_empty())
                .take(MAX_SITE_FRAMES as usize)
                .map(|f| f.chars().take(MAX_FRAME_LENGTH as usize).collect())
                .collect();
            let percent = if g.percent.is_finite() {
                (g.percent.clamp(0.0, 100.0) * 10.0).round() / 10.0
            } else {
                0.0
            };
            (!frames.is_empty()).then_some(GrowthSiteEntry {
                frames,
                bytes: g.bytes,
                percent,
            })
        })
        .collect()
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

/// Equal apart from the update time: no need to write.
pub fn same_content(a: &ResourceWatchStatus, b: &ResourceWatchStatus) -> bool {
    let strip = |s: &ResourceWatchStatus| ResourceWatchStatus {
        last_update_time: None,
        ..s.clone()
    };
    strip(a) == strip(b)
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// The part of a report a watch sees, for tests and the load tool.
pub fn process(pid: u32, command: &str, cpu: f64, rss: u64) -> pb::Process {
    pb::Process {
        pid,
        command: command.into(),
        cpu_percent: cpu,
        rss_bytes: rss,
        ..Default::default()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;
    use resourcewatch_crds::ResourceWatchSpec;
    use std::time::Duration;

    fn settings(json: serde_json::Value) -> Result<WatchSettings, SpecError> {
        let spec: ResourceWatchSpec = serde_json::from_value(json).expect("spec");
        WatchSettings::from_spec(&spec, &crate::spec::Floors::default())
    }

    fn pod(uid: &str, node: &str) -> SelectedPod {
        SelectedPod {
            uid: uid.into(),
            name: format!("pod-{uid}"),
            node: Some(node.into()),
            containers: [(format!("cid-{uid}"), "app".to_string())].into(),
            exited_containers: Default::default(),
        }
    }

    fn node(name: &str, containers: Vec<pb::ContainerReport>, leaks: Vec<pb::Leak>) -> NodeView {
        NodeView {
            name: name.into(),
            connected: true,
            reporting: true,
            missing: false,
            acked_version: Some(7),
            last_report: Some(std::sync::Arc::new(pb::Report {
                containers,
                leaks,
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    fn container(
        uid: &str,
        cpu: f64,
        mem: u64,
        limit: u64,
        procs: Vec<pb::Process>,
    ) -> pb::ContainerReport {
        pb::ContainerReport {
            pod_uid: uid.into(),
            container_id: format!("cid-{uid}"),
            memory_bytes: mem,
            memory_limit_bytes: limit,
            cpu_percent: cpu,
            processes: procs,
        }
    }

    fn write(o: Outcome) -> (ResourceWatchStatus, Vec<EventSpec>) {
        match o {
            Outcome::Write { status, events, .. } => (*status, events),
            Outcome::Hold => panic!("expected a write"),
        }
    }

    /// A status computed for generation 1 at `now` and written.
    fn write_at(
        settings: &Result<WatchSettings, SpecError>,
        pods: &[SelectedPod],
        nodes: &[NodeView],
        old: Option<&ResourceWatchStatus>,
        now: &str,
    ) -> (ResourceWatchStatus, Vec<EventSpec>) {
        write(compute(&Inputs {
            generation: Some(1),
            settings,
            pods,
            finished: &[],
            kill_nodes: &[],
            nodes,
            old,
            now,
        }))
    }

    #[test]
    fn a_node_refusing_its_configuration_is_one_event_and_a_degraded_reason() {
        let s = settings(serde_json::json!({}));
        let pods = [pod("a", "n1")];
        let fine = [node("n1", vec![], vec![])];
        let (st, _) = write_at(&s, &pods, &fine, None, "t0");
        let refusing = [NodeView {
            nack: Some((8, "cpu sketch width 3 is not a power of two".into())),
            ..fine[0].clone()
        }];
        let (st, ev) = write_at(&s, &pods, &refusing, Some(&st), "t1");
        let rejected: Vec<_> = ev
            .iter()
            .filter(|e| e.reason == EventReason::ConfigRejected)
            .collect();
        assert_eq!(rejected.len(), 1, "{ev:?}");
        assert!(rejected[0].note.contains("power of two"), "{ev:?}");
        let degraded = find(&st.conditions, ConditionType::Degraded).cloned();
        assert_eq!(
            degraded.map(|c| c.reason),
            Some(ConditionReason::ConfigRejected)
        );
        // The same refusal at the next reconcile: no second Event.
        let (_, ev) = write_at(&s, &pods, &refusing, Some(&st), "t2");
        assert!(!ev.iter().any(|e| e.reason == EventReason::ConfigRejected));
    }

    #[test]
    fn top_lists_rank_across_nodes_and_ignore_unselected_pods() {
        let s = settings(serde_json::json!({"topK": 2}));
        let pods = [pod("a", "n1"), pod("b", "n2")];
        let nodes = [
            node(
                "n1",
                vec![container(
                    "a",
                    90.0,
                    10 << 20,
                    0,
                    vec![
                        process(10, "burn", 90.0, 1 << 20),
                        process(11, "idle", 0.0, 5 << 20),
                    ],
                )],
                vec![],
            ),
            node(
                "n2",
                vec![
                    container(
                        "b",
                        20.0,
                        300 << 20,
                        0,
                        vec![process(20, "cache", 20.0, 300 << 20)],
                    ),
                    container(
                        "zzz",
                        500.0,
                        900 << 20,
                        0,
                        vec![process(30, "other", 500.0, 900 << 20)],
                    ),
                ],
                vec![],
            ),
        ];
        let (st, ev) = write_at(&s, &pods, &nodes, None, "t0");
        let cpu: Vec<u32> = st.top_cpu.iter().map(|e| e.process.pid).collect();
        let mem: Vec<u32> = st.top_memory.iter().map(|e| e.process.pid).collect();
        assert_eq!(cpu, [10, 20], "pod zzz is not selected");
        assert_eq!(mem, [20, 11]);
        assert_eq!(st.top_cpu[0].container, "app");
        assert_eq!(st.top_cpu[0].process.node, "n1");
        assert_eq!(st.summary.top_cpu.as_deref(), Some("pod-a (90%)"));
        assert_eq!(st.summary.top_memory.as_deref(), Some("pod-b (300Mi)"));
        assert_eq!(
            (st.matched_pods, st.expected_nodes, st.reporting_nodes),
            (2, 2, 2)
        );
        assert_eq!(
            ev.iter().map(|e| e.reason).collect::<Vec<_>>(),
            ["WatchReady"]
        );
    }

    #[test]
    fn leaks_are_listed_once_per_container_and_announced_once() {
        let s = settings(serde_json::json!({"remediation": {"action": "Alert"}}));
        let pods = [pod("a", "n1")];
        let leak = |pid, conf, tto| pb::Leak {
            pod_uid: "a".into(),
            container_id: "cid-a".into(),
            pid,
            growth_bytes_per_second: 2e6,
            confidence: conf,
            limit_bytes: 128 << 20,
            time_to_oom_seconds: tto,
            ..Default::default()
        };
        let nodes = [node(
            "n1",
            vec![],
            vec![
                leak(0, 80, Some(45.0)),
                leak(12, 95, Some(40.0)),
                leak(13, 30, None),
            ],
        )];
        let (st, ev) = write_at(&s, &pods, &nodes, None, "t0");
        assert_eq!(st.leaks.len(), 1, "{:?}", st.leaks);
        assert_eq!(
            st.leaks[0].time_to_oom_seconds,
            Some(45.0),
            "container-level series wins"
        );
        assert_eq!(st.summary.leaking, 1);
        assert_eq!(st.summary.soonest_oom.as_deref(), Some("45s"));
        assert_eq!(
            st.summary.soonest_oom_pod.as_deref(),
            Some(format!("pod-a/{}", st.leaks[0].container).as_str())
        );
        let leak_events: Vec<&EventSpec> =
            ev.iter().filter(|e| e.reason == "LeakDetected").collect();
        assert_eq!(
            leak_events.len(),
            2,
            "on the watch and, with Alert, on the pod"
        );
        assert_eq!(leak_events[1].pod.as_deref(), Some("pod-a"));
        // Both name the leaking container, so the recorder keeps one series per leak.
        for e in &leak_events {
            assert_eq!(
                e.about,
                Some(Subject::container("pod-a", &st.leaks[0].container))
            );
        }
        assert!(
            leak_events[0].note.contains("predicted OOM kill in 45s"),
            "{}",
            leak_events[0].note
        );
        let (_, again) = write_at(&s, &pods, &nodes, Some(&st), "t1");
        assert!(again.is_empty(), "no repeat: {again:?}");
    }

    /// A kill an agent reports is kept in the status, graded, announced once (the agent
    /// repeats it in its reports), counted in the summary, and left alone when its pod is
    /// not selected.
    #[test]
    fn an_oom_kill_is_kept_graded_and_announced_once() {
        let s = settings(serde_json::json!({"leakDetection": {"minConfidence": 80}}));
        let pods = [pod("a", "n1")];
        let kill = |uid: &str, at_ms: i64| pb::OomKill {
            pod_uid: uid.into(),
            container_id: format!("cid-{uid}"),
            pid: 9,
            command: "leak".into(),
            timestamp_unix_ms: at_ms,
            limit_bytes: 128 << 20,
            memory_bytes: 127 << 20,
            predictions: vec![pb::Prediction {
                timestamp_unix_ms: at_ms - 40_000,
                confidence: 90,
                time_to_oom_seconds: Some(45.0),
                time_to_oom_low_seconds: Some(30.0),
            }],
            ..Default::default()
        };
        let mut n = node("n1", vec![], vec![]);
        let report = std::sync::Arc::new(pb::Report {
            oom_kills: vec![
                kill("a", 1_800_000_000_000),
                kill("other", 1_800_000_001_000),
            ],
            ..Default::default()
        });
        n.last_report = Some(report);
        let nodes = [n];
        let (st, ev) = write_at(&s, &pods, &nodes, None, "t0");
        assert_eq!(st.oom_kills.len(), 1, "{:?}", st.oom_kills);
        let k = &st.oom_kills[0];
        assert_eq!((k.pod.as_str(), k.container.as_str()), ("pod-a", "app"));
        assert!(k.predicted);
        assert_eq!(k.warned_seconds_before, Some(40.0));
        assert_eq!(k.eta_error_at_first_alert_seconds, Some(5.0));
        assert_eq!(k.lower_bound_held, Some(true));
        assert_eq!(st.summary.oom_kills.as_deref(), Some("1 (1 predicted)"));
        let kills: Vec<&EventSpec> = ev.iter().filter(|e| e.reason == "OOMKilled").collect();
        assert_eq!(kills.len(), 1, "{ev:?}");
        assert!(kills[0].warning);
        assert!(
            kills[0].note.contains("predicted 40 s ahead"),
            "{}",
            kills[0].note
        );
        assert_eq!(kills[0].about, Some(Subject::container("pod-a", "app")));
        let (again, ev) = write_at(&s, &pods, &nodes, Some(&st), "t1");
        assert_eq!(again.oom_kills, st.oom_kills);
        assert!(
            ev.iter().all(|e| e.reason != "OOMKilled"),
            "announced again: {ev:?}"
        );
    }

    /// A pod that an OOM kill ended (restartPolicy Never: Failed) is no longer tracked,
    /// and its node may run no other pod of the watch: its kill is still the watch's.
    #[test]
    fn the_kill_that_ended_a_pod_is_kept() {
        let s = settings(serde_json::json!({}));
        let mut done = pod("j", "n2");
        done.exited_containers = std::mem::take(&mut done.containers);
        let mut n2 = node("n2", vec![], vec![]);
        n2.last_report = Some(std::sync::Arc::new(pb::Report {
            oom_kills: vec![pb::OomKill {
                pod_uid: "j".into(),
                container_id: "cid-j".into(),
                pid: 3,
                timestamp_unix_ms: 1_800_000_000_000,
                ..Default::default()
            }],
            ..Default::default()
        }));
        let Outcome::Write { status, events, .. } = compute(&Inputs {
            generation: Some(1),
            settings: &s,
            pods: &[],
            finished: &[done],
            kill_nodes: &[n2],
            nodes: &[],
            old: None,
            now: "t0",
        }) else {
            panic!("held")
        };
        assert_eq!(status.matched_pods, 0, "a finished pod is not matched");
        assert_eq!(status.oom_kills.len(), 1, "{:?}", status.oom_kills);
        assert_eq!(status.oom_kills[0].pod, "pod-j");
        assert_eq!(status.oom_kills[0].container, "app");
        assert!(!status.oom_kills[0].predicted);
        assert!(events.iter().any(|e| e.reason == "OOMKilled"));
    }

    #[test]
    fn a_leak_is_listed_once_it_has_grown_the_minimum_time() {
        let s = settings(serde_json::json!({"leakDetection": {"minGrowingTime": "2m"}}));
        assert_eq!(s.as_ref().unwrap().min_growing, Duration::from_secs(120));
        let pods = [pod("a", "n1")];
        let leak = |growing_seconds| pb::Leak {
            pod_uid: "a".into(),
            container_id: "cid-a".into(),
            confidence: 95,
            growing_seconds,
            ..Default::default()
        };
        let young = [node("n1", vec![], vec![leak(45.0)])];
        let (st, ev) = write_at(&s, &pods, &young, None, "t0");
        assert!(st.leaks.is_empty() && ev.iter().all(|e| e.reason != "LeakDetected"));
        let held = [node("n1", vec![], vec![leak(120.0)])];
        let (st, ev) = write_at(&s, &pods, &held, Some(&st), "t1");
        assert_eq!(st.leaks.len(), 1);
        assert!(ev.iter().any(|e| e.reason == "LeakDetected"));
        let bad = settings(serde_json::json!({"leakDetection": {"minGrowingTime": "soon"}}));
        assert!(bad.unwrap_err().to_string().contains("minGrowingTime"));
    }

    #[test]
    fn a_growth_site_found_later_is_written_bounded_and_announced_once() {
        let s = settings(serde_json::json!({}));
        let pods = [pod("a", "n1")];
        let leak = |sites: Vec<pb::GrowthSite>| pb::Leak {
            pod_uid: "a".into(),
            container_id: "cid-a".into(),
            pid: 12,
            growth_bytes_per_second: 6.4e6,
            confidence: 100,
            growth_sites: sites,
            ..Default::default()
        };
        // First named while the capture is young: glibc's unwalkable start-up growth on
        // top, no function to name. Written in status, not announced.
        let libc_only = pb::GrowthSite {
            frames: vec!["[libc.so.6]".into()],
            bytes: 1 << 20,
            percent: 52.6,
        };
        let first = [node("n1", vec![], vec![leak(vec![libc_only])])];
        let (st0, ev0) = write_at(&s, &pods, &first, None, "t0");
        assert_eq!(st0.leaks[0].growth_sites.len(), 1);
        let detected: Vec<&str> = ev0
            .iter()
            .filter(|e| e.reason == "LeakDetected")
            .map(|e| e.note.as_str())
            .collect();
        assert_eq!(detected.len(), 1);
        assert!(!detected[0].contains("libc"), "{detected:?}");
        assert!(ev0.iter().all(|e| e.reason != "LeakSiteFound"));
        // An agent sending more than the status holds, an empty name and a huge one.
        let site = |top: &str, pct| pb::GrowthSite {
            frames: vec![
                "__memset_avx2".into(),
                top.into(),
                "keep".into(),
                "grow".into(),
                "main".into(),
                "".into(),
                "x".repeat(1000),
                "a".into(),
                "b".into(),
                "c".into(),
            ],
            bytes: 30 << 20,
            percent: pct,
        };
        let later = [node(
            "n1",
            vec![],
            vec![leak(vec![
                site("leak_here", 91.2),
                site("other", 5.0),
                site("more", 2.0),
                site("most", f64::NAN),
            ])],
        )];
        let (st1, ev1) = write_at(&s, &pods, &later, Some(&st0), "t1");
        let sites = &st1.leaks[0].growth_sites;
        assert_eq!(sites.len(), MAX_GROWTH_SITES as usize);
        assert_eq!(sites[0].frames.len(), MAX_SITE_FRAMES as usize);
        assert_eq!(sites[0].frames[1], "leak_here");
        assert!(
            sites[0]
                .frames
                .iter()
                .all(|f| !f.is_empty() && f.chars().count() <= MAX_FRAME_LENGTH as usize)
        );
        let notes: Vec<&str> = ev1
            .iter()
            .filter(|e| e.reason == "LeakSiteFound")
            .map(|e| e.note.as_str())
            .collect();
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].starts_with(
                "pod-a/app grows at __memset_avx2 < leak_here < keep < grow < main < xxx"
            ) && notes[0].ends_with("x < ... (91% of its growth)"),
            "{notes:?}"
        );
        let (_, ev2) = write_at(&s, &pods, &later, Some(&st1), "t2");
        assert!(ev2.is_empty(), "announced once: {ev2:?}");
    }

    #[test]
    fn a_lost_agent_degrades_the_watch_once_and_recovers() {
        let s = settings(serde_json::json!({}));
        let pods = [pod("a", "n1")];
        let leak = pb::Leak {
            pod_uid: "a".into(),
            container_id: "cid-a".into(),
            confidence: 90,
            growth_bytes_per_second: 1e6,
            ..Default::default()
        };
        let ok = [node(
            "n1",
            vec![container(
                "a",
                5.0,
                1 << 20,
                0,
                vec![process(7, "app", 5.0, 1 << 20)],
            )],
            vec![leak],
        )];
        let (st1, _) = write_at(&s, &pods, &ok, None, "t0");
        let lost = [NodeView {
            name: "n1".into(),
            missing: true,
            ..Default::default()
        }];
        let (st2, ev2) = write_at(&s, &pods, &lost, Some(&st1), "t1");
        let d = find(&st2.conditions, ConditionType::Degraded).unwrap();
        assert_eq!(
            (d.status, d.reason.as_str()),
            (ConditionStatus::True, "AgentsMissing")
        );
        assert_eq!(d.last_transition_time, "t1");
        assert_eq!(
            ev2.iter().map(|e| e.reason).collect::<Vec<_>>(),
            ["AgentLost"]
        );
        let (st3, ev3) = write_at(&s, &pods, &lost, Some(&st2), "t2");
        assert!(ev3.is_empty());
        assert_eq!(
            find(&st3.conditions, ConditionType::Degraded)
                .unwrap()
                .last_transition_time,
            "t1"
        );
        let (_, ev4) = write_at(&s, &pods, &ok, Some(&st3), "t3");
        assert_eq!(
            ev4.iter().map(|e| e.reason).collect::<Vec<_>>(),
            ["AgentRecovered"]
        );
    }

    #[test]
    fn reconnecting_agents_hold_the_stored_status() {
        let s = settings(serde_json::json!({}));
        let pods = [pod("a", "n1")];
        let ok = [node("n1", vec![], vec![])];
        let (st, _) = write_at(&s, &pods, &ok, None, "t0");
        let pending = [NodeView {
            name: "n1".into(),
            ..Default::default()
        }];
        assert!(matches!(
            compute(&Inputs {
                generation: Some(1),
                settings: &s,
                pods: &pods,
                finished: &[],
                kill_nodes: &[],
                nodes: &pending,
                old: Some(&st),
                now: "t1"
            }),
            Outcome::Hold
        ));
        // A new generation is written at once, but announces nothing yet.
        let (st2, ev) = write(compute(&Inputs {
            generation: Some(2),
            settings: &s,
            pods: &pods,
            finished: &[],
            kill_nodes: &[],
            nodes: &pending,
            old: Some(&st),
            now: "t1",
        }));
        assert_eq!(
            find(&st2.conditions, ConditionType::Ready).unwrap().reason,
            "WaitingForAgents"
        );
        assert!(ev.is_empty());
    }

    #[test]
    fn an_invalid_spec_is_a_condition_and_one_event() {
        let s = settings(serde_json::json!({"interval": "1s"}));
        let (st, ev) = write(compute(&Inputs {
            generation: Some(3),
            settings: &s,
            pods: &[],
            finished: &[],
            kill_nodes: &[],
            nodes: &[],
            old: None,
            now: "t0",
        }));
        let r = find(&st.conditions, ConditionType::Ready).unwrap();
        assert_eq!(
            (r.status, r.reason.as_str()),
            (ConditionStatus::False, "InvalidSpec")
        );
        assert!(r.message.contains("5s minimum"));
        assert_eq!(st.observed_generation, Some(3));
        assert_eq!(ev.len(), 1);
        let (_, again) = write(compute(&Inputs {
            generation: Some(3),
            settings: &s,
            pods: &[],
            finished: &[],
            kill_nodes: &[],
            nodes: &[],
            old: Some(&st),
            now: "t1",
        }));
        assert!(again.is_empty());
    }

    #[test]
    fn thresholds_fire_once_per_crossing() {
        let s = settings(
            serde_json::json!({"thresholds": {"cpuPercent": 50, "memoryPercentOfLimit": 90}}),
        );
        let pods = [pod("a", "n1")];
        let hot = [node(
            "n1",
            vec![container("a", 80.0, 95 << 20, 100 << 20, vec![])],
            vec![],
        )];
        let (st, ev) = write_at(&s, &pods, &hot, None, "t0");
        assert_eq!(
            ev.iter().filter(|e| e.reason == "ThresholdCrossed").count(),
            2
        );
        assert_eq!(st.exceeding.len(), 2);
        let (_, again) = write_at(&s, &pods, &hot, Some(&st), "t1");
        assert!(again.is_empty());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod size_tests {
    use super::*;
    use resourcewatch_crds::{RemediationOutcome, RemediationRecord, ResourceWatchSpec};

    /// The largest status the operator can write: K = 100, 1,000 nodes each with a long
    /// NACK reason, 2,000 selected pods with the longest names, every pod leaking and
    /// above both thresholds, 50 remediation records with the longest messages.
    #[test]
    fn the_largest_status_stays_far_below_the_etcd_limit() {
        let spec: ResourceWatchSpec = serde_json::from_value(serde_json::json!({
            "topK": 100, "thresholds": {"cpuPercent": 1, "memoryPercentOfLimit": 1}
        }))
        .unwrap();
        let s = WatchSettings::from_spec(&spec, &crate::spec::Floors::default());
        let long = |prefix: &str, i: usize, n: usize| {
            let mut x = format!("{prefix}{i}-");
            x.push_str(&"x".repeat(n - x.len()));
            x
        };
        let nodes: Vec<NodeView> = (0..1000)
            .map(|i| NodeView {
                name: long("node", i, 253),
                connected: true,
                reporting: true,
                acked_version: Some(u64::MAX),
                nack: Some((u64::MAX, "r".repeat(10_000))),
                last_report: Some(std::sync::Arc::new(pb::Report::default())),
                ..Default::default()
            })
            .collect();
        let mut pods = Vec::new();
        let mut nodes = nodes;
        for i in 0..2000 {
            let uid = format!("{i:036}");
            let cid = format!("{i:064}");
            let n = &mut nodes[i % 1000];
            pods.push(SelectedPod {
                uid: uid.clone(),
                name: long("pod", i, 253),
                node: Some(n.name.clone()),
                containers: [(cid.clone(), long("c", i, 63))].into(),
                exited_containers: Default::default(),
            });
            let r = std::sync::Arc::make_mut(n.last_report.as_mut().unwrap());
            r.containers.push(pb::ContainerReport {
                pod_uid: uid.clone(),
                container_id: cid.clone(),
                memory_bytes: 100,
                memory_limit_bytes: 100,
                cpu_percent: 1e9,
                processes: (0..200)
                    .map(|p| process(p, &"p".repeat(256), 1e9, u64::MAX))
                    .collect(),
            });
            r.leaks.push(pb::Leak {
                pod_uid: uid,
                container_id: cid,
                confidence: 100,
                growth_bytes_per_second: 1e300,
                limit_bytes: u64::MAX,
                time_to_oom_seconds: Some(1.0),
                ..Default::default()
            });
        }
        let old = ResourceWatchStatus {
            remediations: (0..resourcewatch_crds::MAX_STATUS_REMEDIATIONS)
                .map(|i| RemediationRecord {
                    pod: long("pod", i, 253),
                    pod_uid: format!("{i:036}"),
                    workload: Some(long("Deployment/", i, 253 + 11)),
                    action: RemediationOutcome::Blocked,
                    reason: resourcewatch_crds::RemediationReason::RestartInProgress,
                    message: "m".repeat(resourcewatch_crds::MAX_MESSAGE + 600),
                    time_to_oom_seconds: Some(1e300),
                    confidence: 100,
                    time: "2026-11-23T20:00:00Z".into(),
                })
                .collect(),
            ..Default::default()
        };
        let Outcome::Write { status, .. } = compute(&Inputs {
            generation: Some(i64::MAX),
            settings: &s,
            pods: &pods,
            finished: &[],
            kill_nodes: &[],
            nodes: &nodes,
            old: Some(&old),
            now: "2026-11-23T20:00:00Z",
        }) else {
            panic!("a write")
        };
        let bytes = serde_json::to_vec(&status).unwrap().len();
        assert_eq!(status.top_cpu.len(), 100);
        assert_eq!(status.leaks.len(), resourcewatch_crds::MAX_STATUS_LEAKS);
        assert_eq!(status.nodes.len(), resourcewatch_crds::MAX_STATUS_NODES);
        let t = status.truncated.clone().unwrap();
        assert_eq!((t.leaks, t.nodes), (1900, 900));
        assert_eq!(
            t.exceeding,
            4000 - resourcewatch_crds::MAX_STATUS_EXCEEDING as u32
        );
        assert!(
            status
                .conditions
                .iter()
                .all(|c| c.message.len() <= resourcewatch_crds::MAX_MESSAGE)
        );
        // Remediation messages are written by the operator at most MAX_MESSAGE long; the
        // old ones here are longer on purpose and the bound still holds.
        assert!(bytes < 1 << 20, "{bytes} bytes");
        eprintln!("largest status: {bytes} bytes");
    }
}
