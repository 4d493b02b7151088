//! The `ResourceWatch` API (`resourcewatch.io/v1alpha1`): what users apply, and the status
//! the operator writes. The CRD YAML in this directory is generated from these types by
//! `cargo run -p resourcewatch-crds --bin crdgen` (`make generate`); a test fails if it
//! drifts.
//!
//! Validation lives in the schema wherever OpenAPI v3 as served by Kubernetes 1.20 can
//! express it (bounds, enums, patterns: no CEL there), so bad specs are refused by the API
//! server with a readable message. What it cannot express (the interval floor, a
//! selector's semantics) is for the operator to report as `Ready=False` with a reason.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub mod node_view;
pub mod policy;
pub use node_view::{
    ClusterResourceWatch, ClusterResourceWatchSpec, ClusterResourceWatchStatus, ClusterSummary,
    NodeOomKill, NodeProcess, NodeTop, ProcessOwner,
};
pub use policy::{RemediationPolicy, RemediationPolicySpec};

/// A Go-style duration such as `10s`, `1m30s`, `500ms`, `2h`.
pub const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$";

/// Bounds of the spec, so that a hostile or mistaken object is refused by the API server
/// (with the field named) before it reaches etcd or the operator. Label keys and values
/// as Kubernetes bounds them: a value of at most 63 characters, a key of a 253-character
/// prefix, a slash and a 63-character name.
pub const MAX_MATCH_LABELS: usize = 64;
pub const MAX_MATCH_EXPRESSIONS: usize = 32;
pub const MAX_SELECTOR_VALUES: usize = 64;
pub const MAX_LABEL_VALUE: usize = 63;
pub const MAX_LABEL_KEY: usize = 317;

/// Caps of the status, so that the largest status (K = 100, 1,000 nodes, every list full)
/// stays far below etcd's 1.5 MiB object limit; what a cap cut is counted in
/// `status.truncated`.
pub const MAX_STATUS_LEAKS: usize = 100;
pub const MAX_STATUS_EXCEEDING: usize = 100;
/// OOM kills kept in a watch's status: the newest.
pub const MAX_STATUS_OOM_KILLS: usize = 20;
pub const MAX_STATUS_NODES: usize = 100;
pub const MAX_STATUS_REMEDIATIONS: usize = 50;
/// Free text written into status (messages, reasons from agents) is cut to this many
/// characters.
pub const MAX_MESSAGE: usize = 1024;

/// The Namespace label a cluster admin sets to allow evictions there.
pub const NAMESPACE_OPT_IN_LABEL: &str = "resourcewatch.io/remediation";
/// Its value that allows evictions.
pub const NAMESPACE_OPT_IN_VALUE: &str = "enabled";

/// The annotation a user sets on a ResourceWatch to ask for a CPU profile of one of its
/// pods: `pod=NAME[,container=NAME][,duration=30s][,request=ANY]`. The operator takes each
/// new value once (it never edits the watch: GitOps tools would fight it) and
/// `status.profile` says what became of it; the rendered profile is in the ConfigMap
/// `status.profile.configMap`. To ask again, change the value (e.g. `request=2`). Whoever
/// may patch the watch may ask.
pub const PROFILE_ANNOTATION: &str = "resourcewatch.io/profile";

/// The most functions `status.profile.hottest` lists.
pub const MAX_HOT_FUNCTIONS: u32 = 5;

/// Watch the pods selected in this namespace: their Top-K processes by CPU and memory,
/// leaks with a predicted time to OOM, and optionally act before the kernel OOM-kills.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "resourcewatch.io",
    version = "v1alpha1",
    kind = "ResourceWatch",
    namespaced,
    shortname = "rw",
    doc = "A ResourceWatch selects pods in its namespace and keeps, in its status, their Top-K processes by CPU and memory, the containers predicted to leak with their time to OOM, and what pre-OOM remediation decided.",
    status = "ResourceWatchStatus",
    printcolumn = r#"{"name":"Targets","type":"integer","description":"Pods selected","jsonPath":".status.matchedPods"}"#,
    printcolumn = r#"{"name":"Top CPU","type":"string","description":"Heaviest pod by CPU","jsonPath":".status.summary.topCPU"}"#,
    printcolumn = r#"{"name":"Top Memory","type":"string","description":"Heaviest pod by memory","jsonPath":".status.summary.topMemory"}"#,
    printcolumn = r#"{"name":"Leaking","type":"integer","description":"Containers with a leak (confidence at or above minConfidence)","jsonPath":".status.summary.leaking"}"#,
    printcolumn = r#"{"name":"OOM ETA","type":"string","description":"Soonest predicted OOM kill","jsonPath":".status.summary.soonestOOM"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","description":"Whether the selector and thresholds are valid and the watch is configured","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"OOM Pod","type":"string","priority":1,"description":"Pod and container of the soonest predicted OOM kill","jsonPath":".status.summary.soonestOOMPod"}"#,
    printcolumn = r#"{"name":"OOM Kills","type":"string","priority":1,"description":"OOM kills of the selected containers, and how many were predicted","jsonPath":".status.summary.oomKills"}"#,
    printcolumn = r#"{"name":"Nodes","type":"integer","priority":1,"description":"Nodes running selected pods","jsonPath":".status.expectedNodes"}"#,
    printcolumn = r#"{"name":"Reporting","type":"integer","priority":1,"description":"Nodes whose agent reported within the grace period","jsonPath":".status.reportingNodes"}"#,
    printcolumn = r#"{"name":"Degraded","type":"string","priority":1,"description":"Why the watch is degraded (e.g. AgentsMissing), AllAgentsReporting when not","jsonPath":".status.conditions[?(@.type==\"Degraded\")].reason"}"#,
    printcolumn = r#"{"name":"Remediation","type":"string","priority":1,"description":"For a Restart watch: whether it may evict now, and if not why","jsonPath":".status.conditions[?(@.type==\"Remediation\")].reason"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ResourceWatchSpec {
    /// Pods in this namespace to watch; empty selects every pod.
    #[serde(default)]
    pub selector: LabelSelector,
    /// How many processes each Top-K list holds (1-100).
    #[serde(default = "default_top_k")]
    #[schemars(range(min = 1, max = 100))]
    pub top_k: u32,
    /// What to rank by: `cpu`, `memory` or both.
    #[serde(default = "default_metrics")]
    #[schemars(length(min = 1, max = 2))]
    pub metrics: Vec<Metric>,
    /// How often status is refreshed, e.g. "30s". At least 5s, to protect the API server.
    #[serde(default = "default_interval")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = 32))]
    pub interval: String,
    /// `ThresholdCrossed` Events above these.
    #[serde(default)]
    pub thresholds: Thresholds,
    /// Leak prediction for the selected containers.
    #[serde(default)]
    pub leak_detection: LeakDetection,
    /// What to do about a container predicted to be OOM-killed soon.
    #[serde(default)]
    pub remediation: Remediation,
}

