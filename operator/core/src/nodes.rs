//! What the operator asks of each node's agent and what it knows of each node: the data
//! the hub (the shell's agent endpoint) holds and the core's status and profile logic
//! read, and [`desired`], how every watch and node scope on a node merge into its agent's
//! configuration.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use resourcewatch_proto as pb;

/// A ResourceWatch, by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WatchKey {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for WatchKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A selected pod that is scheduled to a node.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TargetPod {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub node: String,
    /// (container name, runtime id without scheme; empty until started)
    pub containers: Vec<(String, String)>,
}

/// What one watch asks of the nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct WatchTargets {
    pub top_k: u32,
    pub interval: Duration,
    pub leaks_enabled: bool,
    pub min_confidence: u8,
    pub horizon: Duration,
    /// It may act on a leak (`action: Restart`, dry run included): a confident leak in a
    /// report reconciles it at once. A watch that only reports waits for its interval (its
    /// status is written at most once per interval anyway); triggering those on every
    /// report was 200 reconciles/s for nothing at 1,000 nodes.
    pub remediates: bool,
    /// By node, then UID, once [`WatchTargets::sort_pods`] ran (the hub keeps every
    /// watch's so): the order [`WatchTargets::pods_on`] searches and `==` compares in.
    pub pods: Vec<TargetPod>,
    /// A CPU profile a user asked for (crate::profile), while it is Pending.
    pub profile: Option<ProfileOrder>,
}

impl WatchTargets {
    /// Puts the pods in node order (then UID). The pod cache lists in no fixed order, and
    /// a node's configuration is made from the pods of every watch on it: scanning each
    /// watch's every pod for that node was a string compare per pod of a 2,000-pod watch,
    /// for each node recomputed, at each change.
    pub fn sort_pods(&mut self) {
        fn key(p: &TargetPod) -> (&str, &str) {
            (&p.node, &p.uid)
        }
        if !self.pods.is_sorted_by(|a, b| key(a) <= key(b)) {
            self.pods.sort_unstable_by(|a, b| key(a).cmp(&key(b)));
        }
    }

    /// The pods on `node` (the pods sorted, [`WatchTargets::sort_pods`]).
    pub fn pods_on(&self, node: &str) -> &[TargetPod] {
        let from = self.pods.partition_point(|p| p.node.as_str() < node);
        let len = self.pods[from..].partition_point(|p| p.node == node);
        &self.pods[from..from + len]
    }

    /// Puts one pod's target in place of the pod `uid`'s (`None`: removes it), keeping
    /// the node order; what changed (nothing when the target is the same). A pod event
    /// moves one pod of a 2,000-pod watch without rebuilding its targets.
    pub fn put_pod(&mut self, uid: &str, pod: Option<TargetPod>) -> PodChange {
        let mut change = PodChange::default();
        let old = self.pods.iter().position(|p| p.uid == uid);
        if let (Some(i), Some(new)) = (old, &pod)
            && self.pods[i] == *new
        {
            return change;
        }
        if let Some(i) = old {
            let old = self.pods.remove(i);
            change.touched.insert(old.node.clone());
            change.old = Some(old);
        }
        if let Some(new) = pod {
            let key = (new.node.as_str(), new.uid.as_str());
            let at = self
                .pods
                .partition_point(|p| (p.node.as_str(), p.uid.as_str()) < key);
            change.touched.insert(new.node.clone());
            self.pods.insert(at, new);
        }
        change
    }

    /// Whether the watch has a pod or its profile order on `node`.
    pub fn is_on(&self, node: &str) -> bool {
        !self.pods_on(node).is_empty() || self.profile.as_ref().is_some_and(|o| o.node == node)
    }

    /// The pods grouped by node, in node order (the pods sorted).
    pub fn by_node(&self) -> impl Iterator<Item = (&str, &[TargetPod])> {
        self.pods
            .chunk_by(|a, b| a.node == b.node)
            .map(|c| (c[0].node.as_str(), c))
    }
}

