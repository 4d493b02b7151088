//! The `ClusterResourceWatch` API: the node-wide view. Every agent keeps HashPipe Top-K
//! sketches of all the processes of its node (the eHashPipe paper's point: the heaviest
//! processes at sketch cost, whoever runs them); a `ResourceWatch` only shows the pods it
//! selects in its own namespace. This kind shows the sketches' results for the nodes it
//! selects: every namespace's pods and the host's own processes (kubelet, the container
//! runtime, system services).
//!
//! Cluster-scoped on purpose: what it reveals (process names of every namespace and of
//! the host) is cluster-level information, so only a ClusterRole bound cluster-wide can
//! read it; a namespaced kind would let anyone with `view` in one namespace see the
//! others. README "The node view" gives the RBAC it ships with.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{Condition, DURATION_PATTERN, LabelSelector, MAX_STATUS_NODES, ProcessFigure};

/// The heaviest processes of the selected nodes, ranked across the cluster and per node,
/// attributed to their namespace, pod and container, or to the host.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "resourcewatch.io",
    version = "v1alpha1",
    kind = "ClusterResourceWatch",
    shortname = "crw",
    doc = "A ClusterResourceWatch selects nodes and keeps, in its status, the heaviest processes on them by CPU and memory from the agents' node-wide sketches: across the cluster and per node, each attributed to its namespace, pod and container, or to the host.",
    status = "ClusterResourceWatchStatus",
    printcolumn = r#"{"name":"Nodes","type":"integer","description":"Nodes selected","jsonPath":".status.selectedNodes"}"#,
    printcolumn = r#"{"name":"Reporting","type":"integer","description":"Selected nodes whose agent reported recently","jsonPath":".status.reportingNodes"}"#,
    printcolumn = r#"{"name":"Top CPU","type":"string","description":"Heaviest process by CPU: node, owner, command","jsonPath":".status.summary.topCPU"}"#,
    printcolumn = r#"{"name":"Top Memory","type":"string","description":"Heaviest process by memory: node, owner, command","jsonPath":".status.summary.topMemory"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","description":"Whether the spec is valid and the nodes are configured","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Host CPU","type":"string","priority":1,"description":"Heaviest process outside any pod by CPU","jsonPath":".status.summary.topHostCPU"}"#,
    printcolumn = r#"{"name":"Host Memory","type":"string","priority":1,"description":"Heaviest process outside any pod by memory","jsonPath":".status.summary.topHostMemory"}"#,
    printcolumn = r#"{"name":"OOM Kills","type":"string","priority":1,"description":"OOM kills on the selected nodes (how many for want of node memory)","jsonPath":".status.summary.oomKills"}"#,
    printcolumn = r#"{"name":"Updated","type":"string","priority":1,"description":"When the status was last written","jsonPath":".status.lastUpdateTime"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterResourceWatchSpec {
    /// Nodes to watch, by their labels; empty selects every node.
    #[serde(default)]
    pub node_selector: LabelSelector,
    /// How many processes the cluster-wide Top-K lists hold (1-100). Each selected node's
    /// agent reports at least this many of its own.
    #[serde(default = "default_top_k")]
    #[schemars(range(min = 1, max = 100))]
    pub top_k: u32,
    /// How often status is refreshed, e.g. "30s". At least 5s, to protect the API server.
    #[serde(default = "default_interval")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = 32))]
    pub interval: String,
    /// Whether processes outside any pod (kubelet, the container runtime, system services)
    /// are listed; they are marked `owner: Host`.
    #[serde(default = "yes")]
    pub include_host_processes: bool,
}

fn default_top_k() -> u32 {
    10
}

fn default_interval() -> String {
    "30s".into()
}

fn yes() -> bool {
    true
}