fn default_top_k() -> u32 {
    10
}

fn default_metrics() -> Vec<Metric> {
    vec![Metric::Cpu, Metric::Memory]
}

fn default_interval() -> String {
    "30s".into()
}

#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Metric {
    Cpu,
    Memory,
}

/// A label selector, as in `metav1.LabelSelector`, with the operator an enum so that an
/// unknown one is refused by the schema.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    /// Labels a pod must carry, all of them (at most 64).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = MAX_MATCH_LABELS, "additionalProperties" = {"type": "string", "maxLength": MAX_LABEL_VALUE}))]
    pub match_labels: std::collections::BTreeMap<String, String>,
    /// Requirements a pod's labels must meet, all of them (at most 32).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_MATCH_EXPRESSIONS))]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

impl LabelSelector {
    /// As kube's `Selector` (`metav1.LabelSelector` semantics: every `matchLabels` pair
    /// and every requirement must hold; an empty selector selects everything). The
    /// operator validates first what the API server would refuse (`In` without values,
    /// `Exists` with some); the kubectl plugin matches the watches it reads with it.
    pub fn to_selector(&self) -> kube::core::Selector {
        use kube::core::Expression;
        let equal = self
            .match_labels
            .iter()
            .map(|(k, v)| Expression::Equal(k.clone(), v.clone()));
        let required = self.match_expressions.iter().map(|r| {
            let values = r.values.iter().cloned().collect();
            match r.operator {
                SelectorOperator::In => Expression::In(r.key.clone(), values),
                SelectorOperator::NotIn => Expression::NotIn(r.key.clone(), values),
                SelectorOperator::Exists => Expression::Exists(r.key.clone()),
                SelectorOperator::DoesNotExist => Expression::DoesNotExist(r.key.clone()),
            }
        });
        equal.chain(required).collect()
    }

    /// Compiled once, matched against many pods' labels.
    pub fn compile(&self) -> PodSelector {
        PodSelector(self.to_selector())
    }
}

/// A [`LabelSelector`] ready to match labels with kube's `Selector` semantics. It lets the
/// operator's kube-free core select pods without naming kube.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodSelector(kube::core::Selector);

