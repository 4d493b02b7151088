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

    fn pod(json: &str) -> Pod {
        serde_json::from_str(json).expect("a Pod")
    }

    fn names(p: &Pod) -> Vec<String> {
        let mut n: Vec<String> = selected_pod(p).containers.into_values().collect();
        n.sort();
        n
    }

    #[test]
    fn a_slimmed_pod_reads_the_same_and_sheds_the_rest() {
        for json in [
            include_str!("../tests/fixtures/k8s-1.20/pod-running.json"),
            include_str!("../tests/fixtures/k8s-1.20/pod-init-running.json"),
            include_str!("../tests/fixtures/k8s-1.37/pod-running.json"),
            include_str!("../tests/fixtures/k8s-1.37/pod-init-running.json"),
            include_str!("../tests/fixtures/k8s-1.37/pod-sidecar.json"),
        ] {
            let full = pod(json);
            let mut slim = full.clone();
            slim_pod(&mut slim);
            assert_eq!(selected_pod(&slim), selected_pod(&full));
            assert_eq!(is_terminal(&slim), is_terminal(&full));
            assert_eq!(slim.labels(), full.labels());
            assert_eq!(slim.owner_references(), full.owner_references());
            assert_eq!(
                slim.metadata.deletion_timestamp,
                full.metadata.deletion_timestamp
            );
            assert_eq!(is_ready(&slim), is_ready(&full));
            // What is shed: the spec but the node, conditions but Ready's status,
            // images, annotations.
            let spec = slim.spec.as_ref().unwrap();
            assert_eq!(spec.node_name, full.spec.as_ref().unwrap().node_name);
            assert!(spec.containers.is_empty() && spec.volumes.is_none());
            let status = slim.status.as_ref().unwrap();
            assert!(status.pod_ip.is_none());
            assert!(
                status
                    .conditions
                    .iter()
                    .flatten()
                    .all(|c| c.type_ == "Ready"
                        && c.message.is_none()
                        && c.last_transition_time.is_none())
            );
            assert!(
                status
                    .container_statuses
                    .iter()
                    .flatten()
                    .all(|c| c.image.is_empty())
            );
            assert!(slim.metadata.annotations.is_none());
            let size = |p: &Pod| serde_json::to_vec(p).map(|v| v.len()).unwrap_or(0);
            assert!(
                size(&slim) < size(&full) * 2 / 3,
                "{} of {}",
                size(&slim),
                size(&full)
            );
        }
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
        let p = pod(include_str!("../tests/fixtures/k8s-1.37/pod-sidecar.json"));
        assert_eq!(names(&p), ["app", "log-shipper"]);
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
