//! The `RemediationPolicy` API: who lets a `Restart` watch evict.
//!
//! A `ResourceWatch` with `remediation.action: Restart` evicts only where a
//! RemediationPolicy of its own namespace grants it. The grant is an object of its own,
//! not a field or an annotation of the watch, so that the API server's RBAC decides who
//! may give it, at write time, with no webhook: the roles shipped with the operator put
//! write access to this kind only in the ones aggregated to `admin` (not `edit`, which
//! watch authors hold). Someone who may write watches but not policies can point a watch
//! at any pod, but it evicts only the pods a policy written by a namespace admin covers.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::LabelSelector;

/// Grants pre-OOM restarts to ResourceWatches of this namespace.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "resourcewatch.io",
    version = "v1alpha1",
    kind = "RemediationPolicy",
    namespaced,
    shortname = "rwpolicy",
    doc = "A RemediationPolicy lets the Restart ResourceWatches of its namespace evict the pods it covers before their predicted OOM kill. Only namespace admins may write one (the operator's roles aggregate its write verbs to `admin`, not `edit`); without one a Restart watch only reports.",
    printcolumn = r#"{"name":"Watches","type":"string","description":"Labels a watch must carry to be granted (empty: every watch of the namespace)","jsonPath":".spec.watchSelector.matchLabels"}"#,
    printcolumn = r#"{"name":"Pods","type":"string","description":"Labels a pod must carry to be restarted (empty: any pod a granted watch selects)","jsonPath":".spec.podSelector.matchLabels"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct RemediationPolicySpec {
    /// The ResourceWatches of this namespace the grant is for, by their labels; empty:
    /// every watch. Whoever may write watches may also label them, so this picks watches,
    /// it does not fence off their authors: `podSelector` bounds what may be evicted.
    #[serde(default)]
    pub watch_selector: LabelSelector,
    /// The pods a granted watch may restart, by their labels; empty: any pod the watch
    /// selects. Pod labels are set by whoever may write the pod's workload.
    #[serde(default)]
    pub pod_selector: LabelSelector,
}
