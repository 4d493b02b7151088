//! What the operator keeps and reads of a Pod. Every pod of the cluster is cached (the
//! watches' selectors and the node view need them), so each is cut down first.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use resourcewatch_operator_core::status::SelectedPod;

/// The pod's Ready condition is True.
pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A pod that has finished (`Succeeded`, `Failed`): it runs nothing any more.
pub fn is_terminal(p: &Pod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Cuts a pod down to what the operator reads of it before it enters the cache of every
/// pod in the cluster: metadata without annotations and managed fields (labels, owners,
/// deletion time stay), the node, the phase, whether it is Ready, and each container
/// status's name, runtime id and whether it runs. A real pod's env, volumes, probes and `last-applied-configuration`
/// are kilobytes; at 20,000 pods they would be most of the operator's memory.
pub fn slim_pod(p: &mut Pod) {
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, PodCondition, PodSpec, PodStatus,
    };
    p.metadata.managed_fields = None;
    p.metadata.annotations = None;
    if let Some(spec) = p.spec.as_mut() {
        *spec = PodSpec {
            node_name: spec.node_name.take(),
            ..Default::default()
        };
    }
    let slim = |v: Option<Vec<ContainerStatus>>| {
        v.map(|v| {
            v.into_iter()
                .map(|c| {
                    // A terminated instance's runtime id alone: it names an OOM kill's
                    // container after a restart replaced it.
                    let terminated = |s: Option<ContainerState>| {
                        s.and_then(|s| s.terminated)
                            .map(|t| ContainerStateTerminated {
                                container_id: t.container_id,
                                ..Default::default()
                            })
                    };
                    let (running, state_terminated) = match c.state {
                        Some(s) => (s.running.clone(), terminated(Some(s))),
                        None => (None, None),
                    };
                    ContainerStatus {
                        name: c.name,
                        container_id: c.container_id,
                        state: Some(ContainerState {
                            running,
                            terminated: state_terminated,
                            ..Default::default()
                        }),
                        last_state: terminated(c.last_state).map(|t| ContainerState {
                            terminated: Some(t),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }
                })
                .collect()
        })
    };
    if let Some(st) = p.status.as_mut() {
        // Of the conditions, Ready's status alone (a remediation rail reads it).
        let ready = st.conditions.take().and_then(|c| {
            c.into_iter().find(|c| c.type_ == "Ready").map(|c| {
                vec![PodCondition {
                    type_: c.type_,
                    status: c.status,
                    ..Default::default()
                }]
            })
        });
        *st = PodStatus {
            phase: st.phase.take(),
            conditions: ready,
            container_statuses: slim(st.container_statuses.take()),
            init_container_statuses: slim(st.init_container_statuses.take()),
            ..Default::default()
        };
    }
}

/// The pod's containers to track, by runtime id: its containers, and its init containers
/// while they run, which covers the restartable sidecars of Kubernetes 1.28+ (init
/// containers with `restartPolicy: Always`, reported only in `initContainerStatuses`, that
/// run as long as the pod and count against its memory like any container).
pub fn selected_pod(p: &Pod) -> SelectedPod {
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
    }
}
