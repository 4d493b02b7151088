//! A ClusterResourceWatch's status from its nodes' reports: the cluster's Top-K by CPU and
//! memory from what the agents' HashPipe sketches saw node-wide (every namespace's pods
//! and the hosts' own processes), and each node's heaviest process. Pure: the shell's
//! node view (`operator/shell/src/node_view.rs`) gathers the inputs and writes the result.

use std::{
    collections::{BTreeSet, HashMap},
    time::Duration,
};

use resourcewatch_crds::{
    ClusterResourceWatchSpec, ClusterResourceWatchStatus, ClusterSummary, ConditionReason,
    ConditionStatus, MAX_STATUS_NODES, NodeOomKill, NodeProcess, NodeTop, OomScope, ProcessFigure,
    ProcessOwner,
};
use resourcewatch_proto as pb;
use resourcewatch_units::format_bytes;

use crate::{
    model::ConditionType,
    nodes::NodeView,
    spec::{MIN_INTERVAL, SpecError, duration, pod_selector, validate_selector},
    status::{carry_transition_times, cond},
};

/// A ClusterResourceWatch's spec, checked.
#[derive(Clone, Debug)]
pub struct ViewSettings {
    pub nodes: resourcewatch_crds::PodSelector,
    pub top_k: u32,
    pub interval: Duration,
    pub include_host: bool,
}

impl ViewSettings {
    pub fn from_spec(spec: &ClusterResourceWatchSpec) -> Result<Self, SpecError> {
        let interval = duration("interval", &spec.interval)?;
        if interval < MIN_INTERVAL {
            return Err(SpecError::IntervalTooShort(spec.interval.clone()));
        }
        if !crate::spec::top_k_allowed(spec.top_k) {
            return Err(SpecError::TopK(spec.top_k));
        }
        validate_selector(&spec.node_selector).map_err(SpecError::Selector)?;
        Ok(Self {
            nodes: pod_selector(&spec.node_selector),
            top_k: spec.top_k,
            interval,
            include_host: spec.include_host_processes,
        })
    }
}

/// What the operator knows of a pod, to name the owner of a process the agent attributed
/// to a pod UID and a container id.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    /// container id (no scheme) -> container name
    pub containers: std::collections::BTreeMap<String, String>,
}

/// Pods by UID.
pub type PodIndex = HashMap<String, PodInfo>;

pub struct Inputs<'a> {
    pub generation: Option<i64>,
    pub settings: &'a Result<ViewSettings, SpecError>,
    /// What the selector matched (empty when the spec is invalid).
    pub selected: &'a BTreeSet<String>,
    pub nodes: &'a [NodeView],
    pub pods: &'a PodIndex,
    pub old: Option<&'a ClusterResourceWatchStatus>,
    /// RFC 3339, seconds.
    pub now: &'a str,
}

/// The status of a ClusterResourceWatch from the agents' last reports: the cluster's
/// Top-K by CPU and memory (processes of reporting nodes only: a lost node's last figures
/// are not current), and each node's heaviest process.
pub fn compute(i: &Inputs<'_>) -> ClusterResourceWatchStatus {
    let mut status = ClusterResourceWatchStatus {
        observed_generation: i.generation,
        selected_nodes: i.selected.len() as u32,
        last_update_time: Some(i.now.to_owned()),
        ..Default::default()
    };
    let s = match i.settings {
        Ok(s) => s,
        Err(e) => {
            status.conditions = vec![cond(
                ConditionType::Ready,
                ConditionStatus::False,
                ConditionReason::InvalidSpec,
                e.to_string(),
            )];
            carry_transition_times(
                &mut status.conditions,
                i.old.map_or(&[][..], |o| &o.conditions[..]),
                i.now,
            );
            return status;
        }
    };
    let (rows, all_cpu, all_memory) = node_rows(i, s);
    status.reporting_nodes = i.nodes.iter().filter(|n| n.reporting).count() as u32;
    let k = s.top_k as usize;
    status.top_cpu = top(all_cpu, k);
    status.top_memory = top(all_memory, k);
    let mut rows = order_nodes(rows);
    if rows.len() > MAX_STATUS_NODES {
        status.truncated_nodes = Some((rows.len() - MAX_STATUS_NODES) as u32);
        rows.truncate(MAX_STATUS_NODES);
    }
    status.nodes = rows;
    status.oom_kills = node_kills(i, s);
    let host = |list: &[NodeProcess]| list.iter().find(|p| p.owner == ProcessOwner::Host).cloned();
    status.summary = ClusterSummary {
        top_cpu: status.top_cpu.first().map(|p| describe(p, true)),
        top_memory: status.top_memory.first().map(|p| describe(p, false)),
        top_host_cpu: host(&status.top_cpu).map(|p| describe(&p, true)),
        top_host_memory: host(&status.top_memory).map(|p| describe(&p, false)),
        oom_kills: (!status.oom_kills.is_empty()).then(|| {
            let system = status
                .oom_kills
                .iter()
                .filter(|k| k.scope == OomScope::System)
                .count();
            format!("{} ({system} System)", status.oom_kills.len())
        }),
    };
    let reporting = status.reporting_nodes;
    status.conditions = vec![cond(
        ConditionType::Ready,
        ConditionStatus::True,
        ConditionReason::Configured,
        format!(
            "{} node(s) selected, {reporting} reporting",
            status.selected_nodes
        ),
    )];
    carry_transition_times(
        &mut status.conditions,
        i.old.map_or(&[][..], |o| &o.conditions[..]),
        i.now,
    );
    status
}

