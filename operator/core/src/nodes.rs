//! What the operator asks of each node's agent and what it knows of each node: the data
//! the hub (the shell's agent endpoint) holds and the core's status and profile logic read.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

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
    pub pods: Vec<TargetPod>,
    /// A CPU profile a user asked for (crate::profile), while it is Pending.
    pub profile: Option<ProfileOrder>,
}

/// A CPU profile the node `node` must run once.
#[derive(Clone, Debug, PartialEq)]
pub struct ProfileOrder {
    pub id: String,
    pub pod_uid: String,
    pub node: String,
    pub container_ids: Vec<String>,
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