impl PodSelector {
    /// Whether labels are selected (an empty selector selects everything).
    pub fn matches(&self, labels: &std::collections::BTreeMap<String, String>) -> bool {
        use kube::core::SelectorExt;
        self.0.matches(labels)
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelectorRequirement {
    /// The label key, e.g. `app.kubernetes.io/name`.
    #[schemars(length(min = 1, max = MAX_LABEL_KEY))]
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: SelectorOperator,
    /// For `In` and `NotIn`: at least one (at most 64); none for `Exists`/`DoesNotExist`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_SELECTOR_VALUES), inner(length(max = MAX_LABEL_VALUE)))]
    pub values: Vec<String>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum SelectorOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

/// Emit a `ThresholdCrossed` Event when a targeted container goes above these.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Thresholds {
    /// CPU of one core, in percent (200 = two cores busy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 100000.0))]
    pub cpu_percent: Option<f64>,
    /// Memory as a percentage of the container's limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 100.0))]
    pub memory_percent_of_limit: Option<f64>,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeakDetection {
    /// Predict leaks of the selected containers (default true).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// A container is reported as leaking from this confidence (0-100) up.
    #[serde(default = "default_min_confidence")]
    #[schemars(range(min = 0, max = 100))]
    pub min_confidence: u8,
    /// Only time-to-OOM predictions within this horizon are reported, e.g. "2h".
    #[serde(default = "default_horizon")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = 32))]
    pub horizon: String,
    /// A container is reported as leaking only once its growth has held at leak level
    /// this long (e.g. "2m"): a start-up that fills caches and heaps looks like a leak
    /// until it levels off. "0s" (the default) reports at once; node-agent/LEAKS.md
    /// measures what each value costs in detection time.
    #[serde(default = "default_min_growing_time")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = 32))]
    pub min_growing_time: String,
}

fn default_min_growing_time() -> String {
    "0s".into()
}

fn yes() -> bool {
    true
}

fn default_min_confidence() -> u8 {
    60
}

fn default_horizon() -> String {
    "2h".into()
}

impl Default for LeakDetection {
    fn default() -> Self {
        Self {
            enabled: true,
            min_confidence: default_min_confidence(),
            horizon: default_horizon(),
            min_growing_time: default_min_growing_time(),
        }
    }
}

/// What to do about a container predicted to be OOM-killed soon.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Remediation {
    /// `None` (status only), `Alert` (also Events on the pod) or `Restart` (evict before the
    /// predicted OOM kill: needs the operator's `--enable-remediation`, a namespace a
    /// cluster admin opted in, and a RemediationPolicy of this namespace covering the
    /// watch and the pod).
    #[serde(default)]
    pub action: RemediationAction,
    /// Act when the predicted time to OOM drops below this, e.g. "5m".
    #[serde(default = "default_min_time_to_oom", rename = "minTimeToOOM")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = 32))]
    pub min_time_to_oom: String,
    /// After a restart, leave the workload alone this long, e.g. "30m" (at least the
    /// operator's floor).
    #[serde(default = "default_cooldown")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = 32))]
    pub cooldown: String,
    /// At most this many restarts of one workload per `window`.
    #[serde(default = "default_max_restarts")]
    #[schemars(range(min = 1, max = 100))]
    pub max_restarts: u32,
    /// The window `maxRestarts` counts over, e.g. "1h" (at least the operator's floor).
    #[serde(default = "default_window")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = 32))]
    pub window: String,
    /// Decide and report (`WouldRestart` Events), but touch nothing.
    #[serde(default)]
    pub dry_run: bool,
}

fn default_min_time_to_oom() -> String {
    "5m".into()
}

fn default_cooldown() -> String {
    "30m".into()
}

fn default_max_restarts() -> u32 {
    3
}

fn default_window() -> String {
    "1h".into()
}

impl Default for Remediation {
    fn default() -> Self {
        Self {
            action: RemediationAction::None,
            min_time_to_oom: default_min_time_to_oom(),
            cooldown: default_cooldown(),
            max_restarts: default_max_restarts(),
            window: default_window(),
            dry_run: false,
        }
    }
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RemediationAction {
    /// Report only, in status.
    #[default]
    None,
    /// Also publish `LeakDetected` Events.
    Alert,
    /// Evict the pod (through the Eviction API, honouring PodDisruptionBudgets) before its
    /// predicted OOM kill, within the safety rails above.
    Restart,
}

/// What the operator observed, written with server-side apply.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceWatchStatus {
    /// The `metadata.generation` this status was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `Degraded` and, for a `Restart` watch, `Remediation` (whether it may evict
    /// now, and if not why), each with a reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Pods the selector matches.
    #[serde(default)]
    pub matched_pods: u32,
    /// Nodes running selected pods.
    #[serde(default)]
    pub expected_nodes: u32,
    /// How many of those nodes' agents reported within the operator's `--agent-grace`.
    #[serde(default)]
    pub reporting_nodes: u32,
    /// The K processes of the selected pods with the most CPU, heaviest first.
    #[serde(default, rename = "topCPU", skip_serializing_if = "Vec::is_empty")]
    pub top_cpu: Vec<TopEntry>,
    /// The K processes of the selected pods with the most resident memory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top_memory: Vec<TopEntry>,
    /// Containers predicted to leak (confidence at least `minConfidence`), soonest OOM
    /// first (at most 100).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leaks: Vec<LeakEntry>,
    /// Containers above a threshold, kept so a `ThresholdCrossed` Event is published once
    /// per crossing, also across operator restarts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exceeding: Vec<ThresholdEntry>,
    /// Per node running selected pods: whether its agent reports and which configuration
    /// it runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeEntry>,
    /// Pre-OOM remediation: every decision to restart a pod (or not), newest last. An
    /// eviction is recorded here as `Pending` before it is attempted, so an operator
    /// killed in between finishes it on restart instead of losing or repeating it.
    /// A log of what was decided, for people: the operator never acts on it (the
    /// workload's own record, in the operator's namespace, holds the rails).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remediations: Vec<RemediationRecord>,
    /// The selected pods' containers the kernel OOM-killed (seen by their node's agent),
    /// the newest last (at most 20), each graded against what was predicted for it at
    /// this watch's `minConfidence`. Evictions by remediation are not kills: they are in
    /// `remediations`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub oom_kills: Vec<OomKillEntry>,
    /// What `kubectl get resourcewatch` shows.
    #[serde(default)]
    pub summary: Summary,
    /// How many entries each capped list left out (absent when nothing was cut).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<Truncated>,
    /// The last CPU profile asked for with the `resourcewatch.io/profile` annotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<ProfileStatus>,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<String>,
}

/// A CPU profile of one pod, asked for with the `resourcewatch.io/profile` annotation.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProfileStatus {
    /// Names this request in the agent protocol and Events.
    pub id: String,
    /// The annotation's value this status answers; a different value is a new request.
    #[schemars(length(max = 256))]
    pub request: String,
    /// The profiled pod.
    pub pod: String,
    /// The profiled container (absent: all of the pod's containers).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(with = "Option<String>")]
    pub container: String,
    /// The node the pod runs on (absent when the request was refused before one was known).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(with = "Option<String>")]
    pub node: String,
    /// `Pending`, `Succeeded`, `Failed`, `Refused` or `Expired`.
    pub state: ProfileState,
    /// Why it was refused or failed, or what it found, in words.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(with = "Option<String>")]
    pub message: String,
    /// How long the stacks are sampled (1-60 s).
    pub duration_seconds: u32,
    /// Samples per second on each CPU the pod runs on.
    pub frequency_hz: u32,
    /// When the operator took the request, RFC 3339.
    pub requested_at: String,
    /// When the result arrived, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// The ConfigMap in this namespace holding `profile.folded`, `profile.svg` (a flame
    /// graph) and `profile.pb.gz` (pprof). Deleted at `expiresAt`, or with the watch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<String>,
    /// When the ConfigMap is deleted, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// CPU samples taken.
    #[serde(default)]
    pub samples: u64,
    /// The functions most often on top of the user stack ("self" time), heaviest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_HOT_FUNCTIONS))]
    pub hottest: Vec<HotFunction>,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HotFunction {
    /// The function, as the agent named it ("[unknown]" or "[libfoo.so]" when it could not).
    #[schemars(length(max = MAX_FRAME_LENGTH))]
    pub function: String,
    /// Percent of the samples.
    pub percent: f64,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ProfileState {
    /// Taken and sent to the pod's node; the result is awaited.
    Pending,
    /// The profile is in `configMap`.
    Succeeded,
    /// The node could not profile, or no result came in time.
    Failed,
    /// Not run: a malformed request, a pod the watch does not select, or the namespace's
    /// rate limit.
    Refused,
    /// Succeeded, and its ConfigMap has been deleted at `expiresAt`.
    Expired,
}

/// Entries left out of the status by its caps.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Truncated {
    /// Leaking containers left out of `leaks`, which keeps the soonest OOMs.
    #[serde(default)]
    pub leaks: u32,
    /// Threshold crossings left out of `exceeding`.
    #[serde(default)]
    pub exceeding: u32,
    /// Nodes left out of `nodes`.
    #[serde(default)]
    pub nodes: u32,
}

/// A condition, as in `metav1.Condition`.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `Ready`, `Degraded` or `Remediation`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: ConditionStatus,
    /// Why, PascalCase.
    pub reason: ConditionReason,
    /// Details for people.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(with = "Option<String>")]
    pub message: String,
    /// When `status` last changed, RFC 3339.
    pub last_transition_time: String,
    /// The generation the condition was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

/// One process of a Top-K list, attributed to its pod and container.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopEntry {
    /// The pod's name.
    pub pod: String,
    /// Absent when the container could not be named. (Empty strings are never written:
    /// Kubernetes 1.20's server-side apply turns them into nulls, which the schema refuses.)
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(with = "Option<String>")]
    pub container: String,
    #[serde(flatten)]
    pub process: ProcessFigure,
}