/// Written by the operator only.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterResourceWatchStatus {
    /// The `metadata.generation` this status was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`: the spec is valid and the selected nodes are configured.
    #[serde(default)]
    #[schemars(length(max = 8))]
    pub conditions: Vec<Condition>,
    /// Nodes the selector matches.
    #[serde(default)]
    pub selected_nodes: u32,
    /// Selected nodes whose agent is connected and reported within three intervals.
    #[serde(default)]
    pub reporting_nodes: u32,
    /// The heaviest processes by CPU on the selected nodes, heaviest first (percent of one
    /// core over the agent's last interval), at most `topK`.
    #[serde(default, rename = "topCPU")]
    #[schemars(length(max = 100))]
    pub top_cpu: Vec<NodeProcess>,
    /// The heaviest processes by resident memory (bytes), heaviest first, at most `topK`.
    #[serde(default)]
    #[schemars(length(max = 100))]
    pub top_memory: Vec<NodeProcess>,
    /// Each selected node's heaviest process by CPU and by memory, heaviest nodes first by
    /// CPU or memory (the heaviest by CPU, the heaviest by memory, each list's second...);
    /// at most 100 nodes (the rest are counted in `truncatedNodes`: select fewer
    /// nodes to see them).
    #[serde(default)]
    #[schemars(length(max = MAX_STATUS_NODES))]
    pub nodes: Vec<NodeTop>,
    /// Selected nodes left out of `nodes` by its cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated_nodes: Option<u32>,
    /// OOM kills on the selected nodes, every process (targeted by a watch or not, in a
    /// pod or the host's), the newest last (at most 20).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    pub oom_kills: Vec<NodeOomKill>,
    /// The heaviest processes in a few words, for `kubectl get`.
    #[serde(default)]
    pub summary: ClusterSummary,
    /// When this status was computed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<String>,
}

/// Who runs a process.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ProcessOwner {
    /// A container of a pod (named when the operator knows the pod).
    Pod,
    /// Outside any pod: the node's own services, kubelet, the container runtime.
    Host,
}

/// One process of a node-wide Top-K list. Empty strings are never written (Kubernetes
/// 1.20's server-side apply turns them into nulls, which the schema refuses).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeProcess {
    #[serde(flatten)]
    pub process: ProcessFigure,
    /// `Pod` or `Host`.
    pub owner: ProcessOwner,
    /// The pod's namespace (absent for the host, or a pod the operator does not know).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(with = "Option<String>")]
    pub namespace: String,
    /// The pod's name (absent for the host, or a pod the operator does not know).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(with = "Option<String>")]
    pub pod: String,
    /// The container's name (absent when it could not be named).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(with = "Option<String>")]
    pub container: String,
}

/// An OOM kill on a node, as its agent saw it in the kernel.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeOomKill {
    /// The node, the process and its command.
    #[serde(flatten)]
    pub process: ProcessFigure,
    /// When the kernel chose the victim, RFC 3339 with milliseconds.
    pub time: String,
    /// `Pod` or `Host`.
    pub owner: ProcessOwner,
    /// The pod's namespace (absent for the host, or a pod the operator does not know).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(with = "Option<String>")]
    pub namespace: String,
    /// The pod's name (absent for the host, or a pod the operator does not know).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(with = "Option<String>")]
    pub pod: String,
    /// The container's name (absent when it could not be named).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(with = "Option<String>")]
    pub container: String,
    /// `Cgroup`: a memory limit was reached; `System`: the node ran out of memory.
    pub scope: crate::OomScope,
    /// The limit that was reached (a cgroup's; for `System`, the node's RAM + swap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<u64>,
    /// Whether the agent listed a leak for it before the kill (at the node's minimum
    /// confidence; a watch's own grade of a kill is in its `status.oomKills`).
    pub predicted: bool,
}

/// One node's heaviest processes.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeTop {
    /// The node's name.
    pub name: String,
    /// The node's agent is connected and its last report is recent.
    pub reporting: bool,
    /// Its heaviest process by CPU, when it reported one.
    #[serde(default, rename = "topCPU", skip_serializing_if = "Option::is_none")]
    pub top_cpu: Option<NodeProcess>,
    /// Its heaviest process by resident memory, when it reported one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_memory: Option<NodeProcess>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSummary {
    /// The heaviest process by CPU, e.g. "node-1 shop/api-1 java (97%)".
    #[serde(default, rename = "topCPU", skip_serializing_if = "Option::is_none")]
    pub top_cpu: Option<String>,
    /// The heaviest process by memory, e.g. "node-2 host containerd (151Mi)".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_memory: Option<String>,
    /// The heaviest process outside any pod by CPU.
    #[serde(
        default,
        rename = "topHostCPU",
        skip_serializing_if = "Option::is_none"
    )]
    pub top_host_cpu: Option<String>,
    /// The heaviest process outside any pod by memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_host_memory: Option<String>,
    /// The kills in `oomKills`, e.g. "3 (1 System)"; absent without any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_kills: Option<String>,
}
