//! What an agent sends is checked before it touches the hub: a report speaks only for
//! the containers its node was asked to track, holds no NaN or infinity, no duplicate,
//! nothing beyond the caps below, and no free text longer than [`MAX_TEXT`]. What is cut
//! is counted by reason (the `resourcewatch_operator_report_entries_dropped_total`
//! metric), never silently trusted.
//!
//! Together with the gRPC message limit ([`resourcewatch_proto::MAX_MESSAGE_BYTES`]) this
//! bounds what one node can cost the operator, whatever it sends.

use std::collections::{BTreeMap, BTreeSet};

use resourcewatch_proto as pb;

/// Containers in one report: a node runs at most a few hundred pods.
pub const MAX_CONTAINERS: usize = 1_000;
/// Processes per container (K by CPU plus K by memory, K at most 100).
pub const MAX_PROCESSES: usize = 200;
/// Entries of each node-wide Top-K list.
pub const MAX_NODE_TOP: usize = 100;
pub const MAX_LEAKS: usize = 1_000;
pub const MAX_UNRESOLVED: usize = 100;
/// Free text from an agent (commands, reasons, capability notes), in characters.
pub const MAX_TEXT: usize = 256;
/// Identifiers (pod UIDs, container ids).
pub const MAX_ID: usize = 128;

/// Why an entry was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Drop {
    /// A pod or container this node was not asked to track (another node's, or made up).
    NotOnNode,
    Duplicate,
    NonFinite,
    OutOfRange,
    OverCap,
}

impl Drop {
    pub fn metric_label(self) -> &'static str {
        match self {
            Drop::NotOnNode => "not_on_node",
            Drop::Duplicate => "duplicate",
            Drop::NonFinite => "non_finite",
            Drop::OutOfRange => "out_of_range",
            Drop::OverCap => "over_cap",
        }
    }
}

pub type Dropped = BTreeMap<Drop, u64>;

/// The containers a node was configured to track, by pod UID.
#[derive(Clone, Debug, Default)]
pub struct NodeTargets {
    pods: BTreeMap<String, BTreeSet<String>>,
}

impl NodeTargets {
    pub fn new(config: &pb::NodeConfig) -> Self {
        Self {
            pods: config
                .targets
                .iter()
                .map(|t| {
                    (
                        t.uid.clone(),
                        t.containers
                            .iter()
                            .map(|c| c.container_id.clone())
                            .filter(|c| !c.is_empty())
                            .collect(),
                    )
                })
                .collect(),
        }
    }

    fn has(&self, pod_uid: &str, container_id: &str) -> bool {
        self.pods
            .get(pod_uid)
            .is_some_and(|cs| cs.contains(container_id))
    }
}

pub fn truncate(s: &mut String, max: usize) {
    if let Some((i, _)) = s.char_indices().nth(max) {
        s.truncate(i);
    }
}

fn finite_nonneg(v: f64) -> bool {
    v.is_finite() && v >= 0.0
}

fn count(d: &mut Dropped, why: Drop, n: usize) {
    if n > 0 {
        *d.entry(why).or_default() += n as u64;
    }
}

/// Keeps the entries of `v` that `keep` accepts, recording why the others went.
fn retain_counted<T>(
    v: &mut Vec<T>,
    d: &mut Dropped,
    mut keep: impl FnMut(&mut T) -> Result<(), Drop>,
) {
    let mut out = Vec::with_capacity(v.len());
    for mut x in v.drain(..) {
        match keep(&mut x) {
            Ok(()) => out.push(x),
            Err(why) => count(d, why, 1),
        }
    }
    *v = out;
}

fn cap<T>(v: &mut Vec<T>, max: usize, d: &mut Dropped) {
    if v.len() > max {
        count(d, Drop::OverCap, v.len() - max);
        v.truncate(max);
    }
}

fn process(p: &mut pb::Process) -> Result<(), Drop> {
    if !finite_nonneg(p.cpu_percent) {
        return Err(Drop::NonFinite);
    }
    truncate(&mut p.command, MAX_TEXT);
    truncate(&mut p.pod_uid, MAX_ID);
    truncate(&mut p.container_id, MAX_ID);
    Ok(())
}