/// A process on a node and its figure: the part every Top-K entry has, a watch's
/// (`TopEntry`) and the node view's (`NodeProcess`). Flattened into both, so the fields
/// stand beside the entry's own in the API.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProcessFigure {
    /// The node it runs on.
    pub node: String,
    /// The process id on the node (the host's PID namespace).
    pub pid: u32,
    /// The process's command name (`comm`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(with = "Option<String>")]
    pub command: String,
    /// CPU in percent of one core, or resident memory in bytes.
    pub value: f64,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeakEntry {
    /// The pod's name.
    pub pod: String,
    /// Absent when the container could not be named. (Empty strings are never written:
    /// Kubernetes 1.20's server-side apply turns them into nulls, which the schema refuses.)
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(with = "Option<String>")]
    pub container: String,
    /// The node whose agent reported it.
    pub node: String,
    /// Estimated growth of resident memory.
    pub growth_bytes_per_second: f64,
    /// 0-100; how the agent computes it is in node-agent/src/leak/README.md.
    pub confidence: u8,
    /// Predicted seconds until the container reaches its memory limit; absent when the
    /// trend does not support a number or it lies beyond `horizon`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "timeToOOMSeconds"
    )]
    pub time_to_oom_seconds: Option<f64>,
    /// The earliest the OOM kill is likely: the prediction at the growth rate's upper bound
    /// (or its last 10 s, if faster). Remediation acts on it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "timeToOOMLowerBoundSeconds"
    )]
    pub time_to_oom_lower_bound_seconds: Option<f64>,
    /// How long the growth has been held at leak level. A Restart acts only once a leak has
    /// grown at least as long as it has left before the OOM kill (a warm-up slows first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growing_for_seconds: Option<f64>,
    /// The memory limit the prediction is against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<u64>,
    /// Where the memory grows, heaviest first: the user stacks that added resident memory
    /// while the agent captured them (from confidence 60, for 60 s). Absent until the
    /// first seconds of capture are named.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_GROWTH_SITES))]
    pub growth_sites: Vec<GrowthSiteEntry>,
}

/// An OOM kill of a selected pod's container, and how well it was predicted.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OomKillEntry {
    /// The pod's name.
    pub pod: String,
    /// Absent when the container could not be named.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(with = "Option<String>")]
    pub container: String,
    /// The node whose agent saw the kill.
    pub node: String,
    /// When the kernel chose the victim, RFC 3339 with milliseconds.
    pub time: String,
    /// The process killed.
    pub pid: u32,
    /// Its command name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(with = "Option<String>")]
    pub command: String,
    /// `Cgroup`: the container's or the pod's memory limit was reached; `System`: the
    /// node ran out of memory.
    pub scope: OomScope,
    /// The limit that was reached (a cgroup's; for `System`, the node's RAM + swap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<u64>,
    /// The process's resident memory when it was chosen.
    pub memory_bytes: u64,
    /// Whether a leak was listed for the container at `minConfidence` or above before
    /// the kill.
    pub predicted: bool,
    /// How long before the kill the first such listing came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warned_seconds_before: Option<f64>,
    /// The predicted time of the OOM kill less the real one, at the first listing:
    /// negative, predicted early; positive, late. Absent without a time to OOM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_error_at_first_alert_seconds: Option<f64>,
    /// The same for the listing nearest half-way between the first listing and the kill.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_error_at_halfway_seconds: Option<f64>,
    /// Whether no listing put the lower bound of its time to OOM after the kill (what
    /// remediation acts on). Absent without a lower bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lower_bound_held: Option<bool>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum OomScope {
    Cgroup,
    System,
}

