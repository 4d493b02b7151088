//! What the operator keeps and reads of a Pod. Every pod of the cluster is cached (the
//! watches' selectors and the node view need them), so each is cut down first.

use k8s_openapi::{
    api::core::v1::{ContainerState, ContainerStatus, Pod},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::ResourceExt;
use resourcewatch_operator_core::status::SelectedPod;
use serde::{Deserialize, Serialize};

/// A Pod as the operator caches it: the API's JSON read straight into the fields the
/// operator uses, with the API's field names (code reads it as it would a `Pod`).
/// k8s-openapi's `Pod` is 2,176 bytes before any of its strings (its `PodSpec` alone
/// 1,416, a `ContainerStatus` 752), nearly all of it empty fields here: at 20,000 pods the
/// cache of full `Pod`s, even emptied, was 46 MB of the operator's 262 MB heap peak at
/// 1,000 nodes (heaptrack, e2e/SCALE.md). Unknown fields are skipped by serde, so the
/// watch does not build what it would then drop.
#[derive(kube::Resource, Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[resource(inherit = Pod)]
pub struct CachedPod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<CachedPodSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<CachedPodStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedPodSpec {
    #[serde(default)]
    pub node_name: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedPodStatus {
    #[serde(default)]
    pub phase: Option<String>,
    /// Of the conditions, Ready's status alone is kept (a remediation rail reads it).
    #[serde(default)]
    pub conditions: Option<Vec<CachedCondition>>,
    #[serde(default)]
    pub container_statuses: Option<Vec<CachedContainerStatus>>,
    #[serde(default)]
    pub init_container_statuses: Option<Vec<CachedContainerStatus>>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct CachedCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
}

/// A container status's name, runtime id and whether it runs; of a terminated instance
/// (now or last), its runtime id alone: it names an OOM kill's container after a restart
/// replaced it.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedContainerStatus {
    pub name: String,
    /// `containerID` in the API (not the camel case of the other fields).
    #[serde(default, rename = "containerID")]
    pub container_id: Option<String>,
    #[serde(default)]
    pub state: Option<CachedContainerState>,
    #[serde(default)]
    pub last_state: Option<CachedContainerState>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct CachedContainerState {
    #[serde(default)]
    pub running: Option<Running>,
    #[serde(default)]
    pub terminated: Option<Terminated>,
}

/// A running state's details are not read.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct Running {}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Terminated {
    /// `containerID` in the API (not the camel case of the other fields).
    #[serde(default, rename = "containerID")]
    pub container_id: Option<String>,
}

/// The pod's Ready condition is True.
pub fn is_ready(pod: &CachedPod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A pod that has finished (`Succeeded`, `Failed`): it runs nothing any more.
pub fn is_terminal(p: &CachedPod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Sheds what the cache does not read of what the watch decoded: metadata's annotations
/// and managed fields (a real pod's `last-applied-configuration` and field managers are
/// kilobytes; labels, owners and the deletion time stay), and every condition but Ready.
pub fn slim_pod(p: &mut CachedPod) {
    p.metadata.managed_fields = None;
    p.metadata.annotations = None;
    if let Some(st) = p.status.as_mut()
        && let Some(c) = st.conditions.as_mut()
    {
        c.retain(|c| c.type_ == "Ready");
        c.shrink_to_fit();
    }
}

impl From<&ContainerState> for CachedContainerState {
    fn from(s: &ContainerState) -> Self {
        Self {
            running: s.running.as_ref().map(|_| Running {}),
            terminated: s.terminated.as_ref().map(|t| Terminated {
                container_id: t.container_id.clone(),
            }),
        }
    }
}

impl From<&ContainerStatus> for CachedContainerStatus {
    fn from(c: &ContainerStatus) -> Self {
        Self {
            name: c.name.clone(),
            container_id: c.container_id.clone(),
            state: c.state.as_ref().map(Into::into),
            last_state: c.last_state.as_ref().map(Into::into),
        }
    }
}

/// A full Pod as the cache holds it (tests build pods with k8s-openapi's types; the
/// operator's watch reads JSON straight into [`CachedPod`]).
impl From<&Pod> for CachedPod {
    fn from(p: &Pod) -> Self {
        let statuses = |v: &Option<Vec<ContainerStatus>>| {
            v.as_ref().map(|v| v.iter().map(Into::into).collect())
        };
        let mut c = Self {
            metadata: p.metadata.clone(),
            spec: p.spec.as_ref().map(|s| CachedPodSpec {
                node_name: s.node_name.clone(),
            }),
            status: p.status.as_ref().map(|s| CachedPodStatus {
                phase: s.phase.clone(),
                conditions: s.conditions.as_ref().map(|c| {
                    c.iter()
                        .map(|c| CachedCondition {
                            type_: c.type_.clone(),
                            status: c.status.clone(),
                        })
                        .collect()
                }),
                container_statuses: statuses(&s.container_statuses),
                init_container_statuses: statuses(&s.init_container_statuses),
            }),
        };
        slim_pod(&mut c);
        c
    }
}

/// The pod's containers to track, by runtime id: its containers, and its init containers
/// while they run, which covers the restartable sidecars of Kubernetes 1.28+ (init
/// containers with `restartPolicy: Always`, reported only in `initContainerStatuses`, that
/// run as long as the pod and count against its memory like any container).
pub fn selected_pod(p: &CachedPod) -> SelectedPod {
    let running_init = p
        .status
        .iter()
        .flat_map(|s| s.init_container_statuses.iter().flatten())
        .filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
    let containers = p
        .status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .chain(running_init)
        .filter_map(|c| {
            let id = c.container_id.as_deref()?;
            // "containerd://abc…", "cri-o://abc…", "docker://abc…"
            let id = id.split_once("://").map_or(id, |(_, id)| id);
            Some((id.to_owned(), c.name.clone()))
        })
        .collect();
    // Every other instance the pod's status still names: finished init containers, the
    // last instance of each restarted container.
    let strip = |id: &str| id.split_once("://").map_or(id, |(_, id)| id).to_owned();
    let exited_containers = p
        .status
        .iter()
        .flat_map(|s| {
            s.container_statuses
                .iter()
                .flatten()
                .chain(s.init_container_statuses.iter().flatten())
        })
        .flat_map(|c| {
            let last = c
                .last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .and_then(|t| t.container_id.as_deref());
            let now = c
                .state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .and_then(|t| t.container_id.as_deref().or(c.container_id.as_deref()));
            [last, now]
                .into_iter()
                .flatten()
                .map(|id| (strip(id), c.name.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    SelectedPod {
        uid: p.uid().unwrap_or_default(),
        name: p.name_any(),
        node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
        containers,
        exited_containers,
        created: p
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.as_second()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    //! Recorded pods of Kubernetes 1.20 and 1.37 (tests/fixtures/README.md).

    use super::*;

    /// A pod as the watch caches it: the API's JSON read into [`CachedPod`], slimmed.
    fn pod(json: &str) -> CachedPod {
        let mut p: CachedPod = serde_json::from_str(json).expect("a Pod");
        slim_pod(&mut p);
        p
    }

    fn full(json: &str) -> Pod {
        serde_json::from_str(json).expect("a Pod")
    }

    fn names(p: &CachedPod) -> Vec<String> {
        let mut n: Vec<String> = selected_pod(p).containers.into_values().collect();
        n.sort();
        n
    }

    const RECORDED: [&str; 5] = [
        include_str!("../tests/fixtures/k8s-1.20/pod-running.json"),
        include_str!("../tests/fixtures/k8s-1.20/pod-init-running.json"),
        include_str!("../tests/fixtures/k8s-1.37/pod-running.json"),
        include_str!("../tests/fixtures/k8s-1.37/pod-init-running.json"),
        include_str!("../tests/fixtures/k8s-1.37/pod-sidecar.json"),
    ];

    #[test]
    fn a_cached_pod_reads_what_the_full_pod_says_and_sheds_the_rest() {
        for json in RECORDED {
            let full = full(json);
            let cached = pod(json);
            // The watch's path (JSON into CachedPod) and the tests' (a built Pod
            // converted) hold the same.
            assert_eq!(cached, CachedPod::from(&full));
            assert_eq!(cached.labels(), full.labels());
            assert_eq!(cached.owner_references(), full.owner_references());
            assert_eq!(cached.uid(), full.uid());
            assert_eq!(
                cached.metadata.deletion_timestamp,
                full.metadata.deletion_timestamp
            );
            let fs = full.status.as_ref().unwrap();
            assert_eq!(
                is_ready(&cached),
                fs.conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            );
            assert_eq!(cached.status.as_ref().unwrap().phase, fs.phase);
            assert_eq!(
                cached.spec.as_ref().unwrap().node_name,
                full.spec.as_ref().unwrap().node_name
            );
            // Every runtime id the API's pod names (running, terminated, last terminated
            // instance) the cached one names: every `containerID` in either JSON.
            fn ids(v: &serde_json::Value, out: &mut Vec<String>) {
                match v {
                    serde_json::Value::Object(m) => {
                        for (k, v) in m {
                            match (k.as_str(), v.as_str()) {
                                ("containerID", Some(id)) => out.push(id.to_owned()),
                                _ => ids(v, out),
                            }
                        }
                    }
                    serde_json::Value::Array(a) => a.iter().for_each(|v| ids(v, out)),
                    _ => {}
                }
            }
            let (mut api_ids, mut cached_ids) = (Vec::new(), Vec::new());
            ids(&serde_json::from_str(json).unwrap(), &mut api_ids);
            ids(&serde_json::to_value(&cached).unwrap(), &mut cached_ids);
            api_ids.sort();
            cached_ids.sort();
            assert!(!api_ids.is_empty());
            assert_eq!(cached_ids, api_ids);
            let cs = cached.status.as_ref().unwrap();
            // What is shed: annotations, managed fields, conditions but Ready.
            assert!(cached.metadata.annotations.is_none());
            assert!(cached.metadata.managed_fields.is_none());
            assert!(cs.conditions.iter().flatten().all(|c| c.type_ == "Ready"));
            let (c, f) = (
                serde_json::to_vec(&cached).unwrap().len(),
                serde_json::to_vec(&full).unwrap().len(),
            );
            assert!(c < f * 2 / 3, "{c} of {f}");
        }
        // The point of the type: what a cached pod holds before its strings.
        assert!(
            std::mem::size_of::<CachedPod>() * 4 < std::mem::size_of::<Pod>(),
            "{} bytes against a Pod's {}",
            std::mem::size_of::<CachedPod>(),
            std::mem::size_of::<Pod>()
        );
    }

    #[test]
    fn containers_of_running_and_initialising_pods() {
        for (running, init) in [
            (
                include_str!("../tests/fixtures/k8s-1.20/pod-running.json"),
                include_str!("../tests/fixtures/k8s-1.20/pod-init-running.json"),
            ),
            (
                include_str!("../tests/fixtures/k8s-1.37/pod-running.json"),
                include_str!("../tests/fixtures/k8s-1.37/pod-init-running.json"),
            ),
        ] {
            let running = pod(running);
            assert_eq!(names(&running), ["app"]);
            let id = selected_pod(&running)
                .containers
                .into_keys()
                .next()
                .unwrap();
            assert_eq!(id.len(), 64, "the runtime prefix is cut: {id}");
            // Pending with its init container running: that one is tracked meanwhile.
            assert_eq!(names(&pod(init)), ["init"]);
        }
    }

    #[test]
    fn restartable_sidecars_are_tracked() {
        // Recorded on 1.37.2: the sidecar (an init container with restartPolicy
        // Always) runs beside the app; the completed migration is not tracked.
        let json = include_str!("../tests/fixtures/k8s-1.37/pod-sidecar.json");
        assert_eq!(names(&pod(json)), ["app", "log-shipper"]);
        let p = full(json);
        let sidecar = p.spec.as_ref().unwrap().init_containers.as_ref().unwrap()[1].clone();
        assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"));
        let done = &p
            .status
            .as_ref()
            .unwrap()
            .init_container_statuses
            .as_ref()
            .unwrap()[0];
        assert!(
            done.state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .is_some_and(|t| t.exit_code == 0),
            "the migration completed: {done:?}"
        );
    }
}