/// Cleans a report in place; returns what was dropped.
pub fn report(r: &mut pb::Report, targets: &NodeTargets) -> Dropped {
    let mut d = Dropped::new();
    cap(&mut r.containers, MAX_CONTAINERS, &mut d);
    let mut seen = BTreeSet::new();
    retain_counted(&mut r.containers, &mut d, |c| {
        if !targets.has(&c.pod_uid, &c.container_id) {
            return Err(Drop::NotOnNode);
        }
        if !seen.insert((c.pod_uid.clone(), c.container_id.clone())) {
            return Err(Drop::Duplicate);
        }
        if !finite_nonneg(c.cpu_percent) {
            return Err(Drop::NonFinite);
        }
        Ok(())
    });
    for c in &mut r.containers {
        cap(&mut c.processes, MAX_PROCESSES, &mut d);
        let mut pids = BTreeSet::new();
        retain_counted(&mut c.processes, &mut d, |p| {
            if !pids.insert(p.pid) {
                return Err(Drop::Duplicate);
            }
            process(p)
        });
    }
    for list in [&mut r.node_top_cpu, &mut r.node_top_memory] {
        cap(list, MAX_NODE_TOP, &mut d);
        let mut pids = BTreeSet::new();
        retain_counted(list, &mut d, |p| {
            if !pids.insert(p.pid) {
                return Err(Drop::Duplicate);
            }
            process(p)
        });
    }
    cap(&mut r.leaks, MAX_LEAKS, &mut d);
    let mut seen = BTreeSet::new();
    retain_counted(&mut r.leaks, &mut d, |l| {
        if !targets.has(&l.pod_uid, &l.container_id) {
            return Err(Drop::NotOnNode);
        }
        if !seen.insert((l.pod_uid.clone(), l.container_id.clone(), l.pid)) {
            return Err(Drop::Duplicate);
        }
        if !l.growth_bytes_per_second.is_finite()
            || !l.r2.is_finite()
            || l.time_to_oom_seconds.is_some_and(|t| !finite_nonneg(t))
            || l.time_to_oom_low_seconds.is_some_and(|t| !finite_nonneg(t))
            || !finite_nonneg(l.growing_seconds)
        {
            return Err(Drop::NonFinite);
        }
        if l.confidence > 100 || !(-1.0..=1.0).contains(&l.r2) {
            return Err(Drop::OutOfRange);
        }
        truncate(&mut l.command, MAX_TEXT);
        Ok(())
    });
    // Kills are node-wide (the node view lists every one; a kill's container is usually
    // gone from the targets already, restarted under a new id): a watch keeps only those
    // of its pods that run on the reporting node (oom::merge).
    cap(&mut r.oom_kills, pb::MAX_OOM_KILLS_PER_REPORT, &mut d);
    let mut seen = BTreeSet::new();
    retain_counted(&mut r.oom_kills, &mut d, |k| {
        if !seen.insert((k.pid, k.timestamp_unix_ms)) {
            return Err(Drop::Duplicate);
        }
        if k.timestamp_unix_ms <= 0 {
            return Err(Drop::OutOfRange);
        }
        // Verdicts past the cap are cut.
        k.predictions.truncate(pb::MAX_PREDICTIONS_PER_KILL);
        let bad = |t: Option<f64>| t.is_some_and(|t| !finite_nonneg(t));
        k.predictions.retain(|p| {
            p.confidence <= 100 && !bad(p.time_to_oom_seconds) && !bad(p.time_to_oom_low_seconds)
        });
        truncate(&mut k.command, MAX_TEXT);
        truncate(&mut k.container_id, MAX_ID);
        truncate(&mut k.limit_cgroup, MAX_TEXT);
        Ok(())
    });
    if let Some(h) = &mut r.health {
        cap(&mut h.unresolved_containers, MAX_UNRESOLVED, &mut d);
        for c in &mut h.unresolved_containers {
            truncate(c, MAX_ID);
        }
        if !finite_nonneg(h.agent_cpu_percent) {
            h.agent_cpu_percent = 0.0;
            count(&mut d, Drop::NonFinite, 1);
        }
    }
    d
}