/// Growth sites kept per leak in a status, frames per site, and characters per frame.
pub const MAX_GROWTH_SITES: u32 = 3;
pub const MAX_SITE_FRAMES: u32 = 8;
pub const MAX_FRAME_LENGTH: u32 = 160;

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrowthSiteEntry {
    /// Function names, leaf first. `[unknown]`: an address outside any file (JIT code, or
    /// a frame of a binary built without frame pointers); `[libfoo.so]`: a file without a
    /// symbol for it.
    #[schemars(length(min = 1, max = MAX_SITE_FRAMES), inner(length(min = 1, max = MAX_FRAME_LENGTH)))]
    pub frames: Vec<String>,
    /// Resident bytes this stack added while captured.
    pub bytes: u64,
    /// Its share of all the growth captured for the process, 0-100.
    #[schemars(range(min = 0.0, max = 100.0))]
    pub percent: f64,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ThresholdEntry {
    /// The pod's name.
    pub pod: String,
    /// Absent when the container could not be named. (Empty strings are never written:
    /// Kubernetes 1.20's server-side apply turns them into nulls, which the schema refuses.)
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(with = "Option<String>")]
    pub container: String,
    /// `cpu` or `memory`.
    pub metric: Metric,
    /// CPU percent of one core, or memory percent of the container's limit.
    pub value: f64,
    /// The threshold it is above.
    pub threshold: f64,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemediationRecord {
    /// The pod's name.
    pub pod: String,
    /// The pod's UID.
    #[serde(rename = "podUID")]
    pub pod_uid: String,
    /// The controller that replaces the pod, e.g. `Deployment/api`; absent for a bare pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<String>,
    /// `Pending`, `Restarted`, `Blocked`, `WouldRestart` or `Expired`.
    pub action: RemediationOutcome,
    /// Why: the gate or rail that refused, or what happened.
    pub reason: RemediationReason,
    /// The same in words.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(with = "Option<String>")]
    pub message: String,
    /// The predicted time to OOM when decided, in seconds (absent when none was).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "timeToOOMSeconds"
    )]
    pub time_to_oom_seconds: Option<f64>,
    /// The prediction's confidence when decided.
    pub confidence: u8,
    /// When decided, RFC 3339.
    pub time: String,
}

/// Reasons: what the API shows (PascalCase, listed in the schema), compared as types
/// everywhere, and as text where people read them (`as_str`, `Display`, `== "Cooldown"`).
macro_rules! reasons {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident),* $(,)? }) => {
        $(#[$m])*
        #[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
        pub enum $name {
            $($(#[$vm])* $v,)*
            /// Written by a newer operator: a reason this release does not know.
            #[serde(other)]
            Unknown,
        }
        impl $name {
            pub fn as_str(self) -> &'static str {
                match self { $($name::$v => stringify!($v),)* $name::Unknown => "Unknown" }
            }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool { self.as_str() == *other }
        }
    };
}

reasons!(
    /// Why a condition has its status.
    ConditionReason {
        /// Ready: pods are selected and their nodes' agents report.
        Watching,
        /// Ready: the selector matches no pod.
        NoPodsSelected,
        /// Ready (Unknown): the selected pods' agents have not reported yet.
        WaitingForAgents,
        /// Ready (a ClusterResourceWatch): its nodes are configured.
        Configured,
        /// Ready: the spec is refused (the message says which field and why).
        InvalidSpec,
        /// Degraded: some nodes' agents do not report.
        AgentsMissing,
        /// Degraded: some agents refused their configuration.
        ConfigRejected,
        /// Degraded (False): every agent reports.
        AllAgentsReporting,
        /// Remediation (Unknown): checked when a prediction triggers.
        NotEvaluated,
        /// Remediation: restarts are allowed.
        Enabled,
        /// Remediation: `dryRun`.
        DryRun,
        /// Remediation: the operator runs without `--enable-remediation`.
        RemediationDisabled,
        /// Remediation: the namespace is not opted in by a cluster admin.
        NamespaceNotOptedIn,
        /// Remediation: no RemediationPolicy of the namespace grants this watch.
        NoRemediationPolicy,
        /// Remediation: the operator may not evict in this namespace.
        NoEvictionRights,
    }
);

reasons!(
    /// Why a remediation was or was not carried out (docs/api.md, "Pre-OOM remediation").
    RemediationReason {
        /// Recorded in the workload's ledger; the eviction is being attempted.
        Decided,
        /// Evicted through the Eviction API.
        Evicted,
        /// The pod was gone before the eviction.
        Gone,
        DryRun,
        RemediationDisabled,
        NamespaceNotOptedIn,
        NoRemediationPolicy,
        /// No RemediationPolicy covers this pod.
        NotAuthorized,
        NoEvictionRights,
        /// No controller would replace the pod.
        NoController,
        /// The workload's ledger is missing while restarts within its window are known.
        LedgerLost,
        /// The workload's ledger cannot be read.
        LedgerUnreadable,
        /// Writes to the workload's ledger keep losing to another writer.
        LedgerConflict,
        /// Another pod of the workload is being restarted.
        RestartInProgress,
        /// The workload was restarted within `cooldown`.
        Cooldown,
        /// The workload had `maxRestarts` restarts within `window`.
        MaxRestarts,
        /// The pod is the only Ready one of a workload that asks for more.
        LastReadyReplica,
        /// A PodDisruptionBudget refused the eviction.
        PodDisruptionBudget,
        /// A pending restart whose prediction no longer held.
        PredictionNoLongerHolds,
        /// A pending restart that outlived its predicted OOM time.
        IntentExpired,
    }
);

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum RemediationOutcome {
    /// Decided and recorded; the eviction is being attempted.
    Pending,
    /// Evicted through the Eviction API.
    Restarted,
    /// Refused by a rail or by the API (a PodDisruptionBudget).
    Blocked,
    /// `dryRun` or the operator's master switch off: reported only.
    WouldRestart,
    /// A pending restart that was not carried out: the prediction no longer held, a rail
    /// or the master switch said no when it was re-checked, or it outlived its window.
    Expired,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeEntry {
    /// The node's name.
    pub name: String,
    /// The node's agent is connected and its last report is recent.
    pub reporting: bool,
    /// The configuration version the agent last acknowledged, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_version: Option<u64>,
    /// Why the agent refused its configuration or is not reporting.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// The heaviest pod by CPU, e.g. "api-1 (97%)".
    #[serde(default, rename = "topCPU", skip_serializing_if = "Option::is_none")]
    pub top_cpu: Option<String>,
    /// The heaviest pod by memory, e.g. "api-2 (151Mi)".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_memory: Option<String>,
    /// Containers listed in `leaks`.
    #[serde(default)]
    pub leaking: u32,
    /// e.g. "4m30s", or absent when no OOM is predicted.
    #[serde(
        default,
        rename = "soonestOOM",
        skip_serializing_if = "Option::is_none"
    )]
    pub soonest_oom: Option<String>,
    /// The pod and container of `soonestOOM`, e.g. "api-7f9c/app".
    #[serde(
        default,
        rename = "soonestOOMPod",
        skip_serializing_if = "Option::is_none"
    )]
    pub soonest_oom_pod: Option<String>,
    /// The kills in `oomKills` and how many were predicted, e.g. "2 (1 predicted)";
    /// absent when there were none.
    #[serde(default, rename = "oomKills", skip_serializing_if = "Option::is_none")]
    pub oom_kills: Option<String>,
}