/// Each node's heaviest processes, and every process of the reporting nodes' reports
/// the view shows (by CPU, by memory).
fn node_rows(
    i: &Inputs<'_>,
    s: &ViewSettings,
) -> (Vec<NodeTop>, Vec<NodeProcess>, Vec<NodeProcess>) {
    let attributed = |node: &str, list: &[pb::Process], cpu: bool| -> Vec<NodeProcess> {
        list.iter()
            .filter_map(|p| {
                let e = attribute(node, p, cpu, i.pods);
                (e.process.value > 0.0 && (s.include_host || e.owner == ProcessOwner::Pod))
                    .then_some(e)
            })
            .collect()
    };
    let mut all_cpu = Vec::new();
    let mut all_memory = Vec::new();
    let mut rows = Vec::new();
    for n in i.nodes {
        let (cpu, memory) = match &n.last_report {
            Some(r) if n.reporting => (
                attributed(&n.name, &r.node_top_cpu, true),
                attributed(&n.name, &r.node_top_memory, false),
            ),
            _ => (Vec::new(), Vec::new()),
        };
        rows.push(NodeTop {
            name: n.name.clone(),
            reporting: n.reporting,
            top_cpu: heaviest(&cpu).cloned(),
            top_memory: heaviest(&memory).cloned(),
        });
        all_cpu.extend(cpu);
        all_memory.extend(memory);
    }
    (rows, all_cpu, all_memory)
}

/// A process of a node's report, named: the pod and container the operator knows for its
/// pod UID and container id, or the host when the agent found no pod cgroup.
fn attribute(node: &str, p: &pb::Process, cpu: bool, pods: &PodIndex) -> NodeProcess {
    let pod = (!p.pod_uid.is_empty())
        .then(|| pods.get(&p.pod_uid))
        .flatten();
    NodeProcess {
        process: ProcessFigure {
            node: node.to_owned(),
            pid: p.pid,
            command: p.command.clone(),
            value: if cpu {
                (p.cpu_percent * 10.0).round() / 10.0
            } else {
                p.rss_bytes as f64
            },
        },
        owner: if p.pod_uid.is_empty() {
            ProcessOwner::Host
        } else {
            ProcessOwner::Pod
        },
        namespace: pod.map(|x| x.namespace.clone()).unwrap_or_default(),
        pod: pod.map(|x| x.name.clone()).unwrap_or_default(),
        container: pod
            .and_then(|x| x.containers.get(&p.container_id).cloned())
            .unwrap_or_default(),
    }
}

