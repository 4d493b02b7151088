//! Tests of the status: fixtures in, status and Events out.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use super::*;
use resourcewatch_crds::{RemediationOutcome, RemediationRecord, ResourceWatchSpec};
use std::time::Duration;

fn settings(json: serde_json::Value) -> Result<WatchSettings, SpecError> {
    let spec: ResourceWatchSpec = serde_json::from_value(json).expect("spec");
    WatchSettings::from_spec(&spec, &crate::spec::Floors::default())
}

fn pod(uid: &str, node: &str) -> std::sync::Arc<SelectedPod> {
    std::sync::Arc::new(SelectedPod {
        uid: uid.into(),
        name: format!("pod-{uid}"),
        node: Some(node.into()),
        containers: [(format!("cid-{uid}"), "app".to_string())].into(),
        exited_containers: Default::default(),
        created: None,
    })
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
    pods: &[std::sync::Arc<SelectedPod>],
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
    let leak_events: Vec<&EventSpec> = ev.iter().filter(|e| e.reason == "LeakDetected").collect();
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
    let d = std::sync::Arc::make_mut(&mut done);
    d.exited_containers = std::mem::take(&mut d.containers);
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
        notes[0]
            .starts_with("pod-a/app grows at __memset_avx2 < leak_here < keep < grow < main < xxx")
            && notes[0].ends_with("x < ... (91% of its growth)"),
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
    let s =
        settings(serde_json::json!({"thresholds": {"cpuPercent": 50, "memoryPercentOfLimit": 90}}));
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
        pods.push(std::sync::Arc::new(SelectedPod {
            uid: uid.clone(),
            name: long("pod", i, 253),
            node: Some(n.name.clone()),
            containers: [(cid.clone(), long("c", i, 63))].into(),
            exited_containers: Default::default(),
            created: None,
        }));
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

/// The part of a report a watch sees.
fn process(pid: u32, command: &str, cpu: f64, rss: u64) -> pb::Process {
    pb::Process {
        pid,
        command: command.into(),
        cpu_percent: cpu,
        rss_bytes: rss,
        ..Default::default()
    }
}

#[test]
fn statuses_differing_only_in_their_update_time_have_the_same_content() {
    let a = ResourceWatchStatus {
        matched_pods: 3,
        last_update_time: Some("2026-11-29T10:00:00Z".into()),
        ..Default::default()
    };
    let b = ResourceWatchStatus {
        last_update_time: Some("2026-11-29T10:00:30Z".into()),
        ..a.clone()
    };
    assert!(same_content(&a, &b));
    // Any other field tells them apart: a few of each kind.
    let changes: [fn(&mut ResourceWatchStatus); 5] = [
        |s| s.matched_pods += 1,
        |s| s.observed_generation = Some(2),
        |s| s.summary.leaking = 1,
        |s| s.reporting_nodes = 9,
        |s| s.summary.top_cpu = Some("app-1".into()),
    ];
    for change in changes {
        let mut c = b.clone();
        change(&mut c);
        assert!(!same_content(&a, &c), "{c:?}");
    }
}