/// Bounds what a Hello's capabilities may put into status and Events.
pub fn capabilities(c: &mut pb::Capabilities) {
    truncate(&mut c.kernel_release, 64);
    truncate(&mut c.cgroup_mode, 32);
    c.missing.truncate(16);
    for m in &mut c.missing {
        truncate(m, MAX_TEXT);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets() -> NodeTargets {
        NodeTargets::new(&pb::NodeConfig {
            targets: vec![pb::TargetPod {
                uid: "u1".into(),
                containers: vec![pb::TargetContainer {
                    name: "app".into(),
                    container_id: "c1".into(),
                }],
                ..Default::default()
            }],
            ..Default::default()
        })
    }

    fn container(uid: &str, cid: &str, cpu: f64) -> pb::ContainerReport {
        pb::ContainerReport {
            pod_uid: uid.into(),
            container_id: cid.into(),
            cpu_percent: cpu,
            ..Default::default()
        }
    }

    fn leak(uid: &str, cid: &str, confidence: u32, tto: Option<f64>) -> pb::Leak {
        pb::Leak {
            pod_uid: uid.into(),
            container_id: cid.into(),
            confidence,
            time_to_oom_seconds: tto,
            ..Default::default()
        }
    }

    #[test]
    fn only_the_nodes_own_finite_unique_entries_survive() {
        let mut r = pb::Report {
            containers: vec![
                container("u1", "c1", 50.0),
                container("u1", "c1", 60.0),
                container("u2", "c2", 10.0),
                container("u1", "other", 10.0),
            ],
            leaks: vec![
                leak("u1", "c1", 90, Some(30.0)),
                leak("u2", "c2", 100, Some(5.0)),
                leak("u1", "c1", 90, Some(f64::NAN)),
                leak("u1", "c1", 250, None),
            ],
            ..Default::default()
        };
        r.leaks[3].pid = 7;
        r.leaks[2].pid = 8;
        let d = report(&mut r, &targets());
        assert_eq!(r.containers.len(), 1);
        assert_eq!(r.containers[0].cpu_percent, 50.0, "the first of duplicates");
        assert_eq!(r.leaks.len(), 1, "{:?}", r.leaks);
        assert_eq!(r.leaks[0].time_to_oom_seconds, Some(30.0));
        assert_eq!(d.get(&Drop::NotOnNode), Some(&3));
        assert_eq!(d.get(&Drop::Duplicate), Some(&1));
        assert_eq!(d.get(&Drop::NonFinite), Some(&1));
        assert_eq!(d.get(&Drop::OutOfRange), Some(&1));
    }

    /// A kill is kept once (any pod's: the node view lists all; a watch checks the pod's
    /// node), with bounded, finite verdicts.
    #[test]
    fn oom_kills_are_the_nodes_own_once_with_finite_verdicts() {
        let verdict = |tto: f64| pb::Prediction {
            timestamp_unix_ms: 1,
            confidence: 90,
            time_to_oom_seconds: Some(tto),
            time_to_oom_low_seconds: None,
        };
        let kill = |uid: &str, pid: u32| pb::OomKill {
            pod_uid: uid.into(),
            container_id: "cid-gone".into(),
            pid,
            timestamp_unix_ms: 1_800_000_000_000,
            command: "x".repeat(10_000),
            predictions: std::iter::once(verdict(30.0))
                .chain(std::iter::repeat_n(verdict(f64::NAN), 200))
                .collect(),
            ..Default::default()
        };
        let mut r = pb::Report {
            oom_kills: vec![kill("u1", 7), kill("u1", 7), kill("elsewhere", 8)],
            ..Default::default()
        };
        let d = report(&mut r, &targets());
        assert_eq!(r.oom_kills.len(), 2, "{:?}", r.oom_kills);
        assert_eq!(d.get(&Drop::Duplicate), Some(&1));
        let k = &r.oom_kills[0];
        assert!(k.predictions.len() <= pb::MAX_PREDICTIONS_PER_KILL);
        assert!(
            k.predictions
                .iter()
                .all(|p| p.time_to_oom_seconds.is_some_and(f64::is_finite))
        );
        assert_eq!(k.command.chars().count(), MAX_TEXT);
    }

    #[test]
    fn lists_are_capped_and_text_is_cut() {
        let mut r = pb::Report {
            node_top_cpu: (0..100_000)
                .map(|i| pb::Process {
                    pid: i,
                    command: "x".repeat(10_000),
                    cpu_percent: f64::from(i),
                    ..Default::default()
                })
                .collect(),
            containers: vec![pb::ContainerReport {
                processes: (0..5_000)
                    .map(|i| pb::Process {
                        pid: i,
                        cpu_percent: if i == 3 { f64::INFINITY } else { 1.0 },
                        ..Default::default()
                    })
                    .collect(),
                ..container("u1", "c1", 1.0)
            }],
            ..Default::default()
        };
        let d = report(&mut r, &targets());
        assert_eq!(r.node_top_cpu.len(), MAX_NODE_TOP);
        assert!(r.node_top_cpu.iter().all(|p| p.command.len() == MAX_TEXT));
        assert_eq!(r.containers[0].processes.len(), MAX_PROCESSES - 1);
        assert_eq!(
            d.get(&Drop::OverCap),
            Some(&((100_000 - MAX_NODE_TOP + 5_000 - MAX_PROCESSES) as u64))
        );
        let mut s = "é".repeat(300);
        truncate(&mut s, 10);
        assert_eq!(s.chars().count(), 10, "cut on characters, not bytes");
    }
}