/// What [`WatchTargets::put_pod`] changed.
#[derive(Debug, Default, PartialEq)]
pub struct PodChange {
    /// The nodes whose pods changed (none: the target was the same).
    pub touched: BTreeSet<String>,
    /// The pod's target before (`None`: the watch did not target it).
    pub old: Option<TargetPod>,
}

/// A CPU profile the node `node` must run once.
#[derive(Clone, Debug, PartialEq)]
pub struct ProfileOrder {
    pub id: String,
    pub pod_uid: String,
    pub node: String,
    pub container_ids: Vec<String>,
    /// The pod's namespace and name and its containers' names by id: the labels of the
    /// profile's samples.
    pub namespace: String,
    pub pod: String,
    pub container_names: BTreeMap<String, String>,
    pub duration: Duration,
    pub frequency_hz: u32,
}

/// What a ClusterResourceWatch asks of its nodes: the node-wide Top-K of at least `top_k`
/// processes every `interval`. No targets: the sketches see every process anyway.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeScope {
    pub nodes: BTreeSet<String>,
    pub top_k: u32,
    pub interval: Duration,
}

/// What the rest of the operator sees of a node.
#[derive(Clone, Debug, Default)]
pub struct NodeView {
    pub name: String,
    pub connected: bool,
    /// Connected, and the last report is younger than three report intervals.
    pub reporting: bool,
    /// Not reporting, and the grace after start or after the stream ended has passed.
    pub missing: bool,
    pub config_version: Option<u64>,
    pub acked_version: Option<u64>,
    pub nack: Option<(u64, String)>,
    pub capabilities: Option<pb::Capabilities>,
    /// Shared with the hub, not copied: a watch over 1,000 nodes views 1,000 reports at
    /// each reconcile.
    pub last_report: Option<Arc<pb::Report>>,
}

/// The configuration `node` must run, from every watch with a pod there and every node
/// scope that selects it: the union of its targeted pods, the largest K, the shortest
/// cadence, the most sensitive leak settings, the profiles ordered there. `idle`: what a
/// node nothing targets runs. `None`: nothing targets it. Each watch's pods sorted
/// ([`WatchTargets::sort_pods`]).
pub fn desired<'a>(
    node: &str,
    watches: impl Iterator<Item = &'a WatchTargets> + Clone,
    scopes: impl Iterator<Item = &'a NodeScope>,
    idle: &pb::NodeConfig,
) -> Option<pb::NodeConfig> {
    let mut out: Option<pb::NodeConfig> = None;
    let mut pods: BTreeMap<&str, pb::TargetPod> = BTreeMap::new();
    for w in watches.clone() {
        for p in w.pods_on(node) {
            let c = widen(&mut out, w.top_k, w.interval, idle);
            let leak = c.leak.get_or_insert_with(Default::default);
            if w.leaks_enabled {
                leak.min_confidence = if leak.enabled {
                    leak.min_confidence.min(w.min_confidence as u32)
                } else {
                    w.min_confidence as u32
                };
                leak.horizon_secs = leak.horizon_secs.max(w.horizon.as_secs());
                leak.enabled = true;
            }
            // A pod several watches target is copied once.
            pods.entry(&p.uid).or_insert_with(|| target_pod(p));
        }
    }
    // A node scope: a larger K and a shorter cadence on the nodes it selects.
    for scope in scopes.filter(|s| s.nodes.contains(node)) {
        widen(&mut out, scope.top_k, scope.interval, idle);
    }
    let c = out.as_mut()?;
    for o in watches.filter_map(|w| w.profile.as_ref()) {
        // A profile of a pod that left the node fails at its deadline.
        if o.node == node && c.profiles.len() < pb::MAX_PROFILES_PER_NODE {
            c.profiles.push(pb::ProfileRequest {
                id: o.id.clone(),
                pod_uid: o.pod_uid.clone(),
                container_ids: o.container_ids.clone(),
                duration_ms: o.duration.as_millis() as u32,
                frequency_hz: o.frequency_hz,
                namespace: o.namespace.clone(),
                pod: o.pod.clone(),
                container_names: o.container_names.clone().into_iter().collect(),
            });
        }
    }
    c.targets = pods.into_values().collect();
    out
}