/// Kills the view keeps: what it stored, and what the selected nodes' agents report
/// (each kill once, by node, pid and time; an agent repeats one for ten minutes), the host's
/// only with `includeHostProcesses`, the newest `MAX_NODE_KILLS`.
fn node_kills(i: &Inputs<'_>, s: &ViewSettings) -> Vec<NodeOomKill> {
    const MAX_NODE_KILLS: usize = 20;
    let key = |k: &NodeOomKill| (k.time.clone(), k.process.node.clone(), k.process.pid);
    let mut all: std::collections::BTreeMap<_, NodeOomKill> = i
        .old
        .iter()
        .flat_map(|o| o.oom_kills.iter())
        .filter(|k| i.selected.contains(&k.process.node))
        .map(|k| (key(k), k.clone()))
        .collect();
    for n in i.nodes {
        for k in n.last_report.iter().flat_map(|r| r.oom_kills.iter()) {
            let as_process = pb::Process {
                pid: k.pid,
                command: k.command.clone(),
                rss_bytes: k.memory_bytes,
                pod_uid: k.pod_uid.clone(),
                container_id: k.container_id.clone(),
                ..Default::default()
            };
            let p = attribute(&n.name, &as_process, false, i.pods);
            if !s.include_host && p.owner == ProcessOwner::Host {
                continue;
            }
            let kill = NodeOomKill {
                process: p.process,
                time: crate::oom::rfc3339_ms(k.timestamp_unix_ms),
                owner: p.owner,
                namespace: p.namespace,
                pod: p.pod,
                container: p.container,
                scope: if k.system_wide {
                    OomScope::System
                } else {
                    OomScope::Cgroup
                },
                limit_bytes: (k.limit_bytes > 0).then_some(k.limit_bytes),
                predicted: !k.predictions.is_empty(),
            };
            all.entry(key(&kill)).or_insert(kill);
        }
    }
    let mut kills: Vec<NodeOomKill> = all.into_values().collect();
    if kills.len() > MAX_NODE_KILLS {
        kills.drain(..kills.len() - MAX_NODE_KILLS);
    }
    kills
}

/// Heaviest nodes first by CPU *or* memory: each node ranks by its better place in the two
/// orders (the heaviest CPU node, then the heaviest memory node, then each list's second),
/// silent nodes last, by name within. Under the 100-row cap the kept rows hold at least
/// the 50 heaviest nodes of each: by CPU alone a node whose only heavy process is an idle
/// cache was cut first.
fn order_nodes(rows: Vec<NodeTop>) -> Vec<NodeTop> {
    fn ranks(rows: &[NodeTop], value: impl Fn(&NodeTop) -> Option<f64>) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..rows.len()).collect();
        idx.sort_by(|&a, &b| {
            let v = |i: usize| value(&rows[i]).unwrap_or(-1.0);
            v(b).total_cmp(&v(a))
                .then_with(|| rows[a].name.cmp(&rows[b].name))
        });
        let mut rank = vec![usize::MAX; rows.len()];
        for (r, i) in idx.into_iter().enumerate() {
            if value(&rows[i]).is_some() {
                rank[i] = r;
            }
        }
        rank
    }
    let cpu = ranks(&rows, |r| r.top_cpu.as_ref().map(|p| p.process.value));
    let memory = ranks(&rows, |r| r.top_memory.as_ref().map(|p| p.process.value));
    let mut keyed: Vec<((usize, usize), NodeTop)> = rows
        .into_iter()
        .enumerate()
        .map(|(i, r)| ((cpu[i].min(memory[i]), cpu[i]), r))
        .collect();
    keyed.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.name.cmp(&b.1.name)));
    keyed.into_iter().map(|(_, r)| r).collect()
}

fn heaviest(list: &[NodeProcess]) -> Option<&NodeProcess> {
    list.iter()
        .max_by(|a, b| a.process.value.total_cmp(&b.process.value))
}

fn top(mut list: Vec<NodeProcess>, k: usize) -> Vec<NodeProcess> {
    list.sort_by(|a, b| {
        b.process
            .value
            .total_cmp(&a.process.value)
            .then_with(|| (&a.process.node, a.process.pid).cmp(&(&b.process.node, b.process.pid)))
    });
    list.truncate(k);
    list
}

/// "node-1 shop/api-1 java (97%)", "node-2 host containerd (151Mi)".
fn describe(p: &NodeProcess, cpu: bool) -> String {
    let owner = match p.owner {
        ProcessOwner::Host => "host".to_owned(),
        ProcessOwner::Pod if p.pod.is_empty() => "pod".to_owned(),
        ProcessOwner::Pod => format!("{}/{}", p.namespace, p.pod),
    };
    let value = if cpu {
        format!("{}%", p.process.value.round())
    } else {
        format_bytes(p.process.value as u64)
    };
    let command = if p.process.command.is_empty() {
        format!("pid {}", p.process.pid)
    } else {
        p.process.command.clone()
    };
    format!("{} {owner} {command} ({value})", p.process.node)
}