/// The CRD as YAML, exactly what `crdgen` prints and the committed file holds.
pub fn crd_yaml() -> Result<String, serde_saphyr::SerializeError> {
    use kube::CustomResourceExt;
    serde_saphyr::to_string(&ResourceWatch::crd())
}

/// The `RemediationPolicy` CRD as YAML.
pub fn policy_crd_yaml() -> Result<String, serde_saphyr::SerializeError> {
    use kube::CustomResourceExt;
    serde_saphyr::to_string(&RemediationPolicy::crd())
}

/// The `ClusterResourceWatch` CRD as YAML.
pub fn cluster_crd_yaml() -> Result<String, serde_saphyr::SerializeError> {
    use kube::CustomResourceExt;
    serde_saphyr::to_string(&ClusterResourceWatch::crd())
}

/// A YAML document as an untyped value, read as YAML 1.2's core schema (as Kubernetes and
/// Prometheus read it): `on`, `no`, `y` stay strings, `010` and `1_000` too. serde-saphyr's
/// defaults read YAML 1.1's booleans, which would turn a kubeconfig context named `on` into
/// `true`.
pub fn yaml_value(text: &str) -> Result<serde_json::Value, serde_saphyr::Error> {
    serde_saphyr::from_str_with_options(
        text,
        serde_saphyr::options! {
            strict_booleans: true,
            leading_zero_numbers_as_strings: true,
            underscored_numbers_as_strings: true,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMMITTED: &str = include_str!("../resourcewatch.io_resourcewatches.yaml");
    const COMMITTED_CLUSTER: &str = include_str!("../resourcewatch.io_clusterresourcewatches.yaml");
    const COMMITTED_POLICY: &str = include_str!("../resourcewatch.io_remediationpolicies.yaml");

    #[test]
    fn reasons_are_the_schemas_and_a_newer_operators_read_as_unknown() {
        let r: RemediationRecord = serde_json::from_value(serde_json::json!({
            "pod": "p", "podUID": "u", "action": "Blocked", "reason": "SomeRailOfLater",
            "confidence": 90, "time": "2026-11-27T00:00:00Z"
        }))
        .expect("a record of a newer operator");
        assert_eq!(r.reason, RemediationReason::Unknown);
        let c: Condition = serde_json::from_value(serde_json::json!({
            "type": "Ready", "status": "True", "reason": "Watching",
            "lastTransitionTime": "2026-11-27T00:00:00Z"
        }))
        .expect("a condition");
        assert_eq!(c.reason, ConditionReason::Watching);
        assert!(c.reason == "Watching");
        assert_eq!(
            serde_json::to_value(RemediationReason::LastReadyReplica).ok(),
            Some("LastReadyReplica".into())
        );
        // The schema lists every reason: the API server refuses any other.
        let crd = serde_json::to_value(<ResourceWatch as kube::CustomResourceExt>::crd())
            .expect("the CRD as JSON");
        let status = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
            ["properties"];
        let listed = status["remediations"]["items"]["properties"]["reason"]["enum"].clone();
        assert!(
            listed
                .as_array()
                .is_some_and(|l| l.contains(&"Cooldown".into())),
            "{listed}"
        );
        let listed = status["conditions"]["items"]["properties"]["reason"]["enum"].clone();
        assert!(
            listed
                .as_array()
                .is_some_and(|l| l.contains(&"AgentsMissing".into())),
            "{listed}"
        );
    }

    #[test]
    fn committed_crd_matches_the_types() {
        let generated = crd_yaml().expect("the CRD serialises");
        assert!(
            generated == COMMITTED,
            "crds/resourcewatch.io_resourcewatches.yaml is stale: run `make generate` and commit it"
        );
        let generated = cluster_crd_yaml().expect("the CRD serialises");
        assert!(
            generated == COMMITTED_CLUSTER,
            "crds/resourcewatch.io_clusterresourcewatches.yaml is stale: run `make generate` and commit it"
        );
        let generated = policy_crd_yaml().expect("the CRD serialises");
        assert!(
            generated == COMMITTED_POLICY,
            "crds/resourcewatch.io_remediationpolicies.yaml is stale: run `make generate` and commit it"
        );
    }

    /// `kubectl explain resourcewatch --recursive` shows a description for every field:
    /// a field added without a doc comment fails here, naming its path.
    #[test]
    fn every_field_is_described() {
        use kube::CustomResourceExt;
        fn walk(schema: &serde_json::Value, path: &str, missing: &mut Vec<String>) {
            if let Some(props) = schema.get("properties").and_then(|p| p.as_object()) {
                for (name, field) in props {
                    let p = format!("{path}.{name}");
                    let described = field
                        .get("description")
                        .and_then(|d| d.as_str())
                        .is_some_and(|d| !d.trim().is_empty());
                    if !described {
                        missing.push(p.clone());
                    }
                    walk(field, &p, missing);
                }
            }
            for nested in ["items", "additionalProperties"] {
                if let Some(inner) = schema.get(nested).filter(|v| v.is_object()) {
                    walk(inner, &format!("{path}[]"), missing);
                }
            }
        }
        for (crd, kind, min_wide) in [
            (
                serde_json::to_value(ResourceWatch::crd()).expect("json"),
                "A ResourceWatch",
                3,
            ),
            (
                serde_json::to_value(ClusterResourceWatch::crd()).expect("json"),
                "A ClusterResourceWatch",
                2,
            ),
            (
                serde_json::to_value(RemediationPolicy::crd()).expect("json"),
                "A RemediationPolicy",
                0,
            ),
        ] {
            let mut seen = 0;
            for version in crd["spec"]["versions"].as_array().expect("versions") {
                let schema = &version["schema"]["openAPIV3Schema"];
                let top = schema["description"].as_str().unwrap_or_default();
                assert!(top.starts_with(kind), "the kind's description: {top:?}");
                let mut missing = Vec::new();
                walk(schema, "", &mut missing);
                // metadata is the API server's own (ObjectMeta), described by it.
                missing.retain(|p| p != ".metadata");
                assert!(
                    missing.is_empty(),
                    "{kind}: fields without a description: {missing:#?}"
                );
                seen += 1;
                for column in version["additionalPrinterColumns"]
                    .as_array()
                    .expect("columns")
                {
                    assert!(
                        column["name"] == "Age" || column.get("description").is_some(),
                        "printer column without a description: {column}"
                    );
                }
                let wide = version["additionalPrinterColumns"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|c| c.get("priority").and_then(|p| p.as_i64()) == Some(1))
                    .count();
                assert!(wide >= min_wide, "{kind}: -o wide adds {wide} columns");
            }
            assert_eq!(seen, 1);
        }
    }

    /// Server-side apply on Kubernetes 1.20 turns an empty string into null, which the
    /// schema refuses (the whole status write fails); later versions keep it. A status
    /// must therefore never carry an empty string: an unknown container or command is
    /// left out, and nothing is ever written as null.
    #[test]
    fn a_status_never_writes_empty_strings_or_nulls() {
        fn walk(v: &serde_json::Value, path: &str) {
            match v {
                serde_json::Value::Null => panic!("{path} is null"),
                serde_json::Value::String(s) => assert!(!s.is_empty(), "{path} is \"\""),
                serde_json::Value::Array(a) => {
                    for (i, x) in a.iter().enumerate() {
                        walk(x, &format!("{path}[{i}]"));
                    }
                }
                serde_json::Value::Object(m) => {
                    for (k, x) in m {
                        walk(x, &format!("{path}.{k}"));
                    }
                }
                _ => {}
            }
        }
        let entry = TopEntry {
            pod: "p".into(),
            container: String::new(),
            process: ProcessFigure {
                node: "n".into(),
                pid: 1,
                command: String::new(),
                value: 1.0,
            },
        };
        let status = ResourceWatchStatus {
            top_cpu: vec![entry.clone()],
            top_memory: vec![entry],
            leaks: vec![LeakEntry {
                pod: "p".into(),
                container: String::new(),
                node: "n".into(),
                growth_bytes_per_second: 1.0,
                confidence: 70,
                time_to_oom_seconds: None,
                time_to_oom_lower_bound_seconds: None,
                growing_for_seconds: None,
                limit_bytes: None,
                growth_sites: vec![],
            }],
            conditions: vec![Condition {
                type_: "Ready".into(),
                status: ConditionStatus::True,
                reason: ConditionReason::Configured,
                message: String::new(),
                last_transition_time: "2026-11-24T10:00:00Z".into(),
                observed_generation: None,
            }],
            ..Default::default()
        };
        walk(&serde_json::to_value(&status).expect("json"), "status");
    }

    #[test]
    fn the_kustomize_copy_matches_too() {
        for (path, copy) in [
            (
                "config/crd/resourcewatch.io_resourcewatches.yaml",
                include_str!("../../config/crd/resourcewatch.io_resourcewatches.yaml"),
            ),
            (
                "charts/resourcewatch/files/crds/resourcewatch.io_resourcewatches.yaml",
                include_str!(
                    "../../charts/resourcewatch/files/crds/resourcewatch.io_resourcewatches.yaml"
                ),
            ),
        ] {
            assert!(
                copy == COMMITTED,
                "{path} is stale: run `make generate` and commit it"
            );
        }
        for (path, copy) in [
            (
                "config/crd/resourcewatch.io_clusterresourcewatches.yaml",
                include_str!("../../config/crd/resourcewatch.io_clusterresourcewatches.yaml"),
            ),
            (
                "charts/resourcewatch/files/crds/resourcewatch.io_clusterresourcewatches.yaml",
                include_str!(
                    "../../charts/resourcewatch/files/crds/resourcewatch.io_clusterresourcewatches.yaml"
                ),
            ),
        ] {
            assert!(
                copy == COMMITTED_CLUSTER,
                "{path} is stale: run `make generate` and commit it"
            );
        }
        for (path, copy) in [
            (
                "config/crd/resourcewatch.io_remediationpolicies.yaml",
                include_str!("../../config/crd/resourcewatch.io_remediationpolicies.yaml"),
            ),
            (
                "charts/resourcewatch/files/crds/resourcewatch.io_remediationpolicies.yaml",
                include_str!(
                    "../../charts/resourcewatch/files/crds/resourcewatch.io_remediationpolicies.yaml"
                ),
            ),
        ] {
            assert!(
                copy == COMMITTED_POLICY,
                "{path} is stale: run `make generate` and commit it"
            );
        }
    }

    #[test]
    fn the_sample_is_a_valid_resourcewatch() {
        let sample = include_str!("../../config/samples/resourcewatch.yaml");
        let rw: ResourceWatch =
            serde_saphyr::from_str(sample).expect("config/samples/resourcewatch.yaml parses");
        assert_eq!(rw.spec.remediation.action, RemediationAction::Alert);
        assert_eq!(
            rw.spec.selector.match_labels.get("app").map(String::as_str),
            Some("api")
        );
    }

    /// serde ignores unknown fields, the API server prunes them: a misspelt field in the
    /// sample would silently fall back to its default. Every field of the sample must
    /// survive a round trip through the types.
    #[test]
    fn the_sample_has_no_field_the_types_do_not_know() {
        fn paths(v: &serde_json::Value, prefix: &str, out: &mut Vec<String>) {
            if let serde_json::Value::Object(m) = v {
                for (k, v) in m {
                    let p = format!("{prefix}.{k}");
                    out.push(p.clone());
                    paths(v, &p, out);
                }
            }
        }
        let sample = include_str!("../../config/samples/resourcewatch.yaml");
        let raw: serde_json::Value = yaml_value(sample).expect("yaml");
        let typed: ResourceWatch = serde_saphyr::from_str(sample).expect("typed");
        let back = serde_json::to_value(&typed).expect("json");
        let (mut want, mut have) = (Vec::new(), Vec::new());
        paths(&raw["spec"], "spec", &mut want);
        paths(&back["spec"], "spec", &mut have);
        for p in want {
            assert!(
                have.contains(&p),
                "config/samples/resourcewatch.yaml: {p} is not a field of the API"
            );
        }
    }

    #[test]
    fn a_minimal_spec_gets_the_documented_defaults() {
        let spec: ResourceWatchSpec = serde_json::from_str("{}").expect("an empty spec is valid");
        assert_eq!(spec.top_k, 10);
        assert_eq!(spec.metrics, vec![Metric::Cpu, Metric::Memory]);
        assert_eq!(spec.interval, "30s");
        assert_eq!(spec.remediation.action, RemediationAction::None);
        assert!(spec.leak_detection.enabled && spec.leak_detection.min_confidence == 60);
    }

    #[test]
    fn schema_carries_the_validation_the_api_server_enforces() {
        let crd: serde_json::Value = yaml_value(COMMITTED).expect("yaml");
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
        // The bounds every other check of K uses (operator, agent).
        for committed in [COMMITTED, COMMITTED_CLUSTER] {
            let crd: serde_json::Value = yaml_value(committed).expect("yaml");
            let k = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
                ["properties"]["topK"];
            assert_eq!(k["minimum"], f64::from(resourcewatch_proto::TOP_K_MIN));
            assert_eq!(k["maximum"], f64::from(resourcewatch_proto::TOP_K_MAX));
        }
        assert_eq!(spec["interval"]["pattern"], DURATION_PATTERN);
        let action = &spec["remediation"]["properties"]["action"]["enum"];
        assert_eq!(action, &serde_json::json!(["None", "Alert", "Restart"]));
        let op = &spec["selector"]["properties"]["matchExpressions"]["items"]["properties"]["operator"]
            ["enum"];
        assert_eq!(
            op,
            &serde_json::json!(["In", "NotIn", "Exists", "DoesNotExist"])
        );
        let status = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
            ["properties"];
        assert_eq!(status["conditions"]["x-kubernetes-list-type"], "map");
        assert_eq!(
            status["conditions"]["x-kubernetes-list-map-keys"],
            serde_json::json!(["type"])
        );
        let names = &crd["spec"]["names"];
        assert_eq!(names["shortNames"], serde_json::json!(["rw"]));
        assert_eq!(crd["spec"]["scope"], "Namespaced");
    }

    #[test]
    fn the_duration_pattern_accepts_go_durations_only() {
        // The regex crate isn't a dependency; check the pattern's intent with examples
        // through a tiny matcher of the same grammar.
        fn is_duration(s: &str) -> bool {
            let mut rest = s;
            if rest.is_empty() {
                return false;
            }
            while !rest.is_empty() {
                let digits = rest
                    .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                    .unwrap_or(rest.len());
                if digits == 0 || rest[..digits].starts_with('.') || rest[..digits].ends_with('.') {
                    return false;
                }
                rest = &rest[digits..];
                let unit = ["ms", "s", "m", "h"]
                    .into_iter()
                    .find(|u| rest.starts_with(u));
                let Some(u) = unit else { return false };
                rest = &rest[u.len()..];
            }
            true
        }
        for ok in ["10s", "1m30s", "500ms", "2h", "1.5s"] {
            assert!(is_duration(ok), "{ok}");
        }
        for bad in ["", "10", "ten seconds", "5 s", "-1s", "1d"] {
            assert!(!is_duration(bad), "{bad}");
        }
    }
}