/// A targeted pod as its node's agent is sent it.
pub fn target_pod(p: &TargetPod) -> pb::TargetPod {
    pb::TargetPod {
        uid: p.uid.clone(),
        namespace: p.namespace.clone(),
        name: p.name.clone(),
        containers: p
            .containers
            .iter()
            .map(|(name, id)| pb::TargetContainer {
                name: name.clone(),
                container_id: id.clone(),
            })
            .collect(),
    }
}

/// The node's configuration so far, made from the idle one when this is the first watch
/// or scope there, with at least `top_k` and at most `interval`'s cadence.
fn widen<'a>(
    out: &'a mut Option<pb::NodeConfig>,
    top_k: u32,
    interval: Duration,
    idle: &pb::NodeConfig,
) -> &'a mut pb::NodeConfig {
    let c = out.get_or_insert_with(|| pb::NodeConfig {
        top_k,
        report_interval_ms: report_interval_ms(interval),
        ..idle.clone()
    });
    c.top_k = c.top_k.max(top_k);
    c.report_interval_ms = c.report_interval_ms.min(report_interval_ms(interval));
    c
}

/// Agents report twice per status interval, so a status write never shows data older
/// than half an interval plus the write itself.
pub fn report_interval_ms(status_interval: Duration) -> u64 {
    (status_interval.as_millis() as u64 / 2).max(2_000)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    fn pod(uid: &str, node: &str, cid: &str) -> TargetPod {
        TargetPod {
            uid: uid.into(),
            namespace: "ns".into(),
            name: format!("pod-{uid}"),
            node: node.into(),
            containers: vec![("app".into(), cid.into())],
        }
    }

    #[test]
    fn a_pod_put_in_place_keeps_the_node_order_and_names_the_nodes_it_touched() {
        let mut w = WatchTargets {
            top_k: 5,
            interval: Duration::from_secs(10),
            leaks_enabled: true,
            min_confidence: 60,
            horizon: Duration::from_secs(3600),
            remediates: false,
            pods: vec![pod("b", "n2", ""), pod("a", "n1", ""), pod("c", "n2", "")],
            profile: None,
        };
        w.sort_pods();
        let nodes =
            |names: &[&str]| -> BTreeSet<String> { names.iter().map(|n| n.to_string()).collect() };
        assert_eq!(
            w.put_pod("b", Some(pod("b", "n2", ""))),
            PodChange::default(),
            "unchanged"
        );
        let moved = w.put_pod("b", Some(pod("b", "n2", "c1")));
        assert_eq!(moved.touched, nodes(&["n2"]));
        assert_eq!(moved.old, Some(pod("b", "n2", "")));
        assert_eq!(
            w.put_pod("a", Some(pod("a", "n3", ""))).touched,
            nodes(&["n1", "n3"])
        );
        let new = w.put_pod("d", Some(pod("d", "n0", "")));
        assert_eq!((new.touched, new.old), (nodes(&["n0"]), None));
        assert_eq!(w.put_pod("c", None).touched, nodes(&["n2"]));
        assert_eq!(
            w.put_pod("zz", None),
            PodChange::default(),
            "a pod it never had"
        );
        let order: Vec<(&str, &str, &str)> = w
            .pods
            .iter()
            .map(|p| (p.node.as_str(), p.uid.as_str(), p.containers[0].1.as_str()))
            .collect();
        assert_eq!(order, [("n0", "d", ""), ("n2", "b", "c1"), ("n3", "a", "")]);
        assert!(w.is_on("n2") && !w.is_on("n1"));
    }
}