/// Equal apart from the update time: no need to write.
pub fn same_content(a: &ClusterResourceWatchStatus, b: &ClusterResourceWatchStatus) -> bool {
    let strip = |s: &ClusterResourceWatchStatus| ClusterResourceWatchStatus {
        last_update_time: None,
        ..s.clone()
    };
    strip(a) == strip(b)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> ClusterResourceWatchSpec {
        serde_json::from_value(json).unwrap()
    }

    type Row<'a> = (&'a str, u32, &'a str, f64, u64, &'a str, &'a str);

    fn process(pid: u32, comm: &str, cpu: f64, rss: u64, pod_uid: &str, cid: &str) -> pb::Process {
        pb::Process {
            pid,
            command: comm.into(),
            cpu_percent: cpu,
            rss_bytes: rss,
            pod_uid: pod_uid.into(),
            container_id: cid.into(),
        }
    }

    fn node(
        name: &str,
        reporting: bool,
        cpu: Vec<pb::Process>,
        memory: Vec<pb::Process>,
    ) -> NodeView {
        NodeView {
            name: name.into(),
            connected: reporting,
            reporting,
            last_report: reporting.then(|| {
                std::sync::Arc::new(pb::Report {
                    node_top_cpu: cpu,
                    node_top_memory: memory,
                    ..Default::default()
                })
            }),
            ..Default::default()
        }
    }

    fn pods() -> PodIndex {
        let mut index = PodIndex::new();
        index.insert(
            "uid-api".into(),
            PodInfo {
                namespace: "shop".into(),
                name: "api-1".into(),
                containers: [("cid-app".to_owned(), "app".to_owned())].into(),
            },
        );
        index
    }

    fn run(s: &Result<ViewSettings, SpecError>, nodes: &[NodeView]) -> ClusterResourceWatchStatus {
        let selected: BTreeSet<String> = nodes.iter().map(|n| n.name.clone()).collect();
        compute(&Inputs {
            generation: Some(3),
            settings: s,
            selected: &selected,
            nodes,
            pods: &pods(),
            old: None,
            now: "2026-11-24T12:00:00Z",
        })
    }

    /// Every kill on the selected nodes is listed (the host's with includeHostProcesses),
    /// named through the pod index, each once whatever the agents repeat.
    #[test]
    fn the_view_lists_the_nodes_oom_kills_once_named() {
        let kill = |pid: u32, uid: &str, cid: &str, system_wide: bool| pb::OomKill {
            pod_uid: uid.into(),
            container_id: cid.into(),
            pid,
            command: "victim".into(),
            timestamp_unix_ms: 1_800_000_000_000 + i64::from(pid),
            system_wide,
            memory_bytes: 64 << 20,
            ..Default::default()
        };
        let mut n1 = node("n1", true, vec![], vec![]);
        n1.last_report = Some(std::sync::Arc::new(pb::Report {
            oom_kills: vec![kill(1, "uid-api", "cid-app", false), kill(2, "", "", true)],
            ..Default::default()
        }));
        let nodes = [n1];
        let pods_only = ViewSettings::from_spec(&spec(
            serde_json::json!({"topK": 3, "includeHostProcesses": false}),
        ));
        let st = run(&pods_only, &nodes);
        assert_eq!(st.oom_kills.len(), 1, "{:?}", st.oom_kills);
        let k = &st.oom_kills[0];
        assert_eq!(
            (
                k.namespace.as_str(),
                k.pod.as_str(),
                k.container.as_str(),
                k.scope
            ),
            ("shop", "api-1", "app", OomScope::Cgroup)
        );
        assert_eq!(k.process.value, f64::from(64u32 << 20));
        let with_host = ViewSettings::from_spec(&spec(
            serde_json::json!({"topK": 3, "includeHostProcesses": true}),
        ));
        let st = run(&with_host, &nodes);
        assert_eq!(st.oom_kills.len(), 2);
        assert_eq!(st.oom_kills[1].owner, ProcessOwner::Host);
        assert_eq!(st.summary.oom_kills.as_deref(), Some("2 (1 System)"));
        // Reported again, with the stored status: still once.
        let selected: BTreeSet<String> = ["n1".to_owned()].into();
        let again = compute(&Inputs {
            generation: Some(3),
            settings: &with_host,
            selected: &selected,
            nodes: &nodes,
            pods: &pods(),
            old: Some(&st),
            now: "2026-11-24T12:00:10Z",
        });
        assert_eq!(again.oom_kills, st.oom_kills);
    }

    #[test]
    fn the_cluster_top_k_merges_nodes_and_names_pods_and_the_host() {
        let s = ViewSettings::from_spec(&spec(serde_json::json!({"topK": 3})));
        // One table per list: (node, pid, command, CPU %, resident bytes, pod, container).
        let cpu = [
            ("n1", 10, "java", 97.26, 0, "uid-api", "cid-app"),
            ("n1", 11, "kubelet", 12.0, 0, "", ""),
            ("n2", 20, "containerd", 40.0, 0, "", ""),
            ("n2", 21, "ghost", 30.0, 0, "uid-gone", "cid-x"),
            ("n2", 22, "idle", 0.0, 0, "", ""),
        ];
        let memory = [
            ("n1", 10, "java", 0.0, 300 << 20, "uid-api", "cid-app"),
            ("n2", 20, "containerd", 0.0, 500 << 20, "", ""),
        ];
        let rows = |table: &[Row], name: &str| -> Vec<pb::Process> {
            table
                .iter()
                .filter(|r| r.0 == name)
                .map(|&(_, pid, comm, cpu, rss, uid, cid)| process(pid, comm, cpu, rss, uid, cid))
                .collect()
        };
        let nodes = [
            node("n1", true, rows(&cpu, "n1"), rows(&memory, "n1")),
            node("n2", true, rows(&cpu, "n2"), rows(&memory, "n2")),
            node("n3", false, vec![], vec![]),
        ];
        let st = run(&s, &nodes);
        assert_eq!((st.selected_nodes, st.reporting_nodes), (3, 2));
        let cpu: Vec<(&str, u32, f64)> = st
            .top_cpu
            .iter()
            .map(|p| (p.process.node.as_str(), p.process.pid, p.process.value))
            .collect();
        assert_eq!(
            cpu,
            [("n1", 10, 97.3), ("n2", 20, 40.0), ("n2", 21, 30.0)],
            "K = 3"
        );
        let java = &st.top_cpu[0];
        assert_eq!(
            (
                java.owner,
                java.namespace.as_str(),
                java.pod.as_str(),
                java.container.as_str()
            ),
            (ProcessOwner::Pod, "shop", "api-1", "app")
        );
        let ghost = &st.top_cpu[2];
        assert_eq!(
            (ghost.owner, ghost.pod.as_str()),
            (ProcessOwner::Pod, ""),
            "a pod the operator does not know"
        );
        assert_eq!(st.top_cpu[1].owner, ProcessOwner::Host);
        assert_eq!(st.top_memory[0].process.command, "containerd");
        assert_eq!(
            st.summary.top_cpu.as_deref(),
            Some("n1 shop/api-1 java (97%)")
        );
        assert_eq!(
            st.summary.top_memory.as_deref(),
            Some("n2 host containerd (500Mi)")
        );
        assert_eq!(
            st.summary.top_host_cpu.as_deref(),
            Some("n2 host containerd (40%)")
        );
        // Per node: heaviest first, the silent node last with nothing.
        let rows: Vec<(&str, bool, Option<u32>)> = st
            .nodes
            .iter()
            .map(|n| {
                (
                    n.name.as_str(),
                    n.reporting,
                    n.top_cpu.as_ref().map(|p| p.process.pid),
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                ("n1", true, Some(10)),
                ("n2", true, Some(20)),
                ("n3", false, None)
            ]
        );
        let ready = &st.conditions[0];
        assert_eq!(
            (ready.status, ready.reason.as_str()),
            (ConditionStatus::True, "Configured")
        );
    }

    #[test]
    fn host_processes_can_be_left_out() {
        let s = ViewSettings::from_spec(&spec(serde_json::json!({"includeHostProcesses": false})));
        let nodes = [node(
            "n1",
            true,
            vec![
                process(11, "kubelet", 50.0, 0, "", ""),
                process(10, "java", 5.0, 0, "uid-api", "cid-app"),
            ],
            vec![],
        )];
        let st = run(&s, &nodes);
        assert_eq!(st.top_cpu.len(), 1);
        assert_eq!(st.top_cpu[0].process.command, "java");
        assert!(st.summary.top_host_cpu.is_none());
    }

    #[test]
    fn an_invalid_spec_is_ready_false_and_lists_nothing() {
        for bad in [
            serde_json::json!({"interval": "1s"}),
            serde_json::json!({"topK": 0}),
            serde_json::json!({"nodeSelector": {"matchExpressions": [{"key": "zone", "operator": "In"}]}}),
        ] {
            let s = ViewSettings::from_spec(&spec(bad.clone()));
            assert!(s.is_err(), "{bad}");
            let st = compute(&Inputs {
                generation: Some(1),
                settings: &s,
                selected: &BTreeSet::new(),
                nodes: &[],
                pods: &pods(),
                old: None,
                now: "2026-11-24T12:00:00Z",
            });
            let ready = &st.conditions[0];
            assert_eq!(
                (ready.status, ready.reason.as_str()),
                (ConditionStatus::False, "InvalidSpec"),
                "{bad}"
            );
            assert!(st.top_cpu.is_empty() && st.nodes.is_empty());
        }
    }

    #[test]
    fn node_rows_are_capped_and_counted() {
        let s = ViewSettings::from_spec(&spec(serde_json::json!({})));
        let nodes: Vec<NodeView> = (0..MAX_STATUS_NODES + 7)
            .map(|i| {
                node(
                    &format!("n{i:04}"),
                    true,
                    vec![process(1, "x", 1.0 + i as f64, 0, "", "")],
                    vec![],
                )
            })
            .collect();
        let st = run(&s, &nodes);
        assert_eq!(st.nodes.len(), MAX_STATUS_NODES);
        assert_eq!(st.truncated_nodes, Some(7));
        assert_eq!(
            st.nodes[0].name,
            format!("n{:04}", MAX_STATUS_NODES + 6),
            "heaviest kept"
        );
        assert_eq!(st.top_cpu.len(), 10, "the default K");
    }

    #[test]
    fn a_node_heavy_only_in_memory_is_not_cut_by_the_cap() {
        let s = ViewSettings::from_spec(&spec(serde_json::json!({})));
        let mut nodes: Vec<NodeView> = (0..2 * MAX_STATUS_NODES)
            .map(|i| {
                node(
                    &format!("n{i:04}"),
                    true,
                    vec![process(1, "busy", 10.0 + i as f64, 0, "", "")],
                    vec![process(1, "busy", 0.0, (1 + i as u64) << 20, "", "")],
                )
            })
            .collect();
        // An idle node holding the most memory: last by CPU.
        nodes.push(node(
            "cache",
            true,
            vec![process(2, "redis", 0.5, 0, "", "")],
            vec![process(2, "redis", 0.0, 64 << 30, "", "")],
        ));
        nodes.push(node("silent", false, vec![], vec![]));
        let st = run(&s, &nodes);
        assert_eq!(st.nodes.len(), MAX_STATUS_NODES);
        let names: Vec<&str> = st.nodes.iter().map(|n| n.name.as_str()).collect();
        // The heaviest CPU node, then the heaviest memory node.
        assert_eq!(
            names[..2],
            [
                format!("n{:04}", 2 * MAX_STATUS_NODES - 1).as_str(),
                "cache"
            ]
        );
        assert!(!names.contains(&"silent"));
        assert_eq!(st.truncated_nodes, Some(MAX_STATUS_NODES as u32 + 2));
    }

    #[test]
    fn node_selectors_pick_nodes_by_label() {
        let s = ViewSettings::from_spec(&spec(serde_json::json!({
            "nodeSelector": {"matchLabels": {"pool": "batch"}}
        })))
        .unwrap();
        let labels = |v: &str| [("pool".to_owned(), v.to_owned())].into();
        assert!(s.nodes.matches(&labels("batch")));
        assert!(!s.nodes.matches(&labels("web")));
        let all = ViewSettings::from_spec(&spec(serde_json::json!({}))).unwrap();
        assert!(
            all.nodes.matches(&Default::default()),
            "empty selects every node"
        );
    }
}
